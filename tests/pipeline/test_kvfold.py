"""The parallel fold writes the bytes a member writes after replaying the same entries.

The oracle is the node's own machine: restore the base snapshot, apply every entry, write the
snapshot payload. Histories are generated to hit every rule that once made the two differ:
compare-and-set hits and misses, deletes of present and absent keys, retries answered from a
session, sequences overtaken or too old to tell, sessions expiring while other clients move
the clock, commands that do not decode, lone surrogates in keys and client ids, and a base
snapshot taken at a random point.
"""

from __future__ import annotations

import io

from flotilla.node.statemachine.kv import (
    KVStateMachine,
    decode_command,
    encode_delete,
    encode_put,
    packer,
)
from flotilla.pipeline.kvfold import OP_DELETE, OP_PUT, BaseState, decode_fields, synthesize
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KEYS = ["a", "b", "c", "k\ud800", "\U0001f600", ""]
CLIENTS = ["c1", "c2", "x\udfff"]
TTL_MS, WINDOW = 50, 3


@st.composite
def commands(draw) -> list[bytes]:
    """Commands as leaders propose them, with clocks that jump forward and back."""
    out: list[bytes] = []
    seqs = {c: 0 for c in CLIENTS}
    ts = draw(st.integers(0, 100))
    for _ in range(draw(st.integers(0, 60))):
        ts = max(0, ts + draw(st.sampled_from([0, 1, 5, 20, 60, -30, -5])))
        kind = draw(st.sampled_from(["put", "cas", "del", "bad", "put", "del"]))
        if kind == "bad":
            out.append(draw(st.sampled_from([b"", b"\x93\x01\x02\x03", b"junk", b"\xc1"])))
            continue
        session = draw(st.sampled_from([None, *CLIENTS]))
        client = seq = None
        if session is not None:
            client = session
            how = draw(st.sampled_from(["next", "next", "retry", "old", "skip"]))
            if how == "next" or seqs[client] == 0:
                seqs[client] += 1
            elif how == "skip":  # a pipelining client: a later seq overtakes this one
                seqs[client] += 2
            seq = seqs[client]
            if how == "retry":
                seq = max(1, seqs[client] - draw(st.integers(0, 2)))
            elif how == "old":
                seq = max(1, seqs[client] - draw(st.integers(0, 6)))
        key = draw(st.sampled_from(KEYS))
        if kind == "del":
            out.append(encode_delete(key, ts=ts, client=client, seq=seq))
        else:
            prev = draw(st.integers(0, len(out) + 2)) if kind == "cas" else None
            value = draw(st.binary(max_size=4))
            out.append(encode_put(key, value, ts=ts, prev_index=prev, client=client, seq=seq))
    return out


def replayed(entries: list[tuple[int, bytes]], base: bytes | None) -> bytes:
    sm = KVStateMachine(session_ttl_ms=TTL_MS, session_window=WINDOW)
    if base is not None:
        sm.restore(io.BytesIO(base))
    for index, data in entries:
        sm.apply(index, data)
    out = io.BytesIO()
    sm.write_snapshot(out)
    return out.getvalue()


def folded(entries: list[tuple[int, bytes]], base: bytes | None) -> bytes:
    sm = KVStateMachine(session_ttl_ms=TTL_MS, session_window=WINDOW)
    if base is not None:
        sm.restore(io.BytesIO(base))
    state = BaseState(sm.applied_index, sm.clock, sm.session_ttl_ms, sm.session_window,
                      {s.client: s for s in sm.sessions()})
    out = io.BytesIO()
    synthesize(state, list(sm.records()), entries, out)
    return out.getvalue()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=commands(), cut=st.floats(0, 1), gaps=st.lists(st.booleans(), max_size=80))
def test_the_fold_writes_the_replay_s_bytes(history, cut, gaps):
    # Indexes with gaps: membership entries and no-ops sit between the normal entries.
    index, entries = 0, []
    for n, data in enumerate(history):
        index += 2 if n < len(gaps) and gaps[n] else 1
        entries.append((index, data))
    at = int(len(entries) * cut)
    base = replayed(entries[:at], None) if at else None
    assert folded(entries[at:], base) == replayed(entries[at:], base)


def test_a_failed_compare_and_set_is_a_command_not_a_change():
    entries = [(1, encode_put("k", b"1", ts=1)),
               (2, encode_put("k", b"2", ts=2, prev_index=7)),  # misses: k stays at 1
               (3, encode_delete("gone", ts=3))]  # deletes nothing
    assert folded(entries, None) == replayed(entries, None)


def test_a_session_expires_when_another_client_moves_the_clock():
    entries = [(1, encode_put("k", b"1", ts=10, client="c1", seq=1)),
               (2, encode_put("j", b"x", ts=10 + TTL_MS + 1, client="c2", seq=1)),
               (3, encode_put("k", b"again", ts=11, client="c1", seq=1))]  # applied again
    assert folded(entries, None) == replayed(entries, None)


SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 3), st.integers(-2**63, 2**64 - 1),
    st.floats(allow_nan=False),
    st.sampled_from(["put", "delete", "", "k", "c1", "x\udfff", "put "]),
    st.text(max_size=5), st.binary(max_size=5), st.sampled_from([b"put", b"", b"v"]))
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=3), inner, max_size=2), max_leaves=6)

# Per field of [version, op, key, value, prev_index, client, seq, ts]: values one rule away.
NEAR_MISSES = [[0, 2, True, 1.0, "1"], ["put", "delete", "PUT", b"put", 1, None],
               ["", "k", b"k", 1, None, "x\udfff"], [b"", b"v", "v", None, 1],
               [None, 0, 5, -1, True, 1.5, "3"], [None, "c1", "", b"c1", 1],
               [None, 1, 0, -1, True, 2.0], [0, 5, -1, True, 1.5, None, 2**64 - 1]]


@st.composite
def packed_commands(draw) -> bytes:
    """Mostly well-formed commands with a field or two off, and some arbitrary bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=30))
    fields = [1, draw(st.sampled_from(["put", "delete"])), "k", b"", None, None, None, 5]
    if fields[1] == "put":
        fields[3] = b"v"
    if draw(st.booleans()):
        fields[5:7] = ["c1", draw(st.integers(1, 9))]
    for _ in range(draw(st.integers(0, 2))):
        at = draw(st.integers(0, 7))
        fields[at] = draw(st.one_of(st.sampled_from(NEAR_MISSES[at]), SCALARS, VALUES))
    if draw(st.integers(0, 9)) == 0:
        fields = fields[:draw(st.integers(0, 9))]
    data = packer().pack(fields)
    return data + (b"\x00" if draw(st.integers(0, 19)) == 0 else b"")


@settings(max_examples=2000, deadline=None)
@given(data=packed_commands())
def test_the_fold_decodes_exactly_what_the_machine_accepts(data):
    try:
        c = decode_command(data)
    except ValueError:
        assert decode_fields(data) is None
    else:
        client = None if c.client is None else c.client.encode("utf-8", "surrogatepass")
        assert decode_fields(data) == ((OP_PUT if c.op == "put" else OP_DELETE),
                                       c.key.encode("utf-8", "surrogatepass"), c.value,
                                       c.prev_index, client, c.seq, c.ts)
