"""Driving snapshot jobs: methods, targets, failures, cancellation, and a user's own machine."""

from __future__ import annotations

import hashlib
import io
import os
import select
import socket
import time
from typing import Any, BinaryIO

import msgpack
import pytest
from flotilla.node.statemachine import (
    FileTarget,
    KVStateMachine,
    SnapshotError,
    SnapshotTarget,
    StateMachine,
    choose_method,
    encode_put,
    restore_snapshot,
    start_snapshot,
)

from tests.statemachine.sm_workloads import finish


class Counter:
    """A user's machine: no freeze(), so only fork and sync apply to it."""

    kind = "counter"

    def __init__(self) -> None:
        self.total = 0

    def apply(self, index: int, command: bytes) -> Any:
        self.total += int(command)
        return self.total

    def write_snapshot(self, stream: BinaryIO) -> None:
        stream.write(msgpack.packb(self.total))

    def restore(self, stream: BinaryIO) -> None:
        self.total = msgpack.unpackb(stream.read())

    def query(self, request: Any) -> Any:
        return self.total


class Broken(Counter):
    def write_snapshot(self, stream: BinaryIO) -> None:
        stream.write(b"partial")
        raise RuntimeError("disk on fire")


class Slow(Counter):
    def write_snapshot(self, stream: BinaryIO) -> None:
        stream.write(b"started")
        time.sleep(30)


class BrokenFreeze(KVStateMachine):
    def freeze(self):
        frozen = super().freeze()
        released = self.released = []

        class Failing:
            def write(self, stream):
                stream.write(b"x")
                raise OSError("no space left")

            def release(self):
                frozen.release()
                released.append(True)

        return Failing()


class FramedTarget:
    """A target like the storage layer's: a header written (and buffered) in the member before
    the snapshot starts, a trailer added by seal(), facts that are not just a path."""

    def __init__(self, path) -> None:
        self.path = path
        self.file = open(path, "wb", buffering=1 << 16)  # noqa: SIM115
        self.file.write(b"HEADER|")
        self.size = 0

    def flush(self) -> None:
        self.file.flush()

    def write(self, data: bytes) -> int:
        self.size += len(data)
        return self.file.write(data)

    def seal(self) -> dict[str, Any]:
        self.file.write(b"|TRAILER")
        self.file.close()
        return {"payload_size": self.size, "parts": ["header", "payload", "trailer"]}

    def discard(self) -> None:
        self.file.close()
        os.unlink(self.path)


def kv_with(count: int) -> KVStateMachine:
    kv = KVStateMachine()
    for i in range(1, count + 1):
        kv.apply(i, encode_put(f"k{i}", b"v" * 50, ts=i))
    return kv


def test_a_user_machine_is_snapshotted_by_fork_and_sync(tmp_path):
    counter = Counter()
    assert isinstance(counter, StateMachine)
    for i in range(1, 11):
        counter.apply(i, b"5")
    for method in ("fork", "sync"):
        job = start_snapshot(counter, FileTarget(tmp_path / method), method=method)
        counter.apply(11, b"1000")  # after the moment of the snapshot
        result = finish(job)
        copy = Counter()
        with open(result.facts["path"], "rb") as stream:
            restore_snapshot(copy, stream, "counter")
        assert copy.total == 50
        counter.total = 50


