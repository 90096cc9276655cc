"""Scheduled compaction and export: what the newest Job of each CronJob did, as
status.archiveJobs.<kind>, and one Event per outcome.

The CronJobs (`render.archive_cronjob`) run `flotilla pipeline compact` and `export`; their
Jobs carry the CronJob's labels, and their pods the pipeline's result line (or its one-line
reason for failing) as the termination message. The newest Job speaks for the CronJob:

    no Job yet       {cronJob, lastScheduleTime?}
    Job running      ... lastJob, lastOutcome Running
    Job succeeded    ... lastOutcome Succeeded, lastCompletionTime, exitCode, result (the JSON
                     result line, or `message` when the line is not JSON)    Normal <Kind>Succeeded
    Job failed       ... lastOutcome Failed, lastCompletionTime, exitCode, message   Warning
                     <Kind>Failed

An Event is posted once per Job and outcome: the previous round's entry (status) says what was
announced already, so neither more rounds nor an operator restart repeat it. The pods of an
ended Job are read once, in the round that first sees it ended; later rounds copy the entry.

Pure: plain dicts in, the status entry and the event out. `reconcile` does the reading.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from .jobs import JobPhase, read_job
from .render import FINAL_EXIT_CODES
from .spec import ARCHIVE_JOBS, ClusterSpec

__all__ = ["EVENT_REASONS", "entry", "event", "needs_pods", "newest"]

OUTCOMES = {JobPhase.RUNNING: "Running", JobPhase.SUCCEEDED: "Succeeded",
            JobPhase.FAILED: "Failed"}
ENDED = ("Succeeded", "Failed")
EVENT_REASONS = {"compaction": "Compaction", "export": "Export"}  # + Succeeded / Failed
_RUN_FIELDS = ("lastJob", "lastOutcome", "lastCompletionTime", "exitCode", "result", "message")


def newest(jobs: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The Job the CronJob started last. Its Jobs are named NAME-<minutes since the epoch of
    the scheduled time>, so the name orders Jobs created within one second."""
    return max(jobs, key=lambda j: (str(_meta(j).get("creationTimestamp") or ""),
                                    len(_meta(j).get("name") or ""),
                                    str(_meta(j).get("name") or "")), default=None)


def needs_pods(job: Mapping[str, Any] | None, recorded: Mapping[str, Any]) -> bool:
    """Whether the Job's pods must be read: it has ended, and status does not say how yet."""
    if job is None or _phase(job) is JobPhase.RUNNING:
        return False
    return not (recorded.get("lastJob") == _meta(job).get("name")
                and recorded.get("lastOutcome") in ENDED)


def entry(spec: ClusterSpec, kind: str, cronjob: Mapping[str, Any] | None,
          job: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]],
          recorded: Mapping[str, Any]) -> dict[str, Any]:
    """status.archiveJobs.<kind>. `pods`: the Job's pods when `needs_pods`, else unread."""
    out: dict[str, Any] = {"cronJob": spec.archive_job_name(kind)}
    scheduled = ((cronjob or {}).get("status") or {}).get("lastScheduleTime")
    if scheduled:
        out["lastScheduleTime"] = scheduled
    if job is None:
        return out
    name = str(_meta(job).get("name"))
    if not needs_pods(job, recorded) and _phase(job) is not JobPhase.RUNNING:
        out.update({k: recorded[k] for k in _RUN_FIELDS if k in recorded})
        return out
    end = read_job(job, pods, ARCHIVE_JOBS[kind])
    out.update(lastJob=name, lastOutcome=OUTCOMES[end.phase])
    if end.phase is JobPhase.RUNNING:
        return out
    if end.finished:
        out["lastCompletionTime"] = end.finished
    if end.exit_code is not None:
        out["exitCode"] = end.exit_code
    result = _result(end.message) if end.phase is JobPhase.SUCCEEDED else None
    if result is not None:
        out["result"] = result
    elif end.message:
        out["message"] = end.message
    return out


def event(spec: ClusterSpec, kind: str, now: Mapping[str, Any],
          recorded: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The Event announcing the entry's outcome, if it is an end not announced before."""
    outcome, job = now.get("lastOutcome"), now.get("lastJob")
    if outcome not in ENDED or (job, outcome) == (recorded.get("lastJob"),
                                                 recorded.get("lastOutcome")):
        return None
    reason = EVENT_REASONS[kind] + outcome
    said = json.dumps(now["result"]) if "result" in now else now.get("message") or ""
    if outcome == "Succeeded":
        return ("Normal", reason, f"Job {job} succeeded" + (f": {said}" if said else ""))
    code = now.get("exitCode")
    why = f" (exit {code})" if code is not None else ""
    if code in FINAL_EXIT_CODES:
        why += f" (a rerun gives the same: check spec.archive.{kind} and the image)"
    return ("Warning", reason,
            f"Job {job} failed{why}: {said or 'no reason given'}; CronJob "
            f"{spec.archive_job_name(kind)} runs again at its next scheduled time "
            f"(kubectl logs job/{job} has the whole log)")


def _result(line: str) -> dict[str, Any] | None:
    """The result line as an object. Its null fields are left out: status is written as a
    merge patch, where null means "remove"."""
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    return {k: v for k, v in doc.items() if v is not None} if isinstance(doc, dict) else None


def _phase(job: Mapping[str, Any]) -> JobPhase:
    return read_job(job, (), "").phase


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}
