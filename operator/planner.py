"""The membership planner: what a cluster looks like now, in; the one next step, out.

Pure: no I/O, no clock, no randomness. The Kubernetes adapter (`flotilla operator`) and the
local adapter (`flotilla scale`) both observe, ask `plan()`, carry out the single step it
returns, and observe again. Because the step is recomputed from what is observed every time,
an adapter that crashes half-way, or a step that fails, is simply planned again.

Members live in *slots*: ordinal names (`demo-0, demo-1, ...` on Kubernetes, `n1, n2, ...`
locally), because a StatefulSet can only grow and shrink at its end. The first
`spec.replicas` slots are the voters the user asked for; a slot's member can be in the Raft
configuration (as voter or learner) or not, and its volume can hold the member the cluster
knows, a fresh empty data dir, or stale data from before it was removed.

The rules, in the order they are tried (the first that applies is the step):

1. No leader: if too few voters answer to ever elect one, report Degraded and touch nothing
   (quorum loss is for a human: bring members back, or restore from the archive).
2. A joint configuration is being finished by the leader: wait for it.
3. A member of the configuration whose volume was replaced (its `member_uid` is not the one
   the cluster knew) or whose data dir is corrupt (it exits 3) is removed from the
   configuration; it is re-added as a learner afterwards, like any missing member.
4. Scale down: leadership moves off departing voters first, then one joint change to the
   staying voters, then departing learners are removed, then the StatefulSet shrinks, then
   removed members' volumes follow the volume policy.
5. Scale up: grow the StatefulSet; each missing member, once its pod serves empty in
   `existing` mode, is added as a learner; once every new learner has caught up, one joint
   change makes them voters together. A slot that holds stale data (a removed member's old
   volume) is wiped first: a removed member never rejoins on its old data. A learner that
   has not caught up within the timeout is removed and added again (never promoted).
6. Rolling restart (only once the membership is as asked): members whose pod runs an older
   template than the StatefulSet's, or that serve an older certificate than their Secret
   holds (it was renewed; the node reads its files at start), restart one at a time, each
   only when every member answers and has caught up, followers first; leadership moves off
   the leader before its turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from flotilla.node.consensus.membership import CATCH_UP_SLACK, caught_up, change_in_flight

from .memberstatus import MemberStatus

__all__ = [
    "CATCH_UP_SLACK",
    "Action",
    "CatchUp",
    "Observed",
    "Plan",
    "Record",
    "Slot",
    "Step",
    "caught_up",
    "plan",
]


# The exit code of a member that will not use its data dir (corrupt, or another cluster's).
EXIT_BAD_DATA_DIR = 3


class Step(Enum):
    """The kinds of step, named for what the adapter does."""

    WAIT = "wait"  # nothing to do until something changes (the reason says what)
    RESIZE = "resize"  # StatefulSet replicas / the local slots that run: `size`
    ADD_LEARNER = "add-learner"  # POST /v1/members for `member`
    CHANGE_VOTERS = "change-voters"  # PUT /v1/config {voters}: one joint-consensus change
    TRANSFER_LEADER = "transfer-leader"  # POST /v1/leader {name: member}
    REMOVE_MEMBER = "remove-member"  # DELETE /v1/members/{member}
    RESET_VOLUME = "reset-volume"  # wipe `member`'s volume so its slot starts empty
    DELETE_VOLUME = "delete-volume"  # a removed slot's volume, by the Delete policy
    RESTART_MEMBER = "restart-member"  # restart `member` on the current pod template
    DONE = "done"  # the configuration is exactly what was asked for


@dataclass(frozen=True, slots=True)
class Action:
    step: Step
    reason: str
    member: str | None = None
    voters: tuple[str, ...] = ()
    size: int | None = None

    def describe(self) -> str:
        target = {
            Step.RESIZE: f" to {self.size}",
            Step.CHANGE_VOTERS: f" to {', '.join(self.voters)}",
        }.get(self.step, f" {self.member}" if self.member else "")
        return f"{self.step.value}{target}: {self.reason}"


@dataclass(frozen=True, slots=True)
class CatchUp:
    """When a learner's catch-up began (adapter clock, seconds; None while it is out of the
    configuration between two tries) and how many tries it has had."""

    since: float | None
    attempts: int = 1


@dataclass(frozen=True, slots=True)
class Record:
    """What the planner must remember because the cluster cannot tell it again: written back
    by the adapter (RaftCluster status, or the local state file) after every plan."""

    bootstrapped: bool = False
    uids: Mapping[str, str] = field(default_factory=dict)  # member -> the member_uid it had
    removed: Mapping[str, str] = field(default_factory=dict)  # removed uid -> its name: never
    # to rejoin (the name is for people reading the status)
    catch_up: Mapping[str, CatchUp] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "bootstrapped": self.bootstrapped,
            "uids": dict(sorted(self.uids.items())),
            "removed": dict(sorted(self.removed.items())),
            "catch_up": {n: {"since": c.since, "attempts": c.attempts}
                         for n, c in sorted(self.catch_up.items())},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> Record:
        doc = doc or {}
        return cls(
            bootstrapped=bool(doc.get("bootstrapped", False)),
            uids=dict(doc.get("uids") or {}),
            removed=_removed(doc.get("removed")),
            catch_up={n: CatchUp(None if c.get("since") is None else float(c["since"]),
                                 int(c.get("attempts", 1)))
                      for n, c in (doc.get("catch_up") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class Slot:
    """One slot as the adapter saw it: its pod (or process), its volume and its own status."""

    running: bool = False  # the pod exists and is not terminating / the process is alive
    status: MemberStatus | None = None  # its own GET /v1/status, None if it did not answer
    exit_code: int | None = None  # the last exit of its member process (crash loop), if any
    volume: bool = True  # its PVC / data dir exists
    outdated: bool = False  # its pod runs an older template than the StatefulSet's
    # it serves another certificate than its Secret holds (renewed since it started)
    stale_certificate: bool = False


@dataclass(frozen=True, slots=True)
class Observed:
    desired: int  # spec.replicas: how many voters
    size: int  # slots that run now (StatefulSet replicas)
    slots: Mapping[str, Slot]  # what was seen, by slot name; unseen slots count as empty
    names: Sequence[str]  # slot names in ordinal order, at least max(desired, size) long
    record: Record
    now: float  # the adapter's clock, seconds; only differences matter
    catch_up_timeout: float = 600.0
    delete_removed_volumes: bool = True  # the removed-volume policy is Delete


@dataclass(frozen=True, slots=True)
class Plan:
    action: Action
    record: Record  # to write back whatever the action's outcome
    phase: str  # Bootstrapping, Ready, Scaling, Healing, Upgrading or Degraded
    degraded: str | None = None  # why the cluster is unhealthy, even while work goes on
    leader: str | None = None
    leader_status: MemberStatus | None = None


def plan(obs: Observed) -> Plan:
    """The next single step for the cluster in `obs` (see the module docstring)."""
    names = list(obs.names)
    if len(names) < max(obs.desired, obs.size):
        raise ValueError(f"{len(names)} slot names for {max(obs.desired, obs.size)} slots")
    slots = {n: obs.slots.get(n, Slot(running=False, volume=False)) for n in names}
    leader, lead = _leader(slots)
    record = obs.record

    if lead is None:
        return _without_leader(obs, slots, names, record)

    config = lead.config
    voters, learners = set(config.voters), set(config.learners)
    members = voters | learners
    if not record.bootstrapped:
        record = replace(record, bootstrapped=True)
    record = _remember(record, lead, slots, members, obs.now)
    desired = set(names[: obs.desired])
    commit = lead.commit_index
    unhealthy = [n for n in sorted(voters) if _status(slots.get(n)) is None]
    degraded = (f"voters not answering: {', '.join(unhealthy)}" if unhealthy else None)

    def done(step: Step, reason: str, phase: str, **kw: Any) -> Plan:
        return Plan(Action(step, reason, **kw), record, phase, degraded, leader, lead)

    if change_in_flight(config.joint is not None, config.index, commit):
        return done(Step.WAIT, "the leader is finishing a membership change", "Scaling")

    # 3. members whose data is gone or unusable leave the configuration first.
    for name in sorted(members):
        problem = _broken(name, slots.get(name), record, name in voters)
        if problem is None:
            continue
        if voters == {name}:
            return done(Step.WAIT, f"{name} {problem}, but it is the only voter: restore "
                        "from the archive", "Degraded")
        return done(Step.REMOVE_MEMBER, f"{name} {problem}; it is removed and will be added "
                    "back as a learner", "Healing", member=name)

    # 4. scale down.
    departing = members - desired
    if departing & voters:
        staying = voters & desired
        if not staying:
            return done(Step.WAIT, "none of the voters that stay is a voter yet: add them "
                        "first", "Scaling")
        if leader in departing:
            target = max(sorted(staying), key=lambda n: (_status(slots.get(n)) is not None,
                                                         lead.match(n) or 0))
            return done(Step.TRANSFER_LEADER, f"the leader {leader} is leaving; leadership "
                        f"moves to {target} before the change", "Scaling", member=target)
        return done(Step.CHANGE_VOTERS, f"scale down: {', '.join(sorted(departing & voters))} "
                    "leave the voters", "Scaling", voters=tuple(sorted(staying)))
    for name in sorted(departing & learners):
        return done(Step.REMOVE_MEMBER, f"scale down: learner {name} leaves", "Scaling",
                    member=name)
    if obs.size > obs.desired:
        return done(Step.RESIZE, f"scale down: the members of slots {obs.desired} and up have "
                    "left the configuration", "Scaling", size=obs.desired)

    # 5. scale up (and re-adding members that were removed to heal).
    if obs.size < obs.desired:
        return done(Step.RESIZE, f"scale up: {obs.desired - obs.size} new slot(s) start empty "
                    "and wait to be added", "Scaling", size=obs.desired)
    for name in [n for n in names[: obs.desired] if n not in members]:
        slot = slots[name]
        stale = _stale(slot, record)
        if stale is not None:
            return done(Step.RESET_VOLUME, f"{name} {stale}: a removed member never rejoins on "
                        "its old data, so its volume is wiped", "Healing", member=name)
        status = _status(slot)
        if status is None:
            return done(Step.WAIT, f"waiting for {name} to start and answer", "Scaling")
        return done(Step.ADD_LEARNER, f"{name} joins as a learner", "Scaling", member=name)

    new_learners = sorted(learners & desired)
    if new_learners:
        # Caught up, and admitted: a learner whose node has not yet read the configuration
        # that added it would be a voter that does not vote.
        behind = [n for n in new_learners if not caught_up(lead.match(n), commit)
                  or _admitting(slots.get(n))]
        for name in behind:
            track = record.catch_up.get(name)
            if (track is not None and track.since is not None
                    and obs.now - track.since > obs.catch_up_timeout):
                return done(Step.REMOVE_MEMBER, f"learner {name} has not caught up in "
                            f"{obs.catch_up_timeout:g}s (match {lead.match(name)} of "
                            f"commit {commit}); it is removed and added again (attempt "
                            f"{track.attempts + 1})", "Scaling", member=name)
        if behind:
            lag = ", ".join(f"{n} at {lead.match(n)}" for n in behind)
            return done(Step.WAIT, f"learners catching up to commit {commit}: {lag}",
                        "Scaling")
        target = tuple(sorted(voters | set(new_learners)))
        return done(Step.CHANGE_VOTERS, f"{', '.join(new_learners)} caught up and become "
                    "voters", "Scaling", voters=target)

    # 6. roll members onto a new pod template (or certificate), one at a time, the leader last.
    outdated = [n for n in names[: obs.size] if _restart_due(slots[n]) and n in members]
    if outdated:
        behind = [n for n in sorted(members) if _status(slots.get(n)) is None
                  or not caught_up(lead.match(n), commit)]
        if behind:
            return done(Step.WAIT, f"rolling restart: waiting for {', '.join(behind)} to "
                        "answer and catch up before the next restart", "Upgrading")
        followers = [n for n in outdated if n != leader]
        if followers:
            return done(Step.RESTART_MEMBER, f"{followers[0]} {_restart_why(slots[followers[0]])}"
                        ": restarted on the new one (followers first, one at a time)",
                        "Upgrading", member=followers[0])
        current = [n for n in sorted(voters) if n != leader and not _restart_due(slots[n])]
        if current:
            target = max(current, key=lambda n: lead.match(n) or 0)
            what = ("old pod template" if slots[leader].outdated
                    else "certificate its Secret no longer holds")
            return done(Step.TRANSFER_LEADER, f"the leader {leader} is the last on the {what}; "
                        f"leadership moves to {target} before it restarts",
                        "Upgrading", member=target)
        return done(Step.RESTART_MEMBER, f"{leader} {_restart_why(slots[leader])} and is the "
                    "only voter: restarted on the new one", "Upgrading", member=leader)

    if obs.delete_removed_volumes:
        for name in names[obs.size:]:
            if slots[name].volume and not slots[name].running:
                return done(Step.DELETE_VOLUME, f"{name} was removed and the volume policy is "
                            "Delete", "Scaling", member=name)
    return done(Step.DONE, f"{len(voters)} voters, as asked", "Degraded" if degraded
                else "Ready")


def _restart_due(slot: Slot) -> bool:
    return slot.outdated or slot.stale_certificate


def _restart_why(slot: Slot) -> str:
    if slot.outdated:
        return "runs an old pod template"
    return "serves an older certificate than its Secret holds"


# --- observations ---------------------------------------------------------------------------


def _status(slot: Slot | None) -> MemberStatus | None:
    return slot.status if slot is not None and slot.running else None


def _admitting(slot: Slot | None) -> bool:
    """Whether the member answers but its node has not yet read the configuration that
    admits it (it would not vote)."""
    status = _status(slot)
    return status is not None and status.admission is not None


def _leader(slots: Mapping[str, Slot]) -> tuple[str | None, MemberStatus | None]:
    """The member that says it leads, in the highest term any says so (an old leader cut off
    from the others can still believe it leads, in an older term)."""
    best: tuple[int, str, MemberStatus] | None = None
    for name, slot in slots.items():
        status = _status(slot)
        if status is not None and status.leads and (best is None or status.term > best[0]):
            best = (status.term, name, status)
    return (best[1], best[2]) if best else (None, None)


def _broken(name: str, slot: Slot | None, record: Record, voter: bool) -> str | None:
    """Why `name`, a member of the configuration, can never serve on its volume again."""
    status = _status(slot)
    known = record.uids.get(name)
    if status is not None and known and status.member_uid not in (None, known):
        return "came back on a new, empty volume (its member_uid changed)"
    if status is not None and voter and status.admission:
        return ("started empty although the cluster counts it as a voter (its volume was "
                "lost), so it does not vote")
    if status is None and slot is not None and slot.exit_code == EXIT_BAD_DATA_DIR:
        return "will not start on its data dir (it exits 3: corrupt, or not its own)"
    return None


def _stale(slot: Slot, record: Record) -> str | None:
    """Why a slot that is not a member cannot be added as it is, if it cannot."""
    if slot.exit_code == EXIT_BAD_DATA_DIR and _status(slot) is None:
        return "will not start on its data dir (it exits 3)"
    status = _status(slot)
    if status is None:
        return None
    if status.member_uid in record.removed:
        return "is back on the volume of a member that was removed"
    if status.last_index > 0 or status.config.members:
        return "holds data from when it was a member"
    return None


def _remember(record: Record, lead: MemberStatus, slots: Mapping[str, Slot],
              members: set[str], now: float) -> Record:
    """Bring the record up to date with what the leader says: the uids of members that serve,
    the uids of members that left (never to rejoin), and the learners' catch-up clocks."""
    uids = dict(record.uids)
    removed = dict(record.removed)
    for name in list(uids):
        if name not in members:
            removed[uids.pop(name)] = name
    for name in members:
        status = _status(slots.get(name))
        uid = status.member_uid if status else None
        if (status is not None and uid and name not in uids and uid not in removed
                and name in status.config.members):
            uids[name] = uid  # first sight of a member that holds the configuration itself
    learners, voters = set(lead.config.learners), set(lead.config.voters)
    catch_up: dict[str, CatchUp] = {}
    for name, track in record.catch_up.items():
        if name in learners:
            catch_up[name] = track if track.since is not None else CatchUp(now,
                                                                         track.attempts + 1)
        elif name not in voters:
            catch_up[name] = CatchUp(None, track.attempts)  # removed to retry: count kept
    for name in learners - set(catch_up):
        catch_up[name] = CatchUp(now)
    return Record(True, uids, removed, catch_up)


