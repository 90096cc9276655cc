"""Flotilla against etcd 3.4 and PySyncObj on this machine, driven by the same HTTP load generator.

All systems run three members on loopback with the same timing (heartbeat 100 ms, election
timeout 1000 ms). etcd and Flotilla keep their default durability (fsync before acknowledging);
PySyncObj (``bench/pysyncobj_server.py``, PyPI ``pysyncobj``) runs **in memory, with no
durability at all**, behind a small aiohttp wrapper serving Flotilla's ``PUT /v1/kv/{key}``: it
is the bar for a pure-Python Raft that never touches the disk. One system at a time is started,
measured and stopped, so that none competes with another's idle work.

Measured, for each system:

* write throughput and latency: K concurrent clients (``--clients 1,16,64``), each sending one
  write at a time to the leader over a persistent connection for ``--duration`` seconds after
  ``--warmup``. etcd is written through its v3 JSON gateway (``POST /v3/kv/put``, base64 key
  and value), Flotilla and PySyncObj through ``PUT /v1/kv/{key}``; the values are the same
  bytes. CPU time (user + system, from /proc) per write committed in the measured window is
  reported for the leader and for all three members together ("servers CPU"): unlike writes/s
  it hardly depends on what else the host is running.
* the leader-failover window: under a steady 16-client write load the leader is SIGKILLed, and
  the longest gap between two successful writes (any client) is measured; clients that fail or
  time out (``--failover-timeout``) move on to the next member. Repeated ``--failover-rounds``
  times, restarting the killed member in between; the median is reported.

``--passes N`` (default 3) repeats everything N times. Within a pass, each concurrency level is
measured on every system in turn (a fresh cluster each time), the order reversed every other
pass so that a host whose speed drifts favours no column; the table gives the medians, and every
ratio is taken within a pass first (the median of the per-pass ratios, which are printed too).

With ``--tls`` etcd and Flotilla run with mutual TLS between peers (each member's certificate
names it, signed by one CA made for the run) and TLS on the client port (a server certificate,
no client certificates), with the same certificates; the load generator then dials https,
verifying the members against that CA, over the same keep-alive connections. ``--tls both``
measures each system plain and with TLS in one invocation. PySyncObj has no TLS: it is measured
in plain mode only (with ``--tls on`` it is left out).

``--flotilla-loop asyncio,uvloop`` runs Flotilla once per event loop in every pass
(``FLOTILLA_EVENT_LOOP``), with a uvloop/asyncio ratio; without it the node picks its default
(uvloop when installed).

Usage::

    .venv/bin/python bench/compare_etcd.py                       # all three, 3 passes
    .venv/bin/python bench/compare_etcd.py --only etcd --duration 5 --passes 1
    .venv/bin/python bench/compare_etcd.py --systems etcd,flotilla --tls both --failover-rounds 0
    .venv/bin/python bench/compare_etcd.py --flotilla-loop asyncio,uvloop --systems flotilla
    .venv/bin/python bench/compare_etcd.py --clients 1,16 --json bench/results/cmp.json

etcd comes from ``apt-get install -y etcd-server`` (``--etcd PATH`` for another binary);
PySyncObj from ``.venv/bin/pip install -e '.[bench]'`` (or ``pip install pysyncobj``).
The load generator runs in this process (aiohttp on uvloop; ``--generator-loop asyncio`` for
the standard loop, which earlier runs used); its CPU use is printed with the numbers, because
on a small machine it shares the cores with the members and can be what limits the higher
concurrency rows. Every system is driven by the same generator on the same loop.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib
import itertools
import json
import math
import os
import random
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

REPO = Path(__file__).resolve().parents[1]
HEARTBEAT_MS = 100
ELECTION_TIMEOUT_MS = 1000


def _harness(module: str) -> Any:
    """A module of the process-test harness (tests/harness), importable from this script."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"tests.harness.{module}")


def _node_module(module: str) -> Any:
    """A module of the node package (node/), importable from this script."""
    _harness("ports")  # puts the repository on sys.path
    return importlib.import_module(f"node.{module}")


class Certs:
    """A CA made for this run, and certificates it signs for members: CN (and a DNS SAN) the
    member's name, IP SANs the loopback addresses others dial it at. One certificate serves
    a member's client port, its peer port and its peer dials, in both systems."""

    def __init__(self, directory: Path) -> None:
        self.tls = _node_module("tls")
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.ca = self.tls.make_ca("compare_etcd bench CA")
        self.ca_file = directory / "ca.crt"
        self.ca.write(self.ca_file, directory / "ca.key")

    def member(self, name: str, hosts: list[str]) -> tuple[str, str]:
        """(certificate file, key file) for the member ``name`` reachable at ``hosts``."""
        cert, key = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        self.tls.issue(self.ca, name, hosts).write(cert, key)
        return str(cert), str(key)

    def client_context(self) -> ssl.SSLContext:
        """What the load generator dials with: members verified against the CA."""
        return self.tls.client_context(str(self.ca_file))


# ---------------------------------------------------------------------------------------------
# The systems under test: what the load generator needs to know about each


class System(Protocol):
    label: str

    fsync_metric: str  # the Prometheus histogram counting the leader's log fsyncs

    ssl_context: ssl.SSLContext | None  # what clients dial with; None: plain HTTP

    def names(self) -> list[str]: ...

    def running(self, name: str) -> bool: ...

    def pid(self, name: str) -> int | None: ...

    def client_url(self, name: str) -> str: ...

    def write_request(self, key: str, value: bytes) -> tuple[str, str, bytes, dict[str, str]]:
        """(method, path, body, headers) of one write; success is a 200 answer."""
        ...

    async def status(self, session: aiohttp.ClientSession, name: str) -> tuple[str, str]:
        """(the member's own id, the id of the leader it names) from its status endpoint."""
        ...

    def kill(self, name: str) -> None: ...

    def restart(self, name: str) -> None: ...

    def close(self) -> None: ...


