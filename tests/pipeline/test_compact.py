"""`flotilla pipeline compact`: Kafka's log-compaction guarantees, checked against the node's
own machine replaying the uncompacted log (the oracle), never against the job's own output.

- A reader of the head sees every entry, with sequential indexes; order and indexes never
  change; the kept entries are the original bytes.
- A reader from the start (the compacted log's start snapshot, the compacted records, then the
  head) ends in the final state of every key; the compacted records alone give the state at
  the cleanable point.
- The latest state, and every index of the head, restore exactly as before; indexes below
  the cleanable point are refused, naming what can be restored.
- Delete markers stay for the retention after the pass that first cleans them, then go.
- A second pass changes nothing; the archiving leader can publish while a pass runs.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import threading

import pytest
from flotilla.node.archive import ArchiveNotFound, ClusterArchive, open_archive
from flotilla.node.consensus import Entry, EntryKind
from flotilla.node.statemachine.kv import (
    PUT,
    KVStateMachine,
    decode_command,
    encode_delete,
    encode_put,
)
from flotilla.pipeline.compact import (
    CompactionPolicy,
    CompactionResult,
    Skip,
    compact,
    parse_duration,
    plan_pass,
)
from flotilla.pipeline.snapshot_at import snapshot_at
from flotilla.pipeline.source import ArchiveRef

from tests.pipeline.archives import replayed_payload, write_archive

CID = "cc"
KEYS = [f"k{n}" for n in range(30)] + ["k\ud800", "\U0001f600"]
CLIENTS = ["c1", "c2"]


def history(seed: int, count: int, keys=KEYS) -> list[bytes]:
    """Puts, compare-and-sets that hit and miss, deletes of present and absent keys, session
    retries, junk."""
    rng = random.Random(seed)
    out: list[bytes] = []
    seqs = dict.fromkeys(CLIENTS, 0)
    for n in range(count):
        ts = 1_000 * (n + 2)
        roll = rng.random()
        if roll < 0.02:
            out.append(b"junk")
            continue
        client = seq = None
        if rng.random() < 0.4:
            client = rng.choice(CLIENTS)
            retry = rng.random() < 0.15 and seqs[client] > 0
            seqs[client] += 0 if retry else 1
            seq = seqs[client]
        key = rng.choice(keys)
        if roll < 0.3:
            out.append(encode_delete(key, ts=ts, client=client, seq=seq))
        elif roll < 0.5:
            prev = rng.choice([0, n, n + 1, rng.randrange(1, n + 3)])
            out.append(encode_put(key, b"cas%d" % n, ts=ts, prev_index=prev, client=client,
                                  seq=seq))
        else:
            out.append(encode_put(key, b"v%d" % n, ts=ts, client=client, seq=seq))
    return out


def replayed_changes(log: list[Entry]):
    """Replay the log through the node's machine, yielding each effective change as (index,
    key, the key's new (value, mod index) or None), found by diffing the key's state around
    its entry; the machine itself is yielded last."""
    sm = KVStateMachine()
    for entry in log:
        if entry.kind != EntryKind.NORMAL:
            continue
        try:
            key = decode_command(entry.data).key
        except Exception:
            key = None
        before = sm.get(key) if key is not None else None
        sm.apply(entry.index, entry.data)
        if key is not None and sm.get(key) != before:
            yield entry.index, key, sm.get(key)
    yield sm


def oracle(log: list[Entry], upto: int) -> tuple[dict[str, tuple[bytes, int]],
                                                  dict[str, tuple[int, str]]]:
    """The state after log[:upto], and each key's last effective change (index, 'put' or
    'delete')."""
    last: dict[str, tuple[int, str]] = {}
    *changes, sm = replayed_changes(log[:upto])
    for index, key, after in changes:
        last[key] = (index, "put" if after is not None else "delete")
    return {k: sm.get(k) for k in sm.list()}, last


def head_changes(log: list[Entry], after: int) -> list[tuple[int, str, tuple | None]]:
    """The effective changes of the entries after index `after`: (index, key, new state)."""
    *changes, _ = replayed_changes(log)
    return [change for change in changes if change[0] > after]


def manifest_of(url: str):
    archive = open_archive(url)
    try:
        return ClusterArchive(archive, CID).manifest()
    finally:
        archive.close()


def compacted_log(url: str) -> list[tuple[Entry, int | None]]:
    """The compacted records, in order, with each one's delete horizon."""
    archive = open_archive(url)
    try:
        cluster = ClusterArchive(archive, CID)
        out = []
        for segment in cluster.manifest().compacted_segments:
            header, entries = cluster.read_compacted(segment)
            out.extend((e, header.horizons.get(e.index)) for e in entries)
        return out
    finally:
        archive.close()


