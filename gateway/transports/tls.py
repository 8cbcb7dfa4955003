"""TLS as a stream layer: contexts from settings, handshakes, peer identities.

Contexts are built once per listener or upstream; every file problem becomes a
``ValueError`` naming the setting, the path and what is wrong, so ``gateway
check`` and start-up can report it in one line. Handshake timeouts and closing
the stream after a failed handshake are the caller's business.

A failed handshake raises :class:`TlsHandshakeError` with what went wrong in
words (``certificate verify failed: unable to get local issuer
certificate``) and as one of a bounded set of reasons for metrics
(:func:`describe_handshake_failure`). Before it raises, the alert OpenSSL
wrote for the peer (``certificate required``, ``unknown ca``…) is sent and
the connection half-closed, so the peer learns why instead of seeing a bare
EOF: ``trio.SSLStream`` drops that alert when the handshake fails.

When the client presented a certificate that was refused (an unknown CA, an
expired certificate), the error carries its subject, so the log line says
*whose* certificate it was. OpenSSL keeps no refused certificate, so a
listener that asks for client certificates watches the handshake messages it
reads (``SSLContext._msg_callback``) and remembers the first certificate of
the client's Certificate message; the callback returns at once for every
other record.
"""

from __future__ import annotations

import hashlib
import os
import re
import ssl
import weakref
from pathlib import Path
from typing import NoReturn

import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gateway.core.model import PeerIdentity
from gateway.transports.base import StreamLayer, TlsClientSettings, TlsServerSettings

__all__ = [
    "HANDSHAKE_FAILURE_REASONS",
    "TlsHandshakeError",
    "TlsLayer",
    "TlsServerStream",
    "describe_handshake_failure",
    "identity_from_der",
    "ssl_error_words",
    "start_tls",
    "transport",
]

_VERSIONS = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}
_VERIFY_MODES = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


def identity_from_der(der: bytes) -> PeerIdentity:
    """Describe a DER certificate: RFC 4514 subject, typed SANs, SHA-256 fingerprint."""
    cert = x509.load_der_x509_certificate(der)
    sans: list[str] = []
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        pass
    else:
        for name in ext.value:
            if isinstance(name, x509.DNSName):
                sans.append(f"DNS:{name.value}")
            elif isinstance(name, x509.IPAddress):
                sans.append(f"IP:{name.value}")
            elif isinstance(name, x509.UniformResourceIdentifier):
                sans.append(f"URI:{name.value}")
            elif isinstance(name, x509.RFC822Name):
                sans.append(f"email:{name.value}")
    return PeerIdentity(
        subject=cert.subject.rfc4514_string(),
        sans=tuple(sans),
        fingerprint=hashlib.sha256(der).hexdigest(),
    )


class TlsLayer(StreamLayer):
    """TLS 1.2+ over any stream, with optional or required client certificates."""

    name = "tls"
    role = "tls"

    def server_context(self, settings: TlsServerSettings) -> ssl.SSLContext:
        """Server context: our chain, minimum version, and client-certificate policy."""
        if settings.client_auth not in _VERIFY_MODES:
            raise ValueError(
                f"tls client_auth must be 'none', 'optional' or 'required', "
                f"not {settings.client_auth!r}"
            )
        if settings.client_auth != "none" and settings.client_ca is None:
            raise ValueError(
                f"tls client_auth={settings.client_auth!r} needs client_ca "
                "(the CA bundle that signs client certificates)"
            )
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = _min_version(settings.min_version)
        ctx.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE
        _load_chain(ctx, "cert", Path(settings.cert), "key", Path(settings.key))
        if settings.client_ca is not None:
            _load_ca(ctx, "client_ca", Path(settings.client_ca))
        ctx.verify_mode = _VERIFY_MODES[settings.client_auth]
        if settings.client_auth != "none":
            ctx._msg_callback = _note_client_certificate  # type: ignore[attr-defined]
        return ctx

    def client_context(self, settings: TlsClientSettings) -> ssl.SSLContext:
        """Client context: verification (own CA or system store) and an optional client cert.

        With ``verify`` the host name is checked too, so ``wrap_client`` then
        needs a server name (the address host or ``server_name``).
        """
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = _min_version(settings.min_version)
        ctx.options |= ssl.OP_NO_COMPRESSION
        if settings.verify:
            ctx.check_hostname = True
            ctx.verify_mode = ssl.CERT_REQUIRED
            if settings.ca is not None:
                _load_ca(ctx, "ca", Path(settings.ca))
            else:
                ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
        else:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            if settings.ca is not None:
                _check_file("ca", Path(settings.ca), b"CERTIFICATE-----", "certificate")
        if settings.key is not None and settings.cert is None:
            raise ValueError("tls key is set but cert is not: a client key needs its certificate")
        if settings.cert is not None:
            cert = Path(settings.cert)
            if settings.key is not None:
                _load_chain(ctx, "cert", cert, "key", Path(settings.key))
            else:
                _load_chain(ctx, "cert", cert, "cert", cert)
        return ctx

    async def wrap_server(
        self, stream: trio.abc.Stream, context: ssl.SSLContext
    ) -> tuple[trio.abc.Stream, PeerIdentity | None]:
        """Run the server handshake; the identity is the verified client certificate, if any.

        Raises ``trio.BrokenResourceError`` when the handshake fails.
        """
        tls = trio.SSLStream(stream, context, server_side=True)
        await _handshake(tls, stream)
        return TlsServerStream(tls), _verified_identity(tls, context)

    async def wrap_client(
        self, stream: trio.abc.Stream, context: ssl.SSLContext, server_hostname: str | None
    ) -> tuple[trio.abc.Stream, PeerIdentity | None]:
        """Run the client handshake; the identity is the server's, when it was verified."""
        if context.check_hostname and not server_hostname:
            raise ValueError(
                "tls verification checks the server's name, but none is known: "
                "set server_name to a name in the server certificate"
            )
        hostname = _sni_name(server_hostname) if server_hostname else None
        tls = trio.SSLStream(stream, context, server_hostname=hostname)
        await _handshake(tls, stream)
        return tls, _verified_identity(tls, context)