class _Members:
    """Members run as plain processes of this bench (etcd's, PySyncObj's): each started from
    `_argv(name)`, its output appended to WORKDIR/NAME.log, in a session of its own."""

    _env: dict[str, str] | None = None  # None: the bench's own environment

    def __init__(self, workdir: Path, names: list[str], ports: list[int]) -> None:
        self.workdir = workdir
        self._names = names
        self._ports = ports  # released on close
        self._procs: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, Any] = {}

    def _argv(self, name: str) -> list[str]:
        raise NotImplementedError

    def _start(self, name: str) -> None:
        log = self._logs.get(name)
        if log is None:
            log = self._logs[name] = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115
        self._procs[name] = subprocess.Popen(self._argv(name), stdout=log, stderr=log,
                                             stdin=subprocess.DEVNULL, env=self._env,
                                             start_new_session=True)

    def names(self) -> list[str]:
        return list(self._names)

    def running(self, name: str) -> bool:
        return self._procs[name].poll() is None

    def pid(self, name: str) -> int | None:
        return self._procs[name].pid

    def kill(self, name: str) -> None:
        proc = self._procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def restart(self, name: str) -> None:
        if self.running(name):
            raise RuntimeError(f"{name} is still running")
        self._start(name)

    def close(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL after 10 s), close its log, free its
        ports."""
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs.values():
            log.close()
        ports = _harness("ports")
        for port in self._ports:
            ports.release_port(port)
        self._ports = []


class EtcdCluster(_Members):
    """Three etcd members on loopback, started as plain processes."""

    fsync_metric = "etcd_disk_wal_fsync_duration_seconds_count"

    def __init__(self, binary: str, workdir: Path, size: int = 3,
                 certs: Certs | None = None) -> None:
        self.label = "etcd " + _etcd_version(binary)
        self.binary = binary
        numbers = _harness("ports").allocate_ports(2 * size)
        super().__init__(workdir, [f"etcd{i}" for i in range(size)], list(numbers))
        scheme = "https" if certs else "http"
        self._client = {n: f"{scheme}://127.0.0.1:{numbers[2 * i]}" for i, n in
                        enumerate(self._names)}
        self._peer = {n: f"{scheme}://127.0.0.1:{numbers[2 * i + 1]}" for i, n in
                      enumerate(self._names)}
        self._tls: dict[str, list[str]] = {}
        self.ssl_context = certs.client_context() if certs else None
        for name in self._names if certs else ():
            cert, key = certs.member(name, ["127.0.0.1"])
            self._tls[name] = [
                "--cert-file", cert, "--key-file", key,
                "--peer-cert-file", cert, "--peer-key-file", key,
                "--peer-trusted-ca-file", str(certs.ca_file), "--peer-client-cert-auth",
            ]
        self._token = "bench-" + uuid.uuid4().hex[:8]
        self._put_path = "/v3/kv/put"
        for name in self._names:
            self._start(name)

    def _argv(self, name: str) -> list[str]:
        cluster = ",".join(f"{n}={u}" for n, u in self._peer.items())
        return [
            self.binary, "--name", name, "--data-dir", str(self.workdir / name),
            "--listen-client-urls", self._client[name],
            "--advertise-client-urls", self._client[name],
            "--listen-peer-urls", self._peer[name],
            "--initial-advertise-peer-urls", self._peer[name],
            "--initial-cluster", cluster, "--initial-cluster-state", "new",
            "--initial-cluster-token", self._token,
            "--heartbeat-interval", str(HEARTBEAT_MS),
            "--election-timeout", str(ELECTION_TIMEOUT_MS),
            *self._tls.get(name, ()),
        ]

    def client_url(self, name: str) -> str:
        return self._client[name]

    def write_request(self, key: str, value: bytes) -> tuple[str, str, bytes, dict[str, str]]:
        body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                           "value": base64.b64encode(value).decode()}).encode()
        return "POST", self._put_path, body, {"Content-Type": "application/json"}

    async def probe_put_path(self, session: aiohttp.ClientSession, url: str) -> str:
        """etcd 3.4 serves the gateway at /v3 (and /v3beta); 3.3 only at /v3beta."""
        for path in ("/v3/kv/put", "/v3beta/kv/put"):
            self._put_path = path
            method, _, body, headers = self.write_request("bench/probe", b"x")
            async with session.request(method, url + path, data=body, headers=headers) as r:
                await r.read()
                if r.status == 200:
                    return path
        raise RuntimeError(f"{url}: neither /v3/kv/put nor /v3beta/kv/put accepts a put")

    async def status(self, session: aiohttp.ClientSession, name: str) -> tuple[str, str]:
        async with session.post(self._client[name] + "/v3/maintenance/status",
                                data=b"{}", timeout=aiohttp.ClientTimeout(1)) as r:
            doc = await r.json(content_type=None)
        return doc["header"]["member_id"], doc.get("leader", "0")


class FlotillaCluster:
    """Three ``flotilla node`` processes (the test harness's NodeProcess), each on its own
    loopback address where the host allows it, as the harness's LocalCluster places them."""

    fsync_metric = "flotilla_fsync_seconds_count"

    def __init__(self, workdir: Path, size: int = 3, certs: Certs | None = None,
                 event_loop: str | None = None) -> None:
        self.label = "flotilla" + (f" {event_loop}" if event_loop else "")
        self.workdir = workdir
        env = {"FLOTILLA_EVENT_LOOP": event_loop} if event_loop else {}
        processes, ports = _harness("processes"), _harness("ports")
        scheme = "https" if certs else "http"
        self.ssl_context = certs.client_context() if certs else None
        names = [f"n{i}" for i in range(size)]
        hosts = dict(zip(names, ports.loopback_hosts(size), strict=True))
        peer, client = {}, {}
        self._ports: list[int] = []
        for name, host in hosts.items():
            peer_port, client_port = ports.allocate_ports(2, host)
            self._ports += [peer_port, client_port]
            peer[name], client[name] = f"{host}:{peer_port}", f"{host}:{client_port}"
        self._client = {name: f"{scheme}://{addr}" for name, addr in client.items()}
        view = {name: f"{scheme}://{addr}" for name, addr in peer.items()}
        cluster_id = "bench-" + uuid.uuid4().hex[:8]
        self.nodes: dict[str, Any] = {}
        for name in names:
            tls: list[str] = []
            if certs:
                cert, key = certs.member(name, [hosts[name]])
                tls = ["--cert-file", cert, "--key-file", key,
                       "--peer-cert-file", cert, "--peer-key-file", key,
                       "--peer-trusted-ca-file", str(certs.ca_file)]
            self.nodes[name] = processes.NodeProcess(
                name, workdir / name / "data", peer[name], client[name],
                initial_cluster=view, cluster_id=cluster_id,
                election_timeout_ms=ELECTION_TIMEOUT_MS, heartbeat_ms=HEARTBEAT_MS,
                extra_args=tls, env=env, log_path=workdir / f"{name}.log", start=False)
        try:
            for node in self.nodes.values():
                node.start()
        except BaseException:
            self.close()
            raise

    def names(self) -> list[str]:
        return list(self.nodes)

    def running(self, name: str) -> bool:
        return self.nodes[name].running

    def pid(self, name: str) -> int | None:
        return self.nodes[name].pid

    def client_url(self, name: str) -> str:
        return self._client[name]

    def write_request(self, key: str, value: bytes) -> tuple[str, str, bytes, dict[str, str]]:
        return "PUT", "/v1/kv/" + key, value, {}

    async def status(self, session: aiohttp.ClientSession, name: str) -> tuple[str, str]:
        async with session.get(self._client[name] + "/v1/status",
                               timeout=aiohttp.ClientTimeout(1)) as r:
            doc = await r.json(content_type=None)
        return doc["name"], doc.get("leader") or ""

    def kill(self, name: str) -> None:
        self.nodes[name].kill()

    def restart(self, name: str) -> None:
        self.nodes[name].restart()

    def close(self) -> None:
        """Kill every member (as the harness's LocalCluster.stop_all does)."""
        for node in self.nodes.values():
            node.close()
        ports = _harness("ports")
        for port in self._ports:
            ports.release_port(port)
        self._ports = []


class PySyncObjCluster(_Members):
    """Three ``bench/pysyncobj_server.py`` processes, in memory, each on its own loopback
    address where the host allows it (as Flotilla's members are placed). Plain HTTP only."""

    fsync_metric = ""  # in memory: it never fsyncs
    ssl_context = None
    server = REPO / "bench" / "pysyncobj_server.py"

    def __init__(self, workdir: Path, size: int = 3, batch: bool = False) -> None:
        self.label = f"pysyncobj {pysyncobj_version()} (memory)"
        ports = _harness("ports")
        super().__init__(workdir, [f"p{i}" for i in range(size)], [])
        hosts = dict(zip(self._names, ports.loopback_hosts(size), strict=True))
        raft, self._client = {}, {}
        for name, host in hosts.items():
            raft_port, client_port = ports.allocate_ports(2, host)
            self._ports += [raft_port, client_port]
            raft[name], self._client[name] = f"{host}:{raft_port}", f"{host}:{client_port}"
        self._members = ",".join(f"{n}={a}" for n, a in raft.items())
        self._batch = batch
        # the node's own settings must not leak into a PySyncObj member's environment
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_")}
        for name in self._names:
            self._start(name)

    def _argv(self, name: str) -> list[str]:
        return [sys.executable, str(self.server), "--name", name, "--members", self._members,
                "--listen-client", self._client[name], *(["--batch"] if self._batch else [])]

    def client_url(self, name: str) -> str:
        return "http://" + self._client[name]

    def write_request(self, key: str, value: bytes) -> tuple[str, str, bytes, dict[str, str]]:
        return "PUT", "/v1/kv/" + key, value, {}

    async def status(self, session: aiohttp.ClientSession, name: str) -> tuple[str, str]:
        async with session.get(self.client_url(name) + "/v1/status",
                               timeout=aiohttp.ClientTimeout(1)) as r:
            doc = await r.json(content_type=None)
        return doc["name"], doc.get("leader") or ""


async def agreed_leader(system: System, session: aiohttp.ClientSession, timeout: float) -> str:
    """The member every running member names as leader, from their status endpoints."""
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    while time.monotonic() < deadline:
        ids: dict[str, str] = {}
        leaders = set()
        for name in system.names():
            if not system.running(name):
                continue
            try:
                own, lead = await system.status(session, name)
            except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
                last = f"{name}: {type(exc).__name__}: {exc}"
                break
            ids[own] = name
            leaders.add(lead)
        else:
            if len(leaders) == 1 and (lead := leaders.pop()) in ids:
                return ids[lead]
            last = f"leaders reported: {sorted(leaders)}"
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{system.label} has no agreed leader after {timeout}s ({last}); logs "
                       f"in {getattr(system, 'workdir', '?')}")


