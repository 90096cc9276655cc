"""Local clusters: N ``flotilla node`` processes on 127.0.0.1, described by ``DIR/cluster.json``.

What ``flotilla up/status/down`` and the demo stand on. A cluster directory holds::

    DIR/cluster.json   the state file: cluster id, timing, archive, and for every member its
                       name, ports, data dir, log file, pid and the exact node flags it first
                       ran with (a member always restarts with those, as the contract asks)
    DIR/n1/            n1's data dir (log, hard state, snapshots)
    DIR/n1.log         n1's output, appended across restarts with a marker line per start
    DIR/archive/       the default archive (``file://DIR/archive``)
    DIR/admin-token    the admin token (0600) members get through their environment
    DIR/tls/           with ``up --tls`` (0700): the cluster's CA (``ca.crt``, ``ca.key``) and
                       every member's certificate and key (``n1.crt``, ``n1.key``), all 0600

Members run detached (their own session), so they outlive the command that started them; the
state file is how a later command finds them again. A pid is only believed while
``/proc/<pid>/cmdline`` still names the member's data dir, so a reused pid is never mistaken
for a member (and never signalled).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flotilla.client import Client, FlotillaError
from flotilla.progress import Bar, read_restore_progress

__all__ = [
    "CA_CERT",
    "DEFAULT_DIR",
    "SIGNING_KEY_FLAG",
    "STATE_FILE",
    "STATE_MACHINE_FLAG",
    "TLS_DIR",
    "TOKEN_FILE",
    "AlreadyRunning",
    "BadOption",
    "LocalCluster",
    "LocalClusterError",
    "Member",
    "NoCluster",
    "OutsideArchive",
    "RestoreTarget",
    "archive_url",
    "ca_file",
    "default_archive_url",
    "forget_member_certificate",
    "issue_member_certificate",
    "locked",
    "node_accepts_flag",
    "read_token",
    "tls_args",
    "up",
]

DEFAULT_DIR = ".flotilla"
STATE_FILE = "cluster.json"
#: The admin token `up` generates for a new cluster, mode 0600; members get it through their
#: environment (never on a command line or in the state file) and every command sends it.
TOKEN_FILE = "admin-token"
#: Members of a cluster all sign and verify archive manifests with the same key files.
SIGNING_KEY_FLAG = "--archive-signing-key-file"
#: Every member of a cluster runs the same state machine (`module:Class`; none: the built-in).
STATE_MACHINE_FLAG = "--state-machine"
#: `up --tls`: the cluster's own CA and one certificate per member, under DIR/tls/.
TLS_DIR = "tls"
CA_CERT, CA_KEY = "ca.crt", "ca.key"
STATE_VERSION = 1
HOST = "127.0.0.1"
NODE_MODULE = "flotilla.node"


class LocalClusterError(Exception):
    """Something the user must act on; the message says what."""


class NoCluster(LocalClusterError):
    pass


class AlreadyRunning(LocalClusterError):
    pass


class BadOption(LocalClusterError):
    """An option the cluster cannot be started with (a usage error: exit 2)."""


class OutsideArchive(LocalClusterError):
    """The restore target (`--restore-index`, `--restore-time`) is not in the archive: exit 4,
    before any member starts; the message names what the archive can restore."""


@dataclass(frozen=True)
class RestoreTarget:
    """What a new cluster restores, as checked against the archive before its members start
    (every member then settles the same index: it is a pure function of the archived log)."""

    url: str
    cluster_id: str  # the old cluster in the archive
    index: int  # the index restored
    requested_index: int | None = None  # --restore-index
    ts_ms: int | None = None  # --restore-time, ms since the epoch

    def describe(self) -> str:
        from flotilla.node.archive import format_ms

        source = f"cluster {self.cluster_id} from {self.url}"
        if self.ts_ms is not None:
            return (f"the state at {format_ms(self.ts_ms)}: index {self.index}, the last entry "
                    f"stamped at or before it, of {source}")
        if self.requested_index is not None:
            return f"the state at index {self.index} of {source}"
        return f"the newest archived state, index {self.index}, of {source}"


class _BindFailed(LocalClusterError):
    """A member of a brand-new cluster could not listen: its ports were taken meanwhile."""


@dataclass
class Member:
    name: str
    peer_port: int
    client_port: int
    data_dir: str  # absolute
    log_file: str  # absolute
    # Flags after `python -m flotilla.node`, as first run; once the cluster has served,
    # `--initial-cluster-state` is `existing` (see LocalCluster.mark_bootstrapped).
    args: list[str]
    pid: int | None = None
    tls: bool = False  # TLS on both ports (`up --tls`): its URLs are https://

    def flag(self, name: str) -> str | None:
        """The value this member runs with for flag `name`, or None without it."""
        return self.args[self.args.index(name) + 1] if name in self.args else None

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"{self.scheme}://{HOST}:{self.peer_port}"


@dataclass
class ClusterState:
    cluster_id: str
    election_timeout_ms: int
    heartbeat_ms: int
    archive: str | None
    # Whether `archive` reached the members as --archive (a node without that flag gets none).
    archive_passed: bool
    members: list[Member]
    created: str = ""
    version: int = STATE_VERSION
    notes: list[str] = field(default_factory=list)
    # The membership planner's record (flotilla.operator.planner.Record as JSON): member
    # uids, removed uids, catch-up clocks. Written by `flotilla scale`.
    record: dict[str, Any] = field(default_factory=dict)
    # `up --tls`: every member speaks TLS on both ports with a certificate from DIR/tls/.
    tls: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ClusterState:
        if doc.get("version") != STATE_VERSION:
            raise LocalClusterError(f"state file version {doc.get('version')!r} is not "
                                    f"{STATE_VERSION}: written by another flotilla version")
        members = [Member(**m) for m in doc["members"]]
        return cls(**{**doc, "members": members})


def default_archive_url(root: Path) -> str:
    """The archive a local cluster ships to unless told otherwise: ``file://DIR/archive``."""
    return (root.resolve() / "archive").as_uri()


