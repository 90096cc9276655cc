"""`flotilla operator` (kopf, a real subprocess) against kmock's Kubernetes API, with real
members: `tests/operator/kubelet.py` plays the StatefulSet controller and kubelet by running the
pods of every StatefulSet as `flotilla node` processes started from the pod template's env.

The story: apply a RaftCluster; the StatefulSet, both Services and the PDB appear with the right
flags, env, ports, volumes and owner references; the members bootstrap from that env and the
status says Ready. Scale to 5 and back to 3 through spec.replicas (what `kubectl scale` patches
through the scale subresource): the Events show the steps in order (learners, catch-up, one
joint change; leadership moved, one joint change, shrink, volumes by policy) and every
acknowledged write is still there. Delete the RaftCluster: the finalizer takes a final snapshot
into the archive before letting it go. With spec.archive.compaction and .export, CronJobs appear,
follow the spec (patched, deleted with their block), and the outcome of their Jobs reaches
status.archiveJobs and the Events; one compaction runs for real, through Spark.
"""

from __future__ import annotations

import base64
import datetime
import itertools
import json
import re
import socket
import ssl
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from flotilla.node.archive import format_ms, parse_time
from flotilla.node.tls import Issued, issue, make_ca
from flotilla.operator import certs
from flotilla.operator.spec import ClusterSpec
from prometheus_client.parser import text_string_to_metric_families

from flotilla.client import Client, FlotillaError
from tests.harness import ports
from tests.harness.polling import wait_for
from tests.harness.promtool import check_metrics
from tests.operator import clusterdns
from tests.operator.kubelet import Kmock, Kubelet, start_operator, stop_operator
from tests.packaging.crdschema import CRDValidator, load_crd

NS = "default"
NAME = "demo"
OPERATOR_NS = "flotilla-system"


@pytest.fixture
def world(request, tmp_path: Path):
    """kmock, the stand-in kubelet and the operator; `world` parametrized indirectly with a
    dict adds to the operator's environment (its keys that start with "--" are the operator's
    flags; "--metrics-port": "free" takes a free port)."""
    param = dict(getattr(request, "param", {}))
    interval = param.pop("--interval", "0.5")
    flags = [str(item) for flag in [k for k in param if k.startswith("--")]
             for item in (flag, param.pop(flag))]
    if "free" in flags:
        flags[flags.index("free")] = str(ports.allocate_ports(1)[0])
    server = Kmock().start()
    api = server.api()
    kubelet = Kubelet(api, NS, tmp_path).start()
    log = open(tmp_path / "operator.log", "wb")  # noqa: SIM115 (closed below)
    # Members are reached at their cluster DNS names (which their certificates name), resolved
    # by clusterdns in the operator's process and in this one.
    operator = start_operator(server, kubelet, tmp_path, log, "--interval", interval, *flags, env={
        # where the chart's operator runs: its namespace reaches every cluster's members
        "FLOTILLA_OPERATOR_NAMESPACE": OPERATOR_NS,
        "FLOTILLA_OPERATOR_POD_LABELS": "app.kubernetes.io/name=flotilla-operator",
        **param})
    try:
        with clusterdns.installed(kubelet.dns_file):
            yield server, api, kubelet, tmp_path
    finally:
        stop_operator(operator)
        log.close()
        kubelet.stop()
        server.stop()
        print("--- operator log (tail)")
        print("\n".join((tmp_path / "operator.log").read_text(errors="replace")
                        .splitlines()[-40:]))
        print(kubelet.log_tails(8))
        if kubelet.errors:
            print("kubelet errors:", kubelet.errors[:5])


def raft_cluster(archive: str, replicas: int = 3) -> dict[str, Any]:
    return {
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "RaftCluster",
        "metadata": {"name": NAME, "namespace": NS, "uid": "0f1e2d3c-aaaa-bbbb-cccc-1234567890ab",
                     "generation": 1},
        "spec": {"replicas": replicas, "timing": {"electionTimeoutMs": 500, "heartbeatMs": 50},
                 "archive": {"url": archive, "intervalMs": 500},
                 "snapshot": {"entries": 10000}},
    }


def get(api, kind: str, name: str = NAME) -> dict[str, Any] | None:
    return api.get(kind, NS, name)


def status_of(api, name: str = NAME) -> dict[str, Any]:
    return (get(api, "RaftCluster", name) or {}).get("status") or {}


#: The steps of a scale from 3 to 5 voters, in order, as steps_since gives them.
SCALE_UP_STEPS = [
    ("Resized", "resize to 5"),
    ("LearnerAdded", "add-learner demo-3"), ("LearnerAdded", "add-learner demo-4"),
    ("VotersChanged", "change-voters to demo-0, demo-1, demo-2, demo-3, demo-4"),
]


def steps_since(api, seen: int) -> list[tuple[str, str]]:
    """(reason, action) of each step the operator took after the first `seen` Events."""
    return [(reason, message.split(":")[0]) for kind, reason, message in events(api)[seen:]
            if kind == "Normal" and reason != "Created"]


