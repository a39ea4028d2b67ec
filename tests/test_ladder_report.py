"""The ladder's waterfall and the speculative-decoding table in the report, from synthetic results
(no engine, no kernel).

``ladder.json`` is written by a ladder campaign run (``campaign run``, its cells planted:
tests/ladder_planted.py); the report's table, figure and final configuration are read back
from that file, and the compare notebook's own ladder cell is run on it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bakeoff.campaign.ladder import LadderResult, LadderSpec, StepOutcome, decide
from bakeoff.paths import shipped
from bakeoff.report import ladder_report
from bakeoff.report import tables as report
from bakeoff.results.layout import LADDER_FILE
from bakeoff.results.store import write_json
from bakeoff.results.summary import Speculative, Stat
from history_planted import campaign_folder, summary
from ladder_planted import run_planted_ladder

SPEC = LadderSpec.model_validate(
    {
        "steps": [{"name": "x", "knobs": {"max_num_seqs": 2}}],
        "max_exact_drop": 0.05,
        "min_word_agreement": 0.5,
        "min_speedup": None,
    }
)
SAME = {f"q{k}": "the capital of Oria is Fibi" for k in range(10)}


# min_speedup null: the planted kv8 step is kept although slower (a step tried for memory), so the
# waterfall shows a kept step that cost throughput.
LADDER = {
    "steps": [
        {"name": "int8", "knobs": {"quantization": "q8_0"}, "why": "why int8"},
        {"name": "int4", "knobs": {"quantization": "q4_0"}, "why": "why int4"},
        {"name": "kv8", "knobs": {"kv_cache_dtype": "q8_0"}, "why": "why kv8"},
        {"name": "spec", "knobs": {"speculative": "ngram"}, "why": "why spec"},
    ],
    "max_exact_drop": 0.05,
    "min_word_agreement": 0.5,
    "min_speedup": None,
}


@pytest.fixture(scope="module")
def ladder(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Path:
    """bf16 100 tok/s -> int8 kept (150) -> int4 rolled back (exact falls) -> kv8 kept (135) -> spec did not run.

    Written by ``campaign run`` itself on planted cells (tests/ladder_planted.py); the tests only read it.
    """
    out, _, _ = run_planted_ladder(tmp_path_factory.mktemp("ladder"), tiny_model, LADDER)
    return out


def test_the_table_judges_each_step_against_the_last_kept_one(tmp_path: Path, ladder: Path) -> None:
    table = ladder_report.waterfall_table(ladder).set_index("step")
    assert list(table.index) == ["bf16", "int8", "int4", "kv8", "spec"]
    assert list(table["decision"]) == ["baseline", "kept", "rolled back", "kept", "rolled back"]
    # kv8 follows a rollback: it is judged against int8, not int4 (the row above).
    assert list(table["judged against"].iloc[1:]) == ["bf16", "int8", "int8", "kv8"]
    assert table.loc["int4", "Δ tok/s %"] == pytest.approx(40.0)  # 210 against int8's 150
    assert table.loc["kv8", "Δ tok/s %"] == pytest.approx(-10.0)
    assert table.loc["int4", "Δ exact pts"] == pytest.approx(-20.0)
    assert table.loc["int4", "word agreement %"] == pytest.approx(70.0)
    assert table.loc["kv8", "exact held-out-phrasing %"] == pytest.approx(29.5)
    assert table.loc["kv8", "KV cache"] == "q8_0" and table.loc["kv8", "peak RSS MiB"] == 40.0
    assert "exact-answer rate fell 20.0%" in table.loc["int4", "verdict"]
    assert "did not run" in table.loc["spec", "verdict"]
    assert table.loc["kv8", "why tried"] == "why kv8"
    assert ladder_report.waterfall_table(tmp_path).empty  # no ladder.json: nothing to show


def test_perplexity_columns_appear_only_where_a_step_was_scored(tmp_path: Path, ladder: Path) -> None:
    # The planted ladder is llama.cpp-like: no prompt logprobs, so no column of blanks.
    assert "perplexity" not in ladder_report.waterfall_table(ladder).columns
    base = StepOutcome("f32", {}, ran=True, output_tok_s=100.0, exact=0.6, perplexity=3.0, answers=SAME)
    step = StepOutcome("w4a8", {}, ran=True, output_tok_s=90.0, exact=0.6, perplexity=3.3, answers=SAME)
    folder = tmp_path / "scored"
    folder.mkdir()
    write_json(folder / LADDER_FILE, LadderResult(base, [(step, decide(SPEC, base, step))], SPEC).to_json())
    table = ladder_report.waterfall_table(folder).set_index("step")
    assert table.loc["w4a8", "perplexity"] == pytest.approx(3.3)
    assert table.loc["w4a8", "Δ perplexity %"] == pytest.approx(10.0)
    assert "perplexity rose 10.0% (bound 5.0%)" in table.loc["w4a8", "verdict"]
    data = ladder_report.ladder_data(folder)
    assert data is not None and "perplexity (where the server returns prompt logprobs) rises by at most 5%" in (
        ladder_report.bound_text(data)
    )


def test_the_final_configuration_and_its_rollback_chain(ladder: Path) -> None:
    data = ladder_report.ladder_data(ladder)
    assert data is not None
    text = ladder_report.final_markdown(data)
    assert "`kv8`" in text and "+35% output tok/s against the baseline" in text
    assert "`bf16` → `int8` → `kv8`" in text and "**Rolled back:** `int4`, `spec`" in text
    assert "at most 5%" in ladder_report.bound_text(data) and "at least 50%" in ladder_report.bound_text(data)


def test_the_waterfall_moves_the_level_only_on_kept_steps(tmp_path: Path, ladder: Path) -> None:
    fig = ladder_report.waterfall_figure(ladder)
    top, bottom = fig.axes
    bars = [(p.get_x() + p.get_width() / 2, p.get_y(), p.get_y() + p.get_height(), p.get_hatch()) for p in top.patches]
    # (position, from, to, hatch): the baseline from 0; int8 up from 100; int4 from int8's 150,
    # hatched and not carried; kv8 down from 150; spec (did not run) draws no bar.
    assert [(round(x), lo, hi, h) for x, lo, hi, h in bars] == [
        (0, 0.0, 100.0, None),
        (1, 100.0, 150.0, None),
        (2, 150.0, 210.0, "//"),
        (3, 150.0, 135.0, None),
    ]
    assert [round(p.get_height(), 1) for p in bottom.patches] == [60.0, 60.0, 40.0, 59.0, 0.0]
    assert ladder_report.waterfall_figure(tmp_path) is None


def test_the_compare_notebook_shows_the_ladder(tmp_path: Path, ladder: Path) -> None:
    """The notebook's own ladder cell, run on the folder with display() recorded."""
    cells = json.loads((shipped("notebooks") / "compare.ipynb").read_text())["cells"]
    (source,) = ["".join(c["source"]) for c in cells if "ladder_report" in "".join(c["source"])]
    shown: list[Any] = []
    namespace = {"campaign": ladder, "report": report, "display": shown.append, "Markdown": str}
    exec(compile(source, "compare.ipynb", "exec"), namespace)
    assert shown[0].startswith("## Optimization ladder")
    assert any(hasattr(s, "savefig") for s in shown)  # the waterfall figure
    table = next(s for s in shown if hasattr(s, "to_html")).data
    assert list(table["step"]) == ["bf16", "int8", "int4", "kv8", "spec"]
    assert "Rollback chain" in shown[-1]
    shown.clear()
    exec(compile(source, "compare.ipynb", "exec"), {**namespace, "campaign": tmp_path})
    assert shown == []  # a campaign without a ladder shows no section


