"""``bakeoff tune``: each server group's best configuration under the SLO, then tuned against tuned.

Every ``servers:`` entry of a campaign is a *group*; its knobs as written are the *untuned*
start. For each group an Optuna study (TPE, seeded) searches the backend's knob space
(:mod:`bakeoff.backends.tune_space`, merged with the campaign's ``tune:`` section,
:mod:`bakeoff.campaign.tune_spec`) for the best objective at the tuned workload's load:

- ``goodput``: goodput (req/s within the SLO; output tok/s when the SLO bounds nothing);
- ``max_load``: the highest load of the workload's sweep met within the SLO;
- ``pareto``: output tok/s per GPU against tok/s per user (1000 / TPOT P50), two objectives.

A trial with nothing to show on the first two (goodput 0: no request within the SLO; no load
met) is still ranked, by how close it came: its *SLO miss* (the largest median-to-bound ratio
of the bounded metrics, :func:`bakeoff.measure.slo.slo_miss`; for ``max_load`` the lowest over
the sweep's loads) is told to Optuna as ``-miss / (1 + miss)``, between -1 and 0: below every
trial that met something, above every failed, skipped or rejected one (-1), and higher the
smaller the miss, so a search where no configuration meets the SLO still moves toward one.

Every trial is a real cell of the tune's own campaign folder (``reports/NAME-tune``): a
server entry ``GROUP-<digest of its knobs>`` appended to that folder's ``campaign.yaml`` and
measured by :func:`bakeoff.campaign.cell_run.run_cell` (in this process, no notebook per
trial), so the same configuration proposed twice, or a trial cut short, is measured once,
like a resumed campaign's cell (:mod:`bakeoff.campaign.resume`). A trial:

1. is skipped when its knob values break a constraint of the space;
2. runs a short *probe* (``probe_share`` of the requests) whose figure is reported to
   Optuna's percentile pruner: a trial in the worst quarter of the probes so far is pruned
   (single objective only: Optuna cannot prune multi-objective studies);
3. runs the workload at the load, then the campaign's quality set; a trial whose answers do
   not hold up against the untuned configuration's (:func:`bakeoff.campaign.quality.gate`)
   is *rejected*: listed, and told to Optuna as the worst value so the search leaves that region.

Budgets are per group and equal: ``trials`` (pruned and rejected ones count) and optionally
``time_budget_s``. The study lives in ``study.journal`` (Optuna's journal file), so a tune
stopped by Ctrl-C or a crash resumes where it was: finished trials are kept, an interrupted one
is measured again (its finished cells are not).

Then the noise-aware part: the best ``finalists`` of each group and its untuned start are
measured ``repeats`` times (repeat ``r`` of all of them, then ``r + 1``), the pick is the best
finalist only where it *wins* against the untuned start by the comparison test
(:mod:`bakeoff.analysis.tune_compare`), and the picks of the groups are compared with the same
test, beside the comparison of the untuned starts. Each of those is a family whose best was
chosen from the data (the finalists with the untuned start; the groups' picks), so its tests
share one 5% level (Bonferroni over its pairs), the choice included. Where every repeat of both sides has
goodput 0, the test compares their SLO misses instead (lower is better), and says so. The report is
:mod:`bakeoff.report.tune_report`.

A rehearsal (the campaign passed as :func:`bakeoff.campaign.campaign_input.load_input` made it with
``rehearse``): a GPU campaign's tune run end to end on the reference-server stand-ins of a rehearsal
(:mod:`bakeoff.campaign.rehearsal`): the campaign scaled down, the folder marked, every line and
the report tagged, and no verdict or pick presented as a finding. ``runner``: how one cell is
measured, :func:`bakeoff.campaign.cell_run.run_cell` here by default; :mod:`bakeoff.cluster.ray_tune`
passes one that runs it as a Ray task (the study stays here, on the driver, asking and telling).

The package, one module per stage: :mod:`.space` (what is searched), :mod:`.folder` (the tune's
campaign folder and one cell measured in it), :mod:`.figures` (a cell's figures and the objective),
:mod:`.search` (the Optuna study), :mod:`.picks` (finalists, picks, verdicts), :mod:`.result`
(``tune.json`` and the best configurations) and :mod:`.run` (end to end).
"""

from bakeoff.campaign.tune.folder import STUDY_FILE, _add_server, _source_campaign
from bakeoff.campaign.tune.picks import Candidate, cross_verdict, pick
from bakeoff.campaign.tune.run import tune_campaign
from bakeoff.campaign.tune.space import host_only, resolve_groups, trial_workloads

__all__ = [
    "STUDY_FILE",
    "Candidate",
    "_add_server",
    "_source_campaign",
    "cross_verdict",
    "host_only",
    "pick",
    "resolve_groups",
    "trial_workloads",
    "tune_campaign",
]
