"""What the process-level archive tests share: flags, writers that record every acknowledged
write with its ``Flotilla-Index``, replaying those writes to the state at an index, reading a
cluster's state back, and looking at an archive behind the node's back.

The story of every test: real ``flotilla node`` processes archive to a real store (``moto_server``
over HTTP, or a ``file://`` directory); the test writes through the client API, remembers what
was acknowledged and at which index, and then checks the archive's objects, or a NEW cluster
restored from them (``--restore-from``), against that record.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flotilla.node.archive import ClusterArchive, Manifest, open_archive
from flotilla.node.consensus import EntryKind
from flotilla.node.statemachine.kv import KVStateMachine

from tests.harness.kvclient import TRANSPORT_ERRORS, KVClient, Response
from tests.harness.polling import wait_for
from tests.harness.processes import LocalCluster, NodeProcess

FAST = {"election_timeout_ms": 500, "heartbeat_ms": 50}
ARCHIVE_INTERVAL_MS = 200
REGION = "us-east-1"


# ---------------------------------------------------------------------------------------------
# Flags


@dataclass(frozen=True)
class Store:
    """Where an archive lives, as the node's flags and the test's own reader see it."""

    url: str  # the --archive / --restore-from URL (the archive root, without a cluster id)
    endpoint: str | None = None  # --s3-endpoint (None for file://)
    env: Mapping[str, str] = field(default_factory=dict)  # what the node processes need

    def endpoint_flags(self) -> list[str]:
        return [] if self.endpoint is None else ["--s3-endpoint", self.endpoint,
                                                 "--s3-region", REGION]

    def archive_flags(self, *, interval_ms: int = ARCHIVE_INTERVAL_MS,
                      keep_snapshots: int | None = None,
                      segment_entries: int | None = None) -> list[str]:
        flags = ["--archive", self.url, "--archive-interval-ms", str(interval_ms),
                 *self.endpoint_flags()]
        if keep_snapshots is not None:
            flags += ["--archive-keep-snapshots", str(keep_snapshots)]
        if segment_entries is not None:
            flags += ["--archive-segment-entries", str(segment_entries)]
        return flags

    def restore_flags(self, *, cluster_id: str | None = None,
                      index: int | None = None) -> list[str]:
        flags = ["--restore-from", self.url, *self.endpoint_flags()]
        if cluster_id is not None:
            flags += ["--restore-cluster-id", cluster_id]
        if index is not None:
            flags += ["--restore-index", str(index)]
        return flags

    def cluster_archive(self, cluster_id: str) -> ClusterArchive:
        """The archive of one cluster, opened in the test process (close ``.archive``)."""
        archive = open_archive(self.url, endpoint=self.endpoint,
                               region=REGION if self.endpoint else None)
        return ClusterArchive(archive, cluster_id)

    def manifest(self, cluster_id: str) -> Manifest | None:
        cluster = self.cluster_archive(cluster_id)
        try:
            return cluster.manifest()
        finally:
            cluster.archive.close()


# ---------------------------------------------------------------------------------------------
# Waiting and polling


def archive_status(cluster: LocalCluster, name: str) -> dict[str, Any]:
    return cluster.status(name)["archive"]


def wait_archived(cluster: LocalCluster, leader: str, index: int, timeout: float = 30.0
                  ) -> dict[str, Any]:
    """Wait until ``leader`` reports ``archive.last_archived_index >= index``; returns that
    ``archive`` document."""

    def done() -> dict[str, Any] | None:
        doc = archive_status(cluster, leader)
        reached = doc.get("last_archived_index")
        return doc if reached is not None and reached >= index else None

    try:
        return wait_for(done, timeout, f"{leader} to archive up to index {index}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.log_tails(30)}") from None


def post_snapshot(node: NodeProcess, timeout: float = 30.0) -> dict[str, Any]:
    """``POST /v1/snapshot`` on one member, with its admin token; the JSON answer (asserting
    200)."""
    with node.client(timeout=timeout) as c:
        resp = c.request("POST", "/v1/snapshot")
    assert resp.status == 200, (f"POST /v1/snapshot on {node.url}: {resp.status} "
                                f"{resp.body[:300]!r}")
    return resp.json()


# ---------------------------------------------------------------------------------------------
# Writing, with a record of what was acknowledged


@dataclass(frozen=True)
class Write:
    """An acknowledged write: at log ``index`` the key got ``value`` (None: deleted)."""

    index: int
    key: str
    value: bytes | None
    latency: float = 0.0


def write_index(kind: str, resp: Response) -> int:
    """The log index of an acknowledged put (``Flotilla-Index``) or delete (JSON ``index``)."""
    if kind == "put":
        index = resp.index
    else:
        doc = resp.json()
        index = doc.get("index") if isinstance(doc, dict) else None
    assert isinstance(index, int) and index > 0, (
        f"an acknowledged {kind} without its index: headers {dict(resp.headers)}, body "
        f"{resp.body[:200]!r}")
    return index


class Writer:
    """Sequential puts and deletes, each acknowledged before the next (a single client, so the
    history is a sequence and every write in it was acknowledged).

    ``put``/``delete`` retry a 503 (no leader yet) a few times with the SAME
    ``Flotilla-Client``/``Flotilla-Seq`` (exactly-once), so a retried write is applied once.
    Anything else that is not a 200 fails the test.
    """

    def __init__(self, urls: Sequence[str], timeout: float = 5.0, name: str = "writer") -> None:
        self.clients = [KVClient(u, timeout=timeout) for u in urls]
        self.writes: list[Write] = []
        self._turn = itertools.cycle(range(len(self.clients)))
        self._session = f"{name}-{random.getrandbits(40):010x}"
        self._seq = itertools.count(1)

    def put(self, key: str, value: bytes | str) -> Write:
        data = value.encode() if isinstance(value, str) else bytes(value)
        return self._write("put", key, data)

    def delete(self, key: str) -> Write:
        return self._write("delete", key, None)

    def _write(self, kind: str, key: str, value: bytes | None) -> Write:
        seq = next(self._seq)
        deadline = time.monotonic() + 20
        while True:
            client = self.clients[next(self._turn)]
            start = time.monotonic()
            try:
                if kind == "put":
                    assert value is not None
                    resp = client.put(key, value, client_id=self._session, seq=seq)
                else:
                    resp = client.delete(key, client_id=self._session, seq=seq)
            except TRANSPORT_ERRORS as exc:
                # Resent with the same session and seq: applied once whatever happened.
                if time.monotonic() > deadline:
                    raise AssertionError(f"{kind} {key!r} to {client.url}: {exc!r}") from None
                time.sleep(0.1)
                continue
            if resp.status == 503 and time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            assert resp.status == 200, (
                f"{kind} {key!r} to {client.url}: {resp.status} {resp.body[:300]!r}")
            write = Write(write_index(kind, resp), key, value, time.monotonic() - start)
            self.writes.append(write)
            return write

    def close(self) -> None:
        for c in self.clients:
            c.close()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def random_writes(writer: Writer, keys: Sequence[str], count: int, rng: random.Random,
                  *, delete_ratio: float = 0.2, tag: str = "v") -> None:
    """``count`` writes on random ``keys``: mostly puts of unique values, some deletes."""
    for n in range(count):
        key = rng.choice(keys)
        if rng.random() < delete_ratio:
            writer.delete(key)
        else:
            writer.put(key, f"{tag}{n}:{key}:{rng.getrandbits(32):08x}")


class ConcurrentWriters:
    """``threads`` writers at once, each its own ``Writer`` over all ``urls``, writing random
    puts and deletes on ``keys`` until ``stop()``. Every write must be acknowledged (a failure
    is recorded and fails ``check()``); ``writes`` holds them all, in index order."""

    def __init__(self, urls: Sequence[str], keys: Sequence[str], *, threads: int = 3,
                 delete_ratio: float = 0.2, think: float = 0.0, seed: int = 0,
                 timeout: float = 5.0) -> None:
        self.urls = list(urls)
        self.keys = list(keys)
        self.threads = threads
        self.delete_ratio = delete_ratio
        self.think = think
        self.seed = seed
        self.timeout = timeout
        self.failures: list[str] = []
        self._writers: list[Writer] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> ConcurrentWriters:
        for i in range(self.threads):
            writer = Writer(self.urls[i % len(self.urls):] + self.urls[:i % len(self.urls)],
                            timeout=self.timeout, name=f"w{i}")
            self._writers.append(writer)
            t = threading.Thread(target=self._run, args=(i, writer), daemon=True,
                                 name=f"archive-writer-{i}")
            self._threads.append(t)
            t.start()
        return self

    def _run(self, i: int, writer: Writer) -> None:
        rng = random.Random(f"{self.seed}/{i}")
        n = 0
        try:
            while not self._stop.is_set():
                random_writes(writer, self.keys, 1, rng, delete_ratio=self.delete_ratio,
                              tag=f"w{i}.{n}.")
                n += 1
                if self.think:
                    time.sleep(rng.uniform(0, 2 * self.think))
        except BaseException as exc:  # recorded for check(): a failed write ends the thread
            self.failures.append(f"writer {i}: {type(exc).__name__}: {exc}")

    def stop(self) -> list[Write]:
        self._stop.set()
        for t in self._threads:
            t.join(self.timeout * 5 + 30)
            assert not t.is_alive(), f"{t.name} did not finish"
        for w in self._writers:
            w.close()
        return self.writes

    @property
    def writes(self) -> list[Write]:
        return sorted((w for writer in self._writers for w in list(writer.writes)),
                      key=lambda w: w.index)

    def count(self) -> int:
        return sum(len(w.writes) for w in self._writers)

    def check(self) -> None:
        assert not self.failures, f"writes were not acknowledged: {self.failures[:5]}"
        indexes = [w.index for w in self.writes]
        assert len(indexes) == len(set(indexes)), "two acknowledged writes share an index"


# ---------------------------------------------------------------------------------------------
# The state at an index


def replay(writes: Iterable[Write], upto: int | None = None) -> dict[str, bytes]:
    """The key-value state after applying the acknowledged writes with index <= ``upto``
    (None: all), in index order: key -> value of the keys that exist."""
    state: dict[str, bytes] = {}
    for w in sorted(writes, key=lambda w: w.index):
        if upto is not None and w.index > upto:
            break
        if w.value is None:
            state.pop(w.key, None)
        else:
            state[w.key] = w.value
    return state


def state_from_segments(store: Store, cluster_id: str, index: int) -> dict[str, bytes]:
    """The state at ``index`` rebuilt in the test process from the archive's segments alone
    (the plan whose base is the empty state), decoded with the node's own segment reader and
    applied to a fresh ``KVStateMachine``. None of the node's restore code is involved."""
    cluster = store.cluster_archive(cluster_id)
    try:
        plans = [p for p in cluster.restore_candidates(index) if p.snapshot is None]
        assert plans, (f"the archive of {cluster_id} cannot rebuild index {index} from the "
                       f"empty state: {cluster.manifest()}")
        sm = KVStateMachine()
        for entry in cluster.read_segments(plans[0]):
            if entry.kind == EntryKind.NORMAL:
                sm.apply(entry.index, entry.data)
        state = {}
        for key in sm.list(""):
            found = sm.get(key)
            assert found is not None
            state[key] = found[0]
        return state
    finally:
        cluster.archive.close()


