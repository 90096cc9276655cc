"""One live `flotilla node` per data dir: a second one exits 3 with one line naming the holder.

Real processes: a single-member cluster serves from a data dir; a second process pointed at the
same dir (its own ports) must refuse before it touches anything there, and the first must go on
serving as if nothing happened. Once the first is gone, however it went (SIGKILL included: the
kernel drops the lock with the process), the dir can be taken again.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from flotilla.node.storage import lock_data_dir

from flotilla.client import Client
from tests.harness.datadir import wait_commit_recorded
from tests.harness.processes import NodeProcess
from tests.node.one_member import one_member, run_to_exit, serving


def _second_on(member: NodeProcess) -> subprocess.CompletedProcess:
    """Another `flotilla node` with `member`'s flags and data dir but ports of its own."""
    return run_to_exit(one_member(member.data_dir, name=member.name, start=False))


@pytest.fixture
def member(tmp_path: Path) -> Iterator[NodeProcess]:
    with serving(one_member(tmp_path / "n1")) as node:
        yield node


def _put_and_get(url: str, key: str, value: bytes) -> None:
    with Client(url, timeout=10) as c:
        c.put(key, value)
        assert c.get(key).value == value


def test_a_second_process_on_a_live_data_dir_exits_3_naming_the_holder(member):
    _put_and_get(member.url, "before", b"1")
    with Client(member.url, timeout=10) as c:  # then the member leaves its dir alone
        wait_commit_recorded(member.data_dir, c.status()["commit_index"])
    files_before = sorted(p.name for p in member.data_dir.rglob("*"))

    result = _second_on(member)

    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0] == (f"flotilla node: refusing to start: {member.data_dir} is in use by "
                        f"another flotilla node (pid {member.pid}); stop it first")
    assert sorted(p.name for p in member.data_dir.rglob("*")) == files_before
    # The holder is unharmed: it still leads, serves and keeps what it had.
    assert member.running
    _put_and_get(member.url, "after", b"2")
    with Client(member.url, timeout=10) as c:
        assert c.get("before").value == b"1"
        assert c.status()["role"] == "leader"


def test_a_held_empty_data_dir_is_not_bootstrapped_nor_restored_into(tmp_path):
    """The lock comes before anything reads or writes the dir: a restore (or a bootstrap)
    onto an empty dir that someone holds writes nothing there."""
    data_dir = tmp_path / "n1"
    held = lock_data_dir(data_dir)
    try:
        twin = one_member(data_dir, "--restore-from", f"file://{tmp_path}/archive",
                          start=False)
        result = run_to_exit(twin)
    finally:
        held.release()
    assert result.returncode == 3, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"flotilla node: refusing to start: {data_dir} is in use by another flotilla node "
        f"(pid {os.getpid()}); stop it first"]
    assert [p.name for p in data_dir.iterdir()] == ["flotilla.lock"]


def test_the_lock_file_is_private_and_names_the_holder(member):
    lock = member.data_dir / "flotilla.lock"
    assert lock.stat().st_mode & 0o777 == 0o600
    assert lock.read_text().strip() == str(member.pid)


@pytest.mark.parametrize("how", ["sigterm", "sigkill"])
def test_once_the_holder_is_gone_a_new_process_takes_the_data_dir(member, how):
    _put_and_get(member.url, "k", b"kept")
    if how == "sigterm":
        assert member.terminate() == 0
    else:
        member.kill()
    member.restart()
    member.wait_serving()
    with Client(member.url, timeout=15) as c:
        assert c.get("k").value == b"kept"
    assert (member.data_dir / "flotilla.lock").read_text().strip() == str(member.pid)
