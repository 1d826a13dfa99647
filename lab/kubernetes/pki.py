"""The lab cluster's certificates and kubeconfigs: one CA, the API server's serving certificate,
a client certificate per component identity, and the ServiceAccount signing key.

A real cluster's identities are what its authorizers judge: `system:masters` for the admin,
`system:kube-controller-manager` and `system:kube-scheduler` for their bindings, and
`system:node:<name>` in `system:nodes` for each kubelet, so the Node authorizer and the
NodeRestriction admission plugin see exactly the node they would in a kubeadm cluster.
Keys are ECDSA P-256 (fast to make, accepted by every component); everything is written
under one directory, private keys mode 0600, and made once per lab.
"""
from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import json
import os
from collections.abc import Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=365)
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclasses.dataclass(frozen=True)
class Identity:
    """Who a client certificate says it is: the user (CN) and its groups (O)."""
    user: str
    groups: tuple[str, ...] = ()


ADMIN = Identity("kubernetes-admin", ("system:masters",))
CONTROLLER_MANAGER = Identity("system:kube-controller-manager")
SCHEDULER = Identity("system:kube-scheduler")
APISERVER_KUBELET_CLIENT = Identity("kube-apiserver-kubelet-client", ("system:masters",))


def node_identity(node: str) -> Identity:
    return Identity(f"system:node:{node}", ("system:nodes",))


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write(path: str, data: bytes, *, private: bool = False) -> None:
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


class Pki:
    """The certificates of one lab cluster, in `directory` (made on first use)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    @property
    def ca_cert(self) -> str:
        return self.path("ca.crt")

    @property
    def ca_key(self) -> str:
        return self.path("ca.key")

    def ensure_ca(self) -> None:
        if os.path.exists(self.ca_cert):
            return
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "netagent-lab-ca")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False,
                                             encipher_only=False, decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        _write(self.ca_key, _pem_key(key), private=True)
        _write(self.ca_cert, _pem_cert(cert))

    def _issue(self, name: str, subject: x509.Name, *, server: bool, dns: Sequence[str] = (),
               ips: Sequence[IpAddress] = ()) -> tuple[str, str]:
        """`name`.crt and `name`.key signed by the CA (made once); returns their paths."""
        cert_path, key_path = self.path(f"{name}.crt"), self.path(f"{name}.key")
        if os.path.exists(cert_path):
            return cert_path, key_path
        self.ensure_ca()
        with open(self.ca_key, "rb") as f:
            ca_key = serialization.load_pem_private_key(f.read(), password=None)
        with open(self.ca_cert, "rb") as f:
            ca = x509.load_pem_x509_certificate(f.read())
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        key = _key()
        now = datetime.datetime.now(datetime.timezone.utc)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca.subject)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        names += [x509.IPAddress(ip) for ip in ips]
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        _write(key_path, _pem_key(key), private=True)
        _write(cert_path, _pem_cert(builder.sign(ca_key, hashes.SHA256())))
        return cert_path, key_path

    def client(self, name: str, identity: Identity) -> tuple[str, str]:
        subject = x509.Name([*(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in identity.groups),
                             x509.NameAttribute(NameOID.COMMON_NAME, identity.user)])
        return self._issue(name, subject, server=False)

    def server(self, name: str, *, dns: Sequence[str], ips: Sequence[IpAddress]) -> tuple[str, str]:
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns[0] if dns else name)])
        return self._issue(name, subject, server=True, dns=dns, ips=ips)

    def service_account_keys(self) -> tuple[str, str]:
        """The key the API server signs ServiceAccount tokens with, and its public half."""
        private, public = self.path("sa.key"), self.path("sa.pub")
        if not os.path.exists(private):
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            key = _key()
            _write(public, key.public_key().public_bytes(serialization.Encoding.PEM,
                                                         serialization.PublicFormat.SubjectPublicKeyInfo))
            _write(private, _pem_key(key), private=True)
        return private, public

    def kubeconfig(self, path: str, *, server: str, name: str, identity: Identity) -> str:
        """A kubeconfig at `path` for `identity` against `server`, trusting the CA (files by path)."""
        cert, key = self.client(name, identity)
        config = {
            "apiVersion": "v1", "kind": "Config", "current-context": "lab",
            "clusters": [{"name": "lab", "cluster": {"server": server, "certificate-authority": self.ca_cert}}],
            "users": [{"name": identity.user, "user": {"client-certificate": cert, "client-key": key}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": identity.user}}],
        }
        _write(path, json.dumps(config, indent=1).encode(), private=True)  # JSON is YAML
        return path
