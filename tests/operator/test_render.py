"""The owned objects: valid Kubernetes manifests (checked against the API schemas), and a pod
environment that the node's own flag parser turns into the intended configuration."""

from __future__ import annotations

import argparse
import re
from typing import Any

import kubernetes_validate
import pytest
from flotilla.node.archive import parse_time
from flotilla.node.config import NodeConfig, parse
from flotilla.node.snapshot_policy import SnapshotPolicy
from flotilla.operator import render
from flotilla.operator.spec import ARCHIVE_JOBS, ClusterSpec

from tests.operator.test_spec import FULL_SPEC, UID, body

K8S_VERSION = "1.30"

BASIC = ClusterSpec.from_body(body())
FULL = ClusterSpec.from_body(body({**FULL_SPEC, "bootstrap": {"new": {}}}))
RESTORE = ClusterSpec.from_body(body({
    "replicas": 3,
    "archive": {"url": "file:///mnt/archive"},
    "bootstrap": {"restore": {"url": "s3://old-backups/team", "clusterId": "prod-demo-1234abcd",
                              "index": 900}},
}))
NEWEST = ClusterSpec.from_body(body({
    "archive": {"url": "file:///mnt/archive"},
    "bootstrap": {"restore": {"url": "s3://old-backups/team", "clusterId": "prod-demo-1234abcd"}},
}))
# Without TLS and without a NetworkPolicy: what every cluster was before both were defaults.
PLAIN = ClusterSpec.from_body(body({"tls": {"enabled": False}, "network": {"policy": False}}))
# Members that ask clients for certificates; clients only from one namespace.
MUTUAL = ClusterSpec.from_body(body({
    "tls": {"clientCertAuth": True},
    "network": {"clientFrom": [{"namespaceSelector": {"matchLabels": {"team": "orders"}}}]},
}))
SPECS = {"basic": BASIC, "full": FULL, "restore": RESTORE, "newest": NEWEST, "plain": PLAIN,
         "mutual": MUTUAL}

# What the kubelet would find in the Secrets the spec names (admin tokens of at least the 16
# bytes the node takes), and in the admin token Secret the operator generates without one.
ADMIN_TOKEN = "admin-secret-0123456789"
GENERATED_TOKEN = "generated-token-0123456789abcdef"
SECRETS = {("s3-creds", "id"): "AKIA-test", ("s3-creds", "AWS_SECRET_ACCESS_KEY"): "s3-secret",
           ("admin", "token"): ADMIN_TOKEN, ("demo-admin-token", "token"): GENERATED_TOKEN}


def objects(spec: ClusterSpec, bootstrapped: bool = False) -> list[dict[str, Any]]:
    members = spec.member_names(spec.replicas)
    return render.owned_objects(spec, members, bootstrapped, spec.replicas)


def pod_env(statefulset: dict[str, Any], pod: str, config: dict[str, Any]) -> dict[str, str]:
    """The node container's environment as the kubelet resolves it for pod `pod`: variables in
    order, $(VAR) expanded from those defined before it, $$ an escaped $."""
    env: dict[str, str] = {}
    pod_spec = statefulset["spec"]["template"]["spec"]
    (container,) = [c for c in pod_spec["containers"] if c["name"] == "node"]
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = re.sub(
                r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]),
                var["value"],
            )
        elif "fieldRef" in var["valueFrom"]:
            field = var["valueFrom"]["fieldRef"]["fieldPath"]
            env[var["name"]] = {"metadata.name": pod,
                                "metadata.namespace": statefulset["metadata"]["namespace"]}[field]
        elif "configMapKeyRef" in var["valueFrom"]:
            ref = var["valueFrom"]["configMapKeyRef"]
            assert ref["name"] == config["metadata"]["name"], ref
            env[var["name"]] = config["data"][ref["key"]]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = SECRETS[(ref["name"], ref["key"])]
    return env


def node_config(spec: ClusterSpec, pod: str, bootstrapped: bool = False) -> NodeConfig:
    members = spec.member_names(spec.replicas)
    statefulset = render.statefulset(spec, members, bootstrapped, spec.replicas)
    config = render.bootstrap_config(spec, members, bootstrapped)
    return parse([], pod_env(statefulset, pod, config))


