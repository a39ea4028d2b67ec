"""``bakeoff tune CAMPAIGN``: search each server group's knobs under the SLO, then compare the picks.

The work is :mod:`bakeoff.campaign.tune` (here) and :mod:`bakeoff.cluster.ray_tune` (``--ray``);
this module is its command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bakeoff.paths import campaign_file


def add_tune_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    tune = sub.add_parser(
        "tune",
        help="find each server's best knobs under the SLO (Optuna TPE, a quality gate), then compare the picks",
    )
    tune.add_argument("file", type=Path, help="a campaign YAML file (its tune: section), or a shipped campaign name")
    tune.add_argument("--out", type=Path, help="default: reports/CAMPAIGN-tune")
    tune.add_argument("--fresh", action="store_true", help="forget an earlier tune in that folder and start over")
    tune.add_argument(
        "--rehearse",
        action="store_true",
        help="tune a GPU campaign on the reference-server stand-ins of a rehearsal, scaled down "
        "(default out: reports/CAMPAIGN-tune-rehearsal); proves the path, measures and judges nothing",
    )
    tune.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run every trial's cells as Ray tasks (at ADDRESS, else RAY_ADDRESS, else a local Ray); the study "
        "stays here; the --out folder must be one every node sees (needs bakeoff[ray]; default: trials run "
        "here, one after another)",
    )
    tune.set_defaults(handler=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    # Imported here: `bakeoff` builds every command's options from this module.
    from bakeoff.campaign.campaign_input import load_input
    from bakeoff.campaign.rehearsal import gpu_host_text
    from bakeoff.campaign.tune import tune_campaign
    from bakeoff.cluster.ray_tune import tune_campaign_ray

    campaign = load_input(campaign_file(args.file), rehearse=args.rehearse)
    if args.ray is not None:
        report = tune_campaign_ray(campaign, args.out, address=args.ray or None, fresh=args.fresh)
    else:
        report = tune_campaign(campaign, out_dir=args.out, fresh=args.fresh)
    note = " (REHEARSAL: reference-server stand-ins; no figure or verdict in it is a measurement)"
    print(f"report: {report}{note if args.rehearse else ''}")
    steps = gpu_host_text(report.parent) if args.rehearse else None
    if steps:
        print(steps)
    return 0
