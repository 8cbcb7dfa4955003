"""The TLS layer: handshakes over loopback TCP, client certificates, identities, bad files."""

from __future__ import annotations

import hashlib
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gateway.config import certs
from gateway.core.model import PeerIdentity
from gateway.transports import TlsClientSettings, TlsServerSettings
from gateway.transports.tcp import transport as tcp
from gateway.transports.tls import TlsLayer, identity_from_der
from gateway.transports.tls import transport as tls


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    #: A CA nobody trusts, and a client certificate it signed.
    other_ca: Path
    rogue_cert: Path
    rogue_key: Path
    root: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    paths = certs.init_dir(root / "main")
    other_ca, other_key = certs.create_ca(root / "other", "Untrusted CA")
    rogue_cert, rogue_key = certs.issue(
        other_ca,
        other_key,
        root / "other" / "rogue.pem",
        root / "other" / "rogue.key",
        "interchange-client",
        sans=["interchange-client"],
        client=True,
    )
    return Pki(
        ca=paths["ca_cert"],
        server_cert=paths["server_cert"],
        server_key=paths["server_key"],
        client_cert=paths["client_cert"],
        client_key=paths["client_key"],
        other_ca=other_ca,
        rogue_cert=rogue_cert,
        rogue_key=rogue_key,
        root=root,
    )


def server_ctx(pki: Pki, **overrides: object) -> ssl.SSLContext:
    settings: dict[str, object] = {"cert": pki.server_cert, "key": pki.server_key}
    settings.update(overrides)
    return tls.server_context(TlsServerSettings(**settings))  # type: ignore[arg-type]


def client_ctx(pki: Pki, **overrides: object) -> ssl.SSLContext:
    settings: dict[str, object] = {"ca": pki.ca}
    settings.update(overrides)
    return tls.client_context(TlsClientSettings(**settings))  # type: ignore[arg-type]


@dataclass
class Outcome:
    server: trio.abc.Stream | None = None
    server_sees: PeerIdentity | None = None
    server_error: BaseException | None = None
    client: trio.abc.Stream | None = None
    client_sees: PeerIdentity | None = None
    client_error: BaseException | None = None

    async def aclose(self) -> None:
        for stream in (self.server, self.client):
            if stream is not None:
                await trio.aclose_forcefully(stream)


async def handshake(
    server_context: ssl.SSLContext,
    client_context: ssl.SSLContext,
    server_hostname: str | None = "localhost",
) -> Outcome:
    """Run both handshakes over a real loopback TCP connection; record results and errors."""
    out = Outcome()
    listeners = await tcp.listen("127.0.0.1:0")
    address = tcp.listener_name(listeners[0])

    async def serve() -> None:
        raw = await listeners[0].accept()
        try:
            out.server, out.server_sees = await tls.wrap_server(raw, server_context)
        except (trio.BrokenResourceError, ssl.SSLError) as exc:
            out.server_error = exc
            await trio.aclose_forcefully(raw)

    async def dial() -> None:
        raw = await tcp.connect(address)
        try:
            out.client, out.client_sees = await tls.wrap_client(
                raw, client_context, server_hostname
            )
        except (trio.BrokenResourceError, ssl.SSLError) as exc:
            out.client_error = exc
            await trio.aclose_forcefully(raw)

    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(serve)
                nursery.start_soon(dial)
    finally:
        await listeners[0].aclose()
    return out


async def exchange(out: Outcome) -> None:
    """Both sides of a finished handshake can talk."""
    assert out.server is not None
    assert out.client is not None
    with trio.fail_after(10):
        await out.client.send_all(b"hello")
        assert await out.server.receive_some() == b"hello"
        await out.server.send_all(b"world")
        assert await out.client.receive_some() == b"world"


async def client_is_cut_off(out: Outcome) -> bool:
    """After the server refused it, the client either failed its handshake or cannot read.

    (With TLS 1.3 the client finishes before the server checks its certificate.)
    """
    if out.client_error is not None:
        return True
    assert out.client is not None
    with trio.fail_after(10):
        try:
            await out.client.send_all(b"x")
            return await out.client.receive_some() == b""
        except (trio.BrokenResourceError, ssl.SSLError):
            return True


def is_tls_failure(exc: BaseException | None) -> bool:
    if isinstance(exc, ssl.SSLError):
        return True
    return isinstance(exc, trio.BrokenResourceError) and isinstance(
        exc.__cause__, ssl.SSLError | OSError
    )


