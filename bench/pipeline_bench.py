"""How fast `flotilla pipeline snapshot-at` rebuilds a state through Spark, against the node's
own single-process replay of the same archive.

    .venv/bin/python bench/pipeline_bench.py [--sizes 1M,3M] [--quick] [--keep]
                                             [--archive URL] [--engines replay,local[1],local[2]]

For each size N, an archive is written the way a leader writes it (the project's own archive
client, segments of 10,000 entries as `--archive-segment-entries` defaults to): a membership
entry, then key-value commands from a few hundred client sessions that come and go (puts,
compare-and-sets that mostly hit, deletes of present and absent keys, retries answered from the
session, pipelined sequences that overtake each other, quiet spells past the 10-minute session
TTL), a no-op and a leader whose clock is a little off at every new term, one configuration
change, and a member's snapshot at about N/4. The target is the last entry, so N entries are
folded on top of the snapshot. Keys: N/8 of them, a skewed pick (a few are hot), some non-ASCII;
values of 16-240 random bytes (nothing compresses them). Writing 3M entries takes about a
minute.

Then, on that archive and target:

* **replay**: what a member restoring from the archive does (`node/restore.py`'s `restore`,
  called as the node calls it): fetch and verify the snapshot and segments, restore the
  machine, apply every entry, write the snapshot (fsync on). One process, one core.
* **local[1]**, **local[2]**: `snapshot_at` through Spark in a fresh process each (its own JVM
  and Python workers). Spark's start-up is timed apart: the session, then a warm-up, a whole
  snapshot-at over a 20k-entry archive (Spark starts its Python workers and reuses them; the
  JVM compiles the job's plans and hot paths: on a cold JVM that costs about as much CPU as
  the job itself on 1M entries). The job's time runs from the call to the published snapshot.

Each Spark payload must equal, byte for byte, the replay's (the replay is the oracle); the
bench fails otherwise. The table's columns:

* *cores*: CPU seconds of every process of the engine (driver, JVM, Python workers) over the
  job's seconds: how much of the machine it kept busy. Spark's JVM works beside its Python
  workers (moving the blobs, compiling, collecting garbage), so `local[1]` keeps more than one
  core busy.
* *others*: the cores everything else on the machine kept busy meanwhile (other work on a
  shared host takes them from `local[2]` first).
* *decode*, *sessions*, *keys*, *payload*: wall time while Spark ran that stage of the job
  (from Spark's status store; the pipeline describes its jobs by stage). The first three are
  the parallel stages: their tasks spread over the cores. *payload* is the driver fetching the
  folded records from the key ranges in order.
* *driver*: the rest of the job's time: planning, the base snapshot's header and sessions,
  sampling the key ranges, collecting sketches and results, writing and uploading the payload.

Compare numbers as ratios within one run: this host's speed drifts by up to 2x within an hour,
and other work on it takes cores from `local[2]` first.

`--keep` writes the archives under `~/.cache/flotilla/pipeline-bench` (or `--archive`) and
reuses them on the next run; without it they go to a temporary directory that is removed.

`--job compact` (default 1M entries; engines local[1], local[2] and `sequential`, the node's
machine replaying in one process): the same workload with keys picked from a Zipf
distribution (`--zipf`, default 1.2), copied for each engine (a pass rewrites it), then two
passes: the first cleans up to the segment end nearest 60% of the log, the second the rest on
top of the first's output. The table: entries and bytes before and after, the archive bytes a
pass read against the dirty bytes (Kafka's goal: at most 2x), dirty entries/s, and whether
every engine wrote the same compacted bytes.

`--job export` (default 1M entries; local[1] and local[2]): a full export of the workload into
Parquet in a temporary directory, after a warm-up export; entries/s, entries/s per core (CPU
seconds of every process of the engine), and whether the change rows are the same.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import numpy as np
from flotilla.node.archive import ClusterArchive, open_archive
from flotilla.node.consensus import Entry, EntryKind, Membership, SnapshotMeta
from flotilla.node.statemachine.kv import KVStateMachine, encode_delete, encode_put
from flotilla.node.storage import PayloadReader, SnapshotStore

SEGMENT_ENTRIES = 10_000  # the node's default --archive-segment-entries
WORKLOAD_VERSION = 1  # bump when the generator changes: kept archives are then rebuilt
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "flotilla"
VOTERS = Membership(voters=frozenset({"n1", "n2", "n3"}),
                    addresses=(("n1", "http://n1:7001"), ("n2", "http://n2:7001"),
                               ("n3", "http://n3:7001")))
WITH_LEARNER = Membership(voters=VOTERS.voters, learners=frozenset({"n4"}),
                          addresses=(*VOTERS.addresses, ("n4", "http://n4:7001")))


# ---------------------------------------------------------------------------------------------
# The archive


@dataclass(frozen=True, slots=True)
class Workload:
    """N entries folded on top of a member's snapshot at `base`: the archive holds
    1..base + N, and the target is its last index."""

    entries: int
    seed: int = 7
    zipf: float = 0.0  # > 1: keys picked from a Zipf distribution of this exponent

    @property
    def base(self) -> int:
        return self.entries // 4 + 777  # a member snapshots where it happens to be

    @property
    def target(self) -> int:
        return self.base + self.entries

    @property
    def keys(self) -> int:
        return max(1_000, self.entries // 8)

    @property
    def cluster_id(self) -> str:
        zipf = f"-z{self.zipf:g}" if self.zipf else ""
        return f"bench-n{self.entries}-s{self.seed}{zipf}-v{WORKLOAD_VERSION}"


WARM_UP = Workload(20_000)


class _Client:
    __slots__ = ("last", "name", "next_seq", "owed")

    def __init__(self, name: str) -> None:
        self.name = name
        self.next_seq = 1
        self.last: tuple[Any, ...] | None = None  # (seq, op, key, value, prev) for a retry
        self.owed: int | None = None  # a seq overtaken by the one after it, sent next


def _key_names(count: int) -> list[str]:
    names = []
    for i in range(count):
        if i % 97 == 5:
            names.append(f"tenant-{i % 13:02d}/café/{i:08d}")
        elif i % 211 == 7:
            names.append(f"tenant-{i % 13:02d}/\U0001f680/{i:08d}")
        else:
            names.append(f"tenant-{i % 13:02d}/user/{i:08d}/profile")
    return names


def log_entries(w: Workload) -> Iterator[Entry]:
    """The workload's log, 1..w.target, as a leader appends it."""
    rng = np.random.default_rng(w.seed)
    names = _key_names(w.keys)
    blob = rng.bytes(1 << 20)
    mod: dict[int, int] = {}  # the writer's idea of each key's mod index (0: absent)
    clients = [_Client(f"app-{n:05d}") for n in range(300)]
    born = len(clients)
    index, term, clock, skew = 1, 1, 1_767_225_600_000, 0  # 2026-01-01T00:00:00Z
    yield Entry(1, 1, EntryKind.MEMBERSHIP, VOTERS.encode(), clock)
    quiet = {w.target * k // 4 for k in (1, 2, 3)}  # spells past the session TTL
    change = w.target * 3 // 5
    while index < w.target:
        n = min(SEGMENT_ENTRIES, w.target - index)
        u = rng.random((n, 4))
        if w.zipf:
            picks = (rng.zipf(w.zipf, n) - 1) % w.keys  # Zipf: rank 1 the hottest
        else:
            picks = (w.keys * rng.random(n) ** 3).astype(np.int64)  # skewed: a few are hot
        who = rng.integers(0, len(clients), n)
        lengths = rng.integers(16, 240, n)
        offsets = rng.integers(0, len(blob) - 256, n)
        gaps = rng.exponential(2.0, n).astype(np.int64)  # ~500 entries/s
        delays = rng.integers(0, 5, n)
        for j in range(n):
            index += 1
            clock += int(gaps[j])
            if index in quiet:
                clock += 15 * 60 * 1000
            if index % 250_000 == 0:  # a new leader: a no-op first, its clock a little off
                term += 1
                skew = int(rng.integers(-40, 10))
                yield Entry(index, term, EntryKind.NOOP, b"", clock)
                continue
            if index == change:
                yield Entry(index, term, EntryKind.MEMBERSHIP, WITH_LEARNER.encode(), clock)
                continue
            ts = max(0, clock + skew - int(delays[j]))
            roll, session, retry, churn = u[j]
            if churn < 1 / 3000:  # a client goes away (its session expires); a new one comes
                clients[int(who[j])] = _Client(f"app-{born:05d}")
                born += 1
            client = clients[int(who[j])] if session < 0.85 else None
            if client is not None and client.last is not None and retry < 0.01:
                seq, op, key, value, prev = client.last  # a retry: same command, later ts
            else:
                k = int(picks[j])
                key = names[k]
                value = b""
                prev = None
                if roll < 0.08:
                    op = "delete"
                    mod.pop(k, None)
                else:
                    op = "put"
                    off = int(offsets[j])
                    value = blob[off:off + int(lengths[j])]
                    if roll < 0.23:  # compare-and-set: mostly on what the client just read
                        prev = mod.get(k, 0) if retry < 0.85 else max(0, index - 3)
                        if prev == mod.get(k, 0):
                            mod[k] = index
                    else:
                        mod[k] = index
                seq = None
                if client is not None:
                    if client.owed is not None:
                        seq, client.owed = client.owed, None
                    elif retry > 0.997:  # pipelined: the next seq arrives first
                        seq, client.owed = client.next_seq + 1, client.next_seq
                        client.next_seq += 2
                    else:
                        seq = client.next_seq
                        client.next_seq += 1
                    client.last = (seq, op, key, value, prev)
            name = None if client is None else client.name
            if op == "delete":
                data = encode_delete(key, ts=ts, client=name, seq=seq)
            else:
                data = encode_put(key, value, ts=ts, prev_index=prev, client=name, seq=seq)
            yield Entry(index, term, EntryKind.NORMAL, data, clock)


def write_archive(url: str, w: Workload, s3: dict[str, str | None]) -> None:
    """Archive the workload: segments as a leader ships them, a member's snapshot at w.base."""
    archive = open_archive(url, **s3)
    sm: KVStateMachine | None = KVStateMachine()
    membership = VOTERS
    try:
        cluster = ClusterArchive(archive, w.cluster_id)
        with tempfile.TemporaryDirectory() as tmp:
            snapshot = None
            batch: list[Entry] = []
            for entry in log_entries(w):
                if sm is not None:
                    if entry.kind == EntryKind.NORMAL:
                        sm.apply(entry.index, entry.data)
                    elif entry.kind == EntryKind.MEMBERSHIP:
                        membership = Membership.decode(entry.data)
                    if entry.index == w.base:
                        meta = SnapshotMeta(entry.index, entry.term, membership, entry.ts_ms)
                        path = SnapshotStore(tmp, fsync=False).save(meta, sm.kind,
                                                                    sm.write_snapshot)
                        snapshot, sm = (path, meta), None
                batch.append(entry)
                if len(batch) == SEGMENT_ENTRIES:
                    cluster.upload_segment(batch)
                    batch = []
            if batch:
                cluster.upload_segment(batch)
            assert snapshot is not None
            cluster.upload_snapshot(*snapshot)  # once the segments before it are there
        cluster.publish()
    finally:
        archive.close()


def _manifest(url: str, cluster_id: str, s3: dict[str, str | None]) -> Any:
    """The manifest in force for `cluster_id` (None if there is none)."""
    archive = open_archive(url, **s3)
    try:
        return ClusterArchive(archive, cluster_id).manifest()
    finally:
        archive.close()


def archived(url: str, w: Workload, s3: dict[str, str | None]) -> bool:
    manifest = _manifest(url, w.cluster_id, s3)
    return manifest is not None and manifest.last_archived_index == w.target


def remove_cluster(url: str, cluster_id: str, s3: dict[str, str | None]) -> None:
    """Delete a cluster's objects (a run's output, or a workload being rewritten); in a
    file:// archive its emptied folders too."""
    archive = open_archive(url, **s3)
    try:
        for key in list(archive.list_keys(f"{cluster_id}/")):
            archive.delete(key)
    finally:
        archive.close()
    if url.startswith("file://"):
        folder = Path(unquote(urlsplit(url).path)) / cluster_id
        for path in sorted(folder.rglob("*"), reverse=True) if folder.is_dir() else ():
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()


# ---------------------------------------------------------------------------------------------
# The engines


@dataclass
class Run:
    entries: int
    engine: str
    seconds: float = 0.0
    startup: float | None = None  # Spark: session + warm-up
    cpu: float | None = None  # CPU seconds of every process of the engine, over `seconds`
    others: float | None = None  # CPU seconds of everything else on the machine meanwhile
    parts: dict[str, float] = field(default_factory=dict)  # named parts of `seconds`
    sha256: str = ""
    payload_bytes: int = 0
    error: str | None = None


def _payload_digest(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with PayloadReader(path) as payload:
        while chunk := payload.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def run_replay(url: str, w: Workload, s3: dict[str, str | None], work: Path) -> Run:
    """The node's restore, called as the node's start-up calls it."""
    import logging

    from flotilla.node import restore
    from flotilla.node.config import NodeConfig
    from flotilla.node.storage import DiskStorage
    from flotilla.node.storage.datadir import DataDir

    cfg = NodeConfig(name="n1", data_dir=str(work / "n1"), listen_peer=("127.0.0.1", 0),
                     listen_client=("127.0.0.1", 0), advertise_peer="http://127.0.0.1:0",
                     advertise_client="http://127.0.0.1:0",
                     initial_cluster={"n1": "http://127.0.0.1:0"}, cluster_id="restored",
                     restore_from=url, restore_cluster_id=w.cluster_id, restore_index=w.target,
                     s3_endpoint=s3["endpoint"], s3_region=s3["region"])
    datadir = DataDir.open(cfg.data_dir, cluster_id=cfg.cluster_id, member_name=cfg.name)
    storage = DiskStorage(cfg.data_dir, cluster_id=cfg.cluster_id)
    snapshots = SnapshotStore(datadir.snapshot_dir)
    storage.recover()
    membership = Membership(voters=frozenset(cfg.initial_cluster),
                            addresses=tuple(sorted(cfg.initial_cluster.items())))
    # The restore logs once its downloads are verified, and once at the end: the first
    # record's time splits fetching from replaying.
    marks: list[float] = []

    class Marks(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            marks.append(time.perf_counter())

    logger = logging.getLogger(restore.__name__)
    handler, level = Marks(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    restore.mark(datadir.path, cfg)
    try:
        began, cpu, busy = time.perf_counter(), time.process_time(), _machine_busy()
        source = restore.open_source(cfg)  # the plan, from the manifest
        try:
            restore.restore(source, datadir.path, snapshots, storage, membership)
        finally:
            source.close()
        seconds, cpu = time.perf_counter() - began, time.process_time() - cpu
        others = max(0.0, _machine_busy() - busy - cpu)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        storage.close()
    latest = snapshots.latest()
    assert latest is not None
    digest, size = _payload_digest(latest.path)
    fetch = marks[0] - began if marks else 0.0
    return Run(w.entries, "replay", seconds, cpu=cpu, others=others,
               parts={"fetch+verify": fetch, "restore+apply+write": seconds - fetch},
               sha256=digest, payload_bytes=size)


def _warm_up(spark: Any, url: str, s3: dict[str, str | None]) -> None:
    """A whole snapshot-at over a small archive: Spark starts its Python workers (and reuses
    them), the pipeline is imported in each, and the JVM compiles the job's plans and hot
    paths, which costs about as much CPU as the job itself on 1M entries."""
    from flotilla.pipeline.snapshot_at import snapshot_at
    from flotilla.pipeline.source import ArchiveRef

    ref = ArchiveRef(url, WARM_UP.cluster_id, s3["endpoint"], s3["region"])
    target = f"{WARM_UP.cluster_id}-{os.getpid()}"
    try:
        snapshot_at(spark, ref, WARM_UP.target, to_cluster_id=target)
    finally:
        remove_cluster(url, target, s3)


def _stages(spark: Any) -> list[tuple[float, float, str]]:
    """(submitted, completed, stage of snapshot-at) of every completed Spark stage, in
    seconds of the epoch, from Spark's status store (kept whether or not the UI runs): the
    pipeline describes its jobs by its stage ("snapshot-at: keys")."""
    jvm = spark.sparkContext._jvm
    store = spark.sparkContext._jsc.sc().statusStore()
    described = {}
    jobs = store.jobsList(None)
    for n in range(jobs.size()):
        job = jobs.apply(n)
        what = job.description().getOrElse(None) or job.name()
        ids = job.stageIds()
        for m in range(ids.size()):
            described[ids.apply(m)] = str(what).removeprefix("snapshot-at: ")
    quantiles = spark.sparkContext._gateway.new_array(jvm.double, 0)
    stages = store.stageList(None, False, False, quantiles, jvm.java.util.ArrayList())
    out = []
    for n in range(stages.size()):
        s = stages.apply(n)
        if str(s.status()) != "COMPLETE":
            continue
        if s.submissionTime().isEmpty() or s.completionTime().isEmpty():
            continue
        out.append((s.submissionTime().get().getTime() / 1000,
                    s.completionTime().get().getTime() / 1000,
                    described.get(s.stageId(), "other")))
    return out


def _machine_busy() -> float:
    """CPU seconds the whole machine has been busy (every process, the kernel's too)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _cpu_seconds() -> float:
    """CPU time of this process and everything under it (the JVM, Spark's Python workers),
    dead children included."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry)] = int(fields[1])
        times[int(entry)] = sum(int(x) for x in fields[11:15]) / tick  # with reaped children
    mine, todo = set(), [os.getpid()]
    while todo:
        pid = todo.pop()
        mine.add(pid)
        todo.extend(child for child, parent in parents.items() if parent == pid)
    return sum(times.get(pid, 0.0) for pid in mine)


STAGES = ("decode", "sessions", "keys", "payload")  # snapshot-at's, in order
PARALLEL = ("decode", "sessions", "keys")  # those whose tasks are spread over the cores


def _covered(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for low, high in sorted(spans):
        if high > end:
            total += high - max(low, end)
            end = high
    return total


def spark_child(master: str, url: str, w: Workload, s3: dict[str, str | None],
                to_cluster_id: str, conn: Any) -> None:
    """One engine in its own process: `conn` gets the Run (or its error)."""
    run = Run(w.entries, master)
    try:
        from flotilla.pipeline.snapshot_at import snapshot_at
        from flotilla.pipeline.source import ArchiveRef
        from flotilla.pipeline.spark import spark_session

        began = time.perf_counter()
        spark = spark_session(master, app=f"pipeline-bench-{master}")
        try:
            session = time.perf_counter() - began
            _warm_up(spark, url, s3)
            run.startup = time.perf_counter() - began
            run.parts["session"] = session
            ref = ArchiveRef(url, w.cluster_id, s3["endpoint"], s3["region"])
            wall_began = time.time()
            cpu, busy = _cpu_seconds(), _machine_busy()
            began = time.perf_counter()
            snapshot_at(spark, ref, w.target, to_cluster_id=to_cluster_id)
            run.seconds = time.perf_counter() - began
            run.cpu = _cpu_seconds() - cpu
            run.others = max(0.0, _machine_busy() - busy - run.cpu)
            stages = [s for s in _stages(spark) if s[0] >= wall_began]
            for name in STAGES:
                run.parts[name] = _covered([(a, b) for a, b, what in stages if what == name])
            run.parts["driver"] = run.seconds - _covered([(a, b) for a, b, _ in stages])
        finally:
            spark.stop()
    except Exception as exc:  # reported in the table, not a traceback from a child
        run.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
    conn.send(run)
    conn.close()


def run_spark(master: str, url: str, w: Workload, s3: dict[str, str | None]) -> Run:
    to_cluster_id = f"{w.cluster_id}-{master.replace('[', '').replace(']', '')}-{os.getpid()}"
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=spark_child, args=(master, url, w, s3, to_cluster_id, send))
    child.start()
    send.close()
    try:
        run: Run = receive.recv()
    except EOFError:
        run = Run(w.entries, master, error=f"the Spark process died (exit {child.exitcode})")
    child.join()
    if run.error is None:
        archive = open_archive(url, **s3)
        try:
            cluster = ClusterArchive(archive, to_cluster_id)
            manifest = cluster.manifest()
            assert manifest is not None and manifest.last_snapshot is not None
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "s.snap"
                cluster.download_snapshot(manifest.last_snapshot, path)
                run.sha256, run.payload_bytes = _payload_digest(path)
        finally:
            archive.close()
    remove_cluster(url, to_cluster_id, s3)
    return run


# ---------------------------------------------------------------------------------------------
# The table


def parse_size(text: str) -> int:
    text = text.strip().lower().replace("_", "")
    scale = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    value = int(float(number) * scale)
    if value < 1_000:
        raise argparse.ArgumentTypeError(f"a size is at least 1k entries, not {text!r}")
    return value


def _size(n: int) -> str:
    return f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n / 1e3:g}k"


def render(runs: list[Run]) -> str:
    head = ["entries", "engine", "start-up s", "seconds", "entries/s", "vs replay", "cores",
            "others",
            *(f"{name} s" for name in STAGES), "driver s", "identical"]
    rows = [head]
    replay = {r.entries: r for r in runs if r.engine == "replay" and not r.error}
    for r in runs:
        base = replay.get(r.entries)
        if r.error:
            rows.append([_size(r.entries), r.engine, "", "FAILED", r.error,
                         *[""] * (len(head) - 5)])
            continue
        same = ("oracle" if r.engine == "replay" else "n/a" if base is None
                else "yes" if r.sha256 == base.sha256 else "NO")
        ratio = f"{base.seconds / r.seconds:.2f}x" if base is not None else ""
        rows.append([_size(r.entries), r.engine,
                     "" if r.startup is None else f"{r.startup:.1f}", f"{r.seconds:.1f}",
                     f"{r.entries / r.seconds:,.0f}", ratio,
                     "" if r.cpu is None else f"{r.cpu / r.seconds:.2f}",
                     "" if r.others is None else f"{r.others / r.seconds:.2f}",
                     *(f"{r.parts[p]:.1f}" if p in r.parts else ""
                       for p in (*STAGES, "driver")),
                     same])
    return _table(rows)


def scaling(runs: list[Run]) -> list[str]:
    """local[2] against local[1], per size: the whole job, the parallel stages, each stage."""
    out = []
    by = {(r.entries, r.engine): r for r in runs if not r.error}
    for n in sorted({r.entries for r in runs}):
        one, two = by.get((n, "local[1]")), by.get((n, "local[2]"))
        if not (one and two):
            continue
        parallel = [sum(r.parts[p] for p in PARALLEL) for r in (one, two)]
        each = ", ".join(f"{p} {one.parts[p] / two.parts[p]:.2f}x" for p in PARALLEL
                         if two.parts[p] > 0)
        payload = by[(n, "replay")].payload_bytes / 1e6 if (n, "replay") in by else 0
        out.append(f"{_size(n)}: a {payload:.0f} MB payload; "
                   f"local[2] is {one.seconds / two.seconds:.2f}x local[1] over "
                   f"the job, {parallel[0] / parallel[1]:.2f}x on the parallel stages "
                   f"({each})")
    return out


# ---------------------------------------------------------------------------------------------
# Compaction (--job compact)


@dataclass
class PassRun:
    engine: str
    name: str
    seconds: float = 0.0
    cpu: float | None = None
    result: dict[str, Any] = field(default_factory=dict)
    dirty_entries: int = 0
    digests: tuple[str, ...] = ()  # the compacted segments' SHA-256s: equal across engines
    error: str | None = None


def _log_time_lags(url: str, w: Workload, s3: dict[str, str | None],
                   fractions: Sequence[float]) -> list[int]:
    """For each fraction f, the --min-compaction-lag (log-time ms) whose cleanable point is
    the segment end nearest f of the log."""
    segments = _manifest(url, w.cluster_id, s3).raw_segments
    head = max(s.last_ts_ms or 0 for s in segments)
    lags = []
    for f in fractions:
        goal = w.target * f
        nearest = min(segments, key=lambda s: abs(s.last - goal))
        lags.append(head - (nearest.last_ts_ms or 0))
    return lags


def compact_child(master: str, url: str, w: Workload, s3: dict[str, str | None],
                  lags: list[int], warm_url: str, conn: Any) -> None:
    """Passes of compaction on `url` (a copy of the workload's archive) in a fresh process."""
    runs: list[PassRun] = []
    try:
        from flotilla.pipeline.compact import CompactionPolicy, CompactionResult, compact
        from flotilla.pipeline.source import ArchiveRef
        from flotilla.pipeline.spark import spark_session

        sequential = master == "sequential"
        spark = spark_session("local[1]" if sequential else master,
                              app=f"compact-bench-{master}")
        try:
            warm = ArchiveRef(warm_url, WARM_UP.cluster_id, s3["endpoint"], s3["region"])
            compact(spark, warm, CompactionPolicy(min_dirty_ratio=0.01), sequential=sequential)
            ref = ArchiveRef(url, w.cluster_id, s3["endpoint"], s3["region"])
            for n, lag in enumerate(lags):
                run = PassRun(master, f"pass {n + 1}")
                began, cpu = time.perf_counter(), _cpu_seconds()
                result = compact(spark, ref, CompactionPolicy(lag, min_dirty_ratio=0.01),
                                 sequential=sequential)
                run.seconds, run.cpu = time.perf_counter() - began, _cpu_seconds() - cpu
                if not isinstance(result, CompactionResult):
                    run.error = f"nothing cleaned: {result}"
                else:
                    run.result = json.loads(result.to_json())
                    compacted = _manifest(url, w.cluster_id, s3).compacted_segments
                    run.dirty_entries = result.entries_before - (
                        runs[-1].result["entries_after"] if runs else 0)
                    run.digests = tuple(s.sha256 for s in compacted)
                    assert sum(s.entries or 0 for s in compacted) == result.entries_after
                runs.append(run)
        finally:
            spark.stop()
    except Exception as exc:  # reported in the table
        runs.append(PassRun(master, "?", error=f"{type(exc).__name__}: "
                                               f"{str(exc).strip().splitlines()[0][:300]}"))
    conn.send(runs)
    conn.close()


def run_compaction(master: str, source: Path, scratch: Path, w: Workload,
                   lags: list[int]) -> list[PassRun]:
    """Copy the archive (a pass rewrites it) and run the passes on the copy."""
    work = scratch / f"compact-{master.replace('[', '').replace(']', '')}"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source, work / "archive")
    shutil.copytree(source, work / "warm", ignore=lambda d, names: [
        n for n in names if d == str(source) and n != WARM_UP.cluster_id])
    s3: dict[str, str | None] = {"endpoint": None, "region": None}
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=compact_child,
                        args=(master, (work / "archive").as_uri(), w, s3, lags,
                              (work / "warm").as_uri(), send))
    child.start()
    send.close()
    try:
        runs: list[PassRun] = receive.recv()
    except EOFError:
        runs = [PassRun(master, "?", error=f"the Spark process died (exit {child.exitcode})")]
    child.join()
    shutil.rmtree(work, ignore_errors=True)
    return runs


def render_compaction(runs: list[PassRun]) -> str:
    head = ["pass", "engine", "seconds", "dirty entries/s", "cores", "entries before",
            "entries after", "MB before", "MB after", "MB read", "read / dirty", "dirty ratio",
            "markers", "same bytes"]
    rows = [head]
    first = {r.name: r.digests for r in runs if not r.error}
    for r in runs:
        if r.error:
            rows.append([r.name, r.engine, "FAILED", r.error, *[""] * (len(head) - 4)])
            continue
        res = r.result
        clean_before = 0
        for other in runs:
            if other.engine == r.engine and other.name < r.name and other.result:
                clean_before = other.result["bytes_after"]
        dirty_bytes = res["bytes_before"] - clean_before
        rows.append([r.name, r.engine, f"{r.seconds:.1f}",
                     f"{r.dirty_entries / r.seconds:,.0f}",
                     "" if r.cpu is None else f"{r.cpu / r.seconds:.2f}",
                     f"{res['entries_before']:,}", f"{res['entries_after']:,}",
                     f"{res['bytes_before'] / 1e6:.1f}", f"{res['bytes_after'] / 1e6:.1f}",
                     f"{res['bytes_read'] / 1e6:.1f}", f"{res['bytes_read'] / dirty_bytes:.2f}",
                     f"{res['dirty_ratio']:.2f}", f"{res['markers']:,}",
                     "yes" if r.digests == first.get(r.name) else "NO"])
    return _table(rows)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("| " + " | ".join(c.ljust(wd) if i < 2 else c.rjust(wd)
                                       for i, (c, wd) in enumerate(zip(row, widths,
                                                                       strict=True))) + " |")
        if n == 0:
            lines.append("| " + " | ".join("-" * wd if i < 2 else "-" * (wd - 1) + ":"
                                           for i, wd in enumerate(widths)) + " |")
    return "\n".join(lines)


def main_compaction(args: argparse.Namespace, engines: list[str], sizes: list[int],
                    scratch: Path, url: str) -> int:
    """Two passes over a Zipf workload: the first cleans about 60% of the log, the second
    the rest on top of it (so it re-reads the first's output: Kafka's clean section)."""
    if not url.startswith("file://"):
        raise SystemExit("--job compact copies the archive for each engine: use a file:// "
                         "--archive (or none)")
    s3: dict[str, str | None] = {"endpoint": None, "region": None}
    source = Path(unquote(urlsplit(url).path))
    if not archived(url, WARM_UP, s3):
        remove_cluster(url, WARM_UP.cluster_id, s3)
        write_archive(url, WARM_UP, s3)
    runs: list[PassRun] = []
    for n in sizes:
        w = Workload(n, args.seed, zipf=args.zipf)
        if not archived(url, w, s3):
            remove_cluster(url, w.cluster_id, s3)
            began = time.perf_counter()
            write_archive(url, w, s3)
            print(f"{_size(n)}: wrote {w.target:,} entries (Zipf {args.zipf:g} keys) to "
                  f"{url}/{w.cluster_id} in {time.perf_counter() - began:.0f} s", flush=True)
        lags = _log_time_lags(url, w, s3, (0.6, 1.0))
        for engine in engines:
            found = run_compaction(engine, source, scratch, w, lags)
            runs.extend(found)
            print(f"{_size(n)} {engine}: " + ", ".join(
                r.error or f"{r.name} {r.seconds:.1f} s" for r in found), flush=True)
    print()
    print(render_compaction(runs))
    return 1 if any(r.error for r in runs) or len({r.digests for r in runs
                                                     if r.name == "pass 2"}) > 1 else 0


# ---------------------------------------------------------------------------------------------
# Export (--job export)


@dataclass
class ExportRun:
    engine: str
    entries: int = 0
    changes: int = 0
    seconds: float = 0.0
    cpu: float = 0.0
    output_bytes: int = 0
    digest: str = ""  # of the sorted change rows: equal across engines
    error: str | None = None


def export_child(master: str, url: str, w: Workload, out: str, warm_url: str,
                 conn: Any) -> None:
    """One full export of the workload's archive into Parquet under `out`, fresh process."""
    run = ExportRun(master)
    try:
        from flotilla.pipeline.export import Destination, export
        from flotilla.pipeline.source import ArchiveRef
        from flotilla.pipeline.spark import spark_session

        spark = spark_session(master, app=f"export-bench-{master}")
        try:
            export(spark, ArchiveRef(warm_url, WARM_UP.cluster_id),
                   Destination.parse(f"{out}-warm"), "parquet")
            began, cpu = time.perf_counter(), _cpu_seconds()
            result = export(spark, ArchiveRef(url, w.cluster_id), Destination.parse(out),
                            "parquet")
            run.seconds, run.cpu = time.perf_counter() - began, _cpu_seconds() - cpu
            run.entries, run.changes = result.entries, result.changes
        finally:
            spark.stop()
        import pyarrow.dataset as ds

        files = list(Path(unquote(urlsplit(out).path)).rglob("*.parquet"))
        run.output_bytes = sum(f.stat().st_size for f in files)
        table = ds.dataset(Path(unquote(urlsplit(out).path)) / "changes",
                           partitioning="hive").to_table(columns=["index", "op", "key",
                                                                   "after"])
        table = table.sort_by("index")
        digest = hashlib.sha256()
        for column in table.columns:
            for value in column.to_pylist():
                digest.update(repr(value).encode())
        run.digest = digest.hexdigest()
    except Exception as exc:  # reported in the table
        run.error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
    conn.send(run)
    conn.close()


def run_export(master: str, url: str, scratch: Path, w: Workload) -> ExportRun:
    out = scratch / f"export-{master.replace('[', '').replace(']', '')}"
    shutil.rmtree(out, ignore_errors=True)
    ctx = multiprocessing.get_context("spawn")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=export_child,
                        args=(master, url, w, out.as_uri(), url, send))
    child.start()
    send.close()
    try:
        run: ExportRun = receive.recv()
    except EOFError:
        run = ExportRun(master, error=f"the Spark process died (exit {child.exitcode})")
    child.join()
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(Path(f"{out}-warm"), ignore_errors=True)
    return run


def main_export(args: argparse.Namespace, engines: list[str], sizes: list[int],
                scratch: Path, url: str) -> int:
    """A full export of each workload into Parquet (file://), per engine."""
    s3: dict[str, str | None] = {"endpoint": None, "region": None}
    if not archived(url, WARM_UP, s3):
        remove_cluster(url, WARM_UP.cluster_id, s3)
        write_archive(url, WARM_UP, s3)
    rows = [["entries", "engine", "seconds", "entries/s", "cores", "entries/s per core",
             "changes", "MB of Parquet", "same rows"]]
    failed = False
    for n in sizes:
        w = Workload(n, args.seed)
        if not archived(url, w, s3):
            remove_cluster(url, w.cluster_id, s3)
            write_archive(url, w, s3)
        runs = [run_export(engine, url, scratch, w) for engine in engines]
        for r in runs:
            if r.error:
                failed = True
                rows.append([_size(n), r.engine, "FAILED", r.error, "", "", "", "", ""])
                continue
            rows.append([_size(n), r.engine, f"{r.seconds:.1f}", f"{r.entries / r.seconds:,.0f}",
                         f"{r.cpu / r.seconds:.2f}", f"{r.entries / r.cpu:,.0f}",
                         f"{r.changes:,}", f"{r.output_bytes / 1e6:.1f}",
                         "yes" if r.digest == runs[0].digest else "NO"])
            failed |= r.digest != runs[0].digest
            print(f"{_size(n)} {r.engine}: {r.seconds:.1f} s", flush=True)
    print()
    print(_table(rows))
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="1M,3M",
                   help="entries folded on top of the base snapshot, comma-separated "
                        "(default 1M,3M)")
    p.add_argument("--quick", action="store_true", help="one small size (100k): a smoke run")
    p.add_argument("--engines", default="replay,local[1],local[2]",
                   help="comma-separated, of replay and Spark masters (default "
                        "replay,local[1],local[2]); the replay is the oracle")
    p.add_argument("--archive", default=None,
                   help="archive root to write the workloads into and read them from (kept; "
                        "a workload already there is reused). Default: a temporary directory")
    p.add_argument("--keep", action="store_true",
                   help=f"keep the archives (in {CACHE / 'pipeline-bench'} unless --archive "
                        "says) and reuse them next time")
    p.add_argument("--s3-endpoint", default=None)
    p.add_argument("--s3-region", default=None)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--job", choices=("snapshot-at", "compact", "export"),
                   default="snapshot-at",
                   help="snapshot-at (default): the table above; compact: two compaction "
                        "passes over a Zipf workload (--sizes default 1M, --engines default "
                        "local[1],local[2],sequential); export: a full export into Parquet "
                        "(--sizes default 1M, --engines default local[1],local[2])")
    p.add_argument("--zipf", type=float, default=1.2,
                   help="--job compact: the Zipf exponent of the keys written (default 1.2)")
    args = p.parse_args(argv)
    try:
        sizes = [100_000] if args.quick else [parse_size(s) for s in args.sizes.split(",")]
    except (argparse.ArgumentTypeError, ValueError) as exc:
        p.error(f"--sizes: {exc}")
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if args.job in ("compact", "export"):
        if args.engines == p.get_default("engines"):
            engines = ["local[1]", "local[2]"] + (["sequential"] if args.job == "compact"
                                                   else [])
        if args.sizes == p.get_default("sizes") and not args.quick:
            sizes = [1_000_000]
    elif "replay" not in engines:
        p.error("--engines must include replay: it is the oracle the others are checked against")
    s3 = {"endpoint": args.s3_endpoint, "region": args.s3_region}
    scratch = Path(tempfile.mkdtemp(prefix="flotilla-pipeline-bench-"))
    if args.archive:
        url = args.archive
    elif args.keep:
        (CACHE / "pipeline-bench").mkdir(parents=True, exist_ok=True)
        url = (CACHE / "pipeline-bench").as_uri()
    else:
        url = (scratch / "archive").as_uri()
    started = time.perf_counter()
    runs: list[Run] = []
    if args.job in ("compact", "export"):
        job = main_compaction if args.job == "compact" else main_export
        try:
            code = job(args, engines, sizes, scratch, url)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"{os.cpu_count()} CPUs, load average {load}; whole run "
              f"{time.perf_counter() - started:.0f} s")
        print("command: " + " ".join([".venv/bin/python", "bench/pipeline_bench.py",
                                      *(argv if argv is not None else sys.argv[1:])]))
        return code
    try:
        if any(engine != "replay" for engine in engines) and not archived(url, WARM_UP, s3):
            remove_cluster(url, WARM_UP.cluster_id, s3)
            write_archive(url, WARM_UP, s3)
        for n in sizes:
            w = Workload(n, args.seed)
            if archived(url, w, s3):
                print(f"{_size(n)}: reusing {url}/{w.cluster_id}", flush=True)
            else:
                remove_cluster(url, w.cluster_id, s3)
                began = time.perf_counter()
                write_archive(url, w, s3)
                print(f"{_size(n)}: wrote {w.target:,} entries and a snapshot at {w.base:,} "
                      f"to {url}/{w.cluster_id} in {time.perf_counter() - began:.0f} s",
                      flush=True)
            for engine in engines:
                if engine == "replay":
                    work = scratch / f"replay-{n}"
                    run = run_replay(url, w, s3, work)
                    shutil.rmtree(work, ignore_errors=True)
                else:
                    run = run_spark(engine, url, w, s3)
                runs.append(run)
                print(f"{_size(n)} {engine}: {run.error or f'{run.seconds:.1f} s'}", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print(render(runs))
    for line in scaling(runs):
        print(line)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{os.cpu_count()} CPUs, load average {load}; whole run "
          f"{time.perf_counter() - started:.0f} s")
    print("command: " + " ".join([".venv/bin/python", "bench/pipeline_bench.py",
                                  *(argv if argv is not None else sys.argv[1:])]))
    replay = {r.entries: r.sha256 for r in runs if r.engine == "replay"}
    wrong = [r for r in runs if r.error or r.sha256 != replay.get(r.entries)]
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
