"""What the hostile-peer tests share: the cluster they attack, the attacker's listener, and the
checks that every attack ends with.

Each test replays one attack of the security review (issue 14) against real member processes,
with the cluster's *right* id, and then checks the defended outcome. An outcome has several
parts (the request is refused, the cluster still commits, the member still serves, nothing
was dialled), so a test collects every part that went wrong in ``Findings`` and fails once,
listing them all: a member that breaks shows everything it broke, not just the first thing.
Waits are bounded by a few election timeouts, so a broken cluster costs seconds, not minutes.

The members run with the fault suite's short timings (500 ms elections). A module shares one
cluster (``Keeper``); before each test it is checked (every member up, a leader, a write
committed everywhere) and replaced by a new one if an earlier attack broke it, so each test's
findings are its own.
"""

from __future__ import annotations

import contextlib
import itertools
import re
import socketserver
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.support import ELECTION_S, FAST, UNAVAILABILITY_BOUND_S
from tests.harness.forger import SIGNED_LIMIT, Forger, batch
from tests.harness.kvclient import TRANSPORT_ERRORS, KVClient, Response
from tests.harness.processes import LocalCluster

#: An admin token of the length the hardened member requires (16 bytes or more).
ADMIN_TOKEN = "hostile-suite-admin-token-0123456789"


class Findings:
    """Everything a test found wrong; ``check()`` fails with all of it."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def expect(self, ok: Any, problem: str) -> bool:
        if not ok:
            self.problems.append(problem)
        return bool(ok)

    def check(self) -> None:
        assert not self.problems, (f"{len(self.problems)} defended outcome(s) not met:\n- "
                                   + "\n- ".join(self.problems))


# ---------------------------------------------------------------------------------------------
# The cluster under attack


def leader_within(cluster: LocalCluster, seconds: float) -> str | None:
    """The leader every running member agrees on, or None if there is none by then."""
    try:
        return cluster.wait_leader(seconds)
    except TimeoutError:
        return None


def followers(cluster: LocalCluster, leader: str) -> list[str]:
    return [m for m in cluster.members if m != leader]


def forger(cluster: LocalCluster, name: str) -> Forger:
    """An attacker who knows the cluster id, aimed at ``name``'s peer port."""
    return Forger(cluster.peer_url(name), cluster.cluster_id, timeout=10.0)


def in_name_of(cluster: LocalCluster, sender: str, messages: list[Any], **options: Any
               ) -> bytes:
    """A batch in ``sender``'s name, with the cluster's id; it advertises ``sender``'s real
    URLs when ``sender`` is a member (``options`` as for ``forger.batch``)."""
    if sender in cluster.nodes:
        options.setdefault("peer_url", cluster.peer_url(sender))
        options.setdefault("client_url", cluster.nodes[sender].url)
    return batch(cluster.cluster_id, sender, messages, **options)


def refused_on_stream(target: Forger, sender: str, frame: bytes, within: float = 2.0
                      ) -> str | None:
    """None when the member refuses ``frame`` sent on a stream opened as ``sender`` (the
    handshake is refused, or the stream is closed within ``within`` seconds of the frame);
    otherwise what happened instead."""
    with target.stream(sender) as stream:
        if stream.status == 0:
            return f"the handshake got no answer ({stream.error})"
        if stream.status != 101:
            return None
        stream.send(frame)
        code = stream.closed_within(within)
    return None if code is not None else f"the stream stayed open {within}s after the frame"


def metric_lines_naming(cluster: LocalCluster, name: str, pattern: str) -> list[str] | None:
    """The lines of ``name``'s ``/metrics`` that match ``pattern`` (None: no answer)."""
    try:
        with cluster.client(name, timeout=3.0) as c:
            resp = c.request("GET", "/metrics")
    except TRANSPORT_ERRORS:
        return None
    if resp.status != 200:
        return None
    found = re.compile(pattern)
    return [line for line in resp.body.decode(errors="replace").splitlines()
            if found.search(line)]


