"""The setup section: what ran where, what it cost to build and start, and the campaign's title."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from bakeoff.backends.kv_pool import BASIS_TEXT, KvPool, kv_pool_settings
from bakeoff.backends.spec import load_backend
from bakeoff.errors import SpecError
from bakeoff.report.frame import REHEARSAL_SUFFIX, start_note
from bakeoff.report.measured_apart import measured_apart_note
from bakeoff.results.layout import (
    REHEARSAL_BANNER,
    is_rehearsal,
    load_cells,
    read_campaign_copy,
    rehearsal_marker,
)
from bakeoff.results.store import RUN_INFO, read_json_or_empty
from bakeoff.results.summary import Effort

MEMORY_KNOB_NOTE = (
    "`gpu_memory_utilization` means different things: vLLM takes that share of total GPU memory; "
    "SGLang's `--mem-fraction-static` is a share of total memory for weights + KV cache; "
    "TensorRT-LLM's `free_gpu_memory_fraction` is a share of what is free *after* the weights load."
)

# vllm/config/scheduler.py: max_num_batched_tokens caps every token a step schedules, decode
# included; SGLang's --chunked-prefill-size caps one prefill chunk, and decode runs beside it.
BATCHED_TOKENS_NOTE = (
    "`max_num_batched_tokens` means different things: vLLM's budget counts every token of a step, "
    "the running requests' decode tokens included; SGLang's `--chunked-prefill-size` caps the prefill "
    "chunk alone (decode tokens come on top); TensorRT-LLM's `max_num_tokens` counts a step's tokens like vLLM."
)


def build_seconds(effort: Effort) -> float | None:
    """Seconds of the server's build step: the engine flow's trtllm-build (or GGUF conversion), else
    the PyTorch flow's load + autotune + CUDA graphs read from its log (inside its cold start)."""
    pytorch = effort.pytorch_build
    if effort.engine_build_s is None and pytorch is not None:
        return float(pytorch.total_s)
    value = effort.engine_build_s
    return float(value) if value is not None else None


def build_step(effort: Effort) -> str:
    """What the "engine build s" column holds for this server, so a PyTorch flow's start-up build
    is never read as an ahead-of-time engine build, and a cached engine not as a fresh one."""
    pytorch = effort.pytorch_build
    if effort.engine_build_s is None and pytorch is not None:
        rounds = f", {pytorch.rounds} rounds" if pytorch.rounds > 1 else ""
        return (
            f"PyTorch flow, inside cold start (server log{rounds}): load {pytorch.load_s:.0f} s + "
            f"autotune {pytorch.autotune_s:.0f} s + CUDA graphs {pytorch.cuda_graph_s:.0f} s"
        )
    if effort.engine_build_s is None:
        return str(effort.engine_build_step or "-")
    step = effort.engine_build_step or "build"
    if effort.engine_build_cached:
        return f"{step}: cached, the original build's seconds (nothing built this run)"
    return f"{step}, this run"


def effort_table(campaign_dir: Path) -> pd.DataFrame:
    """Engineering effort per server: build and start times, flags changed, failed starts."""
    rows = []
    seen = set()
    suffix = REHEARSAL_SUFFIX if is_rehearsal(campaign_dir) else ""
    cells = load_cells(campaign_dir)
    # With repeats, the warm restart is repeat 2's start (bakeoff.campaign.cell_run.run_cell).
    warm = {c.label: w for c in cells if (w := c.effort.warm_restart_s) is not None}
    for cell in cells:
        label = cell.label + suffix
        if label in seen:
            continue
        seen.add(label)
        effort = cell.effort
        needs = effort.knob_change_needs
        # A warm restart recorded as None (not measurable) stays None; only a cell without one borrows its repeat's.
        warm_s = effort.warm_restart_s if "warm_restart_s" in effort.model_fields_set else warm.get(cell.label)
        rows.append(
            {
                "server": label,
                "backend": cell.backend,
                "image build s": effort.image_build_s,
                "engine build s": build_seconds(effort),
                "build step": build_step(effort),
                "cold start s": effort.cold_start_s,
                "warm restart s": warm_s,
                "cache-emptying restarts s": effort.cache_restart_s or None,
                "flags changed": effort.flags_changed,
                "config lines": effort.config_lines,
                "knobs needing rebuild": ", ".join(k for k, v in needs.items() if v == "rebuild") or "-",
                "knobs needing restart": ", ".join(k for k, v in needs.items() if v == "restart") or "-",
                "failed starts": len(effort.failed_start_attempts),
                "framework warnings": "; ".join(effort.launch_warnings) or "-",
                "status": cell.status,
                "start note": start_note(effort.cold_start_s, warm_s),
            }
        )
    return pd.DataFrame(rows).round(1)