def read_state(url: str, keys: Iterable[str], prefix: str, timeout: float = 30.0
               ) -> tuple[dict[str, bytes | None], list[str]]:
    """Linearizable GET of every key (value, or None for 404) and ``GET /v1/kv?prefix=``,
    retrying 503 (a new cluster still electing) until ``timeout``."""
    deadline = time.monotonic() + timeout
    values: dict[str, bytes | None] = {}
    with KVClient(url, timeout=5.0) as c:

        def ask(do: Callable[[], Response], ok: tuple[int, ...]) -> Response:
            while True:
                try:
                    resp = do()
                except TRANSPORT_ERRORS as exc:
                    if time.monotonic() > deadline:
                        raise AssertionError(f"{url}: {exc!r}") from None
                    time.sleep(0.1)
                    continue
                if resp.status in ok:
                    return resp
                if resp.status != 503 or time.monotonic() > deadline:
                    raise AssertionError(f"{url}: {resp.status} {resp.body[:300]!r}")
                time.sleep(0.1)

        for key in sorted(set(keys)):
            resp = ask(lambda key=key: c.get(key), (200, 404))
            values[key] = resp.body if resp.status == 200 else None
        listed = ask(lambda: c.list(prefix), (200,)).json()["keys"]
    return values, listed


def assert_state(url: str, writes: Sequence[Write], upto: int | None, keys: Iterable[str],
                 prefix: str, what: str) -> dict[str, bytes]:
    """The cluster behind ``url`` holds exactly the state of ``writes`` up to ``upto``: every
    key the history touched has its last acknowledged value (or is absent), and listing
    ``prefix`` gives exactly the keys that exist."""
    expected = replay(writes, upto)
    values, listed = read_state(url, keys, prefix)
    wrong = {k: (v, expected.get(k)) for k, v in values.items() if v != expected.get(k)}
    assert not wrong, (
        f"{what}: {len(wrong)} of {len(values)} keys differ from the acknowledged writes up to "
        f"index {upto} (key: (read, expected)): {dict(list(wrong.items())[:10])}")
    assert listed == sorted(expected), (
        f"{what}: listing {prefix!r} gave {listed}, expected {sorted(expected)}")
    return expected


