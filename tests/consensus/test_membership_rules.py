"""The membership rules (consensus/membership.py) against the core that enforces them: a change
may start exactly when `change_in_flight` says so, whoever asks."""

from __future__ import annotations

import pytest
from flotilla.node.consensus import MembershipChangeInProgress
from flotilla.node.consensus.membership import CATCH_UP_SLACK, caught_up, change_in_flight

from .network import Network


@pytest.mark.parametrize(("joint", "index", "commit", "running"), [
    (False, 5, 5, False), (False, 5, 9, False), (False, 6, 5, True), (True, 5, 9, True),
])
def test_a_change_is_in_flight_while_joint_or_uncommitted(joint, index, commit, running):
    assert change_in_flight(joint, index, commit) is running


@pytest.mark.parametrize(("match", "commit", "expected"), [
    (None, 0, False), (0, 0, True), (9, 100, False), (90, 100, True),
    (10 * CATCH_UP_SLACK, 11 * CATCH_UP_SLACK, True),
    (10 * CATCH_UP_SLACK, 11 * CATCH_UP_SLACK + 1, False),
])
def test_a_learner_is_caught_up_within_the_slack(match, commit, expected):
    assert caught_up(match, commit) is expected


def test_the_core_refuses_a_change_exactly_while_the_rule_says_one_runs():
    net = Network(["a", "b", "c"])
    net.elect("a")
    core = net.core("a")

    def running() -> bool:
        return change_in_flight(core.membership.joint, core.log.membership_index(),
                                core.log.committed)

    assert not running()
    core.settled_membership()  # no exception: a change may start
    core.change_membership({"a", "b", "c"}, {"d"}, {"d": "http://d"})
    assert running()
    with pytest.raises(MembershipChangeInProgress):
        core.settled_membership()
    net.stabilize()
    assert not running()
    core.settled_membership()
