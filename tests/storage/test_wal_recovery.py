"""Recovery of the disk log: a torn tail of the newest segment is cut back; anything worse is
refused with a CorruptDataError that names the file and the byte offset.

Damage is injected into real files: every byte offset a crash could cut the last records at,
single bit flips in every part of a sealed segment, missing and foreign files. Every test runs
twice: on logs in the current format (version 2 segments, whose records carry times) and on
logs in the first release's (version 1 segments and records, which a member upgraded from that
release still has on its volume).
"""

from __future__ import annotations

import functools
import logging
import shutil
import sys
from pathlib import Path

import pytest
from flotilla.node.consensus.types import Entry, HardState, Membership, SnapshotMeta
from flotilla.node.storage import CorruptDataError, DiskStorage, wal
from flotilla.node.storage import segment as wal_segment
from flotilla.node.storage.segment import RECORD_HEADER, encode_header, encode_record

from tests.storage.storage_testlib import (
    CLUSTER,
    EPOCH_MS,
    SMALL_SEGMENT,
    entries,
    newest_segment,
    segments,
)

WAL_LOGGER = "flotilla.node.storage.wal"


@pytest.fixture(autouse=True, params=["v2", "v1"], ids=["format-v2", "format-v1"])
def wal_format(request, monkeypatch) -> str:
    """For "v1", the log writes (and this module's helpers compute) the first release's
    segments: version 1 headers, records without a time; entries are made with time 0, which
    is what such records read back as."""
    if request.param == "v1":
        header = functools.partial(wal_segment.encode_header, version=1)
        record = functools.partial(wal_segment.encode_record, version=wal_segment.RECORD_V1)
        monkeypatch.setattr(wal, "encode_header", header)
        monkeypatch.setattr(wal, "record_encoder",
                            functools.partial(wal_segment.record_encoder, wal_segment.RECORD_V1))
        module = sys.modules[__name__]
        monkeypatch.setattr(module, "encode_header", header)
        monkeypatch.setattr(module, "encode_record", record)
        monkeypatch.setattr(module, "entries", functools.partial(entries, timed=False))
        monkeypatch.setattr(module, "TIMED", False)
    return request.param


TIMED = True  # whether the format under test stores times (see `wal_format`)


def at(index: int) -> int:
    """A time for entries made by hand (0, unknown, in the first release's format)."""
    return EPOCH_MS + index * 10 if TIMED else 0


def open_log(path: Path, **options) -> DiskStorage:
    return DiskStorage(path, cluster_id=CLUSTER, segment_bytes=SMALL_SEGMENT, **options)


def build(path: Path, last: int, *, tail: list[Entry] = ()) -> list[Entry]:
    """A synced, closed log of entries 1..last in small segments, then `tail` appended in one
    call that lands whole in the newest segment; returns everything written."""
    written = entries(1, last + 1, term=1)
    log = open_log(path)
    log.append(written)
    log.sync()
    log.close()
    if tail:
        log = DiskStorage(path, cluster_id=CLUSTER, segment_bytes=1 << 20)
        log.append(tail)
        log.sync()
        log.close()
    return written + list(tail)


def flip_bit(path: Path, offset: int, bit: int = 0x10) -> None:
    path.chmod(0o644)  # sealed segments are read-only
    raw = bytearray(path.read_bytes())
    raw[offset] ^= bit
    path.write_bytes(bytes(raw))


def truncate(path: Path, size: int) -> None:
    path.chmod(0o644)  # sealed segments are read-only
    with open(path, "r+b") as file:
        file.truncate(size)


def record_offsets(path: Path, first_index: int, written: list[Entry]) -> list[int]:
    """Start offset of every record of segment `path`, computed from what was written."""
    offset = len(encode_header(CLUSTER, 0, first_index))
    starts = []
    for entry in written:
        if entry.index >= first_index and offset < path.stat().st_size:
            starts.append(offset)
            offset += len(encode_record(entry))
    return starts


