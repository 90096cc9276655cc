"""Free TCP ports and loopback addresses for tests that start real processes.

The usual trick, bind port 0 and hand the number to a child process, has two races: the port
is free again the moment the probe socket closes, so a second allocation (in this process or
a concurrently running test process) may get the same number; and ports from the kernel's
ephemeral range are also what every outgoing connection takes as its source port, so the
child may find its port taken by some client socket. Here:

* ports come from below the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``;
  20000-32767 on a default Linux), where the kernel never picks source ports;
* each port handed out is reserved by an exclusive ``flock`` on a file named after it in a
  shared directory, held until ``release_port`` or until the process exits, so concurrent
  test processes (pytest-xdist workers, parallel CI jobs) never hand out the same port;
* a port is only handed out if it can be bound right now on the requested host.

Loopback addresses: Linux routes all of 127.0.0.0/8 to ``lo``, so members can each have
their own 127.0.0.x (readable logs, per-member source addresses). ``loopback_hosts(n)``
returns n distinct ones when this machine lets us bind them, else n times ``127.0.0.1``
(macOS without aliases): always pair the host with a port from ``allocate_port``, which is
distinct either way.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import random
import socket
import tempfile
import threading
from pathlib import Path

__all__ = [
    "PortAllocator",
    "allocate_port",
    "allocate_ports",
    "allocate_range",
    "default_allocator",
    "loopback_aliases_supported",
    "loopback_hosts",
    "release_port",
]


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 49152, 65535  # the IANA range, which macOS and Windows use


def _default_range() -> tuple[int, int]:
    """A range the kernel does not use for source ports: below it if there is room."""
    low, high = _ephemeral_range()
    if low - 1 >= 12000:
        return max(10000, low - 12768), low - 1
    if high < 64000:
        return high + 1, 65535
    return 10000, 19999  # an unusual configuration; still better than the ephemeral range


def bindable(host: str, port: int) -> bool:
    """Can a TCP socket bind ``host:port`` right now (without SO_REUSEADDR: conservative)?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class PortAllocator:
    """Hands out ports in ``[low, high]`` that no other allocator sharing ``lock_dir`` holds.

    ``lock_dir`` defaults to a per-user directory under the system temp dir, so every test
    process of this user cooperates. ``rng`` picks where the search starts (spreading
    concurrent allocators apart); seed it for a repeatable order.
    """

    def __init__(self, lock_dir: str | os.PathLike[str] | None = None,
                 port_range: tuple[int, int] | None = None,
                 rng: random.Random | None = None) -> None:
        default_dir = Path(tempfile.gettempdir()) / f"flotilla-test-ports-{os.getuid()}"
        self.lock_dir = Path(lock_dir) if lock_dir is not None else default_dir
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        self.low, self.high = port_range or _default_range()
        if not 0 < self.low <= self.high < 65536:
            raise ValueError(f"bad port range {self.low}-{self.high}")
        self._rng = rng or random.Random()
        self._held: dict[int, int] = {}  # port -> fd of its locked file
        self._lock = threading.Lock()

    def allocate(self, host: str = "127.0.0.1") -> int:
        """One free port, reserved until ``release`` (or the end of this process)."""
        return self.allocate_range(1, host)[0]

    def allocate_many(self, n: int, host: str = "127.0.0.1") -> list[int]:
        return [self.allocate(host) for _ in range(n)]

    def allocate_range(self, n: int, host: str = "127.0.0.1") -> list[int]:
        """``n`` consecutive free ports (for a process that derives its ports from a base)."""
        span = self.high - self.low + 1
        if not 0 < n <= span:
            raise ValueError(f"cannot allocate {n} consecutive ports in {self.low}-{self.high}")
        bases = span - n + 1
        first = self._rng.randrange(bases)
        with self._lock:
            for step in range(bases):
                base = self.low + (first + step) % bases
                taken = self._try_reserve(range(base, base + n), host)
                if taken:
                    return taken
        raise RuntimeError(
            f"no {n} free port(s) left in {self.low}-{self.high} on {host}: {len(self._held)} "
            f"are held by this process; release ports you no longer need, or pass a wider "
            f"port_range (locks live in {self.lock_dir})")

    def _try_reserve(self, ports: range, host: str) -> list[int] | None:
        fds: list[int] = []
        try:
            for port in ports:
                if port in self._held:
                    return None
                fd = os.open(self.lock_dir / f"{port}.lock", os.O_RDWR | os.O_CREAT, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    os.close(fd)
                    if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                        return None
                    raise
                fds.append(fd)
                if not bindable(host, port):
                    return None
            for port, fd in zip(ports, fds, strict=True):
                self._held[port] = fd
            taken, fds = list(ports), []
            return taken
        finally:
            for fd in fds:  # only left when the attempt failed
                os.close(fd)

    def release(self, port: int) -> None:
        """Give the port back (the process using it should have exited or closed it)."""
        with self._lock:
            fd = self._held.pop(port, None)
        if fd is not None:
            os.close(fd)  # closing the descriptor drops the lock

    def release_all(self) -> None:
        with self._lock:
            held, self._held = self._held, {}
        for fd in held.values():
            with contextlib.suppress(OSError):
                os.close(fd)

    @property
    def held(self) -> set[int]:
        with self._lock:
            return set(self._held)


@functools.cache
def default_allocator() -> PortAllocator:
    """The allocator behind the module-level functions (one per process)."""
    return PortAllocator()


def allocate_port(host: str = "127.0.0.1") -> int:
    return default_allocator().allocate(host)


def allocate_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    return default_allocator().allocate_many(n, host)


def allocate_range(n: int, host: str = "127.0.0.1") -> list[int]:
    return default_allocator().allocate_range(n, host)


def release_port(port: int) -> None:
    default_allocator().release(port)


@functools.cache
def loopback_aliases_supported() -> bool:
    """Whether addresses like 127.0.0.2 can be bound here (Linux: yes; macOS: only aliased)."""
    return all(bindable(host, 0) for host in ("127.0.0.2", "127.0.0.3", "127.0.0.254"))


def loopback_hosts(n: int, first: int = 2) -> list[str]:
    """``n`` distinct loopback addresses ``127.0.0.<first>``, ``<first+1>``...; or, where only
    127.0.0.1 is usable, ``n`` times ``127.0.0.1`` (pair each with its own port)."""
    if not (n >= 1 and first >= 1 and first + n - 1 <= 254):
        raise ValueError(f"127.0.0.{first} .. 127.0.0.{first + n - 1} is not a host range")
    if not loopback_aliases_supported():
        return ["127.0.0.1"] * n
    hosts = [f"127.0.0.{first + i}" for i in range(n)]
    if all(bindable(host, 0) for host in hosts):
        return hosts
    return ["127.0.0.1"] * n
