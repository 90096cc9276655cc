"""`snapshot-at` through real Spark (local mode): the payload it publishes is the bytes the
node's own restore builds at that index, and it refuses what the archive cannot give."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from flotilla.node.archive import format_ms
from flotilla.node.statemachine.kv import encode_delete, encode_put
from flotilla.pipeline.snapshot_at import snapshot_at
from flotilla.pipeline.source import ArchiveRef
from flotilla.pipeline.spark import PipelineError

from tests.pipeline.archives import published_payload, replayed_payload, write_archive
from tests.pipeline.ledger import Ledger

KEYS = ["a", "b", "k\ud800", "\U0001f600", "", "z" * 40]
CLIENTS = ["c1", "c2", "x\udfff"]


def history(seed: int, count: int) -> list[bytes]:
    """Puts, compare-and-sets that hit and miss, deletes of present and absent keys, retries,
    stale and overtaken sequences, sessions outliving the TTL, commands that do not decode."""
    rng = random.Random(seed)
    out: list[bytes] = []
    seqs = dict.fromkeys(CLIENTS, 0)
    ts = 1_000
    for n in range(count):
        ts = max(0, ts + rng.choice([0, 3, 50, -20, 700_000]))  # past the 10 min TTL at times
        roll = rng.random()
        if roll < 0.03:
            out.append(rng.choice([b"junk", b"", b"\x93\x01\x02\x03"]))
            continue
        client = seq = None
        if rng.random() < 0.5:
            client = rng.choice(CLIENTS)
            step = rng.choice([1, 1, 1, 0, 2, -3, -20])
            seqs[client] = max(1, seqs[client] + max(step, 0))
            seq = max(1, seqs[client] + min(step, 0))
        key = rng.choice(KEYS)
        if roll < 0.25:
            out.append(encode_delete(key, ts=ts, client=client, seq=seq))
        elif roll < 0.45:
            prev = rng.choice([0, n, max(0, n - 1), rng.randrange(1, n + 2)])
            out.append(encode_put(key, b"cas%d" % n, ts=ts, prev_index=prev, client=client,
                                  seq=seq))
        else:
            out.append(encode_put(key, rng.randbytes(rng.randrange(5)), ts=ts, client=client,
                                  seq=seq))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_snapshot_at_writes_the_bytes_the_node_s_restore_builds(spark, tmp_path, seed):
    rng = random.Random(seed)
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(seed, rng.randrange(30, 400)),
                        snapshot_at=sorted(rng.sample(range(2, 60), rng.randrange(0, 3))),
                        segment_entries=rng.choice([7, 50, 1000]))
    for index in sorted({rng.randrange(1, len(log) + 1), len(log)}):
        result = snapshot_at(spark, ArchiveRef(url, "old"), index, tasks=rng.choice([1, 3]))
        assert result.cluster_id == f"old-at-{index}"
        meta, payload = published_payload(url, result.cluster_id)
        assert (meta.index, meta.term, meta.ts_ms) == (index, log[index - 1].term,
                                                       log[index - 1].ts_ms)
        assert payload == replayed_payload(url, "old", index), f"index {index}"


def last_at_or_before(log, ts_ms: int) -> int:
    """The dumb answer: scan the log for the last entry stamped at or before `ts_ms`."""
    return max(e.index for e in log if e.ts_ms <= ts_ms)


def test_a_time_is_the_state_after_the_last_entry_stamped_at_or_before_it(spark, tmp_path):
    """write_archive stamps command n at 1000 (n + 2) ms; a no-op shares its command's time.
    Inclusive and exclusive targets, a time between two stamps, the very last entry."""
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(5, 120), snapshot_at=[40], segment_entries=25)
    noop = next(e for e in log if e.kind == 2 and e.index > 45)  # EntryKind.NOOP
    cases = [(noop.ts_ms, False), (noop.ts_ms, True), (log[60].ts_ms + 500, False),
             (log[-1].ts_ms, False)]
    for ts_ms, exclusive in cases:
        index = last_at_or_before(log, ts_ms - 1 if exclusive else ts_ms)
        result = snapshot_at(spark, ArchiveRef(url, "old"), time_ms=ts_ms, exclusive=exclusive,
                             to_cluster_id=f"t{ts_ms}{'x' if exclusive else ''}")
        assert result.index == index, (ts_ms, exclusive)
        assert result.time == format_ms(log[index - 1].ts_ms)
        meta, payload = published_payload(url, result.cluster_id)
        assert meta.index == index and payload == replayed_payload(url, "old", index)
    assert last_at_or_before(log, noop.ts_ms) == noop.index  # the no-op counts inclusive


def test_a_rerun_gives_the_same_result_and_an_id_is_never_reused_for_other_data(
        spark, tmp_path):
    """A Job's pod that died after publishing runs again: same answer, nothing rewritten.
    The same id asked to hold another cluster's state at that index is refused."""
    url = (tmp_path / "archive").as_uri()
    write_archive(url, "old", history(6, 60), snapshot_at=[30])
    write_archive(url, "other", history(7, 60))
    first = snapshot_at(spark, ArchiveRef(url, "old"), 50, to_cluster_id="pitr")
    manifests = sorted((tmp_path / "archive" / "pitr").rglob("*"))
    again = snapshot_at(spark, ArchiveRef(url, "old"), 50, to_cluster_id="pitr")
    assert again == first
    assert sorted((tmp_path / "archive" / "pitr").rglob("*")) == manifests
    # A run that died after its upload, before its manifest: the rerun publishes the same.
    for manifest in (tmp_path / "archive" / "pitr" / "manifests").iterdir():
        manifest.unlink()
    assert snapshot_at(spark, ArchiveRef(url, "old"), 50, to_cluster_id="pitr") == first
    assert published_payload(url, "pitr")[1] == replayed_payload(url, "old", 50)
    with pytest.raises(PipelineError, match="already holds a different state at index 50") as no:
        snapshot_at(spark, ArchiveRef(url, "other"), 50, to_cluster_id="pitr")
    assert no.value.exit_code == 2


