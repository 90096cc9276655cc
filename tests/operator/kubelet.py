"""A Kubernetes API (kmock) plus the two things it lacks for the operator's tests: a StatefulSet
controller and a kubelet, played by real `flotilla node` processes on loopback.

`Kmock` serves kmock's emulator from a thread of its own, with the resources the operator
uses registered. `Kubelet` watches it like the controllers would: for every StatefulSet it
runs pods NAME-0..NAME-(replicas-1) as node processes started with the env of the pod
template, resolved as the kubelet does (fieldRef, secretKeyRef and configMapKeyRef read from
the API, `$(VAR)`), makes a PersistentVolumeClaim per pod (a directory), and publishes Pod
objects whose phase and Ready condition follow the process and its /readyz. The pod's volumes
are directories made afresh at every start (emptyDir; projected and secret volumes filled from
the Secrets they name, optional ones left out while missing), and a path under a mount, in the
env or a command, is that directory's path; init containers run to completion, in order, before
the node starts (one that fails is retried, as the kubelet does). Deleting a Pod kills its
process (the controller starts it again); deleting a claim wipes its directory. Cluster DNS is
played by `clusterdns`: members keep the names the operator rendered (`POD.SVC.NS.svc`, which
their certificates name), and every process that dials them (members, the operator, the test
itself) resolves those names through the table this writes.

It also plays the Job controller: each Job's container command runs as a real process (the
image's PATH is this virtualenv's; env resolved as for members, `$(VAR)` in the command line
too; an emptyDir and the termination-log file become directories and files under the test's
root, where an env value names them), under a Pod object that ends with the terminated state
and termination message the kubelet would write (FallbackToLogsOnError: the log's tail on a
failure without a message). The Job's status follows its pods: Complete, or Failed by its
podFailurePolicy's FailJob exit codes or past its backoffLimit, with retries in between. A
deleted Job takes its pods and process with it (background propagation).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import hashlib
import itertools
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import attrs
import jsonpatch
import jsonpointer
import kmock
from flotilla.operator.kube import Kube

from flotilla.client import Client
from tests.harness import ports
from tests.operator import clusterdns

REPO = Path(__file__).resolve().parents[2]
RESOURCES = {
    "flotilla.dev/v1alpha1/raftclusters": ("RaftCluster", {"status"}),
    "apps/v1/statefulsets": ("StatefulSet", set()),
    "v1/services": ("Service", set()),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", set()),
    "v1/events": ("Event", set()),
    "v1/pods": ("Pod", set()),
    "v1/persistentvolumeclaims": ("PersistentVolumeClaim", set()),
    "v1/secrets": ("Secret", set()),
    "v1/configmaps": ("ConfigMap", set()),
    "batch/v1/jobs": ("Job", set()),
    "batch/v1/cronjobs": ("CronJob", set()),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", set()),
    "cert-manager.io/v1/certificates": ("Certificate", set()),
}
VERBS = {"list", "watch", "get", "create", "patch", "delete"}


@attrs.define
class JobRun:
    """The running (or just ended) pod of a Job, and the pods it had before."""

    job_uid: str | None
    proc: subprocess.Popen
    pod: str
    pods: list[str]
    message: Path  # the termination-log file, as mounted into the container
    log: Path
    container: dict[str, Any]


def _expand(word: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of command and args: $(VAR) from the container's env, $$ a $."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), word)


def _fail_job_rule(policy: dict[str, Any] | None, container: str, code: int) -> int | None:
    """The index of the podFailurePolicy rule that fails the Job for this exit code, if any
    (the first matching rule decides; onExitCodes rules only, as the operator writes them)."""
    for index, rule in enumerate((policy or {}).get("rules") or []):
        on = rule.get("onExitCodes")
        if on is None or on.get("containerName") not in (None, container):
            continue
        if (code in on["values"]) == (on["operator"] == "In"):
            return index if rule["action"] == "FailJob" else None
    return None


def _killpg(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait(10)


def _revision(sts: dict[str, Any]) -> str:
    """What the StatefulSet controller names a template revision: NAME-<hash of template>."""
    digest = hashlib.sha256(json.dumps(sts["spec"]["template"], sort_keys=True).encode())
    return f"{sts['metadata']['name']}-{digest.hexdigest()[:10]}"


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock's emulator plus the metadata a real API server assigns and kopf relies on.

    - A new `resourceVersion` on every create and patch. kmock stores what it is sent, and with
      a constant version kopf's consistency check takes stale watch events for fresh ones and
      runs handlers again on old bodies.
    - A name from `generateName`, and `uid`, `creationTimestamp` and the namespace from the URL
      on create.
    - Lists honour `labelSelector` (equality terms, which is all the operator sends).
    - 201 for a create, and 422 (not 500) for a failed JSON-patch `test` operation, which kopf
      treats as a conflict to retry.
    - A request leaves kmock's history of requests once it is answered. kmock finds the
      reaction to a request by looking for that request (by identity) among every request it
      has served, each one put through the reactions' filters: the cost of a request grew with
      the number served before it, and a test's kmock spent most of its CPU on that. No test
      reads the history; the requests under way (watches, say) stay in it, which is all the
      lookup needs. (Request ids, the history's length at arrival, then repeat: kmock only
      shows them.)

    `_handle` is private in kmock 0.8, but it is the only hook that runs before an object is
    stored; the request is completed in place because kmock routes by request identity.
    """

    _versions: itertools.count = attrs.field(factory=lambda: itertools.count(2), init=False)

    # (method, resource plural, name, whether it showed a token) of each answered request
    # (see _forget), for the tests that count the operator's requests.
    answered: list[tuple[str, str, str, bool]] = attrs.field(factory=list)

    async def _serve_list(self, request: Any) -> Any:
        payload = await super()._serve_list(request)
        selector = request.params.get("labelSelector", "")
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        payload["items"] = [item for item in payload["items"] if all(
            ((item.get("metadata") or {}).get("labels") or {}).get(k) == v
            for k, v in wanted.items())]
        return payload

    async def _serve_create(self, request: Any) -> Any:
        return kmock.Response(status=201, payload=await super()._serve_create(request))

    async def _handle(self, request: Any) -> Any:
        self._complete(request)
        try:
            return await super()._handle(request)
        except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        """Drop an answered request from kmock's history (see the class doc), keeping only
        (method, resource plural, name, whether it showed a token) in `answered`, for the
        tests that count the operator's requests."""
        resource = request.resource
        self.answered.append((request.method.value, resource.plural if resource else "",
                              request.name or "", "Authorization" in request.headers))
        history = self._requests
        for i in range(len(history) - 1, -1, -1):
            if history[i] is request:
                del history[i]
                return

    def _complete(self, request: Any) -> None:
        data = request.data
        if request.resource is None:
            return
        if request.action == kmock.action.CREATE and isinstance(data, dict):
            data = copy.deepcopy(data)
            meta = data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:8]}"
            if request.namespace and not meta.get("namespace"):
                meta["namespace"] = request.namespace
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp",
                            datetime.datetime.now(datetime.UTC).isoformat())
            meta["resourceVersion"] = str(next(self._versions))
        elif request.action == kmock.action.UPDATE and isinstance(data, dict):  # merge patch
            data = copy.deepcopy(data)
            if not isinstance(data.get("metadata"), dict):
                data["metadata"] = {}
            data["metadata"]["resourceVersion"] = str(next(self._versions))
        elif request.action == kmock.action.UPDATE and isinstance(data, list):  # JSON patch
            data = [*data, {"op": "add", "path": "/metadata/resourceVersion",
                            "value": str(next(self._versions))}]
        else:
            return
        object.__setattr__(request, "data", data)


