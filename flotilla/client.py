"""The Python client of a Flotilla cluster: key-value and admin calls over the HTTP API.

Only the standard library is used (``http.client``, one keep-alive connection per member with
TCP_NODELAY), so scripts can use it without aiohttp; ``https://`` endpoints take their TLS
context from ``flotilla.node.tls``, the one the members dial each other with.

What a call does for you (docs/contract.md, "The client API"):

* **Leader discovery.** Any member serves any request (followers forward to the leader), but
  going to the leader saves a hop. The client asks ``GET /v1/status`` of an endpoint, learns
  ``members[leader].client_url`` and sends there; when that URL stops answering it falls back
  to the endpoints it was given, round-robin, and discovers again.
* **Retries.** Connection errors, timeouts and ``503`` (no leader; ``Retry-After`` is honoured)
  are retried with exponential backoff until ``retries`` re-sends or ``timeout`` seconds are
  used up; then ``Unavailable`` is raised. ``timeout`` bounds the whole call, retries included.
  With ``stop_when_refused=True`` a call that finds every endpoint refusing connections (nothing
  listens there: a stopped cluster) raises ``Unreachable`` at once instead.
* **Exactly-once writes.** Every put and delete carries ``Flotilla-Client: <client_id>`` and
  ``Flotilla-Seq: <n>``, a new ``n`` per call; a retry re-sends the same pair, so a write whose
  answer was lost is applied once and the retry gets the first outcome.

A ``Client`` may be shared between threads: calls are serialised (one sequence number in flight
keeps the server's session window simple). Use a client per thread for parallel requests.

Sessions are per ``client_id``: two live clients must not share one unless the second one
continues the sequence (``first_seq``), or the server answers the second one's writes with the
first one's recorded outcomes.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import quote, urlencode, urlsplit

__all__ = [
    "BadRequest",
    "Client",
    "Conflict",
    "DeleteResult",
    "FlotillaError",
    "GetResult",
    "InvalidConfig",
    "ListResult",
    "NotFound",
    "PreconditionFailed",
    "PutResult",
    "TLSFailure",
    "TooLarge",
    "Unauthorized",
    "Unavailable",
    "Unreachable",
    "key_path",
    "normalize_endpoint",
]

#: 503 codes that prove a request was refused before anything was done with it.
_NOT_ACTED_ON = ("no_leader", "overloaded")
#: What a request can raise when its answer never arrived.
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)
#: ...and, of those, what a server closing an idle keep-alive connection looks like.
_STALE_CONNECTION = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


# --- errors -------------------------------------------------------------------------------


class FlotillaError(Exception):
    """An error answer (``{"error", "code"}``) or a cluster that could not be reached.

    ``status`` is the HTTP status (None when no answer arrived), ``code`` the error's word
    (``not_found``, ``precondition_failed``, ``unavailable``...), ``message`` its sentence.
    """

    def __init__(self, message: str, *, status: int | None = None, code: str = "error",
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.headers = dict(headers or {})

    def __str__(self) -> str:
        prefix = f"{self.status} {self.code}" if self.status else self.code
        return f"{prefix}: {self.message}"


class BadRequest(FlotillaError):
    """400: the request was refused before it reached the log; fix it, do not retry it."""


class Unauthorized(FlotillaError):
    """401: an admin call needs the cluster's admin token (``Client(token=...)``)."""


class NotFound(FlotillaError):
    """404: no such member (or key, for calls that do not return None for a missing key)."""


class Conflict(FlotillaError):
    """409: another membership change runs, the member exists, or a stale sequence number."""


class PreconditionFailed(FlotillaError):
    """412: a compare-and-set's ``prev_index`` did not match; ``mod_index`` is the key's."""

    @property
    def mod_index(self) -> int | None:
        return _int_or_none(self.headers.get("flotilla-mod-index"))


class TooLarge(FlotillaError):
    """413: the value is larger than the cluster's ``--max-value-bytes``."""


class InvalidConfig(FlotillaError):
    """422: a configuration the cluster will not take (e.g. a voter that is not a caught-up
    learner, or removing the last voter)."""


