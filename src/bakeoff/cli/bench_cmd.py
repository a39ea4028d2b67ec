"""``bakeoff bench``: one workload against an already running server, from command-line options.

The options are turned into the same workload spec a campaign holds
(:data:`bakeoff.workloads.kinds.Workload`: a closed-loop sweep, an open loop at ``--rate``, or
conversations with ``--turns``) and planned by :class:`bakeoff.workloads.plan_store.PlanBuilder`,
so a bench run and a campaign cell send identical requests for identical settings and
are refused for the same reasons. Before anything is sent: the output folder must be new
(or ``--force``), the server must answer and serve the model, and the longest request
must fit the context the server states.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from bakeoff.errors import ServerDiedError, SpecError

# The measuring stack is imported by the functions that use it, not here: `bakeoff` builds every
# command's options from this module, and a refused flag or `--help` should not load it.
if TYPE_CHECKING:
    from bakeoff.results.summary import RunSummary
    from bakeoff.workloads.kinds import Workload

# Workload fields as the flags that set them, so a refused value names what the user typed.
FLAG_OF = {
    "levels": "--concurrency",
    "rates": "--rate",
    "requests_per_level": "--num-requests",
    "requests_per_rate": "--num-requests",
    "conversations": "--conversations",
    "turns": "--turns",
    "input_len": "--input-len",
    "output_len": "--output-len",
    "user_len": "--input-len",
    "system_prompt_len": "--system-prompt-len",
    "warmup_requests": "--warmup",
    "max_concurrency": "--concurrency",
    "burstiness": "--burstiness",
    "request_timeout_s": "--request-timeout",
    "stall_timeout_s": "--stall-timeout",
}


def parse_length(text: str) -> dict[str, Any]:
    """``256``, ``uniform:128:512`` or ``normal:256:32`` (mean:std) as a length distribution."""
    kind, *rest = text.split(":")
    try:
        if not rest:
            dist: dict[str, Any] = {"dist": "fixed", "mean": int(kind)}
        elif kind == "uniform" and len(rest) == 2:
            low, high = int(rest[0]), int(rest[1])
            dist = {"dist": "uniform", "min": low, "max": high, "mean": max(1, (low + high) // 2)}
        elif kind == "normal" and len(rest) == 2:
            dist = {"dist": "normal", "mean": int(rest[0]), "std": float(rest[1])}
        else:
            raise ValueError(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a length; write N, uniform:MIN:MAX or normal:MEAN:STD"
        ) from None
    if min(v for k, v in dist.items() if k in ("mean", "min", "max")) < 1:
        raise argparse.ArgumentTypeError(f"a length must be at least 1 token, got {text!r}")
    return dist


def bench_workload(args: argparse.Namespace) -> Workload:
    """The workload spec the options describe; a bad value is a SpecError naming its flag."""
    from pydantic import TypeAdapter, ValidationError

    from bakeoff.schema import flag_errors
    from bakeoff.workloads.kinds import Workload

    common: dict[str, Any] = {
        "endpoint": args.endpoint,
        "seed": args.seed,
        "warmup_requests": args.warmup,
        "request_timeout_s": args.request_timeout,
        "stall_timeout_s": args.stall_timeout,
    }
    raw: dict[str, Any]
    if args.turns is not None:
        if args.rate:
            raise SpecError("--turns and --rate: conversations run closed loop; drop one of them")
        fixed = {k: args.__dict__[k] for k in ("input_len", "output_len") if args.__dict__[k]["dist"] != "fixed"}
        if fixed:
            raise SpecError(f"--turns takes fixed lengths; {', '.join(FLAG_OF[k] for k in fixed)} is a distribution")
        raw = {
            **common,
            "kind": "multi_turn",
            "endpoint": "chat",
            "turns": args.turns,
            "conversations": args.conversations,
            "concurrency": (args.concurrency or [4])[0],
            "system_prompt_len": args.system_prompt_len,
            "user_len": args.input_len["mean"],
            "output_len": args.output_len["mean"],
        }
    elif args.rate:
        raw = {
            **common,
            "kind": "open_loop",
            "rates": args.rate,
            "arrival": args.arrival,
            "burstiness": args.burstiness,
            "requests_per_rate": args.num_requests,
            "max_concurrency": args.concurrency[0] if args.concurrency else None,
            "input_len": args.input_len,
            "output_len": args.output_len,
        }
    else:
        if not args.concurrency:
            raise SpecError("bench needs --concurrency N (closed loop), --rate R (open loop) or --turns N")
        raw = {
            **common,
            "kind": "concurrency",
            "levels": args.concurrency,
            "requests_per_level": args.num_requests,
            "input_len": args.input_len,
            "output_len": args.output_len,
        }
    try:
        return TypeAdapter(Workload).validate_python(raw)
    except ValidationError as exc:
        raise SpecError(flag_errors(exc, _flag_of)) from None


def _flag_of(loc: tuple[int | str, ...]) -> str:
    """The option that fills a workload field (the kind's tag in the location is stepped over)."""
    field = next((str(p) for p in loc if str(p) in FLAG_OF), None)
    return FLAG_OF[field] if field else ".".join(map(str, loc))


def claim_out(out: Path, force: bool) -> None:
    """Refuse to overwrite an existing run folder unless ``--force``; never delete a stranger's folder."""
    from bakeoff.results.store import RECORDS_JOURNAL, RUN_INFO, SUMMARY

    if not out.exists():
        return
    if not out.is_dir():
        raise SpecError(f"--out {out}: exists and is not a folder; choose another --out")
    if not any(out.iterdir()):
        return
    if not force:
        raise SpecError(f"--out {out}: already holds results; choose another --out, or add --force to replace them")
    run_files = (SUMMARY, RUN_INFO, RECORDS_JOURNAL)
    ours = any((d / name).exists() for d in (out, *out.iterdir()) for name in run_files if d.is_dir())
    if not ours:
        raise SpecError(f"--out {out}: holds files that are not bakeoff results; --force replaces only a run folder")
    shutil.rmtree(out)


def check_context(max_model_len: int | None, need: int, model: str, stated_as: str | None = "max_model_len") -> None:
    """Refuse a workload whose longest request exceeds the context the server states (``stated_as``: its field)."""
    if max_model_len is not None and need > max_model_len:
        raise SpecError(
            f"prompt + output need up to {need} tokens but the server serves {model!r} with a context of "
            f"{max_model_len} (its {stated_as}); lower --input-len / --output-len"
        )


def report_failures(run_dir: Path, show: int = 3) -> list[str]:
    """One line per failure kind with the server's own words, from the run's records.

    Measured requests are counted as the summary and the table count them; failed warm-ups
    (not measured, so in neither) get lines of their own, marked as such.
    """
    from bakeoff.results.store import RECORDS_JOURNAL, read_journal

    path = run_dir / RECORDS_JOURNAL
    if not path.exists():
        return []
    failed = [r for r in read_journal(path) if r.error_kind is not None]
    lines = []
    for warmup, what in ((False, "request(s)"), (True, "warm-up request(s), not counted in the table,")):
        group = [r for r in failed if r.warmup is warmup]
        for kind, count in Counter(str(r.error_kind) for r in group).most_common():
            examples = list(dict.fromkeys(r.error or "" for r in group if str(r.error_kind) == kind))[:show]
            lines.append(f"{count} {what} failed ({kind}): " + " | ".join(e[:300] for e in examples))
    return lines


def print_failures(run_dir: Path) -> None:
    for line in report_failures(run_dir):
        print(f"  {line}", file=sys.stderr)


def base_url(text: str) -> str:
    """``--base-url``: a URL with its scheme (``127.0.0.1:8000`` is told to add ``http://``)."""
    scheme = urlsplit(text).scheme
    if "://" not in text or scheme not in ("http", "https"):
        raise argparse.ArgumentTypeError(
            f"{text!r} has no http:// or https:// in front; add it: http://{text.split('://')[-1]}"
        )
    return text


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


def add_bench_options(bench: argparse.ArgumentParser) -> None:
    """``bakeoff bench``'s options; each refused value names its flag."""
    bench.add_argument(
        "--base-url", required=True, type=base_url, help="the server's root URL, without /v1 (http(s)://host:port)"
    )
    bench.add_argument("--model", required=True, help="served model name")
    bench.add_argument("--endpoint", choices=["completions", "chat"], default="completions", help="API to call")
    bench.add_argument(
        "--concurrency",
        type=_positive("--concurrency"),
        nargs="+",
        help="closed loop: requests in flight, one run per level; with --rate, a cap (default: no cap); "
        "with --turns, conversations at once (default: 4)",
    )
    bench.add_argument(
        "--rate", type=float, nargs="+", help="open loop: arrivals per second, one run per rate (default: closed loop)"
    )
    bench.add_argument("--arrival", choices=["poisson", "gamma", "constant"], default="poisson", help="--rate arrivals")
    bench.add_argument("--burstiness", type=float, default=1.0, help="gamma arrivals: below 1 is burstier")
    bench.add_argument(
        "--turns", type=_positive("--turns"), help="multi-turn conversations of N turns, chat endpoint (default: off)"
    )
    bench.add_argument("--conversations", type=_positive("--conversations"), default=8, help="with --turns")
    bench.add_argument("--system-prompt-len", type=_positive("--system-prompt-len"), default=1024, help="with --turns")
    bench.add_argument(
        "--num-requests", type=_positive("--num-requests"), default=64, help="measured requests per level or rate"
    )
    length = "N, uniform:MIN:MAX or normal:MEAN:STD tokens"
    bench.add_argument("--input-len", type=parse_length, default="256", help=f"prompt length: {length}")
    bench.add_argument("--output-len", type=parse_length, default="64", help=f"output length: {length}")
    bench.add_argument("--warmup", type=int, default=2, help="warm-up requests, not counted")
    bench.add_argument(
        "--tokenizer", type=Path, help="model folder or tokenizer.json for exact prompt lengths (default: approximate)"
    )
    bench.add_argument("--request-timeout", type=float, default=120.0, help="seconds per request")
    bench.add_argument("--stall-timeout", type=float, default=30.0, help="seconds without a byte before giving up")
    bench.add_argument("--connect-timeout", type=float, default=10.0, help="seconds to open a connection")
    bench.add_argument("--no-ignore-eos", action="store_true", help="for servers that reject ignore_eos")
    bench.add_argument(
        "--no-min-tokens",
        action="store_true",
        help="do not send min_tokens = max_tokens (for servers that reject the field)",
    )
    bench.add_argument(
        "--api-key-env",
        metavar="NAME",
        help="environment variable holding the server's API key, sent as 'Authorization: Bearer' on every request "
        "(default: no key)",
    )
    bench.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="extra header on every request, repeatable (secrets belong in --api-key-env)",
    )
    bench.add_argument("--seed", type=int, default=0, help="seed of the prompts and lengths")
    bench.add_argument("--out", type=Path, required=True, help="run folder to write; must be new unless --force")
    bench.add_argument("--force", action="store_true", help="replace the results already in --out")