def _etcd_version(binary: str) -> str:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    for line in out.splitlines():
        if line.startswith("etcd Version:"):
            return line.split(":", 1)[1].strip()
    return "(unknown version)"


def pysyncobj_version() -> str:
    from pysyncobj.version import VERSION
    return VERSION


def pysyncobj_unavailable() -> str | None:
    """Why PySyncObj cannot run here (it is not installed), or None when it can."""
    try:
        pysyncobj_version()
    except ImportError:
        return ("PySyncObj is not installed: `.venv/bin/pip install -e '.[bench]'` (or "
                "`.venv/bin/pip install pysyncobj`), or leave it out with --systems etcd,flotilla")
    return None


def flotilla_unavailable() -> str | None:
    """Why ``python -m flotilla.node`` cannot run here, or None when it can."""
    return _harness("processes").node_unavailable_reason()


# ---------------------------------------------------------------------------------------------
# The load generator (the same code for both systems)

# Every timestamp the generator takes. Not loop.time(): uvloop's counts whole milliseconds,
# which would round a 1.4 ms write to 1 or 2.
clock = time.perf_counter


@dataclass
class LoadResult:
    clients: int
    seconds: float  # the measured window, warm-up excluded
    ok: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, writes started in window
    successes: list[float] = field(default_factory=list)  # completion times of every success
    fsyncs: float | None = None  # the leader's log fsyncs during the whole run, if known
    committed: int = 0  # writes acknowledged within the measured window
    leader_cpu: float | None = None  # the leader's CPU seconds in the measured window
    servers_cpu: float | None = None  # all members' CPU seconds in the measured window
    cpu_seconds: float = 0.0  # this process's CPU time during the run
    wall_seconds: float = 0.0  # the whole run, warm-up included
    samples: list[Any] = field(default_factory=list)  # drive's `sample` at the window's ends

    @property
    def cpu_share(self) -> float:
        """The load generator's CPU use, as a fraction of one core."""
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def leader_cpu_per_write(self) -> float | None:
        """The leader's CPU seconds per write committed in the measured window."""
        return self.leader_cpu / self.committed if self.leader_cpu and self.committed else None

    @property
    def servers_cpu_per_write(self) -> float | None:
        """All members' CPU seconds per write committed in the measured window."""
        return self.servers_cpu / self.committed if self.servers_cpu and self.committed \
            else None

    @property
    def rate(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    def percentile(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        data = sorted(self.latencies)
        return data[min(len(data) - 1, max(0, round(q / 100 * len(data) + 0.5) - 1))]


async def drive(
    system: System,
    session: aiohttp.ClientSession,
    targets: list[str],
    clients: int,
    *,
    duration: float,
    warmup: float,
    value: bytes,
    timeout: float,
    stop: asyncio.Event | None = None,
    result: LoadResult | None = None,
    sample: Callable[[], Any] | None = None,
) -> LoadResult:
    """``clients`` closed-loop writers: one write at a time each, for warmup + duration.

    Every client starts on ``targets[0]`` and, after a failure (error answer, connection error,
    timeout), pauses 20 ms, so that a dead member is not hammered, and moves to another target
    picked at random, so that clients do not all queue up behind the same member. ``result``,
    when given, is filled in as the run goes, so that a caller can watch it. ``sample``, when
    given, is called as the measured window opens and as it closes; its two results are
    returned in ``samples`` (the servers' CPU counters, read at exactly those instants).
    """
    result = result if result is not None else LoadResult(clients, duration)
    loop = asyncio.get_running_loop()
    start = clock()
    measure_from = start + warmup
    end = measure_from + duration
    per_request = aiohttp.ClientTimeout(total=timeout)
    cpu0 = time.process_time()
    if sample is not None:
        samples = result.samples = []
        loop.call_later(warmup, lambda: samples.append(sample()))
        loop.call_later(warmup + duration, lambda: samples.append(sample()))

    async def client(i: int) -> None:
        target = 0
        rng = random.Random(i)
        n = 0
        while clock() < end and not (stop and stop.is_set()):
            key = f"bench/{i}/{n % 1000}"
            n += 1
            method, path, body, headers = system.write_request(key, value)
            t0 = clock()
            ok = False
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.request(method, targets[target] + path, data=body,
                                           headers=headers, timeout=per_request) as r:
                    await r.read()
                    ok = r.status == 200
            t1 = clock()
            if ok:
                result.successes.append(t1)
                if t0 >= measure_from and t1 <= end:
                    result.ok += 1
                    result.latencies.append(t1 - t0)
            else:
                result.errors += 1
                if len(targets) > 1:
                    target = rng.choice([t for t in range(len(targets)) if t != target])
                await asyncio.sleep(0.02)

    await asyncio.gather(*(client(i) for i in range(clients)))
    result.committed = sum(measure_from <= t <= end for t in result.successes)
    result.cpu_seconds = time.process_time() - cpu0
    result.wall_seconds = clock() - start
    return result


def new_session(system: System) -> aiohttp.ClientSession:
    # limit=0: every concurrent client keeps its own keep-alive connection (over TLS: one
    # handshake per client, during the warm-up).
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(
        limit=0, ssl=system.ssl_context if system.ssl_context is not None else True))


async def fsync_count(session: aiohttp.ClientSession, url: str, metric: str) -> float | None:
    """The value of ``metric`` (a histogram's _count) on the member at ``url``, or None."""
    if not metric:
        return None
    try:
        async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as r:
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    for line in text.splitlines():
        if line.startswith(metric + " "):
            return float(line.split()[1])
    return None


def process_cpu(pid: int | None) -> float | None:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def servers_cpu(system: System) -> dict[str, float | None]:
    """Every member's CPU seconds so far, by name (None: not running, or unreadable)."""
    return {name: process_cpu(system.pid(name)) if system.running(name) else None
            for name in system.names()}


async def measure_level(system: System, k: int, args: argparse.Namespace,
                        value: bytes) -> LoadResult:
    """``k`` clients writing to the leader for warm-up + duration; one line about it."""
    async with new_session(system) as session:
        leader = await agreed_leader(system, session, 30)
        url = system.client_url(leader)
        if isinstance(system, EtcdCluster):
            await system.probe_put_path(session, url)
        before = await fsync_count(session, url, system.fsync_metric)
        r = await drive(system, session, [url], k, duration=args.duration,
                        warmup=args.warmup, value=value, timeout=10.0,
                        sample=lambda: servers_cpu(system))
        after = await fsync_count(session, url, system.fsync_metric)
    per_fsync = ""
    if before is not None and after is not None and after > before:
        r.fsyncs = after - before
        per_fsync = f", {len(r.successes) / r.fsyncs:.1f} writes per leader fsync"
    if len(r.samples) == 2:
        start, end = r.samples
        if start[leader] is not None and end[leader] is not None:
            r.leader_cpu = end[leader] - start[leader]
        if all(v is not None for v in (*start.values(), *end.values())):
            r.servers_cpu = sum(end[n] - start[n] for n in start)
    cpu = ""
    if r.leader_cpu_per_write and r.servers_cpu_per_write:
        cpu = (f", CPU us/write leader {r.leader_cpu_per_write * 1e6:.0f} servers "
               f"{r.servers_cpu_per_write * 1e6:.0f}")
    print(f"  {k:>3} client{'s' if k > 1 else ' '} -> {leader}: {r.rate:8.0f} writes/s, "
          f"p50 {r.percentile(50) * 1e3:7.2f} ms, p99 {r.percentile(99) * 1e3:7.2f} ms, "
          f"{r.errors} errors{per_fsync}{cpu}, load generator CPU {r.cpu_share:.0%} of a core",
          flush=True)
    return r


async def measure_failover(system: System, args: argparse.Namespace,
                           value: bytes) -> list[float]:
    """Longest gap between successful writes around a leader SIGKILL, once per round."""
    gaps = []
    async with new_session(system) as session:
        for round_no in range(args.failover_rounds):
            leader = await agreed_leader(system, session, 60)
            order = [leader] + [n for n in system.names() if n != leader]
            targets = [system.client_url(n) for n in order]
            stop = asyncio.Event()
            live = LoadResult(args.failover_clients, args.failover_window)
            load = asyncio.create_task(drive(
                system, session, targets, args.failover_clients, duration=args.failover_window,
                warmup=args.warmup, value=value, timeout=args.failover_timeout, stop=stop,
                result=live))
            await asyncio.sleep(args.warmup + 1.0)
            killed_at = clock()
            await asyncio.to_thread(system.kill, leader)
            while not load.done():  # stop one second after writes resume, or at the window's end
                await asyncio.sleep(0.05)
                if live.successes and live.successes[-1] > killed_at + 1.0:
                    stop.set()
            result = await load
            successes = sorted(result.successes)
            before = [t for t in successes if t < killed_at]
            after = [t for t in successes if t >= killed_at]
            if before and after:
                gap = max(b - a for a, b in itertools.pairwise([before[-1], *after]))
                note = ""
            else:
                gap = clock() - (before[-1] if before else killed_at)
                note = " (writes never resumed within the window: a lower bound)"
            gaps.append(gap)
            print(f"  round {round_no + 1}: SIGKILL leader {leader}: longest gap between "
                  f"successful writes {gap * 1e3:.0f} ms{note}", flush=True)
            await asyncio.to_thread(system.restart, leader)
            await agreed_leader(system, session, 60)
            await asyncio.sleep(2.0)  # let the restarted member catch up before the next round
    return gaps


# ---------------------------------------------------------------------------------------------
# Running the systems, and the tables


@dataclass(frozen=True)
class Config:
    """One system as measured: which, plain or TLS, and (Flotilla) which event loop."""

    system: str  # etcd | flotilla | pysyncobj
    mode: str  # plain | tls
    loop: str | None = None  # Flotilla's FLOTILLA_EVENT_LOOP; None: the node's default

    @property
    def name(self) -> str:
        return self.system + (f" {self.loop}" if self.loop else "")

    @property
    def label(self) -> str:
        return self.name + (" TLS" if self.mode == "tls" else "")


@dataclass
class Report:
    label: str
    throughput: dict[int, LoadResult] = field(default_factory=dict)
    gaps: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # parts that failed; the rest stands
    skipped: str | None = None  # why the system was not measured at all

    def cells(self, levels: list[int]) -> dict[str, float | None]:
        out: dict[str, float | None] = {}
        for k in levels:
            r = self.throughput.get(k)
            clients = f"{k} client{'s' if k > 1 else ''}"
            out[f"writes/s, {clients}"] = r.rate if r else None
            out[f"p50 ms, {clients}"] = r.percentile(50) * 1e3 if r else None
            out[f"p99 ms, {clients}"] = r.percentile(99) * 1e3 if r else None
            per_write = r.leader_cpu_per_write if r else None
            out[f"leader CPU us/write, {clients}"] = per_write * 1e6 if per_write else None
            per_write = r.servers_cpu_per_write if r else None
            out[f"servers CPU us/write, {clients}"] = per_write * 1e6 if per_write else None
        out["failover gap ms (median)"] = (statistics.median(self.gaps) * 1e3
                                           if self.gaps else None)
        return out


def make_system(config: Config, args: argparse.Namespace, certs: Certs | None,
                workdir: Path) -> System:
    tls = certs if config.mode == "tls" else None
    if config.system == "etcd":
        return EtcdCluster(args.etcd, workdir, certs=tls)
    if config.system == "pysyncobj":
        return PySyncObjCluster(workdir, batch=args.pysyncobj_batch)
    return FlotillaCluster(workdir, certs=tls, event_loop=config.loop)


async def on_fresh_cluster(config: Config, report: Report, what: str, args: argparse.Namespace,
                           certs: Certs | None, workdir: Path,
                           measure: Callable[[System], Any]) -> None:
    """Start ``config``'s three members, ``await measure(system)``, stop them. A failure is
    noted in the report (and the table) instead of ending the run, so that the other systems'
    numbers are still printed."""
    print(f"\n== {config.label}, {what}: 3 members on loopback, data under {workdir}",
          flush=True)
    workdir.mkdir(parents=True)
    system = None
    try:
        system = await asyncio.to_thread(make_system, config, args, certs, workdir)
        report.label = system.label + (" TLS" if system.ssl_context else "")
        await measure(system)
    except Exception as exc:
        failure = f"{what}: {type(exc).__name__}: {exc}"
        report.failures.append(failure)
        traceback.print_exc()
        print(f"  {config.label}: {failure} (logs: {workdir}, kept with --keep)", flush=True)
    finally:
        if system is not None:
            await asyncio.to_thread(system.close)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)  # etcd preallocates 64 MB of WAL


