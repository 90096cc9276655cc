"""`export` through real Spark (local mode), to file:// and to a real moto_server.

The oracle is the node's machine: the changes it makes replaying the archived entries (its
whole state diffed around each entry, as in test_kvchanges) and its state at the high water,
which folding the exported changes in log order must give. The exported tables are read back
the way users read them: pyarrow's dataset reader, DuckDB's globs, Spark's Parquet reader and
delta-rs.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from flotilla.node.archive import ClusterArchive, format_ms, open_archive, parse_time
from flotilla.node.consensus import EntryKind
from flotilla.node.statemachine.kv import KVStateMachine
from flotilla.pipeline.export import INTERRUPT, Destination, Interrupted, export, prepare
from flotilla.pipeline.kvfold import READ, decode_fields, key_bytes
from flotilla.pipeline.source import ArchiveRef
from flotilla.pipeline.spark import PipelineError

from tests.archive_node.support import FAST, Writer, post_snapshot, random_writes, wait_archived
from tests.pipeline.archives import REGION, extend_archive, replayed_machine, write_archive
from tests.pipeline.test_kvchanges import state_changes
from tests.pipeline.test_snapshot_at import history

DAY0 = parse_time("2026-11-24T22:00:00Z")
KINDS = {EntryKind.NORMAL: "normal", EntryKind.MEMBERSHIP: "membership",
         EntryKind.NOOP: "noop"}


def stamp(n: int) -> int:
    """Command n's time: 37 minutes apart, so a few hundred entries span a week of dates."""
    return DAY0 + n * 37 * 60_000


def read(root: str, table: str, filesystem=None) -> list[dict]:
    """A table's rows through pyarrow's dataset reader (hive partitions), in log order."""
    import pyarrow.dataset as ds

    data = ds.dataset(f"{root}/{table}", format="parquet", partitioning="hive",
                      filesystem=filesystem).to_table()
    rows = data.to_pylist()
    for r in rows:
        r["date"] = str(r["date"])
    return sorted(rows, key=lambda r: (r["index"], r["key_bytes"] or b""))


def changed(rows: list[dict]) -> list[tuple]:
    return [(r["key_bytes"], r["index"], r["op"], r["before"], r["after"]) for r in rows]


def folded(rows: list[dict]) -> dict[bytes, bytes]:
    """The state the changes give, folded in log order."""
    state: dict[bytes, bytes] = {}
    for r in sorted(rows, key=lambda r: (r["index"], r["key_bytes"])):
        if r["op"] == "d":
            del state[r["key_bytes"]]
        else:
            state[r["key_bytes"]] = r["after"]
    return state


def node_changes(log, upto: int, after: int = 0) -> list[tuple]:
    """The changes the node's machine makes applying the log, those in (after, upto]."""
    found = state_changes(KVStateMachine(), [(e.index, e.data) for e in log[:upto]
                                             if e.kind == EntryKind.NORMAL])
    return sorted((c for c in found if c[1] > after), key=lambda c: (c[1], c[0]))


def node_state(url: str, index: int, endpoint: str | None = None) -> dict[bytes, bytes]:
    """The state the node's own restore builds at `index`."""
    sm = replayed_machine(url, "old", index, endpoint=endpoint)
    return {key_bytes(k): v for k, v, _ in sm.records()}


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "_flotilla" not in p.parts}


