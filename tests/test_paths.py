"""Resolution of shipped and user folders, the engine interpreter, and bench.ipynb's parameter checks."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import pytest
import yaml

from bakeoff import paths
from bakeoff.backends.launch_render import render_launch
from bakeoff.backends.spec import BACKENDS_DIR, list_backends, load_backend
from bakeoff.errors import LaunchError, SpecError
from bakeoff.notebook.guards import bench_ready
from bakeoff.notebook.kernelrun import kernel_environment
from bakeoff.observe.origin import versions
from bakeoff.serving import engine_env
from bakeoff.serving.engine_env import (
    ENGINE_PYTHON_ENV,
    engine_python,
    engine_versions,
    find_engine_python,
    interpreter,
)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _no_bakeoff_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("BAKEOFF_") and name != "BAKEOFF_CACHE_DIR":
            monkeypatch.delenv(name)


def test_checkout_reads_its_own_top_level_folders() -> None:
    assert paths.checkout_root() == REPO
    assert paths.shipped("backends") == REPO / "backends" == BACKENDS_DIR
    assert paths.notebook("bench.ipynb") == REPO / "notebooks" / "bench.ipynb"
    assert (paths.templates_dir() / "offline" / "index.html.j2").is_file()
    with pytest.raises(ValueError, match="shipped folders: backends, notebooks"):
        paths.shipped("models")


def test_campaign_by_path_or_shipped_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert paths.campaign_file(Path("cpu-demo")) == REPO / "campaigns" / "cpu-demo.yaml"
    assert paths.campaign_file(Path("cpu-demo.yaml")) == REPO / "campaigns" / "cpu-demo.yaml"
    mine = tmp_path / "cpu-demo.yaml"
    mine.write_text("name: mine\n")
    assert paths.campaign_file(Path("cpu-demo.yaml")) == Path("cpu-demo.yaml")  # a real file wins
    shipped = r"shipped campaigns: (cpu-[a-z0-9-]+, )*cpu-container, cpu-demo"
    with pytest.raises(SpecError, match=r"campaign file not found: nope .*" + shipped):
        paths.campaign_file(Path("nope"))


def _user_backend(folder: Path, name: str, display: str) -> None:
    folder.mkdir(exist_ok=True)
    spec = yaml.safe_load((REPO / "backends" / "vllm-cpu.yaml").read_text())
    spec.update(name=name, display_name=display)
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(spec))


def test_working_directory_backends_add_and_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert paths.backend_dirs() == [BACKENDS_DIR]
    _user_backend(tmp_path / "backends", "mine", "Mine")
    _user_backend(tmp_path / "backends", "vllm-cpu", "vLLM (CPU, patched)")
    assert paths.backend_dirs() == [tmp_path / "backends", BACKENDS_DIR]
    assert "mine" in list_backends() and "llamacpp" in list_backends()
    assert load_backend("vllm-cpu").display_name == "vLLM (CPU, patched)"
    assert load_backend("vllm-cpu", BACKENDS_DIR).display_name == "vLLM (CPU)"
    with pytest.raises(SpecError, match=r"unknown backend 'nope'; known backends: .*mine"):
        load_backend("nope")


def test_backends_dir_variable_wins_and_must_exist(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _user_backend(tmp_path / "elsewhere", "theirs", "Theirs")
    monkeypatch.setenv("BAKEOFF_BACKENDS_DIR", str(tmp_path / "elsewhere"))
    assert "theirs" in list_backends()
    monkeypatch.setenv("BAKEOFF_BACKENDS_DIR", str(tmp_path / "missing"))
    with pytest.raises(SpecError, match=r"BAKEOFF_BACKENDS_DIR=.*missing: not a folder"):
        list_backends()


def test_models_and_reports_follow_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert paths.models_dir() == tmp_path.resolve() / "models"
    assert paths.reports_dir() == tmp_path.resolve() / "reports"
    monkeypatch.setenv("BAKEOFF_MODELS_DIR", str(tmp_path / "m"))
    assert paths.models_dir() == tmp_path.resolve() / "m"


def test_kernel_environment_pins_and_restores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    _user_backend(tmp_path / "backends", "mine", "Mine")
    with kernel_environment():
        assert os.environ["BAKEOFF_MODELS_DIR"] == str(tmp_path.resolve() / "models")
        assert os.environ["BAKEOFF_BACKENDS_DIR"] == str(tmp_path.resolve() / "backends")
        os.chdir(tmp_path / "backends")  # a kernel's campaign folder: the pins still point home
        assert paths.models_dir() == tmp_path.resolve() / "models"
        assert "mine" in list_backends()
    assert "BAKEOFF_MODELS_DIR" not in os.environ and "BAKEOFF_BACKENDS_DIR" not in os.environ


def _kernelspec(root: Path, argv0: str) -> None:
    folder = root / "kernels" / paths.KERNEL_NAME
    folder.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [argv0, "-m", "ipykernel_launcher", "-f", "{connection_file}"], "language": "python"}
    (folder / "kernel.json").write_text(json.dumps({**spec, "display_name": "Python (bakeoff)"}))


def test_named_kernel_is_used_only_when_it_runs_this_interpreter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))
    _kernelspec(tmp_path, sys.executable)
    assert paths.notebook_kernel() == "bakeoff"
    _kernelspec(tmp_path, "/some/other/venv/bin/python")
    assert paths.notebook_kernel() == "python3"


def test_engine_interpreter_is_found_or_names_its_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(engine_env, "checkout_root", lambda: None)
    assert find_engine_python() is None
    with pytest.raises(LaunchError, match=r"no engine environment .*scripts/bootstrap.sh .*BAKEOFF_ENGINE_PYTHON"):
        engine_python()
    local = tmp_path / ".venv-engine" / "bin" / "python"
    local.parent.mkdir(parents=True)
    local.symlink_to(sys.executable)
    assert find_engine_python() == local  # the link itself: following it would leave the venv
    monkeypatch.setenv(ENGINE_PYTHON_ENV, str(tmp_path / "nothing"))
    with pytest.raises(LaunchError, match=r"BAKEOFF_ENGINE_PYTHON=.*nothing: not an executable"):
        engine_python()


def test_engine_backends_render_with_the_engine_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENGINE_PYTHON_ENV, sys.executable)
    vllm_cpu, llamacpp = load_backend("vllm-cpu"), load_backend("llamacpp")
    assert vllm_cpu.python == "engine" and llamacpp.python == "harness"
    monkeypatch.setenv(ENGINE_PYTHON_ENV, "/opt/engine/bin/python")
    monkeypatch.setattr(os, "access", lambda path, mode: True)
    launch = render_launch(vllm_cpu, {}, model="/m", served_model_name="m", port=8000, python=interpreter(vllm_cpu))
    assert launch.argv[:3] == ["/opt/engine/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert interpreter(llamacpp) == sys.executable


def test_run_versions_carry_the_engine_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The harness's own interpreter stands in for the engine's: its versions are known here.
    monkeypatch.setenv(ENGINE_PYTHON_ENV, sys.executable)
    engine = versions(load_backend("vllm-cpu"))["engine"]
    assert engine["interpreter"] == sys.executable and engine["python"] == platform.python_version()
    assert engine.get("transformers") == versions()["transformers"]
    assert engine_versions(load_backend("llamacpp")) is None and "engine" not in versions(load_backend("llamacpp"))


def _saved_campaign(root: Path, runs: list[str]) -> Path:
    (root / "cells" / "ref__w" / "runs").mkdir(parents=True)
    (root / "campaign.yaml").write_text("name: x\n")
    for run in runs:
        (root / "cells" / "ref__w" / "runs" / run).mkdir()
        (root / "cells" / "ref__w" / "runs" / run / "summary.json").write_text("{}")
    return root


def test_bench_notebook_parameters_say_what_to_set(tmp_path: Path) -> None:
    guard = bench_ready("", "", "", measure=False)
    assert not guard.ready and "Set `campaign_dir`" in guard.message
    assert "not a campaign folder" in bench_ready(str(tmp_path), "a", "b", measure=False).message
    campaign = _saved_campaign(tmp_path / "c", ["c2", "c4"])
    guard = bench_ready(str(campaign), "", "", measure=False)
    assert not guard.ready and "`server_label = 'ref'`, `workload_name = 'w'`" in guard.message
    guard = bench_ready(str(campaign), "ref", "other", measure=False)
    assert not guard.ready and "No saved runs for cell `ref__other`" in guard.message
    assert "set `measure = True`" in guard.message
    guard = bench_ready(str(campaign), "ref", "w", measure=False)
    assert guard.ready and "2 saved run(s)" in guard.message and "nothing is re-measured" in guard.message
    assert bench_ready(str(campaign), "ref", "other", measure=True).ready


def test_campaign_without_an_engine_environment_stops_before_any_server(
    tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bakeoff.campaign.cells import prepare
    from bakeoff.serving import engine_env

    monkeypatch.setattr(engine_env, "find_engine_python", lambda: None)
    campaign = {
        "name": "no-engine",
        "model": {"path": str(tiny_model), "served_name": "tiny"},
        "servers": [{"backend": "vllm-cpu", "label": "v"}],
        "workloads": [{"kind": "concurrency", "name": "w", "levels": [1], "input_len": 16, "output_len": 4}],
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(campaign))
    with pytest.raises(LaunchError, match=r"no engine environment .*scripts/bootstrap.sh"):
        prepare(path, tmp_path / "out")
    assert not (tmp_path / "out" / "cells").exists()
