"""vLLM-CPU in a real podman container and llama.cpp as a local process, end to end through a campaign.

The shipped cpu-container campaign, with its second server a llama.cpp process instead of a
second vLLM-CPU start (its one minute of both cores bought nothing the container and the
INT4 test's process launch do not already show): the campaign launches both itself — the
container through the launcher GPUs use, llama.cpp as a campaign starts any local engine —
measures each cell in its own process (a notebook kernel per cell is the same measuring code
behind a transport; tests/test_resume.py and tests/test_packaging.py run cells through kernels,
and four kernel starts here cost about 20 CPU-s of a busy phase), renders the report in its
notebook kernel and is read in headless Chromium (tests/browser.py). This is the suite's one
campaign that starts real engines of its own, so it
is where the measured start (cold start, flags changed in the effort table), cost and SLO
figures are checked on real engines, and where llama.cpp runs inside a campaign.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import prerequisites
from bakeoff.backends.spec import load_backend
from bakeoff.campaign.execute import run_campaign
from bakeoff.campaign.specs import load_campaign
from bakeoff.report.tables import effort_table, results_frame
from bakeoff.results.store import read_summary
from bakeoff.serving.container_runtime import find_runtime
from bakeoff.serving.containers import leftover_containers
from browser import open_in_chromium
from engines import campaign_against

pytestmark = [pytest.mark.e2e, pytest.mark.container]
REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "campaigns" / "cpu-container.yaml"
IMAGE = "localhost/bakeoff/vllm-cpu:0.32.0"


@pytest.fixture(scope="module")
def podman() -> str:
    prerequisites.image(IMAGE)
    return find_runtime("podman")


# The process side: llama.cpp on the same model, two knobs away from its defaults.
LLAMACPP_KNOBS: dict[str, object] = {"max_num_seqs": 8, "max_model_len": 1024}
LLAMACPP = {"backend": "llamacpp", "label": "llamacpp-process", "knobs": LLAMACPP_KNOBS, "cost_per_hour_usd": 0.1}


def _container_and_llamacpp(dest: Path) -> Path:
    """The shipped file with one repeat, its vLLM-CPU process server replaced by LLAMACPP."""
    path = campaign_against(SHIPPED, {}, dest)
    campaign = yaml.safe_load(path.read_text())
    campaign["servers"] = [s for s in campaign["servers"] if s["backend"] != "vllm-cpu"] + [LLAMACPP]
    path.write_text(yaml.safe_dump(campaign, sort_keys=False))
    load_campaign(path)
    return path


def test_vllm_cpu_in_a_container_and_llamacpp_as_a_process_through_a_campaign(
    podman: str, tiny_model: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "container"
    campaign = _container_and_llamacpp(tmp_path / "c.yaml")
    report = run_campaign(campaign, out_dir=out, cell_notebooks=False)
    assert not leftover_containers(podman)
    # Before any start, the container's launch was parsed by vLLM's own parser in its image
    # (a refusal, and the process launch's parse: tests/test_preflight.py).
    said = capfd.readouterr().err
    assert "preflight: vllm-container (vllm-cpu-container): ok: vllm's own parser took the launch" in said, said
    frame = results_frame(out)
    assert set(frame["server"]) == {"vllm-container", "llamacpp-process"}
    assert sorted(frame["concurrency"]) == [1, 1, 4, 4]
    assert (frame["ok"] == 8).all() and (frame["failed"] == 0).all()

    # The container: its command, image digest and engine log.
    cell = out / "cells" / "vllm-container__sweep"
    server = json.loads((cell / "cell.json").read_text())["effort"]["server"]
    assert server["kind"] == "container" and server["image"] == IMAGE
    assert server["image_digest"].startswith("sha256:")
    assert "--ipc=host" in server["command_line"] or "--shm-size" in server["command_line"]
    assert "Application startup complete" in (cell / "server.log").read_text()  # engine log captured
    effort = effort_table(out).set_index("server")
    assert effort.loc["vllm-container", "cold start s"] > 0
    assert effort.loc["vllm-container", "image build s"] > 0

    # The process: effort, cost and SLO reached the summary; the report ran in its kernel.
    cell = out / "cells" / "llamacpp-process__sweep"
    assert (out / "compare.ipynb").is_file()
    summary = read_summary(cell / "runs" / "c4" / "summary.json")
    assert summary.effort is not None and summary.cost is not None and summary.slo is not None
    assert summary.effort.cold_start_s and summary.effort.cold_start_s > 0
    # Every knob the campaign sets differs from the backend's default, counted and on the command line.
    defaults = load_backend("llamacpp").knobs
    changed = {name: value for name, value in LLAMACPP_KNOBS.items() if value != defaults[name].default}
    assert changed == LLAMACPP_KNOBS
    assert summary.effort.flags_changed == len(changed) and summary.effort.non_default_knobs == changed
    server = json.loads((cell / "cell.json").read_text())["effort"]["server"]
    assert server["kind"] == "process" and "llama-server" in server["command_line"]
    assert "--parallel 8" in server["command_line"] and "--kv-unified-per-slot 1024" in server["command_line"]
    assert summary.cost.usd_per_million_output_tokens and summary.cost.usd_per_million_output_tokens > 0
    # The campaign's SLO judged the requests inside the run's steady-state window. (Whether llama.cpp
    # meets it at c4 depends on what else the two cores run: with the other worker's engines on 1.5
    # of them, one of the window's two requests missed once; the wiring is what this test owns.)
    bounds = load_campaign(campaign).slo
    assert (summary.slo.ttft_ms, summary.slo.tpot_ms) == (bounds.ttft_ms, bounds.tpot_ms) != (None, None)
    assert summary.window is not None and summary.window.requests_inside >= 1
    assert 1 <= summary.slo.met <= summary.window.requests_inside
    assert summary.slo.attainment == pytest.approx(summary.slo.met / summary.window.requests_inside)

    # The report, as a browser shows it: no error, figures embedded and decoded, nothing fetched.
    seen = open_in_chromium(report, tmp_path)
    assert seen["errors"] == [] and seen["fetched"] == [], seen
    assert seen["undecoded"] == [] and isinstance(seen["images"], int) and seen["images"] >= 1
    headings = " | ".join(str(h) for h in seen["headings"])  # type: ignore[attr-defined]
    for heading in ("bakeoff report: cpu-container", "Summary", "Engineering effort", "Glossary"):
        assert heading in headings
