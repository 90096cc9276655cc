"""The point-in-time restore stage, without a cluster: a Job and its pods as the API server
returns them, read into what happened (`observe`), and what the operator does about it
(`decide`); then one reconcile after another against an in-memory API, checking that no member
exists before the Job has succeeded and that each turn is announced once."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from flotilla.operator import render
from flotilla.operator.reconcile import reconcile
from flotilla.operator.restorejob import JobPhase, JobRun, Move, SnapshotResult, decide, observe
from flotilla.operator.spec import ClusterSpec

from tests.operator.test_spec import UID, body

URL = "s3://old-backups/team"
AT_INDEX = body({"bootstrap": {"restore": {"url": URL, "index": 900}}})
AT_TIME = body({"bootstrap": {"restore": {"url": URL, "time": "2026-11-25T17:00:00.250Z"}}})
SPEC = ClusterSpec.from_body(AT_INDEX)
PRODUCED = "prod-demo-6f1c2a9e-at-900"
RESULT = json.dumps({"cluster_id": PRODUCED, "index": 900, "term": 3,
                     "time": "2026-11-25T16:59:59.120Z", "location": f"{URL}/{PRODUCED}/x",
                     "sha256": "ab" * 32})
OUTSIDE = ("flotilla pipeline: index 900 is outside what s3://old-backups/team can rebuild "
           "(indexes 1..57); pick an --index there")


JOB_UID = "7d0c-job"


def job(*conditions: tuple[str, str], owner: str = UID) -> dict[str, Any]:
    doc = render.restore_job(SPEC)
    doc["metadata"]["ownerReferences"][0]["uid"] = owner
    doc["metadata"]["uid"] = JOB_UID
    doc["status"] = {"conditions": [{"type": kind, "status": "True", "reason": reason,
                                     "message": f"{kind}: {reason}"}
                                    for kind, reason in conditions]}
    return doc


def pod(name: str, code: int | None, message: str = "", finished: str = "",
        job_uid: str = JOB_UID) -> dict[str, Any]:
    state = ({"running": {}} if code is None else
             {"terminated": {"exitCode": code, "message": message, "finishedAt": finished}})
    return {"metadata": {"name": name, "creationTimestamp": finished or "2026-01-01T00:00:00Z",
                         "labels": SPEC.restore_job_labels,
                         "ownerReferences": [{"kind": "Job", "uid": job_uid}]},
            "status": {"containerStatuses": [{"name": "snapshot-at", "state": state}]}}


# --- observe ---------------------------------------------------------------------------------


def test_no_job_is_missing_and_a_job_of_another_owner_is_foreign():
    assert observe(None, [], UID) == JobRun(JobPhase.MISSING)
    assert observe(job(owner="an-earlier-uid"), [], UID).phase is JobPhase.FOREIGN


def test_a_job_without_a_final_condition_is_running():
    assert observe(job(), [pod("a", None)], UID).phase is JobPhase.RUNNING
    assert observe(job(("Suspended", "x")), [], UID).phase is JobPhase.RUNNING


@pytest.mark.parametrize("kind", ["Complete", "SuccessCriteriaMet"])
def test_a_succeeded_job_gives_the_result_line_of_its_pod(kind):
    run = observe(job((kind, "CompletionsReached")), [pod("a", 0, f"{RESULT}\n")], UID)
    assert run == JobRun(JobPhase.SUCCEEDED, 0, RESULT,
                         SnapshotResult(PRODUCED, 900, 3, "2026-11-25T16:59:59.120Z"))


@pytest.mark.parametrize("kind", ["Failed", "FailureTarget"])
def test_a_failed_job_gives_the_last_line_of_its_last_pod(kind):
    """FallbackToLogsOnError: the message is the log's tail; the pipeline's reason is last.
    With retries, the pod that ended last speaks."""
    pods = [pod("second", 4, f"Spark noise\n{OUTSIDE}\n\n", "2026-01-01T00:02:00Z"),
            pod("first", 1, "flotilla pipeline: the S3 endpoint did not answer",
                "2026-01-01T00:01:00Z")]
    run = observe(job((kind, "PodFailurePolicy")), pods, UID)
    assert run == JobRun(JobPhase.FAILED, 4, OUTSIDE)


def test_only_the_jobs_own_pods_speak():
    """A replaced Job's pods carry the same labels until they are collected."""
    pods = [pod("old", 4, OUTSIDE, "2026-01-01T00:09:00Z", job_uid="an-earlier-job"),
            pod("ours", 0, RESULT, "2026-01-01T00:01:00Z")]
    run = observe(job(("Complete", "CompletionsReached")), pods, UID)
    assert (run.phase, run.exit_code, run.message) == (JobPhase.SUCCEEDED, 0, RESULT)


