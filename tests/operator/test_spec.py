"""Reading a RaftCluster: the CRD's defaults applied by the operator itself, every rule of the
CRD (OpenAPI and CEL) checked with one message naming the field, and a snapshot policy the
node's own parser reads back."""

from __future__ import annotations

import copy
import re
from decimal import Decimal
from typing import Any

import pytest
from flotilla.node.archive.layout import check_cluster_id
from flotilla.node.archive.urls import parse_archive_url
from flotilla.node.snapshot_policy import (
    DEFAULT_FLOOR,
    EntriesRule,
    LogBytesRule,
    RatioRule,
    SnapshotPolicy,
)
from flotilla.operator.spec import (
    Archive,
    ClusterSpec,
    Compaction,
    Encryption,
    Export,
    IssuerRef,
    Network,
    Resources,
    Restore,
    SecretKey,
    SigningKey,
    SpecError,
    Storage,
    Timing,
    Tls,
    cron_problem,
    default_cluster_id,
    parse_quantity,
    seconds,
)

UID = "6f1c2a9e-1b2c-4d5e-8f90-0123456789ab"
MiB = 1 << 20


def body(spec: dict[str, Any] | None = None, status: dict[str, Any] | None = None,
         **metadata: Any) -> dict[str, Any]:
    """A RaftCluster as the API server (or kmock, without defaults) hands it over."""
    meta = {"name": "demo", "namespace": "prod", "uid": UID, "generation": 4, **metadata}
    obj: dict[str, Any] = {"apiVersion": "flotilla.dev/v1alpha1", "kind": "RaftCluster",
                           "metadata": meta, "spec": spec if spec is not None else {}}
    if status is not None:
        obj["status"] = status
    return obj


FULL_SPEC: dict[str, Any] = {
    "replicas": 5,
    "image": "registry.example/flotilla:1.2.3",
    "imagePullPolicy": "Always",
    "clusterId": "payments.eu-1",
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                  "limits": {"cpu": 2, "memory": "1Gi"}},
    "storage": {"size": "10Gi", "storageClassName": "fast", "removedVolumePolicy": "Retain"},
    "snapshot": {"ratio": "0.25", "logBytes": "64Mi", "entries": 10000},
    "archive": {
        "url": "s3://backups/flotilla",
        "endpoint": "http://minio.minio:9000",
        "region": "eu-west-1",
        "credentialsSecret": {"name": "s3-creds", "accessKeyIdKey": "id"},
        "keepSnapshots": 5,
        "intervalMs": 1000,
        "compaction": {"schedule": "0 3 * * *", "minCompactionLag": "24h",
                       "deleteRetention": "168h", "maxCompactionLag": "720h",
                       "minCleanableDirtyRatio": 0.25, "suspend": False},
        "export": {"schedule": "*/30 * * * mon-fri", "destination": "s3://lake/flotilla",
                   "format": "delta", "suspend": True},
    },
    "bootstrap": {"restore": {"url": "s3://backups/flotilla", "clusterId": "old", "index": 42}},
    "timing": {"electionTimeoutMs": 2000, "heartbeatMs": 200, "catchUpTimeoutSeconds": 60},
    "adminTokenSecret": {"name": "admin"},
    "deletion": {"finalSnapshot": False},
}


class _Delete:
    """The marker for a removed field; its repr names it, so test ids are the same in every
    process (pytest-xdist's workers must collect the same ids)."""

    def __repr__(self) -> str:
        return "DELETE"


DELETE = _Delete()


def with_field(path: str, value: Any) -> dict[str, Any]:
    """FULL_SPEC with one field (a dotted path) replaced, or removed when value is DELETE."""
    spec = copy.deepcopy(FULL_SPEC)
    *parents, last = path.split(".")
    target = spec
    for key in parents:
        target = target.setdefault(key, {})
    if value is DELETE:
        target.pop(last, None)
    else:
        target[last] = value
    return spec


# -- defaults ------------------------------------------------------------------------------------


def test_a_minimal_object_gets_every_default_of_the_crd():
    spec = ClusterSpec.from_body(body(), default_image="flotilla:test")
    assert spec == ClusterSpec(
        name="demo",
        namespace="prod",
        uid=UID,
        generation=4,
        replicas=3,
        image="flotilla:test",
        image_pull_policy="IfNotPresent",
        resources=Resources({}, {}),
        storage=Storage(size="1Gi", storage_class_name=None, removed_volume_policy="Delete"),
        snapshot_policy=None,
        archive=None,
        restore=None,
        timing=Timing(election_timeout_ms=1000, heartbeat_ms=100, catch_up_timeout_seconds=600),
        admin_token=None,
        final_snapshot=True,
        cluster_id="prod-demo-6f1c2a9e",
        tls=Tls(enabled=True, issuer_ref=None, client_cert_auth=False, secret_name=None,
                duration="8760h"),
        network=Network(policy=True, client_from=None),
    )


def test_an_object_without_a_spec_is_a_default_cluster():
    obj = body()
    del obj["spec"]
    assert ClusterSpec.from_body(obj).replicas == 3


def test_every_field_is_read():
    spec = ClusterSpec.from_body(body(FULL_SPEC))
    assert spec.replicas == 5
    assert spec.image == "registry.example/flotilla:1.2.3"
    assert spec.image_pull_policy == "Always"
    assert spec.cluster_id == "payments.eu-1"
    assert spec.resources == Resources({"cpu": "250m", "memory": "256Mi"},
                                       {"cpu": "2", "memory": "1Gi"})
    assert spec.storage == Storage("10Gi", "fast", "Retain")
    assert spec.snapshot_policy == "ratio=0.25,log-bytes=64MiB,entries=10000"
    assert spec.archive == Archive(
        url="s3://backups/flotilla",
        endpoint="http://minio.minio:9000",
        region="eu-west-1",
        access_key_id=SecretKey("s3-creds", "id"),
        secret_access_key=SecretKey("s3-creds", "AWS_SECRET_ACCESS_KEY"),
        keep_snapshots=5,
        interval_ms=1000,
        compaction=Compaction(schedule="0 3 * * *", min_compaction_lag="24h",
                              delete_retention="168h", max_compaction_lag="720h",
                              min_cleanable_dirty_ratio=0.25, suspend=False),
        export=Export(schedule="*/30 * * * mon-fri", destination="s3://lake/flotilla",
                      format="delta", suspend=True),
    )
    assert spec.restore == Restore("s3://backups/flotilla", "old", 42)
    assert spec.timing == Timing(2000, 200, 60)
    assert spec.admin_token == SecretKey("admin", "token")
    assert spec.final_snapshot is False


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ({"archive": {"url": "file:///mnt/archive"}},
         Archive("file:///mnt/archive", keep_snapshots=3, interval_ms=5000)),
        ({"archive": {"url": "s3://b", "credentialsSecret": {"name": "c"}}},
         Archive("s3://b", access_key_id=SecretKey("c", "AWS_ACCESS_KEY_ID"),
                 secret_access_key=SecretKey("c", "AWS_SECRET_ACCESS_KEY"))),
    ],
)
def test_archive_defaults(section, expected):
    assert ClusterSpec.from_body(body(section)).archive == expected


