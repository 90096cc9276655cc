"""The point-in-time restore stage: what the snapshot Job did, and what that means for the cluster.

With `spec.bootstrap.restore.index` or `.time`, the members cannot start until
`flotilla pipeline snapshot-at` has published that state as a cluster of its own in the archive
(`ClusterSpec.restored_cluster_id`); they then restore its newest state, which is exactly the
target. The Job runs once. The stage, in the order it is met:

    no Job                 create it                  Restored False, SnapshotJobRunning
    a Job of an earlier    delete it, then create     Restored False, SnapshotJobRunning
      RaftCluster of this name (another owner uid)
    Job running            wait                       Restored False, SnapshotJobRunning
    Job failed, exit 4     stop: no member starts     Restored False, RestoreTargetOutsideArchive
    Job failed otherwise   stop: no member starts     Restored False, SnapshotJobFailed
    Job succeeded          the members start          Restored True,  SnapshotJobSucceeded

A failed Job is never replaced by the operator (that would loop on a target the archive cannot
give): deleting it asks for one more run, and deleting the RaftCluster lets it be created again
with another target. The failure's reason is the pod's termination message: the pipeline's last
line on stderr (FallbackToLogsOnError).

Pure: `observe` reads the Job and its pods (plain dicts, as the API server returns them) once
into a `JobRun`; `decide` turns that into a `Stage`. The reconcile carries it out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .jobs import JobPhase, foreign, read_job
from .render import FINAL_EXIT_CODES, RESTORE_CONTAINER
from .spec import ClusterSpec

__all__ = ["EXIT_OUTSIDE", "JobPhase", "JobRun", "Move", "SnapshotResult", "Stage", "decide",
           "observe"]

EXIT_OUTSIDE = 4  # the pipeline's exit code for a target outside the archive

RUNNING = "SnapshotJobRunning"
SUCCEEDED = "SnapshotJobSucceeded"
OUTSIDE = "RestoreTargetOutsideArchive"
FAILED = "SnapshotJobFailed"


@dataclass(frozen=True, slots=True)
class SnapshotResult:
    """The pipeline's JSON line: what was published, where."""

    cluster_id: str
    index: int
    term: int
    time: str | None

    @classmethod
    def parse(cls, line: str) -> SnapshotResult | None:
        """The result line, or None when `line` is not one (a truncated or missing message)."""
        try:
            doc = json.loads(line)
            return cls(str(doc["cluster_id"]), int(doc["index"]), int(doc["term"]),
                       str(doc["time"]) if doc.get("time") else None)
        except (ValueError, TypeError, KeyError):
            return None

    def describe(self) -> str:
        when = f", time {self.time}" if self.time else ""
        return f"index {self.index} (term {self.term}{when})"


@dataclass(frozen=True, slots=True)
class JobRun:
    """The Job as observed: its phase, and for a finished one its last pod's exit code and
    termination message (last line), or the Job's own condition message without a pod."""

    phase: JobPhase
    exit_code: int | None = None
    message: str = ""
    result: SnapshotResult | None = None


def observe(job: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]],
            owner_uid: str) -> JobRun:
    if job is None:
        return JobRun(JobPhase.MISSING)
    if foreign(job, owner_uid):
        return JobRun(JobPhase.FOREIGN)
    end = read_job(job, pods, RESTORE_CONTAINER)
    if end.phase is JobPhase.SUCCEEDED:
        return JobRun(end.phase, end.exit_code, end.message, SnapshotResult.parse(end.message))
    return JobRun(end.phase, end.exit_code, end.message)


class Move(Enum):
    CREATE_JOB = "create-job"
    DELETE_JOB = "delete-job"  # a foreign Job in the way: delete it, create ours next round
    WAIT = "wait"
    STOP = "stop"  # failed: nothing starts until a person acts
    PROCEED = "proceed"  # the members may start


@dataclass(frozen=True, slots=True)
class Stage:
    move: Move
    reason: str  # of the Restored condition
    message: str
    result: SnapshotResult | None = None

    @property
    def restored(self) -> bool:
        return self.move is Move.PROCEED

    @property
    def phase(self) -> str:
        return "RestoreFailed" if self.move is Move.STOP else "Restoring"


def decide(spec: ClusterSpec, run: JobRun) -> Stage:
    restore, cluster_id, job = spec.restore, spec.restored_cluster_id, spec.restore_job_name
    if restore is None or cluster_id is None:
        raise ValueError("no point-in-time restore in this spec")
    what = f"the state at {restore.target} of {restore.url} as cluster {cluster_id}"
    if run.phase is JobPhase.MISSING:
        return Stage(Move.CREATE_JOB, RUNNING, f"starting Job {job} to publish {what}")
    if run.phase is JobPhase.FOREIGN:
        return Stage(Move.DELETE_JOB, RUNNING,
                     f"Job {job} belongs to an earlier RaftCluster of this name: deleting it "
                     "before starting this cluster's own")
    if run.phase is JobPhase.RUNNING:
        return Stage(Move.WAIT, RUNNING, f"Job {job} is publishing {what}")
    retry = (f"no member starts. To run the Job again (the archive may have grown since), "
             f"delete Job {job}; to restore another point, delete this RaftCluster and create "
             "it again with another spec.bootstrap.restore")
    if run.phase is JobPhase.FAILED:
        why = run.message or "no reason given"
        if run.exit_code == EXIT_OUTSIDE:
            field = "index" if restore.index is not None else "time"
            return Stage(Move.STOP, OUTSIDE, f"spec.bootstrap.restore.{field} is outside what "
                         f"the archive holds: {why}; {retry}")
        code = f" (exit {run.exit_code})" if run.exit_code is not None else ""
        final = (" (a rerun gives the same)" if run.exit_code in FINAL_EXIT_CODES else "")
        return Stage(Move.STOP, FAILED, f"Job {job} failed{code}{final}: {why}; {retry}")
    if run.result is not None and run.result.cluster_id != cluster_id:
        return Stage(Move.STOP, FAILED,
                     f"Job {job} published cluster {run.result.cluster_id}, not {cluster_id}; "
                     f"{retry}")
    done = run.result.describe() if run.result is not None else restore.target
    return Stage(Move.PROCEED, SUCCEEDED,
                 f"Job {job} published the state at {done} of {restore.url} as cluster "
                 f"{cluster_id}; the members restore it", run.result)
