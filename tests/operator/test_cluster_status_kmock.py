"""Reconcile rounds run in this process against kmock's Kubernetes API, a server of each test's
own, with pods, claims and StorageClasses written as the controllers and the kubelet
would leave them (no member process: those tests live in test_kopf_kmock.py).

The story: spec.pod reaches the StatefulSet, and a change of it too; an invalid option is
refused, nothing is made, and the cluster is Stalled. A new cluster is Pending while its pods
do not run, saying why for each. spec.storage.size grows every member's claim where the
StorageClass allows it (the StatefulSet's claim template stays), and says why not where it
does not, or where the size would shrink. A RaftCluster being deleted is Deleting. Through it
all the conditions follow kstatus: Reconciling, Stalled, observedGeneration, and
lastTransitionTime moving only when a condition's status does.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from flotilla.operator.kube import Kube
from flotilla.operator.members import MEMBER_URLS_ENV
from flotilla.operator.reconcile import Outcome, finalize, reconcile

OLD = "2020-01-01T00:00:00Z"
NS = "orders"


@pytest.fixture
def ns() -> str:
    return NS


@pytest.fixture(autouse=True)
def unreachable_members(tmp_path: Path, monkeypatch) -> None:
    """Members (pods made Running here) are dialled at a closed loopback port: they answer
    nothing, at once, rather than through a cluster DNS name this host cannot resolve."""
    urls = {f"{NS}/demo-{i}": {"client": "http://127.0.0.1:1", "peer": "http://127.0.0.1:1"}
            for i in range(5)}
    path = tmp_path / "member-urls.json"
    path.write_text(json.dumps(urls))
    monkeypatch.setenv(MEMBER_URLS_ENV, str(path))


def create(api: Kube, ns: str, **spec: Any) -> dict[str, Any]:
    body = {"apiVersion": "flotilla.dev/v1alpha1", "kind": "RaftCluster",
            "metadata": {"name": "demo", "namespace": ns, "uid": f"uid-{ns}", "generation": 1,
                         "resourceVersion": "1"},
            "spec": {"tls": {"enabled": False}, **spec}}
    return api.create(body)


def change(api: Kube, ns: str, spec: dict[str, Any]) -> None:
    """A spec change as the API server makes it: a new generation."""
    generation = api.get("RaftCluster", ns, "demo")["metadata"]["generation"] + 1
    api.patch("RaftCluster", ns, "demo", {"spec": spec, "metadata": {"generation": generation}})


def round_(api: Kube, ns: str) -> Outcome:
    """One round on the stored object, its status written back as the daemon writes it."""
    outcome = reconcile(api, api.get("RaftCluster", ns, "demo"), default_image="flotilla:test")
    api.patch("RaftCluster", ns, "demo", {"status": outcome.status}, "status")
    return outcome


def status(api: Kube, ns: str) -> dict[str, Any]:
    return api.get("RaftCluster", ns, "demo")["status"]


def conditions(api: Kube, ns: str) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status(api, ns)["conditions"]}


def summary(api: Kube, ns: str, *kinds: str) -> dict[str, tuple[str, str]]:
    found = conditions(api, ns)
    return {k: (found[k]["status"], found[k]["reason"]) for k in kinds}


def pod(api: Kube, ns: str, name: str, phase: str, **status: Any) -> None:
    """A member pod as the StatefulSet controller and the kubelet leave it."""
    sts = api.get("StatefulSet", ns, "demo")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "status": {"phase": phase, **status}}
    if api.get("Pod", ns, name) is None:
        api.create(body)
    else:
        api.patch("Pod", ns, name, {"status": body["status"]})


def claims(api: Kube, ns: str, capacity: str | None = None) -> None:
    """The claims data-demo-0..2, made from the StatefulSet's template and bound."""
    template = api.get("StatefulSet", ns, "demo")["spec"]["volumeClaimTemplates"][0]
    for i in range(3):
        claim = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                 "metadata": {"name": f"data-demo-{i}", "namespace": ns,
                              "labels": template["metadata"]["labels"]},
                 "spec": copy.deepcopy(template["spec"]), "status": {"phase": "Bound"}}
        if capacity is not None:
            claim["status"]["capacity"] = {"storage": capacity}
        api.create(claim)


