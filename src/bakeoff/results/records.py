"""The per-request record: raw nanosecond timestamps from which every metric is recomputed.

A :class:`RequestRecord` is what the client produces for one request and what
``records.parquet`` stores, one row each. Timestamps are ``time.perf_counter_ns()`` values
of the benchmarking process; only differences between them mean anything.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

ErrorKind = Literal["http", "connect", "timeout", "stall", "stream_cut", "protocol", "cancelled"]
UsageSource = Literal["server", "tokenizer", "chunks"]


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
    first_token_ns: int = 0  # first event that carried generated content (TTFT)
    end_ns: int = 0  # end of stream, or the moment it failed
    chunk_ns: list[int] = field(default_factory=list)  # arrival of each content chunk
    chunk_chars: list[int] = field(default_factory=list)  # characters in each content chunk
    chunk_tokens: list[int] = field(default_factory=list)  # tokens in each content chunk
    prompt_tokens: int = 0
    max_tokens: int = 0  # output tokens the plan asked for; 0 when unknown (older runs)
    completion_tokens: int = 0
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    usage_source: UsageSource = "server"
    finish_reason: str | None = None
    http_status: int = 0
    error_kind: ErrorKind | None = None
    error: str = ""
    output_text: str = ""

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

    def to_row(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> RequestRecord:
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in row.items() if k in names}
        for key in ("chunk_ns", "chunk_chars", "chunk_tokens"):
            values[key] = [int(x) for x in values.get(key) or []]
        cached = values.get("cached_tokens")
        values["cached_tokens"] = None if cached is None or cached != cached else int(cached)
        return cls(**values)
