"""The smoke run: its judgements and table without servers, and one rehearsal against the stand-ins."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from bakeoff.backends.launch_render import RenderedLaunch
from bakeoff.backends.spec import load_backend
from bakeoff.campaign.campaign_input import load_input
from bakeoff.campaign.cells import Cell, rehearsal_cells, validate_campaign
from bakeoff.campaign.execute import run_campaign, wants_smoke
from bakeoff.campaign.smoke import (
    classify_metrics,
    judge_cache_reset,
    judge_non_streamed,
    run_smoke,
    smoke_prompt,
    smoke_table_text,
)
from bakeoff.errors import LaunchError
from bakeoff.report.serving_checks import effective_values_table, smoke_table
from bakeoff.results.smoke import SmokeResult, SmokeServer, SmokeStep, read_smoke, smoke_rows
from bakeoff.results.store import write_json
from bakeoff.serving.handle import ServerHandle

REPO = Path(__file__).resolve().parents[1]
THREE = REPO / "campaigns" / "gpu-7b-three-frameworks.yaml"
BUILD_COST = REPO / "campaigns" / "gpu-7b-build-cost.yaml"


def test_a_lazy_counter_is_marked_lazy_a_speculative_one_off_and_an_unmapped_name_missing() -> None:
    sglang = load_backend("sglang")
    names = sglang.metrics.names
    # A scrape before any cache hit or retraction, speculation off: what SGLang 0.5.23 exports.
    absent = {names["prefix_cache_hits"], names["preemptions"], names["spec_drafts"]}
    snapshot = {native: 1.0 for native in names.values() if native not in absent}
    states = {c.name: c.state for c in classify_metrics(snapshot, sglang, speculating=False)}
    assert states["prefix_cache_hits"] == states["cached_tokens"] == "lazy"
    assert states["preemptions"] == "lazy" and states["spec_drafts"] == "off"
    assert states["prompt_tokens"] == "found"
    speculating = {c.name: c.state for c in classify_metrics(snapshot, sglang, speculating=True)}
    assert speculating["spec_drafts"] == "lazy"
    # vLLM registers its prompt counter at start: absent, the YAML's name is wrong.
    vllm = load_backend("vllm")
    partial = {native: 1.0 for name, native in vllm.metrics.names.items() if name != "prompt_tokens"}
    checks = {c.name: c for c in classify_metrics(partial, vllm, speculating=False)}
    assert checks["prompt_tokens"].state == "missing" and checks["prefix_cache_hits"].hit_counter


@pytest.mark.parametrize(
    ("hit", "after", "ok", "said"),
    [
        (80.0, 0.0, True, "hit 80 tokens before the reset, 0 after"),
        (0.0, 0.0, False, "did not hit"),
        (80.0, 16.0, False, "still hit 16 tokens after it"),
    ],
)
def test_a_cache_reset_is_verified_by_a_hit_before_and_a_miss_after(
    hit: float, after: float, ok: bool, said: str
) -> None:
    passed, detail = judge_cache_reset(hit, after, "reset")
    assert passed is ok and said in detail


def test_a_non_streamed_answer_needs_a_text_choice_and_usage() -> None:
    good = {"choices": [{"text": "abc"}], "usage": {"completion_tokens": 8}}
    assert judge_non_streamed(200, good, "") == (True, "8 tokens")
    assert judge_non_streamed(200, {"choices": [{"text": "abc"}]}, "")[0] is False
    refused = judge_non_streamed(400, None, "Extra inputs are not permitted")
    assert refused[0] is False and "HTTP 400" in refused[1] and "Extra inputs" in refused[1]
    assert judge_non_streamed(None, None, "ConnectionRefusedError")[1].startswith("HTTP no answer")


def test_smoke_prompts_share_no_prefix() -> None:
    one, two = smoke_prompt("a1"), smoke_prompt("a2")
    assert one.split()[0] != two.split()[0] and len(one.split()) == len(two.split()) > 64


def test_the_smoke_runs_by_default_only_on_a_real_run_of_gpu_servers() -> None:
    gpu = validate_campaign(THREE)
    rehearsed = rehearsal_cells(gpu)
    assert wants_smoke("auto", gpu)
    assert not wants_smoke("auto", rehearsed)  # a rehearsal smokes when asked
    assert wants_smoke("only", rehearsed) and not wants_smoke("off", gpu)


def test_a_server_that_does_not_start_fails_the_smoke_at_start_naming_it(tmp_path: Path) -> None:
    cells = validate_campaign(THREE)

    @contextlib.contextmanager
    def refused(cell: Cell, run_dir: Path) -> Iterator[tuple[ServerHandle, RenderedLaunch]]:
        raise LaunchError(f"{cell.server.label} exited during startup")
        yield  # pragma: no cover - never reached

    result = run_smoke(cells, tmp_path, refused)
    assert not result.passed and [s.label for s in result.servers] == ["vllm", "sglang", "trtllm"]
    assert result.failures()[0].startswith("server 'vllm' (vllm): step 'start' failed: vllm exited")
    later = [s for s in result.servers[0].steps if s.step != "start"]
    assert later and all(s.ok is None and s.detail == "the server did not start" for s in later)
    assert read_smoke(tmp_path) == result  # smoke.json holds what was found
    assert "FAILED" in smoke_table_text(result)


def test_a_server_that_answers_nothing_fails_health_and_a_stop_that_fails_is_said(tmp_path: Path) -> None:
    cell = validate_campaign(THREE)[0]

    @contextlib.contextmanager
    def silent(cell: Cell, run_dir: Path) -> Iterator[tuple[ServerHandle, RenderedLaunch]]:
        handle = ServerHandle("http://127.0.0.1:9", "m", run_dir / "server.log", "cmd", 1.0, "container")
        yield handle, RenderedLaunch(cell.backend, [], {}, None, {}, {})
        raise LaunchError("container bakeoff-vllm would not stop")

    [server] = run_smoke([cell], tmp_path, silent).servers
    marks = {s.step: s.ok for s in server.steps}
    assert marks["start"] is True and marks["health"] is False and marks["metrics"] is None
    assert server.steps[-1].step == "stop" and server.steps[-1].detail == "container bakeoff-vllm would not stop"


def test_the_smoke_table_says_each_step_and_which_metric_names_are_lazy() -> None:
    server = SmokeServer(
        label="sglang",
        backend="sglang",
        launcher="container",
        steps=[
            SmokeStep(step="start", ok=True, seconds=61.0),
            SmokeStep(step="metrics", ok=False, detail="/metrics lacks sglang:prompt_tokens_total"),
            SmokeStep(step="stop", ok=None, detail="after the failed 'metrics'"),
        ],
    )
    row = smoke_rows(SmokeResult(servers=[server]))[0]
    assert row["start"] == "ok 61.0 s" and row["metrics"] == "FAILED: /metrics lacks sglang:prompt_tokens_total"
    assert row["stop"] == "not checked: after the failed 'metrics'" and row["health"] == "-"


def test_the_report_shows_the_image_defaults_beside_the_declared_ones_for_unset_knobs(tmp_path: Path) -> None:
    server = {
        "effective_knobs": {"max_num_seqs": 2048, "max_num_batched_tokens": 8192, "dtype": "float16"},
        "image_defaults": {"max_num_seqs": 2048, "max_num_batched_tokens": 8192 * 2, "dtype": "auto"},
    }
    cell = {"server": {"label": "trtllm", "knobs": {"dtype": "float16"}}, "backend": "trtllm"}
    write_json(tmp_path / "cells" / "trtllm__sweep" / "cell.json", {**cell, "effort": {"server": server}})
    bare = {"server": {"label": "vllm", "knobs": {}}, "backend": "vllm", "effort": {"server": {}}}
    write_json(tmp_path / "cells" / "vllm__sweep" / "cell.json", bare)
    write_json(tmp_path / "preflight.json", {"skipped": True, "servers": {}})
    rows = {(r["server"], r["knob"]): r for r in effective_values_table(tmp_path).to_dict("records")}
    assert rows[("trtllm", "max_num_batched_tokens")]["image default (pre-flight)"] == 16384
    assert rows[("trtllm", "max_num_batched_tokens")]["differs"] == "yes"
    assert rows[("trtllm", "max_num_seqs")]["differs"] == "no"
    assert ("trtllm", "dtype") not in rows  # set by the campaign: its value is what ran
    assert "skipped" in rows[("vllm", "-")]["image default (pre-flight)"]


def test_a_rehearsed_smoke_finds_sglangs_hit_counter_after_the_first_hit_and_verifies_each_reset(
    tmp_path: Path, tiny_model: Path
) -> None:
    # The build-cost campaign's SGLang (an HTTP reset) and TensorRT-LLM engine flow (a restart).
    found = run_campaign(
        load_input(BUILD_COST, rehearse=True), out_dir=tmp_path, only=["sglang", "trtllm-engine"], smoke="only"
    )
    result = read_smoke(found.parent)
    assert result is not None and result.passed and result.rehearsal
    sglang, trtllm = result.servers
    hits = next(c for c in sglang.metrics if c.native == "sglang:cached_tokens_total")
    assert hits.state == "lazy" and hits.after_first_hit is True  # absent at the scrape, there after a hit
    reset = sglang.step("cache reset")
    assert reset is not None and "before the reset (/flush_cache), 0 after" in reset.detail
    restart = trtllm.step("cache reset")
    assert restart is not None and "blocks before the restart, 0 after" in restart.detail
    assert not (found.parent / "cells").exists()  # nothing measured
    table = smoke_table(found.parent)
    assert list(table["server"]) == ["sglang [rehearsal]", "trtllm-engine [rehearsal]"]