def requested(api: Kube, ns: str) -> list[str]:
    return [api.get("PersistentVolumeClaim", ns, f"data-demo-{i}")["spec"]["resources"][
        "requests"]["storage"] for i in range(3)]


def storage_class(api: Kube, name: str, expandable: bool | None) -> None:
    if api.get("StorageClass", "", name) is not None:
        return
    body: dict[str, Any] = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                            "metadata": {"name": name}, "provisioner": "ebs.csi.aws.com"}
    if expandable is not None:
        body["allowVolumeExpansion"] = expandable
    api.create(body)


def reasons(outcome: Outcome) -> list[tuple[str, str]]:
    return [e[:2] for e in outcome.events]


# --- spec.pod --------------------------------------------------------------------------------


def test_pod_options_reach_the_statefulset_and_follow_the_spec(kmock_api, ns):
    api = kmock_api
    create(api, ns, pod={
        "metadata": {"labels": {"team": "orders"}, "annotations": {"example.com/scan": "no"}},
        "imagePullSecrets": [{"name": "regcred"}], "serviceAccountName": "orders-archive",
        "priorityClassName": "raft-critical", "nodeSelector": {"pool": "raft"},
        "tolerations": [{"key": "dedicated", "value": "raft", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "disk", "operator": "In", "values": ["ssd"]}]}]}}}})
    round_(api, ns)
    template = api.get("StatefulSet", ns, "demo")["spec"]["template"]
    pod_spec = template["spec"]
    assert template["metadata"]["labels"]["team"] == "orders"
    assert template["metadata"]["labels"]["app.kubernetes.io/instance"] == "demo"
    assert template["metadata"]["annotations"] == {"example.com/scan": "no"}
    assert pod_spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod_spec["serviceAccountName"] == "orders-archive"
    assert pod_spec["priorityClassName"] == "raft-critical"
    assert pod_spec["nodeSelector"] == {"pool": "raft"}
    assert pod_spec["tolerations"] == [{"key": "dedicated", "value": "raft",
                                        "effect": "NoSchedule"}]
    assert pod_spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert [c["topologyKey"] for c in pod_spec["topologySpreadConstraints"]] == [
        "topology.kubernetes.io/zone", "kubernetes.io/hostname"]

    change(api, ns, {"pod": {"nodeSelector": {"pool": "raft-2"},
                             "topologySpreadConstraints": [
                                 {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                  "whenUnsatisfiable": "DoNotSchedule"}]}})
    round_(api, ns)
    pod_spec = api.get("StatefulSet", ns, "demo")["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"pool": "raft-2"}
    assert pod_spec["topologySpreadConstraints"] == [
        {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
         "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {
             "app.kubernetes.io/name": "flotilla", "app.kubernetes.io/instance": "demo"}}}]
    assert status(api, ns)["observedGeneration"] == 2


def test_an_invalid_pod_option_is_refused_nothing_is_made_and_the_cluster_is_stalled(
        kmock_api, ns):
    api = kmock_api
    create(api, ns, pod={"tolerations": [{"key": "dedicated", "operator": "Exists",
                                          "value": "raft"}]})
    outcome = round_(api, ns)
    message = "spec.pod.tolerations[0]: operator Exists takes no value"
    assert reasons(outcome) == [("Warning", "InvalidSpec")] and message in outcome.events[0][2]
    assert api.get("StatefulSet", ns, "demo") is None
    assert status(api, ns)["phase"] == "Invalid"
    assert summary(api, ns, "Ready", "Reconciling", "Stalled") == {
        "Ready": ("False", "InvalidSpec"), "Reconciling": ("False", "Stalled"),
        "Stalled": ("True", "InvalidSpec")}
    assert message in conditions(api, ns)["Stalled"]["message"]


