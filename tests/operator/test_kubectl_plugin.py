"""`kubectl flotilla` against kmock, the operator (a real subprocess) and real members (the
stand-in kubelet of `kubelet.py`), TLS on both ports as by default.

One cluster serves the module, each test leaving it as a user would: `status` shows the
operator's view and each member's own, which the test process reaches at the members' cluster
DNS names (clusterdns) trusting the CA it reads from the cluster's Secret; `snapshot` and
`move-leader` are annotations the operator carries out, answered in `status.requests` and
Events, checked against the members and the archive themselves; a request the operator must
refuse is refused in the status. The plugin runs in this process (its `main`), except where the
test is that kubectl itself finds and runs the installed `kubectl-flotilla`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from flotilla.operator import certs, requests

from flotilla import cli, kubectl_plugin
from tests.operator import clusterdns
from tests.operator.kubelet import Kmock, Kubelet, start_operator, stop_operator
from tests.operator.test_kopf_kmock import (
    NAME,
    NS,
    assert_admitted,
    events,
    raft_cluster,
    status_of,
    wait_status,
)


class World:
    def __init__(self, api: Any, kubelet: Kubelet, kubeconfig: Path, root: Path) -> None:
        self.api, self.kubelet, self.kubeconfig, self.root = api, kubelet, kubeconfig, root

    def plugin(self, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
        """`kubectl flotilla ARGV` against this world: (exit code, stdout, stderr)."""
        capsys.readouterr()
        code = kubectl_plugin.main(["--kubeconfig", str(self.kubeconfig), *argv])
        out, err = capsys.readouterr()
        return code, out, err

    def members(self) -> list[str]:
        return [self.kubelet.client_url(f"{NAME}-{i}") for i in range(3)]

    def leader(self) -> str:
        """The member that says it leads, asked directly."""
        with self.kubelet.client(self.members(), timeout=10) as client:
            return client.status()["name"]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("plugin")
    server = Kmock().start()
    api = server.api()
    kubelet = Kubelet(api, NS, root).start()
    log = open(root / "operator.log", "wb")  # noqa: SIM115 (closed below)
    operator = start_operator(server, kubelet, root, log, "--interval", "5")
    try:
        with clusterdns.installed(kubelet.dns_file):
            (root / "archive").mkdir()
            api.create(raft_cluster((root / "archive").as_uri()))
            wait_status(api, lambda s: s.get("phase") == "Ready" and s.get("replicas") == 3
                        and s.get("leader"), "the cluster to be Ready", 60, kubelet)
            yield World(api, kubelet, server.kubeconfig(root / "kubeconfig"), root)
    finally:
        stop_operator(operator)
        log.close()
        kubelet.stop()
        server.stop()
        print("--- operator log (tail)")
        print("\n".join((root / "operator.log").read_text(errors="replace").splitlines()[-40:]))
        print(kubelet.log_tails(8))


def test_status_shows_the_operators_view_and_each_members_own(world: World, capsys) -> None:
    code, out, err = world.plugin(capsys, "status", NAME)
    assert code == 0, err
    status = status_of(world.api)
    lines = out.splitlines()
    assert lines[0] == (f"RaftCluster {NAME} in namespace {NS}: phase Ready, 3 voters, leader "
                        f"{status['leader']} (term {status['term']})")
    assert f"cluster id:    {status['clusterId']}" in lines
    assert any(line.startswith("archive:") and (world.root / "archive").as_uri() in line
               for line in lines)
    header = next(i for i, line in enumerate(lines) if line.startswith("MEMBER"))
    assert lines[header].split() == ["MEMBER", "ROLE", "READY", "MATCH", "LAG", "LIVE", "ROLE",
                                     "TERM", "COMMIT", "APPLIED"]
    rows = {line.split()[0]: line.split() for line in lines[header + 1:header + 4]}
    assert sorted(rows) == [f"{NAME}-{i}" for i in range(3)]
    # The live columns are each member's own answer: exactly one says it leads.
    assert sorted(row[5] for row in rows.values()) == ["follower", "follower", "leader"]
    assert rows[world.leader()][5] == "leader"
    assert "note:" not in out  # every member was reached
    conditions = out[out.index("CONDITION"):].splitlines()
    assert [c.split()[:2] for c in conditions[1:5]] == [
        ["Ready", "True"], ["Progressing", "False"], ["Degraded", "False"], ["Archiving", "True"]]

    code, out, err = world.plugin(capsys, "status", NAME, "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["status"]["clusterId"] == status["clusterId"]
    assert {name: m["role"] for name, m in doc["members"].items()
            if m["role"] == "leader"} == {world.leader(): "leader"}
    # What a member tells a client without the admin token: no cluster id, no peer URLs.
    assert all("cluster_id" not in m for m in doc["members"].values())


def test_status_says_plainly_when_members_cannot_be_reached(world: World, capsys) -> None:
    """From outside the cluster's network the members' names do not resolve: the table is the
    operator's view, and one line says why there is no live column."""
    with clusterdns.installed(world.root / "no-such-table.json"):
        code, out, err = world.plugin(capsys, "status", NAME)
    assert code == 0, err
    assert "Traceback" not in out + err
    notes = [line for line in out.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "no member could be reached from here" in notes[0], out
    assert f"{NAME}-0" in notes[0] and "the table is the operator's view" in notes[0]


def test_snapshot_is_taken_by_the_operator_and_shipped_to_the_archive(world: World,
                                                                      capsys) -> None:
    with world.kubelet.client(world.members(), timeout=10) as client:
        written = max(client.put(f"snap/{i}", b"x").index for i in range(20))
    before = set((world.root / "archive").rglob("*.snap"))
    code, out, err = world.plugin(capsys, "snapshot", NAME, "--timeout", "30")
    assert code == 0, err
    entry = status_of(world.api)["requests"]["snapshot"]
    assert entry["outcome"] == "Succeeded" and entry["index"] >= written, entry
    assert out.strip() == (f"snapshot of {NAME}: index {entry['index']}, term {entry['term']}, "
                           f"{entry['bytes']} bytes, {entry['location']}")
    assert entry["location"].startswith((world.root / "archive").as_uri())
    assert set((world.root / "archive").rglob("*.snap")) - before, "no snapshot was archived"
    annotations = world.api.get("RaftCluster", NS, NAME)["metadata"]["annotations"]
    assert annotations[requests.SNAPSHOT] == entry["requestedAt"]
    taken = [m for kind, reason, m in events(world.api) if (kind, reason) == ("Normal",
                                                                           "SnapshotTaken")]
    assert taken and taken[-1] == (f"{entry['message']} (asked for at {entry['requestedAt']} "
                                   f"by the annotation {requests.SNAPSHOT})")
    assert_admitted(world.api)

    # Asked again, another snapshot: each new value of the annotation is one request.
    code, out, err = world.plugin(capsys, "snapshot", NAME, "-o", "json")
    assert code == 0, err
    again = json.loads(out)
    assert again["requestedAt"] > entry["requestedAt"] and again["outcome"] == "Succeeded"


def test_move_leader_hands_leadership_to_the_named_voter(world: World, capsys) -> None:
    leader = world.leader()
    target = next(f"{NAME}-{i}" for i in range(3) if f"{NAME}-{i}" != leader)
    code, out, err = world.plugin(capsys, "move-leader", NAME, target.rsplit("-", 1)[1])
    assert code == 0, err
    assert out.startswith(f"leader of {NAME}: {target} (term "), out
    assert world.leader() == target
    entry = status_of(world.api)["requests"]["moveLeader"]
    assert (entry["outcome"], entry["member"], entry["leader"]) == ("Succeeded", target, target)
    assert f"leadership moved from {leader} to {target}" in entry["message"]
    assert_admitted(world.api)
    # The status follows: the plugin then says there is nothing to do.
    wait_status(world.api, lambda s: s.get("leader") == target, "the status's leader", 30)
    code, out, err = world.plugin(capsys, "move-leader", NAME, target)
    assert (code, out.strip()) == (0, f"{target} already leads {NAME} (term "
                                      f"{status_of(world.api)['term']})")


def test_a_member_that_is_not_a_voter_is_refused_in_one_line(world: World, capsys) -> None:
    code, out, err = world.plugin(capsys, "move-leader", NAME, "7")
    assert code == 1 and out == ""
    assert err == (f"kubectl flotilla move-leader: {NAME}-7 is not a member of {NAME}: only a "
                   f"voter can lead (voters: {NAME}-0, {NAME}-1, {NAME}-2)\n")


def test_the_operator_refuses_a_request_it_cannot_carry_out(world: World, capsys) -> None:
    """Annotations written by hand (kubectl annotate) are checked by the operator too: a
    request for a member that does not exist fails in the status and a Warning, and leaves
    leadership where it was."""
    leader = world.leader()
    stamp = "2026-01-01T00:00:00.000Z"
    world.api.patch("RaftCluster", NS, NAME, {"metadata": {"annotations": {
        requests.MOVE_LEADER_TO: "demo-9", requests.MOVE_LEADER: stamp}}})
    entry = kubectl_plugin.await_answer(
        kubectl_plugin.connect(str(world.kubeconfig), None, None), NAME, "moveLeader", stamp,
        30)
    assert entry["outcome"] == "Failed"
    assert entry["message"] == ("leadership not moved: demo-9 is not a member, and only a "
                                "voter can lead (voters: demo-0, demo-1, demo-2)")
    assert world.leader() == leader
    warnings = [m for kind, reason, m in events(world.api)
                if (kind, reason) == ("Warning", "LeadershipTransferFailed")]
    assert warnings and warnings[-1].startswith(entry["message"])
    code, out, err = world.plugin(capsys, "status", NAME)
    assert code == 0, err
    assert f"requested move-leader to demo-9 (at {stamp}): Failed: {entry['message']}" in out


def test_the_quickstarts_writes_through_a_forwarded_follower(world: World, capsys,
                                                             monkeypatch) -> None:
    """docs/kubernetes-quickstart.md writes from a laptop through `kubectl port-forward
    svc/demo`, trusting the CA of the Secret demo-ca and sending the token of
    demo-admin-token: the member behind the forward (here a follower, at its loopback port,
    which its certificate names) passes the write on to a leader whose own URL the laptop
    cannot resolve."""
    leader = world.leader()
    follower = next(f"{NAME}-{i}" for i in range(3) if f"{NAME}-{i}" != leader)
    ca = world.root / "demo-ca.crt"
    ca.write_bytes(certs.decode(world.api.get("Secret", NS, f"{NAME}-ca"))["ca.crt"])
    token = certs.decode(world.api.get("Secret", NS, f"{NAME}-admin-token"))["token"].decode()
    monkeypatch.setenv("FLOTILLA_ENDPOINTS",
                       f"https://localhost:{world.kubelet.addresses[follower][1]}")
    monkeypatch.setenv("FLOTILLA_CACERT", str(ca))
    monkeypatch.setenv("FLOTILLA_TOKEN", token)
    with clusterdns.installed(world.root / "no-such-table.json"):
        capsys.readouterr()
        assert cli.main(["kv", "put", "greeting", "hello"]) == 0
        assert cli.main(["kv", "get", "greeting"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK index ") and out.endswith("hello"), out


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not on PATH")
def test_kubectl_finds_and_runs_the_installed_plugin(world: World) -> None:
    """`kubectl flotilla` runs the console script `kubectl-flotilla` that installing the
    package puts beside the interpreter, as kubectl runs any plugin on PATH."""
    bin_dir = Path(sys.executable).parent
    assert (bin_dir / "kubectl-flotilla").is_file(), (
        "no kubectl-flotilla beside the interpreter: reinstall the package (make setup)")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    # The members' names do not resolve outside this process: the operator's view only.
    done = subprocess.run(["kubectl", "flotilla", "status", NAME, "-o", "yaml",
                           "--kubeconfig", str(world.kubeconfig)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    doc = yaml.safe_load(done.stdout)
    assert doc["status"]["phase"] == "Ready" and "could be reached" in doc["note"]

