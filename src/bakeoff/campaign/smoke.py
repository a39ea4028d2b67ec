"""The smoke run: every server of a campaign through a real run's steps once, in minutes.

``bakeoff campaign run --smoke`` runs only this; a real run runs it first (unless
``--no-smoke``) and stops, naming the server and the step, when any server fails it: a
metric name the backend YAML maps that the server does not export, or a cache reset that
does not empty the cache, is found before hours of GPU time are spent, not after.

Per server, with the campaign's own launch (its first cell's), through the same code a
real run uses (the launchers, :class:`~bakeoff.campaign.cold_cache.CellServer`, the streaming
client, :mod:`bakeoff.observe.telemetry`'s scrapes and cache resets):

1. start: the launcher brings the server up (its health probe included) and is timed;
2. health: the backend's health path answers 200;
3. streamed: one streamed completion ends with the server's own usage;
4. non-streamed: one ``stream: false`` completion answers a choice and usage;
5. metrics: a scrape holds every name the backend maps, a name the framework creates lazily
   (``metrics.lazy``) or only while speculating is marked so, never counted missing;
6. cache reset: a prompt sent twice hits on the second send (the hit counter's delta), the
   cache is emptied the backend's way (its reset endpoint, else a restart), and the same
   prompt then misses: a reset that answers 200 but leaves the cache warm fails here;
7. stop: the server stops and its port stops answering.

A step after a failed one is "not checked". The result is ``smoke.json``
(:mod:`bakeoff.results.smoke`), a table on the terminal and in the report's
engineering-effort section.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import orjson

from bakeoff.backends.launch_render import RenderedLaunch
from bakeoff.backends.spec import BackendSpec
from bakeoff.campaign.cells import Cell
from bakeoff.campaign.cold_cache import CellServer
from bakeoff.campaign.runner import run_coroutine
from bakeoff.console import text_table
from bakeoff.errors import LaunchError
from bakeoff.measure import control
from bakeoff.measure.client import ENDPOINT_PATHS, ClientSettings, StreamingClient, request_body
from bakeoff.observe import telemetry
from bakeoff.observe.telemetry import Snapshot
from bakeoff.results.records import RequestRecord
from bakeoff.results.smoke import (
    STEPS,
    MetricCheck,
    SmokeResult,
    SmokeServer,
    SmokeStep,
    smoke_details,
    smoke_rows,
    write_smoke,
)
from bakeoff.serving.handle import ServerHandle
from bakeoff.serving.launchers import launcher_kind
from bakeoff.serving.process import probe
from bakeoff.workloads.plans import PlannedRequest

# Starts ``cell``'s server with its run folder: cell_run.start_server, passed in (no import cycle).
CellStarter = Callable[[Cell, Path], AbstractContextManager[tuple[ServerHandle, RenderedLaunch]]]

SMOKE_DIR = "smoke"
MAX_TOKENS = 8
# A prompt long enough to fill whole cache blocks on every framework (vLLM 16 tokens,
# TensorRT-LLM 32), short enough for any context a campaign sets; common words, about a
# token each. Each prompt opens with its own nonce word, so two prompts share no prefix.
_TEXT = (
    "the quick brown fox jumps over a lazy dog while seven small birds sing in the old oak tree near "
    "a quiet river that flows past green fields and stone walls toward the distant hills where farmers "
    "gather wheat before the autumn rain comes down on the valley and every house lights a warm fire"
)
_WORDS = tuple(_TEXT.split(" "))
PROMPT_WORDS = 96
# Logical names of the counters a prefix-cache hit increments (telemetry's hit rates read them).
HIT_COUNTERS = frozenset({"prefix_cache_hits", "cached_tokens", "kv_cache_reused_blocks"})


def smoke_prompt(nonce: str) -> str:
    """A prompt of :data:`PROMPT_WORDS` words opening with ``nonce`` (no prefix shared with another nonce)."""
    return " ".join([nonce, *(_WORDS[i % len(_WORDS)] for i in range(PROMPT_WORDS - 1))])


def first_cell_per_server(cells: list[Cell]) -> list[Cell]:
    """One cell per server label, the first in campaign order: its launch is the server's launch."""
    seen: dict[str, Cell] = {}
    for cell in cells:
        seen.setdefault(cell.server.label, cell)
    return list(seen.values())


