"""Fixtures of the kind suite: a kind cluster with the image, MinIO and the operator on it.

Everything is session-scoped and built once, in this order: prerequisites (skip with the
reason when Docker, kind, kubectl or helm is missing; helm is $HELM, as in the chart tests, or
on PATH), the kind cluster `flotilla-e2e` (reused when it exists, deleted at the end unless
E2E_KEEP=1), the image built from the repository and loaded into kind, MinIO with a bucket, the
CRD and the chart. Each test gets a fresh namespace.

Environment: E2E_KEEP=1 keeps the cluster (and the test namespace) for a look afterwards;
E2E_IMAGE names the image (default flotilla:e2e); E2E_KIND_NODE_IMAGE picks the node image
(Kubernetes >= 1.29, e.g. kindest/node:v1.30.0).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
MANIFESTS = Path(__file__).resolve().parent / "manifests"
CLUSTER = "flotilla-e2e"
KEEP = os.environ.get("E2E_KEEP") == "1"
IMAGE = os.environ.get("E2E_IMAGE", "flotilla:e2e")
OPERATOR_NAMESPACE = "flotilla-system"
T = TypeVar("T")


class CommandFailed(AssertionError):
    """A command of the suite failed; the message carries its stderr."""


def run(*args: str, input: str | None = None, timeout: float = 300,
        env: dict[str, str] | None = None) -> str:
    done = subprocess.run(args, input=input, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    if done.returncode != 0:
        raise CommandFailed(f"`{' '.join(args)}` exited {done.returncode}:\n"
                            f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def wait_for(what: str, probe: Callable[[], T | None], timeout: float,
             every: float = 2.0, diagnose: Callable[[], str] | None = None) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    last = "nothing yet"
    while True:
        try:
            result = probe()
        except CommandFailed as exc:
            result, last = None, str(exc)
        else:
            last = repr(result)
        if result:
            return result
        if time.monotonic() > deadline:
            details = f"\n{diagnose()}" if diagnose else ""
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what} (last: {last})"
                        f"{details}")
        time.sleep(every)


def helm_binary() -> str | None:
    """The helm to use, found as the chart tests find it: $HELM (which `make test` sets to the
    helm `make setup` fetched) when it names an executable, else `helm` on PATH."""
    named = os.environ.get("HELM")
    return named if named and os.access(named, os.X_OK) else shutil.which("helm")


def missing_prerequisites() -> list[str]:
    problems = [f"{tool} is not on PATH" for tool in ("docker", "kind", "kubectl")
                if shutil.which(tool) is None]
    if helm_binary() is None:
        problems.append("no helm: put one on PATH or set HELM=/path/to/helm")
    if shutil.which("docker"):
        try:
            info = subprocess.run(["docker", "info"], capture_output=True, text=True,
                                  timeout=60)
        except subprocess.TimeoutExpired:
            problems.insert(0, "no Docker engine: `docker info` did not answer in 60s")
        else:
            if info.returncode != 0:
                lines = (info.stderr or info.stdout).strip().splitlines() or ["failed"]
                problems.insert(0, f"no Docker engine: {lines[-1]}")
    return problems


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class PortForward:
    """`kubectl port-forward` on a fixed local port, restartable: a forward to a pod dies with
    the pod, and the port stays the same so that a client keeps its endpoint. Members speak
    https by default, and their certificates name `localhost`, which the URL uses."""

    def __init__(self, kube: Kube, target: str, remote_port: int,
                 scheme: str = "https") -> None:
        self.kube, self.target, self.remote_port = kube, target, remote_port
        self.local_port = free_port()
        self.url = f"{scheme}://localhost:{self.local_port}"
        self.process: subprocess.Popen[str] | None = None
        self.start()

    def start(self) -> None:
        self.process = subprocess.Popen(
            [*self.kube.kubectl_base(), "port-forward", self.target,
             f"{self.local_port}:{self.remote_port}"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first = self.process.stdout.readline() if self.process.stdout else ""
        if "Forwarding from" not in first:
            self.stop()
            raise CommandFailed(f"port-forward {self.target}: {first.strip()}")
        # kubectl logs every connection: keep reading, or it blocks once the pipe is full.
        threading.Thread(target=self.process.stdout.read, daemon=True).start()

    def restart(self) -> None:
        self.stop()
        wait_for(f"a port-forward to {self.target}", self._try_start, timeout=120)

    def _try_start(self) -> bool:
        self.start()
        return True

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None


class Kube:
    """kubectl and helm against the kind cluster, in one namespace."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.kubeconfig, self.namespace = kubeconfig, namespace

    def kubectl_base(self) -> list[str]:
        return ["kubectl", "--kubeconfig", str(self.kubeconfig), "--namespace", self.namespace]

    def kubectl(self, *args: str, input: str | None = None, timeout: float = 300) -> str:
        return run(*self.kubectl_base(), *args, input=input, timeout=timeout)

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in docs))

    def get(self, resource: str, jsonpath: str) -> str:
        return self.kubectl("get", resource, "-o", f"jsonpath={jsonpath}").strip()

    def in_namespace(self, namespace: str) -> Kube:
        return Kube(self.kubeconfig, namespace)

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout: float) -> T:
        """`wait_for`, printing this namespace's objects and the operator's log on timeout."""
        return wait_for(what, probe, timeout, diagnose=self.diagnostics)

    def port_forward(self, target: str, remote_port: int) -> PortForward:
        return wait_for(f"a port-forward to {target}", lambda: PortForward(self, target,
                                                                           remote_port),
                        timeout=120)

    def diagnostics(self) -> str:
        """What a failed wait prints: the objects of the test namespace and the operator's
        last log lines."""
        sections = []
        for title, args in [
            ("raftclusters", ("get", "raft", "-o", "yaml")),
            ("pods", ("get", "statefulsets,pods,pvc", "-o", "wide")),
            ("operator log", ("--namespace", OPERATOR_NAMESPACE, "logs",
                              "deployment/flotilla", "--tail", "80")),
        ]:
            try:
                sections.append(f"--- {title}\n{self.kubectl(*args, timeout=60)}")
            except CommandFailed as exc:
                sections.append(f"--- {title}: {exc}")
        return "\n".join(sections)


