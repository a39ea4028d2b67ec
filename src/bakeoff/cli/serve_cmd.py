"""``bakeoff serve``: start one backend by hand, exactly as a campaign cell would, for ``bakeoff bench``.

The server is a campaign ``servers:`` entry of its own (backend + knobs) started by the
campaign's launchers (:mod:`bakeoff.serving.launchers`): the same rendered command and
environment, the same model conversion (GGUF for llama.cpp), a local process or the
backend's container. It stays in the foreground and prints its base URL, the served model
name and the ``bakeoff bench`` line that measures it; Ctrl-C or SIGTERM stops it, and the
launcher's teardown leaves no process (or container) behind.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from bakeoff.errors import LaunchError, SpecError

# The serving stack is imported when the command runs (`bakeoff` builds every command's options
# from this module; --help and a refused flag should not load it).
if TYPE_CHECKING:
    from bakeoff.backends.spec import BackendSpec
    from bakeoff.serving.handle import ServerHandle

# How often the foreground loop checks that the server is still up.
CHECK_S = 1.0


def add_serve_options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("backend", help="backend name, as 'bakeoff backends list' shows it")
    serve.add_argument(
        "--model",
        required=True,
        help="a generated preset (tiny, small) or a model folder; llama.cpp gets it converted to GGUF as in a campaign",
    )
    serve.add_argument("--knob", action="append", default=[], help="name=value, repeatable ('bakeoff backends show')")
    serve.add_argument("--port", type=int, help="host port to serve on (default: a free one)")
    serve.add_argument("--served-name", default="bakeoff-model", help="model name the server answers to")
    serve.add_argument(
        "--log-dir", type=Path, help="folder for the server's log and config files (default: a new temporary folder)"
    )
    serve.add_argument(
        "--rehearse",
        action="store_true",
        help="GPU backends: the reference server in the framework's wire profile instead of its container "
        "(as 'campaign run --rehearse'); measures nothing real",
    )


def bench_line(backend: BackendSpec, handle: ServerHandle, tokenizer: Path | None) -> str:
    """The ``bakeoff bench`` command that measures this server, with the flags its backend needs."""
    argv = ["bakeoff", "bench", "--base-url", handle.base_url, "--model", handle.model]
    if tokenizer is not None:
        argv += ["--tokenizer", str(tokenizer)]
    argv += ["--concurrency", "1", "4", "--num-requests", "32", "--input-len", "256", "--output-len", "64"]
    if not backend.request.min_tokens:
        argv.append("--no-min-tokens")  # the server ignores or rejects min_tokens (llama.cpp)
    if "ignore_eos" not in backend.request.extra_body:
        argv.append("--no-ignore-eos")
    return shlex.join([*argv, "--out", f"runs/{backend.name}"])


def cmd_serve(args: argparse.Namespace) -> int:
    """Check everything, start the server, print how to bench it, and hold it until interrupted."""
    from bakeoff.backends.knobs import parse_knob_args
    from bakeoff.backends.launch_render import render_launch
    from bakeoff.backends.server_config import ServerConfig
    from bakeoff.backends.spec import load_backend
    from bakeoff.host.cpu_checks import check_cpu_needs, host_cpu_flags
    from bakeoff.host.gpus import gpu_available
    from bakeoff.models.model_source import ModelRef, model_shorthand, resolve_model
    from bakeoff.serving.launchers import LaunchContext, server_kind, start_server
    from bakeoff.serving.process import port_in_use

    backend = load_backend(args.backend)
    server = ServerConfig(backend=backend.name, knobs=parse_knob_args(args.knob))
    if args.rehearse:  # the server as a rehearsal's: a GPU backend's stand-in starts instead of its container
        server = server.for_rehearsal()
    # Knobs are refused before anything starts, as in a campaign.
    render_launch(backend, server.knobs, model="/model", served_model_name=args.served_name, port=8000)
    if backend.accelerator == "cpu" and not args.rehearse:
        check_cpu_needs("--knob ", backend, server.knobs, host_cpu_flags())
    if args.port is not None and not 0 < args.port < 65536:
        raise SpecError(f"--port {args.port}: a TCP port is 1-65535")
    if args.port is not None and port_in_use(args.port):
        raise SpecError(f"--port {args.port}: already in use; pick another, or leave --port out for a free one")
    source = resolve_model(ModelRef.model_validate(model_shorthand(args.model)))
    kind = server_kind(backend, server)
    if backend.accelerator == "gpu" and not kind.stand_in and not gpu_available():
        raise SpecError(f"{backend.name} needs a GPU and this machine has none; add --rehearse to serve its stand-in")
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix=f"bakeoff-serve-{backend.name}-"))
    ctx = LaunchContext(server, backend, source, args.served_name, log_dir, port=args.port)
    print(
        f"starting {backend.name} ({backend.display_name}) as a {kind.name}; log: {log_dir / 'server.log'}", flush=True
    )
    try:
        with start_server(ctx) as (handle, launch):
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(launch.env.items()) if kind.local_engine)
            local = source.local_dir
            tokenizer = local if local is not None and (local / "tokenizer.json").is_file() else None
            lines = [
                f"ready in {handle.startup_s:.1f} s",
                f"command: {f'env {env} ' if env else ''}{handle.command_line}",
                f"base URL: {handle.base_url}",
                f"served model: {handle.model}",
                "benchmark it with:",
                f"  {bench_line(backend, handle, tokenizer)}",
                "Ctrl-C (or SIGTERM) stops it.",
            ]
            print("\n".join(lines), flush=True)
            _hold(handle, backend)
    except KeyboardInterrupt:
        print(f"stopped {backend.name}; its log stays in {log_dir}", file=sys.stderr)
        return 0
    return 1  # _hold returns only when the server went away by itself


def _hold(handle: ServerHandle, backend: BackendSpec) -> None:
    """Wait until interrupted; raise when the server dies under us (the launcher then cleans up)."""
    import psutil

    from bakeoff.serving.process import probe

    health = handle.base_url + backend.health.path
    while True:
        time.sleep(CHECK_S)
        if handle.pid is not None:
            try:
                alive = psutil.Process(handle.pid).status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                alive = False
        else:
            alive = probe(health) is not None
        if not alive:
            raise LaunchError(f"{backend.name} stopped by itself; read its log: {handle.log_path}")
