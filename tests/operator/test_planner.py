"""The planner, flow by flow: each row is a cluster as an adapter would see it and the one step
the planner must take next. Failures are rows too (quorum loss, a lost or corrupt volume, a
learner that never catches up, a removed member back on its old data)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from flotilla.operator.memberstatus import MemberStatus
from flotilla.operator.planner import (
    CATCH_UP_SLACK,
    CatchUp,
    Observed,
    Record,
    Slot,
    Step,
    caught_up,
    plan,
)

NAMES = [f"n{i}" for i in range(1, 10)]


def uid(name: str) -> str:
    return f"uid-{name}"


@dataclass
class World:
    """A cluster described the way a test reads best; `observed()` turns it into what an
    adapter would have seen."""

    desired: int
    size: int
    voters: list[str]
    learners: list[str] = field(default_factory=list)
    leader: str | None = "n1"
    term: int = 7
    commit: int = 5000
    match: dict[str, int] = field(default_factory=dict)  # default: caught up
    joint: dict | None = None
    down: list[str] = field(default_factory=list)  # members that do not answer
    fresh: list[str] = field(default_factory=list)  # slots serving empty, not yet members
    stale: dict[str, str] = field(default_factory=dict)  # slot -> uid of old data it serves
    new_uid: dict[str, str] = field(default_factory=dict)  # member -> uid of a replaced volume
    exit3: list[str] = field(default_factory=list)  # slots crash-looping with exit 3
    volumes: list[str] = field(default_factory=list)  # extra slots with only a volume left
    outdated: list[str] = field(default_factory=list)  # pods on an older template
    renewed: list[str] = field(default_factory=list)  # serving a certificate since renewed
    fenced: list[str] = field(default_factory=list)  # members whose node awaits admission
    record: Record | None = None
    now: float = 1000.0
    retain: bool = False

    def observed(self) -> Observed:
        members = self.voters + self.learners
        config = {"voters": sorted(self.voters), "learners": sorted(self.learners),
                  "joint": self.joint}
        progress = {n: {"match_index": self.match.get(n, self.commit)} for n in members}
        slots: dict[str, Slot] = {}
        for name in members:
            if name in self.down or name in self.exit3:
                slots[name] = Slot(running=True, status=None,
                                   exit_code=3 if name in self.exit3 else None)
                continue
            status = {"name": name, "member_uid": self.new_uid.get(name, uid(name)),
                      "role": "leader" if name == self.leader else (
                          "learner" if name in self.learners else "follower"),
                      "term": self.term, "leader": self.leader, "commit_index": self.commit,
                      "last_index": self.commit, "config": config,
                      "admission": "fenced" if name in self.fenced else None}
            if name == self.leader:
                status["members"] = progress
            slots[name] = Slot(running=True, status=MemberStatus.parse(status),
                               outdated=name in self.outdated,
                               stale_certificate=name in self.renewed)
        for name in self.fresh:
            slots[name] = Slot(running=True,
                               status=MemberStatus.parse(_fresh(name, uid(name) + "-new")))
        for name, old_uid in self.stale.items():
            old = {"voters": ["n1", "n2", "n3", name], "learners": [], "joint": None}
            slots[name] = Slot(running=True, status=MemberStatus.parse({
                "name": name, "member_uid": old_uid, "role": "follower", "term": 3,
                "leader": None, "commit_index": 40, "last_index": 41, "config": old}))
        for name in self.exit3:
            if name not in members:
                slots[name] = Slot(running=True, status=None, exit_code=3)
        for name in self.volumes:
            slots[name] = Slot(running=False, volume=True)
        record = self.record or Record(bootstrapped=True, uids={n: uid(n) for n in members})
        return Observed(desired=self.desired, size=self.size, slots=slots, names=NAMES,
                        record=record, now=self.now, catch_up_timeout=60.0,
                        delete_removed_volumes=not self.retain)


def _fresh(name: str, member_uid: str) -> dict:
    return {"name": name, "member_uid": member_uid, "role": "follower", "term": 0,
            "leader": None, "commit_index": 0, "last_index": 0,
            "config": {"voters": [], "learners": [], "joint": None}}


V3 = ["n1", "n2", "n3"]
V5 = ["n1", "n2", "n3", "n4", "n5"]

# (flow, world, expected step, expected target: member name, voter tuple or size)
FLOWS = [
    # --- bootstrap
    ("bootstrap: nothing runs yet", World(3, 0, [], leader=None, record=Record()),
     Step.RESIZE, 3),
    ("bootstrap: members starting, no leader yet",
     World(3, 3, V3, leader=None, down=V3, record=Record()), Step.WAIT, None),
    ("bootstrap done: a leader serves the first configuration",
     World(3, 3, V3, record=Record()), Step.DONE, None),
    # --- steady state
    ("steady: exactly the voters asked for", World(3, 3, V3), Step.DONE, None),
    ("steady: one voter down is reported, not acted on", World(3, 3, V3, down=["n3"]),
     Step.DONE, None),
    # --- scale up 3 -> 5
    ("scale up: grow the StatefulSet first", World(5, 3, V3), Step.RESIZE, 5),
    ("scale up: wait for the new pod to answer", World(5, 5, V3), Step.WAIT, None),
    ("scale up: a fresh pod is added as a learner",
     World(5, 5, V3, fresh=["n4", "n5"]), Step.ADD_LEARNER, "n4"),
    ("scale up: the second learner next",
     World(5, 5, V3, learners=["n4"], fresh=["n5"], match={"n4": 10}), Step.ADD_LEARNER,
     "n5"),
    ("scale up: learners behind: wait",
     World(5, 5, V3, learners=["n4", "n5"], match={"n4": 10, "n5": 4990}), Step.WAIT, None),
    ("scale up: all caught up: ONE joint change to the new voter set",
     World(5, 5, V3, learners=["n4", "n5"], match={"n4": 4990, "n5": 5000}),
     Step.CHANGE_VOTERS, tuple(V5)),
    ("scale up: the leader is finishing the joint change",
     World(5, 5, V5, joint={"old": V3, "new": V5}), Step.WAIT, None),
    ("scale up: done", World(5, 5, V5), Step.DONE, None),
    # --- scale down 5 -> 3
    ("scale down: the leader is leaving: transfer first",
     World(3, 5, V5, leader="n5", match={"n1": 3000, "n2": 4000, "n3": 5000}), Step.TRANSFER_LEADER,
     "n3"),
    ("scale down: a transfer never goes to a voter that does not answer",
     World(3, 5, V5, leader="n4", down=["n1", "n2"]), Step.TRANSFER_LEADER, "n3"),
    ("scale down: one joint change to the staying voters",
     World(3, 5, V5, leader="n2"), Step.CHANGE_VOTERS, tuple(V3)),
    ("scale down: a departing learner is removed",
     World(3, 5, V3, learners=["n4"]), Step.REMOVE_MEMBER, "n4"),
    ("scale down: shrink once the departing members left the configuration",
     World(3, 5, V3), Step.RESIZE, 3),
    ("scale down: removed slots' volumes go by the Delete policy",
     World(3, 3, V3, volumes=["n4", "n5"]), Step.DELETE_VOLUME, "n4"),
    ("scale down: Retain keeps them", World(3, 3, V3, volumes=["n4"], retain=True),
     Step.DONE, None),
    ("scale down while joint: wait", World(3, 5, V3, joint={"old": V5, "new": V3}),
     Step.WAIT, None),
    # --- lost and corrupt volumes
    ("a voter came back on a new volume: removed from the configuration",
     World(3, 3, V3, new_uid={"n2": "uid-n2-replaced"}), Step.REMOVE_MEMBER, "n2"),
    ("a voter whose data dir is corrupt (exit 3) is removed",
     World(3, 3, V3, exit3=["n3"]), Step.REMOVE_MEMBER, "n3"),
    ("after removal its slot, holding what it got meanwhile, is wiped",
     World(3, 3, ["n1", "n2"], stale={"n3": "uid-n3-replaced"}), Step.RESET_VOLUME, "n3"),
    ("a slot that still exits 3 after removal is wiped", World(3, 3, ["n1", "n2"],
                                                                exit3=["n3"]),
     Step.RESET_VOLUME, "n3"),
    ("then it is added back as a learner", World(3, 3, ["n1", "n2"], fresh=["n3"]),
     Step.ADD_LEARNER, "n3"),
    ("and promoted once caught up", World(3, 3, ["n1", "n2"], learners=["n3"]),
     Step.CHANGE_VOTERS, tuple(V3)),
    ("a voter whose node says it started empty (fenced) is removed, uid record or not",
     World(3, 3, V3, fenced=["n3"], record=Record(bootstrapped=True)), Step.REMOVE_MEMBER,
     "n3"),
    ("a learner not yet admitted by its node is not broken, and not promoted yet",
     World(3, 3, ["n1", "n2"], learners=["n3"], fenced=["n3"]), Step.WAIT, None),
    ("the only voter's volume is lost: nothing to remove it with",
     World(1, 1, ["n1"], new_uid={"n1": "other"}), Step.WAIT, None),
    # --- removed members never rejoin on old data
    ("scale 3 -> 5 again over a retained volume of a removed member: wiped, not added",
     World(5, 5, V3, stale={"n4": "uid-old-n4"}, fresh=["n5"],
           record=Record(True, {n: uid(n) for n in V3}, {"uid-old-n4": "n4"})),
     Step.RESET_VOLUME, "n4"),
    ("old data the record does not know is still not rejoined",
     World(5, 5, V3, stale={"n4": "uid-unknown"}), Step.RESET_VOLUME, "n4"),
    # --- rolling restart onto a new pod template
    ("upgrade: followers first, one at a time", World(3, 3, V3, outdated=V3),
     Step.RESTART_MEMBER, "n2"),
    ("upgrade: a restarted member must be back and caught up first",
     World(3, 3, V3, outdated=["n1", "n3"], down=["n2"]), Step.WAIT, None),
    ("upgrade: ... and caught up", World(3, 3, V3, outdated=["n1", "n3"],
                                         match={"n2": 100}), Step.WAIT, None),
    ("upgrade: then the next follower", World(3, 3, V3, outdated=["n1", "n3"]),
     Step.RESTART_MEMBER, "n3"),
    ("upgrade: leadership moves off the leader before its turn",
     World(3, 3, V3, outdated=["n1"]), Step.TRANSFER_LEADER, "n2"),
    ("upgrade: the old leader, now a follower, restarts",
     World(3, 3, V3, leader="n2", outdated=["n1"]), Step.RESTART_MEMBER, "n1"),
    ("upgrade: a single voter just restarts", World(1, 1, ["n1"], outdated=["n1"]),
     Step.RESTART_MEMBER, "n1"),
    ("upgrade waits for a scale to finish", World(5, 3, V3, outdated=V3), Step.RESIZE, 5),
    # --- restarting onto renewed certificates, the same way
    ("renewed: followers first", World(3, 3, V3, renewed=V3), Step.RESTART_MEMBER, "n2"),
    ("renewed: a restarted member must be back first",
     World(3, 3, V3, renewed=["n1", "n3"], down=["n2"]), Step.WAIT, None),
    ("renewed: leadership moves off the leader before its turn",
     World(3, 3, V3, renewed=["n1"]), Step.TRANSFER_LEADER, "n2"),
    ("renewed: every follower before the leader",
     World(3, 3, V3, renewed=["n1", "n2"]), Step.RESTART_MEMBER, "n2"),
    ("renewed: a single voter just restarts", World(1, 1, ["n1"], renewed=["n1"]),
     Step.RESTART_MEMBER, "n1"),
    ("renewed waits for a scale to finish", World(5, 3, V3, renewed=V3), Step.RESIZE, 5),
    # --- quorum loss
    ("quorum lost: 1 of 3 voters answers: Degraded, nothing destructive",
     World(3, 3, V3, leader=None, down=["n2", "n3"]), Step.WAIT, None),
    ("no leader but a quorum answers: an election is under way",
     World(3, 3, V3, leader=None, down=["n3"]), Step.WAIT, None),
    ("nobody answers", World(3, 3, V3, leader=None, down=V3), Step.WAIT, None),
    ("quorum lost with replicas raised: still nothing destructive",
     World(5, 3, V3, leader=None, down=["n1", "n2"]), Step.WAIT, None),
]


@pytest.mark.parametrize(("flow", "world", "step", "target"), FLOWS,
                         ids=[row[0] for row in FLOWS])
def test_flow(flow: str, world: World, step: Step, target) -> None:
    result = plan(world.observed())
    action = result.action
    assert action.step is step, f"{flow}: got {action.describe()}"
    if isinstance(target, str):
        assert action.member == target, action.describe()
    elif isinstance(target, tuple):
        assert action.voters == target, action.describe()
    elif isinstance(target, int):
        assert action.size == target, action.describe()
    assert action.reason  # every step says why, for events and status


def test_quorum_loss_is_degraded_with_the_reason() -> None:
    result = plan(World(3, 3, V3, leader=None, down=["n2", "n3"]).observed())
    assert result.phase == "Degraded"
    assert "quorum lost" in result.degraded and "n2, n3" in result.degraded
    assert "restore from the archive" in result.action.reason


def test_quorum_is_counted_in_both_halves_of_a_joint_configuration() -> None:
    world = World(5, 5, V5, leader=None, down=["n4", "n5"],
                  joint={"old": V3, "new": ["n1", "n4", "n5"]})
    world_obs = world.observed()
    # Give the answering members the joint config they would hold.
    result = plan(world_obs)
    assert result.phase == "Degraded" and "1 of 3" in result.degraded


def test_a_learner_that_never_catches_up_is_retried_not_promoted() -> None:
    behind = {"n4": 10, "n5": 5000}
    started = Record(True, {n: uid(n) for n in [*V3, "n4", "n5"]}, {},
                     {"n4": CatchUp(100.0), "n5": CatchUp(100.0)})
    waiting = plan(World(5, 5, V3, learners=["n4", "n5"], match=behind, record=started,
                         now=150.0).observed())
    assert waiting.action.step is Step.WAIT and "n4 at 10" in waiting.action.reason
    late = plan(World(5, 5, V3, learners=["n4", "n5"], match=behind, record=started,
                      now=170.0).observed())
    assert late.action.step is Step.REMOVE_MEMBER and late.action.member == "n4"
    assert "attempt 2" in late.action.reason
    # Removed, its old uid is recorded (never to rejoin on that data), its attempts are kept.
    after = plan(World(5, 5, V3, learners=["n5"], stale={"n4": uid("n4")},
                       record=late.record, now=171.0).observed())
    assert after.record.removed[uid("n4")] == "n4"
    assert after.action.step is Step.RESET_VOLUME and after.action.member == "n4"
    assert after.record.catch_up["n4"] == CatchUp(None, 1)
    # Back as a learner: the clock restarts and the attempt is counted.
    readded = plan(World(5, 5, V3, learners=["n4", "n5"], match=behind,
                         record=after.record, now=200.0).observed())
    assert readded.record.catch_up["n4"] == CatchUp(200.0, 2)
    assert readded.action.step is Step.WAIT


def test_the_record_learns_uids_and_moves_removed_ones_aside() -> None:
    first = plan(World(3, 3, V3, record=Record()).observed())
    assert first.record.bootstrapped
    assert dict(first.record.uids) == {n: uid(n) for n in V3}
    shrunk = plan(World(3, 3, ["n1", "n2"], stale={"n3": uid("n3")},
                        record=first.record).observed())
    assert shrunk.record.removed == {uid("n3"): "n3"} and "n3" not in shrunk.record.uids


def test_record_round_trips_through_json() -> None:
    record = Record(True, {"n1": "a"}, {"b": "n2"}, {"n4": CatchUp(5.0, 2),
                                                           "n5": CatchUp(None, 1)})
    assert Record.from_json(record.to_json()) == record
    assert Record.from_json(None) == Record()
    # State files written before the names were kept hold a list of uids.
    assert Record.from_json({"removed": ["b"]}).removed == {"b": ""}


@pytest.mark.parametrize(("match", "commit", "expected"), [
    (None, 0, False), (0, 0, True), (90, 100, True), (89, 100, False),
    (100_000 - CATCH_UP_SLACK, 100_000, True), (100_000 - CATCH_UP_SLACK - 1, 100_000, False),
])
def test_caught_up_matches_the_nodes_rule(match, commit, expected) -> None:
    assert caught_up(match, commit) is expected


def test_the_planner_waits_for_exactly_the_rule_the_node_enforces() -> None:
    from flotilla.node import node as member
    from flotilla.node.consensus import membership
    assert caught_up is membership.caught_up is member.caught_up


def test_a_scale_up_then_down_converges_step_by_step() -> None:
    """Drive the planner through 3 -> 5 -> 3 with a toy cluster that applies each step as the
    adapters would: the steps come in the documented order and it ends exactly as asked."""
    cluster = Toy(V3)
    record = Record()
    steps = []
    for desired in (5, 3):
        for _ in range(40):
            result = plan(cluster.observe(desired, record))
            record = result.record
            steps.append((desired, result.action.step, result.action.member
                          or result.action.voters or result.action.size))
            if result.action.step is Step.DONE:
                break
            cluster.apply(result.action)
        else:
            pytest.fail(f"no convergence: {steps[-5:]}")
    assert cluster.voters == V3 and not cluster.learners
    assert [s for s in steps if s[1] is not Step.WAIT] == [
        (5, Step.RESIZE, 5),
        (5, Step.ADD_LEARNER, "n4"), (5, Step.ADD_LEARNER, "n5"),
        (5, Step.CHANGE_VOTERS, tuple(V5)),
        (5, Step.DONE, None),
        (3, Step.TRANSFER_LEADER, "n1"),
        (3, Step.CHANGE_VOTERS, tuple(V3)),
        (3, Step.RESIZE, 3),
        (3, Step.DELETE_VOLUME, "n4"), (3, Step.DELETE_VOLUME, "n5"),
        (3, Step.DONE, None),
    ]
    assert {uid("n4"): "n4", uid("n5"): "n5"}.items() <= record.removed.items()


class Toy:
    """Members as plain data: the smallest thing that behaves like a cluster to the planner.
    The leader starts on n5 once it is a voter, so scale-down must move it."""

    def __init__(self, voters: list[str]) -> None:
        self.voters = list(voters)
        self.learners: list[str] = []
        self.size = len(voters)
        self.volumes = set(voters)
        self.leader = voters[0]
        self.commit = 100

    def observe(self, desired: int, record: Record) -> Observed:
        config = {"voters": sorted(self.voters), "learners": sorted(self.learners),
                  "joint": None}
        slots = {}
        for i, name in enumerate(NAMES):
            running = i < self.size
            if not running:
                slots[name] = Slot(running=False, volume=name in self.volumes)
                continue
            member = name in self.voters or name in self.learners
            status = ({"name": name, "member_uid": uid(name), "role":
                       "leader" if name == self.leader else "follower", "term": 2,
                       "commit_index": self.commit, "last_index": self.commit,
                       "config": config} if member else _fresh(name, uid(name)))
            if name == self.leader:
                status["members"] = {n: {"match_index": self.commit}
                                     for n in self.voters + self.learners}
            slots[name] = Slot(running=True, status=MemberStatus.parse(status), volume=True)
        return Observed(desired, self.size, slots, NAMES, record, now=0.0)

    def apply(self, action) -> None:
        if action.step is Step.RESIZE:
            self.size = action.size
            self.volumes |= set(NAMES[: action.size])
        elif action.step is Step.ADD_LEARNER:
            self.learners.append(action.member)
        elif action.step is Step.CHANGE_VOTERS:
            self.voters = list(action.voters)
            self.learners = [n for n in self.learners if n not in action.voters]
            if "n5" in self.voters:
                self.leader = "n5"
        elif action.step is Step.TRANSFER_LEADER:
            self.leader = action.member
        elif action.step is Step.REMOVE_MEMBER:
            self.learners = [n for n in self.learners if n != action.member]
            self.voters = [n for n in self.voters if n != action.member]
        elif action.step is Step.DELETE_VOLUME:
            self.volumes.discard(action.member)


def test_a_renewed_certificate_is_named_as_the_reason_to_restart() -> None:
    follower = plan(World(3, 3, V3, renewed=["n3"]).observed()).action
    assert follower.reason.startswith("n3 serves an older certificate than its Secret holds")
    leader = plan(World(3, 3, V3, renewed=["n1"]).observed()).action
    assert "certificate its Secret no longer holds" in leader.reason
    # a template change and a renewal together: still one restart per member
    both = plan(World(3, 3, V3, outdated=["n2"], renewed=["n2", "n3"]).observed()).action
    assert (both.step, both.member) == (Step.RESTART_MEMBER, "n2")
    assert "old pod template" in both.reason