def archive_url(text: str, option: str = "--archive") -> str:
    """`normalize_archive_url`, now, since members run in the cluster directory rather than
    where the user typed a relative path; a bad URL is a BadOption naming `option`."""
    from flotilla.node.archive.urls import normalize_archive_url

    try:
        return normalize_archive_url(text)
    except ValueError as exc:
        raise BadOption(f"{option}: {exc}") from None


def node_accepts_flag(flag: str) -> bool:
    """Whether this version's ``flotilla node`` has ``flag`` (features land one by one)."""
    try:
        from flotilla.node.config import FLAGS
    except ImportError:
        return False
    return any(name == flag for name, _ in FLAGS)


# --- processes ------------------------------------------------------------------------------


def _node_env(token: str | None) -> dict[str, str]:
    """The caller's environment without FLOTILLA_*: a member's flags are all on its command
    line (and in the state file), so a restart from another shell behaves the same. The admin
    token is the one exception: it comes from the token file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_")}
    env["PYTHONUNBUFFERED"] = "1"
    if token is not None:
        env["FLOTILLA_ADMIN_TOKEN"] = token
    return env


def read_token(root: Path) -> str | None:
    """The cluster's admin token, or None for a cluster made before `up` generated one."""
    try:
        return (root / TOKEN_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def _write_token(root: Path) -> None:
    from flotilla.node.config import new_admin_token  # the node's config, loaded when used

    path = root / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(new_admin_token() + "\n")


# --- TLS (`up --tls`) ------------------------------------------------------------------------


def ca_file(root: Path | str) -> Path:
    """The CA certificate of a TLS local cluster in ``root``: what clients verify members
    against (``--cacert``)."""
    return Path(root).resolve() / TLS_DIR / CA_CERT


def _tls_dir(root: Path) -> Path:
    path = root / TLS_DIR
    path.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)  # mkdir's mode goes through the umask; an old dir keeps its own
    return path


def _make_ca(root: Path, cluster_id: str) -> None:
    """The cluster's own CA, DIR/tls/ca.crt and ca.key (0600): it signs every member's
    certificate, now and when `flotilla scale` adds members."""
    from flotilla.node.tls import make_ca

    tls_dir = _tls_dir(root)
    make_ca(f"flotilla local CA {cluster_id}").write(tls_dir / CA_CERT, tls_dir / CA_KEY)


def issue_member_certificate(root: Path | str, name: str) -> tuple[Path, Path]:
    """Sign ``name``'s certificate with the cluster's CA into DIR/tls/NAME.crt and NAME.key
    (0600), replacing any older one. It names the member (CN and a DNS SAN ``name``: what its
    peers check) and the loopback host it listens on (IP SAN 127.0.0.1, DNS SAN localhost:
    what clients and peers dial). Returns (certificate, key)."""
    from flotilla.node.tls import Issued, issue

    tls_dir = _tls_dir(Path(root))
    try:
        ca = Issued((tls_dir / CA_CERT).read_bytes(), (tls_dir / CA_KEY).read_bytes())
        issued = issue(ca, name, [HOST, "localhost"])
    except FileNotFoundError as exc:
        raise LocalClusterError(f"cannot issue a certificate for {name}: {exc.filename} is "
                                "missing (the cluster's CA, made by `flotilla up --tls`)"
                                ) from None
    except (ValueError, TypeError) as exc:
        raise LocalClusterError(f"cannot issue a certificate for {name}: {tls_dir / CA_CERT} "
                                f"and {tls_dir / CA_KEY} are not a PEM CA certificate and its "
                                f"key ({exc})") from None
    cert, key = tls_dir / f"{name}.crt", tls_dir / f"{name}.key"
    issued.write(cert, key)
    return cert, key


def forget_member_certificate(root: Path | str, name: str) -> None:
    """Delete a removed member's certificate and key."""
    for suffix in (".crt", ".key"):
        (Path(root) / TLS_DIR / f"{name}{suffix}").unlink(missing_ok=True)


