"""A small synchronous HTTP client for Flotilla's client and admin API, and a workload runner.

Process-level tests talk to real ``flotilla node`` processes through this module. It uses only
the standard library (``http.client``) so that a test can be read without knowing an async
framework, and so that what it sends is exactly what a curl user would send (docs/contract.md,
"The client API").

``KVClient`` keeps one keep-alive connection to one member. It is not thread-safe: give each
thread its own clients (``Workload`` does). A request that fails at the transport level raises
``OSError`` (connection refused or reset, ``TimeoutError``) or ``http.client.HTTPException``;
the connection is then dropped and the next request opens a new one. Nothing is retried
behind the caller's back, with one exception that cannot change what the cluster does: a request
that is safe to send twice (a read, or a write carrying ``Flotilla-Client``/``Flotilla-Seq``)
is resent once when a *reused* keep-alive connection turns out to have been closed by the
server while idle.

``Workload`` runs N threads of random put/get/delete (and optionally compare-and-set) against
random members and records every request in a ``tests.harness.linearizability.History``, so a
fault test can inject faults meanwhile and check the history afterwards.
"""

from __future__ import annotations

import http.client
import itertools
import json
import random
import socket
import ssl
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import quote, urlencode, urlsplit

from tests.harness.linearizability import History, Kind, Op

__all__ = [
    "TRANSPORT_ERRORS",
    "FinalRead",
    "KVClient",
    "Response",
    "Workload",
    "classify",
    "read_final_reads",
    "read_finals",
]

#: What a request can raise when the answer never arrived: its outcome is unknown.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (OSError, http.client.HTTPException)


class Response(NamedTuple):
    """One HTTP answer. Unpacks as ``status, headers, body``; ``headers`` ignores case."""

    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def index(self) -> int | None:
        """``Flotilla-Index``: the log index this answer reflects (None when absent)."""
        return _int_header(self.headers, "Flotilla-Index")

    @property
    def mod_index(self) -> int | None:
        """``Flotilla-Mod-Index``: the index that last changed the key (None when absent)."""
        return _int_header(self.headers, "Flotilla-Mod-Index")

    @property
    def error_code(self) -> str | None:
        """The ``code`` word of a JSON error body, or None when the body is not one."""
        try:
            doc = self.json()
        except ValueError:
            return None
        return doc.get("code") if isinstance(doc, dict) else None


def _int_header(headers: http.client.HTTPMessage, name: str) -> int | None:
    raw = headers.get(name)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def key_path(key: str) -> str:
    """``/v1/kv/{key}`` with the key percent-encoded; ``/`` stays readable, as in etcd keys."""
    return "/v1/kv/" + quote(key, safe="/")


