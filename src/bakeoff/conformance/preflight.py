"""Pre-flight: the exact rendered launch parsed by the framework's own parser, before any GPU time.

For one server, :func:`preflight_command` builds the command that runs a short script
with the framework's interpreter, inside the server's image (``RUNTIME run --rm --network
none --entrypoint PYTHON IMAGE -c SCRIPT PAYLOAD``) or with the engine environment of a
process backend. No GPU, model or network is needed: the script only parses.

- vLLM: ``make_arg_parser(FlexibleArgumentParser())`` (``entrypoints/openai``, ``common`` or
  ``launchers/cli_args.py``, whichever the release has) parses the argv after the program.
- SGLang: ``ServerArgs.add_cli_args`` on an ``argparse.ArgumentParser``, then ``parse_args``.
- TensorRT-LLM: ``trtllm-serve``'s ``main`` is a click *group* (``DefaultGroup`` in
  ``tensorrt_llm/commands/serve.py``, routing an unknown first word to ``serve``): its
  ``make_context`` parses the group's own options and stops at MODEL, so every option of the
  launch would go unparsed. The ``serve`` subcommand is parsed instead (``main.commands["serve"]``,
  every option: ``--served_model_name``, ``--config``, ``--backend`` among them), and the
  rendered options file is validated with ``TorchLlmArgs`` (pydantic; unknown keys and a
  wrong speculative tag fail there).

Each script also prints the image's own defaults for the knobs a campaign may leave unset
(:data:`DEFAULT_PARAMS`): for TensorRT-LLM, the ``serve`` options' defaults, which
``get_llm_args`` passes to the LLM whatever the options file leaves out (``--max_batch_size``
and ``--max_num_tokens`` default to ``BuildConfig``'s fields, 2048 and 8192 in
``tensorrt_llm/builder.py``); they go into ``run.json`` so "framework defaults" is what the
image did. An import that fails in the GPU-less pre-flight container (a CUDA library the image
loads at import) is *not checked*, with the reason, never a refusal: only the framework's
parser refusing the launch stops a campaign.

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

from bakeoff.backends.launch_render import RenderedLaunch
from bakeoff.backends.spec import BackendSpec
from bakeoff.errors import LaunchError
from bakeoff.serving.container_runtime import runtime_command

Status = Literal["ok", "refused", "skipped", "not_checked"]
TIMEOUT_S = 300.0  # importing a framework takes tens of seconds on 2 cores
# The script's exit status when the framework could not even be imported (not a refusal).
NOT_CHECKED_EXIT = 3

_COMMON = """\
import json, sys
payload = json.loads(sys.argv[1])
args = payload["args"]
sys.argv[0] = payload["prog"]  # argparse names the program in its messages

def not_checked(exc):
    # The framework did not import here (no GPU, no driver library): nothing was judged.
    print(json.dumps({"not_checked": (type(exc).__name__ + ": " + str(exc))[:400]}))
    sys.exit(3)
"""

_VLLM = (
    _COMMON
    + """\
try:
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:
        from vllm.utils import FlexibleArgumentParser
except Exception as exc:
    not_checked(exc)
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
try:
    from sglang.srt.server_args import ServerArgs
except Exception as exc:
    not_checked(exc)
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
try:
    from tensorrt_llm.commands.serve import main
    from tensorrt_llm.llmapi.llm_args import TorchLlmArgs
except Exception as exc:
    not_checked(exc)
if payload["config_path"]:
    if os.path.dirname(payload["config_path"]):
        os.makedirs(os.path.dirname(payload["config_path"]), exist_ok=True)
    with open(payload["config_path"], "w") as f:
        f.write(payload["config"])
# main is a click group that would stop at MODEL: parse the serve subcommand, every option.
serve = main.commands["serve"] if "serve" in getattr(main, "commands", {}) else main
words = list(args)
if words[:1] == ["serve"]:
    words = words[1:]
ctx = serve.make_context("trtllm-serve serve", words)
defaults = {p.name: p.get_default(ctx) for p in serve.params if p.name in payload["defaults"]}
options = yaml.safe_load(payload["config"] or "") or {}
TorchLlmArgs.model_validate({"model": payload["model"], **options})
print(json.dumps({"parsed": len(options), "defaults": defaults}))
"""
)

SCRIPTS = {"vllm": _VLLM, "sglang": _SGLANG, "trtllm": _TRTLLM}
# The parser's own defaults read back per framework (native name -> bakeoff knob): what the
# image does with a knob a campaign leaves unset. trtllm-serve's serve options
# (tensorrt_llm/commands/serve.py): --max_batch_size / --max_num_tokens default to BuildConfig's
# fields, --max_seq_len None (from the model), --free_gpu_memory_fraction 0.9.
DEFAULT_PARAMS: dict[str, dict[str, str]] = {
    "trtllm": {
        "max_batch_size": "max_num_seqs",
        "max_num_tokens": "max_num_batched_tokens",
        "max_seq_len": "max_model_len",
        "free_gpu_memory_fraction": "gpu_memory_utilization",
        "enable_chunked_prefill": "chunked_prefill",
    },
}


@dataclass(frozen=True)
class PreflightResult:
    label: str
    backend: str
    status: Status
    detail: str
    command: list[str] = field(default_factory=list)
    # The image's own defaults, by bakeoff knob name (DEFAULT_PARAMS), where the parser gave them.
    image_defaults: dict[str, object] = field(default_factory=dict)

    def line(self) -> str:
        shown = self.status.replace("_", " ")
        return f"{self.label} ({self.backend}): {shown}" + (f": {self.detail}" if self.detail else "")

    def to_json(self) -> dict[str, object]:
        return {"status": self.status, "detail": self.detail, "image_defaults": self.image_defaults}


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
    wanted = sorted(DEFAULT_PARAMS.get(launch.backend.preflight or "", {}))
    body = {
        "args": args,
        "config": launch.config_text,
        "config_path": config_path,
        "model": model,
        "prog": prog,
        "defaults": wanted,
    }
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
    said = _last_json(proc.stdout)
    if proc.returncode == NOT_CHECKED_EXIT and "not_checked" in said:
        why = f"{backend.preflight} did not import in the GPU-less pre-flight container ({said['not_checked']})"
        return PreflightResult(label, backend.name, "not_checked", why, command)
    if proc.returncode == 0:
        names = DEFAULT_PARAMS.get(backend.preflight or "", {})
        found = said.get("defaults")
        defaults = {names[k]: v for k, v in found.items() if k in names} if isinstance(found, dict) else {}
        took = f"{backend.preflight}'s own parser took the launch"
        return PreflightResult(label, backend.name, "ok", took, command, defaults)
    return PreflightResult(label, backend.name, "refused", framework_message(proc.stderr or proc.stdout), command)


def _last_json(stdout: str) -> dict[str, object]:
    """The script's report: its last stdout line as a JSON object ({} when there is none)."""
    for line in reversed(stdout.strip().splitlines()):
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        return parsed if isinstance(parsed, dict) else {}
    return {}


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