def test_the_signing_key_and_encryption_are_read():
    archive = ClusterSpec.from_body(body({"archive": {
        "url": "s3://b",
        "signingKeySecret": {"name": "archive-key", "key": "2026", "previousKeys": ["2025"]},
        "encryption": {"type": "aws:kms", "kmsKeyId": "alias/flotilla"},
    }})).archive
    assert archive is not None
    assert archive.signing_key == SigningKey("archive-key", "2026", ("2025",))
    assert archive.encryption == Encryption("aws:kms", "alias/flotilla")


@pytest.mark.parametrize(("section", "signing_key", "encryption"), [
    ({}, None, None),
    ({"signingKeySecret": {"name": "archive-key"}}, SigningKey("archive-key", "signing-key"),
     None),
    ({"encryption": {"type": "AES256"}}, None, Encryption("AES256")),
    ({"encryption": {"type": "aws:kms"}}, None, Encryption("aws:kms")),  # the aws/s3 key
])
def test_without_a_key_or_encryption_nothing_is_signed_or_encrypted(section, signing_key,
                                                                    encryption):
    archive = ClusterSpec.from_body(body({"archive": {"url": "s3://b", **section}})).archive
    assert archive is not None
    assert (archive.signing_key, archive.encryption) == (signing_key, encryption)


@pytest.mark.parametrize(
    "bootstrap",
    [None, {"new": {}}],
    ids=["absent", "new"],
)
def test_bootstrap_new(bootstrap):
    spec = {} if bootstrap is None else {"bootstrap": bootstrap}
    assert ClusterSpec.from_body(body(spec)).restore is None


def test_restore_defaults_to_the_newest_snapshot_of_the_only_cluster():
    spec = ClusterSpec.from_body(body({"bootstrap": {"restore": {"url": "file:///a"}}}))
    assert spec.restore == Restore("file:///a", cluster_id=None, index=None)


def test_restore_index_is_kept():
    spec = ClusterSpec.from_body(body({"bootstrap": {"restore": {"url": "s3://b", "index": 1}}}))
    assert spec.restore is not None and spec.restore.index == 1


@pytest.mark.parametrize(("given", "kept"), [
    ("2026-11-25T17:00:00.250Z", "2026-11-25T17:00:00.250Z"),
    ("2026-11-25T18:00:00.25+01:00", "2026-11-25T17:00:00.250Z"),  # in UTC
    ("2026-11-25t17:00:00z", "2026-11-25T17:00:00.000Z"),
    ("2026-11-25T17:00:00.999999Z", "2026-11-25T17:00:00.999Z"),  # cut, never rounded up
])
def test_restore_time_is_kept_in_utc_with_milliseconds(given, kept):
    spec = ClusterSpec.from_body(body({"bootstrap": {"restore": {"url": "s3://b",
                                                                 "time": given}}}))
    assert spec.restore == Restore("s3://b", time=kept)
    assert spec.restore.point_in_time and spec.restore.target == f"time {kept}"


@pytest.mark.parametrize(("restore", "point_in_time", "target"), [
    ({"url": "s3://b"}, False, "the newest archived state"),
    ({"url": "s3://b", "clusterId": "old"}, False, "the newest archived state"),
    ({"url": "s3://b", "index": 7}, True, "index 7"),
])
def test_a_point_in_time_is_an_index_or_a_time(restore, point_in_time, target):
    spec = ClusterSpec.from_body(body({"bootstrap": {"restore": restore}}))
    assert spec.restore is not None
    assert (spec.restore.point_in_time, spec.restore.target) == (point_in_time, target)


def test_the_restored_cluster_id_is_the_clusters_own_and_the_point():
    """What the restore Job publishes and the members restore: derived from this RaftCluster
    only (a rerun publishes the same id), never its own id, and a valid archive prefix."""
    def restored(restore: dict[str, Any], **spec: Any) -> str | None:
        return ClusterSpec.from_body(body({"bootstrap": {"restore": {"url": "s3://b",
                                                                     **restore}}, **spec})
                                     ).restored_cluster_id

    assert restored({}) is None
    assert restored({"clusterId": "old"}) is None
    assert restored({"index": 120000}) == "prod-demo-6f1c2a9e-at-120000"
    assert restored({"time": "2026-11-25T18:00:00.25+01:00"}) == \
        "prod-demo-6f1c2a9e-at-20261125t170000.250z"
    assert restored({"index": 5, "clusterId": "old"}, clusterId="mine") == "mine-at-5"
    assert ClusterSpec.from_body(body()).restored_cluster_id is None
    longest = [restored({"index": 2**63 - 1}, clusterId="a" * 63),
               restored({"time": "9999-12-31T23:59:59.999Z"}, clusterId="a" * 63)]
    for cluster_id in longest:
        assert cluster_id is not None
        assert check_cluster_id(cluster_id) == cluster_id  # at most 128, one path segment


def test_null_fields_count_as_absent():
    spec = ClusterSpec.from_body(body({"replicas": None, "archive": None, "snapshot": None}))
    assert (spec.replicas, spec.archive, spec.snapshot_policy) == (3, None, None)


def test_the_default_image_is_used_when_the_spec_names_none():
    assert ClusterSpec.from_body(body(), default_image="x:1").image == "x:1"
    assert ClusterSpec.from_body(body({"image": "y:2"}), default_image="x:1").image == "y:2"


def test_metadata_without_uid_namespace_or_generation_still_reads():
    """kmock objects may lack what the API server always sets."""
    spec = ClusterSpec.from_body({"metadata": {"name": "demo"}, "spec": {}})
    assert (spec.namespace, spec.uid, spec.generation) == ("default", "", 0)
    assert spec.cluster_id == "default-demo"


# -- the cluster id ------------------------------------------------------------------------------


def test_cluster_id_prefers_the_spec_then_the_status_then_derives_one():
    assert ClusterSpec.from_body(body({"clusterId": "mine"})).cluster_id == "mine"
    recorded = {"clusterId": "prod-demo-11111111"}
    assert ClusterSpec.from_body(body(status=recorded)).cluster_id == "prod-demo-11111111"
    assert ClusterSpec.from_body(body()).cluster_id == "prod-demo-6f1c2a9e"


