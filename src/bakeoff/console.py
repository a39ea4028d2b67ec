"""The terminal: live bars and spinners where a person watches, and plain fixed-width tables.

Bars (:func:`bar`, tqdm) and the spinner (:func:`working`) show only on a terminal, never in
CI logs; :func:`text_table` is what a terminal and a CI log both show well. Everything that
prints progress, from an image pull deep in serving to a campaign's cell lines, uses these.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from tqdm import tqdm


def interactive(stream: TextIO | None = None) -> bool:
    """Live progress only where a person watches: a terminal, and not under CI."""
    stream = stream or sys.stderr
    return stream.isatty() and not os.environ.get("CI")


def bar(total: int | None, label: str, unit: str = "it", stream: TextIO | None = None) -> tqdm:
    """A progress bar for long work (requests, builds) that stays silent off a terminal."""
    return tqdm(
        total=total, desc=label, unit=unit, disable=not interactive(stream), leave=False, mininterval=0.5, file=stream
    )


@contextlib.contextmanager
def working(label: str, stream: TextIO | None = None) -> Iterator[None]:
    """Elapsed time, live, for one long step with no count to show (an image pull, an engine build)."""
    with bar(None, label, unit="s", stream=stream) as shown:
        if shown.disable:
            yield
            return
        stop = threading.Event()

        def tick() -> None:
            while not stop.wait(0.5):
                shown.refresh()

        ticker = threading.Thread(target=tick, name="bakeoff-progress", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()


def plural(count: int, noun: str) -> str:
    """A count with its noun: '1 cell', '12 cells'."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def text_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain fixed-width table: what a terminal and a CI log both show well."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(value)
