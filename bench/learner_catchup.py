"""How long a new learner takes to catch up behind a compacted log: via the archive or the leader.

For each mode, a fresh 3-member cluster of ``flotilla node`` processes on loopback (the test
harness's LocalCluster, heartbeat 100 ms, election timeout 1000 ms, fsync on, the harness's
``--admin-token``, which its clients send with every admin call) is started in a temporary
directory:

* ``archive``: every member runs with ``--archive`` (a ``file://`` directory under the run's
  temporary directory, or with ``--s3`` a bucket on a local ``moto_server``). A leader whose
  current snapshot is archived sends a new learner only a reference, and the learner downloads
  the snapshot from the archive itself.
* ``leader``: no archive; the leader streams its snapshot file to the learner.

Then, in each mode:

1. ``--state-mb`` MB of state is written by ``--clients`` concurrent clients to the leader, as
   values of ``--value-kb`` KiB (random bytes, so that nothing compresses them away);
2. in mode archive, the bench waits until the archive holds every committed entry (the leader
   keeps unarchived entries in its log whatever its snapshots cover), then ``POST /v1/snapshot``
   on the leader takes a snapshot, compacts the log and, with an archive, ships the snapshot
   before it answers;
3. ``--tail-keys`` more keys are written (the learner gets them from the leader's log);
4. a learner is started empty (``--initial-cluster-state existing``, the same extra flags as
   the voters, so it has the same ``--archive``) and, once it serves HTTP, added with
   ``POST /v1/members`` to the leader. The clock starts right before that request (the
   learner's process start-up is not counted) and stops at the first poll (every 50 ms, of
   ``GET /v1/status``) at which the learner's ``applied_index`` has reached the leader's
   ``commit_index`` read just before it (and the add request has been answered);
5. read from ``GET /metrics``: on the leader, the deltas over the catch-up of
   ``flotilla_snapshot_bytes_sent_total`` (snapshot bytes it streamed),
   ``flotilla_snapshots_sent_total`` (snapshots streamed) and
   ``flotilla_snapshot_references_sent_total`` (archive references the follower fetched); on
   the learner, ``flotilla_snapshots_installed_total{source=...}``;
6. the learner proves it has the data: ``GET /v1/kv?prefix=bench/&consistency=serializable``
   counts every key, and a few keys (first, last, random, the last tail key) are read with
   ``consistency=serializable`` from the learner and compared byte for byte;
7. the learner is removed (``DELETE /v1/members/{name}``) and stopped, and steps 4-6 are
   repeated with a new, empty learner (``--repeat`` in all, default 3: on a small shared
   machine one catch-up of a few seconds is noisy). The table shows the median time, with
   every run's time beside it, and each learner's counters (one value when all agree).

Usage::

    .venv/bin/python bench/learner_catchup.py                    # 200 MB state, both modes
    .venv/bin/python bench/learner_catchup.py --state-mb 20      # a quick run
    .venv/bin/python bench/learner_catchup.py --modes archive --s3 --keep

``--s3`` needs ``moto_server`` (``pip install 'moto[server]'``, part of the test extras); it
keeps objects in memory, so a large state costs that much memory in moto. The whole run needs
about ten times the state in disk space (three voters' logs and snapshots, the archive, the
learner) under ``$TMPDIR``, and each member holds the state in memory.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import importlib
import json
import math
import os
import random
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
HEARTBEAT_MS = 100
ELECTION_TIMEOUT_MS = 1000
MiB = 1 << 20
VALUE_LIMIT = 1 << 20  # the node's default --max-value-bytes
KEY_PREFIX = "bench/"
POLL_SECONDS = 0.05
S3_BUCKET = "flotilla-bench"
S3_REGION = "us-east-1"
MODES = ("archive", "leader")


def _harness(module: str) -> Any:
    """A module of the process-test harness (tests/harness), importable from this script."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"tests.harness.{module}")


class BenchError(RuntimeError):
    """A step of the bench failed; the message says which and why."""


