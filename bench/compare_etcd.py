"""Flotilla against etcd 3.4 on this machine, driven by the same HTTP load generator.

Both systems run three members on loopback with the same timing (heartbeat 100 ms, election
timeout 1000 ms) and their default durability (fsync before acknowledging). One system at a
time is started, measured and stopped, so neither competes with the other's idle work.

Measured, for each system:

* write throughput and latency: K concurrent clients (``--clients 1,16,64``), each sending one
  write at a time to the leader over a persistent connection for ``--duration`` seconds after
  ``--warmup``. etcd is written through its v3 JSON gateway (``POST /v3/kv/put``, base64 key
  and value), Flotilla through ``PUT /v1/kv/{key}``; the values are the same bytes. The
  leader's CPU time (user + system, from /proc) per acknowledged write is reported too: unlike
  writes/s it hardly depends on what else the host is running.
* the leader-failover window: under a steady 16-client write load the leader is SIGKILLed, and
  the longest gap between two successful writes (any client) is measured; clients that fail or
  time out (``--failover-timeout``) move on to the next member. Repeated ``--failover-rounds``
  times, restarting the killed member in between; the median is reported.

With ``--tls`` both systems run with mutual TLS between peers (each member's certificate names
it, signed by one CA made for the run) and TLS on the client port (a server certificate, no
client certificates), with the same certificates; the load generator then dials https,
verifying the members against that CA, over the same keep-alive connections. ``--tls both``
measures each system plain and with TLS in one invocation; ``--passes N`` repeats everything N
times, interleaved (the order reversed every other pass, so that a host whose speed drifts
favours no column), and prints the medians, with every ratio taken within a pass first.

Usage::

    .venv/bin/python bench/compare_etcd.py                       # both, default settings
    .venv/bin/python bench/compare_etcd.py --only etcd --duration 5
    .venv/bin/python bench/compare_etcd.py --tls --failover-rounds 0   # both, TLS everywhere
    .venv/bin/python bench/compare_etcd.py --tls both --passes 3 --failover-rounds 0
    .venv/bin/python bench/compare_etcd.py --clients 1,16 --json bench/results/cmp.json

etcd comes from ``apt-get install -y etcd-server`` (``--etcd PATH`` for another binary).
The load generator runs in this process (asyncio + aiohttp); its CPU use is printed with the
numbers, because on a small machine it can be what limits the higher concurrency rows.
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


class EtcdCluster:
    """Three etcd members on loopback, started as plain processes."""

    fsync_metric = "etcd_disk_wal_fsync_duration_seconds_count"

    def __init__(self, binary: str, workdir: Path, size: int = 3,
                 certs: Certs | None = None) -> None:
        self.label = "etcd " + _etcd_version(binary)
        self.binary = binary
        self.workdir = workdir
        numbers = _harness("ports").allocate_ports(2 * size)
        self._names = [f"etcd{i}" for i in range(size)]
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
        self._procs: dict[str, subprocess.Popen] = {}
        self._logs: dict[str, Any] = {}
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

    def _start(self, name: str) -> None:
        log = self._logs.get(name)
        if log is None:
            log = self._logs[name] = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115
        self._procs[name] = subprocess.Popen(self._argv(name), stdout=log, stderr=log,
                                             stdin=subprocess.DEVNULL, start_new_session=True)

    def names(self) -> list[str]:
        return list(self._names)

    def running(self, name: str) -> bool:
        return self._procs[name].poll() is None

    def pid(self, name: str) -> int | None:
        return self._procs[name].pid

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

    def kill(self, name: str) -> None:
        proc = self._procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def restart(self, name: str) -> None:
        if self._procs[name].poll() is None:
            raise RuntimeError(f"{name} is still running")
        self._start(name)

    def close(self) -> None:
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


class FlotillaCluster:
    """Three ``flotilla node`` processes (the test harness's NodeProcess), each on its own
    loopback address where the host allows it, as the harness's LocalCluster places them."""

    fsync_metric = "flotilla_fsync_seconds_count"

    def __init__(self, workdir: Path, size: int = 3, certs: Certs | None = None) -> None:
        self.label = "flotilla"
        self.workdir = workdir
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
                extra_args=tls, log_path=workdir / f"{name}.log", start=False)
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