def _write(client: KVClient, key: str, value: bytes) -> Response | str:
    try:
        return client.put(key, value, timeout=3.0)
    except TRANSPORT_ERRORS as exc:
        return f"no answer ({type(exc).__name__}: {exc})"


class Keeper:
    """One cluster for a test module, replaced when an attack left it broken."""

    def __init__(self, root: Path, **options: Any) -> None:
        self.root = root
        # Every cluster has an admin token (the hardened member requires one); this suite's
        # clients all carry it.
        self.token = ADMIN_TOKEN
        self.options = {**FAST, **options}
        self.options["extra_args"] = ["--admin-token", ADMIN_TOKEN,
                                      *self.options.get("extra_args", ())]
        self.cluster: LocalCluster | None = None
        self.made = 0
        self._marks: dict[str, int] = {}
        self._writes = 0

    def healthy_cluster(self) -> LocalCluster:
        """The module's cluster, checked; a new one if it is not healthy."""
        problem = self.problem() if self.cluster is not None else "none started yet"
        if problem is not None:
            if self.cluster is not None:
                print(f"replacing the cluster under {self.cluster.root}: {problem}")
                self.cluster.stop_all()
            self.cluster = LocalCluster(self.root / f"cluster{self.made}", 3, start=False,
                                        **self.options)
            self.made += 1
            self.cluster.start()
            self.cluster.wait_leader(30)
            problem = self.problem()
            assert problem is None, f"a new cluster is not healthy: {problem}"
        self._mark_logs()
        return self.cluster

    def client(self, name: str, timeout: float = 5.0) -> KVClient:
        """A client of ``name`` that carries the admin token."""
        assert self.cluster is not None
        return KVClient(self.cluster.nodes[name].url, timeout=timeout, token=self.token)

    def status(self, name: str, timeout: float = 2.0) -> dict[str, Any] | None:
        """``name``'s ``/v1/status``, or None when it does not answer (or is not running)."""
        assert self.cluster is not None
        node = self.cluster.nodes[name]
        if not node.running or node.paused:
            return None
        try:
            with self.client(name, timeout=timeout) as c:
                return c.status()
        except (*TRANSPORT_ERRORS, RuntimeError, ValueError):
            return None

    def caught_up(self, name: str, index: int, seconds: float) -> bool:
        """Whether ``name`` applies ``index`` within ``seconds``."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            st = self.status(name)
            if st is not None and st["applied_index"] >= index:
                return True
            time.sleep(0.05)
        return False

    def problem(self) -> str | None:
        """Why the cluster is not fit for the next attack, or None."""
        cluster = self.cluster
        assert cluster is not None
        down = [n for n, node in cluster.nodes.items() if not node.running or node.paused]
        if down:
            return f"members not running: {down}"
        leader = leader_within(cluster, 5 * ELECTION_S + 2)
        if leader is None:
            return "no leader"
        self._writes += 1
        with self.client(leader, timeout=3.0) as c:
            answer = _write(c, "hostile/health", str(self._writes).encode())
        if isinstance(answer, str) or answer.status != 200:
            return f"the leader did not take a write: {answer}"
        for name in cluster.members:
            if not self.caught_up(name, answer.index or 0, 5.0):
                return f"{name} did not apply index {answer.index}"
        return None

    def _mark_logs(self) -> None:
        assert self.cluster is not None
        self._marks = {name: _size(node.log_path) for name, node in self.cluster.nodes.items()}

    def new_log_text(self, name: str) -> str:
        """What ``name`` logged since the test began."""
        assert self.cluster is not None
        node = self.cluster.nodes[name]
        try:
            with open(node.log_path, "rb") as f:
                f.seek(self._marks.get(name, 0))
                return f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""

    # -- the checks every attack ends with ------------------------------------------------

    def check_serving(self, findings: Findings, tag: str) -> None:
        """Every member is up and serves: ``/healthz``, a write sent to it (followers forward
        it) and a linearizable read of that write from it."""
        cluster = self.cluster
        assert cluster is not None
        for name, node in cluster.nodes.items():
            if not findings.expect(node.running, f"{name} is not running after {tag} (exit "
                                   f"code {node.returncode})"):
                continue
            problem = self._serving_problem(name, tag)
            findings.expect(problem is None, f"{name} does not serve after {tag}: {problem}")

    def _serving_problem(self, name: str, tag: str) -> str | None:
        key = f"hostile/served-by-{name}"
        value = f"{tag} at {time.monotonic():.3f}".encode()
        deadline = time.monotonic() + UNAVAILABILITY_BOUND_S
        last = "no attempt"
        while time.monotonic() < deadline:
            try:
                with self.client(name, timeout=3.0) as c:
                    health = c.request("GET", "/healthz")
                    if health.status != 200:
                        last = f"/healthz answered {health.status} {health.body[:200]!r}"
                        time.sleep(0.2)
                        continue
                    put = c.put(key, value)
                    if put.status != 200:
                        last = f"a write answered {put.status} {put.body[:200]!r}"
                        time.sleep(0.2)
                        continue
                    got = c.get(key)
            except TRANSPORT_ERRORS as exc:
                last = f"no answer ({type(exc).__name__}: {exc})"
                time.sleep(0.2)
                continue
            if got.status == 200 and got.body == value:
                return None
            return (f"a linearizable read after its acknowledged write answered {got.status} "
                    f"{got.body[:200]!r}, not {value!r}")
        return last

    def check_no_tracebacks(self, findings: Findings) -> None:
        """No member logged a traceback during the test (an unhandled error is a defect even
        when the member survives it)."""
        assert self.cluster is not None
        for name in self.cluster.nodes:
            text = self.new_log_text(name)
            at = text.find("Traceback")
            findings.expect(at < 0, f"{name} logged a traceback:\n"
                            + "\n".join(text[max(0, at - 300):at + 1500].splitlines()[-25:]))

    def check_terms_bounded(self, findings: Findings, tag: str) -> None:
        assert self.cluster is not None
        for name in self.cluster.members:
            st = self.status(name)
            if st is not None:
                findings.expect(st["term"] < SIGNED_LIMIT,
                                f"{name} is in term {st['term']} after {tag} (>= 2^63)")

    def check_commit_within_log(self, findings: Findings, tag: str) -> None:
        """No member's commit index is beyond its own log."""
        assert self.cluster is not None
        for name in self.cluster.members:
            st = self.status(name)
            if st is not None:
                findings.expect(st["commit_index"] <= st["last_index"],
                                f"{tag}: {name}'s commit index {st['commit_index']} is beyond "
                                f"its log, which ends at {st['last_index']}")

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop_all()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@dataclass(frozen=True)
class Write:
    key: str
    value: bytes
    answer: Response | str  # or why there was none
    seconds: float

    @property
    def ok(self) -> bool:
        return isinstance(self.answer, Response) and self.answer.status == 200