async def run_pass(n: int, configs: list[Config], runs: Runs, args: argparse.Namespace,
                   certs: Certs | None, value: bytes, root: Path) -> None:
    """Pass ``n``: each level on every system in turn, then the failover rounds."""
    order = configs if n % 2 == 0 else configs[::-1]
    for k in args.levels:
        for config in order:
            report = runs[config][n]
            if report.skipped:
                continue

            async def level(system: System, report: Report = report, k: int = k) -> None:
                report.throughput[k] = await measure_level(system, k, args, value)

            slug = config.label.replace(" ", "-")
            await on_fresh_cluster(config, report, f"{k} clients", args, certs,
                                   root / f"{slug}-pass{n + 1}-{k}", level)
    if args.failover_rounds > 0:
        for config in order:
            report = runs[config][n]
            if report.skipped:
                continue

            async def failover(system: System, report: Report = report) -> None:
                print(f"  failover: {args.failover_clients} clients, leader SIGKILLed, "
                      f"{args.failover_rounds} rounds", flush=True)
                report.gaps = await measure_failover(system, args, value)

            slug = config.label.replace(" ", "-")
            await on_fresh_cluster(config, report, "failover", args, certs,
                                   root / f"{slug}-pass{n + 1}-failover", failover)


Runs = dict[Config, list[Report]]  # one report per pass


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(known) if known else None


