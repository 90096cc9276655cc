"""Client sessions: a retried command is applied once and answered with its first outcome, and
sessions expire by the leader-stamped timestamps in the log, never by a member's clock."""

from __future__ import annotations

import time

from flotilla.node.statemachine import KVStateMachine, decode_command, encode_delete, encode_put
from hypothesis import given, settings

from tests.statemachine.sm_workloads import TTL_MS, WINDOW, replay, workloads


def put(kv, index, key, value, *, ts=0, **kw):
    return kv.apply(index, encode_put(key, value, ts=ts, **kw))


def test_a_retried_put_applies_once_and_returns_the_first_outcome():
    kv = KVStateMachine()
    first = put(kv, 1, "k", b"v1", client="c", seq=1)
    put(kv, 2, "k", b"other writer")
    retry = put(kv, 3, "k", b"v1", client="c", seq=1)
    assert retry == first == {"index": 1, "mod_index": 1}
    assert kv.get("k") == (b"other writer", 2)  # the retry did not overwrite it


def test_a_retried_compare_and_set_returns_its_first_verdict():
    kv = KVStateMachine()
    ok = put(kv, 1, "k", b"a", prev_index=0, client="c", seq=1)
    assert ok == {"index": 1, "mod_index": 1}
    # A naive re-apply would now fail (the key exists); the retry must still say "ok".
    assert put(kv, 2, "k", b"a", prev_index=0, client="c", seq=1) == ok
    miss = put(kv, 3, "k", b"b", prev_index=99, client="c", seq=2)
    put(kv, 4, "k", b"c", prev_index=1)  # mod index becomes 4
    assert put(kv, 5, "k", b"b", prev_index=99, client="c", seq=2) == miss
    assert miss["mod_index"] == 1


def test_a_retried_delete_returns_deleted_true_again():
    kv = KVStateMachine()
    put(kv, 1, "k", b"a")
    first = kv.apply(2, encode_delete("k", ts=0, client="c", seq=1))
    assert first == {"index": 2, "deleted": True}
    assert kv.apply(3, encode_delete("k", ts=0, client="c", seq=1)) == first


def test_returned_results_cannot_corrupt_the_recorded_outcome():
    kv = KVStateMachine()
    first = put(kv, 1, "k", b"a", client="c", seq=1)
    first["index"] = 999
    assert put(kv, 2, "k", b"a", client="c", seq=1) == {"index": 1, "mod_index": 1}


def test_older_seqs_are_answered_from_the_window_or_called_stale():
    kv = KVStateMachine(session_window=3)
    outcomes = {seq: put(kv, seq, f"k{seq}", b"v", client="c", seq=seq) for seq in range(1, 7)}
    # Window 3: seqs 4..6 are remembered.
    assert put(kv, 10, "k4", b"changed", client="c", seq=4) == outcomes[4]
    assert kv.get("k4") == (b"v", 4)
    stale = put(kv, 11, "k3", b"changed", client="c", seq=3)
    assert stale == {"index": 11, "error": "stale_sequence", "last_seq": 6}
    assert kv.get("k3") == (b"v", 3)


def test_a_seq_overtaken_by_a_later_one_is_applied_once():
    kv = KVStateMachine(session_window=4)
    put(kv, 1, "a", b"1", client="c", seq=1)
    put(kv, 2, "c", b"3", client="c", seq=3)  # seq 2 was pipelined and arrives late
    late = put(kv, 3, "b", b"2", client="c", seq=2)
    assert late == {"index": 3, "mod_index": 3}
    assert kv.get("b") == (b"2", 3)
    assert put(kv, 4, "b", b"2", client="c", seq=2) == late  # and its retry is deduplicated
    assert kv.get("b") == (b"2", 3)


def test_clients_have_separate_sessions():
    kv = KVStateMachine()
    put(kv, 1, "k", b"from c1", client="c1", seq=1)
    assert put(kv, 2, "k", b"from c2", client="c2", seq=1) == {"index": 2, "mod_index": 2}
    assert kv.get("k") == (b"from c2", 2)


