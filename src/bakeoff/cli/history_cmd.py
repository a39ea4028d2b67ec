"""The ``history``, ``baseline``, ``compare`` and ``trend`` commands: arguments and handlers.

:mod:`bakeoff.cli.main` registers them with :func:`add_history_commands` and dispatches to
:data:`HANDLERS`. Each handler only parses, calls into :mod:`bakeoff.history.index`,
:mod:`bakeoff.history.baseline`, :mod:`bakeoff.history.compare` or :mod:`bakeoff.history.trend`, and prints.
Exit status: 0, 1 for a regression (compare), 2 for an error (:mod:`bakeoff.cli.main`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

from bakeoff.console import text_table

# Each handler imports the history machinery it uses (DuckDB, pandas): `bakeoff` builds every
# command's options from this module, and --help should not load them.

HISTORY_DIR_HELP = "where archives and the index live (default: $BAKEOFF_HISTORY, else reports/.history)"


def add_history_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    history = sub.add_parser("history", help="list archived runs, or query the history index with SQL")
    history.add_argument("--campaign", help="only this campaign (default: every campaign)")
    history.add_argument("--server", help="only this server label (default: every server)")
    history.add_argument(
        "--metric", help="add this metric's value and interval, e.g. tpot_ms_p50 (default: the headline metrics)"
    )
    history.add_argument(
        "--sql",
        help="a read-only SQL query over the tables archives, runs, metrics, quality, ... (default: list runs instead)",
    )
    history.add_argument(
        "--add", type=Path, metavar="CAMPAIGN_DIR", help="archive a campaign folder's runs first (default: none)"
    )
    history.add_argument("--rebuild", action="store_true", help="rebuild the index from the archives first")
    history.add_argument("--history-dir", type=Path, help=HISTORY_DIR_HELP)

    baseline = sub.add_parser("baseline", help="mark or show the baseline runs compare judges against")
    base_sub = baseline.add_subparsers(dest="baseline_command", required=True)
    mark = base_sub.add_parser("set", help="mark a campaign folder, archive or run as its campaign's baseline")
    mark.add_argument("ref", help="reports/NAME, an archive NAME/STAMP, or a cells/CELL/runs/RUN folder")
    mark.add_argument("--history-dir", type=Path, help=HISTORY_DIR_HELP)
    show = base_sub.add_parser("show", help="list the baselines marked per campaign and server")
    show.add_argument("--history-dir", type=Path, help=HISTORY_DIR_HELP)

    compare = sub.add_parser(
        "compare",
        help="judge a run against its baseline: improved / regressed / within noise / undecided (exit 1 on regression)",
    )
    compare.add_argument("new", help="reports/NAME, an archive NAME/STAMP, or a run folder")
    compare.add_argument(
        "--baseline",
        help="what to judge against: a campaign folder, archive or run folder; 'baseline' or nothing: the baseline "
        "marked per server with 'bakeoff baseline set' (default: the marked baseline)",
    )
    compare.add_argument(
        "--or-set-baseline",
        action="store_true",
        help="when the campaign has no baseline yet (a schedule's first run), mark NEW as the baseline and exit 0 "
        "instead of failing",
    )
    compare.add_argument("--json", type=Path, help="also write the verdicts as JSON to this file (default: no file)")
    compare.add_argument("--history-dir", type=Path, help=HISTORY_DIR_HELP)

    trend = sub.add_parser("trend", help="render the trend report: each metric over time per server and version")
    trend.add_argument("--campaign", help="only this campaign (default: every campaign in the history)")
    trend.add_argument("--metric", action="append", default=[], help="metrics to plot (default: the gated ones)")
    trend.add_argument("--out", type=Path, help="default: reports/trend-CAMPAIGN (or reports/trend)")
    trend.add_argument("--history-dir", type=Path, help=HISTORY_DIR_HELP)


def cmd_history(args: argparse.Namespace) -> int:
    from bakeoff.history import archive
    from bakeoff.history import index as history

    root = archive.history_root(args.history_dir)
    if args.add is not None:
        made = archive.archive_campaign(args.add, root)
        print(f"archived {args.add} as {archive.archive_id(made)}" if made else f"{args.add}: nothing new to archive")
    if args.rebuild:
        history.rebuild(root)
    if args.sql:
        columns, rows = history.query(root, args.sql)
    else:
        columns, rows = history.list_runs(root, args.campaign, args.server, args.metric)
    print(text_table(columns, rows))
    if not args.sql:
        print(f"{len(rows)} runs in {root}")
    return 0


def cmd_baseline(args: argparse.Namespace) -> int:
    from bakeoff.history import archive, baseline
    from bakeoff.history import index as history

    root = archive.history_root(args.history_dir)
    if args.baseline_command == "set":
        for server, ident in baseline.set_baseline(args.ref, root).items():
            print(f"baseline of {server}: {ident}")
        return 0
    rows = [
        (campaign, server, entry.get("archive"), entry.get("set_at"))
        for campaign, servers in sorted(history.load_baselines(root).items())
        for server, entry in sorted(servers.items())
    ]
    print(text_table(["campaign", "server", "archive", "set at"], rows))
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from bakeoff.history import archive
    from bakeoff.history.baseline import first_run_sets_baseline
    from bakeoff.history.compare import MARKED, as_json, compare, render
    from bakeoff.results.store import write_json

    root = archive.history_root(args.history_dir)
    if args.or_set_baseline and args.baseline in (None, *MARKED):
        marked = first_run_sets_baseline(args.new, root)
        if marked is not None:
            for server, ident in marked.items():
                print(f"baseline of {server}: {ident}")
            print(f"{args.new}: no baseline yet, so this run is now the baseline; later runs are judged against it")
            return 0
    result = compare(args.new, root, args.baseline)
    print(render(result))
    if args.json is not None:
        write_json(args.json, as_json(result))
    return 1 if result.regressions else 0


def cmd_trend(args: argparse.Namespace) -> int:
    from bakeoff.history import archive
    from bakeoff.history.trend import render_trend

    root = archive.history_root(args.history_dir)
    print(f"trend report: {render_trend(root, args.campaign, args.metric or None, args.out)}")
    return 0


HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "history": cmd_history,
    "baseline": cmd_baseline,
    "compare": cmd_compare,
    "trend": cmd_trend,
}
