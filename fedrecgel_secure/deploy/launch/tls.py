"""Certificates and SuperNode authentication keys for a TLS deployment (``cryptography`` only, no Flower).

* :func:`make_throwaway_tls`: a CA and a SuperLink certificate for ``deploy local`` when the policy
  names no certificates. The CA's private key is never written: it signs the one server
  certificate and is dropped, so nothing else can be issued under that CA.
* :func:`make_node_key`: a SuperNode's authentication key pair, ECDSA P-384 in OpenSSH format
  (what ``flower-supernode --auth-supernode-private-key`` loads and ``flwr supernode register``
  accepts in flwr 1.42); the private key file is 0600, the ``.pub`` beside it is what gets registered.

Every private key is created with mode 0600 from the start (``os.open`` with the mode), never
written world-readable and tightened afterwards.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

NODE_KEY = "supernode-auth-key"  # in each node's state directory; the public key is NODE_KEY + ".pub"


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a new file readable by its owner alone (0600 from creation)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):  # unique, in order
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def make_throwaway_tls(directory: Path, hosts: list[str], days: int = 30) -> TlsFiles:
    """A fresh CA and a server certificate for ``hosts`` (IP addresses or DNS names) in ``directory``.

    Writes ``ca.pem``, ``server.pem`` and ``server.key`` (0600). The SuperLink's own SuperExec dials
    the Runtime API at the bind address (127.0.0.1 for 0.0.0.0), so that belongs in ``hosts`` too.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    now = datetime.datetime.now(datetime.UTC)
    validity = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days))

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedrecgel throwaway deployment CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(_san(hosts), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA384())
    )

    files = TlsFiles(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    write_private(
        files.server_key,
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    return files


def make_node_key(path: Path) -> Path:
    """A SuperNode authentication key pair at ``path`` (0600, OpenSSH private key) and ``path.pub``.

    An existing key is kept (a restarted node keeps its registered identity); returns the public key's path.
    """
    path = Path(path)
    pub = path.with_name(path.name + ".pub")
    if path.exists() and pub.exists():
        return pub
    key = ec.generate_private_key(ec.SECP384R1())
    write_private(
        path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    pub.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    )
    return pub
