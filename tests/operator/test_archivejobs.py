"""Scheduled compaction and export, without a cluster: a CronJob's newest Job and its pods read
into status.archiveJobs and one Event per outcome (`archivejobs`), then reconcile after
reconcile against an in-memory API: the CronJobs made, patched and deleted with the spec, the
Jobs' pods read once per outcome, and nothing looked at when no block asks for a job."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from flotilla.operator import archivejobs, render
from flotilla.operator.spec import ClusterSpec

from tests.operator.test_restorejob import MemoryKube
from tests.operator.test_spec import UID, body

ARCHIVE = {"url": "s3://backups/orders",
           "compaction": {"schedule": "0 3 * * *", "minCompactionLag": "24h"},
           "export": {"schedule": "@hourly", "destination": "s3://lake/orders"}}
SPEC = ClusterSpec.from_body(body({"archive": ARCHIVE}), default_image="flotilla:test")
RESULT = {"cleaned_through": 5000, "entries_before": 5000, "entries_after": 1200,
          "bytes_before": 900000, "bytes_after": 210000}
FAILURE = "flotilla pipeline: the S3 endpoint did not answer"


def job(name: str, *conditions: str, created: str = "2026-03-01T03:00:00Z",
        uid: str | None = None, completed: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [
        {"type": kind, "status": "True", "reason": kind, "message": f"the Job is {kind}",
         "lastTransitionTime": "2026-03-01T03:09:00Z"} for kind in conditions]}
    if completed:
        status["completionTime"] = completed
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "namespace": "prod", "uid": uid or f"uid-{name}",
                         "creationTimestamp": created,
                         "labels": SPEC.archive_job_labels("compaction")},
            "status": status}


def pod(job_name: str, code: int | None, message: str = "",
        container: str = "compact") -> dict[str, Any]:
    state = ({"running": {}} if code is None else {"terminated": {
        "exitCode": code, "message": message, "finishedAt": "2026-03-01T03:08:00Z"}})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job_name}-p0", "namespace": "prod",
                         "creationTimestamp": "2026-03-01T03:00:01Z",
                         "labels": SPEC.archive_job_labels("compaction"),
                         "ownerReferences": [{"kind": "Job", "uid": f"uid-{job_name}"}]},
            "status": {"containerStatuses": [{"name": container, "state": state}]}}


CRONJOB = {"metadata": {"name": "demo-compact"},
           "status": {"lastScheduleTime": "2026-03-01T03:00:00Z"}}


# --- one CronJob's newest Job, read --------------------------------------------------------------


def test_the_newest_job_speaks_for_the_cronjob():
    jobs = [job("demo-compact-29540000", "Complete", created="2026-03-01T03:00:00Z"),
            job("demo-compact-29541440", created="2026-03-02T03:00:00Z"),
            job("demo-compact-29538560", "Failed", created="2026-02-28T03:00:00Z")]
    assert archivejobs.newest(jobs)["metadata"]["name"] == "demo-compact-29541440"
    same_second = [job("demo-compact-9", created="2026-03-01T03:00:00Z"),
                   job("demo-compact-10", created="2026-03-01T03:00:00Z")]
    assert archivejobs.newest(same_second)["metadata"]["name"] == "demo-compact-10"
    assert archivejobs.newest([]) is None


def test_before_any_run_the_entry_names_the_cronjob_and_its_last_schedule():
    assert archivejobs.entry(SPEC, "compaction", None, None, [], {}) == {
        "cronJob": "demo-compact"}
    assert archivejobs.entry(SPEC, "compaction", CRONJOB, None, [], {}) == {
        "cronJob": "demo-compact", "lastScheduleTime": "2026-03-01T03:00:00Z"}


def test_a_running_job_needs_no_pod():
    running = job("demo-compact-1")
    assert not archivejobs.needs_pods(running, {})
    assert archivejobs.entry(SPEC, "compaction", CRONJOB, running, [], {}) == {
        "cronJob": "demo-compact", "lastScheduleTime": "2026-03-01T03:00:00Z",
        "lastJob": "demo-compact-1", "lastOutcome": "Running"}


@pytest.mark.parametrize("kind", ["Complete", "SuccessCriteriaMet"])
def test_a_succeeded_job_gives_its_result_line_parsed(kind):
    done = job("demo-compact-1", kind, completed="2026-03-01T03:08:30Z")
    assert archivejobs.needs_pods(done, {})
    entry = archivejobs.entry(SPEC, "compaction", CRONJOB, done,
                              [pod("demo-compact-1", 0, json.dumps(RESULT) + "\n")], {})
    assert entry == {"cronJob": "demo-compact", "lastScheduleTime": "2026-03-01T03:00:00Z",
                     "lastJob": "demo-compact-1", "lastOutcome": "Succeeded",
                     "lastCompletionTime": "2026-03-01T03:08:30Z", "exitCode": 0,
                     "result": RESULT}


def test_the_result_leaves_out_null_fields():
    line = json.dumps({**RESULT, "snapshot": None, "skipped": "nothing to clean"})
    entry = archivejobs.entry(SPEC, "compaction", None, job("demo-compact-1", "Complete"),
                              [pod("demo-compact-1", 0, line)], {})
    assert entry["result"] == {**RESULT, "skipped": "nothing to clean"}


def test_a_success_whose_line_is_not_json_keeps_the_line():
    entry = archivejobs.entry(SPEC, "compaction", None, job("demo-compact-1", "Complete"),
                              [pod("demo-compact-1", 0, "done, somehow")], {})
    assert (entry["lastOutcome"], entry["message"]) == ("Succeeded", "done, somehow")
    assert "result" not in entry
    assert entry["lastCompletionTime"] == "2026-03-01T03:09:00Z"  # the condition's time


@pytest.mark.parametrize("kind", ["Failed", "FailureTarget"])
def test_a_failed_job_gives_the_last_line_and_the_exit_code(kind):
    entry = archivejobs.entry(SPEC, "compaction", None, job("demo-compact-1", kind),
                              [pod("demo-compact-1", 1, f"Spark noise\n{FAILURE}\n\n")], {})
    assert entry == {"cronJob": "demo-compact", "lastJob": "demo-compact-1",
                     "lastOutcome": "Failed", "lastCompletionTime": "2026-03-01T03:09:00Z",
                     "exitCode": 1, "message": FAILURE}


def test_only_the_jobs_own_pods_and_its_container_speak():
    pods = [pod("demo-compact-0", 1, "an older run's failure"),
            pod("demo-compact-1", 0, "a sidecar's words", container="sidecar")]
    entry = archivejobs.entry(SPEC, "compaction", None, job("demo-compact-1", "Failed"), pods,
                              {})
    assert entry["message"] == "the Job is Failed" and "exitCode" not in entry


def test_an_outcome_already_recorded_is_copied_without_reading_pods():
    recorded = {"cronJob": "demo-compact", "lastJob": "demo-compact-1",
                "lastOutcome": "Succeeded", "lastCompletionTime": "2026-03-01T03:08:30Z",
                "exitCode": 0, "result": RESULT}
    done = job("demo-compact-1", "Complete")
    assert not archivejobs.needs_pods(done, recorded)
    assert archivejobs.entry(SPEC, "compaction", None, done, [], recorded) == recorded
    assert archivejobs.needs_pods(job("demo-compact-2", "Complete"), recorded)
    assert archivejobs.needs_pods(done, {**recorded, "lastOutcome": "Running"})


# --- one Event per outcome ------------------------------------------------------------------------


def test_a_new_success_is_announced_once():
    now = {"lastJob": "demo-compact-1", "lastOutcome": "Succeeded", "result": RESULT}
    kind, reason, message = archivejobs.event(SPEC, "compaction", now, {})
    assert (kind, reason) == ("Normal", "CompactionSucceeded")
    assert message == f"Job demo-compact-1 succeeded: {json.dumps(RESULT)}"
    assert archivejobs.event(SPEC, "compaction", now, now) is None
    running = {"lastJob": "demo-compact-1", "lastOutcome": "Running"}
    assert archivejobs.event(SPEC, "compaction", now, running) is not None
    assert archivejobs.event(SPEC, "compaction", running, {}) is None
    assert archivejobs.event(SPEC, "export", {**now, "lastJob": "demo-export-1"}, now)[1] == \
        "ExportSucceeded"


def test_a_failure_is_a_warning_with_the_reason_and_what_happens_next():
    now = {"lastJob": "demo-export-7", "lastOutcome": "Failed", "exitCode": 1,
           "message": FAILURE}
    kind, reason, message = archivejobs.event(SPEC, "export", now, {})
    assert (kind, reason) == ("Warning", "ExportFailed")
    assert message == (f"Job demo-export-7 failed (exit 1): {FAILURE}; CronJob demo-export runs "
                       "again at its next scheduled time (kubectl logs job/demo-export-7 has "
                       "the whole log)")
    final = archivejobs.event(SPEC, "compaction", {**now, "exitCode": 2}, {})[2]
    assert "failed (exit 2) (a rerun gives the same: check spec.archive.compaction and the " \
           "image)" in final
    bare = archivejobs.event(SPEC, "export", {"lastJob": "j", "lastOutcome": "Failed"}, {})[2]
    assert bare.startswith("Job j failed: no reason given;")


# --- reconcile, round after round, against an in-memory API ---------------------------------------


def merge(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386, as the API server applies the operator's patches (None deletes)."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)
    return target


class PatchingKube(MemoryKube):
    """MemoryKube whose patches are applied, and whose lists are recorded too."""

    def __init__(self) -> None:
        super().__init__()
        self.patches: list[tuple[str, str, dict[str, Any]]] = []

    def patch(self, kind: str, namespace: str, name: str, patch: dict[str, Any],
              subresource: str = "") -> dict[str, Any]:
        super().patch(kind, namespace, name, patch, subresource)
        self.patches.append((kind, name, patch))
        return merge(self.objects[(kind, namespace, name)], patch)

    def list(self, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
        self.calls.append(("list", kind, selector))
        return super().list(kind, namespace, selector)


def rounds(kube: MemoryKube, obj: dict[str, Any], n: int = 1) -> list[Any]:
    """n reconciles, each merging its status into the object as kopf's patch does."""
    from flotilla.operator.reconcile import reconcile

    outcomes = []
    for _ in range(n):
        outcome = reconcile(kube, obj, default_image="flotilla:test")
        obj["status"] = merge(obj.get("status") or {}, copy.deepcopy(outcome.status))
        outcomes.append(outcome)
    return outcomes


