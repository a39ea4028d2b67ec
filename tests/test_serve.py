"""``bakeoff serve``: a backend started by hand as a campaign would start it, benchmarked, stopped cleanly.

The first tests use a process backend whose command is the reference server (from a
backends folder named by ``BAKEOFF_BACKENDS_DIR``, as in ``test_resume.py``): the launcher,
the process group, the printed bench line and the teardown are the real ones. The e2e test
serves llama.cpp itself (its GGUF conversion included).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from bakeoff.backends.spec import load_backend
from bakeoff.cli.serve_cmd import bench_line
from bakeoff.serving.handle import ServerHandle

BACKEND = """\
name: refproc
display_name: reference server (test)
runtime: process
accelerator: cpu
command: ["{python}", "-m", "bakeoff.ref.server", "--port", "{port}", "--model", "{served_model_name}",
          "--ttft-ms", "2", "--itl-ms", "1"]
health: {path: /health, timeout_s: 20, interval_s: 0.1}
cache_reset: {kind: none}
"""


def start_serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bakeoff", "serve", *args, "--log-dir", str(tmp_path / "log")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip


def read_until_bench_line(proc: subprocess.Popen[str], timeout_s: float) -> list[str]:
    """The lines serve printed up to its bench line (it then holds the server)."""
    assert proc.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            pytest.fail(f"serve ended early: {lines} {proc.communicate()}")
        lines.append(line.rstrip("\n"))
        if line.strip().startswith("bakeoff bench "):
            return lines
    pytest.fail(f"no bench line within {timeout_s} s: {lines}")


def bench_from(lines: list[str], out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run the printed bench line (smaller), as the user would copy it."""
    argv = shlex.split(next(line for line in lines if line.strip().startswith("bakeoff bench ")))
    argv = [a if a != argv[argv.index("--out") + 1] else str(out) for a in argv]
    small = {"--num-requests": "8", "--input-len": "16", "--output-len": "8"}
    argv = [small.get(argv[i - 1], a) if i else a for i, a in enumerate(argv)]
    return subprocess.run([sys.executable, "-m", *argv, *extra], capture_output=True, text=True, timeout=120)


def stop_and_check_nothing_is_left(proc: subprocess.Popen[str], sig: signal.Signals) -> str:
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    assert len(family) >= 2, "the server should be a child of serve"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    _, alive = psutil.wait_procs(family, timeout=10)
    assert not alive, f"left running: {[p.cmdline() for p in alive]}"
    return err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_serve_starts_the_backend_prints_a_bench_line_that_works_and_stops_cleanly(
    tmp_path: Path, tiny_model: Path, sig: signal.Signals
) -> None:
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "refproc.yaml").write_text(BACKEND)
    env = {"BAKEOFF_BACKENDS_DIR": str(tmp_path / "backends")}
    proc = start_serve(tmp_path, "refproc", "--model", str(tiny_model), "--served-name", "m", env=env)
    lines = read_until_bench_line(proc, 60)
    url = next(line.split(": ", 1)[1] for line in lines if line.startswith("base URL: "))
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+", url) and "served model: m" in lines
    assert any(line.startswith("command: ") and "bakeoff.ref.server" in line for line in lines)
    done = bench_from(lines, tmp_path / "run")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "c1" / "summary.json").is_file() and (tmp_path / "run" / "c4" / "summary.json").is_file()
    err = stop_and_check_nothing_is_left(proc, sig)
    assert "stopped refproc" in err and (tmp_path / "log" / "server.log").is_file()


def test_serve_rehearses_a_gpu_backend_with_its_stand_in_and_the_real_command(tmp_path: Path) -> None:
    proc = start_serve(tmp_path, "vllm", "--rehearse", "--model", "tiny", "--knob", "max_num_seqs=8")
    lines = read_until_bench_line(proc, 60)
    command = next(line for line in lines if line.startswith("command: "))
    assert "vllm/vllm-openai" in command and "--max-num-seqs 8" in command, command
    stop_and_check_nothing_is_left(proc, signal.SIGTERM)


def test_serve_refuses_a_knob_typo_and_a_busy_port_before_starting(tmp_path: Path) -> None:
    def serve(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "bakeoff", "serve", "llamacpp", "--model", "tiny", *args]
        return subprocess.run([*argv, "--log-dir", str(tmp_path / "log")], capture_output=True, text=True, timeout=60)

    typo = serve("--knob", "max_num_seq=2")
    assert typo.returncode == 2 and "did you mean 'max_num_seqs'" in typo.stderr, typo.stderr
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        busy = serve("--knob", "max_num_seqs=2", "--port", str(port))
    assert busy.returncode == 2, busy.stderr
    assert f"--port {port}: already in use" in busy.stderr and "starting llamacpp" not in busy.stdout
    assert not (tmp_path / "log").exists()


def test_the_bench_line_carries_the_flags_the_backend_needs(tiny_model: Path) -> None:
    handle = ServerHandle("http://127.0.0.1:9", "m", Path("log"), "cmd", 1.0, "process")
    llamacpp = shlex.split(bench_line(load_backend("llamacpp"), handle, tiny_model))
    assert "--no-min-tokens" in llamacpp and "--no-ignore-eos" not in llamacpp  # llama-server ignores min_tokens
    assert llamacpp[llamacpp.index("--tokenizer") + 1] == str(tiny_model)
    vllm = bench_line(load_backend("vllm-cpu"), handle, None)
    assert "--no-min-tokens" not in vllm and "--tokenizer" not in vllm


@pytest.mark.e2e
def test_serve_llamacpp_converts_the_model_is_benchmarked_and_leaves_nothing(tmp_path: Path, tiny_model: Path) -> None:
    proc = start_serve(tmp_path, "llamacpp", "--model", str(tiny_model), "--knob", "max_num_seqs=4")
    lines = read_until_bench_line(proc, 600)
    command = next(line for line in lines if line.startswith("command: "))
    # The campaign's own launch: the GGUF conversion of the folder, the alias, the slots.
    assert "llama-server" in command and "model-bf16.gguf" in command and "--parallel 4" in command, command
    done = bench_from(lines, tmp_path / "run")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "run" / "c4" / "summary.json").read_text())
    assert summary["requests"]["ok"] == 8 and summary["requests"]["failed"] == 0
    # llama.cpp states its context as meta.n_ctx, not max_model_len: a prompt beyond it is refused unsent.
    too_long = bench_from(lines, tmp_path / "long", "--input-len", "100000")
    assert too_long.returncode == 2 and "(its meta.n_ctx)" in too_long.stderr, too_long.stderr
    assert not (tmp_path / "long").exists()
    stop_and_check_nothing_is_left(proc, signal.SIGTERM)
