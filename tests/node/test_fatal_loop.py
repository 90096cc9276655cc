"""A member whose main loop fails must stop, not linger answering HTTP while doing nothing.

In-process: one member on a temporary data dir whose disk starts failing; the loop records
the failure, sets `dead`, fails `/healthz`, and `flotilla node` turns it into exit code 3.
"""

from __future__ import annotations

import asyncio
import errno

import pytest
from flotilla.node.config import parse
from flotilla.node.main import EXIT_DATA, EXIT_FAILED, _serve
from flotilla.node.node import Node
from flotilla.node.statemachine.kv import encode_put
from flotilla.node.storage import DiskFullError, StorageError, free_bytes

from tests.harness.ports import allocate_ports


def _node(tmp_path) -> Node:
    peer, client = allocate_ports(2)
    cfg = parse(["--name", "n1", "--data-dir", str(tmp_path / "n1"),
                 "--listen-peer", f"127.0.0.1:{peer}", "--listen-client", f"127.0.0.1:{client}",
                 "--initial-cluster", f"n1=http://127.0.0.1:{peer}",
                 "--election-timeout-ms", "200", "--heartbeat-ms", "20"])
    node = Node(cfg)
    node.open()
    return node


async def _until_leader(node: Node) -> None:
    for _ in range(200):
        if node.role() == "leader":
            return
        await asyncio.sleep(0.02)
    raise AssertionError("a single member never became leader")


def _serve_until_the_log_fails(node: Node, failure: BaseException) -> int:
    """Serve `node` until it leads, then make its log's fsync raise `failure` under a write;
    the exit code, once the member has stopped and answered that write (never acknowledged)."""

    def broken_sync() -> None:
        raise failure

    async def scenario() -> int:
        serving = asyncio.create_task(_serve(node))
        await _until_leader(node)
        node.runtime.storage.sync = broken_sync
        write = asyncio.create_task(node.propose(encode_put("k", b"v", ts=0)))
        rc = await asyncio.wait_for(serving, 10)
        assert node.dead.is_set()
        with pytest.raises(Exception, match="shutting down"):
            await asyncio.wait_for(write, 5)  # the waiting client is answered, not left hanging
        return rc

    return asyncio.run(scenario())


@pytest.mark.parametrize(("failure", "code"), [
    (StorageError("disk gone"), EXIT_DATA),
    (RuntimeError("a bug"), EXIT_FAILED),
])
def test_a_failed_loop_stops_the_member_with_an_exit_code(tmp_path, failure, code):
    node = _node(tmp_path)
    assert _serve_until_the_log_fails(node, failure) == code
    assert node.fatal is failure


def test_a_full_disk_anywhere_in_the_loop_stops_the_member_with_exit_3(tmp_path):
    """ENOSPC from any write the loop makes (here the log's fsync, as some file systems report
    it) becomes a DiskFullError naming the data dir and the bytes free there, and exit 3. The
    real thing, on a full tmpfs, is in test_disk_full.py."""
    node = _node(tmp_path)
    full = OSError(errno.ENOSPC, "No space left on device")
    assert _serve_until_the_log_fails(node, full) == EXIT_DATA
    assert isinstance(node.fatal, DiskFullError)
    assert node.fatal.data_dir == node.cfg.data_dir
    assert abs(node.fatal.free - free_bytes(node.cfg.data_dir)) < 1 << 30  # the same disk
    assert str(node.fatal).startswith(f"no space left on device writing {node.cfg.data_dir}: ")
