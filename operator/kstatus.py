"""The two conditions that tools judging health read: `Reconciling` and `Stalled`.

kstatus (the library behind Flux's health checks, `kubectl wait`-style tooling and Argo CD
health scripts written to its conventions) reads a custom resource as InProgress while
status.observedGeneration is behind metadata.generation or `Reconciling` is True, Failed while
`Stalled` is True, and Current otherwise. So the operator says, from the phase and the other
conditions it wrote:

- `Stalled` True when no round will change things without the user: the spec is invalid or a
  Secret it needs is missing (phase Invalid), the restore Job failed (RestoreFailed), the
  cluster has lost a voter or its quorum and nothing is left to try (Degraded), or the
  volumes cannot be grown as asked (a `volumes.STUCK` reason).
- `Reconciling` True, when not Stalled, while the operator works towards the spec: every
  phase but Ready, and a volume resize under way.

Both always present, True or False, with the reason and message of what decided them. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .volumes import CONDITION as VOLUMES
from .volumes import STUCK

# Phases in which the operator cannot go on without the user.
STALLED_PHASES = ("Invalid", "RestoreFailed", "Degraded")
# The condition whose reason and message explain each of those phases.
_WHY = {"Invalid": "Ready", "RestoreFailed": "Restored", "Degraded": "Degraded"}

Wanted = dict[str, tuple[bool, str, str]]


def conditions(phase: str, written: Sequence[Mapping[str, Any]]) -> Wanted:
    """Reconciling and Stalled, as (status, reason, message), for a status whose phase and
    other conditions (`written`, in the Kubernetes shape) are these."""
    by_type = {c.get("type"): c for c in written}
    volumes = by_type.get(VOLUMES) or {}
    volumes_false = volumes.get("status") == "False"
    stalled: tuple[bool, str, str] | None = None
    if phase in STALLED_PHASES:
        why = by_type.get(_WHY[phase]) or by_type.get("Ready") or {}
        stalled = (True, str(why.get("reason") or phase), str(why.get("message") or phase))
    elif volumes_false and volumes.get("reason") in STUCK:
        stalled = (True, str(volumes["reason"]), str(volumes.get("message") or ""))
    if stalled is not None:
        return {"Reconciling": (False, "Stalled", "nothing changes until the Stalled "
                                "condition's cause is fixed"),
                "Stalled": stalled}
    progressing = by_type.get("Progressing") or {}
    if phase != "Ready":
        reconciling = (True, phase, str(progressing.get("message") or phase))
    elif volumes_false:
        reconciling = (True, str(volumes.get("reason") or "Resizing"),
                       str(volumes.get("message") or ""))
    else:
        reconciling = (False, "Reconciled", str((by_type.get("Ready") or {}).get("message")
                                                or "as the spec asks"))
    return {"Reconciling": reconciling,
            "Stalled": (False, "Progressing" if reconciling[0] else "Reconciled",
                        "nothing needs the user")}