def _ratios(num: list[Report], den: list[Report], row: str, levels: list[int]) -> list[float]:
    """num/den in ``row``, pass by pass (the host's speed drifts: only a pass's own runs are
    compared with each other)."""
    out = []
    for a, b in zip(num, den, strict=True):
        x, y = a.cells(levels)[row], b.cells(levels)[row]
        if x is not None and y and not (math.isnan(x) or math.isnan(y)):
            out.append(x / y)
    return out


def _label(reports: list[Report]) -> str:
    return next((r.label for r in reports if not r.skipped), reports[0].label)


@dataclass
class Column:
    header: str
    values: dict[str, float | None]  # row -> median
    per_pass: dict[str, list[float]] | None = None  # a ratio's values, pass by pass


def tables(runs: Runs, levels: list[int]) -> list[tuple[str, list[Column]]]:
    """(title, columns) per table: for each mode, each system's medians, Flotilla over etcd and
    over PySyncObj, and uvloop over asyncio when both loops ran; with both modes, each system's
    TLS over plain."""
    rows = [row for row in Report("").cells(levels)  # no failover row when none was measured
            if not row.startswith("failover") or any(r.gaps for rs in runs.values() for r in rs)]
    modes = list(dict.fromkeys(c.mode for c in runs))

    def ratio(header: str, num: Config, den: Config) -> Column:
        per_pass = {row: _ratios(runs[num], runs[den], row, levels) for row in rows}
        return Column(header, {row: _median(list(v)) for row, v in per_pass.items()}, per_pass)

    out = []
    for mode in modes:
        configs = [c for c in runs if c.mode == mode]
        cols = [Column(_label(runs[c]), {row: _median([r.cells(levels)[row] for r in runs[c]])
                                         for row in rows}) for c in configs]
        suffix = " TLS" if mode == "tls" else ""
        by_system = {c.system: c for c in configs}
        flotillas = [c for c in configs if c.system == "flotilla"]
        for f in flotillas:
            for other in ("etcd", "pysyncobj"):
                if other in by_system:
                    cols.append(ratio(f"{f.name}/{other}{suffix}", f, by_system[other]))
        loops = {c.loop: c for c in flotillas}
        if "asyncio" in loops and "uvloop" in loops:
            cols.append(ratio("uvloop/asyncio" + suffix, loops["uvloop"], loops["asyncio"]))
        title = {"plain": "plain HTTP", "tls": "TLS (mutual between peers, on the client port)"}
        out.append((title[mode], cols))
    if modes == ["plain", "tls"]:
        cols = []
        for config in runs:
            plain = Config(config.system, "plain", config.loop)
            if config.mode == "tls" and plain in runs:
                cols.append(ratio(f"{config.name} TLS/plain", config, plain))
        out.append(("TLS over plain, same system", cols))
    return out


