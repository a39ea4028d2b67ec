"""Warm repeats: one start per server, kept up across a campaign's interleaved rounds.

With ``warm_repeats: true`` (:class:`bakeoff.campaign.specs.CampaignSpec`) a server is started by
the first cell that needs it and stays up; every later round's cell of that server measures on the
same process. The rounds stay interleaved (round r of every server, then round r + 1), each round
sends its own fresh requests, the same to every server (:func:`bakeoff.campaign.cells.plans_dir`),
so the paired test by round and its false-win rate are unchanged; what changes is that a repeat
no longer pays a start-up (on a CPU, 1-3 minutes of vLLM's compile against seconds of requests).

The cold start is measured once, on the cell that started the server; the later cells' effort
names that cell instead of a start of their own. A server the campaign is done with (its last
round measured, or a failed start) is stopped at once, and every one is stopped when the
campaign ends, however it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from bakeoff.backends.launch_render import RenderedLaunch
from bakeoff.serving.handle import ServerHandle

if TYPE_CHECKING:
    from bakeoff.campaign.cells import Cell

Running = tuple[ServerHandle, RenderedLaunch]
Starter = Callable[[], AbstractContextManager[Running]]


@dataclass
class _Up:
    running: Running
    stack: contextlib.ExitStack
    started_by: str  # the cell id whose start it was (its cold start is the server's one)
    attached: set[str] = field(default_factory=set)  # cells that measured on it


class WarmServers:
    """The campaign's running servers by label, each started once; a context manager that stops them all."""

    def __init__(self) -> None:
        self._up: dict[str, _Up] = {}

    def __enter__(self) -> WarmServers:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for label in list(self._up):
            self.stop(label)

    def starter(self, cell: Cell, start: Starter) -> Starter:
        """``start`` for ``cell``'s server the first time; the running server (left running) after.

        A second call for the same cell is a restart its runs asked for (an emptied cache): that one
        is real, never the warm server handed back as if restarted.
        """
        label = cell.server.label

        def attach() -> AbstractContextManager[Running]:
            up = self._up.get(label)
            if up is not None and cell.cell_id in up.attached:
                self.stop(label)
                up = None
            if up is None:
                stack = contextlib.ExitStack()
                try:
                    running = stack.enter_context(start())
                except BaseException:
                    stack.close()
                    raise
                up = self._up[label] = _Up(running, stack, cell.cell_id)
            up.attached.add(cell.cell_id)
            return contextlib.nullcontext(up.running)

        return attach

    def record(self, cell: Cell, effort: dict[str, Any]) -> None:
        """Into ``cell``'s effort: whether it started the server or measured on an earlier cell's start."""
        up = self._up.get(cell.server.label)
        if up is not None and up.started_by != cell.cell_id:
            effort["cold_start_s"] = None  # no start of its own: the start is counted once, where it happened
            effort["warm_start_of"] = up.started_by

    def stop(self, label: str) -> None:
        """Stop ``label``'s server now (nothing when it is not running)."""
        up = self._up.pop(label, None)
        if up is not None:
            up.stack.close()

    def running(self) -> list[str]:
        return sorted(self._up)