class Unavailable(FlotillaError):
    """No member could serve the call within the timeout (no leader, no quorum, unreachable).

    For a write the outcome is unknown; retrying it with the same client is still safe only
    through the exactly-once session, which this client already used for every attempt.
    """


class Unreachable(Unavailable):
    """Every endpoint refused the connection during one call: no process listens at any of
    them (``Client(stop_when_refused=True)`` only). Waiting would not help, unlike a
    missing leader: an election ends by itself, a stopped member does not start by itself."""


class TLSFailure(FlotillaError):
    """A connection that cannot work as configured, so it is not retried (no answer arrived):
    ``code`` says why. ``untrusted_certificate``: the member's certificate is not signed by a
    CA the client trusts (``ca_file``), has expired, or does not name the host dialled.
    ``client_certificate``: the member (run with ``--client-cert-auth``) wants a client
    certificate signed by its CA (``cert_file``, ``key_file``). ``not_tls``: an ``https://``
    endpoint where the member speaks plain HTTP. ``tls_required``: an ``http://`` endpoint
    where the member speaks TLS."""


_BY_STATUS: dict[int, type[FlotillaError]] = {
    400: BadRequest, 401: Unauthorized, 404: NotFound, 409: Conflict, 412: PreconditionFailed,
    413: TooLarge, 422: InvalidConfig, 503: Unavailable,
}


# --- results --------------------------------------------------------------------------------


class PutResult(NamedTuple):
    """``index``: the write's commit index; ``mod_index``: the key's new mod index (the same,
    unless the answer is a retried write's first outcome)."""

    index: int
    mod_index: int | None


class GetResult(NamedTuple):
    """``value`` is None when the key does not exist; ``index`` is the log index the answer
    reflects, ``mod_index`` the index that last changed the key (None when missing)."""

    value: bytes | None
    index: int | None
    mod_index: int | None

    @property
    def found(self) -> bool:
        return self.value is not None


class DeleteResult(NamedTuple):
    index: int
    deleted: bool


class ListResult(NamedTuple):
    index: int
    keys: list[str]


@dataclass(frozen=True)
class _Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes
    url: str

    def json(self) -> Any:
        return json.loads(self.body)


# --- helpers --------------------------------------------------------------------------------


