"""Pre-flight: the exact rendered launch parsed by the framework's own parser, before any GPU time.

For one server, :func:`preflight_command` builds the command that runs a short script
with the framework's interpreter, inside the server's image (``RUNTIME run --rm --network
none --entrypoint PYTHON IMAGE -c SCRIPT PAYLOAD``) or with the engine environment of a
process backend. No GPU, model or network is needed: the script only parses.

- vLLM: ``make_arg_parser(FlexibleArgumentParser())`` (``entrypoints/openai``, ``common`` or
  ``launchers/cli_args.py``, whichever the release has) parses the argv after the program.
- SGLang: ``ServerArgs.add_cli_args`` on an ``argparse.ArgumentParser``, then ``parse_args``.
- TensorRT-LLM: ``trtllm-serve``'s click command parses the argv (``make_context``), and the
  rendered options file is validated with ``TorchLlmArgs`` (pydantic; unknown keys and a
  wrong speculative tag fail there).

A refusal carries the framework's own message (argparse's ``error: ...`` line, click's or
pydantic's). :func:`run_preflight` runs it; in a rehearsal, where the GPU images are not
here, :func:`stand_in` checks the same argv against the flags ``bakeoff backends audit``
read from the framework's wheel when one is cached, and says so.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import dataclass, field
from typing import Literal

from bakeoff.errors import LaunchError
from bakeoff.serving.backends import BackendSpec
from bakeoff.serving.container_runtime import runtime_command
from bakeoff.serving.launch_render import RenderedLaunch

Status = Literal["ok", "refused", "skipped"]
TIMEOUT_S = 300.0  # importing a framework takes tens of seconds on 2 cores

_COMMON = """\
import json, sys
payload = json.loads(sys.argv[1])
args = payload["args"]
sys.argv[0] = payload["prog"]  # argparse names the program in its messages
"""

_VLLM = (
    _COMMON
    + """\
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
make_arg_parser = None
for module in ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.common.cli_args",
               "vllm.entrypoints.launchers.cli_args"):
    try:
        make_arg_parser = __import__(module, fromlist=["make_arg_parser"]).make_arg_parser
        break
    except (ImportError, AttributeError):
        continue
if make_arg_parser is None:
    sys.exit("preflight: this vLLM has no make_arg_parser where bakeoff looks for it")
parser = make_arg_parser(FlexibleArgumentParser())
parsed = parser.parse_args(args)
print(json.dumps({"parsed": len(vars(parsed))}))
"""
)

_SGLANG = (
    _COMMON
    + """\
import argparse
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser(prog="sglang.launch_server")
ServerArgs.add_cli_args(parser)
parsed = parser.parse_args(args)
print(json.dumps({"parsed": len(vars(parsed))}))
"""
)

_TRTLLM = (
    _COMMON
    + """\
import os, yaml
from tensorrt_llm.commands.serve import main
from tensorrt_llm.llmapi.llm_args import TorchLlmArgs
if payload["config_path"]:
    os.makedirs(os.path.dirname(payload["config_path"]), exist_ok=True)
    with open(payload["config_path"], "w") as f:
        f.write(payload["config"])
main.make_context("trtllm-serve", list(args))
options = yaml.safe_load(payload["config"] or "") or {}
TorchLlmArgs.model_validate({"model": payload["model"], **options})
print(json.dumps({"parsed": len(options)}))
"""
)

SCRIPTS = {"vllm": _VLLM, "sglang": _SGLANG, "trtllm": _TRTLLM}


@dataclass(frozen=True)
class PreflightResult:
    label: str
    backend: str
    status: Status
    detail: str
    command: list[str] = field(default_factory=list)

    def line(self) -> str:
        return f"{self.label} ({self.backend}): {self.status}" + (f": {self.detail}" if self.detail else "")


def parser_args(backend: BackendSpec, argv: list[str]) -> list[str]:
    """The words the framework's parser sees: the argv after its program (``vllm serve``, ``-m MODULE``)."""
    kind = backend.preflight
    if kind == "vllm" and argv[1:2] == ["serve"]:
        return ["--model", argv[2], *argv[3:]]  # `vllm serve MODEL` gives the parser --model
    if kind in ("vllm", "sglang") and "-m" in argv:
        return argv[argv.index("-m") + 2 :]
    if kind == "trtllm" and argv and argv[0].endswith("trtllm-serve"):
        return argv[1:]
    raise LaunchError(f"backend {backend.name!r}: preflight cannot tell where {shlex.join(argv[:3])} ends")


