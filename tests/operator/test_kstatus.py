"""Reconciling and Stalled from the phase and the other conditions, read back the way kstatus
(Flux's health checks) reads a custom resource: InProgress while Reconciling is True, Failed
while Stalled is True, Current otherwise. A Degraded cluster is never Current."""

from __future__ import annotations

import pytest
from flotilla.operator.kstatus import conditions


def condition(kind: str, ok: bool, reason: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": "True" if ok else "False", "reason": reason,
            "message": message or reason}


def kstatus_reads(phase: str, written: list[dict[str, str]]) -> str:
    """kstatus's generic rule (observedGeneration aside, which the status always keeps)."""
    ours = conditions(phase, written)
    if ours["Reconciling"][0]:
        return "InProgress"
    if ours["Stalled"][0]:
        return "Failed"
    return "Current"


READY = condition("Ready", True, "AsAsked", "3 voters, as asked")
NOT_READY = condition("Ready", False, "Reconciling")
PROGRESSING = condition("Progressing", True, "VotersChanged", "demo-3 caught up")


@pytest.mark.parametrize(("phase", "written", "read"), [
    ("Ready", [READY, condition("Progressing", False, "Done")], "Current"),
    ("Pending", [NOT_READY, PROGRESSING], "InProgress"),
    ("Bootstrapping", [NOT_READY, PROGRESSING], "InProgress"),
    ("Scaling", [NOT_READY, PROGRESSING], "InProgress"),
    ("Healing", [NOT_READY, PROGRESSING], "InProgress"),
    ("Upgrading", [NOT_READY, PROGRESSING], "InProgress"),
    ("Restoring", [NOT_READY, PROGRESSING], "InProgress"),
    ("Deleting", [NOT_READY, PROGRESSING], "InProgress"),
    ("Invalid", [condition("Ready", False, "InvalidSpec", "spec.replicas (0) ...")], "Failed"),
    ("RestoreFailed", [NOT_READY, condition("Restored", False, "SnapshotJobFailed")],
     "Failed"),
    ("Degraded", [NOT_READY, condition("Degraded", True, "Degraded", "voters not answering")],
     "Failed"),
    ("Ready", [READY, condition("VolumesResized", False, "Resizing")], "InProgress"),
    ("Ready", [READY, condition("VolumesResized", False, "ShrinkRefused")], "Failed"),
    ("Scaling", [NOT_READY, PROGRESSING, condition("VolumesResized", False,
                                                   "ExpansionNotAllowed")], "Failed"),
    ("Ready", [READY, condition("VolumesResized", True, "Resized")], "Current"),
])
def test_how_kstatus_reads_each_phase(phase, written, read):
    assert kstatus_reads(phase, written) == read


def test_stalled_says_what_the_user_must_fix():
    invalid = conditions("Invalid", [condition("Ready", False, "AdminTokenTooShort",
                                               "Secret x holds a token under 16 bytes")])
    assert invalid["Stalled"] == (True, "AdminTokenTooShort",
                                  "Secret x holds a token under 16 bytes")
    degraded = conditions("Degraded", [NOT_READY, condition(
        "Degraded", True, "Degraded", "quorum lost: 1 of 3 voters answer")])
    assert degraded["Stalled"] == (True, "Degraded", "quorum lost: 1 of 3 voters answer")
    shrink = conditions("Ready", [READY, condition("VolumesResized", False, "ShrinkRefused",
                                                   "set spec.storage.size to at least 2Gi")])
    assert shrink["Stalled"] == (True, "ShrinkRefused", "set spec.storage.size to at least 2Gi")


def test_reconciling_says_what_is_under_way():
    assert conditions("Scaling", [NOT_READY, PROGRESSING])["Reconciling"] == (
        True, "Scaling", "demo-3 caught up")
    assert conditions("Ready", [READY])["Reconciling"] == (False, "Reconciled",
                                                           "3 voters, as asked")