class Kmock:
    """kmock's Kubernetes emulator on a loopback port, run by a thread's event loop."""

    def __init__(self) -> None:
        self.url = ""
        self.emulator: Any = None
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)

    def start(self) -> Kmock:
        self._thread.start()
        if not self._ready.wait(20):
            raise RuntimeError("kmock did not start")
        return self

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with ApiServer() as k, kmock.Server(k) as server:
            for key, (kind, subresources) in RESOURCES.items():
                k.resources[key] = dict(kind=kind, namespaced=True, verbs=VERBS,
                                        subresources=subresources)
            # kopf watches CRDs to notice resources coming and going, and waits to see the
            # namespaces resource exist (it lists no namespace when watching cluster-wide).
            k.resources["apiextensions.k8s.io/v1/customresourcedefinitions"] = dict(
                kind="CustomResourceDefinition", namespaced=False, verbs=VERBS)
            k.resources["v1/namespaces"] = dict(kind="Namespace", namespaced=False,
                                                verbs={"list", "watch", "get"})
            # Read by the operator to see whether a claim's volume may grow.
            k.resources["storage.k8s.io/v1/storageclasses"] = dict(
                kind="StorageClass", namespaced=False, verbs=VERBS)
            self.emulator = k
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
            "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": "test-token"}}],
            "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "test"}}],
        }))
        return path

    def api(self) -> Kube:
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        return Kube(client.ApiClient(config))