class KVClient:
    """Requests to one member over one keep-alive connection (one thread at a time).

    An ``https://`` URL is dialled with ``ssl_context`` (a member with TLS on its client port;
    default: the system's CAs)."""

    def __init__(self, url: str, *, timeout: float = 5.0, token: str | None = None,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        parts = urlsplit(url if "//" in url else "http://" + url)
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
            raise ValueError(f"expected a client URL like http://127.0.0.1:2379, got {url!r}")
        self.url = f"{parts.scheme}://{parts.hostname}:{parts.port}"
        self.host, self.port = parts.hostname, parts.port
        self.timeout = timeout
        self.token = token
        self.ssl_context = ssl_context
        if parts.scheme == "https" and ssl_context is None:
            self.ssl_context = ssl.create_default_context()
        self._tls = parts.scheme == "https"
        self._conn: http.client.HTTPConnection | None = None
        self._used = False  # the current connection already carried a complete exchange
        self._reused_at_failure = False

    def __repr__(self) -> str:
        return f"KVClient({self.url!r})"

    # -- key-value ------------------------------------------------------------------------

    def put(
        self,
        key: str,
        value: bytes | str,
        prev_index: int | None = None,
        client_id: str | None = None,
        seq: int | None = None,
        *,
        timeout: float | None = None,
    ) -> Response:
        """``PUT /v1/kv/{key}`` (compare-and-set with ``prev_index``; 0 = must not exist)."""
        query = {} if prev_index is None else {"prev_index": prev_index}
        body = value.encode() if isinstance(value, str) else bytes(value)
        return self.request("PUT", key_path(key), body, query=query,
                            headers=_session_headers(client_id, seq), timeout=timeout)

    def get(self, key: str, consistency: str | None = None, *,
            timeout: float | None = None) -> Response:
        """``GET /v1/kv/{key}``: linearizable unless ``consistency="serializable"``."""
        query = {} if consistency is None else {"consistency": consistency}
        return self.request("GET", key_path(key), query=query, timeout=timeout)

    def delete(self, key: str, client_id: str | None = None, seq: int | None = None, *,
               timeout: float | None = None) -> Response:
        """``DELETE /v1/kv/{key}``: 200 ``{"index": N, "deleted": bool}``."""
        return self.request("DELETE", key_path(key), headers=_session_headers(client_id, seq),
                            timeout=timeout)

    def list(self, prefix: str = "", limit: int | None = None, *,
             timeout: float | None = None) -> Response:
        """``GET /v1/kv?prefix=P&limit=N``: 200 ``{"index": N, "keys": [...]}``."""
        query: dict[str, Any] = {"prefix": prefix}
        if limit is not None:
            query["limit"] = limit
        return self.request("GET", "/v1/kv", query=query, timeout=timeout)

    # -- admin ----------------------------------------------------------------------------

    def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """``GET /v1/status`` as a dict; raises ``RuntimeError`` on a non-200 answer."""
        return _expect_json(self.request("GET", "/v1/status", timeout=timeout), "GET /v1/status")

    def add_member(self, name: str, peer_url: str, client_url: str, *,
                   timeout: float | None = None) -> Response:
        """``POST /v1/members``: add a learner; 200 once that configuration is committed."""
        return self.post_json("/v1/members",
                              {"name": name, "peer_url": peer_url, "client_url": client_url},
                              timeout=timeout)

    def post_json(self, path: str, doc: Any, *, method: str = "POST",
                  timeout: float | None = None) -> Response:
        return self.request(method, path, json.dumps(doc).encode(),
                            headers={"Content-Type": "application/json"}, timeout=timeout)

    # -- transport ------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        *,
        query: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> Response:
        """Send one request and read the whole answer; see the module docstring for errors."""
        target = path + ("?" + urlencode(query) if query else "")
        all_headers = dict(headers or {})
        if self.token is not None:
            all_headers.setdefault("Authorization", f"Bearer {self.token}")
        resendable = method in ("GET", "HEAD") or "Flotilla-Seq" in all_headers
        try:
            return self._exchange(method, target, body, all_headers, timeout)
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            # The server closed an idle keep-alive connection: only a fresh connection can
            # tell whether the member is really gone.
            if not (resendable and self._reused_at_failure):
                raise
            return self._exchange(method, target, body, all_headers, timeout)

    def _exchange(self, method: str, target: str, body: bytes | None,
                  headers: dict[str, str], timeout: float | None) -> Response:
        if self._conn is None:
            if self._tls:
                self._conn = _NoDelayTLSConnection(self.host, self.port, timeout=self.timeout,
                                                   context=self.ssl_context)
            else:
                self._conn = _NoDelayConnection(self.host, self.port, timeout=self.timeout)
            self._used = False
        conn = self._conn
        self._reused_at_failure = self._used
        try:
            conn.timeout = self.timeout if timeout is None else timeout
            if conn.sock is not None:
                conn.sock.settimeout(conn.timeout)
            conn.request(method, target, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
        except BaseException:
            self.close()
            raise
        if answer.will_close:
            self.close()
        else:
            self._used = True
        return Response(answer.status, answer.headers, data)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> KVClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def _session_headers(client_id: str | None, seq: int | None) -> dict[str, str]:
    if (client_id is None) != (seq is None):
        raise ValueError("exactly-once needs both client_id and seq, or neither")
    if client_id is None:
        return {}
    return {"Flotilla-Client": client_id, "Flotilla-Seq": str(seq)}


def _expect_json(resp: Response, what: str) -> Any:
    if resp.status != 200:
        raise RuntimeError(f"{what} answered {resp.status}: {resp.body[:300]!r}")
    return resp.json()


# ---------------------------------------------------------------------------------------------
# From HTTP answers to history outcomes


def classify(kind: Kind | str, resp: Response) -> tuple[str, Any]:
    """What an answer means for the checker: ``("ok", output)``, ``("fail", None)`` or
    ``("unknown", None)`` (see ``tests.harness.linearizability``).

    * 200: ok. put and compare-and-set output the ``Flotilla-Index`` of the write (or None when
      it is missing), get the body, delete the ``deleted`` flag.
    * get 404: ok, the key is absent.
    * compare-and-set 412: ok with output False (the checker verifies the precondition failed).
    * other 4xx (400 bad input, 413 too large, 412 on a plain write): fail, the request was
      refused before it could be proposed.
    * 503 and every other answer: unknown. "No leader" does not prove that a write was not
      applied: the leader may have appended it before losing leadership, or a follower may have
      forwarded it before its leader went away. Only an error body that says so explicitly,
      ``"applied": false``, turns a 503 into fail.
    """
    kind = Kind(kind)
    status = resp.status
    if status == 200:
        if kind is Kind.GET:
            return "ok", resp.body
        if kind is Kind.DELETE:
            try:
                doc = resp.json()
            except ValueError:
                return "unknown", None
            return "ok", bool(doc.get("deleted")) if isinstance(doc, dict) else None
        return "ok", resp.index
    if status == 404 and kind is Kind.GET:
        return "ok", None
    if status == 412 and kind is Kind.CAS:
        return "ok", False
    if 400 <= status < 500 and status not in (408, 429):
        return "fail", None
    try:
        doc = resp.json()
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("applied") is False:
        return "fail", None
    return "unknown", None


# ---------------------------------------------------------------------------------------------
# Workload


class Workload:
    """Concurrent random key-value clients that record everything they do.

    ``clients`` threads each loop until ``duration`` runs out or ``stop()`` is called: pick a
    member at random, pick an operation by ``mix`` weights and a key from ``keys``, record the
    invocation, send it, record the outcome (``classify``), sleep ``think`` seconds. A thread
    whose request ended unknown carries on under a new client name (``c3``, then ``c3.1``...),
    as Jepsen does, so each name has at most one request in flight even in theory.

    Writes carry ``Flotilla-Client``/``Flotilla-Seq`` when ``sessions`` is true, exercising
    exactly-once. Put values are unique (``c3:17``), which keeps the checker's search small.
    ``https://`` members are dialled with ``ssl_context``.

    Use ``run()`` to block for ``duration``, or ``start()`` / ``stop()`` (or ``with``) to inject
    faults meanwhile. Afterwards: ``history``, ``counts`` and ``errors`` (a few transport errors,
    for debugging a run where nothing succeeded).
    """

    def __init__(
        self,
        urls: Sequence[str] | Callable[[], Sequence[str]],
        keys: Iterable[str] = ("k0", "k1", "k2", "k3", "k4"),
        *,
        clients: int = 4,
        duration: float = 10.0,
        mix: Mapping[str, float] | None = None,
        timeout: float = 2.0,
        think: float = 0.0,
        consistency: str | None = None,
        sessions: bool = True,
        seed: int = 0,
        history: History | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._urls = urls
        self.ssl_context = ssl_context  # for https:// members
        self.keys = list(keys)
        self.clients = clients
        self.duration = duration
        self.mix = dict(mix or {"put": 0.45, "get": 0.45, "delete": 0.10})
        unknown_kinds = set(self.mix) - {k.value for k in Kind}
        if unknown_kinds or not self.keys or clients < 1:
            raise ValueError(f"bad workload: kinds {sorted(unknown_kinds)}, {len(self.keys)} "
                             f"keys, {clients} clients")
        self.timeout = timeout
        self.think = think
        self.consistency = consistency
        self.sessions = sessions
        self.seed = seed
        self.history = history if history is not None else History()
        self.counts: Counter[tuple[str, str]] = Counter()  # (kind, outcome) -> n
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._deadline = 0.0
        self._last_index: dict[str, int] = {}  # key -> last index a write of it returned

    @property
    def urls(self) -> list[str]:
        """The members to spread requests over (a callable is asked again for every request,
        so a test can add members while the workload runs)."""
        return list(self._urls() if callable(self._urls) else self._urls)

    def start(self) -> Workload:
        if self._threads:
            raise RuntimeError("this workload was already started")
        self._deadline = time.monotonic() + self.duration
        for i in range(self.clients):
            t = threading.Thread(target=self._client, args=(i,), name=f"workload-c{i}",
                                 daemon=True)
            self._threads.append(t)
            t.start()
        return self

    def stop(self, join_timeout: float | None = None) -> History:
        """Ask every thread to finish its current request, wait for them, return the history."""
        self._stop.set()
        return self.join(join_timeout)

    def join(self, timeout: float | None = None) -> History:
        limit = None if timeout is None else time.monotonic() + timeout
        for t in self._threads:
            t.join(None if limit is None else max(0.0, limit - time.monotonic()))
            if t.is_alive():
                raise TimeoutError(f"{t.name} is still running (a request longer than "
                                   f"its {self.timeout}s timeout?)")
        return self.history

    def run(self) -> History:
        self.start()
        return self.join()

    def __enter__(self) -> Workload:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop(join_timeout=self.timeout * 3 + 5)

    @property
    def ok_count(self) -> int:
        return sum(n for (_, outcome), n in self.counts.items() if outcome == "ok")

    def summary(self) -> str:
        kinds = sorted({k for k, _ in self.counts})
        parts = []
        for kind in kinds:
            outcomes = {o: n for (k, o), n in self.counts.items() if k == kind}
            parts.append(f"{kind}: " + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())))
        return "; ".join(parts) or "no operations"

    # -- one client thread ----------------------------------------------------------------

    def _client(self, index: int) -> None:
        rng = random.Random(f"{self.seed}/{index}")
        kinds = list(self.mix)
        weights = [self.mix[k] for k in kinds]
        connections: dict[str, KVClient] = {}
        incarnation = 0
        name = f"c{index}"
        session = uuid.uuid4().hex[:12]
        seqs = itertools.count(1)
        values = itertools.count(1)
        try:
            while not self._stop.is_set() and time.monotonic() < self._deadline:
                urls = self.urls
                if not urls:
                    time.sleep(0.05)
                    continue
                url = rng.choice(urls)
                client = connections.get(url)
                if client is None:
                    client = connections[url] = KVClient(url, timeout=self.timeout,
                                                         ssl_context=self.ssl_context)
                kind = Kind(rng.choices(kinds, weights)[0])
                key = rng.choice(self.keys)
                outcome = self._one(client, name, kind, key, rng, values,
                                    (session, next(seqs)) if self.sessions else None)
                if outcome == "unknown":
                    incarnation += 1
                    name = f"c{index}.{incarnation}"
                    session = uuid.uuid4().hex[:12]
                    seqs = itertools.count(1)
                if self.think:
                    time.sleep(rng.uniform(0, 2 * self.think))
        finally:
            for client in connections.values():
                client.close()

    def _one(self, client: KVClient, name: str, kind: Kind, key: str, rng: random.Random,
             values: itertools.count, session: tuple[str, int] | None) -> str:
        value = prev_index = None
        if kind in (Kind.PUT, Kind.CAS):
            value = f"{name}:{next(values)}".encode()
        if kind is Kind.CAS:
            prev_index = self._guess_prev_index(key, rng)
        op = self.history.invoke(name, kind, key, value, prev_index=prev_index)
        client_id, seq = session if session and kind is not Kind.GET else (None, None)
        try:
            if kind is Kind.GET:
                resp = client.get(key, self.consistency)
            elif kind is Kind.DELETE:
                resp = client.delete(key, client_id, seq)
            else:
                resp = client.put(key, value, prev_index, client_id, seq)
        except TRANSPORT_ERRORS as exc:
            self.history.unknown(op)
            self._note(kind, "unknown", f"{client.url}: {type(exc).__name__}: {exc}")
            return "unknown"
        outcome, output = classify(kind, resp)
        self._finish(op, outcome, output)
        if kind in (Kind.PUT, Kind.CAS) and outcome == "ok" and type(output) is int:
            with self._lock:
                self._last_index[key] = output
        self._note(kind, outcome,
                   None if outcome == "ok" else f"{client.url}: {resp.status} {resp.body[:200]!r}")
        return outcome

    def _guess_prev_index(self, key: str, rng: random.Random) -> int:
        """A compare-and-set that sometimes holds: the last index seen for the key, or 0."""
        with self._lock:
            known = self._last_index.get(key, 0)
        return known if rng.random() < 0.7 else 0

    def _finish(self, op: Op, outcome: str, output: Any) -> None:
        if outcome == "ok":
            self.history.ok(op, output)
        elif outcome == "fail":
            self.history.fail(op)
        else:
            self.history.unknown(op)

    def _note(self, kind: Kind, outcome: str, error: str | None) -> None:
        with self._lock:
            self.counts[(kind.value, outcome)] += 1
            if error is not None and len(self.errors) < 50:
                self.errors.append(error)


@dataclass(frozen=True)
class FinalRead:
    """One linearizable read of a key after the run: what the checker takes as final."""

    key: str
    value: bytes | None
    member: str  # the name (or URL) of the member that answered
    index: int | None  # Flotilla-Index: the log index the answer reflects
    mod_index: int | None  # Flotilla-Mod-Index: the index that last changed the key
    at: float  # time.monotonic() when the answer arrived

    def __str__(self) -> str:
        return (f"{self.value!r} from {self.member} (Flotilla-Index {self.index}, "
                f"Mod-Index {self.mod_index})")


def read_final_reads(members: Mapping[str, str], keys: Iterable[str], *,
                     timeout: float = 30.0, per_request: float = 2.0,
                     ssl_context: ssl.SSLContext | None = None) -> dict[str, FinalRead]:
    """Read every key linearizably from ``members`` ({name: client URL}), spreading the keys
    over them and retrying a key on the next member until it answers 200/404 or ``timeout``
    passes; keeps who answered and the indexes."""
    deadline = time.monotonic() + timeout
    names = list(members)
    clients = {name: KVClient(url, timeout=per_request, ssl_context=ssl_context)
               for name, url in members.items()}
    out: dict[str, FinalRead] = {}
    try:
        for n, key in enumerate(keys):
            last = "no attempt"
            for attempt in itertools.count():
                name = names[(n + attempt) % len(names)]
                try:
                    resp = clients[name].get(key)
                except TRANSPORT_ERRORS as exc:
                    last = f"{name}: {type(exc).__name__}: {exc}"
                else:
                    if resp.status in (200, 404):
                        out[key] = FinalRead(key, resp.body if resp.status == 200 else None,
                                             name, resp.index, resp.mod_index,
                                             time.monotonic())
                        break
                    last = f"{name}: {resp.status} {resp.body[:200]!r}"
                if time.monotonic() > deadline:
                    raise TimeoutError(f"could not read {key!r} within {timeout}s; last: {last}")
                time.sleep(0.1)
    finally:
        for c in clients.values():
            c.close()
    return out


def read_finals(urls: Sequence[str], keys: Iterable[str], *, timeout: float = 30.0,
                per_request: float = 2.0, ssl_context: ssl.SSLContext | None = None
                ) -> dict[str, bytes | None]:
    """Read every key linearizably (value, or None when absent), retrying across members until
    ``timeout``: the final state for ``check_final_state`` once the cluster is healed."""
    reads = read_final_reads({url: url for url in urls}, keys, timeout=timeout,
                             per_request=per_request, ssl_context=ssl_context)
    return {key: read.value for key, read in reads.items()}
