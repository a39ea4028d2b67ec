"""``bakeoff bench``: one workload against an already running server, from command-line options.

The options are turned into the same workload spec a campaign holds
(:data:`bakeoff.workload_specs.Workload`: a closed-loop sweep, an open loop at ``--rate``, or
conversations with ``--turns``) and planned by :class:`bakeoff.workloads.PlanBuilder`,
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
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from bakeoff.errors import SpecError
from bakeoff.store import RECORDS_JOURNAL, RUN_INFO, SUMMARY, read_journal
from bakeoff.workload_specs import Workload

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
_RUN_FILES = (SUMMARY, RUN_INFO, RECORDS_JOURNAL)
_WORKLOAD = TypeAdapter(Workload)


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
        return _WORKLOAD.validate_python(raw)
    except ValidationError as exc:
        problems = []
        for item in exc.errors():
            field = next((str(p) for p in item["loc"] if str(p) in FLAG_OF), None)
            problems.append(f"{FLAG_OF[field] if field else '.'.join(map(str, item['loc']))}: {item['msg']}")
        raise SpecError("; ".join(problems)) from None


def claim_out(out: Path, force: bool) -> None:
    """Refuse to overwrite an existing run folder unless ``--force``; never delete a stranger's folder."""
    if not out.exists():
        return
    if not out.is_dir():
        raise SpecError(f"--out {out}: exists and is not a folder; choose another --out")
    if not any(out.iterdir()):
        return
    if not force:
        raise SpecError(f"--out {out}: already holds results; choose another --out, or add --force to replace them")
    ours = any((d / name).exists() for d in (out, *out.iterdir()) for name in _RUN_FILES if d.is_dir())
    if not ours:
        raise SpecError(f"--out {out}: holds files that are not bakeoff results; --force replaces only a run folder")
    shutil.rmtree(out)


def check_context(max_model_len: int | None, need: int, model: str) -> None:
    """Refuse a workload whose longest request exceeds the context the server states."""
    if max_model_len is not None and need > max_model_len:
        raise SpecError(
            f"prompt + output need up to {need} tokens but the server serves {model!r} with a context of "
            f"{max_model_len} (its max_model_len); lower --input-len / --output-len"
        )


def report_failures(run_dir: Path, show: int = 3) -> list[str]:
    """One line per failure kind with the server's own words, from the run's records."""
    path = run_dir / RECORDS_JOURNAL
    if not path.exists():
        return []
    failed = [r for r in read_journal(path) if r.error_kind is not None]
    kinds = Counter(str(r.error_kind) for r in failed)
    lines = []
    for kind, count in kinds.most_common():
        examples = list(dict.fromkeys(r.error or "" for r in failed if str(r.error_kind) == kind))[:show]
        lines.append(f"{count} request(s) failed ({kind}): " + " | ".join(e[:300] for e in examples))
    return lines


def print_failures(run_dir: Path) -> None:
    for line in report_failures(run_dir):
        print(f"  {line}", file=sys.stderr)
