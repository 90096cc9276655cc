"""One reconcile of one RaftCluster: observe, plan, take one step, describe.

Runs in a worker thread (the Kubernetes and member calls are synchronous) and returns what the
kopf handler must write back: the status, and the events to post. Everything it decides comes
from `planner.plan`; this module only translates between Kubernetes objects and the planner's
slots, and carries out the step with the API server or the members' admin API.

Idempotent by construction: the owned objects are compared with what `render` produces and
applied (server-side apply) only where they differ, and the step is recomputed from scratch on
every call. An object rendered exactly as when it was last seen in line is not even read
(`applied.py`): the daemon's watches say when one changes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from flotilla.client import FlotillaError

from . import (
    archivejobs,
    certs,
    kstatus,
    podstate,
    render,
    requests,
    restorejob,
    tlsassets,
    volumes,
)
from .applied import Applied, in_line
from .jobs import foreign
from .kube import ApiError, Kube
from .members import Members
from .memberstatus import ArchiveState, Configuration, MemberStatus, SnapshotState
from .planner import Action, CatchUp, Observed, Plan, Record, Slot, Step, plan
from .restorejob import Move, Stage
from .spec import ARCHIVE_JOBS, ClusterSpec, SpecError

__all__ = ["Outcome", "finalize", "reconcile"]

log = logging.getLogger("flotilla.operator")

# Planner steps as Kubernetes event reasons.
REASONS = {
    Step.RESIZE: "Resized",
    Step.ADD_LEARNER: "LearnerAdded",
    Step.CHANGE_VOTERS: "VotersChanged",
    Step.TRANSFER_LEADER: "LeadershipTransferred",
    Step.REMOVE_MEMBER: "MemberRemoved",
    Step.RESET_VOLUME: "VolumeReset",
    Step.DELETE_VOLUME: "VolumeDeleted",
    Step.RESTART_MEMBER: "MemberRestarted",
}
REVISION_LABEL = "controller-revision-hash"  # set on each pod by the StatefulSet controller
# Where the operator runs (the chart sets both from its pod): the NetworkPolicy of every
# cluster lets this namespace's pods with these labels reach the members' client port.
OPERATOR_NAMESPACE_ENV = "FLOTILLA_OPERATOR_NAMESPACE"
OPERATOR_POD_LABELS_ENV = "FLOTILLA_OPERATOR_POD_LABELS"  # k=v,k=v
_ORDINAL = re.compile(r"-(\d+)$")


@dataclass
class Outcome:
    status: dict[str, Any]
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    plan: Plan | None = None
    step_error: str | None = None  # why the planned step failed, if it did
    # A user's request was carried out (a snapshot, leadership moved): the cluster is worth
    # a look again at once, as after a step.
    requests_done: bool = False
    # Each running member's /v1/status this round, None where it did not answer (metrics.py).
    statuses: Mapping[str, MemberStatus | None] = field(default_factory=dict)


def reconcile(kube: Kube, body: Mapping[str, Any], *, default_image: str,
              now: float | None = None, applied: Applied | None = None) -> Outcome:
    """One round; the status it returns also carries kstatus's Reconciling and Stalled. A
    RaftCluster being deleted takes no step: it is only said to be Deleting. `applied`: what the
    cluster's daemon keeps between rounds of the owned objects it brought in line (see
    `applied.py`); without it every owned object is read."""
    old = dict(body.get("status") or {})
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return Outcome(deleting_status(old, _generation(body)))
    outcome = _reconcile(kube, body, default_image=default_image, now=now,
                         applied=applied)
    status = outcome.status
    status["conditions"] = [*status["conditions"], *_conditions(
        old, kstatus.conditions(status["phase"], status["conditions"]),
        int(status.get("observedGeneration") or 0))]
    return outcome


def deleting_status(old: Mapping[str, Any], generation: int) -> dict[str, Any]:
    """The status of a RaftCluster whose deletion waits for the finalizer (the final
    snapshot): phase Deleting, not Ready, Reconciling; the other conditions as they were."""
    message = ("the RaftCluster is being deleted: with an archive the final snapshot is "
               "taken first, then the members and their objects go (the volumes stay)")
    wanted = {"Ready": (False, "Deleting", message), "Progressing": (True, "Deleting", message),
              "Reconciling": (True, "Deleting", message),
              "Stalled": (False, "Deleting", "nothing needs the user")}
    kept = [c for c in old.get("conditions") or [] if c.get("type") not in wanted]
    return {"phase": "Deleting", "observedGeneration": generation,
            "lastAction": "deleting: the final snapshot, then the owned objects",
            "conditions": [*_conditions(old, wanted, generation), *kept]}


def _reconcile(kube: Kube, body: Mapping[str, Any], *, default_image: str,
               now: float | None = None, applied: Applied | None = None) -> Outcome:
    now = time.time() if now is None else now
    old = dict(body.get("status") or {})
    try:
        spec = ClusterSpec.from_body(body, default_image=default_image)
    except SpecError as exc:
        status = {"phase": "Invalid", "observedGeneration": _generation(body),
                  "lastAction": f"nothing: the spec is invalid: {exc}"}
        status["conditions"] = _conditions(old, {
            "Ready": (False, "InvalidSpec", str(exc)),
            "Progressing": (False, "InvalidSpec", "fix the spec; nothing is changed meanwhile"),
        }, _generation(body))
        return Outcome(status, [("Warning", "InvalidSpec", str(exc))])

    record = _record(old)
    # What every round observes of Kubernetes, asked at once: the calls do not depend on
    # each other (pods and volumes are not used before a restore's Job has succeeded).
    sts, pod_list, claims = _at_once(
        lambda: kube.get("StatefulSet", spec.namespace, spec.name),
        lambda: kube.list("Pod", spec.namespace, spec.selector),
        lambda: kube.list("PersistentVolumeClaim", spec.namespace, spec.selector))
    # A point-in-time restore: the snapshot Job first; no member before it has succeeded.
    stage: Stage | None = None
    events: list[tuple[str, str, str]] = []
    if spec.restored_cluster_id is not None and sts is None and not record.bootstrapped:
        stage, events = _restore_stage(kube, spec, old)
        if not stage.restored:
            return Outcome(_restoring_status(spec, old, stage), events)

    # The Secrets members need before they run: the admin token, the certificates.
    token, problem, found = tlsassets.admin_token(kube, spec)
    events += found
    if problem is not None:
        return _blocked(spec, old, problem, events)
    size = int((sts or {}).get("spec", {}).get("replicas") or 0)
    pods = {p["metadata"]["name"]: p for p in pod_list}
    pvcs = {p["metadata"]["name"] for p in claims}
    highest = max([_ordinal(n) + 1 for n in [*pods, *(v[5:] for v in pvcs)]] or [0])
    names = spec.member_names(max(spec.replicas, size, highest))
    tls = tlsassets.ensure(kube, spec, names, datetime.fromtimestamp(now, UTC))
    events += tls.events
    problem = tls.problem or _ensure_certificates(kube, tls.objects, events)
    if problem is not None:
        return _blocked(spec, old, problem, events)
    members = Members(spec, token, tlsassets.client_context(tls.trust, tls.client_cert)
                      if tls.trust is not None else None)
    running = [n for n in names if _running(pods.get(n))]
    statuses, served = members.observe(running)
    revision = ((sts or {}).get("status") or {}).get("updateRevision")
    slots = {n: Slot(running=n in running, status=statuses.get(n),
                     exit_code=_exit_code(pods.get(n)), volume=_claim(n) in pvcs,
                     outdated=_outdated(pods.get(n), revision),
                     stale_certificate=None not in (served.get(n), tls.serials.get(n))
                     and served.get(n) != tls.serials.get(n))
             for n in names}
    result = plan(Observed(desired=spec.replicas, size=size, slots=slots, names=names,
                           record=record, now=now,
                           catch_up_timeout=float(spec.timing.catch_up_timeout_seconds),
                           delete_removed_volumes=spec.storage.removed_volume_policy
                           == "Delete"))
    action = result.action
    if action.step is Step.RESIZE and action.size is not None and action.size > size:
        # No pod before its certificate: cert-manager writes Secrets in its own time.
        waiting = [n for n in names[:action.size] if n not in tls.ready]
        if waiting:
            action = Action(Step.WAIT, f"waiting for the certificate Secrets of "
                            f"{', '.join(waiting)} (spec.tls.issuerRef) before growing to "
                            f"{action.size} pods")
            result = dataclasses.replace(result, action=action)
    lead = result.leader_status
    config = lead.config if lead is not None else Configuration()
    voters = sorted(config.voters)
    # While joint, both voter sets must keep a quorum: the smaller one bounds the budget.
    fewest = min([len(voters), *((len(config.joint.old), len(config.joint.new))
                                 if config.joint is not None else ())])

    # The owned objects, created or brought in line (never resized here but by a step).
    target_size = action.size if action.step is Step.RESIZE else size
    bootstrapped = result.record.bootstrapped
    # After bootstrap --initial-cluster is inert (every pod starts `existing`): left out.
    bootstrap = names[:target_size] if not bootstrapped else []
    if not spec.network.policy:
        events += _no_network_policy(kube, spec)
    owned = render.owned_objects(spec, bootstrap, bootstrapped, target_size,
                                 voters=fewest or spec.replicas, operator_peer=operator_peer())
    if applied is not None:
        applied.retain(owned)
    for obj in owned:
        meta = obj["metadata"]
        token = 0
        if obj["kind"] == "StatefulSet":  # read once, above
            current = sts
            obj = volumes.keep_claim_template(obj, current)  # fixed: claims grow instead
        elif applied is not None and applied.unchanged(obj):
            continue
        else:
            token = applied.token(obj) if applied is not None else 0
            current = kube.get(obj["kind"], meta["namespace"], meta["name"])
        try:
            created = _ensure(kube, obj, current)
        except ApiError as exc:
            if exc.status not in (400, 422):
                raise
            return _blocked(spec, old, tlsassets.Problem("Rejected", (
                f"the API server refused {obj['kind']} {meta['name']} as rendered from the "
                f"spec: {exc}; fix the field it names (spec.pod and spec.resources reach the "
                "pod template as they are)")), events)
        if applied is not None and obj["kind"] != "StatefulSet":
            applied.remember(obj, token)
        if created:
            events.append(("Normal", "Created", f"{obj['kind']} {obj['metadata']['name']}"))
    archive_jobs, job_events = _archive_jobs(kube, spec, old)
    events += job_events
    member_claims = {_claim(n) for n in names[:max(size, target_size)]}
    sizing = volumes.resize(kube, spec, [c for c in claims
                                         if c["metadata"]["name"] in member_claims])
    events += sizing.events

    # The step.
    step_error = None
    if action.step not in (Step.WAIT, Step.DONE, Step.RESIZE):
        try:
            _carry_out(kube, members, spec, action, running)
        except (FlotillaError, ApiError, OSError) as exc:
            step_error = str(exc)
    if action.step in REASONS:
        if step_error:
            events.append(("Warning", REASONS[action.step] + "Failed",
                           f"{action.describe()}; failed, retried next round: {step_error}"))
        else:
            events.append(("Normal", REASONS[action.step], action.describe()))
    status = _status(spec, old, result, pods, voters, step_error, stage, sizing,
                     names[:target_size])
    status["tls"] = _replacing(old.get("tls") or {}, tls.status)
    # What a user asked for through annotations (a snapshot now, leadership to a voter), in a
    # round that took no step on the members or their pods; otherwise the next round, which
    # comes at once after a step.
    asked = requests.pending(body, old)
    if asked and action.step in (Step.WAIT, Step.DONE, Step.RESIZE):
        entries, asked_events = requests.carry_out(asked, members, running, lead,
                                                   _rfc3339(now))
        events += asked_events
        recorded = old.get("requests") or {}
        status["requests"] = {kind: _replacing(recorded.get(kind) or {}, entry)
                              for kind, entry in entries.items()}
    if archive_jobs is not None:
        status["archiveJobs"] = archive_jobs
    return Outcome(status, events, result, step_error, requests_done="requests" in status,
                   statuses=statuses)


def operator_peer() -> dict[str, Any] | None:
    """The NetworkPolicy peer that is this operator: its namespace (and its pod's labels,
    when known) from the environment the chart sets; None outside a cluster."""
    namespace = os.environ.get(OPERATOR_NAMESPACE_ENV)
    if not namespace:
        return None
    peer: dict[str, Any] = {"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": namespace}}}
    labels = dict(term.split("=", 1) for term in
                  (os.environ.get(OPERATOR_POD_LABELS_ENV) or "").split(",") if "=" in term)
    if labels:
        peer["podSelector"] = {"matchLabels": labels}
    return peer


def _ensure_certificates(kube: Kube, objects: list[dict[str, Any]],
                         events: list[tuple[str, str, str]]) -> tlsassets.Problem | None:
    """The cert-manager Certificates, created or patched; a refusal that needs the user
    (no cert-manager, no permission) becomes the Problem that holds the cluster."""
    for obj in objects:
        meta = obj["metadata"]
        try:
            if _ensure(kube, obj, kube.get(obj["kind"], meta["namespace"], meta["name"])):
                events.append(("Normal", "Created", f"Certificate {meta['name']}"))
        except ApiError as exc:
            problem = tlsassets.problem_from_api(exc, obj["kind"])
            if problem is None:
                raise
            return problem
    return None


def _no_network_policy(kube: Kube, spec: ClusterSpec) -> list[tuple[str, str, str]]:
    """spec.network.policy is false: the cluster's NetworkPolicy goes, if the operator made
    one (one of another owner is left alone)."""
    current = kube.get("NetworkPolicy", spec.namespace, spec.name)
    if current is None or foreign(current, spec.uid):
        return []
    kube.delete("NetworkPolicy", spec.namespace, spec.name)
    return [("Normal", "Deleted", f"NetworkPolicy {spec.name}: spec.network.policy is false")]


def _blocked(spec: ClusterSpec, old: Mapping[str, Any], problem: tlsassets.Problem,
             events: list[tuple[str, str, str]]) -> Outcome:
    """A Secret the members need is missing or unusable, or the API server refused an
    object rendered from the spec (reason Rejected): nothing more is created or changed
    until it is fixed; Ready says why, one Warning too."""
    status: dict[str, Any] = {"phase": "Invalid", "observedGeneration": spec.generation,
                              "lastAction": f"nothing: {problem.message}"}
    status["conditions"] = _conditions(old, {
        "Ready": (False, problem.reason, problem.message),
        "Progressing": (False, problem.reason, "fix the Secret; nothing is changed meanwhile"
                        if problem.reason != "Rejected" else
                        "fix the spec; nothing more is changed meanwhile"),
    }, spec.generation)
    return Outcome(status, [*events, ("Warning", problem.reason, problem.message)])


def finalize(kube: Kube, body: Mapping[str, Any], *, default_image: str) -> str:
    """Before a RaftCluster goes: its final snapshot, when it has an archive and asks for one.
    Returns what happened, in words. The owned objects go with it (owner references); the
    volumes stay, as StatefulSet volumes do: delete the PVCs to delete the data."""
    _say_deleting(kube, body)
    try:
        spec = ClusterSpec.from_body(body, default_image=default_image)
    except SpecError as exc:
        return f"no final snapshot: the spec is invalid ({exc})"
    if spec.archive is None or not spec.final_snapshot:
        return "no final snapshot (no archive, or spec.deletion.finalSnapshot is false)"
    pods = kube.list("Pod", spec.namespace, spec.selector)
    running = [p["metadata"]["name"] for p in pods if _running(p)]
    if not running:
        return "no final snapshot: no member runs"
    trust, client_cert = tlsassets.trusted(kube, spec, running)
    members = Members(spec, _token(kube, spec), tlsassets.client_context(trust, client_cert)
                      if trust is not None else None)
    doc = members.snapshot(running)
    return f"final snapshot at index {doc['index']} shipped to {doc.get('location')}"


def _say_deleting(kube: Kube, body: Mapping[str, Any]) -> None:
    """Phase Deleting in the status while the finalizer runs. Best effort: the deletion must
    go on even where the status cannot be written."""
    meta = body.get("metadata") or {}
    status = deleting_status(dict(body.get("status") or {}), _generation(body))
    try:
        kube.patch("RaftCluster", str(meta.get("namespace") or "default"), str(meta.get("name")),
                   {"status": status}, "status")
    except (ApiError, OSError) as exc:
        log.warning("could not mark %s Deleting: %s", meta.get("name"), exc)


# --- the point-in-time restore stage ---------------------------------------------------------


def _restore_stage(kube: Kube, spec: ClusterSpec,
                   old: Mapping[str, Any]) -> tuple[Stage, list[tuple[str, str, str]]]:
    """Observe the snapshot Job, decide (restorejob.decide) and act: create it, delete a
    foreign one, or nothing. Events mark the turns: created, succeeded, failed (once each,
    whatever the number of rounds or operator restarts: the previous reason is in status)."""
    name = spec.restore_job_name
    job = kube.get("Job", spec.namespace, name)
    pods = kube.list("Pod", spec.namespace, spec.restore_job_selector) if job else []
    stage = restorejob.decide(spec, restorejob.observe(job, pods, spec.uid))
    before = _condition(old, "Restored").get("reason")
    events: list[tuple[str, str, str]] = []
    if stage.move is Move.CREATE_JOB:
        kube.create(render.restore_job(spec))
        events.append(("Normal", "RestoreJobCreated", stage.message))
    elif stage.move is Move.DELETE_JOB:
        kube.delete("Job", spec.namespace, name, propagation="Background")
    elif stage.move is Move.STOP and before != stage.reason:
        events.append(("Warning", "RestoreJobFailed", stage.message))
    elif stage.move is Move.PROCEED and before != stage.reason:
        events.append(("Normal", "RestoreJobSucceeded", stage.message))
    return stage, events


# --- scheduled compaction and export ----------------------------------------------------------


def _archive_jobs(kube: Kube, spec: ClusterSpec, old: Mapping[str, Any]
                  ) -> tuple[dict[str, Any] | None, list[tuple[str, str, str]]]:
    """The CronJobs of spec.archive.compaction and .export brought in line with the spec
    (created, patched, or deleted with their Jobs when their block is gone), and
    status.archiveJobs from their newest Jobs (archivejobs.py). None, and not one API call,
    when no block is set and status records none."""
    wanted = spec.archive.scheduled() if spec.archive is not None else {}
    recorded = old.get("archiveJobs") or {}
    if not wanted and not recorded:
        return None, []
    cronjobs = {c["metadata"]["name"]: c
                for c in kube.list("CronJob", spec.namespace, spec.archive_jobs_selector)}
    report: dict[str, Any] = {}
    events: list[tuple[str, str, str]] = []
    for kind in ARCHIVE_JOBS:
        name = spec.archive_job_name(kind)
        current = cronjobs.get(name)
        if kind not in wanted or (current is not None and foreign(current, spec.uid)):
            # Gone from the spec, or left by an earlier RaftCluster of this name (then made
            # again next round): its Jobs and their pods go with it.
            if current is not None:
                kube.delete("CronJob", spec.namespace, name, propagation="Background")
                if kind not in wanted:
                    events.append(("Normal", "Deleted",
                                   f"CronJob {name}: spec.archive.{kind} was removed"))
            if kind not in wanted and kind in recorded:
                report[kind] = None  # merge patch: removes the entry
            continue
        if _ensure(kube, render.archive_cronjob(spec, kind), current):
            events.append(("Normal", "Created", f"CronJob {name}"))
        before = recorded.get(kind) or {}
        job = archivejobs.newest(kube.list("Job", spec.namespace,
                                           spec.archive_job_selector(kind)))
        pods = (kube.list("Pod", spec.namespace, spec.archive_job_selector(kind))
                if archivejobs.needs_pods(job, before) else [])
        now = archivejobs.entry(spec, kind, current, job, pods, before)
        report[kind] = _replacing(before, now)
        announced = archivejobs.event(spec, kind, now, before)
        if announced is not None:
            events.append(announced)
    return report, events


def _replacing(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch (RFC 7386, how status is written) that turns `before` into `after`: what
    `before` has and `after` has not is set to null, at every depth, so nothing of an earlier
    run (its message, a key of its result) lingers beside the newer one."""
    patch: dict[str, Any] = {key: None for key in before if key not in after}
    for key, value in after.items():
        old = before.get(key)
        patch[key] = (_replacing(old, value) if isinstance(value, Mapping)
                      and isinstance(old, Mapping) else value)
    return patch


