"""A member started without ``--admin-token`` still protects its admin API: it generates a token
in ``<data dir>/admin-token`` (0600) the first time, keeps it across restarts, names that file
(never the token) in its log and in its 401s. Real processes on loopback."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from flotilla.client import Client, Unauthorized
from tests.harness.fixtures import require_node
from tests.harness.ports import allocate_ports
from tests.harness.processes import NodeProcess, _node_env
from tests.node.badinput import assert_error

FAST = {"election_timeout_ms": 300, "heartbeat_ms": 30}


def _member(tmp_path: Path) -> NodeProcess:
    """A started single-member cluster run without --admin-token."""
    peer, client = allocate_ports(2)
    return NodeProcess("n1", tmp_path / "n1" / "data", f"127.0.0.1:{peer}",
                       f"127.0.0.1:{client}", admin_token=None, **FAST)


@pytest.fixture
def member(tmp_path: Path) -> Iterator[NodeProcess]:
    require_node()
    with _member(tmp_path) as node:  # killed at the end, whatever the test did
        node.wait_serving()
        yield node


def _snapshot(node: NodeProcess, token: str | None):
    with node.client(timeout=20, with_token=False) as c:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return c.request("POST", "/v1/snapshot", headers=headers)


def test_a_member_without_a_token_generates_one_in_its_data_dir(member):
    assert "--admin-token" not in member.argv
    token_file = member.data_dir / "admin-token"
    assert token_file.stat().st_mode & 0o777 == 0o600
    token = token_file.read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", token)  # safe after --token on a command line
    with Client(member.url, timeout=20) as c:  # the key-value API needs no token
        c.put("k", b"v")

    refused = _snapshot(member, None)
    assert_error(refused, 401, "unauthorized", ["no Authorization header", str(token_file)])
    assert token not in refused.body.decode()
    assert_error(_snapshot(member, "not-the-generated-token"), 401, "unauthorized",
                 ["wrong token", str(token_file)])
    accepted = _snapshot(member, token)
    assert accepted.status == 200, accepted.body
    assert accepted.json()["index"] > 0

    with member.client(with_token=False) as c:
        public = c.status()
    assert "cluster_id" not in public and "cluster_id" in public["redacted"]
    with Client(member.url, token=token) as c:
        assert c.status()["cluster_id"] == member.cluster_id
        assert c.snapshot()["index"] > 0
    with Client(member.url) as c, pytest.raises(Unauthorized) as caught:
        c.snapshot()
    assert str(token_file) in str(caught.value)

    log = member.log_path.read_text()
    assert f"no --admin-token given: the admin API takes the token in {token_file}" in log
    assert token not in log


def test_the_generated_token_survives_restarts(member):
    token_file = member.data_dir / "admin-token"
    token = token_file.read_text()
    assert member.terminate() == 0
    member.restart()
    member.wait_serving()
    assert token_file.read_text() == token
    assert _snapshot(member, token.strip()).status == 200
    member.kill()
    member.restart()
    member.wait_serving()
    assert token_file.read_text() == token
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert _snapshot(member, token.strip()).status == 200


def test_a_given_token_is_used_and_nothing_is_generated(tmp_path):
    require_node()
    peer, client = allocate_ports(2)
    with NodeProcess("n1", tmp_path / "n1" / "data", f"127.0.0.1:{peer}",
                     f"127.0.0.1:{client}", admin_token="a-token-given-on-the-command-line",
                     **FAST) as node:
        node.wait_serving()
        assert _snapshot(node, "a-token-given-on-the-command-line").status == 200
        refused = _snapshot(node, None)
        assert_error(refused, 401, "unauthorized", "--admin-token")
        assert "admin-token" not in {p.name for p in node.data_dir.iterdir()}


def test_a_token_file_too_short_to_use_is_refused_not_replaced(tmp_path):
    """Someone wrote it: a member that silently replaced it would lock them out."""
    require_node()
    with _member(tmp_path) as node:
        node.wait_serving()
        assert node.terminate() == 0
        token_file = node.data_dir / "admin-token"
        token_file.write_text("short\n")
        result = subprocess.run(node.argv, capture_output=True, text=True, timeout=30,
                                stdin=subprocess.DEVNULL, env=_node_env(None))
        assert result.returncode == 3, result.stderr
        assert result.stderr.splitlines() == [
            f"flotilla node: refusing to start: {token_file} holds an admin token of 5 bytes, "
            "under 16: remove the file (a new token is generated there) or give --admin-token"]
        assert token_file.read_text() == "short\n"
        token_file.unlink()  # as the message says: a new one is generated
        node.restart()
        node.wait_serving()
        assert len(token_file.read_text().strip()) >= 32