def writes(keeper: Keeper, name: str, prefix: str, count: int) -> list[Write]:
    """``count`` writes sent to ``name`` one after the other."""
    done = []
    with keeper.client(name, timeout=3.0) as c:
        for i in range(count):
            done.append(_timed_write(c, f"{prefix}/{i}"))
    return done


def _timed_write(client: KVClient, key: str) -> Write:
    value = f"{key} at {time.monotonic():.3f}".encode()
    start = time.monotonic()
    answer = _write(client, key, value)
    return Write(key, value, answer, time.monotonic() - start)


@contextlib.contextmanager
def writing(keeper: Keeper, name: str, prefix: str, *, every: float = 0.05,
            timeout: float = 10.0) -> Iterator[list[Write]]:
    """Write to ``name`` every ``every`` seconds while the block runs (the list fills as the
    answers come)."""
    done: list[Write] = []
    stop = threading.Event()

    def run() -> None:
        with keeper.client(name, timeout=timeout) as c:
            for i in itertools.count():
                if stop.is_set():
                    return
                done.append(_timed_write(c, f"{prefix}/{i}"))
                stop.wait(every)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    time.sleep(0.2)
    try:
        yield done
    finally:
        time.sleep(0.3)
        stop.set()
        thread.join(timeout + 5)


