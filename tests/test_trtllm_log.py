"""TensorRT-LLM's PyTorch-flow build line, read from a start-up log in its logger's format."""

from __future__ import annotations

from pathlib import Path

from bakeoff.report.tables import build_seconds, build_step
from bakeoff.results.summary import Effort
from bakeoff.serving.trtllm_log import parse_pytorch_build, read_pytorch_build

# A 7B start on one GPU as trtllm-serve logs it: MPI workers, weights, then autotuning and
# CUDA-graph capture twice (a profiling pass sizes the KV cache, then the real one), then uvicorn.
LOG = Path(__file__).parent / "data" / "trtllm_pytorch_startup.log"


def test_the_pytorch_flows_build_is_load_autotune_and_graph_capture_summed_over_both_rounds() -> None:
    build = read_pytorch_build(LOG)
    assert build is not None
    assert build.load_s == 41.0  # 09:14:02 "Using LLM" to 09:14:43, the first autotuning
    assert build.autotune_s == 12.0 + 2.0
    assert build.cuda_graph_s == 8.0 + 2.0  # each capture ends at the first line after its graphs
    assert build.total_s == 67.0 and build.rounds == 2 and build.cuda_graph_batch_sizes == 3
    assert build.serving_seen


def test_a_restart_appended_to_the_log_is_read_from_its_own_start(tmp_path: Path) -> None:
    text = LOG.read_text()
    later = text.replace("12/03/2026-09:1", "12/03/2026-10:1")  # the same start an hour later
    build = parse_pytorch_build((text + later).splitlines())
    assert build is not None and build.total_s == 67.0 and build.rounds == 2


def test_a_log_cut_inside_the_capture_counts_the_capture_so_far() -> None:
    lines = LOG.read_text().splitlines()
    cut = lines[: next(i for i, line in enumerate(lines) if "09:15:03" in line)]  # last: the 09:15:02 graph
    build = parse_pytorch_build(cut)
    assert build is not None and build.rounds == 1 and build.cuda_graph_s == 7.0 and not build.serving_seen


def test_another_frameworks_log_has_no_build_line(tmp_path: Path) -> None:
    vllm = ["INFO 12-03 09:14:02 [api_server.py:1] vLLM API server version 0.33.0", "Using LLM with vLLM"]
    assert parse_pytorch_build(vllm) is None
    assert read_pytorch_build(tmp_path / "missing.log") is None


def test_the_effort_table_labels_the_pytorch_build_and_a_cached_engine() -> None:
    build = read_pytorch_build(LOG)
    assert build is not None
    pytorch = Effort(engine_build_s=None, pytorch_build=build)
    assert build_seconds(pytorch) == 67.0
    assert build_step(pytorch).startswith("PyTorch flow, inside cold start (server log, 2 rounds): load 41 s")
    cached = Effort(engine_build_s=412.0, engine_build_step="trtllm-build", engine_build_cached=True)
    assert build_seconds(cached) == 412.0 and build_step(cached).startswith("trtllm-build: cached")
    fresh = cached.model_copy(update={"engine_build_cached": False})
    assert build_step(fresh) == "trtllm-build, this run"
    assert build_step(Effort(engine_build_s=None)) == "-"
