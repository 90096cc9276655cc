"""Taking snapshots of a state machine without stopping applies.

A snapshot must reflect one exact moment (the applied index it is labelled with), yet writing a
million keys takes seconds, and a member that stops applying for seconds stalls every client.
So the moment is captured cheaply and written out while applies go on. Three methods:

- `fork` (preferred, any machine): `os.fork()` gives a child process the parent's memory as a
  copy-on-write image of that moment. The child calls the machine's ordinary `write_snapshot`
  into the target, seals it (fsync) and `os._exit`s; the parent's only pause is the fork itself
  (copying page tables: milliseconds for gigabytes) plus page faults as it dirties shared
  pages. The kernel does the copy-on-write, so no machine needs snapshot-aware code, and the
  child runs on another core with its own GIL. Unsuitable where there is no fork (Windows),
  where memory overcommit is strict (a big heap may fail to fork), or for a machine holding
  threads, connections or devices that a child cannot use. The child touches nothing but the
  machine and the target: it logs nothing and leaves through `os._exit`, so it never runs the
  parent's cleanup handlers or flushes the parent's buffers. The garbage collector's objects
  are frozen (`gc.freeze`) meanwhile, so a collection in the parent does not write to, and so
  copy, every page of the heap.
- `overlay` (machines implementing `SupportsFreeze`, such as the kv machine): `freeze()`
  captures the moment inside the process (the kv machine freezes its dict and sends new writes
  to an overlay that reads consult first); a background thread writes the frozen state, and the
  applying thread releases it when it collects the result. It works everywhere, but the writer
  shares the GIL, so applies slow down while it runs (it offers the GIL at every write).
- `sync`: write in the caller's thread; applies wait. For tests, tools and small machines.

`auto` picks fork where it exists, falling back to overlay (or sync) if fork fails.

Where the bytes go is not this module's business: the storage layer owns the snapshot file
format (header with index, term, membership and kind; checksums; atomic rename). A
`SnapshotTarget` is the seam. `write` receives the payload and `seal` makes it durable, both
wherever the snapshot is written (the forked child, the writer thread, or the caller); `seal`
returns a small msgpack-able dict of facts (size, checksum, temporary path...) that comes back
to the member in `SnapshotResult.facts`, where the member publishes the snapshot (rename it
into place, record it). `discard` is called in the member after a failure or a cancel.
`FileTarget` is the plain reference: the payload alone, in one file.

Driving a job: `start_snapshot` returns a `SnapshotJob`. Call `poll()` from the thread that
applies (it must be, for overlay, which releases the frozen state there); it returns None while
the job runs and a `SnapshotResult` once, or raises `SnapshotError`. `fileno()` becomes
readable when the job is done, for `loop.add_reader`. Always poll a job to its end (or cancel
it): that reaps the child and unfreezes the collector.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import signal
import stat
import threading
import time
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Literal, Protocol, runtime_checkable

import msgpack

from .protocol import FrozenState, StateMachine, SupportsFreeze

Method = Literal["auto", "fork", "overlay", "sync"]
METHODS: tuple[str, ...] = ("auto", "fork", "overlay", "sync")
_FILE_BUFFER = 1 << 20


class SnapshotError(Exception):
    """A snapshot could not be written or restored."""


@runtime_checkable
class SnapshotTarget(Protocol):
    """Where a snapshot's payload goes; see the module docstring for which side calls what.

    If the target buffers anything before `start_snapshot` (a file header, say), it must have a
    `flush()`: it is called just before a fork, so that parent and child do not both hold (and
    write) the same buffered bytes.
    """

    def write(self, data: bytes) -> int: ...

    def seal(self) -> dict[str, Any]: ...

    def discard(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SnapshotResult:
    method: str  # "fork", "overlay" or "sync"
    seconds: float  # from start to the target being sealed
    facts: dict[str, Any] = field(default_factory=dict)  # what the target's seal() returned


class FileTarget:
    """The payload alone in one file, fsynced by `seal`; facts: path, size and sha256.

    The file is opened on the first write, so with the fork method only the child ever opens it.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.path = os.fspath(path)
        self.fsync = fsync
        self._file: BinaryIO | None = None
        self._hash = hashlib.sha256()
        self._size = 0

    def write(self, data: bytes) -> int:
        if self._file is None:
            self._file = open(self.path, "wb", buffering=_FILE_BUFFER)  # noqa: SIM115
        self._hash.update(data)
        self._size += len(data)
        return self._file.write(data)

    def seal(self) -> dict[str, Any]:
        if self._file is None:
            self.write(b"")
        assert self._file is not None
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())
        self._file.close()
        return {"path": self.path, "size": self._size, "sha256": self._hash.hexdigest()}

    def discard(self) -> None:
        if self._file is not None:
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


