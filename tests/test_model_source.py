"""Hugging Face model ids: cache lookup for planning, and what a container gets (never the token's value)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from bakeoff.backends.spec import load_backend
from bakeoff.errors import LaunchError, SpecError
from bakeoff.models.model_source import (
    CONTAINER_HF_HOME,
    ModelRef,
    ModelSource,
    cached_snapshot,
    hf_home,
    hf_hub_cache,
    resolve_model,
)
from bakeoff.serving.containers import container_run_args, render_container_launch

HF_ID = "meta-llama/Llama-3.1-8B-Instruct"
TOKEN = "hf_dontLeakMe0123456789"


def fake_cache(
    hub: Path, hf_id: str = HF_ID, revisions: tuple[str, ...] = ("abc123",), main: str | None = None
) -> Path:
    """A hub cache laid out the way huggingface_hub writes it."""
    repo = hub / ("models--" + hf_id.replace("/", "--"))
    for rev in revisions:
        snap = repo / "snapshots" / rev
        snap.mkdir(parents=True)
        (snap / "tokenizer.json").write_text("{}")
        (snap / "config.json").write_text("{}")
    if main is not None:
        (repo / "refs").mkdir(parents=True)
        (repo / "refs" / "main").write_text(main + "\n")
    return repo


def test_hf_home_and_hub_cache_follow_the_environment(tmp_path: Path) -> None:
    assert hf_home({"HF_HOME": str(tmp_path / "h")}) == tmp_path / "h"
    assert hf_home({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "huggingface"
    assert hf_hub_cache({"HF_HOME": str(tmp_path / "h")}) == tmp_path / "h" / "hub"
    assert hf_hub_cache({"HF_HUB_CACHE": str(tmp_path / "x"), "HF_HOME": "/nope"}) == tmp_path / "x"


def test_snapshot_that_refs_main_names_wins(tmp_path: Path) -> None:
    repo = fake_cache(tmp_path, revisions=("old", "new"), main="old")
    os.utime(repo / "snapshots" / "old" / "tokenizer.json", (1, 1))  # older, but pinned by refs/main
    assert cached_snapshot(HF_ID, tmp_path) == repo / "snapshots" / "old"


def test_without_refs_main_the_newest_snapshot_with_a_tokenizer(tmp_path: Path) -> None:
    repo = fake_cache(tmp_path, revisions=("a", "b"))
    os.utime(repo / "snapshots" / "a" / "tokenizer.json", (1, 1))
    (repo / "snapshots" / "c").mkdir()  # a snapshot without a tokenizer does not count
    assert cached_snapshot(HF_ID, tmp_path) == repo / "snapshots" / "b"


def test_uncached_id_has_no_snapshot(tmp_path: Path) -> None:
    assert cached_snapshot(HF_ID, tmp_path) is None


def test_tokenizer_for_planning_is_read_from_the_cache(tmp_path: Path) -> None:
    fake_cache(tmp_path / "home" / "hub", main="abc123")
    source = resolve_model(ModelRef(hf_id=HF_ID), environ={"HF_HOME": str(tmp_path / "home")})
    assert (
        source.tokenizer_dir()
        == tmp_path / "home" / "hub" / f"models--{HF_ID.replace('/', '--')}" / "snapshots" / "abc123"
    )


def test_tokenizer_missing_from_the_cache_says_how_to_get_it(tmp_path: Path) -> None:
    source = resolve_model(ModelRef(hf_id=HF_ID), environ={"HF_HOME": str(tmp_path)})
    with pytest.raises(SpecError) as err:
        source.tokenizer_dir()
    message = str(err.value)
    assert "model.hf_id" in message and f"huggingface-cli download {HF_ID}" in message
    assert str(tmp_path / "hub") in message  # which cache was looked at
    with pytest.raises(SpecError, match="huggingface-cli download"):
        source.local_dir_or_raise()


def test_local_folder_is_mounted_read_only_at_the_model_mount(tiny_model: Path) -> None:
    source = resolve_model(ModelRef(preset="tiny"))
    mount = source.container_mount("/model")
    assert mount.model_arg == "/model" and mount.pass_env == ()
    assert mount.run_args() == ["-v", f"{tiny_model.absolute()}:/model:ro"]


def test_hf_id_mounts_the_cache_and_passes_the_token_by_name(tmp_path: Path) -> None:
    environ = {"HF_HOME": str(tmp_path / "home"), "HF_TOKEN": TOKEN}
    mount = resolve_model(ModelRef(hf_id=HF_ID), environ=environ).container_mount("/model", environ)
    assert mount.model_arg == HF_ID
    args = mount.run_args()
    assert args[:2] == ["-v", f"{tmp_path / 'home'}:{CONTAINER_HF_HOME}"]  # read-write: the server may download
    assert args[2:4] == ["-e", f"HF_HOME={CONTAINER_HF_HOME}"]
    assert args[4:] == ["-e", "HF_TOKEN"]
    assert TOKEN not in " ".join(args)
    assert mount.writable_dirs() == [tmp_path / "home"]


def test_no_token_in_the_environment_passes_none(tmp_path: Path) -> None:
    environ = {"HF_HOME": str(tmp_path)}
    mount = ModelSource(hf_id=HF_ID, local_dir=None).container_mount("/model", environ)
    assert "HF_TOKEN" not in mount.run_args()


def test_hub_cache_outside_hf_home_is_mounted_where_the_image_looks(tmp_path: Path) -> None:
    environ = {"HF_HOME": str(tmp_path / "home"), "HF_HUB_CACHE": str(tmp_path / "big-disk")}
    mount = resolve_model(ModelRef(hf_id=HF_ID), environ=environ).container_mount("/model", environ)
    assert (tmp_path / "big-disk", f"{CONTAINER_HF_HOME}/hub", False) in mount.mounts


def test_container_command_serves_the_id_and_never_holds_the_token(tmp_path: Path) -> None:
    environ = {"HF_HOME": str(tmp_path / "home"), "HF_TOKEN": TOKEN}
    backend = load_backend("vllm")
    assert backend.container is not None
    mount = resolve_model(ModelRef(hf_id=HF_ID), environ=environ).container_mount(
        backend.container.model_mount, environ
    )
    launch = render_container_launch(backend, {}, served_model_name="m", model_arg=mount.model_arg)
    args = container_run_args(launch, runtime="podman", port=8123, model_dir=None, name="n", model=mount)
    line = shlex.join(args)
    assert f"serve {HF_ID}" in line and ":/model:ro" not in line
    assert f"{tmp_path / 'home'}:{CONTAINER_HF_HOME}" in line and "-e HF_TOKEN " in line + " "
    assert TOKEN not in line


def test_container_without_folder_or_id_is_refused() -> None:
    backend = load_backend("vllm")
    launch = render_container_launch(backend, {}, served_model_name="m")
    with pytest.raises(LaunchError, match="no model folder"):
        container_run_args(launch, runtime="podman", port=8123, model_dir=None, name="n")