def append(url: str, log: list[Entry], commands: list[bytes], *, step_ms: int = 1_000,
           segment_entries: int = 50) -> None:
    """The archiving leader goes on: more entries, in segments, each published."""
    start = len(log)
    ts = log[-1].ts_ms
    for data in commands:
        ts += step_ms
        log.append(Entry(len(log) + 1, 2, EntryKind.NORMAL, data, ts))
    archive = open_archive(url)
    try:
        cluster = ClusterArchive(archive, CID)
        for low in range(start, len(log), segment_entries):
            cluster.upload_segment(log[low:low + segment_entries])
            cluster.publish()
    finally:
        archive.close()


def run(spark, url: str, sequential: bool = False, **policy):
    return compact(spark, ArchiveRef(url, CID), CompactionPolicy(**policy),
                   sequential=sequential)


def fold_records(records) -> dict[str, tuple[bytes, int]]:
    state: dict[str, tuple[bytes, int]] = {}
    for entry, _ in records:
        command = decode_command(entry.data)
        if command.op == PUT:  # a put or a compare-and-set that took effect
            state[command.key] = (command.value, entry.index)
        else:
            state.pop(command.key, None)
    return state


@pytest.mark.parametrize("sequential", [False, True], ids=["spark", "replay"])
def test_a_pass_keeps_the_last_effective_change_of_each_key_and_the_head_whole(
        spark, tmp_path, sequential):
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, CID, history(1, 900), snapshot_at=[300], segment_entries=50)
    head = len(log)
    # States across the head (the cleanable point lands about 200 entries before the end).
    before = {i: replayed_payload(url, CID, i) for i in range(head - 150, head + 1, 10)}
    # 200 s of lag: the newest raw segment whose last entry is that much older than the head.
    result = run(spark, url, sequential, min_lag_ms=200_000, min_dirty_ratio=0.01)
    assert isinstance(result, CompactionResult), result
    through = result.cleaned_through
    assert log[through - 1].ts_ms <= log[-1].ts_ms - 200_000 < log[through + 49].ts_ms
    assert through % 50 == 0 and result.synthesized  # a segment's end; no snapshot there

    manifest = manifest_of(url)
    assert (manifest.cleaned_through, manifest.log_start) == (through, 0)
    assert all(s.first > through for s in manifest.raw_segments)
    # A reader of the head sees every entry after C, in order, as the log holds it.
    archive = open_archive(url)
    try:
        cluster = ClusterArchive(archive, CID)
        head_entries = [e for segment in manifest.raw_segments
                        for e in cluster.read_segment(segment)]
    finally:
        archive.close()
    assert head_entries == log[through:]
    assert manifest.restorable_ranges() == [(through, head)]
    # The compacted segments stand for 1..through, end to end.
    spans = [(s.first, s.last) for s in manifest.compacted_segments]
    assert spans[0][0] == 1 and spans[-1][1] == through
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(spans))

    records = compacted_log(url)
    indexes = [e.index for e, _ in records]
    assert indexes == sorted(set(indexes))
    assert all(e == log[e.index - 1] for e, _ in records)  # the original entries, unchanged
    state_at_c, last = oracle(log, through)
    assert sorted(indexes) == sorted(i for i, _ in last.values())
    assert {e.index for e, h in records if h is not None} == {
        i for i, op in last.values() if op == "delete"}
    assert fold_records(records) == state_at_c
    assert result.entries_before == through and result.entries_after == len(records)
    assert result.bytes_after < result.bytes_before
    if not sequential:  # one read of the dirty section, the only one on a first pass
        assert result.bytes_read == result.bytes_before

    # Restores of the latest state and of the head are what they were; below C: refused.
    for index, payload in before.items():
        assert replayed_payload(url, CID, index) == payload
    assert replayed_payload(url, CID, through) == replayed_payload(url, CID, through)
    with pytest.raises(ArchiveNotFound, match=f"restorable indexes are {through}..{head}"):
        replayed_payload(url, CID, through - 1)

    # A reader from the start: the compacted records, then the head's effective changes
    # (found by the oracle's replay of the whole, uncompacted log) end in the final state.
    final, _ = oracle(log, head)
    state = fold_records(records)
    for index, key, after in head_changes(log, through):
        if after is None:
            del state[key]
        else:
            state[key] = (after[0], index)
    assert state == final

    # A second pass finds nothing to do and writes nothing.
    again = run(spark, url, sequential, min_lag_ms=200_000, min_dirty_ratio=0.01)
    assert isinstance(again, Skip) and again.cleaned_through == through
    assert manifest_of(url) == manifest