def test_the_recorded_cluster_id_wins_and_a_different_spec_id_is_refused():
    recorded = {"clusterId": "prod-demo-11111111"}
    same = body({"clusterId": "prod-demo-11111111"}, status=recorded)
    assert ClusterSpec.from_body(same).cluster_id == "prod-demo-11111111"
    with pytest.raises(SpecError, match=r"spec\.clusterId \(other\) differs .*status\.clusterId"):
        ClusterSpec.from_body(body({"clusterId": "other"}, status=recorded))


@pytest.mark.parametrize(
    ("namespace", "name", "uid", "expected"),
    [
        ("prod", "demo", UID, "prod-demo-6f1c2a9e"),
        ("prod", "demo", UID.upper(), "prod-demo-6f1c2a9e"),
        ("prod", "demo", "", "prod-demo"),
        ("n" * 63, "c" * 52, UID, "n" * 54 + "-6f1c2a9e"),
        ("team-a", "x" * 50, UID, "team-a-" + "x" * 47 + "-6f1c2a9e"),
    ],
)
def test_the_derived_cluster_id_is_short_and_safe(namespace, name, uid, expected):
    cluster_id = default_cluster_id(namespace, name, uid)
    assert cluster_id == expected
    assert len(cluster_id) <= 63
    assert cluster_id[0].isalnum() and cluster_id[-1].isalnum()


# -- what is refused, and how it is said ----------------------------------------------------------


