"""The Secrets a cluster's members and the operator need before anything runs: the admin
token, the CA and one certificate per member (or, with spec.tls.issuerRef, the cert-manager
Certificates that write them), and how the operator itself dials the members.

Called once per reconcile, before the owned objects: a member's Secret exists before its pod
is created, whether it starts the cluster or joins it later. Certificates the operator signs
are renewed here when a third of their lifetime is left; a member then serves an older
certificate than its Secret holds, and the planner restarts it (one member at a time, the
leader last), which is how a renewed certificate reaches the node: it reads its files once,
at start.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import os
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flotilla.node.config import MIN_TOKEN_BYTES, TOKEN_RECIPE, new_admin_token
from flotilla.node.tls import Issued
from flotilla.node.tls import client_context as node_client_context

from . import certs
from .jobs import foreign
from .kube import ApiError, Kube
from .render import owner_reference
from .spec import ClusterSpec

__all__ = ["SECRETS_INTERVAL_ENV", "Problem", "TlsState", "admin_token", "client_context",
           "ensure", "forget", "problem_from_api", "trusted"]



@dataclass(frozen=True)
class Problem:
    """Why the operator cannot act on the cluster until someone fixes a Secret."""

    reason: str  # a CamelCase word, for the condition and the Warning event
    message: str


@dataclass
class TlsState:
    """What `ensure` found and did."""

    status: dict[str, Any]  # status.tls
    events: list[tuple[str, str, str]] = field(default_factory=list)
    objects: list[dict[str, Any]] = field(default_factory=list)  # cert-manager Certificates
    ready: set[str] = field(default_factory=set)  # members whose Secret holds a certificate
    serials: dict[str, int] = field(default_factory=dict)  # member -> serial in its Secret
    trust: bytes | None = None  # the CA certificates members are verified against
    client_cert: tuple[bytes, bytes] | None = None  # the operator's (cert, key), PEM
    problem: Problem | None = None


# Secrets are read again at most this often (seconds; FLOTILLA_OPERATOR_SECRETS_INTERVAL),
# unless a certificate is due or a Secret is still missing; a member that joins has its own
# Secret read: renewal works in days, and every read is an API call in every round of every
# cluster.
SECRETS_INTERVAL_ENV = "FLOTILLA_OPERATOR_SECRETS_INTERVAL"
_memo: dict[tuple[Any, ...], tuple[float, Any]] = {}
_memo_lock = threading.Lock()


def _interval() -> float:
    try:
        return max(0.0, float(os.environ.get(SECRETS_INTERVAL_ENV) or 60))
    except ValueError:
        return 60.0


def _remembered(key: tuple[Any, ...], now: float) -> Any:
    with _memo_lock:
        found = _memo.get(key)
    return found[1] if found is not None and now < found[0] else None


def _remember(key: tuple[Any, ...], until: float, value: Any) -> None:
    with _memo_lock:
        if len(_memo) > 4096:
            _memo.clear()
        _memo[key] = (until, value)


def forget() -> None:
    """Drop everything remembered: the next round reads every Secret again."""
    with _memo_lock:
        _memo.clear()


def admin_token(kube: Kube, spec: ClusterSpec, now: float | None = None
                ) -> tuple[str | None, Problem | None, list[tuple[str, str, str]]]:
    """The members' admin token: read from spec.adminTokenSecret, or from NAME-admin-token,
    which is created (32 random bytes in hex) when the spec names none and it is missing.
    A named Secret that is missing, lacks the key or holds a token the node refuses (under
    16 bytes) is a Problem: members would not start with it. A good token is remembered
    for the secrets interval."""
    now = time.monotonic() if now is None else now
    key = ("token", spec.uid, spec.name, spec.namespace, spec.admin_token_secret)
    token = _remembered(key, now)
    if token is not None:
        return token, None, []
    token, problem, events = _read_admin_token(kube, spec)
    if token is not None:
        _remember(key, now + _interval(), token)
    return token, problem, events


def _read_admin_token(kube: Kube, spec: ClusterSpec
                      ) -> tuple[str | None, Problem | None, list[tuple[str, str, str]]]:
    ref = spec.admin_token_secret
    secret = kube.get("Secret", spec.namespace, ref.name)
    events: list[tuple[str, str, str]] = []
    if secret is None and spec.admin_token is None:
        token = new_admin_token()
        kube.create({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": ref.name, "namespace": spec.namespace,
                         "labels": dict(spec.labels), "ownerReferences": [owner_reference(spec)]},
            "data": {ref.key: base64.b64encode(token.encode()).decode()},
        })
        events.append(("Normal", "Created", f"Secret {ref.name} (a generated admin token)"))
        return token, None, events
    where = f"the admin token Secret {ref.name}" + (
        " (spec.adminTokenSecret)" if spec.admin_token is not None else "")
    if secret is None:
        return None, Problem("AdminTokenSecretMissing",
                             f"{where} does not exist in namespace {spec.namespace}: create "
                             f"it with the token under the key {ref.key!r}"), events
    value = certs.decode(secret).get(ref.key)
    if value is None:
        return None, Problem("AdminTokenSecretMissing",
                             f"{where} has no key {ref.key!r} (spec.adminTokenSecret.key)"), events
    if len(value) < MIN_TOKEN_BYTES:
        return None, Problem(
            "AdminTokenTooShort",
            f"{where} holds a token of {len(value)} bytes under {ref.key!r}; members refuse "
            f"tokens under {MIN_TOKEN_BYTES} bytes and would not start. Make one with: "
            f"{TOKEN_RECIPE}"), events
    return value.decode("utf-8", "surrogateescape"), None, events


def ensure(kube: Kube, spec: ClusterSpec, members: Sequence[str],
           now: datetime.datetime) -> TlsState:
    """Bring the certificates of `members` (and the operator's client certificate, with
    clientCertAuth) in line with the spec; see the module docstring. What was found is
    remembered for the secrets interval (without its events and objects), or until the
    first certificate is due, for the same members and spec.tls."""
    tls = spec.tls
    key = ("tls", spec.uid, spec.name, spec.namespace, tls, tuple(members))
    clock = time.monotonic()
    found = _remembered(key, clock)
    if found is not None:
        return dataclasses.replace(found, events=[], objects=[])
    state = TlsState({"enabled": tls.enabled, "issuer": tls.issuer})
    if not tls.enabled:
        if tls.legacy:
            state.status["legacy"] = True
        state.ready = set(members)
        return state
    state.status["clientCertAuth"] = tls.client_cert_auth
    if tls.issuer_ref is not None:
        _from_cert_manager(kube, spec, members, state)
    else:
        _signed_here(kube, spec, members, now, state)
    if state.problem is None and state.ready >= set(members):
        due = min([_epoch(c["renewAt"]) - now.timestamp() for c in state.status["certificates"]]
                  or [0.0])
        _remember(key, clock + max(0.0, min(_interval(), due)), state)
    return state


def _epoch(text: str) -> float:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
        tzinfo=datetime.UTC).timestamp()


def _signed_here(kube: Kube, spec: ClusterSpec, members: Sequence[str],
                 now: datetime.datetime, state: TlsState) -> None:
    """The CA and each certificate Secret, read (each remembered on its own for the secrets
    interval, so a member that joins costs the reads of its own Secret only), and issued
    where missing or due."""
    name = spec.ca_secret_name
    assert name is not None
    clock = time.monotonic()
    ca_key = ("ca", spec.uid, spec.namespace, name)
    found: tuple[Issued, bytes] | str | None = _remembered(ca_key, clock)
    if found is None:
        secret = kube.get("Secret", spec.namespace, name)
        if secret is None and spec.tls.secret_name is None:
            ca = certs.new_ca(spec)
            kube.create(certs.ca_secret(spec, ca, spec.labels))
            state.events.append(("Normal", "Created", f"Secret {name} (the cluster's CA)"))
            found = (ca, ca.cert_pem)
        else:
            found = certs.ca_from_secret(secret)
        if not isinstance(found, str):
            _remember(ca_key, clock + _interval(), found)
    if isinstance(found, str):
        state.problem = Problem("CASecretInvalid", f"the CA Secret {name}"
                                + (" (spec.tls.secretName)" if spec.tls.secret_name else "")
                                + f" cannot sign member certificates: {found}")
        return
    ca, trust = found
    state.trust = trust
    ca_info = certs.read(ca.cert_pem)
    assert ca_info is not None
    state.status["caNotAfter"] = certs.rfc3339(ca_info.not_after)
    if now >= ca_info.renew_at:
        state.events.append(("Warning", "CAExpiring", f"the CA in Secret {name} expires at "
                             f"{certs.rfc3339(ca_info.not_after)}; the operator does not "
                             "rotate CAs: see docs/operator.md (TLS)"))
    wanted = [(spec.member_tls_secret(m), m, spec.member_dns_names(m)) for m in members]
    if spec.tls.client_cert_auth:
        wanted.append((spec.client_tls_secret, None, [certs.CLIENT_COMMON_NAME]))
    listed = []
    for secret_name, member, names in wanted:
        kept_key = ("certificate", spec.uid, spec.namespace, secret_name, ca.cert_pem)
        kept = _remembered(kept_key, clock)
        if kept is not None and certs.due(kept[1], names, ca.cert_pem, now) is None:
            _record(state, secret_name, member, *kept, listed)
            continue
        current = kube.get("Secret", spec.namespace, secret_name)
        data = certs.decode(current)
        info = certs.read(data.get(certs.TLS_CRT))
        why = certs.due(info, names, ca.cert_pem, now)
        if why is None and current is not None and foreign(current, spec.uid):
            why = "an earlier RaftCluster of this name left it"
        if why is not None:
            issued = (certs.issue_member(spec, member, ca) if member is not None
                      else certs.issue_client(spec, ca))
            body = certs.tls_secret(spec, secret_name, issued, ca, trust, spec.labels)
            if current is None:
                kube.create(body)
                whose = f"member {member}'s" if member else "the operator's client"
                state.events.append(("Normal", "Created", f"Secret {secret_name} ({whose} "
                                     f"certificate, valid until "
                                     f"{certs.rfc3339(issued.not_after())})"))
            else:
                meta = {k: body["metadata"][k] for k in ("labels", "annotations",
                                                          "ownerReferences")}
                kube.patch("Secret", spec.namespace, secret_name,
                           {"metadata": meta, "data": body["data"]})
                state.events.append(("Normal", "CertificateRenewed", f"Secret {secret_name}: "
                                     f"{why}; the new one is valid until "
                                     f"{certs.rfc3339(issued.not_after())}"))
            data = {certs.TLS_CRT: issued.cert_pem, certs.TLS_KEY: issued.key_pem}
            info = certs.read(issued.cert_pem)
        if info is not None:
            left = (info.renew_at - now).total_seconds()
            _remember(kept_key, clock + max(0.0, min(_interval(), left)), (data, info))
        _record(state, secret_name, member, data, info, listed)
    state.status["certificates"] = listed


def _from_cert_manager(kube: Kube, spec: ClusterSpec, members: Sequence[str],
                       state: TlsState) -> None:
    """Certificates for cert-manager to sign (reconcile creates or patches them), and the
    Secrets it wrote so far. A member whose Secret is not there yet is not `ready`: its pod
    is not created until it is."""
    wanted = [(spec.member_tls_secret(m), m, m, spec.member_dns_names(m)[1:]) for m in members]
    if spec.tls.client_cert_auth:
        wanted.append((spec.client_tls_secret, None, certs.CLIENT_COMMON_NAME, []))
    listed: list[dict[str, Any]] = []
    for secret_name, member, common_name, dns_names in wanted:
        state.objects.append(certs.certificate(spec, secret_name, common_name,
                                               [common_name, *dns_names], spec.labels))
        data = certs.decode(kube.get("Secret", spec.namespace, secret_name))
        info = certs.read(data.get(certs.TLS_CRT))
        if info is None:
            continue
        if state.trust is None and data.get(certs.CA_CRT):
            state.trust = data[certs.CA_CRT]
        _record(state, secret_name, member, data, info, listed)
    state.status["certificates"] = listed


def _record(state: TlsState, secret_name: str, member: str | None,
            data: Mapping[str, bytes], info: certs.CertInfo | None,
            listed: list[dict[str, Any]]) -> None:
    if info is None:
        return
    listed.append({"secret": secret_name, "notAfter": certs.rfc3339(info.not_after),
                   "renewAt": certs.rfc3339(info.renew_at)})
    if member is None:
        if data.get(certs.TLS_KEY):
            state.client_cert = (data[certs.TLS_CRT], data[certs.TLS_KEY])
        return
    state.ready.add(member)
    state.serials[member] = info.serial


def trusted(kube: Kube, spec: ClusterSpec, members: Sequence[str]
            ) -> tuple[bytes | None, tuple[bytes, bytes] | None]:
    """What `ensure` would find, read only (for the final snapshot, when nothing should be
    issued any more): the CA certificates members are verified against, and the operator's
    client certificate and key when members ask for one."""
    if not spec.tls.enabled:
        return None, None
    trust = None
    if spec.ca_secret_name is not None:
        found = certs.ca_from_secret(kube.get("Secret", spec.namespace, spec.ca_secret_name))
        trust = None if isinstance(found, str) else found[1]
    else:
        for member in members:
            data = certs.decode(kube.get("Secret", spec.namespace,
                                         spec.member_tls_secret(member)))
            if data.get(certs.CA_CRT):
                trust = data[certs.CA_CRT]
                break
    client = None
    if spec.tls.client_cert_auth:
        data = certs.decode(kube.get("Secret", spec.namespace, spec.client_tls_secret))
        if data.get(certs.TLS_CRT) and data.get(certs.TLS_KEY):
            client = (data[certs.TLS_CRT], data[certs.TLS_KEY])
    return trust, client


# --- how the operator dials members ----------------------------------------------------------

_contexts: dict[tuple[bytes, bytes | None], ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


def client_context(trust: bytes, client_cert: tuple[bytes, bytes] | None = None
                   ) -> ssl.SSLContext:
    """A context that verifies members against `trust` (and their host names), showing
    `client_cert` when given; one per distinct input, kept (they are reused every round)."""
    key = (trust, client_cert[0] if client_cert else None)
    with _contexts_lock:
        found = _contexts.get(key)
        if found is not None:
            return found
        ctx = node_client_context(trusted_ca_pem=trust,
                                  cert=Issued(*client_cert) if client_cert else None)
        if len(_contexts) > 64:  # certificates renewed many times over a long run
            _contexts.clear()
        _contexts[key] = ctx
        return ctx


def problem_from_api(exc: ApiError, kind: str) -> Problem | None:
    """What a refused create or patch of a cert-manager Certificate means for the user."""
    if exc.status == 403:
        return Problem("CertManagerForbidden", f"the operator may not write {kind}s "
                       "(cert-manager.io): install the chart with rbac.certManager=true")
    if exc.status == 404:
        return Problem("CertManagerMissing", f"this Kubernetes cluster has no {kind} resource "
                       "(cert-manager.io/v1): install cert-manager, or remove "
                       "spec.tls.issuerRef to let the operator sign the certificates")
    return None