def _grid(headers: list[str], body: list[list[str]]) -> list[str]:
    table = [headers, *body]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    out = []
    for n, line in enumerate(table):
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(line, widths, strict=True))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return out


def render(runs: Runs, levels: list[int]) -> str:
    out: list[str] = []
    for title, cols in tables(runs, levels):
        rows = list(cols[0].values) if cols else []
        out += ["", f"-- {title}: medians; a ratio is the median of the per-pass ratios", ""]
        out += _grid(["", *(c.header for c in cols)],
                     [[row, *(("n/a" if c.values[row] is None else f"{c.values[row]:.2f}")
                              if c.per_pass is not None else _fmt(c.values[row])
                              for c in cols)] for row in rows])
        ratios = [c for c in cols if c.per_pass is not None]
        if ratios and max(len(v) for c in ratios for v in c.per_pass.values()) > 1:
            out += ["", f"-- {title}: the ratios pass by pass", ""]
            out += _grid(["", *(c.header for c in ratios)],
                         [[row, *(" ".join(f"{v:.2f}" for v in c.per_pass[row]) or "n/a"
                                  for c in ratios)] for row in rows])
    out.append("")
    for reports in runs.values():
        label = _label(reports)
        for n, r in enumerate(reports):
            where = f" (pass {n + 1})" if len(reports) > 1 else ""
            if r.skipped:
                out.append(f"{label}{where}: not measured: {r.skipped}")
            for failure in r.failures:
                out.append(f"{label}{where}: failed: {failure}")
        gaps = [g for r in reports for g in r.gaps]
        if gaps:
            out.append(f"{label} failover gaps, ms: " + ", ".join(f"{g * 1e3:.0f}" for g in gaps))
    out += speed_goals(runs, levels)
    out += tls_goals(runs, levels)
    return "\n".join(out)


