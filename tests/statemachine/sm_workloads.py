"""Hypothesis strategies for key-value workloads, shared by the state machine tests.

A workload is a list of (index, command bytes) as the log would deliver them: indexes
increase with gaps (entries the core keeps for itself), timestamps mostly advance but
sometimes jump past the session TTL and sometimes go backwards (a new leader whose clock is
behind), clients retry old sequence numbers, compare-and-set guesses right and wrong.
"""

from __future__ import annotations

import select
import time

from flotilla.node.statemachine import SnapshotJob, SnapshotResult
from flotilla.node.statemachine.kv import KVStateMachine, encode_delete, encode_put
from hypothesis import strategies as st

TTL_MS = 1_000
WINDOW = 4

# Few keys, so commands collide; odd ones included (empty, slash, NUL, a lone surrogate,
# astral plane, a key that is a prefix of others).
KEYS = ["a", "ab", "abc", "b", "", "x/y", "\x00", "é", "\udc80", "🚀", "a\n"]
CLIENTS = ["c1", "c2", "c3"]

_values = st.binary(max_size=24)
_op = st.tuples(
    st.sampled_from(["put", "put", "cas", "delete"]),
    st.sampled_from(KEYS),
    _values,
    st.integers(0, 40),  # prev_index guess for cas
    st.one_of(st.none(), st.sampled_from(CLIENTS)),
    st.integers(1, 12),  # seq: small range, so retries and stale seqs happen
    st.sampled_from([0, 0, 1, 7, 300, TTL_MS + 1, 5 * TTL_MS, -50]),  # ts step
    st.integers(1, 3),  # index step
)


@st.composite
def workloads(draw: st.DrawFn, min_size: int = 0, max_size: int = 40) -> list[tuple[int, bytes]]:
    ops = draw(st.lists(_op, min_size=min_size, max_size=max_size))
    out = []
    index, ts = 0, 1_000_000
    for kind, key, value, prev, client, seq, ts_step, index_step in ops:
        index += index_step
        ts = max(0, ts + ts_step)
        session = {"client": client, "seq": seq} if client is not None else {}
        if kind == "put":
            command = encode_put(key, value, ts=ts, **session)
        elif kind == "cas":
            command = encode_put(key, value, ts=ts, prev_index=prev, **session)
        else:
            command = encode_delete(key, ts=ts, **session)
        out.append((index, command))
    return out


def machine() -> KVStateMachine:
    return KVStateMachine(session_ttl_ms=TTL_MS, session_window=WINDOW)


def replay(entries: list[tuple[int, bytes]], kv: KVStateMachine | None = None) -> KVStateMachine:
    kv = kv if kv is not None else machine()
    for index, command in entries:
        kv.apply(index, command)
    return kv


def finish(job: SnapshotJob, timeout: float = 30) -> SnapshotResult:
    """Block until `job` is done, as the member's loop waits on it (its descriptor, then
    `poll()` on this thread); TimeoutError if it is not done in `timeout` s."""
    deadline = time.monotonic() + timeout
    while (result := job.poll()) is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("snapshot still running")
        select.select([job.fileno()], [], [], remaining)
    return result
