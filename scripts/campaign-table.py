#!/usr/bin/env python3
"""Write the campaign reference's table of shipped campaigns from campaigns/*.yaml, so the two cannot drift.

Each row is read from its file: the name, what it runs on (a GPU campaign, a CPU one, a CPU
one with a container backend), its servers, its workloads with their levels or rates, and the
file's own ``description``. The table sits in docs/campaigns.md between two marker comments;
``--check`` exits 1 when it differs from the files (the test suite runs that).

    .venv/bin/python scripts/campaign-table.py [--check]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- campaign table: scripts/campaign-table.py writes it from campaigns/*.yaml -->"
END = "<!-- end of campaign table -->"


def _runs_on(spec: dict[str, object], servers: list[dict[str, object]]) -> str:
    if spec.get("gpu"):
        return "1 GPU"
    runtimes = {yaml.safe_load((ROOT / "backends" / f"{s['backend']}.yaml").read_text())["runtime"] for s in servers}
    return "this CPU + podman" if "container" in runtimes else "this CPU"


def _levels(values: list[object], unit: str = "") -> str:
    return "/".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values) + unit


def _workload(wl: dict[str, object]) -> str:
    kind = str(wl["kind"])
    if kind == "concurrency":
        return f"concurrency {_levels(list(wl['levels']))}"  # type: ignore[call-overload]
    if kind == "open_loop":
        search = ", SLO search" if wl.get("slo_search") else ""
        return f"open loop {_levels(list(wl['rates']), ' req/s')}{search}"  # type: ignore[call-overload]
    if kind == "agentic" and wl.get("task_rate") is None:
        levels = wl.get("tasks_in_flight", [2])
        return f"agent tasks {_levels(levels if isinstance(levels, list) else [levels], ' in flight')}"
    return kind.replace("_", " ")


def table() -> str:
    rows = ["| campaign | runs on | servers | workloads | what it shows |", "|---|---|---|---|---|"]
    for path in sorted((ROOT / "campaigns").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        servers = list(spec["servers"])
        labels = ", ".join(f"`{s.get('label') or s['backend']}`" for s in servers)
        workloads = "; ".join(_workload(w) for w in spec["workloads"])
        description = " ".join(str(spec.get("description", "")).split())
        rows.append(f"| `{path.stem}` | {_runs_on(spec, servers)} | {labels} | {workloads} | {description} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/campaigns.md's table differs from the files")
    args = parser.parse_args()
    readme = ROOT / "docs" / "campaigns.md"
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        print(f"{readme}: the campaign table's markers are missing", file=sys.stderr)
        return 1
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    updated = f"{head}{BEGIN}\n{table()}\n{END}{tail}"
    if args.check:
        if updated != text:
            print(f"{readme}: the campaign table differs from campaigns/*.yaml; run {__file__}", file=sys.stderr)
            return 1
        return 0
    readme.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
