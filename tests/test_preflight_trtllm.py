"""TensorRT-LLM's pre-flight against a faithful copy of its parser's shape, run as the image runs it.

The copy keeps what decides the outcome in ``tensorrt_llm/commands/serve.py`` (NVIDIA/TensorRT-LLM,
1.3.0rc): ``main`` is a ``DefaultGroup`` (a click group that routes an unknown first word to
``serve``), and ``serve`` takes MODEL then its underscore options, ``--max_batch_size`` and
``--max_num_tokens`` defaulting to BuildConfig's 2048 and 8192, ``--config`` aliased
``--extra_llm_api_options``. Calling the group's ``make_context`` (what pre-flight did) parses none
of the serve options; parsing ``serve`` refuses a wrong one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bakeoff.backends.launch_render import render_launch
from bakeoff.backends.spec import load_backend
from bakeoff.campaign.preflight_cells import refuse_on_failure
from bakeoff.conformance.preflight import preflight_command, run_preflight

SERVE = """
import click


class DefaultGroup(click.Group):
    def resolve_command(self, ctx, args):
        if args and args[0] not in self.commands:
            return "serve", self.commands["serve"], args
        return super().resolve_command(ctx, args)


@click.command("serve")
@click.argument("model", type=str)
@click.option("--tokenizer", type=str, default=None)
@click.option("--host", type=str, default="localhost")
@click.option("--port", type=int, default=8000)
@click.option("--backend", type=click.Choice(["pytorch", "tensorrt", "_autodeploy"]), default="pytorch")
@click.option("--max_batch_size", type=int, default=2048)
@click.option("--max_num_tokens", type=int, default=8192)
@click.option("--max_seq_len", type=int, default=None)
@click.option("--tensor_parallel_size", "--tp_size", type=int, default=1)
@click.option("--free_gpu_memory_fraction", "--kv_cache_free_gpu_memory_fraction", type=float, default=0.9)
@click.option("--config", "--extra_llm_api_options", "extra_llm_api_options", type=str, default=None)
@click.option("--reasoning_parser", type=click.Choice(["deepseek-r1", "qwen3"]), default=None)
@click.option("--served_model_name", type=str, default=None)
@click.option("--enable_chunked_prefill", is_flag=True, default=False)
def serve(**kwargs):
    raise SystemExit("serve ran: pre-flight must only parse")


main = DefaultGroup(commands={"serve": serve})
"""
LLM_ARGS = """
import pydantic


class TorchLlmArgs(pydantic.BaseModel, extra="forbid"):
    model: str
    max_batch_size: int | None = None
    max_num_tokens: int | None = None
    enable_chunked_prefill: bool = False
    return_perf_metrics: bool = False
    enable_iter_perf_stats: bool = False
    dtype: str = "auto"
    max_seq_len: int | None = None
    kv_cache_config: dict = {}
"""


def _package(root: Path, *, importable: bool = True) -> Path:
    pkg = root / "tensorrt_llm"
    for folder in (pkg, pkg / "commands", pkg / "llmapi"):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text("" if importable else "raise ImportError('libcuda.so.1: cannot open')\n")
    (pkg / "commands" / "serve.py").write_text(SERVE)
    (pkg / "llmapi" / "llm_args.py").write_text(LLM_ARGS)
    return root


def _check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command_edit: dict[str, str] | None = None):
    monkeypatch.chdir(tmp_path)  # the options file is written where the launch names it
    backend = load_backend("trtllm")
    if command_edit:
        words = [command_edit.get(w, w) for w in backend.command]
        backend = backend.model_copy(update={"command": words})
    launch = render_launch(
        backend, {"chunked_prefill": True, "dtype": "float16"}, model="/model", served_model_name="m", port=8000
    )
    command = preflight_command(launch, runtime=None, python=sys.executable, model="/model")
    return run_preflight("trtllm", command, backend)


def test_the_serve_subcommand_parses_every_option_and_reports_the_images_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_package(tmp_path / "site")))
    result = _check(tmp_path, monkeypatch)
    assert result.status == "ok", result.detail
    # What the image does with the knobs the campaign left unset, read from its own parser.
    assert result.image_defaults["max_num_seqs"] == 2048 and result.image_defaults["max_num_batched_tokens"] == 8192
    assert result.image_defaults["gpu_memory_utilization"] == 0.9 and result.image_defaults["max_model_len"] is None


def test_a_wrong_option_name_is_refused_by_serve_where_the_group_let_it_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = _package(tmp_path / "site")
    monkeypatch.setenv("PYTHONPATH", str(site))
    result = _check(tmp_path, monkeypatch, {"--served_model_name": "--served-model-name"})
    assert result.status == "refused" and "--served-model-name" in result.detail, result.detail
    with pytest.raises(Exception, match="preflight refused trtllm"):
        refuse_on_failure([result], Path("c.yaml"))
    # The group alone (what pre-flight used to call) stops at MODEL and never sees the bad option.
    monkeypatch.syspath_prepend(str(site))
    from tensorrt_llm.commands.serve import main  # type: ignore[import-not-found]

    main.make_context("trtllm-serve", ["/model", "--served-model-name", "m"])
    sys.modules.pop("tensorrt_llm.commands.serve", None)
    sys.modules.pop("tensorrt_llm.commands", None)
    sys.modules.pop("tensorrt_llm", None)


def test_an_import_failure_in_the_gpu_less_container_is_not_checked_not_a_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(_package(tmp_path / "site", importable=False)))
    result = _check(tmp_path, monkeypatch)
    assert result.status == "not_checked" and "libcuda.so.1" in result.detail
    assert result.line().startswith("trtllm (trtllm): not checked: trtllm did not import")
    refuse_on_failure([result], Path("c.yaml"))  # does not raise: nothing was judged
