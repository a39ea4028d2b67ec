"""Run request plans against one ready server and leave a complete run folder for each.

For every plan: empty the prefix cache where the backend can (or take the caller's word
that a restart did), run the warm-up, snapshot server counters, drive the measured load
while journalling records, wait for the server to drain and snapshot again, then write
``records.parquet``, ``summary.json`` and ``run.json`` atomically. Both say whether the
run started from an emptied cache. Ctrl-C stops the load, still writes all of that for
what was measured, and re-raises so the caller tears the server down.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bakeoff.analysis.roofline import bandwidth
from bakeoff.backends.spec import BackendSpec
from bakeoff.errors import ServerDiedError
from bakeoff.measure.client import ClientSettings, StreamingClient
from bakeoff.measure.loadgen import run_plan
from bakeoff.measure.metrics import WindowTargets, summarize, window_bounds
from bakeoff.measure.multiload import Spreader
from bakeoff.measure.slo import Slo, run_meets_slo
from bakeoff.measure.task_metrics import task_block
from bakeoff.observe import origin
from bakeoff.observe.energy import EnergyMeter, energy_meter
from bakeoff.observe.hoststats import HostWindow, host_load
from bakeoff.observe.telemetry import (
    CacheReset,
    Snapshot,
    counter_delta,
    prefix_cache_from_counters,
    reset_prefix_cache,
    scrape,
    speculative_from_counters,
    wait_idle,
)
from bakeoff.observe.telemetry_series import (
    DEFAULT_INTERVAL_S,
    SERIES_FILE,
    SERIES_KEY,
    Sampler,
    probes_for,
    write_series,
)
from bakeoff.results.records import RequestRecord
from bakeoff.results.store import (
    RECORDS_JOURNAL,
    RECORDS_PARQUET,
    RUN_INFO,
    SUMMARY,
    RecordJournal,
    read_journal,
    write_json,
    write_records,
    write_summary,
)
from bakeoff.results.summary import (
    CacheResetResult,
    ClientLoad,
    Energy,
    PrefixCache,
    Provenance,
    RunSummary,
    ServerDied,
    Speculative,
    WorkloadInfo,
)
from bakeoff.serving.death_watch import DeathWatch, ServerDeath, url_watch
from bakeoff.serving.handle import SERVER_KINDS
from bakeoff.workloads.plans import RunPlan, designed_reuse, reusable_share


@dataclass
class RunTarget:
    """Where the load goes and what is known about the server behind it."""

    settings: ClientSettings
    backend: BackendSpec | None = None
    server_info: dict[str, Any] = field(default_factory=dict)
    slo: Slo | None = None
    show_progress: bool = True
    # Tells a dead server from a failing request (bakeoff.serving.death_watch); default: its port is probed.
    watch: Callable[[], DeathWatch] | None = None
    # Load-generator processes for the measured part; None: as many as the warm-up shows (bakeoff.measure.multiload).
    client_processes: int | None = None
    # A local engine's process: its CPU and memory go into the telemetry series.
    server_pid: int | None = None
    # The campaign's memory bandwidth (GB/s) for the roofline; None: preset or measured.
    memory_bandwidth_gbs: float | None = None
    telemetry_interval_s: float = DEFAULT_INTERVAL_S
    # The NVML indices of the GPUs the server is pinned to: telemetry and energy read those only.
    gpus: list[int] | None = None

    @property
    def headers(self) -> Mapping[str, str]:
        """The client's headers (an API key among them) go on every scrape and reset too."""
        return self.settings.headers


# How long a counter snapshot waits for the server to finish what the client gave up on.
SETTLE_S = 10.0


def provenance(target: RunTarget, started: str, finished: str) -> Provenance:
    server = target.server_info
    return Provenance(
        bakeoff_version=origin.versions().get("bakeoff"),
        git_revision=origin.harness_revision(),
        framework_version=origin.framework_version(target.backend, origin.versions(target.backend)),
        server_kind=server.get("kind"),
        image=server.get("image"),
        image_digest=server.get("image_digest"),
        machine=origin.describe(),
        started_at=started,
        finished_at=finished,
    )