def _payload(launch: RenderedLaunch, model: str) -> str:
    spec = launch.backend.config_file
    config_path = None
    if spec is not None:
        config_path = next((launch.argv[i + 1] for i, w in enumerate(launch.argv[:-1]) if w == spec.flag), None)
    args = parser_args(launch.backend, launch.argv)
    prog = {"vllm": "vllm serve", "sglang": "sglang.launch_server", "trtllm": "trtllm-serve"}[
        launch.backend.preflight or ""
    ]
    body = {"args": args, "config": launch.config_text, "config_path": config_path, "model": model, "prog": prog}
    return json.dumps(body)


def preflight_command(launch: RenderedLaunch, *, runtime: str | None, python: str, model: str) -> list[str]:
    """The command that parses ``launch`` with its framework's parser: in its image, or with ``python``."""
    backend = launch.backend
    if backend.preflight is None:
        raise LaunchError(f"backend {backend.name!r} names no preflight parser")
    script, payload = SCRIPTS[backend.preflight], _payload(launch, model)
    if runtime is None:
        return [python, "-c", script, payload]
    assert backend.container is not None
    return [
        *runtime_command(runtime),
        "run",
        "--rm",
        "--network",
        "none",
        "--entrypoint",
        python,
        backend.container.image,
        "-c",
        script,
        payload,
    ]


def framework_message(stderr: str) -> str:
    """The framework's own complaint: argparse's ``error:`` line, else the last line written."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line.lower() or "Error" in line.split(":")[0]]
    return (errors or lines or ["(no message)"])[-1]


def run_preflight(
    label: str, command: list[str], backend: BackendSpec, timeout_s: float = TIMEOUT_S
) -> PreflightResult:
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LaunchError(f"{label}: preflight ran past {timeout_s:.0f} s: `{shlex.join(command[:8])} ...`") from exc
    except FileNotFoundError as exc:
        raise LaunchError(f"{label}: preflight cannot run {command[0]}: {exc}") from exc
    if proc.returncode == 0:
        return PreflightResult(label, backend.name, "ok", f"{backend.preflight}'s own parser took the launch", command)
    return PreflightResult(label, backend.name, "refused", framework_message(proc.stderr or proc.stdout), command)


def stand_in(label: str, launch: RenderedLaunch, known_flags: set[str] | None, command: list[str]) -> PreflightResult:
    """Rehearsal: the command is recorded; the argv's flags are checked against the wheel's, when cached."""
    backend = launch.backend
    if known_flags is None:
        why = "rehearsal: command recorded; no wheel of this framework to check it against (see backends audit)"
        return PreflightResult(label, backend.name, "skipped", why, command)
    words = [w for w in parser_args(backend, launch.argv) if w.startswith("--")]
    unknown = [w for w in words if w not in known_flags and _base(w) not in known_flags]
    if unknown:
        detail = f"rehearsal stand-in: the wheel declares no {', '.join(unknown)}"
        return PreflightResult(label, backend.name, "refused", detail, command)
    return PreflightResult(
        label, backend.name, "ok", "rehearsal stand-in: every flag is declared in the wheel", command
    )


def _base(flag: str) -> str:
    # --no-X and --disable-X parse where --X / --enable-X is a boolean-optional flag.
    for prefix, stem in (("--no-", "--"), ("--disable-", "--enable-")):
        if flag.startswith(prefix):
            return stem + flag.removeprefix(prefix)
    return flag
