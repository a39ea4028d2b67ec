"""Resumable campaigns, Ctrl-C through the notebook kernel, and the dead-server verdict.

The campaign tests drive a real ``bakeoff campaign run`` subprocess whose servers are the
reference server run as a process backend (from a backends folder named by
``BAKEOFF_BACKENDS_DIR``), so the kernel, the launcher's process group and the journal
are all the real ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bakeoff.campaign.resume import archive_attempt, cell_state, differences, earlier_attempts, fingerprint
from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.errors import ServerDiedError
from bakeoff.measure.client import ClientSettings
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import read_journal, read_json, write_json
from bakeoff.serving.death_watch import CONNECT_FAILURES, DeathWatch, ServerState, process_probe
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.plans import PlannedRequest, RunPlan
from plan_workloads import CLOSED
from polling import poll_until

REQUESTS = 24
BACKEND = """\
name: refproc
display_name: reference server (test)
runtime: process
accelerator: cpu
command: ["{python}", "-m", "bakeoff.ref.server", "--port", "{port}", "--model", "{served_model_name}",
          "--ttft-ms", "5", "--itl-ms", "12"]
health: {path: /health, timeout_s: 20, interval_s: 0.1}
cache_reset: {kind: none}
"""


QUALITY_SET = """\
{"id": "j", "kind": "json", "prompt": "Return JSON with key a.", "required_keys": ["a"], "max_tokens": 4}
{"id": "e", "kind": "exact", "prompt": "Say yes.", "answer": "yes", "max_tokens": 4}
"""


def campaign_yaml(model: Path, quality: Path) -> str:
    return f"""\
name: resume-test
model: {{path: {model}, served_name: m}}
servers:
  - {{backend: refproc, label: a}}
  - {{backend: refproc, label: b}}
workloads:
  - {{kind: concurrency, name: w, levels: [2], requests_per_level: {REQUESTS}, warmup_requests: 0,
      input_len: 16, output_len: 16, min_duration_s: 0}}