class TlsServerStream(trio.abc.Stream):
    """A server's TLS stream on which a client's close without ``close_notify`` is EOF.

    Many TLS clients close the socket without sending ``close_notify`` (Python's
    ``ssl`` sockets, a process that exits); ``trio.SSLStream`` reports that as
    ``BrokenResourceError`` ("EOF occurred in violation of protocol"), which
    would make every such close a lost connection. Here it reads as the end of
    the stream, as a TCP close does: the protocol sees its EOF and judges
    whether a unit was cut short, as it does over plain TCP (the truncation
    ``close_notify`` guards against is one a protocol with framed units
    detects itself). Our own closes still send ``close_notify``.
    """

    def __init__(self, tls: trio.SSLStream[trio.abc.Stream]) -> None:
        self.tls = tls
        #: What is under it, for the socket's options and addresses.
        self.transport_stream = tls
        self._eof = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._eof:
            await trio.lowlevel.checkpoint()
            return b""
        try:
            return await self.tls.receive_some(max_bytes)
        except trio.BrokenResourceError as e:
            if not _ragged_eof(e.__cause__):
                raise
            self._eof = True
            return b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.tls.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.tls.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.tls.aclose()


def _ragged_eof(error: BaseException | None) -> bool:
    """The peer closed its socket without ``close_notify`` (and nothing else went wrong)."""
    return isinstance(error, ssl.SSLEOFError) or (
        isinstance(error, ssl.SSLError) and error.reason == "UNEXPECTED_EOF_WHILE_READING"
    )


#: ``interchange_tls_handshake_failures_total``'s ``reason``: a bounded set.
HANDSHAKE_FAILURE_REASONS = (
    "unknown_ca",
    "bad_certificate",
    "certificate_required",
    "expired",
    "protocol_version",
    "no_shared_cipher",
    "not_tls",
    "timeout",
    "eof",
    "other",
)

#: How long a failed handshake may take to deliver its alert and see the peer close.
ALERT_LINGER = 0.5
#: Bytes read (and dropped) at most while lingering, so that closing does not reset.
_LINGER_BYTES = 64 * 1024

#: OpenSSL's X509_V_ERR_* codes of a certificate we could not verify.
_VERIFY_REASONS = {
    2: "unknown_ca",  # unable to get issuer certificate
    18: "unknown_ca",  # self-signed certificate
    19: "unknown_ca",  # self-signed certificate in certificate chain
    20: "unknown_ca",  # unable to get local issuer certificate
    21: "unknown_ca",  # unable to verify the first certificate
    9: "expired",  # certificate is not yet valid
    10: "expired",  # certificate has expired
}

