"""Point-in-time restore by time (``--restore-time T``): a new cluster holds exactly the state
after the last entry its old leader stamped at or before T.

The story: a real cluster takes writes in phases a few tens of milliseconds apart, and the
test notes the wall-clock time once each phase is acknowledged. A cluster restored at such a
time holds exactly what the test wrote up to then (by its own record, not the product's), and
the same state as a ``--restore-index`` restore at the index the archive names for that time.
Times outside the archive exit 4 naming what can be restored, and leave the data dir as empty
as they found it; bad flags exit 2 in one line.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest
from flotilla.node.consensus import Entry

from tests.archive_node.support import (
    FAST,
    Store,
    Write,
    Writer,
    assert_state,
    post_snapshot,
    random_writes,
    read_state,
    replay,
    wait_archived,
)
from tests.harness.processes import NodeProcess

PHASES = 4
PER_PHASE = 10
GAP_S = 0.05  # between phases: a phase's entries are stamped in later milliseconds


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def rfc3339(ms: int, offset_hours: int = 0) -> str:
    """``ms`` as an RFC 3339 time with milliseconds, in the zone ``offset_hours`` from UTC
    (written here, not by the product, so a formatting bug cannot hide a parsing one)."""
    zone = UTC if offset_hours == 0 else timezone(timedelta(hours=offset_hours))
    moment = datetime.fromtimestamp(ms / 1000, tz=zone)
    text = moment.isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def time_flags(store: Store, cluster_id: str, ts: str) -> list[str]:
    return [*store.restore_flags(cluster_id=cluster_id), "--restore-time", ts]


def archived_log(store: Store, cluster_id: str) -> list[Entry]:
    """Every archived entry of the cluster, read with the node's segment reader."""
    cluster = store.cluster_archive(cluster_id)
    try:
        manifest = cluster.manifest()
        assert manifest is not None, f"nothing archived for {cluster_id}"
        entries = {e.index: e for s in manifest.segments for e in cluster.read_segment(s)}
    finally:
        cluster.archive.close()
    return [entries[i] for i in sorted(entries)]


def index_at_time(store: Store, cluster_id: str, ts_ms: int) -> int:
    cluster = store.cluster_archive(cluster_id)
    try:
        return cluster.index_at_time(ts_ms)
    finally:
        cluster.archive.close()


def last_run(node: NodeProcess) -> list[str]:
    """The member's output since its latest start."""
    lines = node.log_tail(200).splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("--- harness: start")]
    return lines[starts[-1] + 1:] if starts else lines


def refusal(node: NodeProcess) -> str:
    """The one ``flotilla node:`` line of a member that refused to start, with no traceback."""
    out = last_run(node)
    said = [line for line in out if line.startswith("flotilla node:")]
    assert len(said) == 1 and not any("Traceback" in line for line in out), "\n".join(out)
    return said[0]


def assert_untouched(data_dir: Path) -> None:
    """Nothing but the lock the refused member took: the next start finds an empty dir."""
    left = sorted(p.name for p in data_dir.iterdir()) if data_dir.exists() else []
    assert left in ([], ["flotilla.lock"]), f"a refused restore left {left} in {data_dir}"


def write_in_phases(writer: Writer, keys: list[str], rng: random.Random,
                    between=lambda phase: None) -> tuple[list[list[Write]], list[int]]:
    """PHASES bursts of writes; returns each phase's writes and the wall-clock ms at which all
    of that phase was acknowledged. ``between(phase)`` runs after each phase."""
    phases, ends = [], []
    for phase in range(PHASES):
        time.sleep(GAP_S)
        before = len(writer.writes)
        random_writes(writer, keys, PER_PHASE, rng, delete_ratio=0.25, tag=f"p{phase}.")
        ends.append(now_ms())
        phases.append(list(writer.writes[before:]))
        between(phase)
    return phases, ends


@pytest.mark.timeout(120)
@pytest.mark.parametrize("store_name", ["file", "s3"])
def test_restore_at_a_time_holds_exactly_what_was_acknowledged_by_then(local_cluster, request,
                                                                        store_name):
    store: Store = request.getfixturevalue(f"{store_name}_store")
    # Small segments: a target time falls on a segment's edge or inside one.
    old = local_cluster(3, extra_args=store.archive_flags(segment_entries=8), env=store.env,
                        **FAST)
    old.wait_leader()
    keys = [f"pt/{i}" for i in range(6)]

    def snapshot_after_phase_1(phase: int) -> None:
        if phase == 1:  # later targets restore from a snapshot plus segments
            post_snapshot(old.nodes[old.wait_leader()])

    with Writer([n.url for n in old.nodes.values()]) as writer:
        phases, ends = write_in_phases(writer, keys, random.Random(11), snapshot_after_phase_1)
        writes = list(writer.writes)
    wait_archived(old, old.wait_leader(), writes[-1].index)
    for node in old.nodes.values():
        node.kill()
    stamps = {e.index: e.ts_ms for e in archived_log(store, old.cluster_id)}

    # The first phase's last write, at its own stamp (the target is inclusive), and the time
    # the third phase was acknowledged, written in another zone.
    targets = [(0, stamps[phases[0][-1].index], 0), (2, ends[2], 2)]
    restored = []
    for phase, ts_ms, zone in targets:
        assert stamps[phases[phase][-1].index] <= ts_ms < stamps[phases[phase + 1][0].index], (
            f"phase {phase}: the entries are not stamped on either side of {ts_ms}: {stamps}")
        at = index_at_time(store, old.cluster_id, ts_ms)
        assert phases[phase][-1].index <= at < phases[phase + 1][0].index, (phase, at)
        tag = uuid.uuid4().hex[:6]
        by_time = local_cluster(1, cluster_id=f"time-{tag}", env=store.env, **FAST,
                                extra_args=time_flags(store, old.cluster_id,
                                                      rfc3339(ts_ms, zone)))
        by_index = local_cluster(1, cluster_id=f"index-{tag}", env=store.env, **FAST,
                                 extra_args=store.restore_flags(cluster_id=old.cluster_id,
                                                                index=at))
        restored.append((phase, at, by_time, by_index))

    for phase, at, by_time, by_index in restored:
        acknowledged = [w for p in phases[:phase + 1] for w in p]
        for cluster in (by_time, by_index):
            cluster.wait_leader(timeout=60)
            assert cluster.status("n0")["snapshot"]["index"] == at, cluster.status("n0")
        assert_state(by_time.nodes["n0"].url, acknowledged, None, keys, "pt/",
                     f"restored at the end of phase {phase}")
        assert replay(acknowledged) != replay(writes), "the target should not be the end"
        assert (read_state(by_time.nodes["n0"].url, keys, "pt/")
                == read_state(by_index.nodes["n0"].url, keys, "pt/"))
        said = "\n".join(last_run(by_time.nodes["n0"]))
        assert f"is index {at}" in said and f"restored the state at index {at}" in said, said