def test_the_changes_fold_to_the_node_s_state_and_read_back_in_duckdb_and_spark(spark,
                                                                                tmp_path):
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(31, 300), snapshot_at=[60, 200],
                        segment_entries=40, stamp=stamp)
    out = tmp_path / "export"
    result = export(spark, ArchiveRef(url, None), Destination.parse(str(out)),
                    slice_entries=64)
    hw = len(log)
    assert (result.cluster_id, result.from_index, result.high_water, result.format,
            result.location) == ("old", 1, hw, "parquet", out.as_uri())

    changes = read(str(out), "changes")
    expected = node_changes(log, hw)
    assert changed(changes) == expected  # exactly the machine's changes: no READ rows
    assert result.changes == len(changes)
    assert Counter(r["op"] for r in changes) == Counter(c[2] for c in expected)
    assert set(Counter(r["op"] for r in changes)) == {"c", "u", "d"}
    assert folded(changes) == node_state(url, hw)
    for r in changes:  # each change with its entry's term and time, dated by that time (UTC)
        entry = log[r["index"] - 1]
        assert (r["cluster_id"], r["term"], r["ts_ms"]) == ("old", entry.term, entry.ts_ms)
        assert r["date"] == format_ms(entry.ts_ms)[:10]
        text = r["key_bytes"].decode("utf-8", "surrogatepass")
        assert r["key"] == text.replace("\ud800", "\ufffd")  # the one lone surrogate there
    assert {r["key"] for r in changes if r["key_bytes"] == key_bytes("k\ud800")} == {"k\ufffd"}

    entries = read(str(out), "entries")
    assert result.entries == len(entries) == hw
    assert [(r["index"], r["term"], r["ts_ms"], r["kind"], r["data"]) for r in entries] == [
        (e.index, e.term, e.ts_ms, KINDS[e.kind], e.data) for e in log]
    assert [r["index"] for r in entries if r["effective"]] == [r["index"] for r in changes]
    for r, e in zip(entries, log, strict=True):
        fields = decode_fields(e.data) if e.kind == EntryKind.NORMAL else None
        if fields is None:
            assert (r["command"], r["key_bytes"], r["client"]) == (None, None, None)
        else:
            client = fields[4] and fields[4].decode("utf-8", "surrogatepass")
            assert (r["command"], r["key_bytes"], r["prev_index"], r["seq"]) == (
                ("put", "delete")[fields[0]], fields[1], fields[3], fields[5])
            assert r["client"] == (client and client.replace("\udfff", "\ufffd"))
    dates = sorted({r["date"] for r in entries})
    assert len(dates) >= 7
    # Files named by the indexes of their slice (64 per slice) and dated; staging is gone.
    names = sorted(files(out))
    assert f"entries/date={dates[0]}/{1:020d}-{64:020d}.parquet" in names
    assert all(n.endswith(".parquet") for n in names) and len(names) > 2 * len(dates)
    assert list((out / "_flotilla" / "staging").iterdir()) == []

    # DuckDB: the state at the high water by SQL, the last change of each key.
    import duckdb

    glob = f"{out}/changes/**/*.parquet"
    state = duckdb.sql(f"""
        SELECT key_bytes, after FROM (
            SELECT *, row_number() OVER (PARTITION BY key_bytes ORDER BY index DESC) AS n
            FROM read_parquet('{glob}', hive_partitioning = true))
        WHERE n = 1 AND op <> 'd'""").fetchall()
    assert dict(state) == node_state(url, hw)
    by_date = duckdb.sql(f"SELECT CAST(date AS VARCHAR), count(*) FROM read_parquet('{glob}', "
                         "hive_partitioning = true) GROUP BY ALL").fetchall()
    assert dict(by_date) == Counter(r["date"] for r in changes)

    # Spark: the same, through its Parquet reader (partition discovery gives the date).
    spark.read.parquet(str(out / "changes")).createOrReplaceTempView("changes")
    last = spark.sql("""
        SELECT key_bytes, after FROM (
            SELECT *, row_number() OVER (PARTITION BY key_bytes ORDER BY index DESC) AS n
            FROM changes) WHERE n = 1 AND op <> 'd'""").collect()
    assert {bytes(k): bytes(v) for k, v in last} == node_state(url, hw)
    assert spark.read.parquet(str(out / "entries")).count() == hw


