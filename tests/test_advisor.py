"""The tuning advisor on a saved campaign folder with planted series, and the report's "why" sections over it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import why_planted as planted
from bakeoff.analysis.advisor import Spent, advise, next_step, plan
from bakeoff.analysis.diagnosis import classify
from bakeoff.backends.spec import load_backend
from bakeoff.campaign.specs import load_campaign
from bakeoff.cli.main import main
from bakeoff.report import explain as report_why
from bakeoff.report import tables as report


@pytest.fixture
def folder(tmp_path: Path, small_model: Path) -> Path:
    cells = {
        "vllm-tight": ("vllm-cpu", {"max_model_len": 2048, "max_num_seqs": 8}, planted.memory_bound()),
        "llamacpp": ("llamacpp", {"max_num_seqs": 4, "max_model_len": 2048}, planted.batching_bound()),
        "vllm-ok": ("vllm-cpu", {"max_model_len": 2048}, planted.bandwidth_bound()),
    }
    return planted.campaign_folder(tmp_path / "reports" / "planted", small_model, cells)


def test_advice_follows_the_cost_order_and_the_diagnosis(folder: Path) -> None:
    steps = {s.server: s for s in advise(folder).steps}
    memory = steps["vllm-tight"]
    # Memory-bound: the cheapest knob first — fewer sequences at once, not a bigger KV cache.
    assert (memory.stage, memory.knob, memory.current, memory.proposed) == ("caps", "max_num_seqs", 8, 4)
    assert "preemptions" in memory.markdown()
    batching = steps["llamacpp"]  # four slots, twelve waiting: more slots
    assert (batching.knob, batching.current, batching.proposed) == ("max_num_seqs", 4, 16)
    # Batching pays and the cap (256) is far above the load, so not the cap; alone a step took 2.4x the
    # bandwidth floor (overhead-bound) and vLLM-CPU left one of the 2 cores idle: bind both.
    overhead = steps["vllm-ok"]
    assert overhead.diagnosis.bound == "overhead"
    assert (overhead.stage, overhead.knob, overhead.current, overhead.proposed) == ("parallelism", "threads", None, 2)


def test_advice_follows_from_the_series_it_cites() -> None:
    # The demo: slots capped at 4 of 8 offered, 4 waiting, cores busy, KV under 1 %: the cap first, never KV.
    diagnosis = classify("llamacpp", "w", planted.capped_on_a_busy_cpu())
    step = next_step(diagnosis, load_backend("llamacpp"), {"max_num_seqs": 4})
    assert step is not None and (step.knob, step.current, step.proposed) == ("max_num_seqs", 4, 8), step
    assert "sat at the cap of 4" in step.reason
    # With the cap out of the way (slots for all 8) the compute-bound advice is smaller weights (llama.cpp
    # quantizes its GGUF itself), never the 8-bit KV cache: the KV pool was under 1 % used.
    weights = next_step(diagnosis, load_backend("llamacpp"), {"max_num_seqs": 8})
    assert weights is not None
    assert (weights.stage, weights.knob, weights.proposed) == ("quantization", "quantization", "q8_0")
    assert "check quality" in weights.reason
    # Weights quantized and bound to one core of the host's: bind them all.
    later = next_step(diagnosis, load_backend("llamacpp"), {"max_num_seqs": 8, "threads": 1, "quantization": "q8_0"})
    assert later is not None and (later.stage, later.knob, later.current) == ("parallelism", "threads", 1), later
    # Nothing left: the answer says why at every stage instead of being empty.
    spent = plan(diagnosis, load_backend("llamacpp"), {"max_num_seqs": 8, "quantization": "q8_0"})
    assert isinstance(spent, Spent), spent
    text = spent.markdown()
    assert "compute-bound): nothing left to turn" in text and "quantized already (q8_0)" in text
    assert "an 8-bit KV cache buys nothing" in text and "all 2 cores" in text and "no `tensor_parallel_size`" in text
    # A memory-bound server (KV 98 %, preemptions) may be offered one once the cheap knob is spent.
    memory = classify("v", "w", planted.memory_bound())
    step = next_step(memory, load_backend("vllm-cpu"), {"max_num_seqs": 1})
    assert step is not None and (step.knob, step.proposed) == ("kv_cache_dtype", "fp8")


def test_memory_advice_moves_on_when_the_cheap_knob_is_spent() -> None:
    diagnosis = classify("v", "w", planted.memory_bound())
    step = next_step(diagnosis, load_backend("vllm-cpu"), {"max_num_seqs": 1, "kv_cache_dtype": "fp8"})
    assert step is not None and (step.stage, step.knob) == ("kv_share", "kv_cache_space_gib")


def test_advise_writes_a_campaign_that_validates(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = folder / "advice.yaml"
    assert main(["advise", str(folder)]) == 0
    printed = capsys.readouterr().out
    assert "validated" in printed and "max_num_seqs" in printed
    spec = load_campaign(out)
    labels = [s.label for s in spec.servers]
    assert {"vllm-tight", "vllm-tight-max_num_seqs-4", "llamacpp", "llamacpp-max_num_seqs-16"} <= set(labels)
    variant = next(s for s in spec.servers if s.label == "vllm-tight-max_num_seqs-4")
    assert variant.knobs == {"max_model_len": 2048, "max_num_seqs": 4}
    assert [w.label for w in spec.workloads] == ["sweep"]
    # Only the advised change, at the level the diagnosis cites: not the whole sweep again.
    assert spec.workloads[0].levels == [16] and not spec.measure_warm_restart  # type: ignore[union-attr]
    # What `bakeoff campaign validate` says about it, as a user would run it.
    assert main(["campaign", "validate", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["slo"] == {"ttft_ms": 2000, "tpot_ms": 100}


def test_advise_refuses_a_folder_that_is_not_a_campaign(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", str(tmp_path)]) == 2
    assert "not a campaign folder" in capsys.readouterr().err


def test_why_sections_read_the_saved_folder(folder: Path) -> None:
    frame = report.results_frame(folder)
    table = report_why.roofline_table(folder)
    assert set(table["server"]) == {"vllm-tight", "llamacpp", "vllm-ok"}
    # 10 ms per token against a floor read at the planted 40 GB/s.
    row = table[table["server"] == "vllm-ok"].iloc[0]
    assert row["bandwidth GB/s"] == 40.0 and row["efficiency"] == pytest.approx(row["floor ms"] / 10.0, rel=1e-3)
    assert 0 < row["efficiency"] < 1 and "of the memory-bandwidth floor" in report_why.roofline_notes(table)[0]
    notes = report_why.diagnosis_notes(folder)
    assert any("vllm-tight / sweep: memory-bound" in n for n in notes)
    figures = report_why.pareto_figures(folder, frame)
    assert [w for w, _, _ in figures] == ["sweep"] and not figures[0][2].empty
    assert [w for w, _ in report_why.telemetry_figures(folder, frame)] == ["sweep"]
    assert "max_num_seqs" in report_why.advice_markdown(folder)


def test_findings_leave_the_bandwidth_floor_to_the_roofline(folder: Path) -> None:
    # One place answers "how close to the memory-bandwidth floor": the roofline, not the findings too.
    findings = report.diagnose(report.results_frame(folder))
    roofline = report_why.roofline_notes(report_why.roofline_table(folder))
    assert any("memory-bandwidth floor" in n for n in roofline)
    assert findings and not any("GB/s" in n or "bandwidth floor" in n for n in findings), findings


def test_an_impossible_tpot_names_both_figures_that_could_be_wrong(folder: Path) -> None:
    table = report_why.roofline_table(folder)
    table.loc[0, "efficiency"] = 3.0
    note = report_why.roofline_notes(table)[0]
    assert "not a result" in note and "bandwidth figure is low" in note and "memory_bandwidth.json" in note, note
    assert "chunks that coalesced" in note
    # The diagnosis cites no impossible share of the floor as evidence.
    cited = classify("v", "w", planted.capped_on_a_busy_cpu(), efficiency=1.31)
    assert not any("131%" in e for e in cited.evidence)
    assert any("beat the memory-bandwidth floor" in e for e in cited.evidence), cited.evidence


def test_advise_hands_its_advice_to_tune(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["advise", str(folder), "--tune"]) == 0
    printed = capsys.readouterr().out
    assert "bakeoff tune" in printed and "validated" in printed
    spec = load_campaign(folder / "advice-tune.yaml")
    assert spec.tune is not None and spec.tune.only == ["max_num_seqs", "threads"] and spec.tune.load == 16
    assert {s.label for s in spec.servers} == {"vllm-tight", "llamacpp", "vllm-ok"}
    seqs = spec.tune.knobs["max_num_seqs"]
    assert seqs.low is not None and seqs.high is not None and seqs.low <= 4 and seqs.high >= 16


# Sample /proc/cpuinfo flag sets: this machine's AVX2-only EPYC, an AVX-512 Xeon, an AMX one.
AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma", "f16c"})
AVX512 = AVX2 | {"avx512f", "avx512vl", "avx512bw", "avx512dq"}
AMX = AVX2 | {"amx_tile", "amx_bf16"}


def test_fp8_kv_is_proposed_only_where_the_host_can_run_it() -> None:
    # Memory-bound with the sequence cap spent: an 8-bit KV cache is the natural next step.
    memory = classify("v", "w", planted.memory_bound())
    backend = load_backend("vllm-cpu")
    for flags in (AVX512, AMX):
        step = next_step(memory, backend, {"max_num_seqs": 1}, flags)
        assert step is not None and (step.knob, step.proposed) == ("kv_cache_dtype", "fp8"), sorted(flags)
    step = next_step(memory, backend, {"max_num_seqs": 1}, AVX2)
    # Without AVX-512 or AMX vLLM-CPU has no FP8 KV kernels: the next knob, saying why not fp8.
    assert step is not None and (step.stage, step.knob) == ("kv_share", "kv_cache_space_gib")
    assert "`kv_cache_dtype` 'fp8' was the natural step but is not proposed" in step.reason
    assert "AVX-512" in step.reason and "(amx_tile)" in step.markdown()


def test_advise_reads_the_cpu_flags_the_run_recorded(tmp_path: Path, small_model: Path) -> None:
    cells = {"vllm-one": ("vllm-cpu", {"max_model_len": 2048, "max_num_seqs": 1}, planted.memory_bound())}
    folder = planted.campaign_folder(tmp_path / "planted", small_model, cells)

    def recorded(flags: frozenset[str]) -> dict[str, object]:
        for run_json in folder.glob("cells/*/runs/*/run.json"):
            info = json.loads(run_json.read_text())
            info["machine"]["cpu_flags"] = sorted(flags)
            run_json.write_text(json.dumps(info))
        return {s.server: s.knob for s in advise(folder).steps}

    # Whatever this host has: the measured host's flags decide.
    assert recorded(AVX2) == {"vllm-one": "kv_cache_space_gib"}
    assert recorded(AVX512) == {"vllm-one": "kv_cache_dtype"}


def test_the_advice_campaign_repeats_as_the_measured_one_did(folder: Path) -> None:
    # The demo measures with repeats: auto; its advice must too, bounds and margin included, and load.
    source = folder / "campaign.yaml"
    raw = yaml.safe_load(source.read_text())
    source.write_text(yaml.safe_dump({**raw, "repeats": "auto", "min_repeats": 2, "max_repeats": 4, "min_effect": 0.1}))
    assert main(["advise", str(folder)]) == 0
    spec = load_campaign(folder / "advice.yaml")
    assert (spec.repeats, spec.min_repeats, spec.max_repeats, spec.min_effect) == ("auto", 2, 4, 0.1)


@pytest.fixture
def demo_like(tmp_path: Path, small_model: Path) -> Path:
    """The cpu-demo's diagnosis (issue [19]): vLLM-CPU overhead-bound at 1 and 2 threads, llama.cpp compute-bound."""
    cells = {
        "vllm-default": ("vllm-cpu", {"max_model_len": 2048}, planted.overhead_bound_at_4()),
        "vllm-2threads": ("vllm-cpu", {"max_model_len": 2048, "threads": 2}, planted.overhead_bound_at_4()),
        "llamacpp": ("llamacpp", {"max_num_seqs": 16, "max_model_len": 2048}, planted.compute_bound_on_a_cpu()),
    }
    return planted.campaign_folder(tmp_path / "reports" / "cpu-demo", small_model, cells)