def cronjob_calls(kube: MemoryKube) -> list[tuple[str, str, str]]:
    """The calls about CronJobs, their Jobs and those Jobs' pods."""
    return [c for c in kube.calls if c[1] in ("CronJob", "Job")
            or "flotilla-compact" in c[2] or "flotilla-export" in c[2]]


def scheduled(archive: dict[str, Any]) -> dict[str, Any]:
    return body({"archive": archive})


def test_without_a_block_nothing_is_looked_at():
    kube = PatchingKube()
    obj = scheduled({"url": "s3://b"})
    (outcome,) = rounds(kube, obj)
    assert cronjob_calls(kube) == []
    assert "archiveJobs" not in outcome.status


def test_both_cronjobs_are_created_owned_and_reported():
    kube, obj = PatchingKube(), scheduled(copy.deepcopy(ARCHIVE))
    first, second = rounds(kube, obj, 2)
    assert [e for e in first.events if "CronJob" in e[2]] == [
        ("Normal", "Created", "CronJob demo-compact"), ("Normal", "Created", "CronJob demo-export")]
    assert not [e for e in second.events if "CronJob" in e[2]]
    for kind in ("compaction", "export"):
        stored = kube.objects[("CronJob", "prod", SPEC.archive_job_name(kind))]
        assert {k: v for k, v in stored.items() if k != "metadata"} == {
            k: v for k, v in render.archive_cronjob(SPEC, kind).items() if k != "metadata"}
        assert stored["metadata"]["ownerReferences"][0]["uid"] == UID
    assert obj["status"]["archiveJobs"] == {"compaction": {"cronJob": "demo-compact"},
                                            "export": {"cronJob": "demo-export"}}
    # One list of CronJobs and one of Jobs per kind a round; no pods while no Job has ended.
    assert [c[:2] for c in cronjob_calls(kube)].count(("list", "CronJob")) == 2
    assert not [c for c in kube.calls if c[:2] == ("list", "Pod") and "flotilla-compact" in c[2]]
    assert not [c for c in kube.calls if c[0] == "patch" and c[1] == "CronJob"]