def cmd_bench(args: argparse.Namespace) -> int:
    """Check everything, then run each plan of the workload into ``--out`` and print the summary."""
    from bakeoff.campaign.runner import RunTarget, execute_plan
    from bakeoff.measure.auth import parse_header_arg, request_headers
    from bakeoff.measure.client import ClientSettings
    from bakeoff.measure.control import check_server, context_limit
    from bakeoff.report.frame import run_warnings, summary_table
    from bakeoff.results.store import SUMMARY, read_summary
    from bakeoff.workloads.plans import PlanBuilder
    from bakeoff.workloads.prompts import PromptFactory, load_tokenizer

    if args.warmup < 0:
        raise SpecError(f"--warmup must be 0 or more, got {args.warmup}")
    # Everything checkable is checked before the first request is sent.
    workload = bench_workload(args)
    headers = request_headers(args.api_key_env, dict(parse_header_arg(h) for h in args.header))
    tokenizer = load_tokenizer(args.tokenizer)
    served = check_server(args.base_url, args.model, headers=headers)
    limit, stated_as = context_limit(args.base_url, args.model, served, headers)
    check_context(limit, workload.longest_request(), args.model, stated_as)
    claim_out(args.out, args.force)
    if not tokenizer.exact:
        print("note: no --tokenizer given; prompt lengths are approximate (word count)", file=sys.stderr)
    plans = PlanBuilder(PromptFactory(tokenizer)).build(workload)
    settings = ClientSettings(
        base_url=args.base_url,
        model=args.model,
        extra_body={} if args.no_ignore_eos else {"ignore_eos": True},
        request_timeout_s=args.request_timeout,
        stall_timeout_s=args.stall_timeout,
        count_tokens=tokenizer.count if tokenizer.exact else None,
        headers=headers,
        min_tokens=not args.no_min_tokens,
        connect_timeout_s=args.connect_timeout,
    )
    target = RunTarget(settings, server_info={"base_url": args.base_url, "external": True})
    summaries: dict[str, RunSummary] = {}
    for plan in plans:
        # One plan writes straight into --out (as before); a sweep gets a folder per run.
        run_dir = args.out if len(plans) == 1 else args.out / plan.name
        try:
            summaries[plan.name] = summary = execute_plan(plan, target, run_dir)
        except ServerDiedError:
            print_failures(run_dir)  # what the server said before it died
            raise
        except KeyboardInterrupt:
            # Ctrl-C or SIGTERM: the interrupted run wrote its summary; show what was measured, then stop.
            if (run_dir / SUMMARY).is_file():
                summaries[f"{plan.name} (interrupted)"] = read_summary(run_dir / SUMMARY)
            if summaries:
                print(summary_table(summaries))
            print(f"results: {args.out} (interrupted)")
            raise
        print_failures(run_dir)
    print(summary_table(summaries))
    # On screen, not only in summary.json: what each run's figures can be read as.
    for name, summary in summaries.items():
        for line in run_warnings(name if len(summaries) > 1 else "", summary, more_requests="--num-requests"):
            print(f"warning: {line}", file=sys.stderr)
    print(f"results: {args.out}")
    return 0 if all(s.requests.ok > 0 for s in summaries.values()) else 1
