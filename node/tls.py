"""TLS for both ports: contexts from PEM files, the names a peer's certificate gives, and a
small certificate authority (used by `flotilla up --tls`, the operator and the tests).

A member's certificate names it: its common name or one of its DNS subject alternative names
equals the member's `--name`, as etcd's `--peer-cert-allowed-cn` checks a peer's CN. The same
certificate serves the member's ports (so its SANs also hold the host names and IP addresses
others dial) and identifies it when it dials a peer, so it carries both the serverAuth and the
clientAuth extended key usages.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from flotilla.node.storage.fsutil import write_atomic

#: Certificates `issue` makes live this long unless told otherwise; the operator renews them
#: when a third of that is left.
DEFAULT_DAYS = 365
CA_DAYS = 3650


class TLSError(ValueError):
    """A certificate, key or CA file that cannot be used: the message names the file."""


def server_context(cert_file: str, key_file: str, trusted_ca_file: str | None = None,
                   require_client_cert: bool = False) -> ssl.SSLContext:
    """The context a port listens with. With `require_client_cert`, a client must present a
    certificate signed by `trusted_ca_file` or the handshake fails."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(ctx, cert_file, key_file)
    if trusted_ca_file:
        _load_ca(ctx, trusted_ca_file)
    if require_client_cert:
        if not trusted_ca_file:
            raise TLSError("requiring client certificates needs a trusted CA file")
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(trusted_ca_file: str | None = None, cert_file: str | None = None,
                   key_file: str | None = None, *, trusted_ca_pem: bytes | None = None,
                   cert: Issued | None = None) -> ssl.SSLContext:
    """The context a member or a client dials with: it verifies the server against
    `trusted_ca_file` (or the PEM `trusted_ca_pem`; else the system's CAs) and the host name it
    dials, and presents `cert_file` (or the in-memory `cert`) when given (mutual TLS)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if trusted_ca_pem:
        ctx.load_verify_locations(cadata=trusted_ca_pem.decode())
    elif trusted_ca_file:
        _load_ca(ctx, trusted_ca_file)
    else:
        ctx.load_default_certs()
    if cert is not None:
        # load_cert_chain reads files only: a private directory, gone right after.
        with tempfile.TemporaryDirectory(prefix="flotilla-tls-") as folder:
            cert_path, key_path = Path(folder) / "tls.crt", Path(folder) / "tls.key"
            cert.write(cert_path, key_path)
            _load_chain(ctx, str(cert_path), str(key_path))
    elif cert_file:
        _load_chain(ctx, cert_file, key_file or cert_file)
    return ctx


def _load_chain(ctx: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except FileNotFoundError as exc:
        raise TLSError(f"{exc.filename}: no such file") from None
    except PermissionError as exc:
        raise TLSError(f"{exc.filename}: permission denied") from None
    except ssl.SSLError as exc:
        raise TLSError(f"{cert_file} and {key_file} are not a PEM certificate and its "
                       f"private key ({exc.reason or exc})") from None


def _load_ca(ctx: ssl.SSLContext, ca_file: str) -> None:
    try:
        ctx.load_verify_locations(cafile=ca_file)
    except FileNotFoundError:
        raise TLSError(f"{ca_file}: no such file") from None
    except PermissionError:
        raise TLSError(f"{ca_file}: permission denied") from None
    except ssl.SSLError as exc:
        raise TLSError(f"{ca_file} holds no PEM CA certificate ({exc.reason or exc})") from None


def names(peercert: dict | None) -> frozenset[str]:
    """The names a verified certificate (`SSLSocket.getpeercert()`) gives its holder: the
    subject's common names and the DNS subject alternative names."""
    if not peercert:
        return frozenset()
    found = {value for rdn in peercert.get("subject", ()) for key, value in rdn
             if key == "commonName"}
    found.update(value for key, value in peercert.get("subjectAltName", ()) if key == "DNS")
    return frozenset(found)


# --- a small certificate authority -----------------------------------------------------------


def expires(cert_pem: bytes) -> datetime.datetime:
    """When the (first) PEM certificate in `cert_pem` expires, UTC. ValueError if unreadable."""
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def not_after(self) -> datetime.datetime:
        return expires(self.cert_pem)

    def write(self, cert_path: Path, key_path: Path) -> None:
        """Both files, readable by their owner only (0600), each replaced whole."""
        write_atomic(cert_path, self.cert_pem)
        write_atomic(key_path, self.key_pem)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(common_name: str, days: int = CA_DAYS) -> Issued:
    """A self-signed CA certificate that can sign member and client certificates."""
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def issue(ca: Issued, common_name: str, hosts: Iterable[str] = (), days: int = DEFAULT_DAYS,
          ) -> Issued:
    """A certificate signed by `ca` for `common_name`, valid for TLS servers and clients.
    `hosts` are its other names: IP addresses become IP SANs, anything else a DNS SAN (the
    common name is always a DNS SAN too, so it names the holder either way)."""
    ca_cert = ca.certificate
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    key = _key()
    sans: list[x509.GeneralName] = []
    for host in dict.fromkeys([common_name, *hosts]):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=True,
                                     content_commitment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=False, crl_sign=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                              ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


@dataclass(frozen=True)
class NodeContexts:
    """A member's TLS contexts, built once at start from its flags (a TLSError names the file
    that cannot be used). None where that side speaks plain HTTP."""

    peer_server: ssl.SSLContext | None = None  # the peer port: mutual TLS
    peer_client: ssl.SSLContext | None = None  # dialling peers, with this member's certificate
    client_server: ssl.SSLContext | None = None  # the client/admin port
    forward_client: ssl.SSLContext | None = None  # forwarding a client request to the leader

    @classmethod
    def from_config(cls, cfg) -> NodeContexts:
        peer_server = peer_client = client_server = None
        if cfg.peer_cert_file:
            peer_server = server_context(cfg.peer_cert_file, cfg.peer_key_file,
                                         cfg.peer_trusted_ca_file, require_client_cert=True)
            peer_client = client_context(cfg.peer_trusted_ca_file, cfg.peer_cert_file,
                                         cfg.peer_key_file)
        if cfg.cert_file:
            client_server = server_context(cfg.cert_file, cfg.key_file, cfg.trusted_ca_file,
                                           require_client_cert=cfg.client_cert_auth)
        # The leader's client port is verified against the client CA, else the peer CA (one CA
        # usually signs both); with --client-cert-auth this member shows its own certificate.
        forward_client = None
        if cfg.cert_file or cfg.peer_cert_file:
            forward_client = client_context(
                cfg.trusted_ca_file or cfg.peer_trusted_ca_file,
                cfg.cert_file if cfg.client_cert_auth else None,
                cfg.key_file if cfg.client_cert_auth else None)
        return cls(peer_server, peer_client, client_server, forward_client)