# --- phases and conditions ---------------------------------------------------------------------


def test_a_new_cluster_is_pending_while_its_pods_do_not_run_saying_why(kmock_api, ns):
    api = kmock_api
    create(api, ns)
    round_(api, ns)
    assert status(api, ns)["phase"] == "Pending"
    assert "demo-0 has no pod yet" in conditions(api, ns)["Ready"]["message"]
    unschedulable = "0/3 nodes are available: 3 Insufficient memory."
    pod(api, ns, "demo-0", "Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": unschedulable}])
    pod(api, ns, "demo-1", "Pending", containerStatuses=[
        {"name": "node", "state": {"waiting": {"reason": "ImagePullBackOff",
                                               "message": 'Back-off pulling image "flotilla"'}}}])
    pod(api, ns, "demo-2", "Running")
    round_(api, ns)
    ready = conditions(api, ns)["Ready"]
    assert status(api, ns)["phase"] == "Pending"
    assert (ready["status"], ready["reason"]) == ("False", "PodsPending")
    assert f"demo-0 is not scheduled: {unschedulable}" in ready["message"]
    assert "demo-1 waits in container node: ImagePullBackOff: Back-off pulling" in \
        ready["message"]
    assert "demo-2" not in ready["message"]
    assert summary(api, ns, "Reconciling", "Stalled") == {
        "Reconciling": ("True", "Pending"), "Stalled": ("False", "Progressing")}
    # a quorum runs: the members elect (none answers here), no longer Pending
    pod(api, ns, "demo-0", "Running")
    round_(api, ns)
    assert status(api, ns)["phase"] == "Bootstrapping"
    assert summary(api, ns, "Reconciling") == {"Reconciling": ("True", "Bootstrapping")}


def test_conditions_carry_the_generation_and_move_only_when_their_status_does(kmock_api, ns):
    api = kmock_api
    create(api, ns)
    round_(api, ns)
    # as if written long ago
    aged = [{**c, "lastTransitionTime": OLD} for c in status(api, ns)["conditions"]]
    api.patch("RaftCluster", ns, "demo", {"status": {"conditions": aged}}, "status")
    round_(api, ns)
    assert {c["lastTransitionTime"] for c in status(api, ns)["conditions"]} == {OLD}

    change(api, ns, {"replicas": 0})  # generation 2, invalid
    round_(api, ns)
    found = conditions(api, ns)
    assert {c["observedGeneration"] for c in found.values()} == {2}
    assert status(api, ns)["observedGeneration"] == 2
    assert (found["Stalled"]["status"], found["Reconciling"]["status"]) == ("True", "False")
    assert found["Stalled"]["lastTransitionTime"] != OLD
    assert found["Reconciling"]["lastTransitionTime"] != OLD
    assert found["Ready"]["lastTransitionTime"] == OLD  # False before and after
    assert "spec.replicas (0) must be at least 1" in found["Stalled"]["message"]

    change(api, ns, {"replicas": 3})  # fixed
    round_(api, ns)
    assert summary(api, ns, "Reconciling", "Stalled") == {
        "Reconciling": ("True", "Pending"), "Stalled": ("False", "Progressing")}
    assert {c["observedGeneration"] for c in conditions(api, ns).values()} == {3}


def test_a_cluster_being_deleted_is_deleting_and_takes_no_step(kmock_api, ns):
    api = kmock_api
    create(api, ns)
    round_(api, ns)
    api.delete("StatefulSet", ns, "demo")
    body = api.get("RaftCluster", ns, "demo")
    body["metadata"]["deletionTimestamp"] = "2026-11-26T12:00:00Z"
    outcome = reconcile(api, body, default_image="flotilla:test")
    assert outcome.status["phase"] == "Deleting" and outcome.events == []
    assert api.get("StatefulSet", ns, "demo") is None  # nothing made again
    # the finalizer says so in the stored status, whatever the daemon did
    assert finalize(api, body, default_image="flotilla:test").startswith("no final snapshot")
    assert status(api, ns)["phase"] == "Deleting"
    assert summary(api, ns, "Ready", "Reconciling", "Stalled") == {
        "Ready": ("False", "Deleting"), "Reconciling": ("True", "Deleting"),
        "Stalled": ("False", "Deleting")}