def test_a_changed_schedule_or_flag_is_patched_in():
    kube, obj = PatchingKube(), scheduled(copy.deepcopy(ARCHIVE))
    rounds(kube, obj)
    obj["spec"]["archive"]["compaction"].update(schedule="30 4 * * *", deleteRetention="48h")
    obj["spec"]["archive"]["export"]["suspend"] = True
    rounds(kube, obj)
    patched = {name: patch for kind, name, patch in kube.patches if kind == "CronJob"}
    assert set(patched) == {"demo-compact", "demo-export"}
    # applied whole (server-side apply), as rendered from the changed spec
    changed = ClusterSpec.from_body(obj, default_image="flotilla:test")
    assert patched["demo-compact"] == render.archive_cronjob(changed, "compaction")
    assert patched["demo-compact"]["spec"]["schedule"] == "30 4 * * *"
    assert patched["demo-export"] == render.archive_cronjob(changed, "export")
    assert patched["demo-export"]["spec"]["suspend"] is True
    compact = kube.objects[("CronJob", "prod", "demo-compact")]["spec"]
    (container,) = compact["jobTemplate"]["spec"]["template"]["spec"]["containers"]
    assert container["args"][-4:] == ["--delete-retention", "48h", "--result-file",
                                      "/dev/termination-log"]
    before = len(kube.patches)
    rounds(kube, obj)
    assert len(kube.patches) == before, "an unchanged spec patches nothing"