def events(api) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the RaftCluster's events, oldest first (kmock lists objects
    in the order they were created; timestamps have one-second resolution)."""
    items = api.list("Event", NS, "")
    items = [e for e in items if (e.get("involvedObject") or {}).get("kind") == "RaftCluster"]
    return [(e.get("type"), e.get("reason"), e.get("message") or e.get("note") or "")
            for e in items]


def wait_status(api, predicate: Callable[[dict[str, Any]], bool], what: str,
                timeout: float = 60.0, kubelet: Kubelet | None = None,
                name: str = NAME) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def check() -> bool:
        nonlocal last
        last = status_of(api, name)
        return predicate(last)

    try:
        wait_for(check, timeout, what)
    except Exception:
        brief = {k: last.get(k) for k in ("phase", "replicas", "leader", "configuration",
                                           "lastAction")}
        raise AssertionError(f"{what}: last status {brief}\nevents {events(api)[-8:]}"
                             + (f"\n{kubelet.log_tails(6)}" if kubelet else "")) from None
    return last


CRD = CRDValidator(load_crd(Path(__file__).resolve().parents[2] / "crds" / "raftcluster.yaml"),
                   "v1alpha1")


def assert_admitted(api, name: str = NAME) -> None:
    """The status the operator wrote is one the API server would store as it is: nothing
    pruned (an unknown field would silently lose the planner's memory), nothing refused."""
    obj = get(api, "RaftCluster", name)
    stored, errors = CRD.admit({"status": obj["status"]}, old=obj, subresource="status")
    assert not errors, errors
    assert stored["status"] == obj["status"]


def env_of(sts: dict[str, Any]) -> dict[str, Any]:
    container = sts["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def operator_log(root: Path) -> list[dict[str, Any]]:
    """The operator's log (run with --log-format json): every line one JSON object with the
    agreed keys, kopf's own records included."""
    records = []
    for line in (root / "operator.log").read_text().splitlines():
        record = json.loads(line)  # any line that is not JSON fails the test
        assert {"time", "level", "logger", "message"} <= set(record), record
        records.append(record)
    return records


def operator_metrics(root: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The operator's /metrics, checked by promtool, as {(sample, sorted labels): value}; the
    port is the one its log says it serves on."""
    port = next(int(r["message"].split()[4].rstrip(",")) for r in operator_log(root)
                if r["message"].startswith("serving metrics on port"))
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read()
    check_metrics(text, "the operator's /metrics")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text.decode())
            for s in family.samples}


def metrics_when(root: Path, predicate: Callable[[dict], Any], what: str) -> dict:
    """The operator's metrics once `predicate` holds of them (they follow each round)."""
    def found() -> dict | None:
        metrics = operator_metrics(root)
        return metrics if predicate(metrics) else None
    return wait_for(found, 10, f"the operator's metrics to show {what}")


def cluster_gauges(found: dict, name: str = NAME) -> dict[str, float]:
    """The operator's per-cluster gauges of `name`, without their common prefix."""
    labels = (("namespace", NS), ("raftcluster", name))
    return {sample.removeprefix("flotilla_operator_cluster_"): value
            for (sample, got), value in found.items() if got == labels}


def steps_taken(found: dict) -> dict[str, float]:
    return {dict(labels)["step"]: value for (sample, labels), value in found.items()
            if sample == "flotilla_operator_steps_total" and value}


@pytest.mark.parametrize("world", [{"--log-format": "json", "--metrics-port": "free"}],
                         indirect=True)
def test_apply_scale_and_delete_a_raft_cluster(world):
    """...and the operator's own /metrics follow the cluster (voters, fault tolerance, the
    steps taken), and every line it logs is one JSON object."""
    _, api, kubelet, root = world
    archive = (root / "archive").as_uri()
    (root / "archive").mkdir()
    api.create(raft_cluster(archive))

    # 1. The owned objects, as rendered.
    wait_for(lambda: get(api, "StatefulSet") is not None, 30, "the StatefulSet")
    sts = get(api, "StatefulSet")
    owner = sts["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("RaftCluster", NAME, True)
    assert sts["spec"]["replicas"] == 3 and sts["spec"]["serviceName"] == "demo-peers"
    assert sts["spec"]["updateStrategy"]["type"] == "OnDelete"
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "flotilla:test"
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "client": 2379, "peer": 2380}
    env = env_of(sts)
    bootstrap = {"configMapKeyRef": {"name": "demo-bootstrap", "key": "initial-cluster-state"}}
    assert env["FLOTILLA_INITIAL_CLUSTER_STATE"] == bootstrap
    assert get(api, "ConfigMap", "demo-bootstrap")["data"] == {
        "initial-cluster-state": "new", "initial-cluster": ",".join(
            f"demo-{i}=https://demo-{i}.demo-peers.default.svc:2380" for i in range(3))}
    assert env["FLOTILLA_ARCHIVE"] == archive
    assert env["FLOTILLA_ELECTION_TIMEOUT_MS"] == "500"
    assert env["FLOTILLA_SNAPSHOT_POLICY"] == "entries=10000"
    assert env["FLOTILLA_CLUSTER_ID"].startswith("default-demo-")
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert env["FLOTILLA_DATA_DIR"].startswith(mounts["data"] + "/")
    for kind, name in (("Service", "demo-peers"), ("Service", "demo"),
                       ("PodDisruptionBudget", "demo")):
        obj = wait_for(lambda k=kind, n=name: get(api, k, n), 10, f"{kind} {name}")
        assert obj["metadata"]["ownerReferences"][0]["name"] == NAME
    assert get(api, "Service", "demo-peers")["spec"]["clusterIP"] == "None"
    assert get(api, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1

    # 2. The members bootstrap from that env; the status says so.
    status = wait_status(api, lambda s: s.get("phase") == "Ready" and s.get("replicas") == 3,
                         "the cluster to be Ready with 3 voters", kubelet=kubelet)
    assert status["configuration"] == {"voters": ["demo-0", "demo-1", "demo-2"],
                                       "learners": [], "joint": False}
    assert status["bootstrapped"] and status["leader"].startswith("demo-")
    assert_admitted(api)
    # The API server filters by label, as the operator's lists rely on.
    assert len(api.list("Pod", NS, status["selector"])) == 3
    assert api.list("Pod", NS, "app.kubernetes.io/instance=another") == []
    assert status["selector"] == "app.kubernetes.io/name=flotilla,app.kubernetes.io/instance=demo"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Ready": "True", "Progressing": "False", "Degraded": "False", "Archiving": "True",
        "VolumesResized": "True", "Reconciling": "False", "Stalled": "False"}
    wait_for(lambda: get(api, "ConfigMap", "demo-bootstrap")["data"]["initial-cluster-state"]
             == "existing", 10, "empty volumes to start `existing` once bootstrapped")
    assert get(api, "StatefulSet")["spec"]["template"] == sts["spec"]["template"]
    found = metrics_when(root, lambda f: cluster_gauges(f).get("ready"), "the cluster ready")
    assert cluster_gauges(found) == {"voters": 3, "unavailable_voters": 0,
                                     "fault_tolerance": 1, "ready": 1}
    assert found[("flotilla_operator_clusters", (("phase", "Ready"),))] == 1
    assert steps_taken(found) == {"resize": 1}
    assert found[("flotilla_operator_reconcile_duration_seconds_count", ())] > 0

    acknowledged: dict[str, bytes] = {}
    with kubelet.client([kubelet.client_url(f"demo-{i}") for i in range(3)], timeout=10) as c:
        for i in range(50):
            c.put(f"k{i}", f"v{i}".encode())
            acknowledged[f"k{i}"] = f"v{i}".encode()

    # 3. Scale up: what `kubectl scale raft/demo --replicas=5` patches.
    seen = len(events(api))
    api.patch("RaftCluster", NS, NAME, {"spec": {"replicas": 5}, "metadata": {"generation": 2}})
    status = wait_status(api, lambda s: s.get("replicas") == 5 and s.get("phase") == "Ready",
                         "5 voters", 90, kubelet)
    assert status["configuration"]["joint"] is False and not status["configuration"]["learners"]
    steps = steps_since(api, seen)
    assert steps == SCALE_UP_STEPS, steps
    assert get(api, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 2
    assert_admitted(api)
    found = operator_metrics(root)
    assert steps_taken(found) == {"resize": 2, "add-learner": 2, "change-voters": 1}
    assert cluster_gauges(found)["voters"] == 5
    assert cluster_gauges(found)["fault_tolerance"] == 2

    # 4. Scale down with the leader among the members that leave.
    with kubelet.client(kubelet.client_url("demo-0"), timeout=10) as c:
        c.transfer_leader("demo-4")
    seen = len(events(api))
    api.patch("RaftCluster", NS, NAME, {"spec": {"replicas": 3}, "metadata": {"generation": 3}})
    status = wait_status(api, lambda s: s.get("replicas") == 3 and s.get("phase") == "Ready"
                         and get(api, "StatefulSet")["spec"]["replicas"] == 3
                         and "delete-volume" not in s.get("lastAction", ""),
                         "back to 3 voters", 90, kubelet)
    wait_for(lambda: api.get("PersistentVolumeClaim", NS, "data-demo-3") is None
             and api.get("PersistentVolumeClaim", NS, "data-demo-4") is None, 20,
             "the removed members' claims to go (policy Delete)")
    # Each Event follows its step: the last claim can go a moment before its Event is posted
    # (and the cluster is Ready with 3 voters while the last removed pod is still stopping).
    wait_for(lambda: [r for _, r, _ in events(api)[seen:]].count("VolumeDeleted") >= 2, 10,
             "the Event of each deleted volume")
    steps = steps_since(api, seen)
    assert steps[0][0] == "LeadershipTransferred", steps
    assert steps[1:] == [
        ("VotersChanged", "change-voters to demo-0, demo-1, demo-2"),
        ("Resized", "resize to 3"),
        ("VolumeDeleted", "delete-volume demo-3"), ("VolumeDeleted", "delete-volume demo-4"),
    ], steps
    assert sorted(m["name"] for m in status["removedMembers"]) == ["demo-3", "demo-4"]
    assert_admitted(api)
    with kubelet.client([kubelet.client_url(f"demo-{i}") for i in range(3)], timeout=10) as c:
        for key, value in acknowledged.items():
            assert c.get(key).value == value
        for i in range(3):
            config = c.status(kubelet.client_url(f"demo-{i}"))["config"]
            assert sorted(config["voters"]) == ["demo-0", "demo-1", "demo-2"]
            assert config["joint"] is None and not config["learners"]

    # 5. Delete: the finalizer ships a final snapshot first.
    raft = get(api, "RaftCluster")
    assert "flotilla.dev/final-snapshot" in raft["metadata"].get("finalizers", [])
    before = set((root / "archive").rglob("*.snap"))
    api.delete("RaftCluster", NS, NAME)
    wait_for(lambda: get(api, "RaftCluster") is None, 30, "the RaftCluster to be deleted")
    final = [m for _, reason, m in events(api) if reason == "Deleting"]
    assert final and final[0].startswith("final snapshot at index"), events(api)[-5:]
    assert set((root / "archive").rglob("*.snap")) - before, "no new snapshot in the archive"
    found = metrics_when(root, lambda f: not cluster_gauges(f), "no series of the cluster")
    assert found[("flotilla_operator_clusters", (("phase", "Ready"),))] == 0
    records = operator_log(root)
    assert any(r["logger"].startswith("kopf") for r in records)  # kopf's records too
    assert any(r.get("object", {}).get("name") == NAME for r in records)


SAFETY_INTERVAL = 120.0


def operator_calls(server: Kmock, since: int = 0) -> list[tuple[str, str, str]]:
    """(method, resource plural, name) of each API request the operator made (the ones that
    show its kubeconfig's token) among the requests kmock served after the first `since`."""
    return [(method, plural, name)
            for method, plural, name, token in server.emulator.answered[since:] if token]


@pytest.mark.parametrize("world", [{"--interval": str(SAFETY_INTERVAL)}], indirect=True)
def test_steps_follow_each_other_without_waiting_for_the_safety_interval(world):
    """With a safety interval of two minutes, a bootstrap and a scale 3 -> 5 (six steps and
    the waits between them) are done well within it: each step follows the one before as soon
    as it completed, and the waits end on events (a pod that starts or gets ready, the spec
    patched) or on what the members say, never on the timer. The rounds of the scale neither
    read nor write the owned objects it leaves as they are (both Services, the NetworkPolicy,
    the bootstrap ConfigMap); the budget, which follows the voters, is read and written when
    it changes, not in every round."""
    server, api, kubelet, root = world
    began = time.monotonic()
    api.create(raft_cluster((root / "archive").as_uri()))
    wait_status(api, lambda s: s.get("phase") == "Ready" and s.get("replicas") == 3,
                "the cluster to be Ready with 3 voters", SAFETY_INTERVAL / 2, kubelet)
    wait_for(lambda: get(api, "ConfigMap", "demo-bootstrap")["data"]["initial-cluster-state"]
             == "existing", 10, "empty volumes to start `existing` once bootstrapped")
    seen = len(events(api))
    served = len(server.emulator.answered)
    api.patch("RaftCluster", NS, NAME, {"spec": {"replicas": 5}, "metadata": {"generation": 2}})
    status = wait_status(api, lambda s: s.get("replicas") == 5 and s.get("phase") == "Ready",
                         "5 voters", SAFETY_INTERVAL / 2, kubelet)
    assert time.monotonic() - began < SAFETY_INTERVAL / 2
    assert status["configuration"] == {"voters": [f"demo-{i}" for i in range(5)],
                                       "learners": [], "joint": False}
    steps = steps_since(api, seen)
    assert steps == SCALE_UP_STEPS, steps
    assert_admitted(api)

    calls = operator_calls(server, served)
    rounds = calls.count(("GET", "statefulsets", NAME))  # each round reads it once
    assert rounds >= len(SCALE_UP_STEPS) + 1, calls
    untouched = [c for c in calls if c[1] in ("services", "networkpolicies", "configmaps")]
    assert untouched == [], untouched
    # The budget is read only in a round that renders it anew, and then written (twice the
    # writes allows for the event of a write arriving before the round remembered it).
    budget = [c[0] for c in calls if c[1] == "poddisruptionbudgets"]
    assert 1 <= budget.count("PATCH") <= budget.count("GET") <= 2 * budget.count("PATCH"), \
        budget
    assert budget.count("GET") < rounds, (budget, rounds)
    assert get(api, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 2


@pytest.mark.parametrize("world", [{"--interval": str(SAFETY_INTERVAL)}], indirect=True)
def test_an_owned_object_deleted_or_edited_by_someone_else_is_repaired_at_once(world):
    """The rounds skip the owned objects they left in line, yet one deleted or edited behind
    the operator's back is put back on its watch event, long before the safety interval."""
    _, api, kubelet, root = world
    ready_cluster(api, kubelet, raft_cluster((root / "archive").as_uri()))
    wait_for(lambda: get(api, "ConfigMap", "demo-bootstrap")["data"]["initial-cluster-state"]
             == "existing", 10, "empty volumes to start `existing` once bootstrapped")
    rendered = {(kind, name): get(api, kind, name)["spec"] for kind, name in (
        ("Service", "demo"), ("NetworkPolicy", NAME), ("PodDisruptionBudget", NAME))}
    began = time.monotonic()
    api.delete("Service", NS, "demo")
    api.delete("NetworkPolicy", NS, NAME)
    api.patch("PodDisruptionBudget", NS, NAME, {"spec": {"maxUnavailable": 3}})
    api.patch("ConfigMap", NS, "demo-bootstrap", {"data": {"initial-cluster-state": "new"}})

    def repaired() -> bool:
        return all((get(api, kind, name) or {}).get("spec") == spec
                   for (kind, name), spec in rendered.items()) and get(
            api, "ConfigMap", "demo-bootstrap")["data"]["initial-cluster-state"] == "existing"

    wait_for(repaired, 20, "the deleted and edited objects to be put back")
    assert time.monotonic() - began < SAFETY_INTERVAL / 4

    def created() -> list[dict[str, Any]]:
        return [e for e in api.list("Event", NS, "") if e.get("reason") == "Created"
                and (e.get("message") or e.get("note")) == "Service demo"]

    def told() -> int:
        return sum(int(e.get("count") or 1) for e in created())

    # Posted again on the repair: one aggregated Event (client-go's series) counting both. A
    # round posts its Events after it has applied its objects, so the repaired Service can be
    # seen before the Event that announces it.
    wait_for(lambda: told() >= 2, 10, "the repair's Created event")
    assert told() == 2 and len(created()) == 1, created()


def test_an_invalid_spec_is_reported_and_nothing_is_created(world):
    _, api, _, root = world
    body = raft_cluster((root / "a").as_uri())
    body["spec"]["timing"] = {"electionTimeoutMs": 100, "heartbeatMs": 80}
    api.create(body)
    status = wait_status(api, lambda s: s.get("phase") == "Invalid", "the Invalid phase", 30)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False" and "electionTimeoutMs" in ready["message"]
    assert get(api, "StatefulSet") is None
    time.sleep(1.5)  # three more rounds: the same problem is not announced again
    assert [reason for _, reason, _ in events(api)] == ["InvalidSpec"]


def ready_cluster(api, kubelet, body: dict[str, Any], replicas: int = 3) -> dict[str, Any]:
    api.create(body)
    return wait_status(api, lambda s: s.get("phase") == "Ready" and s.get("replicas") ==
                       replicas, f"{body['metadata']['name']} Ready with {replicas} voters",
                       60, kubelet, body["metadata"]["name"])


def test_a_member_whose_volume_is_lost_is_removed_and_added_back(world):
    _, api, kubelet, root = world
    (root / "archive").mkdir()
    ready_cluster(api, kubelet, raft_cluster((root / "archive").as_uri()))
    with kubelet.client([kubelet.client_url(f"demo-{i}") for i in range(3)], timeout=10) as c:
        for i in range(30):
            c.put(f"k{i}", b"v")
        leader = c.status()["name"]
    victim = next(f"demo-{i}" for i in range(3) if f"demo-{i}" != leader)
    old_uid = next(m["uid"] for m in status_of(api)["members"] if m["name"] == victim)
    assert old_uid

    # The node under it is gone: its claim and pod are deleted; it comes back empty.
    seen = len(events(api))
    api.delete("PersistentVolumeClaim", NS, f"data-{victim}")
    api.delete("Pod", NS, victim)
    status = wait_status(
        api, lambda s: s.get("phase") == "Ready" and any(
            m["name"] == victim and m["uid"] not in ("", old_uid) for m in s["members"])
        and s["configuration"]["voters"] == ["demo-0", "demo-1", "demo-2"],
        f"{victim} back as a voter with a new identity", 60, kubelet)
    steps = steps_since(api, seen)
    assert ("MemberRemoved", f"remove-member {victim}") in steps, steps
    assert ("LearnerAdded", f"add-learner {victim}") in steps, steps
    assert steps.index(("MemberRemoved", f"remove-member {victim}")) < steps.index(
        ("LearnerAdded", f"add-learner {victim}")) < steps.index(
        ("VotersChanged", "change-voters to demo-0, demo-1, demo-2")), steps
    assert old_uid in {m["uid"] for m in status["removedMembers"]}
    assert_admitted(api)
    with kubelet.client(kubelet.client_url(victim), timeout=10) as c:
        assert c.get("k29", consistency="serializable").value == b"v"


def test_a_deleted_cluster_is_restored_from_its_archive(world):
    _, api, kubelet, root = world
    (root / "archive").mkdir()
    archive = (root / "archive").as_uri()
    ready_cluster(api, kubelet, raft_cluster(archive))
    with kubelet.client([kubelet.client_url(f"demo-{i}") for i in range(3)], timeout=10) as c:
        for i in range(40):
            c.put(f"k{i}", f"v{i}".encode())

    # Lose everything but the archive: the RaftCluster (final snapshot), its pods, its claims.
    api.delete("RaftCluster", NS, NAME)
    wait_for(lambda: get(api, "RaftCluster") is None, 30, "the RaftCluster to go")
    for kind in ("StatefulSet", "PodDisruptionBudget"):  # kmock has no garbage collector
        api.delete(kind, NS, NAME)
    wait_for(lambda: not api.list("Pod", NS, ""), 20, "the pods to go")
    for claim in api.list("PersistentVolumeClaim", NS, ""):
        api.delete("PersistentVolumeClaim", NS, claim["metadata"]["name"])

    body = raft_cluster(archive)
    body["metadata"].update(name="restored", uid="11112222-aaaa-bbbb-cccc-1234567890ab")
    body["spec"]["bootstrap"] = {"restore": {"url": archive}}
    status = ready_cluster(api, kubelet, body)
    assert status["clusterId"] != "default-demo-0f1e2d3c"
    with kubelet.client([kubelet.client_url(f"restored-{i}") for i in range(3)], timeout=10) as c:
        for i in range(40):
            assert c.get(f"k{i}").value == f"v{i}".encode()
        c.put("after", b"restore")


def test_a_template_change_rolls_members_one_at_a_time_leader_last(world):
    _, api, kubelet, root = world
    (root / "archive").mkdir()
    ready_cluster(api, kubelet, raft_cluster((root / "archive").as_uri()))
    urls = [kubelet.client_url(f"demo-{i}") for i in range(3)]
    acknowledged: dict[str, bytes] = {}
    stop = threading.Event()

    def write() -> None:  # a client writing throughout the roll
        with kubelet.client(urls, timeout=10) as c:
            for i in itertools.count():
                if stop.is_set():
                    return
                c.put(f"w{i}", b"x")
                acknowledged[f"w{i}"] = b"x"

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    old_revision = get(api, "StatefulSet")["status"]["updateRevision"]
    with kubelet.client(urls, timeout=10) as c:
        leader = c.status()["name"]
    seen = len(events(api))
    api.patch("RaftCluster", NS, NAME, {"spec": {"timing": {"heartbeatMs": 60}},
                                        "metadata": {"generation": 2}})

    def rolled() -> bool:
        sts = get(api, "StatefulSet")
        revision = (sts.get("status") or {}).get("updateRevision")
        pods = api.list("Pod", NS, "")
        return (revision != old_revision and len(pods) == 3 and all(
            p["metadata"]["labels"].get("controller-revision-hash") == revision for p in pods)
            and status_of(api).get("phase") == "Ready")

    wait_for(rolled, 90, "every pod on the new template and the cluster Ready")
    stop.set()
    writer.join(30)
    assert env_of(get(api, "StatefulSet"))["FLOTILLA_HEARTBEAT_MS"] == "60"
    steps = steps_since(api, seen)
    restarts = [m.split()[-1] for r, m in steps if r == "MemberRestarted"]
    assert sorted(restarts) == ["demo-0", "demo-1", "demo-2"], steps
    assert restarts[-1] == leader, f"the leader {leader} must restart last: {steps}"
    assert ("LeadershipTransferred" in [r for r, _ in steps]
            and [r for r, _ in steps].index("LeadershipTransferred")
            < [m.split()[-1] for _, m in steps].index(leader)), steps
    assert kubelet.started.count(leader) == 2  # started, then restarted once
    assert len(acknowledged) > 20
    with kubelet.client(urls, timeout=10) as c:
        for key, value in acknowledged.items():
            assert c.get(key).value == value


# --- point-in-time restore: the snapshot Job, then the members ----------------------------------


def archived_source(api, kubelet, archive: str) -> tuple[list[tuple[int, str, bytes | None]],
                                                         int, int]:
    """A one-member cluster `demo` that writes, overwrites and deletes keys and has archived
    all of it: (index, key, value or None for a delete) in log order; a time (ms) between the
    first half of those writes and the second; the index of the last write before that time."""
    ready_cluster(api, kubelet, raft_cluster(archive, replicas=1), replicas=1)
    history: list[tuple[int, str, bytes | None]] = []
    middle = last_before = 0
    with kubelet.client(kubelet.client_url("demo-0"), timeout=10) as c:
        for i in range(30):
            if i == 15:  # the member stamps entries with this machine's clock
                time.sleep(0.05)
                middle, last_before = time.time_ns() // 1_000_000, history[-1][0]
                time.sleep(0.05)
            value = f"v{i}".encode()
            history.append((c.put(f"k{i % 20}", value).index, f"k{i % 20}", value))
            if i % 7 == 6:
                history.append((c.delete(f"k{i % 5}").index, f"k{i % 5}", None))
        last = history[-1][0]
        wait_for(lambda: (c.status()["archive"]["last_archived_index"] or 0) >= last, 30,
                 f"the archive to reach index {last}")
    return history, middle, last_before


def state_at(history: list[tuple[int, str, bytes | None]], index: int) -> dict[str, bytes]:
    state: dict[str, bytes] = {}
    for at, key, value in history:
        if at <= index:
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
    return state


def restoring(archive: str, restore: dict[str, Any], name: str = "restored") -> dict[str, Any]:
    body = raft_cluster(archive)
    uid = f"{sum(map(ord, name)):08x}-aaaa-bbbb-cccc-1234567890ab"
    body["metadata"].update(name=name, uid=uid)
    body["spec"]["archive"]["url"] = f"{archive}-{name}"  # its own archive, elsewhere
    body["spec"]["bootstrap"] = {"restore": {"url": archive, **restore}}
    return body


def test_a_point_in_time_restore_runs_the_snapshot_job_then_the_members(world):
    """One of the operator tests' two real Spark runs (the other compacts, below): the Job
    publishes the state at a time of the source's archive, and the members of the new cluster
    restore exactly that."""
    _, api, kubelet, root = world
    (root / "archive").mkdir()
    archive = (root / "archive").as_uri()
    history, middle, target = archived_source(api, kubelet, archive)
    expected = state_at(history, target)
    assert expected != state_at(history, history[-1][0])
    asked = format_ms(middle)

    api.create(restoring(archive, {"time": asked}))
    running = wait_status(api, lambda s: s.get("phase") == "Restoring", "the restore Job to run",
                          30, kubelet, "restored")
    conditions = {c["type"]: (c["status"], c["reason"]) for c in running["conditions"]}
    assert conditions["Restored"] == ("False", "SnapshotJobRunning")
    job = get(api, "Job", "restored-restore")
    assert job["metadata"]["ownerReferences"][0]["name"] == "restored"
    produced = f"{running['clusterId']}-at-{re.sub('[-:]', '', asked).lower()}"
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][-6:] == [
        "--time", asked, "--to-cluster-id", produced, "--result-file", "/dev/termination-log"]
    assert get(api, "StatefulSet", "restored") is None  # no member before the state exists

    status = wait_status(api, lambda s: s.get("phase") == "Ready" and s.get("replicas") == 3,
                         "the restored cluster Ready with 3 voters", 180, kubelet, "restored")
    assert kubelet.job_pods and all(p.startswith("restored-restore-") for p in kubelet.job_pods)
    assert len(kubelet.job_pods) == 1, "one run of the Job: no retry"
    # The status says what the pipeline reported in its result line (the pod's termination
    # message): the cluster, the index the time resolved to, its term and its time.
    (pod,) = [p for p in api.list("Pod", NS, "") if p["metadata"]["name"] == kubelet.job_pods[0]]
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 0
    result = json.loads(terminated["message"])
    assert (result["cluster_id"], result["index"]) == (produced, target)
    restore = status["restore"]
    assert restore == {"job": "restored-restore", "clusterId": produced, "index": target,
                       "term": result["term"], "time": result["time"]}
    assert restore["term"] >= 1
    assert middle - 5000 < parse_time(restore["time"]) <= middle
    conditions = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert conditions["Restored"] == ("True", "SnapshotJobSucceeded")
    assert_admitted(api, "restored")
    reasons = [reason for _, reason, _ in events(api)]
    assert reasons.index("RestoreJobCreated") < reasons.index("RestoreJobSucceeded")
    created_sts = [i for i, (_, r, m) in enumerate(events(api)) if r == "Created"
                   and m == "StatefulSet restored"]
    assert created_sts and created_sts[0] > reasons.index("RestoreJobSucceeded")
    env = env_of(get(api, "StatefulSet", "restored"))
    assert (env["FLOTILLA_RESTORE_FROM"], env["FLOTILLA_RESTORE_CLUSTER_ID"]) == (
        archive, produced)
    assert not {"FLOTILLA_RESTORE_INDEX", "FLOTILLA_RESTORE_TIME"} & set(env)

    urls = [kubelet.client_url(f"restored-{i}") for i in range(3)]
    with kubelet.client(urls, timeout=10) as c:
        assert sorted(c.list().keys) == sorted(expected)
        for key, value in expected.items():
            assert c.get(key).value == value
        for i in range(3):  # every member restored the same state
            assert sorted(c.status(urls[i])["config"]["voters"]) == [
                "restored-0", "restored-1", "restored-2"]
        c.put("after", b"restore")


def test_restore_targets_outside_the_archive_start_no_member(world):
    """An index past the archive's end and a time before its start: each Job fails at once
    with the pipeline's exit 4 (before Spark starts), the Restored condition names the range
    the archive can restore, one Warning says so, and no StatefulSet or member exists, nor a
    second run of the Job."""
    _, api, kubelet, root = world
    (root / "archive").mkdir()
    archive = (root / "archive").as_uri()
    history, _, _ = archived_source(api, kubelet, archive)
    last = history[-1][0]
    targets = {"past-end": ({"index": last + 1000}, f"(indexes 1..{last})"),
               "before-start": ({"time": "2001-01-01T00:00:00Z"}, f"(index {last})")}
    for name, (target, _) in targets.items():
        api.create(restoring(archive, target, name))
    for name, (target, names_the_range) in targets.items():
        status = wait_status(api, lambda s: s.get("phase") == "RestoreFailed",
                             f"the restore of {name} to fail", 60, kubelet, name)
        conditions = {c["type"]: c for c in status["conditions"]}
        restored = conditions["Restored"]
        assert (restored["status"], restored["reason"]) == ("False",
                                                            "RestoreTargetOutsideArchive")
        (pod,) = [p for p in api.list("Pod", NS, "") if p["metadata"]["name"].startswith(
            f"{name}-restore-")]
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 4
        line = terminated["message"].strip().splitlines()[-1]
        assert line.startswith("flotilla pipeline: ")
        assert restored["message"].startswith(
            f"spec.bootstrap.restore.{next(iter(target))} is outside what the archive holds: "
            f"{line}; ")
        assert names_the_range in line
        assert conditions["Ready"]["status"] == "False"
        assert conditions["Ready"]["reason"] == "RestoreTargetOutsideArchive"
        assert "delete this RaftCluster and create it again" in conditions["Ready"]["message"]
        job = get(api, "Job", f"{name}-restore")
        assert any(c["type"] == "Failed" and c["reason"] == "PodFailurePolicy"
                   for c in job["status"]["conditions"])
        assert_admitted(api, name)

    time.sleep(2)  # four more rounds: nothing is retried, started or announced again
    for name in targets:
        ours = [(e["type"], e["reason"], e["message"]) for e in api.list("Event", NS, "")
                if (e.get("involvedObject") or {}).get("name") == name]
        warnings = [(reason, message) for kind, reason, message in ours if kind == "Warning"]
        assert [reason for reason, _ in warnings] == ["RestoreJobFailed"], ours
        assert [reason for kind, reason, _ in ours if kind == "Normal"] == ["RestoreJobCreated"]
        assert get(api, "StatefulSet", name) is None
        assert api.list("Pod", NS, f"app.kubernetes.io/instance={name},"
                                   "app.kubernetes.io/name=flotilla") == []
        assert status_of(api, name)["phase"] == "RestoreFailed"
    assert not [p for p in kubelet.started if p != "demo-0"]
    assert sorted(p.rsplit("-", 1)[0] for p in kubelet.job_pods) == [
        "before-start-restore", "past-end-restore"]


# --- scheduled compaction and export: CronJobs and the outcome of their Jobs ---------------------


def scheduled_job(cronjob: dict[str, Any], scheduled: datetime.datetime) -> dict[str, Any]:
    """The Job the CronJob controller makes for a scheduled time: from the jobTemplate, named
    after the scheduled minute, labelled, annotated and owned as the controller does."""
    minutes = int(scheduled.timestamp()) // 60
    template = cronjob["spec"]["jobTemplate"]
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": f"{cronjob['metadata']['name']}-{minutes}", "namespace": NS,
                     "labels": template["metadata"]["labels"],
                     "annotations": {"batch.kubernetes.io/cronjob-scheduled-timestamp":
                                     scheduled.strftime("%Y-%m-%dT%H:%M:%SZ")},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob",
                                          "name": cronjob["metadata"]["name"],
                                          "uid": cronjob["metadata"]["uid"],
                                          "controller": True, "blockOwnerDeletion": True}]},
        "spec": template["spec"],
    }


