"""Snapshot files: streamed in and out, visible only once durable, at most two on disk, and a
damaged newest one falls back to the one before it."""

from __future__ import annotations

import io
import logging
import random
import shutil
import tracemalloc

import pytest
from flotilla.node.consensus.types import Membership, SnapshotMeta
from flotilla.node.storage import CorruptDataError, SnapshotStore

CONFIG = Membership(voters=frozenset({"a", "b", "c"}), learners=frozenset({"d"}))
JOINT = Membership(voters=frozenset({"a", "b"}), outgoing=frozenset({"a", "b", "c"}))
STORE_LOGGER = "flotilla.node.storage.snapshots"


def payload_of(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def write_snapshot(store: SnapshotStore, index: int, payload: bytes, *, membership=CONFIG):
    meta = SnapshotMeta(index=index, term=index // 10 + 1, membership=membership,
                        ts_ms=1_800_000_000_000 + index)
    with store.begin(meta, "kv") as writer:
        for start in range(0, len(payload), 100_000):
            writer.write(payload[start : start + 100_000])
        path = writer.commit()
    return meta, path


def read_payload(store: SnapshotStore, path) -> bytes:
    with store.open_payload(path) as reader:
        return reader.read()


def flip_bit(path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x04
    path.write_bytes(bytes(raw))


def snapshot_files(directory):
    return sorted(p.name for p in directory.iterdir())


def test_no_snapshot_yet(tmp_path):
    assert SnapshotStore(tmp_path / "snap").latest() is None


@pytest.mark.parametrize("size", [0, 1, 1_500_000])
def test_a_snapshot_round_trips(tmp_path, size):
    store = SnapshotStore(tmp_path / "snap")
    payload = payload_of(size, seed=size)
    meta, path = write_snapshot(store, 42, payload, membership=JOINT)
    found = SnapshotStore(tmp_path / "snap").latest()
    assert found == (meta, "kv", path)
    with store.open_payload(found.path) as reader:
        assert (reader.size, reader.meta, reader.kind) == (size, meta, "kv")
        copy = io.BytesIO()
        shutil.copyfileobj(reader, copy, 64 * 1024)
    assert copy.getvalue() == payload


def test_a_writer_accepts_a_stream(tmp_path):
    store = SnapshotStore(tmp_path / "snap")
    payload = payload_of(300_000, seed=1)
    with store.begin(SnapshotMeta(7, 1, CONFIG), "kv") as writer:
        shutil.copyfileobj(io.BytesIO(payload), writer)
        writer.commit()
    assert read_payload(store, store.latest().path) == payload


def test_the_newest_snapshot_wins_and_older_ones_are_removed_once_it_is_durable(tmp_path):
    directory = tmp_path / "snap"
    store = SnapshotStore(directory)
    for index in (10, 20, 30):
        write_snapshot(store, index, payload_of(1000, index))
        assert len(snapshot_files(directory)) == 1
    writer = store.begin(SnapshotMeta(40, 5, CONFIG), "kv")
    writer.write(b"in progress")
    files = snapshot_files(directory)
    assert len(files) == 2 and files[0].startswith("snap-0000000000000030")
    assert store.latest().meta.index == 30  # the one in progress is invisible
    writer.commit()
    assert snapshot_files(directory) == ["snap-0000000000000040-0000000000000005.snap"]
    assert store.latest().meta.index == 40


def test_a_damaged_newest_snapshot_falls_back_to_the_older_one(tmp_path, caplog):
    directory = tmp_path / "snap"
    store = SnapshotStore(directory)
    older_payload = payload_of(5000, 1)
    older_meta, older_path = write_snapshot(store, 10, older_payload)
    older_bytes = older_path.read_bytes()
    _, newer_path = write_snapshot(store, 20, payload_of(5000, 2))
    # A crash between the newer one's rename and the removal of the older one keeps both.
    older_path.write_bytes(older_bytes)
    assert store.latest().meta.index == 20
    flip_bit(newer_path, newer_path.stat().st_size - 100)
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        found = store.latest()
    assert found == (older_meta, "kv", older_path)
    assert any(
        "damaged" in r.getMessage() and newer_path.name in r.getMessage() for r in caplog.records
    )
    assert read_payload(store, found.path) == older_payload


def test_no_snapshot_that_verifies_is_an_error_not_an_absence(tmp_path):
    store = SnapshotStore(tmp_path / "snap")
    _, path = write_snapshot(store, 10, payload_of(5000, 1))
    flip_bit(path, 2000)
    with pytest.raises(CorruptDataError, match="payload checksum mismatch") as caught:
        store.latest()
    assert caught.value.path == str(path)


@pytest.mark.parametrize(
    "damage", ["magic", "kind", "time", "membership", "payload length", "trailer", "truncated",
               "renamed"]
)
def test_damage_anywhere_in_a_snapshot_file_is_detected(tmp_path, damage):
    store = SnapshotStore(tmp_path / "snap")
    _, path = write_snapshot(store, 10, payload_of(5000, 1))
    size = path.stat().st_size
    membership_length = len(CONFIG.encode())
    position = 8 + 8 + 8 + 4  # index, term, time, membership length
    header_length = 12 + len(b"kv") + position + membership_length + 8
    if damage == "magic":
        flip_bit(path, 0)
    elif damage == "kind":
        flip_bit(path, 12)
    elif damage == "time":
        flip_bit(path, 12 + 2 + 16)
    elif damage == "membership":
        flip_bit(path, 12 + 2 + position + 3)
    elif damage == "payload length":
        flip_bit(path, header_length - 8)
    elif damage == "trailer":
        flip_bit(path, size - 12)
    elif damage == "truncated":
        with open(path, "r+b") as file:
            file.truncate(size - 1)
    else:
        path.rename(path.with_name("snap-0000000000000011-0000000000000002.snap"))
    with pytest.raises(CorruptDataError) as caught:
        store.latest()
    assert "snap-00000000000000" in str(caught.value)


def test_reading_a_payload_that_went_bad_after_latest_fails_at_its_end(tmp_path):
    store = SnapshotStore(tmp_path / "snap")
    _, path = write_snapshot(store, 10, payload_of(5000, 1))
    found = store.latest()
    flip_bit(path, 1000)
    with pytest.raises(CorruptDataError, match="payload checksum"):
        read_payload(store, found.path)


def test_a_crash_mid_write_leaves_a_temp_file_that_is_ignored_and_cleaned_up(tmp_path, caplog):
    directory = tmp_path / "snap"
    store = SnapshotStore(directory)
    meta, path = write_snapshot(store, 10, payload_of(1000, 1))
    writer = store.begin(SnapshotMeta(20, 3, CONFIG), "kv")
    writer.write(payload_of(3000, 2))
    writer._file.flush()  # the process dies here: nothing else happens to the writer
    temp = writer.temp_path
    assert temp.exists() and len(snapshot_files(directory)) == 2
    assert store.latest() == (meta, "kv", path)
    with caplog.at_level(logging.WARNING, logger=STORE_LOGGER):
        restarted = SnapshotStore(directory)
    assert not temp.exists()
    assert any("interrupted" in r.getMessage() for r in caplog.records)
    assert restarted.latest() == (meta, "kv", path)
    assert snapshot_files(directory) == [path.name]


def test_an_aborted_or_failed_write_leaves_nothing(tmp_path):
    directory = tmp_path / "snap"
    store = SnapshotStore(directory)
    writer = store.begin(SnapshotMeta(10, 1, CONFIG), "kv")
    writer.write(b"partial")
    writer.abort()
    with (
        pytest.raises(RuntimeError, match="state machine failed"),
        store.begin(SnapshotMeta(11, 1, CONFIG), "kv") as writer,
    ):
        writer.write(b"partial")
        raise RuntimeError("state machine failed")
    assert snapshot_files(directory) == []
    assert store.latest() is None


def test_one_writer_at_a_time(tmp_path):
    store = SnapshotStore(tmp_path / "snap")
    first = store.begin(SnapshotMeta(10, 1, CONFIG), "kv")
    with pytest.raises(RuntimeError, match="already being written"):
        store.begin(SnapshotMeta(11, 1, CONFIG), "kv")
    first.abort()
    store.begin(SnapshotMeta(11, 1, CONFIG), "kv").abort()


def test_large_snapshots_are_streamed_not_held_in_memory(tmp_path):
    store = SnapshotStore(tmp_path / "snap")
    chunk = payload_of(1 << 20, seed=3)
    chunks = 24
    tracemalloc.start()
    try:
        with store.begin(SnapshotMeta(99, 9, CONFIG), "kv") as writer:
            for _ in range(chunks):
                writer.write(chunk)
            writer.commit()
        found = store.latest()
        seen = 0
        with store.open_payload(found.path) as reader:
            buffer = bytearray(1 << 20)
            while count := reader.readinto(buffer):
                assert buffer[:count] == chunk[seen % len(chunk) : seen % len(chunk) + count]
                seen += count
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == chunks * len(chunk)
    assert peak < 6 * len(chunk), f"peak {peak} bytes for a {seen}-byte snapshot"
