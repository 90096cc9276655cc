"""The two rules of a membership change, in one place: when a change may start, and when a
learner has caught up enough to become a voter.

The core enforces them on proposals, the admin API answers 409/422 with them before it
proposes, and the operator's planner waits on them before it asks: all three call these
functions, so they cannot disagree (tests/consensus/test_membership_rules.py).
"""

from __future__ import annotations

#: A learner may be promoted when it trails the commit index by at most this many entries
#: (and by at most a tenth of the commit index, as etcd's 90% rule).
CATCH_UP_SLACK = 1000


def change_in_flight(joint: bool, config_index: int, committed: int) -> bool:
    """Whether a membership change is still running: the newest configuration in the log is
    joint (C_old,new, which the leader finishes on its own), or not yet committed. At most one
    change is in flight (dissertation 4.1): a new one may start only when this is False."""
    return joint or config_index > committed


def caught_up(match: int | None, commit: int) -> bool:
    """Whether a learner whose log matches the leader's up to `match` may become a voter: it
    trails the commit index by at most CATCH_UP_SLACK entries and at most a tenth of it. A
    learner the leader has no progress for (`None`) has not caught up."""
    return match is not None and commit - match <= min(CATCH_UP_SLACK, commit // 10)
