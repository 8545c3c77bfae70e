"""A throwaway certificate authority for TLS tests: a CA, a server certificate for 127.0.0.1 and
``localhost``, and a client certificate whose key is encrypted with a password, all generated
with ``cryptography`` in the test's own directory (nothing is downloaded or kept)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Authority", "make_authority"]


@dataclass(frozen=True)
class Authority:
    """PEM files of one CA: ``ca`` signs ``server_cert`` and ``client_cert``."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    client_key_password: str


def make_authority(folder: Path, name: str = "reclock-test", *, key_password: str = "k3y-pa55") -> Authority:
    """A fresh CA named ``name`` and its two leaf certificates, written under ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
    ca = (
        _builder(ca_name, ca_name, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    paths = {}
    for role, usage in (("server", ExtendedKeyUsageOID.SERVER_AUTH), ("client", ExtendedKeyUsageOID.CLIENT_AUTH)):
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} {role}")])
        builder = (
            _builder(subject, ca_name, key)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        )
        if role == "server":
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        encryption = (
            serialization.BestAvailableEncryption(key_password.encode())
            if role == "client"
            else serialization.NoEncryption()
        )
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
        paths[f"{role}_cert"] = _write(folder / f"{name}-{role}.pem", cert.public_bytes(serialization.Encoding.PEM))
        paths[f"{role}_key"] = _write(folder / f"{name}-{role}-key.pem", key_pem)
    ca_path = _write(folder / f"{name}-ca.pem", ca.public_bytes(serialization.Encoding.PEM))
    return Authority(ca_path, client_key_password=key_password, **paths)


def _builder(subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