def test_a_failed_job_whose_pods_are_gone_gives_its_own_reason():
    run = observe(job(("Failed", "BackoffLimitExceeded")), [], UID)
    assert run == JobRun(JobPhase.FAILED, None, "Failed: BackoffLimitExceeded")


@pytest.mark.parametrize("line", ["", "not json", '{"cluster_id": "x"}', '{"index": "x"}'])
def test_a_result_line_that_is_not_one_reads_as_none(line):
    assert SnapshotResult.parse(line) is None


# --- decide ----------------------------------------------------------------------------------


def test_each_job_phase_has_its_move_and_reason():
    cases = {
        JobRun(JobPhase.MISSING): (Move.CREATE_JOB, "SnapshotJobRunning", "Restoring"),
        JobRun(JobPhase.FOREIGN): (Move.DELETE_JOB, "SnapshotJobRunning", "Restoring"),
        JobRun(JobPhase.RUNNING): (Move.WAIT, "SnapshotJobRunning", "Restoring"),
        JobRun(JobPhase.FAILED, 4, OUTSIDE): (Move.STOP, "RestoreTargetOutsideArchive",
                                              "RestoreFailed"),
        JobRun(JobPhase.FAILED, 1, "boom"): (Move.STOP, "SnapshotJobFailed", "RestoreFailed"),
        JobRun(JobPhase.SUCCEEDED, 0, RESULT, SnapshotResult.parse(RESULT)): (
            Move.PROCEED, "SnapshotJobSucceeded", "Restoring"),
        JobRun(JobPhase.SUCCEEDED, 0, ""): (Move.PROCEED, "SnapshotJobSucceeded", "Restoring"),
    }
    for run, (move, reason, phase) in cases.items():
        stage = decide(SPEC, run)
        assert (stage.move, stage.reason, stage.phase) == (move, reason, phase), run
        assert stage.restored is (move is Move.PROCEED)


def test_a_target_outside_the_archive_says_the_range_and_how_to_retry():
    stage = decide(SPEC, JobRun(JobPhase.FAILED, 4, OUTSIDE))
    assert stage.message.startswith(
        f"spec.bootstrap.restore.index is outside what the archive holds: {OUTSIDE};")
    assert "(indexes 1..57)" in stage.message
    assert "delete Job demo-restore" in stage.message
    assert "delete this RaftCluster and create it again" in stage.message


def test_a_failure_names_the_exit_code_and_whether_a_rerun_helps():
    assert "failed (exit 1): boom;" in decide(SPEC, JobRun(JobPhase.FAILED, 1, "boom")).message
    assert "failed (exit 2) (a rerun gives the same): no Java;" in decide(
        SPEC, JobRun(JobPhase.FAILED, 2, "no Java")).message


def test_a_result_for_another_cluster_is_a_failure():
    other = SnapshotResult("someone-else", 900, 3, None)
    stage = decide(SPEC, JobRun(JobPhase.SUCCEEDED, 0, "", other))
    assert (stage.move, stage.reason) == (Move.STOP, "SnapshotJobFailed")
    assert "published cluster someone-else, not prod-demo-6f1c2a9e-at-900" in stage.message