INVALID = [
    # (field path, value, words the message must contain)
    ("replicas", 0, "spec.replicas (0) must be at least 1"),
    ("replicas", -2, "spec.replicas (-2) must be at least 1"),
    ("replicas", 100, "spec.replicas (100) must be at most 99"),
    ("replicas", "three", "spec.replicas must be a whole number, not 'three'"),
    ("replicas", "3", "spec.replicas must be a whole number"),
    ("replicas", 3.5, "spec.replicas must be a whole number"),
    ("replicas", True, "spec.replicas must be a whole number"),
    ("image", 7, "spec.image must be a string"),
    ("imagePullPolicy", "Sometimes", "spec.imagePullPolicy must be Always or IfNotPresent or "
                                     "Never, not 'Sometimes'"),
    ("clusterId", "My_Cluster", "spec.clusterId must be 1-63 characters of a-z, 0-9"),
    ("clusterId", "", "spec.clusterId must be 1-63 characters"),
    ("clusterId", "a" * 64, "spec.clusterId must be 1-63 characters"),
    ("resources.requests.memory", "lots", "spec.resources.requests.memory must be a quantity"),
    ("resources.limits.cpu", "-1", "spec.resources.limits.cpu must be a quantity"),
    ("resources.requests.cpu", "4", "spec.resources.requests.cpu (4) must not exceed "
                                    "spec.resources.limits.cpu (2)"),
    ("resources", "big", "spec.resources must be an object"),
    ("storage.size", "1 GB", "spec.storage.size must be a quantity such as 1Gi"),
    ("storage.size", "1GB", "spec.storage.size must be a quantity"),
    ("storage.size", "0", "spec.storage.size (0) must be more than 0"),
    ("storage.removedVolumePolicy", "Keep", "spec.storage.removedVolumePolicy must be Delete or "
                                            "Retain, not 'Keep'"),
    ("snapshot.ratio", "0", "spec.snapshot.ratio must be a decimal more than 0 and at most 1"),
    ("snapshot.ratio", "1.5", "spec.snapshot.ratio must be a decimal"),
    ("snapshot.ratio", "-0.1", "spec.snapshot.ratio must be a decimal"),
    ("snapshot.ratio", 0.1, "spec.snapshot.ratio must be a string (quote it"),
    ("snapshot.logBytes", "64MB", "spec.snapshot.logBytes must be a quantity"),
    ("snapshot.logBytes", "0", "spec.snapshot.logBytes (0) must be a whole number of bytes"),
    ("snapshot.logBytes", "1500m", "spec.snapshot.logBytes (1500m) must be a whole number"),
    ("snapshot.entries", 0, "spec.snapshot.entries (0) must be at least 1"),
    ("archive.url", DELETE, "spec.archive.url is required"),
    ("archive.url", "http://minio/bucket", "spec.archive.url must start with s3:// or file://"),
    ("archive.url", "s3:///prefix", "spec.archive.url names no bucket"),
    ("archive.url", "file://relative/dir", "spec.archive.url must be an absolute file URL"),
    ("archive.url", "s3://key:secret@bucket", "spec.archive.url must not carry credentials"),
    ("archive.url", "http://minio:9000/b", "endpoint goes in spec.archive.endpoint"),
    ("archive.url", "s3://bucket?versioned=1", "spec.archive.url must not have a query"),
    ("archive.endpoint", "minio:9000", "spec.archive.endpoint must be an http:// or https://"),
    ("archive.credentialsSecret.name", DELETE, "spec.archive.credentialsSecret.name is required"),
    ("archive.credentialsSecret.name", "", "spec.archive.credentialsSecret.name is required"),
    ("archive.keepSnapshots", 0, "spec.archive.keepSnapshots (0) must be at least 1"),
    ("archive.intervalMs", 99, "spec.archive.intervalMs (99) must be at least 100"),
    ("bootstrap.restore.url", DELETE, "spec.bootstrap.restore.url is required"),
    ("bootstrap.restore.url", "https://x/y", "spec.bootstrap.restore.url must start with s3://"),
    ("bootstrap.restore.index", 0, "spec.bootstrap.restore.index (0) must be at least 1"),
    ("bootstrap.restore.time", "2026-11-25T17:00:00.250Z",
     "spec.bootstrap.restore sets both index and time: give one of them"),
    ("bootstrap.restore.clusterId", "a/b", "spec.bootstrap.restore.clusterId must be the old "
                                           "cluster's id"),
    ("bootstrap.restore.clusterId", "-old", "1-128 letters, digits"),
    ("bootstrap.new", {}, "spec.bootstrap must set exactly one of new or restore (it sets both)"),
    ("bootstrap", {}, "spec.bootstrap must set exactly one of new or restore (it sets neither)"),
    ("bootstrap.restore", "yes", "spec.bootstrap.restore must be an object"),
    ("timing.heartbeatMs", 1500, "spec.timing.electionTimeoutMs (2000) must be at least twice "
                                 "spec.timing.heartbeatMs (1500)"),
    ("timing.electionTimeoutMs", 5, "spec.timing.electionTimeoutMs (5) must be at least 10"),
    ("timing.heartbeatMs", 0, "spec.timing.heartbeatMs (0) must be at least 1"),
    ("timing.heartbeatMs", 60_001, "spec.timing.heartbeatMs (60001) must be at most 60000"),
    ("timing.electionTimeoutMs", 600_001, "spec.timing.electionTimeoutMs (600001) must be at "
                                          "most 600000"),
    ("timing.catchUpTimeoutSeconds", 9, "spec.timing.catchUpTimeoutSeconds (9) must be at "
                                        "least 10"),
    ("adminTokenSecret.name", DELETE, "spec.adminTokenSecret.name is required"),
    # scheduled compaction and export
    ("archive.compaction", "daily", "spec.archive.compaction must be an object"),
    ("archive.compaction.schedule", DELETE, "spec.archive.compaction.schedule is required: "
                                            "when to run, in cron syntax, such as "
                                            '"0 3 * * *" (03:00 UTC every day)'),
    ("archive.compaction.schedule", "", "spec.archive.compaction.schedule is required"),
    ("archive.compaction.schedule", "0 3 * *", "spec.archive.compaction.schedule must be a "
                                               "cron schedule: five fields (minute hour "
                                               "day-of-month month day-of-week, in UTC"),
    ("archive.compaction.schedule", "0 3 * *", "'0 3 * *' has 4 fields"),
    ("archive.compaction.schedule", "0 0 3 * * *", "'0 0 3 * * *' has 6 fields"),
    ("archive.compaction.schedule", "daily", "'daily' has 1 field"),
    ("archive.compaction.schedule", "@every 1h", "or one of @yearly, @annually, @monthly, "
                                                 "@weekly, @daily, @midnight, @hourly"),
    ("archive.compaction.schedule", "60 3 * * *", "has '60' as its minute: use 0-59"),
    ("archive.compaction.schedule", "0 24 * * *", "has '24' as its hour: use 0-23"),
    ("archive.compaction.schedule", "0 3 0 * *", "has '0' as its day-of-month: use 1-31"),
    ("archive.compaction.schedule", "0 3 * 13 *", "has '13' as its month: use 1-12 or names"),
    ("archive.compaction.schedule", "0 3 * * 7", "has '7' as its day-of-week: use 0-6 or names"),
    ("archive.compaction.schedule", "0 3 * * sunday", "has 'sunday' as its day-of-week"),
    ("archive.compaction.schedule", "*/0 3 * * *", "has '*/0' as its minute"),
    ("archive.compaction.schedule", "50-10 3 * * *", "has '50-10' as its minute"),
    ("archive.compaction.schedule", "0,,30 3 * * *", "has '' as its minute"),
    ("archive.compaction.schedule", "CRON_TZ=UTC 0 3 * * *", "has 6 fields"),
    ("archive.compaction.schedule", 3, "spec.archive.compaction.schedule must be a string"),
    ("archive.compaction.minCompactionLag", "1d", "spec.archive.compaction.minCompactionLag "
                                                  "must be a duration: a whole number of "
                                                  "seconds, minutes or hours"),
    ("archive.compaction.minCompactionLag", "1h30m", "not '1h30m'"),
    ("archive.compaction.minCompactionLag", "1.5h", "such as 30m, 24h or 0s (7 days is 168h)"),
    ("archive.compaction.minCompactionLag", "-1h", "minCompactionLag must be a duration"),
    ("archive.compaction.minCompactionLag", "24", "minCompactionLag must be a duration"),
    ("archive.compaction.minCompactionLag", "1234567s", "at most 6 digits"),
    ("archive.compaction.minCompactionLag", 3600, "spec.archive.compaction.minCompactionLag "
                                                  "must be a string"),
    ("archive.compaction.deleteRetention", "a week", "spec.archive.compaction.deleteRetention "
                                                     "must be a duration"),
    ("archive.compaction.maxCompactionLag", "30d", "spec.archive.compaction.maxCompactionLag "
                                                   "must be a duration"),
    ("archive.compaction.maxCompactionLag", "23h", "spec.archive.compaction.minCompactionLag "
                                                   "(24h) must not exceed "
                                                   "spec.archive.compaction.maxCompactionLag "
                                                   "(23h)"),
    ("archive.compaction.minCleanableDirtyRatio", 0, "spec.archive.compaction."
                                                     "minCleanableDirtyRatio must be a number "
                                                     "more than 0 and at most 1, such as 0.5"),
    ("archive.compaction.minCleanableDirtyRatio", 1.01, "not 1.01"),
    ("archive.compaction.minCleanableDirtyRatio", -0.5, "not -0.5"),
    ("archive.compaction.minCleanableDirtyRatio", "0.5", "not '0.5'"),
    ("archive.compaction.minCleanableDirtyRatio", True, "not True"),
    ("archive.compaction.minCleanableDirtyRatio", float("nan"), "not nan"),
    ("archive.compaction.suspend", "no", "spec.archive.compaction.suspend must be true or false"),
    ("archive.export", ["s3://lake"], "spec.archive.export must be an object"),
    ("archive.export.schedule", DELETE, "spec.archive.export.schedule is required"),
    ("archive.export.schedule", "every hour", "spec.archive.export.schedule must be a cron "
                                              "schedule"),
    ("archive.export.destination", DELETE, "spec.archive.export.destination is required: "
                                           "where the change log goes (s3://bucket/prefix or "
                                           "file:///absolute/path)"),
    ("archive.export.destination", "lake/orders", "spec.archive.export.destination must start "
                                                  "with s3:// or file://"),
    ("archive.export.destination", "s3://k:s@lake", "spec.archive.export.destination must not "
                                                    "carry credentials"),
    ("archive.export.destination", "file://lake", "spec.archive.export.destination must be an "
                                                  "absolute file URL"),
    ("archive.export.format", "csv", "spec.archive.export.format must be parquet or delta, "
                                     "not 'csv'"),
    ("archive.export.format", "Parquet", "not 'Parquet'"),
    ("archive.export.suspend", 1, "spec.archive.export.suspend must be true or false"),
    ("deletion.finalSnapshot", "yes", "spec.deletion.finalSnapshot must be true or false"),
    ("tls.enabled", "no", "spec.tls.enabled must be true or false, not 'no'"),
    ("tls.clientCertAuth", 1, "spec.tls.clientCertAuth must be true or false"),
    ("tls.duration", "30m", "spec.tls.duration must be a duration of at least 1h"),
    ("tls.duration", "365d", "spec.tls.duration must be a duration of at least 1h"),
    ("tls.issuerRef", {"kind": "Issuer"}, "spec.tls.issuerRef.name is required"),
    ("tls.issuerRef", {"name": "ca", "kind": "VaultIssuer"},
     "spec.tls.issuerRef.kind must be Issuer or ClusterIssuer, not 'VaultIssuer'"),
    ("tls.issuerRef", {"name": "Bad_Name"}, "spec.tls.issuerRef.name must be a Kubernetes "
                                            "object name"),
    ("tls.secretName", "demo-ca", "spec.tls.secretName must not be 'demo-ca'"),
    ("tls.secretName", "CA!", "spec.tls.secretName must be a Kubernetes object name"),
    ("network.policy", "off", "spec.network.policy must be true or false"),
    ("network.clientFrom", {"podSelector": {}}, "spec.network.clientFrom must be a list of "
                                                "NetworkPolicy peers"),
    ("network.clientFrom", [{}], "spec.network.clientFrom[0] must be a NetworkPolicy peer"),
    ("network.clientFrom", [{"pods": {}}], "spec.network.clientFrom[0] has pods: a "
                                            "NetworkPolicy peer takes only"),
    ("network.clientFrom", [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}],
     "spec.network.clientFrom[0] sets ipBlock with a selector"),
    ("network.clientFrom", [{"ipBlock": {"cidr": "ten"}}],
     "spec.network.clientFrom[0].ipBlock.cidr must be a CIDR such as 10.0.0.0/8, not 'ten'"),
    ("network.clientFrom", [{"ipBlock": {}}], "spec.network.clientFrom[0].ipBlock.cidr is "
                                              "required"),
    ("network.clientFrom", [{"podSelector": {"matchLabels": {"app": 1}}}],
     "spec.network.clientFrom[0].podSelector.matchLabels must map label names to string values"),
    ("network.clientFrom", [{"namespaceSelector": {"matchExpressions": [
        {"key": "team", "operator": "Like", "values": ["a"]}]}}],
     "spec.network.clientFrom[0].namespaceSelector.matchExpressions[0].operator must be In or "
     "NotIn or Exists or DoesNotExist, not 'Like'"),
    ("network.clientFrom", [{"podSelector": {"matchExpressions": [
        {"key": "team", "operator": "In"}]}}],
     "matchExpressions[0]: In takes a non-empty list of values"),
    ("network.clientFrom", [{"podSelector": {"matchExpressions": [
        {"key": "team", "operator": "Exists", "values": ["x"]}]}}],
     "matchExpressions[0]: Exists takes no list of values"),
    ("network.clientFrom", [{"podSelector": {"labels": {}}}],
     "spec.network.clientFrom[0].podSelector has labels: a label selector takes"),
    ("stateMachine.class", "counter", "spec.stateMachine.class must be module:Class"),
    ("stateMachine.class", "counter.machine:Counter:x", "not 'counter.machine:Counter:x'"),
    ("stateMachine.class", "counter-machine:Counter", "spec.stateMachine.class must be "
                                                      "module:Class"),
    ("stateMachine.class", "counter.:Counter", "spec.stateMachine.class must be module:Class"),
    ("stateMachine.class", ":Counter", "spec.stateMachine.class must be module:Class"),
    ("stateMachine.class", 7, "spec.stateMachine.class must be a string"),
    ("stateMachine", {"image": "registry/counter:1"}, "spec.stateMachine.class"),
    ("stateMachine", "counter:Counter", "spec.stateMachine must be an object"),
    ("stateMachine", {"class": "c:C", "image": 7}, "spec.stateMachine.image must be a string"),
]


