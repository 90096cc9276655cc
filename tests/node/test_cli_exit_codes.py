"""`flotilla node` exit codes: 2 for bad flags (one line), 3 for a data dir it will not use."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from flotilla.node.consensus import Entry, Membership, SnapshotMeta
from flotilla.node.statemachine.kv import KVStateMachine
from flotilla.node.storage import DataDir, DiskStorage, SnapshotStore

from tests.harness.ports import allocate_ports


def run_node(*args: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flotilla.node", *args], capture_output=True,
                          text=True, timeout=timeout)


BASE = ["--listen-peer", "127.0.0.1:1", "--listen-client", "127.0.0.1:2"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--data-dir", "/tmp/x", *BASE], "--name is required"),
        (["--name", "n1", "--data-dir", "/tmp/x", "--listen-peer", "nope",
          "--listen-client", "127.0.0.1:2"], "--listen-peer must be HOST:PORT"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--initial-cluster", "n2"],
         "--initial-cluster entries must be NAME=URL"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--initial-cluster",
          "n2=http://127.0.0.1:5"], "must include this member (n1)"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--snapshot-policy", "ratio=abc"],
         "--snapshot-policy"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--fsync", "maybe"],
         "--fsync must be true or false"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--election-timeout-ms", "100"],
         "at least twice --heartbeat-ms"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--no-such-flag"],
         "unrecognized arguments"),
        (["--name", "n1\nn2", "--data-dir", "/tmp/x", *BASE], "--name must be 1 to 63"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--advertise-peer", "http://[::1"],
         "--advertise-peer must be an http(s) URL"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--initial-cluster", "n1=http://[::1"],
         "--initial-cluster must be an http(s) URL"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--archive", "s3://b/p",
          "--s3-endpoint", "ftp://minio:9000"], "--s3-endpoint must be an http(s) URL"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--archive", "s3://b/p",
          "--s3-endpoint", "http://key:secret@minio:9000"], "must not carry credentials"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--initial-cluster",
          "n1=http://127.0.0.1:5,a\nb=http://127.0.0.1:6"], "a member name is 1 to 63"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--restore-from", "file:///tmp/a",
          "--restore-index", "0"], "--restore-index must be at least 1"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--quota-free-bytes", "64MB"],
         "--quota-free-bytes: '64MB': sizes are in powers of 1024, write KiB, MiB or GiB"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--quota-free-bytes", "-1"],
         "--quota-free-bytes: '-1' is not a size"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--admin-token", "fifteen-bytes!!"],
         "--admin-token must be at least 16 bytes long"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--admin-token", "\u00e9" * 7],
         "--admin-token must be at least 16 bytes long"),  # 7 characters, 14 bytes
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--admin-token", ""],
         "--admin-token must be at least 16 bytes long"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--log-format", "xml"],
         "--log-format must be text or json, not 'xml'"),
        (["--name", "n1", "--data-dir", "/tmp/x", *BASE, "--log-level", "loud"],
         "--log-level must be one of debug, info, warning, error, not 'loud'"),
    ],
)
def test_bad_flags_exit_2_with_one_line_reason(args, says):
    result = run_node(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert says in lines[0]


@pytest.mark.parametrize("taken", ["--listen-peer", "--listen-client"])
def test_a_port_in_use_exits_2_with_one_line_and_nothing_else(tmp_path, taken):
    """Nothing the member started is left to complain at exit (no unclosed session)."""
    peer, client = allocate_ports(2)
    occupied = peer if taken == "--listen-peer" else client
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", occupied))
        holder.listen()
        result = run_node("--name", "n1", "--data-dir", str(tmp_path / "n1"),
                          "--listen-peer", f"127.0.0.1:{peer}",
                          "--listen-client", f"127.0.0.1:{client}")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        f"flotilla node: cannot listen: 127.0.0.1:{occupied} ({taken}): address already in use"]


def test_an_address_of_another_host_exits_2_with_one_line(tmp_path):
    peer = allocate_ports(1)[0]
    result = run_node("--name", "n1", "--data-dir", str(tmp_path / "n1"),
                      "--listen-peer", f"127.0.0.1:{peer}", "--listen-client", "192.0.2.1:2379")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "flotilla node: cannot listen: 192.0.2.1:2379 (--listen-client): cannot assign "
        "requested address"]


def test_a_token_of_16_bytes_is_taken_and_a_shorter_one_from_the_environment_is_not(tmp_path):
    from flotilla.node import config

    base = ["--name", "n1", "--data-dir", str(tmp_path), *BASE]
    assert config.parse([*base, "--admin-token", "x" * 16], env={}).admin_token == "x" * 16
    assert config.parse(base, env={}).admin_token is None  # the member generates one
    with pytest.raises(config.UsageError, match="at least 16 bytes"):
        config.parse(base, env={"FLOTILLA_ADMIN_TOKEN": "x" * 15})


def test_environment_supplies_flags_and_a_flag_beats_it(tmp_path):
    from flotilla.node import config

    cfg = config.parse(["--name", "from-flag"], env={
        "FLOTILLA_NAME": "from-env", "FLOTILLA_DATA_DIR": str(tmp_path),
        "FLOTILLA_LISTEN_PEER": "127.0.0.1:7001", "FLOTILLA_LISTEN_CLIENT": "127.0.0.1:7002",
        "FLOTILLA_HEARTBEAT_MS": "50"})
    assert cfg.name == "from-flag"
    assert cfg.data_dir == str(tmp_path)
    assert cfg.heartbeat_ms == 50
    assert cfg.advertise_client == "http://127.0.0.1:7002"


def test_the_free_space_quota_defaults_to_64_mib_and_takes_sizes(tmp_path):
    from flotilla.node import config

    base = ["--name", "n1", "--data-dir", str(tmp_path), *BASE]
    assert config.parse(base, env={}).quota_free_bytes == 64 << 20
    assert config.parse(base, env={"FLOTILLA_QUOTA_FREE_BYTES": "1GiB"}).quota_free_bytes == \
        1 << 30
    assert config.parse([*base, "--quota-free-bytes", "0"], env={}).quota_free_bytes == 0


def _log_with_sealed_segment(path: Path, cluster_id: str) -> Path:
    DataDir.open(path, cluster_id=cluster_id, member_name="n1")
    storage = DiskStorage(path, cluster_id=cluster_id, segment_bytes=4096)
    storage.install_snapshot(SnapshotMeta(0, 0, Membership(voters=frozenset({"n1"}))))
    storage.append([Entry(i, 1, 0, b"x" * 200) for i in range(1, 60)])
    storage.sync()
    storage.close()
    segments = sorted((path / "wal").glob("*.seg"))
    assert len(segments) > 2, "the test needs at least one sealed segment"
    return segments[0]


def test_a_bit_flip_in_a_sealed_segment_exits_3_naming_file_and_offset(tmp_path):
    data = tmp_path / "n1"
    sealed = _log_with_sealed_segment(data, "c1")
    raw = bytearray(sealed.read_bytes())
    offset = len(raw) // 2
    raw[offset] ^= 0x10
    sealed.chmod(0o644)
    sealed.write_bytes(bytes(raw))
    result = run_node("--name", "n1", "--data-dir", str(data), "--cluster-id", "c1", *BASE)
    assert result.returncode == 3, result.stderr
    assert sealed.name in result.stderr
    assert "offset" in result.stderr


def test_another_clusters_data_dir_exits_3(tmp_path):
    data = tmp_path / "n1"
    _log_with_sealed_segment(data, "c1")
    result = run_node("--name", "n1", "--data-dir", str(data), "--cluster-id", "c2", *BASE)
    assert result.returncode == 3, result.stderr
    assert "belongs to cluster 'c1'" in result.stderr


def test_an_older_snapshot_than_the_log_needs_is_refused_not_loaded(tmp_path):
    """The newest snapshot is damaged and an older one verifies, but the log starts after the
    newer one: loading the older one would silently lose the entries between (exit 3)."""
    data = tmp_path / "n1"
    _log_with_sealed_segment(data, "c1")
    storage = DiskStorage(data, cluster_id="c1", segment_bytes=4096)
    storage.recover()
    storage.compact(40)
    storage.close()
    store = SnapshotStore(DataDir.open(data, cluster_id="c1", member_name="n1").snapshot_dir)
    membership = Membership(voters=frozenset({"n1"}))
    paths = {}
    for index in (20, 40):
        writer = store.begin(SnapshotMeta(index, 1, membership), "kv")
        frozen = KVStateMachine().freeze()
        frozen.write(writer)
        frozen.release()
        paths[index] = writer.commit()
        if index == 20:
            kept = paths[20].read_bytes()  # the store keeps only the newest: put it back below
    paths[20].write_bytes(kept)
    raw = bytearray(paths[40].read_bytes())
    raw[-20] ^= 0x01  # inside the payload or its trailer: the newest no longer verifies
    paths[40].write_bytes(bytes(raw))
    result = run_node("--name", "n1", "--data-dir", str(data), "--cluster-id", "c1", *BASE)
    assert result.returncode == 3, result.stderr
    assert "the newest snapshot that verifies is at index 20" in result.stderr