def normalize_endpoint(endpoint: str) -> str:
    """``127.0.0.1:2379`` or ``http://127.0.0.1:2379/`` -> ``http://127.0.0.1:2379``
    (``https://`` stays https)."""
    text = endpoint.strip()
    parts = urlsplit(text if "//" in text else "http://" + text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
        raise ValueError(f"expected a client URL like http://127.0.0.1:2379 or "
                         f"https://10.0.0.1:2379, got {endpoint!r}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}:{parts.port}"


def key_path(key: str) -> str:
    """``/v1/kv/{key}`` with every reserved character of the key percent-encoded.

    ``/`` is encoded too: a proxy or URL library between us and the member may collapse
    ``//`` or resolve ``..`` in a path, and a key must arrive exactly as given.
    """
    if not isinstance(key, str) or not key:
        raise ValueError(f"a key is a non-empty string, not {key!r}")
    return "/v1/kv/" + quote(key, safe="")


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _retry_after(headers: Mapping[str, str]) -> float | None:
    raw = headers.get("retry-after")
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except ValueError:
        return None  # an HTTP date: no member sends one; fall back to our own backoff


class _NoDelayConnection(http.client.HTTPConnection):
    """Small requests leave at once instead of waiting on Nagle's algorithm."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _NoDelayTLSConnection(http.client.HTTPSConnection):
    """The same over TLS."""

    def connect(self) -> None:
        super().connect()
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


#: OpenSSL's reasons for a member refusing this client's certificate, or the lack of one.
_CLIENT_CERT_REFUSED = frozenset({
    "TLSV13_ALERT_CERTIFICATE_REQUIRED", "TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN", "SSLV3_ALERT_CERTIFICATE_EXPIRED",
    "TLSV1_ALERT_ACCESS_DENIED", "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE",
})
#: How a TLS 1.2 handshake without a client certificate ends at a server that wants one.
_NO_CLIENT_CERT = _CLIENT_CERT_REFUSED | {"eof", "SSLV3_ALERT_HANDSHAKE_FAILURE"}
#: OpenSSL's reasons for a server that answered a TLS client hello with something else.
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE",
                      "HTTP_REQUEST", "UNKNOWN_PROTOCOL"})


def _tls_failure(url: str, exc: ssl.SSLError) -> TLSFailure | None:
    """What a TLS error on ``url`` means, when retrying cannot change it (else None)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or exc.reason or str(exc)
        return TLSFailure(f"{url}'s certificate is not trusted ({why}): give the CA that "
                          "signed the members' certificates", code="untrusted_certificate")
    if exc.reason in _CLIENT_CERT_REFUSED:
        return TLSFailure(f"{url} wants a client certificate signed by its CA ({exc.reason}):"
                          " this client showed none, or one it does not trust",
                          code="client_certificate")
    if exc.reason in _NOT_TLS:
        plain = "http://" + url.partition("://")[2]
        return TLSFailure(f"{url} does not speak TLS ({exc.reason}): use {plain}",
                          code="not_tls")
    return None


def _tls_context(ca_file: str | None = None, cert_file: str | None = None,
                 key_file: str | None = None) -> ssl.SSLContext:
    """The context https:// members are dialled with (`flotilla.node.tls.client_context`:
    verified against `ca_file`, else the system's CAs; `cert_file` shown when the members ask
    for a certificate). Imported here, so that plain http:// clients never load it."""
    from flotilla.node.tls import client_context

    return client_context(ca_file, cert_file, key_file)


def _handshake(host: str, port: int, timeout: float, *, tls12: bool = False) -> str:
    """How a TLS handshake without a client certificate (and without checking who answers:
    this only explains a failure) ends at host:port: ``ok``; ``eof`` (the server closed the
    connection during the handshake); OpenSSL's reason for an alert the server sent
    (``..._ALERT_...``: a TLS server said no); ``not_tls``; or ``no_answer``. ``tls12`` caps
    the version at TLS 1.2, where a server checks a client's certificate before the handshake
    ends."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if tls12:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock, \
                ctx.wrap_socket(sock, server_hostname=host):
            return "ok"
    except (ssl.SSLEOFError, ConnectionResetError):
        return "eof"
    except ssl.SSLError as exc:
        return exc.reason if "_ALERT_" in (exc.reason or "") else "not_tls"
    except OSError:
        return "no_answer"


# --- the client -----------------------------------------------------------------------------


class Client:
    """A connection to one Flotilla cluster through any of its members' client URLs.

    ``endpoints``: client URLs (``http://127.0.0.1:2379``), a list or one comma-separated
    string. ``timeout``: seconds one call may take, retries included. ``token``: the admin
    token for admin calls (the members' ``--admin-token``; a member started without one keeps
    the token it generated in ``<data-dir>/admin-token``). ``client_id``: the exactly-once
    session name (default: a fresh random one). ``retries``: re-sends after the first attempt.
    ``first_seq``: the first sequence number (to continue a session of ``client_id``).
    ``prefer_leader=False`` sends to the endpoints themselves, round-robin, and lets them
    forward: to spread serializable reads, or to show forwarding.
    ``ca_file`` (the CA that signed the members' certificates), ``cert_file`` and ``key_file``
    (this client's certificate, for members run with ``--client-cert-auth``), or a ready
    ``ssl_context``: for ``https://`` endpoints.
    ``stop_when_refused=True`` raises ``Unreachable`` as soon as every endpoint has refused a
    connection during a call, instead of retrying until ``timeout``: right for a command a user
    waits on, wrong for a program riding out a restart of the whole cluster (off by default).
    """

    def __init__(
        self,
        endpoints: Iterable[str] | str,
        *,
        timeout: float = 5.0,
        token: str | None = None,
        client_id: str | None = None,
        retries: int = 10,
        first_seq: int = 1,
        backoff: float = 0.05,
        max_backoff: float = 1.0,
        prefer_leader: bool = True,
        stop_when_refused: bool = False,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = endpoints.split(",")
        self.endpoints = list(dict.fromkeys(normalize_endpoint(e) for e in endpoints
                                            if e.strip()))
        if not self.endpoints:
            raise ValueError("give at least one endpoint, e.g. http://127.0.0.1:2379")
        if timeout <= 0 or retries < 0 or first_seq < 1:
            raise ValueError("timeout must be > 0, retries >= 0 and first_seq >= 1")
        self.timeout = timeout
        self.token = token
        self.client_id = client_id or f"py-{uuid.uuid4().hex}"
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.prefer_leader = prefer_leader
        self.stop_when_refused = stop_when_refused
        self._ssl_context = ssl_context
        if ssl_context is None and (ca_file or cert_file):
            self._ssl_context = _tls_context(ca_file, cert_file, key_file)
        self._seq = first_seq - 1
        self._leader_url: str | None = None
        # Where calls go while it answers: the leader once known; else, for a short while, a
        # member that answered but knew no leader's URL (it forwards), so that not every call
        # asks for the status first.
        self._target: str | None = None
        self._target_until = 0.0
        self._next_endpoint = 0
        self._conns: dict[str, _NoDelayConnection] = {}
        self._used: set[str] = set()  # URLs whose connection completed an exchange already
        self._lock = threading.RLock()
        self._rng = random.Random()

    def __repr__(self) -> str:
        return f"Client({self.endpoints!r}, leader={self._leader_url!r})"

    # --- key-value ------------------------------------------------------------------------

    def put(self, key: str, value: bytes, prev_index: int | None = None) -> PutResult:
        """Write ``value`` under ``key``. With ``prev_index`` it is a compare-and-set on the
        key's mod index (0: the key must not exist) and raises ``PreconditionFailed``."""
        if not isinstance(value, bytes | bytearray | memoryview):
            raise TypeError(f"value must be bytes, not {type(value).__name__} (encode it)")
        query = {} if prev_index is None else {"prev_index": int(prev_index)}
        answer = self._write("PUT", key_path(key), bytes(value), query)
        return PutResult(_int_or_none(answer.headers.get("flotilla-index")) or 0,
                         _int_or_none(answer.headers.get("flotilla-mod-index")))

    def get(self, key: str, consistency: str = "linearizable") -> GetResult:
        """Read ``key``: its value is None when it does not exist. ``linearizable`` (default)
        reflects every write acknowledged before the call; ``serializable`` answers from the
        member's local state, possibly stale, and works without a leader."""
        if consistency not in ("linearizable", "serializable"):
            raise ValueError("consistency is 'linearizable' or 'serializable'")
        query = {} if consistency == "linearizable" else {"consistency": consistency}
        answer = self._call("GET", key_path(key), query=query, ok=(200, 404))
        index = _int_or_none(answer.headers.get("flotilla-index"))
        if answer.status == 404:
            return GetResult(None, index, None)
        return GetResult(answer.body, index, _int_or_none(answer.headers.get("flotilla-mod-index")))

    def delete(self, key: str) -> DeleteResult:
        """Delete ``key``; ``deleted`` says whether it existed."""
        doc = self._write("DELETE", key_path(key), None, {}).json()
        return DeleteResult(int(doc["index"]), bool(doc["deleted"]))

    def list(self, prefix: str = "", limit: int | None = None,
             consistency: str = "linearizable") -> ListResult:
        """Keys starting with ``prefix``, ascending, at most ``limit`` of them."""
        query: dict[str, Any] = {"prefix": prefix}
        if limit is not None:
            query["limit"] = int(limit)
        if consistency != "linearizable":
            query["consistency"] = consistency
        doc = self._call("GET", "/v1/kv", query=query).json()
        return ListResult(int(doc["index"]), list(doc["keys"]))

    # --- any state machine ----------------------------------------------------------------

    def command(self, command: bytes) -> Any:
        """Propose ``command`` to the cluster's state machine (``POST /v1/command``) and
        return what its ``apply`` returned. A command carries no exactly-once session, so it
        is resent only when the cluster proves it was not proposed (no leader yet, overloaded,
        connection refused); any other failure raises at once, ``Unavailable`` with code
        ``outcome_unknown`` when it may have been applied (make commands idempotent, e.g.
        with unique ids, to retry those)."""
        if not isinstance(command, bytes | bytearray | memoryview):
            raise TypeError(f"command must be bytes, not {type(command).__name__} (encode it)")
        return self._call("POST", "/v1/command", bytes(command),
                          headers={"Content-Type": "application/octet-stream"},
                          resend=False).json()

    def query(self, request: Any = None, consistency: str = "linearizable") -> Any:
        """Ask the cluster's state machine ``request`` (any JSON value; ``POST /v1/query``)
        and return its answer. ``linearizable`` (default) reflects every command acknowledged
        before the call; ``serializable`` answers from the member's local state."""
        if consistency not in ("linearizable", "serializable"):
            raise ValueError("consistency is 'linearizable' or 'serializable'")
        query = {} if consistency == "linearizable" else {"consistency": consistency}
        body = json.dumps(request).encode()
        return self._call("POST", "/v1/query", body, query=query,
                          headers={"Content-Type": "application/json"}).json()

    # --- admin ----------------------------------------------------------------------------

    def status(self, endpoint: str | None = None) -> dict[str, Any]:
        """The leader's ``/v1/status`` document; or, with ``endpoint``, that member's own
        (one member, no failover: asking a given member is the point)."""
        if endpoint is not None:
            return self._call("GET", "/v1/status", only=normalize_endpoint(endpoint)).json()
        with self._lock:
            deadline = time.monotonic() + self.timeout
            last = "no member answered"
            while True:
                answer = self._call("GET", "/v1/status", deadline=deadline,
                                    prefer_leader=True)
                doc = answer.json()
                if doc.get("role") == "leader":
                    self._aim(answer.url, leader=True)
                    return doc
                leader_url = self._leader_from(doc)
                if leader_url is not None and leader_url != answer.url:
                    try:
                        leader_doc = self._call(
                            "GET", "/v1/status", only=leader_url,
                            deadline=min(deadline, time.monotonic() + 1.0)).json()
                    except Unavailable as exc:
                        last = str(exc)
                    else:
                        if leader_doc.get("role") == "leader":
                            self._aim(leader_url, leader=True)
                            return leader_doc
                else:
                    last = f"{doc.get('name')} knows no leader (role {doc.get('role')})"
                self._forget_target()
                if time.monotonic() + self.backoff >= deadline:
                    raise Unavailable(f"no leader within {self.timeout:g}s: {last}",
                                      code="unavailable")
                time.sleep(self.backoff)

    def add_member(self, name: str, peer_url: str, client_url: str) -> dict[str, Any]:
        """Add ``name`` as a learner; returns once that configuration is committed."""
        return self._admin("POST", "/v1/members",
                           {"name": name, "peer_url": peer_url, "client_url": client_url},
                           done_if=("member_exists",))

    def set_voters(self, voters: Iterable[str]) -> dict[str, Any]:
        """Joint consensus to exactly these voters; returns once C_new is committed."""
        return self._admin("PUT", "/v1/config", {"voters": sorted(voters)})

    def remove_member(self, name: str) -> dict[str, Any]:
        """Remove a learner, or a voter through joint consensus."""
        return self._admin("DELETE", "/v1/members/" + quote(name, safe=""), None,
                           done_if=("not_found",))

    def transfer_leader(self, name: str) -> dict[str, Any]:
        """Hand leadership to voter ``name``; returns once it leads."""
        result = self._admin("POST", "/v1/leader", {"name": name})
        self._forget_target()
        return result

    def snapshot(self) -> dict[str, Any]:
        """Snapshot the leader now: ``{index, term, bytes, location}``."""
        return self._admin("POST", "/v1/snapshot", None)

    # --- lifecycle -----------------------------------------------------------------------

    def close(self) -> None:
        with self._lock:
            for conn in self._conns.values():
                conn.close()
            self._conns.clear()
            self._used.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def leader_url(self) -> str | None:
        """The leader's client URL as last learned (None until discovered, or after it failed)."""
        return self._leader_url

    # --- calls ----------------------------------------------------------------------------

    def _write(self, method: str, path: str, body: bytes | None,
               query: Mapping[str, Any]) -> _Answer:
        with self._lock:
            self._seq += 1
            session = {"Flotilla-Client": self.client_id, "Flotilla-Seq": str(self._seq)}
            return self._call(method, path, body, query=query, headers=session)

    def _admin(self, method: str, path: str, doc: Any,
               done_if: tuple[str, ...] = ()) -> dict[str, Any]:
        """An admin call. A retry of a call whose first attempt may have been applied can be
        refused for that very reason (``done_if`` codes): that answer means success."""
        body = None if doc is None else json.dumps(doc).encode()
        headers = {"Content-Type": "application/json"} if body is not None else {}
        attempts: list[int] = []
        try:
            answer = self._call(method, path, body, headers=headers, attempts=attempts)
        except FlotillaError as exc:
            if exc.code in done_if and len(attempts) > 1:
                return {}
            raise
        return answer.json() if answer.body else {}

    def _call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        ok: tuple[int, ...] = (200,),
        only: str | None = None,
        deadline: float | None = None,
        prefer_leader: bool | None = None,
        attempts: list[int] | None = None,
        resend: bool = True,
    ) -> _Answer:
        """Send until an answer that is not worth retrying, or until time or retries run out.

        ``only`` pins the call to one member. ``attempts`` (out) collects attempt numbers, so a
        caller can tell whether the answer it got was to a re-send. ``resend=False`` (a request
        that must not be applied twice): resend only what was surely not acted on (a refused
        connection, a 503 ``no_leader`` or ``overloaded``), else raise at once.
        """
        target = path + ("?" + urlencode(query, quote_via=quote) if query else "")
        all_headers = dict(headers or {})
        if self.token is not None:
            all_headers.setdefault("Authorization", f"Bearer {self.token}")
        if prefer_leader is None:
            prefer_leader = self.prefer_leader
        with self._lock:
            began = time.monotonic()
            deadline = deadline if deadline is not None else began + self.timeout
            failed: set[str] = set()  # members that did not answer during this call
            # Endpoints whose latest attempt in this call was refused (nothing listens there).
            refused: set[str] = set()
            candidates = {only} if only else set(self.endpoints)
            delay = self.backoff
            last = "no attempt was made"
            for attempt in range(self.retries + 1):
                if attempts is not None:
                    attempts.append(attempt)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                url = only or self._pick(failed, deadline, prefer_leader, refused)
                if self.stop_when_refused and candidates <= refused:
                    raise Unreachable(_refused_by(sorted(candidates)), code="unreachable")
                if url is None:
                    last = "no member answered: " + ", ".join(self.endpoints)
                    failed.clear()
                    pause = delay
                    delay = min(self.max_backoff, delay * 2)
                    time.sleep(min(pause, max(0.0, deadline - time.monotonic() - 0.05)))
                    continue
                try:
                    answer = self._exchange(url, method, target, body, all_headers,
                                            min(remaining, self.timeout))
                except _TRANSPORT_ERRORS as exc:
                    if not resend and not isinstance(exc, ConnectionRefusedError):
                        raise Unavailable(f"{method} {path}: {url} did not answer "
                                          f"({_describe(exc)}); whether it was acted on is "
                                          "unknown", code="outcome_unknown") from None
                    last = f"{url} did not answer: {_describe(exc)}"
                    failed.add(url)
                    if isinstance(exc, ConnectionRefusedError):
                        refused.add(url)
                        if self.stop_when_refused and candidates <= refused:
                            raise Unreachable(_refused_by(sorted(candidates)),
                                              code="unreachable") from None
                    else:
                        refused.discard(url)
                    if url in (self._target, self._leader_url):
                        self._forget_target()
                    if only is None and not set(self.endpoints) <= failed:
                        continue  # another member may answer at once: no need to wait
                    failed.clear()
                    pause = delay
                else:
                    refused.discard(url)
                    if answer.status in ok:
                        return answer
                    if answer.status != 503 or (not resend
                                                and _code(answer) not in _NOT_ACTED_ON):
                        raise _error_from(answer)
                    last = f"{url} answered 503: {_sentence(answer)}"
                    self._forget_target()
                    # An overloaded leader asks for Retry-After; "no leader yet" is over
                    # within an election, so it is retried on the client's own, shorter
                    # backoff (Retry-After, whole seconds, is then only an upper bound).
                    retry_after = _retry_after(answer.headers)
                    if retry_after is None:
                        pause = delay
                    elif _code(answer) == "overloaded":
                        pause = retry_after
                    else:
                        pause = min(delay, retry_after)
                delay = min(self.max_backoff, delay * 2)
                pause *= 0.8 + 0.4 * self._rng.random()  # clients that failed together spread
                if time.monotonic() + pause >= deadline:
                    # Sleeping past the deadline helps nobody; one last try just before it.
                    pause = max(0.0, deadline - time.monotonic() - 0.05)
                time.sleep(pause)
            raise Unavailable(f"{method} {path} gave up after {attempt + 1} attempt(s) in "
                              f"{time.monotonic() - began:.1f}s; last: {last}",
                              code="unavailable")

    def _pick(self, failed: set[str], deadline: float, prefer_leader: bool,
              refused: set[str]) -> str | None:
        """The member to send to: the known leader, else the leader an endpoint names, else
        that endpoint; None when every endpoint failed during this call. Endpoints that
        refuse the connection are added to ``refused``, those that answer taken out."""
        target = self._target
        if (prefer_leader and target and target not in failed
                and (target == self._leader_url or time.monotonic() < self._target_until)):
            return target
        for _ in range(len(self.endpoints)):
            url = self.endpoints[self._next_endpoint % len(self.endpoints)]
            self._next_endpoint += 1
            if url in failed:
                continue
            if not prefer_leader:
                return url
            alive, leader = self._discover(url, deadline, refused)
            if not alive:
                failed.add(url)
                continue
            if leader is not None and leader not in failed:
                self._aim(leader, leader=True)
                return leader
            self._aim(url, leader=False)
            return url
        return None

    def _aim(self, url: str, *, leader: bool) -> None:
        self._target = url
        self._leader_url = url if leader else None
        if not leader:
            self._target_until = time.monotonic() + 1.0

    def _forget_target(self) -> None:
        self._target = self._leader_url = None

    def _discover(self, url: str, deadline: float,
                  refused: set[str]) -> tuple[bool, str | None]:
        """Ask ``url`` who leads: (whether it answered, the leader's client URL if known)."""
        try:
            answer = self._exchange(url, "GET", "/v1/status", None, {},
                                    max(0.05, min(1.0, deadline - time.monotonic())))
            refused.discard(url)
            doc = answer.json() if answer.status == 200 else {}
        except ConnectionRefusedError:
            refused.add(url)
            return False, None
        except _TRANSPORT_ERRORS:
            refused.discard(url)
            return False, None
        except ValueError:
            return True, None
        return True, self._leader_from(doc if isinstance(doc, dict) else {})

    @staticmethod
    def _leader_from(doc: Mapping[str, Any]) -> str | None:
        leader = doc.get("leader")
        member = (doc.get("members") or {}).get(leader) if leader else None
        url = member.get("client_url") if isinstance(member, dict) else None
        try:
            return normalize_endpoint(url) if url else None
        except ValueError:
            return None

    def _exchange(self, url: str, method: str, target: str, body: bytes | None,
                  headers: Mapping[str, str], timeout: float) -> _Answer:
        """One request on ``url``'s keep-alive connection.

        A server may close an idle keep-alive connection just as we reuse it; then the request
        goes once more on a fresh connection at once, without counting as a retry, when sending
        it twice is harmless: a read, or a write carrying its exactly-once session. Anything
        else goes through the caller's retry rules."""
        resendable = method == "GET" or "Flotilla-Seq" in headers
        reused = url in self._used and url in self._conns
        try:
            return self._exchange_once(url, method, target, body, headers, timeout)
        except _STALE_CONNECTION as exc:
            if not reused:
                self._explain_closed(url, exc, timeout)
            if not (reused and resendable):
                raise
        try:
            return self._exchange_once(url, method, target, body, headers, timeout)
        except _STALE_CONNECTION as exc:
            self._explain_closed(url, exc, timeout)
            raise

    @staticmethod
    def _explain_closed(url: str, exc: BaseException, timeout: float) -> None:
        """A fresh connection closed without an answer. Raise TLSFailure, rather than retry
        what can never work, when a TLS server listens behind an http:// URL, or when the
        member behind an https:// URL wants a client certificate (it closes a connection
        whose certificate it does not trust, or that has none, right after the handshake)."""
        parts = urlsplit(url)
        if not (parts.hostname and parts.port):
            return
        probe = min(1.0, timeout)
        if parts.scheme == "http":
            ended = _handshake(parts.hostname, parts.port, probe)
            if ended == "ok" or "_ALERT_" in ended:
                raise TLSFailure(f"{url} speaks TLS and closed a plain HTTP request: use "
                                 f"https://{parts.netloc}", code="tls_required") from exc
        elif _handshake(parts.hostname, parts.port, probe, tls12=True) in _NO_CLIENT_CERT:
            raise TLSFailure(f"{url} wants a client certificate signed by its CA (it runs "
                             "with --client-cert-auth) and closed the connection: this client "
                             "showed none, or one it does not trust",
                             code="client_certificate") from exc

    def _exchange_once(self, url: str, method: str, target: str, body: bytes | None,
                       headers: Mapping[str, str], timeout: float) -> _Answer:
        conn = self._conns.get(url)
        if conn is None:
            parts = urlsplit(url)
            if parts.scheme == "https":
                if self._ssl_context is None:
                    self._ssl_context = _tls_context()
                conn = _NoDelayTLSConnection(parts.hostname, parts.port, timeout=timeout,
                                             context=self._ssl_context)
            else:
                conn = _NoDelayConnection(parts.hostname, parts.port, timeout=timeout)
            self._conns[url] = conn
            self._used.discard(url)
        try:
            conn.timeout = timeout
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.request(method, target, body=body, headers=dict(headers))
            response = conn.getresponse()
            data = response.read()
        except ssl.SSLError as exc:
            self._drop(url)
            failure = _tls_failure(url, exc)
            if failure is not None:
                raise failure from exc
            raise
        except BaseException:
            self._drop(url)
            raise
        if response.will_close:
            self._drop(url)
        else:
            self._used.add(url)
        return _Answer(response.status, {k.lower(): v for k, v in response.getheaders()},
                       data, url)

    def _drop(self, url: str) -> None:
        conn = self._conns.pop(url, None)
        self._used.discard(url)
        if conn is not None:
            conn.close()


def _refused_by(urls: list[str]) -> str:
    return (f"nothing answers at {', '.join(urls)} (connection refused): no member process "
            "listens there")


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _sentence(answer: _Answer) -> str:
    try:
        doc = answer.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        return doc["error"]
    return answer.body[:200].decode(errors="replace") or "(no body)"


def _code(answer: _Answer) -> str | None:
    try:
        doc = answer.json()
    except ValueError:
        return None
    return doc.get("code") if isinstance(doc, dict) else None


def _error_from(answer: _Answer) -> FlotillaError:
    code = "error"
    try:
        doc = answer.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("code"), str):
        code = doc["code"]
    cls = _BY_STATUS.get(answer.status, FlotillaError)
    return cls(_sentence(answer), status=answer.status, code=code, headers=answer.headers)
