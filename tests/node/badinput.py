"""Helpers for the bad-input suites (tests/node/test_bad_input*.py).

Each suite runs one cluster of real ``flotilla node`` processes for the whole module, sends it
bad requests, and after every one checks with a ``Canary`` that the cluster still serves (a put
and a linearizable get work) and that everything written before is intact.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import socket
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.harness.fixtures import require_node
from tests.harness.kvclient import TRANSPORT_ERRORS, KVClient, Response
from tests.harness.processes import LocalCluster

#: Timing for the suites: generous, so a loaded 2-core machine does not hold spurious
#: elections in the middle of a test that checks that the term did not move.
TIMING = {"election_timeout_ms": 2000, "heartbeat_ms": 100}

MIB = 1 << 20
CODE_WORD = re.compile(r"[a-z][a-z_]*")


def module_cluster(tmp_path_factory: pytest.TempPathFactory, size: int,
                   **options: Any) -> Iterator[LocalCluster]:
    """A started cluster for a module-scoped fixture; killed (logs printed) at teardown."""
    require_node()
    root: Path = tmp_path_factory.mktemp("cluster")
    cluster = LocalCluster(root, size, start=False, **{**TIMING, **options})
    try:
        cluster.start()
        cluster.wait_leader(30)
        yield cluster
    finally:
        try:
            print(f"\n=== logs of the cluster under {cluster.root}\n{cluster.log_tails(40)}")
        finally:
            cluster.stop_all()


def assert_error(resp: Response, status: int | Iterable[int], code: str | None = None,
                 says: str | Iterable[str] = ()) -> dict[str, Any]:
    """The answer is the contract's JSON error: ``{"error": "<sentence>", "code": "<word>"}``
    with this status (one of these), code, and words in its sentence."""
    wanted = {status} if isinstance(status, int) else set(status)
    assert resp.status in wanted, (resp.status, resp.body[:500])
    assert resp.headers.get("Content-Type", "").startswith("application/json"), \
        (resp.headers.get("Content-Type"), resp.body[:200])
    doc = resp.json()
    assert isinstance(doc, dict), doc
    assert isinstance(doc.get("error"), str) and len(doc["error"]) > 10, doc
    assert isinstance(doc.get("code"), str) and CODE_WORD.fullmatch(doc["code"]), doc
    if code is not None:
        assert doc["code"] == code, doc
    for words in [says] if isinstance(says, str) else says:
        assert words in doc["error"], (words, doc)
    return doc


class Canary:
    """Proof that a cluster still serves and forgot nothing: every ``check()`` writes a new key
    through one member, reads it back linearizably through another, and verifies that every
    key written before is still listed, and a sample of them still holds its value."""

    def __init__(self, cluster: LocalCluster, prefix: str = "canary/") -> None:
        self.cluster = cluster
        self.prefix = prefix
        self.written: dict[str, bytes] = {}
        self._turn = itertools.count()

    def members(self) -> list[str]:
        return [m for m in self.cluster.members
                if self.cluster.nodes[m].running and not self.cluster.nodes[m].paused]

    def check(self, note: str = "", timeout: float = 20.0) -> None:
        turn = next(self._turn)
        members = self.members()
        writer, reader = members[turn % len(members)], members[(turn + 1) % len(members)]
        key = f"{self.prefix}{turn:04d}"
        value = f"value {turn} {note}".encode()
        self._until_ok(writer, lambda c: c.put(key, value), timeout, f"put {key}")
        self.written[key] = value
        got = self._until_ok(reader, lambda c: c.get(key), timeout, f"get {key}")
        assert got.body == value, (note, got.body)
        listed = self._until_ok(reader, lambda c: c.list(self.prefix), timeout, "list").json()
        assert listed["keys"] == sorted(self.written), (note, listed)
        sample = sorted(self.written)
        for old in {sample[0], sample[len(sample) // 2], sample[-1]}:
            got = self._until_ok(writer, lambda c, k=old: c.get(k), timeout, f"get {old}")
            assert got.body == self.written[old], (note, old, got.body)

    def _until_ok(self, member: str, call, timeout: float, what: str) -> Response:
        """200 from `call`, retrying only what a healthy cluster may answer meanwhile (503
        while a leader is elected, a dropped connection)."""
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            try:
                with self.cluster.client(member, timeout=5.0) as c:
                    resp = call(c)
                if resp.status == 200:
                    return resp
                last = f"{resp.status} {resp.body[:300]!r}"
                assert resp.status == 503, f"{what} via {member}: {last}"
            except TRANSPORT_ERRORS as exc:
                last = f"{type(exc).__name__}: {exc}"
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} via {member} did not succeed within {timeout}s; "
                                     f"last: {last}")
            time.sleep(0.1)


def raw_exchange(host: str, port: int, data: bytes, *, timeout: float = 5.0,
                 read_until_close: bool = False) -> bytes:
    """Send bytes on a fresh TCP connection and return what comes back: the first answer
    head and body as far as Content-Length says (or everything until close)."""
    with socket.create_connection((host, port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):  # the peer may close early; read what it said
            sock.sendall(data)
        received = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                break
            if not chunk:
                break
            received += chunk
            if not read_until_close and _complete(received):
                break
        return received


def raw_exchanges(exchanges: Iterable[tuple[str, int, bytes]], **options: Any) -> list[bytes]:
    """``raw_exchange(host, port, data, **options)`` for each of ``exchanges`` at the same time,
    the answers in their order: exchanges that wait for members to close their connections
    wait once, not once per member."""
    exchanges = list(exchanges)
    with ThreadPoolExecutor(len(exchanges)) as pool:
        return list(pool.map(lambda e: raw_exchange(*e, **options), exchanges))


def _complete(received: bytes) -> bool:
    head, sep, body = received.partition(b"\r\n\r\n")
    if not sep:
        return False
    match = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return match is not None and len(body) >= int(match.group(1))


def parse_raw(received: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, body


def raw_error(received: bytes, status: int, code: str | None = None) -> dict[str, Any]:
    """Like ``assert_error`` for an answer read off a raw socket."""
    got, headers, body = parse_raw(received)
    assert got == status, received[:500]
    assert headers.get("content-type", "").startswith("application/json"), received[:500]
    doc = json.loads(body)
    assert isinstance(doc.get("error"), str) and CODE_WORD.fullmatch(doc.get("code", "")), doc
    if code is not None:
        assert doc["code"] == code, doc
    return doc


def address(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[-1].rstrip("/").rsplit(":", 1)
    return host, int(port)


def leader_client(cluster: LocalCluster, timeout: float = 10.0) -> KVClient:
    return cluster.client(cluster.wait_leader(30), timeout=timeout)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One 3-member cluster for a whole test module."""
    yield from module_cluster(tmp_path_factory, 3)


@pytest.fixture(scope="module")
def canary(cluster):
    """Checks, after each bad input, that the cluster still serves and lost nothing."""
    canary = Canary(cluster)
    canary.check("before any bad input")
    return canary