@pytest.mark.parametrize("seed", [20, 21])
def test_the_sequential_replay_gives_the_folds_bytes(spark, tmp_path, seed):
    rng = random.Random(seed)
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(seed, 200), snapshot_at=[rng.randrange(2, 150)],
                        segment_entries=40)
    index = rng.randrange(150, len(log) + 1)
    result = snapshot_at(spark, ArchiveRef(url, "old"), index, sequential=True)
    meta, payload = published_payload(url, result.cluster_id)
    assert (meta.index, meta.term, meta.ts_ms) == (index, log[index - 1].term,
                                                   log[index - 1].ts_ms)
    assert payload == replayed_payload(url, "old", index)


def ledger_commands(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    names = ["ann", "bob", "cy"]
    out = []
    for _ in range(count):
        roll = rng.random()
        if roll < 0.4:
            out.append(f"deposit {rng.choice(names)} {rng.randrange(100)}".encode())
        elif roll < 0.8:
            out.append(f"transfer {rng.choice(names)} {rng.choice(names)} "
                       f"{rng.randrange(80)}".encode())
        elif roll < 0.95:
            out.append(f"interest {rng.randrange(1, 9)}".encode())
        else:
            out.append(b"\xffjunk")
    return out


def test_a_users_state_machine_is_replayed_in_one_task_to_the_members_bytes(spark, tmp_path):
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "books", ledger_commands(1, 300), snapshot_at=[90, 200],
                        segment_entries=37, machine=Ledger)
    spec = "tests.pipeline.ledger:Ledger"
    for index in (150, len(log)):
        result = snapshot_at(spark, ArchiveRef(url, "books"), index, machine=spec)
        meta, payload = published_payload(url, result.cluster_id)
        assert (meta.index, meta.ts_ms) == (index, log[index - 1].ts_ms)
        assert payload == replayed_payload(url, "books", index, Ledger)
        assert b'"balances"' in payload
    # The built-in machine cannot read the ledger's snapshots, nor the ledger the built-in's.
    with pytest.raises(PipelineError, match=r"snapshots/\S+ is a snapshot of the 'ledger' "
                                             "machine, not of the key-value machine"):
        snapshot_at(spark, ArchiveRef(url, "books"), 120, to_cluster_id="wrong")


def test_a_snapshot_of_another_machine_is_refused_naming_it(spark, tmp_path):
    from flotilla.pipeline.spark import task_failure

    url = (tmp_path / "archive").as_uri()
    write_archive(url, "old", history(22, 60), snapshot_at=[30])
    with pytest.raises(Exception) as wrong:
        snapshot_at(spark, ArchiveRef(url, "old"), 50, machine="tests.pipeline.ledger:Ledger")
    why = task_failure(wrong.value) or str(wrong.value)
    assert "is a snapshot of the 'kv' machine, not of 'tests.pipeline.ledger:Ledger'" in why