def _restoring_status(spec: ClusterSpec, old: Mapping[str, Any], stage: Stage) -> dict[str, Any]:
    """While the snapshot Job runs, or after it failed: no member, no StatefulSet."""
    failed = stage.move is Move.STOP
    status: dict[str, Any] = {
        "observedGeneration": spec.generation,
        "phase": stage.phase,
        "replicas": 0,
        "readyReplicas": 0,
        "selector": spec.selector,
        "clusterId": spec.cluster_id,
        "bootstrapped": False,
        "restore": _restore_record(spec, stage, old),
        "lastAction": f"{stage.move.value}: {stage.message}",
    }
    status["conditions"] = _conditions(old, {
        "Ready": (False, stage.reason if failed else "Restoring", stage.message),
        "Progressing": (not failed, stage.reason, "no member starts until the restore Job is "
                        "run again" if failed else stage.message),
        "Restored": (False, stage.reason, stage.message),
    }, spec.generation)
    return status


def _restore_record(spec: ClusterSpec, stage: Stage | None,
                    old: Mapping[str, Any]) -> dict[str, Any]:
    """status.restore: the Job, the cluster it publishes, and once it has, what it restored."""
    record = {"job": spec.restore_job_name, "clusterId": spec.restored_cluster_id or ""}
    result = stage.result if stage is not None else None
    if result is not None:
        record.update(index=result.index, term=result.term)
        if result.time:
            record["time"] = result.time
    elif stage is None:  # after the stage: what was recorded then
        recorded = old.get("restore") or {}
        record.update({k: recorded[k] for k in ("index", "term", "time") if k in recorded})
    return record


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