@pytest.mark.parametrize(("path", "value", "message"), INVALID,
                         ids=[f"{path}={value!r}" for path, value, _ in INVALID])
def test_an_invalid_field_is_named_in_one_readable_message(path, value, message):
    with pytest.raises(SpecError) as caught:
        ClusterSpec.from_body(body(with_field(path, value)))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


# A spec with a signing key and encryption, each field of which the table below breaks.
PROTECTED_SPEC: dict[str, Any] = {"archive": {
    "url": "s3://b", "signingKeySecret": {"name": "archive-key"},
    "encryption": {"type": "AES256"}}}
INVALID_PROTECTION = [
    ("archive.signingKeySecret.name", DELETE,
     "spec.archive.signingKeySecret.name is required: the Secret holding the archive's signing"),
    ("archive.signingKeySecret.name", "Archive_Key",
     "spec.archive.signingKeySecret.name must be a Kubernetes object name"),
    ("archive.signingKeySecret.key", "a/b",
     "spec.archive.signingKeySecret.key must be a key of a Secret"),
    ("archive.signingKeySecret.previousKeys", "old",
     "spec.archive.signingKeySecret.previousKeys must be a list of at most 8 keys"),
    ("archive.signingKeySecret.previousKeys", ["k"] * 9,
     "spec.archive.signingKeySecret.previousKeys must be a list of at most 8 keys"),
    ("archive.signingKeySecret.previousKeys", ["old", 7],
     "spec.archive.signingKeySecret.previousKeys[1] must be a key of a Secret"),
    ("archive.signingKeySecret.previousKeys", ["old", "old"],
     "spec.archive.signingKeySecret.previousKeys repeats a key"),
    ("archive.signingKeySecret.previousKeys", ["signing-key"],
     "names spec.archive.signingKeySecret.key (signing-key)"),
    ("archive.encryption.type", DELETE,
     "spec.archive.encryption.type is required: AES256 or aws:kms"),
    ("archive.encryption.type", "aes", "spec.archive.encryption.type must be AES256 or aws:kms"),
    ("archive.encryption.kmsKeyId", "alias/flotilla",  # with type AES256
     "spec.archive.encryption.kmsKeyId goes with type aws:kms, not AES256"),
    ("archive.encryption.kmsKeyId", "alias/my key",
     "spec.archive.encryption.kmsKeyId must be a KMS key id, ARN or alias"),
]


@pytest.mark.parametrize(("path", "value", "message"), INVALID_PROTECTION,
                         ids=[f"{path}={value!r}" for path, value, _ in INVALID_PROTECTION])