def test_a_second_run_adds_exactly_the_changes_after_the_high_water(spark, tmp_path):
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(32, 150), snapshot_at=[50], segment_entries=30,
                        stamp=stamp)
    ref, a = ArchiveRef(url, "old"), Destination.parse(str(tmp_path / "a"))
    first = export(spark, ref, a, slice_entries=64)
    hw1 = len(log)
    assert (first.from_index, first.high_water) == (1, hw1)
    before, published = read(str(tmp_path / "a"), "changes"), files(tmp_path / "a")
    # More entries (other clients' sessions, a snapshot among them), archived later.
    extend_archive(url, "old", log, history(33, 120), snapshot_at=[hw1 + 40],
                   segment_entries=30, stamp=stamp)
    hw2 = len(log)
    second = export(spark, ref, a, slice_entries=64)
    assert (second.from_index, second.high_water) == (hw1 + 1, hw2)
    changes = read(str(tmp_path / "a"), "changes")
    assert [r for r in changes if r["index"] <= hw1] == before
    assert changed(r for r in changes if r["index"] > hw1) == node_changes(log, hw2, hw1)
    assert (second.changes, second.entries) == (len(changes) - len(before), hw2 - hw1)
    assert all(files(tmp_path / "a")[name] == data for name, data in published.items())
    assert folded(changes) == node_state(url, hw2)
    # The same rows as one run over the whole archive.
    b = Destination.parse(str(tmp_path / "b"))
    export(spark, ref, b, slice_entries=64)
    assert read(str(tmp_path / "b"), "changes") == changes
    assert read(str(tmp_path / "b"), "entries") == read(str(tmp_path / "a"), "entries")
    # Nothing new: nothing added, not an error.
    third = export(spark, ref, a, slice_entries=64)
    assert (third.from_index, third.high_water, third.changes, third.entries) == (
        hw2 + 1, hw2, 0, 0)
    record = json.loads((tmp_path / "a" / "_flotilla" / "export.json").read_text())
    assert (record["cluster_id"], record["format"], record["high_water"]) == (
        "old", "parquet", hw2)
    assert [(r["from_index"], r["high_water"], r["changes"]) for r in record["runs"]] == [
        (1, hw1, first.changes), (hw1 + 1, hw2, second.changes)]


def test_a_first_export_of_a_trimmed_archive_starts_with_the_snapshot_s_keys(spark,
                                                                            tmp_path):
    """Retention removed the history before the snapshot at 90: the first export reads that
    snapshot's keys as op 'r' rows at its index, so the table still folds to the state. A
    destination whose high water retention has since passed is refused (exit 4)."""
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(34, 160), snapshot_at=[40, 90],
                        segment_entries=20, stamp=stamp)
    ref = ArchiveRef(url, "old")
    early = Destination.parse(str(tmp_path / "early"))
    export(spark, ref, early)  # the whole history, before retention
    archive = open_archive(url)
    try:
        ClusterArchive(archive, "old").retain(keep_snapshots=1)
    finally:
        archive.close()
    late = Destination.parse(str(tmp_path / "late"))
    result = export(spark, ref, late)
    assert (result.from_index, result.high_water) == (90, len(log))
    changes = read(str(tmp_path / "late"), "changes")
    reads = [r for r in changes if r["op"] == READ]
    at_90 = KVStateMachine()
    for e in log[:90]:
        if e.kind == EntryKind.NORMAL:
            at_90.apply(e.index, e.data)
    assert [(r["key_bytes"], r["before"], r["after"]) for r in reads] == [
        (key_bytes(k), None, v) for k, v, _ in at_90.records()]
    assert {(r["index"], r["term"], r["ts_ms"]) for r in reads} == {
        (90, log[89].term, log[89].ts_ms)}
    assert changes[:len(reads)] == reads
    assert changed(changes[len(reads):]) == node_changes(log, len(log), 90)
    assert folded(changes) == node_state(url, len(log))
    assert [r["index"] for r in read(str(tmp_path / "late"), "entries")] == list(
        range(91, len(log) + 1))
    reading = sorted(n for n in files(tmp_path / "late") if f"/{90:020d}-{90:020d}-r" in n)
    assert reading and all(n.startswith(f"changes/date={reads[0]['date']}/") for n in reading)

    hw = len(log)
    extend_archive(url, "old", log, history(35, 60), snapshot_at=[hw + 30],
                   segment_entries=20, stamp=stamp)
    archive = open_archive(url)
    try:
        ClusterArchive(archive, "old").retain(keep_snapshots=1)
    finally:
        archive.close()
    with pytest.raises(PipelineError) as gone:
        prepare(ref, early)
    assert gone.value.exit_code == 4
    assert f"no longer holds the entries after index {hw}" in str(gone.value)


