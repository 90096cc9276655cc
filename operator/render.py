"""The objects the operator owns for a RaftCluster, as plain dicts ready for the API server:
the members' objects, for a point-in-time restore the Job that runs before them, and the
CronJobs of scheduled compaction and export.

Pure functions of a checked `ClusterSpec` plus what only the operator knows: who bootstrapped
the cluster, whether it has, and how many pods the planner wants. Every node flag reaches the
container as `FLOTILLA_*` environment (secrets through `secretKeyRef` only), so the node parses
exactly what it would from the command line. The pod template never changes once the cluster
has bootstrapped unless the spec does: the StatefulSet uses OnDelete, and the operator decides
when a pod restarts on a new template.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .spec import (
    API_VERSION,
    ARCHIVE_JOBS,
    CLIENT_PORT,
    KIND,
    MAX_REPLICAS,
    PEER_PORT,
    ClusterSpec,
    Compaction,
    SecretKey,
)

MOUNT_PATH = "/var/lib/flotilla"
DATA_DIR = f"{MOUNT_PATH}/data"  # a subdirectory: a fresh ext4 volume holds lost+found
VOLUME = "data"
CONTAINER = "node"
RUN_AS = 10001  # the image's non-root user and group
# TLS: every member Secret (MEMBER-tls) is projected, each under its member's name, into a
# volume only the init container mounts; it copies its own member's three files into a
# memory-backed emptyDir, the only one the node container sees. A pod template is shared by
# every pod of a StatefulSet, so it cannot name one pod's Secret; this way no member process
# can read another member's key.
TLS_DIR = "/var/run/flotilla/tls"
TLS_VOLUME = "tls"
MEMBER_CERTS_DIR = "/var/run/flotilla/members"
MEMBER_CERTS_VOLUME = "member-certificates"
TLS_INIT_CONTAINER = "tls"
TLS_FILES = ("tls.crt", "tls.key", "ca.crt")
# spec.archive.signingKeySecret: the Secret's key mounted as one file, read-only, readable by the
# node's user alone (mode 0400; the kubelet adds group read for the pod's fsGroup), in the
# members and in every pipeline Job, which all sign what they write and verify what they read.
SIGNING_KEY_VOLUME = "archive-signing-key"
SIGNING_KEY_DIR = "/var/run/flotilla/archive-signing-key"
SIGNING_KEY_FILE = f"{SIGNING_KEY_DIR}/signing-key"
# With clientCertAuth the kubelet's httpGet probes (which show no certificate) would fail the
# handshake: the probes run in the container instead, showing the member's own certificate.
_PROBE_SCRIPT = (
    "import ssl,sys,urllib.request as u;"
    f"d='{TLS_DIR}/';"
    "c=ssl.create_default_context(cafile=d+'ca.crt');"
    "c.load_cert_chain(d+'tls.crt',d+'tls.key');"
    f"u.urlopen('https://localhost:{CLIENT_PORT}'+sys.argv[1],context=c,timeout=4)"
)

Manifest = dict[str, Any]


def owner_reference(spec: ClusterSpec) -> Manifest:
    """Makes the RaftCluster the controller of an object: deleted with it, watched through it."""
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": spec.name,
        "uid": spec.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned_objects(
    spec: ClusterSpec,
    bootstrap_members: Sequence[str],
    bootstrapped: bool,
    statefulset_replicas: int,
    voters: int | None = None,
    operator_peer: Manifest | None = None,
) -> list[Manifest]:
    """Every owned object, in the order to create them (the StatefulSet names the peer Service
    and the bootstrap ConfigMap; the NetworkPolicy comes before any pod).

    `voters` sizes the PodDisruptionBudget: the voters of the committed configuration,
    spec.replicas when not given. `operator_peer`: how the NetworkPolicy lets the operator in
    (see `network_policy`).
    """
    policy = [network_policy(spec, operator_peer)] if spec.network.policy else []
    return [
        bootstrap_config(spec, bootstrap_members, bootstrapped),
        *policy,
        peer_service(spec),
        client_service(spec),
        statefulset(spec, bootstrap_members, bootstrapped, statefulset_replicas),
        pod_disruption_budget(spec, spec.replicas if voters is None else voters),
    ]


def statefulset(
    spec: ClusterSpec,
    bootstrap_members: Sequence[str],
    bootstrapped: bool,
    statefulset_replicas: int,
) -> Manifest:
    """Pods NAME-0..NAME-(n-1), each with its own volume; started in parallel, restarted by
    the operator (OnDelete), never by a rolling update that could take out a quorum."""
    if not bootstrapped:
        strangers = set(spec.member_names(statefulset_replicas)) - set(bootstrap_members)
        if strangers:
            raise ValueError(
                f"pods {', '.join(sorted(strangers))} would start with "
                "--initial-cluster-state new but are not bootstrap members; before the "
                "cluster has bootstrapped, run only the bootstrap members"
            )
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _metadata(spec, spec.name),
        "spec": {
            "serviceName": spec.peer_service_name,
            "replicas": statefulset_replicas,
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": spec.selector_labels},
            "template": {
                "metadata": pod_metadata(spec, spec.labels),
                "spec": pod_spec(spec, bootstrap_members, bootstrapped),
            },
            "volumeClaimTemplates": [_volume_claim(spec)],
        },
    }


def pod_metadata(spec: ClusterSpec, labels: dict[str, str]) -> Manifest:
    """A pod template's metadata: spec.pod.metadata's labels beside the operator's own (which
    it cannot name, spec.py checks), and its annotations."""
    metadata: Manifest = {"labels": {**spec.pod.labels, **labels}}
    if spec.pod.annotations:
        metadata["annotations"] = dict(spec.pod.annotations)
    return metadata


def pod_spec(spec: ClusterSpec, bootstrap_members: Sequence[str], bootstrapped: bool) -> Manifest:
    """The member pod: one non-root container (and with TLS an init container that hands it
    its own certificate); it needs neither the API nor service links. spec.pod says where it
    runs: by default spread over zones and nodes, as a preference."""
    pod: Manifest = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,  # NAME_PORT-style variables would crowd the FLOTILLA_* env
        "terminationGracePeriodSeconds": 30,
        "securityContext": _pod_security(),
        **spec.pod.member_pod(spec.selector_labels),
        "containers": [_container(spec, node_env(spec, bootstrap_members, bootstrapped))],
    }
    volumes = []
    if spec.tls.enabled:
        pod["initContainers"] = [_tls_init_container(spec)]
        volumes += tls_volumes(spec)
    volumes += signing_key_volumes(spec)
    if volumes:
        pod["volumes"] = volumes
    return pod


def signing_key_files(spec: ClusterSpec) -> str | None:
    """--archive-signing-key-file: the signing key's file, then each previous key's (which
    only verify); None without spec.archive.signingKeySecret."""
    ref = spec.archive.signing_key if spec.archive is not None else None
    if ref is None:
        return None
    return ",".join([SIGNING_KEY_FILE, *(f"{SIGNING_KEY_DIR}/previous-key-{i}"
                                         for i in range(len(ref.previous_keys)))])


def signing_key_volumes(spec: ClusterSpec) -> list[Manifest]:
    """spec.archive.signingKeySecret's keys as the files of `signing_key_files` (none without
    one). Not optional: a pod whose key is missing waits for it rather than archiving
    unsigned."""
    ref = spec.archive.signing_key if spec.archive is not None else None
    files = signing_key_files(spec)
    if ref is None or files is None:
        return []
    items = [{"key": key, "path": path.rsplit("/", 1)[1]}
             for key, path in zip((ref.key, *ref.previous_keys), files.split(","), strict=True)]
    return [{"name": SIGNING_KEY_VOLUME,
             "secret": {"secretName": ref.name, "defaultMode": 0o400, "items": items}}]


def signing_key_mounts(spec: ClusterSpec) -> list[Manifest]:
    return [{"name": volume["name"], "mountPath": SIGNING_KEY_DIR, "readOnly": True}
            for volume in signing_key_volumes(spec)]


def tls_volumes(spec: ClusterSpec) -> list[Manifest]:
    """The member Secrets MEMBER-tls of every ordinal a member can have, projected each under
    its member's name (optional: a Secret that does not exist yet is left out, so the
    template never changes when the cluster grows); and the memory-backed directory the init
    container copies the pod's own files into."""
    sources = [{"secret": {"name": spec.member_tls_secret(member), "optional": True,
                           "items": [{"key": key, "path": f"{member}/{key}"}
                                     for key in TLS_FILES]}}
               for member in spec.member_names(MAX_REPLICAS)]
    return [
        {"name": MEMBER_CERTS_VOLUME,
         "projected": {"sources": sources, "defaultMode": 0o440}},
        {"name": TLS_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
    ]


def _tls_init_container(spec: ClusterSpec) -> Manifest:
    """Copies this pod's tls.crt, tls.key and ca.crt (readable by the node's user only) from
    the projected member Secrets into the node's TLS directory; fails, and is retried by the
    kubelet, while the pod's Secret is not there yet."""
    own = f"{MEMBER_CERTS_DIR}/$(FLOTILLA_NAME)"
    return {
        "name": TLS_INIT_CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["install", "-m", "0400", *(f"{own}/{f}" for f in TLS_FILES), f"{TLS_DIR}/"],
        "env": [{"name": "FLOTILLA_NAME",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                      "limits": {"memory": "64Mi"}},
        "volumeMounts": [{"name": MEMBER_CERTS_VOLUME, "mountPath": MEMBER_CERTS_DIR,
                          "readOnly": True},
                         {"name": TLS_VOLUME, "mountPath": TLS_DIR}],
        "securityContext": _container_security(),
    }


def node_env(
    spec: ClusterSpec, bootstrap_members: Sequence[str], bootstrapped: bool
) -> list[Manifest]:
    """The node's flags as env. FLOTILLA_NAME comes first: later values refer to it as
    $(FLOTILLA_NAME), which the kubelet expands only from variables defined before."""
    env = [
        {"name": "FLOTILLA_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        _value("FLOTILLA_DATA_DIR", DATA_DIR),
        _value("FLOTILLA_LISTEN_PEER", f"0.0.0.0:{PEER_PORT}"),
        _value("FLOTILLA_LISTEN_CLIENT", f"0.0.0.0:{CLIENT_PORT}"),
        _value("FLOTILLA_ADVERTISE_PEER", spec.peer_url("$(FLOTILLA_NAME)")),
        _value("FLOTILLA_ADVERTISE_CLIENT", spec.client_url("$(FLOTILLA_NAME)")),
        # From the bootstrap ConfigMap, read when the container starts: the pod template stays
        # the same when the cluster turns from `new` to `existing`, so that turn restarts no pod.
        _config("FLOTILLA_INITIAL_CLUSTER", spec, "initial-cluster"),
        _config("FLOTILLA_INITIAL_CLUSTER_STATE", spec, "initial-cluster-state"),
        _value("FLOTILLA_CLUSTER_ID", spec.cluster_id),
        _value("FLOTILLA_ELECTION_TIMEOUT_MS", spec.timing.election_timeout_ms),
        _value("FLOTILLA_HEARTBEAT_MS", spec.timing.heartbeat_ms),
        _value("FLOTILLA_SNAPSHOT_POLICY", spec.snapshot_policy),
        # spec.stateMachine: the node's --state-machine (absent: the key-value machine)
        _value("FLOTILLA_STATE_MACHINE", spec.state_machine.cls
               if spec.state_machine is not None else None),
    ]
    if spec.archive is not None:
        archive = spec.archive
        env += [
            _value("FLOTILLA_ARCHIVE", archive.url),
            _value("FLOTILLA_S3_ENDPOINT", archive.endpoint),
            _value("FLOTILLA_S3_REGION", archive.region),
            _value("FLOTILLA_ARCHIVE_KEEP_SNAPSHOTS", archive.keep_snapshots),
            _value("FLOTILLA_ARCHIVE_INTERVAL_MS", archive.interval_ms),
            _secret("AWS_ACCESS_KEY_ID", archive.access_key_id),
            _secret("AWS_SECRET_ACCESS_KEY", archive.secret_access_key),
            # It also verifies what the member restores (spec.bootstrap.restore) or fetches.
            _value("FLOTILLA_ARCHIVE_SIGNING_KEY_FILE", signing_key_files(spec)),
        ]
        if archive.encryption is not None:
            env += [_value("FLOTILLA_S3_SSE", archive.encryption.type),
                    _value("FLOTILLA_S3_SSE_KMS_KEY_ID", archive.encryption.kms_key_id)]
    if spec.restore is not None:
        # A point in time was published by the restore Job as a cluster of its own, whose
        # newest state is exactly the target: the members restore that, with no index.
        env += [
            _value("FLOTILLA_RESTORE_FROM", spec.restore.url),
            _value("FLOTILLA_RESTORE_CLUSTER_ID",
                   spec.restored_cluster_id or spec.restore.cluster_id),
        ]
    if spec.tls.enabled:
        # The same certificate serves both ports and identifies the member to its peers.
        env += [_value(f"FLOTILLA_{prefix}{flag}", f"{TLS_DIR}/{name}")
                for prefix in ("", "PEER_")
                for flag, name in (("CERT_FILE", "tls.crt"), ("KEY_FILE", "tls.key"),
                                   ("TRUSTED_CA_FILE", "ca.crt"))]
        if spec.tls.client_cert_auth:
            env.append(_value("FLOTILLA_CLIENT_CERT_AUTH", "true"))
    env.append(_secret("FLOTILLA_ADMIN_TOKEN", spec.admin_token_secret))
    return [var for var in env if var is not None]


# --- the pipeline's Jobs: the point-in-time restore, scheduled compaction and export ------------

RESTORE_CONTAINER = "snapshot-at"
SCRATCH_VOLUME = "scratch"
SCRATCH_PATH = "/tmp"  # Spark's and the JVM's temporary files; the root filesystem is read-only
TERMINATION_LOG = "/dev/termination-log"
# Local mode on two cores, with memory for the driver's JVM (1 GiB heap), its Python and two
# Python workers. Archives whose fold does not fit want a Spark cluster (`--master`), run by hand.
PIPELINE_MASTER = "local[2]"
PIPELINE_RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "3Gi"}}
RESTORE_BACKOFF_LIMIT = 2
# A scheduled run retries once; the next schedule is the retry after that.
ARCHIVE_JOB_BACKOFF_LIMIT = 1
# The pipeline's exit codes that a rerun cannot change: bad flags or no Java / PySpark in the
# image (2), a target outside the archive (4). They fail the Job at once.
FINAL_EXIT_CODES = (2, 4)
# The pipeline writes its result line (or, failing, its one-line reason) to the termination-log
# file itself (`--result-file`), which the operator reads from the pod's status; its exit code
# is the container's, for the Job's podFailurePolicy. FallbackToLogsOnError covers a process
# that died before it could write (killed for memory, say): then the log's tail is the message.
RESTORE_COMMAND = ["flotilla", "pipeline", "snapshot-at"]
# CronJobs: a run never overlaps the one before (Forbid): two compactions of one archive would
# only race for the same manifest. A run the controller could not start within five minutes of
# its time is skipped, not started late; the last three Jobs of each outcome are kept, for
# `kubectl logs` and for status.archiveJobs. The schedule is read in UTC wherever the
# controller runs.
CRON_TIME_ZONE = "Etc/UTC"
CRON_STARTING_DEADLINE_SECONDS = 300
CRON_HISTORY_LIMIT = 3


def restore_job(spec: ClusterSpec) -> Manifest:
    """`flotilla pipeline snapshot-at` as a Job: it publishes the state at spec.bootstrap.restore's
    index or time into the archive as the cluster `spec.restored_cluster_id`, which the members
    then restore. Run once: a failure that a rerun cannot fix (exit 2 or 4) fails the Job at
    once, others are retried twice, and a node drain does not count as a failure."""
    restore = spec.restore
    cluster_id = spec.restored_cluster_id
    if restore is None or cluster_id is None:
        raise ValueError("a restore Job needs spec.bootstrap.restore.index or .time")
    args = ["--archive", restore.url]
    if restore.cluster_id is not None:
        args += ["--cluster-id", restore.cluster_id]
    args += _archive_access(spec)
    args += ["--index", str(restore.index)] if restore.index is not None else [
        "--time", str(restore.time)]
    if spec.state_machine is not None:  # replayed in one task, as that machine applies
        args += ["--state-machine", spec.state_machine.cls]
    args += ["--to-cluster-id", cluster_id, "--result-file", TERMINATION_LOG]
    labels = spec.restore_job_labels
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": spec.restore_job_name, "namespace": spec.namespace,
                     "labels": labels, "ownerReferences": [owner_reference(spec)]},
        "spec": _pipeline_job_spec(spec, RESTORE_CONTAINER, RESTORE_COMMAND, args, labels,
                                   RESTORE_BACKOFF_LIMIT),
    }