def test_every_diagnosis_of_the_demo_has_its_next_knob(demo_like: Path, capsys: pytest.CaptureFixture[str]) -> None:
    advice = advise(demo_like)
    steps = {s.server: s for s in advice.steps}
    assert {s: st.diagnosis.bound for s, st in steps.items()} == {
        "vllm-default": "overhead",
        "vllm-2threads": "overhead",
        "llamacpp": "compute",
    }
    assert not advice.spent and advice.undiagnosed is None
    # Overhead-bound with a core idle: bind both. With both bound, speculation for latency at concurrency 1.
    assert (steps["vllm-default"].knob, steps["vllm-default"].proposed) == ("threads", 2)
    spec = steps["vllm-2threads"]
    assert (spec.stage, spec.knob, spec.proposed, spec.level) == ("speculation", "speculative", "ngram", 1.0)
    assert "per-step overhead" in spec.reason
    # Compute-bound on both cores: smaller weights, the next stage in the cost order.
    weights = steps["llamacpp"]
    assert (weights.knob, weights.proposed, weights.level) == ("quantization", "q8_0", 4.0)
    # The report says the same; never that nothing was measured.
    shown = report_why.advice_markdown(demo_like)
    assert "nothing measured" not in shown and "q8_0" in shown and "ngram" in shown
    # `bakeoff advise` writes a campaign that validates, each variant at the level its step is for.
    assert main(["advise", str(demo_like)]) == 0
    assert "validated" in capsys.readouterr().out
    written = load_campaign(demo_like / "advice.yaml")
    variants = {s.label: s.knobs for s in written.servers}
    assert variants["vllm-2threads-speculative-ngram"] == {"max_model_len": 2048, "threads": 2, "speculative": "ngram"}
    assert variants["llamacpp-quantization-q8_0"]["quantization"] == "q8_0"
    assert written.workloads[0].levels == [1, 4]  # type: ignore[union-attr]
    assert main(["campaign", "validate", str(demo_like / "advice.yaml")]) == 0
    # Handed to tune: one search space, so llama.cpp's q8_0 (no vLLM-CPU value) stays in advice.yaml.
    assert main(["advise", str(demo_like), "--tune"]) == 0
    tune = load_campaign(demo_like / "advice-tune.yaml")
    assert tune.tune is not None and {s.label for s in tune.servers} == {"vllm-default", "vllm-2threads"}
    assert sorted(tune.tune.only) == ["speculative", "threads"]


def test_advise_with_nothing_left_says_why_and_exits_0(
    tmp_path: Path, small_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cells = {"llamacpp": ("llamacpp", {"max_num_seqs": 16, "quantization": "q4_0"}, planted.compute_bound_on_a_cpu())}
    folder = planted.campaign_folder(tmp_path / "spent", small_model, cells)
    assert main(["advise", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "nothing left to turn" in out and "quantized already (q4_0)" in out and "no campaign written" in out
    assert not (folder / "advice.yaml").exists()
    # One level only: no bound diagnosed, and the line says so rather than that nothing was measured.
    one_level = {"v": ("vllm-cpu", {}, planted.overhead_bound_at_4()[:1])}
    single = planted.campaign_folder(tmp_path / "single", small_model, one_level)
    assert "one load level measured" in report_why.advice_markdown(single)