def flotilla_unavailable() -> str | None:
    """Why ``python -m flotilla.node`` cannot run here, or None when it can."""
    return _harness("processes").node_unavailable_reason()


# ---------------------------------------------------------------------------------------------
# The load generator (the same code for both systems)


@dataclass
class LoadResult:
    clients: int
    seconds: float  # the measured window, warm-up excluded
    ok: int = 0
    errors: int = 0
    latencies: list[float] = field(default_factory=list)  # seconds, writes started in window
    successes: list[float] = field(default_factory=list)  # completion times of every success
    fsyncs: float | None = None  # the leader's log fsyncs during the whole run, if known
    leader_cpu: float | None = None  # the leader's CPU seconds during the whole run, if known
    cpu_seconds: float = 0.0  # this process's CPU time during the run
    wall_seconds: float = 0.0  # the whole run, warm-up included

    @property
    def cpu_share(self) -> float:
        """The load generator's CPU use, as a fraction of one core."""
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds else 0.0

    @property
    def leader_cpu_per_write(self) -> float | None:
        """The leader's CPU seconds per acknowledged write (warm-up included in both)."""
        return self.leader_cpu / len(self.successes) if self.leader_cpu and self.successes \
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
) -> LoadResult:
    """``clients`` closed-loop writers: one write at a time each, for warmup + duration.

    Every client starts on ``targets[0]`` and, after a failure (error answer, connection error,
    timeout), pauses 20 ms, so that a dead member is not hammered, and moves to another target
    picked at random, so that clients do not all queue up behind the same member. ``result``,
    when given, is filled in as the run goes, so that a caller can watch it.
    """
    result = result if result is not None else LoadResult(clients, duration)
    loop = asyncio.get_running_loop()
    start = loop.time()
    measure_from = start + warmup
    end = measure_from + duration
    per_request = aiohttp.ClientTimeout(total=timeout)
    cpu0 = time.process_time()

    async def client(i: int) -> None:
        target = 0
        rng = random.Random(i)
        n = 0
        while loop.time() < end and not (stop and stop.is_set()):
            key = f"bench/{i}/{n % 1000}"
            n += 1
            method, path, body, headers = system.write_request(key, value)
            t0 = loop.time()
            ok = False
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.request(method, targets[target] + path, data=body,
                                           headers=headers, timeout=per_request) as r:
                    await r.read()
                    ok = r.status == 200
            t1 = loop.time()
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
    result.cpu_seconds = time.process_time() - cpu0
    result.wall_seconds = loop.time() - start
    return result


def new_session(system: System) -> aiohttp.ClientSession:
    # limit=0: every concurrent client keeps its own keep-alive connection (over TLS: one
    # handshake per client, during the warm-up).
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(
        limit=0, ssl=system.ssl_context if system.ssl_context is not None else True))


async def fsync_count(session: aiohttp.ClientSession, url: str, metric: str) -> float | None:
    """The value of ``metric`` (a histogram's _count) on the member at ``url``, or None."""
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