#: OpenSSL's reason codes: our own verdicts, then alerts the peer sent us.
_SSL_REASONS = {
    "PEER_DID_NOT_RETURN_A_CERTIFICATE": "certificate_required",
    "NO_SHARED_CIPHER": "no_shared_cipher",
    "NO_CIPHERS_AVAILABLE": "no_shared_cipher",
    "UNSUPPORTED_PROTOCOL": "protocol_version",
    "NO_PROTOCOLS_AVAILABLE": "protocol_version",
    "WRONG_SSL_VERSION": "protocol_version",
    "VERSION_TOO_LOW": "protocol_version",
    "VERSION_TOO_HIGH": "protocol_version",
    "WRONG_VERSION_NUMBER": "not_tls",
    "HTTP_REQUEST": "not_tls",
    "HTTPS_PROXY_REQUEST": "not_tls",
    "UNKNOWN_PROTOCOL": "not_tls",
    "PACKET_LENGTH_TOO_LONG": "not_tls",
    "RECORD_LAYER_FAILURE": "not_tls",
    "UNEXPECTED_EOF_WHILE_READING": "eof",
    "TLSV1_ALERT_UNKNOWN_CA": "unknown_ca",
    "SSLV3_ALERT_BAD_CERTIFICATE": "bad_certificate",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "bad_certificate",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "bad_certificate",
    "SSLV3_ALERT_CERTIFICATE_REVOKED": "bad_certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "expired",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "certificate_required",
    "TLSV1_ALERT_PROTOCOL_VERSION": "protocol_version",
    "TLSV1_ALERT_INSUFFICIENT_SECURITY": "no_shared_cipher",
}

_OPENSSL_NOISE = re.compile(r"^\[[A-Z0-9_]+: [A-Z0-9_]+\]\s*|\s*\(_ssl\.c:\d+\)$")