# ---------------------------------------------------------------------------------------------
# Looking at the archive behind the node's back


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Bucket:
    """Raw boto3 access to one archive prefix in a bucket on moto_server (keys relative to
    ``prefix/``)."""

    def __init__(self, client: Any, bucket: str, prefix: str) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")

    def full(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def keys(self, under: str = "") -> list[str]:
        found = []
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.full(under))
        for page in pages:
            found += [o["Key"][len(self.prefix) + 1:] for o in page.get("Contents", [])]
        return sorted(found)

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=self.full(key))["Body"].read()

    def head(self, key: str) -> dict[str, Any]:
        return self.client.head_object(Bucket=self.bucket, Key=self.full(key))

    def put(self, key: str, data: bytes, metadata: Mapping[str, str] | None = None) -> None:
        extra = {"Metadata": dict(metadata)} if metadata is not None else {}
        self.client.put_object(Bucket=self.bucket, Key=self.full(key), Body=data, **extra)

    def manifest(self, cluster_id: str) -> tuple[str, dict[str, Any]]:
        """The manifest in force (the highest seq): its key and its JSON."""
        names = self.keys(f"{cluster_id}/manifests/")
        assert names, f"no manifest under {self.full(cluster_id)}/manifests/"
        return names[-1], json.loads(self.get(names[-1]))