async def measure_throughput(system: System, levels: list[int], args: argparse.Namespace,
                             value: bytes) -> dict[int, LoadResult]:
    results = {}
    async with new_session(system) as session:
        if isinstance(system, EtcdCluster):
            leader = await agreed_leader(system, session, 30)
            path = await system.probe_put_path(session, system.client_url(leader))
            print(f"  etcd gateway put path: {path}", flush=True)
        for k in levels:
            leader = await agreed_leader(system, session, 30)
            url = system.client_url(leader)
            before = await fsync_count(session, url, system.fsync_metric)
            cpu_before = process_cpu(system.pid(leader))
            r = await drive(system, session, [url], k,
                            duration=args.duration, warmup=args.warmup, value=value,
                            timeout=10.0)
            cpu_after = process_cpu(system.pid(leader))
            after = await fsync_count(session, url, system.fsync_metric)
            per_fsync = ""
            if before is not None and after is not None and after > before:
                r.fsyncs = after - before
                per_fsync = f", {len(r.successes) / r.fsyncs:.1f} writes per leader fsync"
            if cpu_before is not None and cpu_after is not None:
                r.leader_cpu = cpu_after - cpu_before
            per_write = r.leader_cpu_per_write
            leader_cpu = f", leader CPU {per_write * 1e6:.0f} us/write" if per_write else ""
            print(f"  {k:>3} client{'s' if k > 1 else ' '} -> {leader}: {r.rate:8.0f} writes/s, "
                  f"p50 {r.percentile(50) * 1e3:7.2f} ms, p99 {r.percentile(99) * 1e3:7.2f} ms, "
                  f"{r.errors} errors{per_fsync}{leader_cpu}, load generator CPU "
                  f"{r.cpu_share:.0%} of a core", flush=True)
            results[k] = r
    return results


async def measure_failover(system: System, args: argparse.Namespace,
                           value: bytes) -> list[float]:
    """Longest gap between successful writes around a leader SIGKILL, once per round."""
    gaps = []
    loop = asyncio.get_running_loop()
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
            killed_at = loop.time()
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
                gap = loop.time() - (before[-1] if before else killed_at)
                note = " (writes never resumed within the window: a lower bound)"
            gaps.append(gap)
            print(f"  round {round_no + 1}: SIGKILL leader {leader}: longest gap between "
                  f"successful writes {gap * 1e3:.0f} ms{note}", flush=True)
            await asyncio.to_thread(system.restart, leader)
            await agreed_leader(system, session, 60)
            await asyncio.sleep(2.0)  # let the restarted member catch up before the next round
    return gaps


# ---------------------------------------------------------------------------------------------
# Running one system, and the table


@dataclass
class Report:
    label: str
    throughput: dict[int, LoadResult] = field(default_factory=dict)
    gaps: list[float] = field(default_factory=list)
    skipped: str | None = None

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
        out["failover gap ms (median)"] = (statistics.median(self.gaps) * 1e3
                                           if self.gaps else None)
        return out


async def run_system(make: Any, label: str, levels: list[int], args: argparse.Namespace,
                     value: bytes, workdir: Path) -> Report:
    """Start, measure and stop one system. A failure is reported in the table instead of
    ending the run, so the other system's numbers are still printed."""
    print(f"\n== {label}: 3 members on loopback, data under {workdir}", flush=True)
    report = Report(label)
    system = None
    try:
        system = await asyncio.to_thread(make, workdir)
        report.label = system.label + (" TLS" if system.ssl_context else "")
        report.throughput = await measure_throughput(system, levels, args, value)
        if args.failover_rounds > 0:
            print(f"  failover: {args.failover_clients} clients, leader SIGKILLed, "
                  f"{args.failover_rounds} rounds", flush=True)
            report.gaps = await measure_failover(system, args, value)
    except Exception as exc:
        report.skipped = f"the run failed: {type(exc).__name__}: {exc}"
        traceback.print_exc()
        print(f"  {label}: {report.skipped} (logs: {workdir}, kept with --keep)", flush=True)
    finally:
        if system is not None:
            await asyncio.to_thread(system.close)
    return report


Runs = dict[tuple[str, str], list[Report]]  # (system, mode) -> one report per pass


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


