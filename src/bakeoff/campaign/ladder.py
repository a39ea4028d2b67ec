"""The optimization ladder: one knob at a time, kept only while quality holds and speed does not fall.

A campaign with a ``ladder:`` section measures its first server (the baseline), then each
step in order on top of the last *kept* configuration: the step's knobs are merged into the
kept knobs, the cell is measured for speed and quality like any other, and the step is
kept unless it breaks the quality bound against the last kept step, costs more speed than
``min_speedup`` allows (or fails to run), in which case it is rolled back and the next step
starts again from the last kept one. This is
the recommended way to tune a server (measure a baseline, turn one knob at a time, re-test
speed *and* quality, keep a rollback) turned into a campaign.

This module owns the section, the outcome of a step (:func:`outcome_of`: speed, peak server
memory, quality) and the keep/rollback decision (:func:`decide`, pure);
:func:`bakeoff.campaign.execute.run_campaign` drives the cells and writes ``ladder.json`` and
``ladder.md`` into the campaign folder. The waterfall itself, in ``ladder.md`` and in the
report, is :mod:`bakeoff.report.ladder_report`'s, read from ``ladder.json``.

Quality bound, against the last kept step: the exact-answer rate may drop by at most
``max_exact_drop`` (absolute share), greedy outputs must keep a word agreement
(:func:`bakeoff.campaign.quality.word_agreement`) of at least ``min_word_agreement``, and the
held-out perplexity, where the server returns prompt logprobs for both steps, may rise by at
most ``max_perplexity_rise`` (relative).
Speed bound: output tok/s at least ``min_speedup`` times the last kept step's (default 0.95:
a step may cost at most 5%, about one repeat's noise on a CPU). A step is tried to buy speed;
one that keeps the answers but slows the server down is not an optimization, and keeping it
left the shipped CPU ladder 36% slower than its baseline. ``min_speedup: null`` keeps a slower
step (one tried for memory, say).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Annotated, Any

from pydantic import Field, model_validator

from bakeoff.backends.spec import KnobValue
from bakeoff.campaign.quality import word_agreement
from bakeoff.observe.telemetry_series import SERIES_FILE, read_series
from bakeoff.report.ladder_report import waterfall_markdown as markdown_of
from bakeoff.results.layout import CellResult
from bakeoff.schema import Strict


class LadderStep(Strict):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    knobs: dict[str, KnobValue] = Field(min_length=1, description="merged into the last kept step's knobs")
    why: str = Field(default="", description="what the step is expected to buy, for the report")


class LadderSpec(Strict):
    """Steps on top of the campaign's first server, and the quality bound each must hold."""

    steps: Annotated[list[LadderStep], Field(min_length=1)]
    max_exact_drop: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.05, description="largest allowed fall of the exact-answer rate against the last kept step"
    )
    min_word_agreement: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.5, description="smallest allowed mean word agreement with the last kept step's greedy outputs"
    )
    max_perplexity_rise: Annotated[float, Field(ge=0)] = Field(
        default=0.05, description="largest allowed relative rise of the held-out perplexity (where measured)"
    )
    min_speedup: Annotated[float, Field(gt=0)] | None = Field(
        default=0.95,
        description="smallest allowed output tok/s against the last kept step (0.95: at most 5% slower); "
        "null keeps a slower step",
    )

    @model_validator(mode="after")
    def _unique(self) -> LadderSpec:
        names = [s.name for s in self.steps]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"ladder.steps[].name must be unique; repeated: {', '.join(repeated)}")
        return self


@dataclass
class StepOutcome:
    """What one measured step (or the baseline) gave: speed, quality, the outputs behind it."""

    label: str
    knobs: dict[str, Any]
    ran: bool
    output_tok_s: float | None = None
    ttft_ms_p50: float | None = None
    ttft_ms_p99: float | None = None
    tpot_ms_p50: float | None = None
    tpot_ms_p99: float | None = None
    itl_per_token_ms_p50: float | None = None
    spec_acceptance_rate: float | None = None
    peak_rss_mib: float | None = None  # the server's process tree, highest over the measured windows
    dtypes: dict[str, str] = field(default_factory=dict)  # weights and KV cache, as the server ran
    exact: float | None = None
    perplexity: float | None = None  # held-out, from the server's prompt logprobs (None: not returned)
    exact_by_group: dict[str, float | None] = field(default_factory=dict)
    answers: dict[str, str] = field(default_factory=dict, repr=False)
    why: str = ""  # what the step was expected to buy (the ladder step's why)


@dataclass
class Decision:
    step: str
    kept: bool
    reasons: list[str]
    against: str  # the last kept step it was judged against
    exact_change: float | None = None
    word_agreement: float | None = None
    perplexity_change: float | None = None  # relative, against the last kept step
    speedup: float | None = None  # output tok/s against the last kept step


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def _first_dtypes(cells: list[CellResult]) -> dict[str, str] | None:
    """The weight and KV-cache types the first finished cell's server ran with (None: none had started)."""
    first = next((c for c in cells if c.status == "ok"), None)
    return first.effort.server.dtypes if first is not None and first.effort.server is not None else None


def peak_rss_mib(cells: list[CellResult]) -> float | None:
    """The server's highest resident memory over every run's telemetry series, in MiB."""
    peaks = []
    for cell in cells:
        for run in cell.summaries:
            path = cell.dir / "runs" / run / SERIES_FILE
            if path.is_file():
                series = read_series(path)
                if "rss_bytes" in series and series["rss_bytes"].notna().any():
                    peaks.append(float(series["rss_bytes"].max()) / 2**20)
    return max(peaks) if peaks else None