def run_smoke(cells: list[Cell], out: Path, start: CellStarter) -> SmokeResult:
    """Smoke-run every server of ``cells`` one after another; write ``smoke.json`` and print the table."""
    result = SmokeResult(rehearsal=any(c.rehearsed for c in cells))
    for cell in first_cell_per_server(cells):
        print(f"smoke: {cell.server.label} ...", flush=True)
        result.servers.append(smoke_server(cell, out / SMOKE_DIR / cell.server.label, start))
    write_smoke(out, result)
    print(smoke_table_text(result), flush=True)
    return result


def smoke_table_text(result: SmokeResult) -> str:
    """The terminal's smoke table (marks and seconds), then what each step found."""
    rows = smoke_rows(result, detailed=False)
    columns = ["server", "backend", *STEPS, "metric names"]
    table = text_table(columns, [[row[c] for c in columns] for row in rows])
    return "\n".join([table, *(f"  {line}" for line in smoke_details(result))])


def smoke_server(cell: Cell, run_dir: Path, start: CellStarter) -> SmokeServer:
    """One server's smoke run (module docstring); never raises for what the server does."""
    kind = launcher_kind(cell.backend, cell.server)
    record = SmokeServer(label=cell.server.label, backend=cell.backend.name, launcher=kind)
    began = time.monotonic()
    try:
        return _through_the_steps(cell, run_dir, start, record, began)
    except LaunchError as exc:  # stopping the server failed (a container that would not go)
        record.steps.append(SmokeStep(step="stop", ok=False, detail=_short(str(exc))))
        return record


def _through_the_steps(cell: Cell, run_dir: Path, start: CellStarter, record: SmokeServer, began: float) -> SmokeServer:
    with contextlib.ExitStack() as stack:
        server = CellServer(lambda: start(cell, run_dir), cell.backend, [])
        try:
            stack.enter_context(server)
        except LaunchError as exc:
            record.steps.append(SmokeStep(step="start", ok=False, detail=_short(str(exc)), seconds=_since(began)))
            _not_checked(record, "the server did not start")
            return record
        handle, launch = server.current()
        record.steps.append(SmokeStep(step="start", ok=True, detail=handle.kind, seconds=handle.startup_s))
        checks = _Checks(cell, server, launch, record)
        for name, step in (
            ("health", checks.health),
            ("streamed", checks.streamed),
            ("non-streamed", checks.non_streamed),
            ("metrics", checks.metrics),
            ("cache reset", checks.cache_reset),
        ):
            if record.failed is not None:
                record.steps.append(SmokeStep(step=name, ok=None, detail=f"after the failed {record.failed.step!r}"))
                continue
            step_began = time.monotonic()
            ok, detail = step()
            record.steps.append(SmokeStep(step=name, ok=ok, detail=detail, seconds=_since(step_began)))
        base_url, launched = server.current()[0].base_url, handle.server_kind.launched
        stop_began = time.monotonic()
    record.steps.append(_stopped(base_url, cell, launched, _since(stop_began)))
    return record


def _stopped(base_url: str, cell: Cell, launched: bool, seconds: float) -> SmokeStep:
    if not launched:
        return SmokeStep(step="stop", ok=None, detail="an external server: not bakeoff's to stop")
    if probe(base_url + cell.backend.health.path, timeout_s=2.0) is not None:
        return SmokeStep(step="stop", ok=False, detail=f"{base_url} still answers after the stop", seconds=seconds)
    return SmokeStep(step="stop", ok=True, seconds=seconds)


def _not_checked(record: SmokeServer, why: str) -> None:
    record.steps += [SmokeStep(step=name, ok=None, detail=why) for name in STEPS if record.step(name) is None]


def _since(began: float) -> float:
    return time.monotonic() - began