def test_the_log_under_test_is_in_the_format_under_test(tmp_path, wal_format):
    written = build(tmp_path, 30)
    version = 1 if wal_format == "v1" else wal_segment.VERSION
    for path in segments(tmp_path):
        assert int.from_bytes(path.read_bytes()[8:10], "little") == version, path
    log = open_log(tmp_path)
    assert log.recover().entries == written
    assert all(bool(e.ts_ms) == (wal_format == "v2") for e in written)


# --- torn tails ----------------------------------------------------------------------------


def test_a_cut_at_every_byte_of_the_last_records_recovers_the_whole_ones_before(tmp_path, caplog):
    """The last append was a batch of two records (one os.write): a crash can cut it at any
    byte. Recovery must keep exactly the records that are whole, and the log must go on."""
    big = [Entry(i, 2, 0, bytes([i]) * 60, at(i)) for i in (31, 32)]
    written = build(tmp_path / "base", 30, tail=big)
    newest = newest_segment(tmp_path / "base")
    assert len(segments(tmp_path / "base")) > 2, "the newest segment must have sealed ones before"
    size = newest.stat().st_size
    batch = sum(len(encode_record(e)) for e in big)
    batch_start = size - batch
    record_ends = [batch_start]
    for entry in big:
        record_ends.append(record_ends[-1] + len(encode_record(entry)))

    for cut in range(batch_start, size):
        case = tmp_path / f"cut{cut}"
        shutil.copytree(tmp_path / "base", case)
        truncate(case / "wal" / newest.name, cut)
        whole = sum(1 for end in record_ends[1:] if end <= cut)
        expected = written[: 30 + whole]
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=WAL_LOGGER):
            log = open_log(case)
        assert log.recover().entries == expected, f"cut at byte {cut}"
        torn = cut not in record_ends
        assert any("torn" in r.getMessage() for r in caplog.records) == torn, f"cut at {cut}"
        follow_up = Entry(len(expected) + 1, 3, 0, b"after the crash", at(len(expected) + 1))
        log.append([follow_up])
        log.sync()
        log.close()
        reopened = open_log(case)
        assert reopened.recover().entries == [*expected, follow_up], f"cut at byte {cut}"
        reopened.close()
        shutil.rmtree(case)


@pytest.mark.parametrize(
    "damage",
    ["zeros appended", "garbage appended", "last checksum flipped", "last length flipped"],
)
def test_damage_to_the_last_record_with_nothing_valid_after_it_is_a_torn_tail(
    tmp_path, caplog, damage
):
    written = build(tmp_path, 20)
    newest = newest_segment(tmp_path)
    last_start = newest.stat().st_size - len(encode_record(written[-1]))
    expected = written
    if damage == "zeros appended":
        newest.chmod(0o644)
        newest.write_bytes(newest.read_bytes() + bytes(4096))
    elif damage == "garbage appended":
        newest.chmod(0o644)
        newest.write_bytes(newest.read_bytes() + b"\x94\x07garbage" * 50)
    elif damage == "last checksum flipped":
        flip_bit(newest, last_start + 4)
        expected = written[:-1]
    else:
        flip_bit(newest, last_start, bit=0x80)
        expected = written[:-1]
    with caplog.at_level(logging.WARNING, logger=WAL_LOGGER):
        log = open_log(tmp_path)
    assert log.recover().entries == expected
    assert any("torn" in r.getMessage() for r in caplog.records)
    log.close()
    assert open_log(tmp_path).recover().entries == expected


def test_damage_in_the_newest_segment_followed_by_intact_records_is_corruption(tmp_path):
    written = build(tmp_path, 20, tail=entries(21, 26, term=2))
    newest = newest_segment(tmp_path)
    first_index = int(newest.stem)
    starts = record_offsets(newest, first_index, written)
    assert len(starts) >= 3
    flip_bit(newest, starts[-3] + RECORD_HEADER.size + 2)
    with pytest.raises(CorruptDataError) as caught:
        open_log(tmp_path)
    assert caught.value.path == str(newest)
    assert caught.value.offset == starts[-3]
    assert "intact record follows" in str(caught.value)


