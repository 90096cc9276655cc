"""`flotilla up` never strands a user: a failed start leaves nothing running or recorded, a
cluster with dead members is brought back whole, and bad options are one line."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from flotilla import local
from tests.harness.cli import CLEANUP_TIMEOUT_S
from tests.harness.cli import flotilla as run_flotilla
from tests.harness.fixtures import require_node
from tests.harness.ports import allocate_range, release_port

FAST = ["--election-timeout-ms", "500", "--heartbeat-ms", "50"]


def flotilla(cwd: Path, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_flotilla(*argv, cwd=cwd, timeout=timeout, text=True)


def members_running(root: Path) -> str:
    """The `flotilla node` processes whose command line names `root` (pgrep's output)."""
    return subprocess.run(["pgrep", "-af", f"flotilla.node .*{root}"], capture_output=True,
                          text=True).stdout


def one_line(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    return lines[0]


def test_a_failed_up_leaves_no_process_and_no_cluster(tmp_path: Path):
    """n1's client port is taken: n2 and n3 start, elect a leader, and must be stopped with
    every trace of the cluster that never served, so the next `up` starts cleanly."""
    require_node()
    base = allocate_range(13)[0]
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", base + 10))
        squatter.listen()
        failed = flotilla(tmp_path, "up", "--base-port", str(base), *FAST)
        assert failed.returncode == 1
        line = one_line(failed)
        assert "n1 exited with 2 while starting" in line and "address already in use" in line
        root = tmp_path / ".flotilla"
        assert members_running(root) == ""
        assert not local.LocalCluster.exists(root)
        assert not any(root.glob("n[0-9]/"))  # data dirs gone; logs kept
        assert (root / "n1.log").exists()
    finally:
        squatter.close()
    try:
        again = flotilla(tmp_path, "up", "--base-port", str(base), *FAST)
        assert again.returncode == 0, again.stdout + again.stderr
    finally:
        flotilla(tmp_path, "down", "--timeout", str(CLEANUP_TIMEOUT_S))
        for port in range(base, base + 13):
            release_port(port)


def test_up_starts_the_members_that_died_and_keeps_the_others(tmp_path: Path):
    require_node()
    root = tmp_path / ".flotilla"
    try:
        assert flotilla(tmp_path, "up", *FAST).returncode == 0
        cluster = local.LocalCluster.load(root)
        with cluster.client(timeout=10) as c:
            c.put("k", b"v")
        leader = cluster.leader()
        survivors = {m.name: m.pid for m in cluster.members if m.name != leader}
        cluster.kill(leader)
        resumed = flotilla(tmp_path, "up", *FAST)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        assert f"starting {leader}" in resumed.stdout
        cluster = local.LocalCluster.load(root)
        assert cluster.alive() == cluster.names
        assert {n: cluster.member(n).pid for n in survivors} == survivors  # not restarted
        with local.LocalCluster.load(root).client(timeout=10) as c:
            assert c.get("k").value == b"v"
        whole = flotilla(tmp_path, "up", *FAST)
        assert whole.returncode == 1 and "already running" in one_line(whole)
    finally:
        flotilla(tmp_path, "down", "--timeout", str(CLEANUP_TIMEOUT_S))


@pytest.mark.parametrize(("argv", "says"), [
    (["up", "--archive", "ftp://x/y"], "--archive: archive URL 'ftp://x/y' is not supported"),
    (["up", "--restore-from", "s3://"], "--restore-from: archive URL 's3://' names no bucket"),
    (["up", "--dir", "a-file"], "cannot use a-file as the cluster directory: it is a file"),
    (["up", "--dir", "a-file/below"], "cannot use a-file/below as the cluster directory"),
])
def test_up_refuses_bad_options_in_one_line_and_starts_nothing(tmp_path: Path, argv, says):
    (tmp_path / "a-file").write_text("not a directory")
    result = flotilla(tmp_path, *argv)
    assert result.returncode == 2
    assert says in one_line(result)
    assert members_running(tmp_path) == ""
    assert not local.LocalCluster.exists(tmp_path / ".flotilla")


def test_a_bad_option_is_not_remembered_by_the_directory(tmp_path: Path):
    """A first `up` with a bad --archive must not leave a cluster that later `up`s resume."""
    require_node()
    assert flotilla(tmp_path, "up", "--archive", "ftp://x/y").returncode == 2
    try:
        fixed = flotilla(tmp_path, "up", *FAST)
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        assert "note:" not in fixed.stdout
    finally:
        flotilla(tmp_path, "down", "--timeout", str(CLEANUP_TIMEOUT_S))


def test_resuming_with_other_options_says_how_to_start_over(tmp_path: Path):
    require_node()
    try:
        assert flotilla(tmp_path, "up", *FAST).returncode == 0
        assert flotilla(tmp_path, "down", "--timeout", "5").returncode == 0
        other = (tmp_path / "elsewhere").as_uri()
        resumed = flotilla(tmp_path, "up", "--archive", other, *FAST)
        assert resumed.returncode == 0, resumed.stderr
        assert "resuming with the original archive" in resumed.stdout
        assert "flotilla down --dir" in resumed.stdout and "another --dir" in resumed.stdout
    finally:
        flotilla(tmp_path, "down", "--timeout", str(CLEANUP_TIMEOUT_S))


def test_up_protects_the_admin_api_with_a_token_the_other_commands_use(tmp_path: Path):
    require_node()
    root = tmp_path / ".flotilla"
    try:
        assert flotilla(tmp_path, "up", *FAST).returncode == 0
        token_file = root / local.TOKEN_FILE
        assert token_file.stat().st_mode & 0o777 == 0o600
        token = token_file.read_text().strip()
        assert re.fullmatch(r"[0-9a-f]{64}", token)  # safe after --token on a command line
        cluster = local.LocalCluster.load(root)
        assert token not in (root / local.STATE_FILE).read_text()
        for m in cluster.members:  # never on a command line another user can read
            assert token.encode() not in Path(f"/proc/{m.pid}/cmdline").read_bytes()
        refused = urllib.request.Request(f"{cluster.endpoints[0]}/v1/snapshot", method="POST")
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(refused, timeout=10)
        assert denied.value.code == 401
        snap = flotilla(tmp_path, "snapshot", "-o", "json")
        assert snap.returncode == 0, snap.stderr
        assert json.loads(snap.stdout)["index"] > 0
        scaled = flotilla(tmp_path, "scale", "4")  # admin calls with the token
        assert scaled.returncode == 0, scaled.stdout + scaled.stderr
    finally:
        flotilla(tmp_path, "down", "--timeout", str(CLEANUP_TIMEOUT_S))


def test_up_gives_a_cluster_made_without_a_token_one_before_resuming_it(tmp_path: Path):
    """A cluster made before `up` generated a token: its members would each make their own in
    their data dirs, which `flotilla` does not read, so `up` makes the cluster's token first."""
    require_node()
    root = tmp_path / ".flotilla"
    try:
        assert flotilla(tmp_path, "up", *FAST).returncode == 0
        assert flotilla(tmp_path, "down", "--timeout", "5").returncode == 0
        (root / local.TOKEN_FILE).unlink()
        resumed = flotilla(tmp_path, "up", *FAST)
        assert resumed.returncode == 0, resumed.stderr
        assert f"had no admin token; generated one in .flotilla/{local.TOKEN_FILE}" \
            in resumed.stdout
        assert (root / local.TOKEN_FILE).stat().st_mode & 0o777 == 0o600
        snap = flotilla(tmp_path, "snapshot", "-o", "json")
        assert snap.returncode == 0, snap.stderr
        status = flotilla(tmp_path, "status", "-o", "json")
        assert status.returncode == 0, status.stderr
        doc = json.loads(status.stdout)
        assert "cluster_id" in doc and "redacted" not in doc  # the token was taken
    finally:
        flotilla(tmp_path, "down", "--timeout", str(CLEANUP_TIMEOUT_S))