def test_a_removed_block_deletes_its_cronjob_and_its_status():
    kube, obj = PatchingKube(), scheduled(copy.deepcopy(ARCHIVE))
    rounds(kube, obj)
    del obj["spec"]["archive"]["export"]
    (removed,) = rounds(kube, obj)
    assert ("delete", "CronJob", "demo-export") in kube.calls
    assert ("CronJob", "prod", "demo-export") not in kube.objects
    assert ("CronJob", "prod", "demo-compact") in kube.objects
    assert ("Normal", "Deleted", "CronJob demo-export: spec.archive.export was removed") in \
        removed.events
    assert removed.status["archiveJobs"]["export"] is None  # deletes the entry (merge patch)
    assert obj["status"]["archiveJobs"] == {"compaction": {"cronJob": "demo-compact"}}
    del obj["spec"]["archive"]["compaction"]
    rounds(kube, obj)
    assert obj["status"]["archiveJobs"] == {}
    calls = len(kube.calls)
    rounds(kube, obj)
    assert not [c for c in kube.calls[calls:] if c[1] in ("CronJob", "Job")]


def test_each_outcome_is_read_once_and_announced_once():
    kube, obj = PatchingKube(), scheduled(copy.deepcopy(ARCHIVE))
    rounds(kube, obj)
    kube.objects[("Job", "prod", "demo-compact-1")] = job("demo-compact-1")
    (running,) = rounds(kube, obj)
    assert obj["status"]["archiveJobs"]["compaction"]["lastOutcome"] == "Running"
    assert not [e for e in running.events if e[1].startswith("Compaction")]

    kube.objects[("Job", "prod", "demo-compact-1")] = job("demo-compact-1", "Complete",
                                                          completed="2026-03-01T03:08:30Z")
    kube.objects[("Pod", "prod", "demo-compact-1-p0")] = pod("demo-compact-1", 0,
                                                             json.dumps(RESULT))
    kube.objects[("CronJob", "prod", "demo-compact")]["status"] = {
        "lastScheduleTime": "2026-03-01T03:00:00Z"}
    calls = len(kube.calls)
    (done,) = rounds(kube, obj)
    assert [e[:2] for e in done.events if e[1].startswith("Compaction")] == [
        ("Normal", "CompactionSucceeded")]
    pod_lists = [c for c in kube.calls[calls:] if c[:2] == ("list", "Pod")
                 and c[2] == SPEC.archive_job_selector("compaction")]
    assert len(pod_lists) == 1
    assert obj["status"]["archiveJobs"]["compaction"] == {
        "cronJob": "demo-compact", "lastScheduleTime": "2026-03-01T03:00:00Z",
        "lastJob": "demo-compact-1", "lastOutcome": "Succeeded",
        "lastCompletionTime": "2026-03-01T03:08:30Z", "exitCode": 0, "result": RESULT}

    calls = len(kube.calls)
    (again,) = rounds(kube, obj)
    assert not [e for e in again.events if e[1].startswith("Compaction")]
    assert not [c for c in kube.calls[calls:] if c[:2] == ("list", "Pod")
                and c[2] == SPEC.archive_job_selector("compaction")]
    assert obj["status"]["archiveJobs"]["compaction"]["result"] == RESULT

    # The next run succeeds with less to say: nothing of the earlier result lingers.
    kube.objects[("Job", "prod", "demo-compact-15")] = job(
        "demo-compact-15", "Complete", created="2026-03-01T15:00:00Z")
    kube.objects[("Pod", "prod", "demo-compact-15-p0")] = pod(
        "demo-compact-15", 0, json.dumps({"cleaned_through": 5000, "skipped": "not dirty"}))
    rounds(kube, obj)
    assert obj["status"]["archiveJobs"]["compaction"]["result"] == {"cleaned_through": 5000,
                                                                     "skipped": "not dirty"}

    # The next run fails: Failed, its reason, one Warning.
    kube.objects[("Job", "prod", "demo-compact-2")] = job(
        "demo-compact-2", "Failed", created="2026-03-02T03:00:00Z")
    kube.objects[("Pod", "prod", "demo-compact-2-p0")] = pod("demo-compact-2", 1, FAILURE)
    failed, quiet = rounds(kube, obj, 2)
    assert [e[:2] for e in failed.events if e[1].startswith("Compaction")] == [
        ("Warning", "CompactionFailed")]
    assert FAILURE in next(e[2] for e in failed.events if e[1] == "CompactionFailed")
    assert not [e for e in quiet.events if e[1].startswith("Compaction")]
    entry = obj["status"]["archiveJobs"]["compaction"]
    assert (entry["lastJob"], entry["lastOutcome"], entry["exitCode"], entry["message"]) == (
        "demo-compact-2", "Failed", 1, FAILURE)
    assert "result" not in entry  # the merge patch removed the earlier run's result