class TlsHandshakeError(trio.BrokenResourceError):
    """A TLS handshake failed; ``str()`` says why in words, ``reason`` as a metric label.

    ``reason`` is one of :data:`HANDSHAKE_FAILURE_REASONS`; ``error`` is what
    the ssl module (or the stream under it) raised; ``subject`` is the RFC 4514
    subject of the certificate the client presented (None: it presented none,
    or we are the client).
    """

    def __init__(
        self,
        reason: str,
        detail: str,
        error: BaseException | None = None,
        subject: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.error = error
        self.subject = subject


def describe_handshake_failure(error: BaseException) -> tuple[str, str]:
    """``(reason, detail)`` of a failed handshake: a label of
    :data:`HANDSHAKE_FAILURE_REASONS` and OpenSSL's words for it.

    ``error`` may be anything a handshake raised: an ``ssl.SSLError``,
    ``trio.BrokenResourceError`` from one (or from a lost socket), a
    :class:`TlsHandshakeError`, ``trio.TooSlowError``.
    """
    if isinstance(error, TlsHandshakeError):
        return error.reason, error.detail
    if isinstance(error, trio.TooSlowError):
        return "timeout", str(error) or "the handshake timed out"
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and len(chain) < 8 and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    for e in chain:
        if isinstance(e, ssl.SSLCertVerificationError):
            reason = _VERIFY_REASONS.get(getattr(e, "verify_code", 0), "bad_certificate")
            message = getattr(e, "verify_message", "") or _openssl_words(e)
            return reason, f"certificate verify failed: {message}"
        if isinstance(e, ssl.SSLError):
            code = str(getattr(e, "reason", None) or "")
            if (
                isinstance(e, ssl.SSLEOFError | ssl.SSLZeroReturnError)
                or _SSL_REASONS.get(code) == "eof"
            ):
                return "eof", "the peer closed the connection during the handshake"
            reason = _SSL_REASONS.get(code, "other")
            words = _openssl_words(e)
            if reason == "not_tls":
                words += " (the peer does not speak TLS: a plaintext client?)"
            return reason, words
    for e in chain:
        if isinstance(e, ConnectionError):
            return "eof", f"connection lost during the handshake ({e.strerror or e})"
        if isinstance(e, OSError):
            return "other", f"socket error during the handshake ({e.strerror or e})"
    if isinstance(error, trio.BrokenResourceError | trio.ClosedResourceError):
        return "eof", "the peer closed the connection during the handshake"
    return "other", str(error) or type(error).__name__


def ssl_error_words(error: ssl.SSLError) -> str:
    """What OpenSSL said, without its codes: ``certificate verify failed: unable to get
    local issuer certificate``, ``tlsv1 alert unknown ca``."""
    message = getattr(error, "verify_message", "")
    if isinstance(error, ssl.SSLCertVerificationError) and message:
        return f"certificate verify failed: {message}"
    return _openssl_words(error)


def _openssl_words(error: ssl.SSLError) -> str:
    """``[SSL: X] peer did not return a certificate (_ssl.c:1006)`` → the words only."""
    words = _OPENSSL_NOISE.sub("", str(error.args[1] if len(error.args) > 1 else error))
    if words:
        return words
    return str(getattr(error, "reason", None) or error).lower().replace("_", " ")


async def start_tls(
    stream: trio.abc.Stream, ssl_context: ssl.SSLContext, server_hostname: str | None
) -> trio.SSLStream[trio.abc.Stream]:
    """A client's side of TLS over ``stream``, handshake done; when the handshake fails,
    ``stream`` is closed (the caller gets the error, not a socket to clean up)."""
    tls = trio.SSLStream(stream, ssl_context, server_hostname=server_hostname)
    try:
        await tls.do_handshake()
    except BaseException:
        await trio.aclose_forcefully(stream)
        raise
    return tls


async def _handshake(tls: trio.SSLStream[trio.abc.Stream], raw: trio.abc.Stream) -> None:
    """Run the handshake; when it fails, tell the peer why and raise :class:`TlsHandshakeError`."""
    try:
        await tls.do_handshake()
    except trio.BrokenResourceError as e:
        reason, detail = describe_handshake_failure(e)
        subject = _presented_subject(tls)
        await _send_alert(tls, raw)
        raise TlsHandshakeError(reason, detail, e.__cause__ or e, subject) from e.__cause__ or e
    finally:
        _presented(tls)  # forget it: a verified certificate is the identity


#: The first certificate each server connection's client presented, DER (see
#: :func:`_note_client_certificate`); an entry goes with its ``SSLObject``.
_PRESENTED: weakref.WeakKeyDictionary[object, bytes] = weakref.WeakKeyDictionary()
_HANDSHAKE = 22
_CERTIFICATE = 11
_TLS13 = 0x0304


def _note_client_certificate(
    conn: object, direction: str, version: int, content_type: int, msg_type: int, data: bytes
) -> None:
    """``SSLContext._msg_callback`` of a server context: keep the client's certificate.

    Called by OpenSSL for every record and handshake message, so anything
    but a Certificate message read is dismissed first.
    """
    if msg_type != _CERTIFICATE or content_type != _HANDSHAKE or direction != "read":
        return
    try:
        der = _first_certificate(data, version >= _TLS13)
    except (IndexError, ValueError):
        return
    if der:
        _PRESENTED[conn] = der


def _first_certificate(message: bytes, tls13: bool) -> bytes:
    """The first DER certificate of a Certificate handshake message (b"": none).

    TLS 1.3 puts a request context (one length byte) before the list.
    """
    at = 4  # msg_type and a 3-byte length
    if tls13:
        at += 1 + message[at]
    at += 3  # the list's length
    if at + 3 > len(message):
        return b""
    size = int.from_bytes(message[at : at + 3], "big")
    return message[at + 3 : at + 3 + size]


def _presented(tls: trio.SSLStream[trio.abc.Stream]) -> bytes | None:
    """Take the certificate noted for ``tls``'s client (None: none was)."""
    obj = getattr(tls, "_ssl_object", None)  # trio's SSLObject
    return _PRESENTED.pop(obj, None) if obj is not None else None


def _presented_subject(tls: trio.SSLStream[trio.abc.Stream]) -> str | None:
    """The subject of the certificate the client presented, if one was noted."""
    der = _presented(tls)
    if der is None:
        return None
    try:
        return x509.load_der_x509_certificate(der).subject.rfc4514_string()
    except ValueError:
        return None


async def _send_alert(tls: trio.SSLStream[trio.abc.Stream], raw: trio.abc.Stream) -> None:
    """Send what OpenSSL wrote for the peer when the handshake failed (its alert).

    ``trio.SSLStream`` raises without sending it, so the peer would see a bare
    EOF. After the alert, our side is closed and the peer's bytes are read
    (and dropped) for up to :data:`ALERT_LINGER` seconds: closing a socket
    with unread input resets the connection, and a reset may destroy the
    alert before the peer reads it.
    """
    outgoing = getattr(tls, "_outgoing", None)  # trio's MemoryBIO towards the peer
    if not isinstance(outgoing, ssl.MemoryBIO) or not outgoing.pending:
        return
    alert = outgoing.read()
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + ALERT_LINGER
        try:
            await raw.send_all(alert)
            send_eof = getattr(raw, "send_eof", None)
            if send_eof is not None:
                await send_eof()
            received = 0
            while received < _LINGER_BYTES:
                data = await raw.receive_some(_LINGER_BYTES)
                if not data:
                    break
                received += len(data)
        except (
            trio.BrokenResourceError,
            trio.ClosedResourceError,
            trio.BusyResourceError,
            OSError,
        ):
            pass


def _verified_identity(
    tls: trio.SSLStream[trio.abc.Stream], ctx: ssl.SSLContext
) -> PeerIdentity | None:
    """The peer's identity, but only if OpenSSL verified its certificate against our CAs."""
    if ctx.verify_mode == ssl.CERT_NONE:
        return None
    der = tls.getpeercert(binary_form=True)
    return identity_from_der(der) if der else None


def _sni_name(host: str) -> str:
    """``[::1]`` → ``::1``: the ssl module wants a bare IP literal to match IP SANs."""
    if host.startswith("[") and host.endswith("]"):
        return host[1:-1]
    return host


def _min_version(value: str) -> ssl.TLSVersion:
    try:
        return _VERSIONS[str(value)]
    except KeyError:
        raise ValueError(f"tls min_version must be '1.2' or '1.3', not {value!r}")


def _problem(setting: str, path: Path, what: str) -> NoReturn:
    raise ValueError(f"tls {setting} {path}: {what}")


def _check_file(setting: str, path: Path, marker: bytes, kind: str) -> bytes:
    """Read ``path`` and make sure it holds a PEM ``kind``; return its bytes."""
    if not path.exists():
        _problem(setting, path, "file does not exist")
    if not path.is_file():
        _problem(setting, path, "is not a regular file")
    try:
        data = path.read_bytes()
    except OSError as exc:
        _problem(setting, path, f"cannot read file ({exc.strerror or exc})")
    if b"-----BEGIN " not in data:
        _problem(setting, path, f"not a PEM file (expected a PEM {kind})")
    if marker not in data:
        _problem(setting, path, f"no PEM {kind} found in the file")
    return data


def _load_chain(
    ctx: ssl.SSLContext, cert_setting: str, cert: Path, key_setting: str, key: Path
) -> None:
    """Load a certificate chain and its key, diagnosing the usual mistakes by file."""
    _check_file(cert_setting, cert, b"CERTIFICATE-----", "certificate")
    key_data = _check_file(key_setting, key, b"PRIVATE KEY-----", "private key")

    def no_password() -> NoReturn:
        _problem(key_setting, key, "private key is encrypted (use an unencrypted key)")

    try:
        ctx.load_cert_chain(os.fspath(cert), os.fspath(key), password=no_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            _problem(key_setting, key, f"private key does not match the certificate in {cert}")
        _diagnose_chain(cert_setting, cert, key_setting, key, key_data)
        _problem(cert_setting, cert, f"cannot load certificate/key ({_reason(exc)}; key {key})")


def _diagnose_chain(
    cert_setting: str, cert: Path, key_setting: str, key: Path, key_data: bytes
) -> None:
    """After OpenSSL refused a chain, find which file is at fault (returns if unsure)."""
    try:
        certs = x509.load_pem_x509_certificates(cert.read_bytes())
    except ValueError as exc:
        _problem(cert_setting, cert, f"invalid PEM certificate ({exc})")
    try:
        private = serialization.load_pem_private_key(key_data, password=None)
    except TypeError:
        _problem(key_setting, key, "private key is encrypted (use an unencrypted key)")
    except ValueError as exc:
        _problem(key_setting, key, f"invalid PEM private key ({exc})")
    except Exception:  # unsupported key algorithm: leave it to OpenSSL's message
        return
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if certs and certs[0].public_key().public_bytes(*spki) != private.public_key().public_bytes(
        *spki
    ):
        _problem(key_setting, key, f"private key does not match the certificate in {cert}")


def _load_ca(ctx: ssl.SSLContext, setting: str, path: Path) -> None:
    """Trust the CA certificates in ``path``."""
    _check_file(setting, path, b"CERTIFICATE-----", "CA certificate")
    try:
        ctx.load_verify_locations(cafile=os.fspath(path))
    except ssl.SSLError as exc:
        _problem(setting, path, f"cannot load CA certificates ({_reason(exc)})")


def _reason(exc: ssl.SSLError) -> str:
    return str(exc.reason or exc.strerror or exc).lower().replace("_", " ")


transport = TlsLayer()