class Kubelet:
    """Runs the pods of every StatefulSet in `namespace` as node processes (see module doc)."""

    def __init__(self, api: Kube, namespace: str, root: Path) -> None:
        self.api = api
        self.namespace = namespace
        self.root = root
        self.dns_file = root / "cluster-dns.json"  # clusterdns's table
        self.procs: dict[str, subprocess.Popen] = {}
        self.addresses: dict[str, tuple[int, int]] = {}  # pod -> (peer port, client port)
        self.hosts: dict[str, list[str]] = {}  # pod -> its DNS names
        self.envs: dict[str, dict[str, str]] = {}  # pod -> its node's env at its last start
        self.init_failed: dict[str, float] = {}  # pod -> when its init container last failed
        self.started: list[str] = []  # pods in the order they were started, restarts too
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)
        self.published: set[str] = set()  # pods whose Pod object this created
        self.crashed: dict[str, float] = {}  # pod -> when its process was seen exited
        self.errors: list[str] = []
        self.job_runs: dict[str, JobRun] = {}  # Job name -> its current pod's process
        self.job_pods: list[str] = []  # Job pods in the order they were started
        self._probe_contexts: dict[tuple[str, str] | None, ssl.SSLContext] = {}
        self.dns_file.write_text("{}")

    def start(self) -> Kubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for name in list(self.procs):
            self._kill(name, signal.SIGKILL)
        for run in self.job_runs.values():
            _killpg(run.proc)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
                self.sync_jobs()
            except Exception as exc:  # keep playing the kubelet; the test reads the errors
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(0.2)

    # --- the StatefulSet controller and the kubelet ----------------------------------------

    def sync(self) -> None:
        sets = self.api.list("StatefulSet", self.namespace, "")
        wanted: dict[str, dict[str, Any]] = {}
        for sts in sets:
            name = sts["metadata"]["name"]
            revision = _revision(sts)
            if (sts.get("status") or {}).get("updateRevision") != revision:
                self.api.patch("StatefulSet", self.namespace, name,
                               {"status": {"updateRevision": revision}})
            for i in range(int(sts["spec"].get("replicas") or 0)):
                wanted[f"{name}-{i}"] = sts
        pods = {p["metadata"]["name"]: p for p in self.api.list("Pod", self.namespace, "")}
        for pod in list(self.procs):
            if pod not in wanted:  # scaled away
                self._kill(pod, signal.SIGTERM)
                if pod in pods:
                    self.api.delete("Pod", self.namespace, pod)
                    del pods[pod]
            elif pod in self.published and pod not in pods:  # its Pod object was deleted
                self._kill(pod, signal.SIGKILL)
        self.published &= set(pods)
        claims = {c["metadata"]["name"] for c in self.api.list("PersistentVolumeClaim",
                                                                 self.namespace, "")}
        for pod, sts in wanted.items():
            claim = f"data-{pod}"
            proc = self.procs.get(pod)
            if claim not in claims:
                if proc is not None and proc.poll() is None:
                    continue  # a claim in use is only released once its pod is gone
                shutil.rmtree(self.root / claim, ignore_errors=True)  # deleted: data gone
                self.api.create(self._claim(sts, claim))
            if proc is None or (proc.poll() is not None and pod not in self.crashed):
                if proc is not None:
                    self.crashed[pod] = time.monotonic()  # show the exit, restart later
                else:
                    self._try_start(pod, sts)
            elif pod in self.crashed and time.monotonic() - self.crashed[pod] > 1.0:
                del self.crashed[pod]
                self._try_start(pod, sts)
            self._publish(pod, sts, pods.get(pod))

    # --- the Job controller and the kubelet for its pods -------------------------------------

    def sync_jobs(self) -> None:
        jobs = {j["metadata"]["name"]: j for j in self.api.list("Job", self.namespace, "")}
        for name in [n for n in self.job_runs if n not in jobs]:  # deleted: its pods go too
            run = self.job_runs.pop(name)
            _killpg(run.proc)
            for pod in run.pods:
                self.api.delete("Pod", self.namespace, pod)
        for name, job in jobs.items():
            conditions = {c["type"] for c in (job.get("status") or {}).get("conditions") or []
                          if c.get("status") == "True"}
            if conditions & {"Complete", "Failed"}:
                continue
            run = self.job_runs.get(name)
            if run is not None and run.job_uid != job["metadata"].get("uid"):  # replaced
                _killpg(run.proc)
                for pod in run.pods:
                    self.api.delete("Pod", self.namespace, pod)
                run = None
            if run is None:
                self.job_runs[name] = self._start_job_pod(job, [])
                self._job_status(job, active=1)
            elif run.proc.poll() is not None:
                self._end_job_pod(job, run)

    def _start_job_pod(self, job: dict[str, Any], earlier: list[str]) -> JobRun:
        name = job["metadata"]["name"]
        pod = f"{name}-{uuid.uuid4().hex[:5]}"
        template = job["spec"]["template"]
        (container,) = template["spec"]["containers"]
        scratch = self.root / "pods" / pod
        scratch.mkdir(parents=True)
        mounted = {m["mountPath"]: scratch / m["name"] for m in container.get("volumeMounts")
                   or []}
        for path in mounted.values():
            path.mkdir()
        message = scratch / "termination-log"
        message.write_text("")
        mounted[container.get("terminationMessagePath") or "/dev/termination-log"] = message
        env = {k: str(mounted.get(v, v))  # a value naming a mount is that mount's host path
               for k, v in self.resolve_env(pod, container.get("env") or []).items()}
        # A word naming a mounted path (--result-file /dev/termination-log) is that mount's
        # host path, as the container would see the mount there.
        command = [str(mounted.get(word, word)) for word in
                   (_expand(word, env) for word in
                    [*(container.get("command") or []), *(container.get("args") or [])])]
        base = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_")}
        base["PATH"] = f"{Path(sys.executable).parent}:{base.get('PATH', '/usr/bin:/bin')}"
        workdir = mounted.get(container.get("workingDir") or "", scratch)
        log_path = self.root / f"{pod}.log"
        with open(log_path, "ab") as log:
            log.write(f"--- start {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
            proc = subprocess.Popen(command, env={**base, **env}, cwd=workdir, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.job_pods.append(pod)
        labels = {**(template["metadata"].get("labels") or {}),
                  "batch.kubernetes.io/job-name": name,
                  "batch.kubernetes.io/controller-uid": job["metadata"]["uid"]}
        owner = {"apiVersion": "batch/v1", "kind": "Job", "name": name,
                 "uid": job["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
        self.api.create({"apiVersion": "v1", "kind": "Pod",
                         "metadata": {"name": pod, "namespace": self.namespace, "labels": labels,
                                      "ownerReferences": [owner]},
                         "spec": template["spec"],
                         "status": {"phase": "Running", "containerStatuses": [
                             {"name": container["name"], "ready": True, "restartCount": 0,
                              "state": {"running": {}}}]}})
        return JobRun(job["metadata"].get("uid"), proc, pod, [*earlier, pod], message, log_path,
                      container)

    def _end_job_pod(self, job: dict[str, Any], run: JobRun) -> None:
        code = run.proc.returncode
        code = 128 - code if code < 0 else code  # killed by a signal, as a container reports it
        message = run.message.read_text()
        if not message and code != 0 and run.container.get(
                "terminationMessagePolicy") == "FallbackToLogsOnError":
            tail = run.log.read_bytes().splitlines()[-80:]  # (before the line below)
            message = b"\n".join(tail)[-2048:].decode(errors="replace")
        with open(run.log, "ab") as log:
            log.write(f"--- exit {code} {time.strftime('%H:%M:%S')}\n".encode())
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.api.patch("Pod", self.namespace, run.pod, {"status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{"name": run.container["name"], "ready": False,
                                   "restartCount": 0, "state": {"terminated": {
                                       "exitCode": code, "reason": "Completed" if code == 0
                                       else "Error", "message": message, "finishedAt": now}}}]}})
        spec, status = job["spec"], job.get("status") or {}
        if code == 0:
            self._job_status(job, succeeded=1, conditions=[
                ("SuccessCriteriaMet", "CompletionsReached", "Reached expected number of "
                                                             "succeeded pods"),
                ("Complete", "CompletionsReached", "Reached expected number of succeeded pods")])
            return
        failed = int(status.get("failed") or 0) + 1
        rule = _fail_job_rule(spec.get("podFailurePolicy"), run.container["name"], code)
        if rule is not None:
            why = (f"Container {run.container['name']} for pod {self.namespace}/{run.pod} "
                   f"failed with exit code {code} matching FailJob rule at index {rule}")
            self._job_status(job, failed=failed, conditions=[
                ("FailureTarget", "PodFailurePolicy", why), ("Failed", "PodFailurePolicy", why)])
        elif failed > int(spec.get("backoffLimit", 6)):
            why = "Job has reached the specified backoff limit"
            self._job_status(job, failed=failed, conditions=[
                ("FailureTarget", "BackoffLimitExceeded", why),
                ("Failed", "BackoffLimitExceeded", why)])
        else:
            self._job_status(job, failed=failed, active=1)
            self.job_runs[job["metadata"]["name"]] = self._start_job_pod(job, run.pods)

    def _job_status(self, job: dict[str, Any], active: int = 0, succeeded: int = 0,
                    failed: int | None = None,
                    conditions: list[tuple[str, str, str]] | None = None) -> None:
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        status: dict[str, Any] = {"active": active, "succeeded": succeeded}
        if failed is not None:
            status["failed"] = failed
        if conditions:
            status["conditions"] = [{"type": kind, "status": "True", "reason": reason,
                                     "message": message, "lastTransitionTime": now}
                                    for kind, reason, message in conditions]
            status["completionTime" if succeeded else "failedTime"] = now
        self.api.patch("Job", self.namespace, job["metadata"]["name"], {"status": status})

    def _claim(self, sts: dict[str, Any], claim: str) -> dict[str, Any]:
        template = sts["spec"]["volumeClaimTemplates"][0]
        return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": claim, "namespace": self.namespace,
                             "labels": template["metadata"].get("labels") or {}},
                "spec": template["spec"]}

    def _try_start(self, pod: str, sts: dict[str, Any]) -> None:
        """Start the pod, unless its last start failed under a second ago (a missing Secret,
        an init container that failed: the kubelet retries those too)."""
        if time.monotonic() - self.init_failed.get(pod, -1e9) < 1.0:
            return
        try:
            self._start(pod, sts)
        except RuntimeError as exc:
            self.init_failed[pod] = time.monotonic()
            if len(self.errors) < 100:
                self.errors.append(f"{pod} did not start: {exc}")

    def _start(self, pod: str, sts: dict[str, Any]) -> None:
        if pod not in self.addresses:
            self.addresses[pod] = tuple(ports.allocate_ports(2, "127.0.0.1"))
            ns, service = self.namespace, sts["spec"]["serviceName"]
            self.hosts[pod] = [f"{pod}.{service}.{ns}.svc",
                               f"{pod}.{service}.{ns}.svc.cluster.local"]
            self._write_dns()
        pod_spec = sts["spec"]["template"]["spec"]
        # Volumes made afresh, as for a new pod: a restarted member reads its Secrets as they
        # are now.
        folder = self.root / "pods" / f"{pod}-{uuid.uuid4().hex[:5]}"
        volumes = self._volumes(pod_spec.get("volumes") or [], folder)
        for init in pod_spec.get("initContainers") or []:
            env = self.resolve_env(pod, init.get("env") or [])
            mounts = self._mounts(init, volumes)
            words = [self._host_path(_expand(w, env), mounts) for w in
                     [*(init.get("command") or []), *(init.get("args") or [])]]
            done = subprocess.run(words, env={**os.environ, **env}, capture_output=True,
                                  text=True, timeout=60)
            if done.returncode != 0:
                raise RuntimeError(f"{pod}: init container {init['name']} exited "
                                   f"{done.returncode}: {done.stderr.strip()[-300:]}")
        container = pod_spec["containers"][0]
        mounts = self._mounts(container, volumes)
        env = {k: self._host_path(v, mounts)
               for k, v in self.resolve_env(pod, container.get("env") or []).items()}
        peer, client = self.addresses[pod]
        data = self.root / f"data-{pod}"
        data.mkdir(parents=True, exist_ok=True)
        env.update({
            "FLOTILLA_DATA_DIR": str(data / "data"),
            "FLOTILLA_LISTEN_PEER": f"127.0.0.1:{peer}",
            "FLOTILLA_LISTEN_CLIENT": f"127.0.0.1:{client}",
        })
        self.envs[pod] = env
        log = open(self.root / f"{pod}.log", "ab")  # noqa: SIM115 (the process keeps it)
        log.write(f"--- start {time.strftime('%H:%M:%S')}\n".encode())
        argv = clusterdns.command(self.dns_file, "flotilla.node")
        base = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_")}
        base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")]))
        self.procs[pod] = subprocess.Popen(argv, env={**base, **env}, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        self.started.append(pod)

    def _volumes(self, volumes: list[dict[str, Any]], folder: Path) -> dict[str, Path]:
        """Each volume of the pod as a directory: emptyDir empty, secret and projected
        volumes holding the Secrets' keys as files (a missing optional Secret left out)."""
        made: dict[str, Path] = {}
        secrets = {x["metadata"]["name"]: x for x in self.api.list("Secret", self.namespace, "")}
        for volume in volumes:
            path = folder / volume["name"]
            path.mkdir(parents=True)
            made[volume["name"]] = path
            if "secret" in volume:
                sources = [{"secret": volume["secret"]}]
            else:
                sources = (volume.get("projected") or {}).get("sources") or []
            for source in sources:
                ref = source.get("secret")
                if ref is not None:
                    self._project(ref, secrets, path, volume["name"])
        return made

    @staticmethod
    def _project(ref: dict[str, Any], secrets: dict[str, Any], path: Path, volume: str) -> None:
        name = ref.get("name") or ref.get("secretName")
        secret = secrets.get(name)
        if secret is None:
            if ref.get("optional"):
                return
            raise RuntimeError(f"volume {volume}: Secret {name} not found")
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        for item in ref.get("items") or [{"key": k, "path": k} for k in data]:
            if item["key"] not in data:
                if ref.get("optional"):
                    continue
                raise RuntimeError(f"volume {volume}: Secret {name} has no key {item['key']}")
            target = path / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data[item["key"]])

    @staticmethod
    def _mounts(container: dict[str, Any], volumes: dict[str, Path]) -> dict[str, Path]:
        return {m["mountPath"].rstrip("/"): volumes[m["name"]]
                for m in container.get("volumeMounts") or [] if m["name"] in volumes}

    @staticmethod
    def _host_path(value: str, mounts: dict[str, Path]) -> str:
        """A path in the container is that path under its mount's directory."""
        for mount, path in mounts.items():
            if value == mount or value.startswith(mount + "/"):
                return str(path) + value[len(mount):]
        return value

    def resolve_env(self, pod: str, env: list[dict[str, Any]]) -> dict[str, str]:
        """The container env as the kubelet gives it: fieldRef metadata.name, secretKeyRef and
        configMapKeyRef from the API (a missing one fails the start, as the kubelet's
        CreateContainerConfigError), `$(VAR)` from earlier variables."""
        out: dict[str, str] = {}
        for var in env:
            source = var.get("valueFrom", {})
            if "value" in var:
                value = re.sub(r"\$\((\w+)\)", lambda m: out.get(m.group(1), m.group(0)),
                               str(var["value"]))
            elif source.get("fieldRef", {}).get("fieldPath") == "metadata.name":
                value = pod
            elif "configMapKeyRef" in source:
                ref = source["configMapKeyRef"]
                config = self.api.get("ConfigMap", self.namespace, ref["name"])
                if config is None:
                    raise RuntimeError(f"{pod}: ConfigMap {ref['name']} not found")
                value = config["data"][ref["key"]]
            else:
                ref = source["secretKeyRef"]
                secret = self.api.get("Secret", self.namespace, ref["name"]) or {}
                encoded = (secret.get("data") or {}).get(ref["key"])
                if encoded is None:
                    raise RuntimeError(f"{pod}: Secret {ref['name']} has no key {ref['key']}")
                value = base64.b64decode(encoded).decode()
            out[var["name"]] = value
        return out

    def _write_dns(self) -> None:
        table = {host: {"2380": ["127.0.0.1", peer], "2379": ["127.0.0.1", client]}
                 for pod, (peer, client) in self.addresses.items()
                 for host in self.hosts.get(pod, [])}
        tmp = self.dns_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(table))
        os.replace(tmp, self.dns_file)

    def _publish(self, pod: str, sts: dict[str, Any], current: dict[str, Any] | None) -> None:
        proc = self.procs.get(pod)
        alive = proc is not None and proc.poll() is None
        ready = alive and self._ready(pod)
        status: dict[str, Any] = {
            "phase": "Running" if alive else "Pending",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            "containerStatuses": [{"name": "node", "ready": ready, "restartCount": 0,
                                   "state": {"running": {}} if alive else {"waiting": {}},
                                   **({"lastState": {"terminated": {"exitCode":
                                                                    proc.returncode}}}
                                      if proc is not None and not alive else {})}],
        }
        if current is None:
            labels = {**(sts["spec"]["template"]["metadata"].get("labels") or {}),
                      "controller-revision-hash": _revision(sts)}
            self.api.create({"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"name": pod, "namespace": self.namespace,
                                          "labels": labels},
                             "spec": sts["spec"]["template"]["spec"], "status": status})
            self.published.add(pod)
        elif current.get("status") != status:
            self.api.patch("Pod", self.namespace, pod, {"status": status})

    def _ready(self, pod: str) -> bool:
        """The readiness probe: /readyz over the pod's own scheme; like the kubelet's HTTPS
        probe it does not verify the certificate, and it shows the member's own when members
        ask clients for one (as the probe the operator renders then does)."""
        _, client = self.addresses[pod]
        env = self.envs.get(pod, {})
        context = None
        if env.get("FLOTILLA_CERT_FILE"):
            shown = ((env["FLOTILLA_CERT_FILE"], env["FLOTILLA_KEY_FILE"])
                     if env.get("FLOTILLA_CLIENT_CERT_AUTH") == "true" else None)
            context = self._probe_context(shown)
        scheme = "https" if context is not None else "http"
        try:
            with urllib.request.urlopen(f"{scheme}://127.0.0.1:{client}/readyz", timeout=0.5,
                                        context=context) as r:
                return r.status == 200
        except OSError:
            return False

    def _probe_context(self, shown: tuple[str, str] | None) -> ssl.SSLContext:
        """The probe's TLS: no verification (so no CA certificates to load), and the member's
        own certificate and key when it asks clients for one. Made once per certificate: a
        pod's volumes are made afresh at each start, so a file's path names its content."""
        context = self._probe_contexts.get(shown)
        if context is None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
            if shown is not None:
                context.load_cert_chain(*shown)
            self._probe_contexts[shown] = context
        return context

    def _kill(self, pod: str, sig: signal.Signals) -> None:
        proc = self.procs.pop(pod, None)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)

    def client_url(self, pod: str) -> str:
        """The client URL the pod advertises: its DNS name, https with TLS."""
        return self.envs[pod]["FLOTILLA_ADVERTISE_CLIENT"]

    def client(self, urls: list[str] | str, **kw: Any) -> Client:
        """A client of the cluster behind `urls` (client URLs of its pods) as an application
        with access to its Secrets makes one: verifying the members against the cluster's CA
        and their names (which clusterdns resolves in this process), with the admin token,
        and with a member's certificate when members ask clients for one."""
        first = (urls if isinstance(urls, str) else urls[0]).split(",")[0]
        env = next(env for env in self.envs.values()
                   if env.get("FLOTILLA_ADVERTISE_CLIENT") == first)
        context = None
        if env.get("FLOTILLA_CERT_FILE"):
            context = ssl.create_default_context(cafile=env["FLOTILLA_TRUSTED_CA_FILE"])
            if env.get("FLOTILLA_CLIENT_CERT_AUTH") == "true":
                context.load_cert_chain(env["FLOTILLA_CERT_FILE"], env["FLOTILLA_KEY_FILE"])
        return Client(urls, token=env.get("FLOTILLA_ADMIN_TOKEN"), ssl_context=context, **kw)

    def log_tails(self, lines: int = 15) -> str:
        out = []
        for path in sorted(self.root.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)


def start_operator(server: Kmock, kubelet: Kubelet, root: Path, log: Any, *flags: str,
                   env: dict[str, str] | None = None) -> subprocess.Popen:
    """`flotilla operator` against `server`, watching every namespace, resolving members'
    names through the kubelet's cluster DNS, its output to `log`; `env` adds to its
    environment (the runner's own FLOTILLA_ settings are left out). It serves no metrics
    unless `flags` give a --metrics-port: its default port is not this test's to take."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("FLOTILLA_")}
    base.update({"KUBECONFIG": str(server.kubeconfig(root / "kubeconfig")),
                 "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), **(env or {})})
    return subprocess.Popen(
        clusterdns.command(kubelet.dns_file, "flotilla", "operator", "--all-namespaces",
                           "--default-image", "flotilla:test", "--metrics-port", "0",
                           *flags),
        env=base, stdout=log, stderr=subprocess.STDOUT)


def stop_operator(operator: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after 15 s."""
    operator.terminate()
    try:
        operator.wait(15)
    except subprocess.TimeoutExpired:
        operator.kill()
        operator.wait()
