"""Certificates for process-level tests: a CA per cluster and one certificate per member, made
with the node's own small CA (``flotilla.node.tls``), and the node flags that use them.

    ca = TestCA(tmp_path / "tls")
    files = ca.member("n1", hosts=["127.0.0.2"])
    NodeProcess("n1", ..., tls=files)             # TLS on both ports, mutual TLS on peers
    KVClient("https://127.0.0.2:2379", ssl_context=ca.client_context())
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from flotilla.node.tls import Issued, client_context, issue, make_ca

__all__ = ["MemberTLS", "TestCA"]


@dataclass(frozen=True)
class MemberTLS:
    """One member's certificate, its key and the CA that signed both it and its peers'."""

    ca_file: Path
    cert_file: Path
    key_file: Path
    #: Clients must present a certificate signed by the CA (``--client-cert-auth``).
    client_cert_auth: bool = False

    def node_args(self) -> list[str]:
        """The node flags: this certificate on the client port and, with mutual TLS against
        the CA, on the peer port."""
        args = ["--cert-file", str(self.cert_file), "--key-file", str(self.key_file),
                "--peer-cert-file", str(self.cert_file), "--peer-key-file", str(self.key_file),
                "--peer-trusted-ca-file", str(self.ca_file)]
        if self.client_cert_auth:
            args += ["--trusted-ca-file", str(self.ca_file), "--client-cert-auth"]
        return args

    def client_context(self) -> ssl.SSLContext:
        """What a test dials this member's client port with: the CA, and with
        ``client_cert_auth`` the member's own certificate (any certificate of the CA will do)."""
        if self.client_cert_auth:
            return client_context(str(self.ca_file), str(self.cert_file), str(self.key_file))
        return client_context(str(self.ca_file))


class TestCA:
    """A CA under ``directory`` (``ca.crt``, ``ca.key``) that issues member and client
    certificates next to it."""

    __test__ = False  # not a test class, whatever its name

    def __init__(self, directory: Path | str, common_name: str = "flotilla test CA") -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.ca = make_ca(common_name)
        self.ca_file = self.directory / "ca.crt"
        self.ca.write(self.ca_file, self.directory / "ca.key")

    def issue(self, name: str, hosts: Iterable[str] = ()) -> tuple[Path, Path]:
        """``name``'s certificate (CN and DNS SAN ``name``, plus ``hosts``) and key files."""
        cert, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        issued: Issued = issue(self.ca, name, list(hosts))
        issued.write(cert, key)
        return cert, key

    def member(self, name: str, hosts: Iterable[str] = (), *,
               client_cert_auth: bool = False) -> MemberTLS:
        """A member's files; ``hosts`` are the addresses others dial it at."""
        cert, key = self.issue(name, hosts)
        return MemberTLS(self.ca_file, cert, key, client_cert_auth)

    def client_context(self, client: str | None = None) -> ssl.SSLContext:
        """A client context that trusts this CA; with ``client``, it also presents a
        certificate issued to that name (for members run with ``--client-cert-auth``)."""
        if client is None:
            return client_context(str(self.ca_file))
        cert, key = self.issue(client)
        return client_context(str(self.ca_file), str(cert), str(key))