def restore_snapshot(machine: StateMachine, stream: BinaryIO, kind: str) -> None:
    """Restore `machine` from a payload that the storage layer says a `kind` machine wrote."""
    if kind != machine.kind:
        raise SnapshotError(
            f"the snapshot was written by a {kind!r} state machine; this member runs "
            f"{machine.kind!r}"
        )
    machine.restore(stream)


def write_snapshot_now(machine: StateMachine, target: SnapshotTarget) -> SnapshotResult:
    """Write and seal a snapshot in the caller's thread (the `sync` method, without a job)."""
    started = time.perf_counter()
    machine.write_snapshot(target)  # type: ignore[arg-type]
    facts = target.seal()
    return SnapshotResult("sync", time.perf_counter() - started, facts)


def choose_method(machine: StateMachine, requested: str = "auto") -> str:
    """The method `start_snapshot` would use first; ValueError if `requested` cannot work."""
    if requested not in METHODS:
        raise ValueError(f"snapshot method {requested!r} is not one of {', '.join(METHODS)}")
    if requested == "fork" and not hasattr(os, "fork"):
        raise ValueError("snapshot method 'fork' needs os.fork(); use 'overlay' or 'sync'")
    if requested == "overlay" and not isinstance(machine, SupportsFreeze):
        raise ValueError(
            f"snapshot method 'overlay' needs a machine with freeze(); {type(machine).__name__} "
            "has none: use 'fork' or 'sync'"
        )
    if requested != "auto":
        return requested
    if hasattr(os, "fork"):
        return "fork"
    return "overlay" if isinstance(machine, SupportsFreeze) else "sync"


def start_snapshot(
    machine: StateMachine, target: SnapshotTarget, *, method: str = "auto"
) -> SnapshotJob:
    """Start writing a snapshot of `machine` as it is now into `target`. Applies may continue
    as soon as this returns."""
    chosen = choose_method(machine, method)
    if chosen == "fork":
        try:
            return _ForkJob(machine, target)
        except OSError:
            if method == "fork":
                raise
            chosen = "overlay" if isinstance(machine, SupportsFreeze) else "sync"
    if chosen == "overlay":
        return _OverlayJob(machine.freeze(), target)  # type: ignore[attr-defined]
    return _SyncJob(machine, target)


class SnapshotJob:
    """A snapshot being written. See the module docstring for how to drive it."""

    method: str

    def __init__(self, target: SnapshotTarget) -> None:
        self.target = target
        self._started = time.perf_counter()
        self._result: SnapshotResult | None = None
        self._error: SnapshotError | None = None

    def fileno(self) -> int:
        """A descriptor that becomes readable when the job is done, for `loop.add_reader` or
        `select` (where Linux pidfds are missing, a fork job's may wake up once early:
        `poll()` then returns None)."""
        raise NotImplementedError

    def _collect(self) -> dict[str, Any] | None:
        """The seal's facts once done, None while running; raises SnapshotError on failure."""
        raise NotImplementedError

    def _stop(self) -> None:
        """Stop the writer and wait for it (cancel)."""
        raise NotImplementedError

    def poll(self) -> SnapshotResult | None:
        if self._error is not None:
            raise self._error
        if self._result is None:
            try:
                facts = self._collect()
            except SnapshotError as exc:
                self._fail(exc)
                raise
            if facts is None:
                return None
            self._result = SnapshotResult(self.method, time.perf_counter() - self._started, facts)
        return self._result

    @property
    def done(self) -> bool:
        return self._result is not None or self._error is not None

    def cancel(self) -> None:
        """Stop the job if it still runs, and discard the target. A job that already succeeded
        or failed is left alone (a sealed target is the caller's to publish or discard)."""
        if not self.done:
            self._stop()
            self._fail(SnapshotError("snapshot cancelled"))

    def _fail(self, error: SnapshotError) -> None:
        self._error = error
        with contextlib.suppress(Exception):
            self.target.discard()


