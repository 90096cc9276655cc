"""`kubectl flotilla` where no member is needed, against kmock's Kubernetes API alone: the
RaftCluster `restore` writes (admitted by the CRD as the API server would, read by the
operator's own parser into the restore it describes), how the plugin finds the cluster
(kubeconfig, context, namespace), and every mistake as one line with its exit code."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from flotilla.node.archive import format_ms, parse_time
from flotilla.operator.spec import ClusterSpec

from flotilla import kubectl_plugin
from tests.operator.kubelet import Kmock
from tests.packaging.crdschema import CRDValidator, load_crd

CRD = CRDValidator(load_crd(Path(__file__).resolve().parents[2] / "crds" / "raftcluster.yaml"),
                   "v1alpha1")
NS = "team"
ARCHIVE = "s3://backups/orders"
CLUSTER_ID = "team-orders-6f1c2a9e"
ORDERS = {
    "apiVersion": "flotilla.dev/v1alpha1", "kind": "RaftCluster",
    "metadata": {"name": "orders", "namespace": NS, "uid": "6f1c2a9e-1b2c-4d5e-8f90-0123456789ab",
                 "resourceVersion": "1"},
    "spec": {"replicas": 5, "image": "registry.example/flotilla:0.1.0",
             "storage": {"size": "10Gi"}, "timing": {"electionTimeoutMs": 1500, "heartbeatMs": 150},
             "clusterId": CLUSTER_ID,
             "archive": {"url": ARCHIVE, "endpoint": "http://minio.minio.svc:9000",
                         "region": "us-east-1", "credentialsSecret": {"name": "orders-s3"},
                         "compaction": {"schedule": "@daily"},
                         "export": {"schedule": "@hourly", "destination": "s3://lake/orders"}}},
    "status": {"phase": "Ready", "clusterId": CLUSTER_ID, "leader": "orders-0", "term": 2,
               "configuration": {"voters": [f"orders-{i}" for i in range(5)], "learners": [],
                                 "joint": False}},
}


class Api:
    def __init__(self, server: Kmock, root: Path) -> None:
        self.server, self.api, self.root = server, server.api(), root
        self.kubeconfig = server.kubeconfig(root / "kubeconfig")


@pytest.fixture(scope="module")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Api]:
    server = Kmock().start()
    try:
        api = Api(server, tmp_path_factory.mktemp("plugin"))
        api.api.create(copy.deepcopy(ORDERS))
        no_archive = copy.deepcopy(ORDERS)
        no_archive["metadata"].update(name="plain", uid="11112222-aaaa-bbbb-cccc-1234567890ab")
        del no_archive["spec"]["archive"]
        api.api.create(no_archive)
        yield api
    finally:
        server.stop()


def plugin(kube: Api, capsys, *argv: str, namespace: str | None = NS) -> tuple[int, str, str]:
    capsys.readouterr()
    flags = ["--kubeconfig", str(kube.kubeconfig)] + (["-n", namespace] if namespace else [])
    code = kubectl_plugin.main([*argv, *flags])
    out, err = capsys.readouterr()
    return code, out, err


def admitted(manifest: dict[str, Any]) -> dict[str, Any]:
    stored, errors = CRD.admit(manifest)
    assert not errors, errors
    return stored


def test_restore_dry_run_prints_the_raft_cluster_that_restores_a_point_in_time(kube,
                                                                              capsys) -> None:
    code, out, err = plugin(kube, capsys, "restore", "orders", "--as", "orders-at-1700",
                            "--to-time", "2026-01-05T18:00:00.25+01:00", "--dry-run")
    assert code == 0, err
    manifest = yaml.safe_load(out)
    assert manifest["metadata"] == {"name": "orders-at-1700", "namespace": NS}
    spec = manifest["spec"]
    assert spec["bootstrap"] == {"restore": {"url": ARCHIVE, "clusterId": CLUSTER_ID,
                                             "time": "2026-01-05T17:00:00.250Z"}}
    # The rest of the old spec, but its own id, and no export sharing the old destination.
    assert "clusterId" not in spec and "export" not in spec["archive"]
    assert err == ("note: spec.archive.export of orders is not copied (two clusters would "
                   "export to one destination): add one with a destination of its own\n")
    old = {k: v for k, v in ORDERS["spec"].items() if k not in ("clusterId", "archive")}
    assert {k: v for k, v in spec.items() if k not in ("bootstrap", "archive")} == old
    assert spec["archive"]["compaction"] == {"schedule": "@daily"}
    assert spec["archive"]["credentialsSecret"] == {"name": "orders-s3"}
    # What the API server stores, the operator reads as a point-in-time restore of `orders`.
    read = ClusterSpec.from_body({**admitted(manifest), "metadata": {
        "name": "orders-at-1700", "namespace": NS, "uid": "abcd0123-0000"}})
    assert (read.restore.url, read.restore.cluster_id, read.restore.time) == (
        ARCHIVE, CLUSTER_ID, "2026-01-05T17:00:00.250Z")
    assert read.cluster_id != CLUSTER_ID
    assert read.restored_cluster_id == f"{read.cluster_id}-at-20260105t170000.250z"

    code, out, _ = plugin(kube, capsys, "restore", "orders", "--as", "orders-at-1700",
                          "--to-index", "120000", "--archive-url", "s3://backups/elsewhere",
                          "--dry-run", "-o", "json")
    assert code == 0
    spec = json.loads(out)["spec"]
    assert spec["bootstrap"]["restore"]["index"] == 120000
    assert spec["archive"]["url"] == "s3://backups/elsewhere"
    assert kube.api.get("RaftCluster", NS, "orders-at-1700") is None, "a dry run creates nothing"


def test_restore_creates_the_raft_cluster_once(kube, capsys) -> None:
    code, out, err = plugin(kube, capsys, "restore", "orders", "--as", "orders-copy")
    assert code == 0, err
    assert out == ("raftcluster.flotilla.dev/orders-copy created: it restores orders (cluster "
                   f"{CLUSTER_ID}) at its newest archived snapshot; `kubectl flotilla status "
                   "orders-copy` follows it\n")
    created = kube.api.get("RaftCluster", NS, "orders-copy")
    assert created["spec"]["bootstrap"] == {"restore": {"url": ARCHIVE,
                                                        "clusterId": CLUSTER_ID}}
    admitted({k: created[k] for k in ("apiVersion", "kind", "metadata", "spec")})
    assert kube.api.get("RaftCluster", NS, "orders")["spec"] == ORDERS["spec"], \
        "the old cluster is only read"

    code, out, err = plugin(kube, capsys, "restore", "orders", "--as", "orders-copy")
    assert (code, out) == (1, "")
    assert err.splitlines()[-1] == ("kubectl flotilla restore: RaftCluster orders-copy already "
                                    f"exists in namespace {NS}: give --as another name")


def test_restore_time_is_rfc3339_and_not_in_the_future() -> None:
    assert kubectl_plugin.restore_time("2026-11-25T18:00:00.250999+01:00") == \
        "2026-11-25T17:00:00.250Z"
    now = parse_time("2026-11-25T17:00:00Z")
    with pytest.raises(ValueError, match=r"2026-11-25T17:00:01.000Z is in the future \(now is "
                                         r"2026-11-25T17:00:00.000Z\)"):
        kubectl_plugin.restore_time("2026-11-25T17:00:01Z", now_ms=now)
    assert kubectl_plugin.restore_time(format_ms(now), now_ms=now) == format_ms(now)


@pytest.mark.parametrize(("argv", "code", "message"), [
    (["status", "nope"], 1, f"kubectl flotilla status: RaftCluster nope not found in namespace "
                            f"{NS} (`kubectl get raft -A` lists them all; -n picks the "
                            "namespace)"),
    (["snapshot", "nope"], 1, f"kubectl flotilla snapshot: RaftCluster nope not found in "
                              f"namespace {NS} (`kubectl get raft -A` lists them all; -n picks "
                              "the namespace)"),
    (["move-leader", "orders", "orders-7"], 1,
     "kubectl flotilla move-leader: orders-7 is not a member of orders: only a voter can lead "
     "(voters: orders-0, orders-1, orders-2, orders-3, orders-4)"),
    (["restore", "orders", "--as", "x", "--to-time", "yesterday"], 2,
     "kubectl flotilla restore: argument --to-time: 'yesterday' is not an RFC 3339 time with an "
     "offset; write it like 2026-11-25T17:00:00.250Z or 2026-11-25T18:00:00+01:00 (see "
     "`kubectl flotilla restore --help`)"),
    (["restore", "orders", "--as", "x", "--to-time", "2026-11-25T17:00:00"], 2,
     "kubectl flotilla restore: argument --to-time: '2026-11-25T17:00:00' is not an RFC 3339 "
     "time with an offset; write it like 2026-11-25T17:00:00.250Z or 2026-11-25T18:00:00+01:00 "
     "(see `kubectl flotilla restore --help`)"),
    (["restore", "orders", "--as", "x", "--to-index", "0"], 2,
     "kubectl flotilla restore: argument --to-index: expected a log index, a whole number >= 1, "
     "not '0' (see `kubectl flotilla restore --help`)"),
    (["restore", "orders", "--as", "Orders_Copy"], 2,
     "kubectl flotilla restore: the new RaftCluster would be invalid: metadata.name "
     "'Orders_Copy' cannot name a Raft cluster: use at most 52 characters of a-z, 0-9 and '-', "
     "starting with a letter (it names the StatefulSet, its pods and the NAME-peers Service) "
     "(see `kubectl flotilla restore --help`)"),
    (["restore", "plain", "--as", "x"], 1,
     "kubectl flotilla restore: RaftCluster plain has no archive (spec.archive.url): there is "
     "nothing to restore from"),
    (["restore", "orders"], 2,
     "kubectl flotilla restore: the following arguments are required: --as (see `kubectl "
     "flotilla restore --help`)"),
    (["snapshot", "orders", "--timeout", "0"], 2,
     "kubectl flotilla snapshot: argument --timeout: expected a number of seconds > 0, not '0' "
     "(see `kubectl flotilla snapshot --help`)"),
    (["status", "orders", "--context", "prod"], 2,
     "kubectl flotilla status: --context prod: no such context in {kubeconfig} (contexts: "
     "kmock) (see `kubectl flotilla status --help`)"),
])
def test_every_mistake_is_one_line_with_its_exit_code(kube, capsys, argv: list[str], code: int,
                                                      message: str) -> None:
    got, out, err = plugin(kube, capsys, *argv)
    assert (got, out) == (code, "")
    assert err == message.format(kubeconfig=kube.kubeconfig) + "\n"


def test_the_cluster_is_found_as_kubectl_finds_it(kube, capsys, monkeypatch,
                                                  tmp_path: Path) -> None:
    """KUBECONFIG when no flag names one; the context's namespace when -n is not given; a
    missing kubeconfig, or an API server that does not answer, said in one line."""
    config = json.loads(kube.kubeconfig.read_text())
    config["contexts"][0]["context"]["namespace"] = NS
    path = tmp_path / "config"
    path.write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    capsys.readouterr()
    assert kubectl_plugin.main(["status", "orders", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["namespace"] == NS
    # A flag beats the environment; -n before the command counts as after it.
    assert kubectl_plugin.main(["-n", "default", "status", "orders"]) == 1
    assert "not found in namespace default" in capsys.readouterr().err

    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert kubectl_plugin.main(["status", "orders"]) == 1
    assert capsys.readouterr().err == (
        f"kubectl flotilla status: no kubeconfig at {tmp_path / 'missing'}: give --kubeconfig "
        "FILE or set KUBECONFIG (the file kubectl uses)\n")

    config["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:9"  # discard: refused
    path.write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(path))
    assert kubectl_plugin.main(["status", "orders"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kubectl flotilla status: cannot reach the Kubernetes API server: "
                          "[Errno 111] Connection refused"), err
    assert len(err.splitlines()) == 1
