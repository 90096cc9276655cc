"""A pipeline Job and its pods, read once: whether it has ended, how, and what its container said.

The pipeline writes its result line, or its one-line reason for failing, to the container's
termination-log file (`--result-file /dev/termination-log`), and the kubelet puts that file in
the pod's status; with `FallbackToLogsOnError`, a process killed before it could write leaves
its log's tail there instead. The restore stage (`restorejob.py`) and the scheduled jobs
(`archivejobs.py`) both read a Job this way.

Pure: plain dicts, as the API server returns them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

__all__ = ["JobEnd", "JobPhase", "foreign", "read_job"]


class JobPhase(Enum):
    MISSING = "missing"
    FOREIGN = "foreign"  # a Job of this name owned by another object (an earlier RaftCluster)
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class JobEnd:
    """A Job as observed: RUNNING, SUCCEEDED or FAILED; for a finished one, the exit code and
    the last line of the termination message of its pod that ended last (on a failure without
    a pod, the Job's own condition message), and when it finished (RFC 3339), if known."""

    phase: JobPhase
    exit_code: int | None = None
    message: str = ""
    finished: str | None = None


def read_job(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]],
             container: str) -> JobEnd:
    """`pods` may hold other Jobs' pods (of a Job this one replaced, say): only this Job's own
    speak. `container` is the pipeline's container in the pod."""
    status = job.get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []
                  if c.get("status") == "True"}
    # Kubernetes 1.31+ sets SuccessCriteriaMet / FailureTarget first, Complete / Failed once
    # the pods are gone; either says how it ends.
    failed = conditions.get("Failed") or conditions.get("FailureTarget")
    succeeded = conditions.get("Complete") or conditions.get("SuccessCriteriaMet")
    if failed is None and succeeded is None:
        return JobEnd(JobPhase.RUNNING)
    uid = (job.get("metadata") or {}).get("uid")
    exit_code, message = _last_termination(
        (p for p in pods if not uid or any(o.get("uid") == uid for o in (
            p.get("metadata") or {}).get("ownerReferences") or [])), container)
    ended = failed if failed is not None else succeeded
    finished = (status.get("completionTime") if failed is None else None) or ended.get(
        "lastTransitionTime")
    if failed is not None:
        return JobEnd(JobPhase.FAILED, exit_code,
                      message or str(failed.get("message") or failed.get("reason") or ""),
                      finished)
    return JobEnd(JobPhase.SUCCEEDED, exit_code, message, finished)


def _last_termination(pods: Iterable[Mapping[str, Any]],
                      container: str) -> tuple[int | None, str]:
    """The exit code and the last line of the termination message of the pod that ended last."""
    ended = []
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated")
            if status.get("name") == container and terminated:
                ended.append((str(terminated.get("finishedAt") or ""),
                              str((pod.get("metadata") or {}).get("creationTimestamp") or ""),
                              terminated))
    if not ended:
        return None, ""
    terminated = max(ended, key=lambda e: e[:2])[2]
    lines = [line.strip() for line in str(terminated.get("message") or "").splitlines()]
    code = terminated.get("exitCode")
    return (int(code) if code is not None else None), next(
        (line for line in reversed(lines) if line), "")


def foreign(obj: Mapping[str, Any], owner_uid: str) -> bool:
    """Whether `obj` belongs to another owner than the RaftCluster of `owner_uid`: left by an
    earlier RaftCluster of the same name. Never, when the uid is unknown (test servers)."""
    owners = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(owner_uid) and not any(o.get("uid") == owner_uid for o in owners)