def test_an_interrupted_run_is_discarded_or_finished_by_the_next(spark, tmp_path, monkeypatch):
    """Stopped after staging (nothing visible, discarded), after publishing one file (rows
    beyond the recorded high water visible until the next run finishes the publish), after
    publishing all (the high water not recorded yet): the next run ends with exactly the
    files, bytes and record of a run that was never interrupted."""
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(36, 120), segment_entries=30, stamp=stamp)
    ref = ArchiveRef(url, "old")
    a, b = (Destination.parse(str(tmp_path / name)) for name in "ab")
    for dest in (a, b):
        export(spark, ref, dest, slice_entries=32)
    hw1, done = len(log), read(str(tmp_path / "a"), "changes")
    extend_archive(url, "old", log, history(37, 100), segment_entries=30, stamp=stamp)
    staging = tmp_path / "a" / "_flotilla" / "staging"

    def run(stop: str) -> None:
        monkeypatch.setenv(INTERRUPT, stop)
        with pytest.raises(Interrupted):
            export(spark, ref, a, slice_entries=32)
        monkeypatch.delenv(INTERRUPT)

    def recorded() -> int:
        return json.loads((tmp_path / "a" / "_flotilla" / "export.json").read_text())[
            "high_water"]

    run("staged")
    assert read(str(tmp_path / "a"), "changes") == done and recorded() == hw1
    assert list(staging.glob("*.json")) == [] and list(staging.rglob("*.parquet"))
    run("publishing")  # the staged files are discarded, the run staged again, one published
    assert [p.name for p in staging.glob("*.json")] == [f"{hw1 + 1:020d}-{len(log):020d}.json"]
    assert recorded() == hw1
    visible = read(str(tmp_path / "a"), "changes")
    assert [r for r in visible if r["index"] <= hw1] == done
    run("published")  # the rest published, the high water still not recorded
    assert recorded() == hw1
    finished = export(spark, ref, a, slice_entries=32)  # publishes, records: no Spark job
    assert (finished.from_index, finished.high_water) == (hw1 + 1, len(log))
    assert recorded() == len(log) and list(staging.iterdir()) == []
    export(spark, ref, b, slice_entries=32)
    assert files(tmp_path / "a") == files(tmp_path / "b")
    record = [json.loads((tmp_path / d / "_flotilla" / "export.json").read_text()) for d in "ab"]
    for r in record:
        for done_run in r["runs"]:
            del done_run["published"]
    assert record[0] == record[1]


