"""What a user asks of a running cluster through annotations on its RaftCluster: a snapshot
now, and leadership handed to a named voter. The operator carries them out because it is the
one that reaches the members (their admin API needs the token and, with TLS, the cluster's
CA; the NetworkPolicy admits the operator); `kubectl flotilla snapshot` and `move-leader`
write the annotations, and so can `kubectl annotate`.

A request is the value of its annotation, a time stamp (any string that differs from the last
one; the plugin writes the time in RFC 3339):

    flotilla.dev/snapshot-requested-at: "2026-11-25T17:00:00.250Z"
    flotilla.dev/move-leader-requested-at: "2026-11-25T17:00:00.250Z"
    flotilla.dev/move-leader-to: demo-1

Each new value is carried out once and recorded, with its outcome, in
`status.requests.snapshot` or `.moveLeader` (`requestedAt` is the value handled). The
annotations stay where they are, as kubectl's `restartedAt` does: the operator never writes
the object's metadata, and a second request written while the first is carried out is not
lost to a race on removing an annotation; it is simply the next new value.

`pending` and `watched` are pure; `carry_out` makes the members' admin calls through the
`Members` adapter it is given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from flotilla.client import FlotillaError

from .memberstatus import MemberStatus

__all__ = ["MOVE_LEADER", "MOVE_LEADER_TO", "SNAPSHOT", "Pending", "carry_out", "pending",
           "watched"]

SNAPSHOT = "flotilla.dev/snapshot-requested-at"
MOVE_LEADER = "flotilla.dev/move-leader-requested-at"
MOVE_LEADER_TO = "flotilla.dev/move-leader-to"
ANNOTATIONS = (SNAPSHOT, MOVE_LEADER, MOVE_LEADER_TO)

# status.requests keys
SNAPSHOT_KEY, MOVE_LEADER_KEY = "snapshot", "moveLeader"
SUCCEEDED, FAILED = "Succeeded", "Failed"


class Admin(Protocol):
    """The two admin calls a request needs (`members.Members`)."""

    def snapshot(self, reachable: list[str]) -> dict[str, Any]: ...

    def move_leader(self, member: str, reachable: list[str]) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class Pending:
    """The requests not carried out yet: each is its stamp (None: nothing asked)."""

    snapshot: str | None = None
    move_leader: str | None = None
    move_leader_to: str = ""  # the voter named by MOVE_LEADER_TO ("" when unset)

    def __bool__(self) -> bool:
        return self.snapshot is not None or self.move_leader is not None


def _annotations(body: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((body.get("metadata") or {}).get("annotations")) or {}


def watched(body: Mapping[str, Any]) -> tuple[str | None, ...]:
    """The request annotations' values: a change of these wakes the cluster's daemon (they
    change neither the generation nor the spec)."""
    annotations = _annotations(body)
    return tuple(annotations.get(key) for key in ANNOTATIONS)


def pending(body: Mapping[str, Any], status: Mapping[str, Any]) -> Pending:
    """The requests on the RaftCluster `body` that `status` does not record as handled."""
    annotations = _annotations(body)
    handled = status.get("requests") or {}

    def new(annotation: str, key: str) -> str | None:
        stamp = annotations.get(annotation)
        if not isinstance(stamp, str) or not stamp.strip():
            return None
        done = (handled.get(key) or {}).get("requestedAt")
        return None if stamp == done else stamp

    target = annotations.get(MOVE_LEADER_TO)
    return Pending(snapshot=new(SNAPSHOT, SNAPSHOT_KEY),
                   move_leader=new(MOVE_LEADER, MOVE_LEADER_KEY),
                   move_leader_to=target.strip() if isinstance(target, str) else "")


def carry_out(requests: Pending, admin: Admin, running: list[str],
              lead: MemberStatus | None, now: str
              ) -> tuple[dict[str, Any], list[tuple[str, str, str]]]:
    """Carry out the pending requests (the snapshot first); returns the new
    `status.requests` entries, whole, and the Events that say what happened. `lead` is the
    leader's status as the round saw it (None: no leader answered), `now` the time written
    as `completedAt`."""
    entries: dict[str, Any] = {}
    events: list[tuple[str, str, str]] = []
    if requests.snapshot is not None:
        entry = _snapshot(admin, running)
        entries[SNAPSHOT_KEY] = {"requestedAt": requests.snapshot, "completedAt": now, **entry}
        ok = entry["outcome"] == SUCCEEDED
        events.append(("Normal" if ok else "Warning", "SnapshotTaken" if ok else
                       "SnapshotFailed", f"{entry['message']} (asked for at "
                       f"{requests.snapshot} by the annotation {SNAPSHOT})"))
    if requests.move_leader is not None:
        entry = _move_leader(requests.move_leader_to, admin, running, lead)
        entries[MOVE_LEADER_KEY] = {"requestedAt": requests.move_leader, "completedAt": now,
                                    "member": requests.move_leader_to, **entry}
        ok = entry["outcome"] == SUCCEEDED
        events.append(("Normal" if ok else "Warning", "LeadershipTransferred" if ok else
                       "LeadershipTransferFailed", f"{entry['message']} (asked for at "
                       f"{requests.move_leader} by the annotation {MOVE_LEADER})"))
    return entries, events


def _snapshot(admin: Admin, running: list[str]) -> dict[str, Any]:
    if not running:
        return {"outcome": FAILED, "message": "no snapshot: no member runs"}
    try:
        doc = admin.snapshot(running)
    except (FlotillaError, OSError, ValueError) as exc:
        return {"outcome": FAILED, "message": f"no snapshot: {exc}"}
    index, location = doc.get("index"), doc.get("location")
    entry: dict[str, Any] = {"outcome": SUCCEEDED}
    for key in ("index", "term", "bytes"):
        if isinstance(doc.get(key), int):
            entry[key] = doc[key]
    if location:
        entry["location"] = str(location)
    where = f"shipped to {location}" if location else "kept on the members (no archive)"
    entry["message"] = f"snapshot at index {index} {where}"
    return entry


def _move_leader(target: str, admin: Admin, running: list[str],
                 lead: MemberStatus | None) -> dict[str, Any]:
    if not target:
        return {"outcome": FAILED, "message": f"leadership not moved: the annotation "
                f"{MOVE_LEADER_TO} does not name the voter to hand it to"}
    if lead is None:
        return {"outcome": FAILED, "message": f"leadership not moved to {target}: no leader "
                "answers (see the Degraded condition)"}
    voters = sorted(lead.config.voters)
    if target not in voters:
        what = "a learner" if target in lead.config.learners else "not a member"
        return {"outcome": FAILED, "message": f"leadership not moved: {target} is {what}, and "
                f"only a voter can lead (voters: {', '.join(voters)})"}
    if target == lead.name:
        return {"outcome": SUCCEEDED, "leader": target, "term": lead.term,
                "message": f"{target} already leads (term {lead.term})"}
    try:
        done = admin.move_leader(target, running)
    except (FlotillaError, OSError, ValueError) as exc:
        return {"outcome": FAILED, "message": f"leadership not moved from {lead.name} to "
                f"{target}: {exc}"}
    leader = done.get("leader") if isinstance(done.get("leader"), str) else target
    entry: dict[str, Any] = {"outcome": SUCCEEDED, "leader": leader}
    term = done.get("term")
    if isinstance(term, int):
        entry["term"] = term
    entry["message"] = f"leadership moved from {lead.name} to {leader}" + (
        f" (term {term})" if isinstance(term, int) else "")
    return entry