measure_warm_restart: false
repeats: 1
quality: {{prompts: {quality}, concurrency: 2}}
"""


@pytest.fixture
def campaign(tmp_path: Path, tiny_model: Path) -> Path:
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "refproc.yaml").write_text(BACKEND)
    (tmp_path / "q.jsonl").write_text(QUALITY_SET)
    path = tmp_path / "c.yaml"
    path.write_text(campaign_yaml(tiny_model, tmp_path / "q.jsonl"))
    return path


def start(campaign: Path, *extra: str) -> subprocess.Popen[str]:
    env = {**os.environ, "BAKEOFF_BACKENDS_DIR": str(campaign.parent / "backends")}
    argv = [sys.executable, "-m", "bakeoff", "campaign", "run", str(campaign), "--out", str(out_of(campaign))]
    return subprocess.Popen(
        [*argv, *extra], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=campaign.parent
    )


def out_of(campaign: Path) -> Path:
    return campaign.parent / "out"


def journal(campaign: Path, cell: str) -> Path:
    return out_of(campaign) / "cells" / cell / "runs" / "c2" / "records.jsonl"


def lines(path: Path) -> int:
    return len(path.read_bytes().splitlines()) if path.is_file() else 0


def family(proc: subprocess.Popen[str]) -> list[psutil.Process]:
    """bakeoff, its notebook kernel and the server the kernel started (each in its own session)."""
    return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]


def assert_all_gone(procs: list[psutil.Process], timeout_s: float = 10.0) -> None:
    _, alive = psutil.wait_procs(procs, timeout=timeout_s)
    assert not alive, f"left running: {[(p.pid, p.cmdline()) for p in alive]}"


def cell_info(campaign: Path, cell: str) -> dict[str, object]:
    info: dict[str, object] = read_json(out_of(campaign) / "cells" / cell / "cell.json")
    return info


# --- a real campaign, interrupted ----------------------------------------------------------


# SIGTERM is how timeout, docker stop, systemd and Kubernetes stop a scheduled run: it must be Ctrl-C's twin.
@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_ctrl_c_mid_cell_stops_within_seconds_keeps_the_journal_and_leaves_nothing(
    campaign: Path, stop: signal.Signals
) -> None:
    proc = start(campaign)
    poll_until(lambda: lines(journal(campaign, "a__w")) >= 3, 60, "the first cell's first records")
    procs = family(proc)
    assert any("ipykernel" in " ".join(p.cmdline()) for p in procs) and any(
        "bakeoff.ref.server" in " ".join(p.cmdline()) for p in procs
    ), "the kernel and the server should both be running mid-cell"
    seen = lines(journal(campaign, "a__w"))
    sent = time.monotonic()
    proc.send_signal(stop)
    output, _ = proc.communicate(timeout=60)
    # "Within seconds", one-sided and loose for a loaded machine; the campaign left alone would run
    # on (cell b's server, notebooks and report), which the exit code and the cells below rule out.
    assert time.monotonic() - sent < 20, output
    assert proc.returncode == 130, output
    assert_all_gone(procs)
    record = cell_info(campaign, "a__w")
    # CI once found "running" here (the kernel's measuring code ended by something other than the
    # interrupt, and said nothing): the record now carries what ended a cell, shown if it recurs.
    assert record["status"] == "interrupted", (record.get("error"), output)
    kept = read_journal(journal(campaign, "a__w"))
    assert len(kept) >= seen and all(r.ok for r in kept)
    summary = read_json(journal(campaign, "a__w").parent / "summary.json")
    assert summary["interrupted"] is True and summary["requests"]["ok"] == len(kept)
    assert not (out_of(campaign) / "cells" / "b__w").exists(), "no cell may start after Ctrl-C"


def test_sigkill_mid_cell_then_rerun_measures_every_cell_once_and_loses_nothing(campaign: Path) -> None:
    proc = start(campaign)
    poll_until(lambda: lines(journal(campaign, "b__w")) >= 4, 90, "the second cell's first records")
    first_cell = cell_info(campaign, "a__w")
    assert first_cell["status"] == "ok"
    procs = family(proc)
    proc.kill()
    proc.wait()
    # Killed without any cleanup: the kernel notices its parent is gone, the server its parent.
    assert_all_gone(procs, timeout_s=15)
    finished_before = read_journal(journal(campaign, "b__w"))
    assert finished_before and cell_info(campaign, "b__w")["status"] == "running"

    rerun = start(campaign)
    output, _ = rerun.communicate(timeout=180)
    assert rerun.returncode == 0, output
    assert "a__w: already measured" in output and "skipped" in output
    assert "b__w: interrupted mid-cell" in output and "measuring it again" in output
    # The finished cell was not measured again: same attempt, same start time.
    assert cell_info(campaign, "a__w")["started_at"] == first_cell["started_at"]
    # The interrupted one was, once, completely; what its first attempt finished is kept aside.
    for cell in ("a__w", "b__w"):
        records = read_journal(journal(campaign, cell))
        summary = read_json(journal(campaign, cell).parent / "summary.json")
        assert summary["interrupted"] is False and cell_info(campaign, cell)["status"] == "ok"
        assert all(r.ok for r in records) and summary["requests"]["ok"] > REQUESTS // 2
        assert len({r.request_id for r in records}) == len(records)  # each request sent once
    archived = out_of(campaign) / "cells" / "b__w" / "attempts" / "1" / "runs" / "c2"
    kept = read_journal(archived / "records.jsonl")
    assert [r.to_row() for r in kept[: len(finished_before)]] == [r.to_row() for r in finished_before]
    assert read_json(archived / "summary.json")["interrupted"] is True
    attempts = cell_info(campaign, "b__w")["earlier_attempts"]
    assert isinstance(attempts, list) and [a["status"] for a in attempts] == ["interrupted"]
    assert attempts[0]["finished_requests"] == len(kept)
    report = (out_of(campaign) / "report.html").read_text()
    assert "b__w" in report and "measured again" in report
    # The quality set ran after each cell's speed runs; random text is scored, not skipped.
    for cell in ("a__w", "b__w"):
        rates = read_json(out_of(campaign) / "cells" / cell / "quality.json")["rates"]
        assert rates["answered"] == 2 and rates["invalid_json"] == 1.0 and rates["exact"] == 0.0
        assert cell_info(campaign, cell)["quality"] == rates
    assert "Quality (temperature 0" in report


def test_a_dead_server_fails_the_cell_and_the_campaign_exit_status(campaign: Path) -> None:
    backend = campaign.parent / "backends" / "refproc.yaml"
    backend.write_text(BACKEND.replace('"12"]', '"12", "--fault", "die", "--fault-every", "8"]'))
    campaign.write_text(campaign.read_text().replace("  - {backend: refproc, label: b}\n", ""))
    proc = start(campaign)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, output
    assert "a__w failed: server died mid-run" in output
    info = cell_info(campaign, "a__w")
    died = info["server_died"]
    assert info["status"] == "failed" and isinstance(died, dict)
    assert died["how"] == "process exited" and died["exit_code"] == 3
    summary = read_json(journal(campaign, "a__w").parent / "summary.json")
    assert summary["server_died"] == died and summary["requests"]["ok"] == died["requests_finished"]


# --- the dead-server verdict, without a campaign -------------------------------------------


def plan(n: int = 200) -> RunPlan:
    requests = [PlannedRequest(i, "completions", 12, prompt=f"hello {i}") for i in range(n)]
    return RunPlan("c4", "closed", CLOSED, concurrency=4, requests=requests)


def test_a_server_that_dies_ends_the_run_at_once_with_the_evidence(tmp_path: Path) -> None:
    with serve_reference(ttft_ms=2, itl_ms=1, fault="die", fault_every=30) as url:
        target = RunTarget(ClientSettings(url, "bakeoff-ref"), show_progress=False)
        with pytest.raises(ServerDiedError, match="died mid-run") as caught:
            execute_plan(plan(), target, tmp_path)
    summary = read_json(tmp_path / "summary.json")
    died = summary["server_died"]
    assert died == caught.value.verdict and died["how"] == "port closed"
    # The 30th request killed it; up to 3 more were in flight with it (concurrency 4).
    assert died["requests_finished"] == summary["requests"]["ok"] and 26 <= died["requests_finished"] <= 29
    # Far fewer failures than the 171 requests left: the rest of the plan was never sent (a loopback
    # URL is probed inline at the first refused connect, so no burst of them goes out first).
    assert died["requests_not_sent"] > 100
    assert summary["requests"]["failed"] == died["stream_cuts"] + died["connect_failures"]
    assert read_json(tmp_path / "run.json")["server_died"] == died


def test_a_run_with_cut_streams_but_a_live_server_is_not_a_death(tmp_path: Path) -> None:
    with serve_reference(ttft_ms=2, itl_ms=1, fault="cut", fault_every=5) as url:
        summary = execute_plan(plan(40), RunTarget(ClientSettings(url, "bakeoff-ref"), show_progress=False), tmp_path)
    assert summary.server_died is None and summary.requests.failed_by_kind == {"stream_cut": 8}


def test_process_probe_reads_the_exit_code_without_reaping_the_child() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time, sys; time.sleep(0.3); sys.exit(3)"])
    probe = process_probe(child.pid)
    assert probe().alive is True
    child_gone = time.monotonic() + 10
    while probe().alive and time.monotonic() < child_gone:
        time.sleep(0.05)
    state = probe()
    assert (state.alive, state.how, state.exit_code) == (False, "process exited", 3)
    assert child.wait(timeout=5) == 3  # still the launcher's to collect


def test_consecutive_connect_failures_condemn_a_server_nobody_can_probe() -> None:
    """A host that vanished does not even refuse: with a probe that can tell nothing, the guard
    the runner runs beside the load ends it after CONNECT_FAILURES failed connects in a row, and
    not before (an answer in between starts the count again)."""
    looks: list[ServerState] = []

    def unknown() -> ServerState:
        looks.append(ServerState(None))
        return looks[-1]

    watch = DeathWatch(unknown)
    before_the_last: dict[str, object] = {}

    async def fail(request_id: int) -> None:
        """One failed connect, then the guard's look at the server it prompted."""
        seen = len(looks)
        watch.observe(RequestRecord(request_id, error_kind="connect"))
        async with asyncio.timeout(5):
            while len(looks) == seen and watch.verdict is None:
                await asyncio.sleep(0.001)

    async def load(go: asyncio.Event) -> None:
        await go.wait()
        for i in range(CONNECT_FAILURES - 1):
            await fail(i)
        watch.observe(RequestRecord(100))  # an answer: the host is there
        for i in range(CONNECT_FAILURES - 1):
            await fail(200 + i)
        before_the_last.update(verdict=watch.verdict, looks=len(looks))
        await fail(300)
        await asyncio.sleep(5)  # the rest of the plan; the guard cancels it

    async def run() -> bool:
        """As the runner does: the guard beside the load, stopped once the load ends."""
        go = asyncio.Event()
        task = asyncio.create_task(load(go))
        guard = asyncio.create_task(watch.guard(task))
        await asyncio.sleep(0)  # the guard is up and waiting before the first failure
        go.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 15)
        guard.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await guard
        return task.cancelled()

    cancelled = asyncio.run(run())
    assert before_the_last == {"verdict": None, "looks": 2 * (CONNECT_FAILURES - 1)}
    assert cancelled, "the guard should cancel the load"
    assert watch.verdict is not None and watch.verdict.how == f"{CONNECT_FAILURES} connects in a row failed"
    assert (watch.verdict.connect_failures, watch.verdict.requests_finished) == (2 * CONNECT_FAILURES - 1, 1)
    assert watch.verdict.exit_code is None and watch.verdict.stream_cuts == 0