# ---------------------------------------------------------------------------------------------
# Cleanup: every process this bench starts is registered here and killed at exit, on failure,
# Ctrl-C or SIGTERM alike.


_live_clusters: list[Any] = []
_live_procs: list[subprocess.Popen] = []


def _cleanup() -> None:
    while _live_clusters:
        cluster = _live_clusters.pop()
        with contextlib.suppress(Exception):
            cluster.stop_all()
    while _live_procs:
        proc = _live_procs.pop()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks, then atexit


# ---------------------------------------------------------------------------------------------
# The data: deterministic random values, so the learner's copy can be checked byte for byte


def state_key(i: int) -> str:
    return f"{KEY_PREFIX}state/{i:06d}"


def tail_key(i: int) -> str:
    return f"{KEY_PREFIX}tail/{i:03d}"


def value_for(key: str, size: int) -> bytes:
    return random.Random(key).randbytes(size)


# ---------------------------------------------------------------------------------------------
# HTTP helpers (the harness's KVClient: one per thread)


def metrics(url: str) -> dict[str, float]:
    """``GET /metrics`` of one member, as {series: value}."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            text = r.read().decode()
    except (OSError, urllib.error.URLError) as exc:
        raise BenchError(f"GET {url}/metrics failed: {exc}") from exc
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


def metric(doc: dict[str, float], name: str) -> float:
    if name not in doc:
        raise BenchError(f"/metrics has no {name}; this node does not export it (yet)")
    return doc[name]


def put_with_retries(client: Any, key: str, value: bytes, attempts: int = 8) -> None:
    """One write, retried on 503 (no leader for a moment) and transport errors."""
    transport_errors = _harness("kvclient").TRANSPORT_ERRORS
    last = ""
    for attempt in range(attempts):
        try:
            resp = client.put(key, value)
        except transport_errors as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if resp.status == 200:
                return
            last = f"{resp.status} {resp.body[:200]!r}"
            if resp.status not in (503, 504):
                break
        time.sleep(min(2.0, 0.1 * 2 ** attempt))
    raise BenchError(f"PUT {key} to {client.url} failed: {last}")


def status(cluster: Any, name: str) -> dict[str, Any]:
    """``GET /v1/status``, retried for a few seconds (a member busy installing a snapshot on a
    small machine can be slow to answer)."""
    transport_errors = _harness("kvclient").TRANSPORT_ERRORS
    deadline = time.monotonic() + 15
    while True:
        try:
            return cluster.status(name, timeout=5.0)
        except (*transport_errors, RuntimeError, ValueError) as exc:
            if time.monotonic() > deadline:
                raise BenchError(f"GET /v1/status of {name} keeps failing: {exc}") from exc
            time.sleep(0.2)


# ---------------------------------------------------------------------------------------------
# An S3 archive on moto_server (optional)


def start_moto(workdir: Path) -> tuple[str, dict[str, str]]:
    """Start moto_server on a free loopback port and create the bucket; returns the endpoint
    and the AWS environment the nodes need (dummy credentials, no shared config)."""
    beside = Path(sys.executable).with_name("moto_server")
    binary = str(beside) if beside.exists() else shutil.which("moto_server")
    if binary is None:
        raise BenchError("--s3 needs moto_server: pip install 'moto[server]' into the venv")
    env = {
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_CONFIG_FILE": str(workdir / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(workdir / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    port = _harness("ports").allocate_port("127.0.0.1")
    endpoint = f"http://127.0.0.1:{port}"
    log_path = workdir / "moto_server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([binary, "-H", "127.0.0.1", "-p", str(port)], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    _live_procs.append(proc)
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise BenchError(f"moto_server exited with {proc.returncode}: "
                             f"{log_path.read_text()[-1000:]}")
        try:
            urllib.request.urlopen(endpoint, timeout=1).close()
            break
        except urllib.error.HTTPError:
            break  # it answers (with an S3 error document): it is up
        except OSError:
            if time.monotonic() > deadline:
                raise BenchError(f"moto_server did not answer on {endpoint} within 30 s") \
                    from None
            time.sleep(0.1)
    import boto3  # the test extras install it with moto
    from botocore.config import Config

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        s3 = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name=S3_REGION,
            config=Config(s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket=S3_BUCKET)
        s3.close()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return endpoint, env


# ---------------------------------------------------------------------------------------------
# One mode


@dataclass
class LearnerRun:
    """One learner added behind the compacted log, and what it took."""

    name: str
    catchup_seconds: float | None = None
    snapshot_applied_seconds: float | None = None  # when applied_index passed the snapshot
    bytes_streamed: float | None = None  # leader counter deltas over this learner's catch-up
    snapshots_streamed: float | None = None
    references: float | None = None
    installed: dict[str, float] = field(default_factory=dict)  # the learner's counters
    keys_on_learner: int | None = None
    checked: list[str] = field(default_factory=list)

    @property
    def installed_from(self) -> str:
        got = [src + (f" x{int(n)}" if n != 1 else "")
               for src, n in sorted(self.installed.items()) if n]
        return "+".join(got) if got else ("nothing" if self.installed else "n/a")


@dataclass
class Result:
    mode: str
    state_bytes: int = 0
    snapshot_bytes: int | None = None
    snapshot_index: int | None = None
    snapshot_location: str = ""
    fill_seconds: float | None = None
    leader_first_index: int | None = None
    keys_expected: int | None = None
    learners: list[LearnerRun] = field(default_factory=list)
    timed_from: str = "POST /v1/members"
    commands: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def done(self) -> list[LearnerRun]:
        return [r for r in self.learners if r.catchup_seconds is not None]

    def per_learner(self, attr: str, fmt: Any) -> str:
        """One value when every learner agrees, else each learner's, separated by /."""
        values = [fmt(getattr(r, attr)) for r in self.done]
        if not values:
            return "n/a"
        return values[0] if len(set(values)) == 1 else "/".join(values)

    @property
    def catchup_cell(self) -> str:
        times = [r.catchup_seconds for r in self.done]
        if not times:
            return "n/a"
        if len(times) == 1:
            return _fmt_s(times[0])
        return (f"{statistics.median(times):.2f} (median; "
                + ", ".join(_fmt_s(t) for t in times) + ")")


