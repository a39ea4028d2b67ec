"""From a loaded trace to prompts: context checks, clipping, and token-exact block text.

Each distinct block id becomes one fixed block of ``block_size`` single-token words, drawn
from a generator seeded by the workload seed and the id alone, so the same id is the same
tokens in every request, wherever it appears, on every server; a partial last block is the
first words of that block. Tokens a row has beyond its ids are fresh text, unique to the
request. A request that does not fit the served context is refused before anything starts
(with the count of such rows), or clipped when the workload says ``clip_to_context``:
the prompt is shortened first (its trailing blocks go), then the output.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from bakeoff.errors import SpecError
from bakeoff.workloads.prompts import PromptFactory
from bakeoff.workloads.traces.loading import load_trace
from bakeoff.workloads.traces.rows import LoadedTrace, TraceRow, block_tokens, reused_tokens, sharing_class
from bakeoff.workloads.traces.spec import TraceSpec

# Tokens a server adds around the body: BOS on completions, the chat template's role markers on chat.
CONTEXT_ALLOWANCE = {"completions": 1, "chat": 16}


def allowance(wl: TraceSpec) -> int:
    return CONTEXT_ALLOWANCE[wl.endpoint]


def need(row: TraceRow, wl: TraceSpec) -> int:
    """Context tokens a request occupies on the server: prompt, output and what the server adds."""
    return row.prompt_tokens + row.output_tokens + allowance(wl)


def check_fits(wl: TraceSpec, limit: int | None, where: str, server: str) -> None:
    """Refuse a trace with requests beyond ``limit`` unless the workload clips them."""
    if limit is None or wl.clip_to_context:
        return
    rows = load_trace(wl).rows
    over = [r for r in rows if need(r, wl) > limit]
    if over:
        worst = max(over, key=lambda r: need(r, wl))
        raise SpecError(
            f"{where}: {len(over)} of {len(rows)} trace requests need more than the {limit} tokens {server} accepts "
            f"(prompt + output + {allowance(wl)}; the longest, row {worst.line}, needs {need(worst, wl)}); "
            "set clip_to_context: true to shorten them, or raise max_model_len"
        )


def clip(rows: tuple[TraceRow, ...], wl: TraceSpec, limit: int | None, block_size: int) -> tuple[list[TraceRow], int]:
    """Rows shortened to fit ``limit`` (prompt first, then output) and how many were shortened."""
    if limit is None or not wl.clip_to_context:
        return list(rows), 0
    room = limit - allowance(wl)
    if room < 2:
        raise SpecError(f"clip_to_context: a {limit}-token context leaves no room for a prompt and an output token")
    out, clipped = [], 0
    for row in rows:
        if need(row, wl) <= limit:
            out.append(row)
            continue
        clipped += 1
        output = min(row.output_tokens, room - 1)
        prompt = min(row.prompt_tokens, room - output)
        kept = len(block_tokens(prompt, row.blocks, block_size)) if block_size else 0
        out.append(replace(row, prompt_tokens=prompt, output_tokens=output, blocks=row.blocks[:kept]))
    return out, clipped


def _first_words(text: str, count: int) -> str:
    """The first ``count`` words of a prompt text, spaced as the text was (words hold no spaces)."""
    if count <= 0:
        return ""
    parts = text.split(" ")
    if parts[0] == "":  # every word carries its own leading space
        return " " + " ".join(parts[1 : count + 1])
    return " ".join(parts[:count])


class BlockText:
    """The fixed text of each block id, made once per plan."""

    def __init__(self, prompts: PromptFactory, block_size: int, seed: int) -> None:
        self.prompts = prompts
        self.block_size = block_size
        self.seed = seed
        self._blocks: dict[int, str] = {}

    def block(self, block_id: int, tokens: int) -> str:
        text = self._blocks.get(block_id)
        if text is None:
            # Seeded by the id alone: the block is the same text whichever request sends it first.
            text = self.prompts.text(self.block_size, random.Random(f"{self.seed}/block/{block_id}"))
            self._blocks[block_id] = text
        return text if tokens == self.block_size else _first_words(text, tokens)

    def prompt(self, row: TraceRow, rng: random.Random) -> str:
        sizes = block_tokens(row.prompt_tokens, row.blocks, self.block_size) if self.block_size else []
        parts = [self.block(b, n) for b, n in zip(row.blocks, sizes, strict=False)]
        rest = row.prompt_tokens - sum(sizes)
        if rest > 0:
            parts.append(self.prompts.text(rest, rng))
        return self.prompts.joiner.join(parts)


@dataclass
class TraceRequests:
    """What a trace run sends, in arrival order, and what the report needs to know about it."""

    rows: list[TraceRow]
    texts: list[str]
    classes: list[str]
    arrivals_s: list[float]
    block_size: int
    info: dict[str, Any] = field(default_factory=dict)


def plan_trace(wl: TraceSpec, prompts: PromptFactory, context_limit: int | None) -> TraceRequests:
    """The trace's requests with their prompt texts, arrivals scaled, clipped when asked."""
    trace = load_trace(wl)
    block_size = trace.block_size if any(r.blocks for r in trace.rows) else 0
    rows, clipped = clip(trace.rows, wl, context_limit, block_size)
    text = BlockText(prompts, block_size, wl.seed)
    rng = random.Random(wl.seed)
    texts = [text.prompt(row, rng) for row in rows]
    reused = reused_tokens([(r.prompt_tokens, r.blocks) for r in rows], block_size) if block_size else [0] * len(rows)
    arrivals = [row.at_s * wl.time_scale for row in rows]
    return TraceRequests(
        rows,
        texts,
        [sharing_class(n, r.prompt_tokens) for n, r in zip(reused, rows, strict=True)],
        arrivals,
        block_size,
        _info(trace, wl, arrivals, clipped, context_limit),
    )


def _info(trace: LoadedTrace, wl: TraceSpec, arrivals: list[float], clipped: int, limit: int | None) -> dict[str, Any]:
    span = arrivals[-1] - arrivals[0] if arrivals else 0.0
    return {
        "source": str(trace.source),
        "format": trace.format,
        "sha256": trace.sha256,
        "rows_in_file": trace.rows_in_file,
        "left_out": trace.left_out,
        "requests": len(arrivals),
        "time_scale": wl.time_scale,
        "span_s": span,
        # n arrivals over their span: the mean rate the trace offers once scaled.
        "offered_rate": (len(arrivals) - 1) / span if span > 0 else None,
        "clipped": clipped,
        "context_limit": limit,
        "block_size": trace.block_size,
    }
