"""The `LogStorage` contract, run against every implementation (memory and disk).

Each test states one rule of protocol.py. "Reopen" is a crash and restart: for the memory
backend it keeps only what was synced, for the disk backend it recovers from the files.
"""

from __future__ import annotations

import pytest
from flotilla.node.consensus.types import (
    EMPTY_MEMBERSHIP,
    Entry,
    EntryKind,
    HardState,
    Membership,
    SnapshotMeta,
)
from flotilla.node.storage import CompactedError, LogStorage, UnavailableError

from tests.storage.storage_testlib import DiskBackend, MemoryBackend, entries

CONFIG_AB = Membership(voters=frozenset({"a", "b"}))
CONFIG_ABC = Membership(voters=frozenset({"a", "b", "c"}), learners=frozenset({"d"}))


@pytest.fixture(params=[MemoryBackend, DiskBackend], ids=lambda backend: backend.name)
def backend(request, tmp_path):
    return request.param(tmp_path)


def assert_same_state(before: LogStorage, after: LogStorage) -> None:
    """Everything a reader can observe is equal."""
    assert after.recover() == before.recover()
    assert after.first_index() == before.first_index()
    assert after.last_index() == before.last_index()
    lo, hi = before.first_index(), before.last_index() + 1
    assert after.entries(lo, hi) == before.entries(lo, hi)
    assert after.term(lo - 1) == before.term(lo - 1)


def test_implements_the_protocol(backend):
    assert isinstance(backend.open(), LogStorage)


def test_a_new_log_is_empty_and_starts_at_index_one(backend):
    log = backend.open()
    assert (log.first_index(), log.last_index(), log.term(0)) == (1, 0, 0)
    assert log.entries(1, 1) == []
    state = log.recover()
    assert state.hard_state == HardState()
    assert state.snapshot == SnapshotMeta(0, 0, EMPTY_MEMBERSHIP)
    assert state.entries == []


def test_appended_entries_read_back_in_order(backend):
    log = backend.open()
    written = entries(1, 21, term=1) + entries(21, 41, term=2)
    log.append(written[:5])
    log.append(written[5:])
    assert (log.first_index(), log.last_index()) == (1, 40)
    assert log.entries(1, 41) == written
    assert log.entries(7, 9) == written[6:8]
    assert [log.term(i) for i in (0, 1, 20, 21, 40)] == [0, 1, 1, 2, 2]
    assert log.recover().entries == written


def test_reads_outside_the_log_raise(backend):
    log = backend.open()
    log.append(entries(1, 11, term=1))
    with pytest.raises(CompactedError):
        log.entries(0, 3)
    with pytest.raises(UnavailableError):
        log.entries(5, 12)
    with pytest.raises(UnavailableError):
        log.term(11)
    with pytest.raises(ValueError):
        log.entries(6, 5)


def test_an_empty_append_changes_nothing(backend):
    log = backend.open()
    log.append(entries(1, 4, term=1))
    log.append([])
    assert log.last_index() == 3


def test_appending_after_a_gap_is_a_caller_bug(backend):
    log = backend.open()
    log.append(entries(1, 4, term=1))
    with pytest.raises(ValueError, match="gap"):
        log.append(entries(5, 6, term=1))
    assert log.last_index() == 3


def test_a_batch_that_is_not_contiguous_is_refused_whole(backend):
    log = backend.open()
    log.append(entries(1, 4, term=1))
    with pytest.raises(ValueError, match="contiguous"):
        log.append([Entry(4, 1), Entry(5, 1), Entry(7, 1)])
    assert log.last_index() == 3


def test_an_append_replaces_the_stored_suffix_from_its_first_index(backend):
    log = backend.open()
    log.append(entries(1, 11, term=1))
    replacement = entries(6, 8, term=2, salt="new")
    log.append(replacement)
    assert log.last_index() == 7
    assert log.entries(1, 8) == entries(1, 6, term=1) + replacement
    log.sync()
    reopened = backend.reopen(log)
    assert reopened.entries(1, 8) == entries(1, 6, term=1) + replacement
    assert reopened.last_index() == 7


def test_a_suffix_replaced_at_any_index_survives_reopen(backend):
    """Every truncation point, so that with small segments some fall exactly on a segment's
    first record, some in the middle, and some many segments back."""
    for cut in range(1, 31):
        name = f"cut{cut}"
        log = backend.open(name)
        log.append(entries(1, 31, term=1))
        log.sync()
        if backend.segment_count(name) is not None:
            assert backend.segment_count(name) > 3
        replacement = entries(cut, cut + 12, term=2, salt="new")
        log.append(replacement)
        log.sync()
        expected = entries(1, cut, term=1) + replacement
        assert log.entries(1, log.last_index() + 1) == expected
        reopened = backend.reopen(log)
        assert reopened.entries(1, reopened.last_index() + 1) == expected
        reopened.append(entries(cut + 12, cut + 14, term=2, salt="new"))
        reopened.sync()
        again = backend.reopen(reopened)
        assert again.entries(1, cut + 14) == expected + entries(cut + 12, cut + 14, 2, "new")
        again.close()