def prefix_cache_block(
    plan: RunPlan,
    records: list[RequestRecord],
    counters: dict[str, Any],
    *,
    absent_cached_is_zero: bool = False,
    granularity: int | None = None,
) -> PrefixCache:
    """Designed reuse beside what the server's counters and usage say was realised.

    ``granularity``: the server's prefix-cache block in tokens; reuse counts as realised
    against what whole blocks could reuse, so a 128-token block that a 32-token shared prefix
    never fills is not flagged as a cache that failed.

    ``absent_cached_is_zero``: the backend reports cached tokens but leaves the field out
    when there were none (SGLang), so a server usage without it counts as 0 cached tokens
    rather than dropping the request from the ratio.
    """
    measured = [r for r in records if r.ok and not r.warmup]
    reporting = [
        r for r in measured if r.cached_tokens is not None or (absent_cached_is_zero and r.usage_source == "server")
    ]
    prompt = sum(r.prompt_tokens for r in reporting)
    cached_ratio = sum(r.cached_tokens or 0 for r in reporting) / prompt if reporting and prompt else None
    designed = designed_reuse(plan)
    # What the server could realise at best: its cache reuses whole blocks only (vLLM-CPU: 128 tokens).
    reusable = designed if granularity is None else reusable_share(plan, granularity)
    block = PrefixCache(
        designed_reuse=designed,
        cache_granularity=granularity,
        reusable=reusable,
        cached_tokens_ratio=cached_ratio,
        **counters,
    )
    realised = block.server_hit_rate if block.server_hit_rate is not None else cached_ratio
    block.reuse_realised = None if reusable is None or realised is None else realised >= 0.5 * reusable
    return block


def empty_cache(target: RunTarget) -> CacheReset:
    """Empty the server's prefix cache where an endpoint can; say what happened either way."""
    backend = target.backend
    if backend is None:
        return CacheReset("none", None, 0, "unknown server: its cache was left as it was")
    if backend.cache_reset.kind == "http":
        return reset_prefix_cache(target.settings.base_url, backend, headers=target.headers)
    return CacheReset(backend.cache_reset.kind, None, 0, "not restarted before this run: its cache was left as it was")


def _snapshot(target: RunTarget) -> Snapshot:
    """Server counters once the server has nothing in flight (bounded wait)."""
    backend = target.backend
    if backend is None:
        return {}
    base_url = target.settings.base_url
    wait_idle(base_url, backend, timeout_s=SETTLE_S, headers=target.headers)
    return scrape(base_url, backend, headers=target.headers)


def _mean_cores(series: list[dict[str, float | None]]) -> float | None:
    """A local engine's mean CPU over the window, from its process probe's readings."""
    cores = [c for row in series if (c := row.get("cpu_cores")) is not None]
    return sum(cores) / len(cores) if cores else None


def _client_cores(client: ClientLoad | None) -> float | None:
    return sum(client.cpu_util) if client is not None and client.cpu_util else None


def execute_plan(
    plan: RunPlan, target: RunTarget, run_dir: Path, *, cache_state: CacheReset | None = None, repeat: int = 1
) -> RunSummary:
    """Run one plan into ``run_dir`` and return its summary (``repeat``: which repeat of its cell).

    ``cache_state``: how the caller already emptied the cache (a server restart); without
    it the cache is reset through the backend's endpoint, where it has one.
    """
    _clear_run(run_dir)
    cache = cache_state if cache_state is not None else empty_cache(target)
    run = _measure(plan, target, run_dir)
    summary = _summarize_run(plan, target, run, cache, repeat)
    write_summary(run_dir / SUMMARY, summary)
    write_json(run_dir / RUN_INFO, _run_info(plan, target, run, cache, summary))
    if run.interrupted:
        raise KeyboardInterrupt
    if run.died is not None:
        verdict = summary.server_died.model_dump() if summary.server_died else {}
        raise ServerDiedError(f"{run.died.message(target.settings.base_url)}; results in {run_dir}", verdict)
    return summary


