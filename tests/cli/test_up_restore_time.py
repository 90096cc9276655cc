"""`flotilla up --restore-from URL --restore-time T`: a new local cluster holds the state after
the last entry stamped at or before T; a T outside the archive is refused (exit 4) before
any member starts."""

from __future__ import annotations

import json
import random
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from flotilla import local
from tests.archive_node.support import (
    FAST,
    Store,
    Writer,
    assert_state,
    random_writes,
    wait_archived,
)
from tests.harness.cli import CLEANUP_TIMEOUT_S
from tests.harness.cli import flotilla as run_flotilla

UP_FAST = ["--election-timeout-ms", "500", "--heartbeat-ms", "50"]


def flotilla(cwd: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_flotilla(*argv, cwd=cwd, timeout=timeout, text=True)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def members_running(root: Path) -> str:
    return subprocess.run(["pgrep", "-af", f"flotilla.node .*{root}"], capture_output=True,
                          text=True).stdout


def assert_nothing_left(root: Path) -> None:
    assert members_running(root) == ""
    assert not local.LocalCluster.exists(root)
    assert not any(root.glob("n[0-9]/")), sorted(p.name for p in root.iterdir())


def archived_cluster(local_cluster, tmp_path: Path, phases: int = 2):
    """A one-member cluster that archived ``phases`` bursts of writes to a file:// archive,
    then died: its store, cluster id, the writes of each phase, and the wall-clock ms by which
    each phase was acknowledged (the next one starts tens of ms later)."""
    root = tmp_path / "old-archive"
    root.mkdir()
    store = Store(root.as_uri())
    old = local_cluster(1, extra_args=store.archive_flags(), **FAST)
    old.wait_leader()
    keys = [f"up/{i}" for i in range(5)]
    rng = random.Random(7)
    done, ends = [], []
    with Writer([old.nodes["n0"].url]) as writer:
        for phase in range(phases):
            time.sleep(0.05)
            before = len(writer.writes)
            random_writes(writer, keys, 8, rng, delete_ratio=0.25, tag=f"p{phase}.")
            ends.append(now_ms())
            done.append(list(writer.writes[before:]))
    wait_archived(old, "n0", done[-1][-1].index)
    old.nodes["n0"].kill()
    return store, old.cluster_id, keys, done, ends


@pytest.mark.timeout(120)
def test_up_restores_the_state_at_a_time_on_every_member(local_cluster, tmp_path: Path):
    store, old_id, keys, phases, ends = archived_cluster(local_cluster, tmp_path)
    cluster = store.cluster_archive(old_id)
    try:
        at = cluster.index_at_time(ends[0])
    finally:
        cluster.archive.close()
    assert phases[0][-1].index <= at < phases[1][0].index, (at, phases)

    root = tmp_path / "new"
    try:
        up = flotilla(tmp_path, "up", "--dir", str(root), "--restore-from", store.url,
                      "--restore-time", rfc3339(ends[0]), *UP_FAST)
        assert up.returncode == 0, up.stdout + up.stderr
        assert (f"restored: the state at {rfc3339(ends[0])}: index {at}, the last entry "
                f"stamped at or before it, of cluster {old_id} from {store.url}") in up.stdout
        new = local.LocalCluster.load(root)
        assert len(new.members) == 3
        for m in new.members:  # the flag every member was started with, recorded for restarts
            assert m.args[m.args.index("--restore-time") + 1] == rfc3339(ends[0]), m.args
        with new.client(timeout=10) as client:
            for m in new.members:
                assert client.status(m.client_url)["snapshot"]["index"] == at, m.name
        for m in new.members:
            assert_state(m.client_url, phases[0], None, keys, "up/",
                         f"{m.name} restored at the end of the first phase")
        status = json.loads(flotilla(tmp_path, "status", "--dir", str(root), "-o",
                                     "json").stdout)
        assert status["cluster_id"] != old_id
    finally:
        flotilla(tmp_path, "down", "--dir", str(root), "--timeout", str(CLEANUP_TIMEOUT_S))


@pytest.mark.timeout(90)
def test_up_refuses_a_target_outside_the_archive_before_starting_anything(local_cluster,
                                                                          tmp_path: Path):
    store, old_id, *_ = archived_cluster(local_cluster, tmp_path, phases=1)
    cluster = store.cluster_archive(old_id)
    try:
        manifest = cluster.manifest()
        assert manifest is not None
        stamps = {e.index: e.ts_ms for s in manifest.segments for e in cluster.read_segment(s)}
    finally:
        cluster.archive.close()
    first, last = min(stamps), manifest.last_archived_index
    last_ts = stamps[last]
    restorable = (f"restorable times are {rfc3339(stamps[first])} (index {first}) to "
                  f"{rfc3339(last_ts)} (index {last})")

    for n, (flag, value, says) in enumerate([
            ("--restore-time", rfc3339(last_ts + 60_000), "it is after the last archived entry"),
            ("--restore-time", rfc3339(0), "no archived entry is stamped at or before it"),
            ("--restore-index", str(last + 100), f"index {last + 100} is beyond")]):
        root = tmp_path / f"refused-{n}"
        refused = flotilla(tmp_path, "up", "--dir", str(root), "--restore-from", store.url,
                           flag, value, *UP_FAST)
        assert refused.returncode == 4, refused.stdout + refused.stderr
        line = one_line(refused)
        assert line.startswith("flotilla up: cannot restore: ") and says in line, line
        if flag == "--restore-time":
            assert restorable in line, line
        assert_nothing_left(root)


@pytest.mark.parametrize(("argv", "says"), [
    (["--restore-from", "x", "--restore-time", "2026-11-25 17:00"],
     "argument --restore-time: '2026-11-25 17:00' is not an RFC 3339 time with an offset"),
    (["--restore-from", "x", "--restore-time", "2026-11-25T17:00:00Z", "--restore-index", "3"],
     "not allowed with argument"),
    (["--restore-time", "2026-11-25T17:00:00Z"], "--restore-time needs --restore-from"),
])
def test_up_refuses_bad_restore_time_options_in_one_line(tmp_path: Path, argv, says):
    result = flotilla(tmp_path, "up", *argv)
    assert result.returncode == 2, result.stdout + result.stderr
    assert says in one_line(result)
    assert not (tmp_path / ".flotilla").exists()


def test_up_restores_the_archived_cluster_it_is_told_to(tmp_path: Path):
    """An archive holding two clusters (an old one and what `snapshot-at` published beside
    it, say): `--restore-cluster-id` picks one; without it `up` says to, and starts nothing."""
    from flotilla.node.statemachine.kv import encode_put

    from tests.pipeline.archives import write_archive

    url = (tmp_path / "archive").as_uri()
    write_archive(url, "prod", [encode_put("k", b"from prod", ts=1)])
    write_archive(url, "prod-at-2", [encode_put("k", b"from the copy", ts=1),
                                     encode_put("j", b"too", ts=2)])
    several = flotilla(tmp_path, "up", "--replicas", "1", "--restore-from", url, *UP_FAST)
    assert several.returncode == 1, several.stdout + several.stderr
    assert "holds several clusters (prod, prod-at-2); pick one with --restore-cluster-id" in \
        one_line(several)
    assert_nothing_left(tmp_path / ".flotilla")
    alone = flotilla(tmp_path, "up", "--restore-cluster-id", "prod-at-2")
    assert alone.returncode == 2 and "--restore-cluster-id needs --restore-from" in \
        one_line(alone)
    root = tmp_path / ".flotilla"
    up = flotilla(tmp_path, "up", "--replicas", "1", "--restore-from", url,
                  "--restore-cluster-id", "prod-at-2", *UP_FAST)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "of cluster prod-at-2 from" in up.stdout, up.stdout
        got = flotilla(tmp_path, "kv", "get", "k")
        assert got.returncode == 0 and got.stdout.strip() == "from the copy", got
    finally:
        flotilla(tmp_path, "down")
    assert members_running(root) == ""
