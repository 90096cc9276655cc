"""The RaftCluster CRD and the examples, checked offline.

The CRD is the operator's user interface: `kubectl explain` reads its descriptions, the API
server applies its defaults and refuses what its rules forbid before the operator sees a
change. These tests pin that behaviour without a cluster:

- `kubernetes_validate` checks the CRD object itself against the published
  CustomResourceDefinition schema (strict: a misspelt keyword fails) and the built-in kinds in
  the examples. It has no schema for RaftCluster, so it cannot check those.
- `crdschema.CRDValidator` admits RaftCluster objects the way the API server does (pruning,
  defaulting, OpenAPI validation, CEL rules), so bad specs are shown to be refused with a
  message that says what to fix.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import celpy
import kubernetes_validate
import pytest
import yaml
from flotilla.operator.spec import ClusterSpec

from tests.packaging.crdschema import CRDValidator, iter_schemas, load_crd, version_schema

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "crds" / "raftcluster.yaml"
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
VERSION = "v1alpha1"
# The oldest Kubernetes we support (CEL fieldPath, transition rules) and the newest the
# installed kubernetes-validate knows.
KUBERNETES_VERSIONS = ["1.30", kubernetes_validate.latest_version()]


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return load_crd(CRD_PATH)


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> dict[str, Any]:
    return version_schema(crd, VERSION)


@pytest.fixture(scope="module")
def validator(crd: dict[str, Any]) -> CRDValidator:
    return CRDValidator(crd, VERSION)


def raftcluster(spec: dict[str, Any] | None = None, **fields: Any) -> dict[str, Any]:
    obj = {"apiVersion": "flotilla.dev/v1alpha1", "kind": "RaftCluster",
           "metadata": {"name": "orders", "namespace": "default"}, **fields}
    if spec is not None:
        obj["spec"] = spec
    return obj


def stored(validator: CRDValidator, spec: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """The object as the API server stores it after a successful create."""
    obj, errors = validator.admit(raftcluster(spec, **fields))
    assert errors == []
    return obj


# --- the CRD object -------------------------------------------------------------------------


@pytest.mark.parametrize("kubernetes", KUBERNETES_VERSIONS)
def test_crd_is_a_valid_customresourcedefinition(crd: dict[str, Any], kubernetes: str) -> None:
    kubernetes_validate.validate(crd, kubernetes, strict=True)


def test_kubernetes_validate_catches_a_misspelt_schema_keyword(crd: dict[str, Any]) -> None:
    """Guards the check above: strict mode must refuse what the API server would refuse."""
    broken = yaml.safe_load(yaml.safe_dump(crd))
    replicas = version_schema(broken, VERSION)["properties"]["spec"]["properties"]["replicas"]
    replicas["minimun"] = replicas.pop("minimum")
    with pytest.raises(kubernetes_validate.ValidationError, match="minimun"):
        kubernetes_validate.validate(broken, KUBERNETES_VERSIONS[0], strict=True)


def test_names_scope_and_version(crd: dict[str, Any]) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == "raftclusters.flotilla.dev"
    assert spec["group"] == "flotilla.dev"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "RaftCluster", "listKind": "RaftClusterList", "plural": "raftclusters",
        "singular": "raftcluster", "shortNames": ["raft"], "categories": ["flotilla"],
    }
    assert [(v["name"], v["served"], v["storage"]) for v in spec["versions"]] == [
        (VERSION, True, True)
    ]


def test_scale_and_status_subresources(crd: dict[str, Any]) -> None:
    assert crd["spec"]["versions"][0]["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }


def test_printer_columns(crd: dict[str, Any]) -> None:
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [(c["name"], c["jsonPath"], c["type"]) for c in columns] == [
        ("Replicas", ".spec.replicas", "integer"),
        ("Ready", ".status.readyReplicas", "integer"),
        ("Leader", ".status.leader", "string"),
        ("Term", ".status.term", "integer"),
        ("Phase", ".status.phase", "string"),
        ("Age", ".metadata.creationTimestamp", "date"),
    ]


def test_every_field_has_a_description_for_kubectl_explain(schema: dict[str, Any]) -> None:
    # Root metadata is the exception the API server imposes: it forbids anything but `type`.
    missing = [path or "<root>" for path, node in iter_schemas(schema)
               if path != "metadata" and not node.get("description", "").strip()]
    assert missing == []


def _json_schema_props_keywords() -> set[str]:
    """The keywords the API server accepts in a schema node, from the same OpenAPI definitions
    kubernetes-validate uses (which only checks them outside of `items`)."""
    folder = f"v{KUBERNETES_VERSIONS[0]}.0-local-strict"
    text = (resources.files(kubernetes_validate) / "kubernetes-json-schema" / folder
            / "_definitions.json").read_text()
    definitions = json.loads(text)["$defs"]
    name = "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions.v1.JSONSchemaProps"
    return set(definitions[name]["properties"])


def structural_problems(schema: dict[str, Any]) -> list[str]:
    """The rules of a structural schema (the API server refuses a CRD that breaks them) that
    matter for a schema without allOf/oneOf/not, plus the metadata restriction."""
    keywords, problems = _json_schema_props_keywords(), []
    int_or_string = [{"type": "integer"}, {"type": "string"}]
    if schema.get("type") != "object":
        problems.append("<root>: type must be object")
    if schema["properties"].get("metadata") != {"type": "object"}:
        problems.append("metadata: must be exactly {type: object}")
    for path, node in iter_schemas(schema):
        where = path or "<root>"
        problems += [f"{where}: unknown keyword {k}" for k in sorted(set(node) - keywords)]
        if node.get("x-kubernetes-preserve-unknown-fields") is False:
            problems.append(f"{where}: x-kubernetes-preserve-unknown-fields must be true or unset")
        if node.get("x-kubernetes-int-or-string"):
            if "type" in node or node.get("anyOf", int_or_string) != int_or_string:
                problems.append(f"{where}: int-or-string takes no type, anyOf integer|string")
        elif "anyOf" in node or "allOf" in node or "oneOf" in node or "not" in node:
            problems.append(f"{where}: logic junctors are only used for int-or-string")
        elif "type" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
            problems.append(f"{where}: type is required")
        if node.get("type") == "array" and not isinstance(node.get("items"), dict):
            problems.append(f"{where}: an array needs items")
        if "properties" in node and "additionalProperties" in node:
            problems.append(f"{where}: properties and additionalProperties are exclusive")
        for key in node.get("x-kubernetes-list-map-keys", []):
            if key not in node["items"].get("required", []):
                problems.append(f"{where}: list-map key {key} must be required")
    return problems


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    assert structural_problems(schema) == []


def test_structural_check_finds_an_untyped_field(schema: dict[str, Any]) -> None:
    broken = yaml.safe_load(yaml.safe_dump(schema))
    del broken["properties"]["spec"]["properties"]["image"]["type"]
    assert structural_problems(broken) == ["spec.image: type is required"]


def test_defaults_are_valid_values_of_their_field(schema: dict[str, Any]) -> None:
    """The API server refuses a CRD whose defaults its own schema would refuse."""
    for path, node in iter_schemas(schema):
        if "default" in node:
            wrapper = {"type": "object", "properties": {"field": node}}
            check = CRDValidator(
                {"spec": {"versions": [{"name": "v", "schema": {"openAPIV3Schema": wrapper}}]}},
                "v",
            )
            assert check.admit({"field": node["default"]})[1] == [], path


_FIELD_READ = re.compile(r"\b(?:oldSelf|self)((?:\.[A-Za-z_]\w*\b(?!\s*\())*)")


def test_cel_rules_compile_and_only_read_bounded_values(schema: dict[str, Any]) -> None:
    """The API server estimates each rule's worst-case cost from maxLength and maxItems and
    refuses a CRD whose rules could cost too much: every string or list a rule reads, and every
    value below an object it compares as a whole, must be bounded. celpy must also parse the
    rule (Kubernetes extensions it lacks would show up here)."""
    environment, unbounded = celpy.Environment(), []
    for path, node in iter_schemas(schema):
        for rule in node.get("x-kubernetes-validations", []):
            environment.compile(rule["rule"])
            for fields in _FIELD_READ.findall(rule["rule"]):
                target = node
                for name in fields.split(".")[1:]:
                    target = target["properties"][name]
                nodes = iter_schemas(target) if not fields else [("", target)]
                for sub, read in nodes:
                    if (read.get("type") == "string" and "maxLength" not in read
                            and "enum" not in read) or (
                            read.get("type") == "array" and "maxItems" not in read):
                        unbounded.append(f"{path}{fields}{sub} read by {rule['rule']!r}")
    assert unbounded == []


# --- the examples ---------------------------------------------------------------------------


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def _example(name: str, kind: str = "RaftCluster") -> dict[str, Any]:
    return next(d for d in _documents(ROOT / "examples" / name) if d["kind"] == kind)


def test_the_seven_examples_exist() -> None:
    assert [p.name for p in EXAMPLES] == ["basic.yaml", "compaction-and-export.yaml",
                                          "pod-placement.yaml", "restore-point-in-time.yaml",
                                          "restore.yaml", "s3-archive.yaml",
                                          "tls-cert-manager.yaml"]


def test_the_pod_placement_example_reads_as_the_operator_reads_it(validator: CRDValidator
                                                                  ) -> None:
    spec = ClusterSpec.from_body(validator.admit(_example("pod-placement.yaml"))[0])
    account = _example("pod-placement.yaml", kind="ServiceAccount")
    assert spec.pod.service_account_name == account["metadata"]["name"]
    assert spec.archive is not None and spec.archive.access_key_id is None  # the IAM role
    assert spec.pod.image_pull_secrets == ("regcred",)
    assert [c["whenUnsatisfiable"] for c in spec.pod.spread(spec.selector_labels)] == [
        "DoNotSchedule", "ScheduleAnyway"]


def test_the_cert_manager_example_reads_as_the_operator_reads_it(validator: CRDValidator
                                                                 ) -> None:
    spec = ClusterSpec.from_body(validator.admit(_example("tls-cert-manager.yaml"))[0])
    assert spec.tls.issuer == "cert-manager/ClusterIssuer/platform-ca"
    assert spec.tls.client_cert_auth and spec.tls.duration == "2160h"
    assert spec.ca_secret_name is None
    assert spec.network.client_from == ({"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "orders-app"}}},)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_is_admitted(path: Path, validator: CRDValidator) -> None:
    assert path.read_text().startswith("# "), "an example starts by saying what it shows"
    for doc in _documents(path):
        if doc["kind"] == "RaftCluster":
            # kubernetes-validate has no schema for custom kinds: that is crdschema's job.
            with pytest.raises(kubernetes_validate.SchemaNotFoundError):
                kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[0], strict=True)
            assert validator.admit(doc)[1] == []
        else:
            kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[0], strict=True)


def test_basic_example_gets_the_documented_defaults(validator: CRDValidator) -> None:
    spec = validator.admit(_example("basic.yaml"))[0]["spec"]
    assert spec == {
        "replicas": 3,
        "imagePullPolicy": "IfNotPresent",
        "storage": {"size": "1Gi", "removedVolumePolicy": "Delete"},
        "bootstrap": {"new": {}},
        "timing": {"electionTimeoutMs": 1000, "heartbeatMs": 100, "catchUpTimeoutSeconds": 600},
        "tls": {"enabled": True, "clientCertAuth": False, "duration": "8760h"},
        "network": {"policy": True},
        "deletion": {"finalSnapshot": True},
    }


def test_an_object_without_spec_is_a_default_cluster(validator: CRDValidator) -> None:
    spec = stored(validator, None)["spec"]
    assert (spec["replicas"], spec["bootstrap"]) == (3, {"new": {}})


def test_s3_example_secret_holds_the_keys_the_cluster_reads(validator: CRDValidator) -> None:
    secret = _example("s3-archive.yaml", kind="Secret")
    archive = validator.admit(_example("s3-archive.yaml"))[0]["spec"]["archive"]
    credentials = archive["credentialsSecret"]
    assert credentials["name"] == secret["metadata"]["name"]
    assert {credentials["accessKeyIdKey"], credentials["secretAccessKeyKey"]} == set(
        secret["stringData"]
    )
    assert (archive["keepSnapshots"], archive["intervalMs"]) == (5, 2000)


def test_restore_example_reads_the_s3_example_archive(validator: CRDValidator) -> None:
    restore = _example("restore.yaml")
    old_archive = _example("s3-archive.yaml")["spec"]["archive"]
    assert restore["spec"]["bootstrap"]["restore"]["url"] == old_archive["url"]
    assert restore["spec"]["archive"]["url"] != old_archive["url"]
    assert "index" not in restore["spec"]["bootstrap"]["restore"]  # the newest snapshot


def test_restore_example_commented_variants_are_valid(validator: CRDValidator) -> None:
    text = (ROOT / "examples" / "restore.yaml").read_text()
    text = text.replace("# clusterId:", "clusterId:").replace("# index:", "index:")
    doc = next(d for d in yaml.safe_load_all(text) if d)
    restore = validator.admit(doc)[0]["spec"]["bootstrap"]["restore"]
    assert restore == {"url": "s3://flotilla-archive/orders",
                       "clusterId": "default-orders-1f2e3d4c", "index": 120000}


def test_point_in_time_example_reads_the_s3_example_archive_at_a_time(
    validator: CRDValidator,
) -> None:
    restore = _example("restore-point-in-time.yaml")
    old_archive = _example("s3-archive.yaml")["spec"]["archive"]
    stored = validator.admit(restore)[0]["spec"]
    assert stored["bootstrap"]["restore"] == {"url": old_archive["url"],
                                              "clusterId": "default-orders-1f2e3d4c",
                                              "time": "2026-11-25T17:00:00.250Z"}
    assert stored["archive"]["url"] != old_archive["url"]
    secret = old_archive["credentialsSecret"]["name"]
    assert stored["archive"]["credentialsSecret"]["name"] == secret


def test_compaction_and_export_example_schedules_both_jobs(validator: CRDValidator) -> None:
    stored = validator.admit(_example("compaction-and-export.yaml"))[0]
    archive = stored["spec"]["archive"]
    assert archive["credentialsSecret"]["name"] == _example(
        "compaction-and-export.yaml", kind="Secret")["metadata"]["name"]
    assert (archive["compaction"]["suspend"], archive["export"]["suspend"]) == (False, False)
    assert archive["export"]["format"] == "parquet"
    spec = ClusterSpec.from_body({**stored, "metadata": {"name": "ledger"}})
    assert list(spec.archive.scheduled()) == ["compaction", "export"]


# --- what the API server refuses ------------------------------------------------------------

RESTORE = {"restore": {"url": "s3://flotilla-archive/orders"}}

# (case, spec of a new object, fragments that one error message must all contain)
REFUSED_ON_CREATE = [
    ("replicas 0", {"replicas": 0},
     ["spec.replicas", "Invalid value: 0", "greater than or equal to 1"]),
    ("replicas 0 (CEL)", {"replicas": 0}, ["spec.replicas", "replicas must be at least 1"]),
    ("replicas -1", {"replicas": -1}, ["spec.replicas", "greater than or equal to 1"]),
    ("replicas 100", {"replicas": 100}, ["spec.replicas", "less than or equal to 99"]),
    ("replicas 'three'", {"replicas": "three"}, ["spec.replicas", "must be of type integer"]),
    ("typo spec.replica", {"replica": 3}, ['unknown field "spec.replica"']),
    ("field in bootstrap.new", {"bootstrap": {"new": {"fast": True}}},
     ['unknown field "spec.bootstrap.new.fast"']),
    ("bootstrap new and restore", {"bootstrap": {"new": {}, **RESTORE}},
     ["spec.bootstrap", "exactly one of new or restore"]),
    ("bootstrap neither", {"bootstrap": {}}, ["spec.bootstrap", "exactly one of new or restore"]),
    ("restore without url", {"bootstrap": {"restore": {"index": 5}}},
     ["spec.bootstrap.restore.url", "Required value"]),
    ("restore url relative", {"bootstrap": {"restore": {"url": "backups/orders"}}},
     ["spec.bootstrap.restore.url", "s3://bucket/prefix", "file:///absolute/path"]),
    ("negative restore index", {"bootstrap": {"restore": {"url": "s3://b", "index": -1}}},
     ["spec.bootstrap.restore.index", "Invalid value: -1", "greater than or equal to 1"]),
    # Index 0 is the empty state: the node refuses to restore it (a restore index is at least 1).
    ("restore index 0", {"bootstrap": {"restore": {"url": "s3://b", "index": 0}}},
     ["spec.bootstrap.restore.index", "greater than or equal to 1"]),
    ("restore index and time", {"bootstrap": {"restore": {
        "url": "s3://b", "index": 5, "time": "2026-11-25T17:00:00Z"}}},
     ["spec.bootstrap.restore", "at most one of index and time"]),
    ("restore time without an offset", {"bootstrap": {"restore": {
        "url": "s3://b", "time": "2026-11-25T17:00:00"}}},
     ["spec.bootstrap.restore.time", "RFC 3339 time with an offset"]),
    ("restore time in words", {"bootstrap": {"restore": {"url": "s3://b", "time": "yesterday"}}},
     ["spec.bootstrap.restore.time", "such as 2026-11-25T17:00:00.250Z"]),
    ("restore time as a number", {"bootstrap": {"restore": {"url": "s3://b", "time": 17}}},
     ["spec.bootstrap.restore.time", "must be of type string"]),
    ("restore cluster id with a slash", {"bootstrap": {"restore": {"url": "s3://b",
                                                                   "clusterId": "a/b"}}},
     ["spec.bootstrap.restore.clusterId", "should match"]),
    ("archive url http", {"archive": {"url": "http://x"}},
     ["spec.archive.url", "s3://bucket/prefix", "file:///absolute/path"]),
    ("archive url relative file", {"archive": {"url": "file://archive"}},
     ["spec.archive.url", "file:///absolute/path"]),
    ("archive url with credentials", {"archive": {"url": "s3://key:secret@bucket/p"}},
     ["spec.archive.url", "without credentials"]),
    ("archive without url", {"archive": {"endpoint": "http://minio:9000"}},
     ["spec.archive.url", "Required value"]),
    ("archive endpoint without scheme", {"archive": {"url": "s3://b", "endpoint": "minio:9000"}},
     ["spec.archive.endpoint", "http:// or https://"]),
    ("credentials secret without name", {"archive": {"url": "s3://b", "credentialsSecret": {}}},
     ["spec.archive.credentialsSecret.name", "Required value"]),
    ("signing key secret without name", {"archive": {"url": "s3://b",
                                                      "signingKeySecret": {"key": "k"}}},
     ["spec.archive.signingKeySecret.name", "Required value"]),
    ("signing key secret name not a name", {"archive": {"url": "s3://b", "signingKeySecret": {
        "name": "Archive_Key"}}}, ["spec.archive.signingKeySecret.name", "should match"]),
    ("signing key with a slash", {"archive": {"url": "s3://b", "signingKeySecret": {
        "name": "archive-key", "key": "a/b"}}}, ["spec.archive.signingKeySecret.key", "match"]),
    ("previous keys list the signing key", {"archive": {"url": "s3://b", "signingKeySecret": {
        "name": "archive-key", "previousKeys": ["old", "signing-key"]}}},
     ["spec.archive.signingKeySecret", "previousKeys must not list key"]),
    ("previous keys repeated", {"archive": {"url": "s3://b", "signingKeySecret": {
        "name": "archive-key", "previousKeys": ["old", "old"]}}},
     ["spec.archive.signingKeySecret.previousKeys", "lists a key twice"]),
    ("encryption without type", {"archive": {"url": "s3://b", "encryption": {}}},
     ["spec.archive.encryption.type", "Required value"]),
    ("encryption type aes", {"archive": {"url": "s3://b", "encryption": {"type": "aes"}}},
     ["spec.archive.encryption.type", 'Unsupported value: "aes"', '"AES256", "aws:kms"']),
    ("kms key with AES256", {"archive": {"url": "s3://b", "encryption": {
        "type": "AES256", "kmsKeyId": "alias/flotilla"}}},
     ["spec.archive.encryption", "kmsKeyId goes with type aws:kms"]),
    ("election timeout below two heartbeats",
     {"timing": {"electionTimeoutMs": 150, "heartbeatMs": 100}},
     ["spec.timing", "electionTimeoutMs must be at least twice timing.heartbeatMs"]),
    ("heartbeat default vs short election timeout", {"timing": {"electionTimeoutMs": 150}},
     ["spec.timing", "at least twice"]),
    ("removedVolumePolicy Maybe", {"storage": {"removedVolumePolicy": "Maybe"}},
     ["spec.storage.removedVolumePolicy", 'Unsupported value: "Maybe"', '"Delete", "Retain"']),
    ("storage size not a quantity", {"storage": {"size": "ten gigs"}},
     ["spec.storage.size", "should match"]),
    ("imagePullPolicy lower case", {"imagePullPolicy": "always"},
     ["spec.imagePullPolicy", "Unsupported value", '"Always"']),
    ("clusterId upper case", {"clusterId": "Orders"}, ["spec.clusterId", "should match"]),
    ("clusterId too long", {"clusterId": "a" * 64}, ["spec.clusterId", "Too long", "63"]),
    ("snapshot ratio 0", {"snapshot": {"ratio": "0"}}, ["spec.snapshot.ratio", "should match"]),
    ("snapshot ratio 1.5", {"snapshot": {"ratio": "1.5"}}, ["spec.snapshot.ratio", "match"]),
    ("snapshot ratio as a number", {"snapshot": {"ratio": 0.1}},
     ["spec.snapshot.ratio", "must be of type string"]),
    ("snapshot entries 0", {"snapshot": {"entries": 0}},
     ["spec.snapshot.entries", "greater than or equal to 1"]),
    ("resources with a bad quantity", {"resources": {"limits": {"memory": "1 GB"}}},
     ["spec.resources.limits.memory", "should match"]),
    ("admin token secret without name", {"adminTokenSecret": {"key": "t"}},
     ["spec.adminTokenSecret.name", "Required value"]),
    ("compaction without schedule", {"archive": {"url": "s3://b", "compaction": {}}},
     ["spec.archive.compaction.schedule", "Required value"]),
    ("compaction schedule of four fields", {"archive": {"url": "s3://b", "compaction": {
        "schedule": "0 3 * *"}}}, ["spec.archive.compaction.schedule", "should match"]),
    ("compaction schedule in words", {"archive": {"url": "s3://b", "compaction": {
        "schedule": "every night"}}}, ["spec.archive.compaction.schedule", "should match"]),
    ("compaction lag in days", {"archive": {"url": "s3://b", "compaction": {
        "schedule": "@daily", "minCompactionLag": "7d"}}},
     ["spec.archive.compaction.minCompactionLag", "should match"]),
    ("compaction lag as a number", {"archive": {"url": "s3://b", "compaction": {
        "schedule": "@daily", "deleteRetention": 3600}}},
     ["spec.archive.compaction.deleteRetention", "must be of type string"]),
    ("compaction lags the wrong way round", {"archive": {"url": "s3://b", "compaction": {
        "schedule": "@daily", "minCompactionLag": "48h", "maxCompactionLag": "2879m"}}},
     ["spec.archive.compaction.minCompactionLag",
      "minCompactionLag must not exceed archive.compaction.maxCompactionLag"]),
    ("dirty ratio 0", {"archive": {"url": "s3://b", "compaction": {
        "schedule": "@daily", "minCleanableDirtyRatio": 0}}},
     ["spec.archive.compaction.minCleanableDirtyRatio", "Invalid value: 0",
      "should be greater than 0"]),
    ("dirty ratio 1.5", {"archive": {"url": "s3://b", "compaction": {
        "schedule": "@daily", "minCleanableDirtyRatio": 1.5}}},
     ["spec.archive.compaction.minCleanableDirtyRatio", "less than or equal to 1"]),
    ("dirty ratio as a string", {"archive": {"url": "s3://b", "compaction": {
        "schedule": "@daily", "minCleanableDirtyRatio": "0.5"}}},
     ["spec.archive.compaction.minCleanableDirtyRatio", "must be of type number"]),
    ("export without destination", {"archive": {"url": "s3://b", "export": {
        "schedule": "@daily"}}}, ["spec.archive.export.destination", "Required value"]),
    ("export to http", {"archive": {"url": "s3://b", "export": {
        "schedule": "@daily", "destination": "https://lake.example/orders"}}},
     ["spec.archive.export.destination", "s3://bucket/prefix", "file:///absolute/path"]),
    ("export format csv", {"archive": {"url": "s3://b", "export": {
        "schedule": "@daily", "destination": "s3://lake", "format": "csv"}}},
     ["spec.archive.export.format", 'Unsupported value: "csv"', '"parquet", "delta"']),
    ("typo in compaction", {"archive": {"url": "s3://b", "compaction": {
        "schedule": "@daily", "minCompactionLagMs": 1000}}},
     ['unknown field "spec.archive.compaction.minCompactionLagMs"']),
    ("tls issuerRef and secretName", {"tls": {"issuerRef": {"name": "ca"}, "secretName": "ca"}},
     ["spec.tls", "sets both issuerRef and secretName"]),
    ("tls off with clientCertAuth", {"tls": {"enabled": False, "clientCertAuth": True}},
     ["spec.tls", "tls.enabled is false", "would do"]),
    ("tls off with an issuer", {"tls": {"enabled": False, "issuerRef": {"name": "ca"}}},
     ["spec.tls", "tls.enabled is false"]),
    ("tls issuer of another kind", {"tls": {"issuerRef": {"name": "ca", "kind": "Vault"}}},
     ["spec.tls.issuerRef.kind", 'Unsupported value: "Vault"', '"Issuer", "ClusterIssuer"']),
    ("tls issuerRef without name", {"tls": {"issuerRef": {"kind": "ClusterIssuer"}}},
     ["spec.tls.issuerRef.name", "Required value"]),
    ("tls duration in days", {"tls": {"duration": "365d"}},
     ["spec.tls.duration", "should match"]),
    ("tls secretName not a name", {"tls": {"secretName": "My_CA"}},
     ["spec.tls.secretName", "should match"]),
    ("network clientFrom not a list", {"network": {"clientFrom": {"podSelector": {}}}},
     ["spec.network.clientFrom", "must be of type array"]),
    ("network policy yes", {"network": {"policy": "yes"}},
     ["spec.network.policy", "must be of type boolean"]),
    ("pod label the operator selects by", {"pod": {"metadata": {"labels": {
        "team": "orders", "app.kubernetes.io/instance": "other"}}}},
     ["spec.pod.metadata.labels", "must not set the labels the operator selects members by"]),
    ("pod label value not a string", {"pod": {"metadata": {"labels": {"critical": True}}}},
     ["spec.pod.metadata.labels.critical", "must be of type string"]),
    ("pull secret without name", {"pod": {"imagePullSecrets": [{"secret": "regcred"}]}},
     ["spec.pod.imagePullSecrets[0].name", "Required value"]),
    ("service account not a name", {"pod": {"serviceAccountName": "Orders SA"}},
     ["spec.pod.serviceAccountName", "should match"]),
    ("toleration seconds without NoExecute", {"pod": {"tolerations": [
        {"key": "k", "value": "v", "effect": "NoSchedule", "tolerationSeconds": 30}]}},
     ["spec.pod.tolerations[0]", "tolerationSeconds goes with effect NoExecute"]),
    ("toleration Exists with a value", {"pod": {"tolerations": [
        {"key": "k", "operator": "Exists", "value": "v"}]}},
     ["spec.pod.tolerations[0]", "operator Exists takes no value"]),
    ("toleration without key nor Exists", {"pod": {"tolerations": [{"value": "v"}]}},
     ["spec.pod.tolerations[0]", "without a key tolerates every taint"]),
    ("toleration effect misspelt", {"pod": {"tolerations": [
        {"key": "k", "operator": "Exists", "effect": "NoSchedul"}]}},
     ["spec.pod.tolerations[0].effect", 'Unsupported value: "NoSchedul"']),
    ("spread without topologyKey", {"pod": {"topologySpreadConstraints": [
        {"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]}},
     ["spec.pod.topologySpreadConstraints[0].topologyKey", "Required value"]),
    ("spread minDomains with ScheduleAnyway", {"pod": {"topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
         "whenUnsatisfiable": "ScheduleAnyway", "minDomains": 3}]}},
     ["spec.pod.topologySpreadConstraints[0]", "minDomains goes with whenUnsatisfiable"]),
    ("node affinity weight 0", {"pod": {"affinity": {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 0, "preference": {}}]}}}},
     ["preferredDuringSchedulingIgnoredDuringExecution[0].weight",
      "greater than or equal to 1"]),
    ("pod option misspelt", {"pod": {"nodeSelectors": {"disk": "ssd"}}},
     ['unknown field "spec.pod.nodeSelectors"']),
]


def _has_error(errors: list[str], fragments: list[str]) -> bool:
    return any(all(fragment in error for fragment in fragments) for error in errors)


@pytest.mark.parametrize(("spec", "fragments"), [c[1:] for c in REFUSED_ON_CREATE],
                         ids=[c[0] for c in REFUSED_ON_CREATE])
def test_create_is_refused_with_a_message_that_names_the_problem(
    validator: CRDValidator, spec: dict[str, Any], fragments: list[str]
) -> None:
    errors = validator.admit(raftcluster(spec))[1]
    assert _has_error(errors, fragments), errors


# (case, spec at creation, spec of the update, fragments of one error message)
REFUSED_ON_UPDATE = [
    ("storageClassName changed", {"storage": {"storageClassName": "fast"}},
     {"storage": {"storageClassName": "slow"}},
     ["spec.storage.storageClassName", "cannot be changed"]),
    ("storageClassName set later", {}, {"storage": {"storageClassName": "fast"}},
     ["spec.storage.storageClassName", "cannot be changed"]),
    ("storageClassName removed", {"storage": {"storageClassName": "fast"}}, {},
     ["spec.storage.storageClassName", "cannot be changed"]),
    ("bootstrap new to restore", {}, {"bootstrap": RESTORE},
     ["spec.bootstrap", "bootstrap cannot be changed"]),
    ("bootstrap restore index changed", {"bootstrap": RESTORE},
     {"bootstrap": {"restore": {**RESTORE["restore"], "index": 7}}},
     ["spec.bootstrap", "bootstrap cannot be changed"]),
    ("bootstrap restore time changed",
     {"bootstrap": {"restore": {**RESTORE["restore"], "time": "2026-11-25T17:00:00Z"}}},
     {"bootstrap": {"restore": {**RESTORE["restore"], "time": "2026-11-25T17:00:01Z"}}},
     ["spec.bootstrap", "bootstrap cannot be changed"]),
    ("bootstrap restore time added", {"bootstrap": RESTORE},
     {"bootstrap": {"restore": {**RESTORE["restore"], "time": "2026-11-25T17:00:00Z"}}},
     ["spec.bootstrap", "bootstrap cannot be changed"]),
    ("bootstrap restore removed", {"bootstrap": RESTORE}, {},
     ["spec.bootstrap", "bootstrap cannot be changed"]),
    ("clusterId changed", {"clusterId": "orders-a"}, {"clusterId": "orders-b"},
     ["spec.clusterId", "cannot be changed or removed"]),
    ("clusterId removed", {"clusterId": "orders-a"}, {},
     ["spec.clusterId", "cannot be changed or removed"]),
    ("tls turned off", {}, {"tls": {"enabled": False}},
     ["spec.tls.enabled", "tls.enabled cannot be changed after creation"]),
    ("tls turned on", {"tls": {"enabled": False}}, {},
     ["spec.tls.enabled", "tls.enabled cannot be changed after creation"]),
    ("tls issuer added", {}, {"tls": {"issuerRef": {"name": "ca"}}},
     ["spec.tls", "issuerRef and tls.secretName cannot be changed after creation"]),
    ("tls issuer renamed", {"tls": {"issuerRef": {"name": "ca"}}},
     {"tls": {"issuerRef": {"name": "other"}}},
     ["spec.tls", "cannot be changed after creation"]),
    ("tls own CA removed", {"tls": {"secretName": "team-ca"}}, {},
     ["spec.tls", "cannot be changed after creation"]),
]


@pytest.mark.parametrize(("before", "after", "fragments"), [c[1:] for c in REFUSED_ON_UPDATE],
                         ids=[c[0] for c in REFUSED_ON_UPDATE])
def test_update_is_refused_with_a_message_that_names_the_problem(
    validator: CRDValidator, before: dict, after: dict, fragments: list[str]
) -> None:
    old = stored(validator, before)
    errors = validator.admit(raftcluster(after), old)[1]
    assert _has_error(errors, fragments), errors


ALLOWED_UPDATES = [
    ("replicas 3 to 5", {"replicas": 3}, {"replicas": 5}),
    ("replicas 5 to 1", {"replicas": 5}, {"replicas": 1}),
    ("storage.size default written out", {}, {"storage": {"size": "1Gi"}}),
    ("storage.size grown", {"storage": {"size": "1Gi"}}, {"storage": {"size": "20Gi"}}),
    # The operator refuses to shrink a volume, but the spec may go back to the volumes' size
    # after a growth their StorageClass could not make.
    ("storage.size set back", {"storage": {"size": "2Gi"}}, {"storage": {"size": "1Gi"}}),
    ("pod options added, then changed", {},
     {"pod": {"metadata": {"labels": {"team": "orders"},
                           "annotations": {"sidecar.istio.io/inject": "false"}},
              "imagePullSecrets": [{"name": "regcred"}], "serviceAccountName": "orders-s3",
              "priorityClassName": "raft-critical", "nodeSelector": {"disk": "ssd"},
              "tolerations": [{"key": "dedicated", "value": "raft", "effect": "NoSchedule"},
                              {"operator": "Exists", "effect": "NoExecute",
                               "tolerationSeconds": 60}],
              "affinity": {"podAntiAffinity": {
                  "requiredDuringSchedulingIgnoredDuringExecution": [{
                      "topologyKey": "kubernetes.io/hostname", "labelSelector": {
                          "matchLabels": {"app.kubernetes.io/instance": "orders"}}}]}},
              "topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule",
                                             "topologyKey": "topology.kubernetes.io/zone",
                                             "minDomains": 3}]}}),
    ("removedVolumePolicy changed", {}, {"storage": {"removedVolumePolicy": "Retain"}}),
    ("timing, image, snapshot, archive changed", {},
     {"timing": {"electionTimeoutMs": 3000, "heartbeatMs": 300}, "image": "flotilla:0.2",
      "snapshot": {"entries": 5000}, "archive": {"url": "file:///var/lib/archive"}}),
    ("clusterId kept", {"clusterId": "orders-a"}, {"clusterId": "orders-a", "replicas": 5}),
    ("clusterId set when there was none", {}, {"clusterId": "orders-a"}),
    ("bootstrap written out as its default", {}, {"bootstrap": {"new": {}}}),
    ("compaction and export added, then changed", {"archive": {"url": "s3://b"}},
     {"archive": {"url": "s3://b", "compaction": {"schedule": "30 4 * * 1-5"},
                  "export": {"schedule": "@hourly", "destination": "s3://lake",
                             "suspend": True}}}),
    ("tls clientCertAuth and duration changed", {},
     {"tls": {"clientCertAuth": True, "duration": "2160h"}}),
    ("tls issuerRef kept, network changed", {"tls": {"issuerRef": {"name": "ca"}}},
     {"tls": {"issuerRef": {"name": "ca"}}, "network": {"policy": False, "clientFrom": [
         {"namespaceSelector": {"matchLabels": {"team": "orders"}}}]}}),
    ("signing key and encryption added, then the key rotated",
     {"archive": {"url": "s3://b"}},
     {"archive": {"url": "s3://b", "signingKeySecret": {"name": "archive-key", "key": "2026",
                                                       "previousKeys": ["2025"]},
                  "encryption": {"type": "aws:kms", "kmsKeyId": "alias/flotilla"}}}),
    ("compaction lags equal, in other units", {},
     {"archive": {"url": "s3://b", "compaction": {
         "schedule": "@daily", "minCompactionLag": "48h", "maxCompactionLag": "2880m"}}}),
]


@pytest.mark.parametrize(("before", "after"), [c[1:] for c in ALLOWED_UPDATES],
                         ids=[c[0] for c in ALLOWED_UPDATES])
def test_update_is_accepted(validator: CRDValidator, before: dict, after: dict) -> None:
    old = stored(validator, before)
    assert validator.admit(raftcluster(after), old)[1] == []


def test_scaling_through_the_scale_subresource_path_is_an_update_of_spec_replicas(
    validator: CRDValidator, crd: dict[str, Any]
) -> None:
    old = stored(validator, {"clusterId": "orders-a", "storage": {"size": "8Gi"}})
    path = crd["spec"]["versions"][0]["subresources"]["scale"]["specReplicasPath"]
    assert path == ".spec.replicas"
    scaled = {**old, "spec": {**old["spec"], "replicas": 7}}
    assert validator.admit(scaled, old)[1] == []


def test_clusterid_set_later_must_match_the_one_the_operator_recorded(
    validator: CRDValidator,
) -> None:
    old = stored(validator, {})
    old["status"] = {"clusterId": "default-orders-1f2e3d4c", "phase": "Ready"}
    assert validator.admit(raftcluster({"clusterId": "default-orders-1f2e3d4c"}), old)[1] == []
    errors = validator.admit(raftcluster({"clusterId": "orders-new"}), old)[1]
    assert _has_error(errors, ["spec.clusterId", "must equal status.clusterId"]), errors


STATUS = {
    "observedGeneration": 2, "phase": "Scaling", "replicas": 3, "readyReplicas": 2,
    "selector": "app.kubernetes.io/name=flotilla,app.kubernetes.io/instance=orders",
    # Status is not held to spec's rules: the operator's default id may be long and mixed case.
    "clusterId": "Some-Namespace-" + "x" * 60 + "-1f2e3d4c",
    "bootstrapped": True, "leader": "orders-0", "term": 4, "commitIndex": 1200,
    "configuration": {"voters": ["orders-0", "orders-1", "orders-2"],
                      "learners": ["orders-3"], "joint": False},
    "members": [{"name": "orders-0", "role": "leader", "matchIndex": 1200, "uid": "u0",
                 "ready": True}],
    "lastSnapshot": {"index": 1000, "term": 3, "bytes": 4096},
    "archive": {"url": "s3://b/p", "lastArchivedIndex": 1100, "lastSnapshotIndex": 1000,
                "lag": 100, "error": ""},
    "removedMembers": [{"name": "orders-4", "uid": "u4"}],
    "catchUp": [{"name": "orders-3", "since": "2025-01-01T00:00:00Z", "attempts": 1}],
    "archiveJobs": {
        "compaction": {"cronJob": "orders-compact", "lastScheduleTime": "2025-01-01T03:00:00Z",
                       "lastJob": "orders-compact-28929780", "lastOutcome": "Succeeded",
                       "lastCompletionTime": "2025-01-01T03:04:10Z", "exitCode": 0,
                       "result": {"cleaned_through": 5000, "entries_before": 5000,
                                  "entries_after": 1200, "bytes_before": 900000,
                                  "bytes_after": 210000, "anything": {"else": [1, 2]}}},
        "export": {"cronJob": "orders-export", "lastJob": "orders-export-28929781",
                   "lastOutcome": "Failed", "exitCode": 1,
                   "message": "flotilla pipeline: the S3 endpoint did not answer"},
    },
    "lastAction": "added orders-3 as a learner",
    "conditions": [{"type": "Ready", "status": "False", "reason": "Scaling",
                    "message": "adding orders-3", "lastTransitionTime": "2025-01-01T00:00:00Z",
                    "observedGeneration": 2}],
}


def test_status_update_is_accepted_and_only_changes_status(validator: CRDValidator) -> None:
    old = stored(validator, {"replicas": 4})
    attempt = raftcluster({"replicas": 9}, status=STATUS)
    obj, errors = validator.admit(attempt, old, subresource="status")
    assert errors == []
    assert (obj["status"], obj["spec"]["replicas"]) == (STATUS, 4)


def test_status_is_dropped_on_create_and_kept_on_spec_updates(validator: CRDValidator) -> None:
    created = stored(validator, {}, status={"phase": "NotAPhase"})
    assert "status" not in created
    old = {**created, "status": STATUS}
    updated, errors = validator.admit(raftcluster({"replicas": 5}, status={"phase": "x"}), old)
    assert (errors, updated["status"]) == ([], STATUS)


def test_status_update_is_still_checked_against_its_own_schema(validator: CRDValidator) -> None:
    old = stored(validator, {})
    bad = raftcluster({}, status={"phase": "Sleeping", "members": [{"role": "leader"}]})
    errors = validator.admit(bad, old, subresource="status")[1]
    assert _has_error(errors, ["status.phase", "Unsupported value", '"Ready"']), errors
    assert _has_error(errors, ["status.members[0].name", "Required value"]), errors


def test_every_cel_rule_is_shown_to_fire(validator: CRDValidator, schema: dict) -> None:
    """A rule no bad spec triggers is untested: each rule's message must appear in the errors
    of the tables above (and dropping a rule fails its rows there)."""
    seen: list[str] = []
    for _, spec, _ in REFUSED_ON_CREATE:
        seen += validator.admit(raftcluster(spec))[1]
    for _, before, after, _ in REFUSED_ON_UPDATE:
        seen += validator.admit(raftcluster(after), stored(validator, before))[1]
    old = {**stored(validator, {}), "status": {"clusterId": "a"}}
    seen += validator.admit(raftcluster({"clusterId": "b"}), old)[1]
    messages = [rule["message"] for _, node in iter_schemas(schema)
                for rule in node.get("x-kubernetes-validations", [])]
    assert [m for m in messages if not any(m in error for error in seen)] == []