def test_an_index_beyond_the_archive_is_refused_with_what_it_holds(spark, tmp_path):
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(1, 40))
    with pytest.raises(PipelineError) as refused:
        snapshot_at(spark, ArchiveRef(url, "old"), len(log) + 1)
    assert refused.value.exit_code == 4
    assert f"indexes 1..{len(log)}" in str(refused.value)


def test_the_command_prints_one_json_line_and_refuses_in_one_line(tmp_path):
    pytest.importorskip("pyspark")
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(2, 60), snapshot_at=[20])

    def pipeline(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "flotilla", "pipeline", *argv],
                              capture_output=True, text=True, timeout=300)

    plan = pipeline("snapshot-at", "--archive", url, "--index", "30", "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert '"base_snapshot": {"key": "snapshots/' in plan.stdout
    result_file = tmp_path / "result"
    done = pipeline("snapshot-at", "--archive", url, "--index", str(len(log)),
                    "--to-cluster-id", "copy", "--master", "local[1]", "--result-file",
                    str(result_file))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith('{"cluster_id": "copy"')
    assert result_file.read_text() == done.stdout.strip().splitlines()[-1] + "\n"
    # Spark's own log lines and progress bar stay off the console (the JVM's start-up notes,
    # printed before any configuration applies, remain).
    assert not re.search(r"^\S+ \S+ (WARN|INFO) ", done.stderr, re.M), done.stderr
    assert "[Stage" not in done.stderr, done.stderr
    outside = pipeline("snapshot-at", "--archive", url, "--cluster-id", "old", "--index",
                       str(len(log) + 5), "--result-file", str(result_file))
    assert outside.returncode == 4
    assert len(outside.stderr.strip().splitlines()) == 1, outside.stderr
    assert result_file.read_text() == outside.stderr  # the reason, for a Job's status
    # The only source cluster besides the target: a rerun finds the old one by itself.
    rerun = pipeline("snapshot-at", "--archive", url, "--index", str(len(log)),
                     "--to-cluster-id", "copy", "--dry-run")
    assert rerun.returncode == 0 and '"cluster_id": "old"' in rerun.stdout, rerun.stderr
    twice = pipeline("snapshot-at", "--archive", url, "--cluster-id", "old", "--index", "5",
                     "--to-cluster-id", "copy")
    assert twice.returncode == 2 and "already holds a cluster 'copy'" in twice.stderr
    several = pipeline("snapshot-at", "--archive", url, "--index", "5")
    assert several.returncode == 1 and "pick one with --cluster-id" in several.stderr
    late = pipeline("snapshot-at", "--archive", url, "--cluster-id", "old", "--time",
                    format_ms(log[-1].ts_ms + 1))
    assert late.returncode == 4, late.stderr
    assert "after the last archived entry; restorable times are 1970-01-01T00:00:01.000Z " \
           f"(index 1) to {format_ms(log[-1].ts_ms)} (index {len(log)})" in late.stderr
    assert len(late.stderr.strip().splitlines()) == 1, late.stderr
    early = pipeline("snapshot-at", "--archive", url, "--cluster-id", "old", "--time",
                     "1970-01-01T00:00:01Z", "--exclusive", "--dry-run")
    assert early.returncode == 4 and "no archived entry is stamped before it" in early.stderr
    by_time = pipeline("snapshot-at", "--archive", url, "--cluster-id", "old", "--time",
                       "1970-01-01T00:00:05.5+00:00", "--dry-run")
    assert by_time.returncode == 0, by_time.stderr
    assert '"requested_time": "1970-01-01T00:00:05.500Z"' in by_time.stdout
    assert '"index": 5,' in by_time.stdout  # entry n + 2 (command n) is stamped n + 2 s


@pytest.mark.parametrize(("argv", "says"), [
    (["--index", "3", "--time", "2026-11-25T17:00:00Z"], "not allowed with argument"),
    (["--time", "2026-11-25T17:00:00"], "not an RFC 3339 time with an offset"),
    (["--time", "yesterday"], "like 2026-11-25T17:00:00.250Z"),
    (["--index", "3", "--exclusive"], "--exclusive goes with --time"),
    ([], "one of the arguments --index --time is required"),
    (["--index", "0"], "expected a whole number >= 1"),
    (["--index", "3", "--to-cluster-id", "../x"], "--to-cluster-id"),
    (["--index", "3", "--to-cluster-id", "old"], "is the source cluster itself"),
    (["--index", "3", "--state-machine", "nowhere.at.all:X"], "cannot import module"),
])
def test_bad_flags_exit_2_in_one_line(tmp_path, argv, says):
    url = (tmp_path / "archive").as_uri()
    write_archive(url, "old", history(8, 10))
    done = subprocess.run([sys.executable, "-m", "flotilla", "pipeline", "snapshot-at",
                           "--archive", url, "--dry-run", *argv],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_what_is_not_in_the_archive_is_named_in_one_line(tmp_path):
    """No manifest at all; a cluster id the archive does not hold (the ones it holds are
    listed)."""
    empty = tmp_path / "empty"
    empty.mkdir()
    url = (tmp_path / "archive").as_uri()
    write_archive(url, "old", history(9, 10))
    for argv, says in [
        (["--archive", empty.as_uri()], "holds no archived cluster; check the --archive URL"),
        (["--archive", url, "--cluster-id", "nope"],
         "holds no cluster 'nope' (it holds: old); check --cluster-id"),
    ]:
        done = subprocess.run([sys.executable, "-m", "flotilla", "pipeline", "snapshot-at",
                               "--index", "3", *argv], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 1, done.stderr
        assert says in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_missing_java_or_pyspark_is_named_with_what_to_install(tmp_path):
    url = (tmp_path / "archive").as_uri()
    write_archive(url, "old", history(10, 10))
    argv = ["snapshot-at", "--archive", url, "--index", "3"]
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = os.path.dirname(sys.executable)  # no java on it
    no_java = subprocess.run([sys.executable, "-m", "flotilla", "pipeline", *argv], env=env,
                             capture_output=True, text=True, timeout=60)
    assert no_java.returncode == 2, no_java.stderr
    assert no_java.stderr.strip() == (
        "flotilla pipeline: Spark needs a Java runtime (17 or 21) and none was found: install "
        "one (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    # Without the extra, pyspark does not import (None in sys.modules makes import fail).
    script = ("import sys; sys.modules['pyspark'] = None; "
              "from flotilla.cli import main; sys.exit(main(['pipeline', *sys.argv[1:]]))")
    no_extra = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True,
                              text=True, timeout=60)
    assert no_extra.returncode == 2, no_extra.stderr
    assert no_extra.stderr.strip() == (
        "flotilla pipeline: the pipeline needs PySpark: pip install 'flotilla[pipeline]'")


def test_a_corrupt_segment_fails_naming_the_object(spark, tmp_path):
    url = (tmp_path / "archive").as_uri()
    write_archive(url, "old", history(3, 80), segment_entries=30)
    victim = sorted(Path(tmp_path / "archive" / "old" / "segments").glob("*.seg"))[1]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(Exception) as failed:
        snapshot_at(spark, ArchiveRef(url, "old"), 80)
    from flotilla.pipeline.spark import task_failure

    assert victim.name in (task_failure(failed.value) or str(failed.value))


def test_spark_submit_runs_the_job_file_on_the_master_it_was_given(tmp_path):
    """The documented way onto a Spark cluster: `spark-submit --master M <the job file> JOB`.
    The job takes spark-submit's master (no --master of its own) and prints its JSON line."""
    pytest.importorskip("pyspark")
    from flotilla.pipeline import main as job_file

    submit = Path(sys.executable).with_name("spark-submit")
    if not submit.exists():
        pytest.skip(f"no spark-submit beside {sys.executable}")
    url = (tmp_path / "archive").as_uri()
    log = write_archive(url, "old", history(11, 120), snapshot_at=[40])
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([str(submit), "--master", "local[1]", job_file.__file__,
                           "snapshot-at", "--archive", url, "--index", str(len(log) - 3)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(f'{{"cluster_id": "old-at-{len(log) - 3}"'), done.stdout
    _, payload = published_payload(url, f"old-at-{len(log) - 3}")
    assert payload == replayed_payload(url, "old", len(log) - 3)


def test_every_destination_lands_in_its_own_partition(spark):
    # The stages rely on Spark's hash partitioning being pmod(hash(c), n) for their labels.
    from flotilla.pipeline.stages import exactly, spark_hash_int
    from pyspark.sql import functions as F

    ints = spark.range(-300, 300).select(F.col("id").cast("int").alias("i"))
    assert all(spark_hash_int(i) == h
               for i, h in ints.select("i", F.hash("i")).collect())
    for count in (1, 2, 3, 7, 16):
        rows = spark.range(5 * count).select((F.col("id") % count).cast("int").alias("dest"))
        placed = exactly(rows, count).select("dest", F.spark_partition_id()).collect()
        assert all(dest == partition for dest, partition in placed)
