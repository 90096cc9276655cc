"""A member upgraded from the first release goes on writing into the log it has: its newest
segment, a version 1 segment, takes version 2 records (with times) after its version 1 ones, and
every rule of recovery holds for such a mixed segment too."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest
from flotilla.node.consensus.types import Entry
from flotilla.node.storage import CorruptDataError, DiskStorage, wal
from flotilla.node.storage import segment as wal_segment
from flotilla.node.storage.segment import RECORD_V1, encode_header, encode_record

from tests.storage.storage_testlib import CLUSTER, EPOCH_MS, entries, newest_segment, segments


def open_log(path: Path, segment_bytes: int = 1 << 20) -> DiskStorage:
    return DiskStorage(path, cluster_id=CLUSTER, segment_bytes=segment_bytes)


def first_release_log(path: Path, last: int, monkeypatch: pytest.MonkeyPatch) -> list[Entry]:
    """Entries 1..last written the way the first release wrote them (several segments)."""
    written = entries(1, last + 1, term=1, timed=False)
    with monkeypatch.context() as patch:
        patch.setattr(wal, "encode_header", functools.partial(encode_header, version=1))
        patch.setattr(wal, "record_encoder",
                      functools.partial(wal_segment.record_encoder, RECORD_V1))
        log = open_log(path, segment_bytes=256)
        log.append(written)
        log.sync()
        log.close()
    assert all(p.read_bytes()[8:10] == b"\x01\x00" for p in segments(path))
    return written


def timed(lo: int, hi: int, term: int) -> list[Entry]:
    return [Entry(i, term, 0, f"new {i}".encode() * 3, EPOCH_MS + i) for i in range(lo, hi)]


def test_new_records_follow_old_ones_in_the_newest_segment_and_survive_a_restart(
        tmp_path, monkeypatch):
    old = first_release_log(tmp_path, 30, monkeypatch)
    newest = newest_segment(tmp_path)
    log = open_log(tmp_path)
    new = timed(31, 36, term=2)
    log.append(new)
    log.sync()
    log.close()
    assert newest_segment(tmp_path) == newest  # the version 1 segment took them
    assert open_log(tmp_path).recover().entries == old + new


def test_a_cut_at_every_byte_of_new_records_in_an_old_segment_is_a_torn_tail(
        tmp_path, monkeypatch):
    old = first_release_log(tmp_path / "base", 30, monkeypatch)
    log = open_log(tmp_path / "base")
    new = timed(31, 33, term=2)
    log.append(new)
    log.sync()
    log.close()
    newest = newest_segment(tmp_path / "base")
    size = newest.stat().st_size
    ends = [size - sum(len(encode_record(e)) for e in new)]
    for entry in new:
        ends.append(ends[-1] + len(encode_record(entry)))
    for cut in range(ends[0], size):
        case = tmp_path / f"cut{cut}"
        shutil.copytree(tmp_path / "base", case)
        with open(case / "wal" / newest.name, "r+b") as file:
            file.truncate(cut)
        whole = sum(1 for end in ends[1:] if end <= cut)
        log = open_log(case)
        assert log.recover().entries == old + new[:whole], f"cut at byte {cut}"
        more = timed(31 + whole, 32 + whole, term=3)
        log.append(more)
        log.sync()
        log.close()
        assert open_log(case).recover().entries == old + new[:whole] + more, f"cut at {cut}"
        shutil.rmtree(case)


def test_a_mixed_segment_sealed_by_rotation_is_read_whole(tmp_path, monkeypatch):
    old = first_release_log(tmp_path, 30, monkeypatch)
    mixed = newest_segment(tmp_path)
    log = open_log(tmp_path, segment_bytes=256)
    new = timed(31, 61, term=2)
    log.append(new)
    log.sync()
    log.close()
    assert mixed.read_bytes()[8:10] == b"\x01\x00" and mixed != newest_segment(tmp_path)
    assert newest_segment(tmp_path).read_bytes()[8:10] == b"\x02\x00"
    assert open_log(tmp_path).recover().entries == old + new


def test_an_old_record_in_a_new_segment_is_corruption_not_a_torn_tail(tmp_path):
    log = open_log(tmp_path)
    log.append(timed(1, 4, term=1))
    log.sync()
    log.close()
    newest = newest_segment(tmp_path)
    record = encode_record(Entry(4, 1, 0, b"old"), RECORD_V1)
    newest.write_bytes(newest.read_bytes() + record)
    with pytest.raises(CorruptDataError, match="valid checksum but is not a log entry"):
        open_log(tmp_path)


def test_a_segment_of_an_unknown_version_is_refused_naming_the_versions_read(tmp_path):
    open_log(tmp_path).close()
    newest = newest_segment(tmp_path)
    newest.write_bytes(encode_header(CLUSTER, 0, 1, version=3))
    with pytest.raises(CorruptDataError, match=r"version 3 is not supported.*versions 1, 2"):
        open_log(tmp_path)