def test_an_overwrite_spanning_segments_replaces_all_of_them(backend):
    log = backend.open()
    log.append(entries(1, 41, term=1))
    log.sync()
    segments_before = backend.segment_count()
    log.append(entries(9, 12, term=2, salt="x"))  # cuts into an early segment
    if segments_before is not None:
        assert backend.segment_count() < segments_before
    log.append(entries(12, 45, term=2, salt="x"))  # and grows across new ones
    log.sync()
    expected = entries(1, 9, term=1) + entries(9, 45, term=2, salt="x")
    assert log.entries(1, 45) == expected
    assert backend.reopen(log).entries(1, 45) == expected


def test_hard_state_round_trips_and_is_durable_without_sync(backend):
    log = backend.open()
    log.save_hard_state(HardState(term=3, vote="n2"))
    log = backend.reopen(log)
    assert log.recover().hard_state == HardState(term=3, vote="n2")
    log.save_hard_state(HardState(term=4, vote=None))
    assert backend.reopen(log).recover().hard_state == HardState(term=4, vote=None)


def test_a_snapshot_the_log_holds_keeps_the_entries_after_it(backend):
    log = backend.open()
    log.append(entries(1, 11, term=1) + entries(11, 21, term=2))
    meta = SnapshotMeta(index=12, term=2, membership=CONFIG_AB)
    log.install_snapshot(meta)
    assert (log.first_index(), log.last_index(), log.term(12)) == (13, 20, 2)
    assert log.entries(13, 21) == entries(13, 21, term=2)
    with pytest.raises(CompactedError):
        log.entries(12, 13)
    state = log.recover()
    assert state.snapshot == meta
    assert state.entries == entries(13, 21, term=2)
    assert_same_state(log, backend.reopen(log))


def test_a_snapshot_the_log_contradicts_discards_the_whole_log(backend):
    log = backend.open()
    log.append(entries(1, 11, term=1) + entries(11, 21, term=2))
    meta = SnapshotMeta(index=12, term=3, membership=CONFIG_AB)
    log.install_snapshot(meta)
    assert (log.first_index(), log.last_index(), log.term(12)) == (13, 12, 3)
    assert log.recover().entries == []
    log = backend.reopen(log)
    assert (log.first_index(), log.last_index()) == (13, 12)
    assert log.recover().snapshot == meta
    log.append(entries(13, 16, term=3))
    log.sync()
    log = backend.reopen(log)
    assert log.recover().entries == entries(13, 16, term=3)


def test_a_snapshot_beyond_the_log_discards_it(backend):
    log = backend.open()
    log.append(entries(1, 11, term=1))
    log.install_snapshot(SnapshotMeta(index=50, term=4, membership=CONFIG_AB))
    assert (log.first_index(), log.last_index(), log.term(50)) == (51, 50, 4)
    log = backend.reopen(log)
    assert (log.first_index(), log.last_index(), log.term(50)) == (51, 50, 4)


def test_a_snapshot_older_than_the_current_one_is_refused(backend):
    log = backend.open()
    log.install_snapshot(SnapshotMeta(index=50, term=4, membership=CONFIG_AB))
    with pytest.raises(ValueError, match="older"):
        log.install_snapshot(SnapshotMeta(index=40, term=4, membership=CONFIG_AB))


def test_entries_covered_by_a_snapshot_cannot_be_replaced(backend):
    log = backend.open(keep_trailing_entries=10)
    log.append(entries(1, 21, term=1))
    log.compact(15)
    with pytest.raises(ValueError, match="snapshot"):
        log.append(entries(15, 17, term=2))
    log.append(entries(16, 18, term=2))  # right after the snapshot is fine
    assert log.last_index() == 17


def test_compact_moves_the_snapshot_and_frees_what_it_covers(backend):
    log = backend.open()
    log.append(entries(1, 41, term=1))
    log.compact(25)
    state = log.recover()
    assert (state.snapshot.index, state.snapshot.term) == (25, 1)
    assert state.entries == entries(26, 41, term=1)
    assert 1 < log.first_index() <= 26
    assert log.entries(log.first_index(), 41) == entries(log.first_index(), 41, term=1)
    assert log.term(log.first_index() - 1) == 1
    assert_same_state(log, backend.reopen(log))


def test_compact_keeps_trailing_entries_for_slow_followers(backend):
    log = backend.open(keep_trailing_entries=10)
    log.append(entries(1, 41, term=1))
    log.compact(30)
    assert log.recover().snapshot.index == 30
    assert 1 < log.first_index() <= 21
    assert log.entries(21, 41) == entries(21, 41, term=1)
    reopened = backend.reopen(log)
    assert reopened.entries(21, 41) == entries(21, 41, term=1)
    assert reopened.recover().snapshot.index == 30


