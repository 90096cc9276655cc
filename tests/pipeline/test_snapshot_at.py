"""`snapshot-at` through real Spark (local mode): the payload it publishes is the bytes the
node's own restore builds at that index, and it refuses what the archive cannot give."""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
from flotilla.node.statemachine.kv import encode_delete, encode_put
from flotilla.pipeline.snapshot_at import snapshot_at
from flotilla.pipeline.source import ArchiveRef
from flotilla.pipeline.spark import PipelineError

from tests.pipeline.archives import published_payload, replayed_payload, write_archive

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
            prev = rng.choice([0, n, n - 1, rng.randrange(1, n + 2)])
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
    done = pipeline("snapshot-at", "--archive", url, "--index", str(len(log)),
                    "--to-cluster-id", "copy", "--master", "local[1]")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith('{"cluster_id": "copy"')
    # Spark's own log lines and progress bar stay off the console (the JVM's start-up notes,
    # printed before any configuration applies, remain).
    assert not re.search(r"^\S+ \S+ (WARN|INFO) ", done.stderr, re.M), done.stderr
    assert "[Stage" not in done.stderr, done.stderr
    outside = pipeline("snapshot-at", "--archive", url, "--cluster-id", "old", "--index",
                       str(len(log) + 5))
    assert outside.returncode == 4
    assert len(outside.stderr.strip().splitlines()) == 1, outside.stderr
    twice = pipeline("snapshot-at", "--archive", url, "--cluster-id", "old", "--index", "5",
                     "--to-cluster-id", "copy")
    assert twice.returncode == 2 and "already holds a cluster 'copy'" in twice.stderr
    several = pipeline("snapshot-at", "--archive", url, "--index", "5")
    assert several.returncode == 1 and "pick one with --cluster-id" in several.stderr


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
