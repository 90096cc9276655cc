"""The kopf handlers: thin. Each RaftCluster has a daemon (`run`) that observes, plans one step
and takes it (`reconcile.py`), then decides when to look again (`pacing.py`): at once after a
step that succeeded, soon while the planner waits on the members, otherwise when an event
wakes it or the safety interval has passed. Events about the cluster (its spec), its
StatefulSet, its pods and its Jobs wake it, and so does any change to its other owned objects
that the daemon did not make itself (a deleted Service, an edited budget). Deletion waits for
the final snapshot.

Settings come from the environment `flotilla operator` sets before importing this module:
FLOTILLA_DEFAULT_IMAGE (for RaftClusters without spec.image) and FLOTILLA_OPERATOR_INTERVAL
(the safety interval: the longest a cluster goes without a round; default 30 seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import threading
import time
from collections.abc import Mapping
from typing import Any

import kopf
import urllib3

from flotilla.client import FlotillaError

from . import pacing, requests
from .applied import Applied
from .kube import ApiError, Kube
from .metrics import METRICS
from .planner import Action
from .reconcile import Outcome, finalize, reconcile
from .spec import DEFAULT_IMAGE, GROUP, VERSION

PLURAL = "raftclusters"
FINALIZER = "flotilla.dev/final-snapshot"
INTERVAL = float(os.environ.get("FLOTILLA_OPERATOR_INTERVAL", "30"))
FINAL_SNAPSHOT_TRIES = 3
# What the operator makes carries this label; only such StatefulSets, pods and Jobs are
# watched (a server-side label selector), and their instance label names their cluster.
MANAGED = {"app.kubernetes.io/managed-by": "flotilla-operator"}
INSTANCE_LABEL = "app.kubernetes.io/instance"
# The owned objects a round does not read while they are as it last brought them in line
# (`applied.py`): watched, by plural, so an edit or a deletion is repaired at once.
APPLIED_KINDS = {"configmaps": "ConfigMap", "services": "Service",
                 "poddisruptionbudgets": "PodDisruptionBudget",
                 "networkpolicies": "NetworkPolicy"}

# Set by `flotilla operator` when it watches namespaces named exactly (no kopf globs): kopf then
# does not scan CRDs and namespaces cluster-wide, so a Role in each namespace is all it needs.
STATIC_NAMESPACES = False

_kube: Kube | None = None
# One round of a cluster at a time, and never a round beside its final snapshot: held in the
# worker thread, so a round the daemon's cancellation leaves running still holds it.
_locks: dict[str, threading.Lock] = {}
# A Warning identical to one posted for the same cluster this recently is not posted again:
# a problem that lasts (an invalid spec, a step failing every round) is said once, not at
# every reconcile. Normal events, one per step taken, are always posted.
WARNING_REPEAT_S = 600.0
_warned: dict[str, dict[tuple[str, str], float]] = {}  # uid -> (reason, message) -> when


def _default_image() -> str:
    return os.environ.get("FLOTILLA_DEFAULT_IMAGE") or DEFAULT_IMAGE


def _api() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube()
    return _kube


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="flotilla.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="flotilla.dev", key="last-handled-configuration")
    settings.posting.level = logging.WARNING  # our own events say what happened
    settings.scanning.disabled = STATIC_NAMESPACES
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    selector = ",".join(f"{k}={v}" for k, v in MANAGED.items())
    for resource in ("statefulsets", "pods", "jobs", *APPLIED_KINDS):
        settings.watching.label_selectors[resource] = selector
    # (namespace, name) -> the Event that wakes that cluster's daemon, and what it keeps of
    # the owned objects it brought in line. The operator's memo is shallow-copied into each
    # object's, so every handler sees these same dicts.
    memo.wakers = {}
    memo.applied = {}


def _key(body: Mapping[str, Any]) -> str:
    meta = body.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name") or "")


def _round(body: Mapping[str, Any], applied: Applied) -> Outcome:
    """One reconcile, in a worker thread, under the cluster's lock."""
    with _locks.setdefault(_key(body), threading.Lock()):
        return reconcile(_api(), body, default_image=_default_image(), applied=applied)


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=5.0)
async def run(body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped,
              logger: logging.Logger, **_: Any) -> None:
    """The cluster's loop: a round, then a wait as `pacing.next_look` says, cut short by
    `memo.wake`. `body` is kopf's live view of the RaftCluster; its status is the operator's
    alone, so the daemon keeps what it last wrote (`written`) and plans from that, not from a
    watch event that may not have arrived yet. What it brought in line of the owned objects
    (`applied`) it forgets at least once per safety interval: that round reads them all."""
    meta = body.get("metadata") or {}
    where = (str(meta.get("namespace")), str(meta.get("name")))
    uid = _key(body)
    wake = memo.wake = asyncio.Event()
    memo.wakers[where] = wake
    applied = memo.applied[where] = Applied()
    forgot_at = time.monotonic()
    pace = pacing.Pace(safety=INTERVAL)
    written: dict[str, Any] = copy.deepcopy(dict(body.get("status") or {}))
    written_at = time.monotonic()
    previous: Action | None = None
    waited: float | None = None
    woken = False  # whether an event cut the last wait short
    try:
        while not stopped:
            wake.clear()
            seen = copy.deepcopy(dict(body))
            memo.seen = _changes(seen)
            seen["status"] = copy.deepcopy(written)
            try:
                began = time.monotonic()
                if began - forgot_at >= INTERVAL:
                    applied.forget()
                    forgot_at = began
                outcome = await asyncio.to_thread(_round, seen, applied)
                METRICS.round_done(where, time.monotonic() - began, outcome, uid)
                logger.debug(f"round of {time.monotonic() - began:.2f}s: "
                             f"{outcome.status.get('lastAction')}")
                await _tell(body, uid, outcome, logger)  # what was done, then where it stands
                # Once stopped (the RaftCluster is being deleted), the finalizer writes the
                # status: a round that began before must not put an older phase back.
                if not stopped and pacing.write_due(written, outcome.status,
                                                    time.monotonic() - written_at):
                    await asyncio.to_thread(_api().patch, "RaftCluster", *where,
                                            {"status": outcome.status}, "status")
                    written = pacing.merge(written, outcome.status)
                    written_at = time.monotonic()
            except Exception as exc:  # the next round plans again from what it observes
                METRICS.round_failed(where, time.monotonic() - began)
                _round_failed(logger, exc)
                applied.forget()
                waited = pacing.next_look(None, True, previous, waited, pace)
                previous = None
            else:
                action = outcome.plan.action if outcome.plan is not None else None
                waited = 0.0 if outcome.requests_done else pacing.next_look(
                    action, outcome.step_error is not None, previous, waited, pace,
                    restoring=outcome.status.get("phase") == "Restoring", woken=woken)
                previous = action
            woken = False
            if waited > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=waited)
                    woken = True
    finally:
        if (body.get("metadata") or {}).get("deletionTimestamp"):  # kopf's live view
            METRICS.deleting(where)  # until the finalizer is done
        else:
            METRICS.forget(where)
        if memo.wakers.get(where) is wake:
            del memo.wakers[where]
        if memo.applied.get(where) is applied:
            del memo.applied[where]