def pipeline(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flotilla", "pipeline", *argv],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def test_the_command_prints_one_json_line_refuses_in_one_and_survives_a_kill(tmp_path):
    pytest.importorskip("pyspark")
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(38, 80), segment_entries=30, stamp=stamp)
    write_archive(url, "other", history(40, 20), stamp=stamp)
    out = tmp_path / "out"
    common = ["--archive", url, "--cluster-id", "old", "--to", str(out), "--master",
              "local[1]"]
    plan = pipeline("export", *common, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    described = json.loads(plan.stdout.strip().splitlines()[-1])
    assert (described["cluster_id"], described["format"], described["high_water"],
            described["from_index"], described["index"]) == ("old", "parquet", 0, 1, len(log))
    # Killed (SIGKILL) after publishing the first file: the next run finishes the publish.
    killed = pipeline("export", *common, env={INTERRUPT: "publishing:kill"})
    assert killed.returncode == -9, killed.stderr
    result_file = tmp_path / "result"
    done = pipeline("export", *common, "--result-file", str(result_file))
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert json.loads(line) == {"cluster_id": "old", "from_index": 1, "high_water": len(log),
                                "changes": len(node_changes(log, len(log))),
                                "entries": len(log), "location": out.as_uri(),
                                "format": "parquet"}
    assert result_file.read_text() == line + "\n"
    again = pipeline("export", *common)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1])["changes"] == 0
    refusals = [
        (["--cluster-id", "other"], 2, "holds the export of cluster 'old', not 'other': "
                                       "export 'other' to another --to URL"),
        (["--format", "delta"], 2, "holds a parquet export of 'old': run with --format "
                                   "parquet, or pick another --to URL"),
        (["--to", "http://example.com/x"], 2, "--to: archive URL 'http://example.com/x' is "
                                              "not supported"),
        (["--format", "csv"], 2, "invalid choice: 'csv'"),
    ]
    for extra, code, says in refusals:
        refused = pipeline("export", *common, *extra)
        assert refused.returncode == code, refused.stderr
        assert says in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    stray = tmp_path / "stray"
    (stray / "changes").mkdir(parents=True)
    (stray / "changes" / "x.parquet").write_bytes(b"")
    refused = pipeline("export", *common[:4], "--to", str(stray))
    assert refused.returncode == 2 and "holds files but no flotilla export record" in \
        refused.stderr


@pytest.fixture
def s3(moto_s3):
    """pyarrow's filesystem for moto_server's bucket, to read what the export wrote."""
    import pyarrow.fs as pafs

    return pafs.S3FileSystem(endpoint_override=moto_s3.endpoint, region=REGION)


def test_parquet_and_delta_on_s3_with_delta_time_travel(spark, s3_store, s3, monkeypatch):
    from deltalake import DeltaTable

    endpoint = s3_store.endpoint
    log = write_archive(s3_store.url, "old", history(40, 120), snapshot_at=[30],
                        segment_entries=30, endpoint=endpoint, stamp=stamp)
    ref = ArchiveRef(s3_store.url, "old", endpoint, REGION)
    prefix = s3_store.url.removeprefix("s3://")
    parquet = Destination.parse(f"{s3_store.url}-parquet", endpoint, REGION)
    delta = Destination.parse(f"{s3_store.url}-delta", endpoint, REGION)
    first = export(spark, ref, parquet, slice_entries=64)
    export(spark, ref, delta, "delta", slice_entries=64)
    hw1 = len(log)
    changes = read(f"{prefix}-parquet", "changes", s3)
    assert changed(changes) == node_changes(log, hw1) and first.changes == len(changes)
    assert folded(changes) == node_state(s3_store.url, hw1, endpoint)
    assert len(read(f"{prefix}-parquet", "entries", s3)) == hw1
    assert s3.get_file_info(f"{prefix}-parquet/_flotilla/export.json").size > 0

    extend_archive(s3_store.url, "old", log, history(41, 60), segment_entries=30,
                   endpoint=endpoint, stamp=stamp)
    export(spark, ref, parquet, slice_entries=64)
    options = delta.storage_options()

    def versions() -> list[tuple[int, int | None]]:
        found = [DeltaTable(f"{s3_store.url}-delta/{t}", storage_options=options)
                 for t in ("changes", "entries")]
        return [(t.version(), t.transaction_version("flotilla-export")) for t in found]

    # Stopped between the two tables' commits: the next run commits entries, not changes again.
    monkeypatch.setenv(INTERRUPT, "committed changes")
    with pytest.raises(Interrupted):
        export(spark, ref, delta, slice_entries=64)  # the format the destination holds
    monkeypatch.delenv(INTERRUPT)
    assert versions() == [(1, len(log)), (0, hw1)]
    second = export(spark, ref, delta, slice_entries=64)
    assert (second.format, second.from_index, second.high_water) == ("delta", hw1 + 1,
                                                                     len(log))
    assert versions() == [(1, len(log)), (1, len(log))]  # one commit per run and table
    tables = {t: DeltaTable(f"{s3_store.url}-delta/{t}", storage_options=options)
              for t in ("changes", "entries")}

    def rows(table) -> list[dict]:
        found = table.to_pyarrow_table().to_pylist()
        return sorted(found, key=lambda r: (r["index"], r["key_bytes"] or b""))

    assert rows(tables["changes"]) == read(f"{prefix}-parquet", "changes", s3)
    assert folded(rows(tables["changes"])) == node_state(s3_store.url, len(log), endpoint)
    assert rows(tables["entries"]) == read(f"{prefix}-parquet", "entries", s3)
    # Time travel: version 0 is the first run, exactly.
    before = DeltaTable(f"{s3_store.url}-delta/changes", storage_options=options, version=0)
    assert rows(before) == changes
    with pytest.raises(PipelineError, match="holds a delta export of 'old': run with "
                                            "--format delta") as refused:
        prepare(ref, delta, "parquet")
    assert refused.value.exit_code == 2