def test_speculative_runs_show_itl_per_chunk_beside_per_token(tmp_path: Path, ladder: Path) -> None:
    """A draft accepting 3 of 4 tokens: chunks of up to four tokens, 20 ms apart, 5 ms a token."""
    spec = summary(5.0, 200.0)
    spec.speculative = Speculative(
        draft_tokens=400.0, accepted_tokens=300.0, drafts=100.0, acceptance_rate=0.75, accepted_per_step=3.0
    )
    spec.latency.itl_ms = Stat(n=200, mean=20.0, p50=20.0, p90=22.0, p99=30.0)
    spec.latency.itl_per_token_ms = Stat(n=200, mean=5.0, p50=5.0, p90=6.0, p99=9.0)
    coalesced = summary(5.0, 200.0)
    coalesced.speculative = Speculative(draft_tokens=0.0, accepted_tokens=0.0)
    coalesced.latency.itl_per_token_ms = Stat(unsupported="chunks coalesced")
    folder = campaign_folder(tmp_path / "c", {"draft": [spec], "ngram": [coalesced], "plain": [summary(8.0, 120.0)]})
    table = report.speculative_table(folder).set_index("server")
    assert sorted(table.index) == ["draft", "ngram"]  # the run without speculation has no row
    assert table.loc["draft", "draft acceptance %"] == 75.0 and table.loc["draft", "accepted per step"] == 3.0
    assert table.loc["draft", "ITL P50 ms (per chunk)"] == 20.0 and table.loc["draft", "ITL/token P50 ms"] == 5.0
    assert table.loc["ngram", "ITL/token P50 ms"] == "unsupported"
    assert report.speculative_table(ladder).empty