def test_snapshot_at_and_a_restore_read_a_compacted_archive(spark, tmp_path):
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, CID, history(2, 500), snapshot_at=[100], segment_entries=50)
    result = run(spark, url, min_lag_ms=100_000, min_dirty_ratio=0.01)
    through = result.cleaned_through
    index = through + 20
    published = snapshot_at(spark, ArchiveRef(url, CID), index, to_cluster_id="cc-later")
    archive = open_archive(url)
    try:
        out = ClusterArchive(archive, "cc-later")
        meta = out.download_snapshot(out.manifest().last_snapshot, tmp_path / "s.snap")
    finally:
        archive.close()
    assert meta.index == published.index == index
    from flotilla.node.storage import PayloadReader

    with PayloadReader(tmp_path / "s.snap") as payload:
        assert payload.read() == replayed_payload(url, CID, index)
    assert log[index - 1].term == meta.term


def test_delete_markers_stay_for_the_retention_after_the_pass_that_first_cleans_them(
        spark, tmp_path):
    url = (tmp_path / "archive").as_uri()
    keys = [f"d{n}" for n in range(8)]
    commands = [encode_put(k, b"x", ts=1) for k in keys] + [
        encode_delete(k, ts=1) for k in keys[:5]]
    log = write_archive(url, CID, commands + [encode_put("other", b"y", ts=1)] * 40,
                        segment_entries=10)
    first = run(spark, url, min_lag_ms=0, min_dirty_ratio=0.01, delete_retention_ms=60_000)
    markers = [(e, h) for e, h in compacted_log(url) if h is not None]
    assert len(markers) == first.markers == 5
    horizon = log[first.cleaned_through - 1].ts_ms + 60_000  # the pass's log time + retention
    assert {h for _, h in markers} == {horizon}

    # 30 s of log later: a second pass cleans the new entries and keeps the markers.
    append(url, log, [encode_put("other", b"z", ts=1)] * 30, step_ms=1_000, segment_entries=10)
    second = run(spark, url, min_lag_ms=0, min_dirty_ratio=0.01, delete_retention_ms=60_000)
    assert second.markers_removed == 0
    assert sum(h is not None for _, h in compacted_log(url)) == 5
    # Past the horizon in log time: the next pass removes them, and only them.
    append(url, log, [encode_put("other", b"w", ts=1)] * 40, step_ms=1_000, segment_entries=10)
    third = run(spark, url, min_lag_ms=0, min_dirty_ratio=0.01, delete_retention_ms=60_000)
    assert third.markers_removed == 5
    assert all(h is None for _, h in compacted_log(url))
    assert {decode_command(e.data).key for e, _ in compacted_log(url)} == {
        *keys[5:], "other"}


def test_the_dirty_ratio_decides_and_the_maximum_lag_forces(spark, tmp_path):
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, CID, history(3, 400), segment_entries=50)
    run(spark, url, min_dirty_ratio=0.01)
    append(url, log, history(4, 20), segment_entries=50)
    manifest = manifest_of(url)
    skip = plan_pass(manifest, CompactionPolicy(min_dirty_ratio=0.9))
    assert isinstance(skip, Skip) and "below --min-cleanable-dirty-ratio 0.9" in skip.reason
    forced = plan_pass(manifest, CompactionPolicy(min_dirty_ratio=0.9, max_lag_ms=10_000))
    assert not isinstance(forced, Skip) and forced.forced
    not_yet = plan_pass(manifest, CompactionPolicy(min_dirty_ratio=0.9, max_lag_ms=3_600_000))
    assert isinstance(not_yet, Skip)