def test_success_says_what_was_restored():
    stage = decide(SPEC, JobRun(JobPhase.SUCCEEDED, 0, RESULT, SnapshotResult.parse(RESULT)))
    assert stage.message == (
        f"Job demo-restore published the state at index 900 (term 3, time "
        f"2026-11-25T16:59:59.120Z) of {URL} as cluster {PRODUCED}; the members restore it")


def test_without_a_point_in_time_there_is_no_stage():
    with pytest.raises(ValueError):
        decide(ClusterSpec.from_body(body()), JobRun(JobPhase.MISSING))


# --- reconcile, round after round, against an in-memory API -----------------------------------


class MemoryKube:
    """get/list/create/patch/apply/delete over a dict; the operator's calls are recorded."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.calls: list[tuple[str, str, str]] = []

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = self.objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def list(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        return [copy.deepcopy(o) for (k, ns, _), o in self.objects.items()
                if k == kind and ns == namespace and wanted.items() <= (
                    o["metadata"].get("labels") or {}).items()]

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta["uid"] = f"uid-{len(self.calls)}"  # what the API server assigns
        self.calls.append(("create", obj["kind"], meta["name"]))
        self.objects[(obj["kind"], meta["namespace"], meta["name"])] = obj
        return obj

    def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any],
              subresource: str = "") -> dict[str, Any]:
        self.calls.append(("patch", kind, name))
        return {}

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply as the API server takes it: a create when the object is missing,
        else a PATCH of the whole object."""
        meta = obj["metadata"]
        if (obj["kind"], meta["namespace"], meta["name"]) not in self.objects:
            return self.create(obj)
        return self.patch(obj["kind"], meta["namespace"], meta["name"], copy.deepcopy(obj))

    def delete(self, kind: str, namespace: str, name: str, propagation: str | None = None) -> bool:
        self.calls.append(("delete", kind, name))
        return self.objects.pop((kind, namespace, name), None) is not None


def rounds(kube: MemoryKube, obj: dict[str, Any], n: int = 1) -> list[Any]:
    """n reconciles, each writing its status back as the handler does."""
    outcomes = []
    for _ in range(n):
        outcome = reconcile(kube, obj, default_image="flotilla:test")
        obj["status"] = {**(obj.get("status") or {}), **outcome.status}
        outcomes.append(outcome)
    return outcomes


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def finish(kube: MemoryKube, kind: str, code: int, message: str) -> None:
    stored = kube.objects[("Job", "prod", "demo-restore")]
    stored["status"] = {"conditions": [{"type": kind, "status": "True"}]}
    kube.objects[("Pod", "prod", "demo-restore-x1")] = pod(
        "demo-restore-x1", code, message, job_uid=stored["metadata"]["uid"])


def test_the_job_comes_first_and_members_only_after_it_succeeded():
    kube, obj = MemoryKube(), copy.deepcopy(AT_INDEX)
    created, waiting = rounds(kube, obj, 2)
    assert kube.calls == [("create", "Job", "demo-restore")]
    assert [e[:2] for e in created.events] == [("Normal", "RestoreJobCreated")]
    assert waiting.events == []
    status = obj["status"]
    assert status["phase"] == "Restoring" and status["bootstrapped"] is False
    assert conditions(status) == {"Ready": ("False", "Restoring"),
                                  "Progressing": ("True", "SnapshotJobRunning"),
                                  "Restored": ("False", "SnapshotJobRunning"),
                                  "Reconciling": ("True", "Restoring"),
                                  "Stalled": ("False", "Progressing")}
    assert status["restore"] == {"job": "demo-restore", "clusterId": PRODUCED}

    finish(kube, "Complete", 0, RESULT + "\n")
    (done,) = rounds(kube, obj)
    assert [e[:2] for e in done.events if e[1].startswith("RestoreJob")] == [
        ("Normal", "RestoreJobSucceeded")]
    assert ("create", "StatefulSet", "demo") in kube.calls
    sts = kube.objects[("StatefulSet", "prod", "demo")]
    env = {v["name"]: v.get("value") for v in sts["spec"]["template"]["spec"]["containers"][0][
        "env"]}
    assert (env["FLOTILLA_RESTORE_FROM"], env["FLOTILLA_RESTORE_CLUSTER_ID"]) == (URL, PRODUCED)
    assert "FLOTILLA_RESTORE_INDEX" not in env
    status = obj["status"]
    assert status["restore"] == {"job": "demo-restore", "clusterId": PRODUCED, "index": 900,
                                 "term": 3, "time": "2026-11-25T16:59:59.120Z"}
    assert conditions(status)["Restored"] == ("True", "SnapshotJobSucceeded")
    (later,) = rounds(kube, obj)  # the StatefulSet exists: the Job is not looked at again
    assert not [e for e in later.events if e[1].startswith("RestoreJob")]
    assert obj["status"]["restore"]["index"] == 900
    assert conditions(obj["status"])["Restored"] == ("True", "SnapshotJobSucceeded")


