"""A pytest plugin that records where a phase of the suite spends its time (``--suite-times DIR``).

``make test`` runs the suite in three phases (docs/development.md) and passes each
``--suite-times=.suite-times --suite-phase=NAME``; at the end of the phase this writes
``DIR/NAME.json``: the phase's wall time, its test count, each test's setup + call + teardown
seconds (the session fixture a test is the first to use is charged to it, as pytest's own
``--durations`` does) and the CPU seconds its process and the children it reaped spent (a
test's kernels, servers and subprocesses: where a phase whose cores are all busy spends them),
and the vLLM and llama.cpp servers started while it ran, counted from
the process table (``engine_starts``: a process or a container), and how busy the machine's cores
were over the phase (``cpu_busy``: 1.0 is every core busy the whole time; a phase well under it
leaves room that running more at once would use). ``benchmarks/suite_time.py`` prints the table.

Under pytest-xdist only the controller writes: it receives every worker's reports.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import TypedDict

import psutil
import pytest

# Command-line fragments of the engine servers a phase may start, on the host or in a container
# (rootful podman's processes are the host's). A forked child that keeps its parent's command
# line (vLLM's engine core) is not a second start.
ENGINE_SIGNATURES = {
    "vllm": ("vllm.entrypoints.openai.api_server", "vllm serve"),
    "llama-server": ("llama-server",),
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("suite timing")
    group.addoption("--suite-times", metavar="DIR", default=None, help="write this phase's timing to DIR/PHASE.json")
    group.addoption("--suite-phase", metavar="NAME", default="all", help="the phase's name in that file")


# Runtime clients: their container's own processes are what is counted (rootful podman's are the host's).
RUNTIME_CLIENTS = ("podman", "docker", "conmon")


def _kind(cmdline: list[str], signatures: dict[str, tuple[str, ...]] = ENGINE_SIGNATURES) -> str | None:
    """The engine a command line starts; a ``python -c`` script that only mentions it is a pre-flight parse."""
    if not cmdline or cmdline[0].rsplit("/", 1)[-1] in RUNTIME_CLIENTS:
        return None
    line = " ".join(cmdline)
    kind = next((kind for kind, marks in signatures.items() if any(m in line for m in marks)), None)
    if kind is not None and "-c" in cmdline[1:2]:
        return f"{kind} parse"
    return kind


class EngineStarts:
    """Engine servers started on this machine since the phase began, by sampling the process table.

    A sample every half second catches every start: an engine lives for tens of seconds. Each
    start keeps its command, the CPU its process tree had spent when last seen (a vLLM-CPU start
    is mostly CPU: imports and warm-up in three processes), and the tests running when it began.
    """

    def __init__(self, signatures: dict[str, tuple[str, ...]] = ENGINE_SIGNATURES) -> None:
        self.signatures = signatures
        self.since = time.time()
        self.seen: dict[str, set[int]] = defaultdict(set)
        self.starts: dict[int, EngineStart] = {}
        self.running: set[str] = set()  # tests started and not yet finished, on any worker
        self._procs: dict[int, psutil.Process] = {}
        self._tree_cpu: dict[int, dict[int, float]] = defaultdict(dict)  # start -> pid -> CPU when last seen
        self._tree_total: dict[int, float] = {}  # start -> its tree's CPU at the last sample, unrounded
        # Engine CPU spent while each test ran (a shared engine's work is charged to the tests it
        # served, split evenly between the tests running in the same half second).
        self.by_test: dict[str, float] = defaultdict(float)

    def sample(self) -> None:
        for proc in psutil.process_iter(["pid", "ppid", "cmdline", "create_time"]):
            info = proc.info
            # create_time is boot time plus clock ticks: it can read a little before the real start.
            if info["pid"] in self.starts or (info["create_time"] or 0) < self.since - 1.0:
                continue
            if not (kind := _kind(info["cmdline"] or [], self.signatures)):
                continue
            try:
                if _kind(psutil.Process(info["ppid"]).cmdline(), self.signatures) == kind:
                    continue
            except psutil.Error:
                pass
            self.seen[kind].add(info["pid"])
            self.starts[info["pid"]] = {
                "kind": kind,
                "command": _short(info["cmdline"] or []),
                "cpu_s": 0.0,
                "during": sorted(self.running),
            }
            self._procs[info["pid"]] = proc
        for pid, proc in list(self._procs.items()):
            try:
                tree = [proc, *proc.children(recursive=True)]
            except psutil.Error:
                del self._procs[pid]  # gone: its last sample stands
                continue
            seen = self._tree_cpu[pid]
            for member in tree:  # a child that exits first keeps the CPU it was last seen with
                seen[member.pid] = max(seen.get(member.pid, 0.0), _proc_cpu(member))
            total = sum(seen.values())
            spent, self._tree_total[pid] = total - self._tree_total.get(pid, 0.0), total
            self.starts[pid]["cpu_s"] = round(total, 1)
            for test in self.running:
                self.by_test[test] += spent / len(self.running)

    def counts(self) -> dict[str, int]:
        return {kind: len(pids) for kind, pids in sorted(self.seen.items())}

    def listed(self) -> list[EngineStart]:
        return [self.starts[pid] for pid in sorted(self.starts, key=lambda p: self.starts[p]["cpu_s"], reverse=True)]


class EngineStart(TypedDict):
    kind: str
    command: str
    cpu_s: float
    during: list[str]


def _proc_cpu(proc: psutil.Process) -> float:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except psutil.Error:
        return 0.0


def _short(cmdline: list[str]) -> str:
    """The engine's program and the options that tell one start from another (paths cut to their last part)."""
    words = [w.rsplit("/", 1)[-1] if "/" in w and not w.startswith("-") else w for w in cmdline]
    return " ".join(words)[:240]


