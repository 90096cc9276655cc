"""When the operator looks at a cluster again, and when it writes the cluster's status.

Pure functions of what the last round did, so the rules are tested without a cluster; the
daemon in `handlers.py` only carries them out.

Looking again (`next_look`): after a step that succeeded, at once (the next step may be ready
now: a learner added, the next can be); after a failed step, with a backoff; while the planner
waits on the members (a learner catching up, a new member starting, an election), soon, and
less often the longer nothing changes: members say nothing on their own, so their progress is
seen by asking, and no Kubernetes event marks it; a wait that an event cut short (a pod that
started) starts over at the shortest. Otherwise (the cluster is as asked, or the spec is
invalid) not before the safety interval. Events about the cluster and the objects it owns cut
every wait short.

Writing status (`write_due`): only when it changes, and a change of the fast-moving indexes
alone (commit and match indexes, the snapshot, how far the archive got) at most once per
`INDEX_INTERVAL`: those move with every write to the cluster, and `flotilla status` reads them
from the members themselves.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .planner import Action, Step

__all__ = ["INDEX_INTERVAL", "Pace", "merge", "next_look", "write_due"]

INDEX_INTERVAL = 30.0


@dataclass(frozen=True, slots=True)
class Pace:
    safety: float = 30.0  # the longest the operator goes without looking at a cluster
    poll_first: float = 0.2  # the first look again while waiting on the members
    poll_max: float = 5.0  # ... growing by half each time nothing changed, up to this
    retry_first: float = 1.0  # the first retry of a failed step (or round), doubling

    def __post_init__(self) -> None:
        if self.safety <= 0:
            raise ValueError(f"the safety interval must be > 0, not {self.safety}")


def next_look(action: Action | None, failed: bool, previous: Action | None,
              waited: float | None, pace: Pace, *, restoring: bool = False,
              woken: bool = False) -> float:
    """Seconds until the next round. `action` is the step this round planned (None: there was
    no plan, as for an invalid spec or a round that raised), `failed` whether carrying it out
    (or the round) failed, `previous` the action of the round before and `waited` how long
    the operator waited after it. `restoring`: the restore Job runs, no member yet. `woken`:
    an event cut that wait short (a pod started, say): the wait is a new one, and looking
    again starts over at `poll_first`, since what it waits on (that pod's member answering)
    is likely near."""
    if failed:
        return min(pace.safety, max(pace.retry_first, 2 * (waited or 0)))
    if action is None:
        return _poll(waited, pace, same=not woken) if restoring else pace.safety
    if action.step is Step.DONE:
        return pace.safety
    if action.step is not Step.WAIT:
        return 0.0
    return _poll(waited, pace, same=not woken and previous is not None
                 and _kind(previous) == _kind(action))


def _kind(action: Action) -> tuple[Step, str | None, str]:
    """A wait without its numbers: a learner catching up is the same wait as its index moves."""
    return action.step, action.member, re.sub(r"\d+", "#", action.reason)


def _poll(waited: float | None, pace: Pace, same: bool) -> float:
    if not same or not waited:
        return min(pace.poll_first, pace.safety)
    return min(pace.poll_max, pace.safety, max(pace.poll_first, waited * 1.5))


def merge(target: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    """`target` with the JSON merge patch `patch` applied (RFC 7386: None deletes a key,
    objects merge, everything else replaces), as the API server applies the status patch."""
    out = copy.deepcopy(dict(target))
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping):
            before = out.get(key)
            out[key] = merge(before if isinstance(before, Mapping) else {}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def write_due(written: Mapping[str, Any], patch: Mapping[str, Any],
                 since_written: float) -> bool:
    """Whether to send the status merge patch `patch` now, given the status as `written` and
    the seconds `since_written`."""
    after = merge(written, patch)
    if after == written:
        return False
    if _slow(after) != _slow(written):
        return True
    return since_written >= INDEX_INTERVAL


def _slow(status: Mapping[str, Any]) -> dict[str, Any]:
    """The status without what moves with every write to the cluster."""
    out = copy.deepcopy(dict(status))
    out.pop("commitIndex", None)
    out.pop("lastSnapshot", None)
    for member in out.get("members") or []:
        if isinstance(member, dict):
            member.pop("matchIndex", None)
    archive = out.get("archive")
    if isinstance(archive, dict):
        for key in ("lastArchivedIndex", "lastSnapshotIndex", "lag"):
            archive.pop(key, None)
    for condition in out.get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == "Archiving" and \
                condition.get("status") == "True":
            condition.pop("message", None)  # "archived up to index N of M"
    return out