def cron_run(api, cronjob: dict[str, Any], scheduled: datetime.datetime, code: int,
             message: str) -> str:
    """What the CronJob controller, the Job controller and the kubelet leave behind for one
    scheduled run that has ended: the Job, its pod with the container's exit code and
    termination message, and the CronJob's lastScheduleTime. The Job is created already
    ended, so the stand-in Job controller (which would run the command) leaves it alone; its
    pod is created first, as a Job only ends once its pod has (the operator reads an ended
    Job's pods once: created the other way round, it could find none)."""
    stamp = scheduled.strftime("%Y-%m-%dT%H:%M:%SZ")
    ended = (scheduled + datetime.timedelta(minutes=4)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kind = "Complete" if code == 0 else "Failed"
    job = scheduled_job(cronjob, scheduled)
    job["metadata"]["uid"] = str(uuid.uuid4())  # what the pod's owner reference names
    job["status"] = {"succeeded" if code == 0 else "failed": 1,
                     **({"completionTime": ended} if code == 0 else {}),
                     "conditions": [{"type": kind, "status": "True", "lastTransitionTime": ended,
                                     "reason": "CompletionsReached" if code == 0
                                     else "BackoffLimitExceeded"}]}
    name = job["metadata"]["name"]
    template = cronjob["spec"]["jobTemplate"]["spec"]["template"]
    (container,) = template["spec"]["containers"]
    api.create({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{name}-x7k2p", "namespace": NS,
                     "labels": {**template["metadata"]["labels"],
                                "batch.kubernetes.io/job-name": name},
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                          "uid": job["metadata"]["uid"], "controller": True}]},
        "spec": template["spec"],
        "status": {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [
            {"name": container["name"], "ready": False, "restartCount": 0, "state": {
                "terminated": {"exitCode": code, "message": message, "finishedAt": ended,
                               "reason": "Completed" if code == 0 else "Error"}}}]}})
    api.create(job)
    api.patch("CronJob", NS, cronjob["metadata"]["name"],
              {"status": {"lastScheduleTime": stamp}})
    return name


