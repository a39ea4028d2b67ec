"""``bakeoff tune CAMPAIGN``: search each server group's knobs under the SLO, then compare the picks.

The work is :mod:`bakeoff.campaign.tune`; this module is its command line.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_tune_command(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    tune = sub.add_parser(
        "tune",
        help="find each server's best knobs under the SLO (Optuna TPE, a quality gate), then compare the picks",
    )
    tune.add_argument("file", type=Path, help="a campaign YAML file (its tune: section), or a shipped campaign name")
    tune.add_argument("--out", type=Path, help="default: reports/CAMPAIGN-tune")
    tune.add_argument("--fresh", action="store_true", help="forget an earlier tune in that folder and start over")
    tune.set_defaults(handler=cmd_tune)


def cmd_tune(args: argparse.Namespace) -> int:
    from bakeoff.campaign.tune import tune_campaign
    from bakeoff.paths import campaign_file

    report = tune_campaign(campaign_file(args.file), out_dir=args.out, fresh=args.fresh)
    print(f"report: {report}")
    return 0