def unread(keeper: Keeper, name: str, done: Iterable[Write]) -> list[str]:
    """The acknowledged writes that a linearizable read from ``name`` does not return."""
    missing = []
    with keeper.client(name) as c:
        for w in done:
            if w.ok:
                try:
                    got = c.get(w.key)
                except TRANSPORT_ERRORS as exc:
                    missing.append(f"{w.key}: no answer ({type(exc).__name__})")
                    continue
                if got.status != 200 or got.body != w.value:
                    missing.append(f"{w.key}: {brief(got)}")
    return missing


def failed(done: Iterable[Write]) -> list[str]:
    """The writes that were not answered 200, and what they got."""
    return [f"{w.key}: {brief(w.answer)}" for w in done if not w.ok]


def brief(answer: Any) -> str:
    if isinstance(answer, Response):
        return f"{answer.status} {answer.body[:120]!r}"
    return str(answer)


# ---------------------------------------------------------------------------------------------
# The attacker's listener


@dataclass(frozen=True)
class Request:
    peer: str
    line: str
    headers: dict[str, str]


@dataclass
class Listener:
    """A server the attacker runs, whose URL the forged batches advertise. It records every
    connection and every request head, and answers each request 200 ``{"index": 1}`` (what
    the review's fake leader did: a member that forwards a write here gets a success for a
    write that never reaches the log)."""

    name: str
    connections: list[str] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    def __post_init__(self) -> None:
        owner = self

        class Handler(socketserver.StreamRequestHandler):
            timeout = 2.0

            def handle(self) -> None:
                peer = "{}:{}".format(*self.client_address[:2])
                with owner._lock:
                    owner.connections.append(peer)
                try:
                    line = self.rfile.readline(65536).decode("latin-1").strip()
                    headers: dict[str, str] = {}
                    while (raw := self.rfile.readline(65536)) not in (b"\r\n", b"\n", b""):
                        k, _, v = raw.decode("latin-1").partition(":")
                        headers[k.strip().lower()] = v.strip()
                    with owner._lock:
                        owner.requests.append(Request(peer, line, headers))
                    body = b'{"index": 1}'
                    self.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                     b"Flotilla-Index: 1\r\nFlotilla-Mod-Index: 1\r\n"
                                     b"Connection: close\r\nContent-Length: %d\r\n\r\n%s"
                                     % (len(body), body))
                except OSError:
                    pass

        self._lock = threading.Lock()
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name=f"listener-{self.name}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def seen(self) -> str | None:
        """What reached this listener (None: nothing at all)."""
        with self._lock:
            if not self.connections:
                return None
            shown = "; ".join(f"{r.line} (Authorization: {r.headers.get('authorization')})"
                              for r in self.requests[:5])
            return (f"the attacker's {self.name} listener {self.url} got "
                    f"{len(self.connections)} connection(s), {len(self.requests)} request(s): "
                    f"{shown}")

    def authorization_seen(self) -> list[str]:
        with self._lock:
            return [r.headers["authorization"] for r in self.requests
                    if "authorization" in r.headers]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def run_in_background(target: Callable[[], Any]) -> Callable[[float], Any]:
    """Start ``target`` in a thread; the returned function joins it and gives its result
    (or raises what it raised)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = target()
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join(timeout: float) -> Any:
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError("the background call did not finish")
        if "error" in box:
            raise box["error"]
        return box.get("result")

    return join


def rss_bytes(pid: int) -> int | None:
    """Resident memory of a process (Linux), or None where /proc is not there."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def open_fds(pid: int) -> int | None:
    try:
        return len(list(Path(f"/proc/{pid}/fd").iterdir()))
    except OSError:
        return None


def names_in(text: str, names: Iterable[str]) -> list[str]:
    return [n for n in names if n in text]