def reported_run(api, cronjob: dict, when: datetime.datetime, code: int, output: str,
                 outcome: str) -> tuple[str, dict]:
    """A run of `cronjob` scheduled `when` that ends with exit `code` and `output` in its
    termination log; once status.archiveJobs.compaction reports it with `outcome`: the Job's
    name and that entry."""
    name = cron_run(api, cronjob, when, code, output)
    scheduled = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    status = wait_status(api, lambda s: s["archiveJobs"]["compaction"].get("lastScheduleTime")
                         == scheduled and s["archiveJobs"]["compaction"].get("lastOutcome")
                         == outcome, f"the {outcome.lower()} run in status")
    return name, status["archiveJobs"]["compaction"]


def test_scheduled_compaction_and_export_run_as_cronjobs_whose_runs_the_status_reports(world):
    _, api, _, root = world
    (root / "archive").mkdir()
    body = raft_cluster((root / "archive").as_uri())
    body["spec"]["archive"].update(
        compaction={"schedule": "0 3 * * *", "minCompactionLag": "24h",
                    "minCleanableDirtyRatio": 0.5},
        export={"schedule": "@hourly", "destination": (root / "lake").as_uri()})
    api.create(body)

    # 1. Both CronJobs, as rendered: the cluster's archive and id, owned by the RaftCluster.
    wait_for(lambda: get(api, "CronJob", "demo-compact") and get(api, "CronJob", "demo-export"),
             30, "the two CronJobs")
    cluster_id = wait_status(api, lambda s: bool(s.get("clusterId")), "the cluster id")[
        "clusterId"]
    compact = get(api, "CronJob", "demo-compact")
    assert compact["metadata"]["ownerReferences"][0]["name"] == NAME
    assert compact["metadata"]["labels"]["app.kubernetes.io/name"] == "flotilla-compact"
    spec = compact["spec"]
    assert (spec["schedule"], spec["timeZone"], spec["concurrencyPolicy"], spec["suspend"]) == (
        "0 3 * * *", "Etc/UTC", "Forbid", False)
    (container,) = spec["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert [*container["command"], *container["args"]] == [
        "flotilla", "pipeline", "compact", "--archive", (root / "archive").as_uri(),
        "--cluster-id", cluster_id, "--master", "local[2]", "--min-compaction-lag", "24h",
        "--min-cleanable-dirty-ratio", "0.5", "--result-file", "/dev/termination-log"]
    (container,) = get(api, "CronJob", "demo-export")["spec"]["jobTemplate"]["spec"][
        "template"]["spec"]["containers"]
    assert container["args"][-6:] == ["--to", (root / "lake").as_uri(), "--format", "parquet",
                                      "--result-file", "/dev/termination-log"]
    status = wait_status(api, lambda s: set(s.get("archiveJobs") or {}) == {"compaction",
                                                                           "export"},
                         "status.archiveJobs for both")
    assert status["archiveJobs"] == {"compaction": {"cronJob": "demo-compact"},
                                     "export": {"cronJob": "demo-export"}}
    created = [m for _, reason, m in events(api) if reason == "Created"]
    assert "CronJob demo-compact" in created and "CronJob demo-export" in created

    # 2. A new schedule and flag are patched in; the export block removed deletes its CronJob.
    api.patch("RaftCluster", NS, NAME, {"metadata": {"generation": 2}, "spec": {"archive": {
        "compaction": {"schedule": "30 4 * * mon-fri", "deleteRetention": "168h"},
        "export": None}}})
    wait_for(lambda: get(api, "CronJob", "demo-compact")["spec"]["schedule"]
             == "30 4 * * mon-fri", 30, "the new schedule")
    (container,) = get(api, "CronJob", "demo-compact")["spec"]["jobTemplate"]["spec"][
        "template"]["spec"]["containers"]
    assert container["args"][-6:] == ["--delete-retention", "168h", "--min-cleanable-dirty-ratio",
                                      "0.5", "--result-file", "/dev/termination-log"]
    wait_for(lambda: get(api, "CronJob", "demo-export") is None, 30, "demo-export to go")
    wait_status(api, lambda s: set(s.get("archiveJobs") or {}) == {"compaction"},
                "the export entry to leave status")
    assert ("Normal", "Deleted", "CronJob demo-export: spec.archive.export was removed") in \
        events(api)

    # 3. A run that succeeded: its result line in status, one Normal event.
    compact = get(api, "CronJob", "demo-compact")
    result = {"cleaned_through": 900, "entries_before": 1000, "entries_after": 240,
              "bytes_before": 81000, "bytes_after": 19500}
    first, entry = reported_run(api, compact, datetime.datetime(2026, 3, 2, 4, 30, tzinfo=UTC),
                                0, json.dumps(result) + "\n", "Succeeded")
    assert entry == {
        "cronJob": "demo-compact", "lastScheduleTime": "2026-03-02T04:30:00Z",
        "lastJob": first, "lastOutcome": "Succeeded",
        "lastCompletionTime": "2026-03-02T04:34:00Z", "exitCode": 0, "result": result}
    assert_admitted(api)
    succeeded = [(kind, m) for kind, reason, m in events(api) if reason == "CompactionSucceeded"]
    assert succeeded == [("Normal", f"Job {first} succeeded: {json.dumps(result)}")]

    # 4. The next run fails: Failed with the pipeline's reason, one Warning.
    reason = "flotilla pipeline: the archive holds no cluster 'x'"
    second, entry = reported_run(api, compact, datetime.datetime(2026, 3, 3, 4, 30, tzinfo=UTC),
                                 1, f"some Spark output\n{reason}\n", "Failed")
    assert entry == {
        "cronJob": "demo-compact", "lastScheduleTime": "2026-03-03T04:30:00Z",
        "lastJob": second, "lastOutcome": "Failed",
        "lastCompletionTime": "2026-03-03T04:34:00Z", "exitCode": 1, "message": reason}
    assert_admitted(api)
    time.sleep(1.5)  # three more rounds: each outcome is announced once
    ours = [(kind, r, m) for kind, r, m in events(api) if r.startswith("Compaction")]
    assert [(kind, r) for kind, r, _ in ours] == [("Normal", "CompactionSucceeded"),
                                                  ("Warning", "CompactionFailed")]
    assert ours[1][2].startswith(f"Job {second} failed (exit 1): {reason}; CronJob "
                                 "demo-compact runs again at its next scheduled time")


