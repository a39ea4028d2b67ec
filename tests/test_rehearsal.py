"""Rehearsals: every shipped GPU campaign runs end to end here, each framework's container
replaced by the reference server in that framework's wire profile.

What is asserted is what the GPU path must produce on a real host — the rendered container
commands, probes that pass, counter-based prefix-cache hit rates, cache resets that
worked, effort rows, no failed request — and that nothing of it can pass for a measurement.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pytest
import yaml

from bakeoff.backends.server_config import ServerConfig
from bakeoff.backends.spec import BackendSpec, load_backend
from bakeoff.campaign.campaign_input import load_input
from bakeoff.campaign.execute import run_campaign
from bakeoff.campaign.quality import QUALITY_FILE, load_prompt_set
from bakeoff.campaign.rehearsal import rehearsal_spec
from bakeoff.campaign.runner import RunTarget, execute_plan
from bakeoff.campaign.specs import CampaignSpec, load_campaign
from bakeoff.errors import SpecError
from bakeoff.measure.client import ClientSettings
from bakeoff.models.model_source import ModelSource
from bakeoff.report.tables import REHEARSAL_SUFFIX, quality_table, speculative_table
from bakeoff.results.layout import REHEARSAL_MARKER as MARKER
from bakeoff.results.layout import REHEARSAL_TAG
from bakeoff.results.store import read_json, read_summary, write_json
from bakeoff.serving.handle import SERVER_KINDS
from bakeoff.serving.launchers import LAUNCHERS, LaunchContext, launcher_kind, server_kind, start_server
from bakeoff.serving.stand_in_quality import BROKEN_EVERY, LOSSY_PROMPT_LOGPROB, PLANTED_FILE, PROMPT_LOGPROB
from bakeoff.workloads.kinds import ConcurrencySweep
from bakeoff.workloads.plans import PlannedRequest, RunPlan
from plan_workloads import CLOSED

REPO = Path(__file__).resolve().parents[1]
GPU_CAMPAIGNS = sorted((REPO / "campaigns").glob("gpu-*.yaml"))
# The first word of each framework's real server command, as it must appear in the
# recorded container command line.
SERVER_COMMANDS = {"vllm": "--entrypoint vllm", "sglang": "sglang.launch_server", "trtllm": "--entrypoint trtllm-serve"}
# The shipped GPU servers whose launch is lossy (4-bit weights: the quantization knob, or
# TensorRT-LLM's pre-quantized ModelOpt checkpoint): their stand-ins answer a planted share of
# the quality set wrong and plant a lower prompt logprob. Every other shipped server is clean.
LOSSY = {"gpu-7b-awq-int4": {"vllm-awq", "sglang-awq", "trtllm-w4a16-awq"}}


def test_every_gpu_campaign_is_rehearsable() -> None:
    assert GPU_CAMPAIGNS, "no shipped GPU campaign found"
    for path in GPU_CAMPAIGNS:
        spec = load_campaign(path)
        for server in spec.servers:
            backend = load_backend(server.backend)
            assert launcher_kind(backend, server.for_rehearsal()) == "rehearsal", (path.name, server.label)
            assert launcher_kind(backend, server) == "container"


def test_launcher_kind_keeps_cpu_engines_and_external_servers_real() -> None:
    cpu = load_backend("vllm-cpu")
    assert launcher_kind(cpu, ServerConfig(backend="vllm-cpu").for_rehearsal()) == "process"
    gpu = load_backend("vllm")
    external = ServerConfig(backend="vllm", url="http://10.0.0.1:8000")
    assert launcher_kind(gpu, external.for_rehearsal()) == "external"


def test_every_launcher_kind_says_what_it_means_around_its_start() -> None:
    assert set(LAUNCHERS) == set(SERVER_KINDS) and all(k == v.name for k, v in SERVER_KINDS.items())
    assert [k for k, v in SERVER_KINDS.items() if v.stand_in] == ["rehearsal"]
    assert [k for k, v in SERVER_KINDS.items() if not v.launched] == ["external"]
    gpu = load_backend("vllm")
    assert server_kind(gpu, ServerConfig(backend="vllm").for_rehearsal()).stand_in
    assert server_kind(load_backend("vllm-cpu"), ServerConfig(backend="vllm-cpu")).local_engine


def test_rehearsal_spec_scales_down_but_keeps_the_shape() -> None:
    spec = load_campaign(REPO / "campaigns" / "gpu-7b-three-frameworks.yaml")
    scaled = rehearsal_spec(spec)
    assert scaled.model.preset == "tiny" and scaled.model.path is None
    assert scaled.model.served_name == spec.model.served_name
    original, small = spec.workloads[0], scaled.workloads[0]
    assert isinstance(original, ConcurrencySweep) and isinstance(small, ConcurrencySweep)
    assert small.levels == original.levels
    assert small.input_len == original.input_len
    assert [small.requests_for(c) for c in small.levels] == small.levels
    assert small.output_len.upper <= 32 < original.output_len.upper
    # Knobs are untouched: the rendered commands are the real ones.
    assert [s.knobs for s in scaled.servers] == [s.knobs for s in spec.servers]


def test_a_rehearsal_is_the_specs_transform_its_servers_carry_into_the_campaign_copy() -> None:
    path = REPO / "campaigns" / "gpu-7b-three-frameworks.yaml"
    run, plain = load_input(path, rehearse=True), load_input(path)
    assert run.rehearsal and run.written == plain.spec == load_campaign(path) and run.tag == REHEARSAL_TAG
    assert not plain.rehearsal and plain.tag == "" and plain.suffix == "" and run.suffix == "-rehearsal"
    assert all(s.launcher == "rehearsal" for s in run.spec.servers)
    # The copy a cell's kernel reloads keeps the launcher; a measured server's record has no such key.
    copy = CampaignSpec.model_validate(yaml.safe_load(yaml.safe_dump(run.spec.model_dump(mode="json"))))
    assert all(s.rehearsed for s in copy.servers)
    assert all("launcher" not in s.model_dump(mode="json") for s in plain.spec.servers)


def test_a_campaign_file_that_sets_the_rehearsal_launcher_is_refused(tmp_path: Path) -> None:
    raw = yaml.safe_load((REPO / "campaigns" / "gpu-7b-three-frameworks.yaml").read_text())
    raw["servers"][1]["launcher"] = "rehearsal"
    path = tmp_path / "hand-made.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(SpecError, match=r"servers\[1\]\.launcher: set by --rehearse"):
        load_input(path)
    with pytest.raises(SpecError, match="never in a campaign file"):
        load_input(path, rehearse=True)


@pytest.fixture(scope="session")
def rehearsed(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Callable[[str], Path]:
    """Each shipped GPU campaign rehearsed once, when a test first asks; the tests read the folders.

    One campaign at a time: under pytest-xdist (``--dist loadscope``) each class below is a
    scope, so a worker rehearses only the campaigns whose class it was handed.
    """
    out = tmp_path_factory.mktemp("rehearsals")
    done: dict[str, Path] = {}

    def folder(stem: str) -> Path:
        if stem not in done:
            # Cells measured in this process: what a rehearsal checks is the GPU path's commands,
            # wire protocol and report, not the notebook kernel (tests/test_packaging.py runs those).
            path = REPO / "campaigns" / f"{stem}.yaml"
            done[stem] = run_campaign(load_input(path, rehearse=True), out_dir=out / stem, cell_notebooks=False).parent
        return done[stem]

    return folder


def _cells(folder: Path) -> list[dict[str, Any]]:
    cells = []
    for info in sorted((folder / "cells").glob("*/cell.json")):
        cell = json.loads(info.read_text())
        cell["runs"] = [
            (read_summary(p), json.loads((p.parent / "run.json").read_text()))
            for p in sorted(info.parent.glob("runs/*/summary.json"))
        ]
        cell["dir"] = info.parent
        cells.append(cell)
    return cells


def _rehearsed_config(cell_dir: Path, backend: BackendSpec) -> dict[str, Any] | None:
    """The options file the rehearsal wrote as a GPU host would get it (next to the cell's runs)."""
    if backend.config_file is None:
        return None
    data = yaml.safe_load((cell_dir / f"rehearsed-{backend.config_file.filename}").read_text())
    assert isinstance(data, dict)
    return data


def _contains(argv: list[str], words: list[str]) -> bool:
    return any(argv[i : i + len(words)] == words for i in range(len(argv) - len(words) + 1))


def _launched_with(
    backend: BackendSpec, knob: str, value: Any, command: list[str], config: dict[str, Any] | None
) -> bool:
    """Whether the GPU command (or its options file) runs the server with ``knob`` at ``value``.

    Read from the knob's own target in the backend YAML, not from the renderer: a flag and its
    value, a true/false flag, or a key of the options file. Left at the framework's default, a
    value flag may be absent.
    """
    spec = backend.knobs[knob]
    native = spec.value_map.get(str(value).lower() if isinstance(value, bool) else str(value), value)
    if spec.true_flag or spec.false_flag:
        flag, other = (spec.true_flag, spec.false_flag) if value else (spec.false_flag, spec.true_flag)
        present = flag is None or _contains(command, shlex.split(flag))
        return present and (other is None or not _contains(command, shlex.split(other)))
    if spec.flag:
        if spec.flag not in command:
            return bool(value == spec.default)
        return command[command.index(spec.flag) + 1] == str(native)
    if spec.config_key:
        node: Any = config
        for part in spec.config_key.split("."):
            if not isinstance(node, dict) or part not in node:
                return bool(value == spec.default)
            node = node[part]
        return bool(node == native)
    raise AssertionError(f"{backend.name}.{knob}: a knob target this test has no check for")


class RehearsedCampaign:
    """The tests every rehearsed GPU campaign passes; one ``TestRehearsal...`` subclass per campaign.

    A class per campaign rather than a parameter: pytest-xdist's loadscope hands out a
    class as a unit, so a campaign is rehearsed on one worker and the campaigns spread
    over the workers (a parameter's tests would all share the module's scope).
    """

    campaign: ClassVar[str]

    def test_rehearsal_runs_every_cell_without_a_failure(self, rehearsed: Callable[[str], Path]) -> None:
        folder = rehearsed(self.campaign)
        assert (folder / MARKER).is_file()
        spec = load_campaign(folder / "campaign.yaml")
        cells = _cells(folder)
        assert len(cells) == len(spec.servers) * len(spec.workloads)
        for cell in cells:
            label = cell["server"]["label"]
            assert cell["status"] == "ok", (label, cell.get("error"))
            effort = cell["effort"]
            assert effort["cold_start_s"] > 0 and effort["warm_restart_s"] is not None, label
            assert effort["failed_start_attempts"] == [], label
            # TensorRT-LLM's PyTorch flow builds at start: its build line comes from its (stand-in's) log.
            builder = load_backend(cell["backend"])
            builds_at_start = builder.rehearsal_profile == "trtllm" and builder.engine_build is None
            assert (effort.get("pytorch_build") is not None) == builds_at_start, label
            assert cell["runs"], f"{label}: no run"
            for summary, run in cell["runs"]:
                assert summary.rehearsal is True
                assert summary.requests.failed == 0, (label, summary.requests.failed_by_kind)
                assert summary.requests.ok > 0
                server = run["server"]
                assert server["kind"] == "rehearsal"
                backend = load_backend(cell["backend"])
                assert SERVER_COMMANDS[str(backend.rehearsal_profile)] in server["command_line"], server["command_line"]
                assert backend.container is not None and backend.container.image in server["command_line"]
                # The exact knob values reach the command (or the options file) a GPU host would run.
                command = shlex.split(server["command_line"])
                config = _rehearsed_config(cell["dir"], backend)
                for knob, value in cell["server"]["knobs"].items():
                    assert _launched_with(backend, knob, value, command, config), (label, knob, value)

    def test_rehearsal_answers_the_quality_set_per_cell(self, rehearsed: Callable[[str], Path]) -> None:
        """With ``quality:``, every cell's quality.json holds the rates its stand-in planted: all
        right when the launch is clean, every BROKEN_EVERY-th item of each kind wrong when lossy."""
        folder = rehearsed(self.campaign)
        spec = load_campaign(folder / "campaign.yaml")
        cells = _cells(folder)
        lossy_labels = LOSSY.get(self.campaign, set())
        assert lossy_labels <= {c["server"]["label"] for c in cells}
        for cell in cells:
            label, lossy = cell["server"]["label"], cell["server"]["label"] in lossy_labels
            planted = read_json(cell["dir"] / PLANTED_FILE)
            assert bool(planted["lossy"]) is lossy, (label, planted["lossy"])
            assert planted["prompt_logprob"] == (LOSSY_PROMPT_LOGPROB if lossy else PROMPT_LOGPROB)
            if spec.quality is None:
                assert planted["canned"] is None and not (cell["dir"] / QUALITY_FILE).exists(), label
                continue
            items = [i for i in load_prompt_set(spec.quality.prompts) if i.kind != "perplexity"]  # asked
            kinds = Counter(i.kind for i in items)
            share = {kind: (n // BROKEN_EVERY) / n if lossy else 0.0 for kind, n in kinds.items()}
            rates = read_json(cell["dir"] / QUALITY_FILE)["rates"]
            assert (rates["answered"], rates["failed"], rates["truncated"], rates["refused"]) == (len(items), 0, 0, 0)
            assert rates["exact"] == 1 - share["exact"], (label, rates)
            assert rates["length_ok"] == 1 - share["free"], (label, rates)
            assert rates["invalid_json"] == share["json"], (label, rates)
            assert (rates["exact"] < 1) is lossy  # the shipped set has enough items of each kind to show it
            assert cell["quality"] == rates  # cell.json carries the same rates
            # Only vLLM's stand-in returns prompt logprobs: its planted one comes back as the perplexity.
            scored = load_backend(cell["server"]["backend"]).prompt_logprobs
            expected = math.exp(-planted["prompt_logprob"]) if scored else None
            assert rates["perplexity"] == (pytest.approx(expected) if scored else None), (label, rates)
        table = quality_table(folder)
        assert len(table) == (len(cells) if spec.quality is not None else 0)
        assert all(str(server).endswith(REHEARSAL_SUFFIX) for server in table.get("server", []))

    def test_rehearsal_report_is_marked_on_every_section(self, rehearsed: Callable[[str], Path]) -> None:
        html = (rehearsed(self.campaign) / "report.html").read_text()
        assert "REHEARSAL" in html
        headings = re.findall(r"<h2[^>]*>(.*?)</h2>", html, flags=re.S)
        assert headings, "report has no sections"
        for heading in headings:
            assert "REHEARSAL" in heading, heading
        assert "[rehearsal]" in html  # server labels in the tables carry the mark
        assert "Rehearsal: no verdict is drawn" in html and "No sweep" not in html
        # No front ranked from stand-ins; the way to the real run instead.
        assert "On the front" not in html and "No Pareto front in a rehearsal" in html
        text = re.sub(r"<[^>]+>", "", html)  # code blocks are highlighted word by word
        assert "On the GPU host" in text and "bakeoff campaign run" in text and " pull " in text
        assert "What was compared, on what" in text


class TestRehearsalAgent3kContext(RehearsedCampaign):
    campaign = "gpu-agent-3k-context"

    def test_rehearsal_prefix_cache_hit_rates_come_from_counters(self, rehearsed: Callable[[str], Path]) -> None:
        """Agents repeating 3,000 tokens: every framework's counters must show the reuse."""
        cells = {c["server"]["label"]: c for c in _cells(rehearsed(self.campaign))}
        for label, cell in cells.items():
            for summary, run in cell["runs"]:
                block = summary.prefix_cache
                assert block is not None, label
                designed = block.designed_reuse
                assert designed and designed > 0.5, label
                rate = block.server_hit_rate
                if label == "vllm-no-prefix":
                    assert rate == 0.0, block  # the stand-in honours prefix_caching: false
                    continue
                assert block.server_hits is not None and block.server_queries, (label, block)
                assert rate == pytest.approx(block.server_hits / block.server_queries)
                assert rate == pytest.approx(designed, abs=0.1), (label, block)
                # Usage-reported cached tokens agree with the counters (absent details count as 0).
                assert block.cached_tokens_ratio == pytest.approx(rate, abs=0.05), (label, block)
                if load_backend(cell["backend"]).cache_reset.kind == "http":
                    assert run["prefix_cache_reset_before_run"], label


# No shipped GPU campaign asks a speculative question (their questions are frameworks, prefix
# caching, chunked prefill, INT4, tuning), so these servers do: one per way of counting drafts.
# vLLM counts drafts, SGLang only verification steps, TensorRT-LLM no steps. A GPU host would
# need an EAGLE head for SGLang; the rehearsal only mounts the folder.
SPECULATIVE = {
    "vllm": {"speculative": "ngram", "num_speculative_tokens": 2},
    "sglang": {"speculative": "eagle"},  # num_speculative_tokens: 4 by default
    "trtllm": {"speculative": "ngram"},
}


def _rehearse_one(backend_name: str, knobs: dict[str, Any], model: Path, cell_dir: Path) -> None:
    """One server as a rehearsal launches it, one closed-loop level through the runner into ``cell_dir``."""
    backend = load_backend(backend_name)
    server = ServerConfig(backend=backend_name, label=f"{backend_name}-spec", knobs=knobs).for_rehearsal()
    source = ModelSource(hf_id=None, local_dir=model)
    ctx = LaunchContext(server, backend, source, "llama-7b", cell_dir, draft_dir=model)
    # 25 tokens: the prefill's one, then whole steps (1 + 1 of 2 drafts, or 1 + 2 of 4).
    requests = [PlannedRequest(i, "completions", 25, prompt=f"hello {i} " * 8) for i in range(4)]
    with start_server(ctx) as (handle, launch):
        info = {"kind": handle.kind, "knobs": launch.knobs, "effective_knobs": launch.effective_knobs}
        extra = dict(backend.request.extra_body)
        settings = ClientSettings(
            handle.base_url, handle.model, extra_body=extra, min_tokens=backend.request.min_tokens
        )
        target = RunTarget(settings, backend, info, show_progress=False)
        plan = RunPlan("c2", "closed", CLOSED, concurrency=2, requests=requests)
        execute_plan(plan, target, cell_dir / "runs" / "c2")
    server_info = {"label": server.label, "backend": backend_name, "knobs": knobs}
    write_json(
        cell_dir / "cell.json", {"server": server_info, "backend": backend_name, "workload": "w", "status": "ok"}
    )


def test_a_rehearsed_speculative_server_fills_the_speculative_table(tmp_path: Path, tiny_model: Path) -> None:
    """The stand-ins speculate as the knobs say; the report's table reads their counters through each YAML."""
    for name, knobs in SPECULATIVE.items():
        _rehearse_one(name, knobs, tiny_model, tmp_path / "cells" / f"{name}-spec__w")
    table = speculative_table(tmp_path).set_index("server")
    # Planted (REHEARSAL_DRAFT_ACCEPTANCE): half the drafts accepted, each step whole.
    assert table["draft acceptance %"].to_dict() == {"vllm-spec": 50.0, "sglang-spec": 50.0, "trtllm-spec": 50.0}
    per_step = table["accepted per step"]
    assert (per_step["vllm-spec"], per_step["sglang-spec"]) == (1.0, 2.0)  # 2 drafts a step, then SGLang's 4
    assert pd.isna(per_step["trtllm-spec"])  # /prometheus/metrics counts no verification steps
    # 4 requests of 24 tokens after the first: 12 steps of 2 drafts, or 8 of 4.
    drafted = {"vllm-spec": 4 * 12 * 2, "sglang-spec": 4 * 8 * 4, "trtllm-spec": 4 * 8 * 4}
    assert table["draft tokens"].to_dict() == drafted


def _class_name(stem: str) -> str:
    return "TestRehearsal" + "".join(part.capitalize() for part in stem.removeprefix("gpu-").split("-"))


# Every other shipped GPU campaign gets its class here, so a new campaign is rehearsed unasked.
for _path in GPU_CAMPAIGNS:
    if _class_name(_path.stem) not in globals():
        globals()[_class_name(_path.stem)] = type(
            _class_name(_path.stem), (RehearsedCampaign,), {"campaign": _path.stem}
        )