#: What a round can meet that is not a bug: the API server or a member refusing or not
#: answering. Logged in one line; anything else is logged with its traceback.
EXPECTED_FAILURES = (ApiError, FlotillaError, OSError, TimeoutError, urllib3.exceptions.HTTPError)


def _round_failed(logger: logging.Logger, exc: Exception) -> None:
    if isinstance(exc, EXPECTED_FAILURES):
        logger.warning(f"round failed, retried: {exc}")
    else:
        logger.exception(f"round failed, retried: {exc}")


def _changes(body: Mapping[str, Any]) -> tuple[Any, ...]:
    """What, changed on the RaftCluster, calls for a round: its generation and spec, and the
    annotations of a user's requests (a status the daemon wrote itself does not)."""
    meta = body.get("metadata") or {}
    return (meta.get("generation"), body.get("spec"), meta.get("deletionTimestamp"),
            requests.watched(body))


@kopf.on.event(GROUP, VERSION, PLURAL)
def cluster_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    wake = getattr(memo, "wake", None)
    if wake is not None and _changes(body) != getattr(memo, "seen", None):
        wake.set()


@kopf.on.event("apps", "statefulsets", labels=MANAGED)
@kopf.on.event("v1", "pods", labels=MANAGED)
@kopf.on.event("batch", "jobs", labels=MANAGED)
def owned_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A StatefulSet, pod or Job of a cluster changed (a pod started, got ready, went; a Job
    ended): its cluster's daemon looks again now."""
    meta = body.get("metadata") or {}
    cluster = (meta.get("labels") or {}).get(INSTANCE_LABEL)
    wake = memo.wakers.get((meta.get("namespace"), cluster)) if cluster else None
    if wake is not None:
        wake.set()