class _SyncJob(SnapshotJob):
    method = "sync"

    def __init__(self, machine: StateMachine, target: SnapshotTarget) -> None:
        super().__init__(target)
        self._facts: dict[str, Any] | None = None
        self._failure: SnapshotError | None = None
        try:
            self._facts = write_snapshot_now(machine, target).facts
        except Exception as exc:
            self._failure = SnapshotError(f"snapshot failed: {type(exc).__name__}: {exc}")
            self._failure.__cause__ = exc
        self._ready_r, ready_w = os.pipe()
        os.close(ready_w)  # EOF: readable at once

    def fileno(self) -> int:
        return self._ready_r

    def _close(self) -> None:
        if self._ready_r >= 0:
            os.close(self._ready_r)
            self._ready_r = -1

    def _collect(self) -> dict[str, Any] | None:
        self._close()
        if self._failure is not None:
            raise self._failure
        return self._facts

    def _stop(self) -> None:
        self._close()


class _ForkJob(SnapshotJob):
    method = "fork"

    def __init__(self, machine: StateMachine, target: SnapshotTarget) -> None:
        super().__init__(target)
        flush = getattr(target, "flush", None)
        if flush is not None:
            flush()
        read_fd, write_fd = os.pipe()
        _gc_freeze()
        try:
            pid = os.fork()
        except OSError:
            _gc_unfreeze()
            os.close(read_fd)
            os.close(write_fd)
            raise
        if pid == 0:  # pragma: no cover - runs in the child, which never returns
            _child_main(machine, target, read_fd, write_fd)
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        self._pid = pid
        self._read_fd = read_fd
        self._message = b""
        self._eof = False
        # A pidfd turns readable exactly when the child exits; the pipe already does when the
        # child writes its report, a moment earlier (a harmless early wake-up).
        self._pidfd = -1
        with contextlib.suppress(AttributeError, OSError):
            self._pidfd = os.pidfd_open(pid)

    def fileno(self) -> int:
        return self._pidfd if self._pidfd >= 0 else self._read_fd

    def _drain_pipe(self) -> None:
        try:
            while not self._eof:
                chunk = os.read(self._read_fd, 65536)
                self._message += chunk
                self._eof = not chunk
        except BlockingIOError:
            pass

    def _reaped(self) -> None:
        self._pid = 0
        _gc_unfreeze()
        os.close(self._read_fd)
        if self._pidfd >= 0:
            os.close(self._pidfd)

    def _collect(self) -> dict[str, Any] | None:
        # The pipe reaches EOF when the child exits; only then is a blocking waitpid sure to
        # return at once.
        self._drain_pipe()
        pid, status = os.waitpid(self._pid, 0 if self._eof else os.WNOHANG)
        if pid == 0:
            return None
        self._drain_pipe()
        self._reaped()
        try:
            report = msgpack.unpackb(self._message, raw=False)
        except Exception:
            report = None
        if not isinstance(report, dict):
            report = {}
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 and report.get("ok"):
            return report["facts"]
        if os.WIFSIGNALED(status):
            why = f"killed by signal {os.WTERMSIG(status)}"
        else:
            why = report.get("error") or f"exit status {os.waitstatus_to_exitcode(status)}"
        raise SnapshotError(f"snapshot child process failed: {why}")

    def _stop(self) -> None:
        if self._pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)
            self._reaped()


