"""A real campaign against the reference server: twins are never a win, a 30% gap is decided by repeats: auto.

Three servers run through ``bakeoff campaign run``: ``a`` and ``b`` are the reference server with
the same timing (byte-identical), ``c`` streams 30% slower (inter-token gap 13 ms against 10 ms).
With ``repeats: auto`` the campaign must stop once every comparison is decided, or at
``max_repeats``; the verdict may call a and b equivalent or undecided, never a win, and must
find that c loses to the best of them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bakeoff.analysis.verdict import verdicts
from bakeoff.results.layout import AUTO_REPEATS
from bakeoff.results.store import read_json

BACKEND = """\
name: {name}
display_name: reference server ({itl} ms a token)
runtime: process
accelerator: cpu
version: "1.0"
command: ["{{python}}", "-m", "bakeoff.ref.server", "--port", "{{port}}", "--model", "{{served_model_name}}",
          "--ttft-ms", "5", "--itl-ms", "{itl}"]
health: {{path: /health, timeout_s: 20, interval_s: 0.1}}
cache_reset: {{kind: none}}
"""


def test_twins_are_never_a_win_and_a_30_percent_gap_is_decided_within_max_repeats(
    tmp_path: Path, tiny_model: Path
) -> None:
    backends = tmp_path / "backends"
    backends.mkdir()
    (backends / "reffast.yaml").write_text(BACKEND.format(name="reffast", itl=10))
    (backends / "refslow.yaml").write_text(BACKEND.format(name="refslow", itl=13))
    campaign = tmp_path / "twins.yaml"
    campaign.write_text(
        f"name: twins\nmodel: {{path: {tiny_model}, served_name: m}}\n"
        "servers: [{backend: reffast, label: a}, {backend: reffast, label: b}, {backend: refslow, label: c}]\n"
        "workloads: [{kind: concurrency, name: w, levels: [2], requests_per_level: 12, warmup_requests: 1,"
        " input_len: 16, output_len: 16}]\n"
        "measure_warm_restart: false\nrepeats: auto\nmax_repeats: 3\n"
    )
    out = tmp_path / "reports" / "twins"
    env = {**os.environ, "BAKEOFF_BACKENDS_DIR": str(backends), "BAKEOFF_HISTORY": str(tmp_path / "history")}
    # Cells in this process (--no-cell-notebooks): the verdict is under test, not the notebook kernel.
    argv = ["campaign", "run", str(campaign), "--out", str(out), "--fresh", "--no-cell-notebooks"]
    done = subprocess.run(
        [sys.executable, "-m", "bakeoff", *argv],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    stopped = read_json(out / AUTO_REPEATS)
    assert 2 <= stopped["rounds"] <= 3
    (found,) = verdicts(out)
    level = found.levels[2.0]
    stand = {s.server: s.against_best for s in level.standings}
    best = level.best
    assert best in ("a", "b")
    twin = stand["b" if best == "a" else "a"]
    assert twin is not None and twin.outcome in ("equivalent", "undecided")
    slow = stand["c"]
    # Planted: a request is 5 + 15 x 10 ms against 5 + 15 x 13 ms, so c's output tok/s is 22% lower. Load
    # on the machine adds the same client and scheduling delay to both sides, pulling the change towards 0,
    # never past it: one-sided, with half the planted gap to spare.
    assert slow is not None and slow.outcome == "loss" and slow.change is not None and slow.change < -0.10
    assert level.winner is None  # a twin is never beaten
    html = (out / "report.html").read_text()
    assert "Repeats: auto" in html and "round(s) of at most 3" in html
    print(f"rounds: {stopped['rounds']} ({stopped['why']}); twin: {twin.text()}; slow: {slow.text()}")
