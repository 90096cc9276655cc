"""Real ``flotilla node`` processes on loopback, for process-level fault tests.

``NodeProcess`` is one member: the command line of the contract (docs/contract.md, "A
member"), its output in ``<data dir's parent>/<name>.log``, and the signals a fault test needs
(SIGKILL, SIGSTOP/SIGCONT, SIGTERM with the exit code). ``LocalCluster`` starts N of them with
ports from ``tests.harness.ports`` and, with ``proxied=True``, sends every ordered pair's peer
traffic through its own ``FaultProxy`` (a ``tests.harness.faultproxy.ProxyNet``) so that tests
can partition.

How the proxied topology works: a member dials its peers at the URLs of its own
``--initial-cluster``. Each member therefore gets its own view, in which the entry for every
other member ``dst`` is the proxy for the pair (self -> dst); its own entry is its real peer
address. Cutting the pair (a -> b) is then one proxy's business. A member added later
(``add_member``) is announced to the cluster with a single peer URL that every member learns
from the log, so its inbound traffic goes through one shared proxy (* -> new); ``isolate`` works
for it, and ``partition`` works as long as it does not split the senders of that shared proxy.

Every member runs with ``--admin-token ADMIN_TOKEN`` (the member's admin API always needs a
token), and the clients the harness hands out (``NodeProcess.client``, ``LocalCluster.client``)
send it as ``Authorization: Bearer``. A test that gives its own ``--admin-token`` in
``extra_args`` gets clients with that one; ``admin_token=None`` starts members without the
flag, and their clients then carry the token each member generated in
``<data dir>/admin-token``.

With ``tls=True`` every member runs with TLS on both ports (mutual TLS between members) with a
certificate from a CA the cluster makes under its root (``tests.harness.certs``); its URLs are
``https://`` and ``ssl_context`` is what clients dial them with.

Signals go to the member's process group (it runs in its own session), so a child it forked,
for example to write a snapshot, is paused and killed with it; SIGTERM goes to the member only,
which then owns its shutdown.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tests.harness import ports
from tests.harness.certs import MemberTLS, TestCA
from tests.harness.faultproxy import FaultProxy, ProxyNet
from tests.harness.kvclient import TRANSPORT_ERRORS, KVClient

__all__ = [
    "ADMIN_TOKEN",
    "NODE_COMMAND",
    "LocalCluster",
    "NodeProcess",
    "format_initial_cluster",
    "node_unavailable_reason",
]

NODE_COMMAND: tuple[str, ...] = (sys.executable, "-m", "flotilla.node")

#: The ``--admin-token`` the harness gives every member it starts (unless told otherwise).
ADMIN_TOKEN = "flotilla-test-admin-token-0123456789"

#: Where a member started without ``--admin-token`` keeps the token it generated.
GENERATED_TOKEN_FILE = "admin-token"


@functools.cache
def node_unavailable_reason(timeout: float = 60.0) -> str | None:
    """Why ``python -m flotilla.node --help`` does not work here, or None when it does."""
    try:
        done = subprocess.run([*NODE_COMMAND, "--help"], capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL, env=_node_env(None))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`{' '.join(NODE_COMMAND)} --help` could not run: {exc}"
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        detail = lines[-1] if lines else "no output"
        return (f"the node server is not runnable yet: `python -m flotilla.node --help` "
                f"exited {done.returncode}: {detail}")
    return None


def generated_admin_token(data_dir: Path | str) -> str | None:
    """The token a member started without ``--admin-token`` generated in its data dir (None
    before its first start)."""
    try:
        return (Path(data_dir) / GENERATED_TOKEN_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def _flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` in ``args`` (``--flag V`` or ``--flag=V``; the last one wins)."""
    found = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            found = args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg[len(flag) + 1:]
    return found


def format_initial_cluster(view: Mapping[str, str]) -> str:
    """``--initial-cluster`` text: ``n1=http://127.0.0.1:7001,n2=...`` in the given order."""
    return ",".join(f"{name}={url}" for name, url in view.items())


