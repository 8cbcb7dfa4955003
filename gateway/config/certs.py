"""A development certificate authority.

``gateway certs init`` (and the TLS tests) need a CA, a server certificate and
a client certificate that fit together, without asking anyone to drive the
``openssl`` command line. These are for development and tests: keys are
written unencrypted (mode 0600) and nothing here tracks revocation.
"""

from __future__ import annotations

import datetime
import errno
import ipaddress
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["DEFAULT_DAYS", "DEFAULT_HOSTS", "create_ca", "init_dir", "issue"]

#: 825 days: the longest validity Apple platforms accept for a TLS server certificate.
DEFAULT_DAYS = 825
DEFAULT_HOSTS: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")

KeyType = Literal["ec", "rsa"]
PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey

#: Backdating ``notBefore`` keeps a fresh certificate valid on a peer whose clock is a bit behind.
_CLOCK_SKEW = datetime.timedelta(minutes=5)
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9_*]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_-]{1,63})*\.?$"
)


def init_dir(
    directory: Path,
    *,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    client_name: str = "interchange-client",
    days: int = DEFAULT_DAYS,
    force: bool = False,
) -> dict[str, Path]:
    """Create a CA plus a server and a client certificate it signs, in ``directory``.

    Returns the written paths under the keys ``ca_cert``, ``ca_key``,
    ``server_cert``, ``server_key``, ``client_cert`` and ``client_key``
    (files ``ca.pem``, ``ca.key``, ``server.pem``, …). Without ``force`` no
    file is written if any of them already exists.
    """
    _check_days(days)
    if not hosts:
        raise ValueError("at least one host is needed for the server certificate")
    directory = Path(directory)
    paths = {
        f"{who}_{part}": directory / f"{who}.{suffix}"
        for who in ("ca", "server", "client")
        for part, suffix in (("cert", "pem"), ("key", "key"))
    }
    if not force:
        _refuse_existing(paths.values())
    directory.mkdir(parents=True, exist_ok=True)
    ca = paths["ca_cert"], paths["ca_key"]
    create_ca(directory, days=days, force=force, cert_path=ca[0], key_path=ca[1])
    server = paths["server_cert"], paths["server_key"]
    issue(*ca, *server, hosts[0], sans=hosts, days=days, force=force)
    client = paths["client_cert"], paths["client_key"]
    client_sans = (client_name,) if _HOSTNAME.match(client_name) else ()
    issue(*ca, *client, client_name, sans=client_sans, client=True, days=days, force=force)
    return paths


def create_ca(
    directory: Path,
    name: str = "Interchange Development CA",
    *,
    days: int = DEFAULT_DAYS,
    force: bool = False,
    cert_path: Path | None = None,
    key_path: Path | None = None,
) -> tuple[Path, Path]:
    """Write a self-signed CA (``ca.pem``/``ca.key`` unless named) into ``directory``.

    Returns ``(cert_path, key_path)``. Also how tests make "another, untrusted CA".
    """
    _check_days(days)
    directory = Path(directory)
    cert_path = Path(cert_path) if cert_path is not None else directory / "ca.pem"
    key_path = Path(key_path) if key_path is not None else directory / "ca.key"
    if not force:
        _refuse_existing((cert_path, key_path))
    directory.mkdir(parents=True, exist_ok=True)

    key = _new_key("ec")
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, name),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Interchange development"),
        ]
    )
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        _builder(subject, subject, key, now, now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key, force=force)
    _write_cert(cert_path, cert, force=force)
    return cert_path, key_path


