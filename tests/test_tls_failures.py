"""TLS handshakes that fail: the peer gets the alert, the log says why, the metric counts it.

A listener that refuses a client certificate (or gets none where one is
required) must answer with the TLS alert OpenSSL chose, so the client reports
``certificate required`` or ``unknown ca`` instead of a bare EOF; the gateway
logs OpenSSL's reason at WARNING, with the subject of the certificate it
refused, counts it in ``interchange_tls_handshake_failures_total{listener,
reason}`` and shows it in the status's hints (no ``[metrics]`` table needed).
A peer that hangs up during the handshake is information only.
"""

from __future__ import annotations

import datetime
import logging
import ssl
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from harness import host_port, running_gateway
from interchange_ndjson.client import NdjsonClient
from test_runtime_tls import tls_listener

from gateway.config.certs import create_ca, init_dir, issue
from gateway.ops.status import snapshot
from gateway.protocol.plugin import describe_error
from gateway.runtime.gateway import Gateway
from gateway.transports.tls import (
    HANDSHAKE_FAILURE_REASONS,
    TlsHandshakeError,
    describe_handshake_failure,
)

LISTENER = "secure"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("certs")
    paths = init_dir(d)
    other = tmp_path_factory.mktemp("other-ca")
    ca_cert, ca_key = create_ca(other, "Untrusted CA")
    issue(ca_cert, ca_key, other / "rogue.pem", other / "rogue.key", "rogue", client=True)
    paths["rogue_cert"], paths["rogue_key"] = other / "rogue.pem", other / "rogue.key"
    paths["expired_cert"], paths["expired_key"] = _expired_client(paths, d)
    return paths


