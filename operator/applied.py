"""What a cluster's daemon last brought in line, so that a round which renders an owned object
exactly as before neither reads nor writes it.

Without it every round reads each owned object (the bootstrap ConfigMap, the NetworkPolicy,
both Services, the PodDisruptionBudget) to compare it with what it renders, although they
change only when the spec or the membership does: five of a round's API calls, in every round
of a scale. An entry is kept from the round that read the object (and applied it, if it was not
in line) until one of these:

- a round renders something else for it: that round reads and applies it as before;
- a round no longer renders it (spec.network.policy turned off): if it is rendered again, it
  is read again;
- a watch event shows the object deleted, or no longer in line with what was rendered (someone
  edited a field the operator sets): the entry goes, and the daemon is woken to repair it;
- the safety interval: the daemon forgets every entry, so that round reads everything again,
  as if no watch event could ever be missed;
- a round that fails: the daemon forgets everything too.

A round reads an object and remembers it later; an event about that object arriving in between
may describe a change that the read did not see. Each key counts such events (`token`), and a
round does not remember what it read before the count moved. One event in between is expected:
the echo of the round's own apply. An event that shows the object in line with what the round
is applying (`token` records it) is that echo, or as good as it, and moves nothing; without
this the next round read the object again whenever the echo beat the round to `remember`.

The StatefulSet is not kept here: each round reads it anyway, for its size and revision.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["MUTABLE", "Applied", "covers", "in_line"]

Key = tuple[str, str, str]  # kind, namespace, name

# What may change in an owned object after creation (the rest is immutable, or the API
# server's to fill in).
MUTABLE = {
    "ConfigMap": ("initial-cluster", "initial-cluster-state"),
    "StatefulSet": ("replicas", "template", "updateStrategy"),
    "Service": ("ports", "publishNotReadyAddresses"),
    "PodDisruptionBudget": ("maxUnavailable",),
    "CronJob": ("schedule", "timeZone", "suspend", "concurrencyPolicy",
                "startingDeadlineSeconds", "successfulJobsHistoryLimit",
                "failedJobsHistoryLimit", "jobTemplate"),
    "NetworkPolicy": ("podSelector", "policyTypes", "ingress"),
    "Certificate": ("secretName", "commonName", "dnsNames", "ipAddresses", "duration",
                    "renewBefore", "usages", "privateKey", "issuerRef", "secretTemplate"),
}


def in_line(obj: Mapping[str, Any], current: Mapping[str, Any]) -> bool:
    """Whether `current` (as the API server holds it) already has every field of `obj` (as
    rendered) that may change, and its labels."""
    section = "data" if obj["kind"] == "ConfigMap" else "spec"
    have = current.get(section) or {}
    labels = (current.get("metadata") or {}).get("labels") or {}
    return all(covers(have.get(k), v) for k, v in obj[section].items()
               if k in MUTABLE[obj["kind"]]) and all(
        labels.get(k) == v for k, v in (obj["metadata"].get("labels") or {}).items())


def covers(current: Any, wanted: Any) -> bool:
    """Whether `current` already holds everything in `wanted` (the API server adds defaults,
    so equality would patch every round)."""
    if isinstance(wanted, Mapping):
        return isinstance(current, Mapping) and all(
            covers(current.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list):
        return (isinstance(current, list) and len(current) == len(wanted)
                and all(covers(c, w) for c, w in zip(current, wanted, strict=True)))
    return current == wanted


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(obj.get("kind")), str(meta.get("namespace")), str(meta.get("name"))


class Applied:
    """Owned objects of one cluster known to be in line with what was rendered for them.
    Used from the round's worker thread and from the watch handlers on the event loop."""

    def __init__(self) -> None:
        self._rendered: dict[Key, dict[str, Any]] = {}
        self._events: dict[Key, int] = {}
        self._applying: dict[Key, dict[str, Any]] = {}  # read and applied by a round now
        self._lock = threading.Lock()

    def unchanged(self, obj: Mapping[str, Any]) -> bool:
        """Whether `obj` is exactly what was rendered when the object was last seen in line,
        with no event since that says otherwise: it need not be read nor applied."""
        with self._lock:
            return self._rendered.get(key_of(obj)) == obj

    def token(self, obj: Mapping[str, Any]) -> int:
        """Taken before reading the object (which the round then brings in line with `obj`);
        handed back to `remember`."""
        key = key_of(obj)
        with self._lock:
            self._applying[key] = copy.deepcopy(dict(obj))
            return self._events.get(key, 0)

    def remember(self, obj: Mapping[str, Any], token: int) -> None:
        """The object was read and is now in line with `obj`: unless an event about it came
        in since `token` was taken that showed it otherwise."""
        key = key_of(obj)
        with self._lock:
            self._applying.pop(key, None)
            if self._events.get(key, 0) == token:
                self._rendered[key] = copy.deepcopy(dict(obj))

    def observe(self, kind: str, body: Mapping[str, Any], deleted: bool) -> bool:
        """A watch event about an owned object of this `kind`. True when the daemon should
        look again: the object is gone, out of line with what was rendered for it, or not
        known here."""
        meta = body.get("metadata") or {}
        key = (kind, str(meta.get("namespace")), str(meta.get("name")))
        with self._lock:
            rendered = self._rendered.get(key)
            if rendered is not None and not deleted and in_line(rendered, body):
                return False
            applying = self._applying.get(key)
            if applying is not None and not deleted and in_line(applying, body):
                return False  # the echo of the round's own apply: it remembers the object
            self._rendered.pop(key, None)
            self._events[key] = self._events.get(key, 0) + 1
            return True

    def retain(self, rendered: list[Mapping[str, Any]]) -> None:
        """Only the objects a round renders are kept: one it stopped rendering (a NetworkPolicy
        turned off) is read again if it is ever rendered again."""
        keys = {key_of(obj) for obj in rendered}
        with self._lock:
            for key in [k for k in self._rendered if k not in keys]:
                del self._rendered[key]

    def forget(self) -> None:
        """Every object is read again by the next round."""
        with self._lock:
            self._rendered.clear()
            self._applying.clear()