def tls_args(root: Path | str, name: str) -> list[str]:
    """The node flags of a TLS member: its certificate on the client port, and on the peer port
    with mutual TLS against the cluster's CA (the peers' certificates must name them)."""
    tls_dir = Path(root) / TLS_DIR
    cert, key = str(tls_dir / f"{name}.crt"), str(tls_dir / f"{name}.key")
    return ["--cert-file", cert, "--key-file", key,
            "--peer-cert-file", cert, "--peer-key-file", key,
            "--peer-trusted-ca-file", str(tls_dir / CA_CERT)]


def _proc_state(pid: int) -> str | None:
    """The kernel's one-letter process state, or None without /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return "gone"
    except OSError:
        return None
    return text[text.rindex(")") + 2]


def pid_is_member(pid: int | None, data_dir: str) -> bool:
    """Is ``pid`` a live ``flotilla node`` process serving ``data_dir``?"""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process: the pid was reused
    state = _proc_state(pid)
    if state == "gone" or state == "Z":
        return False
    if state is None:
        return True  # no /proc (macOS): the pid's existence is all we can know
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return data_dir.encode() in argv


def _ports_free(ports: Iterable[int]) -> bool:
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                return False
    return True


def _port_range() -> tuple[int, int]:
    """Ports outside the kernel's ephemeral range, which it hands out as the source ports of
    outgoing connections (a member must not find its port taken by some client). Above that
    range when there is room: test harnesses allocate below it, and the two must not race."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 49152, 65535
    if 65535 - high >= 1000:
        return high + 1, 65535
    if low > 12000:
        return max(10000, low - 12768), low - 1
    return 20000, 29999


def free_ports(count: int, rng: random.Random | None = None) -> list[int]:
    """``count`` distinct ports that can be bound on 127.0.0.1 right now."""
    rng = rng or random.Random()
    low, high = _port_range()
    chosen: list[int] = []
    for _ in range(2000):
        port = rng.randint(low, high)
        if port not in chosen and _ports_free([port]):
            chosen.append(port)
            if len(chosen) == count:
                return chosen
    raise LocalClusterError(f"could not find {count} free ports in {low}-{high} on {HOST}")


# --- the cluster ----------------------------------------------------------------------------


