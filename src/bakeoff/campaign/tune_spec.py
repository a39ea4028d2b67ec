"""A campaign's ``tune:`` section: what ``bakeoff tune`` optimises, on which load, with what budget.

::

    tune:
      objective: goodput        # goodput at the load (default) | max_load | pareto
      workload: chat            # default: the first workload (a concurrency sweep or open loop)
      load: 8                   # a level (or rate) of that workload; default its highest
      trials: 12                # per server group, the same for every group (fair)
      time_budget_s: 1800       # per group, optional: whichever budget ends first
      only: [max_num_seqs, max_num_batched_tokens]   # search just these knobs
      knobs: {max_num_seqs: {low: 2, high: 32, log: true}}  # ranges replacing the backend's
      finalists: 3              # re-measured with `repeats` repeats before the pick
      repeats: 3

Every server entry of the campaign is one *group*: its knobs as written are the untuned start
(measured like a finalist, and the quality reference), the backend's ``tune:`` block
(:mod:`bakeoff.backends.tune_space`) merged with this section's is the space searched.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from bakeoff.backends.tune_space import Constraint, KnobRange
from bakeoff.schema import Strict
from bakeoff.workloads.kinds import Workload

Objective = Literal["goodput", "max_load", "pareto"]


class QualityGate(Strict):
    """A trial passes when its quality answers hold up against its group's untuned configuration."""

    min_agreement: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.9, description="share of items answered exactly as the untuned configuration answered them"
    )
    max_rate_drop: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.05, description="most a pass rate (exact, valid JSON, length) may fall below the untuned one's"
    )


class TuneSpec(Strict):
    """What to optimise, where, and the budget every server group gets."""

    objective: Objective = Field(
        default="goodput",
        description="goodput at the load; max_load: highest load of the workload within the SLO; "
        "pareto: throughput per GPU against tok/s per user",
    )
    workload: str | None = Field(default=None, description="the workload tuned on; default the first")
    load: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="the concurrency level or rate of that workload; default its highest"
    )
    trials: Annotated[int, Field(ge=1, le=500)] = Field(default=12, description="trials per server group")
    time_budget_s: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="wall-clock seconds per server group; no new trial starts after it"
    )
    only: list[str] | None = Field(default=None, description="search only these knobs")
    knobs: dict[str, KnobRange] = Field(default_factory=dict, description="ranges that replace the backend's")
    constraints: list[Constraint] = Field(default_factory=list, description="added to the backend's")
    prune: bool = Field(default=True, description="stop clearly bad trials after a short probe run")
    probe_share: Annotated[float, Field(gt=0, le=1)] = Field(
        default=0.25, description="the probe's share of the trial's requests"
    )
    finalists: Annotated[int, Field(ge=1, le=10)] = Field(default=3, description="best trials re-measured")
    repeats: Annotated[int, Field(ge=2, le=20)] = Field(
        default=3, description="repeats of each finalist and untuned start (the first is the trial itself)"
    )
    min_effect: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.05, description="smallest ratio that counts as a difference in the verdicts"
    )
    quality: QualityGate = Field(default_factory=QualityGate)
    seed: int = Field(default=0, description="the sampler's seed: the same campaign proposes the same trials")

    def for_rehearsal(self) -> TuneSpec:
        """The budget scaled down for a rehearsal: every step of the path once, no search worth the name.

        Two trials (the probe and the pruner's path included), one finalist and two repeats: the
        fewest that still run the re-measuring, the pick and both comparisons.
        """
        return self.model_copy(
            update={"trials": min(self.trials, 2), "time_budget_s": None, "finalists": 1, "repeats": 2}
        )

    def target(self, workloads: list[Workload]) -> tuple[Workload, float]:
        """The workload tuned on and its load; ValueError naming the field when they do not fit."""
        names = [w.label for w in workloads]
        if self.workload is not None and self.workload not in names:
            raise ValueError(f"tune.workload: no workload {self.workload!r}; workloads: {', '.join(names)}")
        wl = workloads[names.index(self.workload)] if self.workload is not None else workloads[0]
        loads = wl.load_levels()
        if not loads:
            raise ValueError(
                f"tune.workload: {wl.label!r} is a {wl.kind} workload; tune needs a load to hold: "
                "a concurrency sweep or an open loop"
            )
        load = self.load if self.load is not None else max(loads)
        if load not in loads:
            raise ValueError(f"tune.load: {load:g} is not a load of {wl.label!r}; its loads: {loads}")
        return wl, load