@dataclass
class _MeasuredRun:
    """What the measuring phase of one run leaves for its summary and run.json."""

    records: list[RequestRecord]
    before: Snapshot
    after: Snapshot
    series: list[dict[str, float | None]]
    telemetry_notes: list[str]
    interrupted: bool
    died: ServerDeath | None
    client: ClientLoad | None
    started: str
    meter: EnergyMeter | None
    energy_note: str
    host_window: dict[str, float | None]


def _clear_run(run_dir: Path) -> None:
    """A re-run replaces the run: its journal must not append to the previous one's."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in (RECORDS_JOURNAL, RECORDS_PARQUET, SUMMARY, RUN_INFO, SERIES_FILE):
        (run_dir / name).unlink(missing_ok=True)


def _measure(plan: RunPlan, target: RunTarget, run_dir: Path) -> _MeasuredRun:
    """Drive the plan with the server's counters snapshotted around the measured window and the series sampled."""
    backend = target.backend
    base_url = target.settings.base_url
    snapshots: dict[str, Snapshot] = {}
    probes, telemetry_notes = probes_for(
        base_url, backend, pid=target.server_pid, headers=target.headers, gpus=target.gpus
    )
    # Energy from cumulative counters, read with the telemetry and cut to the measured window after.
    meter, energy_note = energy_meter(backend.accelerator if backend is not None else "cpu", gpus=target.gpus)
    if meter is not None:
        probes.append(meter)
    else:
        telemetry_notes.append(energy_note)
    sampler = Sampler(probes, target.telemetry_interval_s)
    host = HostWindow()

    def measure_start() -> None:
        # After warm-up: server counters must cover what cached_tokens_ratio covers.
        snapshots["before"] = _snapshot(target)
        sampler.start()  # the series covers the measured window only
        host.start()

    started = dt.datetime.now(dt.UTC).isoformat()
    interrupted = False
    watch = target.watch() if target.watch is not None else url_watch(base_url)
    spreader = Spreader(target.client_processes)
    with RecordJournal(run_dir / RECORDS_JOURNAL) as journal:
        try:
            run_coroutine(_drive(plan, target, journal, measure_start, watch, spreader))
        except KeyboardInterrupt:
            interrupted = True
        finally:
            series = sampler.stop()
            window = host.stop()
    if series:
        write_series(run_dir / SERIES_FILE, series)
    died = watch.verdict
    # After Ctrl-C the user wants out: no waiting for the server to drain; a dead one has nothing to say.
    if died is not None or backend is None:
        after = {}
    else:
        after = scrape(base_url, backend, headers=target.headers) if interrupted else _snapshot(target)
    records = read_journal(run_dir / RECORDS_JOURNAL)
    write_records(run_dir / RECORDS_PARQUET, records)
    return _MeasuredRun(
        records=records,
        before=snapshots.get("before", {}),
        after=after,
        series=series,
        telemetry_notes=telemetry_notes,
        interrupted=interrupted,
        died=died,
        client=spreader.result,
        started=started,
        meter=meter,
        energy_note=energy_note,
        host_window=window,
    )