def der_of(path: Path) -> bytes:
    return x509.load_pem_x509_certificate(path.read_bytes()).public_bytes(
        serialization.Encoding.DER
    )


def test_entry_point_instance() -> None:
    assert isinstance(tls, TlsLayer)
    assert (tls.name, tls.kind) == ("tls", "layer")


# --- handshakes -----------------------------------------------------------------------


async def test_handshake_and_server_identity(pki: Pki) -> None:
    out = await handshake(server_ctx(pki), client_ctx(pki))
    try:
        assert out.server_error is None
        assert out.client_error is None
        await exchange(out)
        assert out.server_sees is None  # client_auth="none": nothing asked, nothing claimed
        assert out.client_sees is not None
        assert out.client_sees.subject == "CN=localhost"
        assert out.client_sees.sans == ("DNS:localhost", "IP:127.0.0.1", "IP:::1")
        assert out.client_sees.fingerprint == hashlib.sha256(der_of(pki.server_cert)).hexdigest()
    finally:
        await out.aclose()


async def test_ip_address_as_server_name(pki: Pki) -> None:
    out = await handshake(server_ctx(pki), client_ctx(pki), server_hostname="127.0.0.1")
    try:
        assert out.client_error is None
        await exchange(out)
    finally:
        await out.aclose()


async def test_mutual_tls_identity(pki: Pki) -> None:
    out = await handshake(
        server_ctx(pki, client_ca=pki.ca, client_auth="required"),
        client_ctx(pki, cert=pki.client_cert, key=pki.client_key),
    )
    try:
        assert out.server_error is None
        await exchange(out)
        identity = out.server_sees
        assert identity is not None
        assert identity.subject == "CN=interchange-client"
        assert identity.common_name == "interchange-client"
        assert identity.sans == ("DNS:interchange-client",)
        assert identity.fingerprint == hashlib.sha256(der_of(pki.client_cert)).hexdigest()
        assert len(identity.fingerprint) == 64
    finally:
        await out.aclose()


async def test_required_client_cert_missing_is_rejected(pki: Pki) -> None:
    out = await handshake(
        server_ctx(pki, client_ca=pki.ca, client_auth="required"), client_ctx(pki)
    )
    try:
        assert out.server is None
        assert is_tls_failure(out.server_error)
        assert await client_is_cut_off(out)
    finally:
        await out.aclose()


async def test_optional_client_cert_missing_is_accepted(pki: Pki) -> None:
    out = await handshake(
        server_ctx(pki, client_ca=pki.ca, client_auth="optional"), client_ctx(pki)
    )
    try:
        assert out.server_error is None
        await exchange(out)
        assert out.server_sees is None
        assert out.client_sees is not None
    finally:
        await out.aclose()


async def test_optional_client_cert_present_gives_identity(pki: Pki) -> None:
    out = await handshake(
        server_ctx(pki, client_ca=pki.ca, client_auth="optional"),
        client_ctx(pki, cert=pki.client_cert, key=pki.client_key),
    )
    try:
        await exchange(out)
        assert out.server_sees is not None
        assert out.server_sees.common_name == "interchange-client"
    finally:
        await out.aclose()


@pytest.mark.parametrize("client_auth", ["required", "optional"])
async def test_client_cert_from_other_ca_is_rejected(pki: Pki, client_auth: str) -> None:
    out = await handshake(
        server_ctx(pki, client_ca=pki.ca, client_auth=client_auth),
        client_ctx(pki, cert=pki.rogue_cert, key=pki.rogue_key),
    )
    try:
        assert out.server is None
        assert out.server_sees is None
        assert is_tls_failure(out.server_error)
        assert await client_is_cut_off(out)
    finally:
        await out.aclose()


async def test_client_cert_ignored_when_not_asked(pki: Pki) -> None:
    out = await handshake(
        server_ctx(pki), client_ctx(pki, cert=pki.client_cert, key=pki.client_key)
    )
    try:
        await exchange(out)
        assert out.server_sees is None
    finally:
        await out.aclose()


async def test_client_not_trusting_server_ca_fails(pki: Pki) -> None:
    out = await handshake(server_ctx(pki), client_ctx(pki, ca=pki.other_ca))
    try:
        assert out.client is None
        assert is_tls_failure(out.client_error)
        cause = out.client_error.__cause__ or out.client_error
        assert isinstance(cause, ssl.SSLCertVerificationError)
    finally:
        await out.aclose()


