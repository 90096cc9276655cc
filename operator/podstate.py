"""Why a member's pod does not run, in the words the scheduler and the kubelet left on it.

While a new cluster's pods cannot start (no node has room, a node selector or taint keeps
them off every node, the image cannot be pulled, a Secret is missing) the RaftCluster is
Pending, and its Ready condition says why for each pod: what `kubectl describe pod` would
show, without having to look. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def why_not_running(pod: Mapping[str, Any] | None) -> str | None:
    """None for a running pod (phase Running, not terminating); else a short clause such as
    `is not scheduled: 0/3 nodes are available: 3 Insufficient cpu.`"""
    if pod is None:
        return "has no pod yet"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "is terminating"
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    if phase == "Running":
        return None
    if phase != "Pending":
        return f"has ended ({phase})"
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            said = condition.get("message") or condition.get("reason") or "no node fits it"
            return f"is not scheduled: {said}"
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") and waiting["reason"] not in ("ContainerCreating",
                                                                  "PodInitializing"):
                message = waiting.get("message")
                return (f"waits in container {container.get('name')}: {waiting['reason']}"
                        + (f": {message}" if message else ""))
    return "is starting"
