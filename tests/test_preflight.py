"""Tests of bakeoff.conformance.preflight and bakeoff.campaign.preflight_cells (``bakeoff campaign preflight``).

The command shapes and the rehearsal stand-in are checked without an engine; the real
pre-flight parses the vLLM-CPU launch inside its locally built image (``container``) and
with the engine environment (``e2e``), and refuses a planted flag with vLLM's own message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import prerequisites
from bakeoff.backends.launch_render import render_launch
from bakeoff.backends.spec import load_backend
from bakeoff.campaign.campaign_input import load_input
from bakeoff.campaign.cells import expand, rehearsal_cells
from bakeoff.campaign.preflight_cells import preflight_campaign, preflight_cells, refuse_on_failure
from bakeoff.campaign.specs import load_campaign
from bakeoff.conformance.preflight import PreflightResult, framework_message, parser_args, preflight_command
from bakeoff.errors import SpecError
from bakeoff.serving.containers import render_container_launch

REPO = Path(__file__).resolve().parents[1]
IMAGE = "localhost/bakeoff/vllm-cpu:0.32.0"


def test_the_parser_sees_the_argv_after_each_frameworks_program() -> None:
    vllm = render_launch(load_backend("vllm"), {}, model="/model", served_model_name="m", port=8000)
    assert parser_args(vllm.backend, vllm.argv)[:2] == ["--model", "/model"]  # `vllm serve MODEL`
    sglang = render_launch(load_backend("sglang"), {}, model="/model", served_model_name="m", port=8000)
    assert parser_args(sglang.backend, sglang.argv)[:2] == ["--model-path", "/model"]
    trt = render_container_launch(load_backend("trtllm"), {"speculative": "ngram"}, served_model_name="m")
    args = parser_args(trt.backend, trt.argv)
    assert args[0] == "/model" and args[-2:] == ["--config", "/bakeoff/options.yaml"]


def test_the_command_runs_in_the_image_offline_with_the_rendered_options() -> None:
    launch = render_container_launch(load_backend("trtllm"), {"speculative": "draft"}, served_model_name="m")
    command = preflight_command(launch, runtime="podman", python="python3", model="/model")
    image = load_backend("trtllm").container
    assert image is not None
    at = command.index("run")
    assert command[at : at + 6] == ["run", "--rm", "--network", "none", "--entrypoint", "python3"]
    assert command[at + 6] == image.image and command[at + 7] == "-c"
    assert "TorchLlmArgs.model_validate" in command[at + 8]
    payload = json.loads(command[-1])
    assert payload["config_path"] == "/bakeoff/options.yaml" and payload["prog"] == "trtllm-serve"
    assert yaml.safe_load(payload["config"])["speculative_config"]["decoding_type"] == "Draft_Target"


def test_the_frameworks_own_error_line_is_quoted() -> None:
    stderr = "usage: vllm serve [-h] ...\nvllm serve: error: unrecognized arguments: --bogus\n"
    assert framework_message(stderr) == "vllm serve: error: unrecognized arguments: --bogus"
    trace = "Traceback (most recent call last):\n  ...\npydantic_core.ValidationError: 1 validation error\n"
    assert framework_message(trace).startswith("pydantic_core.ValidationError")


def test_a_refusal_stops_the_campaign_naming_the_server() -> None:
    results = [
        PreflightResult("a", "vllm", "ok", ""),
        PreflightResult("b", "sglang", "refused", "error: unrecognized arguments: --x"),
    ]
    with pytest.raises(SpecError, match=r"preflight refused b \(sglang\): refused: error: unrecognized arguments"):
        refuse_on_failure(results, Path("c.yaml"))
    refuse_on_failure(results[:1], Path("c.yaml"))


def _planted(tmp_path: Path, name: str, flag: str, after: str) -> Path:
    folder = tmp_path / "backends"
    folder.mkdir(exist_ok=True)
    text = (REPO / "backends" / f"{name}.yaml").read_text()
    assert after in text
    (folder / f"{name}.yaml").write_text(text.replace(after, f"{after}\n  - {flag}", 1))
    return folder


def test_a_rehearsal_stands_in_for_the_gpu_images_with_the_wheels_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prerequisites.wheel("vllm==0.33.0")
    prerequisites.wheel("sglang==0.5.23")
    path = REPO / "campaigns" / "gpu-7b-three-frameworks.yaml"
    results = {r.label: r for r in preflight_campaign(load_input(path, rehearse=True))}
    statuses = {r.backend: r.status for r in results.values()}
    assert statuses == {"vllm": "ok", "sglang": "ok", "trtllm": "skipped"}
    assert all(r.command and "--network" in r.command for r in results.values())  # recorded as on a GPU host

    monkeypatch.setenv("BAKEOFF_BACKENDS_DIR", str(_planted(tmp_path, "vllm", "--planted-bad-flag", '  - "8000"')))
    cells = rehearsal_cells(expand(load_campaign(path), None))
    [vllm] = [r for r in preflight_cells(cells) if r.backend == "vllm"]
    assert vllm.status == "refused" and "--planted-bad-flag" in vllm.detail


# --- for real: vLLM's own parser -------------------------------------------------------


@pytest.mark.e2e
def test_the_vllm_cpu_process_launch_is_parsed_by_vllm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(
        "BAKEOFF_BACKENDS_DIR",
        str(_planted(tmp_path, "vllm-cpu", "--planted-bad-flag", "  - --disable-uvicorn-access-log")),
    )
    campaign = yaml.safe_load((REPO / "campaigns" / "cpu-container.yaml").read_text())
    campaign["servers"] = [s for s in campaign["servers"] if s["backend"] == "vllm-cpu"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(campaign))
    [result] = preflight_campaign(path)
    assert result.status == "refused"
    assert result.detail == "vllm serve: error: unrecognized arguments: --planted-bad-flag"


@pytest.mark.container
def test_the_container_launch_is_parsed_inside_its_image_and_a_bad_flag_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prerequisites.image(IMAGE)
    campaign = yaml.safe_load((REPO / "campaigns" / "cpu-container.yaml").read_text())
    campaign["servers"] = [s for s in campaign["servers"] if s["backend"] == "vllm-cpu-container"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(campaign))
    # The unchanged launch parses "ok" in the container campaign's own pre-flight
    # (tests/test_e2e_container.py): here only the refusal, one container start fewer.
    after = "  - --disable-uvicorn-access-log"
    monkeypatch.setenv(
        "BAKEOFF_BACKENDS_DIR", str(_planted(tmp_path, "vllm-cpu-container", "--planted-bad-flag", after))
    )
    [refused] = preflight_campaign(path)
    assert refused.status == "refused" and refused.command[:2] == ["podman", "run"]
    assert refused.detail == "vllm serve: error: unrecognized arguments: --planted-bad-flag"
