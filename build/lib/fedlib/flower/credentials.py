"""The credentials of a local Flower deployment: a certificate authority, the SuperLink's TLS
certificate and one authentication key pair per SuperNode, made with the ``cryptography`` package
(Flower's own dependency; no cryptography is written here).

Flower 1.41's mechanisms, which :mod:`fedlib.flower.deploy` switches on:

- **TLS** (every SuperNode to SuperLink connection, and ``flwr`` to the SuperLink): the SuperLink
  serves ``--ssl-certfile``/``--ssl-keyfile`` (a certificate for ``127.0.0.1`` and ``localhost``
  signed by the CA, ``--ssl-ca-certfile``), each SuperNode and the ``flwr`` CLI verify it against
  the CA certificate (``--root-certificates``; ``root-certificates`` in the CLI's connection).
  A process without the CA certificate cannot complete the handshake.
- **SuperNode authentication**: the SuperLink runs with ``--enable-supernode-auth``; each node's
  public key (an EC key on NIST P-384, OpenSSH format) is registered with
  ``flwr supernode register``, and the node signs its requests with the private key
  (``--auth-supernode-private-key``). A node whose key is not registered is refused.

Everything is written into one folder that only its owner can read (mode 0700, files 0600); the
caller deletes it when the deployment ends. A deployment across machines would instead take the
SuperLink's certificate from a real CA and let each node owner generate their key and send only the
public half to the operator (see the README).
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

#: How long the generated certificates are valid: one day covers any local deployment.
VALIDITY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class NodeKey:
    """One SuperNode's authentication key pair (OpenSSH-format files)."""

    private: Path
    public: Path


@dataclass(frozen=True)
class Credentials:
    """The files of one deployment's TLS and node authentication (see the module docstring)."""

    folder: Path
    ca_cert: Path
    server_cert: Path
    server_key: Path
    nodes: tuple[NodeKey, ...]


def _write_private(path: Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` readable by its owner only (created with mode 0600)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _name(common_name: str):
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def node_key(folder: Path, name: str) -> NodeKey:
    """A new P-384 key pair for a SuperNode, as ``<name>`` (private) and ``<name>.pub`` (public)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private = _write_private(folder / name, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    public = _write_private(folder / f"{name}.pub", key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
    return NodeKey(private, public)


def make_credentials(folder: Path, nodes: int, host: str = "127.0.0.1") -> Credentials:
    """A CA, a SuperLink certificate for ``host`` (and ``localhost``) and ``nodes`` node key pairs in
    ``folder`` (created with mode 0700; it must not exist yet)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if nodes < 1:
        raise ValueError(f"a deployment needs at least one node key, got {nodes}")
    folder = Path(folder)
    folder.mkdir(mode=0o700, parents=False, exist_ok=False)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = (x509.CertificateBuilder().subject_name(_name("fedlib local deployment CA"))
          .issuer_name(_name("fedlib local deployment CA")).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + VALIDITY)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .sign(ca_key, hashes.SHA384()))
    server_key = ec.generate_private_key(ec.SECP384R1())
    names = [x509.DNSName("localhost")]
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    server = (x509.CertificateBuilder().subject_name(_name(host)).issuer_name(ca.subject)
              .public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                             critical=False)
              .sign(ca_key, hashes.SHA384()))
    pem = serialization.Encoding.PEM
    ca_cert = _write_private(folder / "ca.crt", ca.public_bytes(pem))
    server_cert = _write_private(folder / "superlink.crt", server.public_bytes(pem))
    server_key_path = _write_private(folder / "superlink.key", server_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    keys = tuple(node_key(folder, f"node{n}") for n in range(nodes))
    return Credentials(folder, ca_cert, server_cert, server_key_path, keys)
