"""A member refuses (exit 3, one line naming the file) a data dir whose durable state has lost
something, and leaves it exactly as it found it; and what it writes there is private.

Real processes on a real disk with fsync: a single-member cluster takes writes and stops; the
test then removes what an accident or an operator's mistake would (the hard state, the newest
log segment) and starts it again. A data dir another live process holds is refused too: see
test_datadir_lock.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.datadir import files_of, wait_commit_recorded
from tests.harness.kvclient import KVClient
from tests.harness.processes import NodeProcess
from tests.node.one_member import one_member, run_to_exit, serving

NO_SNAPSHOTS = ["--snapshot-policy", "entries=100000000"]


@pytest.fixture
def member(tmp_path: Path) -> Iterator[NodeProcess]:
    with serving(one_member(tmp_path / "n1", *NO_SNAPSHOTS)) as node:
        yield node


def _put(c: KVClient, key: str, value: bytes) -> int:
    """Write `key` (retrying while the single member elects itself); its log index."""
    deadline = time.monotonic() + 15
    while True:
        resp = c.put(key, value, timeout=10)
        if resp.status == 200:
            return resp.index
        assert resp.status == 503 and time.monotonic() < deadline, resp
        time.sleep(0.05)


def _refused(member: NodeProcess) -> str:
    """Start the stopped member again: it must exit 3 with one line, changing nothing."""
    before = files_of(member.data_dir, lock_content=False)
    result = run_to_exit(member)  # its own command line once more
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert files_of(member.data_dir, lock_content=False) == before
    return lines[0]


def test_a_log_whose_hard_state_is_missing_is_refused(member):
    with member.client() as c:
        for n in range(5):
            _put(c, f"k{n}", b"v")
    assert member.terminate() == 0
    (member.data_dir / "hardstate").unlink()

    line = _refused(member)

    assert line == (
        f"flotilla node: refusing to start: corrupt data in {member.data_dir / 'hardstate'} at "
        f"byte offset 0: file is missing although the log in {member.data_dir / 'wal'} holds "
        "entries: the term and vote this member gave are lost, so it could vote twice in one "
        "term; this member's durable state cannot be trusted: restore it from its peers (stop "
        "it, remove its data dir, and re-add it to the cluster as a learner)")


def test_a_log_whose_newest_segment_was_deleted_is_refused(member):
    """Writes of 1 MiB fill the first 64 MiB segment and start a second; once stopped with
    SIGTERM (which records the final commit index), the second one is deleted."""
    value = b"x" * ((1 << 20) - 200)
    with member.client(timeout=15) as c:
        index = 0
        while len(list((member.data_dir / "wal").glob("*.seg"))) < 2:
            index = _put(c, f"k{index}", value)
            assert index < 100, "the log never rotated to a second segment"
        last = _put(c, "last", b"the newest write")
    assert member.terminate() == 0
    survivor, newest = sorted((member.data_dir / "wal").glob("*.seg"))
    newest.unlink()

    line = _refused(member)

    ends = int(newest.name.removesuffix(".seg")) - 1
    assert line.startswith(
        f"flotilla node: refusing to start: corrupt data in {survivor} at byte offset "
        f"{survivor.stat().st_size}: the log ends at index {ends}, in this segment, but "
        f"{member.data_dir / 'hardstate'} records index {last} as committed: committed entries "
        "are missing (a newer segment was deleted, or the volume was restored from an older "
        "copy)"), line


def test_a_killed_member_has_recorded_its_commit_within_a_second(member):
    """SIGKILL gives no chance to record anything at exit: the commit index was recorded while
    it ran (about once a second, off the write path), and deleting the only segment is seen."""
    with member.client() as c:
        last = max(_put(c, f"k{n}", b"v") for n in range(5))
    wait_commit_recorded(member.data_dir, last)
    member.kill()
    (only,) = (member.data_dir / "wal").glob("*.seg")
    only.unlink()

    line = _refused(member)

    assert line.startswith(
        f"flotilla node: refusing to start: corrupt data in {member.data_dir / 'wal'} at byte "
        f"offset 0: the log ends at index 0 (no segment holds an entry), but "
        f"{member.data_dir / 'hardstate'} records index {last} as committed"), line


def test_everything_in_the_data_dir_is_private(tmp_path):
    """Files 0600 (a sealed segment may be 0400), directories 0700, after writes and a
    snapshot; the data dir included, though it was there already with mode 0755 (an operator's
    mkdir, or an older build)."""
    (tmp_path / "n1").mkdir(mode=0o755)
    with serving(one_member(tmp_path / "n1", "--snapshot-policy", "entries=10")) as node, \
            node.client() as c:
        for n in range(25):
            _put(c, f"k{n}", b"v" * 100)
        deadline = time.monotonic() + 10
        while c.status()["snapshot"]["index"] == 0:
            assert time.monotonic() < deadline, "no snapshot was taken"
            time.sleep(0.05)
        assert node.terminate() == 0
    data = node.data_dir
    assert list((data / "snap").glob("*.snap"))
    wrong = {}
    for path in [data, *data.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        allowed = {0o700} if path.is_dir() else {0o600, 0o400} if path.suffix == ".seg" \
            else {0o600}
        if mode not in allowed:
            wrong[str(path.relative_to(tmp_path))] = f"{mode:o}"
    assert not wrong, f"not private: {wrong}"