# --- steps ----------------------------------------------------------------------------------


def _carry_out(kube: Kube, members: Members, spec: ClusterSpec, action: Any,
               running: list[str]) -> None:
    if action.step is Step.RESET_VOLUME:
        # The claim first: it is held until the pod is gone, then the StatefulSet controller
        # makes the pod again with a new, empty claim.
        kube.delete("PersistentVolumeClaim", spec.namespace, _claim(action.member))
        kube.delete("Pod", spec.namespace, action.member)
    elif action.step is Step.DELETE_VOLUME:
        kube.delete("PersistentVolumeClaim", spec.namespace, _claim(action.member))
    elif action.step is Step.RESTART_MEMBER:
        # OnDelete: the StatefulSet controller makes the pod again from the current template,
        # on the same volume.
        kube.delete("Pod", spec.namespace, action.member)
    else:
        members.carry_out(action, running)


def _ensure(kube: Kube, obj: Mapping[str, Any], current: Mapping[str, Any] | None) -> bool:
    """Server-side apply `obj` when it is missing, or when a field that may change (or a
    label) differs from `current`. True if it was created.

    The comparison first, so an object already as rendered costs no write (and no watch event
    that would wake the operator again); the apply then sends the whole object, so what the
    operator stopped rendering is removed too, which a merge patch could not do."""
    if current is not None and in_line(obj, current):
        return False
    kube.apply(obj)
    return current is None