def _row(what: str, k: int) -> str:
    return f"{what}, {k} client{'s' if k > 1 else ''}"


def _verdict(what: str, values: list[float], goal: float, at_least: bool) -> str:
    median = _median(list(values))
    shown = ", ".join(f"{v:.2f}" for v in values) or "n/a"
    met = None if median is None else median >= goal if at_least else median <= goal
    verdict = "" if met is None else " (met)" if met else " (missed)"
    return (f"{what}: {shown}; median {'n/a' if median is None else f'{median:.2f}'}, goal "
            f"{'at least' if at_least else 'at most'} {goal:.2f}{verdict}")


def speed_goals(runs: Runs, levels: list[int]) -> list[str]:
    """Issue #15's speed goals, pass by pass, for each Flotilla measured beside etcd or
    PySyncObj in the same mode."""
    out = []
    top, low = 64, 1  # the goals' levels: each is judged only when it was measured
    for f in (c for c in runs if c.system == "flotilla"):
        etcd = Config("etcd", f.mode)
        pso = Config("pysyncobj", f.mode)
        lines = []
        if etcd in runs and top in levels:
            lines.append(_verdict(f"  writes/s at {top} clients over etcd",
                                  _ratios(runs[f], runs[etcd], _row("writes/s", top), levels),
                                  1.3, True))
        if pso in runs and top in levels:
            lines.append(_verdict(f"  writes/s at {top} clients over PySyncObj (memory)",
                                  _ratios(runs[f], runs[pso], _row("writes/s", top), levels),
                                  1.0, True))
        if etcd in runs and low in levels:
            lines.append(_verdict(f"  p50 at {low} client over etcd",
                                  _ratios(runs[f], runs[etcd], _row("p50 ms", low), levels),
                                  1.3, False))
            for k in levels:
                lines.append(_verdict(
                    f"  servers CPU per write at {k} client{'s' if k > 1 else ''} over etcd",
                    _ratios(runs[f], runs[etcd], _row("servers CPU us/write", k), levels),
                    1.0, False))
        if lines:
            out += ["", f"Speed goals (issue #15), {f.label}, pass by pass:", *lines]
    return out


def tls_goals(runs: Runs, levels: list[int]) -> list[str]:
    """What TLS costs at the highest concurrency, pass by pass: each system's TLS/plain
    writes/s, and Flotilla's ratio to etcd with TLS over that ratio without."""
    k = max(levels)
    row = _row("writes/s", k)
    out = []
    etcd_tls, etcd_plain = Config("etcd", "tls"), Config("etcd", "plain")
    for f in (c for c in runs if c.system == "flotilla" and c.mode == "tls"):
        plain = Config(f.system, "plain", f.loop)
        if plain not in runs:
            continue
        flo = _ratios(runs[f], runs[plain], row, levels)
        out += ["", f"TLS at {k} clients, {f.name}, pass by pass:",
                _verdict(f"  {f.name} TLS/plain writes/s", flo, 0.85, True)]
        if etcd_tls in runs and etcd_plain in runs:
            etcd = _ratios(runs[etcd_tls], runs[etcd_plain], row, levels)
            out.append("  etcd TLS/plain writes/s: " + (", ".join(f"{v:.2f}" for v in etcd)
                                                        or "n/a"))
            if len(flo) == len(etcd):
                out.append(_verdict(f"  {f.name}/etcd with TLS over {f.name}/etcd without",
                                    [a / b for a, b in zip(flo, etcd, strict=True)], 1.0, True))
        for config, base in ((f, plain), (etcd_tls, etcd_plain)):
            if config in runs and base in runs:
                ratios = _ratios(runs[config], runs[base], _row("servers CPU us/write", k),
                                 levels)
                out.append(f"  {config.name} TLS/plain servers CPU per write: "
                           + (", ".join(f"{v:.2f}" for v in ratios) or "n/a"))
    return out


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.0f}" if v >= 100 else f"{v:.2f}"


SYSTEMS = ("etcd", "flotilla", "pysyncobj")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=10.0,
                   help="measured seconds per concurrency level (default 10)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring (2)")
    p.add_argument("--clients", default="1,16,64",
                   help="comma-separated concurrency levels (default 1,16,64)")
    p.add_argument("--systems", default=",".join(SYSTEMS),
                   help="comma-separated systems to measure (default etcd,flotilla,pysyncobj)")
    p.add_argument("--only", choices=SYSTEMS, help="measure one system (--systems NAME)")
    p.add_argument("--flotilla-loop", default="",
                   help="comma-separated event loops to run Flotilla on, each a column of its "
                        "own in every pass: asyncio, uvloop (default: the node's own choice)")
    p.add_argument("--generator-loop", choices=("uvloop", "asyncio"), default="uvloop",
                   help="the load generator's event loop (default uvloop: the lighter the "
                        "generator, the more of a small host's CPU the members get)")
    p.add_argument("--tls", nargs="?", const="on", default="off", choices=("off", "on", "both"),
                   help="mutual TLS between peers and TLS on the client port, for etcd and "
                        "Flotilla (--tls, or --tls on); --tls both: plain and TLS in one "
                        "invocation. PySyncObj has no TLS: plain mode only")
    p.add_argument("--passes", type=int, default=3,
                   help="measure everything this many times, interleaved; medians (3)")
    p.add_argument("--value-size", type=int, default=128, help="bytes per value (128)")
    p.add_argument("--failover-rounds", type=int, default=3, help="leader kills (3; 0: skip)")
    p.add_argument("--failover-clients", type=int, default=16, help="writers during kills (16)")
    p.add_argument("--failover-timeout", type=float, default=0.25,
                   help="seconds before a writer gives up on a request and moves on (0.25): "
                        "the gap is measured to about this resolution, since a member that "
                        "still believes in the dead leader holds requests until they time out")
    p.add_argument("--failover-window", type=float, default=15.0,
                   help="longest wait for writes to resume after a kill (15 s)")
    p.add_argument("--etcd", default=shutil.which("etcd") or "/usr/bin/etcd",
                   help="the etcd binary (default: etcd on PATH)")
    p.add_argument("--pysyncobj-batch", action="store_true",
                   help="PySyncObj with appendEntriesUseBatch (entries wait for the next "
                        "heartbeat; its library default, slow for closed-loop clients)")
    p.add_argument("--keep", action="store_true", help="keep data dirs and logs")
    p.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = p.parse_args(argv)
    try:
        args.levels = [int(x) for x in args.clients.split(",") if x.strip()]
    except ValueError:
        p.error(f"--clients wants comma-separated integers, got {args.clients!r}")
    if not args.levels or min(args.levels) < 1:
        p.error("--clients needs at least one level >= 1")
    if args.passes < 1:
        p.error("--passes needs at least 1")
    args.systems = [args.only] if args.only else [
        x.strip() for x in args.systems.split(",") if x.strip()]
    if not args.systems or set(args.systems) - set(SYSTEMS):
        p.error(f"--systems takes some of {', '.join(SYSTEMS)}, got {','.join(args.systems)}")
    args.loops = [x.strip() for x in args.flotilla_loop.split(",") if x.strip()]
    if set(args.loops) - {"asyncio", "uvloop"} or len(set(args.loops)) != len(args.loops):
        p.error(f"--flotilla-loop takes asyncio and/or uvloop, got {args.flotilla_loop!r}")
    args.modes = {"off": ["plain"], "on": ["tls"], "both": ["plain", "tls"]}[args.tls]
    return args


