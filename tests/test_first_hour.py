"""A new user's first hour: messages, refusals and progress they act on, without real engines."""

from __future__ import annotations

import argparse
import datetime as dt
import io
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest
import yaml

from bakeoff.backends.spec import list_backends, load_backend
from bakeoff.campaign.cells import validate_campaign
from bakeoff.campaign.gpu_host import gpu_host_steps
from bakeoff.campaign.progress import CampaignProgress, CellEstimate, cell_result, estimate_cell
from bakeoff.campaign.specs import load_campaign
from bakeoff.cli import main as cli
from bakeoff.cli.bench_cmd import claim_out, report_failures
from bakeoff.errors import SpecError
from bakeoff.measure.metrics import summarize
from bakeoff.models.model_source import ModelSource
from bakeoff.ref.options import MODEL
from bakeoff.report import explain
from bakeoff.report.measured_apart import measured_apart_note
from bakeoff.report.tables import effort_notes, setup_table, start_note, styled
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import write_summary
from bakeoff.results.summary import Provenance
from bakeoff.serving.containers import render_container_launch
from bakeoff.serving.launchers import rehearsed_container_command
from bakeoff.serving.reference import serve_reference
from bakeoff.serving.show_launch import describe_launch
from bakeoff.workloads.kinds import ConcurrencySweep, MultiTurn, OpenLoop
from bakeoff.workloads.plans import PlanBuilder
from bakeoff.workloads.prompts import PromptFactory, load_tokenizer

REPO = Path(__file__).resolve().parents[1]


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(args))
    except SystemExit as exc:  # argparse refusals
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parsers(child)


def test_every_option_states_its_default_and_help_is_plain_text() -> None:
    parser = cli.build_parser()
    for sub in _parsers(parser):
        text = sub.format_help()
        assert ":class:" not in text and "``" not in text, sub.prog
        formatter = sub._get_formatter()
        for action in sub._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS or action.dest == "help":
                continue
            help_text = formatter._expand_help(action) if action.help else ""
            assert action.required or "default" in help_text, f"{sub.prog} {action.option_strings[0]}: {help_text!r}"


def test_backends_list_has_a_header_and_show_lists_knobs_at_their_default(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "backends", "list")
    assert code == 0 and out.splitlines()[0].split() == ["NAME", "RUNTIME", "HW", "DESCRIPTION"]
    code, out, _ = run_cli(capsys, "backends", "show", "vllm", "--knob", "chunked_prefill=true")
    assert code == 0
    knobs = out.split("knobs:\n", 1)[1].split("\n\n", 1)[0]
    assert "chunked_prefill = true" in knobs and "the same value" in knobs
    assert "all at the backend's defaults" not in out


# --- campaign files ---------------------------------------------------------------------


def write(path: Path, spec: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump(spec))
    return path


BASE = {
    "name": "t",
    "servers": [{"backend": "vllm-cpu"}],
    "workloads": [{"kind": "concurrency", "levels": [1], "input_len": 8, "output_len": 8}],
}


def test_the_annotated_example_campaign_is_valid_and_covers_every_section() -> None:
    path = REPO / "campaigns" / "example-annotated.yaml"
    spec = load_campaign(path)
    text = path.read_text()
    # Each top-level key a campaign can have appears in the example, set or commented.
    for key in type(spec).model_fields:
        assert f"\n{key}:" in text, key
    assert {type(w).__name__ for w in spec.workloads} >= {"ConcurrencySweep", "OpenLoop", "MultiTurn"}
    assert validate_campaign(path)


@pytest.mark.parametrize(
    ("written", "expected"), [("tiny", {"preset": "tiny"}), ("models/tiny", {"path": "models/tiny"})]
)
def test_model_shorthand_string(tmp_path: Path, written: str, expected: dict[str, str]) -> None:
    spec = load_campaign(write(tmp_path / "c.yaml", {**BASE, "model": written}))
    if "preset" in expected:
        assert spec.model.preset == "tiny" and spec.model.path is None
    else:
        # Not beside the campaign file: resolved against the working directory, absolute.
        assert spec.model.path == (Path.cwd() / "models/tiny").resolve()