def test_a_session_expires_after_ttl_of_log_time_exactly():
    ttl = 1000
    kv = KVStateMachine(session_ttl_ms=ttl)
    put(kv, 1, "k", b"v", ts=5000, client="c", seq=1)
    put(kv, 2, "other", b"x", ts=5000 + ttl)  # idle for exactly the TTL: still alive
    assert kv.session("c") is not None
    put(kv, 3, "other", b"x", ts=5000 + ttl + 1)  # idle longer than the TTL: dropped
    assert kv.session("c") is None
    # A retry after expiry is a new request (the documented limit of the guarantee).
    assert put(kv, 4, "k", b"v", ts=5000 + ttl + 1, client="c", seq=1)["index"] == 4


def test_activity_keeps_a_session_alive_including_retries():
    kv = KVStateMachine(session_ttl_ms=1000)
    put(kv, 1, "k", b"v", ts=1000, client="c", seq=1)
    put(kv, 2, "k", b"v", ts=1900, client="c", seq=1)  # a retry is activity too
    put(kv, 3, "x", b"v", ts=2800)
    assert kv.session("c") is not None
    assert kv.session("c").last_active == 1900


def test_the_session_clock_never_runs_backwards():
    kv = KVStateMachine(session_ttl_ms=1000)
    put(kv, 1, "k", b"v", ts=10_000, client="c", seq=1)
    put(kv, 2, "k", b"v", ts=11_001)  # c expires
    put(kv, 3, "k", b"v", ts=500, client="d", seq=1)  # a leader whose clock is behind
    assert kv.clock == 11_001
    assert kv.session("c") is None
    assert kv.session("d").last_active == 11_001


def test_expiry_ignores_the_members_own_clock(monkeypatch):
    def run() -> dict:
        kv = KVStateMachine(session_ttl_ms=1000)
        put(kv, 1, "k", b"v", ts=1, client="c", seq=1)
        put(kv, 2, "k", b"w", ts=2)
        put(kv, 3, "k", b"v", ts=3, client="c", seq=1)  # must be deduplicated
        return kv.canonical_state()

    reference = run()
    # A member whose clocks say a year has passed must behave exactly the same.
    year = 365 * 24 * 3600.0
    monkeypatch.setattr(time, "time", lambda: 1.7e9 + year)
    monkeypatch.setattr(time, "monotonic", lambda: year)
    monkeypatch.setattr(time, "time_ns", lambda: int((1.7e9 + year) * 1e9))
    assert run() == reference
    assert reference["data"]["k"] == (b"w", 2)


@settings(max_examples=150, deadline=None)
@given(workloads(max_size=60))
def test_replicas_applying_the_same_entries_agree_on_results_and_sessions(entries):
    a, b = replay([]), replay([])
    results_a = [a.apply(i, c) for i, c in entries]
    results_b = [b.apply(i, c) for i, c in entries]
    assert results_a == results_b
    assert a.canonical_state() == b.canonical_state()
    a.check_invariants()


@settings(max_examples=200, deadline=None)
@given(workloads(max_size=60))
def test_sessions_agree_with_a_dumb_model_of_exactly_once(entries):
    """The table against a model that keeps every outcome of a session in a plain dict and
    expires sessions by scanning them all."""
    ttl, window = TTL_MS, WINDOW
    kv = replay([])
    clock = 0
    model: dict[str, dict] = {}  # client -> {"last_seq", "last_active", "results": {seq: r}}
    for index, command in entries:
        cmd = decode_command(command)
        clock = max(clock, cmd.ts)
        model = {c: s for c, s in model.items() if clock - s["last_active"] <= ttl}
        result = kv.apply(index, command)
        if cmd.client is None:
            assert result["index"] == index
            continue
        session = model.setdefault(cmd.client, {"last_seq": 0, "results": {}})
        session["last_active"] = clock
        if cmd.seq <= session["last_seq"] - window:
            assert result == {
                "index": index,
                "error": "stale_sequence",
                "last_seq": session["last_seq"],
            }
        elif cmd.seq in session["results"]:
            assert result == session["results"][cmd.seq]  # the first outcome, not re-applied
        else:
            assert result["index"] == index  # applied now
            session["results"][cmd.seq] = result
            session["last_seq"] = max(session["last_seq"], cmd.seq)
    assert sorted(model) == sorted(s[0] for s in kv.canonical_state()["sessions"])
    kv.check_invariants()
