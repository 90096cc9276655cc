"""Quorum arithmetic for simple majorities and for joint consensus.

Kept apart from the core so it can be checked exhaustively against a dumb version
(tests/consensus/test_quorum.py). A joint configuration needs a majority of the new voters
*and* a majority of the old ones, for elections and for commitment alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import IntEnum

from .types import Membership


class VoteResult(IntEnum):
    PENDING = 0
    LOST = 1
    WON = 2


def majority_index(voters: frozenset[str], acked: Callable[[str], int]) -> int:
    """The highest value that a majority of `voters` have acknowledged (0 for no voters)."""
    n = len(voters)
    if n == 0:
        return 0
    if n == 1:
        return acked(next(iter(voters)))
    values = sorted((acked(v) for v in voters), reverse=True)
    return values[n // 2]


def committed_index(membership: Membership, acked: Callable[[str], int]) -> int:
    """The highest index acknowledged by a quorum of `membership` (both halves when joint)."""
    index = majority_index(membership.voters, acked)
    if membership.outgoing is not None:
        index = min(index, majority_index(membership.outgoing, acked))
    return index


def majority_vote(voters: frozenset[str], votes: Mapping[str, bool]) -> VoteResult:
    if not voters:
        return VoteResult.LOST
    granted = sum(1 for v in voters if votes.get(v) is True)
    rejected = sum(1 for v in voters if votes.get(v) is False)
    need = len(voters) // 2 + 1
    if granted >= need:
        return VoteResult.WON
    if rejected > len(voters) - need:
        return VoteResult.LOST
    return VoteResult.PENDING


def vote_result(membership: Membership, votes: Mapping[str, bool]) -> VoteResult:
    result = majority_vote(membership.voters, votes)
    if membership.outgoing is None:
        return result
    other = majority_vote(membership.outgoing, votes)
    if VoteResult.LOST in (result, other):
        return VoteResult.LOST
    if result is VoteResult.WON and other is VoteResult.WON:
        return VoteResult.WON
    return VoteResult.PENDING


def has_quorum(membership: Membership, active: frozenset[str] | set[str]) -> bool:
    """Whether `active` members form a quorum (CheckQuorum)."""
    votes = {name: True for name in active}
    return vote_result(membership, votes) is VoteResult.WON
