"""The few Kubernetes API calls the operator makes, as plain JSON over the `kubernetes` client's
REST layer (its configuration, auth and TLS, none of its generated models).

Plain dicts both ways keep the operator's objects identical to what `render` produced and what
the tests compare, and the calls small enough to read in one sitting. Synchronous: handlers run
a whole reconcile in a worker thread.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

__all__ = ["ApiError", "Kube", "object_path"]

COMPONENT = "flotilla-operator"
FIELD_MANAGER = "flotilla-operator"  # who owns the fields the operator applies

# kind -> (API prefix, plural) for everything the operator touches.
_RESOURCES = {
    "RaftCluster": ("/apis/flotilla.dev/v1alpha1", "raftclusters"),
    "StatefulSet": ("/apis/apps/v1", "statefulsets"),
    "Service": ("/api/v1", "services"),
    "PodDisruptionBudget": ("/apis/policy/v1", "poddisruptionbudgets"),
    "Pod": ("/api/v1", "pods"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "Secret": ("/api/v1", "secrets"),
    "Event": ("/api/v1", "events"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Job": ("/apis/batch/v1", "jobs"),
    "CronJob": ("/apis/batch/v1", "cronjobs"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "Certificate": ("/apis/cert-manager.io/v1", "certificates"),
    "StorageClass": ("/apis/storage.k8s.io/v1", "storageclasses"),
}
_CLUSTER_SCOPED = {"StorageClass"}  # their namespace argument is ignored
# Events remembered for aggregation (client-go's EventRecorder keeps as many): an Event said
# again updates its count and lastTimestamp instead of becoming a new object.
EVENT_CACHE_SIZE = 4096


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def object_path(kind: str, namespace: str, name: str | None = None) -> str:
    prefix, plural = _RESOURCES[kind]
    path = (f"{prefix}/{plural}" if kind in _CLUSTER_SCOPED
            else f"{prefix}/namespaces/{quote(namespace, safe='')}/{plural}")
    return f"{path}/{quote(name, safe='')}" if name else path


class Kube:
    """GET/LIST/POST/PATCH/DELETE of whole objects by kind, namespace and name, and server-side
    apply."""

    def __init__(self, api_client: Any | None = None) -> None:
        if api_client is None:
            api_client = _default_client()
        self.api = api_client
        # (object, type, reason, message) -> the count of its Event; oldest first
        self._events: OrderedDict[tuple[str, str, str, str], int] = OrderedDict()
        self._events_lock = threading.Lock()

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", object_path(kind, namespace, name))
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        """Objects whose labels match `selector` ("k=v,k2=v2"; "" for all)."""
        query = f"?{urlencode({'labelSelector': selector})}" if selector else ""
        doc = self._call("GET", f"{object_path(kind, namespace)}{query}")
        return list(doc.get("items") or [])

    def create(self, body: Mapping[str, Any],
               field_manager: str = FIELD_MANAGER) -> dict[str, Any]:
        path = object_path(body["kind"], body["metadata"].get("namespace", ""))
        query = urlencode({"fieldManager": field_manager})
        return self._call("POST", f"{path}?{query}", body)

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the whole object as FIELD_MANAGER (forced: the operator owns
        what it renders): the API server creates it, or sets what is given and removes what
        the operator applied before and no longer renders. An API that answers 404 instead of
        creating (kmock, the tests' emulator, applies only to existing objects, as a merge
        patch) gets a create."""
        meta = obj["metadata"]
        query = urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
        path = object_path(obj["kind"], meta["namespace"], meta["name"])
        try:
            return self._call("PATCH", f"{path}?{query}", obj, "application/apply-patch+yaml")
        except ApiError as exc:
            if exc.status != 404:
                raise
        return self.create(obj)

    def patch(self, kind: str, namespace: str, name: str, patch: Mapping[str, Any],
              subresource: str = "") -> dict[str, Any]:
        """A JSON merge patch (RFC 7386): what is given replaces, None deletes."""
        path = object_path(kind, namespace, name) + (f"/{subresource}" if subresource else "")
        return self._call("PATCH", path, patch, "application/merge-patch+json")

    def delete(self, kind: str, namespace: str, name: str, propagation: str | None = None) -> bool:
        """True if it was there. `propagation` ("Background", "Foreground") deletes what the
        object owns too; a Job deleted through the API without it leaves its pods behind."""
        query = f"?{urlencode({'propagationPolicy': propagation})}" if propagation else ""
        try:
            self._call("DELETE", object_path(kind, namespace, name) + query)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def event(self, obj: Mapping[str, Any], kind: str, reason: str, message: str) -> None:
        """A core/v1 Event about `obj` (what `kubectl describe` and `kubectl get events`
        show), aggregated as client-go's EventRecorder does: the same type, reason and message
        about the same object again raises the count and lastTimestamp of the Event already
        posted (`kubectl describe` shows "x3 over 5m") instead of adding another.

        The Event's name is a digest of what it says (NAME.<16 hex digits>), so an operator
        that restarted, and lost its memory of the counts, finds it by name (a create that
        conflicts) and counts on; once the API server has expired it, a new one starts."""
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        message = message[:1024]
        key = (str(meta.get("uid") or f"{namespace}/{meta.get('name')}"), kind, reason, message)
        name = f"{meta.get('name')}.{hashlib.sha256(repr(key).encode()).hexdigest()[:16]}"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._events_lock:
            count = self._events.get(key)
        if count is not None and self._count_again(namespace, name, count + 1, now):
            self._remember(key, count + 1)
            return
        try:
            self.create({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "involvedObject": {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
                                   "name": meta.get("name"), "namespace": meta.get("namespace"),
                                   "uid": meta.get("uid")},
                "type": kind, "reason": reason, "message": message,
                "firstTimestamp": now, "lastTimestamp": now, "count": 1,
                "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            })
            count = 1
        except ApiError as exc:
            if exc.status != 409:
                raise
            posted = self.get("Event", namespace, name) or {}
            count = int(posted.get("count") or 1) + 1
            if not self._count_again(namespace, name, count, now):
                count = 0  # gone between the two calls: the next one creates it afresh
        self._remember(key, count)

    def _count_again(self, namespace: str, name: str, count: int, now: str) -> bool:
        """Patch a posted Event's count and lastTimestamp; False if it is gone (expired)."""
        try:
            self.patch("Event", namespace, name, {"count": count, "lastTimestamp": now})
        except ApiError as exc:
            if exc.status != 404:
                raise
            return False
        return True

    def _remember(self, key: tuple[str, str, str, str], count: int) -> None:
        with self._events_lock:
            self._events.pop(key, None)
            if count:
                self._events[key] = count
            while len(self._events) > EVENT_CACHE_SIZE:
                self._events.popitem(last=False)

    def _call(self, method: str, path: str, body: Any = None,
              content_type: str = "application/json") -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        headers = {"Accept": "application/json", "Content-Type": content_type}
        self.api.update_params_for_auth(headers, [], ["BearerToken"])
        try:
            resp = self.api.rest_client.request(
                method, self.api.configuration.host + path, headers=headers,
                body=body, _preload_content=False, _request_timeout=30)
        except ApiException as exc:
            try:
                message = json.loads(exc.body or b"{}").get("message") or exc.reason
            except ValueError:
                message = (exc.body or b"")[:300] or exc.reason
            raise ApiError(exc.status or 0, str(message)) from None
        data = resp.data
        return json.loads(data) if data else {}


def _default_client() -> Any:
    """The in-cluster service account, else the local kubeconfig (as kubectl finds it)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client.ApiClient()