def _summarize_run(plan: RunPlan, target: RunTarget, run: _MeasuredRun, cache: CacheReset, repeat: int) -> RunSummary:
    """The run's summary: its records' figures, what the run was, and what may make it not count."""
    backend = target.backend
    measured = summarize(run.records, target.slo, WindowTargets(plan.min_requests, plan.min_duration_s))
    energy = _energy(run.meter, run.energy_note, run.records, measured)
    finished = dt.datetime.now(dt.UTC).isoformat()
    slo = measured.slo
    if slo is not None and target.slo is not None:
        slo = slo.model_copy(update={"p99_met": run_meets_slo(measured, target.slo)})
    block = None
    if plan.designs_reuse:
        counters = prefix_cache_from_counters(run.before, run.after, backend) if backend else {}
        absent_is_zero = backend is not None and backend.request.reports_cached_tokens
        block = prefix_cache_block(
            plan,
            run.records,
            counters,
            absent_cached_is_zero=absent_is_zero,
            granularity=backend.prefix_cache_granularity if backend else None,
        )
        # False: the reset failed, so hits may include what earlier runs left in the cache.
        block.cache_emptied_before_run = cache.ok
    knobs = target.server_info.get("effective_knobs") or target.server_info.get("knobs") or {}
    draft_len = knobs.get("num_speculative_tokens")
    draft_len = draft_len if isinstance(draft_len, int) and not isinstance(draft_len, bool) else None
    drafted = speculative_from_counters(run.before, run.after, backend, draft_len) if backend else None
    died = run.died
    return measured.model_copy(
        update={
            "slo": slo,
            "speculative": Speculative(**drafted) if drafted else None,
            "workload": WorkloadInfo(
                run=plan.name,
                mode=plan.mode,
                concurrency=plan.concurrency,
                rate=plan.rate,
                repeat=repeat,
                spec=plan.workload.model_dump(mode="json"),
            ),
            "interrupted": run.interrupted,
            "server_died": None
            if died is None
            else ServerDied(**vars(died), requests_not_sent=_unsent(plan, run.records)),
            # A reference-server stand-in (campaign run --rehearse): never to be read as a measurement.
            "rehearsal": any(k.stand_in for k in SERVER_KINDS.values() if k.name == target.server_info.get("kind")),
            "cache_reset": CacheResetResult(**cache.to_json()),
            "prefix_cache": block,
            "agent_tasks": task_block(
                plan,
                run.records,
                backend.prefix_cache_granularity if backend else None,
                preemptions=counter_delta(run.before, run.after, backend, "preemptions") if backend else None,
                evicted_tokens=counter_delta(run.before, run.after, backend, "evicted_tokens") if backend else None,
            ),
            "trace": plan.trace or None,
            "provenance": provenance(target, run.started, finished),
            "client": run.client,
            "energy": energy,
            "host": host_load(run.host_window, _mean_cores(run.series), _client_cores(run.client)),
            "telemetry_series": {SERIES_KEY: SERIES_FILE} if run.series else {},
        }
    )


def _run_info(
    plan: RunPlan, target: RunTarget, run: _MeasuredRun, cache: CacheReset, summary: RunSummary
) -> dict[str, Any]:
    """run.json: how the run was made (client settings, machine, versions), beside its summary."""
    settings = target.settings
    return {
        "plan": plan.name,
        "workload": plan.workload.model_dump(mode="json"),
        "server": target.server_info,
        "client": {
            "base_url": settings.base_url,
            "model": settings.model,
            "extra_body": settings.extra_body,
            "request_timeout_s": settings.request_timeout_s,
            "stall_timeout_s": settings.stall_timeout_s,
            "exact_prompt_lengths": settings.count_tokens is not None,
            "min_tokens": settings.min_tokens,
            # Names only: values may hold the API key.
            "header_names": sorted(settings.headers),
        },
        "prefix_cache_reset_before_run": cache.ok is True,
        "cache_reset": cache.to_json(),
        "machine": origin.machine_info(),
        "memory_bandwidth": _bandwidth_json(target),
        "telemetry": {
            "interval_s": target.telemetry_interval_s,
            "samples": len(run.series),
            "left_out": run.telemetry_notes,
        },
        "versions": origin.versions(target.backend),
        "started_at": run.started,
        "finished_at": summary.provenance.finished_at,
        "interrupted": run.interrupted,
        "server_died": summary.server_died.model_dump() if summary.server_died else None,
    }


