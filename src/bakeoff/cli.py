"""The ``bakeoff`` command line: bench a running server, make models, run campaigns.

Every expected failure is a :class:`BakeoffError` and ends as one clear message on stderr
with exit status 2; input is validated before any server starts.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

from bakeoff.errors import BakeoffError, SpecError


def _positive(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1, got {value}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bakeoff", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    bench = sub.add_parser("bench", help="benchmark an already running OpenAI-compatible server")
    bench.add_argument("--base-url", required=True)
    bench.add_argument("--model", required=True, help="served model name")
    bench.add_argument("--endpoint", choices=["completions", "chat"], default="completions")
    bench.add_argument("--concurrency", type=_positive("--concurrency"), required=True)
    bench.add_argument("--num-requests", type=_positive("--num-requests"), required=True)
    bench.add_argument("--input-len", type=_positive("--input-len"), required=True)
    bench.add_argument("--output-len", type=_positive("--output-len"), required=True)
    bench.add_argument("--warmup", type=int, default=2, help="warm-up requests, not counted")
    bench.add_argument("--tokenizer", type=Path, help="model folder or tokenizer.json: exact prompt lengths")
    bench.add_argument("--request-timeout", type=float, default=120.0)
    bench.add_argument("--stall-timeout", type=float, default=30.0)
    bench.add_argument("--no-ignore-eos", action="store_true", help="for servers that reject ignore_eos")
    bench.add_argument(
        "--no-min-tokens",
        action="store_true",
        help="do not send min_tokens = max_tokens (for servers that reject the field)",
    )
    bench.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="environment variable holding the server's API key, sent as 'Authorization: Bearer' on every request",
    )
    bench.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="extra header on every request, repeatable (secrets belong in --api-key-env)",
    )
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--out", type=Path, required=True, help="run folder to write")

    model = sub.add_parser("model", help="generate the local model")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    make = model_sub.add_parser("make", help="random-weight Llama + locally trained tokenizer")
    make.add_argument("--preset", choices=["tiny", "small"], required=True)
    make.add_argument("--seed", type=int, default=0)
    make.add_argument("out_dir", nargs="?", type=Path, help="default: models/PRESET")

    campaign = sub.add_parser("campaign", help="validate or run a campaign")
    camp_sub = campaign.add_subparsers(dest="campaign_command", required=True)
    validate = camp_sub.add_parser("validate", help="check a campaign without running it")
    validate.add_argument("files", nargs="+", type=Path)
    run = camp_sub.add_parser("run", help="run every cell, then build the report")
    run.add_argument("file", type=Path)
    run.add_argument("--out", type=Path, help="default: reports/CAMPAIGN")
    run.add_argument("--only", action="append", default=[], help="run only these server labels")
    run.add_argument(
        "--rehearse",
        action="store_true",
        help="replace each GPU container by the reference server in that framework's wire profile and run a "
        "scaled-down campaign end to end (default out: reports/CAMPAIGN-rehearsal); measures nothing",
    )

    backends = sub.add_parser("backends", help="list backends or show a rendered launch")
    back_sub = backends.add_subparsers(dest="backends_command", required=True)
    back_sub.add_parser("list", help="list backend specs")
    show = back_sub.add_parser("show", help="print the exact launch command for a knob set")
    show.add_argument("name")
    show.add_argument("--knob", action="append", default=[], help="name=value, repeatable")
    return parser


def cmd_bench(args: argparse.Namespace) -> int:
    from bakeoff.auth import parse_header_arg, request_headers
    from bakeoff.client import ClientSettings, check_server
    from bakeoff.prompts import PromptFactory, load_tokenizer
    from bakeoff.report import summary_table
    from bakeoff.runner import RunTarget, execute_plan
    from bakeoff.specs import ConcurrencySweep
    from bakeoff.workloads import PlanBuilder

    if args.warmup < 0:
        raise SpecError(f"--warmup must be 0 or more, got {args.warmup}")
    # Before anything is sent: a missing key variable is an error naming it.
    headers = request_headers(args.api_key_env, dict(parse_header_arg(h) for h in args.header))
    tokenizer = load_tokenizer(args.tokenizer)
    workload = ConcurrencySweep(
        levels=[args.concurrency],
        requests_per_level=args.num_requests,
        warmup_requests=args.warmup,
        input_len=args.input_len,
        output_len=args.output_len,
        endpoint=args.endpoint,
        seed=args.seed,
        request_timeout_s=args.request_timeout,
        stall_timeout_s=args.stall_timeout,
    )
    asyncio.run(check_server(args.base_url, args.model, headers=headers))
    if not tokenizer.exact:
        print("note: no --tokenizer given; prompt lengths are approximate (word count)", file=sys.stderr)
    plan = PlanBuilder(PromptFactory(tokenizer)).build(workload)[0]
    settings = ClientSettings(
        base_url=args.base_url,
        model=args.model,
        extra_body={} if args.no_ignore_eos else {"ignore_eos": True},
        request_timeout_s=args.request_timeout,
        stall_timeout_s=args.stall_timeout,
        count_tokens=tokenizer.count if tokenizer.exact else None,
        headers=headers,
        min_tokens=not args.no_min_tokens,
    )
    target = RunTarget(settings, server_info={"base_url": args.base_url, "external": True})
    summary = execute_plan(plan, target, args.out)
    print(summary_table({f"c{args.concurrency}": summary}))
    if summary["short_completions"]["warning"]:
        print(f"warning: {summary['short_completions']['warning']}", file=sys.stderr)
    print(f"results: {args.out}")
    return 0 if summary["requests"]["ok"] > 0 else 1


def cmd_model(args: argparse.Namespace) -> int:
    from bakeoff.modelgen import DEFAULT_MODELS_DIR, make_model, model_is_ready

    out = args.out_dir or DEFAULT_MODELS_DIR / args.preset
    if model_is_ready(out, args.preset, args.seed):
        print(f"{out}: already made (preset {args.preset}, seed {args.seed})")
    else:
        make_model(args.preset, out, args.seed)
        print(f"{out}: made preset {args.preset} (seed {args.seed})")
    return 0


def cmd_campaign(args: argparse.Namespace) -> int:
    from bakeoff.campaign import run_campaign, validate_campaign
    from bakeoff.runner import gpu_available

    if args.campaign_command == "validate":
        for path in args.files:
            cells = validate_campaign(path)
            note = ""
            if any(c.backend.accelerator == "gpu" for c in cells) and not gpu_available():
                note = "; model files not checked: a GPU campaign, and this machine has no GPU"
            print(f"{path}: ok ({len(cells)} cells{note})")
        return 0
    report = run_campaign(args.file, out_dir=args.out, only=args.only, rehearse=args.rehearse)
    note = " (REHEARSAL: reference-server stand-ins, not a measurement)" if args.rehearse else ""
    print(f"report: {report}{note}")
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    from bakeoff import backends
    from bakeoff.backend_review import describe_launch

    if args.backends_command == "list":
        for name in backends.list_backends():
            spec = backends.load_backend(name)
            print(f"{name:22} {spec.runtime:9} {spec.accelerator:4} {spec.display_name}")
        return 0
    print(describe_launch(args.name, backends.parse_knob_args(args.knob)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handlers = {"bench": cmd_bench, "model": cmd_model, "campaign": cmd_campaign, "backends": cmd_backends}
    try:
        return handlers[args.command](args)
    except BakeoffError as exc:
        print(f"bakeoff: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bakeoff: interrupted; results measured so far were saved", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
