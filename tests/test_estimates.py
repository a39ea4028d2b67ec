"""`campaign validate`'s time estimate: calibrated from the history where it has measured runs, a range for auto.

No engines: a planted campaign folder archived into a temporary history, and the shipped demo campaign.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import why_planted as planted
from bakeoff.analysis.diagnosis import Level
from bakeoff.cli.main import main
from bakeoff.history.archive import HISTORY_ENV, archive_campaign
from bakeoff.history.calibration import calibrate, prefill_per_token_s
from bakeoff.results.store import read_json, write_json
from bakeoff.results.summary import PrefixCache, Tokens

DEMO = Path(__file__).resolve().parents[1] / "campaigns" / "cpu-demo.yaml"


def _minutes(line: str) -> list[float]:
    """Every duration in a line, in minutes (``12 min``, ``45 s``, ``1.5 h``)."""
    scale = {"s": 1 / 60, "min": 1.0, "h": 60.0}
    return [float(v) * scale[u] for v, u in re.findall(r"(\d+(?:\.\d+)?) (s|min|h)\b", line)]


def _history(tmp_path: Path, small_model: Path, tpot_ms: float, start_s: float) -> Path:
    """A history holding one measured vllm-cpu campaign: TPOT P50 ``tpot_ms``, cold start ``start_s``."""
    levels = [Level(1, 100.0, 20.0, 25.0, tpot_ms, None, 2), Level(8, 500.0, 30.0, 40.0, tpot_ms, None, 2)]
    folder = planted.campaign_folder(tmp_path / "done", small_model, {"v": ("vllm-cpu", {}, levels)})
    info_path = folder / "cells" / "v__sweep" / "cell.json"
    write_json(info_path, {**read_json(info_path), "effort": {"cold_start_s": start_s}})
    root = tmp_path / "history"
    assert archive_campaign(folder, root) is not None
    return root


def test_the_history_calibrates_decode_and_start_up_per_backend(tmp_path: Path, small_model: Path) -> None:
    found = calibrate(_history(tmp_path, small_model, tpot_ms=2.0, start_s=20.0))
    assert found is not None
    assert found.token_s == {"vllm-cpu": pytest.approx(0.002)} and found.start_s == {"vllm-cpu": 20.0}
    # Prefill from the concurrency-1 run alone (TTFT P50 20 ms over 256 prompt tokens a request): at
    # concurrency 8 a request's TTFT also holds the queue ahead of it.
    assert found.prefill_s == {"vllm-cpu": pytest.approx(0.020 / 256)}
    assert "vllm-cpu 2.0 ms per output token, 0.08 ms per prompt token, 20 s per start (2 runs)" in found.text()
    assert calibrate(tmp_path / "nothing-here") is None


def test_prefill_is_read_from_uncached_prompt_tokens_at_concurrency_1_only() -> None:
    planted_run = planted.run_summary(Level(1, 100.0, 40.0, 50.0, 10.0))
    summary = planted_run.model_copy(update={"tokens": Tokens(prompt=64 * 1024, completion=64 * 64)})
    assert prefill_per_token_s(summary) == pytest.approx(0.040 / 1024)
    # Half of each prompt served from the cache: the TTFT paid for the other half.
    half = summary.model_copy(update={"prefix_cache": PrefixCache(cached_tokens_ratio=0.5)})
    assert prefill_per_token_s(half) == pytest.approx(0.040 / 512)
    # Too few uncached tokens for the TTFT to be mostly prefill (102 a request), or a queue ahead: no figure.
    assert (
        prefill_per_token_s(summary.model_copy(update={"prefix_cache": PrefixCache(cached_tokens_ratio=0.9)})) is None
    )
    assert prefill_per_token_s(planted.run_summary(Level(4, 100.0, 40.0, 50.0, 10.0))) is None


def test_validate_estimates_from_the_history_when_it_has_the_backend(
    tmp_path: Path, small_model: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HISTORY_ENV, str(tmp_path / "empty"))
    assert main(["campaign", "validate", str(DEMO)]) == 0
    assumed = capsys.readouterr().out
    assert "calibrated" not in assumed and "assuming" in assumed
    # A history where vLLM-CPU decoded 5x faster and started 3x faster than assumed: a shorter estimate.
    monkeypatch.setenv(HISTORY_ENV, str(_history(tmp_path, small_model, tpot_ms=2.0, start_s=20.0)))
    assert main(["campaign", "validate", str(DEMO)]) == 0
    measured = capsys.readouterr().out
    assert (
        "calibrated from history: vllm-cpu 2.0 ms per output token, 0.08 ms per prompt token, 20 s per start"
        in measured
    )
    assert "otherwise assuming" in measured  # llama.cpp has no history: its figures are still assumed
    assert (
        _minutes(measured.splitlines()[-2])[0] < _minutes(assumed.splitlines()[-2])[0]
    )  # the basis is said last, once


def test_repeats_auto_states_its_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HISTORY_ENV, str(tmp_path / "empty"))
    spec = yaml.safe_load(DEMO.read_text())
    spec.update(repeats="auto", min_repeats=2, max_repeats=6, warm_repeats=False)
    path = tmp_path / "auto.yaml"
    path.write_text(yaml.safe_dump(spec))
    assert main(["campaign", "validate", str(path)]) == 0
    line = capsys.readouterr().out.splitlines()[-2]  # the last one is the basis, said once
    assert "repeats: auto — 2..6 repeats:" in line
    low, high = _minutes(line)[:2]
    assert high == pytest.approx(3 * low, rel=0.15)  # six rounds of every cell against two
    # On warm starts the four extra rounds start nothing: well under three times as long.
    path.write_text(yaml.safe_dump({**spec, "warm_repeats": True}))
    assert main(["campaign", "validate", str(path)]) == 0
    warm_low, warm_high = _minutes(capsys.readouterr().out.splitlines()[-2])[:2]
    assert warm_low < low and warm_high < 3 * warm_low * 0.9