def test_entry_data_that_looks_like_a_record_does_not_hide_a_torn_tail(tmp_path):
    """A client may store anything, even bytes shaped like a log record; cutting through such
    an entry is still a torn write."""
    inner = encode_record(Entry(10**9, 1, 0, b"not really a log record", at(10**9)))
    written = build(tmp_path, 5, tail=[Entry(6, 1, 0, b"x" * 40 + inner + b"y" * 20, at(6))])
    newest = newest_segment(tmp_path)
    truncate(newest, newest.stat().st_size - 10)
    assert open_log(tmp_path).recover().entries == written[:-1]


# --- damage that is refused ------------------------------------------------------------------


def sealed_segment_cases(tmp_path: Path):
    written = build(tmp_path / "base", 40)
    sealed = segments(tmp_path / "base")[1]
    first_index = int(sealed.stem)
    header_size = len(encode_header(CLUSTER, 0, first_index))
    starts = record_offsets(sealed, first_index, written)
    assert len(starts) >= 3
    return written, sealed, header_size, starts


@pytest.mark.parametrize(
    "where",
    [
        "header magic",
        "header cluster id",
        "header first index",
        "header checksum",
        "first record length",
        "middle record payload",
        "last record checksum",
        "last record length high bit",
        "last record payload last byte",
    ],
)
def test_a_bit_flip_in_a_sealed_segment_is_refused_naming_file_and_offset(tmp_path, where):
    _, sealed, header_size, starts = sealed_segment_cases(tmp_path)
    size = sealed.stat().st_size
    position, expected_offset, bit = {
        "header magic": (0, 0, 0x10),
        "header cluster id": (header_size - 6, 0, 0x10),
        "header first index": (20, 0, 0x10),
        "header checksum": (header_size - 1, 0, 0x10),
        "first record length": (starts[0], starts[0], 0x01),
        "middle record payload": (starts[1] + RECORD_HEADER.size + 3, starts[1], 0x10),
        "last record checksum": (starts[-1] + 4, starts[-1], 0x10),
        "last record length high bit": (starts[-1] + 3, starts[-1], 0x80),
        "last record payload last byte": (size - 1, starts[-1], 0x01),
    }[where]
    case = tmp_path / "case"
    shutil.copytree(tmp_path / "base", case)
    damaged = case / "wal" / sealed.name
    flip_bit(damaged, position, bit)
    with pytest.raises(CorruptDataError) as caught:
        open_log(case)
    error = caught.value
    assert (error.path, error.offset) == (str(damaged), expected_offset)
    message = str(error)
    assert sealed.name in message and f"byte offset {expected_offset}" in message
    assert "restore it from its peers" in message


def test_a_torn_tail_in_a_sealed_segment_is_refused(tmp_path):
    _, sealed, _, starts = sealed_segment_cases(tmp_path)
    damaged = tmp_path / "base" / "wal" / sealed.name
    truncate(damaged, damaged.stat().st_size - 3)
    with pytest.raises(CorruptDataError, match="sealed segment") as caught:
        open_log(tmp_path / "base")
    assert caught.value.offset == starts[-1]


def test_a_missing_segment_in_the_middle_is_a_gap(tmp_path):
    build(tmp_path, 40)
    middle = segments(tmp_path)[2]
    middle.unlink()
    with pytest.raises(CorruptDataError, match="gap between segments") as caught:
        open_log(tmp_path)
    assert caught.value.path == str(segments(tmp_path)[2])


def test_a_missing_oldest_segment_leaves_the_log_unanchored(tmp_path):
    build(tmp_path, 40)
    segments(tmp_path)[0].unlink()
    with pytest.raises(CorruptDataError, match="entries are missing"):
        open_log(tmp_path)


@pytest.mark.parametrize("newest", [True, False], ids=["newest", "sealed"])
def test_records_out_of_sequence_are_refused_even_with_valid_checksums(tmp_path, newest):
    wal = tmp_path / "wal"
    open_log(tmp_path).close()  # creates wal/start and an empty first segment
    for segment in segments(tmp_path):
        segment.unlink()
    records = [Entry(1, 1), Entry(2, 1), Entry(4, 1)]
    (wal / "0000000000000001.seg").write_bytes(
        encode_header(CLUSTER, 0, 1) + b"".join(encode_record(e) for e in records)
    )
    if not newest:
        (wal / "0000000000000004.seg").write_bytes(
            encode_header(CLUSTER, 0, 4) + encode_record(Entry(4, 1))
        )
    with pytest.raises(CorruptDataError, match="index 4 where index 3 was expected"):
        open_log(tmp_path)


