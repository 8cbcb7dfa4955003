"""The development CA: file layout, permissions, certificate contents, overwrite rules."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gateway.config import certs

FILES = ("ca.pem", "ca.key", "server.pem", "server.key", "client.pem", "client.key")


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def sans_of(cert: x509.Certificate) -> list[x509.GeneralName]:
    return list(cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value)


def eku_of(cert: x509.Certificate) -> list[x509.ObjectIdentifier]:
    return list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)


def test_init_dir_writes_all_files_with_private_keys(tmp_path: Path) -> None:
    paths = certs.init_dir(tmp_path / "pki")
    assert sorted(p.name for p in paths.values()) == sorted(FILES)
    assert paths["server_cert"] == tmp_path / "pki" / "server.pem"
    for name in FILES:
        path = tmp_path / "pki" / name
        assert path.is_file()
        if name.endswith(".key"):
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")  # PKCS#8
        else:
            assert path.read_bytes().startswith(b"-----BEGIN CERTIFICATE-----")


def test_ca_is_a_ca_and_signs_both_leaves(tmp_path: Path) -> None:
    paths = certs.init_dir(tmp_path)
    ca = load(paths["ca_cert"])
    constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca is True
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign is True
    for leaf in ("server_cert", "client_cert"):
        cert = load(paths[leaf])
        cert.verify_directly_issued_by(ca)
        assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False


def test_server_cert_has_a_san_per_host_and_server_auth(tmp_path: Path) -> None:
    paths = certs.init_dir(tmp_path)
    server = load(paths["server_cert"])
    assert sans_of(server) == [
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    assert eku_of(server) == [ExtendedKeyUsageOID.SERVER_AUTH]


def test_custom_hosts_and_client_name(tmp_path: Path) -> None:
    paths = certs.init_dir(
        tmp_path, hosts=("gw.example.net", "10.1.2.3"), client_name="beats-01", days=30
    )
    server = load(paths["server_cert"])
    assert sans_of(server) == [
        x509.DNSName("gw.example.net"),
        x509.IPAddress(ipaddress.ip_address("10.1.2.3")),
    ]
    client = load(paths["client_cert"])
    cn = client.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    assert [a.value for a in cn] == ["beats-01"]
    assert eku_of(client) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    lifetime = client.not_valid_after_utc - client.not_valid_before_utc
    assert 29 <= lifetime.days <= 30


def test_client_cert_default_name(tmp_path: Path) -> None:
    client = load(certs.init_dir(tmp_path)["client_cert"])
    assert client.subject.rfc4514_string() == "CN=interchange-client"
    assert sans_of(client) == [x509.DNSName("interchange-client")]


def test_refuses_to_overwrite_and_leaves_files_alone(tmp_path: Path) -> None:
    certs.init_dir(tmp_path)
    before = {name: (tmp_path / name).read_bytes() for name in FILES}
    with pytest.raises(FileExistsError, match=r"ca\.pem"):
        certs.init_dir(tmp_path)
    assert {name: (tmp_path / name).read_bytes() for name in FILES} == before


def test_one_existing_file_blocks_everything(tmp_path: Path) -> None:
    (tmp_path / "client.key").write_text("precious")
    with pytest.raises(FileExistsError) as info:
        certs.init_dir(tmp_path)
    assert "client.key" in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["client.key"]
    assert (tmp_path / "client.key").read_text() == "precious"


def test_force_replaces_and_tightens_key_mode(tmp_path: Path) -> None:
    first = certs.init_dir(tmp_path)
    old_ca = first["ca_cert"].read_bytes()
    first["server_key"].chmod(0o644)
    second = certs.init_dir(tmp_path, force=True)
    assert second["ca_cert"].read_bytes() != old_ca
    assert stat.S_IMODE(second["server_key"].stat().st_mode) == 0o600
    load(second["server_cert"]).verify_directly_issued_by(load(second["ca_cert"]))


def test_second_ca_does_not_sign_for_the_first(tmp_path: Path) -> None:
    paths = certs.init_dir(tmp_path / "a")
    other_cert, other_key = certs.create_ca(tmp_path / "b", "Other CA")
    assert (other_cert.name, other_key.name) == ("ca.pem", "ca.key")
    rogue_cert, _ = certs.issue(
        other_cert,
        other_key,
        tmp_path / "b" / "rogue.pem",
        tmp_path / "b" / "rogue.key",
        "interchange-client",
        client=True,
    )
    rogue = load(rogue_cert)
    rogue.verify_directly_issued_by(load(other_cert))
    with pytest.raises((ValueError, InvalidSignature)):
        rogue.verify_directly_issued_by(load(paths["ca_cert"]))
    assert "Other CA" in load(other_cert).subject.rfc4514_string()


def test_issue_sans_forms_and_validity_capped_by_ca(tmp_path: Path) -> None:
    ca_cert, ca_key = certs.create_ca(tmp_path, days=10)
    cert_path, key_path = certs.issue(
        ca_cert,
        ca_key,
        tmp_path / "leaf.pem",
        tmp_path / "leaf.key",
        "svc",
        sans=("svc.local", "192.0.2.7", "URI:spiffe://example/svc", "email:ops@example.org"),
        days=825,
    )
    leaf = load(cert_path)
    assert sans_of(leaf) == [
        x509.DNSName("svc.local"),
        x509.IPAddress(ipaddress.ip_address("192.0.2.7")),
        x509.UniformResourceIdentifier("spiffe://example/svc"),
        x509.RFC822Name("ops@example.org"),
    ]
    assert leaf.not_valid_after_utc <= load(ca_cert).not_valid_after_utc
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600


def test_issue_refuses_existing_output(tmp_path: Path) -> None:
    ca_cert, ca_key = certs.create_ca(tmp_path)
    (tmp_path / "leaf.key").write_text("x")
    with pytest.raises(FileExistsError, match=r"leaf\.key"):
        certs.issue(ca_cert, ca_key, tmp_path / "leaf.pem", tmp_path / "leaf.key", "leaf")
    assert not (tmp_path / "leaf.pem").exists()


@pytest.mark.parametrize("bad", ["not a host!", "a..b", ""])
def test_issue_rejects_bad_san(tmp_path: Path, bad: str) -> None:
    ca_cert, ca_key = certs.create_ca(tmp_path)
    with pytest.raises(ValueError, match="neither an IP address nor a host name"):
        certs.issue(ca_cert, ca_key, tmp_path / "l.pem", tmp_path / "l.key", "leaf", sans=[bad])


def test_rsa_keys_can_be_issued(tmp_path: Path) -> None:
    ca_cert, ca_key = certs.create_ca(tmp_path)
    cert_path, _ = certs.issue(
        ca_cert, ca_key, tmp_path / "r.pem", tmp_path / "r.key", "rsa", key_type="rsa"
    )
    assert load(cert_path).public_key().key_size == 2048


def test_days_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="days"):
        certs.init_dir(tmp_path, days=0)
    assert list(tmp_path.iterdir()) == []
