"""Snapshots of the key-value machine: faithful, deterministic, and taken without stopping.

Every method (sync, fork, overlay) must write the same bytes for the same state, restoring
must give back the full state (sessions included), and applies made while a snapshot is being
written belong to the live state only.
"""

from __future__ import annotations

import io
import threading

import pytest
from flotilla.node.statemachine import (
    FileTarget,
    KVStateMachine,
    SnapshotError,
    encode_put,
    restore_snapshot,
    start_snapshot,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.statemachine.sm_workloads import finish, machine, replay, workloads

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def payload(kv: KVStateMachine) -> bytes:
    stream = io.BytesIO()
    kv.write_snapshot(stream)
    return stream.getvalue()


def restored(data: bytes) -> KVStateMachine:
    kv = machine()
    kv.restore(io.BytesIO(data))
    return kv


@SETTINGS
@given(workloads(max_size=60))
def test_restore_gives_back_the_full_state_including_sessions(entries):
    kv = replay(entries)
    copy = restored(payload(kv))
    assert copy.canonical_state() == kv.canonical_state()
    copy.check_invariants()
    assert payload(copy) == payload(kv)  # and writing it again is byte-identical


@SETTINGS
@given(workloads(max_size=40), workloads(max_size=20))
def test_a_restored_machine_continues_exactly_like_the_original(entries, more):
    kv = replay(entries)
    copy = restored(payload(kv))
    offset = kv.applied_index
    more = [(offset + i, c) for i, c in more]
    assert [copy.apply(i, c) for i, c in more] == [kv.apply(i, c) for i, c in more]
    assert copy.canonical_state() == kv.canonical_state()


@SETTINGS
@given(workloads(max_size=60))
def test_replicas_that_applied_the_same_entries_write_identical_snapshots(entries):
    # Different histories of internal layout (one was itself restored halfway) must not show.
    a = replay(entries)
    half = len(entries) // 2
    b = replay(entries[half:], restored(payload(replay(entries[:half]))))
    assert payload(a) == payload(b)


@pytest.mark.parametrize("method", ["fork", "overlay"])
@SETTINGS
@given(entries=workloads(max_size=40), during=workloads(max_size=20))
def test_concurrent_methods_write_the_same_bytes_as_a_plain_snapshot_of_that_moment(
    tmp_path, method, entries, during
):
    kv = replay(entries)
    expected = payload(kv)
    expected_live = replay([(kv.applied_index + i, c) for i, c in during], restored(expected))
    path = tmp_path / f"{method}.snap"
    job = start_snapshot(kv, FileTarget(path, fsync=False), method=method)
    offset = kv.applied_index
    for index, command in during:  # applied while the snapshot may still be in progress
        kv.apply(offset + index, command)
    result = finish(job)
    assert result.method == method
    assert path.read_bytes() == expected
    kv.check_invariants()
    assert kv.canonical_state() == expected_live.canonical_state()


class GatedStream(io.BytesIO):
    """Lets the first write through, then blocks until the test opens the gate: the writer
    is provably in the middle of the snapshot while the test applies."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.gate = threading.Event()

    def write(self, data):
        written = super().write(data)
        self.started.set()
        assert self.gate.wait(10)
        return written


@settings(max_examples=60, deadline=None)
@given(workloads(min_size=1, max_size=40), workloads(max_size=30))
def test_applies_during_an_overlay_snapshot_are_live_but_not_in_it(entries, during):
    kv = replay(entries)
    at_freeze = payload(kv)
    frozen = kv.freeze()
    stream = GatedStream()
    writer = threading.Thread(target=frozen.write, args=(stream,))
    writer.start()
    assert stream.started.wait(10)
    offset = kv.applied_index
    reference = restored(at_freeze)
    for index, command in during:
        assert kv.apply(offset + index, command) == reference.apply(offset + index, command)
        kv.check_invariants()
        # Reads during the snapshot see the live state (overlay first, then the frozen base).
        assert kv.canonical_state() == reference.canonical_state()
    stream.gate.set()
    writer.join(10)
    assert stream.getvalue() == at_freeze
    frozen.release()
    for step in range(200):  # the overlay drains into the base over the next applies
        kv.apply(offset + 1000 + step, encode_put("drain", b"", ts=0))
        reference.apply(offset + 1000 + step, encode_put("drain", b"", ts=0))
        kv.check_invariants()
    assert kv.canonical_state() == reference.canonical_state()
    assert payload(kv) == payload(reference)


def test_applies_during_a_fork_snapshot_are_live_but_not_in_it(tmp_path):
    kv = machine()
    for i in range(1, 2001):
        kv.apply(i, encode_put(f"k{i:05d}", b"before", ts=i))
    at_fork = payload(kv)
    job = start_snapshot(kv, FileTarget(tmp_path / "s"), method="fork")
    for i in range(2001, 3001):
        kv.apply(i, encode_put(f"k{i - 2000:05d}", b"after", ts=i))
    finish(job)
    assert (tmp_path / "s").read_bytes() == at_fork
    assert kv.get("k00001") == (b"after", 2001)


def test_a_second_freeze_while_one_is_outstanding_is_refused():
    kv = replay([(1, encode_put("k", b"v", ts=1))])
    frozen = kv.freeze()
    with pytest.raises(RuntimeError):
        kv.freeze()
    with pytest.raises(RuntimeError):
        kv.restore(io.BytesIO(payload(kv)))
    frozen.write(io.BytesIO())
    frozen.release()
    kv.freeze().release()  # fine again (and drains what the first one left)


def test_restoring_checks_the_kind_the_snapshot_was_written_by():
    kv = replay([(1, encode_put("k", b"v", ts=1))])
    copy = machine()
    restore_snapshot(copy, io.BytesIO(payload(kv)), "kv")
    assert copy.canonical_state() == kv.canonical_state()

    class Other(KVStateMachine):
        kind = "counter"

    with pytest.raises(SnapshotError, match="'kv'"):
        restore_snapshot(Other(), io.BytesIO(payload(kv)), "kv")


@given(st.data())
@settings(max_examples=40, deadline=None)
def test_a_damaged_payload_is_refused_and_leaves_the_machine_untouched(data):
    original = payload(replay([(i, encode_put(f"k{i}", b"v" * i, ts=i)) for i in range(1, 30)]))
    cut = data.draw(st.integers(0, len(original) - 1))
    damaged = original[:cut]
    if data.draw(st.booleans()):
        damaged = original + b"\x00"  # trailing garbage
    kv = replay([(1, encode_put("mine", b"x", ts=1))])
    before = kv.canonical_state()
    with pytest.raises(ValueError):
        kv.restore(io.BytesIO(damaged))
    assert kv.canonical_state() == before


def test_out_of_order_keys_in_a_snapshot_are_refused():
    import msgpack

    header = {
        "version": 1,
        "applied_index": 2,
        "clock": 0,
        "session_ttl_ms": 1000,
        "session_window": 4,
        "keys": 2,
        "sessions": 0,
    }
    body = b"".join(msgpack.packb(r) for r in (header, ["b", b"", 1], ["a", b"", 2]))
    with pytest.raises(ValueError, match="out of order"):
        machine().restore(io.BytesIO(body))
