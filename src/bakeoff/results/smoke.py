"""The smoke run's record on disk (``smoke.json`` in the campaign folder) and its table.

A smoke run (:mod:`bakeoff.campaign.smoke`) takes every server of a campaign through the
steps of a real run once, minutes long, before the hours-long run: start, health, a streamed
and a non-streamed completion, a metrics scrape, a verified cache reset, stop. This module
owns what it found, typed, so the campaign (to stop a real run) and the report (its
engineering-effort section) read one definition.

A step's ``ok`` is True (passed), False (failed: the server is not ready for a real run) or
None (not checked, with the reason: a step that cannot apply, or one after a failed step).
A mapped metric is ``found``, ``lazy`` (the framework creates it on its first increment, so
absent until then: SGLang's ``cached_tokens_total`` before the first cache hit), ``off`` (a
counter registered only with a feature the server does not run, speculative decoding) or
``missing`` (a failure: the name the backend YAML maps is not what the server exports).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from bakeoff.results.store import read_json, write_json

SMOKE_FILE = "smoke.json"
SMOKE_SCHEMA_VERSION = 1

StepName = Literal["start", "health", "streamed", "non-streamed", "metrics", "cache reset", "stop"]
STEPS: tuple[StepName, ...] = ("start", "health", "streamed", "non-streamed", "metrics", "cache reset", "stop")
MetricState = Literal["found", "lazy", "off", "missing"]


class SmokeStep(BaseModel):
    """One step of one server's smoke run."""

    step: StepName
    ok: bool | None
    detail: str = ""
    seconds: float | None = None

    @property
    def mark(self) -> str:
        return {True: "ok", False: "FAILED", None: "not checked"}[self.ok]


class MetricCheck(BaseModel):
    """One logical metric the backend maps, and whether the server's scrape had it."""

    name: str
    native: str
    state: MetricState
    # A lazy counter: whether it is the prefix-cache hit counter (appears with the first hit)
    # rather than one that appears with its own first increment (a preemption, a draft).
    hit_counter: bool = False
    # Scraped again after the cache-reset step's first hit: a lazy counter seen then.
    after_first_hit: bool | None = None


class SmokeServer(BaseModel):
    """One server's smoke run: its steps in order and its metric names."""

    label: str
    backend: str
    launcher: str
    steps: list[SmokeStep] = Field(default_factory=list)
    metrics: list[MetricCheck] = Field(default_factory=list)

    @property
    def failed(self) -> SmokeStep | None:
        """The first step that failed, None when none did."""
        return next((s for s in self.steps if s.ok is False), None)

    def step(self, name: StepName) -> SmokeStep | None:
        return next((s for s in self.steps if s.step == name), None)


class SmokeResult(BaseModel):
    """Every server's smoke run, as ``smoke.json`` holds it."""

    schema_version: int = SMOKE_SCHEMA_VERSION
    rehearsal: bool = False
    servers: list[SmokeServer] = Field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(s.failed is None for s in self.servers)

    def failures(self) -> list[str]:
        """One line per failed server: the server, the step, why."""
        return [
            f"server {s.label!r} ({s.backend}): step {f.step!r} failed: {f.detail}"
            for s in self.servers
            if (f := s.failed) is not None
        ]


def write_smoke(campaign_dir: Path, result: SmokeResult) -> None:
    write_json(campaign_dir / SMOKE_FILE, result.model_dump(mode="json"))


def read_smoke(campaign_dir: Path) -> SmokeResult | None:
    """The campaign folder's smoke run, None when none ran there."""
    path = campaign_dir / SMOKE_FILE
    return SmokeResult.model_validate(read_json(path)) if path.is_file() else None


def smoke_rows(result: SmokeResult, *, detailed: bool = True) -> list[dict[str, str]]:
    """The smoke table: one row per server, a column per step.

    ``detailed``: each cell with what the step found ("ok 2.1 s (verified: ...)", "FAILED: why");
    else only the mark and the seconds, for a terminal (:func:`smoke_details` then lists the rest).
    """
    rows = []
    for server in result.servers:
        row = {"server": server.label, "backend": server.backend}
        for name in STEPS:
            found = server.step(name)
            row[name] = "-" if found is None else cell_text(found, detailed=detailed)
        row["metric names"] = metrics_text(server.metrics) if detailed else metrics_short(server.metrics)
        rows.append(row)
    return rows


def smoke_details(result: SmokeResult) -> list[str]:
    """What the compact table leaves out: each step's finding, and the metric names by state."""
    lines = []
    for server in result.servers:
        for step in server.steps:
            if step.detail and (step.ok is not True or step.step == "cache reset"):
                lines.append(f"{server.label} {step.step}: {step.mark}: {step.detail}")
        if server.metrics:
            lines.append(f"{server.label} metric names: {metrics_text(server.metrics)}")
    return lines


def cell_text(step: SmokeStep, *, detailed: bool = True) -> str:
    took = f" {step.seconds:.1f} s" if step.seconds is not None and step.ok else ""
    if not detailed or not step.detail:
        return f"{step.mark}{took}"
    return f"{step.mark}{took} ({step.detail})" if step.ok else f"{step.mark}: {step.detail}"


def metrics_short(checks: list[MetricCheck]) -> str:
    """``10 found, 1 lazy, 1 off``; missing ones counted first."""
    if not checks:
        return "-"
    states: tuple[MetricState, ...] = ("missing", "found", "lazy", "off")
    counts = {state: len({c.native for c in checks if c.state == state}) for state in states}
    return ", ".join(f"{n} {state}" for state, n in counts.items() if n)


def metrics_text(checks: list[MetricCheck]) -> str:
    """``9 found; lazy: sglang:cached_tokens_total (appears after the first hit)``; missing ones first."""
    if not checks:
        return "-"
    parts = []
    checks = list({c.native: c for c in checks}.values())  # two logical names may map one native
    missing = [c.native for c in checks if c.state == "missing"]
    if missing:
        parts.append("MISSING: " + ", ".join(missing))
    parts.append(f"{sum(c.state == 'found' for c in checks)} found")
    seen = {True: ", seen after it", False: ", still absent after it", None: ""}
    hit = [c for c in checks if c.state == "lazy" and c.hit_counter]
    if hit:
        parts.append("lazy, appears after first hit: " + ", ".join(f"{c.native}{seen[c.after_first_hit]}" for c in hit))
    lazy = [c.native for c in checks if c.state == "lazy" and not c.hit_counter]
    if lazy:
        parts.append("lazy, appears at its first increment: " + ", ".join(lazy))
    off = [c.native for c in checks if c.state == "off"]
    if off:
        parts.append("off (speculation not running): " + ", ".join(off))
    return "; ".join(parts)