def _expired_client(paths: dict[str, Path], directory: Path) -> tuple[Path, Path]:
    """A client certificate of the right CA that expired yesterday."""
    ca_cert = x509.load_pem_x509_certificate(paths["ca_cert"].read_bytes())
    ca_key = serialization.load_pem_private_key(paths["ca_key"].read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "expired")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=10))
        .not_valid_after(now - datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = directory / "expired.pem", directory / "expired.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def config(certs: dict[str, Path], **tls: str) -> dict[str, Any]:
    """The mutual-TLS ndjson listener of the TLS tests, with more time to shake hands."""
    listener = tls_listener(certs) | {"name": LISTENER, "handshake_timeout": "1s"}
    listener["tls"] |= tls
    return {"listeners": [listener]}


def client_context(
    certs: dict[str, Path],
    cert: str | None = None,
    maximum: ssl.TLSVersion | None = None,
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(certs["ca_cert"]))
    if cert is not None:
        ctx.load_cert_chain(str(certs[f"{cert}_cert"]), str(certs[f"{cert}_key"]))
    if maximum is not None:
        ctx.maximum_version = maximum
    return ctx


async def client_error(gw: Gateway, ctx: ssl.SSLContext) -> ssl.SSLError:
    """What a client with ``ctx`` gets: TLS 1.3 reports the server's verdict on the first read."""
    tcp = await trio.open_tcp_stream(*host_port(gw.addresses[LISTENER][0]))
    stream = trio.SSLStream(tcp, ctx, server_hostname="localhost")
    with trio.fail_after(5), pytest.raises(trio.BrokenResourceError) as raised:  # noqa: PT012
        try:
            await stream.do_handshake()
            await stream.send_all(b'{"op":"ping"}\n')
            data = await stream.receive_some()
            raise AssertionError(f"the handshake did not fail: got {data!r}")
        finally:
            await trio.aclose_forcefully(stream)
    cause = raised.value.__cause__
    assert isinstance(cause, ssl.SSLError), repr(cause)
    return cause


def failures(gw: Gateway, reason: str) -> float | None:
    return gw.metrics.value(
        "interchange_tls_handshake_failures_total", {"listener": LISTENER, "reason": reason}
    )


async def wait_for_failure(gw: Gateway, reason: str) -> None:
    with trio.fail_after(5):
        while failures(gw, reason) != 1:
            await trio.sleep(0.01)


# -- the peer hears why ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("cert", "maximum", "alert", "reason", "words"),
    [
        (
            None,
            None,
            "TLSV13_ALERT_CERTIFICATE_REQUIRED",
            "certificate_required",
            "peer did not return a certificate",
        ),
        (
            None,
            ssl.TLSVersion.TLSv1_2,
            "SSLV3_ALERT_HANDSHAKE_FAILURE",
            "certificate_required",
            "peer did not return a certificate",
        ),
        (
            "rogue",
            None,
            "TLSV1_ALERT_UNKNOWN_CA",
            "unknown_ca",
            "certificate verify failed: unable to get local issuer certificate",
        ),
        (
            "rogue",
            ssl.TLSVersion.TLSv1_2,
            "TLSV1_ALERT_UNKNOWN_CA",
            "unknown_ca",
            "certificate verify failed: unable to get local issuer certificate",
        ),
        (
            "expired",
            None,
            "SSLV3_ALERT_CERTIFICATE_EXPIRED",
            "expired",
            "certificate verify failed: certificate has expired",
        ),
    ],
    ids=["no-cert-tls13", "no-cert-tls12", "unknown-ca", "unknown-ca-tls12", "expired"],
)
async def test_a_refused_client_certificate_gets_its_alert_and_is_logged(
    certs: dict[str, Path],
    caplog: pytest.LogCaptureFixture,
    cert: str | None,
    maximum: ssl.TLSVersion | None,
    alert: str,
    reason: str,
    words: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    whose = f" (client certificate CN={cert})" if cert else ""
    async with running_gateway(config(certs)) as gw:
        assert not snapshot(gw)["hints"]
        error = await client_error(gw, client_context(certs, cert, maximum))
        assert alert in str(error), error  # the alert, not a bare EOF
        await wait_for_failure(gw, reason)
        # The status says so, though no [metrics] table is configured.
        [listener] = snapshot(gw)["listeners"]
        assert listener["tls_refusals"] == 1
        [hint] = snapshot(gw)["hints"]
        assert hint["level"] == "warning"
        assert hint["subject"] == f"listener {LISTENER}"
        assert hint["text"].startswith("1 TLS handshake refused since the start")
        assert "127.0.0.1:" in hint["text"]
        assert f"{whose}: {reason.replace('_', ' ')}: {words}" in hint["text"]
        # The listener still serves good clients.
        tcp = await trio.open_tcp_stream(*host_port(gw.addresses[LISTENER][0]))
        good = trio.SSLStream(tcp, client_context(certs, "client"), server_hostname="localhost")
        await good.do_handshake()
        await NdjsonClient(good).subscribe("logs")
        await good.aclose()
    assert failures(gw, reason) == 1
    [line] = [r for r in caplog.records if "TLS handshake" in r.msg]
    assert line.levelno == logging.WARNING
    assert line.getMessage().startswith(f"[{LISTENER} 127.0.0.1:")
    assert line.getMessage().endswith(
        f"TLS handshake failed ({reason.replace('_', ' ')}): {words}{whose}"
    )
    closed = [r.getMessage() for r in caplog.records if "connection closed after" in r.msg]
    assert any(f"(TLS handshake failed: {reason.replace('_', ' ')})" in m for m in closed), closed


async def test_protocol_version_is_refused_with_its_alert(certs: dict[str, Path]) -> None:
    async with running_gateway(config(certs, min_version="1.3")) as gw:
        ctx = client_context(certs, "client", ssl.TLSVersion.TLSv1_2)
        error = await client_error(gw, ctx)
        assert "PROTOCOL_VERSION" in str(error), error
        await wait_for_failure(gw, "protocol_version")


async def test_a_plaintext_client_is_counted_as_not_tls(
    certs: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    async with running_gateway(config(certs)) as gw:
        plain = await trio.open_tcp_stream(*host_port(gw.addresses[LISTENER][0]))
        await plain.send_all(b'{"op":"ping"}\n')
        with trio.fail_after(3):
            while await plain.receive_some():
                pass
        await wait_for_failure(gw, "not_tls")
    assert "does not speak TLS" in caplog.text


async def test_hang_up_and_silence_are_eof_and_timeout(certs: dict[str, Path]) -> None:
    async with running_gateway(config(certs)) as gw:
        address = host_port(gw.addresses[LISTENER][0])
        quitter = await trio.open_tcp_stream(*address)
        await quitter.send_all(b"\x16\x03\x01")  # the start of a ClientHello, then nothing
        await quitter.aclose()
        await wait_for_failure(gw, "eof")
        # A hang-up is no refusal: nothing for the status's hints.
        assert snapshot(gw)["listeners"][0]["tls_refusals"] == 0
        silent = await trio.open_tcp_stream(*address)
        with trio.fail_after(5):
            assert await silent.receive_some() == b""
        await wait_for_failure(gw, "timeout")
        refused = gw.metrics.value(
            "interchange_refused_connections_total",
            {"listener": LISTENER, "reason": "handshake_timeout"},
        )
        assert refused == 1


@pytest.mark.parametrize("close_notify", [True, False], ids=["close-notify", "ragged"])
async def test_a_client_that_closes_is_an_ordinary_close(
    certs: dict[str, Path], caplog: pytest.LogCaptureFixture, close_notify: bool
) -> None:
    """With or without ``close_notify``, a client closing after its exchange is no
    fault: nothing above DEBUG, and the closing line says the peer closed."""
    caplog.set_level(logging.DEBUG)
    async with running_gateway(config(certs)) as gw:
        tcp = await trio.open_tcp_stream(*host_port(gw.addresses[LISTENER][0]))
        tls = trio.SSLStream(tcp, client_context(certs, "client"), server_hostname="localhost")
        await tls.do_handshake()
        await NdjsonClient(tls).subscribe("logs")
        await (tls.aclose() if close_notify else tcp.aclose())
        with trio.fail_after(5):
            while not any("connection closed after" in r.msg for r in caplog.records):
                await trio.sleep(0.01)
    about = [r for r in caplog.records if r.getMessage().startswith(f"[{LISTENER} ")]
    assert [r.getMessage() for r in about if r.levelno > logging.DEBUG] == []
    closed = [r.getMessage() for r in about if "connection closed after" in r.msg]
    [line] = closed
    assert "(peer closed)" in line


# -- the upstream side -----------------------------------------------------------------


async def test_an_upstream_names_the_certificate_problem(
    certs: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The client role of a TLS upstream says what OpenSSL said, not EPERM or a class name."""
    caplog.set_level(logging.INFO)
    async with running_gateway(config(certs, client_auth="none")) as b:
        other_ca, _ = create_ca(tmp_path, "Some Other CA")
        upstream = {
            "name": "up",
            "protocol": "ndjson",
            "connect": b.addresses[LISTENER][0],
            "backoff_initial": "10s",
            "tls": {"ca": str(other_ca), "server_name": "localhost"},
        }
        async with running_gateway({"upstreams": [upstream]}):
            with trio.fail_after(5):
                while "cannot connect" not in caplog.text:
                    await trio.sleep(0.01)
            # The server saw the client's alert: the client did not trust its CA.
            await wait_for_failure(b, "unknown_ca")
    line = next(r.getMessage() for r in caplog.records if "cannot connect" in r.msg)
    assert "certificate verify failed: self-signed certificate in certificate chain" in line
    assert "EPERM" not in line


# -- reasons ------------------------------------------------------------------------------


def test_reasons_are_a_bounded_set_and_errors_are_described() -> None:
    eof = trio.BrokenResourceError()
    eof.__cause__ = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
    assert describe_handshake_failure(eof)[0] == "eof"
    reset = trio.BrokenResourceError()
    reset.__cause__ = ConnectionResetError(104, "Connection reset by peer")
    assert describe_handshake_failure(reset) == (
        "eof",
        "connection lost during the handshake (Connection reset by peer)",
    )
    assert describe_handshake_failure(trio.TooSlowError())[0] == "timeout"
    assert describe_handshake_failure(RuntimeError("odd")) == ("other", "odd")
    error = TlsHandshakeError("unknown_ca", "certificate verify failed: x")
    assert describe_handshake_failure(error) == ("unknown_ca", "certificate verify failed: x")
    assert describe_error(error) == "certificate verify failed: x"
    for reason in ("eof", "timeout", "other", "unknown_ca"):
        assert reason in HANDSHAKE_FAILURE_REASONS