def _node_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    """The parent's environment without FLOTILLA_* (a developer's shell must not leak flags
    into a test), unbuffered output so log tails are current, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_")}
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class NodeProcess:
    """One ``flotilla node`` process; restartable with exactly the flags it first ran with.

    With ``tls`` (a ``tests.harness.certs.MemberTLS``) it runs with TLS on both ports and its
    URLs are ``https://``. It runs with ``--admin-token admin_token`` (default: the harness's
    ``ADMIN_TOKEN``) unless ``extra_args`` or ``env`` give one (that one is used) or
    ``admin_token`` is None (no flag: the member generates one in its data dir)."""

    def __init__(
        self,
        name: str,
        data_dir: Path | str,
        peer_addr: str,
        client_addr: str,
        *,
        initial_cluster: Mapping[str, str] | str | None = None,
        initial_cluster_state: str = "new",
        cluster_id: str = "flotilla-test",
        election_timeout_ms: int = 1000,
        heartbeat_ms: int = 100,
        advertise_peer: str | None = None,
        advertise_client: str | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_path: Path | str | None = None,
        command: Sequence[str] = NODE_COMMAND,
        start: bool = True,
        tls: MemberTLS | None = None,
        admin_token: str | None = ADMIN_TOKEN,
    ) -> None:
        if initial_cluster_state not in ("new", "existing"):
            raise ValueError(f"initial_cluster_state must be new or existing, "
                             f"not {initial_cluster_state!r}")
        self.name = name
        self.data_dir = Path(data_dir)
        self.peer_addr = peer_addr
        self.client_addr = client_addr
        self.tls = tls
        self._ssl_context: ssl.SSLContext | None = None
        if initial_cluster is None:
            initial_cluster = {name: self.peer_url}
        self.initial_cluster = (initial_cluster if isinstance(initial_cluster, str)
                                else format_initial_cluster(initial_cluster))
        self.initial_cluster_state = initial_cluster_state
        self.cluster_id = cluster_id
        self.election_timeout_ms = election_timeout_ms
        self.heartbeat_ms = heartbeat_ms
        self.advertise_peer = advertise_peer
        self.advertise_client = advertise_client
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.given_admin_token = admin_token
        self.command = list(command)
        self.log_path = Path(log_path) if log_path else self.data_dir.parent / f"{name}.log"
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self.starts = 0
        self._log: IO[bytes] | None = None
        if start:
            self.start()

    def __repr__(self) -> str:
        state = ("not started" if self.proc is None else
                 f"exited {self.returncode}" if self.returncode is not None else
                 "paused" if self.paused else f"pid {self.proc.pid}")
        return f"NodeProcess({self.name!r}, {self.url}, {state})"

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"

    @property
    def url(self) -> str:
        """The client URL (``--listen-client``)."""
        return f"{self.scheme}://{self.client_addr}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://{self.peer_addr}"

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """What clients dial this member's client port with (None without TLS)."""
        if self.tls is not None and self._ssl_context is None:
            self._ssl_context = self.tls.client_context()
        return self._ssl_context

    @property
    def own_admin_token(self) -> str | None:
        """The ``--admin-token`` the test gave in ``extra_args`` or ``env`` (None: none)."""
        return (_flag_value(self.extra_args, "--admin-token")
                or self.env.get("FLOTILLA_ADMIN_TOKEN"))

    @property
    def admin_token(self) -> str | None:
        """The token this member's admin API takes: the one it is given, else the one it
        generated in its data dir (None until it has started once)."""
        return (self.own_admin_token or self.given_admin_token
                or generated_admin_token(self.data_dir))

    @property
    def argv(self) -> list[str]:
        args = [
            *self.command,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-peer", self.peer_addr,
            "--listen-client", self.client_addr,
            "--initial-cluster", self.initial_cluster,
            "--initial-cluster-state", self.initial_cluster_state,
            "--cluster-id", self.cluster_id,
            "--election-timeout-ms", str(self.election_timeout_ms),
            "--heartbeat-ms", str(self.heartbeat_ms),
        ]
        if self.given_admin_token is not None and self.own_admin_token is None:
            args += ["--admin-token", self.given_admin_token]
        if self.advertise_peer:
            args += ["--advertise-peer", self.advertise_peer]
        if self.advertise_client:
            args += ["--advertise-client", self.advertise_client]
        if self.tls is not None:
            args += self.tls.node_args()
        return args + self.extra_args

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        if self._log is None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 (kept open across restarts)
        self.starts += 1
        stamp = time.strftime("%H:%M:%S")
        self._log.write(f"--- harness: start #{self.starts} at {stamp}: "
                        f"{' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.paused = False
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            cwd=self.data_dir.parent, env=_node_env(self.env), start_new_session=True)

    def restart(self) -> None:
        """Start again with the same flags; the process must have exited (kill or terminate)."""
        if self.running:
            raise RuntimeError(f"{self.name} is still running; kill() or terminate() it first")
        self.start()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        """None while running (or paused); the exit code, or -signal, once it has exited."""
        return self.proc.poll() if self.proc else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> int:
        """SIGKILL the member (and anything it forked); returns once it is gone."""
        if self.running:
            self._signal_group(signal.SIGKILL)
        self.paused = False
        return self.wait(30)

    def stop(self) -> None:
        """SIGSTOP: the member freezes with its sockets open, like a long GC pause."""
        self._require_running("stop")
        self._signal_group(signal.SIGSTOP)
        self.paused = True
        self._wait_stopped(True)

    def cont(self) -> None:
        """SIGCONT after ``stop()``."""
        self._require_running("cont")
        self._signal_group(signal.SIGCONT)
        self.paused = False
        self._wait_stopped(False)

    def _wait_stopped(self, stopped: bool, timeout: float = 5.0) -> None:
        """Signals arrive asynchronously: return once the kernel shows the new state, so a
        test's next step really happens while the member is frozen (or running again)."""
        stat = Path(f"/proc/{self.pid}/stat")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                text = stat.read_text()
            except OSError:
                return  # gone, or no /proc here: nothing to wait for
            if (text[text.rindex(")") + 2] in "Tt") == stopped:
                return
            time.sleep(0.005)
        raise TimeoutError(f"{self.name} did not {'stop' if stopped else 'continue'} "
                           f"within {timeout}s")

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait for the exit code (0 is a clean shutdown, per the contract).

        A member that has not exited after ``timeout`` seconds is SIGKILLed and TimeoutError is
        raised with the end of its log.
        """
        if self.running:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)
            if self.paused:  # a stopped process only sees SIGTERM once it runs again
                self._signal_group(signal.SIGCONT)
                self.paused = False
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise TimeoutError(f"{self.name} did not exit within {timeout}s of SIGTERM; "
                                   f"killed it. Log tail:\n{self.log_tail(30)}") from None
        return self.wait(0)

    def wait_serving(self, timeout: float = 20.0) -> None:
        """Return once the client port answers HTTP (``GET /healthz``, any status); raise with
        the log's end if the process exits or the time runs out first."""
        deadline = time.monotonic() + timeout
        with KVClient(self.url, timeout=1.0, ssl_context=self.ssl_context) as c:
            while True:
                if not self.running:
                    raise RuntimeError(f"{self.name} exited with {self.returncode} before "
                                       f"serving; log tail:\n{self.log_tail(30)}")
                try:
                    c.request("GET", "/healthz")
                    return
                except TRANSPORT_ERRORS:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"{self.name} did not serve {self.url} within "
                                           f"{timeout}s; log tail:\n{self.log_tail(30)}"
                                           ) from None
                    time.sleep(0.05)

    def wait(self, timeout: float | None = None) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} was never started")
        return self.proc.wait(timeout)

    def close(self) -> None:
        """Kill if running and release the log file (idempotent)."""
        if self.proc is not None:
            self.kill()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> NodeProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _signal_group(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        # Only called while the process is unreaped, so its pid cannot have been reused.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def _require_running(self, what: str) -> None:
        if not self.running:
            raise RuntimeError(f"cannot {what} {self.name}: it is not running "
                               f"(exit code {self.returncode})")

    # -- diagnostics ----------------------------------------------------------------------

    def log_tail(self, n: int = 50) -> str:
        """The last ``n`` lines of the member's log (all its runs, separated by markers)."""
        if self._log is not None:
            self._log.flush()
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 256 * 1024))
                text = f.read().decode(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(text.splitlines()[-n:])

    def client(self, timeout: float = 5.0, *, with_token: bool = True) -> KVClient:
        """A client of this member that carries its admin token (``with_token=False``: one
        that sends no ``Authorization`` header of its own)."""
        return KVClient(self.url, timeout=timeout,
                        token=self.admin_token if with_token else None,
                        ssl_context=self.ssl_context)


# ---------------------------------------------------------------------------------------------
# Clusters


class LocalCluster:
    """N members on loopback, optionally with one fault proxy per ordered pair of members.

    ``nodes`` maps names (``n0``, ``n1``...) to ``NodeProcess``; with ``proxied=True``,
    ``proxy(src, dst)`` is the ``FaultProxy`` that carries src's peer traffic to dst (for
    delays and resets beyond what ``partition`` does). Use it as a context manager, or through
    the ``local_cluster`` fixture, so that processes never outlive the test.

    ``tls=True``: TLS on both ports, mutual TLS between members, certificates from ``ca`` (a
    ``TestCA`` under ``root/tls``) naming each member and the hosts it is dialled at (its own
    127.0.0.x, and 127.0.0.1 where the proxies listen); ``client_cert_auth=True`` also makes
    clients show a certificate of that CA. ``ssl_context`` is what clients dial with.

    ``admin_token``: every member's ``--admin-token`` (default ``ADMIN_TOKEN``; None: none, each
    member generates its own); ``client(name)`` carries the member's token.
    """

    def __init__(
        self,
        tmp_path: Path | str,
        size: int = 3,
        *,
        proxied: bool = False,
        election_timeout_ms: int = 1000,
        heartbeat_ms: int = 100,
        cluster_id: str | None = None,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        names: Sequence[str] | None = None,
        command: Sequence[str] = NODE_COMMAND,
        start: bool = True,
        tls: bool = False,
        client_cert_auth: bool = False,
        admin_token: str | None = ADMIN_TOKEN,
    ) -> None:
        self.root = Path(tmp_path)
        self.command = list(command)
        if client_cert_auth and not tls:
            raise ValueError("client_cert_auth needs tls=True")
        self.client_cert_auth = client_cert_auth
        self.ca = TestCA(self.root / "tls") if tls else None
        self.ssl_context: ssl.SSLContext | None = None
        if self.ca is not None:
            self.ssl_context = self.ca.client_context("test-client" if client_cert_auth
                                                      else None)
        self.proxied = proxied
        self.election_timeout_ms = election_timeout_ms
        self.heartbeat_ms = heartbeat_ms
        self.cluster_id = cluster_id or f"test-{uuid.uuid4().hex[:8]}"
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.given_admin_token = admin_token
        names = list(names) if names is not None else [f"n{i}" for i in range(size)]
        if len(names) != len(set(names)) or not names:
            raise ValueError(f"member names must be unique and not empty: {names}")
        self.nodes: dict[str, NodeProcess] = {}
        self.members: list[str] = []  # in the configuration as far as the harness knows
        self.net: ProxyNet | None = None
        self._peer_addr: dict[str, str] = {}
        self._client_addr: dict[str, str] = {}
        self._inbound: dict[str, FaultProxy] = {}  # added members: the shared (* -> name) proxy
        self._blocked: set[tuple[str, str]] = set()
        self._hosts = iter(ports.loopback_hosts(200))  # each member its own 127.0.0.x if possible
        self._ports: list[int] = []
        try:
            for name in names:
                self._allocate(name)
            self.members = list(names)
            if proxied:
                self.net = ProxyNet({n: _address(self._peer_addr[n]) for n in names}).start()
            for name in names:
                self.nodes[name] = self._node(name, "new", names)
            if start:
                self.start()
        except BaseException:
            self.stop_all()
            raise

    # -- topology -------------------------------------------------------------------------

    def _allocate(self, name: str) -> None:
        host = next(self._hosts)
        peer, client = ports.allocate_ports(2, host)
        self._ports += [peer, client]
        self._peer_addr[name] = f"{host}:{peer}"
        self._client_addr[name] = f"{host}:{client}"

    @property
    def scheme(self) -> str:
        return "https" if self.ca is not None else "http"

    def peer_url(self, name: str) -> str:
        """The member's real peer address (what it listens on)."""
        return f"{self.scheme}://{self._peer_addr[name]}"

    def dial_url(self, src: str, dst: str) -> str:
        """The URL ``src`` uses to reach ``dst``'s peer port."""
        if src == dst or self.net is None:
            return self.peer_url(dst)
        if dst in self._inbound:
            proxy = self._inbound[dst]
            return f"{self.scheme}://{proxy.host}:{proxy.port}"
        return self.net.url(src, dst, scheme=self.scheme)

    def proxy(self, src: str, dst: str) -> FaultProxy:
        """The proxy carrying what ``src`` sends to ``dst`` (shared by every sender when
        ``dst`` was added after the start)."""
        self._require_proxied("proxy")
        assert self.net is not None
        return self._inbound.get(dst) or self.net.proxy(src, dst)

    def initial_cluster_view(self, name: str, members: Iterable[str] | None = None
                             ) -> dict[str, str]:
        """``name``'s ``--initial-cluster``: every member's peer URL as ``name`` dials it."""
        return {m: self.dial_url(name, m) for m in (members or self.members)}

    def _node(self, name: str, state: str, members: Iterable[str]) -> NodeProcess:
        tls = None
        if self.ca is not None:
            host = _address(self._peer_addr[name])[0]
            tls = self.ca.member(name, [host, "127.0.0.1"],
                                 client_cert_auth=self.client_cert_auth)
        return NodeProcess(
            name, self.root / name / "data", self._peer_addr[name], self._client_addr[name],
            initial_cluster=self.initial_cluster_view(name, members),
            initial_cluster_state=state, cluster_id=self.cluster_id,
            election_timeout_ms=self.election_timeout_ms, heartbeat_ms=self.heartbeat_ms,
            extra_args=self.extra_args, env=self.env, log_path=self.root / f"{name}.log",
            command=self.command, start=False, tls=tls, admin_token=self.given_admin_token)

    def start(self) -> None:
        """Start every member that is not running (all of them, the first time)."""
        for node in self.nodes.values():
            if not node.running:
                node.start()

    # -- faults ---------------------------------------------------------------------------

    def partition(self, group_a: Iterable[str], group_b: Iterable[str]) -> None:
        """Cut peer traffic both ways between the two groups (other pairs are untouched)."""
        a, b = set(group_a), set(group_b)
        if a & b:
            raise ValueError(f"a member cannot be on both sides: {sorted(a & b)}")
        self._require_proxied("partition")
        unknown = (a | b) - set(self.nodes)
        if unknown:
            raise ValueError(f"no such members: {sorted(unknown)}")
        blocked = set(self._blocked)
        for src in a:
            for dst in b:
                blocked |= {(src, dst), (dst, src)}
        self._apply(blocked)

    def isolate(self, name: str) -> None:
        """Cut ``name`` off from every other member, both ways."""
        self.partition([name], [m for m in self.nodes if m != name])

    def heal(self) -> None:
        """Restore every pair's peer traffic."""
        self._require_proxied("heal")
        self._apply(set())

    @property
    def blocked(self) -> frozenset[tuple[str, str]]:
        """The ordered pairs (src, dst) whose peer traffic is cut now."""
        return frozenset(self._blocked)

    def _apply(self, blocked: set[tuple[str, str]]) -> None:
        """Make every proxy carry traffic exactly for the pairs not in ``blocked``.

        A shared inbound proxy (* -> dst) can only be cut for all its senders at once, so a
        partition that would split them is refused before anything changes.
        """
        inbound_cut = {}
        for dst in self._inbound:
            senders = [s for s in self.nodes if s != dst]
            cut = [s for s in senders if (s, dst) in blocked]
            if cut and len(cut) < len(senders):
                raise ValueError(
                    f"{dst} was added after the start, so all its inbound peer traffic shares "
                    f"one proxy: it can be cut off from every member (isolate({dst!r})) but "
                    f"not from {sorted(cut)} only")
            inbound_cut[dst] = bool(cut)
        assert self.net is not None
        for src in self.net.members:
            for dst in self.net.members:
                if src != dst and dst not in self._inbound:
                    _set_blocked(self.net.proxy(src, dst), (src, dst) in blocked)
        for dst, proxy in self._inbound.items():
            _set_blocked(proxy, inbound_cut[dst])
        self._blocked = set(blocked)

    def _require_proxied(self, what: str) -> None:
        if self.net is None:
            raise RuntimeError(f"{what}() needs LocalCluster(..., proxied=True)")

    # -- observation ----------------------------------------------------------------------

    @property
    def admin_token(self) -> str | None:
        """The admin token every member takes (None when they differ, as when each generated
        its own: ask ``nodes[name].admin_token``)."""
        tokens = {node.admin_token for node in self.nodes.values()}
        return tokens.pop() if len(tokens) == 1 else None

    def client(self, name: str, timeout: float = 5.0, *, with_token: bool = True) -> KVClient:
        """A client of ``name`` that carries its admin token (``with_token=False``: one that
        sends no ``Authorization`` header of its own)."""
        return KVClient(self.nodes[name].url, timeout=timeout,
                        token=self.nodes[name].admin_token if with_token else None,
                        ssl_context=self.ssl_context)

    @property
    def urls(self) -> list[str]:
        """Client URLs of every member that is running (paused ones included)."""
        return [n.url for n in self.nodes.values() if n.running]

    def status(self, name: str, timeout: float = 2.0) -> dict[str, Any]:
        """``GET /v1/status`` of one member."""
        with self.client(name, timeout=timeout) as c:
            return c.status()

    def wait_leader(self, timeout: float = 30.0, among: Iterable[str] | None = None) -> str:
        """The leader that every running, unpaused member of ``among`` (default: all members in
        the configuration) names, with the leader itself reporting role leader in that term.

        Polls ``GET /v1/status``; raises TimeoutError with what each member said last.
        """
        deadline = time.monotonic() + timeout
        said: dict[str, str] = {}
        while True:
            names = [m for m in (among or self.members)
                     if m in self.nodes and self.nodes[m].running and not self.nodes[m].paused]
            docs: dict[str, dict[str, Any]] = {}
            for m in names:
                try:
                    docs[m] = self.status(m, timeout=1.0)
                    said[m] = (f"role={docs[m].get('role')} term={docs[m].get('term')} "
                               f"leader={docs[m].get('leader')}")
                except (*TRANSPORT_ERRORS, RuntimeError, ValueError) as exc:
                    said[m] = f"{type(exc).__name__}: {exc}"
            leader = _agreed_leader(docs) if len(docs) == len(names) and names else None
            if leader is not None:
                return leader
            if time.monotonic() > deadline:
                lines = "\n".join(f"  {m}: {s}" for m, s in said.items())
                raise TimeoutError(f"no leader agreed by {names} within {timeout}s; last "
                                   f"answers:\n{lines}\n{self.log_tails(20)}")
            time.sleep(0.05)

    def log_tails(self, n: int = 20) -> str:
        return "\n".join(f"--- {name} ({node.log_path}):\n{node.log_tail(n)}"
                         for name, node in self.nodes.items())

    # -- membership -----------------------------------------------------------------------

    def add_member(self, name: str, timeout: float = 60.0) -> NodeProcess:
        """Start ``name`` empty (``--initial-cluster-state existing``) and, once it serves, add
        it as a learner with ``POST /v1/members`` to the leader; returns when that configuration
        is committed. Promoting it to voter is the test's business (``PUT /v1/config``)."""
        if name in self.nodes:
            raise ValueError(f"{name} already exists")
        self._allocate(name)
        if self.net is not None:
            # Its outbound pairs come from the net (which also makes inbound pairs that nobody
            # dials: the others learn one address for it, from the log).
            self.net.add_member(name, _address(self._peer_addr[name]))
            self._inbound[name] = FaultProxy(_address(self._peer_addr[name]),
                                             name=f"*->{name}").start()
            self._apply(self._blocked)
        node = self.nodes[name] = self._node(name, "existing", [*self.members, name])
        node.start()
        deadline = time.monotonic() + timeout
        node.wait_serving(timeout)
        announced = self.dial_url(self.members[0], name) if self.proxied else node.peer_url
        last = "no attempt"
        while time.monotonic() < deadline:
            try:
                leader = self.wait_leader(max(1.0, deadline - time.monotonic()))
                with self.client(leader, timeout=max(1.0, deadline - time.monotonic())) as c:
                    resp = c.add_member(name, announced, node.url)
            except (*TRANSPORT_ERRORS, TimeoutError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status == 200 or (resp.status == 409 and self._in_config(name)):
                    self.members.append(name)
                    return node
                last = f"{resp.status} {resp.body[:300]!r}"
            time.sleep(0.2)
        raise TimeoutError(f"could not add {name} within {timeout}s; last: {last}\n"
                           f"{self.log_tails(20)}")

    def _in_config(self, name: str) -> bool:
        try:
            config = self.status(self.wait_leader(5)).get("config", {})
        except (*TRANSPORT_ERRORS, RuntimeError, TimeoutError):
            return False
        return name in (config.get("voters") or []) or name in (config.get("learners") or [])

    # -- teardown -------------------------------------------------------------------------

    def stop_all(self) -> None:
        """Kill every member and close every proxy; safe to call twice and after failures."""
        errors: list[BaseException] = []
        for node in self.nodes.values():
            try:
                node.close()
            except Exception as exc:  # keep tearing down the rest
                errors.append(exc)
        for proxies in [*self._inbound.values(), self.net]:
            try:
                if proxies is not None:
                    proxies.stop()
            except Exception as exc:
                errors.append(exc)
        if not any(node.running for node in self.nodes.values()):
            for port in self._ports:
                ports.release_port(port)
            self._ports = []
        if errors:
            raise errors[0]

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()


def _agreed_leader(docs: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The one leader all status documents name, if it is among them and says so itself."""
    leaders = {d.get("leader") for d in docs.values()}
    if len(leaders) != 1:
        return None
    leader = leaders.pop()
    if not leader or leader not in docs or docs[leader].get("role") != "leader":
        return None
    term = docs[leader].get("term")
    return leader if all(d.get("term") == term for d in docs.values()) else None


# ---------------------------------------------------------------------------------------------
# Helpers


def _address(host_port: str) -> tuple[str, int]:
    host, port = host_port.rsplit(":", 1)
    return host, int(port)


def _set_blocked(proxy: FaultProxy, blocked: bool) -> None:
    if proxy.blocked != blocked:
        if blocked:
            proxy.block()
        else:
            proxy.unblock()