def _energy(meter: EnergyMeter | None, note: str, records: list[RequestRecord], measured: RunSummary) -> Energy:
    """Energy over the window the throughput is measured over, for the tokens that arrived in it."""
    bounds = window_bounds(records)
    if meter is None:
        return Energy(reason=note)
    if bounds is None:
        return Energy(source=meter.source, reason="no measured request: no window to read energy over")
    tokens = measured.throughput.output_tok_s * measured.throughput.window_s
    return meter.window(bounds.start_ns, bounds.end_ns, tokens)


def _bandwidth_json(target: RunTarget) -> dict[str, Any] | None:
    """The bandwidth the roofline of this run is drawn against, recorded where it was measured."""
    accelerator = target.backend.accelerator if target.backend is not None else "cpu"
    found = bandwidth(accelerator, override=target.memory_bandwidth_gbs)
    return found.to_json() if found is not None else None


def _unsent(plan: RunPlan, records: list[RequestRecord]) -> int:
    """Requests of the plan (warm-up included) that never got an answer of any kind."""
    planned = len(plan.warmup) + len(plan.requests) + sum(len(s.user_turns) for s in plan.sessions)
    planned += sum(len(t.calls) for t in plan.tasks)
    return max(planned - len(records), 0)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop  # a faster loop keeps client overhead per chunk low

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


def run_coroutine(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` to completion, also from inside a notebook kernel's running loop.

    Jupyter kernels already run an event loop in the main thread, so there the load runs
    on a fresh loop in a worker thread; Ctrl-C (a kernel interrupt) cancels it cleanly.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        with asyncio.Runner(loop_factory=_new_loop) as runner:
            runner.run(coro)
        return
    loop = _new_loop()
    task_box: list[asyncio.Task[None]] = []
    errors: list[BaseException] = []

    def work() -> None:
        async def main() -> None:
            task_box.append(asyncio.current_task())  # type: ignore[arg-type]
            await coro

        try:
            loop.run_until_complete(main())
        except BaseException as exc:  # handed to the calling thread below
            errors.append(exc)
        finally:
            loop.close()

    thread = threading.Thread(target=work, name="bakeoff-load", daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        if task_box:
            loop.call_soon_threadsafe(task_box[0].cancel)
        thread.join()
        raise
    if errors and not isinstance(errors[0], asyncio.CancelledError):
        raise errors[0]


async def _drive(
    plan: RunPlan,
    target: RunTarget,
    journal: RecordJournal,
    on_measure_start: Callable[[], None],
    watch: DeathWatch,
    spread: Spreader | None = None,
) -> None:
    """The load, with ``watch`` beside it: a dead server ends the load at once (``watch.verdict``)."""

    def sink(record: RequestRecord) -> None:
        journal.append(record)
        watch.observe(record)

    async with StreamingClient(target.settings) as client:
        load = asyncio.create_task(
            run_plan(
                client,
                plan,
                sink,
                show_progress=target.show_progress,
                on_measure_start=on_measure_start,
                spread=spread,
            )
        )
        guard = asyncio.create_task(watch.guard(load))
        try:
            await load
        except asyncio.CancelledError:
            if watch.verdict is None:
                raise  # Ctrl-C, not the watch
        finally:
            guard.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await guard
        await watch.conclude()


def salvage_runs(root: Path, slo: Slo | None = None) -> list[Path]:
    """Finish run folders whose process died mid-run: parquet and summary from the journal.

    The journal holds every request that completed; the summary is marked interrupted.
    """
    finished = []
    for journal in sorted(root.rglob(RECORDS_JOURNAL)):
        run_dir = journal.parent
        if (run_dir / SUMMARY).is_file():
            continue
        records = read_journal(journal)
        write_records(run_dir / RECORDS_PARQUET, records)
        summary = summarize(records, slo).model_copy(
            update={"workload": WorkloadInfo(run=run_dir.name), "interrupted": True}
        )
        write_summary(run_dir / SUMMARY, summary)
        finished.append(run_dir)
    return finished
