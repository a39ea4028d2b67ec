"""The headers every request to one server carries: its API key and any extra headers.

A server started with an API key (vLLM and SGLang ``--api-key``, llama.cpp ``--api-key``,
a gateway in front of a cluster) wants ``Authorization: Bearer <key>`` on its requests.
bakeoff takes the key only from an environment variable the user names
(``bakeoff bench --api-key-env NAME``, ``api_key_env: NAME`` on a campaign server) and
sends it on every generation request, health check and metrics scrape. The key is never
written anywhere: what bakeoff records about headers is their names
(:func:`header_names`), and a missing variable is an error naming it before any request.

Extra headers (``--header K:V``, ``headers: {}``) go out verbatim after validation. The
client writes HTTP/1.1 by hand, so a name that is not an HTTP token, a value holding a
line break, or a header that frames the message (``Content-Length``...) is refused here
rather than corrupting the request stream.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from bakeoff.errors import SpecError

AUTHORIZATION = "Authorization"
# Set by the client itself; a second copy would break the framing or the routing.
RESERVED = frozenset({"host", "content-length", "content-type", "transfer-encoding", "connection"})
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def header_problem(name: str, value: str) -> str | None:
    """Why ``name: value`` cannot be sent, or None when it can."""
    if not _TOKEN.match(name):
        return f"header name {name!r} is not a valid HTTP header name (letters, digits and -_.!#$%&'*+^`|~)"
    if name.lower() in RESERVED:
        return f"header {name!r} is set by bakeoff itself and cannot be overridden"
    if any(ch in value for ch in "\r\n\0"):
        return f"header {name!r} has a line break or NUL in its value"
    if not value.isascii():
        return f"header {name!r} has non-ASCII characters in its value"
    return None


def env_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be an environment variable name, or None when it can."""
    if _ENV_NAME.match(name):
        return None
    # The value is not echoed: a key pasted here by mistake must not reach a terminal log.
    return "not an environment variable name (letters, digits and _, not starting with a digit)"


def check_headers(headers: Mapping[str, str], where: str) -> None:
    """Raise :class:`SpecError` naming ``where`` for the first header that cannot be sent."""
    for name, value in headers.items():
        problem = header_problem(name, value)
        if problem is not None:
            raise SpecError(f"{where}: {problem}")


def parse_header_arg(text: str) -> tuple[str, str]:
    """``"Name: value"`` (as curl takes it) -> ``("Name", "value")``."""
    name, sep, value = text.partition(":")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        raise SpecError(f"--header {text!r}: write it as NAME:VALUE, e.g. --header 'X-Team: search'")
    problem = header_problem(name, value)
    if problem is not None:
        raise SpecError(f"--header {text!r}: {problem}")
    return name, value


def request_headers(
    api_key_env: str | None,
    extra: Mapping[str, str] | None = None,
    *,
    where: str = "--api-key-env",
    where_headers: str = "--header",
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The headers for every request: ``extra`` plus the bearer key read from ``api_key_env``.

    ``where`` and ``where_headers`` name the settings in errors (``servers[1].api_key_env``,
    ``servers[1].headers``). A variable that is unset or empty is an error: benchmarking an
    authenticated server without its key would only measure 401 answers.
    """
    headers = dict(extra or {})
    check_headers(headers, where_headers)
    if api_key_env is None:
        return headers
    problem = env_name_problem(api_key_env)
    if problem is not None:
        raise SpecError(f"{where}: {problem}")
    if any(name.lower() == AUTHORIZATION.lower() for name in headers):
        raise SpecError(f"{where}: {where_headers} also sets Authorization; keep one of them")
    key = (os.environ if environ is None else environ).get(api_key_env, "")
    if not key:
        raise SpecError(
            f"{where}: environment variable {api_key_env} is not set or empty; "
            f"export {api_key_env}=<the server's API key> and retry"
        )
    if any(ch in key for ch in "\r\n\0") or not key.isascii():
        raise SpecError(f"{where}: the value of {api_key_env} is not a bare ASCII key; set it to the key alone")
    headers[AUTHORIZATION] = f"Bearer {key.strip()}"
    return headers


def header_names(headers: Mapping[str, str]) -> list[str]:
    """What a run records about its headers: the names only, since values may be secrets."""
    return sorted(headers)