# --- growing the volumes -----------------------------------------------------------------------


def test_a_larger_size_grows_every_member_claim_and_leaves_the_template(kmock_api, ns):
    api = kmock_api
    storage_class(api, "expandable", True)
    create(api, ns, storage={"size": "1Gi", "storageClassName": "expandable"})
    round_(api, ns)
    claims(api, ns, capacity="1Gi")
    round_(api, ns)
    assert summary(api, ns, "VolumesResized") == {"VolumesResized": ("True", "Resized")}

    change(api, ns, {"storage": {"size": "2Gi", "storageClassName": "expandable"}})
    outcome = round_(api, ns)
    assert requested(api, ns) == ["2Gi"] * 3
    assert ("Normal", "VolumesResizing") in reasons(outcome)
    assert "data-demo-0 1Gi -> 2Gi" in dict((e[1], e[2]) for e in outcome.events)[
        "VolumesResizing"]
    # the StatefulSet's claim template cannot change: it keeps the size it was made with
    sts = api.get("StatefulSet", ns, "demo")
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"][
        "storage"] == "1Gi"
    assert summary(api, ns, "VolumesResized") == {"VolumesResized": ("False", "Resizing")}

    # the driver grows them in its own time: the claims say how far it is
    api.patch("PersistentVolumeClaim", ns, "data-demo-1", {"status": {"conditions": [
        {"type": "FileSystemResizePending", "status": "True",
         "message": "Waiting for user to (re-)start a pod to finish file system resize"}]}})
    outcome = round_(api, ns)
    assert not [e for e in outcome.events if e[1] == "VolumesResizing"]  # patched once
    message = conditions(api, ns)["VolumesResized"]["message"]
    assert "data-demo-0 has 1Gi of 2Gi" in message
    assert "data-demo-1 has 1Gi of 2Gi (FileSystemResizePending: Waiting for user" in message
    for i in range(3):
        api.patch("PersistentVolumeClaim", ns, f"data-demo-{i}",
                  {"status": {"capacity": {"storage": "2Gi"}, "conditions": []}})
    round_(api, ns)
    assert summary(api, ns, "VolumesResized", "Stalled") == {
        "VolumesResized": ("True", "Resized"), "Stalled": ("False", "Progressing")}

    # a smaller size is refused, never applied
    change(api, ns, {"storage": {"size": "1Gi", "storageClassName": "expandable"}})
    outcome = round_(api, ns)
    assert requested(api, ns) == ["2Gi"] * 3
    assert ("Warning", "ShrinkRefused") in reasons(outcome)
    found = conditions(api, ns)
    assert (found["VolumesResized"]["status"], found["VolumesResized"]["reason"]) == (
        "False", "ShrinkRefused")
    assert "a volume cannot shrink" in found["VolumesResized"]["message"]
    assert "Set spec.storage.size to at least 2Gi" in found["VolumesResized"]["message"]
    assert summary(api, ns, "Stalled", "Reconciling") == {
        "Stalled": ("True", "ShrinkRefused"), "Reconciling": ("False", "Stalled")}


