"""The control-plane client and the streaming client over TLS, with one proxy/TLS/auth policy.

A local HTTPS reference server with a self-signed certificate (made here, with
``cryptography`` when installed, else the ``openssl`` command) proves that both clients
verify certificates the same way, trust a private CA given by ``SSL_CERT_FILE``, and
ignore environment proxies; a TLS peer that never answers the handshake proves the
streaming client's connect timeout is its own, not the request's.
"""

from __future__ import annotations

import asyncio
import datetime
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from bakeoff.errors import ServerUnreachableError, SpecError
from bakeoff.measure import control
from bakeoff.measure.client import ClientSettings, StreamingClient
from bakeoff.ref.options import MODEL, RefOptions
from bakeoff.ref.server import ReferenceServer
from bakeoff.results.records import RequestRecord
from bakeoff.serving.process import free_port, probe
from bakeoff.serving.reference import serve_reference
from bakeoff.workloads.plans import PlannedRequest


def _self_signed(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    try:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID
    except ImportError:
        if shutil.which("openssl") is None:
            pytest.skip("neither the cryptography package nor the openssl command is available to make a certificate")
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
             "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
        return cert, key
    import ipaddress

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    built = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(built.public_bytes(serialization.Encoding.PEM))
    key.write_bytes(
        private.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert, key


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The reference server's app behind TLS, in a thread of this process; yields (base URL, cert)."""
    cert, key = _self_signed(tmp_path_factory.mktemp("tls"))
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(ReferenceServer(RefOptions(ttft_ms=5, itl_ms=1)).app(), access_log=None)
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(runner.setup())
        loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port, ssl_context=context).start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10), "TLS reference server did not start"
    try:
        yield f"https://localhost:{port}", cert
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def _stream(settings: ClientSettings, max_tokens: int = 8) -> RequestRecord:
    async def main() -> RequestRecord:
        async with StreamingClient(settings) as client:
            item = PlannedRequest(1, "completions", max_tokens, prompt="hello there", prompt_tokens=2)
            return await client.send(item, RequestRecord(request_id=1))

    return asyncio.run(main())


def test_streaming_and_control_clients_over_https_trust_a_private_ca(
    tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cert = tls_server
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    record = _stream(ClientSettings(base_url=url, model=MODEL))
    assert record.ok, record.error
    assert record.completion_tokens == 8 and len(record.chunk_ns) == 8
    served = control.check_server(url, MODEL)
    assert [m.id for m in served] == [MODEL]
    assert probe(url + "/health") == 200


def test_an_untrusted_certificate_fails_both_clients_the_same_way(
    tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = tls_server
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    record = _stream(ClientSettings(base_url=url, model=MODEL))
    assert record.error_kind == "connect" and "CERTIFICATE_VERIFY_FAILED" in (record.error or "")
    answer = control.call(url + "/health")
    assert answer.status is None and "CERTIFICATE_VERIFY_FAILED" in answer.reason
    with pytest.raises(ServerUnreachableError, match="cannot reach"):
        control.check_server(url, MODEL)


def test_the_connect_timeout_is_separate_from_the_request_timeout(tmp_path: Path) -> None:
    # A peer that accepts TCP but never answers the TLS handshake: only the connect timeout ends it.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        settings = ClientSettings(
            base_url=f"https://127.0.0.1:{port}", model=MODEL, request_timeout_s=60, connect_timeout_s=0.3
        )
        started = time.monotonic()
        record = _stream(settings)
    assert time.monotonic() - started < 5
    assert record.error_kind == "connect" and "timed out after 0.3 s" in (record.error or "")


def test_environment_proxies_are_ignored_like_the_streaming_client_does(monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: a proxied request could not succeed
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(name, dead)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    with serve_reference(api_key_env=None) as url:
        assert control.call(url + "/health").status == 200
        assert control.call(url + "/no-such-page").status == 404


def test_control_headers_carry_the_key_and_are_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAKEOFF_TEST_KEY", "s3cret")
    with serve_reference(api_key_env="BAKEOFF_TEST_KEY") as url:
        assert control.call(url + "/health").status == 401
        assert control.call(url + "/health", headers={"Authorization": "Bearer s3cret"}).status == 200
        with pytest.raises(ServerUnreachableError, match="wants an API key; pass --api-key-env"):
            control.check_server(url, MODEL)
    with pytest.raises(SpecError, match="line break"):
        control.call("http://127.0.0.1:9/", headers={"X-Bad": "a\r\nb"})


def test_a_base_url_ending_in_v1_is_told_to_drop_it() -> None:
    with serve_reference() as url, pytest.raises(ServerUnreachableError) as err:
        control.check_server(url + "/v1", MODEL)
    assert "HTTP 404" in str(err.value) and "drop the trailing /v1" in str(err.value) and url in str(err.value)


def test_served_models_reads_the_context_limit_where_given() -> None:
    payload = {
        "data": [
            {"id": "a", "max_model_len": 2048},
            {"id": "b"},
            {"id": "c", "max_model_len": True},
            {"id": "d", "meta": {"n_ctx": 8192, "n_ctx_train": 131072}},  # llama.cpp
            "junk",
        ]
    }
    assert control.served_models(payload) == [
        control.ServedModel("a", 2048, "max_model_len"),
        control.ServedModel("b", None),
        control.ServedModel("c", None),
        control.ServedModel("d", 8192, "meta.n_ctx"),
    ]
    assert control.served_models(["not", "a", "dict"]) == []