class LocalCluster:
    """A local cluster recorded in ``root/cluster.json``.

    Member processes this object started are its children (kept to read exit codes and reap
    them); members found through the state file are signalled by pid.
    """

    def __init__(self, root: Path | str, state: ClusterState) -> None:
        # Absolute from here on: members are started with the cluster dir as their working
        # directory, and archive URLs are built from it, so a relative path (the default
        # `.flotilla`) would mean two different places.
        self.root = Path(root).resolve()
        self.state = state
        for m in state.members:  # state files written before paths were made absolute
            m.data_dir = str(self.root / m.data_dir)
            m.log_file = str(self.root / m.log_file)
        self._procs: dict[str, subprocess.Popen] = {}
        #: What `up` restored this cluster from, when it has just done so.
        self.restored: RestoreTarget | None = None

    # --- the state file -------------------------------------------------------------------

    @staticmethod
    def state_path(root: Path | str) -> Path:
        return Path(root) / STATE_FILE

    @classmethod
    def exists(cls, root: Path | str) -> bool:
        return cls.state_path(root).exists()

    @classmethod
    def load(cls, root: Path | str) -> LocalCluster:
        path = cls.state_path(root)
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise NoCluster(f"no cluster in {root} ({path} does not exist); start one with "
                            f"`flotilla up --dir {root}`") from None
        except ValueError as exc:
            raise LocalClusterError(f"{path} is not a cluster state file: {exc}") from None
        try:
            return cls(root, ClusterState.from_json(doc))
        except (KeyError, TypeError) as exc:
            raise LocalClusterError(f"{path} is not a cluster state file: {exc}") from None

    @classmethod
    def create(
        cls,
        root: Path | str,
        replicas: int,
        *,
        election_timeout_ms: int = 1000,
        heartbeat_ms: int = 100,
        archive: str | None = None,
        base_port: int | None = None,
        cluster_id: str | None = None,
        restore_from: str | None = None,
        restore_index: int | None = None,
        restore_time: int | None = None,
        restore_cluster_id: str | None = None,
        tls: bool = False,
        signing_key_file: str | None = None,
        state_machine: str | None = None,
    ) -> LocalCluster:
        """Write the state file of a new cluster (nothing is started). ``archive`` None means
        the default archive under ``root``; ``base_port`` pins ports (peers at base+i, clients
        at base+10+i) instead of picking free ones. ``restore_time`` is in ms since the
        epoch. ``tls`` makes the cluster's CA and every member's certificate under DIR/tls/
        and runs the members with TLS on both ports. ``signing_key_file`` (absolute paths, see
        `signing_keys`) goes to every member, and so does ``state_machine`` (`module:Class`,
        importable by the members)."""
        if not 1 <= replicas <= (10 if base_port else 99):
            raise LocalClusterError(f"--replicas must be between 1 and "
                                    f"{10 if base_port else 99}, not {replicas}")
        root = Path(root).resolve()
        if archive is not None:
            archive = archive_url(archive)
        if restore_from is not None:
            restore_from = archive_url(restore_from, "--restore-from")
        if tls and not node_accepts_flag("--peer-cert-file"):
            raise BadOption("--tls: this flotilla node has no TLS flags (--cert-file, "
                            "--peer-cert-file)")
        root.mkdir(parents=True, exist_ok=True)
        names = [f"n{i + 1}" for i in range(replicas)]
        if base_port:
            peer_ports = [base_port + i for i in range(replicas)]
            client_ports = [base_port + 10 + i for i in range(replicas)]
        else:
            ports = free_ports(2 * replicas)
            peer_ports, client_ports = ports[:replicas], ports[replicas:]
        notes: list[str] = []
        if archive is None:
            archive = default_archive_url(root)
            (root / "archive").mkdir(exist_ok=True)
        archive_passed = node_accepts_flag("--archive")
        if not archive_passed:
            notes.append(f"this flotilla node has no --archive flag yet: {archive} is recorded "
                         "here and will be passed once it has")
        cluster_id = cluster_id or f"local-{uuid.uuid4().hex[:8]}"
        scheme = "https" if tls else "http"
        initial = ",".join(f"{n}={scheme}://{HOST}:{p}" for n, p in zip(names, peer_ports,
                                                                         strict=True))
        if tls:
            _make_ca(root, cluster_id)
        members = []
        for name, peer, client in zip(names, peer_ports, client_ports, strict=True):
            data_dir = str(root / name)
            args = [
                "--name", name,
                "--data-dir", data_dir,
                "--listen-peer", f"{HOST}:{peer}",
                "--listen-client", f"{HOST}:{client}",
                "--initial-cluster", initial,
                "--initial-cluster-state", "new",
                "--cluster-id", cluster_id,
                "--election-timeout-ms", str(election_timeout_ms),
                "--heartbeat-ms", str(heartbeat_ms),
            ]
            if archive_passed:
                args += ["--archive", archive]
            if tls:
                issue_member_certificate(root, name)
                args += tls_args(root, name)
            if signing_key_file:
                args += [SIGNING_KEY_FLAG, signing_key_file]
            if state_machine:
                args += [STATE_MACHINE_FLAG, state_machine]
            if restore_from:  # only read on the first start, when the data dir is empty
                args += ["--restore-from", restore_from]
                if restore_cluster_id is not None:
                    args += ["--restore-cluster-id", restore_cluster_id]
                if restore_index is not None:
                    args += ["--restore-index", str(restore_index)]
                if restore_time is not None:
                    from flotilla.node.archive import format_ms

                    args += ["--restore-time", format_ms(restore_time)]
            members.append(Member(name, peer, client, data_dir, str(root / f"{name}.log"),
                                  args, tls=tls))
        state = ClusterState(
            cluster_id=cluster_id, election_timeout_ms=election_timeout_ms,
            heartbeat_ms=heartbeat_ms, archive=archive, archive_passed=archive_passed,
            members=members, created=time.strftime("%Y-%m-%dT%H:%M:%S%z"), notes=notes,
            tls=tls)
        if node_accepts_flag("--admin-token"):
            _write_token(root)
        cluster = cls(root, state)
        cluster.save()
        return cluster

    def save(self) -> None:
        """Write the state file atomically (a reader never sees half of it)."""
        path = self.state_path(self.root)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.state.to_json(), indent=2) + "\n")
        os.replace(tmp, path)

    def renew_certificates(self, names: Iterable[str], within_days: int = 30) -> list[str]:
        """In a TLS cluster, issue a new certificate from its CA for each member of ``names``
        whose certificate is missing or expires within ``within_days`` (member certificates
        last a year; a cluster can stay stopped longer). A member reads its certificate when
        it starts, so renew only members about to start. Returns the names renewed."""
        if not self.state.tls:
            return []
        from flotilla.node.tls import expires

        soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=within_days)
        renewed = []
        for name in names:
            try:
                fresh = expires((self.root / TLS_DIR / f"{name}.crt").read_bytes()) > soon
            except (OSError, ValueError):
                fresh = False
            if not fresh:
                issue_member_certificate(self.root, name)
                renewed.append(name)
        return renewed

    def mark_bootstrapped(self) -> None:
        """Turn every member's `--initial-cluster-state` to `existing`, as the operator turns
        its pod template once the cluster has served. The flag only matters on an empty data
        dir, and after bootstrap an empty data dir is a lost one: that member must wait to be
        added back as a learner, never found a second cluster with the first configuration."""
        changed = False
        for m in self.members:
            if "--initial-cluster-state" in m.args:
                at = m.args.index("--initial-cluster-state") + 1
                if m.args[at] != "existing":
                    m.args[at] = "existing"
                    changed = True
        if changed:
            self.save()

    # --- members --------------------------------------------------------------------------

    @property
    def members(self) -> list[Member]:
        return self.state.members

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.members]

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    def member(self, name: str) -> Member:
        for m in self.members:
            if m.name == name:
                return m
        raise LocalClusterError(f"no member {name!r} in {self.root} (members: "
                                f"{', '.join(self.names)})")

    def is_alive(self, name: str) -> bool:
        member = self.member(name)
        proc = self._procs.get(name)
        if proc is not None and proc.pid == member.pid:
            return proc.poll() is None
        return pid_is_member(member.pid, member.data_dir)

    def alive(self) -> list[str]:
        return [m.name for m in self.members if self.is_alive(m.name)]

    def url(self, name: str) -> str:
        return self.member(name).client_url

    def start(self, names: Iterable[str] | None = None) -> list[str]:
        """Start the given members (default: all) that are not running, with their original
        flags; returns the names started. Does not wait for them."""
        started = []
        for name in (list(names) if names is not None else self.names):
            if not self.is_alive(name):
                self._spawn(self.member(name))
                started.append(name)
        self.save()
        return started

    def restart(self, name: str) -> None:
        """Start a member that is down (killed or stopped) on its old data dir."""
        if self.is_alive(name):
            raise LocalClusterError(f"{name} is still running (pid {self.member(name).pid})")
        self.start([name])

    def _spawn(self, member: Member) -> None:
        argv = [sys.executable, "-m", NODE_MODULE, *member.args]
        with open(member.log_file, "ab") as log:
            log.write(f"--- flotilla: start at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                      f"{' '.join(argv)}\n".encode())
            log.flush()
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=self.root,
                                    env=_node_env(read_token(self.root)),
                                    start_new_session=True)
        self._procs[member.name] = proc
        member.pid = proc.pid

    def kill(self, name: str) -> None:
        """``kill -9`` the member (and anything it forked); returns once it is gone."""
        member = self.member(name)
        if self.is_alive(name) and member.pid:
            _signal_group(member.pid, signal.SIGKILL)
            self._wait_gone([name], 10)
        self._reap(name)
        member.pid = None
        self.save()

    def stop(self, timeout: float = 15.0, names: Iterable[str] | None = None) -> dict[str, str]:
        """SIGTERM every running member (or those in ``names``; a leader hands over first),
        SIGKILL whoever has not exited after ``timeout`` seconds. Returns what happened to
        each of them."""
        report: dict[str, str] = {}
        chosen = [self.member(n) for n in names] if names is not None else self.members
        running = [m.name for m in chosen if self.is_alive(m.name)]
        for m in chosen:
            if m.name not in running:
                report[m.name] = "was not running"
                m.pid = None
        for name in running:
            pid = self.member(name).pid
            if pid:  # never 0 or None: os.kill(0, ...) would signal our own process group
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        began = time.monotonic()
        left = self._wait_gone(running, timeout)
        for name in running:
            if name in left:
                _signal_group(self.member(name).pid or 0, signal.SIGKILL)
                report[name] = f"did not exit within {timeout:g}s of SIGTERM: killed"
            else:
                code = self._reap(name)
                took = time.monotonic() - began
                report[name] = (f"stopped (exit {code})" if code is not None
                                else "stopped") + f" after {took:.1f}s"
        if left:
            self._wait_gone(left, 5)
        for name in running:
            self._reap(name)
            self.member(name).pid = None
        self.save()
        return {m.name: report[m.name] for m in chosen}

    def _wait_gone(self, names: Iterable[str], timeout: float) -> set[str]:
        left = set(names)
        deadline = time.monotonic() + timeout
        while left and time.monotonic() < deadline:
            left = {n for n in left if self.is_alive(n)}
            if left:
                time.sleep(0.05)
        return left

    def _reap(self, name: str) -> int | None:
        proc = self._procs.pop(name, None)
        if proc is None:
            return None
        try:
            return proc.wait(5)
        except subprocess.TimeoutExpired:
            return None

    # --- observing ------------------------------------------------------------------------

    @property
    def token(self) -> str | None:
        return read_token(self.root)

    @property
    def ca_file(self) -> str | None:
        """The CA that signed the members' certificates (DIR/tls/ca.crt), for a TLS cluster."""
        return str(ca_file(self.root)) if self.state.tls else None

    def client(self, endpoints: Iterable[str] | str | None = None, **options: Any) -> Client:
        """A client for ``endpoints`` (default: every member's), with the admin token and, for
        a TLS cluster, the cluster's CA (options as for ``Client``)."""
        return Client(self.endpoints if endpoints is None else endpoints,
                      **{"token": self.token, "ca_file": self.ca_file, **options})

    def member_status(self, name: str, timeout: float = 1.0) -> dict[str, Any] | None:
        """``name``'s own ``/v1/status``, or None when it does not answer."""
        try:
            with self.client(self.url(name), timeout=timeout, retries=0) as c:
                return c.status(self.url(name))
        except (FlotillaError, ValueError):
            return None

    def leader(self, timeout: float = 15.0) -> str:
        """The member that says it leads (polling until one does)."""
        deadline = time.monotonic() + timeout
        while True:
            for name in self.alive():
                doc = self.member_status(name, timeout=0.5)
                if doc and doc.get("role") == "leader":
                    return name
            if time.monotonic() > deadline:
                raise LocalClusterError(f"no leader within {timeout:g}s; see the member logs "
                                        f"in {self.root}")
            time.sleep(0.05)

    def wait_ready(self, timeout: float = 60.0, require: Sequence[str] = (),
                   on_wait: Callable[[], None] | None = None) -> str:
        """Return the leader's name once a leader serves a linearizable read and every member
        of ``require`` answers on its own port (a majority can serve while one member is still
        failing to start). Raises when time runs out, or when a member of ``require`` exits
        first (with its last word)."""
        deadline = time.monotonic() + timeout
        last = "no attempt"
        waiting = list(require)
        with self.client(timeout=2.0) as client:
            while True:
                for name in waiting:
                    if not self.is_alive(name):
                        raise self._exited(name)
                if on_wait is not None:
                    on_wait()
                waiting = [n for n in waiting if self.member_status(n, timeout=0.5) is None]
                try:
                    self._linearizable_read(client)
                    leader = client.status()["name"]
                    if not waiting:
                        return leader
                    last = f"{', '.join(waiting)} not answering yet"
                except FlotillaError as exc:
                    last = str(exc)
                if time.monotonic() > deadline:
                    raise LocalClusterError(
                        f"no leader served a read within {timeout:g}s (last: {last}); see the "
                        f"member logs in {self.root}")
                time.sleep(0.1)

    def _linearizable_read(self, client: Client) -> None:
        """One linearizable read of the cluster's machine: a key listing for the built-in
        one, a query for a user's (one it refuses, 400 bad_query, was answered after the
        read barrier all the same)."""
        if not self.members or self.members[0].flag(STATE_MACHINE_FLAG) is None:
            client.list(limit=1)
            return
        try:
            client.query(None)
        except FlotillaError as exc:
            if exc.code != "bad_query":
                raise

    def exit_code(self, name: str) -> int | None:
        """How `name` last exited, if this object started it and it has exited."""
        proc = self._procs.get(name)
        return proc.poll() if proc is not None else None

    def _exited(self, name: str) -> LocalClusterError:
        code = self.exit_code(name)
        tail = self.log_tail(name, 15)
        this_run = tail.rpartition("--- flotilla: start at")[2]
        cls = _BindFailed if "cannot listen" in this_run else LocalClusterError
        # One line: the member's own last word (a fatal error is its last line) and where the
        # rest of its log is.
        lines = [line for line in this_run.splitlines()[1:] if line.strip()]
        why = next((line for line in reversed(lines) if line.startswith("flotilla node:")),
                   lines[-1] if lines else "no output")
        return cls(f"{name} exited{'' if code is None else f' with {code}'} while starting: "
                   f"{why.removeprefix('flotilla node: ')} (its log: "
                   f"{self.member(name).log_file})")

    def log_tail(self, name: str, lines: int = 20) -> str:
        try:
            with open(self.member(name).log_file, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 64 * 1024))
                text = f.read().decode(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def _signal_group(pid: int, sig: signal.Signals) -> None:
    """Signal the member's process group (it leads its own session), so a child it forked
    goes with it; fall back to the pid alone."""
    if pid <= 0:
        return
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
            return
    except (ProcessLookupError, PermissionError):
        pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


@contextlib.contextmanager
def locked(root: Path | str) -> Iterator[None]:
    """Hold ``root``'s lock file: two `flotilla up` (or up and down) in one directory at the
    same time would each start members, or stop what the other starts."""
    root = Path(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / ".lock", "a+b")  # noqa: SIM115 (closed below)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if root.exists() and not root.is_dir():
            reason = "it is a file, not a directory"
        raise BadOption(f"cannot use {root} as the cluster directory: {reason}; "
                        "pass --dir a directory (it is created when missing)") from None
    with lock as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LocalClusterError(f"another flotilla command is starting or stopping the "
                                    f"cluster in {root}; wait for it to finish") from None
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def up(
    root: Path | str,
    replicas: int = 3,
    *,
    election_timeout_ms: int = 1000,
    heartbeat_ms: int = 100,
    archive: str | None = None,
    base_port: int | None = None,
    timeout: float = 60.0,
    say: Callable[[str], None] = lambda _text: None,
    restore_from: str | None = None,
    restore_index: int | None = None,
    restore_time: int | None = None,
    restore_cluster_id: str | None = None,
    tls: bool = False,
    signing_key_file: str | None = None,
    state_machine: str | None = None,
) -> tuple[LocalCluster, str]:
    """Start the cluster in ``root`` (a new one, or the stopped one recorded there) and return
    it with its leader's name once a leader serves a linearizable read. A new cluster with
    ``tls`` gets its own CA and member certificates under DIR/tls/ and TLS on both ports.

    Raises ``AlreadyRunning`` when members recorded in ``root`` are alive. A stopped cluster is
    resumed exactly as it was first started; options that differ are reported through ``say``.
    A new cluster restored from an archive (``restore_from``, at ``restore_index`` or at
    ``restore_time``, ms since the epoch) has its target checked before any member starts:
    ``OutsideArchive`` when the archive cannot give it. ``restore_cluster_id`` picks the
    archived cluster when the archive holds several. ``cluster.restored`` says what it
    restored. ``signing_key_file`` (`--archive-signing-key-file`, else its environment
    variable) signs and verifies archive manifests, the restore's included.
    ``state_machine`` (`module:Class`) is the members' `--state-machine`; a spec the members
    could not load is BadOption before any of them starts.
    """
    if restore_index is not None and restore_time is not None:
        raise BadOption("give --restore-index or --restore-time, not both: each picks the "
                        "point to restore")
    given = [flag for flag, value in (("--restore-index", restore_index),
                                      ("--restore-time", restore_time),
                                      ("--restore-cluster-id", restore_cluster_id))
             if value is not None]
    if given and restore_from is None:
        raise BadOption(f"{given[0]} needs --restore-from: the archive to restore from")
    signing_key_file = signing_keys(signing_key_file)
    state_machine = state_machine_spec(state_machine)
    with locked(root):
        return _up(Path(root), replicas, election_timeout_ms=election_timeout_ms,
                   heartbeat_ms=heartbeat_ms, archive=archive, base_port=base_port,
                   timeout=timeout, say=say, restore_from=restore_from,
                   restore_index=restore_index, restore_time=restore_time,
                   restore_cluster_id=restore_cluster_id, tls=tls,
                   signing_key_file=signing_key_file, state_machine=state_machine)


def state_machine_spec(spec: str | None) -> str | None:
    """`--state-machine`, loaded here once as each member will load it (BadOption, exit 2,
    when it cannot be); None for the built-in key-value machine."""
    from flotilla.node.statemachine import StateMachineLoadError, load_state_machine

    if spec is None or spec.strip() in ("", "kv"):
        return None
    try:
        load_state_machine(spec.strip())
    except StateMachineLoadError as exc:
        raise BadOption("--state-machine: " + " ".join(str(exc).split())) from None
    return spec.strip()


def signing_keys(text: str | None) -> str | None:
    """`--archive-signing-key-file` (else `FLOTILLA_ARCHIVE_SIGNING_KEY_FILE`) with every path
    made absolute (members run in the cluster directory), once its keys are known to load:
    BadOption (exit 2) otherwise."""
    from flotilla.node.archive import ManifestKeys

    text = text or os.environ.get("FLOTILLA_ARCHIVE_SIGNING_KEY_FILE") or None
    if text is None:
        return None
    try:
        ManifestKeys.parse(text)
    except ValueError as exc:
        raise BadOption(f"--archive-signing-key-file: {exc}") from None
    return ",".join(str(Path(part.strip()).resolve()) for part in text.split(","))


def _up(root: Path, replicas: int, *, election_timeout_ms: int, heartbeat_ms: int,
        archive: str | None, base_port: int | None, timeout: float,
        say: Callable[[str], None], restore_from: str | None = None,
        restore_index: int | None = None, restore_time: int | None = None,
        restore_cluster_id: str | None = None,
        tls: bool = False,
        signing_key_file: str | None = None,
        state_machine: str | None = None) -> tuple[LocalCluster, str]:
    if LocalCluster.exists(root):
        cluster = LocalCluster.load(root)
        running = cluster.alive()
        if len(running) == len(cluster.members):
            raise AlreadyRunning(
                f"a cluster is already running in {root} (members "
                f"{', '.join(f'{n} pid {cluster.member(n).pid}' for n in running)}); "
                f"`flotilla status --dir {root}` shows it, `flotilla down --dir {root}` stops it")
        _resume_notes(cluster, replicas, election_timeout_ms, heartbeat_ms, archive, tls, say,
                      signing_key_file, state_machine)
        if read_token(root) is None and node_accepts_flag("--admin-token"):
            # Made before `up` generated a token: its members would each generate their own
            # in their data dirs, which the other commands do not read.
            _write_token(root)
            say(f"note: {root} had no admin token; generated one in {root / TOKEN_FILE}")
        down = [n for n in cluster.names if n not in running]
        if running:
            say(f"{', '.join(running)} running; starting {', '.join(down)}")
        for name in cluster.renew_certificates(down):
            say(f"note: {name}'s certificate had expired or was about to (or was missing); "
                f"issued a new one from the cluster's CA")
        try:
            cluster.start(down)
            leader = cluster.wait_ready(timeout, require=down)
        except BaseException:
            cluster.stop(timeout=5, names=down)  # only what this call started
            raise
        cluster.mark_bootstrapped()  # a state file from before the flag was turned
        return cluster, leader
    target = None
    if restore_from is not None:
        restore_from = archive_url(restore_from, "--restore-from")
        target = check_restore(restore_from, restore_index, restore_time, restore_cluster_id,
                               signing_key_file)
    for attempt in range(3):
        cluster = LocalCluster.create(root, replicas, election_timeout_ms=election_timeout_ms,
                                      heartbeat_ms=heartbeat_ms, archive=archive,
                                      base_port=base_port, restore_from=restore_from,
                                      restore_index=restore_index, restore_time=restore_time,
                                      restore_cluster_id=restore_cluster_id,
                                      tls=tls,
                                      signing_key_file=signing_key_file,
                                      state_machine=state_machine)
        cluster.restored = target
        try:
            cluster.start()
            with Bar() as bar:
                leader = cluster.wait_ready(
                    timeout, require=cluster.names,
                    on_wait=_show_restore(cluster, bar) if restore_from else None)
            cluster.mark_bootstrapped()
            return cluster, leader
        except BaseException as exc:
            # Nothing of a cluster that never served is worth keeping: stop every member this
            # call started and remove its state and data dirs, so the next `up` starts clean
            # instead of finding half a cluster (elected, even) or a remembered bad flag.
            cluster.stop(timeout=5)
            _forget(cluster)
            if not isinstance(exc, _BindFailed) or base_port is not None or attempt == 2:
                raise
            say("note: a port was taken while the members started; trying other ports")
    raise LocalClusterError("could not find free ports for the members; try again")


def check_restore(url: str, index: int | None = None, ts_ms: int | None = None,
                  cluster_id: str | None = None,
                  signing_key_file: str | None = None) -> RestoreTarget:
    """Settle a restore from ``url`` exactly as each member will (the node's own
    `flotilla.node.restore.settle`): ``cluster_id``, or the only cluster there, and
    ``index``, the index ``ts_ms`` resolves to, or the newest. Raises OutsideArchive for a
    target the archive cannot give, LocalClusterError when the archive cannot be read or
    holds no cluster."""
    from flotilla.node.archive import ArchiveError, ManifestKeys, open_archive
    from flotilla.node.restore import OutsideArchive as NodeOutside
    from flotilla.node.restore import settle

    try:
        archive = open_archive(url)
    except (ArchiveError, ValueError) as exc:
        raise LocalClusterError(f"cannot restore from {url}: {exc}") from None
    try:
        keys = ManifestKeys.parse(signing_key_file) if signing_key_file else None
        source = settle(archive, cluster_id=cluster_id, excluding=None, index=index,
                        ts_ms=ts_ms, keys=keys)
    except NodeOutside as exc:
        raise OutsideArchive(f"cannot restore: {exc}") from None
    except ArchiveError as exc:
        raise LocalClusterError(f"cannot restore from {url}: {exc}") from None
    finally:
        archive.close()
    return RestoreTarget(url, source.cluster.cluster_id, source.plan.index, index, ts_ms)


def _show_restore(cluster: LocalCluster, bar: Bar) -> Callable[[], None]:
    """Follow the first member's restore (every initial member does the same work)."""
    first = cluster.members[0]

    def show() -> None:
        doc = read_restore_progress(first.data_dir)
        if doc is not None:
            what = "fetching from the archive" if doc["stage"] == "fetch" else "replaying"
            bar.show(doc["stage"], f"{first.name} {what}", doc["done"], doc["total"],
                     doc["unit"])
    return show


def _resume_notes(cluster: LocalCluster, replicas: int, election_timeout_ms: int,
                  heartbeat_ms: int, archive: str | None, tls: bool,
                  say: Callable[[str], None], signing_key_file: str | None = None,
                  state_machine: str | None = None) -> None:
    """Say which options of this `up` a stopped cluster does not take: it resumes exactly as
    it first ran, and says how to start over instead."""
    root, state = cluster.root, cluster.state
    anew = (f"to start over with other options, `flotilla down --dir {root}` and delete "
            f"{root} (its data goes with it), or use another --dir")
    if replicas != len(cluster.members):
        say(f"note: {root} holds a {len(cluster.members)}-member cluster; resuming it as it "
            f"was (--replicas applies to a new cluster; `flotilla scale N` resizes this one)")
    if (election_timeout_ms, heartbeat_ms) != (state.election_timeout_ms, state.heartbeat_ms):
        say(f"note: resuming with the original timing (--election-timeout-ms "
            f"{state.election_timeout_ms} --heartbeat-ms {state.heartbeat_ms}); {anew}")
    if archive is not None and archive != state.archive:
        say(f"note: resuming with the original archive {state.archive}; {anew}")
    if tls and not state.tls:
        say(f"note: {root} holds a cluster started without TLS; resuming it as it was "
            f"(plain http://); {anew}")
    recorded = cluster.members[0].flag(SIGNING_KEY_FLAG)
    if signing_key_file != recorded:
        say(f"note: resuming with the original {SIGNING_KEY_FLAG} ({recorded or 'none'}); "
            f"{anew}")
    machine = cluster.members[0].flag(STATE_MACHINE_FLAG)
    if state_machine is not None and state_machine != machine:
        say(f"note: resuming with the original state machine ({machine or 'kv'}); {anew}")


def _forget(cluster: LocalCluster) -> None:
    """Remove a cluster that never served (its members are down): state file and data dirs,
    so the next attempt starts from nothing. Logs are kept."""
    for m in cluster.members:
        shutil.rmtree(m.data_dir, ignore_errors=True)
    LocalCluster.state_path(cluster.root).unlink(missing_ok=True)
    (cluster.root / TOKEN_FILE).unlink(missing_ok=True)
    shutil.rmtree(cluster.root / TLS_DIR, ignore_errors=True)
