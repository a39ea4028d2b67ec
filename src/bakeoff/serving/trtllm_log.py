"""TensorRT-LLM's PyTorch-flow build, read from the server's own log.

The PyTorch flow (``trtllm-serve --backend pytorch``) builds nothing ahead of time: what the
engine flow's ``trtllm-build`` does once, it does at every start, inside the cold start. Its
logger (``tensorrt_llm/logger.py``: ``[MM/DD/YYYY-HH:MM:SS] [TRT-LLM] [I] message``, a
``[RANK n]`` after ``[TRT-LLM]`` under MPI) marks each phase:

- ``Using LLM with PyTorch backend``: the LLM API starts (MPI workers, weights, KV cache);
- ``[Autotuner] Autotuning process starts ...`` / ``... ends``: kernel autotuning
  (``tensorrt_llm/_torch/autotuner.py``);
- ``Creating CUDA graph instances for N batch sizes.`` then one ``Run generation only CUDA
  graph warmup for batch size=...`` line per graph (``pyexecutor/model_engine.py``); the first
  line after those ends the capture;
- ``Uvicorn running on`` (no timestamp): serving.

Autotuning and capture run twice on a start that sizes its KV cache from a profiling pass (a
small cache first, then the real one): the phases are summed over every round. "load" is from
the first marker to the first autotuning start. The timestamps have whole seconds, so each
phase is good to about a second; that is what a build line of tens of seconds needs.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable
from pathlib import Path

from bakeoff.results.summary import PyTorchBuild

LINE = re.compile(r"^\[(\d\d/\d\d/\d{4}-\d\d:\d\d:\d\d)\] \[TRT-LLM\](?: \[RANK \d+\])? \[[A-Z]\] (.*)$")
TIME_FORMAT = "%m/%d/%Y-%H:%M:%S"
STARTS = "Using LLM with PyTorch backend"
TUNE_START = "[Autotuner] Autotuning process starts"
TUNE_END = "[Autotuner] Autotuning process ends"
GRAPHS = re.compile(r"Creating CUDA graph instances for (\d+) batch sizes")
GRAPH_WARMUP = "CUDA graph warmup for batch size"
SERVING = "Uvicorn running on"


def _events(lines: Iterable[str]) -> tuple[list[tuple[dt.datetime, str]], bool]:
    events, serving = [], False
    for line in lines:
        found = LINE.match(line.rstrip("\r\n"))
        if found is not None:
            events.append((dt.datetime.strptime(found.group(1), TIME_FORMAT), found.group(2)))
        elif SERVING in line:
            serving = True
    return events, serving


def parse_pytorch_build(lines: Iterable[str]) -> PyTorchBuild | None:
    """The build line of a PyTorch-flow start-up log (its last start); None when the log is not one."""
    events, serving = _events(lines)
    # The last start: a server log is appended to across the restarts of one cell.
    starts = [i for i, (_, text) in enumerate(events) if text.startswith(STARTS)]
    if not starts:
        return None
    start = starts[-1]
    events = events[start:]
    began = events[0][0]
    autotune = graphs = 0.0
    rounds, sizes = 0, None
    first_tune: dt.datetime | None = None
    end = began
    tune_began: dt.datetime | None = None
    capture_began: dt.datetime | None = None
    for at, text in events[1:]:
        if capture_began is not None and GRAPH_WARMUP not in text:
            graphs += (at - capture_began).total_seconds()  # the first line after the graphs ends the capture
            capture_began, end = None, at
        if text.startswith(TUNE_START):
            tune_began = at
            first_tune = first_tune or at
            rounds += 1
        elif text.startswith(TUNE_END) and tune_began is not None:
            autotune += (at - tune_began).total_seconds()
            tune_began, end = None, at
        elif (match := GRAPHS.search(text)) is not None:
            capture_began, sizes = at, int(match.group(1))
    if capture_began is not None:  # the log ends inside a capture (read before the server was up)
        graphs += (events[-1][0] - capture_began).total_seconds()
        end = events[-1][0]
    load = ((first_tune or end) - began).total_seconds()
    return PyTorchBuild(
        load_s=load,
        autotune_s=autotune,
        cuda_graph_s=graphs,
        total_s=(end - began).total_seconds(),
        rounds=rounds,
        cuda_graph_batch_sizes=sizes,
        serving_seen=serving,
    )


def read_pytorch_build(log_path: Path) -> PyTorchBuild | None:
    """:func:`parse_pytorch_build` of a server log file; None when it is missing or not a PyTorch-flow log."""
    try:
        with open(log_path, encoding="utf-8", errors="replace") as log:
            return parse_pytorch_build(log)
    except OSError:
        return None