def outcome_of(
    label: str, knobs: dict[str, Any], cells: list[CellResult], quality: dict[str, Any] | None
) -> StepOutcome:
    """One step's outcome from its cells (every workload and repeat: runs averaged) and quality.json."""
    summaries = [s for c in cells if c.status == "ok" for s in c.summaries.values()]
    if not summaries:
        return StepOutcome(label, knobs, ran=False)
    rates = (quality or {}).get("rates") or {}
    return StepOutcome(
        label=label,
        knobs=knobs,
        ran=True,
        output_tok_s=_mean([s.throughput.output_tok_s for s in summaries]),
        ttft_ms_p50=_mean([s.latency.ttft_ms.p50 for s in summaries]),
        ttft_ms_p99=_mean([s.latency.ttft_ms.p99 for s in summaries]),
        tpot_ms_p50=_mean([s.latency.tpot_ms.p50 for s in summaries]),
        tpot_ms_p99=_mean([s.latency.tpot_ms.p99 for s in summaries]),
        # Left out where the client read several chunks at once (the gaps are then not the server's).
        itl_per_token_ms_p50=_mean(
            [None if s.latency.itl_per_token_ms.unsupported else s.latency.itl_per_token_ms.p50 for s in summaries]
        ),
        spec_acceptance_rate=_mean([s.speculative.acceptance_rate if s.speculative else None for s in summaries]),
        peak_rss_mib=peak_rss_mib([c for c in cells if c.status == "ok"]),
        dtypes=dict(_first_dtypes(cells) or {}),
        exact=rates.get("exact"),
        perplexity=rates.get("perplexity"),
        exact_by_group=dict((quality or {}).get("exact_by_group") or {}),
        answers={a["id"]: a["output"] for a in (quality or {}).get("answers", []) if a.get("error") is None},
    )


def decide(spec: LadderSpec, kept: StepOutcome, step: StepOutcome) -> Decision:
    """Keep ``step`` unless it did not run, breaks the quality bound or costs speed against ``kept``."""
    reasons: list[str] = []
    if not step.ran:
        return Decision(step.label, False, ["the step did not run (see its cell)"], kept.label)
    change = None if step.exact is None or kept.exact is None else step.exact - kept.exact
    if change is None:
        reasons.append("no exact-answer rate to judge (the campaign needs quality: with exact items)")
    elif change < -spec.max_exact_drop:
        reasons.append(f"exact-answer rate fell {-change:.1%} (bound {spec.max_exact_drop:.1%})")
    shared = sorted(set(step.answers) & set(kept.answers))
    agreement = _mean([word_agreement(step.answers[i], kept.answers[i]) for i in shared])
    if agreement is None:
        reasons.append(f"no greedy outputs shared with {kept.label} to compare")
    elif agreement < spec.min_word_agreement:
        reasons.append(f"word agreement with {kept.label} {agreement:.1%} (bound {spec.min_word_agreement:.1%})")
    perplexity_change = (
        None if step.perplexity is None or not kept.perplexity else step.perplexity / kept.perplexity - 1
    )
    if perplexity_change is not None and perplexity_change > spec.max_perplexity_rise:
        reasons.append(f"perplexity rose {perplexity_change:.1%} (bound {spec.max_perplexity_rise:.1%})")
    speedup = step.output_tok_s / kept.output_tok_s if step.output_tok_s is not None and kept.output_tok_s else None
    if spec.min_speedup is not None and speedup is not None and speedup < spec.min_speedup:
        reasons.append(f"output tok/s {speedup - 1:+.1%} against {kept.label} (bound {spec.min_speedup - 1:+.0%})")
    return Decision(step.label, not reasons, reasons, kept.label, change, agreement, perplexity_change, speedup)


@dataclass
class LadderResult:
    baseline: StepOutcome
    steps: list[tuple[StepOutcome, Decision]]
    spec: LadderSpec | None = None  # the bound the steps were judged by, for the report

    @property
    def final(self) -> StepOutcome:
        kept = [outcome for outcome, decision in self.steps if decision.kept]
        return kept[-1] if kept else self.baseline

    @property
    def chain(self) -> list[str]:
        """The kept steps in order, the baseline first: the rollback chain of the final configuration."""
        return [self.baseline.label, *(o.label for o, d in self.steps if d.kept)]

    def to_json(self) -> dict[str, Any]:
        def plain(outcome: StepOutcome) -> dict[str, Any]:
            row = asdict(outcome)
            row.pop("answers")
            return row

        bound = (
            {}
            if self.spec is None
            else {
                "max_exact_drop": self.spec.max_exact_drop,
                "min_word_agreement": self.spec.min_word_agreement,
                "max_perplexity_rise": self.spec.max_perplexity_rise,
            }
        )
        return {
            "baseline": plain(self.baseline),
            "steps": [{"outcome": plain(o), "decision": asdict(d)} for o, d in self.steps],
            "final": {"label": self.final.label, "knobs": self.final.knobs, "chain": self.chain},
            "bound": bound,
        }


def waterfall_markdown(result: LadderResult) -> str:
    """``ladder.md``: the report's waterfall (:mod:`bakeoff.report.ladder_report`) of this result."""
    return markdown_of(result.to_json())
