"""flotilla.local's own rules: a recorded pid is believed only while it is that member, the
state file round-trips, and `up` picks other ports when one was taken meanwhile."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from flotilla import local
from flotilla.local import LocalCluster
from tests.cli.conftest import FAST
from tests.harness.cli import CLEANUP_TIMEOUT_S
from tests.harness.fixtures import require_node


def test_a_reused_pid_is_never_taken_for_a_member_nor_signalled(tmp_path):
    cluster = LocalCluster.create(tmp_path / "c", 2, base_port=40000)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        for m in cluster.members:
            m.pid = stranger.pid if m.name == "n1" else os.getpid()
        cluster.save()
        loaded = LocalCluster.load(tmp_path / "c")
        assert loaded.alive() == []
        report = loaded.stop(timeout=1)
        assert report == {"n1": "was not running", "n2": "was not running"}
        assert stranger.poll() is None  # untouched
        assert [m.pid for m in LocalCluster.load(tmp_path / "c").members] == [None, None]
    finally:
        stranger.kill()
        stranger.wait()


def test_the_state_file_records_every_flag_a_restart_needs(tmp_path):
    cluster = LocalCluster.create(tmp_path, 3, election_timeout_ms=500, heartbeat_ms=50,
                                  archive="file:///somewhere/else")
    loaded = LocalCluster.load(tmp_path)
    assert loaded.state == cluster.state
    n2 = loaded.member("n2")
    flags = dict(zip(n2.args[::2], n2.args[1::2], strict=True))
    assert flags["--name"] == "n2" and flags["--data-dir"] == n2.data_dir
    assert flags["--initial-cluster"].count("=http://127.0.0.1:") == 3
    assert flags["--cluster-id"] == loaded.state.cluster_id
    assert (flags["--election-timeout-ms"], flags["--heartbeat-ms"]) == ("500", "50")
    assert flags.get("--archive") == "file:///somewhere/else"
    assert len({p for m in loaded.members for p in (m.peer_port, m.client_port)}) == 6


def test_an_unknown_state_file_version_is_refused(tmp_path):
    LocalCluster.create(tmp_path, 1, base_port=40000)
    path = LocalCluster.state_path(tmp_path)
    path.write_text(path.read_text().replace('"version": 1', '"version": 99'))
    with pytest.raises(local.LocalClusterError, match="version"):
        LocalCluster.load(tmp_path)


def test_up_moves_to_other_ports_when_one_was_taken_meanwhile(tmp_path, monkeypatch):
    require_node()
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    taken = squatter.getsockname()[1]
    real = local.free_ports
    calls = []

    def first_one_taken(count, rng=None):
        calls.append(count)
        ports = real(count, rng)
        return [taken, *ports[1:]] if len(calls) == 1 else ports

    monkeypatch.setattr(local, "free_ports", first_one_taken)
    notes: list[str] = []
    cluster = None
    try:
        cluster, leader = local.up(tmp_path, 1, say=notes.append, timeout=30, **FAST)
        assert leader == "n1" and len(calls) == 2
        assert any("trying other ports" in n for n in notes)
        assert taken not in (cluster.member("n1").peer_port, cluster.member("n1").client_port)
    finally:
        squatter.close()
        if cluster is not None:
            cluster.stop(timeout=CLEANUP_TIMEOUT_S)
