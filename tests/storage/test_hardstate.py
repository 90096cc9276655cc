"""The hard state records the term, the vote and the commit index, and a log is checked
against it at open.

The file format: version 2 holds [term, vote, commit]; version 1 (the first release, and the
fixture it wrote) holds [term, vote] and reads as commit 0. The commit index is only ever
recorded as far as a completed fsync covers the log, so a crash can never make a sound log look
short; and a log that is short (its newest segment deleted) or has lost its hard state is
refused without anything in the data dir being touched.
"""

from __future__ import annotations

from pathlib import Path

import msgpack
import pytest
from flotilla.node.consensus.types import Entry, HardState, Membership, SnapshotMeta
from flotilla.node.storage import CorruptDataError, DiskStorage
from flotilla.node.storage.checkedfile import write_checked
from flotilla.node.storage.hardstate import MAGIC, HardStateFile, SavedHardState

from tests.fixtures import copy_v1, v1_expected
from tests.harness.datadir import files_of
from tests.storage.storage_testlib import CLUSTER, entries, newest_segment, segments

MEMBERSHIP = Membership(voters=frozenset({"n1"}))


def _file(tmp_path: Path) -> HardStateFile:
    return HardStateFile(tmp_path / "hardstate")


def test_term_vote_and_commit_round_trip(tmp_path):
    _file(tmp_path).save(SavedHardState(HardState(5, "n2"), 41))
    assert _file(tmp_path).load() == SavedHardState(HardState(5, "n2"), 41)


def test_a_missing_file_is_told_apart_from_a_zero_one(tmp_path):
    assert _file(tmp_path).load() is None
    _file(tmp_path).save(SavedHardState())
    assert _file(tmp_path).load() == SavedHardState(HardState(0, None), 0)


def test_a_file_in_the_first_format_reads_with_commit_0(tmp_path):
    write_checked(tmp_path / "hardstate", MAGIC, 1, msgpack.packb([3, "n2"]), fsync=False)
    assert _file(tmp_path).load() == SavedHardState(HardState(3, "n2"), 0)


def test_the_first_releases_hard_state_reads_and_opens(tmp_path):
    expected = v1_expected()
    data_dir = copy_v1("datadir", tmp_path / "datadir")
    saved = _file(data_dir).load()
    assert saved == SavedHardState(HardState(expected["term"], expected["member"]), 0)
    log = DiskStorage(data_dir, cluster_id=expected["cluster_id"])
    assert log.recorded_commit == 0
    assert log.last_index() == expected["last_index"]
    log.close()  # records what it may: nothing was noted, so the file stays as it was
    assert _file(data_dir).load() == saved


@pytest.mark.parametrize("payload", [[3], [3, "n2", 7, 8], [3, 5, 0], [3, None, -1],
                                     [3, None, "7"], [-1, None, 0], {"term": 3}])
def test_a_payload_that_is_not_a_hard_state_is_refused(tmp_path, payload):
    write_checked(tmp_path / "hardstate", MAGIC, 2, msgpack.packb(payload), fsync=False)
    with pytest.raises(CorruptDataError) as caught:
        _file(tmp_path).load()
    assert caught.value.path == str(tmp_path / "hardstate")


def test_a_newer_format_is_refused_not_guessed(tmp_path):
    write_checked(tmp_path / "hardstate", MAGIC, 3, msgpack.packb([3, None, 7]), fsync=False)
    with pytest.raises(CorruptDataError, match="format version 3 is not supported"):
        _file(tmp_path).load()


# --- recording the commit index -----------------------------------------------------------------


def _log(path: Path, segment_bytes: int = 1 << 20) -> DiskStorage:
    log = DiskStorage(path, cluster_id=CLUSTER, segment_bytes=segment_bytes)
    if log.last_index() == 0 and log.recover().snapshot.membership != MEMBERSHIP:
        log.install_snapshot(SnapshotMeta(0, 0, MEMBERSHIP))
    return log


def test_the_commit_is_recorded_only_as_far_as_the_log_is_synced(tmp_path):
    log = _log(tmp_path)
    log.append(entries(1, 11, term=1))
    log.note_commit(10)
    assert not log.save_commit()  # nothing synced yet: a crash could lose all ten
    assert _file(tmp_path).load().commit == 0
    log.sync()
    assert log.save_commit()
    assert _file(tmp_path).load().commit == 10
    assert not log.save_commit()  # unchanged: no rewrite
    log.close()
    assert _log(tmp_path).recorded_commit == 10