def test_an_invalid_signing_key_or_encryption_is_named_in_one_readable_message(path, value,
                                                                              message):
    spec = copy.deepcopy(PROTECTED_SPEC)
    *parents, last = path.split(".")
    target = spec
    for key in parents:
        target = target[key]
    if value is DELETE:
        del target[last]
    else:
        target[last] = value
    with pytest.raises(SpecError) as caught:
        ClusterSpec.from_body(body(spec))
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(("time", "message"), [
    ("2026-11-25T17:00:00", "'2026-11-25T17:00:00' is not an RFC 3339 time with an offset; "
                            "write it like 2026-11-25T17:00:00.250Z"),
    ("yesterday", "is not an RFC 3339 time with an offset"),
    ("2026-02-30T17:00:00Z", "'2026-02-30T17:00:00Z' is not a valid time"),
    ("1969-12-31T23:59:59Z", "is before 1970"),
    (1764090000250, "spec.bootstrap.restore.time must be a string"),
])
def test_an_invalid_restore_time_is_named_with_the_parsers_reason(time, message):
    restore = {"url": "s3://b", "time": time}
    with pytest.raises(SpecError) as caught:
        ClusterSpec.from_body(body({"bootstrap": {"restore": restore}}))
    assert str(caught.value).startswith("spec.bootstrap.restore.time")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_timing_rule_reads_like_the_crd():
    with pytest.raises(SpecError) as caught:
        ClusterSpec.from_body(body({"timing": {"electionTimeoutMs": 150}}))
    assert str(caught.value) == ("spec.timing.electionTimeoutMs (150) must be at least twice "
                                 "spec.timing.heartbeatMs (100); 10x is usual")


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"name": None}, "metadata.name is required"),
        ({"name": "Demo"}, "metadata.name 'Demo' cannot name a Raft cluster"),
        ({"name": "a.b"}, "metadata.name 'a.b' cannot name a Raft cluster"),
        ({"name": "1st"}, "starting with a letter"),
        ({"name": "x" * 53}, "at most 52 characters"),
    ],
)
def test_an_unusable_object_name_is_refused(metadata, message):
    with pytest.raises(SpecError, match=message):
        ClusterSpec.from_body(body(**metadata))


def test_a_spec_that_is_not_an_object_is_refused():
    with pytest.raises(SpecError, match="spec must be an object"):
        ClusterSpec.from_body(body(spec=["replicas", 3]))  # type: ignore[arg-type]


# -- archive URLs: refused here exactly when the node would exit 2 on them ------------------------


@pytest.mark.parametrize(
    "url",
    ["s3://bucket", "s3://bucket/a/b/", "file:///", "file:///var/archive", "file://localhost/x",
     "s3://", "s3:///x", "file://host/x", "file://", "s3://u:p@bucket", "s3://b?x=1",
     "file:///a#frag", "gs://bucket", "S3://bucket"],
)
def test_archive_urls_are_checked_like_the_node_checks_them(url):
    try:
        parse_archive_url(url)
        node_accepts = True
    except ValueError:
        node_accepts = False
    try:
        ClusterSpec.from_body(body({"archive": {"url": url}}))
        operator_accepts = True
    except SpecError:
        operator_accepts = False
    # The CRD only admits s3:// and file:// (lowercase), so S3:// is refused even if the node
    # would take it.
    assert operator_accepts == (node_accepts and url.startswith(("s3://", "file://")))


# -- the snapshot policy, as the node reads it -----------------------------------------------


@pytest.mark.parametrize(
    ("snapshot", "policy", "rules"),
    [
        ({}, None, None),
        ({"ratio": "0.1"}, "ratio=0.1", (RatioRule(Decimal("0.1"), DEFAULT_FLOOR),)),
        ({"ratio": "1"}, "ratio=1", (RatioRule(Decimal(1), DEFAULT_FLOOR),)),
        ({"ratio": "1.00"}, "ratio=1.00", (RatioRule(Decimal(1), DEFAULT_FLOOR),)),
        ({"logBytes": "64Mi"}, "log-bytes=64MiB", (LogBytesRule(64 * MiB),)),
        ({"logBytes": 4096}, "log-bytes=4KiB", (LogBytesRule(4096),)),
        ({"logBytes": "1000"}, "log-bytes=1000B", (LogBytesRule(1000),)),
        ({"logBytes": "1G"}, "log-bytes=1000000000B", (LogBytesRule(10**9),)),
        ({"logBytes": "1.5Gi"}, "log-bytes=1536MiB", (LogBytesRule(1536 * MiB),)),
        ({"logBytes": "2e3"}, "log-bytes=2000B", (LogBytesRule(2000),)),
        ({"logBytes": "1Ti"}, "log-bytes=1024GiB", (LogBytesRule(1 << 40),)),
        ({"entries": 10000}, "entries=10000", (EntriesRule(10000),)),
        ({"ratio": "0.1", "logBytes": "64Mi", "entries": 10000},
         "ratio=0.1,log-bytes=64MiB,entries=10000",
         (RatioRule(Decimal("0.1"), DEFAULT_FLOOR), LogBytesRule(64 * MiB),
          EntriesRule(10000))),
    ],
)
def test_the_snapshot_policy_round_trips_through_the_nodes_parser(snapshot, policy, rules):
    spec = ClusterSpec.from_body(body({"snapshot": snapshot}))
    assert spec.snapshot_policy == policy
    if policy is not None:
        assert SnapshotPolicy.parse(spec.snapshot_policy).rules == rules


# -- quantities ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [("1Gi", 1 << 30), ("64Mi", 64 * MiB), ("1.5Ki", 1536), ("500m", Decimal("0.5")),
     ("2", 2), ("1k", 1000), ("1M", 10**6), ("1E", 10**18), ("1Ei", 1 << 60),
     ("1e3", 1000), ("1E3", 1000), ("5e-1", Decimal("0.5")), (".5", Decimal("0.5")),
     ("+3", 3), ("100n", Decimal("1e-7")), ("3u", Decimal("3e-6"))],
)
def test_kubernetes_quantities(text, value):
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "Gi", "1 Gi", "1GB", "1gi", "1.2.3", "1e", "1K",
                                  "1e99999999999", "0x10"])
def test_not_quantities(text):
    with pytest.raises(ValueError):
        parse_quantity(text)


# -- names and helpers ----------------------------------------------------------------------------


@pytest.mark.parametrize(("tls", "scheme"), [({"enabled": False}, "http"), (None, "https")],
                         ids=["without TLS", "with TLS, the default"])
def test_members_and_their_urls(tls, scheme):
    spec = ClusterSpec.from_body(body({"tls": tls}))
    assert spec.member_names(3) == ["demo-0", "demo-1", "demo-2"]
    assert spec.peer_url("demo-1") == f"{scheme}://demo-1.demo-peers.prod.svc:2380"
    assert spec.client_url("demo-1") == f"{scheme}://demo-1.demo-peers.prod.svc:2379"
    assert spec.initial_cluster(["demo-0", "demo-1"]) == (
        f"demo-0={scheme}://demo-0.demo-peers.prod.svc:2380,"
        f"demo-1={scheme}://demo-1.demo-peers.prod.svc:2380"
    )


