"""The per-request record: raw nanosecond timestamps from which every metric is recomputed.

A :class:`RequestRecord` is what the client produces for one request and what
``records.parquet`` stores, one row each. Timestamps are ``time.perf_counter_ns()`` values
of the benchmarking process; only differences between them mean anything.

A call of an agent task tree also says which task and call it was and which calls' replies
its prompt carried (``depends_on``), so task times and critical paths are recomputed from
records alone (:mod:`bakeoff.measure.task_metrics`).

A reasoning model's stream has two phases, thinking then answer, sent in different delta
fields (:mod:`bakeoff.measure.sse`). ``chunk_phase`` says which each chunk was (one entry
per ``chunk_ns``, :data:`REASONING` or :data:`ANSWER`); it stays empty when no chunk
carried reasoning, so records of other models (and those written before it existed) read
as all answer. A chunk carrying both is kept as two entries at the same instant.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

ErrorKind = Literal["http", "connect", "timeout", "stall", "stream_cut", "protocol", "cancelled"]
UsageSource = Literal["server", "tokenizer", "chunks"]
ANSWER = 0
REASONING = 1


@dataclass
class RequestRecord:
    """One request as observed by the client; failed requests keep what was seen before."""

    request_id: int
    warmup: bool = False
    group: str = ""  # workload-specific class, e.g. "short" / "long", or the session id
    turn: int = -1  # multi-turn index, -1 when not a conversation
    scheduled_ns: int = 0  # when the load generator wanted to send it (open loop)
    slot: int = -1  # closed loop: which of the N workers sent it (the steady window is derived from these)
    start_ns: int = 0  # request bytes handed to the connection
    headers_ns: int = 0  # response headers received
    first_event_ns: int = 0  # first SSE event of any kind (time to first byte)
    first_token_ns: int = 0  # first event that carried generated tokens of any kind (TTFT)
    end_ns: int = 0  # end of stream, or the moment it failed
    chunk_ns: list[int] = field(default_factory=list)  # arrival of each content chunk
    chunk_chars: list[int] = field(default_factory=list)  # characters in each content chunk
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each content chunk
    chunk_phase: list[int] = field(default_factory=list)  # REASONING / ANSWER per chunk; empty: all answer
    prompt_tokens: int = 0
    max_tokens: int = 0  # output tokens the plan asked for; 0 when unknown (older runs)
    completion_tokens: int = 0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    usage_source: UsageSource = "server"
    reasoning_tokens: int | None = None  # of completion_tokens; None when no reasoning was seen
    reasoning_source: UsageSource | None = None  # where reasoning_tokens came from
    finish_reason: str | None = None
    http_status: int = 0
    error_kind: ErrorKind | None = None
    error: str = ""
    output_text: str = ""
    # Agent task trees (mode "tasks"): which task and call this was, the calls whose real
    # replies its prompt carries, and a fingerprint of the messages as sent.
    task: int = -1
    node: int = -1
    role: str = ""  # planner / worker / join
    depends_on: list[int] = field(default_factory=list)  # nodes of the same task
    sent_digest: str = ""

    @property
    def ok(self) -> bool:
        return self.error_kind is None

    @property
    def short(self) -> bool:
        """Completed with fewer tokens than planned, counted by the server's own usage.

        Only server counts are trusted: re-tokenizing the output text can come out a few
        tokens off, which would flag exact runs as short.
        """
        return self.ok and self.usage_source == "server" and self.completion_tokens < self.max_tokens

    @property
    def reasons(self) -> bool:
        """Whether any chunk of the stream carried reasoning."""
        return REASONING in self.chunk_phase

    def phase_ns(self, phase: int) -> list[int]:
        """Arrival times of this phase's chunks (no phases recorded: every chunk is answer)."""
        if not self.chunk_phase:
            return list(self.chunk_ns) if phase == ANSWER else []
        return [at for at, p in zip(self.chunk_ns, self.chunk_phase, strict=True) if p == phase]

    def phase_tokens(self, phase: int) -> list[int]:
        """Token shares of this phase's chunks, in order (1 each where shares are missing)."""
        shares = self.chunk_tokens if len(self.chunk_tokens) == len(self.chunk_ns) else [1] * len(self.chunk_ns)
        phases = self.chunk_phase or [ANSWER] * len(self.chunk_ns)
        return [t for t, p in zip(shares, phases, strict=True) if p == phase]

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RequestRecord:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in row.items() if k in names}
        for key in ("chunk_ns", "chunk_chars", "chunk_tokens", "chunk_phase", "depends_on"):
            values[key] = [int(x) for x in values.get(key) or []]
        for key in ("cached_tokens", "reasoning_tokens"):
            count = values.get(key)  # parquet reads a missing integer back as NaN
            values[key] = None if count is None or count != count else int(count)
        source = values.get("reasoning_source")
        values["reasoning_source"] = source if isinstance(source, str) else None
        return cls(**values)
