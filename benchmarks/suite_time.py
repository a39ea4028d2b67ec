"""Where `make test` spent its time: each phase's wall time, its engine starts and the slowest tests.

``make test`` runs its three phases with ``--suite-times .suite-times`` (tests/suite_timing.py
writes one JSON file a phase) and then this script, which prints the table the suite's budget
is checked against (README, Development: 540 s after set-up on 2 cores)::

    python benchmarks/suite_time.py [--dir .suite-times] [--slowest 10] [--budget 540]

It exits 0 whatever the figures: a budget is reported, not asserted (a busy machine is not a
failing test). Its last line says whether the phases together were within the budget.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import NotRequired, TypedDict

PHASES = ("lint", "unit", "precision", "engine")


class SlowTest(TypedDict):
    test: str
    seconds: float


class CpuTest(TypedDict):
    test: str
    cpu_s: float


class EngineStart(TypedDict):
    kind: str
    command: str
    cpu_s: float  # its process tree's CPU when last seen (a container's processes are the host's)
    during: list[str]  # the tests running when it began (none: started at collection)


class PhaseTiming(TypedDict):
    """One phase's file, as tests/suite_timing.py writes it (lint's holds the first two keys only)."""

    phase: str
    wall_s: float
    tests: NotRequired[int]
    test_seconds: NotRequired[float]
    cpu_busy: NotRequired[float]
    engine_starts: NotRequired[dict[str, int]]
    engines: NotRequired[list[EngineStart]]
    engine_cpu_by_test: NotRequired[dict[str, float]]  # engine CPU spent while each test ran
    slowest: NotRequired[list[SlowTest]]
    test_cpu_s: NotRequired[float]
    most_cpu: NotRequired[list[CpuTest]]
    beside: NotRequired[str]  # ran at the same time as that phase, started with it


def load(folder: Path) -> list[PhaseTiming]:
    found: dict[str, PhaseTiming] = {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}
    return [found[name] for name in [*PHASES, *sorted(set(found) - set(PHASES))] if name in found]


def table(phases: list[PhaseTiming], slowest: int, budget: float) -> str:
    lines = ["| phase | wall s | tests | cores busy | engine starts |", "|---|---:|---:|---:|---|"]
    total = 0.0
    walls = {phase["phase"]: phase["wall_s"] for phase in phases}
    for phase in phases:
        beside = phase.get("beside")
        # A phase run beside another adds only the time it outlasted it (`make test` waits for both).
        total += max(0.0, phase["wall_s"] - walls.get(beside, 0.0)) if beside else phase["wall_s"]
        started = ", ".join(f"{n} {kind}" for kind, n in phase.get("engine_starts", {}).items()) or "none"
        busy = f"{phase['cpu_busy']:.0%}" if "cpu_busy" in phase else ""
        wall = f"{phase['wall_s']:.0f}" + (f" (beside {beside})" if beside else "")
        lines.append(f"| {phase['phase']} | {wall} | {phase.get('tests', '')} | {busy} | {started} |")
    lines.append(f"| **total** | **{total:.0f}** | | | |")
    tests = [(t["seconds"], phase["phase"], t["test"]) for phase in phases for t in phase.get("slowest", [])]
    lines += ["", f"The {slowest} slowest tests (setup + call + teardown):", ""]
    lines += [f"{s:7.1f} s  {name}  [{where}]" for s, where, name in sorted(tests, reverse=True)[:slowest]]
    # In a phase whose cores are all busy, the CPU a test spends (with its kernels, servers and
    # subprocesses) is what lengthens the phase; its wall time may be mostly waiting.
    heavy = [(t["cpu_s"], phase["phase"], t["test"]) for phase in phases for t in phase.get("most_cpu", [])]
    if heavy:
        lines += ["", f"The {slowest} tests that spent the most CPU (with the children they reaped):", ""]
        lines += [f"{s:7.1f} s  {name}  [{where}]" for s, where, name in sorted(heavy, reverse=True)[:slowest]]
    starts = [(e["cpu_s"], phase["phase"], e) for phase in phases for e in phase.get("engines", [])]
    if starts:
        lines += ["", "Engine starts, by the CPU each spent (its tests: those running when it began):", ""]
        for cpu, where, start in sorted(starts, key=lambda s: s[0], reverse=True):
            during = ", ".join(t.rsplit("::", 1)[-1] for t in start["during"]) or "at collection"
            lines.append(f"{cpu:7.1f} s  {start['kind']}  [{where}]  {during}\n           {start['command'][:160]}")
    served = [(c, phase["phase"], t) for phase in phases for t, c in phase.get("engine_cpu_by_test", {}).items()]
    if served:
        lines += ["", f"Engine CPU by the tests it served (the {slowest} most; shared engines split it):", ""]
        lines += [f"{c:7.1f} s  {name}  [{where}]" for c, where, name in sorted(served, reverse=True)[:slowest]]
    verdict = "within" if total <= budget else "OVER"
    lines += ["", f"suite after set-up: {total:.0f} s, {verdict} the {budget:.0f} s budget"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path(".suite-times"))
    parser.add_argument("--slowest", type=int, default=10)
    parser.add_argument("--budget", type=float, default=540.0)
    args = parser.parse_args()
    phases = load(args.dir)
    if not phases:
        raise SystemExit(f"no phase timings in {args.dir}: run `make test` (it passes --suite-times {args.dir})")
    print(table(phases, args.slowest, args.budget))


if __name__ == "__main__":
    main()
