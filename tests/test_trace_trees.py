"""Mooncake-style traces read as task trees: parents from hash prefixes, reuse at a cache block, inspect."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bakeoff.cli.main import main
from bakeoff.workloads.kinds import Trace
from bakeoff.workloads.traces.hash_tree import call_tree, hash_tree_shape
from bakeoff.workloads.traces.loading import load_trace
from bakeoff.workloads.traces.rows import TraceRow, cache_block_reuse, reuse_share

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "traces" / "mooncake-agent-sample.jsonl"
B = 512


def row(line: int, at: float, prompt: int, output: int, *blocks: int) -> TraceRow:
    return TraceRow(line, at, prompt, output, tuple(blocks))


def test_parents_are_the_longest_extended_prefix_and_common_prefixes_make_no_edge() -> None:
    rows = [
        row(1, 0.0, 1300, 100, 0, 1, 2),  # planner: system block 0, its own block 1, partial block 2
        row(2, 1.0, 1700, 50, 0, 1, 3, 4),  # sub-agent A from the planner's context
        row(3, 1.0, 1700, 60, 0, 1, 5, 6),  # sub-agent B, sent with A: a sibling, not A's child
        row(4, 2.0, 2400, 80, 0, 1, 3, 7, 8),  # A's tool-result turn extends A
        row(5, 2.5, 900, 40, 0, 9),  # another task: shares only the system block
        row(6, 3.0, 1600, 90, 0, 1, 10, 11),  # the planner's join extends the planner, not A or B
        row(7, 3.5, 1100, 30, 0, 1, 12),  # shares the planner's blocks but not its reply: a new task
    ]
    calls = call_tree(rows, B)
    assert [c.parent for c in calls] == [None, 0, 0, 1, None, 0, None]
    assert [c.task for c in calls] == [0, 0, 0, 0, 4, 0, 6]
    assert [c.depth for c in calls] == [0, 1, 1, 2, 0, 1, 0]
    shape = hash_tree_shape(rows, B)
    assert shape["tasks"] == 3 and shape["depth"]["max"] == 2 and shape["fanout"]["max"] == 3


def test_reuse_at_a_cache_block_is_whole_blocks_of_the_512_token_reuse() -> None:
    requests = [(1300, (0, 1, 2)), (1700, (0, 1, 3, 4)), (2400, (0, 1, 3, 7, 8))]
    exact = reuse_share(requests, B)
    assert exact == pytest.approx((1024 + 1536) / (1300 + 1700 + 2400))
    assert cache_block_reuse(requests, B, B) == pytest.approx(exact)
    assert cache_block_reuse(requests, B, 16) == pytest.approx(exact)  # finer: the ids show no more
    assert cache_block_reuse(requests, B, 1024) == pytest.approx((1024 + 1024) / 5400)  # coarser: whole 1024s only


def test_inspect_prints_the_shipped_mooncake_agent_samples_trees_and_reuse(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trace", "inspect", str(SAMPLE), "--json", "--cache-block", "1024"]) == 0
    figures = json.loads(capsys.readouterr().out)
    tree = figures["tree"]
    assert figures["format"] == "mooncake" and figures["tree_kind"] == "hash"
    assert tree["tasks"] == 10 == figures["sessions"] and tree["calls"] == figures["requests"]
    assert tree["fanout"]["min"] >= 3 and tree["depth"]["max"] == 2  # sub-agents and the join; tool turns
    assert 0.5 < figures["designed_reuse"] < 0.95
    assert figures["cache_block"] == 1024 and figures["cache_block_reuse"] < figures["designed_reuse"]
    done = subprocess.run(
        [sys.executable, "-m", "bakeoff", "trace", "inspect", str(SAMPLE)], capture_output=True, text=True, check=True
    )
    assert "call trees    10 tasks" in done.stdout and "fan-out (children)" in done.stdout
    assert f"prefix reuse  {figures['designed_reuse']:.1%}" in done.stdout
    assert "at a 512-token cache block (exact)" in done.stdout


def test_convert_keeps_each_calls_task_as_its_session(tmp_path: Path) -> None:
    out = tmp_path / "agent.jsonl"
    assert main(["trace", "convert", str(SAMPLE), "--out", str(out)]) == 0
    converted = load_trace(Trace(path=out, format="bakeoff"))
    original = load_trace(Trace(path=SAMPLE, format="mooncake"))
    assert [r.session for r in converted.rows] == [r.session for r in original.rows]
    assert len({r.session for r in converted.rows}) == 10 and converted.block_size == B


def test_the_sample_script_writes_the_shipped_file(tmp_path: Path) -> None:
    out = tmp_path / "sample.jsonl"
    script = REPO / "scripts" / "make-mooncake-agent-trace.py"
    subprocess.run([sys.executable, str(script), "--out", str(out)], check=True, capture_output=True)
    assert out.read_bytes() == SAMPLE.read_bytes()
