"""`flotilla scale` end to end: the planner driving real member processes.

`flotilla up --replicas 3`, clients writing and reading throughout, `flotilla scale 5`, leadership
moved onto a member that is about to leave, `flotilla scale 3`. The history must be
linearizable with no acknowledged write lost, and every remaining member must hold exactly the
expected voters, not joint. Then the slot of a removed member comes back: it must not rejoin on
its old data."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from flotilla.operator.planner import Record

from flotilla import local, scaling
from flotilla.cli import main as cli_main
from tests.faults.support import KEYS, TracedHistory, TracedWorkload, diagnostics
from tests.harness.cli import CLEANUP_TIMEOUT_S, flotilla
from tests.harness.kvclient import read_final_reads
from tests.harness.linearizability import check_final_state
from tests.harness.polling import wait_for

FAST = {"election_timeout_ms": 500, "heartbeat_ms": 50}


@pytest.fixture
def cluster_dir(tmp_path: Path):
    root = tmp_path / "c"
    yield root
    if local.LocalCluster.exists(root):
        cluster = local.LocalCluster.load(root)
        cluster.stop(timeout=CLEANUP_TIMEOUT_S)


def checked_workload(root: Path, clients: int, seed: int) -> TracedWorkload:
    """Clients writing and reading the cluster in `root`, their history recorded for the
    linearizability check; the endpoints are read again per request, so the clients follow
    the members as `scale` changes them."""
    return TracedWorkload(lambda: local.LocalCluster.load(root).endpoints, KEYS,
                          clients=clients, duration=180.0, seed=seed, timeout=2.0,
                          mix={"put": 0.4, "get": 0.4, "delete": 0.1, "cas": 0.1},
                          history=TracedHistory())


def config_of(cluster: local.LocalCluster, name: str) -> tuple[list[str], list[str], object]:
    config = cluster.member_status(name, timeout=2.0)["config"]
    return sorted(config["voters"]), sorted(config["learners"]), config["joint"]


def test_scale_3_to_5_to_3_under_load_with_the_leader_leaving(cluster_dir: Path, capsys):
    cluster, _ = local.up(cluster_dir, 3, **FAST)
    w = checked_workload(cluster_dir, clients=4, seed=7)
    with w:
        wait_for(lambda: w.ok_count >= 30, 20, "the workload to get going")
        assert cli_main(["scale", "5", "--dir", str(cluster_dir), "--timeout", "120"]) == 0
        cluster = local.LocalCluster.load(cluster_dir)
        five = ["n1", "n2", "n3", "n4", "n5"]
        assert config_of(cluster, cluster.leader()) == (five, [], None)
        grown = w.ok_count

        with cluster.client(timeout=10) as c:  # the leader must be among those removed
            c.transfer_leader("n5")
        assert cluster.leader() == "n5"
        wait_for(lambda: w.ok_count >= grown + 30, 20, "writes with five voters")
        assert cli_main(["scale", "3", "--dir", str(cluster_dir), "--timeout", "120"]) == 0
        shrunk = w.ok_count
        wait_for(lambda: w.ok_count >= shrunk + 30, 20, "writes after the scale down")
    out = capsys.readouterr().out
    print(out)

    cluster = local.LocalCluster.load(cluster_dir)
    three = ["n1", "n2", "n3"]
    assert cluster.names == three
    for name in three:
        assert config_of(cluster, name) == (three, [], None)
    steps = [line.split(":")[0] for line in out.splitlines() if not line.startswith(
        ("waiting", "  ", "voters"))]
    assert steps[:5] == ["resize to 5", "add-learner n4", "add-learner n5",
                         "change-voters to n1, n2, n3, n4, n5", "done"], out
    assert steps[5].startswith("transfer-leader n"), out  # off n5, before anything else
    assert steps[6:] == ["change-voters to n1, n2, n3", "resize to 3", "delete-volume n4",
                         "delete-volume n5", "done"], out
    assert not (cluster_dir / "n4").exists() and not (cluster_dir / "n5").exists()

    reads = read_final_reads({n: cluster.url(n) for n in three}, KEYS)
    result = check_final_state(w.history, {k: r.value for k, r in reads.items()}, timeout=90)
    assert result.ok, f"{diagnostics(w)}\n{result.explain()}"
    print(f"{w.summary()}: {result.verdict}")
    record = Record.from_json(cluster.state.record)
    assert sorted(record.removed.values()) == ["n4", "n5"] and sorted(record.uids) == three


def test_a_removed_member_never_rejoins_on_its_old_data(cluster_dir: Path):
    cluster, _ = local.up(cluster_dir, 3, **FAST)
    with cluster.client(timeout=10) as c:
        c.put("before", b"1")
    scaling.scale(cluster_dir, 4, timeout=60)
    cluster = local.LocalCluster.load(cluster_dir)
    old_uid = cluster.member_status("n4")["member_uid"]
    scaling.scale(cluster_dir, 3, timeout=60, keep_removed_data=True)
    assert (cluster_dir / "n4" / "identity.json").exists()  # kept, as asked
    cluster = local.LocalCluster.load(cluster_dir)
    assert old_uid in Record.from_json(cluster.state.record).removed

    # Slot n4 comes back: its retained data dir belongs to a removed member.
    said: list[str] = []
    scaling.scale(cluster_dir, 4, timeout=60, say=said.append)
    assert any(s.startswith("reset-volume n4") for s in said), said
    cluster = local.LocalCluster.load(cluster_dir)
    status = cluster.member_status("n4")
    assert status["member_uid"] != old_uid
    assert sorted(status["config"]["voters"]) == ["n1", "n2", "n3", "n4"]
    with cluster.client(timeout=10) as c:
        assert c.get("before").value == b"1"


def test_a_member_whose_volume_is_lost_is_removed_and_added_back(cluster_dir: Path):
    cluster, _ = local.up(cluster_dir, 3, **FAST)
    with cluster.client(timeout=10) as c:
        for i in range(20):
            c.put(f"k{i}", b"v")
    scaling.scale(cluster_dir, 3, timeout=30)  # records each member's uid
    cluster = local.LocalCluster.load(cluster_dir)
    victim = next(n for n in cluster.names if n != cluster.leader())
    old_uid = cluster.member_status(victim)["member_uid"]
    cluster.kill(victim)
    shutil.rmtree(cluster.member(victim).data_dir)
    cluster.start([victim])  # back empty: --initial-cluster-state is `existing` by now
    wait_for(lambda: cluster.member_status(victim) is not None, 20, f"{victim} to answer")

    said: list[str] = []
    began = time.monotonic()
    scaling.scale(cluster_dir, 3, timeout=60, say=said.append)
    print("\n".join(said), f"\nhealed in {time.monotonic() - began:.1f}s")
    assert any(s.startswith(f"remove-member {victim}") for s in said), said
    assert any(s.startswith(f"add-learner {victim}") for s in said), said
    cluster = local.LocalCluster.load(cluster_dir)
    status = cluster.member_status(victim)
    assert status["member_uid"] != old_uid
    assert sorted(status["config"]["voters"]) == sorted(cluster.names)
    assert old_uid in Record.from_json(cluster.state.record).removed
    with cluster.client(timeout=10) as c:
        assert c.get("k19").value == b"v"


@pytest.mark.parametrize(("argv", "code", "says"), [
    (["scale", "0"], 2, "expected a number >= 1"),
    (["scale", "three"], 2, "expected a whole number"),
    (["scale", "3"], 1, "no cluster in"),
])
def test_scale_refuses_bad_input_with_a_reason(tmp_path, capsys, argv, code, says):
    assert cli_main([*argv, "--dir", str(tmp_path / "none")]) == code
    assert says in capsys.readouterr().err


def test_scale_of_a_stopped_cluster_says_how_to_start_it(cluster_dir: Path, capsys):
    cluster, _ = local.up(cluster_dir, 1, **FAST)
    cluster.stop(timeout=5)
    assert cli_main(["scale", "3", "--dir", str(cluster_dir)]) == 1
    assert "flotilla up --dir" in capsys.readouterr().err


def _flotilla(cwd: Path, *argv: str, timeout: float = 150) -> subprocess.CompletedProcess:
    """`flotilla ARGV` as a user runs it in `cwd`: a separate process, the default --dir."""
    return flotilla(*argv, cwd=cwd, timeout=timeout, text=True)


def test_scale_5_3_5_with_the_default_relative_dir_under_load(tmp_path: Path):
    """The default `--dir .flotilla` is relative: members added by `scale` are started inside
    the cluster dir, so any data dir built from the relative path would land in
    `.flotilla/.flotilla/n4`, outlive scale-down, and make the next scale-up loop on wiping a
    volume it could not find."""
    root = tmp_path / ".flotilla"
    try:
        made = _flotilla(tmp_path, "up", "--election-timeout-ms", "500", "--heartbeat-ms", "50")
        assert made.returncode == 0, made.stdout + made.stderr
        w = checked_workload(root, clients=3, seed=11)
        with w:
            wait_for(lambda: w.ok_count >= 30, 20, "the workload to get going")
            for n, members in ((5, ["n4", "n5"]), (3, []), (5, ["n4", "n5"])):
                done = w.ok_count
                scaled = _flotilla(tmp_path, "scale", str(n), "--timeout", "120")
                assert scaled.returncode == 0, scaled.stdout + scaled.stderr
                assert scaled.stdout.count("reset-volume") == 0, scaled.stdout
                assert not (root / ".flotilla").exists(), "a data dir nested in the cluster dir"
                assert sorted(p.name for p in root.glob("n[4-9]") if p.is_dir()) == members
                cluster = local.LocalCluster.load(root)
                assert config_of(cluster, cluster.leader()) == (
                    [f"n{i}" for i in range(1, n + 1)], [], None)
                wait_for(lambda done=done: w.ok_count >= done + 30, 20, f"writes at {n}")
        cluster = local.LocalCluster.load(root)
        reads = read_final_reads({m: cluster.url(m) for m in cluster.names}, KEYS)
        result = check_final_state(w.history, {k: r.value for k, r in reads.items()},
                                   timeout=90)
        assert result.ok, f"{diagnostics(w)}\n{result.explain()}"
    finally:
        _flotilla(tmp_path, "down", "--timeout", str(CLEANUP_TIMEOUT_S))