@pytest.mark.parametrize("method", ["fork", "overlay", "sync"])
def test_file_target_facts_describe_the_file(tmp_path, method):
    kv = kv_with(100)
    result = finish(start_snapshot(kv, FileTarget(tmp_path / "s"), method=method))
    data = (tmp_path / "s").read_bytes()
    assert result.method == method
    assert result.facts == {
        "path": str(tmp_path / "s"),
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    stream = io.BytesIO()
    kv.write_snapshot(stream)
    assert data == stream.getvalue()


@pytest.mark.parametrize("method", ["fork", "overlay", "sync"])
def test_a_target_that_buffered_a_header_is_written_once_and_sealed(tmp_path, method):
    kv = kv_with(10)
    target = FramedTarget(tmp_path / "s")
    assert isinstance(target, SnapshotTarget)
    result = finish(start_snapshot(kv, target, method=method))
    target.file.close()  # the member's copy: after a fork it must hold nothing left to write
    payload = io.BytesIO()
    kv.write_snapshot(payload)
    assert (tmp_path / "s").read_bytes() == b"HEADER|" + payload.getvalue() + b"|TRAILER"
    assert result.facts == {
        "payload_size": len(payload.getvalue()),
        "parts": ["header", "payload", "trailer"],
    }


def test_auto_prefers_fork_and_refuses_methods_that_cannot_work():
    assert choose_method(KVStateMachine()) == ("fork" if hasattr(os, "fork") else "overlay")
    assert choose_method(Counter(), "sync") == "sync"
    with pytest.raises(ValueError, match="freeze"):
        choose_method(Counter(), "overlay")
    with pytest.raises(ValueError, match="one of"):
        choose_method(Counter(), "threads")


@pytest.mark.parametrize("method", ["fork", "sync"])
def test_a_failing_writer_is_reported_and_its_target_discarded(tmp_path, method):
    path = tmp_path / "s"
    job = start_snapshot(Broken(), FileTarget(path), method=method)
    with pytest.raises(SnapshotError, match="disk on fire"):
        finish(job)
    assert not path.exists()
    with pytest.raises(SnapshotError):  # and it keeps saying so
        job.poll()


def test_a_failing_overlay_writer_is_reported_and_the_machine_released(tmp_path):
    kv = BrokenFreeze()
    kv.apply(1, encode_put("k", b"v", ts=1))
    job = start_snapshot(kv, FileTarget(tmp_path / "s"), method="overlay")
    kv.apply(2, encode_put("k", b"during", ts=2))
    with pytest.raises(SnapshotError, match="no space left"):
        finish(job)
    assert kv.released == [True]
    assert not (tmp_path / "s").exists()
    assert kv.get("k") == (b"during", 2)
    kv.freeze().release()  # the machine is usable for the next snapshot


def test_cancel_kills_a_fork_child_and_discards_the_target(tmp_path):
    path = tmp_path / "s"
    job = start_snapshot(Slow(), FileTarget(path), method="fork")
    time.sleep(0.2)
    started = time.monotonic()
    job.cancel()
    assert time.monotonic() - started < 5
    assert not path.exists()
    with pytest.raises(SnapshotError, match="cancelled"):
        job.poll()


def test_a_fork_child_holds_none_of_the_members_sockets(tmp_path):
    """While a child writes a long snapshot, the member's port is free again once the member
    closes it (a restart can listen), and a connection the member closes ends for its peer."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    peer = socket.create_connection(("127.0.0.1", port))
    accepted, _ = listener.accept()
    job = start_snapshot(Slow(), FileTarget(tmp_path / "s"), method="fork")
    try:
        time.sleep(0.3)  # the child is in write_snapshot, with whatever it kept
        listener.close()
        accepted.close()
        again = socket.create_server(("127.0.0.1", port))  # EADDRINUSE if the child held it
        again.close()
        peer.settimeout(5)
        assert peer.recv(1) == b"", "the connection stayed open: the child holds its socket"
    finally:
        peer.close()
        job.cancel()


def test_cancel_stops_an_overlay_writer(tmp_path):
    kv = kv_with(20_000)
    job = start_snapshot(kv, FileTarget(tmp_path / "s"), method="overlay")
    job.cancel()
    assert not (tmp_path / "s").exists()
    with pytest.raises(SnapshotError):
        job.poll()
    kv.apply(20_001, encode_put("k1", b"after", ts=1))
    kv.check_invariants()
    kv.freeze().release()


def test_cancel_after_success_leaves_the_snapshot_alone(tmp_path):
    job = start_snapshot(kv_with(5), FileTarget(tmp_path / "s"), method="fork")
    finish(job)
    job.cancel()
    assert (tmp_path / "s").exists()
    assert job.poll() is not None


@pytest.mark.parametrize("method", ["fork", "overlay", "sync"])
def test_fileno_becomes_readable_when_the_job_is_done(tmp_path, method):
    job = start_snapshot(kv_with(1), FileTarget(tmp_path / "s"), method=method)
    readable, _, _ = select.select([job.fileno()], [], [], 30)
    assert readable
    assert job.poll() is not None
    assert job.done