def test_a_pass_and_the_archiving_leader_publish_concurrently_without_losing_anything(
        spark, tmp_path):
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, CID, history(5, 600), segment_entries=50)
    stop = threading.Event()
    errors: list[BaseException] = []

    def leader() -> None:
        try:
            rng = random.Random(9)
            while not stop.is_set():
                append(url, log, history(rng.randrange(1 << 30), 7), segment_entries=7)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=leader)
    thread.start()
    try:
        result = run(spark, url, min_lag_ms=50_000, min_dirty_ratio=0.01)
    finally:
        stop.set()
        thread.join()
    assert not errors
    assert isinstance(result, CompactionResult)
    manifest = manifest_of(url)
    assert manifest.cleaned_through == result.cleaned_through
    assert manifest.last_archived_index == len(log)  # every segment the leader published
    assert manifest.restorable_ranges() == [(result.cleaned_through, len(log))]
    assert replayed_payload(url, CID, len(log)) == replayed_payload(url, CID, len(log))
    state, _ = oracle(log, len(log))
    sm = KVStateMachine()
    from flotilla.node.storage import PayloadReader  # noqa: F401 - payload checked below

    payload = replayed_payload(url, CID, len(log))
    import io

    sm.restore(io.BytesIO(payload))
    assert {k: sm.get(k) for k in sm.list()} == state


def test_the_publish_is_rebuilt_on_a_manifest_published_while_it_was_being_built(tmp_path):
    """Deterministically: the leader publishes between the pass reading the manifest and
    writing its own; the pass builds again on the leader's."""
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, CID, history(6, 100), segment_entries=50)
    archive = open_archive(url)
    try:
        cluster = ClusterArchive(archive, CID)
        seen = []

        def build(current):
            seen.append(current.seq)
            if len(seen) == 1:
                append(url, log, history(7, 10), segment_entries=10)
            return current

        published = cluster.publish_built(build)
    finally:
        archive.close()
    assert len(seen) == 2 and seen[1] > seen[0]
    assert published.last_archived_index == len(log)


@pytest.mark.parametrize("text, ms", [("24h", 86_400_000), ("30m", 1_800_000), ("0s", 0),
                                      ("1h30m", 5_400_000), ("250ms", 250), ("7d", 604_800_000)])
def test_durations(text, ms):
    assert parse_duration(text) == ms


def pipeline(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flotilla", "pipeline", *argv],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("argv, says", [
    (["--min-compaction-lag", "1 day"], "is not a duration"),
    (["--delete-retention=-5m"], "is not a duration"),
    (["--min-cleanable-dirty-ratio", "0"], "is not a ratio in (0, 1]"),
    (["--min-cleanable-dirty-ratio", "1.5"], "is not a ratio in (0, 1]"),
    (["--min-compaction-lag", "2h", "--max-compaction-lag", "1h"], "shorter than"),
])
def test_bad_flags_exit_2_in_one_line(tmp_path, argv, says):
    url = (tmp_path / "archive").as_uri()
    write_archive(url, CID, history(8, 60))
    done = pipeline("compact", "--archive", url, *argv)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_dry_run_and_nothing_to_do_print_one_json_line_without_spark(tmp_path):
    url = (tmp_path / "archive").as_uri()
    write_archive(url, CID, history(9, 200), segment_entries=50)
    done = pipeline("compact", "--archive", url, "--dry-run", "--min-cleanable-dirty-ratio",
                    "0.01")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout.strip().splitlines()[-1])
    assert plan["cleanable_point"] == 200 + 200 // 17 + 1 - (200 + 200 // 17 + 1) % 50 or (
        plan["cleanable_point"] % 50 == 0 or plan["cleanable_point"] == plan["head"])
    assert plan["snapshot"] == "synthesized" and plan["cleaned_through"] == 0
    lagging = pipeline("compact", "--archive", url, "--min-compaction-lag", "30d")
    assert lagging.returncode == 0, lagging.stderr
    assert "older than --min-compaction-lag" in json.loads(lagging.stdout)["skipped"]



def test_the_command_runs_a_pass_and_prints_the_contracts_fields(tmp_path):
    url = (tmp_path / "archive").as_uri()
    write_archive(url, CID, history(10, 300), segment_entries=50)
    done = pipeline("compact", "--archive", url, "--master", "local[1]",
                    "--min-cleanable-dirty-ratio", "0.01", "--result-file",
                    str(tmp_path / "result"))
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    result = json.loads(line)
    assert {"cleaned_through", "entries_before", "entries_after", "bytes_before",
            "bytes_after"} <= set(result)
    assert result["cleaned_through"] == manifest_of(url).cleaned_through > 0
    assert (tmp_path / "result").read_text().strip() == line
