"""The tune's result (``tune.json``) and the best configurations written back as a campaign."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.trial import TrialState

from bakeoff.analysis.tune_compare import Comparison
from bakeoff.campaign.campaign_input import CampaignInput
from bakeoff.campaign.specs import CampaignSpec
from bakeoff.campaign.tune.figures import goodput_metric, objective
from bakeoff.campaign.tune.folder import Target
from bakeoff.campaign.tune.picks import Candidate, Pick, cross_verdict
from bakeoff.campaign.tune.search import _spent_s
from bakeoff.campaign.tune.space import Group
from bakeoff.campaign.tune_spec import TuneSpec
from bakeoff.results.layout import (
    REHEARSAL_TAG,
)


def _untuned_row(group: Group, found: dict[str, Any], target: Target) -> dict[str, Any]:
    """The untuned start as a row of the trial table: the searched knobs as it ran them (defaults named)."""
    knobs: dict[str, Any] = {}
    for name in group.knobs:
        set_here, default = group.server.knobs.get(name), group.backend.knobs[name].default
        knobs[name] = set_here if set_here is not None else ("default" if default is None else f"{default} (default)")
    return {
        "number": None,
        "label": group.label,
        "knobs": knobs,
        "state": "untuned",
        "values": objective(found, target),
        "figures": found,
        "quality": "the reference",
        "note": "the untuned start (repeat 1)",
        "seconds": None,
    }


def _trial_rows(group: Group, study: optuna.Study) -> list[dict[str, Any]]:
    rows = []
    for t in study.get_trials(deepcopy=False):
        if t.state == TrialState.FAIL:
            continue  # interrupted, and measured again as a later trial
        knobs = t.user_attrs.get("knobs", {})
        rows.append(
            {
                "number": t.number,
                "label": t.user_attrs.get("label"),
                "knobs": {k: knobs.get(k) for k in group.knobs},
                "state": t.user_attrs.get("state", t.state.name.lower()),
                "values": list(t.values) if t.values is not None else None,
                "figures": t.user_attrs.get("figures", {}),
                "quality": t.user_attrs.get("quality", "not measured"),
                "note": t.user_attrs.get("note", ""),
                "seconds": t.user_attrs.get("seconds"),
            }
        )
    return rows


def _nothing_met(rows: list[dict[str, Any]], p: Pick, target: Target) -> dict[str, Any] | None:
    """Where no trial, finalist repeat or untuned start of a group met the SLO: the one that came closest.

    None where something met it (goodput above 0, or a load met for max_load), or where the
    objective reads no SLO (pareto, or an SLO that bounds nothing).
    """
    tune = target.spec
    if tune.objective == "pareto" or goodput_metric(target.slo) != "goodput_req_s":
        return None
    candidates = [p.untuned, *p.finalists]
    key = "sustained" if tune.objective == "max_load" else "figure"
    if any((r["figures"].get(key) or 0) > 0 for r in rows) or any(
        c.sustained > 0 if tune.objective == "max_load" else any(v > 0 for v in c.values) for c in candidates
    ):
        return None
    miss_key = "lowest_slo_miss" if tune.objective == "max_load" else "slo_miss"
    ranked = [r for r in rows if r["state"] in ("untuned", "complete") and r["figures"].get(miss_key) is not None]
    if not ranked:
        return {"trial": None, "label": None, "knobs": {}, "miss": None, "text": "nothing measured at the load"}
    best = min(ranked, key=lambda r: r["figures"][miss_key])
    factor = best["figures"][miss_key]
    closest = f"SLO missed by {factor:.1f}x at its closest load"
    text = best["figures"]["slo_miss_text"] if miss_key == "slo_miss" else closest
    return {"trial": best["number"], "label": best["label"], "knobs": best["knobs"],
            "miss": factor, "text": text}  # fmt: skip


def _candidate_json(c: Candidate) -> dict[str, Any]:
    return {"label": c.label, "knobs": c.knobs, "trial": c.trial, "values": c.values, "mean": c.mean(),
            "sustained": c.sustained, "misses": c.misses}  # fmt: skip


def _comparison_json(c: Comparison | None) -> dict[str, Any] | None:
    return None if c is None else {"outcome": c.outcome, "change": c.change, "text": c.text, "basis": c.basis}


def _result(
    spec: CampaignSpec,
    tune: TuneSpec,
    target: Target,
    groups: list[Group],
    studies: dict[str, optuna.Study],
    picks: list[Pick],
    untuned: dict[str, dict[str, Any]],
    seconds: float,
) -> dict[str, Any]:
    by_group = {p.group: p for p in picks}
    rows = {g.label: [untuned[g.label], *_trial_rows(g, studies[g.label])] for g in groups}
    return {
        "campaign": spec.name,
        "objective": tune.objective,
        "figure": "tok_s_per_gpu" if tune.objective == "pareto" else goodput_metric(target.slo),
        "workload": target.workload,
        "load": target.load,
        "slo": target.slo.model_dump(mode="json", exclude_none=True),
        "budget": {
            "trials": tune.trials,
            "time_budget_s": tune.time_budget_s,
            "finalists": tune.finalists,
            "repeats": tune.repeats,
            "prune": tune.prune and tune.objective != "pareto",
        },
        "min_effect": tune.min_effect,
        "seconds": round(seconds, 1),
        "groups": [
            {
                "group": g.label,
                "backend": g.backend.name,
                "searched": g.knobs,
                "space": {k: g.space.knobs[k].model_dump(exclude_none=True) for k in g.knobs},
                "spent_s": round(_spent_s(studies[g.label]), 1),
                "untuned_trial": untuned[g.label],
                "trials": rows[g.label][1:],
                "nothing_met": _nothing_met(rows[g.label], by_group[g.label], target),
                "untuned": _candidate_json(by_group[g.label].untuned),
                "finalists": [_candidate_json(c) for c in by_group[g.label].finalists],
                "chosen": _candidate_json(by_group[g.label].chosen),
                "vs_untuned": _comparison_json(by_group[g.label].vs_untuned),
                "vs_runner_up": _comparison_json(by_group[g.label].vs_runner_up),
            }
            for g in groups
        ],
        "tuned": cross_verdict(picks, tuned=True, min_effect=tune.min_effect, objective=tune.objective),
        "as_given": cross_verdict(picks, tuned=False, min_effect=tune.min_effect, objective=tune.objective),
        "rehearsal": None,
    }


def _write_best(campaign: CampaignInput, picks: list[Pick], out: Path) -> None:
    """Each group's pick as a campaign YAML (the campaign with that server's knobs), and all picks in one.

    Written from the validated campaign, model paths absolute, so the files run from anywhere. A
    rehearsal writes them for the original campaign (its GPU model, its workloads), headed as
    picked from stand-ins: they prove the path, they are no tuned configuration.
    """
    warning = (
        f"# {REHEARSAL_TAG} picked from reference-server stand-ins' figures: this file proves the path; "
        "it is not a tuned configuration\n"
        if campaign.rehearsal
        else ""
    )
    spec = campaign.written
    raw = spec.model_dump(mode="json", exclude_none=True)
    raw.pop("tune", None)
    servers = {s["label"]: s for s in raw["servers"]}
    best = out / "best"
    best.mkdir(exist_ok=True)
    tuned = []
    for p in picks:
        entry = {**servers[p.group], "label": f"{p.group}-tuned", "knobs": p.chosen.knobs}
        tuned.append(entry)
        one = {**raw, "name": f"{spec.name}-{p.group}-tuned", "servers": [entry]}
        text = f"{warning}# {p.group}'s pick from bakeoff tune ({out}); run it with bakeoff campaign run\n"
        (best / f"{p.group}.yaml").write_text(text + yaml.safe_dump(one, sort_keys=False))
    both = {**raw, "name": f"{spec.name}-tuned", "servers": tuned}
    text = f"{warning}# every group's pick from bakeoff tune ({out}), side by side\n"
    (best / "tuned.yaml").write_text(text + yaml.safe_dump(both, sort_keys=False))
