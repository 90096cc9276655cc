"""A member on a small, real file system (a tmpfs of 8 MiB mounted for the test; skipped where
mounting is not allowed) that its writes fill up.

With the NOSPACE alarm (`--quota-free-bytes`), writes are refused with 507 while there is still
room, reads go on, and the alarm clears once the volume grows. Without it (quota 0) the member
runs into ENOSPC itself: it exits 3 naming the file and the bytes free, and every write it had
acknowledged is there once it restarts with more space. Starting on a full disk exits 3 too.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from flotilla.node.storage import free_bytes

from tests.harness.kvclient import TRANSPORT_ERRORS, KVClient
from tests.harness.processes import NodeProcess
from tests.harness.tmpfs import SmallFilesystem, small_filesystem
from tests.node.one_member import one_member, run_to_exit

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
        node = one_member(volume.path / "n1", *NO_SNAPSHOTS, *extra,
                          log_path=tmp_path / "n1.log")
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


def test_a_full_disk_exits_3_with_the_space_left_and_loses_nothing_acknowledged(
        member_on, volume, tmp_path):
    member = member_on("--quota-free-bytes", "0")
    acked: dict[str, bytes] = {}
    with member.client(timeout=10) as c:
        assert _leader_put(c, "first", b"1").status == 200
        acked["first"] = b"1"
        for n in range(64):
            value = bytes([n]) * len(VALUE)
            try:
                resp = c.put(f"k{n}", value)
            except TRANSPORT_ERRORS:
                break
            if resp.status != 200:
                break
            acked[f"k{n}"] = value
        else:
            pytest.fail("16 MiB went onto an 8 MiB volume")
    assert member.wait(20) == 3
    last = member.log_tail(1)
    found = re.fullmatch(
        r"flotilla node: stopped after a fatal error: no space left on device writing (\S+): "
        r"(\d+) bytes free on the file system of (\S+); free space there or grow the volume, "
        r"then restart the member \(nothing acknowledged was lost\)", last)
    assert found, last
    assert Path(found.group(1)).is_relative_to(member.data_dir)
    assert int(found.group(2)) < len(VALUE) + 4096
    assert found.group(3) == str(member.data_dir)
    assert len(acked) > 10

    volume.resize("64m")
    member.restart()
    member.wait_serving()
    with member.client(timeout=10) as c:
        assert _leader_put(c, "after", b"room again").status == 200
        for key, value in acked.items():
            assert c.get(key).body == value, key


def test_starting_on_a_full_disk_exits_3_with_the_space_left(volume):
    fd = os.open(volume.path / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 65536)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    node = one_member(volume.path / "n1", start=False, log_path=volume.path.parent / "n1.log")
    result = run_to_exit(node)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert re.fullmatch(
        rf"flotilla node: refusing to start: no space left on device writing "
        rf"{re.escape(str(node.data_dir))}\S*: 0 bytes free on the file system of "
        rf"{re.escape(str(node.data_dir))}; .*", lines[0]), lines[0]