def issue(
    ca_cert_path: Path,
    ca_key_path: Path,
    out_cert: Path,
    out_key: Path,
    common_name: str,
    *,
    sans: Iterable[str] = (),
    client: bool = False,
    days: int = DEFAULT_DAYS,
    key_type: KeyType = "ec",
    force: bool = False,
) -> tuple[Path, Path]:
    """Issue a leaf certificate signed by the CA at ``ca_cert_path``/``ca_key_path``.

    ``sans`` entries are IP literals (IP SAN), ``DNS:``/``IP:``/``URI:``/``email:``
    prefixed names, or host names (DNS SAN). ``client`` selects EKU clientAuth
    instead of serverAuth. The validity is capped at the CA's own expiry.
    Returns ``(out_cert, out_key)``.
    """
    _check_days(days)
    out_cert, out_key = Path(out_cert), Path(out_key)
    if not force:
        _refuse_existing((out_cert, out_key))
    ca_cert, ca_key = _load_ca(Path(ca_cert_path), Path(ca_key_path))
    general_names = [_general_name(san) for san in sans]

    key = _new_key(key_type)
    now = _now()
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    usage = ExtendedKeyUsageOID.CLIENT_AUTH if client else ExtendedKeyUsageOID.SERVER_AUTH
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    builder = (
        _builder(subject, ca_cert.subject, key, now, not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(key_encipherment=key_type == "rsa"), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if general_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(general_names), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    out_cert.parent.mkdir(parents=True, exist_ok=True)
    out_key.parent.mkdir(parents=True, exist_ok=True)
    _write_key(out_key, key, force=force)
    _write_cert(out_cert, cert, force=force)
    return out_cert, out_key


def _load_ca(cert_path: Path, key_path: Path) -> tuple[x509.Certificate, PrivateKey]:
    """The CA certificate and its key, as ``create_ca`` (or openssl) wrote them."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise TypeError(f"{key_path}: unsupported CA key type {type(key).__name__}")
    return cert, key


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: PrivateKey,
    now: datetime.datetime,
    not_after: datetime.datetime,
) -> x509.CertificateBuilder:
    """What a CA and a leaf certificate have alike: names, key, a random serial and
    the validity (backdated by ``_CLOCK_SKEW``)."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(not_after)
    )


def _key_usage(*, key_cert_sign: bool = False, key_encipherment: bool = False) -> x509.KeyUsage:
    """Digital signatures, plus signing certificates and CRLs (a CA) or key
    encipherment (an RSA leaf, for TLS 1.2's RSA key exchange)."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=key_cert_sign,
        crl_sign=key_cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(san: str) -> x509.GeneralName:
    """One SAN string as a ``GeneralName``: prefixed, an IP literal, or a DNS name."""
    kind, sep, value = san.partition(":")
    if sep and kind in ("DNS", "IP", "URI", "email"):
        if kind == "DNS":
            return x509.DNSName(value)
        if kind == "IP":
            return x509.IPAddress(ipaddress.ip_address(value))
        if kind == "URI":
            return x509.UniformResourceIdentifier(value)
        return x509.RFC822Name(value)
    try:
        return x509.IPAddress(ipaddress.ip_address(san))
    except ValueError:
        pass
    if not _HOSTNAME.match(san):
        raise ValueError(f"{san!r} is neither an IP address nor a host name")
    return x509.DNSName(san)


def _new_key(key_type: KeyType) -> PrivateKey:
    if key_type == "ec":
        return ec.generate_private_key(ec.SECP256R1())
    if key_type == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    raise ValueError(f"key_type must be 'ec' or 'rsa', not {key_type!r}")


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def _check_days(days: int) -> None:
    if days < 1:
        raise ValueError(f"days must be at least 1, not {days}")


def _refuse_existing(paths: Iterable[Path]) -> None:
    """Raise ``FileExistsError`` for the first path that exists: never clobber keys silently."""
    for path in paths:
        if os.path.lexists(path):
            raise FileExistsError(
                errno.EEXIST, f"{path} already exists (use force to overwrite)", os.fspath(path)
            )


def _write_key(path: Path, key: PrivateKey, *, force: bool) -> None:
    """Write ``key`` as unencrypted PKCS#8 PEM, readable by the owner only."""
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write(path, data, 0o600, force=force)


def _write_cert(path: Path, cert: x509.Certificate, *, force: bool) -> None:
    _write(path, cert.public_bytes(serialization.Encoding.PEM), 0o644, force=force)


def _write(path: Path, data: bytes, mode: int, *, force: bool) -> None:
    """Create ``path`` with ``mode`` from the start (no window where a key is world-readable)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    fd = os.open(path, flags, mode)
    with os.fdopen(fd, "wb") as file:
        os.fchmod(fd, mode)  # an overwritten file keeps its old mode otherwise
        file.write(data)
