"""The members' certificates as Kubernetes objects: Secrets the operator signs itself, or
cert-manager Certificates; and what a certificate in a Secret says (who it names, until when,
whether it is due for renewal).

Pure: no API calls. `tlsassets.py` reads and writes the objects; this module decides what they
hold. Certificates are made with the node's own small CA (`flotilla.node.tls`).

A member's Secret `MEMBER-tls` holds `tls.crt`, `tls.key` and `ca.crt`, the layout
cert-manager writes, so the pods mount the same thing whoever signed. A certificate is renewed
once a third of its lifetime is left (cert-manager's default `renewBefore`).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.x509.oid import ExtensionOID, NameOID
from flotilla.node.tls import CA_DAYS, Issued, issue, make_ca

from .render import owner_reference
from .spec import ClusterSpec

__all__ = [
    "CLIENT_COMMON_NAME",
    "ISSUED_BY",
    "CertInfo",
    "ca_fingerprint",
    "ca_from_secret",
    "ca_secret",
    "certificate",
    "decode",
    "due",
    "issue_client",
    "issue_member",
    "new_ca",
    "read",
    "rfc3339",
    "tls_secret",
]

TLS_CRT, TLS_KEY, CA_CRT = "tls.crt", "tls.key", "ca.crt"
#: The common name of the client certificate the operator shows members that ask for one. No
#: member can have it (members are NAME-<ordinal>), so the peer port never takes it for one.
CLIENT_COMMON_NAME = "flotilla-operator"
#: An annotation on the Secrets the operator signs: by which CA (its certificate's SHA-256).
ISSUED_BY = "flotilla.dev/issued-by"
RENEW_AT_FRACTION = 3  # renew when 1/3 of the lifetime is left
USAGES = ["digital signature", "key encipherment", "server auth", "client auth"]

Manifest = dict[str, Any]


@dataclass(frozen=True)
class CertInfo:
    """What one PEM certificate says, as far as renewal cares."""

    serial: int
    not_before: datetime.datetime
    not_after: datetime.datetime
    names: frozenset[str]  # the common name and every SAN (DNS and IP, as text)
    issuer: bytes  # the issuer's distinguished name, DER
    authority_key: bytes | None  # the signing key's id, when the certificate names it

    @property
    def renew_at(self) -> datetime.datetime:
        """When a third of the lifetime is left."""
        return self.not_after - (self.not_after - self.not_before) / RENEW_AT_FRACTION


def read(cert_pem: bytes | None) -> CertInfo | None:
    """The first certificate of a PEM chain; None when there is none or it cannot be read."""
    if not cert_pem:
        return None
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return None
    found = {a.value for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)}
    try:
        sans = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
        found.update(sans.get_values_for_type(x509.DNSName))
        found.update(str(ip) for ip in sans.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        pass
    try:
        authority = cert.extensions.get_extension_for_oid(
            ExtensionOID.AUTHORITY_KEY_IDENTIFIER).value.key_identifier
    except x509.ExtensionNotFound:
        authority = None
    return CertInfo(cert.serial_number, cert.not_valid_before_utc, cert.not_valid_after_utc,
                    frozenset(str(n) for n in found), cert.issuer.public_bytes(), authority)


def _subject_key(cert_pem: bytes) -> bytes | None:
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        return cert.extensions.get_extension_for_oid(
            ExtensionOID.SUBJECT_KEY_IDENTIFIER).value.digest
    except x509.ExtensionNotFound:
        return None


def due(info: CertInfo | None, names: Sequence[str], ca_pem: bytes,
        now: datetime.datetime) -> str | None:
    """Why a certificate must be (re)issued, in words, or None while it is good: missing or
    unreadable, a third of its lifetime left, other names than wanted, or signed by
    another CA than `ca_pem`."""
    if info is None:
        return "it has no readable certificate"
    if now >= info.renew_at:
        return (f"it expires at {rfc3339(info.not_after)} and a third of its lifetime is "
                "left")
    missing = sorted(set(names) - info.names)
    if missing:
        return f"it does not name {', '.join(missing)}"
    ca = x509.load_pem_x509_certificate(ca_pem)
    key = _subject_key(ca_pem)
    if info.issuer != ca.subject.public_bytes() or (
            key is not None and info.authority_key not in (None, key)):
        return "another CA signed it"
    return None


def issue_member(spec: ClusterSpec, member: str, ca: Issued) -> Issued:
    """A member's certificate: its name as the common name, its DNS names as SANs, valid
    for spec.tls.duration, for serving and for dialling peers."""
    names = spec.member_dns_names(member)
    return issue(ca, member, names[1:], days=spec.tls.seconds / 86400)


def issue_client(spec: ClusterSpec, ca: Issued) -> Issued:
    """The operator's client certificate (for members run with clientCertAuth)."""
    return issue(ca, CLIENT_COMMON_NAME, (), days=spec.tls.seconds / 86400)


def new_ca(spec: ClusterSpec) -> Issued:
    return make_ca(f"flotilla {spec.namespace}/{spec.name} CA", days=CA_DAYS)