def test_bench_exits_non_zero_when_the_server_dies(tmp_path: Path) -> None:
    with serve_reference(ttft_ms=2, itl_ms=1, fault="die", fault_every=20) as url:
        done = subprocess.run(
            [sys.executable, "-m", "bakeoff", "bench", "--base-url", url, "--model", "bakeoff-ref",
             "--concurrency", "2", "--num-requests", "100", "--input-len", "8", "--output-len", "8",
             "--warmup", "0", "--out", str(tmp_path / "run")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode != 0, done.stderr
    assert "died mid-run" in done.stderr and "Traceback" not in done.stderr


# --- bookkeeping -----------------------------------------------------------------------------


def finished_cell(cell_dir: Path, plans: Path, versions: dict[str, str | None]) -> dict[str, object]:
    expected = fingerprint(plans, {"backend": "x", "knobs": {"max_num_seqs": 4}}, {"name": "x"}, versions)
    write_json(cell_dir / "cell.json", {"status": "ok", "fingerprint": expected})
    write_json(cell_dir / "runs" / "c1" / "summary.json", {"interrupted": False})
    return expected


def test_cell_states_follow_status_fingerprint_and_runs(tmp_path: Path) -> None:
    plans = tmp_path / "plans"
    write_json(plans / "c1.json", {"requests": [1, 2]})
    cell = tmp_path / "cell"
    assert cell_state(cell, {}).state == "new"
    expected = finished_cell(cell, plans, {"bakeoff": "1.0"})
    assert cell_state(cell, expected).state == "complete"
    newer = fingerprint(plans, {"backend": "x", "knobs": {"max_num_seqs": 4}}, {"name": "x"}, {"bakeoff": "1.1"})
    prior = cell_state(cell, newer)
    assert prior.state == "changed" and "versions.bakeoff" in prior.reason
    write_json(plans / "c1.json", {"requests": [1, 2, 3]})
    assert differences(expected, fingerprint(plans, {"backend": "x", "knobs": {"max_num_seqs": 4}},
                                             {"name": "x"}, {"bakeoff": "1.0"})) == ["plan_hash"]  # fmt: skip
    write_json(cell / "cell.json", {"status": "running", "started_at": "T0"})
    assert cell_state(cell, expected).state == "interrupted"
    write_json(cell / "cell.json", {"status": "failed", "server_died": {"how": "process exited"}})
    prior = cell_state(cell, expected)
    assert prior.state == "failed" and "server died" in prior.reason


def test_archiving_an_attempt_moves_everything_and_counts_its_finished_requests(tmp_path: Path) -> None:
    cell = tmp_path / "cell"
    write_json(cell / "cell.json", {"status": "running", "started_at": "T0"})
    rows = [RequestRecord(i).to_row() for i in range(3)] + [RequestRecord(9, warmup=True).to_row()]
    (cell / "runs" / "c1").mkdir(parents=True)
    (cell / "runs" / "c1" / "records.jsonl").write_bytes(b"".join(__import__("orjson").dumps(r) + b"\n" for r in rows))
    (cell / "server.log").write_text("log")
    target = archive_attempt(cell, "interrupted mid-cell")
    assert target == cell / "attempts" / "1"
    assert not (cell / "runs").exists() and not (cell / "cell.json").exists()
    assert (target / "server.log").read_text() == "log"
    [attempt] = earlier_attempts(cell)
    assert attempt["status"] == "interrupted" and attempt["finished_requests"] == 3
    assert attempt["why_measured_again"] == "interrupted mid-cell"
    assert archive_attempt(cell, "again") is None  # nothing left to move