def archive_cronjob(spec: ClusterSpec, kind: str) -> Manifest:
    """spec.archive.<kind> (compaction, export) as a CronJob NAME-compact or NAME-export, whose
    Jobs run `flotilla pipeline compact` or `export` on this cluster's own archive, in the pod
    the restore Job runs in (image, credentials, limits, a scratch /tmp). Only the settings
    the spec gives become flags: the pipeline's defaults apply to the rest."""
    archive = spec.archive
    scheduled = archive.scheduled().get(kind) if archive is not None else None
    if archive is None or scheduled is None:
        raise ValueError(f"no spec.archive.{kind} to schedule")
    job = ARCHIVE_JOBS[kind]
    args = ["--archive", archive.url, "--cluster-id", spec.cluster_id, *_archive_access(spec)]
    if isinstance(scheduled, Compaction):
        for flag, value in (("--min-compaction-lag", scheduled.min_compaction_lag),
                            ("--delete-retention", scheduled.delete_retention),
                            ("--min-cleanable-dirty-ratio", scheduled.min_cleanable_dirty_ratio),
                            ("--max-compaction-lag", scheduled.max_compaction_lag)):
            if value is not None:
                args += [flag, str(value)]
    else:
        args += ["--to", scheduled.destination, "--format", scheduled.format]
    args += ["--result-file", TERMINATION_LOG]
    labels = spec.archive_job_labels(kind)
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": spec.archive_job_name(kind), "namespace": spec.namespace,
                     "labels": labels, "ownerReferences": [owner_reference(spec)]},
        "spec": {
            "schedule": scheduled.schedule,
            "timeZone": CRON_TIME_ZONE,
            "suspend": scheduled.suspend,
            "concurrencyPolicy": "Forbid",
            "startingDeadlineSeconds": CRON_STARTING_DEADLINE_SECONDS,
            "successfulJobsHistoryLimit": CRON_HISTORY_LIMIT,
            "failedJobsHistoryLimit": CRON_HISTORY_LIMIT,
            "jobTemplate": {
                "metadata": {"labels": labels},
                "spec": _pipeline_job_spec(spec, job, ["flotilla", "pipeline", job], args,
                                           labels, ARCHIVE_JOB_BACKOFF_LIMIT),
            },
        },
    }


