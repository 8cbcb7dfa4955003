"""TLS as a stream layer: contexts from settings, handshakes, peer identities.

Contexts are built once per listener or upstream; every file problem becomes a
``ValueError`` naming the setting, the path and what is wrong, so ``gateway
check`` and start-up can report it in one line. Handshake timeouts and closing
the stream after a failed handshake are the caller's business.
"""

from __future__ import annotations

import hashlib
import os
import ssl
from pathlib import Path
from typing import NoReturn

import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from ..model import PeerIdentity
from .base import StreamLayer, TlsClientSettings, TlsServerSettings

__all__ = ["TlsLayer", "identity_from_der", "transport"]

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
        await tls.do_handshake()
        return tls, _verified_identity(tls, context)

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
        await tls.do_handshake()
        return tls, _verified_identity(tls, context)


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