def test_a_cronjob_left_by_an_earlier_cluster_of_the_name_is_replaced():
    kube, obj = PatchingKube(), scheduled(copy.deepcopy(ARCHIVE))
    stale = render.archive_cronjob(SPEC, "compaction")
    stale["metadata"]["ownerReferences"][0]["uid"] = "an-earlier-uid"
    kube.objects[("CronJob", "prod", "demo-compact")] = stale
    rounds(kube, obj)
    assert ("delete", "CronJob", "demo-compact") in kube.calls
    rounds(kube, obj)
    assert kube.objects[("CronJob", "prod", "demo-compact")]["metadata"]["ownerReferences"][0][
        "uid"] == UID


def test_an_invalid_block_changes_nothing_and_says_why():
    kube, obj = PatchingKube(), scheduled(copy.deepcopy(ARCHIVE))
    rounds(kube, obj)
    obj["spec"]["archive"]["compaction"]["schedule"] = "daily at 3"
    (outcome,) = rounds(kube, obj)
    assert outcome.status["phase"] == "Invalid"
    assert outcome.events == [("Warning", "InvalidSpec", outcome.status["conditions"][0][
        "message"])]
    assert "spec.archive.compaction.schedule must be a cron schedule" in outcome.events[0][2]
    assert kube.objects[("CronJob", "prod", "demo-compact")]["spec"]["schedule"] == "0 3 * * *"
