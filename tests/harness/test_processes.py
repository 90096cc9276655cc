"""The process harness on its own: command lines, proxied views, partitions, signals, leaders.

Nothing here needs the node server. Command lines and proxy wiring are checked as data, with
real (idle) fault proxies; signals, logs, restarts and ``wait_leader`` run against
``fake_node.py``, a real process that takes the node's flags and serves a status document the
test controls.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest

from tests.harness import ports, processes
from tests.harness.processes import LocalCluster, NodeProcess, format_initial_cluster

FAKE_NODE = [sys.executable, str(Path(__file__).with_name("fake_node.py"))]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def parse_view(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(","))


def address(host_port: str) -> tuple[str, int]:
    host, port = host_port.rsplit(":", 1)
    return host, int(port)


# ---------------------------------------------------------------------------------------------
# Command lines


def test_node_command_line_is_the_contract_one(tmp_path):
    node = NodeProcess(
        "n1", tmp_path / "n1" / "data", "127.0.0.1:7001", "127.0.0.1:8001",
        initial_cluster={"n0": "http://127.0.0.1:7000", "n1": "http://127.0.0.1:7001"},
        initial_cluster_state="existing", cluster_id="c-42", election_timeout_ms=500,
        heartbeat_ms=50, extra_args=["--fsync", "false"], start=False)
    assert node.argv == [
        sys.executable, "-m", "flotilla.node",
        "--name", "n1",
        "--data-dir", str(tmp_path / "n1" / "data"),
        "--listen-peer", "127.0.0.1:7001",
        "--listen-client", "127.0.0.1:8001",
        "--initial-cluster", "n0=http://127.0.0.1:7000,n1=http://127.0.0.1:7001",
        "--initial-cluster-state", "existing",
        "--cluster-id", "c-42",
        "--election-timeout-ms", "500",
        "--heartbeat-ms", "50",
        "--admin-token", processes.ADMIN_TOKEN,
        "--fsync", "false",
    ]
    assert node.url == "http://127.0.0.1:8001"
    assert node.peer_url == "http://127.0.0.1:7001"
    assert node.log_path == tmp_path / "n1" / "n1.log"  # beside the data dir, not in it
    assert node.returncode is None and not node.running


def test_every_member_gets_an_admin_token_its_clients_carry(tmp_path):
    node = NodeProcess("n1", tmp_path / "n1" / "data", "127.0.0.1:7001", "127.0.0.1:8001",
                       start=False)
    assert flag(node.argv, "--admin-token") == processes.ADMIN_TOKEN
    assert len(processes.ADMIN_TOKEN.encode()) >= 16
    assert node.admin_token == processes.ADMIN_TOKEN
    assert node.client().token == processes.ADMIN_TOKEN
    own = NodeProcess("n2", tmp_path / "n2" / "data", "127.0.0.1:7002", "127.0.0.1:8002",
                      extra_args=["--admin-token", "a-token-of-the-test-itself"], start=False)
    assert own.argv.count("--admin-token") == 1
    assert flag(own.argv, "--admin-token") == "a-token-of-the-test-itself"
    assert own.client().token == "a-token-of-the-test-itself"
    from_env = NodeProcess("n3", tmp_path / "n3" / "data", "127.0.0.1:7003", "127.0.0.1:8003",
                           env={"FLOTILLA_ADMIN_TOKEN": "a-token-in-the-environment"},
                           start=False)
    assert "--admin-token" not in from_env.argv
    assert from_env.admin_token == "a-token-in-the-environment"


def test_a_member_without_a_token_is_reached_with_the_one_it_generated(tmp_path):
    node = NodeProcess("n1", tmp_path / "n1" / "data", "127.0.0.1:7001", "127.0.0.1:8001",
                       admin_token=None, start=False)
    assert "--admin-token" not in node.argv
    assert node.admin_token is None  # not started yet: nothing generated
    node.data_dir.mkdir(parents=True)
    (node.data_dir / "admin-token").write_text("generated-by-the-member-0123\n")
    assert node.admin_token == "generated-by-the-member-0123"
    assert node.client().token == "generated-by-the-member-0123"
    cluster = LocalCluster(tmp_path / "c", 2, start=False, admin_token=None)
    assert not any("--admin-token" in n.argv for n in cluster.nodes.values())
    for i, n in enumerate(cluster.nodes.values()):
        n.data_dir.mkdir(parents=True)
        (n.data_dir / "admin-token").write_text(f"generated-by-member-{i}-0123456\n")
    assert cluster.admin_token is None  # one per member
    assert cluster.client("n1").token == "generated-by-member-1-0123456"
    assert LocalCluster(tmp_path / "d", 2, start=False).admin_token == processes.ADMIN_TOKEN


def test_node_defaults_and_advertise_flags(tmp_path):
    node = NodeProcess("solo", tmp_path / "d", "127.0.0.1:7001", "127.0.0.1:8001",
                       advertise_peer="http://10.0.0.1:7001",
                       advertise_client="http://10.0.0.1:8001", start=False)
    argv = node.argv
    assert flag(argv, "--initial-cluster") == "solo=http://127.0.0.1:7001"
    assert flag(argv, "--initial-cluster-state") == "new"
    assert flag(argv, "--election-timeout-ms") == "1000"
    assert flag(argv, "--heartbeat-ms") == "100"
    assert flag(argv, "--advertise-peer") == "http://10.0.0.1:7001"
    assert flag(argv, "--advertise-client") == "http://10.0.0.1:8001"
    with pytest.raises(ValueError, match="new or existing"):
        NodeProcess("x", tmp_path / "x", "127.0.0.1:1", "127.0.0.1:2",
                    initial_cluster_state="join", start=False)


def test_plain_cluster_shares_one_view_of_real_peer_addresses(tmp_path):
    cluster = LocalCluster(tmp_path, 3, start=False, election_timeout_ms=600, heartbeat_ms=60)
    nodes = cluster.nodes
    assert list(nodes) == ["n0", "n1", "n2"] and not any(n.running for n in nodes.values())
    views = {name: flag(n.argv, "--initial-cluster") for name, n in nodes.items()}
    assert len(set(views.values())) == 1
    view = parse_view(views["n0"])
    assert view == {name: n.peer_url for name, n in nodes.items()}
    addresses = [n.peer_addr for n in nodes.values()] + [n.client_addr for n in nodes.values()]
    assert len(set(addresses)) == 6
    for n in nodes.values():
        assert flag(n.argv, "--cluster-id") == cluster.cluster_id
        assert flag(n.argv, "--election-timeout-ms") == "600"
        assert flag(n.argv, "--data-dir") == str(tmp_path / n.name / "data")


def pairs(cluster):
    return [(a, b) for a in cluster.nodes for b in cluster.nodes if a != b]


def test_proxied_cluster_gives_each_member_its_own_view(tmp_path):
    cluster = LocalCluster(tmp_path, 3, proxied=True, start=False)
    proxies = {pair: cluster.proxy(*pair) for pair in pairs(cluster)}
    assert len({p.port for p in proxies.values()}) == 6
    for (_, dst), proxy in proxies.items():
        assert proxy.target == address(cluster.nodes[dst].peer_addr)
    for name, node in cluster.nodes.items():
        view = parse_view(flag(node.argv, "--initial-cluster"))
        assert view[name] == cluster.peer_url(name)  # itself: where it really listens
        for other in cluster.members:
            if other != name:
                assert view[other] == proxies[(name, other)].url
    cluster.stop_all()
    with pytest.raises(OSError):  # the proxies are gone with the cluster
        socket.create_connection(("127.0.0.1", proxies[("n0", "n1")].port), timeout=1)


def test_partition_isolate_heal_cut_exactly_the_crossing_pairs(tmp_path):
    cluster = LocalCluster(tmp_path, 5, proxied=True, start=False)
    cut = lambda: {pair for pair in pairs(cluster) if cluster.proxy(*pair).blocked}  # noqa: E731

    cluster.partition(["n0", "n1"], ["n2", "n3", "n4"])
    crossing = {(a, b) for a in ("n0", "n1") for b in ("n2", "n3", "n4")}
    assert cut() == crossing | {(b, a) for a, b in crossing} == cluster.blocked

    cluster.isolate("n4")  # adds to the current cuts
    assert ("n2", "n4") in cut() and ("n4", "n3") in cut() and ("n2", "n3") not in cut()

    cluster.heal()
    assert cut() == set() == cluster.blocked

    with pytest.raises(ValueError, match="both sides"):
        cluster.partition(["n0"], ["n0", "n1"])
    with pytest.raises(ValueError, match="no such members"):
        cluster.partition(["n0"], ["n9"])
    assert LocalCluster(tmp_path / "plain", 3, start=False).proxied is False
    with pytest.raises(RuntimeError, match="proxied=True"):
        LocalCluster(tmp_path / "plain", 3, start=False).isolate("n0")
    cluster.stop_all()


def test_format_initial_cluster_keeps_order():
    assert format_initial_cluster({"b": "http://h:2", "a": "http://h:1"}) == \
        "b=http://h:2,a=http://h:1"


# ---------------------------------------------------------------------------------------------
# Signals, logs and restarts (a real process: fake_node.py)


def fake_node(tmp_path: Path, name: str = "n0", **options) -> NodeProcess:
    peer, client = ports.allocate_ports(2)
    return NodeProcess(name, tmp_path / name / "data", f"127.0.0.1:{peer}",
                       f"127.0.0.1:{client}", command=FAKE_NODE, **options)


def wait_serving(node: NodeProcess, timeout: float = 10.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with node.client(timeout=1) as c:
                return c.status()
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"{node} never served; log:\n{node.log_tail()}") from None
            time.sleep(0.05)


def process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat: R, S, T (stopped)..."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


def test_signals_restart_and_log(tmp_path):
    node = fake_node(tmp_path)
    try:
        assert wait_serving(node)["name"] == "n0"
        assert node.running and node.returncode is None

        node.stop()
        assert node.paused and process_state(node.pid) == "T"
        with pytest.raises(TimeoutError), node.client(timeout=0.3) as c:
            c.status()  # a paused member accepts connections but never answers
        node.cont()
        assert not node.paused and process_state(node.pid) != "T"
        assert wait_serving(node)["name"] == "n0"

        assert node.kill() == -9 and node.returncode == -9
        with pytest.raises(RuntimeError, match="not running"):
            node.stop()
        first_pid = node.pid
        node.restart()
        assert node.pid != first_pid and node.starts == 2
        wait_serving(node)
        with pytest.raises(RuntimeError, match="still running"):
            node.restart()
        assert node.terminate(10) == 0 and node.returncode == 0

        log = node.log_tail(100)
        assert "--- harness: start #1" in log and "--- harness: start #2" in log
        assert log.count("fake node argv:") == 2
        assert "fake node: SIGTERM" in log
        assert node.log_tail(1).count("\n") == 0
    finally:
        node.close()


def test_terminate_returns_the_exit_code_even_when_paused(tmp_path):
    node = fake_node(tmp_path, env={"FAKE_NODE_EXIT_CODE": "3"})
    try:
        wait_serving(node)
        node.stop()
        assert node.terminate(10) == 3  # SIGCONT follows SIGTERM, or it would wait for ever
    finally:
        node.close()


def test_node_environment_drops_flotilla_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("FLOTILLA_CLUSTER_ID", "leaked-from-the-shell")
    env = processes._node_env({"FLOTILLA_ARCHIVE": "file:///x"})
    assert "FLOTILLA_CLUSTER_ID" not in env and env["FLOTILLA_ARCHIVE"] == "file:///x"
    assert env["PYTHONUNBUFFERED"] == "1"


# ---------------------------------------------------------------------------------------------
# Clusters of fake nodes: leaders, membership, cleanup


def fake_cluster(tmp_path: Path, statuses: dict, **options) -> tuple[LocalCluster, Path]:
    status_file = tmp_path / "status.json"
    status_file.write_text(json.dumps(statuses))
    cluster = LocalCluster(tmp_path / "c", 3, command=FAKE_NODE,
                           env={"FAKE_NODE_STATUS": str(status_file)}, **options)
    return cluster, status_file


def test_wait_leader_needs_every_live_member_to_agree(tmp_path):
    agreed = {"*": {"role": "follower", "term": 3, "leader": "n1"},
              "n1": {"role": "leader", "term": 3, "leader": "n1"}}
    cluster, status_file = fake_cluster(tmp_path, agreed)
    with cluster:
        assert cluster.wait_leader(10) == "n1"
        assert cluster.status("n2")["term"] == 3

        split = dict(agreed, n2={"role": "candidate", "term": 4, "leader": None})
        status_file.write_text(json.dumps(split))
        with pytest.raises(TimeoutError) as info:
            cluster.wait_leader(0.5)
        assert "n2: role=candidate term=4 leader=None" in str(info.value)
        assert cluster.wait_leader(5, among=["n0", "n1"]) == "n1"

        cluster.nodes["n2"].stop()  # a paused member cannot answer and is not waited for
        assert cluster.wait_leader(5) == "n1"
        cluster.nodes["n2"].kill()
        assert cluster.wait_leader(5) == "n1"
        assert cluster.urls == [cluster.nodes["n0"].url, cluster.nodes["n1"].url]

        stale_term = dict(agreed, n0={"role": "follower", "term": 2, "leader": "n1"})
        status_file.write_text(json.dumps(stale_term))
        with pytest.raises(TimeoutError):
            cluster.wait_leader(0.5)  # n0 names n1 but from an older term: not settled
    assert not any(n.running for n in cluster.nodes.values())


def test_leader_must_say_so_itself(tmp_path):
    followers_only = {"*": {"role": "follower", "term": 1, "leader": "n1"}}
    cluster, _ = fake_cluster(tmp_path, followers_only)
    with cluster, pytest.raises(TimeoutError):
        cluster.wait_leader(0.5)


def test_add_member_starts_it_existing_and_posts_it_to_the_leader(tmp_path):
    statuses = {"*": {"role": "follower", "term": 1, "leader": "n0"},
                "n0": {"role": "leader", "term": 1, "leader": "n0"}}
    cluster, _ = fake_cluster(tmp_path, statuses, proxied=True)
    with cluster:
        node = cluster.add_member("n3", timeout=20)
        assert cluster.members == ["n0", "n1", "n2", "n3"]
        assert flag(node.argv, "--initial-cluster-state") == "existing"
        view = parse_view(flag(node.argv, "--initial-cluster"))
        assert view["n3"] == node.peer_url
        assert view["n0"] == cluster.proxy("n3", "n0").url
        inbound = cluster.proxy("n0", "n3")
        assert inbound is cluster.proxy("n1", "n3")  # one proxy for every sender
        assert inbound.target == address(node.peer_addr)
        posted = [line for line in cluster.nodes["n0"].log_tail(50).splitlines()
                  if "POST /v1/members" in line]
        assert len(posted) == 1
        body = json.loads(posted[0].split("/v1/members ", 1)[1])
        # Every member learns the new one's address from the log: the shared inbound proxy.
        assert body == {"name": "n3", "peer_url": inbound.url, "client_url": node.url}

        cluster.isolate("n3")
        assert inbound.blocked
        assert all(cluster.proxy("n3", m).blocked for m in ("n0", "n1", "n2"))
        assert not cluster.proxy("n0", "n1").blocked
        cluster.heal()
        assert not inbound.blocked
        with pytest.raises(ValueError, match=r"not from \['n1', 'n2'\] only"):
            cluster.partition(["n0", "n3"], ["n1", "n2"])
        assert cluster.blocked == frozenset()  # a refused partition changes nothing
        with pytest.raises(ValueError, match="already exists"):
            cluster.add_member("n3")


def test_a_failing_test_still_kills_every_member(tmp_path):
    cluster, _ = fake_cluster(tmp_path, {})
    with pytest.raises(ZeroDivisionError), cluster:
        nodes = list(cluster.nodes.values())
        nodes[0].stop()  # paused members must die too
        1 / 0  # noqa: B018
    assert all(n.returncode == -9 for n in nodes)
    cluster.stop_all()  # idempotent