def test_a_truncated_segment_header_is_refused(tmp_path):
    build(tmp_path, 40)
    newest = newest_segment(tmp_path)
    truncate(newest, 10)
    with pytest.raises(CorruptDataError, match="header is cut short"):
        open_log(tmp_path)


def test_a_segment_whose_name_disagrees_with_its_header_is_refused(tmp_path):
    build(tmp_path, 40)
    newest = newest_segment(tmp_path)
    newest.rename(newest.with_name("0000000000000999.seg"))
    with pytest.raises(CorruptDataError, match="the name says 999"):
        open_log(tmp_path)


def test_another_clusters_log_is_refused_with_a_clear_message(tmp_path):
    build(tmp_path, 10)
    with pytest.raises(CorruptDataError) as caught:
        DiskStorage(tmp_path, cluster_id="someone-else", segment_bytes=SMALL_SEGMENT)
    message = str(caught.value)
    assert f"cluster {CLUSTER!r}" in message and "'someone-else'" in message
    assert "--cluster-id" in message and str(segments(tmp_path)[0]) in message


def test_segments_without_the_log_start_file_are_refused(tmp_path):
    build(tmp_path, 10)
    (tmp_path / "wal" / "start").unlink()
    with pytest.raises(CorruptDataError, match="missing"):
        open_log(tmp_path)


@pytest.mark.parametrize("name", ["hardstate", "wal/start"])
def test_a_damaged_state_file_is_refused(tmp_path, name):
    log = open_log(tmp_path)
    log.save_hard_state(HardState(term=7, vote="x"))
    log.close()
    flip_bit(tmp_path / name, 20)
    with pytest.raises(CorruptDataError) as caught:
        open_log(tmp_path)
    assert caught.value.path == str(tmp_path / name)


# --- crashes in the middle of multi-file operations -------------------------------------------


def test_a_crash_after_discarding_the_log_never_resurrects_its_entries(tmp_path):
    """install_snapshot discards a log it contradicts: if the crash comes after wal/start was
    rewritten but before the old segments were unlinked, they must stay discarded."""
    build(tmp_path, 40)
    old = {p.name: p.read_bytes() for p in segments(tmp_path)}
    log = open_log(tmp_path)
    log.install_snapshot(SnapshotMeta(12, 5, Membership(frozenset({"a"}))))
    log.close()
    for segment in segments(tmp_path):
        segment.unlink()  # the crash came before the new segment was created, too
    for name, raw in old.items():
        (tmp_path / "wal" / name).write_bytes(raw)
    log = open_log(tmp_path)
    assert (log.first_index(), log.last_index(), log.term(12)) == (13, 12, 5)
    assert log.recover().entries == []
    assert [p.name for p in segments(tmp_path)] == ["0000000000000013.seg"]
    log.append([Entry(13, 5)])


def test_a_crash_after_compaction_before_unlinking_deletes_the_segments_again(tmp_path):
    build(tmp_path, 40)
    old = {p.name: p.read_bytes() for p in segments(tmp_path)}
    log = open_log(tmp_path)
    log.compact(30)
    first_index = log.first_index()
    log.close()
    kept = [p.name for p in segments(tmp_path)]
    assert len(kept) < len(old)
    for name, raw in old.items():
        if name not in kept:  # the unlinks were lost in the crash
            (tmp_path / "wal" / name).write_bytes(raw)
    log = open_log(tmp_path)
    assert log.first_index() == first_index
    assert log.recover().snapshot.index == 30
    assert [p.name for p in segments(tmp_path)] == kept


def test_leftover_temporary_files_are_removed(tmp_path):
    build(tmp_path, 10)
    leftover = tmp_path / "wal" / "0000000000000011.seg.tmp"
    leftover.write_bytes(b"half a header")
    open_log(tmp_path).close()
    assert not leftover.exists()