def archive_args(mode: str, args: argparse.Namespace, workdir: Path,
                 s3_endpoint: str | None) -> list[str]:
    if mode != "archive":
        return []
    if s3_endpoint is not None:
        url = f"s3://{S3_BUCKET}/{workdir.name}"
        extra = ["--s3-endpoint", s3_endpoint, "--s3-region", S3_REGION]
    else:
        url = (workdir / "archive").as_uri()
        extra = []
    return ["--archive", url, *extra, "--archive-interval-ms", str(args.archive_interval_ms)]


def fill(cluster: Any, leader: str, args: argparse.Namespace, n_keys: int,
         value_bytes: int) -> None:
    """Write keys 0..n_keys-1 from ``args.clients`` threads, each with its own connection."""
    done = 0
    lock = threading.Lock()
    stop = threading.Event()
    step = max(1, n_keys // 10)
    t0 = time.monotonic()

    def writer(worker: int) -> None:
        nonlocal done
        with cluster.client(leader, timeout=60.0) as c:
            for i in range(worker, n_keys, args.clients):
                if stop.is_set():
                    return
                key = state_key(i)
                put_with_retries(c, key, value_for(key, value_bytes))
                with lock:
                    done += 1
                    if done % step == 0 or done == n_keys:
                        mb = done * value_bytes / MiB
                        print(f"    {done}/{n_keys} keys, {mb:.0f} MB, "
                              f"{mb / (time.monotonic() - t0):.1f} MB/s", flush=True)

    with ThreadPoolExecutor(args.clients, thread_name_prefix="fill") as pool:
        futures = [pool.submit(writer, w) for w in range(args.clients)]
        try:
            for f in futures:
                f.result()
        except BaseException:
            stop.set()  # the other writers stop at their next key (Ctrl-C, or one failed)
            raise


def wait_archived(cluster: Any, leader: str, timeout: float) -> int:
    """Wait until the archive holds every committed entry; returns that index."""
    deadline = time.monotonic() + timeout
    while True:
        doc = status(cluster, leader)
        archive = doc.get("archive") or {}
        if archive.get("error"):
            print(f"    archive error reported by {leader}: {archive['error']}", flush=True)
        archived = archive.get("last_archived_index") or 0
        if archived >= doc["commit_index"]:
            return archived
        if time.monotonic() > deadline:
            raise BenchError(f"the archive holds entries up to {archived} but {leader} has "
                             f"committed {doc['commit_index']} after {timeout:.0f}s "
                             f"(archive status: {archive})")
        time.sleep(0.2)


def add_learner(cluster: Any, name: str, result: Result) -> tuple[Any, float, Future[int]]:
    """Start ``name`` empty and add it as a learner; returns (node, clock start, future of the
    POST /v1/members answer).

    This is ``LocalCluster.add_member`` split in two so that the clock starts at the request,
    not at the process start (a Python process takes a second or more to import and serve on a
    busy machine). It uses the harness's own helpers, so the learner gets exactly the flags
    ``add_member`` would give it (the cluster's ``extra_args``: the same ``--archive``).
    """
    if not (hasattr(cluster, "_allocate") and hasattr(cluster, "_node")):
        # The harness changed: fall back to add_member and say the time includes the start.
        note = ("LocalCluster has no _allocate/_node any more: timed from the add_member() "
                "call, which includes starting the learner process")
        if note not in result.notes:
            result.notes.append(note)
        result.timed_from = "add_member() call (includes the learner's process start)"
        t0 = time.monotonic()
        node = cluster.add_member(name, timeout=120)
        done: Future[int] = Future()
        done.set_result(200)
        return node, t0, done
    cluster._allocate(name)
    node = cluster.nodes[name] = cluster._node(name, "existing", [*cluster.members, name])
    node.start()
    node.wait_serving(60)
    leader = cluster.wait_leader(30)
    client = cluster.client(leader, timeout=120.0)

    def post() -> int:
        with client:
            resp = client.add_member(name, node.peer_url, node.url)
        if resp.status != 200:
            raise BenchError(f"POST /v1/members {name} to {leader} answered {resp.status}: "
                             f"{resp.body[:300]!r}")
        cluster.members.append(name)
        return resp.status

    pool = ThreadPoolExecutor(1, thread_name_prefix="add")
    t0 = time.monotonic()
    future = pool.submit(post)
    pool.shutdown(wait=False)
    return node, t0, future


def remove_learner(cluster: Any, leader: str, name: str) -> None:
    """``DELETE /v1/members/{name}``, then stop the process (the next learner starts alone)."""
    with cluster.client(leader, timeout=60.0) as c:
        resp = c.request("DELETE", f"/v1/members/{name}")
    if resp.status != 200:
        raise BenchError(f"DELETE /v1/members/{name} on {leader} answered {resp.status}: "
                         f"{resp.body[:300]!r}")
    if name in cluster.members:
        cluster.members.remove(name)
    cluster.nodes[name].kill()


def prepare(cluster: Any, mode: str, args: argparse.Namespace, workdir: Path,
            result: Result, n_keys: int, value_bytes: int) -> str:
    """Fill the state, snapshot, write the tail; returns the leader."""
    cluster.start()
    leader = cluster.wait_leader(60)
    print(f"  leader {leader}; writing {n_keys} keys of {args.value_kb} KiB "
          f"({result.state_bytes / MiB:.0f} MB) with {args.clients} clients", flush=True)
    t_fill = time.monotonic()
    fill(cluster, leader, args, n_keys, value_bytes)
    result.fill_seconds = time.monotonic() - t_fill
    if mode == "archive":
        archived = wait_archived(cluster, leader, args.archive_wait)
        print(f"  the archive holds every committed entry (up to {archived})", flush=True)
    with cluster.client(leader, timeout=args.timeout) as c:
        t = time.monotonic()
        snap = c.request("POST", "/v1/snapshot", b"")
        if snap.status != 200:
            raise BenchError(f"POST /v1/snapshot on {leader} answered {snap.status}: "
                             f"{snap.body[:300]!r}")
        doc = snap.json()
        result.snapshot_bytes = doc["bytes"]
        result.snapshot_index = doc["index"]
        result.snapshot_location = doc.get("location", "")
        print(f"  POST /v1/snapshot: index {doc['index']}, {doc['bytes'] / MiB:.1f} MB, "
              f"in {time.monotonic() - t:.1f}s, at {result.snapshot_location}", flush=True)
        if mode == "archive" and result.snapshot_location.startswith(
                (workdir / leader).as_uri()):
            result.notes.append(f"POST /v1/snapshot answered a location in the leader's "
                                f"data dir, not the archive: {result.snapshot_location}")
        for i in range(args.tail_keys):
            put_with_retries(c, tail_key(i), value_for(tail_key(i), value_bytes))
    if cluster.wait_leader(30) != leader:
        raise BenchError(f"leadership moved away from {leader} before the learner was "
                         "added; the leader's counters would not be comparable")
    doc = status(cluster, leader)
    result.leader_first_index = doc["first_index"]
    if result.leader_first_index <= 1:
        result.notes.append(f"the leader's log was not compacted (first_index "
                            f"{result.leader_first_index}): a learner may replicate the "
                            "whole log instead of installing a snapshot")
    print(f"  wrote {args.tail_keys} tail keys; leader log now {doc['first_index']}"
          f"..{doc['last_index']}, commit {doc['commit_index']}", flush=True)
    return leader


def measure_learner(cluster: Any, leader: str, name: str, args: argparse.Namespace,
                    result: Result, n_keys: int, value_bytes: int) -> LearnerRun:
    run = LearnerRun(name)
    doc = status(cluster, leader)
    if doc["snapshot"]["index"] != result.snapshot_index:
        note = (f"before adding {name}, the leader's current snapshot is {doc['snapshot']}, not "
                f"the one POST /v1/snapshot took ({result.snapshot_index}); only an archived "
                "current snapshot is sent as a reference")
        result.notes.append(note)
    before = metrics(cluster.nodes[leader].url)
    node, t0, added = add_learner(cluster, name, result)
    if not result.commands:
        result.commands = [" ".join(shlex.quote(a) for a in cluster.nodes[leader].argv),
                           " ".join(shlex.quote(a) for a in node.argv)]
    print(f"  learner {name} serves at {node.url}; added at t=0, polling every "
          f"{POLL_SECONDS * 1e3:.0f} ms", flush=True)
    deadline = t0 + args.timeout
    last_report = t0
    while True:
        if added.done() and added.exception() is not None:
            raise added.exception()  # type: ignore[misc]
        if not node.running:
            raise BenchError(f"the learner exited with {node.returncode}:\n"
                             f"{node.log_tail(30)}")
        target = status(cluster, leader)["commit_index"]
        mine = status(cluster, name)
        now = time.monotonic()
        applied = mine["applied_index"]
        if (run.snapshot_applied_seconds is None and result.snapshot_index
                and applied >= result.snapshot_index):
            run.snapshot_applied_seconds = now - t0
        if applied >= target and added.done():
            run.catchup_seconds = now - t0
            break
        if now > deadline:
            raise BenchError(f"{name} did not catch up within {args.timeout:.0f}s: "
                             f"applied {applied}, leader commit {target}\n"
                             f"{cluster.log_tails(15)}")
        if now - last_report > 5:
            last_report = now
            print(f"    t={now - t0:5.1f}s {name} applied {applied}/{target} "
                  f"(role {mine.get('role')})", flush=True)
        time.sleep(POLL_SECONDS)
    if cluster.wait_leader(30) != leader:
        result.notes.append(f"leadership changed while {name} caught up: the leader's counter "
                            "deltas are of the old leader")
    after = metrics(cluster.nodes[leader].url)
    learner_metrics = metrics(node.url)

    def delta(series: str) -> float:
        return metric(after, series) - metric(before, series)

    run.bytes_streamed = delta("flotilla_snapshot_bytes_sent_total")
    run.snapshots_streamed = delta("flotilla_snapshots_sent_total")
    run.references = delta("flotilla_snapshot_references_sent_total")
    run.installed = {
        src: metric(learner_metrics, f'flotilla_snapshots_installed_total{{source="{src}"}}')
        for src in ("archive", "leader")}
    print(f"  {name} caught up after {run.catchup_seconds:.2f}s (snapshot applied at "
          f"{_fmt_s(run.snapshot_applied_seconds)}s); installed from {run.installed_from}; "
          f"leader streamed {_fmt_n(run.bytes_streamed)} bytes", flush=True)
    verify(node, args, n_keys, value_bytes, result, run)
    if result.mode == "archive" and not run.installed.get("archive"):
        result.notes.append(f"{name} did not install from the archive; the leader's and "
                            "learner's logs say:\n" + _grep_logs(cluster, leader, name))
    return run


def run_mode(mode: str, args: argparse.Namespace, workdir: Path,
             s3: tuple[str, dict[str, str]] | None) -> Result:
    result = Result(mode)
    processes = _harness("processes")
    value_bytes = args.value_kb * 1024
    n_keys = math.ceil(args.state_mb * MiB / value_bytes)
    result.state_bytes = n_keys * value_bytes
    result.keys_expected = n_keys + args.tail_keys
    extra = archive_args(mode, args, workdir, s3[0] if s3 else None)
    print(f"\n== mode {mode}: 3 voters + {args.repeat} learner(s) one after the other, under "
          f"{workdir}" + (f", archive {extra[1]}" if extra else ", no archive"), flush=True)
    cluster = processes.LocalCluster(
        workdir, 3, election_timeout_ms=args.election_timeout_ms,
        heartbeat_ms=args.heartbeat_ms, extra_args=extra, env=s3[1] if s3 else None,
        start=False)
    _live_clusters.append(cluster)
    try:
        leader = prepare(cluster, mode, args, workdir, result, n_keys, value_bytes)
        for k in range(args.repeat):
            name = f"n{3 + k}"
            result.learners.append(
                measure_learner(cluster, leader, name, args, result, n_keys, value_bytes))
            remove_learner(cluster, leader, name)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        result.error = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        print(f"  mode {mode} FAILED: {result.error}\n  logs: {workdir} "
              f"(kept with --keep)", flush=True)
    finally:
        with contextlib.suppress(Exception):
            cluster.stop_all()
        if cluster in _live_clusters:
            _live_clusters.remove(cluster)
    return result


def verify(node: Any, args: argparse.Namespace, n_keys: int, value_bytes: int,
           result: Result, run: LearnerRun) -> None:
    """The learner's own state (serializable reads): every key is there, and a few keys hold
    exactly what was written."""
    with node.client(timeout=60.0) as c:
        resp = c.request("GET", "/v1/kv", query={"prefix": KEY_PREFIX,
                                                 "consistency": "serializable"})
        if resp.status != 200:
            raise BenchError(f"{run.name}'s key listing answered {resp.status}: "
                             f"{resp.body[:300]!r}")
        run.keys_on_learner = len(resp.json()["keys"])
        rng = random.Random(run.name)
        keys = [state_key(0), state_key(n_keys - 1),
                *(state_key(rng.randrange(n_keys)) for _ in range(args.check_keys))]
        if args.tail_keys:
            keys.append(tail_key(args.tail_keys - 1))
        for key in keys:
            got = c.get(key, consistency="serializable")
            if got.status != 200:
                raise BenchError(f"{run.name} answered {got.status} for {key}: "
                                 f"{got.body[:200]!r}")
            if got.body != value_for(key, value_bytes):
                raise BenchError(f"{run.name}'s value of {key} differs from what was written "
                                 f"({len(got.body)} bytes)")
            run.checked.append(key)
    if run.keys_on_learner != result.keys_expected:
        raise BenchError(f"{run.name} lists {run.keys_on_learner} keys under "
                         f"{KEY_PREFIX!r}, expected {result.keys_expected}")
    print(f"  {run.name} holds all {run.keys_on_learner} keys; {len(run.checked)} values "
          "read back (serializable) and identical", flush=True)


def _grep_logs(cluster: Any, *names: str) -> str:
    words = ("snapshot", "archive", "reference", "stream")
    out = []
    for name in names:
        lines = [ln for ln in cluster.nodes[name].log_tail(400).splitlines()
                 if any(w in ln.lower() for w in words)]
        out.append(f"--- {name}:\n" + "\n".join(lines[-20:]))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# The table


COLUMNS = ["mode", "state MB", "snapshot bytes", "time to caught up (s)",
           "bytes the leader streamed", "snapshots streamed", "archive references",
           "installed from"]


def _fmt_s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"


def _fmt_n(v: float | None) -> str:
    return "n/a" if v is None else f"{int(v):,}"


def render(results: list[Result]) -> str:
    table = [COLUMNS]
    for r in results:
        table.append([r.mode, f"{r.state_bytes / MiB:.0f}", _fmt_n(r.snapshot_bytes),
                      r.catchup_cell, r.per_learner("bytes_streamed", _fmt_n),
                      r.per_learner("snapshots_streamed", _fmt_n),
                      r.per_learner("references", _fmt_n),
                      ("FAILED; " if r.error else "")
                      + r.per_learner("installed_from", str)])
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS))]
    out = []
    for n, row in enumerate(table):
        out.append(" | ".join(c.ljust(w) if i in (0, len(row) - 1) else c.rjust(w)
                              for i, (c, w) in enumerate(zip(row, widths, strict=True))))
        if n == 0:
            out.append("-+-".join("-" * w for w in widths))
    out.append("(counters are per learner: the leader's deltas over each learner's catch-up, "
               "and the learner's own installs)")
    for r in results:
        applied = ", ".join(_fmt_s(x.snapshot_applied_seconds) for x in r.done) or "n/a"
        keys = ", ".join(f"{x.keys_on_learner}" for x in r.done) or "n/a"
        details = [f"fill {_fmt_s(r.fill_seconds)}s",
                   f"snapshot index {r.snapshot_index}",
                   f"leader log starts at {r.leader_first_index}",
                   f"snapshot applied on the learners at {applied}s",
                   f"learner keys {keys} of {r.keys_expected}",
                   f"timed from {r.timed_from}"]
        out.append(f"{r.mode}: " + ", ".join(details))
        if r.snapshot_location:
            out.append(f"{r.mode}: snapshot location {r.snapshot_location}")
        if r.error:
            out.append(f"{r.mode}: FAILED: {r.error.splitlines()[0]}")
        for note in r.notes:
            out.append(f"{r.mode}: NOTE: {note}")
    return "\n".join(out)


