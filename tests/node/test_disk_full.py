"""A member on a small, real file system (a tmpfs of 8 MiB mounted for the test; skipped where
mounting is not allowed) that its writes fill up.

With the NOSPACE alarm (`--quota-free-bytes`), writes are refused with 507 while there is still
room, reads go on, and the alarm clears once the volume grows.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flotilla.node.storage import free_bytes

from tests.harness.kvclient import KVClient
from tests.harness.ports import allocate_ports
from tests.harness.processes import NodeProcess
from tests.harness.tmpfs import SmallFilesystem, small_filesystem

FAST = {"election_timeout_ms": 300, "heartbeat_ms": 30}
NO_SNAPSHOTS = ["--snapshot-policy", "entries=100000000"]
VALUE = b"v" * (256 << 10)
MiB = 1 << 20


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[SmallFilesystem]:
    with small_filesystem(tmp_path / "vol", "8m") as fs:
        yield fs


@pytest.fixture
def member_on(tmp_path: Path, volume: SmallFilesystem) -> Iterator:
    """A single member whose data dir is on the volume (its log file is not)."""
    started: list[NodeProcess] = []

    def start(*extra: str) -> NodeProcess:
        peer, client = allocate_ports(2)
        node = NodeProcess("n1", volume.path / "n1", f"127.0.0.1:{peer}", f"127.0.0.1:{client}",
                           extra_args=[*NO_SNAPSHOTS, *extra], log_path=tmp_path / "n1.log",
                           **FAST)
        started.append(node)
        node.wait_serving()
        return node

    try:
        yield start
    finally:
        for node in started:
            node.close()  # before the volume is unmounted


def _leader_put(c: KVClient, key: str, value: bytes):
    """The first write, retried while the single member elects itself."""
    deadline = time.monotonic() + 15
    while True:
        resp = c.put(key, value, timeout=10)
        if resp.status != 503 or time.monotonic() > deadline:
            return resp
        time.sleep(0.05)


def _metrics(c: KVClient) -> dict[str, float]:
    text = c.request("GET", "/metrics").body.decode()
    return {name: float(value) for name, value in
            re.findall(r"^(flotilla_\w+) (\S+)$", text, re.MULTILINE)}


def _wait(condition, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout}s"
        time.sleep(0.1)


def test_low_space_raises_nospace_refuses_writes_keeps_reads_and_clears(member_on, volume):
    member = member_on("--quota-free-bytes", "4MiB")
    acked: dict[str, bytes] = {}
    with member.client(timeout=10) as c:
        assert _leader_put(c, "first", b"1").status == 200
        acked["first"] = b"1"
        assert c.status()["alarms"] == []
        assert _metrics(c)["flotilla_alarm_nospace"] == 0
        for n in range(64):  # 16 MiB: twice the volume
            key = f"k{n}"
            resp = c.put(key, VALUE)
            if resp.status == 507:
                break
            assert resp.status == 200, resp
            acked[key] = VALUE
        else:
            pytest.fail("8 MiB of writes on an 8 MiB volume were never refused")

        assert resp.json()["code"] == "no_space"
        assert resp.json()["error"].startswith(
            f"NOSPACE: the file system of this member's data dir {member.data_dir} has ")
        assert "below --quota-free-bytes (4194304)" in resp.json()["error"]
        assert free_bytes(volume.path) > 2 * MiB, "refused before the disk is full"
        assert c.status()["alarms"] == ["NOSPACE"]
        metrics = _metrics(c)
        assert metrics["flotilla_alarm_nospace"] == 1
        assert 0 < metrics["flotilla_disk_free_bytes"] < 4 * MiB
        assert c.delete("first").status == 507
        for key, value in acked.items():  # reads go on, linearizable ones included
            assert c.get(key).body == value

        volume.resize("64m")
        _wait(lambda: c.status()["alarms"] == [], "the alarm did not clear")
        assert _metrics(c)["flotilla_alarm_nospace"] == 0
        assert c.put("after", b"room again").status == 200
    assert member.running