def _short(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


StepOutcome = tuple[bool | None, str]


class _Checks:
    """The steps after start, on one running server (the handle re-read: a restart moves it)."""

    def __init__(self, cell: Cell, server: CellServer, launch: RenderedLaunch, record: SmokeServer) -> None:
        self.cell, self.server, self.launch, self.record = cell, server, launch, record
        self.backend = cell.backend
        self.nonce = secrets.token_hex(3)
        self.sent = 0
        self.unit = "tokens"  # of the hit counter read (TensorRT-LLM counts KV blocks)

    @property
    def handle(self) -> ServerHandle:
        return self.server.current()[0]

    def settings(self) -> ClientSettings:
        return ClientSettings(
            base_url=self.handle.base_url,
            model=self.handle.model,
            extra_body=dict(self.backend.request.extra_body),
            request_timeout_s=120.0,
            min_tokens=self.backend.request.min_tokens,
            headers=dict(self.cell.headers),
        )

    def prompt(self) -> str:
        """A prompt no earlier one of this smoke run shares a prefix with."""
        self.sent += 1
        return smoke_prompt(f"smoke{self.nonce}n{self.sent}")

    def health(self) -> StepOutcome:
        url = self.handle.base_url + self.backend.health.path
        status = probe(url, timeout_s=30.0, headers=self.cell.headers)
        return (True, f"HTTP {status}") if status == 200 else (False, f"{url} answered {status or 'nothing'}")

    def send(self, prompt: str) -> RequestRecord:
        item = PlannedRequest(request_id=self.sent, endpoint="completions", max_tokens=MAX_TOKENS, prompt=prompt)
        record = RequestRecord(request_id=self.sent)

        async def go() -> None:
            async with StreamingClient(self.settings()) as client:
                await client.send(item, record)

        run_coroutine(go())
        return record

    def streamed(self) -> StepOutcome:
        record = self.send(self.prompt())
        if not record.ok:
            return False, f"{record.error_kind}: {_short(record.error)}"
        if record.usage_source != "server":
            return False, f"the stream carried no usage (tokens counted from {record.usage_source})"
        return True, f"{record.completion_tokens} tokens, usage from the server"

    def non_streamed(self) -> StepOutcome:
        settings = self.settings()
        item = PlannedRequest(request_id=0, endpoint="completions", max_tokens=MAX_TOKENS, prompt=self.prompt())
        body = orjson.loads(request_body(item, settings))
        body["stream"] = False
        body.pop("stream_options")  # TensorRT-LLM refuses stream_options without stream
        answer = control.call(
            settings.base_url.rstrip("/") + ENDPOINT_PATHS["completions"],
            method="POST",
            headers=settings.headers,
            timeout_s=settings.request_timeout_s,
            data=orjson.dumps(body),
            content_type="application/json",
        )
        return judge_non_streamed(answer.status, answer.json(), answer.reason or answer.text)

    def scrape(self) -> Snapshot:
        return telemetry.scrape(self.handle.base_url, self.backend, headers=self.cell.headers)

    def metrics(self) -> StepOutcome:
        spec = self.backend.metrics
        if spec.path is None or spec.format != "prometheus" or not spec.names:
            return None, "the backend maps no Prometheus metrics"
        answer = control.call(self.handle.base_url + spec.path, headers=self.cell.headers, timeout_s=10.0)
        if answer.status != 200:
            return False, f"{spec.path} answered {answer.status or answer.reason}"
        self.record.metrics = classify_metrics(
            telemetry.parse_prometheus(answer.text), self.backend, speculating=self._speculating()
        )
        missing = [c.native for c in self.record.metrics if c.state == "missing"]
        if missing:
            fix = f"fix metrics.names (or metrics.lazy) in backends/{self.backend.name}.yaml"
            return False, f"{spec.path} lacks {', '.join(missing)}: {fix}"
        return True, f"{len(self.record.metrics)} mapped names"

    def _speculating(self) -> bool:
        return self.launch.effective_knobs.get("speculative") not in (None, "none")

    def cache_reset(self) -> StepOutcome:
        if self.launch.effective_knobs.get("prefix_caching") is False:
            return None, "prefix caching is off on this server"
        if not telemetry.has_prefix_cache_counters(self.backend):
            return None, "the backend maps no prefix-cache hit counter"
        if self.backend.cache_reset.kind == "none":
            return None, "the backend has no way to empty its cache"
        prompt = self.prompt()
        first = self._hits_of(prompt)
        hit = self._hits_of(prompt, note_lazy=True)
        if isinstance(first, str) or isinstance(hit, str):
            return False, first if isinstance(first, str) else str(hit)
        how, reset_ok, reset_detail = self._reset()
        if not reset_ok:
            return False, f"the {how} failed: {reset_detail}"
        after = self._hits_of(prompt)
        if isinstance(after, str):
            return False, after
        return judge_cache_reset(hit, after, f"{how}", self.unit)

    def _hits_of(self, prompt: str, *, note_lazy: bool = False) -> float | str:
        """The hit counter's delta over one send of ``prompt``; a string says what failed."""
        before = self.scrape()
        record = self.send(prompt)
        after = self.scrape()
        if not record.ok:
            return f"the request failed: {record.error_kind}: {_short(record.error)}"
        if note_lazy:
            for check in self.record.metrics:
                if check.state == "lazy":
                    check.after_first_hit = telemetry.logical(after, self.backend, check.name) is not None
        found = telemetry.prefix_cache_from_counters(before, after, self.backend)
        if found["server_hits"] is None:
            return "a scrape around the request failed"
        self.unit = str(found["server_hit_unit"])
        return float(found["server_hits"])

    def _reset(self) -> tuple[str, bool, str]:
        """Empty the cache the way a real run does: (how, emptied?, what was said)."""
        if self.backend.cache_reset.kind == "restart":
            try:
                stop_s, start_s = self.server.restart()
            except LaunchError as exc:
                return "restart", False, _short(str(exc))
            return "restart", True, f"{stop_s + start_s:.1f} s"
        reset = telemetry.reset_prefix_cache(self.handle.base_url, self.backend, headers=self.cell.headers)
        return f"reset ({self.backend.cache_reset.path})", bool(reset.ok), reset.detail


def judge_non_streamed(status: int | None, payload: object, reason: str) -> StepOutcome:
    """A ``stream: false`` completion's answer: HTTP 200 with a text choice and usage."""
    if status != 200:
        return False, f"HTTP {status if status is not None else 'no answer'}: {_short(reason, 200)}"
    choices = payload.get("choices") if isinstance(payload, dict) else None
    usage = payload.get("usage") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0].get("text"), str):
        return False, "the answer has no text choice"
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(tokens, int) or tokens <= 0:
        return False, "the answer has no usage.completion_tokens"
    return True, f"{tokens} tokens"