def test_a_target_outside_the_archive_stops_everything_and_is_said_once():
    kube, obj = MemoryKube(), copy.deepcopy(AT_TIME)
    rounds(kube, obj)
    finish(kube, "Failed", 4, f"some log line\n{OUTSIDE}\n")
    outcomes = rounds(kube, obj, 3)
    assert [[e[:2] for e in o.events] for o in outcomes] == [
        [("Warning", "RestoreJobFailed")], [], []]
    assert OUTSIDE in outcomes[0].events[0][2]
    status = obj["status"]
    assert status["phase"] == "RestoreFailed"
    assert conditions(status) == {"Ready": ("False", "RestoreTargetOutsideArchive"),
                                  "Progressing": ("False", "RestoreTargetOutsideArchive"),
                                  "Restored": ("False", "RestoreTargetOutsideArchive"),
                                  # kstatus: Failed, until the user runs the Job again
                                  "Reconciling": ("False", "Stalled"),
                                  "Stalled": ("True", "RestoreTargetOutsideArchive")}
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert "spec.bootstrap.restore.time is outside what the archive holds" in ready["message"]
    assert "(indexes 1..57)" in ready["message"]
    # the failed Job is never replaced, and no member object exists
    assert kube.calls == [("create", "Job", "demo-restore")]
    assert {k for k, _, _ in kube.objects} == {"Job", "Pod"}


def test_deleting_the_failed_job_runs_it_again():
    kube, obj = MemoryKube(), copy.deepcopy(AT_INDEX)
    rounds(kube, obj)
    finish(kube, "Failed", 1, "flotilla pipeline: the archive did not answer")
    rounds(kube, obj)
    assert obj["status"]["phase"] == "RestoreFailed"
    kube.delete("Job", "prod", "demo-restore")
    del kube.objects[("Pod", "prod", "demo-restore-x1")]
    (again,) = rounds(kube, obj)
    assert [e[:2] for e in again.events] == [("Normal", "RestoreJobCreated")]
    assert obj["status"]["phase"] == "Restoring"


def test_a_job_left_by_an_earlier_cluster_of_the_name_is_deleted_first():
    kube, obj = MemoryKube(), copy.deepcopy(AT_INDEX)
    stale = job(("Failed", "PodFailurePolicy"), owner="an-earlier-uid")
    kube.objects[("Job", "prod", "demo-restore")] = stale
    rounds(kube, obj)
    assert kube.calls == [("delete", "Job", "demo-restore")]
    assert "earlier RaftCluster" in obj["status"]["lastAction"]
    rounds(kube, obj)
    assert kube.calls[-1] == ("create", "Job", "demo-restore")
    assert kube.objects[("Job", "prod", "demo-restore")]["metadata"]["ownerReferences"][0][
        "uid"] == UID


def test_an_invalid_spec_creates_no_job():
    both = body({"bootstrap": {"restore": {"url": URL, "index": 5, "time": "2026-11-25T17:00Z"}}})
    kube = MemoryKube()
    (outcome,) = rounds(kube, both)
    assert outcome.status["phase"] == "Invalid" and kube.calls == []