def by_kind(objs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (found,) = [o for o in objs if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    return found


# -- valid Kubernetes objects -------------------------------------------------------------------


@pytest.mark.parametrize("bootstrapped", [False, True])
@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_object_passes_the_kubernetes_schema_strictly(name, bootstrapped):
    for obj in objects(SPECS[name], bootstrapped):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize(("replicas", "max_unavailable"), [(1, 0), (2, 0), (3, 1), (4, 1),
                                                          (5, 2)])
def test_replicas_and_the_disruption_budget_keep_a_quorum(replicas, max_unavailable):
    spec = ClusterSpec.from_body(body({"replicas": replicas}))
    objs = objects(spec)
    for obj in objs:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert by_kind(objs, "StatefulSet")["spec"]["replicas"] == replicas
    assert by_kind(objs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == max_unavailable
    # however many pods are down (at most that many), a quorum of the voters is up
    assert replicas - max_unavailable >= spec.quorum(replicas)


def test_the_budget_follows_the_committed_voters_not_the_spec():
    objs = render.owned_objects(BASIC, BASIC.member_names(3), True, 5, voters=3)
    assert by_kind(objs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert by_kind(objs, "StatefulSet")["spec"]["replicas"] == 5


def test_the_owned_objects_and_their_names():
    assert [(o["kind"], o["metadata"]["name"]) for o in objects(PLAIN)] == [
        ("ConfigMap", "demo-bootstrap"), ("Service", "demo-peers"), ("Service", "demo"),
        ("StatefulSet", "demo"),
        ("PodDisruptionBudget", "demo"),
    ]
    assert [(o["kind"], o["metadata"]["name"]) for o in objects(BASIC)] == [
        ("ConfigMap", "demo-bootstrap"), ("NetworkPolicy", "demo"), ("Service", "demo-peers"),
        ("Service", "demo"), ("StatefulSet", "demo"), ("PodDisruptionBudget", "demo"),
    ]


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_object_is_owned_by_the_raftcluster_and_labelled(name):
    spec = SPECS[name]
    for obj in objects(spec):
        metadata = obj["metadata"]
        assert metadata["namespace"] == "prod"
        assert metadata["labels"] == spec.labels
        assert metadata["ownerReferences"] == [{
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "RaftCluster", "name": "demo",
            "uid": UID, "controller": True, "blockOwnerDeletion": True,
        }]
        assert all(len(value) <= 63 for value in metadata["labels"].values())


def test_selectors_pick_exactly_the_member_pods():
    objs = objects(FULL)
    sts = by_kind(objs, "StatefulSet")
    template_labels = sts["spec"]["template"]["metadata"]["labels"]
    selectors = [
        sts["spec"]["selector"]["matchLabels"],
        by_kind(objs, "Service", "demo-peers")["spec"]["selector"],
        by_kind(objs, "Service", "demo")["spec"]["selector"],
        by_kind(objs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"],
    ]
    for selector in selectors:
        assert selector == FULL.selector_labels
        assert selector.items() <= template_labels.items()
    assert FULL.selector == ",".join(f"{k}={v}" for k, v in selectors[0].items())


def test_the_peer_service_is_headless_and_publishes_members_before_they_are_ready():
    peers = render.peer_service(BASIC)
    assert peers["spec"]["clusterIP"] == "None"
    assert peers["spec"]["publishNotReadyAddresses"] is True
    assert {(p["name"], p["port"]) for p in peers["spec"]["ports"]} == {("client", 2379),
                                                                       ("peer", 2380)}
    assert render.statefulset(BASIC, [], True, 0)["spec"]["serviceName"] == "demo-peers"


def test_the_client_service_serves_the_client_port_only():
    service = render.client_service(BASIC)
    assert service["spec"]["type"] == "ClusterIP"
    assert [(p["name"], p["port"]) for p in service["spec"]["ports"]] == [("client", 2379)]


def test_the_statefulset_leaves_restarts_to_the_operator():
    sts = render.statefulset(BASIC, BASIC.member_names(3), False, 3)["spec"]
    assert sts["updateStrategy"] == {"type": "OnDelete"}
    assert sts["podManagementPolicy"] == "Parallel"


def test_the_data_dir_is_a_subdirectory_of_the_volume():
    sts = render.statefulset(FULL, FULL.member_names(5), False, 5)["spec"]
    (container,) = sts["template"]["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "data"]
    (claim,) = sts["volumeClaimTemplates"]
    assert mount["name"] == claim["metadata"]["name"] == "data"
    data_dir = node_config(FULL, "demo-0").data_dir
    assert data_dir.startswith(mount["mountPath"].rstrip("/") + "/")
    assert data_dir != mount["mountPath"]


def test_the_volume_claim_follows_spec_storage():
    (claim,) = render.statefulset(FULL, FULL.member_names(5), False, 5)["spec"][
        "volumeClaimTemplates"]
    assert claim["spec"] == {"accessModes": ["ReadWriteOnce"],
                             "resources": {"requests": {"storage": "10Gi"}},
                             "storageClassName": "fast"}
    (basic,) = render.statefulset(BASIC, [], True, 0)["spec"]["volumeClaimTemplates"]
    assert "storageClassName" not in basic["spec"]


def test_the_container_runs_the_node_unprivileged_with_the_specs_image_and_resources():
    pod = render.statefulset(FULL, FULL.member_names(5), False, 5)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["flotilla", "node"]
    assert (container["image"], container["imagePullPolicy"]) == (
        "registry.example/flotilla:1.2.3", "Always")
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "256Mi"},
                                      "limits": {"cpu": "2", "memory": "1Gi"}}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "client",
                                                      "scheme": "HTTPS"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "client",
                                                     "scheme": "HTTPS"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    (plain,) = render.statefulset(PLAIN, [], True, 0)["spec"]["template"]["spec"]["containers"]
    assert plain["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "client"}
    assert plain["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "client"}


def test_without_resources_in_the_spec_members_get_the_default_requests_and_limits():
    for spec in (BASIC, PLAIN):
        (container,) = render.statefulset(spec, [], True, 0)["spec"]["template"]["spec"][
            "containers"]
        assert container["resources"] == {"requests": {"cpu": "250m", "memory": "512Mi"},
                                          "limits": {"memory": "1Gi"}}
    # Any resources in the spec replace the defaults whole: no default is mixed in.
    only_requests = ClusterSpec.from_body(body({"resources": {"requests": {"cpu": "2"}}}))
    (container,) = render.statefulset(only_requests, [], True, 0)["spec"]["template"]["spec"][
        "containers"]
    assert container["resources"] == {"requests": {"cpu": "2"}}


def test_secrets_are_referenced_never_inlined():
    env = render.node_env(FULL, FULL.member_names(5), False)
    secret_vars = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "FLOTILLA_ADMIN_TOKEN"}
    refs = {var["name"]: var["valueFrom"]["secretKeyRef"] for var in env
            if var["name"] in secret_vars}
    assert refs == {
        "AWS_ACCESS_KEY_ID": {"name": "s3-creds", "key": "id"},
        "AWS_SECRET_ACCESS_KEY": {"name": "s3-creds", "key": "AWS_SECRET_ACCESS_KEY"},
        "FLOTILLA_ADMIN_TOKEN": {"name": "admin", "key": "token"},
    }
    assert all("value" not in var for var in env if var["name"] in secret_vars)
    basic = {var["name"]: var.get("valueFrom") for var in render.node_env(BASIC, ["demo-0"],
                                                                          False)}
    # No archive, no AWS credentials; no adminTokenSecret, the one the operator generates.
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(basic)
    assert basic["FLOTILLA_ADMIN_TOKEN"] == {"secretKeyRef": {"name": "demo-admin-token",
                                                              "key": "token"}}


def test_env_names_are_unique_and_only_flags_or_aws_credentials():
    flags = {"FLOTILLA_" + flag.upper() for flag in NodeConfig.__dataclass_fields__}
    for spec in SPECS.values():
        names = [var["name"] for var in render.node_env(spec, spec.member_names(3), False)]
        assert len(names) == len(set(names))
        assert set(names) <= flags | {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


def test_pods_beyond_the_bootstrap_members_cannot_start_new():
    with pytest.raises(ValueError, match="demo-3, demo-4 would start with"):
        render.statefulset(BASIC, BASIC.member_names(3), False, 5)
    # once bootstrapped, new pods start `existing` and wait to be added as learners
    render.statefulset(BASIC, BASIC.member_names(3), True, 5)


# -- the node accepts exactly what the operator renders ----------------------------------------


@pytest.mark.parametrize("pod", ["demo-0", "demo-2"])
@pytest.mark.parametrize(("spec", "scheme"), [(PLAIN, "http"), (BASIC, "https")],
                         ids=["plain", "tls"])
def test_the_node_reads_the_basic_pod_env(pod, spec, scheme):
    cfg = node_config(spec, pod)
    members = spec.member_names(3)
    assert cfg.name == pod
    assert cfg.data_dir == "/var/lib/flotilla/data"
    assert cfg.listen_peer == ("0.0.0.0", 2380)
    assert cfg.listen_client == ("0.0.0.0", 2379)
    assert cfg.advertise_peer == f"{scheme}://{pod}.demo-peers.prod.svc:2380" == spec.peer_url(
        pod)
    assert cfg.advertise_client == spec.client_url(pod)
    assert cfg.advertise_client == f"{scheme}://{pod}.demo-peers.prod.svc:2379"
    assert cfg.initial_cluster == {m: spec.peer_url(m) for m in members}
    assert cfg.initial_cluster_state == "new"
    assert cfg.cluster_id == "prod-demo-6f1c2a9e"
    assert (cfg.election_timeout_ms, cfg.heartbeat_ms) == (1000, 100)
    assert cfg.snapshot_policy == SnapshotPolicy.default()
    assert (cfg.archive, cfg.s3_endpoint, cfg.s3_region) == (None, None, None)
    assert (cfg.restore_from, cfg.restore_cluster_id, cfg.restore_index) == (None, None, None)
    # Without spec.adminTokenSecret, the token the operator generated (NAME-admin-token).
    assert cfg.admin_token == GENERATED_TOKEN
    assert cfg.fsync is True
    tls = (cfg.cert_file, cfg.key_file, cfg.trusted_ca_file, cfg.peer_cert_file,
           cfg.peer_key_file, cfg.peer_trusted_ca_file, cfg.client_cert_auth)
    if scheme == "http":
        assert tls == (None,) * 6 + (False,)
    else:  # one certificate for both ports, from the directory the init container fills
        assert tls == ("/var/run/flotilla/tls/tls.crt", "/var/run/flotilla/tls/tls.key",
                       "/var/run/flotilla/tls/ca.crt") * 2 + (False,)


def test_after_bootstrap_pods_start_existing():
    assert node_config(BASIC, "demo-1", bootstrapped=True).initial_cluster_state == "existing"
    late = render.statefulset(BASIC, BASIC.member_names(3), True, 5)
    config = render.bootstrap_config(BASIC, [], True)
    cfg = parse([], pod_env(late, "demo-4", config))
    assert (cfg.name, cfg.initial_cluster_state) == ("demo-4", "existing")


def test_turning_to_existing_leaves_the_pod_template_alone():
    """The turn happens in the ConfigMap, read at container start: a template change would
    have the operator restart every member right after bootstrap."""
    members = BASIC.member_names(3)
    before = render.statefulset(BASIC, members, False, 3)["spec"]["template"]
    after = render.statefulset(BASIC, [], True, 3)["spec"]["template"]
    assert before == after
    assert render.bootstrap_config(BASIC, members, False)["data"] != render.bootstrap_config(
        BASIC, [], True)["data"]


def test_the_node_reads_the_full_pod_env():
    cfg = node_config(FULL, "demo-4")
    assert cfg.name == "demo-4"
    assert cfg.advertise_peer == FULL.peer_url("demo-4")
    assert list(cfg.initial_cluster) == FULL.member_names(5)
    assert cfg.cluster_id == "payments.eu-1"
    assert (cfg.election_timeout_ms, cfg.heartbeat_ms) == (2000, 200)
    assert cfg.snapshot_policy == SnapshotPolicy.parse("ratio=0.25,log-bytes=64MiB,entries=10000")
    assert cfg.archive == "s3://backups/flotilla"
    assert (cfg.s3_endpoint, cfg.s3_region) == ("http://minio.minio:9000", "eu-west-1")
    assert (cfg.archive_keep_snapshots, cfg.archive_interval_ms) == (5, 1000)
    assert cfg.admin_token == ADMIN_TOKEN
    assert cfg.restore_from is None


def test_the_aws_credentials_reach_the_environment_boto3_reads():
    statefulset = render.statefulset(FULL, FULL.member_names(5), False, 5)
    env = pod_env(statefulset, "demo-0", render.bootstrap_config(FULL, FULL.member_names(5),
                                                                 False))
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("AKIA-test", "s3-secret")


@pytest.mark.parametrize("bootstrapped", [False, True])
@pytest.mark.parametrize("name", ["restore", "newest"])
def test_every_member_of_a_restore_starts_with_the_same_restore_flags(name, bootstrapped):
    """At a point in time, the members restore the cluster the restore Job published (its
    newest state is the target: no index); otherwise the old cluster's newest state."""
    spec = {"restore": RESTORE, "newest": NEWEST}[name]
    configs = [node_config(spec, pod, bootstrapped) for pod in spec.member_names(3)]
    for cfg in configs:
        assert cfg.restore_from == "s3://old-backups/team"
        assert cfg.restore_cluster_id == {"restore": "prod-demo-6f1c2a9e-at-900",
                                          "newest": "prod-demo-1234abcd"}[name]
        assert cfg.restore_index is None
        assert cfg.cluster_id == "prod-demo-6f1c2a9e"  # the new cluster's own id
        assert cfg.archive == "file:///mnt/archive"
        assert cfg.initial_cluster == configs[0].initial_cluster
    assert {cfg.name for cfg in configs} == set(spec.member_names(3))
    names = {var["name"] for var in render.node_env(spec, spec.member_names(3), bootstrapped)}
    assert not names & {"FLOTILLA_RESTORE_INDEX", "FLOTILLA_RESTORE_TIME"}


def test_members_restore_a_point_in_time_from_the_cluster_the_job_publishes():
    for target in ({"index": 1}, {"time": "2026-11-25T17:00:00Z"}):
        spec = ClusterSpec.from_body(body({"bootstrap": {"restore": {"url": "s3://b",
                                                                     **target}}}))
        cfg = node_config(spec, "demo-0")
        assert cfg.restore_cluster_id == spec.restored_cluster_id
        assert restore_job_args(render.restore_job(spec))["to_cluster_id"] == \
            spec.restored_cluster_id


# -- the point-in-time restore Job ---------------------------------------------------------------

RESTORE_AT_TIME = ClusterSpec.from_body(body({
    **FULL_SPEC,
    "bootstrap": {"restore": {"url": "s3://old-backups/team", "time": "2026-11-25T17:00:00.25Z"}},
}))
JOB_SPECS = {"index": RESTORE, "time": RESTORE_AT_TIME,
             "full": ClusterSpec.from_body(body(FULL_SPEC))}


def restore_job_args(job: dict[str, Any]) -> dict[str, Any]:
    """The container's command line as the pipeline's own parser reads it."""
    from flotilla.pipeline.main import build_parser

    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["flotilla", "pipeline", "snapshot-at"]
    return vars(build_parser().parse_args(["snapshot-at", *container["args"]]))


def job_env(job: dict[str, Any]) -> dict[str, str]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {}
    for var in container["env"]:
        if "value" in var:
            env[var["name"]] = var["value"]
        else:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = SECRETS[(ref["name"], ref["key"])]
    return env


@pytest.mark.parametrize("name", sorted(JOB_SPECS))
def test_the_restore_job_passes_the_kubernetes_schema_strictly(name):
    kubernetes_validate.validate(render.restore_job(JOB_SPECS[name]), K8S_VERSION, strict=True)


def test_only_a_point_in_time_has_a_restore_job():
    for spec in (BASIC, NEWEST):
        with pytest.raises(ValueError, match=r"needs spec\.bootstrap\.restore\.index or \.time"):
            render.restore_job(spec)


def test_the_restore_job_runs_snapshot_at_with_the_pipelines_flags():
    index = restore_job_args(render.restore_job(RESTORE))
    assert (index["job"], index["archive"], index["cluster_id"], index["index"]) == (
        "snapshot-at", "s3://old-backups/team", "prod-demo-1234abcd", 900)
    assert (index["to_cluster_id"], index["master"]) == ("prod-demo-6f1c2a9e-at-900", "local[2]")
    assert (index["s3_endpoint"], index["s3_region"]) == (None, None)
    full = restore_job_args(render.restore_job(JOB_SPECS["full"]))
    assert (full["cluster_id"], full["index"], full["to_cluster_id"]) == (
        "old", 42, "payments.eu-1-at-42")
    assert (full["s3_endpoint"], full["s3_region"]) == ("http://minio.minio:9000", "eu-west-1")


def test_the_restore_job_at_a_time_passes_it_in_utc():
    at_time = restore_job_args(render.restore_job(RESTORE_AT_TIME))
    assert (at_time["time"], at_time["index"], at_time["cluster_id"]) == (
        parse_time("2026-11-25T17:00:00.250Z"), None, None)
    assert at_time["exclusive"] is False  # at or before the time, as the node's --restore-time
    assert at_time["to_cluster_id"] == "payments.eu-1-at-20261125t170000.250z"


def test_the_restore_job_reads_the_archive_with_the_members_credentials():
    job = render.restore_job(JOB_SPECS["full"])
    env = job_env(job)
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("AKIA-test", "s3-secret")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert all("value" not in var for var in container["env"] if var["name"].startswith("AWS"))
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert not [name for name in job_env(render.restore_job(RESTORE)) if "AWS" in name]
    assert not [name for name in env if name.startswith("FLOTILLA_")]


def test_the_restore_job_fails_at_once_on_what_a_rerun_cannot_change():
    spec = render.restore_job(RESTORE)["spec"]
    assert spec["backoffLimit"] == 2
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy needs it
    fail, ignore = spec["podFailurePolicy"]["rules"]
    assert fail == {"action": "FailJob", "onExitCodes": {
        "containerName": "snapshot-at", "operator": "In", "values": [2, 4]}}
    assert ignore == {"action": "Ignore",
                      "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}


def test_the_restore_job_runs_unprivileged_on_a_read_only_root_with_a_scratch_tmp():
    job = render.restore_job(JOB_SPECS["full"])
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001
    assert pod["automountServiceAccountToken"] is False
    assert container["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    (mount,) = container["volumeMounts"]
    (volume,) = pod["volumes"]
    assert (mount["mountPath"], mount["name"], volume) == (
        "/tmp", volume["name"], {"name": volume["name"], "emptyDir": {}})
    assert container["workingDir"] == "/tmp" and job_env(job)["HOME"] == "/tmp"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["resources"]["limits"]["memory"] == "3Gi"
    assert (container["image"], container["imagePullPolicy"]) == (
        "registry.example/flotilla:1.2.3", "Always")


def test_the_restore_job_is_owned_and_never_selected_as_a_member():
    job = render.restore_job(RESTORE)
    assert job["metadata"]["name"] == "demo-restore"
    assert job["metadata"]["ownerReferences"] == [render.owner_reference(RESTORE)]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels == job["metadata"]["labels"] == RESTORE.restore_job_labels
    assert not RESTORE.selector_labels.items() <= labels.items()
    assert all(len(value) <= 63 for value in labels.values())
    assert RESTORE.restore_job_selector == ",".join(f"{k}={v}" for k, v in labels.items())


def test_the_job_leaves_its_result_or_its_reason_as_the_termination_message():
    """The pipeline writes its own result line, or its one-line reason, to the file the
    container's terminationMessagePath names; the operator reads it from the pod's status."""
    job = render.restore_job(RESTORE)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert restore_job_args(job)["result_file"] == container["terminationMessagePath"] == \
        "/dev/termination-log"
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"  # a killed JVM


@pytest.mark.parametrize(
    "snapshot",
    [{"ratio": "1"}, {"logBytes": "1.5Gi"}, {"logBytes": 12345}, {"entries": 1},
     {"ratio": "0.05", "entries": 500}],
)
def test_the_node_takes_every_snapshot_policy_the_operator_writes(snapshot):
    spec = ClusterSpec.from_body(body({"snapshot": snapshot}))
    cfg = node_config(spec, "demo-0")
    assert cfg.snapshot_policy == SnapshotPolicy.parse(spec.snapshot_policy)
    assert cfg.snapshot_policy != SnapshotPolicy.default()


@pytest.mark.parametrize("timing", [{"electionTimeoutMs": 10, "heartbeatMs": 5},
                                    {"electionTimeoutMs": 200, "heartbeatMs": 100}])
def test_the_node_takes_every_timing_the_spec_allows(timing):
    cfg = node_config(ClusterSpec.from_body(body({"timing": timing})), "demo-0")
    assert (cfg.election_timeout_ms, cfg.heartbeat_ms) == (timing["electionTimeoutMs"],
                                                           timing["heartbeatMs"])


# -- scheduled compaction and export: CronJobs ---------------------------------------------------

SCHEDULED = ClusterSpec.from_body(body({**FULL_SPEC, "bootstrap": {"new": {}}}))
MINIMAL = ClusterSpec.from_body(body({"archive": {
    "url": "file:///mnt/archive", "compaction": {"schedule": "@daily"},
    "export": {"schedule": "15 * * * *", "destination": "file:///mnt/lake"}}}))
CRON_SPECS = {"full": SCHEDULED, "minimal": MINIMAL}
TAIL = ["--master", "local[2]"]


def cron_container(cronjob: dict[str, Any]) -> dict[str, Any]:
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    return container


def pipeline_args(job: str, args: list[str]) -> dict[str, Any]:
    """The command line as the pipeline's own parser reads it (a flag it does not know fails
    the test)."""
    from flotilla.pipeline.main import build_parser

    return vars(build_parser().parse_args([job, *args]))


@pytest.mark.parametrize("kind", ["compaction", "export"])
@pytest.mark.parametrize("name", sorted(CRON_SPECS))
@pytest.mark.parametrize("version", [K8S_VERSION, kubernetes_validate.latest_version()])
def test_the_cronjobs_pass_the_kubernetes_schema_strictly(name, kind, version):
    kubernetes_validate.validate(render.archive_cronjob(CRON_SPECS[name], kind), version,
                                 strict=True)


@pytest.mark.parametrize(("name", "kind", "command"), [
    ("full", "compaction", [
        "flotilla", "pipeline", "compact", "--archive", "s3://backups/flotilla",
        "--cluster-id", "payments.eu-1", "--s3-endpoint", "http://minio.minio:9000",
        "--s3-region", "eu-west-1", *TAIL, "--min-compaction-lag", "24h",
        "--delete-retention", "168h", "--min-cleanable-dirty-ratio", "0.25",
        "--max-compaction-lag", "720h", "--result-file", "/dev/termination-log"]),
    ("minimal", "compaction", [
        "flotilla", "pipeline", "compact", "--archive", "file:///mnt/archive",
        "--cluster-id", "prod-demo-6f1c2a9e", *TAIL, "--result-file", "/dev/termination-log"]),
    ("full", "export", [
        "flotilla", "pipeline", "export", "--archive", "s3://backups/flotilla",
        "--cluster-id", "payments.eu-1", "--s3-endpoint", "http://minio.minio:9000",
        "--s3-region", "eu-west-1", *TAIL, "--to", "s3://lake/flotilla", "--format", "delta",
        "--result-file", "/dev/termination-log"]),
    ("minimal", "export", [
        "flotilla", "pipeline", "export", "--archive", "file:///mnt/archive",
        "--cluster-id", "prod-demo-6f1c2a9e", *TAIL, "--to", "file:///mnt/lake",
        "--format", "parquet", "--result-file", "/dev/termination-log"]),
])
def test_each_cronjob_runs_the_pipeline_with_exactly_the_flags_the_spec_sets(name, kind,
                                                                             command):
    container = cron_container(render.archive_cronjob(CRON_SPECS[name], kind))
    assert [*container["command"], *container["args"]] == command
    assert container["name"] == command[2]  # what podFailurePolicy and the operator look for


@pytest.mark.parametrize(("field", "value", "flag"), [
    ("minCompactionLag", "0s", ["--min-compaction-lag", "0s"]),
    ("deleteRetention", "30m", ["--delete-retention", "30m"]),
    ("maxCompactionLag", "1h", ["--max-compaction-lag", "1h"]),
    ("minCleanableDirtyRatio", 1, ["--min-cleanable-dirty-ratio", "1.0"]),
    ("minCleanableDirtyRatio", 0.05, ["--min-cleanable-dirty-ratio", "0.05"]),
])
def test_one_compaction_setting_gives_one_flag(field, value, flag):
    spec = ClusterSpec.from_body(body({"archive": {"url": "s3://b", "compaction": {
        "schedule": "@daily", field: value}}}))
    args = cron_container(render.archive_cronjob(spec, "compaction"))["args"]
    assert args[args.index("--master") + 2:] == [*flag, "--result-file", "/dev/termination-log"]


@pytest.mark.parametrize(("kind", "job"), [("compaction", "compact"), ("export", "export")])
def test_the_pipeline_parses_the_cronjobs_command_line(kind, job):
    container = cron_container(render.archive_cronjob(SCHEDULED, kind))
    args = pipeline_args(job, container["args"])
    assert (args["archive"], args["cluster_id"], args["result_file"]) == (
        "s3://backups/flotilla", "payments.eu-1", "/dev/termination-log")
    assert (args["s3_endpoint"], args["s3_region"]) == ("http://minio.minio:9000", "eu-west-1")


def test_the_cronjobs_are_owned_labelled_and_never_selected_as_members():
    for kind, name in (("compaction", "demo-compact"), ("export", "demo-export")):
        cronjob = render.archive_cronjob(SCHEDULED, kind)
        labels = SCHEDULED.archive_job_labels(kind)
        assert cronjob["metadata"] == {"name": name, "namespace": "prod", "labels": labels,
                                       "ownerReferences": [render.owner_reference(SCHEDULED)]}
        assert cronjob["metadata"]["ownerReferences"][0]["uid"] == UID
        template = cronjob["spec"]["jobTemplate"]
        # The controller copies these onto each Job and its pods: how the operator finds them.
        assert template["metadata"]["labels"] == labels
        assert template["spec"]["template"]["metadata"]["labels"] == labels
        assert not SCHEDULED.selector_labels.items() <= labels.items()
        assert not SCHEDULED.restore_job_labels.items() <= labels.items()


def test_a_run_never_overlaps_the_last_one_and_is_kept_for_a_while():
    for kind in ("compaction", "export"):
        spec = render.archive_cronjob(MINIMAL, kind)["spec"]
        assert {k: v for k, v in spec.items() if k != "jobTemplate"} == {
            "schedule": {"compaction": "@daily", "export": "15 * * * *"}[kind],
            "timeZone": "Etc/UTC", "suspend": False, "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": 300, "successfulJobsHistoryLimit": 3,
            "failedJobsHistoryLimit": 3}
        job = spec["jobTemplate"]["spec"]
        assert job["backoffLimit"] == 1
        fail, ignore = job["podFailurePolicy"]["rules"]
        assert fail == {"action": "FailJob", "onExitCodes": {
            "containerName": ARCHIVE_JOBS[kind], "operator": "In", "values": [2, 4]}}
        assert ignore["action"] == "Ignore"
    assert render.archive_cronjob(SCHEDULED, "export")["spec"]["suspend"] is True


def test_the_cronjobs_pod_is_the_restore_jobs_pod_with_another_command():
    """Image, credentials (the members' Secret, by reference), resources, security context,
    service account token, scratch /tmp and termination message: as for the restore Job."""
    restore = render.restore_job(ClusterSpec.from_body(body(FULL_SPEC)))["spec"]["template"]
    for kind in ("compaction", "export"):
        template = render.archive_cronjob(SCHEDULED, kind)["spec"]["jobTemplate"]["spec"][
            "template"]

        def without_command(pod_template: dict[str, Any]) -> dict[str, Any]:
            spec = dict(pod_template["spec"])
            spec["containers"] = [{k: v for k, v in c.items()
                                   if k not in ("name", "command", "args")}
                                  for c in spec["containers"]]
            return spec

        assert without_command(template) == without_command(restore)
        env = job_env({"spec": {"template": template}})
        assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"]) == ("AKIA-test",
                                                                            "s3-secret")
        (container,) = template["spec"]["containers"]
        assert all("value" not in var for var in container["env"]
                   if var["name"].startswith("AWS"))
        assert container["terminationMessagePath"] == "/dev/termination-log"
        assert container["image"] == "registry.example/flotilla:1.2.3"
    assert not [n for n in job_env({"spec": {"template": render.archive_cronjob(
        MINIMAL, "export")["spec"]["jobTemplate"]["spec"]["template"]}}) if "AWS" in n]


def test_no_cronjob_without_its_block():
    spec = ClusterSpec.from_body(body({"archive": {"url": "s3://b"}}))
    for kind in ("compaction", "export"):
        with pytest.raises(ValueError, match=f"no spec.archive.{kind} to schedule"):
            render.archive_cronjob(spec, kind)
        with pytest.raises(ValueError):
            render.archive_cronjob(BASIC, kind)


# -- TLS: the member's own certificate, mounted for the node alone --------------------------


def test_members_get_their_own_certificate_through_an_init_container():
    pod = render.statefulset(BASIC, BASIC.member_names(3), False, 3)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    sources = volumes["member-certificates"]["projected"]["sources"]
    # every ordinal a member can have, each under its own name, optional until it exists:
    # the template is the same for 3 members or 99, so growing restarts no one
    assert len(sources) == 99
    assert sources[4] == {"secret": {"name": "demo-4-tls", "optional": True, "items": [
        {"key": "tls.crt", "path": "demo-4/tls.crt"}, {"key": "tls.key", "path": "demo-4/tls.key"},
        {"key": "ca.crt", "path": "demo-4/ca.crt"}]}}
    assert volumes["tls"] == {"name": "tls", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    (init,) = pod["initContainers"]
    assert init["command"] == [
        "install", "-m", "0400", "/var/run/flotilla/members/$(FLOTILLA_NAME)/tls.crt",
        "/var/run/flotilla/members/$(FLOTILLA_NAME)/tls.key",
        "/var/run/flotilla/members/$(FLOTILLA_NAME)/ca.crt", "/var/run/flotilla/tls/"]
    assert init["env"] == [{"name": "FLOTILLA_NAME",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    assert {m["name"] for m in init["volumeMounts"]} == {"member-certificates", "tls"}
    (node,) = pod["containers"]
    # the node sees its own three files and nobody else's key
    assert {m["name"]: (m["mountPath"], m.get("readOnly", False))
            for m in node["volumeMounts"]} == {"data": ("/var/lib/flotilla", False),
                                               "tls": ("/var/run/flotilla/tls", True)}
    env = {v["name"]: v.get("value") for v in node["env"]}
    for prefix in ("", "PEER_"):
        assert env[f"FLOTILLA_{prefix}CERT_FILE"] == "/var/run/flotilla/tls/tls.crt"
        assert env[f"FLOTILLA_{prefix}KEY_FILE"] == "/var/run/flotilla/tls/tls.key"
        assert env[f"FLOTILLA_{prefix}TRUSTED_CA_FILE"] == "/var/run/flotilla/tls/ca.crt"
    assert "FLOTILLA_CLIENT_CERT_AUTH" not in env
    assert "initContainers" not in render.pod_spec(PLAIN, [], True)
    assert "volumes" not in render.pod_spec(PLAIN, [], True)


def test_with_client_certificates_the_probes_show_the_members_own():
    (container,) = render.pod_spec(MUTUAL, [], True)["containers"]
    env = {v["name"]: v.get("value") for v in container["env"]}
    assert env["FLOTILLA_CLIENT_CERT_AUTH"] == "true"
    cfg = node_config(MUTUAL, "demo-1")
    assert cfg.client_cert_auth is True
    for probe, path in (("readinessProbe", "/readyz"), ("startupProbe", "/healthz"),
                        ("livenessProbe", "/healthz")):
        command = container[probe]["exec"]["command"]
        assert command[:2] == ["python", "-c"] and command[-1] == path
        assert "httpGet" not in container[probe]
        assert container[probe]["timeoutSeconds"] == 5


# -- the NetworkPolicy ---------------------------------------------------------------------


OPERATOR = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "flotilla-operator"}}}


def ingress_of(spec: ClusterSpec, operator: dict[str, Any] | None = OPERATOR
               ) -> list[dict[str, Any]]:
    policy = render.network_policy(spec, operator)
    kubernetes_validate.validate(policy, K8S_VERSION, strict=True)
    assert policy["spec"]["podSelector"] == {"matchLabels": spec.selector_labels}
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress (archive, DNS) left alone
    return policy["spec"]["ingress"]


def ports_of(rule: dict[str, Any]) -> set[int]:
    return {p["port"] for p in rule["ports"]}


def test_the_peer_port_is_open_to_the_clusters_own_pods_only():
    for spec in (BASIC, MUTUAL):
        rules = ingress_of(spec)
        peer_rules = [r for r in rules if 2380 in ports_of(r)]
        assert peer_rules == [{"from": [{"podSelector": {"matchLabels": spec.selector_labels}}],
                               "ports": [{"protocol": "TCP", "port": 2380},
                                         {"protocol": "TCP", "port": 2379}]}]
        assert all(ports_of(r) == {2379} for r in rules if r not in peer_rules)


def test_the_client_port_is_open_to_the_namespace_and_the_operator_by_default():
    (_, clients) = ingress_of(BASIC)
    assert clients == {"from": [{"podSelector": {}}, OPERATOR],
                       "ports": [{"protocol": "TCP", "port": 2379}]}
    (_, clients) = ingress_of(BASIC, operator=None)  # outside a cluster: the namespace only
    assert clients["from"] == [{"podSelector": {}}]


def test_the_client_port_follows_client_from():
    (_, clients) = ingress_of(MUTUAL)
    assert clients["from"] == [{"namespaceSelector": {"matchLabels": {"team": "orders"}}},
                               OPERATOR]


def test_an_empty_client_from_never_opens_the_client_port_to_everyone():
    """A rule with an empty `from` admits every source: with no client peers there is no
    client rule at all, and only the cluster's own pods (and the operator) get in."""
    closed = ClusterSpec.from_body(body({"network": {"clientFrom": []}}))
    assert ingress_of(closed, operator=None) == [
        {"from": [{"podSelector": {"matchLabels": closed.selector_labels}}],
         "ports": [{"protocol": "TCP", "port": 2380}, {"protocol": "TCP", "port": 2379}]}]
    (_, clients) = ingress_of(closed)
    assert clients["from"] == [OPERATOR]
    assert all(rule["from"] for rule in ingress_of(closed) + ingress_of(closed, None))


def test_the_network_policy_can_be_left_out():
    assert "NetworkPolicy" not in {o["kind"] for o in objects(PLAIN)}
    assert render.owned_objects(BASIC, [], True, 0, operator_peer=OPERATOR)[1] == \
        render.network_policy(BASIC, OPERATOR)


# -- signed manifests and server-side encryption ------------------------------------------------

SIGNING_SECRETS = {"2026": b"new-signing-key-0123456789abcdef\n", "2025": b"old-key-0123456789"}
SIGNED = ClusterSpec.from_body(body({
    "archive": {
        "url": "s3://backups/flotilla",
        "credentialsSecret": {"name": "s3-creds", "accessKeyIdKey": "id"},
        "signingKeySecret": {"name": "archive-key", "key": "2026", "previousKeys": ["2025"]},
        "encryption": {"type": "aws:kms", "kmsKeyId": "alias/flotilla"},
        "compaction": {"schedule": "@daily"},
        "export": {"schedule": "@hourly", "destination": "s3://lake/flotilla"},
    },
    "bootstrap": {"restore": {"url": "s3://backups/flotilla", "clusterId": "old", "index": 42}},
}))
AES = ClusterSpec.from_body(body({"archive": {
    "url": "s3://b", "signingKeySecret": {"name": "archive-key"},
    "encryption": {"type": "AES256"}, "compaction": {"schedule": "@daily"}}}))


def signed_pods(spec: ClusterSpec) -> dict[str, dict[str, Any]]:
    """Every pod template the operator renders for `spec`: the members', the restore Job's
    (with a point in time) and each CronJob's."""
    pods = {"member": render.statefulset(spec, spec.member_names(3), False, 3)["spec"][
        "template"]["spec"]}
    if spec.restored_cluster_id is not None:
        pods["snapshot-at"] = render.restore_job(spec)["spec"]["template"]["spec"]
    assert spec.archive is not None
    for kind in spec.archive.scheduled():
        pods[kind] = render.archive_cronjob(spec, kind)["spec"]["jobTemplate"]["spec"][
            "template"]["spec"]
    return pods


def kubelet_files(pod: dict[str, Any], directory) -> dict[str, str]:
    """Writes the signing key volume's files as the kubelet would, from SIGNING_SECRETS, into
    `directory`; returns each in-container path with the path it was written to."""
    (volume,) = [v for v in pod["volumes"] if v["name"] == render.SIGNING_KEY_VOLUME]
    written = {}
    for item in volume["secret"]["items"]:
        local = directory / item["path"]
        local.write_bytes(SIGNING_SECRETS[item["key"]])
        written[f"{render.SIGNING_KEY_DIR}/{item['path']}"] = str(local)
    return written


@pytest.mark.parametrize("spec", [SIGNED, AES], ids=["kms", "aes"])
def test_signed_and_encrypted_objects_pass_the_kubernetes_schema_strictly(spec):
    for bootstrapped in (False, True):
        for obj in objects(spec, bootstrapped):
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    assert spec.archive is not None
    for kind in spec.archive.scheduled():
        kubernetes_validate.validate(render.archive_cronjob(spec, kind), K8S_VERSION,
                                     strict=True)
    if spec.restored_cluster_id is not None:
        kubernetes_validate.validate(render.restore_job(spec), K8S_VERSION, strict=True)


@pytest.mark.parametrize("name", ["member", "snapshot-at", "compaction", "export"])
def test_every_pod_mounts_the_signing_keys_read_only_from_the_secret(name):
    pod = signed_pods(SIGNED)[name]
    (volume,) = [v for v in pod["volumes"] if v["name"] == render.SIGNING_KEY_VOLUME]
    assert volume["secret"] == {
        "secretName": "archive-key", "defaultMode": 0o400,  # no `optional`: the pod waits
        "items": [{"key": "2026", "path": "signing-key"},
                  {"key": "2025", "path": "previous-key-0"}]}
    (container,) = pod["containers"]
    assert [m for m in container["volumeMounts"] if m["name"] == render.SIGNING_KEY_VOLUME] == [
        {"name": render.SIGNING_KEY_VOLUME, "mountPath": "/var/run/flotilla/archive-signing-key",
         "readOnly": True}]
    # The TLS init container copies certificates only: it never sees the signing key.
    for init in pod.get("initContainers", []):
        assert render.SIGNING_KEY_VOLUME not in {m["name"] for m in init["volumeMounts"]}


def test_the_node_signs_with_the_first_key_verifies_with_both_and_encrypts(tmp_path):
    from flotilla.node.archive import ManifestKeys, S3Encryption

    statefulset = render.statefulset(SIGNED, SIGNED.member_names(3), False, 3)
    files = kubelet_files(statefulset["spec"]["template"]["spec"], tmp_path)
    env = pod_env(statefulset, "demo-1", render.bootstrap_config(SIGNED, SIGNED.member_names(3),
                                                                 False))
    assert env["FLOTILLA_ARCHIVE_SIGNING_KEY_FILE"] == (
        "/var/run/flotilla/archive-signing-key/signing-key,"
        "/var/run/flotilla/archive-signing-key/previous-key-0")
    assert (env["FLOTILLA_S3_SSE"], env["FLOTILLA_S3_SSE_KMS_KEY_ID"]) == ("aws:kms",
                                                                         "alias/flotilla")
    env["FLOTILLA_ARCHIVE_SIGNING_KEY_FILE"] = ",".join(
        files[path] for path in env["FLOTILLA_ARCHIVE_SIGNING_KEY_FILE"].split(","))
    cfg = parse([], env)
    expected = ManifestKeys.parse(f"{tmp_path}/signing-key,{tmp_path}/previous-key-0")
    assert cfg.archive_keys is not None
    assert cfg.archive_keys.key_ids == expected.key_ids  # the new key first: it signs
    assert cfg.s3_encryption == S3Encryption("aws:kms", "alias/flotilla")


def test_aes256_gives_no_kms_key_and_one_key_file():
    env = {var["name"]: var.get("value") for var in render.node_env(AES, ["demo-0"], False)}
    assert env["FLOTILLA_S3_SSE"] == "AES256"
    assert "FLOTILLA_S3_SSE_KMS_KEY_ID" not in env
    assert env["FLOTILLA_ARCHIVE_SIGNING_KEY_FILE"] == render.SIGNING_KEY_FILE


@pytest.mark.parametrize(("name", "job"), [("snapshot-at", "snapshot-at"),
                                           ("compaction", "compact"), ("export", "export")])
def test_every_pipeline_job_signs_verifies_and_encrypts_like_the_members(name, job, tmp_path):
    from flotilla.pipeline.main import _archive_protection

    pod = signed_pods(SIGNED)[name]
    (container,) = pod["containers"]
    args = pipeline_args(job, container["args"])
    assert args["archive_signing_key_file"] == (
        "/var/run/flotilla/archive-signing-key/signing-key,"
        "/var/run/flotilla/archive-signing-key/previous-key-0")
    assert (args["s3_sse"], args["s3_sse_kms_key_id"]) == ("aws:kms", "alias/flotilla")
    files = kubelet_files(pod, tmp_path)
    args["archive_signing_key_file"] = ",".join(
        files[path] for path in args["archive_signing_key_file"].split(","))
    protection = _archive_protection(argparse.Namespace(**args))
    member_env = render.node_env(SIGNED, ["demo-0"], False)
    assert protection["keys"].key_ids == parse_keys(tmp_path).key_ids
    assert protection["encryption"].put_args() == {"ServerSideEncryption": "aws:kms",
                                                   "SSEKMSKeyId": "alias/flotilla"}
    assert {"name": "FLOTILLA_ARCHIVE_SIGNING_KEY_FILE",
            "value": "/var/run/flotilla/archive-signing-key/signing-key,"
                     "/var/run/flotilla/archive-signing-key/previous-key-0"} in member_env


def parse_keys(directory):
    from flotilla.node.archive import ManifestKeys

    return ManifestKeys.parse(f"{directory}/signing-key,{directory}/previous-key-0")


def test_without_a_key_or_encryption_nothing_is_mounted_passed_or_flagged():
    for spec in (FULL, SCHEDULED, MINIMAL, BASIC):
        names = {var["name"] for var in render.node_env(spec, spec.member_names(3), False)}
        assert not {"FLOTILLA_ARCHIVE_SIGNING_KEY_FILE", "FLOTILLA_S3_SSE",
                    "FLOTILLA_S3_SSE_KMS_KEY_ID"} & names
        pods = [render.statefulset(spec, spec.member_names(3), False, 3)["spec"]["template"][
            "spec"]]
        if spec.archive is not None:
            pods += [render.archive_cronjob(spec, kind)["spec"]["jobTemplate"]["spec"][
                "template"]["spec"] for kind in spec.archive.scheduled()]
        for pod in pods:
            assert render.SIGNING_KEY_VOLUME not in {v["name"] for v in pod.get("volumes", [])}
            for container in pod["containers"]:
                assert not {"--archive-signing-key-file", "--s3-sse", "--s3-sse-kms-key-id"} & set(
                    container.get("args", []))


@pytest.mark.parametrize("change", [
    {"signingKeySecret": {"name": "archive-key-2"}},
    {"signingKeySecret": {"name": "archive-key", "key": "2027", "previousKeys": ["2026"]}},
    {"signingKeySecret": {"name": "archive-key"}, "encryption": {"type": "AES256"}},
    {"encryption": {"type": "aws:kms", "kmsKeyId": "alias/other"}},
    {},  # both removed
])
def test_a_changed_key_or_encryption_changes_the_member_template_so_members_roll(change):
    """The StatefulSet is OnDelete: the operator restarts members whose pod runs an older
    template than the StatefulSet's. Changing the Secret reference or encryption must change
    the template (and the bootstrap turn to `existing` must not)."""
    before = {"url": "s3://b", "signingKeySecret": {"name": "archive-key"},
              "encryption": {"type": "aws:kms"}}
    old = ClusterSpec.from_body(body({"archive": before}))
    new = ClusterSpec.from_body(body({"archive": {"url": "s3://b", **change}}))
    template = render.statefulset(old, [], True, 3)["spec"]["template"]
    assert render.statefulset(new, [], True, 3)["spec"]["template"] != template
    assert render.statefulset(old, old.member_names(3), False, 3)["spec"]["template"] == template


def test_the_signing_and_encryption_env_names_are_node_flags():
    """The names the node reads its flags from (`config.FLAGS`): these three are flags whose
    NodeConfig fields have other names (archive_keys, s3_encryption)."""
    from flotilla.node.config import FLAGS

    flags = {"FLOTILLA_" + flag[2:].replace("-", "_").upper() for flag, _ in FLAGS}
    for spec in (SIGNED, AES):
        names = [var["name"] for var in render.node_env(spec, spec.member_names(3), False)]
        assert len(names) == len(set(names))
        assert set(names) <= flags | {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


MACHINE = ClusterSpec.from_body(body({
    "stateMachine": {"class": "flotilla.examples.counter:Counter", "image": "registry/counter:2"},
    "archive": {"url": "file:///mnt/archive", "compaction": {"schedule": "@daily"}},
    "bootstrap": {"restore": {"url": "s3://old", "clusterId": "c1", "index": 7}},
}))


def test_a_state_machine_reaches_the_node_as_its_flag_in_its_image():
    statefulset = by_kind(objects(MACHINE), "StatefulSet")
    pod = statefulset["spec"]["template"]["spec"]
    env = pod_env(statefulset, "demo-0", by_kind(objects(MACHINE), "ConfigMap"))
    assert env["FLOTILLA_STATE_MACHINE"] == "flotilla.examples.counter:Counter"
    assert {c["image"] for c in [*pod["containers"], *pod["initContainers"]]} == {
        "registry/counter:2"}
    cfg = node_config(MACHINE, "demo-0")  # the node parses (and loads) --state-machine
    assert cfg.state_machine == "flotilla.examples.counter:Counter"
    # without one, no flag: the node's default, the key-value machine
    assert "FLOTILLA_STATE_MACHINE" not in pod_env(
        by_kind(objects(BASIC), "StatefulSet"), "demo-0", by_kind(objects(BASIC), "ConfigMap"))


def test_the_pipeline_jobs_of_a_state_machine_run_in_its_image():
    job = render.restore_job(MACHINE)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry/counter:2"
    assert restore_job_args(job)["state_machine"] == "flotilla.examples.counter:Counter"
    assert restore_job_args(render.restore_job(RESTORE))["state_machine"] == "kv"
    cronjob = render.archive_cronjob(MACHINE, "compaction")
    (container,) = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry/counter:2"