# --- observing ------------------------------------------------------------------------------


def _at_once(*calls: Callable[[], Any]) -> list[Any]:
    """The results of independent calls, made together (each waits on the network); the
    first error is raised."""
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return [f.result() for f in [pool.submit(call) for call in calls]]


def _ordinal(name: str) -> int:
    found = _ORDINAL.search(name)
    return int(found.group(1)) if found else -1


def _claim(member: str) -> str:
    return f"{render.VOLUME}-{member}"


def _running(pod: Mapping[str, Any] | None) -> bool:
    if pod is None or pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") == "Running"


def _ready(pod: Mapping[str, Any] | None) -> bool:
    conditions = ((pod or {}).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _outdated(pod: Mapping[str, Any] | None, revision: str | None) -> bool:
    """Whether the pod was made from an older template than the StatefulSet's newest."""
    labels = ((pod or {}).get("metadata") or {}).get("labels") or {}
    return bool(revision and labels.get(REVISION_LABEL) not in (None, revision))


def _exit_code(pod: Mapping[str, Any] | None) -> int | None:
    """The node container's last exit code while it is waiting to be restarted (a crash
    loop), else None."""
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") != render.CONTAINER or "running" in (cs.get("state") or {}):
            continue
        terminated = (cs.get("lastState") or {}).get("terminated") or (
            cs.get("state") or {}).get("terminated")
        if terminated and terminated.get("exitCode") is not None:
            return int(terminated["exitCode"])
    return None


def _token(kube: Kube, spec: ClusterSpec) -> str | None:
    """The admin token as it is (nothing is created): for the final snapshot."""
    ref = spec.admin_token_secret
    value = certs.decode(kube.get("Secret", spec.namespace, ref.name)).get(ref.key)
    return value.decode("utf-8", "surrogateescape") if value else None


def _generation(body: Mapping[str, Any]) -> int:
    return int((body.get("metadata") or {}).get("generation") or 0)


# --- the record and the status --------------------------------------------------------------


def _record(status: Mapping[str, Any]) -> Record:
    """The planner's record, kept in the status (so it survives operator restarts)."""
    return Record(
        bootstrapped=bool(status.get("bootstrapped")),
        uids={m["name"]: m["uid"] for m in status.get("members") or [] if m.get("uid")},
        removed={m["uid"]: m.get("name") or "" for m in status.get("removedMembers") or []
                 if m.get("uid")},
        catch_up={c["name"]: CatchUp(_epoch(c.get("since")), int(c.get("attempts") or 1))
                  for c in status.get("catchUp") or []},
    )


def _epoch(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(spec: ClusterSpec, old: Mapping[str, Any], result: Plan,
            pods: Mapping[str, Any], voters: list[str],
            step_error: str | None, stage: Stage | None = None,
            sizing: volumes.Sizing | None = None,
            slots: list[str] | None = None) -> dict[str, Any]:
    """`stage`: the restore stage, when it ended this round (else what status recorded).
    `sizing`: the member volumes against spec.storage.size. `slots`: the pods the
    StatefulSet runs, whose start a bootstrap waits for (phase Pending until a quorum runs)."""
    lead = result.leader_status
    record = result.record
    config = lead.config if lead is not None else Configuration()
    progress = lead.members if lead is not None else {}
    members = []
    for name in sorted(progress, key=_ordinal):
        info = progress[name]
        members.append({"name": name, "role": info.role,
                        "matchIndex": info.match_index or 0,
                        "uid": record.uids.get(name, ""), "ready": _ready(pods.get(name))})
    snapshot = lead.snapshot if lead is not None else SnapshotState()
    archive = lead.archive if lead is not None else ArchiveState()
    commit = lead.commit_index if lead is not None else 0
    action = result.action
    generation = spec.generation
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "phase": result.phase,
        "replicas": len(voters),
        "readyReplicas": sum(1 for p in pods.values() if _ready(p)),
        "selector": spec.selector,
        "clusterId": spec.cluster_id,
        "bootstrapped": record.bootstrapped,
        "leader": result.leader or "",
        "term": (lead.term if lead is not None else 0) or int(old.get("term") or 0),
        "commitIndex": commit,
        "configuration": {"voters": sorted(config.voters),
                          "learners": sorted(config.learners),
                          "joint": config.joint is not None},
        "members": members,
        "lastSnapshot": {"index": snapshot.index, "term": snapshot.term,
                         "bytes": snapshot.bytes},
        "removedMembers": [{"name": name, "uid": uid}
                           for uid, name in sorted(record.removed.items())],
        "catchUp": [{"name": n, "attempts": c.attempts,
                     **({"since": _rfc3339(c.since)} if c.since is not None else {})}
                    for n, c in sorted(record.catch_up.items())],
        "lastAction": action.describe() + (f" (failed: {step_error})" if step_error else ""),
    }
    if spec.archive is not None:
        archived = archive.last_archived_index or 0
        status["archive"] = {
            "url": archive.url or spec.archive.url,
            "lastArchivedIndex": archived,
            "lastSnapshotIndex": archive.last_snapshot_index or 0,
            "lag": max(0, commit - archived),
            "error": archive.error or "",
        }
    done = action.step is Step.DONE
    wanted: dict[str, tuple[bool, str, str]] = {
        "Ready": (done and not result.degraded, "AsAsked" if done else "Reconciling",
                  action.reason if not done else f"{len(voters)} voters, as asked"),
        "Progressing": (not done, REASONS.get(action.step, action.step.value.title()),
                        action.reason),
        "Degraded": (bool(result.degraded), "Degraded" if result.degraded else "Healthy",
                     result.degraded or "every voter answers"),
    }
    if spec.archive is not None:
        error = archive.error
        wanted["Archiving"] = (lead is not None and not error, "ArchiveError" if error else (
            "Shipping" if lead is not None else "NoLeader"), error or f"archived up to index "
            f"{archive.last_archived_index or 0} of {commit}")
    waiting = _pending(result, pods, slots or [])
    if waiting is not None:
        status["phase"] = "Pending"
        wanted["Ready"] = (False, "PodsPending", waiting)
        wanted["Progressing"] = (True, "PodsPending", waiting)
    if sizing is not None and sizing.condition is not None:
        wanted[volumes.CONDITION] = sizing.condition
    if spec.restored_cluster_id is not None:
        status["restore"] = _restore_record(spec, stage, old)
        restored = _condition(old, "Restored")
        wanted["Restored"] = (True, restorejob.SUCCEEDED, stage.message if stage is not None
                              else str(restored.get("message") or "the snapshot Job succeeded"))
    status["conditions"] = _conditions(old, wanted, generation)
    return status


def _pending(result: Plan, pods: Mapping[str, Any], slots: list[str]) -> str | None:
    """Before the first leader, while fewer than a quorum of the first members' pods run:
    why they do not (not created, not scheduled, an image not pulled...), in words; else
    None."""
    if result.record.bootstrapped or result.phase != "Bootstrapping" or not slots:
        return None
    waiting = {name: podstate.why_not_running(pods.get(name)) for name in slots}
    waiting = {name: why for name, why in waiting.items() if why is not None}
    if len(slots) - len(waiting) >= ClusterSpec.quorum(len(slots)):
        return None
    return "waiting for the members' pods to run: " + "; ".join(
        f"{name} {why}" for name, why in waiting.items())


def _conditions(old: Mapping[str, Any], wanted: Mapping[str, tuple[bool, str, str]],
                generation: int) -> list[dict[str, Any]]:
    """Conditions in the Kubernetes shape; lastTransitionTime moves only when status does."""
    before = {c.get("type"): c for c in old.get("conditions") or []}
    now = _rfc3339(time.time())
    out = []
    for kind, (ok, reason, message) in wanted.items():
        value = "True" if ok else "False"
        prior = before.get(kind) or {}
        out.append({"type": kind, "status": value, "reason": reason, "message": message[:1000],
                    "observedGeneration": generation,
                    "lastTransitionTime": prior.get("lastTransitionTime")
                    if prior.get("status") == value else now})
    return out
