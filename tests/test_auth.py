"""API keys and extra headers: validated before anything is sent, the key read only from the environment."""

from __future__ import annotations

import asyncio

import pytest

from bakeoff.errors import SpecError
from bakeoff.measure.auth import check_headers, header_names, parse_header_arg, request_headers
from bakeoff.measure.client import ClientSettings, StreamingClient, header_block
from bakeoff.workloads.plans import PlannedRequest


def test_bearer_key_comes_from_the_named_variable() -> None:
    headers = request_headers("SERVE_KEY", {"X-Team": "search"}, environ={"SERVE_KEY": "s3cret"})
    assert headers == {"X-Team": "search", "Authorization": "Bearer s3cret"}


def test_no_key_variable_sends_only_the_extra_headers() -> None:
    assert request_headers(None, {"X-Team": "a"}, environ={}) == {"X-Team": "a"}


@pytest.mark.parametrize("environ", [{}, {"SERVE_KEY": ""}])
def test_missing_or_empty_key_variable_names_it_and_the_setting(environ: dict[str, str]) -> None:
    with pytest.raises(SpecError) as err:
        request_headers("SERVE_KEY", where="servers[1].api_key_env", environ=environ)
    assert "servers[1].api_key_env" in str(err.value) and "SERVE_KEY" in str(err.value)
    assert "export SERVE_KEY=" in str(err.value)


def test_key_setting_that_is_not_a_variable_name_is_refused() -> None:
    with pytest.raises(SpecError, match="not an environment variable name"):
        request_headers("sk-live-123", environ={"sk-live-123": "x"})


def test_key_and_an_authorization_header_conflict() -> None:
    with pytest.raises(SpecError, match="also sets Authorization"):
        request_headers("K", {"authorization": "Bearer other"}, environ={"K": "v"})


def test_key_with_a_line_break_is_refused_without_echoing_it() -> None:
    with pytest.raises(SpecError) as err:
        request_headers("K", environ={"K": "abc\r\nX-Injected: 1"})
    assert "abc" not in str(err.value) and "Injected" not in str(err.value)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("Bad Name", "v", "not a valid HTTP header name"),
        ("X-A", "one\r\nX-B: two", "line break"),
        ("Content-Length", "5", "set by bakeoff itself"),
        ("host", "elsewhere", "set by bakeoff itself"),
        ("X-A", "caf\u00e9", "non-ASCII"),
    ],
)
def test_headers_that_would_corrupt_the_request_are_refused(name: str, value: str, message: str) -> None:
    with pytest.raises(SpecError, match=message):
        check_headers({name: value}, "--header")


def test_header_argument_is_split_at_the_first_colon() -> None:
    assert parse_header_arg('x-bakeoff-ref: {"eos_after": 4}') == ("x-bakeoff-ref", '{"eos_after": 4}')
    with pytest.raises(SpecError, match="NAME:VALUE"):
        parse_header_arg("no-colon-here")


def test_headers_are_written_into_every_request_head() -> None:
    block = header_block({"Authorization": "Bearer k", "X-Team": "a"})
    assert block == "Authorization: Bearer k\r\nX-Team: a\r\n"

    async def head() -> bytes:
        settings = ClientSettings(base_url="http://127.0.0.1:9", model="m", headers={"Authorization": "Bearer k"})
        async with StreamingClient(settings) as client:
            return client._request_bytes(PlannedRequest(0, "completions", 4, prompt="hi"))

    raw = asyncio.run(head())
    head_text, _, _ = raw.partition(b"\r\n\r\n")
    assert b"\r\nAuthorization: Bearer k\r\n" in head_text + b"\r\n"


def test_client_refuses_a_bad_header_at_construction() -> None:
    with pytest.raises(SpecError, match="line break"):
        StreamingClient(ClientSettings(base_url="http://127.0.0.1:9", model="m", headers={"X": "a\nb"}))


def test_only_header_names_are_recorded() -> None:
    assert header_names({"Authorization": "Bearer k", "X-Team": "a"}) == ["Authorization", "X-Team"]