def client_changes(writes) -> list[tuple[int, str, str, bytes | None]]:
    """What a single client's acknowledged writes changed, by its own record alone: a put on
    a key it had not written or had deleted creates it, a put on one it had written updates
    it, a delete of one it had written deletes it, a delete of an absent key changes nothing."""
    held: dict[str, bytes] = {}
    found = []
    for w in sorted(writes, key=lambda w: w.index):
        if w.value is None:
            if held.pop(w.key, None) is not None:
                found.append((w.index, "d", w.key, None))
        else:
            found.append((w.index, "u" if w.key in held else "c", w.key, w.value))
            held[w.key] = w.value
    return found


@pytest.mark.timeout(300)
def test_a_real_cluster_s_writes_come_out_as_its_client_made_them(local_cluster, s3_store,
                                                                   s3, spark):
    """A real 3-member cluster archives to moto_server while one client writes; two exports
    (a member's snapshot between them) hold exactly the changes the client's own record of
    acknowledged writes implies, in its order, with its values."""
    cluster = local_cluster(3, extra_args=s3_store.archive_flags(), env=s3_store.env, **FAST)
    ref = ArchiveRef(s3_store.url, cluster.cluster_id, s3_store.endpoint, REGION)
    dest = Destination.parse(f"{s3_store.url}-export", s3_store.endpoint, REGION)
    keys = [f"x/{i}" for i in range(12)]
    rng = random.Random(5)
    with Writer([n.url for n in cluster.nodes.values()]) as writer:
        random_writes(writer, keys, 60, rng, delete_ratio=0.3, tag="a")
        wait_archived(cluster, cluster.wait_leader(), writer.writes[-1].index)
        first = export(spark, ref, dest)
        post_snapshot(cluster.nodes[cluster.wait_leader()])
        random_writes(writer, keys, 60, rng, delete_ratio=0.3, tag="b")
        wait_archived(cluster, cluster.wait_leader(), writer.writes[-1].index)
        second = export(spark, ref, dest)
    assert first.from_index == 1 and second.from_index == first.high_water + 1
    changes = read(f"{s3_store.url.removeprefix('s3://')}-export", "changes", s3)
    expected = client_changes(writer.writes)
    assert [(r["index"], r["op"], r["key"], r["after"]) for r in changes] == expected
    assert Counter(r["op"] for r in changes) == Counter(op for _, op, _, _ in expected)
    assert first.changes == sum(1 for c in expected if c[0] <= first.high_water)
    assert second.changes == len(expected) - first.changes
