"""How long does rendering a campaign's report take, and which notebook cell costs it?

Renders ``compare.ipynb`` (then the HTML export) over a saved campaign folder the way
``bakeoff report`` does, ``--runs`` times, and prints the wall and CPU seconds of each
render plus the slowest notebook cells (papermill records each cell's duration). Without
``--campaign`` it first rehearses the shipped ``gpu-vllm-tuned`` campaign into a
temporary folder (a closed-loop sweep of five levels and an open-loop rate search on two
servers, with telemetry: the report's largest figures). Usage::

    python benchmarks/report_render.py [--campaign reports/NAME] [--runs 3]

Every campaign run renders one report, and the test suite runs about twenty campaigns,
so this figure is a large share of the suite's time (README, Development).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import time
from pathlib import Path

from bakeoff.campaign.campaign_input import load_input
from bakeoff.campaign.execute import render_report, run_campaign
from bakeoff.paths import campaign_file


def cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def cell_durations(notebook: Path) -> list[tuple[float, str]]:
    cells = json.loads(notebook.read_text())["cells"]
    timed = []
    for cell in cells:
        duration = (cell.get("metadata", {}).get("papermill") or {}).get("duration")
        if cell["cell_type"] == "code" and duration:
            first = "".join(cell["source"]).strip().splitlines()[-1][:90]
            timed.append((float(duration), first))
    return sorted(timed, reverse=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--campaign", type=Path, help="a campaign folder with saved runs (default: a fresh rehearsal)")
    parser.add_argument("--runs", type=int, default=3, help="renders to time (default: 3)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.campaign
        if folder is None:
            folder = Path(tmp) / "rehearsal"
            run_campaign(load_input(campaign_file(Path("gpu-vllm-tuned")), rehearse=True), out_dir=folder)
        walls, cpus = [], []
        for _ in range(args.runs):
            wall0, cpu0 = time.perf_counter(), cpu_seconds()
            render_report(folder)
            walls.append(time.perf_counter() - wall0)
            cpus.append(cpu_seconds() - cpu0)
        print(
            f"report render, {args.runs} runs: wall median {statistics.median(walls):.1f} s, "
            f"CPU median {statistics.median(cpus):.1f} s (kernel included)"
        )
        print("slowest notebook cells (last render):")
        for duration, line in cell_durations(folder / "compare.ipynb")[:5]:
            print(f"  {duration:6.2f} s  {line}")


if __name__ == "__main__":
    main()