@pytest.fixture(scope="session")
def prerequisites() -> None:
    problems = missing_prerequisites()
    if problems:
        pytest.skip("; ".join(problems))


@pytest.fixture(scope="session")
def kubeconfig(prerequisites: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    created = CLUSTER not in run("kind", "get", "clusters").split()
    if created:
        node_image = os.environ.get("E2E_KIND_NODE_IMAGE")
        run("kind", "create", "cluster", "--name", CLUSTER, "--wait", "180s",
            *(["--image", node_image] if node_image else []), timeout=600)
    path = tmp_path_factory.mktemp("kind") / "kubeconfig"
    path.write_text(run("kind", "get", "kubeconfig", "--name", CLUSTER))
    yield path
    if not KEEP:
        run("kind", "delete", "cluster", "--name", CLUSTER, timeout=300)


@pytest.fixture(scope="session")
def image(kubeconfig: Path) -> str:
    run("docker", "build", "--tag", IMAGE, str(REPO), timeout=1800)
    run("kind", "load", "docker-image", IMAGE, "--name", CLUSTER, timeout=600)
    return IMAGE


@pytest.fixture(scope="session")
def minio(kubeconfig: Path) -> dict[str, str]:
    """MinIO in the cluster, with its bucket; the endpoint and credentials members use."""
    manifest = MANIFESTS / "minio.yaml"
    kube = Kube(kubeconfig, "minio")
    kube.kubectl("apply", "-f", str(manifest))
    kube.kubectl("wait", "--for=condition=complete", "job/make-bucket", "--timeout=300s",
                 timeout=330)
    secret = next(doc for doc in yaml.safe_load_all(manifest.read_text())
                  if doc["kind"] == "Secret")["stringData"]
    return {"endpoint": "http://minio.minio.svc:9000", "bucket": "flotilla",
            "region": "us-east-1", "access_key": secret["MINIO_ROOT_USER"],
            "secret_key": secret["MINIO_ROOT_PASSWORD"]}


@pytest.fixture(scope="session")
def operator(kubeconfig: Path, image: str) -> None:
    """The CRD (applied as the chart README says to before an upgrade) and the chart."""
    kube = Kube(kubeconfig, OPERATOR_NAMESPACE)
    kube.kubectl("apply", "--server-side", "-f", str(REPO / "charts" / "flotilla" / "crds"))
    repository, _, tag = image.rpartition(":")
    run(helm_binary() or "helm", "upgrade", "--install", "flotilla",
        str(REPO / "charts" / "flotilla"), "--kubeconfig", str(kubeconfig),
        "--namespace", OPERATOR_NAMESPACE, "--create-namespace",
        "--set", f"image.repository={repository}", "--set", f"image.tag={tag}",
        "--set", "image.pullPolicy=Never",
        "--wait", "--timeout", "5m", timeout=360)


@pytest.fixture
def kube(kubeconfig: Path, operator: None, minio: dict[str, str]) -> Iterator[Kube]:
    """A fresh namespace with the S3 credentials Secret, deleted afterwards (unless E2E_KEEP=1):
    its RaftClusters go first, while the operator can still run their finalizers."""
    namespace = f"e2e-{uuid.uuid4().hex[:6]}"
    run("kubectl", "--kubeconfig", str(kubeconfig), "create", "namespace", namespace)
    kube = Kube(kubeconfig, namespace)
    kube.apply({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "s3-credentials"},
                "stringData": {"AWS_ACCESS_KEY_ID": minio["access_key"],
                               "AWS_SECRET_ACCESS_KEY": minio["secret_key"]}})
    yield kube
    if not KEEP:
        kube.kubectl("delete", "raft", "--all", "--timeout=300s", timeout=330)
        run("kubectl", "--kubeconfig", str(kubeconfig), "delete", "namespace", namespace,
            "--timeout=300s", timeout=330)