def classify_metrics(snapshot: Snapshot, backend: BackendSpec, *, speculating: bool) -> list[MetricCheck]:
    """Each logical name the backend maps: found in ``snapshot``, lazy, off (speculation), or missing."""
    checks = []
    for name, native in backend.metrics.names.items():
        if telemetry.logical(snapshot, backend, name) is not None:
            state = "found"
        elif name in backend.metrics.lazy or (speculating and name.startswith("spec_")):
            state = "lazy"  # speculative counters appear with the first draft (telemetry reads them so)
        elif name.startswith("spec_"):
            state = "off"
        else:
            state = "missing"
        checks.append(MetricCheck(name=name, native=native, state=state, hit_counter=name in HIT_COUNTERS))
    return checks


def judge_cache_reset(hit: float, after: float, how: str, unit: str = "tokens") -> StepOutcome:
    """The repeated prompt's hits (the hit counter's delta) before the reset and the same prompt's after it."""
    if hit <= 0:
        return False, "a repeated prompt did not hit: the cache (or its hit counter) does not work as mapped"
    if after > 0:
        return False, (
            f"the {how} answered, but the same prompt still hit {after:g} {unit} after it: the cache was not emptied"
        )
    return True, f"verified: a repeated prompt hit {hit:g} {unit} before the {how}, 0 after"