def reproduce(args: argparse.Namespace, results: list[Result]) -> str:
    argv = [".venv/bin/python", "bench/learner_catchup.py", "--state-mb", f"{args.state_mb:g}",
            "--value-kb", str(args.value_kb), "--clients", str(args.clients),
            "--tail-keys", str(args.tail_keys), "--repeat", str(args.repeat),
            "--modes", ",".join(args.mode_list)]
    if args.s3:
        argv.append("--s3")
    lines = ["To reproduce (from the repo root):", "  " + " ".join(argv)]
    for r in results:
        if len(r.commands) == 2:
            lines += [f"By hand, mode {r.mode} (paths of this run's temporary directory):",
                      f"  a voter:   {r.commands[0]}",
                      f"  learner:   {r.commands[1]}  (the next ones: n4, n5...)",
                      "  then, with AUTH='Authorization: Bearer <their --admin-token>': fill "
                      "the state with PUT /v1/kv/...; curl -X POST -H \"$AUTH\" "
                      "$LEADER/v1/snapshot; a few more PUTs; curl -X POST -H \"$AUTH\" "
                      "$LEADER/v1/members -d '{\"name\": \"n3\", \"peer_url\": ..., "
                      "\"client_url\": ...}'; poll /v1/status of both (with $AUTH); compare "
                      "GET /metrics before and after"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--state-mb", type=float, default=200.0,
                   help="state written before the learner is added, MB (default 200)")
    p.add_argument("--value-kb", type=int, default=256,
                   help="KiB per value (default 256; the node's limit is 1 MiB per value)")
    p.add_argument("--clients", type=int, default=4, help="concurrent writers (default 4)")
    p.add_argument("--tail-keys", type=int, default=5,
                   help="keys written after the snapshot (default 5)")
    p.add_argument("--check-keys", type=int, default=5,
                   help="random keys read back from the learner, besides the first, the last "
                        "and the last tail key (default 5)")
    p.add_argument("--repeat", type=int, default=3,
                   help="learners added one after the other per mode, each removed and "
                        "stopped before the next; the table shows the median time (default 3)")
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated, of archive,leader (default both)")
    p.add_argument("--s3", action="store_true",
                   help="mode archive uses an S3 bucket on a local moto_server instead of a "
                        "file:// directory")
    p.add_argument("--archive-interval-ms", type=int, default=500,
                   help="the members' --archive-interval-ms (default 500)")
    p.add_argument("--archive-wait", type=float, default=120.0,
                   help="longest wait for the archive to hold every entry (default 120 s)")
    p.add_argument("--election-timeout-ms", type=int, default=ELECTION_TIMEOUT_MS)
    p.add_argument("--heartbeat-ms", type=int, default=HEARTBEAT_MS)
    p.add_argument("--timeout", type=float, default=900.0,
                   help="longest wait for the snapshot and the catch-up, s (default 900)")
    p.add_argument("--keep", action="store_true", help="keep data dirs, archive and logs")
    p.add_argument("--json", type=Path, help="also write the results to this file")
    args = p.parse_args(argv)
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in args.mode_list if m not in MODES]
    if bad or not args.mode_list:
        p.error(f"--modes takes archive and/or leader, not {args.modes!r}")
    if not 0 < args.value_kb * 1024 <= VALUE_LIMIT - 4096:
        p.error(f"--value-kb must be between 1 and {(VALUE_LIMIT - 4096) // 1024} (the node "
                "refuses values over 1 MiB)")
    if (args.state_mb <= 0 or args.clients < 1 or args.repeat < 1 or args.tail_keys < 0
            or args.check_keys < 0):
        p.error("--state-mb, --clients and --repeat must be positive, --tail-keys and "
                "--check-keys not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    atexit.register(_cleanup)
    signal.signal(signal.SIGTERM, _on_sigterm)
    reason = _harness("processes").node_unavailable_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 1
    root = Path(tempfile.mkdtemp(prefix="flotilla-learner-catchup-"))
    results: list[Result] = []
    try:
        s3 = start_moto(root) if args.s3 and "archive" in args.mode_list else None
        for mode in args.mode_list:
            workdir = root / mode
            workdir.mkdir()
            results.append(run_mode(mode, args, workdir, s3))
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, SystemExit):
        print("\ninterrupted: stopping every process this bench started", file=sys.stderr,
              flush=True)
        raise
    finally:
        _cleanup()
        if args.keep:
            print(f"\ndata, archive and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    wall = time.monotonic() - started
    archive_kind = "s3 (moto_server)" if args.s3 else "file://"
    print(f"\nA learner added behind a compacted log: 3 voters, {args.value_kb} KiB values, "
          f"archive {archive_kind}, heartbeat {args.heartbeat_ms} ms, election timeout "
          f"{args.election_timeout_ms} ms, fsync on\n")
    print(render(results))
    print()
    print(reproduce(args, results))
    print(f"\nwall time of the whole run: {wall:.1f}s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            [dataclasses.asdict(r) for r in results], indent=2, default=str))
    return 0 if results and not any(r.error for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