@kopf.on.event("v1", "configmaps", labels=MANAGED)
@kopf.on.event("v1", "services", labels=MANAGED)
@kopf.on.event("policy", "poddisruptionbudgets", labels=MANAGED)
@kopf.on.event("networking.k8s.io", "networkpolicies", labels=MANAGED)
def applied_event(body: kopf.Body, type: str | None, resource: kopf.Resource,
                  memo: kopf.Memo, **_: Any) -> None:
    """A ConfigMap, Service, PodDisruptionBudget or NetworkPolicy of a cluster changed or went:
    unless it is still as the daemon last brought it in line (its own apply, a status the
    API server updated), the daemon reads it again and repairs it now."""
    meta = body.get("metadata") or {}
    where = (meta.get("namespace"), (meta.get("labels") or {}).get(INSTANCE_LABEL))
    applied = memo.applied.get(where)
    if applied is not None and applied.observe(APPLIED_KINDS[resource.plural], body,
                                               deleted=type == "DELETED"):
        wake = memo.wakers.get(where)
        if wake is not None:
            wake.set()


async def _tell(body: Mapping[str, Any], uid: str, outcome: Outcome,
                logger: logging.Logger) -> None:
    events = [e for e in outcome.events if e[0] != "Warning" or _first_warning(uid, e)]
    for kind, reason, message in events:
        (logger.warning if kind == "Warning" else logger.info)(f"{reason}: {message}")
    await asyncio.to_thread(_post, body, events)


def _first_warning(uid: str, event: tuple[str, str, str]) -> bool:
    now = time.monotonic()
    warned = _warned.setdefault(uid, {})
    for key in [k for k, at in warned.items() if now - at > WARNING_REPEAT_S]:
        del warned[key]
    if event[1:] in warned:
        return False
    warned[event[1:]] = now
    return True


def _post(body: Mapping[str, Any], events: list[tuple[str, str, str]]) -> None:
    """Events are best effort: a lost one must not fail the reconcile that took the step."""
    for kind, reason, message in events:
        try:
            _api().event(body, kind, reason, message)
        except Exception as exc:
            logging.getLogger("flotilla.operator").warning("could not post event %s: %s",
                                                           reason, exc)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def deleted(body: kopf.Body, logger: logging.Logger, retry: int, **_: Any) -> None:
    try:
        what = await asyncio.to_thread(_finalize, body)
    except Exception as exc:  # any failure: retried, then the deletion goes on regardless
        if retry + 1 < FINAL_SNAPSHOT_TRIES:
            raise kopf.TemporaryError(f"final snapshot failed: {exc}", delay=5) from exc
        message = (f"no final snapshot after {FINAL_SNAPSHOT_TRIES} tries ({exc}); deleting "
                   "anyway: the archive holds what was shipped before")
        logger.warning(message)
        await asyncio.to_thread(_post, body, [("Warning", "FinalSnapshotFailed", message)])
        METRICS.forget(_where(body), _key(body))
        return
    finally:
        _locks.pop(body.get("metadata", {}).get("uid", ""), None)
        _warned.pop(body.get("metadata", {}).get("uid", ""), None)
    METRICS.forget(_where(body), _key(body))
    logger.info(what)
    await asyncio.to_thread(_post, body, [("Normal", "Deleting", what)])


def _where(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def _finalize(body: Mapping[str, Any]) -> str:
    """The final snapshot, once no round of the cluster runs (a round the stopped daemon left
    running in its thread finishes first)."""
    with _locks.setdefault(_key(body), threading.Lock()):
        return finalize(_api(), body, default_image=_default_image())