def unavailable_systems(args: argparse.Namespace) -> dict[str, str]:
    """system -> why it cannot be measured here (printed, and in the table)."""
    out = {}
    if "etcd" in args.systems and not (os.path.isfile(args.etcd)
                                       and os.access(args.etcd, os.X_OK)):
        out["etcd"] = (f"no etcd binary at {args.etcd}; apt-get install -y etcd-server, or "
                       "pass --etcd PATH")
    if "flotilla" in args.systems and (reason := flotilla_unavailable()):
        out["flotilla"] = reason
    if "flotilla" in args.systems and "uvloop" in args.loops:
        try:
            importlib.import_module("uvloop")
        except ImportError:
            out["flotilla"] = ("--flotilla-loop uvloop, but uvloop is not installed "
                               "(.venv/bin/pip install -e .)")
    if "pysyncobj" in args.systems and (reason := pysyncobj_unavailable()):
        out["pysyncobj"] = reason
    for system, reason in out.items():
        print(f"\n== {system}: NOT MEASURED: {reason}", flush=True)
    return out


async def main_async(args: argparse.Namespace) -> int:
    load_before = _loadavg()
    value = os.urandom(args.value_size // 2 + 1).hex()[: args.value_size].encode()
    root = Path(tempfile.mkdtemp(prefix="flotilla-vs-etcd-"))
    certs = Certs(root / "tls") if "tls" in args.modes else None
    unavailable = unavailable_systems(args)
    configs = []
    for mode in args.modes:
        for system in args.systems:
            if system == "pysyncobj" and mode == "tls":
                continue
            for loop in (args.loops or [None]) if system == "flotilla" else [None]:
                configs.append(Config(system, mode, loop))
    if "pysyncobj" in args.systems and "plain" not in args.modes:
        print("\n== pysyncobj: not measured: it has no TLS, and --tls on measures TLS only "
              "(--tls both measures it in plain mode beside the others)", flush=True)
    elif "pysyncobj" in args.systems and "tls" in args.modes:
        print("\n== pysyncobj: plain mode only (it has no TLS)", flush=True)
    if not configs:
        print("nothing to measure", file=sys.stderr)
        return 1
    runs: Runs = {c: [Report(c.label, skipped=unavailable.get(c.system))
                      for _ in range(args.passes)] for c in configs}
    try:
        for n in range(args.passes):
            if args.passes > 1:
                print(f"\n==== pass {n + 1} of {args.passes}", flush=True)
            await run_pass(n, configs, runs, args, certs, value, root)
    finally:
        if args.keep:
            print(f"\ndata and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    tls = {"plain": "", "tls": "; mutual TLS between peers, TLS on the client port",
           "both": "; plain, and with mutual TLS between peers and TLS on the client port "
                   "(PySyncObj plain only)"}
    passes = (f"; medians of {args.passes} interleaved passes (ratios: the median of each "
              "pass's ratio)" if args.passes > 1 else "")
    failover = (f"; failover: median of {args.failover_rounds} leader SIGKILLs under "
                f"{args.failover_clients} writers (request timeout {args.failover_timeout:g}s)"
                if args.failover_rounds > 0 else "")
    print(f"\n{args.value_size}-byte values, {args.duration:g}s per level after "
          f"{args.warmup:g}s warm-up, a fresh cluster per level, clients write to the leader; "
          f"CPU per write: user + system time in the measured window over the writes "
          f"committed in it{failover}{tls['both' if len(args.modes) == 2 else args.modes[0]]}"
          f"{passes}; load generator on {args.generator_loop}; load average before the "
          f"run: {load_before}, after: "
          f"{_loadavg()}")
    print(render(runs, args.levels))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "passes": args.passes,
            "tables": {title: {c.header: {"median": c.values, "per_pass": c.per_pass}
                               for c in cols} for title, cols in tables(runs, args.levels)},
            "runs": [{"system": c.system, "mode": c.mode, "loop": c.loop, "pass": n + 1,
                      "label": r.label, "skipped": r.skipped, "failures": r.failures,
                      "gaps_s": r.gaps, **r.cells(args.levels)}
                     for c, reports in runs.items() for n, r in enumerate(reports)],
        }, indent=2))
    measured = [r for reports in runs.values() for r in reports
                if not r.skipped and r.throughput]
    return 0 if measured else 1


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    factory = None
    if args.generator_loop == "uvloop":
        import uvloop

        factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