def columns(runs: Runs, levels: list[int]) -> list[tuple[str, dict[str, float | None], bool]]:
    """(header, row -> value, is a ratio): each system's medians per mode, Flotilla over etcd
    per mode, and with both modes each system's TLS over plain."""
    rows = list(Report("").cells(levels))
    systems = list(dict.fromkeys(system for system, _ in runs))
    modes = list(dict.fromkeys(mode for _, mode in runs))
    out = []

    def ratio(header: str, num: list[Report], den: list[Report]) -> None:
        out.append((header, {row: _median(_ratios(num, den, row, levels)) for row in rows}, True))

    for mode in modes:
        for system in systems:
            reports = runs[system, mode]
            out.append((_label(reports), {row: _median([r.cells(levels)[row] for r in reports])
                                          for row in rows}, False))
        if systems == ["etcd", "flotilla"]:
            ratio("flotilla/etcd" + (" TLS" if mode == "tls" else ""),
                  runs["flotilla", mode], runs["etcd", mode])
    if modes == ["plain", "tls"]:
        for system in systems:
            ratio(f"{system} TLS/plain", runs[system, "tls"], runs[system, "plain"])
    return out


def render(runs: Runs, levels: list[int]) -> str:
    cols = columns(runs, levels)
    rows = list(cols[0][1]) if cols else []
    headers = ["", *(header for header, _, _ in cols)]
    table = [headers]
    for row in rows:
        table.append([row, *(("n/a" if values[row] is None else f"{values[row]:.2f}")
                             if is_ratio else _fmt(values[row]) for _, values, is_ratio in cols)])
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    out = []
    for n, line in enumerate(table):
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                             for i, (c, w) in enumerate(zip(line, widths, strict=True))))
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    for reports in runs.values():
        label = _label(reports)
        for n, r in enumerate(reports):
            if r.skipped:
                where = f" (pass {n + 1})" if len(reports) > 1 else ""
                out.append(f"{label}{where}: not (fully) measured: {r.skipped}")
        gaps = [g for r in reports for g in r.gaps]
        if gaps:
            out.append(f"{label} failover gaps, ms: " + ", ".join(f"{g * 1e3:.0f}" for g in gaps))
    out += goals(runs, levels)
    return "\n".join(out)


def goals(runs: Runs, levels: list[int]) -> list[str]:
    """What TLS costs at the highest concurrency, pass by pass: each system's TLS/plain
    writes/s, and Flotilla's ratio to etcd with TLS over that ratio without."""
    if ("flotilla", "tls") not in runs or ("flotilla", "plain") not in runs:
        return []
    k = max(levels)
    row = f"writes/s, {k} client{'s' if k > 1 else ''}"

    def line(what: str, values: list[float], goal: float) -> str:
        median = _median(list(values))
        shown = ", ".join(f"{v:.2f}" for v in values) or "n/a"
        verdict = "" if median is None else " (met)" if median >= goal else " (missed)"
        return (f"{what}: {shown}; median {'n/a' if median is None else f'{median:.2f}'}, "
                f"goal at least {goal:.2f}{verdict}")

    flo = _ratios(runs["flotilla", "tls"], runs["flotilla", "plain"], row, levels)
    out = ["", f"TLS at {k} clients, pass by pass:",
           line("  flotilla TLS/plain writes/s", flo, 0.85)]
    if ("etcd", "tls") in runs:
        etcd = _ratios(runs["etcd", "tls"], runs["etcd", "plain"], row, levels)
        out.append("  etcd TLS/plain writes/s: " + (", ".join(f"{v:.2f}" for v in etcd) or "n/a"))
        if len(flo) == len(etcd):
            out.append(line("  flotilla/etcd with TLS over flotilla/etcd without",
                            [f / e for f, e in zip(flo, etcd, strict=True)], 1.0))
    cpu = f"leader CPU us/write, {k} client{'s' if k > 1 else ''}"
    for system in ("flotilla", "etcd"):
        if (system, "tls") in runs:
            ratios = _ratios(runs[system, "tls"], runs[system, "plain"], cpu, levels)
            out.append(f"  {system} TLS/plain leader CPU per write: "
                       + (", ".join(f"{v:.2f}" for v in ratios) or "n/a"))
    return out


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.0f}" if v >= 100 else f"{v:.2f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=10.0,
                   help="measured seconds per concurrency level (default 10)")
    p.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring (2)")
    p.add_argument("--clients", default="1,16,64",
                   help="comma-separated concurrency levels (default 1,16,64)")
    p.add_argument("--only", choices=("etcd", "flotilla"), help="measure one system")
    p.add_argument("--tls", nargs="?", const="on", default="off", choices=("off", "on", "both"),
                   help="mutual TLS between peers and TLS on the client port, for both systems "
                        "(--tls, or --tls on); --tls both: plain and TLS in one invocation")
    p.add_argument("--passes", type=int, default=1,
                   help="measure everything this many times, interleaved; medians (1)")
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
    args.modes = {"off": ["plain"], "on": ["tls"], "both": ["plain", "tls"]}[args.tls]
    return args


