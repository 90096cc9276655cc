"""When the operator looks at a cluster again and when it writes its status: the rules of
`pacing`, without a cluster."""

from __future__ import annotations

import pytest
from flotilla.operator.pacing import INDEX_INTERVAL, Pace, merge, next_look, write_due
from flotilla.operator.planner import Action, Step

PACE = Pace(safety=30.0)
ADD = Action(Step.ADD_LEARNER, "n4 joins", member="n4")
CATCH_UP = Action(Step.WAIT, "learners catching up to commit 90: n4 at 10")
START = Action(Step.WAIT, "waiting for n5 to start and answer")
DONE = Action(Step.DONE, "3 voters, as asked")


def test_after_a_step_the_next_round_is_at_once():
    assert next_look(ADD, False, None, None, PACE) == 0.0
    assert next_look(Action(Step.RESIZE, "grow", size=5), False, DONE, 30.0, PACE) == 0.0


def test_a_cluster_as_asked_waits_for_events_or_the_safety_interval():
    assert next_look(DONE, False, ADD, 0.0, PACE) == 30.0
    assert next_look(None, False, None, None, PACE) == 30.0  # an invalid spec: its fix wakes


def test_waiting_on_the_members_looks_soon_then_less_often_while_nothing_changes():
    first = next_look(CATCH_UP, False, ADD, 0.0, PACE)
    assert first == PACE.poll_first
    looks = [first]
    for _ in range(12):
        looks.append(next_look(CATCH_UP, False, CATCH_UP, looks[-1], PACE))
    assert looks == sorted(looks) and looks[-1] == PACE.poll_max
    # another wait (the numbers in a reason do not count, the kind of wait does)
    assert next_look(START, False, CATCH_UP, PACE.poll_max, PACE) == PACE.poll_first
    later = Action(Step.WAIT, "learners catching up to commit 95: n4 at 80")
    assert next_look(later, False, CATCH_UP, 1.0, PACE) == 1.5


def test_a_wait_an_event_cut_short_looks_again_soon_and_backs_off_again():
    """A pod that started (its event woke the daemon) has a member about to answer: the
    operator does not go on waiting as long as it had been while nothing happened."""
    assert next_look(START, False, START, 2.0, PACE) == 3.0
    assert next_look(START, False, START, 2.0, PACE, woken=True) == PACE.poll_first
    assert next_look(START, False, START, PACE.poll_first, PACE) == 1.5 * PACE.poll_first
    assert next_look(None, False, None, 2.0, PACE, restoring=True, woken=True) == \
        PACE.poll_first
    # Steps and a cluster as asked are paced as before.
    assert next_look(ADD, False, START, 2.0, PACE, woken=True) == 0.0
    assert next_look(DONE, False, START, 2.0, PACE, woken=True) == 30.0


def test_a_failed_step_is_retried_with_a_doubling_backoff_up_to_the_safety_interval():
    delays = [next_look(ADD, True, None, None, PACE)]
    for _ in range(8):
        delays.append(next_look(ADD, True, ADD, delays[-1], PACE))
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0] and delays[-1] == 30.0


def test_a_short_safety_interval_bounds_every_wait():
    quick = Pace(safety=0.1)
    assert next_look(CATCH_UP, False, CATCH_UP, 4.0, quick) == 0.1
    assert next_look(ADD, True, ADD, 4.0, quick) == 0.1
    with pytest.raises(ValueError):
        Pace(safety=0)


def test_the_restore_job_running_is_looked_at_like_a_wait_on_the_members():
    assert next_look(None, False, None, None, PACE, restoring=True) == PACE.poll_first
    assert next_look(None, False, None, 2.0, PACE, restoring=True) == 3.0


STATUS = {"phase": "Ready", "commitIndex": 100, "term": 3,
          "members": [{"name": "n1", "matchIndex": 100, "uid": "u1"}],
          "lastSnapshot": {"index": 50, "term": 2, "bytes": 10},
          "archive": {"url": "s3://a", "lastArchivedIndex": 90, "lag": 10, "error": ""},
          "conditions": [{"type": "Archiving", "status": "True", "reason": "Shipping",
                          "message": "archived up to index 90 of 100"}]}


def moved(**changes):
    out = merge(STATUS, changes)
    return out


def test_an_unchanged_status_is_never_written():
    assert not write_due(STATUS, STATUS, 3600.0)
    assert not write_due(STATUS, {"phase": "Ready"}, 3600.0)  # a patch that changes nothing


def test_a_change_that_matters_is_written_at_once():
    assert write_due(STATUS, {"phase": "Scaling"}, 0.0)
    assert write_due(STATUS, {"term": 4}, 0.0)
    assert write_due(STATUS, {"members": [{"name": "n1", "matchIndex": 100, "uid": "u2"}]}, 0.0)
    assert write_due(STATUS, {"archive": {"error": "access denied"}}, 0.0)


def test_moving_indexes_alone_are_written_at_most_once_per_interval():
    indexes = {"commitIndex": 140, "members": [{"name": "n1", "matchIndex": 140, "uid": "u1"}],
               "lastSnapshot": {"index": 120}, "archive": {"lastArchivedIndex": 130, "lag": 10},
               "conditions": [{"type": "Archiving", "status": "True", "reason": "Shipping",
                               "message": "archived up to index 130 of 140"}]}
    assert not write_due(STATUS, indexes, INDEX_INTERVAL - 1)
    assert write_due(STATUS, indexes, INDEX_INTERVAL)


def test_the_status_merge_is_the_api_servers():
    patched = merge(STATUS, {"archive": {"error": None, "lag": 0}, "leader": "n1",
                             "members": []})
    assert patched["archive"] == {"url": "s3://a", "lastArchivedIndex": 90, "lag": 0}
    assert patched["leader"] == "n1" and patched["members"] == []
    assert STATUS["archive"]["error"] == ""  # the original is left alone