async def test_system_store_does_not_trust_dev_ca(pki: Pki) -> None:
    out = await handshake(server_ctx(pki), tls.client_context(TlsClientSettings()))
    try:
        assert out.client is None
        assert is_tls_failure(out.client_error)
    finally:
        await out.aclose()


async def test_wrong_server_name_fails(pki: Pki) -> None:
    out = await handshake(server_ctx(pki), client_ctx(pki), server_hostname="example.com")
    try:
        assert out.client is None
        cause = out.client_error.__cause__ if out.client_error else None
        assert isinstance(cause, ssl.SSLCertVerificationError)
        assert "example.com" in str(cause)
    finally:
        await out.aclose()


async def test_verify_off_connects_without_identity(pki: Pki) -> None:
    out = await handshake(
        server_ctx(pki), client_ctx(pki, ca=pki.other_ca, verify=False), server_hostname=None
    )
    try:
        assert out.client_error is None
        await exchange(out)
        assert out.client_sees is None  # not verified: no identity claimed
    finally:
        await out.aclose()


async def test_verify_needs_a_server_name(pki: Pki) -> None:
    left, right = trio.testing.memory_stream_pair()
    with pytest.raises(ValueError, match="server_name"):
        await tls.wrap_client(left, client_ctx(pki), None)
    await left.aclose()
    await right.aclose()


async def test_min_version_13_refuses_tls12_client(pki: Pki) -> None:
    old_client = client_ctx(pki)
    old_client.maximum_version = ssl.TLSVersion.TLSv1_2
    control = await handshake(server_ctx(pki), old_client)
    await control.aclose()
    assert control.client_error is None  # the same client is fine against a 1.2 server
    out = await handshake(server_ctx(pki, min_version="1.3"), old_client)
    try:
        assert out.server is None
        assert is_tls_failure(out.server_error)
    finally:
        await out.aclose()


def tls11_client(pki: Pki) -> ssl.SSLContext:
    """A client that speaks TLS 1.1 at most, or skip if this OpenSSL cannot make one."""
    try:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(cafile=os.fspath(pki.ca))
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
        ctx.minimum_version = ssl.TLSVersion.TLSv1_1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
    except (ssl.SSLError, ValueError) as exc:
        pytest.skip(f"cannot build a TLS 1.1 client here: {exc}")
    return ctx


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
async def test_tls11_client_refused(pki: Pki) -> None:
    old_client = tls11_client(pki)
    # Control: a server that does allow TLS 1.1 must accept this client, or the
    # refusal below would prove nothing about our server.
    lax = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        lax.set_ciphers("DEFAULT:@SECLEVEL=0")
        lax.minimum_version = ssl.TLSVersion.TLSv1_1
    except (ssl.SSLError, ValueError) as exc:
        pytest.skip(f"cannot build a TLS 1.1 server here: {exc}")
    lax.load_cert_chain(pki.server_cert, pki.server_key)
    control = await handshake(lax, old_client)
    await control.aclose()
    if control.client_error is not None or control.server_error is not None:
        pytest.skip("this OpenSSL cannot complete a TLS 1.1 handshake at all")

    out = await handshake(server_ctx(pki), old_client)
    try:
        assert out.server is None
        assert is_tls_failure(out.server_error)
        assert out.client is None
    finally:
        await out.aclose()


@pytest.mark.parametrize("key_format", ["pkcs1", "pkcs8"])
async def test_rsa_key_formats(pki: Pki, tmp_path: Path, key_format: str) -> None:
    cert_path, key_path = certs.issue(
        pki.root / "main" / "ca.pem",
        pki.root / "main" / "ca.key",
        tmp_path / "rsa.pem",
        tmp_path / "rsa.key",
        "localhost",
        sans=["localhost"],
        key_type="rsa",
    )
    if key_format == "pkcs1":
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        assert key_path.read_bytes().startswith(b"-----BEGIN RSA PRIVATE KEY-----")
    out = await handshake(server_ctx(pki, cert=cert_path, key=key_path), client_ctx(pki))
    try:
        await exchange(out)
        assert out.client_sees is not None
        assert out.client_sees.fingerprint == hashlib.sha256(der_of(cert_path)).hexdigest()
    finally:
        await out.aclose()