def archived_writes(kubelet, count: int, delete: str | None = None) -> int:
    """`count` puts to ten keys k0..k9 (v0, v1, ...), then a delete of `delete`, all in the
    archive: the last index."""
    with kubelet.client(kubelet.client_url("demo-0"), timeout=10) as c:
        last = 0
        for i in range(count):
            last = c.put(f"k{i % 10}", f"v{i}".encode()).index
        if delete is not None:
            last = c.delete(delete).index
        wait_for(lambda: (c.status()["archive"]["last_archived_index"] or 0) >= last, 30,
                 f"the archive to reach index {last}")
    return last


def run_scheduled(api, kubelet, cronjob: str, kind: str) -> tuple[str, dict]:
    """Create the Job the CronJob controller would, wait for the run to end and check it
    succeeded, as status.archiveJobs[kind] reports it: the Job's name and the status."""
    template = wait_for(lambda: get(api, "CronJob", cronjob), 10, "the CronJob")
    name = api.create(scheduled_job(template, datetime.datetime.now(datetime.UTC)))[
        "metadata"]["name"]
    status = wait_status(api, lambda s: (s.get("archiveJobs") or {}).get(kind, {}).get(
        "lastOutcome") in ("Succeeded", "Failed"), f"the {kind} run to end", 240, kubelet)
    entry = status["archiveJobs"][kind]
    assert (entry["lastJob"], entry["lastOutcome"], entry["exitCode"]) == (
        name, "Succeeded", 0), entry
    return name, status


