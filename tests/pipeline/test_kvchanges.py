"""The effective-change fold finds exactly the changes a member's machine makes.

The oracle is the node's own machine, with no rule of its own: apply the entries one by one
and compare the whole state (value and mod index of every key) before and after each; a key
that appears is a create, one that disappears a delete, one whose value or mod index moved an
update. The histories are test_kvfold's: compare-and-set hits and misses, deletes of present
and absent keys, retries answered from a session, sessions expiring, undecodable commands,
lone surrogates, a base snapshot at a random point, gaps in the indexes.
"""

from __future__ import annotations

import io
from collections.abc import Iterable

from flotilla.node.statemachine.kv import KVStateMachine, encode_delete, encode_put
from flotilla.pipeline.kvfold import (
    CREATED,
    DELETED,
    READ,
    UPDATED,
    BaseState,
    Change,
    changes,
    key_bytes,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.pipeline.test_kvfold import TTL_MS, WINDOW, commands, replayed


def machine(base: bytes | None) -> KVStateMachine:
    sm = KVStateMachine(session_ttl_ms=TTL_MS, session_window=WINDOW)
    if base is not None:
        sm.restore(io.BytesIO(base))
    return sm


def replayed_changes(entries: list[tuple[int, bytes]], base: bytes | None) -> list[Change]:
    return state_changes(machine(base), entries)


def state_changes(sm: KVStateMachine, entries: Iterable[tuple[int, bytes]]) -> list[Change]:
    """Every change `sm` makes applying `entries`, found by diffing its whole state around
    each entry."""
    found: list[Change] = []
    before = sm.canonical_state()["data"]
    for index, data in entries:
        sm.apply(index, data)
        after = sm.canonical_state()["data"]
        moved = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        assert len(moved) <= 1, f"entry {index} changed {moved}"
        for key in moved:
            was, now = before.get(key), after.get(key)
            op = CREATED if was is None else DELETED if now is None else UPDATED
            assert now is None or now[1] == index  # what changed was stamped by this entry
            found.append((key_bytes(key), index, op, was and was[0], now and now[0]))
        before = after
    return found


def folded_changes(entries: list[tuple[int, bytes]], base: bytes | None, since: int = 0,
                   read_at: int | None = None) -> list[Change]:
    sm = machine(base)
    state = BaseState(sm.applied_index, sm.clock, sm.session_ttl_ms, sm.session_window,
                      {s.client: s for s in sm.sessions()})
    return changes(state, list(sm.records()), entries, since, read_at)


def indexed(history: list[bytes], gaps: list[bool]) -> list[tuple[int, bytes]]:
    """Indexes with gaps: membership entries and no-ops sit between the normal entries."""
    index, entries = 0, []
    for n, data in enumerate(history):
        index += 2 if n < len(gaps) and gaps[n] else 1
        entries.append((index, data))
    return entries


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=commands(), cut=st.floats(0, 1), since=st.floats(0, 1),
       gaps=st.lists(st.booleans(), max_size=80))
def test_the_fold_finds_exactly_the_changes_the_machine_makes(history, cut, since, gaps):
    entries = indexed(history, gaps)
    at = int(len(entries) * cut)
    base = replayed(entries[:at], None) if at else None
    rest = entries[at:]
    expected = replayed_changes(rest, base)
    assert folded_changes(rest, base) == expected
    # From a later point on: the state up to it still counts, its changes are not repeated.
    upto = int(len(rest) * since)
    after = rest[upto - 1][0] if upto else 0
    assert folded_changes(rest, base, since=after) == [c for c in expected if c[1] > after]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=commands(), cut=st.floats(0, 1), gaps=st.lists(st.booleans(), max_size=80))
def test_reads_then_changes_fold_to_the_machine_s_state(history, cut, gaps):
    """The base as READ rows at its index, then the changes: folding them in log order gives
    every key's value after the last entry, as export's table promises."""
    entries = indexed(history, gaps)
    at = int(len(entries) * cut)
    base = replayed(entries[:at], None) if at else None
    read_at = entries[at - 1][0] if at else 0
    found = folded_changes(entries[at:], base, read_at=read_at)
    reads = [c for c in found if c[2] == READ]
    assert reads == [(key_bytes(k), read_at, READ, None, v) for k, v, _ in
                     machine(base).records()]  # first, in key order
    assert found[:len(reads)] == reads
    state: dict[bytes, bytes] = {}
    for key, _, op, _, value in found:
        if op == DELETED:
            del state[key]
        else:
            state[key] = value  # type: ignore[assignment]
    sm = machine(base)
    for index, data in entries[at:]:
        sm.apply(index, data)
    assert state == {key_bytes(k): v for k, v, _ in sm.records()}


def test_what_changes_nothing_yields_nothing():
    entries = [(1, encode_put("k", b"1", ts=1)),
               (2, encode_put("k", b"2", ts=2, prev_index=7)),  # misses: k stays at 1
               (3, encode_delete("gone", ts=3)),  # deletes nothing
               (4, b"junk"),  # does not decode
               (5, encode_put("k", b"1", ts=4, client="c", seq=1)),  # the same value: an update
               (6, encode_put("k", b"x", ts=5, client="c", seq=1)),  # a retry, answered
               (7, encode_put("k", b"3", ts=6, prev_index=5)),  # hits
               (8, encode_delete("k", ts=7)),
               (9, encode_put("k", b"4", ts=8, prev_index=0))]  # hits: must not exist
    assert folded_changes(entries, None) == [
        (b"k", 1, CREATED, None, b"1"), (b"k", 5, UPDATED, b"1", b"1"),
        (b"k", 7, UPDATED, b"1", b"3"), (b"k", 8, DELETED, b"3", None),
        (b"k", 9, CREATED, None, b"4")]
    assert folded_changes(entries, None) == replayed_changes(entries, None)