async def main_async(args: argparse.Namespace) -> int:
    value = os.urandom(args.value_size // 2 + 1).hex()[: args.value_size].encode()
    root = Path(tempfile.mkdtemp(prefix="flotilla-vs-etcd-"))
    certs = Certs(root / "tls") if "tls" in args.modes else None
    systems = [s for s in ("etcd", "flotilla") if args.only in (None, s)]
    unavailable = {}
    if "etcd" in systems and not (os.path.isfile(args.etcd) and os.access(args.etcd, os.X_OK)):
        unavailable["etcd"] = (f"no etcd binary at {args.etcd}; apt-get install -y "
                               "etcd-server, or pass --etcd PATH")
    if "flotilla" in systems and (reason := flotilla_unavailable()):
        print(f"\n== flotilla: NOT MEASURED: {reason}", flush=True)
        unavailable["flotilla"] = reason
    configs = [(system, mode) for system in systems for mode in args.modes]
    runs: Runs = {config: [] for config in configs}
    try:
        for n in range(args.passes):
            if args.passes > 1:
                print(f"\n==== pass {n + 1} of {args.passes}", flush=True)
            for system, mode in configs if n % 2 == 0 else configs[::-1]:
                label = system + (" TLS" if mode == "tls" else "")
                if system in unavailable:
                    runs[system, mode].append(Report(label, skipped=unavailable[system]))
                    continue
                tls = certs if mode == "tls" else None
                workdir = root / f"{system}-{mode}-{n + 1}"
                workdir.mkdir()
                if system == "etcd":
                    def make(d: Path, tls: Certs | None = tls) -> System:
                        return EtcdCluster(args.etcd, d, certs=tls)
                else:
                    def make(d: Path, tls: Certs | None = tls) -> System:
                        return FlotillaCluster(d, certs=tls)
                runs[system, mode].append(
                    await run_system(make, label, args.levels, args, value, workdir))
    finally:
        if args.keep:
            print(f"\ndata and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    tls = {"plain": "", "tls": "; mutual TLS between peers, TLS on the client port",
           "both": "; plain, and with mutual TLS between peers and TLS on the client port"}
    passes = (f"; medians of {args.passes} interleaved passes (ratios: the median of each "
              "pass's ratio)" if args.passes > 1 else "")
    print(f"\n{args.value_size}-byte values, {args.duration:g}s per level after "
          f"{args.warmup:g}s warm-up, clients write to the leader; failover: median of "
          f"{args.failover_rounds} leader SIGKILLs under {args.failover_clients} writers "
          f"(request timeout {args.failover_timeout:g}s)"
          f"{tls['both' if len(args.modes) == 2 else args.modes[0]]}{passes}\n")
    print(render(runs, args.levels))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "passes": args.passes,
            "columns": {header: values for header, values, _ in columns(runs, args.levels)},
            "runs": [{"system": system, "mode": mode, "pass": n + 1, "label": r.label,
                      "skipped": r.skipped, "gaps_s": r.gaps, **r.cells(args.levels)}
                     for (system, mode), reports in runs.items()
                     for n, r in enumerate(reports)],
        }, indent=2))
    measured = [r for reports in runs.values() for r in reports if not r.skipped]
    return 0 if measured else 1


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