def _machine_text(machine: dict[str, Any]) -> str:
    """``AMD EPYC 9654, 2 cores, 7.8 GiB memory`` (and the GPUs where there are any), from run.json."""
    parts = [str(machine.get("cpu_model") or machine.get("platform") or "unknown CPU")]
    if machine.get("cpus"):
        parts.append(f"{machine['cpus']} cores")
    if machine.get("memory_gib"):
        parts.append(f"{float(machine['memory_gib']):.1f} GiB memory")
    if machine.get("gpu_count"):
        driver = f", driver {machine['gpu_driver']}" if machine.get("gpu_driver") else ""
        parts.append(f"{machine['gpu_count']}x {machine['gpu']}{driver}")
    return ", ".join(parts)


def _runs_as(server: dict[str, Any], versions: dict[str, Any]) -> str:
    """The image and digest a container ran, or the interpreter (or binary) a process ran."""
    if server.get("image"):
        digest = server.get("image_digest")
        return f"image {server['image']}" + (f" ({digest})" if digest else "")
    engine = versions.get("engine") if isinstance(versions.get("engine"), dict) else None
    if engine and engine.get("interpreter"):
        python = f" (Python {engine['python']})" if engine.get("python") else ""
        return f"{server.get('kind', 'process')}: {engine['interpreter']}{python}"
    words = str(server.get("command_line") or "").split()
    return f"{server.get('kind', 'process')}: {words[0]}" if words else str(server.get("kind") or "-")


def setup_table(campaign_dir: Path) -> pd.DataFrame:
    """What was compared, on what: each server's framework, version, image or interpreter, and the machine.

    Read from each server's first run (``run.json`` and the summary's provenance), so the
    report says it without opening either; the version is the one spelling provenance records.
    """
    rows = []
    seen: set[str] = set()
    suffix = REHEARSAL_SUFFIX if is_rehearsal(campaign_dir) else ""
    for cell in load_cells(campaign_dir):
        if cell.label in seen or not cell.summaries:
            continue
        seen.add(cell.label)
        run_name, summary = next(iter(cell.summaries.items()))
        run = read_json_or_empty(cell.dir / "runs" / run_name / RUN_INFO)
        server, versions = dict(run.get("server") or {}), dict(run.get("versions") or {})
        provenance = summary.provenance
        try:
            framework = load_backend(cell.backend).display_name
        except SpecError:
            framework = cell.backend
        rows.append(
            {
                "server": cell.label + suffix,
                "framework": framework,
                "version": (provenance.framework_version if provenance else None) or "-",
                "runs as": _runs_as(server, versions),
                "machine": _machine_text(dict(run.get("machine") or {})),
            }
        )
    return pd.DataFrame(rows)


def gpu_host_markdown(campaign_dir: Path) -> str | None:
    """A rehearsal's "on the GPU host" steps (its marker holds them), or None for a measured campaign."""
    marker = rehearsal_marker(campaign_dir)
    steps = marker.get("gpu_host") if marker else None
    return str(steps["markdown"]) if isinstance(steps, dict) and "markdown" in steps else None


def effort_notes(campaign_dir: Path) -> list[str]:
    """The notes under the effort table that apply to this campaign (GPU-memory knobs: GPU campaigns only)."""
    return [MEMORY_KNOB_NOTE, BATCHED_TOKENS_NOTE] if read_campaign_copy(campaign_dir).gpu else []


def kv_pool_table(campaign_dir: Path) -> pd.DataFrame:
    """The campaign's one KV-pool intent beside each server's own knob and value (empty without ``kv_pool``).

    Read from the campaign copy and mapped again by :mod:`bakeoff.backends.kv_pool`, the one rule
    the launches were rendered with.
    """
    spec = read_campaign_copy(campaign_dir)
    if not spec.kv_pool:
        return pd.DataFrame()
    pool = KvPool.model_validate(spec.kv_pool)
    servers = [s for s in spec.servers if not s.url]
    settings = kv_pool_settings(pool, [(s.name, load_backend(s.backend)) for s in servers])
    suffix = REHEARSAL_SUFFIX if is_rehearsal(campaign_dir) else ""
    return pd.DataFrame(
        [
            {
                "server": x.server + suffix,
                "declared KV pool": f"{pool.share_of_gpu:.0%} of {pool.gpu_memory_gib:g} GiB = {pool.pool_gib:.1f} GiB",
                "framework knob": x.target,
                "a share of": BASIS_TEXT[x.basis],
                "value": f"{x.value:g}",  # as rendered: the table styling would round it
            }
            for x in settings
        ]
    )


def campaign_title(campaign_dir: Path) -> str:
    spec = read_campaign_copy(campaign_dir)
    title = f"# bakeoff report: {spec.name}\n\n{spec.description}"
    apart = measured_apart_note(campaign_dir)
    if apart is not None:
        title = f"{title}\n\n{apart}"
    rehearsal = rehearsal_marker(campaign_dir)
    if rehearsal is None:
        return title
    title = f"# REHEARSAL of {spec.name} — not a measurement\n\n{spec.description}"
    title += f"\n\n{apart}" if apart is not None else ""
    return (
        f"{title}\n\n> {REHEARSAL_BANNER}\n>\n> Campaign: `{rehearsal['source_campaign']}` (scaled down); "
        f"model on a real run: `{rehearsal['original_model']}`."
    )
