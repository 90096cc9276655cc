"""Requests made through a RaftCluster's annotations (a snapshot now, leadership to a voter):
which are new, what wakes the daemon, and the answers the operator gives without calling a
member (nothing to call, or a request it must refuse). Carrying them out against real members
is `test_kubectl_plugin.py`'s story."""

from __future__ import annotations

from typing import Any

import pytest
from flotilla.operator import requests
from flotilla.operator.memberstatus import MemberStatus
from flotilla.operator.requests import MOVE_LEADER, MOVE_LEADER_TO, SNAPSHOT, Pending

from flotilla.client import FlotillaError

T1, T2 = "2026-11-25T17:00:00.000Z", "2026-11-25T17:05:00.000Z"
NOW = "2026-11-25T17:05:01Z"


def cluster(**annotations: str) -> dict[str, Any]:
    return {"metadata": {"name": "demo", "annotations": annotations}}


LEAD = MemberStatus.from_json({
    "name": "demo-0", "role": "leader", "term": 4,
    "config": {"voters": ["demo-0", "demo-1", "demo-2"], "learners": ["demo-3"]}})


class Refusing:
    """An admin API that answers every call with the error a member gives."""

    def __init__(self, message: str) -> None:
        self.message = message
        self.calls: list[str] = []

    def snapshot(self, reachable: list[str]) -> dict[str, Any]:
        self.calls.append("snapshot")
        raise FlotillaError(self.message, status=503, code="no_leader")

    def move_leader(self, member: str, reachable: list[str]) -> dict[str, Any]:
        self.calls.append(f"move-leader {member}")
        raise FlotillaError(self.message, status=503, code="no_leader")


class Untouchable:
    """For answers that must be given without calling any member."""

    def snapshot(self, reachable: list[str]) -> dict[str, Any]:
        raise AssertionError("no member should be called")

    def move_leader(self, member: str, reachable: list[str]) -> dict[str, Any]:
        raise AssertionError("no member should be called")


def test_a_new_value_is_a_request_and_the_value_handled_is_not() -> None:
    body = cluster(**{SNAPSHOT: T2, MOVE_LEADER: T1, MOVE_LEADER_TO: " demo-1 "})
    assert requests.pending(body, {}) == Pending(snapshot=T2, move_leader=T1,
                                                 move_leader_to="demo-1")
    handled = {"requests": {"snapshot": {"requestedAt": T1}, "moveLeader": {"requestedAt": T1}}}
    assert requests.pending(body, handled) == Pending(snapshot=T2, move_leader=None,
                                                      move_leader_to="demo-1")
    assert not requests.pending(cluster(**{SNAPSHOT: T1}), handled)
    assert not requests.pending({"metadata": {}}, {})
    assert not requests.pending(cluster(**{SNAPSHOT: "  "}), {}), "a blank value asks nothing"


def test_only_the_request_annotations_wake_the_daemon() -> None:
    quiet = requests.watched(cluster(other="x"))
    assert requests.watched(cluster(other="y")) == quiet
    assert requests.watched(cluster(**{SNAPSHOT: T1})) != quiet
    assert requests.watched(cluster(**{MOVE_LEADER_TO: "demo-2"})) != quiet


@pytest.mark.parametrize(("target", "lead", "outcome", "message"), [
    ("", LEAD, "Failed", f"leadership not moved: the annotation {MOVE_LEADER_TO} does not "
                         "name the voter to hand it to"),
    ("demo-1", None, "Failed", "leadership not moved to demo-1: no leader answers (see the "
                               "Degraded condition)"),
    ("demo-3", LEAD, "Failed", "leadership not moved: demo-3 is a learner, and only a voter "
                               "can lead (voters: demo-0, demo-1, demo-2)"),
    ("demo-9", LEAD, "Failed", "leadership not moved: demo-9 is not a member, and only a voter "
                               "can lead (voters: demo-0, demo-1, demo-2)"),
    ("demo-0", LEAD, "Succeeded", "demo-0 already leads (term 4)"),
])
def test_move_leader_answers_given_without_calling_a_member(target: str, lead, outcome: str,
                                                             message: str) -> None:
    entries, events = requests.carry_out(Pending(move_leader=T1, move_leader_to=target),
                                         Untouchable(), ["demo-0", "demo-1"], lead, NOW)
    entry = entries["moveLeader"]
    assert (entry["outcome"], entry["message"]) == (outcome, message)
    assert (entry["requestedAt"], entry["completedAt"], entry["member"]) == (T1, NOW, target)
    kind, reason, said = events[0]
    assert (kind, reason) == (("Normal", "LeadershipTransferred") if outcome == "Succeeded"
                              else ("Warning", "LeadershipTransferFailed"))
    assert said == f"{message} (asked for at {T1} by the annotation {MOVE_LEADER})"


def test_a_refused_call_is_a_failed_request_saying_why() -> None:
    admin = Refusing("no leader is known; retry shortly")
    entries, events = requests.carry_out(
        Pending(snapshot=T1, move_leader=T2, move_leader_to="demo-2"), admin,
        ["demo-0"], LEAD, NOW)
    assert admin.calls == ["snapshot", "move-leader demo-2"]  # the snapshot first
    assert entries["snapshot"] == {
        "requestedAt": T1, "completedAt": NOW, "outcome": "Failed",
        "message": "no snapshot: 503 no_leader: no leader is known; retry shortly"}
    assert entries["moveLeader"]["message"] == (
        "leadership not moved from demo-0 to demo-2: 503 no_leader: no leader is known; retry "
        "shortly")
    assert [e[:2] for e in events] == [("Warning", "SnapshotFailed"),
                                       ("Warning", "LeadershipTransferFailed")]


def test_no_snapshot_without_a_running_member() -> None:
    entries, _ = requests.carry_out(Pending(snapshot=T1), Untouchable(), [], None, NOW)
    assert entries["snapshot"]["outcome"] == "Failed"
    assert entries["snapshot"]["message"] == "no snapshot: no member runs"