def test_labels_and_the_scale_selector():
    spec = ClusterSpec.from_body(body())
    assert spec.labels == {
        "app.kubernetes.io/name": "flotilla",
        "app.kubernetes.io/instance": "demo",
        "app.kubernetes.io/managed-by": "flotilla-operator",
        "app.kubernetes.io/component": "raft-member",
    }
    assert spec.selector == "app.kubernetes.io/name=flotilla,app.kubernetes.io/instance=demo"
    assert spec.selector_labels.items() <= spec.labels.items()


@pytest.mark.parametrize(("voters", "quorum"), [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (99, 50)])
def test_quorum_is_a_majority(voters, quorum):
    assert ClusterSpec.quorum(voters) == quorum


def test_the_spec_is_frozen():
    spec = ClusterSpec.from_body(body())
    with pytest.raises(AttributeError):
        spec.replicas = 5  # type: ignore[misc]


def test_an_archive_url_with_credentials_is_not_echoed():
    with pytest.raises(SpecError) as caught:
        ClusterSpec.from_body(body({"archive": {"url": "s3://AKIA:hunter2@bucket"}}))
    assert "hunter2" not in str(caught.value)


# -- scheduled compaction and export ------------------------------------------------------------


def test_compaction_and_export_take_only_a_schedule_and_a_destination():
    spec = ClusterSpec.from_body(body({"archive": {
        "url": "s3://b", "compaction": {"schedule": "@daily"},
        "export": {"schedule": "0 * * * *", "destination": "file:///lake"}}}))
    assert spec.archive.compaction == Compaction(schedule="@daily")
    assert spec.archive.compaction.min_cleanable_dirty_ratio is None  # the pipeline's default
    assert spec.archive.export == Export(schedule="0 * * * *", destination="file:///lake",
                                         format="parquet", suspend=False)
    assert list(spec.archive.scheduled()) == ["compaction", "export"]


def test_without_the_blocks_nothing_is_scheduled():
    archive = ClusterSpec.from_body(body({"archive": {"url": "s3://b"}})).archive
    assert (archive.compaction, archive.export, archive.scheduled()) == (None, None, {})
    null = ClusterSpec.from_body(body({"archive": {"url": "s3://b", "compaction": None}}))
    assert null.archive.compaction is None


@pytest.mark.parametrize("ratio", [1, 1.0, 0.5, 1e-9])
def test_the_dirty_ratio_takes_any_number_above_0_up_to_1(ratio):
    archive = ClusterSpec.from_body(body({"archive": {"url": "s3://b", "compaction": {
        "schedule": "@daily", "minCleanableDirtyRatio": ratio}}})).archive
    assert archive.compaction.min_cleanable_dirty_ratio == ratio


def test_equal_lags_are_allowed():
    compaction = {"schedule": "@daily", "minCompactionLag": "60m", "maxCompactionLag": "1h"}
    spec = ClusterSpec.from_body(body({"archive": {"url": "s3://b", "compaction": compaction}}))
    assert spec.archive.compaction.max_compaction_lag == "1h"


@pytest.mark.parametrize(("text", "value"), [("0s", 0), ("30m", 1800), ("24h", 86400),
                                             ("999999h", 999999 * 3600)])
def test_durations(text, value):
    assert seconds(text) == value


@pytest.mark.parametrize("schedule", [
    "0 3 * * *", "*/15 * * * *", "0 0 1,15 * *", "5-55/10 8-18 * jan-mar,dec mon-fri",
    "0 12 ? * SUN", "59 23 31 12 6", "0 0 1 1 0", "0  3 * * *", "@hourly", "@daily",
    "@midnight", "@weekly", "@monthly", "@yearly", "@annually", "10/5 * * * *",
])
def test_cron_schedules_the_api_server_takes(schedule):
    assert cron_problem(schedule) is None
    ClusterSpec.from_body(body({"archive": {"url": "s3://b", "compaction": {
        "schedule": schedule}}}))


@pytest.mark.parametrize(("name", "kind", "longest"), [("x" * 45, "compaction", 44),
                                                       ("x" * 46, "export", 45)])
def test_a_name_too_long_for_the_cronjob_is_refused(name, kind, longest):
    block = {"compaction": {"schedule": "@daily"},
             "export": {"schedule": "@daily", "destination": "s3://lake"}}[kind]
    spec = {"archive": {"url": "s3://b", kind: block}}
    with pytest.raises(SpecError) as caught:
        ClusterSpec.from_body(body(spec, name=name))
    assert str(caught.value).startswith(f"metadata.name '{name}' is too long for "
                                        f"spec.archive.{kind}: its CronJob ")
    assert f"at most 52 characters, so the RaftCluster's name at most {longest}" in str(
        caught.value)
    ok = ClusterSpec.from_body(body(spec, name="x" * longest))
    assert len(ok.archive_job_name(kind)) == 52
    ClusterSpec.from_body(body({"archive": {"url": "s3://b"}}, name=name))  # no CronJob: fine


def test_the_scheduled_jobs_names_and_labels():
    spec = ClusterSpec.from_body(body(FULL_SPEC))
    assert (spec.archive_job_name("compaction"), spec.archive_job_name("export")) == (
        "demo-compact", "demo-export")
    for kind, job in (("compaction", "compact"), ("export", "export")):
        labels = spec.archive_job_labels(kind)
        assert labels == {"app.kubernetes.io/name": f"flotilla-{job}",
                          "app.kubernetes.io/instance": "demo",
                          "app.kubernetes.io/managed-by": "flotilla-operator",
                          "app.kubernetes.io/component": f"{job}-job"}
        assert not spec.selector_labels.items() <= labels.items()  # never taken for members
        assert spec.archive_job_selector(kind) == ",".join(f"{k}={v}" for k, v in
                                                           labels.items())
        both = dict(term.split("=") for term in spec.archive_jobs_selector.split(","))
        assert both.items() <= labels.items()


# -- TLS, the admin token, the NetworkPolicy, default resources ---------------------------------


def test_tls_settings_are_read():
    spec = ClusterSpec.from_body(body({"tls": {
        "clientCertAuth": True, "duration": "2160h",
        "issuerRef": {"name": "platform-ca", "kind": "ClusterIssuer"}}}))
    assert spec.tls == Tls(enabled=True, issuer_ref=IssuerRef("platform-ca", "ClusterIssuer",
                                                              "cert-manager.io"),
                           client_cert_auth=True, secret_name=None, duration="2160h")
    assert spec.tls.issuer == "cert-manager/ClusterIssuer/platform-ca"
    assert spec.tls.seconds == 2160 * 3600
    assert spec.ca_secret_name is None  # cert-manager signs: the operator holds no CA
    own = ClusterSpec.from_body(body({"tls": {"secretName": "team-ca"}}))
    assert (own.tls.issuer, own.ca_secret_name) == ("secret/team-ca", "team-ca")
    default = ClusterSpec.from_body(body())
    assert (default.tls.issuer, default.ca_secret_name) == ("operator", "demo-ca")
    plain = ClusterSpec.from_body(body({"tls": {"enabled": False}}))
    assert (plain.tls.issuer, plain.scheme) == ("none", "http")


