"""The `flotilla` command as a user runs it: subprocesses against a local cluster it starts.

One cluster (`flotilla up` in a temporary directory) serves the status and kv stories; the
lifecycle story (up, up refused, down, up resumes) runs its own, from the default directory.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flotilla.local import LocalCluster, pid_is_member
from tests.cli.conftest import FAST, FAST_FLAGS, ok, tear_down, text
from tests.harness.cli import flotilla
from tests.harness.fixtures import require_node


@pytest.fixture(scope="module")
def up_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    require_node()
    root = tmp_path_factory.mktemp("flotilla") / "cluster"
    try:
        ok(flotilla("up", "--replicas", "3", "--dir", str(root), *FAST_FLAGS))
        yield root
    finally:
        tear_down(root)


def test_help_lists_every_command():
    out = ok(flotilla("--help"))
    for command in ("node", "up", "status", "down", "kv"):
        assert f"    {command} " in out
    assert flotilla().returncode == 2
    assert flotilla("kv").returncode == 2


def test_up_records_the_cluster_and_prints_endpoints(up_dir):
    cluster = LocalCluster.load(up_dir)
    assert cluster.names == ["n1", "n2", "n3"]
    assert cluster.alive() == cluster.names
    assert cluster.state.election_timeout_ms == FAST["election_timeout_ms"]
    for m in cluster.members:
        assert Path(m.data_dir).is_dir() and Path(m.log_file).is_file()
        assert "--archive" in m.args  # the default archive under the cluster's directory
    assert cluster.state.archive == (up_dir.resolve() / "archive").as_uri()


def test_status_shows_every_member_and_one_leader(up_dir):
    out = ok(flotilla("status", "--dir", str(up_dir)))
    lines = out.splitlines()
    assert "leader n" in lines[0]
    assert lines[1].split()[:5] == ["MEMBER", "ROLE", "TERM", "COMMIT", "APPLIED"]
    rows = [line.split() for line in lines[2:]]
    assert [r[0] for r in rows] == ["n1", "n2", "n3"]
    assert sorted(r[1] for r in rows) == ["follower", "follower", "leader"]
    assert all(r[-1] == "alive" for r in rows)


def test_status_json_is_the_leaders_status_document(up_dir):
    doc = json.loads(ok(flotilla("status", "--json", "--dir", str(up_dir))))
    assert doc["role"] == "leader" and doc["leader"] == doc["name"]
    assert sorted(doc["members"]) == ["n1", "n2", "n3"]
    assert doc["cluster_id"] == LocalCluster.load(up_dir).state.cluster_id


def test_kv_put_get_del_ls(up_dir):
    d = ["--dir", str(up_dir)]
    assert ok(flotilla("kv", "put", "cli/greeting", "hello", *d)).startswith("OK index ")
    assert flotilla("kv", "get", "cli/greeting", *d).stdout == b"hello"
    assert flotilla("kv", "get", "cli/greeting", "--serializable", *d).returncode == 0
    ok(flotilla("kv", "put", "cli/other key ü?%", "x", *d))
    assert ok(flotilla("kv", "ls", "cli/", *d)).splitlines() == ["cli/greeting",
                                                                  "cli/other key ü?%"]
    assert ok(flotilla("kv", "ls", "cli/", "--limit", "1", *d)).splitlines() == ["cli/greeting"]
    assert ok(flotilla("kv", "del", "cli/greeting", *d)).strip() == "1"
    assert ok(flotilla("kv", "del", "cli/greeting", *d)).strip() == "0"
    missing = flotilla("kv", "get", "cli/greeting", *d)
    assert missing.returncode == 1 and missing.stdout == b""
    assert "key not found" in missing.stderr.decode()
    assert len(missing.stderr.decode().strip().splitlines()) == 1


def test_kv_put_from_stdin_and_get_return_raw_bytes(up_dir):
    payload = bytes(range(256)) * 4
    ok(flotilla("kv", "put", "cli/blob", "-", "--dir", str(up_dir), stdin=payload))
    assert flotilla("kv", "get", "cli/blob", "--dir", str(up_dir)).stdout == payload


def test_kv_finds_the_cluster_from_endpoints(up_dir):
    endpoints = ",".join(LocalCluster.load(up_dir).endpoints[1:])
    ok(flotilla("kv", "put", "cli/ep", "via endpoints", "--endpoints", endpoints))
    assert flotilla("kv", "get", "cli/ep", "--endpoints", endpoints).stdout == b"via endpoints"
    out = ok(flotilla("status", "--endpoints", endpoints))
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["n1", "n2", "n3"]


def test_kv_compare_and_set_failure_is_one_line_and_exit_1(up_dir):
    d = ["--dir", str(up_dir)]
    ok(flotilla("kv", "put", "cli/cas", "v", "--prev-index", "0", *d))
    refused = flotilla("kv", "put", "cli/cas", "w", "--prev-index", "0", *d)
    assert refused.returncode == 1
    assert "precondition failed" in refused.stderr.decode()
    assert len(refused.stderr.decode().strip().splitlines()) == 1


def test_status_and_kv_ls_speak_json_and_yaml(up_dir):
    import yaml

    d = ["--dir", str(up_dir)]
    ok(flotilla("kv", "put", "fmt/a", "1", *d))
    ok(flotilla("kv", "put", "fmt/b", "2", *d))
    as_json = json.loads(ok(flotilla("status", "-o", "json", *d)))
    assert as_json["role"] == "leader" and sorted(as_json["members"]) == ["n1", "n2", "n3"]
    as_yaml = yaml.safe_load(ok(flotilla("status", "-o", "yaml", *d)))
    assert as_yaml["cluster_id"] == as_json["cluster_id"] and as_yaml["role"] == "leader"
    listed = json.loads(ok(flotilla("kv", "ls", "fmt/", "-o", "json", *d)))
    assert listed["keys"] == ["fmt/a", "fmt/b"] and listed["index"] >= 2
    assert yaml.safe_load(ok(flotilla("kv", "ls", "fmt/", "-o", "yaml", *d)))["keys"] == [
        "fmt/a", "fmt/b"]
    assert ok(flotilla("kv", "ls", "fmt/", "-o", "table", *d)).split() == ["KEY", "fmt/a",
                                                                         "fmt/b"]


def test_the_environment_finds_the_cluster_and_a_flag_beats_it(up_dir, tmp_path):
    ok(flotilla("kv", "put", "env/k", "v", "--dir", str(up_dir)))
    assert ok(flotilla("kv", "get", "env/k", env={"FLOTILLA_DIR": str(up_dir)})) == "v"
    endpoints = ",".join(LocalCluster.load(up_dir).endpoints)
    assert ok(flotilla("kv", "get", "env/k", env={"FLOTILLA_ENDPOINTS": endpoints})) == "v"
    # FLOTILLA_ENDPOINTS beats FLOTILLA_DIR; --dir beats both.
    elsewhere = {"FLOTILLA_DIR": str(tmp_path / "none"), "FLOTILLA_ENDPOINTS": endpoints}
    assert ok(flotilla("kv", "get", "env/k", env=elsewhere)) == "v"
    nowhere = {"FLOTILLA_DIR": str(tmp_path / "none"),
               "FLOTILLA_ENDPOINTS": "http://127.0.0.1:1"}
    assert ok(flotilla("kv", "get", "env/k", "--dir", str(up_dir), env=nowhere)) == "v"
    assert ok(flotilla("status", env={"FLOTILLA_DIR": str(up_dir)})).startswith("cluster ")


def test_member_list_add_remove(up_dir):
    import yaml

    d = ["--dir", str(up_dir)]
    lines = ok(flotilla("member", "list", *d)).splitlines()
    assert lines[0].split() == ["NAME", "ROLE", "PEER", "URL", "CLIENT", "URL", "MATCH", "INDEX"]
    rows = [line.split() for line in lines[1:]]
    cluster = LocalCluster.load(up_dir)
    assert [r[0] for r in rows] == ["n1", "n2", "n3"]
    assert sorted(r[1] for r in rows) == ["follower", "follower", "leader"]
    assert [r[2] for r in rows] == [m.peer_url for m in cluster.members]
    assert [r[3] for r in rows] == [m.client_url for m in cluster.members]
    assert all(r[4].isdigit() for r in rows)

    # A learner that never starts: the configuration commits without it.
    add = ok(flotilla("member", "add", "n9", "--peer-url", "http://127.0.0.1:9",
                      "--client-url", "http://127.0.0.1:19", *d))
    assert add.startswith("added n9 as a learner")
    doc = json.loads(ok(flotilla("member", "list", "-o", "json", *d)))
    added = {m["name"]: m for m in doc["members"]}["n9"]
    assert added["role"] == "learner" and added["peer_url"] == "http://127.0.0.1:9"
    assert doc["leader"] in ("n1", "n2", "n3")
    assert ok(flotilla("member", "remove", "n9", *d)).strip() == "removed n9"
    listed = yaml.safe_load(ok(flotilla("member", "list", "-o", "yaml", *d)))
    assert [m["name"] for m in listed["members"]] == ["n1", "n2", "n3"]

    gone = flotilla("member", "remove", "n9", *d)
    assert gone.returncode == 1 and "not a member" in gone.stderr.decode()
    assert len(gone.stderr.decode().strip().splitlines()) == 1


def test_leader_move_and_snapshot(up_dir):
    d = ["--dir", str(up_dir)]
    leader = json.loads(ok(flotilla("status", "-o", "json", *d)))["name"]
    target = next(n for n in ("n1", "n2", "n3") if n != leader)
    assert ok(flotilla("leader", "move", target, *d)).startswith(f"leader: {target}")
    assert json.loads(ok(flotilla("status", "-o", "json", *d)))["name"] == target

    ok(flotilla("kv", "put", "snap/k", "v", *d))
    fields = dict(line.split(": ", 1) for line in ok(flotilla("snapshot", *d)).splitlines())
    assert list(fields) == ["index", "term", "bytes", "location"]
    assert int(fields["index"]) >= 1 and int(fields["term"]) >= 1 and int(fields["bytes"]) > 0
    as_json = json.loads(ok(flotilla("snapshot", "-o", "json", *d)))
    assert as_json["index"] >= int(fields["index"])


def test_commands_without_a_cluster_say_so(tmp_path):
    for args in (["status"], ["down"], ["kv", "get", "k"]):
        result = flotilla(*args, "--dir", str(tmp_path / "none"))
        assert result.returncode == 1, text(result)
        assert "no cluster in" in result.stderr.decode() and "flotilla up" in text(result)


def test_up_refuses_twice_down_stops_every_pid_and_up_resumes_the_data(tmp_path):
    require_node()
    root = tmp_path / ".flotilla"  # the default --dir, relative to where the user is
    try:
        out = ok(flotilla("up", "--replicas", "3", *FAST_FLAGS, cwd=tmp_path))
        assert "started 3 members" in out and "endpoints: http://127.0.0.1:" in out
        ok(flotilla("kv", "put", "kept", "across restarts", cwd=tmp_path))

        again = flotilla("up", cwd=tmp_path)
        assert again.returncode == 1 and "already running" in again.stderr.decode()

        pids = [m.pid for m in LocalCluster.load(root).members]
        data_dirs = [m.data_dir for m in LocalCluster.load(root).members]
        down = ok(flotilla("down", cwd=tmp_path))
        assert all(f"n{i}: stopped" in down for i in (1, 2, 3)), down
        assert not any(pid_is_member(p, d) for p, d in zip(pids, data_dirs, strict=True))
        assert "stopped" in ok_or_1(flotilla("status", cwd=tmp_path))

        began = time.monotonic()
        out = ok(flotilla("up", cwd=tmp_path))
        assert "resumed 3 members" in out
        assert time.monotonic() - began < 30
        assert flotilla("kv", "get", "kept", cwd=tmp_path).stdout == b"across restarts"
        ok(flotilla("down", cwd=tmp_path))
    finally:
        tear_down(root)


def ok_or_1(result: subprocess.CompletedProcess) -> str:
    """`flotilla status` exits 1 when no leader is known (a stopped cluster) but still prints."""
    assert result.returncode in (0, 1), text(result)
    return result.stdout.decode()


def test_member_helpers_kill_and_restart_by_name(up_dir):
    cluster = LocalCluster.load(up_dir)
    leader = cluster.leader()
    cluster.kill(leader)
    assert leader not in cluster.alive()
    # The others still name the dead leader until their election timers fire: status does not.
    first = ok_or_1(flotilla("status", "--dir", str(up_dir))).splitlines()[0]
    assert not first.endswith(f"leader {leader}"), first
    assert LocalCluster.load(up_dir).member(leader).pid is None
    with cluster.client(timeout=15) as c:
        c.put("cli/after-kill", b"served")
        assert c.status()["name"] != leader
    cluster.restart(leader)
    assert cluster.wait_ready(30, require=[leader])
    deadline = time.monotonic() + 20
    while (cluster.member_status(leader) or {}).get("applied_index", 0) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    status = ok(flotilla("status", "--dir", str(up_dir)))
    assert status.count("alive") == 3