# --- identity_from_der -----------------------------------------------------------------


def test_identity_from_der_all_san_kinds(tmp_path: Path) -> None:
    ca_cert, ca_key = certs.create_ca(tmp_path)
    cert_path, _ = certs.issue(
        ca_cert,
        ca_key,
        tmp_path / "l.pem",
        tmp_path / "l.key",
        "svc",
        sans=["svc.local", "10.0.0.1", "::1", "URI:spiffe://ex/svc", "email:ops@example.org"],
    )
    der = der_of(cert_path)
    identity = identity_from_der(der)
    assert identity == PeerIdentity(
        subject="CN=svc",
        sans=(
            "DNS:svc.local",
            "IP:10.0.0.1",
            "IP:::1",
            "URI:spiffe://ex/svc",
            "email:ops@example.org",
        ),
        fingerprint=hashlib.sha256(der).hexdigest(),
    )


def test_identity_from_der_without_sans(tmp_path: Path) -> None:
    ca_cert, _ = certs.create_ca(tmp_path, "Some CA")
    identity = identity_from_der(der_of(ca_cert))
    assert identity.sans == ()
    assert identity.subject == "O=Interchange development,CN=Some CA"
    assert identity.common_name == "Some CA"


# --- bad settings and files -----------------------------------------------------------


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def encrypted_copy(key: Path, dest: Path) -> Path:
    loaded = serialization.load_pem_private_key(key.read_bytes(), password=None)
    return write(
        dest,
        loaded.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        ),
    )


BROKEN_PEM = b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n"

ServerCase = Callable[[Pki, Path], tuple[dict[str, object], Path, str]]

SERVER_CASES: dict[str, ServerCase] = {
    "cert missing": lambda p, t: ({"cert": t / "nope.pem"}, t / "nope.pem", "does not exist"),
    "key missing": lambda p, t: ({"key": t / "nope.key"}, t / "nope.key", "does not exist"),
    "cert is a directory": lambda p, t: ({"cert": t}, t, "not a regular file"),
    "cert not PEM": lambda p, t: (
        {"cert": write(t / "junk.pem", b"hello")},
        t / "junk.pem",
        "not a PEM file",
    ),
    "cert holds a key": lambda p, t: ({"cert": p.server_key}, p.server_key, "no PEM certificate"),
    "key holds a cert": lambda p, t: ({"key": p.server_cert}, p.server_cert, "no PEM private key"),
    "cert corrupt": lambda p, t: (
        {"cert": write(t / "bad.pem", BROKEN_PEM)},
        t / "bad.pem",
        "invalid PEM certificate",
    ),
    "key does not match": lambda p, t: ({"key": p.client_key}, p.client_key, "does not match"),
    "key encrypted": lambda p, t: (
        {"key": encrypted_copy(p.server_key, t / "enc.key")},
        t / "enc.key",
        "encrypted",
    ),
    "client_ca missing": lambda p, t: (
        {"client_ca": t / "ca-nope.pem", "client_auth": "required"},
        t / "ca-nope.pem",
        "does not exist",
    ),
    "client_ca holds a key": lambda p, t: (
        {"client_ca": p.server_key, "client_auth": "optional"},
        p.server_key,
        "no PEM CA certificate",
    ),
}


@pytest.mark.parametrize("case", SERVER_CASES)
def test_server_file_errors_name_the_path(pki: Pki, tmp_path: Path, case: str) -> None:
    overrides, bad_path, problem = SERVER_CASES[case](pki, tmp_path)
    with pytest.raises(ValueError) as info:
        server_ctx(pki, **overrides)
    message = str(info.value)
    assert str(bad_path) in message
    assert problem in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of their mode")
def test_unreadable_key(pki: Pki, tmp_path: Path) -> None:
    key = write(tmp_path / "locked.key", pki.server_key.read_bytes())
    key.chmod(0)
    with pytest.raises(ValueError, match="cannot read") as info:
        server_ctx(pki, key=key)
    assert str(key) in str(info.value)