def _archive_access(spec: ClusterSpec) -> list[str]:
    """The flags every pipeline Job shares: spec.archive's endpoint and region, its signing
    key (mounted as in the members) and server-side encryption, the master. As flags: the
    pipeline reads --s3-sse from no environment."""
    archive, args = spec.archive, []
    if archive is not None and archive.endpoint is not None:
        args += ["--s3-endpoint", archive.endpoint]
    if archive is not None and archive.region is not None:
        args += ["--s3-region", archive.region]
    key_files = signing_key_files(spec)
    if key_files is not None:
        args += ["--archive-signing-key-file", key_files]
    if archive is not None and archive.encryption is not None:
        args += ["--s3-sse", archive.encryption.type]
        if archive.encryption.kms_key_id is not None:
            args += ["--s3-sse-kms-key-id", archive.encryption.kms_key_id]
    return [*args, "--master", PIPELINE_MASTER]


def _pipeline_job_spec(spec: ClusterSpec, container_name: str, command: list[str],
                       args: list[str], labels: dict[str, str], backoff_limit: int) -> Manifest:
    """A Job running one pipeline command in the members' image, with spec.archive's
    credentials (the members' Secret, through secretKeyRef) and nothing else of theirs."""
    env = [
        _value("SPARK_LOCAL_IP", "127.0.0.1"),
        _value("HOME", SCRATCH_PATH),
    ]
    archive = spec.archive
    if archive is not None:  # the same credentials as the members', through the same Secret
        env += [_secret("AWS_ACCESS_KEY_ID", archive.access_key_id),
                _secret("AWS_SECRET_ACCESS_KEY", archive.secret_access_key)]
    container: Manifest = {
        "name": container_name,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(command),
        "args": args,
        "workingDir": SCRATCH_PATH,
        "env": [var for var in env if var is not None],
        "resources": {kind: dict(values) for kind, values in PIPELINE_RESOURCES.items()},
        "volumeMounts": [{"name": SCRATCH_VOLUME, "mountPath": SCRATCH_PATH},
                         *signing_key_mounts(spec)],
        "terminationMessagePath": TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": _container_security(),
    }
    return {
        "backoffLimit": backoff_limit,
        "podFailurePolicy": {"rules": [
            {"action": "FailJob",
             "onExitCodes": {"containerName": container_name, "operator": "In",
                             "values": list(FINAL_EXIT_CODES)}},
            {"action": "Ignore",
             "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]},
        "template": {
            "metadata": pod_metadata(spec, labels),
            "spec": {
                "restartPolicy": "Never",  # the Job retries; podFailurePolicy needs Never
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "securityContext": _pod_security(),
                **spec.pod.placement(),
                "containers": [container],
                "volumes": [{"name": SCRATCH_VOLUME, "emptyDir": {}},
                            *signing_key_volumes(spec)],
            },
        },
    }


def bootstrap_name(spec: ClusterSpec) -> str:
    return f"{spec.name}-bootstrap"


def bootstrap_config(spec: ClusterSpec, bootstrap_members: Sequence[str],
                     bootstrapped: bool) -> Manifest:
    """How a member with an empty volume starts: as a founding voter (`new`) until the cluster
    has served, then `existing` (it waits to be added as a learner), so a pod whose volume is
    lost never founds a second cluster with the first configuration."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(spec, bootstrap_name(spec)),
        "data": {
            "initial-cluster": spec.initial_cluster(bootstrap_members) if not bootstrapped
            else "",
            "initial-cluster-state": "existing" if bootstrapped else "new",
        },
    }


def _config(name: str, spec: ClusterSpec, key: str) -> Manifest:
    return {"name": name, "valueFrom": {"configMapKeyRef": {"name": bootstrap_name(spec),
                                                             "key": key}}}


def peer_service(spec: ClusterSpec) -> Manifest:
    """Headless: gives each pod its DNS name. Not-ready pods are published, because a member
    is only ready once it knows a leader, and there is no leader before peers find each other."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, spec.peer_service_name),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": spec.selector_labels,
            "ports": [_service_port("client", CLIENT_PORT), _service_port("peer", PEER_PORT)],
        },
    }


def client_service(spec: ClusterSpec) -> Manifest:
    """What clients use: any ready member serves, followers forward to the leader."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(spec, spec.client_service_name),
        "spec": {
            "type": "ClusterIP",
            "selector": spec.selector_labels,
            "ports": [_service_port("client", CLIENT_PORT)],
        },
    }


def pod_disruption_budget(spec: ClusterSpec, voters: int) -> Manifest:
    """Voluntary evictions (drains) keep a quorum of the voters running.

    As `maxUnavailable`, the voters' fault tolerance, rather than `minAvailable`: the budget
    counts every pod, learners too, so "at least a quorum of pods" would let a drain take
    voters down while learners stay up. At most (voters - 1) // 2 pods of any kind may be
    down at once, so however they are spread, a quorum of voters runs."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(spec, spec.name),
        "spec": {
            "maxUnavailable": (voters - 1) // 2,
            "selector": {"matchLabels": spec.selector_labels},
        },
    }