def test_compact_records_the_configuration_and_the_time_at_its_index(backend):
    log = backend.open()
    written = [
        *entries(1, 5, term=1),
        Entry(5, 1, EntryKind.MEMBERSHIP, CONFIG_AB.encode(), entries(5, 6, term=1)[0].ts_ms),
        *entries(6, 15, term=1),
        Entry(15, 2, EntryKind.MEMBERSHIP, CONFIG_ABC.encode(), entries(15, 16, term=2)[0].ts_ms),
        *entries(16, 25, term=2),
    ]
    ts = {e.index: e.ts_ms for e in written}
    for lo, hi in [(0, 4), (4, 5), (5, 14), (14, 15), (15, 24)]:
        log.append(written[lo:hi])
    log.compact(3)
    assert log.recover().snapshot.membership == EMPTY_MEMBERSHIP
    assert log.recover().snapshot.ts_ms == ts[3]
    log.compact(10)
    assert log.recover().snapshot == SnapshotMeta(10, 1, CONFIG_AB, ts[10])
    log.compact(20)
    assert log.recover().snapshot == SnapshotMeta(20, 2, CONFIG_ABC, ts[20])
    assert backend.reopen(log).recover().snapshot == SnapshotMeta(20, 2, CONFIG_ABC, ts[20])


def test_an_installed_snapshot_keeps_its_time_across_a_reopen(backend):
    log = backend.open()
    log.append(entries(1, 11, term=1))
    meta = SnapshotMeta(30, 4, CONFIG_AB, 1_800_000_123_456)
    log.install_snapshot(meta)
    assert backend.reopen(log).recover().snapshot == meta


def test_compact_beyond_the_last_index_is_refused(backend):
    log = backend.open()
    log.append(entries(1, 11, term=1))
    with pytest.raises(ValueError):
        log.compact(11)


def test_the_log_goes_on_after_compaction_and_reopen(backend):
    log = backend.open()
    log.append(entries(1, 41, term=1))
    log.compact(30)
    log = backend.reopen(log)
    log.append(entries(41, 61, term=2))
    log.sync()
    log = backend.reopen(log)
    assert log.recover().entries == entries(31, 41, term=1) + entries(41, 61, term=2)


def test_reopen_returns_exactly_the_synced_state(backend):
    """A mixed history, synced: the reopened log must be indistinguishable from the original."""
    log = backend.open(keep_trailing_entries=5)
    log.append(entries(1, 31, term=1))
    log.save_hard_state(HardState(term=1, vote="a"))
    log.sync()
    assert_same_state(log, log := backend.reopen(log))
    log.append(entries(20, 37, term=2))
    log.compact(25)
    log.save_hard_state(HardState(term=2, vote="b"))
    log.append(entries(37, 50, term=2))
    log.sync()
    assert_same_state(log, log := backend.reopen(log))
    log.install_snapshot(SnapshotMeta(45, 2, CONFIG_AB))
    log.append(entries(46, 52, term=3))
    log.sync()
    assert_same_state(log, backend.reopen(log))


def test_the_commit_index_is_recorded_only_as_far_as_the_log_is_durable(backend):
    """`note_commit` only remembers; `save_commit` records what is synced of it, and a reopened
    log hands it back, so the member applies that much again before hearing from a leader."""
    log = backend.open()
    log.append(entries(1, 11, term=1))
    log.note_commit(10)
    assert not log.save_commit()  # nothing is durable yet: a crash could lose all ten
    log.sync()
    assert log.save_commit()
    assert not log.save_commit()  # unchanged
    log.append(entries(11, 16, term=1))
    log.note_commit(15)  # not synced: recorded no further than 10, even at close
    assert backend.reopen(log).recover().commit == 10


def test_a_hard_state_and_a_close_record_the_noted_commit(backend):
    log = backend.open()
    log.append(entries(1, 6, term=1))
    log.sync()
    log.note_commit(5)
    log.save_hard_state(HardState(term=2, vote="a"))  # the commit rides with it
    assert log.recover().commit == 5
    log.append(entries(6, 9, term=2))
    log.sync()
    log.note_commit(8)
    log.close()
    assert backend.reopen(log).recover().commit == 8


def test_memory_crash_loses_exactly_the_unsynced_entries(tmp_path):
    log = MemoryBackend(tmp_path).open()
    log.append(entries(1, 11, term=1))
    log.sync()
    log.append(entries(11, 16, term=1))
    assert log.crash_copy().last_index() == 10
    log.append(entries(8, 12, term=2))  # a truncation is durable at once, the new entries not
    crashed = log.crash_copy()
    assert crashed.entries(1, crashed.last_index() + 1) == entries(1, 8, term=1)
    log.sync()
    assert log.crash_copy().entries(1, 12) == entries(1, 8, term=1) + entries(8, 12, term=2)