def test_a_claim_made_later_at_the_templates_size_is_grown_too(kmock_api, ns):
    api = kmock_api
    storage_class(api, "expandable", True)
    create(api, ns, storage={"size": "1Gi", "storageClassName": "expandable"})
    round_(api, ns)
    claims(api, ns)
    change(api, ns, {"storage": {"size": "3Gi", "storageClassName": "expandable"}})
    round_(api, ns)
    # a fourth pod, as a scale-up makes it: its claim comes from the (unchanged) template
    api.patch("StatefulSet", ns, "demo", {"spec": {"replicas": 4}})
    template = api.get("StatefulSet", ns, "demo")["spec"]["volumeClaimTemplates"][0]
    api.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data-demo-3", "namespace": ns,
                             "labels": template["metadata"]["labels"]},
                "spec": copy.deepcopy(template["spec"]), "status": {"phase": "Bound"}})
    assert template["spec"]["resources"]["requests"]["storage"] == "1Gi"
    outcome = round_(api, ns)
    assert api.get("PersistentVolumeClaim", ns, "data-demo-3")["spec"]["resources"][
        "requests"]["storage"] == "3Gi"
    assert [e[2] for e in outcome.events if e[1] == "VolumesResizing"] == [
        "spec.storage.size is 3Gi: data-demo-3 1Gi -> 3Gi"]


@pytest.mark.parametrize(("storage_class_name", "expandable", "reason", "words"), [
    ("fixed", False, "ExpansionNotAllowed", "StorageClass fixed does not allow volume "
                                            "expansion"),
    ("unsaid", None, "ExpansionNotAllowed", "StorageClass unsaid does not allow"),
    ("gone", "missing", "StorageClassMissing", "StorageClass gone of data-demo-0"),
    ("", "missing", "ExpansionNotAllowed", "no StorageClass provisions data-demo-0"),
])
def test_a_class_that_cannot_grow_volumes_is_said_and_nothing_is_patched(
        kmock_api, ns, storage_class_name, expandable, reason, words):
    api = kmock_api
    if expandable != "missing":
        storage_class(api, storage_class_name, expandable)
    create(api, ns, storage={"size": "1Gi", "storageClassName": storage_class_name})
    round_(api, ns)
    claims(api, ns, capacity="1Gi")
    change(api, ns, {"storage": {"size": "5Gi", "storageClassName": storage_class_name}})
    outcome = round_(api, ns)
    assert requested(api, ns) == ["1Gi"] * 3
    assert ("Warning", reason) in reasons(outcome)
    found = conditions(api, ns)["VolumesResized"]
    assert (found["status"], found["reason"]) == ("False", reason)
    assert words in found["message"] and "set spec.storage.size back to 1Gi" in found["message"]
    assert summary(api, ns, "Stalled") == {"Stalled": ("True", reason)}
    # set back: nothing left to do
    change(api, ns, {"storage": {"size": "1Gi", "storageClassName": storage_class_name}})
    round_(api, ns)
    assert summary(api, ns, "VolumesResized", "Stalled") == {
        "VolumesResized": ("True", "Resized"), "Stalled": ("False", "Progressing")}


def test_an_object_the_api_server_refuses_holds_the_cluster_with_its_message():
    """What the operator's checks let through and the API server refuses (here a StatefulSet
    refused as a stricter admission webhook would refuse it) is said, not retried blindly."""
    import kmock

    from tests.operator.kubelet import Kmock

    server = Kmock().start()
    try:
        refusal = ('StatefulSet.apps "demo" is invalid: spec.template.spec.priorityClassName: '
                   'Forbidden: no PriorityClass with name raft-critical was found')
        server.emulator[f"post /apis/apps/v1/namespaces/{NS}/statefulsets"] << kmock.Response(
            status=422, payload={"kind": "Status", "message": refusal})
        api = server.api()
        create(api, NS, pod={"priorityClassName": "raft-critical"})
        outcome = round_(api, NS)
        assert ("Warning", "Rejected") in reasons(outcome)
        assert status(api, NS)["phase"] == "Invalid"
        stalled = conditions(api, NS)["Stalled"]
        assert (stalled["status"], stalled["reason"]) == ("True", "Rejected")
        assert refusal in stalled["message"] and "StatefulSet demo" in stalled["message"]
    finally:
        server.stop()