def network_policy(spec: ClusterSpec, operator_peer: Manifest | None = None) -> Manifest:
    """Who may reach the members. The peer port: the cluster's own pods only. The client port:
    its own pods (followers forward to the leader), spec.network.clientFrom (by default
    every pod of the namespace), and the operator (`operator_peer`, for admin calls; None when
    the operator does not know where it runs). Egress is left alone (archive, DNS).

    A rule whose `from` is empty would admit everyone, so with no client peers at all there is
    no client rule."""
    own = {"podSelector": {"matchLabels": dict(spec.selector_labels)}}
    clients = [dict(peer) for peer in (spec.network.client_from
                                       if spec.network.client_from is not None
                                       else ({"podSelector": {}},))]
    if operator_peer is not None and operator_peer not in clients:
        clients.append(operator_peer)
    ingress: list[Manifest] = [{
        "from": [own],
        "ports": [{"protocol": "TCP", "port": PEER_PORT},
                  {"protocol": "TCP", "port": CLIENT_PORT}],
    }]
    if clients:
        ingress.append({"from": clients, "ports": [{"protocol": "TCP", "port": CLIENT_PORT}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(spec, spec.name),
        "spec": {
            "podSelector": {"matchLabels": dict(spec.selector_labels)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


# --- parts ---------------------------------------------------------------------------------


def _metadata(spec: ClusterSpec, name: str) -> Manifest:
    return {
        "name": name,
        "namespace": spec.namespace,
        "labels": spec.labels,
        "ownerReferences": [owner_reference(spec)],
    }


def _pod_security() -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container(spec: ClusterSpec, env: list[Manifest]) -> Manifest:
    container: Manifest = {
        "name": CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["flotilla", "node"],
        "ports": [
            {"name": "client", "containerPort": CLIENT_PORT, "protocol": "TCP"},
            {"name": "peer", "containerPort": PEER_PORT, "protocol": "TCP"},
        ],
        "env": env,
        "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT_PATH}],
        "readinessProbe": {
            **_probe(spec, "/readyz"),
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        # A member serves HTTP only once its data dir is recovered, or its first state
        # restored from the archive: up to an hour before liveness applies.
        "startupProbe": {
            **_probe(spec, "/healthz"),
            "periodSeconds": 10,
            "failureThreshold": 360,
        },
        "livenessProbe": {  # generous: a busy member (snapshot, catch-up) must not be killed
            **_probe(spec, "/healthz"),
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "securityContext": _container_security(),
        "resources": spec.container_resources,
    }
    if spec.tls.enabled:
        container["volumeMounts"].append({"name": TLS_VOLUME, "mountPath": TLS_DIR,
                                          "readOnly": True})
    container["volumeMounts"] += signing_key_mounts(spec)
    return container


def _probe(spec: ClusterSpec, path: str) -> Manifest:
    """The kubelet's check of `path` on the client port: plain HTTP, HTTPS (the kubelet does
    not verify the certificate), or, when members ask clients for a certificate, a command in
    the container that shows the member's own."""
    if spec.tls.client_cert_auth:
        return {"exec": {"command": ["python", "-c", _PROBE_SCRIPT, path]},
                "timeoutSeconds": 5}
    probe: Manifest = {"path": path, "port": "client"}
    if spec.tls.enabled:
        probe["scheme"] = "HTTPS"
    return {"httpGet": probe}


def _container_security() -> Manifest:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def _volume_claim(spec: ClusterSpec) -> Manifest:
    """The member's data volume. Immutable on a StatefulSet, like storage.size in the CRD."""
    claim_spec: Manifest = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": spec.storage.size}},
    }
    if spec.storage.storage_class_name is not None:
        claim_spec["storageClassName"] = spec.storage.storage_class_name
    return {"metadata": {"name": VOLUME, "labels": spec.labels}, "spec": claim_spec}


def _service_port(name: str, port: int) -> Manifest:
    return {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}


def _value(name: str, value: object) -> Manifest | None:
    """A plain variable, or nothing when the setting is absent (the node's default applies)."""
    return None if value is None else {"name": name, "value": str(value)}


def _secret(name: str, ref: SecretKey | None) -> Manifest | None:
    if ref is None:
        return None
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
