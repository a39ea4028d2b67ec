"""The control-plane HTTP client: health probes, metrics scrapes, cache resets, reachability.

Everything bakeoff asks a server *about* (as opposed to the measured generation requests,
which go through the streaming client in :mod:`bakeoff.measure.client`) goes through
:func:`call`, so every such request is handled the same way as the measured ones:

- **No proxy.** The streaming client connects straight to the server; a control request
  that went through ``HTTP(S)_PROXY`` could reach a different host, or fail where the
  measurement works. Environment proxies are therefore ignored here too.
- **One TLS policy.** :func:`tls_context` is used by both clients: certificates are
  verified against the system trust store; ``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` (read by
  OpenSSL) add a private CA, e.g. a gateway's.
- **The same headers.** The caller's headers (the API key: :mod:`bakeoff.measure.auth`) go on
  every call; they are checked before sending and never written anywhere.

Failures do not raise: an :class:`Answer` carries the status (``None`` when nothing
answered) and a short reason, and callers decide what a failure means for them.
"""

from __future__ import annotations

import functools
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from bakeoff.errors import ServerUnreachableError
from bakeoff.measure.auth import check_headers

BODY_LIMIT = 1 << 22  # metrics pages of big servers run to a few hundred KiB


def tls_context() -> ssl.SSLContext:
    """The TLS settings of every connection bakeoff makes, measured or not."""
    return ssl.create_default_context()


def _opener(url: str) -> urllib.request.OpenerDirector:
    # An empty ProxyHandler switches off the environment's proxies (see the module docstring).
    if urlsplit(url).scheme != "https":
        return _plain_opener()
    return urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls_context())
    )


@functools.cache
def _plain_opener() -> urllib.request.OpenerDirector:
    # Plain HTTP needs no TLS context, and building one loads the CA store (about 20 ms of CPU):
    # too much once a second beside a running load (the telemetry sampler scrapes through here).
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Answer:
    """One control request's outcome: ``status`` is None when nothing answered."""

    url: str
    status: int | None
    body: bytes = b""
    reason: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def text(self) -> str:
        return self.body.decode(errors="replace")

    def json(self) -> Any:
        """The body as JSON, or None when it is not JSON."""
        try:
            return orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None


def call(
    url: str,
    *,
    method: str = "GET",
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 5.0,
    data: bytes | None = None,
    body_limit: int = BODY_LIMIT,
    content_type: str | None = None,
) -> Answer:
    """One control request; the answer, an HTTP error status or no answer, never an exception.

    ``content_type``: of ``data`` (``application/json``), set here since callers' headers may not.
    """
    check_headers(headers or {}, "control request headers")
    if data is None and method in ("POST", "PUT"):
        data = b""
    sent = dict(headers or {}) | ({"Content-Type": content_type} if content_type else {})
    request = urllib.request.Request(url, method=method, data=data, headers=sent)
    try:
        with _opener(url).open(request, timeout=timeout_s) as resp:
            return Answer(url, int(resp.status), resp.read(body_limit), str(resp.reason or ""))
    except urllib.error.HTTPError as exc:
        body = exc.read(body_limit) if exc.fp is not None else b""
        return Answer(url, exc.code, body, str(exc.reason))
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        return Answer(url, None, b"", f"{type(reason).__name__}: {reason}")


@dataclass(frozen=True)
class ServedModel:
    """One entry of ``/v1/models`` and the context it states: where the server states one.

    vLLM and SGLang give ``max_model_len``; llama.cpp gives ``meta.n_ctx`` (the context of
    one slot) there and in ``/props`` (:func:`props_context`). ``context_from`` names the field read.
    """

    id: str
    max_model_len: int | None = None
    context_from: str | None = None


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def served_models(payload: object) -> list[ServedModel]:
    """The models a ``/v1/models`` answer lists, with their context limit when given."""
    data = payload.get("data") if isinstance(payload, dict) else None
    models = []
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict) or item.get("id") is None:
            continue
        meta = item.get("meta")
        found = [
            (limit, name)
            for limit, name in (
                (_positive_int(item.get("max_model_len")), "max_model_len"),
                (_positive_int(meta.get("n_ctx")) if isinstance(meta, dict) else None, "meta.n_ctx"),
            )
            if limit is not None
        ]
        limit, name = found[0] if found else (None, None)
        models.append(ServedModel(str(item["id"]), limit, name))
    return models


def props_context(base_url: str, headers: Mapping[str, str] | None = None, timeout_s: float = 5.0) -> int | None:
    """The per-request context llama.cpp's ``/props`` states (``default_generation_settings.n_ctx``), if any."""
    answer = call(base_url.rstrip("/") + "/props", headers=headers, timeout_s=timeout_s)
    body = answer.json() if answer.ok else None
    settings = body.get("default_generation_settings") if isinstance(body, dict) else None
    return _positive_int(settings.get("n_ctx")) if isinstance(settings, dict) else None


def context_limit(
    base_url: str, model: str, served: list[ServedModel], headers: Mapping[str, str] | None = None
) -> tuple[int | None, str | None]:
    """The context the server states for ``model`` and the field it came from (None, None: it states none)."""
    entry = next((m for m in served if m.id == model), None)
    if entry is not None and entry.max_model_len is not None:
        return entry.max_model_len, entry.context_from
    limit = props_context(base_url, headers)
    return (limit, "/props n_ctx") if limit is not None else (None, None)


def check_server(
    base_url: str, model: str | None, timeout_s: float = 5.0, headers: Mapping[str, str] | None = None
) -> list[ServedModel]:
    """Fail within seconds, with a clear message, when nothing serves at ``base_url``.

    Returns the served models; an unknown ``model`` is an error listing them.
    """
    url = base_url.rstrip("/") + "/v1/models"
    answer = call(url, headers=headers, timeout_s=timeout_s)
    if answer.status is None:
        raise ServerUnreachableError(
            f"cannot reach {base_url} ({answer.reason}); check --base-url and that the server is up"
        )
    if answer.status in (401, 403):
        keyed = any(name.lower() == "authorization" for name in headers or {})
        hint = "check the key's value" if keyed else "pass --api-key-env NAME"
        raise ServerUnreachableError(f"{url} answered HTTP {answer.status}: the server wants an API key; {hint}")
    if answer.status != 200:
        raise ServerUnreachableError(f"{url} answered HTTP {answer.status}; {_base_url_hint(base_url)}")
    served = served_models(answer.json())
    names = [m.id for m in served]
    if model is not None and served and model not in names:
        raise ServerUnreachableError(f"--model {model!r} is not served at {base_url}; it serves: {', '.join(names)}")
    return served


def _base_url_hint(base_url: str) -> str:
    path = urlsplit(base_url).path.rstrip("/")
    if path.endswith("/v1"):
        trimmed = base_url.rstrip("/")[: -len("/v1")]
        return f"drop the trailing /v1 from the base URL (bakeoff adds /v1/... itself): use {trimmed}"
    return "is it an OpenAI-compatible server?"
