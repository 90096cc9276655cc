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
import time
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

# Set by `flotilla operator` when it watches namespaces named exactly (no kopf globs): kopf then
# does not scan CRDs and namespaces cluster-wide, so a Role in each namespace is all it needs.
STATIC_NAMESPACES = False

_kube: Kube | None = None
_locks: dict[str, asyncio.Lock] = {}
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
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix="flotilla.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="flotilla.dev", key="last-handled-configuration")
    settings.posting.level = logging.WARNING  # our own events say what happened
    settings.scanning.disabled = STATIC_NAMESPACES
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
        _warned.pop(body.get("metadata", {}).get("uid", ""), None)
    logger.info(what)
    await asyncio.to_thread(_post, body, [("Normal", "Deleting", what)])