def ca_fingerprint(ca_pem: bytes) -> str:
    """The SHA-256 of a CA certificate, hex (what ISSUED_BY records)."""
    return x509.load_pem_x509_certificate(ca_pem).fingerprint(hashes.SHA256()).hex()


def chain(issued: Issued, ca: Issued) -> bytes:
    """A leaf followed by its CA when the CA is not self-signed (an intermediate of the
    user's), so that peers who trust only the root can follow the chain."""
    cert = ca.certificate
    if cert.issuer == cert.subject:
        return issued.cert_pem
    return issued.cert_pem + ca.cert_pem


def tls_secret(spec: ClusterSpec, name: str, issued: Issued, ca: Issued, trust: bytes,
               labels: Mapping[str, str]) -> Manifest:
    """A kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt (`trust`: the CA
    certificates peers and clients verify against)."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": spec.namespace, "labels": dict(labels),
                     "annotations": {ISSUED_BY: ca_fingerprint(ca.cert_pem)},
                     "ownerReferences": [owner_reference(spec)]},
        "data": {TLS_CRT: _b64(chain(issued, ca)), TLS_KEY: _b64(issued.key_pem),
                 CA_CRT: _b64(trust)},
    }


def ca_secret(spec: ClusterSpec, ca: Issued, labels: Mapping[str, str]) -> Manifest:
    """The cluster's own CA (NAME-ca): its certificate and key, and ca.crt as cert-manager's
    CA issuer expects it. Owned by the RaftCluster: it goes when the cluster goes."""
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": spec.ca_secret_name, "namespace": spec.namespace,
                     "labels": dict(labels), "ownerReferences": [owner_reference(spec)]},
        "data": {TLS_CRT: _b64(ca.cert_pem), TLS_KEY: _b64(ca.key_pem),
                 CA_CRT: _b64(ca.cert_pem)},
    }


def ca_from_secret(secret: Mapping[str, Any] | None) -> tuple[Issued, bytes] | str:
    """The CA in a Secret (tls.crt and tls.key; ca.crt, when given, is what to trust, else
    tls.crt): (the CA, the trust bundle), or what is wrong with it, in words."""
    if secret is None:
        return "it does not exist"
    data = decode(secret)
    cert_pem, key_pem = data.get(TLS_CRT), data.get(TLS_KEY)
    if not cert_pem or not key_pem:
        return "it needs tls.crt and tls.key (the CA's certificate and private key)"
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        return f"its tls.crt and tls.key are not a PEM certificate and key ({exc})"
    try:
        constraints = cert.extensions.get_extension_for_oid(
            ExtensionOID.BASIC_CONSTRAINTS).value
        is_ca = constraints.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        return "its tls.crt is not a CA certificate (basicConstraints CA:TRUE)"
    if cert.public_key().public_bytes(serialization.Encoding.DER,
                                      serialization.PublicFormat.SubjectPublicKeyInfo) != \
            key.public_key().public_bytes(serialization.Encoding.DER,  # type: ignore[union-attr]
                                          serialization.PublicFormat.SubjectPublicKeyInfo):
        return "its tls.key is not the private key of its tls.crt"
    first = cert.public_bytes(serialization.Encoding.PEM)
    return Issued(first, key_pem), data.get(CA_CRT) or first


def certificate(spec: ClusterSpec, secret_name: str, common_name: str,
                dns_names: Sequence[str], labels: Mapping[str, str]) -> Manifest:
    """A cert-manager Certificate (cert-manager.io/v1) writing `secret_name`, signed by
    spec.tls.issuerRef, renewed when a third of spec.tls.duration is left. The key is
    regenerated on every renewal (rotationPolicy Always)."""
    ref = spec.tls.issuer_ref
    assert ref is not None
    total = spec.tls.seconds
    body: Manifest = {
        "secretName": secret_name,
        "commonName": common_name,
        "duration": _go_duration(total),
        "renewBefore": _go_duration(total // RENEW_AT_FRACTION),
        "usages": list(USAGES),
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
        "issuerRef": {"name": ref.name, "kind": ref.kind, "group": ref.group},
        "secretTemplate": {"labels": dict(labels)},
    }
    hosts = [n for n in dns_names if not _is_ip(n)]
    ips = [n for n in dns_names if _is_ip(n)]
    if hosts:
        body["dnsNames"] = hosts
    if ips:
        body["ipAddresses"] = ips
    return {
        "apiVersion": "cert-manager.io/v1", "kind": "Certificate",
        "metadata": {"name": secret_name, "namespace": spec.namespace, "labels": dict(labels),
                     "ownerReferences": [owner_reference(spec)]},
        "spec": body,
    }


def decode(secret: Mapping[str, Any] | None) -> dict[str, bytes]:
    """A Secret's data, base64-decoded (keys whose value does not decode are left out)."""
    out: dict[str, bytes] = {}
    for key, value in ((secret or {}).get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value, validate=True)
        except (ValueError, TypeError):
            continue
    return out


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _go_duration(total: int) -> str:
    """Seconds as a Go duration cert-manager reads: 8760h, 90m, 45s."""
    for unit, size in (("h", 3600), ("m", 60)):
        if total % size == 0:
            return f"{total // size}{unit}"
    return f"{total}s"


def rfc3339(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