def test_a_scheduled_compaction_run_reports_the_pipelines_own_result(world):
    """The rendered command run for real: the stand-in Job controller runs the Job the CronJob
    controller would make as a `flotilla pipeline compact` process (Spark, local mode) on the
    cluster's archive, and status.archiveJobs carries the result line the pipeline wrote to
    its termination-log file."""
    _, api, kubelet, root = world
    (root / "archive").mkdir()
    body = raft_cluster((root / "archive").as_uri(), replicas=1)
    body["spec"]["archive"]["compaction"] = {"schedule": "@daily", "minCompactionLag": "0s"}
    ready_cluster(api, kubelet, body, replicas=1)
    archived_writes(kubelet, 120)  # ten keys overwritten again and again: much to compact
    name, status = run_scheduled(api, kubelet, "demo-compact", "compaction")
    result = status["archiveJobs"]["compaction"]["result"]
    assert result["cluster_id"] == status["clusterId"]
    assert 0 < result["entries_after"] < result["entries_before"], result
    assert result["cleaned_through"] > 0
    (pod,) = kubelet.job_pods  # one run, no retry
    assert pod.startswith(f"{name}-")
    assert_admitted(api)
    announced = [(kind, m) for kind, reason, m in events(api) if reason == "CompactionSucceeded"]
    assert len(announced) == 1 and announced[0][0] == "Normal"
    with kubelet.client(kubelet.client_url("demo-0"), timeout=10) as c:  # the cluster is untouched
        assert c.get("k9").value == b"v119"


