"""How the operator reaches members: their own `/v1/status` (parsed once into the types of
`memberstatus`, re-exported here), and the admin calls a step needs.

A member is reached at its stable DNS name through the headless Service
(`https://NAME-i.NAME-peers.NS.svc:2379`; http without TLS), verified against the cluster's CA
and that name, with the admin token, and with the operator's client certificate when members
ask clients for one. Where the operator runs outside the cluster network (on a laptop), a JSON
file named by `FLOTILLA_OPERATOR_MEMBER_URLS` maps `NS/POD` to `{"client": URL, "peer": URL}`
instead; it is read on every lookup, so whoever starts the members can add them as they come.
With TLS, the host of such a URL must be one of the names on the member's certificate.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from cryptography import x509

from flotilla.client import Client, FlotillaError

from .memberstatus import Configuration, MemberStatus, Progress
from .planner import Action, Step
from .spec import ClusterSpec

__all__ = ["ADMIN_TIMEOUT", "MEMBERSHIP_STEPS", "MEMBER_URLS_ENV", "Configuration",
           "MemberStatus", "Members", "Progress", "call"]

MEMBER_URLS_ENV = "FLOTILLA_OPERATOR_MEMBER_URLS"
STATUS_TIMEOUT = 2.0  # a member slower than this to describe itself counts as not answering
ADMIN_TIMEOUT = 30.0  # joint changes answer once C_new is committed


class Members:
    def __init__(self, spec: ClusterSpec, token: str | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.spec = spec
        self.token = token
        self.ssl_context = ssl_context  # for https members: the cluster's CA (and our cert)

    def _override(self, member: str) -> Mapping[str, str] | None:
        path = os.environ.get(MEMBER_URLS_ENV)
        if not path:
            return None
        try:
            with open(path) as f:
                return json.load(f).get(f"{self.spec.namespace}/{member}")
        except (OSError, ValueError):
            return None

    def client_url(self, member: str) -> str:
        override = self._override(member)
        return override["client"] if override else self.spec.client_url(member)

    def peer_url(self, member: str) -> str:
        override = self._override(member)
        return override["peer"] if override else self.spec.peer_url(member)

    def observe(self, members: Iterable[str]
                ) -> tuple[dict[str, MemberStatus | None], dict[str, int | None]]:
        """Each member's own /v1/status, parsed (None when it does not answer, or answers
        with something that is not a status), and the serial number of the certificate it
        serves on its client port (None when it does not answer, or speaks plain HTTP), all
        asked at once."""
        names = list(members)
        if not names:
            return {}, {}
        with ThreadPoolExecutor(max_workers=min(16, 2 * len(names))) as pool:
            statuses = [pool.submit(self.status, n) for n in names]
            serials = [pool.submit(self.served_serial, n) for n in names]
            return ({n: f.result() for n, f in zip(names, statuses, strict=True)},
                    {n: f.result() for n, f in zip(names, serials, strict=True)})

    def status(self, member: str) -> MemberStatus | None:
        url = self.client_url(member)
        try:
            with Client(url, timeout=STATUS_TIMEOUT, retries=0, token=self.token,
                        ssl_context=self.ssl_context) as c:
                doc = c.status(url)
        except (FlotillaError, ValueError, OSError):
            return None
        return MemberStatus.parse(doc, source=f"{member} ({url})")

    def served_serial(self, member: str) -> int | None:
        url = urlsplit(self.client_url(member))
        if url.scheme != "https" or self.ssl_context is None or url.hostname is None:
            return None
        try:
            with socket.create_connection((url.hostname, url.port or 443),
                                          timeout=STATUS_TIMEOUT) as raw, \
                    self.ssl_context.wrap_socket(raw, server_hostname=url.hostname) as tls:
                der = tls.getpeercert(binary_form=True)
        except (OSError, ValueError):
            return None
        return x509.load_der_x509_certificate(der).serial_number if der else None

    def carry_out(self, action: Action, reachable: Iterable[str]) -> None:
        """One membership step through the admin API of any member that answers (followers
        forward to the leader). Raises FlotillaError when it was refused or failed."""
        urls = [self.client_url(m) for m in reachable]
        with Client(urls, timeout=ADMIN_TIMEOUT, token=self.token,
                    ssl_context=self.ssl_context) as c:
            joining = action.member if action.step is Step.ADD_LEARNER else None
            if joining is None:
                call(c, action, "", "")
            else:
                call(c, action, self.peer_url(joining), self.client_url(joining))

    def snapshot(self, reachable: Iterable[str]) -> dict[str, Any]:
        urls = [self.client_url(m) for m in reachable]
        with Client(urls, timeout=ADMIN_TIMEOUT, token=self.token,
                    ssl_context=self.ssl_context) as c:
            return c.snapshot()

    def move_leader(self, member: str, reachable: Iterable[str]) -> dict[str, Any]:
        """Hand leadership to voter `member` (POST /v1/leader); `{leader, term}` once it
        leads. Raises FlotillaError when it was refused or failed."""
        urls = [self.client_url(m) for m in reachable]
        with Client(urls, timeout=ADMIN_TIMEOUT, token=self.token,
                    ssl_context=self.ssl_context) as c:
            return c.transfer_leader(member)


#: The planner's steps that are a call to the members' admin API (the rest act on pods,
#: volumes or processes, which is each adapter's own business).
MEMBERSHIP_STEPS = frozenset({Step.ADD_LEARNER, Step.CHANGE_VOTERS, Step.TRANSFER_LEADER,
                              Step.REMOVE_MEMBER})


def call(client: Client, action: Action, peer_url: str, client_url: str) -> None:
    """Carry out a membership step with `client`; the URLs are the joining member's (used by
    ADD_LEARNER only). Both adapters take their membership steps through here."""
    if action.step is Step.ADD_LEARNER:
        client.add_member(action.member, peer_url, client_url)
    elif action.step is Step.CHANGE_VOTERS:
        client.set_voters(action.voters)
    elif action.step is Step.TRANSFER_LEADER:
        client.transfer_leader(action.member)
    elif action.step is Step.REMOVE_MEMBER:
        client.remove_member(action.member)
    else:
        raise AssertionError(f"{action.step} is not a membership call")