def test_unreadable_key_reported(pki: Pki, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = write(tmp_path / "locked.key", pki.server_key.read_bytes())
    real_read_bytes = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self == key:
            raise PermissionError(13, "Permission denied", str(self))
        return real_read_bytes(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(ValueError, match="cannot read file") as info:
        server_ctx(pki, key=key)
    assert str(key) in str(info.value)


@pytest.mark.parametrize("client_auth", ["optional", "required"])
def test_client_auth_needs_client_ca(pki: Pki, client_auth: str) -> None:
    with pytest.raises(ValueError, match="needs client_ca"):
        server_ctx(pki, client_auth=client_auth)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"client_auth": "sometimes"}, "client_auth must be"),
        ({"min_version": "1.1"}, "min_version must be '1.2' or '1.3'"),
    ],
)
def test_bad_server_settings(pki: Pki, overrides: dict[str, object], fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        server_ctx(pki, **overrides)


@pytest.mark.parametrize(
    ("client_auth", "mode"),
    [("none", ssl.CERT_NONE), ("optional", ssl.CERT_OPTIONAL), ("required", ssl.CERT_REQUIRED)],
)
def test_server_context_modes(pki: Pki, client_auth: str, mode: ssl.VerifyMode) -> None:
    ctx = server_ctx(pki, client_ca=pki.ca, client_auth=client_auth)
    assert ctx.verify_mode == mode
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    assert server_ctx(pki, min_version="1.3").minimum_version == ssl.TLSVersion.TLSv1_3


def test_client_context_defaults(pki: Pki) -> None:
    ctx = client_ctx(pki)
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname is True
    assert ctx.minimum_version == ssl.TLSVersion.TLSv1_2
    lax = client_ctx(pki, verify=False)
    assert lax.verify_mode == ssl.CERT_NONE
    assert lax.check_hostname is False


ClientCase = Callable[[Pki, Path], tuple[dict[str, object], Path | None, str]]

CLIENT_CASES: dict[str, ClientCase] = {
    "ca missing": lambda p, t: ({"ca": t / "ca.pem"}, t / "ca.pem", "does not exist"),
    "ca not PEM": lambda p, t: ({"ca": write(t / "ca.pem", b"\x00\x01")}, t / "ca.pem", "PEM"),
    "cert missing": lambda p, t: (
        {"cert": t / "c.pem", "key": p.client_key},
        t / "c.pem",
        "does not exist",
    ),
    "key missing": lambda p, t: (
        {"cert": p.client_cert, "key": t / "c.key"},
        t / "c.key",
        "does not exist",
    ),
    "key does not match": lambda p, t: (
        {"cert": p.client_cert, "key": p.server_key},
        p.server_key,
        "does not match",
    ),
    "cert without key": lambda p, t: ({"cert": p.client_cert}, p.client_cert, "no PEM private key"),
    "key without cert": lambda p, t: ({"key": p.client_key}, None, "key is set but cert is not"),
    "bad min_version": lambda p, t: ({"min_version": "TLSv1"}, None, "min_version must be"),
}


@pytest.mark.parametrize("case", CLIENT_CASES)
def test_client_file_errors_name_the_path(pki: Pki, tmp_path: Path, case: str) -> None:
    overrides, bad_path, problem = CLIENT_CASES[case](pki, tmp_path)
    with pytest.raises(ValueError) as info:
        client_ctx(pki, **overrides)
    message = str(info.value)
    if bad_path is not None:
        assert str(bad_path) in message
    assert problem in message


async def test_cert_and_key_in_one_file(pki: Pki, tmp_path: Path) -> None:
    bundle = write(
        tmp_path / "both.pem", pki.client_cert.read_bytes() + pki.client_key.read_bytes()
    )
    out = await handshake(
        server_ctx(pki, client_ca=pki.ca, client_auth="required"), client_ctx(pki, cert=bundle)
    )
    try:
        await exchange(out)
        assert out.server_sees is not None
        assert out.server_sees.common_name == "interchange-client"
    finally:
        await out.aclose()


async def test_start_tls_closes_the_stream_when_the_handshake_fails() -> None:
    """A client whose handshake fails gets the error, not a socket left open."""
    import ssl as ssl_module

    from gateway.sdk import start_tls

    client, server = trio.testing.memory_stream_pair()
    await server.send_all(b"HTTP/1.1 400 Bad Request\r\n\r\n")  # not TLS
    context = ssl_module.create_default_context()
    with pytest.raises(trio.BrokenResourceError):
        await start_tls(client, context, "localhost")
    with pytest.raises(trio.ClosedResourceError):
        await client.send_all(b"x")