def test_a_scheduled_export_run_writes_the_change_log_and_reports_its_result(world):
    """The export CronJob's command run for real, as the compaction one above: the Job runs
    `flotilla pipeline export` on the cluster's archive into a Parquet destination, and
    status.archiveJobs carries the pipeline's own result line."""
    import pyarrow.dataset as ds

    _, api, kubelet, root = world
    (root / "archive").mkdir()
    body = raft_cluster((root / "archive").as_uri(), replicas=1)
    destination = root / "export"
    body["spec"]["archive"]["export"] = {"schedule": "@hourly",
                                         "destination": destination.as_uri()}
    ready_cluster(api, kubelet, body, replicas=1)
    last = archived_writes(kubelet, 40, delete="k3")
    _, status = run_scheduled(api, kubelet, "demo-export", "export")
    result = status["archiveJobs"]["export"]["result"]
    assert result["cluster_id"] == status["clusterId"] and result["format"] == "parquet"
    assert result["high_water"] >= last and result["changes"] == 41, result
    changes = ds.dataset(destination / "changes", partitioning="hive").to_table().to_pylist()
    final: dict[str, bytes | None] = {}
    for row in sorted(changes, key=lambda r: r["index"]):
        final[row["key"]] = row["after"]
    assert {k: v for k, v in final.items() if v is not None} == {
        f"k{i}": f"v{30 + i}".encode() for i in range(10) if i != 3}
    announced = [kind for kind, reason, _ in events(api) if reason == "ExportSucceeded"]
    assert announced == ["Normal"]


# --- TLS, the admin token and the NetworkPolicy ---------------------------------------------------


def served_certificate(api, pod: str, ca_pem: bytes) -> x509.Certificate:
    """The certificate `pod` serves on its client port, verified against `ca_pem` and the
    pod's DNS name (as the operator and the peers dial it)."""
    host = f"{pod}.demo-peers.{NS}.svc"
    context = ssl.create_default_context(cadata=ca_pem.decode())
    with socket.create_connection((host, 2379), timeout=5) as raw, \
            context.wrap_socket(raw, server_hostname=host) as tls:
        return x509.load_der_x509_certificate(tls.getpeercert(binary_form=True))


def secret(api, name: str) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in (get(api, "Secret", name)["data"]).items()}


@pytest.mark.parametrize("world", [{"FLOTILLA_OPERATOR_SECRETS_INTERVAL": "1"}],
                         indirect=True)
