"""The kopf handlers: thin. Every event about a RaftCluster (created, changed, resumed after an
operator restart) and a timer every few seconds run the same reconcile, which observes,
plans one step and takes it (`reconcile.py`). Deletion waits for the final snapshot.

Settings come from the environment `flotilla operator` sets before importing this module:
FLOTILLA_DEFAULT_IMAGE (for RaftClusters without spec.image) and FLOTILLA_OPERATOR_INTERVAL
(seconds between reconciles of a cluster; default 5).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from .kube import Kube
from .reconcile import finalize, reconcile
from .spec import DEFAULT_IMAGE, GROUP, VERSION

PLURAL = "raftclusters"
FINALIZER = "flotilla.dev/final-snapshot"
INTERVAL = float(os.environ.get("FLOTILLA_OPERATOR_INTERVAL", "5"))
FINAL_SNAPSHOT_TRIES = 3

_kube: Kube | None = None
_locks: dict[str, asyncio.Lock] = {}
_invalid: dict[str, str] = {}  # cluster uid -> the spec problem last announced


def _default_image() -> str:
    return os.environ.get("FLOTILLA_DEFAULT_IMAGE") or DEFAULT_IMAGE


def _api() -> Kube:
    global _kube
    if _kube is None:
        _kube = Kube()
    return _kube


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="flotilla.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="flotilla.dev", key="last-handled-configuration")
    settings.posting.level = logging.WARNING  # our own events say what happened
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330


async def _reconcile(body: Mapping[str, Any], patch: kopf.Patch,
                     logger: logging.Logger) -> None:
    uid = body.get("metadata", {}).get("uid") or body.get("metadata", {}).get("name", "")
    lock = _locks.setdefault(uid, asyncio.Lock())
    async with lock:  # a change handler and the timer never reconcile one cluster at once
        outcome = await asyncio.to_thread(reconcile, _api(), body,
                                          default_image=_default_image())
    patch["status"] = outcome.status
    # An invalid spec is announced once per problem, not every round (the status, which a
    # round may not see yet, is where the planner remembers; this is where the handlers do).
    if outcome.status.get("phase") != "Invalid":
        _invalid.pop(uid, None)
    for event in [e for e in outcome.events if e[1] == "InvalidSpec"]:
        if _invalid.get(uid) == event[2]:
            outcome.events.remove(event)
        _invalid[uid] = event[2]
    for kind, reason, message in outcome.events:
        (logger.warning if kind == "Warning" else logger.info)(f"{reason}: {message}")
    await asyncio.to_thread(_post, body, outcome.events)


def _post(body: Mapping[str, Any], events: list[tuple[str, str, str]]) -> None:
    """Events are best effort: a lost one must not fail the reconcile that took the step."""
    for kind, reason, message in events:
        try:
            _api().event(body, kind, reason, message)
        except Exception as exc:
            logging.getLogger("flotilla.operator").warning("could not post event %s: %s",
                                                           reason, exc)


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def changed(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger,
                  **_: Any) -> None:
    await _reconcile(body, patch, logger)


@kopf.timer(GROUP, VERSION, PLURAL, interval=INTERVAL, initial_delay=INTERVAL)
async def tick(body: kopf.Body, patch: kopf.Patch, logger: logging.Logger, **_: Any) -> None:
    await _reconcile(body, patch, logger)


@kopf.on.delete(GROUP, VERSION, PLURAL)
async def deleted(body: kopf.Body, logger: logging.Logger, retry: int, **_: Any) -> None:
    try:
        what = await asyncio.to_thread(finalize, _api(), body,
                                       default_image=_default_image())
    except Exception as exc:  # any failure: retried, then the deletion goes on regardless
        if retry + 1 < FINAL_SNAPSHOT_TRIES:
            raise kopf.TemporaryError(f"final snapshot failed: {exc}", delay=5) from exc
        message = (f"no final snapshot after {FINAL_SNAPSHOT_TRIES} tries ({exc}); deleting "
                   "anyway: the archive holds what was shipped before")
        logger.warning(message)
        await asyncio.to_thread(_post, body, [("Warning", "FinalSnapshotFailed", message)])
        return
    finally:
        _locks.pop(body.get("metadata", {}).get("uid", ""), None)
    logger.info(what)
    await asyncio.to_thread(_post, body, [("Normal", "Deleting", what)])