@pytest.mark.timeout(90)
def test_a_time_outside_the_archive_exits_4_naming_the_range_and_writes_nothing(
        local_cluster, file_store):
    store: Store = file_store
    old = local_cluster(1, extra_args=store.archive_flags(), **FAST)
    old.wait_leader()
    keys = [f"out/{i}" for i in range(4)]
    with Writer([old.nodes["n0"].url]) as writer:
        random_writes(writer, keys, 12, random.Random(5), delete_ratio=0.2)
        writes = list(writer.writes)
    wait_archived(old, "n0", writes[-1].index)
    old.nodes["n0"].kill()
    log = archived_log(store, old.cluster_id)
    first, last = log[0], log[-1]
    assert last.index >= writes[-1].index
    restorable = (f"restorable times are {rfc3339(first.ts_ms)} (index {first.index}) to "
                  f"{rfc3339(last.ts_ms)} (index {last.index})")

    before, after = first.ts_ms - 1, last.ts_ms + 1
    new = local_cluster(1, cluster_id=f"out-{uuid.uuid4().hex[:6]}", **FAST,
                        extra_args=time_flags(store, old.cluster_id, rfc3339(before)))
    node = new.nodes["n0"]
    for ts_ms, why in ((before, "no archived entry is stamped at or before it"),
                       (after, "it is after the last archived entry")):
        if ts_ms != before:  # the same data dir, started again
            node.extra_args = time_flags(store, old.cluster_id, rfc3339(ts_ms))
            node.restart()
        assert node.wait(30) == 4, "\n".join(last_run(node))
        line = refusal(node)
        assert why in line and restorable in line, line
        assert_untouched(node.data_dir)

    # The same data dir restores a time inside the range: the last entry's own stamp.
    node.extra_args = time_flags(store, old.cluster_id, rfc3339(last.ts_ms))
    node.restart()
    new.wait_leader(timeout=30)
    assert new.status("n0")["snapshot"]["index"] == last.index
    assert_state(node.url, writes, None, keys, "out/", "restored at the last archived entry")

    # Once it holds state, restore flags are ignored, however wrong.
    node.kill()
    node.extra_args = time_flags(store, old.cluster_id, rfc3339(last.ts_ms + 60_000))
    node.restart()
    new.wait_leader(timeout=30)
    assert new.status("n0")["snapshot"]["index"] == last.index
    assert_state(node.url, writes, None, keys, "out/", "a restart with a wrong time")


BASE = ["--name", "n1", "--listen-peer", "127.0.0.1:1", "--listen-client", "127.0.0.1:2"]
FROM = ["--restore-from", "file:///nonexistent/archive"]


@pytest.mark.parametrize(("args", "env", "says"), [
    ([*FROM, "--restore-time", "yesterday"], {},
     "--restore-time: 'yesterday' is not an RFC 3339 time with an offset"),
    ([*FROM, "--restore-time", "2026-11-25T17:00:00.250"], {},
     "--restore-time: '2026-11-25T17:00:00.250' is not an RFC 3339 time with an offset"),
    ([*FROM, "--restore-time", "2026-02-30T17:00:00Z"], {}, "is not a valid time"),
    ([*FROM], {"FLOTILLA_RESTORE_TIME": "soon"}, "--restore-time: 'soon' is not an RFC 3339"),
    (["--restore-time", "2026-11-25T17:00:00Z"], {}, "--restore-time needs --restore-from"),
    ([*FROM, "--restore-index", "5", "--restore-time", "2026-11-25T17:00:00Z"], {},
     "give --restore-index or --restore-time, not both"),
    ([*FROM, "--restore-time", "2026-11-25T17:00:00Z"], {"FLOTILLA_RESTORE_INDEX": "5"},
     "give --restore-index or --restore-time, not both"),
])
def test_bad_restore_time_flags_exit_2_in_one_line(tmp_path, args, env, says):
    data_dir = tmp_path / "data"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_")}
    result = subprocess.run([sys.executable, "-m", "flotilla.node", *BASE,
                             "--data-dir", str(data_dir), *args],
                            capture_output=True, text=True, timeout=30, env={**clean, **env})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("flotilla node: ") and says in lines[0], lines[0]
    assert not data_dir.exists()