def test_a_bad_model_value_shows_the_right_forms_not_a_class_name(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        load_campaign(write(tmp_path / "c.yaml", {**BASE, "model": 7}))
    assert "ModelRef" not in str(err.value) and "{preset: tiny|small|trained}" in str(err.value)
    with pytest.raises(SpecError) as err:
        load_campaign(write(tmp_path / "c.yaml", {**BASE, "model": {"preset": "tiny"}, "slo": 5}))
    assert "Slo" not in str(err.value) and "slo: expected a mapping" in str(err.value)


@pytest.mark.parametrize(
    ("patch", "where", "keys"),
    [
        ({"modle": 1}, "modle", "name, description, model, servers"),
        ({"model": {"preset": "tiny", "pth": "x"}}, "model.pth", "preset, path, hf_id"),
        ({"servers": [{"backend": "vllm-cpu", "knob": {}}]}, "servers.0.knob", "backend, label, knobs"),
        (
            {"workloads": [{"kind": "open_loop", "rate": [1], "rates": [1], "input_len": 8, "output_len": 8}]},
            "workloads.0.rate",
            "rates, arrival, burstiness",
        ),
    ],
)
def test_an_unknown_key_lists_the_valid_keys_of_its_section(
    tmp_path: Path, patch: dict[str, object], where: str, keys: str
) -> None:
    spec = {**BASE, "model": "tiny", **patch}
    with pytest.raises(SpecError) as err:
        load_campaign(write(tmp_path / "c.yaml", spec))
    message = str(err.value)
    assert f"{where}: unknown key" in message and keys in message, message


def test_a_relative_model_path_is_found_beside_the_campaign_and_the_copy_keeps_it(tmp_path: Path) -> None:
    (tmp_path / "campaigns").mkdir()
    (tmp_path / "campaigns" / "m").mkdir()
    path = write(tmp_path / "campaigns" / "c.yaml", {**BASE, "model": "m"})
    spec = load_campaign(path)
    assert spec.model.path == (tmp_path / "campaigns" / "m").resolve()
    from bakeoff.campaign.specs import campaign_copy

    copied = tmp_path / "copy.yaml"
    copied.write_bytes(campaign_copy(path, spec))
    assert load_campaign(copied).model.path == spec.model.path  # a copy elsewhere still finds it


def test_a_missing_model_folder_error_names_the_absolute_path_tried(tmp_path: Path) -> None:
    path = write(tmp_path / "c.yaml", {**BASE, "model": "no-such-model"})
    with pytest.raises(SpecError) as err:
        validate_campaign(path)
    assert str((Path.cwd() / "no-such-model").resolve()) in str(err.value)


# --- estimates and progress -------------------------------------------------------------


@pytest.mark.parametrize(
    "workload",
    [
        ConcurrencySweep(levels=[1, 3], requests_per_level=5, warmup_requests=2, input_len=8, output_len=4),
        OpenLoop(rates=[5.0, 10.0], requests_per_rate=6, warmup_requests=1, input_len=8, output_len=4),
        MultiTurn(conversations=3, turns=2, system_prompt_len=16, user_len=4, output_len=4),
    ],
)
def test_the_request_estimate_matches_the_plans(tiny_model: Path, workload: object) -> None:
    plans = PlanBuilder(PromptFactory(load_tokenizer(tiny_model))).build(workload)  # type: ignore[arg-type]
    planned = sum(len(p.warmup) + len(p.requests) + sum(len(s.user_turns) for s in p.sessions) for p in plans)
    assert estimate_cell(workload, "cpu", "process", restart=False).requests == planned  # type: ignore[arg-type]


def test_estimates_grow_with_work_and_restarts() -> None:
    small = ConcurrencySweep(levels=[4], requests_per_level=8, input_len=8, output_len=16)
    big = small.model_copy(update={"output_len": small.output_len.model_copy(update={"mean": 160})})
    assert estimate_cell(big, "cpu", "process", False).seconds > estimate_cell(small, "cpu", "process", False).seconds
    once = estimate_cell(small, "cpu", "process", False).seconds
    assert estimate_cell(small, "cpu", "process", True).seconds > once


def test_progress_lines_show_position_estimate_result_and_a_summary() -> None:
    out = io.StringIO()
    progress = CampaignProgress([CellEstimate(10, 60.0), CellEstimate(20, 120.0), CellEstimate(5, 30.0)], out=out)
    progress.skip(0, "a__w", "already measured")
    progress.start(1, "b__w")
    progress.end("b__w", True, "2 run(s), best 100 output tok/s")
    progress.start(2, "c__w")
    progress.end("c__w", False, "its notebook kernel died")
    lines = out.getvalue().splitlines()
    assert lines[0] == "[1/3] a__w: already measured; skipped"
    assert lines[1].startswith("[2/3] b__w: 20 requests, about 2 min") and "left)" in lines[1]
    assert lines[2].strip().startswith("done in") and "best 100 output tok/s" in lines[2]
    # b took ~0 s against 120 s estimated: the next estimate is rescaled, not the raw 30 s.
    assert lines[3].startswith("[3/3] c__w: 5 requests, about 0 s")
    assert "FAILED" in lines[4]
    summary = progress.summary()
    assert summary.splitlines()[0].startswith("campaign: 2/3 cells ok")
    assert "skipped" in summary and "FAILED" in summary


def _saved_run(cell_dir: Path, run: str, ttfts_ms: list[float], completion_tokens: int, failed: int = 0) -> None:
    ms = 1_000_000
    records = [
        RequestRecord(
            i,
            start_ns=i * ms,
            first_token_ns=i * ms + int(t * ms),
            end_ns=i * ms + int(t * ms) + 1_000 * ms,
            completion_tokens=completion_tokens,
        )
        for i, t in enumerate(ttfts_ms)
    ]
    records += [RequestRecord(len(records) + i, start_ns=0, end_ns=ms, error_kind="http") for i in range(failed)]
    summary = summarize(records)
    summary.workload.run = run
    write_summary(cell_dir / "runs" / run / "summary.json", summary)


def test_a_finished_cell_is_summed_up_by_its_best_run_with_a_supported_ttft(tmp_path: Path) -> None:
    # 3 requests: P99 and P90 would be the largest sample stretched; the line shows P50, with n.
    _saved_run(tmp_path, "c1", [100.0, 110.0, 120.0], completion_tokens=10)
    _saved_run(tmp_path, "c4", [400.0, 420.0, 440.0], completion_tokens=40, failed=1)
    line = cell_result(tmp_path)
    assert line.startswith("2 run(s), best ") and "output tok/s (c4)" in line
    assert "P50 TTFT 420 ms (n=3)" in line and "P99" not in line
    assert line.endswith(", 1 failed request(s)")
    assert cell_result(tmp_path / "nothing") == "no runs saved"


# --- report provenance ------------------------------------------------------------------


def _run(folder: Path, cell: str, start: dt.datetime, versions: dict[str, str], image: str | None = None) -> None:
    run = folder / "cells" / cell / "runs" / "c1"
    run.mkdir(parents=True)
    end = start + dt.timedelta(minutes=2)
    info = {"started_at": start.isoformat(), "finished_at": end.isoformat(), "versions": versions}
    if image is not None:
        info["server"] = {"image": image}
    (run / "run.json").write_text(json.dumps(info))


def test_a_report_says_when_cells_were_measured_apart(tmp_path: Path) -> None:
    t0 = dt.datetime(2026, 3, 1, 9, 0, tzinfo=dt.UTC)
    _run(tmp_path, "a__w", t0, {"bakeoff": "1.0"})
    _run(tmp_path, "b__w", t0 + dt.timedelta(minutes=5), {"bakeoff": "1.0"})
    assert measured_apart_note(tmp_path) is None  # one sitting, one version
    _run(tmp_path, "c__w", t0 + dt.timedelta(days=2), {"bakeoff": "1.1"})
    note = measured_apart_note(tmp_path)
    assert note is not None
    assert "2 separate sittings" in note and "different software versions" in note
    assert "| c__w | 2026-03-03 09:00" in note and "bakeoff 1.1" in note and "| a__w | 2026-03-01 09:00" in note


def test_each_framework_s_own_image_is_not_a_change_of_software_but_one_server_s_new_image_is(tmp_path: Path) -> None:
    t0 = dt.datetime(2026, 3, 1, 9, 0, tzinfo=dt.UTC)
    harness = {"bakeoff": "1.0", "aiohttp": "3.14"}
    _run(tmp_path, "vllm__w", t0, harness, image="vllm/vllm-openai:v0.31.0")
    _run(tmp_path, "sglang__w", t0 + dt.timedelta(minutes=5), harness, image="lmsysorg/sglang:v0.5.18")
    assert measured_apart_note(tmp_path) is None  # the comparison itself: one image per framework
    _run(tmp_path, "vllm__w__r2", t0 + dt.timedelta(minutes=10), harness, image="vllm/vllm-openai:v0.32.0")
    note = measured_apart_note(tmp_path)
    assert note is not None and "different software versions" in note and "separate sittings" not in note
    assert "image vllm/vllm-openai:v0.32.0" in note


# --- bench ------------------------------------------------------------------------------


def bench_args(url: str, out: Path, *extra: str) -> list[str]:
    return ["bench", "--base-url", url, "--model", MODEL, "--out", str(out), "--warmup", "0", *extra]


def test_bench_base_url_ending_in_v1_suggests_dropping_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with serve_reference() as url:
        code, _, err = run_cli(capsys, *bench_args(url + "/v1", tmp_path / "r", "--concurrency", "1"))
    assert code == 2 and "drop the trailing /v1" in err and not (tmp_path / "r").exists()


def test_bench_refuses_to_replace_results_unless_forced(tmp_path: Path) -> None:
    out = tmp_path / "run"
    claim_out(out, force=False)  # new: fine
    out.mkdir()
    (out / "summary.json").write_text("{}")
    with pytest.raises(SpecError, match=r"already holds results; .* --force"):
        claim_out(out, force=False)
    claim_out(out, force=True)
    assert not out.exists()
    stranger = tmp_path / "home"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("mine")
    with pytest.raises(SpecError, match="not bakeoff results"):
        claim_out(stranger, force=True)
    assert (stranger / "notes.txt").exists()


# What each server states about its context: vLLM / SGLang in /v1/models, llama.cpp in its
# /v1/models meta and in /props (the shapes of llama.cpp's tools/server/server-context.cpp).
STATED_CONTEXT = {
    "max_model_len": {"/v1/models": {"data": [{"id": MODEL, "max_model_len": 100}]}},
    "meta.n_ctx": {"/v1/models": {"data": [{"id": MODEL, "meta": {"n_ctx": 100, "n_ctx_train": 2048}}]}},
    "/props n_ctx": {
        "/v1/models": {"data": [{"id": MODEL}]},
        "/props": {"default_generation_settings": {"n_ctx": 100}, "total_slots": 4},
    },
}


def _serve_json(pages: dict[str, object]) -> ThreadingHTTPServer:
    class Pages(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            page = pages.get(self.path)
            body = json.dumps(page).encode()
            self.send_response(200 if page is not None else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Pages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.parametrize("stated_as", list(STATED_CONTEXT))
def test_bench_refuses_requests_beyond_the_served_context(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, stated_as: str
) -> None:
    server = _serve_json(STATED_CONTEXT[stated_as])
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        code, _, err = run_cli(
            capsys, *bench_args(url, tmp_path / "r", "--concurrency", "1", "--input-len", "90", "--output-len", "20")
        )
    finally:
        server.shutdown()
    assert code == 2 and "need up to 110 tokens" in err and f"context of 100 (its {stated_as})" in err, err
    assert not (tmp_path / "r").exists()


def test_failed_counts_agree_between_the_failure_lines_and_the_table(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with serve_reference(fault="http500") as url:
        args = bench_args(url, tmp_path / "r", "--concurrency", "1", "--num-requests", "3", "--input-len", "8")
        code, out, err = run_cli(capsys, *args, "--output-len", "4", "--warmup", "2")
    assert code == 1
    header, _, row = out.splitlines()[:3]
    assert row.split()[header.split().index("failed")] == "3", out
    assert "3 request(s) failed (http)" in err and "2 warm-up request(s), not counted in the table, failed" in err


def test_bench_shows_the_servers_error_message(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with serve_reference(fault="http500") as url:
        args = bench_args(url, tmp_path / "r", "--concurrency", "2", "--num-requests", "3", "--input-len", "8")
        code, _, err = run_cli(capsys, *args, "--output-len", "4")
    assert code == 1
    assert "3 request(s) failed (http)" in err and "injected fault: internal server error" in err
    assert report_failures(tmp_path / "r")


def test_bench_runs_an_open_loop_and_conversations_through_the_planner(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, tiny_model: Path
) -> None:
    with serve_reference(ttft_ms=5, itl_ms=1) as url:
        code, _, err = run_cli(
            capsys,
            *bench_args(url, tmp_path / "open", "--rate", "20", "40", "--num-requests", "6"),
            "--input-len", "uniform:8:24", "--output-len", "4", "--tokenizer", str(tiny_model),
        )  # fmt: skip
        assert code == 0, err
        runs = sorted(p.name for p in (tmp_path / "open").iterdir())
        assert len(runs) == 2 and all(r.startswith("r") for r in runs), runs
        summary = json.loads((tmp_path / "open" / runs[0] / "summary.json").read_text())
        assert summary["workload"]["mode"] == "open" and summary["requests"]["ok"] == 6
        planned = json.loads((tmp_path / "open" / runs[0] / "run.json").read_text())["workload"]
        assert planned["kind"] == "open_loop" and planned["input_len"]["dist"] == "uniform"
        code, _, err = run_cli(
            capsys, *bench_args(url, tmp_path / "chat", "--turns", "2", "--conversations", "2", "--input-len", "8"),
            "--output-len", "4", "--system-prompt-len", "16", "--tokenizer", str(tiny_model),
        )  # fmt: skip
        assert code == 0, err
        summary = json.loads((tmp_path / "chat" / "summary.json").read_text())
        assert summary["workload"]["mode"] == "sessions" and summary["requests"]["ok"] == 4


def test_bench_refuses_conflicting_workload_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, *bench_args("http://127.0.0.1:9", tmp_path / "r", "--turns", "2", "--rate", "1"))
    assert code == 2 and "--turns and --rate" in err
    code, _, err = run_cli(capsys, *bench_args("http://127.0.0.1:9", tmp_path / "r"))
    assert code == 2 and "--concurrency N" in err
    code, _, err = run_cli(capsys, *bench_args("http://127.0.0.1:9", tmp_path / "r", "--rate", "0"))
    assert code == 2 and "--rate" in err


def test_report_command_refuses_a_folder_without_saved_runs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, "report", str(tmp_path))
    assert code == 2 and "not a campaign folder" in err
    (tmp_path / "campaign.yaml").write_text("name: x\n")
    code, _, err = run_cli(capsys, "report", str(tmp_path))
    assert code == 2 and "no saved runs" in err


def test_long_steps_show_elapsed_time_on_a_terminal_and_nothing_in_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    import io
    import time

    from bakeoff.console import working

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("CI", raising=False)
    shown = Terminal()
    with working("pulling img:1", stream=shown):
        # While the step still runs, the line is repainted with the time elapsed so far.
        deadline = time.monotonic() + 10
        while "00:01" not in shown.getvalue():
            assert time.monotonic() < deadline, f"no elapsed time shown while working: {shown.getvalue()!r}"
            time.sleep(0.05)
        assert "pulling img:1" in shown.getvalue()
    monkeypatch.setenv("CI", "true")
    quiet = Terminal()
    with working("pulling img:1", stream=quiet):
        pass
    assert quiet.getvalue() == ""


# --- stopping: SIGTERM as Ctrl-C ------------------------------------------------------------


def test_sigterm_stops_bench_like_ctrl_c_with_a_summary_and_the_partial_table(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with serve_reference(ttft_ms=5, itl_ms=20) as url:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bakeoff", "bench", "--base-url", url, "--model", MODEL, "--concurrency", "2",
             "--num-requests", "400", "--input-len", "8", "--output-len", "16", "--warmup", "0", "--out", str(out)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        journal = out / "records.jsonl"
        while not (journal.is_file() and len(journal.read_bytes().splitlines()) >= 3):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["requests"]["ok"] >= 3
    assert (out / "records.parquet").is_file()
    assert "(interrupted)" in stdout and "run" in stdout.splitlines()[0], stdout
    assert "Traceback" not in stderr


# --- messages: did you mean, plain words, locations ---------------------------------------------


@pytest.mark.parametrize(
    ("patch", "expected"),
    [
        ({"servers": [{"backend": "vllm-cpu", "knob": {}}]}, "servers.0.knob: unknown key (did you mean 'knobs'?)"),
        (
            {"workloads": [{"kind": "concurency", "levels": [1], "input_len": 8, "output_len": 8}]},
            "workloads.0.kind: unknown kind 'concurency' (did you mean 'concurrency'?); valid kinds: concurrency, "
            "open_loop, multi_turn",
        ),
        (
            {"workloads": [{"kind": "multi_turn", "conversations": 1, "turns": 2, "output_len": 8, "concurency": 2}]},
            "workloads.0.concurency: unknown key (did you mean 'concurrency'?); valid keys here: name",
        ),
        (
            {"workloads": [{"kind": "concurrency", "levels": [1], "input_len": 8, "output_len": 8, "warmup": 1}]},
            "workloads.0.warmup: unknown key (did you mean 'warmup_requests'?); valid keys here: name",
        ),
    ],
)
def test_typos_get_did_you_mean_the_valid_choices_and_no_pydantic_wording(
    tmp_path: Path, patch: dict[str, object], expected: str
) -> None:
    with pytest.raises(SpecError) as err:
        load_campaign(write(tmp_path / "c.yaml", {**BASE, "model": "tiny", **patch}))
    message = str(err.value)
    assert expected in message, message
    assert "Input tag" not in message and "Value error" not in message and "expected tags" not in message


def test_a_knob_typo_names_its_servers_knobs_location_and_the_closest_knob(tmp_path: Path) -> None:
    spec = {**BASE, "model": "tiny", "servers": [{"backend": "llamacpp", "knobs": {"max_num_seq": 4}}]}
    with pytest.raises(SpecError) as err:
        validate_campaign(write(tmp_path / "c.yaml", spec))
    assert str(err.value).startswith("servers.0.knobs (llamacpp): "), err.value
    assert "(did you mean 'max_num_seqs'?)" in str(err.value)


def test_a_base_url_without_a_scheme_is_told_to_add_http(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run_cli(capsys, *bench_args("127.0.0.1:8000", tmp_path / "r", "--concurrency", "1"))
    assert code == 2 and "add it: http://127.0.0.1:8000" in err and "unknown url type" not in err


def test_report_tables_show_concurrency_as_a_whole_number() -> None:
    frame = pd.DataFrame({"server": ["a", "b"], "concurrency": [1.0, None], "out tok/s": [12.345, 3.0]})
    html = styled(frame).to_html()
    assert ">1<" in html and "1.00" not in html and "12.35" in html


def test_a_warm_restart_clearly_slower_than_the_cold_start_is_flagged() -> None:
    assert "slower than the cold start (25 s)" in start_note(25.0, 50.0)
    assert start_note(25.0, 10.0) == "-" and start_note(None, 50.0) == "-"
    # Start-time noise is no finding: a second more of a second, or 10% more of a minute.
    assert start_note(1.03, 1.05) == "-" and start_note(55.0, 60.0) == "-"


def test_make_demo_leaves_the_report_line_to_campaign_run() -> None:
    recipe = (REPO / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert "campaign run" in recipe and "report:" not in recipe  # campaign run prints "report: PATH" itself


def test_validate_of_several_campaigns_counts_in_words_and_states_its_assumptions_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ladder, demo = (str(REPO / "campaigns" / f"{name}.yaml") for name in ("cpu-ladder", "cpu-demo"))
    code, out, _ = run_cli(capsys, "campaign", "validate", ladder, demo)
    assert len(validate_campaign(Path(ladder))) == 1, "the singular case needs a one-cell campaign"
    cells = len(validate_campaign(Path(demo)))
    assert code == 0 and f"{ladder}: ok (1 cell)" in out and f"{demo}: ok ({cells} cells)" in out, out
    assert out.count("assum") == 1 and out.rstrip().splitlines()[-1].startswith("(the durations are rough"), out


def test_the_help_summary_names_every_command() -> None:
    parser = cli.build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name in commands:
        assert f"  bakeoff {name} " in cli.DESCRIPTION, name


def test_readme_says_how_to_run_bakeoff_after_make_demo_and_its_campaign_table_matches_the_files() -> None:
    readme = (REPO / "README.md").read_text()
    setup = readme.split("## Install", 1)[0]  # before the first `bakeoff ...` command a reader meets
    assert ".venv/bin/bakeoff" in setup and "source .venv/bin/activate" in setup
    using = readme.split("## Using it", 1)[1]
    assert using.index("bakeoff serve") < using.index("bakeoff bench")
    done = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "campaign-table.py"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


# --- a rehearsal that leads to the GPU host ----------------------------------------------------

GPU_CAMPAIGN = REPO / "campaigns" / "gpu-7b-three-frameworks.yaml"


def test_every_console_line_of_a_rehearsal_is_tagged() -> None:
    out = io.StringIO()
    estimates = [CellEstimate(requests=4, seconds=1.0), CellEstimate(requests=4, seconds=1.0)]
    progress = CampaignProgress(estimates, out=out, tag="[rehearsal]")
    progress.start(0, "vllm__sweep")
    progress.end("vllm__sweep", True, "1 run(s), best 19969 output tok/s (c128)")
    progress.skip(1, "sglang__sweep", "already measured")
    print(progress.summary(), file=out)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 5 and all(line.startswith("[rehearsal] ") for line in lines), lines


def test_a_rehearsal_draws_no_pareto_front_and_says_why(tmp_path: Path) -> None:
    (tmp_path / "campaign.yaml").write_text("name: x\ngpu: true\n")
    frame = pd.DataFrame()
    assert explain.pareto_withheld(tmp_path) is None
    (tmp_path / "rehearsal.json").write_text("{}")
    assert explain.pareto_figures(tmp_path, frame) == []
    assert "stand-ins" in str(explain.pareto_withheld(tmp_path))


def test_validate_warns_when_an_image_names_an_unset_registry(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NGC_REGISTRY", raising=False)
    code, _, err = run_cli(capsys, "campaign", "validate", str(GPU_CAMPAIGN))
    assert code == 0 and "warning: NGC_REGISTRY is not set, and the image of trtllm names it" in err
    monkeypatch.setenv("NGC_REGISTRY", "registry.example")
    code, _, err = run_cli(capsys, "campaign", "validate", str(GPU_CAMPAIGN))
    assert code == 0 and "NGC_REGISTRY" not in err


def test_backends_show_and_a_rehearsal_record_the_same_runtime_command(tmp_path: Path) -> None:
    shown = describe_launch("vllm", {"max_num_seqs": 8}).split("command:\n", 1)[1].splitlines()[0].split()
    backend = load_backend("vllm")
    model = ModelSource(hf_id=None, local_dir=tmp_path).container_mount("/model")
    launch = render_container_launch(backend, {"max_num_seqs": 8}, served_model_name="m", model_arg=model.model_arg)
    recorded = rehearsed_container_command(launch, model, port=8000).split()
    assert shown[: shown.index("run")] == recorded[: recorded.index("run")]


def test_the_gpu_host_steps_name_images_environment_commands_preflight_and_the_campaign(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NGC_REGISTRY", raising=False)
    spec = load_campaign(GPU_CAMPAIGN)
    steps = gpu_host_steps(spec, Path("campaigns/gpu-7b-three-frameworks.yaml"), tmp_path)
    text, markdown = steps.text("[rehearsal]"), steps.markdown()
    assert text.startswith("[rehearsal] On the GPU host")
    for needed in (
        "export NGC_REGISTRY=",  # the registry the TensorRT-LLM image names
        f"{spec.model.path} must exist on the GPU host",  # the campaign's own model, not the rehearsal's
        "pull docker.io/vllm/vllm-openai:",
        'pull "${NGC_REGISTRY}/nvidia/tensorrt-llm',  # double-quoted: expands once exported
        "nvidia-smi",
        "bakeoff doctor campaigns/gpu-7b-three-frameworks.yaml",
        "bakeoff campaign validate campaigns/gpu-7b-three-frameworks.yaml",
        "bakeoff campaign preflight campaigns/gpu-7b-three-frameworks.yaml",
        "bakeoff campaign run campaigns/gpu-7b-three-frameworks.yaml",
        f"-v {spec.model.path}:/model:ro",
        "--enable-chunked-prefill",  # the knobs the campaign sets reach the commands
    ):
        assert needed in text and needed in markdown, needed
    mounted = re.search(r"-v (\S+options\.yaml):/bakeoff/options\.yaml:ro", text)
    assert mounted is not None and Path(mounted.group(1)).is_file()  # the options file the command mounts
    assert "/path/to/" not in text


def _setup_cell(folder: Path, label: str, backend: str, server: dict[str, object], version: str) -> None:
    cell = folder / "cells" / f"{label}__w"
    (cell / "runs" / "c1").mkdir(parents=True)
    (cell / "cell.json").write_text(json.dumps({"server": {"label": label, "backend": backend}, "backend": backend}))
    summary = summarize([RequestRecord(0, start_ns=0, first_token_ns=1_000_000, end_ns=9_000_000, completion_tokens=4)])
    summary = summary.model_copy(update={"provenance": Provenance(framework_version=version)})
    write_summary(cell / "runs" / "c1" / "summary.json", summary)
    machine = {"cpu_model": "AMD EPYC 9654", "cpus": 2, "memory_gib": 7.75, "gpu_count": 0}
    info = {"server": server, "machine": machine, "versions": {}}
    if backend == "vllm-cpu":
        info["versions"] = {"engine": {"interpreter": "/opt/.venv-engine/bin/python", "python": "3.11.9"}}
    (cell / "runs" / "c1" / "run.json").write_text(json.dumps(info))


def test_the_report_header_says_what_was_compared_on_what(tmp_path: Path) -> None:
    (tmp_path / "campaign.yaml").write_text("name: t\ngpu: false\n")
    llamacpp = load_backend("llamacpp").version
    _setup_cell(tmp_path, "l", "llamacpp", {"kind": "process", "command_line": "llama-server --model x"}, llamacpp)
    _setup_cell(tmp_path, "v", "vllm-cpu", {"kind": "process", "command_line": "/opt/python -m vllm"}, "0.32.0")
    image = {"kind": "container", "image": "localhost/bakeoff-vllm-cpu:0.32.0", "image_digest": "sha256:abc"}
    _setup_cell(tmp_path, "c", "vllm-cpu-container", image, "0.32.0")
    table = setup_table(tmp_path).set_index("server")
    assert table.loc["l", "framework"] == "llama.cpp (llama-server)" and table.loc["l", "version"] == llamacpp
    assert table.loc["l", "runs as"] == "process: llama-server"
    assert table.loc["v", "runs as"] == "process: /opt/.venv-engine/bin/python (Python 3.11.9)"
    assert table.loc["c", "runs as"] == "image localhost/bakeoff-vllm-cpu:0.32.0 (sha256:abc)"
    assert set(table["machine"]) == {"AMD EPYC 9654, 2 cores, 7.8 GiB memory"}
    assert effort_notes(tmp_path) == []  # no GPU-memory note in a CPU report
    (tmp_path / "campaign.yaml").write_text("name: t\ngpu: true\n")
    assert any("gpu_memory_utilization" in note for note in effort_notes(tmp_path))


def test_a_backend_version_is_spelled_once_without_the_framework_name() -> None:
    for name in list_backends():
        spec = load_backend(name)
        framework = spec.display_name.split()[0].lower()
        assert not spec.version.lower().startswith(framework), (name, spec.version)


def test_output_piped_into_a_reader_that_leaves_ends_quietly() -> None:
    # `bakeoff ... | head -1`: head exits after one line and the next print meets a closed pipe.
    shell = f"{sys.executable} -m bakeoff campaign validate {REPO / 'campaigns'}/*.yaml | head -1"
    done = subprocess.run(["bash", "-o", "pipefail", "-c", shell], capture_output=True, text=True, timeout=120)
    assert done.stdout.count("\n") == 1 and ": ok (" in done.stdout, done.stdout
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141, (done.returncode, done.stderr)