def test_members_run_tls_with_the_operators_certificates_which_it_renews(world):
    """By default: a CA and one certificate Secret per member made before the pods, TLS
    flags and https URLs in the StatefulSet, the member's own files through the init
    container, a generated admin token, a NetworkPolicy. Then a certificate near expiry is
    renewed, and the member restarts onto it."""
    _, api, kubelet, root = world
    (root / "archive").mkdir()
    ready_cluster(api, kubelet, raft_cluster((root / "archive").as_uri(), replicas=1), 1)

    # The Secrets, owned by the RaftCluster.
    for name in ("demo-ca", "demo-0-tls", "demo-admin-token"):
        assert get(api, "Secret", name)["metadata"]["ownerReferences"][0]["name"] == NAME
    token = secret(api, "demo-admin-token")["token"]
    assert re.fullmatch(rb"[0-9a-f]{64}", token)  # 32 random bytes, never a leading "-"
    ca = secret(api, "demo-ca")["tls.crt"]
    member = secret(api, "demo-0-tls")
    assert member["ca.crt"] == ca
    # The StatefulSet: https everywhere, the node's files from its own Secret only.
    sts = get(api, "StatefulSet")
    env = env_of(sts)
    assert env["FLOTILLA_ADVERTISE_PEER"] == "https://$(FLOTILLA_NAME).demo-peers.default.svc:2380"
    assert env["FLOTILLA_ADVERTISE_CLIENT"] == (
        "https://$(FLOTILLA_NAME).demo-peers.default.svc:2379")
    assert get(api, "ConfigMap", "demo-bootstrap")["data"]["initial-cluster"] == ""  # served
    assert env["FLOTILLA_ADMIN_TOKEN"] == {"secretKeyRef": {"name": "demo-admin-token",
                                                            "key": "token"}}
    for flag in ("CERT_FILE", "PEER_CERT_FILE", "TRUSTED_CA_FILE", "PEER_TRUSTED_CA_FILE"):
        assert env[f"FLOTILLA_{flag}"].startswith("/var/run/flotilla/tls/")
    pod = sts["spec"]["template"]["spec"]
    assert pod["initContainers"][0]["command"][0] == "install"
    assert {m["name"] for m in pod["containers"][0]["volumeMounts"]} == {"data", "tls"}
    # The member serves the certificate of its Secret, which names it; a plain client and a
    # tokenless admin call get nowhere.
    served = served_certificate(api, "demo-0", ca)
    assert served.serial_number == certs.read(member["tls.crt"]).serial
    assert "demo-0" in certs.read(member["tls.crt"]).names
    with pytest.raises(FlotillaError), Client(
            "http://demo-0.demo-peers.default.svc:2379", timeout=2, retries=0) as plain:
        plain.put("k", b"v")
    with kubelet.client(kubelet.client_url("demo-0"), timeout=5) as c:
        c.put("before", b"renewal")
        with pytest.raises(FlotillaError), Client(
                kubelet.client_url("demo-0"), timeout=2, retries=0,
                ssl_context=ssl.create_default_context(cadata=ca.decode())) as tokenless:
            tokenless.snapshot()
    # The NetworkPolicy: peers from the cluster's own pods only; clients from the namespace
    # and the operator's pods.
    policy = wait_for(lambda: get(api, "NetworkPolicy"), 10, "the NetworkPolicy")
    own = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "flotilla",
                                           "app.kubernetes.io/instance": NAME}}}
    assert policy["spec"]["podSelector"] == own["podSelector"]
    peers, clients = policy["spec"]["ingress"]
    assert peers["from"] == [own] and {p["port"] for p in peers["ports"]} == {2379, 2380}
    assert {p["port"] for p in clients["ports"]} == {2379}
    assert clients["from"] == [{"podSelector": {}}, {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": OPERATOR_NS}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "flotilla-operator"}}}]
    status = status_of(api)
    assert (status["tls"]["enabled"], status["tls"]["issuer"]) == (True, "operator")
    assert_admitted(api)

    # A certificate with a minute left (signed by the cluster's CA): renewed, and the member
    # restarts onto the renewed one.
    seen = len(events(api))
    authority = Issued(ca, secret(api, "demo-ca")["tls.key"])
    short = issue(authority, "demo-0", ClusterSpec.from_body(get(api, "RaftCluster"))
                  .member_dns_names("demo-0")[1:], days=60 / 86400)
    api.patch("Secret", NS, "demo-0-tls", {"data": {
        "tls.crt": base64.b64encode(short.cert_pem).decode(),
        "tls.key": base64.b64encode(short.key_pem).decode()}})

    def renewed_and_served() -> bool:
        current = certs.read(secret(api, "demo-0-tls")["tls.crt"])
        if current.serial == short.certificate.serial_number:
            return False
        try:
            return served_certificate(api, "demo-0", ca).serial_number == current.serial
        except OSError:
            return False

    wait_for(renewed_and_served, 60, "the renewed certificate to be served")
    renewed = certs.read(secret(api, "demo-0-tls")["tls.crt"])
    assert renewed.not_after - datetime.datetime.now(UTC) > datetime.timedelta(days=364)
    status = wait_status(api, lambda s: s.get("phase") == "Ready" and any(
        c["secret"] == "demo-0-tls" and c["notAfter"] == renewed.not_after.strftime(
            "%Y-%m-%dT%H:%M:%SZ") for c in s["tls"]["certificates"]),
        "the renewed certificate's expiry in status", 30, kubelet)
    later = events(api)[seen:]
    assert any(r == "CertificateRenewed" and "demo-0-tls" in m for _, r, m in later), later
    assert any(r == "MemberRestarted" and "certificate" in m for _, r, m in later), later
    assert_admitted(api)
    with kubelet.client(kubelet.client_url("demo-0"), timeout=10) as c:
        assert c.get("before").value == b"renewal"


def test_with_an_issuer_members_wait_for_cert_manager_then_run_on_its_certificates(world):
    """spec.tls.issuerRef: the operator renders a cert-manager Certificate per member and
    starts no pod until its Secret exists; this test plays cert-manager."""
    _, api, kubelet, root = world
    body = raft_cluster((root / "archive").as_uri(), replicas=1)
    (root / "archive").mkdir()
    body["spec"]["tls"] = {"issuerRef": {"name": "platform", "kind": "ClusterIssuer"}}
    api.create(body)
    certificate = wait_for(lambda: get(api, "Certificate", "demo-0-tls"), 30,
                           "the Certificate of demo-0")
    spec = certificate["spec"]
    assert spec["secretName"] == "demo-0-tls" and spec["commonName"] == "demo-0"
    assert "demo-0.demo-peers.default.svc" in spec["dnsNames"]
    assert spec["issuerRef"] == {"name": "platform", "kind": "ClusterIssuer",
                                 "group": "cert-manager.io"}
    assert (spec["duration"], spec["renewBefore"]) == ("8760h", "2920h")
    assert certificate["metadata"]["ownerReferences"][0]["name"] == NAME
    waiting = wait_status(api, lambda s: "waiting for the certificate Secrets of demo-0"
                          in s.get("lastAction", ""), "the wait for cert-manager", 30)
    assert waiting["tls"]["issuer"] == "cert-manager/ClusterIssuer/platform"
    assert int((get(api, "StatefulSet") or {}).get("spec", {}).get("replicas") or 0) == 0
    assert get(api, "Secret", "demo-ca") is None
    assert not kubelet.started

    # cert-manager issues: the Secret it writes, with the issuer's CA in ca.crt.
    issuer = make_ca("platform issuer")
    issued = issue(issuer, spec["commonName"], [*spec["dnsNames"], *spec.get("ipAddresses", [])])
    api.create({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": "demo-0-tls", "namespace": NS},
                "data": {"tls.crt": base64.b64encode(issued.cert_pem).decode(),
                         "tls.key": base64.b64encode(issued.key_pem).decode(),
                         "ca.crt": base64.b64encode(issuer.cert_pem).decode()}})
    wait_status(api, lambda s: s.get("phase") == "Ready" and s.get("replicas") == 1,
                "the cluster Ready on cert-manager's certificate", 60, kubelet)
    assert served_certificate(api, "demo-0", issuer.cert_pem).serial_number == \
        issued.certificate.serial_number
    with kubelet.client(kubelet.client_url("demo-0"), timeout=10) as c:
        c.put("signed-by", b"cert-manager")
    assert_admitted(api)


def test_a_cluster_with_a_signing_key_archives_signed_manifests(world):
    """spec.archive.signingKeySecret reaches the members as a file: the manifests they write
    carry a MAC by that key."""
    from flotilla.node.archive import ManifestKeys

    _, api, kubelet, root = world
    (root / "archive").mkdir()
    secret = b"orders-archive-signing-key-0123456789"
    api.create({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "archive-key", "namespace": NS},
                "data": {"signing-key": base64.b64encode(secret).decode()}})
    body = raft_cluster((root / "archive").as_uri(), replicas=1)
    body["spec"]["archive"]["signingKeySecret"] = {"name": "archive-key"}
    ready_cluster(api, kubelet, body, replicas=1)
    with kubelet.client([kubelet.client_url("demo-0")], timeout=10) as c:
        c.put("signed", b"yes")
        wait_for(lambda: sorted((root / "archive").rglob("manifests/*.json")), 30,
                 "a manifest in the archive")
    key_file = root / "signing.key"
    key_file.write_bytes(secret)
    (key_id,) = ManifestKeys.parse(str(key_file)).key_ids
    for path in sorted((root / "archive").rglob("manifests/*.json")):
        manifest = json.loads(path.read_text())
        assert manifest["mac"]["alg"] == "HMAC-SHA256", path
        assert manifest["mac"]["key_id"] == key_id, path
        ManifestKeys.parse(str(key_file)).verify(manifest, str(path))