# While a forked child writes, the parent's collector must not touch (and so copy) every
# object of the heap: gc.freeze() parks all current objects outside the collector's reach.
# Counted, so overlapping jobs (which the runtime avoids anyway) cannot unfreeze early.
_gc_frozen = 0


def _gc_freeze() -> None:
    global _gc_frozen
    if _gc_frozen == 0:
        gc.freeze()
    _gc_frozen += 1


def _gc_unfreeze() -> None:
    global _gc_frozen
    _gc_frozen -= 1
    if _gc_frozen == 0:
        gc.unfreeze()


def _close_sockets() -> None:  # pragma: no cover - runs in the forked child
    """Close the child's copies of the member's sockets: its listening ports and its peer and
    client connections. Held by a child writing a long snapshot, a port stays bound after the
    member stops (its restart fails to listen) and a connection the member closes stays open
    for the peer. Closing a copy shuts nothing down for the parent, which keeps its own."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:  # no /proc: the child keeps them until it exits
        return
    for fd in fds:
        if fd <= 2:
            continue
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                os.close(fd)
        except OSError:  # the listing's own descriptor, closed since
            pass


def _child_main(
    machine: StateMachine, target: SnapshotTarget, read_fd: int, write_fd: int
) -> None:  # pragma: no cover - runs in the forked child
    status = 1
    report: dict[str, Any] = {"ok": False, "error": "unknown failure"}
    try:
        gc.disable()
        os.close(read_fd)
        # The child shares the parent's signal wakeup descriptor (asyncio's self-pipe): a
        # signal delivered to the child must not wake the parent's loop as if it were its own.
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
        _close_sockets()
        machine.write_snapshot(target)  # type: ignore[arg-type]
        report = {"ok": True, "facts": target.seal()}
        status = 0
    except BaseException as exc:
        report = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
    finally:
        try:
            os.write(write_fd, msgpack.packb(report))
        finally:
            os._exit(status)


class _Polite:
    """Wraps the target for the overlay writer thread: offers the GIL to the applying thread
    after every write, and turns a cancel into an exception at the next write."""

    def __init__(self, target: SnapshotTarget) -> None:
        self._target = target
        self.cancelled = False

    def write(self, data: bytes) -> int:
        if self.cancelled:
            raise SnapshotError("snapshot cancelled")
        written = self._target.write(data)
        time.sleep(0)  # let the applying thread take the GIL now, not after 5 ms
        return written

    def writable(self) -> bool:
        return True


class _OverlayJob(SnapshotJob):
    method = "overlay"

    def __init__(self, frozen: FrozenState, target: SnapshotTarget) -> None:
        super().__init__(target)
        self._frozen: FrozenState | None = frozen
        self._stream = _Polite(target)
        self._ready_r, self._ready_w = os.pipe()
        self._facts: dict[str, Any] | None = None
        self._failure: BaseException | None = None
        self._writer_done = False
        self._thread = threading.Thread(target=self._run, name="snapshot-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        time.sleep(0)  # give the GIL back to the thread in start(), which waits for it
        try:
            assert self._frozen is not None
            self._frozen.write(self._stream)  # type: ignore[arg-type]
            self._facts = self.target.seal()
        except BaseException as exc:
            self._failure = exc
        finally:
            self._writer_done = True
            os.close(self._ready_w)  # EOF: readable

    def fileno(self) -> int:
        return self._ready_r

    def _release(self) -> None:
        if self._frozen is not None:
            os.close(self._ready_r)
            frozen, self._frozen = self._frozen, None
            frozen.release()

    def _collect(self) -> dict[str, Any] | None:
        if not self._writer_done:
            return None
        self._thread.join()  # it is past its last statement that matters
        self._release()
        if self._failure is not None:
            raise SnapshotError(
                f"snapshot failed: {type(self._failure).__name__}: {self._failure}"
            ) from self._failure
        return self._facts

    def _stop(self) -> None:
        self._stream.cancelled = True
        self._thread.join()
        self._release()