def test_a_hard_state_change_carries_the_commit_with_it(tmp_path):
    log = _log(tmp_path)
    log.append(entries(1, 6, term=1))
    log.sync()
    log.note_commit(4)
    log.save_hard_state(HardState(2, "n1"))
    assert _file(tmp_path).load() == SavedHardState(HardState(2, "n1"), 4)
    log.save_hard_state(HardState(3, None))  # never goes back, whatever is noted
    assert _file(tmp_path).load() == SavedHardState(HardState(3, None), 4)


def test_a_truncated_suffix_is_not_vouched_for_until_its_replacement_is_synced(tmp_path):
    log = _log(tmp_path)
    log.append(entries(1, 11, term=1))
    log.sync()
    log.note_commit(5)
    log.append(entries(6, 10, term=2))  # a new leader replaces the uncommitted 6..10
    log.note_commit(8)
    log.save_commit()
    assert log.recorded_commit == 5  # 6..8 of term 2 are not durable yet
    log.sync()
    log.save_commit()
    assert log.recorded_commit == 8


def test_close_records_the_commit(tmp_path):
    log = _log(tmp_path)
    log.append(entries(1, 8, term=1))
    log.sync()
    log.note_commit(7)
    log.close()
    assert _file(tmp_path).load().commit == 7


# --- refusals at open -----------------------------------------------------------------------------


def _written(tmp_path: Path, count: int, segment_bytes: int = 4096, *, commit: int) -> None:
    log = _log(tmp_path, segment_bytes)
    log.save_hard_state(HardState(1, "n1"))
    log.append([Entry(i, 1, 0, b"x" * 200) for i in range(1, count + 1)])
    log.sync()
    log.note_commit(commit)
    log.close()


def test_a_log_without_its_hard_state_is_refused_and_left_as_it_was(tmp_path):
    _written(tmp_path, 10, commit=10)
    (tmp_path / "hardstate").unlink()
    before = files_of(tmp_path)
    with pytest.raises(CorruptDataError) as caught:
        _log(tmp_path)
    assert caught.value.path == str(tmp_path / "hardstate")
    assert "file is missing although the log" in str(caught.value)
    assert "could vote twice" in str(caught.value)
    assert files_of(tmp_path) == before


def test_an_empty_log_without_a_hard_state_gets_a_zero_one(tmp_path):
    """A data dir an older build created and left before anything happened (no vote, no
    entry) is not refused: there is nothing it could have forgotten."""
    DiskStorage(tmp_path, cluster_id=CLUSTER).close()
    (tmp_path / "hardstate").unlink()
    DiskStorage(tmp_path, cluster_id=CLUSTER).close()
    assert _file(tmp_path).load() == SavedHardState()


def test_a_log_that_ends_before_its_recorded_commit_is_refused_and_left_as_it_was(tmp_path):
    _written(tmp_path, 60, commit=60)
    assert len(segments(tmp_path)) > 2
    deleted = newest_segment(tmp_path)
    deleted.unlink()
    survivor = newest_segment(tmp_path)
    before = files_of(tmp_path)
    with pytest.raises(CorruptDataError) as caught:
        _log(tmp_path)
    assert caught.value.path == str(survivor)
    assert caught.value.offset == survivor.stat().st_size
    ends = int(deleted.name.removesuffix(".seg")) - 1
    assert str(caught.value) == (
        f"corrupt data in {survivor} at byte offset {survivor.stat().st_size}: the log ends at "
        f"index {ends}, in this segment, but {tmp_path / 'hardstate'} records index 60 as "
        "committed: committed entries are missing (a newer segment was deleted, or the volume "
        "was restored from an older copy); this member's durable state cannot be trusted: "
        "restore it from its peers (stop it, remove its data dir, and re-add it to the cluster "
        "as a learner)")
    assert files_of(tmp_path) == before  # the sealed survivor is still read-only, too


def test_a_log_whose_every_segment_is_gone_is_refused_naming_the_log_directory(tmp_path):
    _written(tmp_path, 5, commit=5)
    for path in segments(tmp_path):
        path.unlink()
    before = files_of(tmp_path)
    with pytest.raises(CorruptDataError) as caught:
        _log(tmp_path)
    assert caught.value.path == str(tmp_path / "wal")
    assert "no segment holds an entry" in str(caught.value)
    assert files_of(tmp_path) == before


def test_losing_entries_past_the_recorded_commit_is_a_crash_not_damage(tmp_path):
    """Only what the hard state says was committed is missed: a newest segment holding just
    uncommitted entries may go (as a crash before its fsync would take it)."""
    _written(tmp_path, 60, commit=0)
    log = _log(tmp_path, 4096)
    sealed_end = log.sealed_segments()[-1].last_index
    log.note_commit(sealed_end)
    log.close()
    newest_segment(tmp_path).unlink()
    reopened = _log(tmp_path, 4096)
    assert reopened.last_index() == sealed_end
    assert reopened.recorded_commit == sealed_end