CPU_AT_SETUP = pytest.StashKey[float]()


def _cpu_s() -> float:
    """CPU seconds of this process and of every child it has reaped, so far."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class TestCpu:
    """Charges each test the CPU its worker process and the children it reaped spent from its setup
    to its teardown; the teardown report carries it (``user_properties``) to the xdist controller."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        item.stash[CPU_AT_SETUP] = _cpu_s()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.when == "teardown" and CPU_AT_SETUP in item.stash:
            report.user_properties.append(("cpu_s", round(_cpu_s() - item.stash[CPU_AT_SETUP], 2)))
        return report


class SuiteTiming:
    def __init__(self, out_dir: Path, phase: str) -> None:
        self.out_dir = out_dir
        self.phase = phase
        self.started = time.monotonic()
        self.started_wall = time.time()  # reports carry wall-clock start and stop times
        self.finished: dict[str, tuple[str, float]] = {}
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = {}
        self.outcomes: dict[str, str] = {}
        self.engines = EngineStarts()
        self.cpu_at_start = psutil.cpu_times()
        self._sampling = False

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.engines.running.add(nodeid)

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        self.engines.running.discard(nodeid)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration
        for name, value in report.user_properties:
            if name == "cpu_s" and isinstance(value, (int, float)):
                self.cpu[report.nodeid] = float(value)
        # When each test finished, on which worker: where a phase's last minutes went.
        worker = getattr(report, "worker_id", None) or "main"
        self.finished[report.nodeid] = (worker, round(report.stop - self.started_wall, 1))
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.nodeid] = report.outcome

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> object:
        self._sampling = True

        def loop() -> None:
            while self._sampling:
                self.engines.sample()
                time.sleep(0.5)

        sampler = threading.Thread(target=loop, name="suite-timing-engines", daemon=True)
        sampler.start()
        try:
            return (yield)
        finally:
            self._sampling = False
            sampler.join(timeout=2)

    def _last_per_worker(self) -> dict[str, list[dict[str, object]]]:
        """Each worker's last five tests and when they finished (seconds into the phase)."""
        by_worker: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for nodeid, (worker, at) in self.finished.items():
            by_worker[worker].append((at, nodeid))
        return {
            worker: [{"test": nodeid, "finished_s": at} for at, nodeid in sorted(done)[-5:]]
            for worker, done in sorted(by_worker.items())
        }

    def _cpu_busy(self) -> float:
        """The share of all cores' time since the phase began that was not idle (iowait counts as idle)."""
        before, after = self.cpu_at_start, psutil.cpu_times()
        total = sum(after) - sum(before)
        idle = (after.idle - before.idle) + (getattr(after, "iowait", 0.0) - getattr(before, "iowait", 0.0))
        return round(1.0 - idle / total, 3) if total > 0 else 0.0

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.engines.sample()
        slowest = sorted(self.seconds.items(), key=lambda kv: kv[1], reverse=True)
        heaviest = sorted(self.cpu.items(), key=lambda kv: kv[1], reverse=True)
        record = {
            "phase": self.phase,
            "wall_s": round(time.monotonic() - self.started, 1),
            "tests": len(self.outcomes),
            "test_seconds": round(sum(self.seconds.values()), 1),
            "cpu_busy": self._cpu_busy(),
            "engine_starts": self.engines.counts(),
            "engines": self.engines.listed(),
            "engine_cpu_by_test": {
                t: round(c, 1) for t, c in sorted(self.engines.by_test.items(), key=lambda kv: -kv[1]) if c >= 1.0
            },
            "slowest": [{"test": nodeid, "seconds": round(s, 1)} for nodeid, s in slowest[:30]],
            "test_cpu_s": round(sum(self.cpu.values()), 1),
            "most_cpu": [{"test": nodeid, "cpu_s": round(c, 1)} for nodeid, c in heaviest[:30]],
            "last_finished": self._last_per_worker(),
        }
        self.out_dir.mkdir(parents=True, exist_ok=True)
        target = self.out_dir / f"{self.phase}.json"
        partial = target.with_suffix(".json.partial")
        partial.write_text(json.dumps(record, indent=2) + "\n")
        partial.replace(target)


def pytest_configure(config: pytest.Config) -> None:
    out = config.getoption("--suite-times", default=None)
    if out is None:
        return
    config.pluginmanager.register(TestCpu(), "bakeoff-test-cpu")  # on each worker, where tests run
    if hasattr(config, "workerinput"):
        return
    config.pluginmanager.register(SuiteTiming(Path(out), config.getoption("--suite-phase")), "bakeoff-suite-timing")
