"""Quorum arithmetic checked against a dumb version that tries every subset."""

from itertools import combinations

from flotilla.node.consensus.quorum import (
    VoteResult,
    committed_index,
    has_quorum,
    vote_result,
)
from flotilla.node.consensus.types import Membership
from hypothesis import given
from hypothesis import strategies as st

NAMES = ["a", "b", "c", "d", "e", "f", "g"]


def is_quorum(group: frozenset[str], members: set[str]) -> bool:
    return len(group & members) * 2 > len(group)


def dumb_is_quorum(m: Membership, members: set[str]) -> bool:
    ok = is_quorum(m.voters, members)
    if m.outgoing is not None:
        ok = ok and is_quorum(m.outgoing, members)
    return ok


def dumb_committed(m: Membership, match: dict[str, int]) -> int:
    """The largest index such that the members holding at least it form a quorum."""
    best = 0
    for index in set(match.values()) | {0}:
        holders = {n for n, i in match.items() if i >= index}
        if dumb_is_quorum(m, holders):
            best = max(best, index)
    return best


def dumb_vote(m: Membership, votes: dict[str, bool]) -> VoteResult:
    granted = {n for n, v in votes.items() if v}
    undecided = {n for n in m.members() if n not in votes}
    if dumb_is_quorum(m, granted):
        return VoteResult.WON
    if dumb_is_quorum(m, granted | undecided):
        return VoteResult.PENDING
    return VoteResult.LOST


memberships = st.builds(
    lambda voters, outgoing, joint: Membership(
        voters=frozenset(voters), outgoing=frozenset(outgoing) if joint else None
    ),
    st.sets(st.sampled_from(NAMES), min_size=1, max_size=5),
    st.sets(st.sampled_from(NAMES), min_size=1, max_size=5),
    st.booleans(),
)


@given(memberships, st.dictionaries(st.sampled_from(NAMES), st.integers(0, 20)))
def test_committed_index_is_the_largest_index_a_quorum_holds(m, match):
    assert committed_index(m, lambda n: match.get(n, 0)) == dumb_committed(
        m, {n: match.get(n, 0) for n in m.members()}
    )


@given(memberships, st.dictionaries(st.sampled_from(NAMES), st.booleans()))
def test_vote_result_matches_counting_every_outcome(m, votes):
    votes = {n: v for n, v in votes.items() if n in m.members()}
    assert vote_result(m, votes) == dumb_vote(m, votes)


def test_joint_quorum_needs_a_majority_of_both_halves():
    m = Membership(voters=frozenset("def"), outgoing=frozenset("abc"))
    assert not has_quorum(m, {"a", "b", "c"})
    assert not has_quorum(m, {"d", "e", "f"})
    assert has_quorum(m, {"a", "b", "d", "e"})
    for size in range(1, 7):
        for group in combinations("abcdef", size):
            assert has_quorum(m, set(group)) == dumb_is_quorum(m, set(group))


def test_an_even_sized_group_needs_more_than_half():
    m = Membership(voters=frozenset("abcd"))
    assert committed_index(m, {"a": 5, "b": 5, "c": 1, "d": 1}.__getitem__) == 1
    assert committed_index(m, {"a": 5, "b": 5, "c": 5, "d": 1}.__getitem__) == 5
