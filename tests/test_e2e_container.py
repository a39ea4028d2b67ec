"""vLLM-CPU in a real podman container, end to end through the campaign path GPUs use.

The container is started by the campaign; the local-process server it is compared with is
the session's started engine (``vllm_tiny``, cpu-container.yaml's knobs), reached by url.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bakeoff.campaign import run_campaign
from bakeoff.containers import find_runtime, inspect_image, leftover_containers
from bakeoff.report import effort_table, results_frame
from engines import Engine, campaign_against

pytestmark = [pytest.mark.e2e, pytest.mark.container]
REPO = Path(__file__).resolve().parents[1]
IMAGE = "localhost/bakeoff/vllm-cpu:0.32.0"


@pytest.fixture(scope="module")
def podman() -> str:
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (make test installs it with scripts/setup-podman.sh)")
    runtime = find_runtime("podman")
    if not inspect_image(runtime, IMAGE, missing_ok=True).present:
        pytest.fail(f"{IMAGE} missing: run scripts/build-images.sh vllm-cpu (make test does)")
    return runtime


def test_vllm_cpu_in_a_container_through_a_campaign(
    podman: str, vllm_tiny: Engine, tiny_model: Path, tmp_path: Path
) -> None:
    out = tmp_path / "container"
    shipped = REPO / "campaigns" / "cpu-container.yaml"
    campaign = campaign_against(shipped, {"vllm-process": vllm_tiny}, tmp_path / "c.yaml")
    report = run_campaign(campaign, out_dir=out)
    frame = results_frame(out)
    assert set(frame["server"]) == {"vllm-container", "vllm-process"}
    assert (frame["ok"] == 8).all() and (frame["failed"] == 0).all()
    cell = out / "cells" / "vllm-container__sweep"
    info = json.loads((cell / "cell.json").read_text())
    server = info["effort"]["server"]
    assert server["kind"] == "container" and server["image"] == IMAGE
    assert server["image_digest"].startswith("sha256:")
    assert "--ipc=host" in server["command_line"] or "--shm-size" in server["command_line"]
    assert "Application startup complete" in (cell / "server.log").read_text()  # engine log captured
    effort = effort_table(out).set_index("server")
    assert effort.loc["vllm-container", "cold start s"] > 0
    assert effort.loc["vllm-container", "image build s"] > 0
    assert not leftover_containers(podman)
    assert report.is_file()