def corrupt(data: bytes) -> bytes:
    """Different bytes of the same length: a flipped byte in the middle (bit rot)."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]


def check_coverage(manifest: Mapping[str, Any], upto: int) -> None:
    """The manifest's segments run from its oldest base (the oldest kept snapshot, or 0) to at
    least ``upto`` with no gap and no overlap, and its ``last_archived_index`` says so."""
    segments = sorted(manifest["segments"], key=lambda s: s["first"])
    snapshots = manifest["snapshots"]
    base = min([s["index"] for s in snapshots]) if manifest.get("retention_floor") else 0
    assert segments, f"no segment in the manifest: {manifest}"
    assert segments[0]["first"] <= base + 1, (
        f"the first segment starts at {segments[0]['first']}, after base {base} + 1")
    for before, after in itertools.pairwise(segments):
        assert after["first"] == before["last"] + 1, (
            f"segments {before['first']}..{before['last']} and {after['first']}..{after['last']} "
            f"leave a gap or overlap")
    assert segments[-1]["last"] >= upto, (
        f"the segments end at {segments[-1]['last']}, before index {upto}")
    assert manifest["last_archived_index"] == segments[-1]["last"], (
        f"last_archived_index {manifest['last_archived_index']} is not the end of the "
        f"segments, {segments[-1]['last']}")
