"""A single-member cluster on fresh loopback ports with fast timings, for process tests of one
member's data dir (its lock, its refusals, its disk filling up)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from tests.harness.ports import allocate_ports
from tests.harness.processes import NodeProcess, _node_env

FAST = {"election_timeout_ms": 300, "heartbeat_ms": 30}


def one_member(data_dir: Path, *extra_args: str, name: str = "n1", **options) -> NodeProcess:
    """`flotilla node` for `data_dir` (started unless `start=False` is among `options`)."""
    peer, client = allocate_ports(2)
    return NodeProcess(name, data_dir, f"127.0.0.1:{peer}", f"127.0.0.1:{client}",
                       extra_args=list(extra_args), **FAST, **options)


def run_to_exit(node: NodeProcess) -> subprocess.CompletedProcess:
    """Run `node`'s command line once, in the foreground, its stderr captured: for a start that
    is expected to be refused."""
    return subprocess.run(node.argv, capture_output=True, text=True, timeout=30,
                          stdin=subprocess.DEVNULL, env=_node_env(None))


@contextlib.contextmanager
def serving(node: NodeProcess) -> Iterator[NodeProcess]:
    """`node` once it answers HTTP; killed at the end of the block, whatever happens in it."""
    try:
        node.wait_serving()
        yield node
    finally:
        node.close()
