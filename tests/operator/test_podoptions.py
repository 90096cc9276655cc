"""spec.pod: every member pod option read, checked as the API server would check it, and
rendered into the StatefulSet's pod template (and, for placement, into the pipeline Jobs'
pods); by default members spread over zones and nodes as a preference."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest
from flotilla.operator import render
from flotilla.operator.podoptions import RESERVED_LABELS, PodOptions
from flotilla.operator.spec import ClusterSpec, SpecError

K8S_VERSION = "1.30"
MEMBERS = {"app.kubernetes.io/name": "flotilla", "app.kubernetes.io/instance": "demo"}
ANTI_AFFINITY = {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
    "topologyKey": "kubernetes.io/hostname",
    "labelSelector": {"matchExpressions": [
        {"key": "app.kubernetes.io/instance", "operator": "In", "values": ["demo"]}]}}]}}
NODE_AFFINITY = {"nodeAffinity": {
    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "node.example.com/generation", "operator": "Gt",
                               "values": ["3"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-7"]}]}]},
    "preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "preference": {"matchExpressions": [
            {"key": "disk", "operator": "In", "values": ["nvme", "ssd"]}]}}]}}
POD: dict[str, Any] = {
    "metadata": {"labels": {"team": "orders", "example.com/tier": "data"},
                 "annotations": {"sidecar.istio.io/inject": "false",
                                 "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}},
    "imagePullSecrets": [{"name": "regcred"}, {"name": "mirror.creds"}],
    "serviceAccountName": "orders-archive",
    "priorityClassName": "raft-critical",
    "nodeSelector": {"kubernetes.io/arch": "arm64", "pool": "raft"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "raft",
                     "effect": "NoSchedule"},
                    {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 120}],
    "affinity": {**NODE_AFFINITY, **ANTI_AFFINITY},
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
         "whenUnsatisfiable": "DoNotSchedule", "minDomains": 3,
         "nodeTaintsPolicy": "Honor", "matchLabelKeys": ["controller-revision-hash"]}],
}


def body(pod: Any = None, **spec: Any) -> dict[str, Any]:
    if pod is not None:
        spec["pod"] = pod
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "RaftCluster",
            "metadata": {"name": "demo", "namespace": "prod", "uid": "u-1", "generation": 2},
            "spec": {"archive": {"url": "s3://archive/demo",
                                 "compaction": {"schedule": "@daily"}}, **spec}}


def member_pod(spec: ClusterSpec) -> dict[str, Any]:
    return render.statefulset(spec, ["demo-0", "demo-1", "demo-2"], False, 3)["spec"][
        "template"]


def test_every_option_reaches_the_member_pod_template():
    spec = ClusterSpec.from_body(body(POD))
    template = member_pod(spec)
    pod = template["spec"]
    assert template["metadata"]["labels"] == {**POD["metadata"]["labels"], **spec.labels}
    assert template["metadata"]["annotations"] == POD["metadata"]["annotations"]
    assert pod["imagePullSecrets"] == POD["imagePullSecrets"]
    assert pod["serviceAccountName"] == "orders-archive"
    assert pod["priorityClassName"] == "raft-critical"
    assert pod["nodeSelector"] == POD["nodeSelector"]
    assert pod["tolerations"] == POD["tolerations"]
    assert pod["affinity"] == POD["affinity"]
    # a constraint without a labelSelector counts this cluster's members
    assert pod["topologySpreadConstraints"] == [
        {**POD["topologySpreadConstraints"][0], "labelSelector": {"matchLabels": MEMBERS}}]
    # members still mount no API token: a service account is for cloud credentials
    assert pod["automountServiceAccountToken"] is False


def test_the_rendered_objects_pass_the_kubernetes_schema_strictly():
    spec = ClusterSpec.from_body(body(POD, bootstrap={"restore": {"url": "s3://old",
                                                                  "index": 9}}))
    for obj in [*render.owned_objects(spec, ["demo-0", "demo-1", "demo-2"], False, 3),
                render.restore_job(spec), render.archive_cronjob(spec, "compaction")]:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_by_default_members_spread_over_zones_and_nodes_as_a_preference():
    spec = ClusterSpec.from_body(body())
    pod = member_pod(spec)["spec"]
    assert pod["topologySpreadConstraints"] == [
        {"maxSkew": 1, "topologyKey": key, "whenUnsatisfiable": "ScheduleAnyway",
         "labelSelector": {"matchLabels": MEMBERS}}
        for key in ("topology.kubernetes.io/zone", "kubernetes.io/hostname")]
    # the spread selects exactly the cluster's members, as the StatefulSet does
    sts = render.statefulset(spec, ["demo-0"], False, 1)
    assert sts["spec"]["selector"]["matchLabels"] == MEMBERS
    for absent in ("affinity", "nodeSelector", "tolerations", "imagePullSecrets",
                   "serviceAccountName", "priorityClassName"):
        assert absent not in pod
    assert "annotations" not in member_pod(spec)["metadata"]


def test_an_empty_spread_list_spreads_nothing():
    pod = member_pod(ClusterSpec.from_body(body({"topologySpreadConstraints": []})))["spec"]
    assert "topologySpreadConstraints" not in pod


def test_the_pipeline_jobs_run_where_members_may_but_without_the_member_spread():
    spec = ClusterSpec.from_body(body(POD, bootstrap={"restore": {"url": "s3://old",
                                                                  "index": 9}}))
    for template in (render.restore_job(spec)["spec"]["template"],
                     render.archive_cronjob(spec, "compaction")["spec"]["jobTemplate"]["spec"][
                         "template"]):
        pod = template["spec"]
        assert {k: pod.get(k) for k in ("imagePullSecrets", "serviceAccountName",
                                         "priorityClassName", "nodeSelector", "tolerations")} == {
            k: POD[k] for k in ("imagePullSecrets", "serviceAccountName", "priorityClassName",
                                "nodeSelector", "tolerations")}
        assert pod["affinity"] == NODE_AFFINITY
        assert "topologySpreadConstraints" not in pod
        assert template["metadata"]["annotations"] == POD["metadata"]["annotations"]
        assert template["metadata"]["labels"]["team"] == "orders"
        assert template["metadata"]["labels"]["app.kubernetes.io/name"].startswith(
            "flotilla-")  # never a member's


def test_a_changed_option_changes_the_member_template_so_members_roll():
    before = member_pod(ClusterSpec.from_body(body()))
    for change in ({"metadata": {"annotations": {"a": "b"}}}, {"priorityClassName": "high"},
                   {"nodeSelector": {"pool": "b"}}, {"topologySpreadConstraints": []}):
        assert member_pod(ClusterSpec.from_body(body(change))) != before, change


def test_nulls_count_as_absent():
    assert ClusterSpec.from_body(body({"affinity": None, "nodeSelector": None,
                                       "metadata": {"labels": None}})).pod == PodOptions()


# (path under spec.pod, value, words the message must contain)
INVALID = [
    ("", "fast", "spec.pod must be an object"),
    ("nodeSelectors", {"a": "b"}, "spec.pod has nodeSelectors, which is not a field there"),
    ("metadata.labels.team", 7, 'spec.pod.metadata.labels.team must be a string (quote it: "7")'),
    ("metadata.labels", {"-team": "x"}, "spec.pod.metadata.labels key '-team' is not a valid key"),
    ("metadata.labels", {"team": "a b"}, "spec.pod.metadata.labels.team ('a b') is not a valid "
                                         "pod label value"),
    ("metadata.labels", {"team": "x" * 64}, "is not a valid pod label value: at most 63"),
    ("metadata.annotations", {"Example.com/a": "x"}, "key 'Example.com/a' is not a valid key"),
    ("metadata.annotations", {"a": "x" * 300_000}, "at most 262144 (256 KiB) in all"),
    ("metadata.annotations.a", True, 'spec.pod.metadata.annotations.a must be a string'),
    ("imagePullSecrets", "regcred", "spec.pod.imagePullSecrets must be a list"),
    ("imagePullSecrets", ["regcred"], "spec.pod.imagePullSecrets[0] must be {name: SECRET}"),
    ("imagePullSecrets", [{"name": "Reg_Cred"}], "spec.pod.imagePullSecrets[0].name must name "
                                                 "a Secret"),
    ("imagePullSecrets", [{"name": "a"}, {"name": "a"}], "names a Secret twice"),
    ("serviceAccountName", "Orders", "spec.pod.serviceAccountName must name a ServiceAccount"),
    ("priorityClassName", "x" * 254, "spec.pod.priorityClassName must name a PriorityClass"),
    ("nodeSelector.pool", 1, "spec.pod.nodeSelector.pool must be a string"),
    ("tolerations", [{"key": "a", "operator": "Exists", "value": "b"}],
     "spec.pod.tolerations[0]: operator Exists takes no value"),
    ("tolerations", [{"value": "b"}], "spec.pod.tolerations[0] has no key"),
    ("tolerations", [{"key": "a", "operator": "In"}],
     "spec.pod.tolerations[0].operator must be Equal or Exists, not 'In'"),
    ("tolerations", [{"key": "a", "effect": "NoSchedul"}],
     "spec.pod.tolerations[0].effect must be '' or NoSchedule or PreferNoSchedule or NoExecute"),
    ("tolerations", [{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 5}],
     "tolerationSeconds goes with effect NoExecute"),
    ("tolerations", [{"key": "a", "effect": "NoExecute", "tolerationSeconds": "5s"}],
     "tolerationSeconds must be a whole number of seconds"),
    ("tolerations", [{"key": "a", "tolerate": True}], "tolerations[0] has tolerate"),
    ("affinity", {"nodeAfinity": {}}, "spec.pod.affinity has nodeAfinity, which is not a field"),
    ("affinity", {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": []}}}, "nodeSelectorTerms must list at least one term"),
    ("affinity", {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [{"key": "gen", "operator": "Gt",
                                                     "values": ["three"]}]}]}}},
     "Gt takes exactly one value, a whole number"),
    ("affinity", {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.labels", "operator": "In",
                                                "values": ["a"]}]}]}}},
     "must be key metadata.name with exactly one value"),
    ("affinity", {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 101, "preference": {}}]}}, "weight must be a whole number from 1 to 100"),
    ("affinity", {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"a": "b"}}}]}},
     "requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey is required"),
    ("affinity", {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "podAffinityTerm": {"topologyKey": "zone", "labelSelector": {
            "matchExpressions": [{"key": "app", "operator": "Exists", "values": ["x"]}]}}}]}},
     "matchExpressions[0]: Exists takes no values"),
    ("affinity", {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "zone", "labelSelector": {"matchExpressions": [
            {"key": "app", "operator": "Gt", "values": ["1"]}]}}]}},
     "operator must be In, NotIn, Exists or DoesNotExist, not 'Gt'"),
    ("topologySpreadConstraints", [{"maxSkew": 0, "topologyKey": "zone",
                                    "whenUnsatisfiable": "DoNotSchedule"}],
     "topologySpreadConstraints[0].maxSkew must be a whole number of at least 1"),
    ("topologySpreadConstraints", [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}],
     "topologySpreadConstraints[0].topologyKey is required"),
    ("topologySpreadConstraints", [{"maxSkew": 1, "topologyKey": "zone"}],
     "whenUnsatisfiable is required: DoNotSchedule"),
    ("topologySpreadConstraints", [{"maxSkew": 1, "topologyKey": "zone", "minDomains": 2,
                                    "whenUnsatisfiable": "ScheduleAnyway"}],
     "minDomains goes with whenUnsatisfiable: DoNotSchedule"),
    ("topologySpreadConstraints", [{"maxSkew": 1, "topologyKey": "zone",
                                    "whenUnsatisfiable": "ScheduleAnyway"}] * 2,
     "topologySpreadConstraints[1] repeats topologyKey zone with whenUnsatisfiable"),
]


def _set(tree: dict[str, Any], path: str, value: Any) -> Any:
    if not path:
        return value
    node = tree
    *parents, last = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return tree


@pytest.mark.parametrize(("path", "value", "message"), INVALID,
                         ids=[f"{p or 'pod'}={str(v)[:40]}" for p, v, _ in INVALID])
def test_an_invalid_option_is_refused_with_one_message_naming_it(path, value, message):
    with pytest.raises(SpecError) as raised:
        ClusterSpec.from_body(body(_set({}, path, copy.deepcopy(value))))
    assert message in str(raised.value)
    assert "\n" not in str(raised.value)


@pytest.mark.parametrize("label", RESERVED_LABELS)
def test_the_operators_own_labels_cannot_be_set(label):
    with pytest.raises(SpecError, match=f"must not set {label}: the operator sets it"):
        ClusterSpec.from_body(body({"metadata": {"labels": {label: "x"}}}))


def test_the_crd_refuses_the_same_reserved_labels():
    """The CEL rule of spec.pod.metadata.labels names the same keys the operator refuses."""
    from pathlib import Path

    from tests.packaging.crdschema import load_crd, version_schema

    crd = load_crd(Path(__file__).resolve().parents[2] / "crds" / "raftcluster.yaml")
    labels = version_schema(crd, "v1alpha1")["properties"]["spec"]["properties"]["pod"][
        "properties"]["metadata"]["properties"]["labels"]
    (rule,) = labels["x-kubernetes-validations"]
    assert sorted(RESERVED_LABELS) == sorted(
        term.split("'")[1] for term in rule["rule"].split("&&"))