def _removed(doc: Any) -> dict[str, str]:
    """The removed uids as written; a list of bare uids is how state files written before the
    names were kept hold them."""
    if isinstance(doc, Mapping):
        return {str(uid): str(name) for uid, name in doc.items()}
    return {str(uid): "" for uid in doc or ()}


def _without_leader(obs: Observed, slots: Mapping[str, Slot], names: Sequence[str],
                    record: Record) -> Plan:
    answering = {n: status for n, s in slots.items() if (status := _status(s)) is not None}
    if not record.bootstrapped:
        if obs.size == 0:
            return Plan(Action(Step.RESIZE, f"bootstrap: {obs.desired} members start as the "
                               "first configuration", size=obs.desired), record,
                        "Bootstrapping")
        return Plan(Action(Step.WAIT, "bootstrap: waiting for the first members to elect a "
                           "leader"), record, "Bootstrapping")
    if not answering:
        reason = "no member answers"
        return Plan(Action(Step.WAIT, f"{reason}; nothing is changed automatically"), record,
                    "Degraded", reason)
    # The newest configuration any answering member holds decides what a quorum is.
    newest = max(answering.values(), key=lambda s: (s.term, s.commit_index))
    config = newest.config
    groups = ([config.joint.old, config.joint.new] if config.joint is not None
              else [config.voters])
    short = []
    for group in groups:
        up = [v for v in group if v in answering]
        if len(up) * 2 <= len(group):
            down = sorted(set(group) - set(up))
            short.append(f"{len(up)} of {len(group)} voters answer ({', '.join(down)} do not)")
    if short:
        reason = ("quorum lost: " + "; ".join(short) + ". Nothing is changed automatically: "
                  "bring the missing members back, or restore from the archive")
        return Plan(Action(Step.WAIT, reason), record, "Degraded", reason)
    return Plan(Action(Step.WAIT, "no leader yet: an election is under way"), record,
                "Degraded", "no leader")