def test_the_secret_names_and_the_names_on_a_members_certificate():
    spec = ClusterSpec.from_body(body())
    assert spec.member_tls_secret("demo-3") == "demo-3-tls"
    assert spec.client_tls_secret == "demo-client-tls"
    names = spec.member_dns_names("demo-3")
    assert names[0] == "demo-3"  # what the peers' identity check reads
    assert {"demo-3.demo-peers.prod.svc", "demo-3.demo-peers.prod.svc.cluster.local",
            "demo.prod.svc", "demo.prod.svc.cluster.local", "localhost"} <= set(names)
    # every name a client dials: the member's advertised URLs and the client Service
    assert spec.member_host("demo-3") in names
    assert not any(n.startswith("demo-") and n != "demo-3" and "." not in n for n in names)


@pytest.mark.parametrize(("tls", "message"), [
    ({"issuerRef": {"name": "ca"}, "secretName": "team-ca"},
     "spec.tls sets both issuerRef and secretName: give one"),
    ({"enabled": False, "clientCertAuth": True},
     "spec.tls.enabled is false, so clientCertAuth would do nothing"),
    ({"enabled": False, "issuerRef": {"name": "ca"}, "secretName": "x"},
     "spec.tls sets both issuerRef and secretName"),
    ({"enabled": False, "secretName": "team-ca"},
     "spec.tls.enabled is false, so secretName would do nothing"),
])
def test_tls_settings_that_contradict_each_other_are_refused(tls, message):
    with pytest.raises(SpecError, match=re.escape(message)):
        ClusterSpec.from_body(body({"tls": tls}))


@pytest.mark.parametrize(("recorded", "tls", "message"), [
    ({"enabled": True, "issuer": "operator"}, {"enabled": False},
     "spec.tls.enabled cannot change once the cluster has bootstrapped (it runs with TLS on)"),
    ({"enabled": False, "issuer": "none"}, {},
     "spec.tls.enabled cannot change once the cluster has bootstrapped (it runs with TLS off)"),
    ({"enabled": True, "issuer": "operator"}, {"issuerRef": {"name": "ca"}},
     "its certificates come from operator, the spec now says cert-manager/Issuer/ca"),
    ({"enabled": True, "issuer": "secret/team-ca"}, {"secretName": "other-ca"},
     "its certificates come from secret/team-ca, the spec now says secret/other-ca"),
])
def test_tls_and_its_signer_are_fixed_once_the_cluster_has_bootstrapped(recorded, tls,
                                                                         message):
    with pytest.raises(SpecError, match=re.escape(message)):
        ClusterSpec.from_body(body({"tls": tls}, status={"bootstrapped": True, "tls": recorded}))
    # before the first leader, nothing runs yet that the change could break
    ClusterSpec.from_body(body({"tls": tls}, status={"bootstrapped": False, "tls": recorded}))


def test_the_admin_token_secret_is_the_specs_or_the_generated_one():
    assert ClusterSpec.from_body(body()).admin_token_secret == SecretKey("demo-admin-token",
                                                                         "token")
    named = ClusterSpec.from_body(body({"adminTokenSecret": {"name": "mine", "key": "t"}}))
    assert named.admin_token_secret == named.admin_token == SecretKey("mine", "t")


def test_network_settings_are_read():
    peers = [{"podSelector": {"matchLabels": {"app": "orders"}}},
             {"namespaceSelector": {"matchExpressions": [
                 {"key": "team", "operator": "In", "values": ["a", "b"]}]},
              "podSelector": {}},
             {"ipBlock": {"cidr": "10.1.0.0/16", "except": ["10.1.2.0/24"]}}]
    spec = ClusterSpec.from_body(body({"network": {"clientFrom": peers}}))
    assert spec.network == Network(policy=True, client_from=tuple(peers))
    assert ClusterSpec.from_body(body({"network": {"clientFrom": []}})).network.client_from == ()
    assert ClusterSpec.from_body(body({"network": {"policy": False}})).network.policy is False


def test_default_resources_only_when_the_spec_sets_none():
    assert ClusterSpec.from_body(body()).container_resources == {
        "requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}}
    limits_only = ClusterSpec.from_body(body({"resources": {"limits": {"memory": "4Gi"}}}))
    assert limits_only.container_resources == {"limits": {"memory": "4Gi"}}


def test_a_cluster_that_bootstrapped_before_tls_existed_keeps_running_without():
    """Its status records no TLS, and the API server fills in `enabled: true`: switching it
    to https would break its committed http peer URLs, so it stays as it runs."""
    before = {"bootstrapped": True, "clusterId": "prod-demo-6f1c2a9e"}
    for tls in (None, {"enabled": True}, {"issuerRef": {"name": "ca"}}):
        spec = ClusterSpec.from_body(body({"tls": tls}, status=before))
        assert (spec.tls.enabled, spec.tls.legacy, spec.scheme) == (False, True, "http")
    # ...also once the operator has recorded it so
    recorded = {**before, "tls": {"enabled": False, "issuer": "none", "legacy": True}}
    assert ClusterSpec.from_body(body(status=recorded)).tls.legacy is True
    # a cluster not bootstrapped yet takes the spec as it is
    fresh = ClusterSpec.from_body(body(status={"bootstrapped": False}))
    assert (fresh.tls.enabled, fresh.tls.legacy) == (True, False)


@pytest.mark.parametrize("machine", ["counter:Counter", "counter.machine:Counter",
                                     "pkg.sub.mod:Outer.Machine", "_m:_C"])
def test_a_state_machine_is_module_colon_class_with_dotted_parts(machine):
    spec = ClusterSpec.from_body(body({"stateMachine": {"class": machine}}),
                                 default_image="flotilla:1")
    assert spec.state_machine.cls == machine and spec.state_machine.image is None
    assert spec.image == "flotilla:1"  # no image of its own: the cluster's


def test_the_state_machines_image_runs_the_members():
    spec = ClusterSpec.from_body(body({"image": "flotilla:1", "stateMachine": {
        "class": "counter:Counter", "image": "registry/counter:2"}}))
    assert spec.image == "registry/counter:2"
    assert spec.state_machine.image == "registry/counter:2"
    assert ClusterSpec.from_body(body()).state_machine is None

