"""The disk log, driven through long random histories, never disagrees with the reference.

Random appends (many of them truncating), syncs, hard-state saves, snapshot installs (matching
and contradicting), compactions and reopens, applied to `DiskStorage` (tiny segments, so every
operation crosses segment boundaries) and `MemoryStorage` alike; after every step everything a
reader can see must be equal. The one permitted difference: compaction frees whole segments on
disk, so the disk log may keep more trailing entries (its `first_index` may be lower).
"""

from __future__ import annotations

import random

import pytest
from flotilla.node.consensus.types import Entry, EntryKind, HardState, Membership, SnapshotMeta
from flotilla.node.storage import DiskStorage, MemoryStorage

from tests.storage.storage_testlib import CLUSTER, payload

CONFIGS = [Membership(frozenset({"a"})), Membership(frozenset({"a", "b", "c"}))]


def open_disk(path, keep):
    return DiskStorage(path, cluster_id=CLUSTER, segment_bytes=300, keep_trailing_entries=keep)


def assert_agree(disk: DiskStorage, memory: MemoryStorage, step: str) -> None:
    assert disk.recover() == memory.recover(), step
    assert disk.last_index() == memory.last_index(), step
    assert disk.first_index() <= memory.first_index(), step
    lo, hi = memory.first_index(), memory.last_index() + 1
    assert disk.entries(lo, hi) == memory.entries(lo, hi), step
    assert [disk.term(i) for i in range(lo - 1, hi)] == [
        memory.term(i) for i in range(lo - 1, hi)
    ], step


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_histories_agree_with_the_reference(tmp_path, seed):
    rng = random.Random(seed)
    keep = rng.choice([0, 3, 20])
    disk, memory = open_disk(tmp_path, keep), MemoryStorage(keep_trailing_entries=keep)
    term = 1
    for step_number in range(250):
        op = rng.choices(
            ["append", "sync", "hard_state", "install", "compact", "reopen"],
            weights=[60, 15, 5, 3, 7, 10],
        )[0]
        step = f"seed {seed} step {step_number}: {op}"
        last, snapshot_index = memory.last_index(), memory.recover().snapshot.index
        if op == "append":
            start = rng.randint(max(snapshot_index + 1, last - 8), last + 1)
            if rng.random() < 0.3:
                term += 1
            batch = []
            for index in range(start, start + rng.choice([1, 2, 3, 8, 20])):
                if rng.random() < 0.1:
                    config = rng.choice(CONFIGS)
                    batch.append(Entry(index, term, EntryKind.MEMBERSHIP, config.encode()))
                else:
                    batch.append(Entry(index, term, EntryKind.NORMAL, payload(index, str(term))))
            disk.append(batch)
            memory.append(batch)
        elif op == "sync":
            disk.sync()
            memory.sync()
        elif op == "hard_state":
            hard_state = HardState(term=term, vote=rng.choice([None, "a", "b"]))
            disk.save_hard_state(hard_state)
            memory.save_hard_state(hard_state)
        elif op == "install":
            index = rng.randint(snapshot_index, last + 10)
            matching = rng.random() < 0.5 and index <= last
            snapshot_term = memory.term(index) if matching else term + 1
            term = max(term, snapshot_term)
            meta = SnapshotMeta(index, snapshot_term, rng.choice(CONFIGS))
            disk.install_snapshot(meta)
            memory.install_snapshot(meta)
        elif op == "compact" and last >= snapshot_index:
            index = rng.randint(snapshot_index, last)
            disk.compact(index)
            memory.compact(index)
        elif op == "reopen":
            disk.sync()
            memory.sync()
            disk.close()
            disk, memory = open_disk(tmp_path, keep), memory.crash_copy()
        assert_agree(disk, memory, step)
    disk.close()
