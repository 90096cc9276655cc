"""The linearizability checker: hand-written stories, generated executions, and a dumb oracle.

The oracle (``brute_force_linearizable``) tries every subset of the unknown operations and
every order of what it includes; it shares no code with the checker. Generated histories come
from really executing operations one after another at chosen instants inside their intervals,
so they are linearizable by construction; mutating one answer in a way that no order can
explain must make them fail.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from dataclasses import dataclass
from unittest import mock

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.harness import linearizability
from tests.harness.linearizability import (
    History,
    Kind,
    Op,
    Status,
    Verdict,
    add_final_reads,
    check,
    check_final_state,
    lost_writes,
)

# ---------------------------------------------------------------------------------------------
# The dumb oracle


def brute_force_linearizable(ops: list[Op]) -> bool:
    """Every subset of the maybe-applied operations, in every order that respects real time."""
    ops = [o for o in ops if o.status is not Status.FAIL
           and not (o.kind is Kind.GET and o.status is not Status.OK)]
    must = [o for o in ops if o.status is Status.OK]
    maybe = [o for o in ops if o.status is not Status.OK]
    for r in range(len(maybe) + 1):
        for chosen in itertools.combinations(maybe, r):
            for order in itertools.permutations(must + list(chosen)):
                if respects_real_time(order) and replays(order):
                    return True
    return False


def respects_real_time(order: tuple[Op, ...]) -> bool:
    return not any(later.deadline < earlier.invoke
                   for i, earlier in enumerate(order) for later in order[i + 1:])


def replays(order: tuple[Op, ...]) -> bool:
    """Run ``order`` against a plain dict; every known answer must match."""
    store: dict = {}  # key -> (value, mod index or None when not recorded)
    for op in order:
        known = op.status is Status.OK
        current = store.get(op.key)
        if op.kind is Kind.GET:
            if (current[0] if current else None) != op.output:
                return False
        elif op.kind is Kind.PUT:
            store[op.key] = (op.value, op.output if known and type(op.output) is int else None)
        elif op.kind is Kind.DELETE:
            if known and op.output != (current is not None):
                return False
            store.pop(op.key, None)
        else:
            if op.prev_index == 0:
                holds = current is None
            elif current is None:
                holds = False
            elif current[1] is None:
                holds = None  # cannot tell: either answer is accepted
            else:
                holds = current[1] == op.prev_index
            refused = known and op.output is False
            if refused:
                if holds is True:
                    return False
            else:
                if holds is False:
                    return False
                index = op.output if known and type(op.output) is int else None
                store[op.key] = (op.value, index)
    return True


# ---------------------------------------------------------------------------------------------
# Real executions


@dataclass
class Spec:
    """One generated request: which client, what, and how its interval and fate look."""

    client: int
    kind: str
    key: int
    gap: float  # idle time of the client before invoking it
    latency: float
    at: float  # where inside the interval it takes effect, 0..1
    fate: str  # ok | unknown-applied | unknown-lost | fail
    cas_matches: bool = True


def execute(specs: list[Spec]) -> History:
    """Give each client a sequential timeline, then apply every applied request in the order
    of the instant it takes effect against one real store: the recorded answers are what a
    correct server would have said, so the history is linearizable by construction."""
    h = History()
    clock: dict[int, float] = {}
    planned = []
    for n, spec in enumerate(specs):
        invoke = clock.get(spec.client, 0.0) + spec.gap
        complete = invoke + spec.latency
        clock[spec.client] = complete
        planned.append((invoke + spec.at * spec.latency, n, spec, invoke, complete))
    store: dict[str, tuple[str, int]] = {}
    index = 0
    answers: dict[int, tuple] = {}
    for _, n, spec, _, _ in sorted(planned):
        if spec.fate in ("fail", "unknown-lost"):
            continue
        key = f"k{spec.key}"
        current = store.get(key)
        if spec.kind == "get":
            answers[n] = (current[0] if current else None, None)
        elif spec.kind == "put":
            index += 1
            store[key] = (f"v{n}", index)
            answers[n] = (index, None)
        elif spec.kind == "delete":
            index += 1
            answers[n] = (current is not None, None)
            store.pop(key, None)
        else:
            prev = (current[1] if current else 0) if spec.cas_matches else (
                current[1] + 1000 if current else 7)
            if (current[1] if current else 0) == prev:
                index += 1
                store[key] = (f"v{n}", index)
                answers[n] = (index, prev)
            else:
                answers[n] = (False, prev)
    for _, n, spec, invoke, complete in sorted(planned, key=lambda p: p[1]):
        key = f"k{spec.key}"
        output, prev = answers.get(n, (None, None))
        value = f"v{n}" if spec.kind in ("put", "cas") else None
        if spec.kind == "cas" and prev is None:  # not applied: any precondition will do
            prev = 1000 + n if spec.cas_matches else 0
        status = {"ok": Status.OK, "fail": Status.FAIL}.get(spec.fate, Status.UNKNOWN)
        if spec.kind == "cas" and spec.fate == "fail":
            status = Status.FAIL
        h.record(f"c{spec.client}", spec.kind, key, value, invoke=invoke, complete=complete,
                 output=output if status is Status.OK else None, status=status,
                 prev_index=prev)
    return h


def spec_strategy(keys: int, max_latency: float, fates: list[str]) -> st.SearchStrategy[Spec]:
    return st.builds(
        Spec,
        client=st.integers(0, 3),
        kind=st.sampled_from(["get", "get", "put", "put", "delete", "cas"]),
        key=st.integers(0, keys - 1),
        gap=st.floats(0, 1),
        latency=st.floats(0, max_latency),
        at=st.floats(0, 1),
        fate=st.sampled_from(fates),
        cas_matches=st.booleans(),
    )


def random_specs(rng: random.Random, n: int, keys: int, clients: int,
                 p_unknown: float = 0.01) -> list[Spec]:
    kinds = ["get"] * 5 + ["put"] * 4 + ["delete", "cas"]
    specs = []
    for _ in range(n):
        r = rng.random()
        fate = ("ok" if r > p_unknown * 2 else "unknown-applied" if r > p_unknown
                else "unknown-lost")
        specs.append(Spec(rng.randrange(clients), rng.choice(kinds), rng.randrange(keys),
                          rng.expovariate(200), rng.expovariate(100), rng.random(), fate,
                          rng.random() < 0.7))
    return specs


FATES = ["ok"] * 6 + ["unknown-applied", "unknown-lost", "fail"]


@given(st.lists(spec_strategy(keys=3, max_latency=3.0, fates=FATES), max_size=60))
@settings(max_examples=150, deadline=None)
def test_real_executions_are_linearizable(specs: list[Spec]) -> None:
    result = check(execute(specs), timeout=20)
    assert result.ok, result.explain()


@given(st.lists(spec_strategy(keys=2, max_latency=3.0, fates=FATES), min_size=1, max_size=40),
       st.data())
@settings(max_examples=150, deadline=None)
def test_reading_a_value_never_written_is_caught(specs: list[Spec], data: st.DataObject) -> None:
    h = execute(specs)
    reads = [o for o in h.ops if o.kind is Kind.GET and o.status is Status.OK]
    assume(reads)
    data.draw(st.sampled_from(reads)).output = "never-written"
    result = check(h, timeout=20)
    assert result.verdict is Verdict.VIOLATION, result.explain()


@given(st.lists(spec_strategy(keys=1, max_latency=1.0, fates=["ok"] * 5 + ["unknown-applied"]),
                min_size=6, max_size=40),
       st.data())
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
def test_reading_an_overwritten_value_after_the_overwrite_completed_is_caught(
        specs: list[Spec], data: st.DataObject) -> None:
    h = execute(specs)
    ops = h.ops
    ok = [o for o in ops if o.status is Status.OK]
    puts = [o for o in ok if o.kind is Kind.PUT]
    overwrites = [o for o in ok if o.kind in (Kind.PUT, Kind.DELETE)
                  or (o.kind is Kind.CAS and o.output is not False)]
    reads = [o for o in ok if o.kind is Kind.GET]
    stale = [(p, g) for p in puts for w in overwrites for g in reads
             if w is not p and w.key == p.key == g.key
             and p.deadline < w.invoke and w.deadline < g.invoke and g.output != p.value]
    assume(stale)
    put, read = data.draw(st.sampled_from(stale))
    read.output = put.value
    result = check(h, timeout=20)
    assert result.verdict is Verdict.VIOLATION, result.explain()


# ---------------------------------------------------------------------------------------------
# Against the oracle, on small arbitrary (mostly not linearizable) histories

small_op = st.tuples(
    st.sampled_from(list(Kind)),
    st.sampled_from(["x", "y"]),
    st.sampled_from(["a", "b", "c"]),
    st.integers(0, 6),  # invoke
    st.integers(0, 4),  # duration
    st.sampled_from([Status.OK] * 4 + [Status.UNKNOWN, Status.FAIL, Status.PENDING]),
    st.sampled_from([None, "a", "b", True, False, 0, 1, 2, 3]),  # output
    st.integers(0, 3),  # prev index
)


mostly_unknown_op = st.tuples(
    st.sampled_from([Kind.PUT, Kind.PUT, Kind.DELETE, Kind.CAS, Kind.GET, Kind.GET]),
    st.just("x"),
    st.sampled_from(["a", "b"]),
    st.integers(0, 6),
    st.integers(0, 4),
    st.sampled_from([Status.OK, Status.UNKNOWN]),
    st.sampled_from([None, "a", "b", True, False, 0, 1, 2]),
    st.integers(0, 2),
)


def small_history(raw: list) -> History:
    h = History()
    for kind, key, value, invoke, duration, status, output, prev in raw:
        if kind is Kind.GET and output not in (None, "a", "b"):
            output = None
        if kind is Kind.DELETE:
            output = bool(output)
        h.record("c", kind, key, value if kind in (Kind.PUT, Kind.CAS) else None,
                 invoke=invoke, complete=invoke + duration, status=status, output=output,
                 prev_index=prev if kind is Kind.CAS else None)
    return h


@given(st.lists(small_op, max_size=7))
@settings(max_examples=400, deadline=None)
def test_agrees_with_brute_force_on_small_histories(raw: list) -> None:
    h = small_history(raw)
    expected = brute_force_linearizable(h.ops)
    result = check(h, timeout=20)
    assert result.ok == expected, f"oracle says {expected}\n{result.explain()}"


@given(st.lists(mostly_unknown_op, max_size=7))
@settings(max_examples=300, deadline=None)
def test_agrees_with_brute_force_when_many_outcomes_are_unknown(raw: list) -> None:
    h = small_history(raw)
    expected = brute_force_linearizable(h.ops)
    result = check(h, timeout=20)
    assert result.ok == expected, f"oracle says {expected}\n{result.explain()}"


@given(st.lists(small_op, max_size=7), st.integers(0, 10), st.integers(0, 10))
@settings(max_examples=400, deadline=None)
def test_a_window_only_fails_when_the_whole_history_does(raw: list, a: int, b: int) -> None:
    """Windows are relaxations: whatever they reject, the oracle must reject too."""
    h = small_history(raw)
    budget = linearizability._Budget(None, time.monotonic, 10**6)
    for key in ("x", "y"):  # windows are per key, like the search
        ops = [o for o in h.ops if o.key == key and o.status is not Status.FAIL
               and not (o.kind is Kind.GET and o.status is not Status.OK)]
        window = linearizability._Window.of(ops, min(a, b), max(a, b))
        if window.search(window.ops, budget).verdict is Verdict.VIOLATION:
            assert not brute_force_linearizable(h.ops)


def test_a_window_may_start_with_a_value_written_before_it() -> None:
    """The read of v at the start is explained by the earlier put of v, so the unknown put of
    v inside the window need not have happened (and must not be forced to)."""
    h = story(("p", "put", "x", "v", -5, -4, None), ("a", "get", "x", None, 0, 10, "v"),
              ("b", "put", "x", "z", 0.5, 0.6, None),
              ("c", "put", "x", "v", 0.7, None, None, Status.UNKNOWN),
              ("d", "get", "x", None, 10.5, 11, "z"))
    assert brute_force_linearizable(h.ops)
    ops = [o for o in h.ops if o.status is not Status.FAIL]
    window = linearizability._Window.of(ops, 0, 11)
    budget = linearizability._Budget(None, time.monotonic, 10**6)
    assert window.search(window.ops, budget).verdict is Verdict.LINEARIZABLE
    with mock.patch.object(linearizability, "_WINDOW", 2):
        assert check(h).ok


@given(st.lists(spec_strategy(keys=1, max_latency=3.0, fates=FATES), max_size=60))
@settings(max_examples=100, deadline=None)
def test_windows_raise_no_false_alarm_on_real_executions(specs: list[Spec]) -> None:
    with mock.patch.object(linearizability, "_WINDOW", 4):
        result = check(execute(specs), timeout=20)
    assert result.ok, result.explain()


@given(st.lists(spec_strategy(keys=1, max_latency=1.0, fates=["ok"] * 5 + ["unknown-applied"]),
                min_size=6, max_size=40),
       st.data())
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
def test_windows_catch_stale_reads(specs: list[Spec], data: st.DataObject) -> None:
    h = execute(specs)
    ok = [o for o in h.ops if o.status is Status.OK]
    stale = [(p, g) for p in ok for w in ok for g in ok
             if p.kind is Kind.PUT and g.kind is Kind.GET and w is not p
             and (w.kind in (Kind.PUT, Kind.DELETE) or (w.kind is Kind.CAS
                                                         and w.output is not False))
             and p.deadline < w.invoke and w.deadline < g.invoke and g.output != p.value]
    assume(stale)
    put, read = data.draw(st.sampled_from(stale))
    read.output = put.value
    with mock.patch.object(linearizability, "_WINDOW", 4):
        result = check(h, timeout=20)
    assert result.verdict is Verdict.VIOLATION, result.explain()


def test_oracle_itself_can_fail() -> None:
    h = History()
    h.record("a", "put", "x", "1", invoke=0, complete=1)
    h.record("b", "get", "x", invoke=2, complete=3, output=None)
    assert not brute_force_linearizable(h.ops)


# ---------------------------------------------------------------------------------------------
# Hand-written stories


def story(*rows: tuple) -> History:
    """rows: (client, kind, key, value, invoke, complete, output[, status[, prev_index]])"""
    h = History()
    for client, kind, key, value, invoke, complete, output, *rest in rows:
        status = rest[0] if rest else Status.OK
        prev = rest[1] if len(rest) > 1 else None
        h.record(client, kind, key, value, invoke=invoke, complete=complete, output=output,
                 status=status, prev_index=prev)
    return h


def test_a_sequential_history_that_reads_its_writes_is_linearizable() -> None:
    h = story(("a", "put", "x", "1", 0, 1, 1), ("a", "get", "x", None, 2, 3, "1"),
              ("a", "delete", "x", None, 4, 5, True), ("a", "get", "x", None, 6, 7, None),
              ("a", "delete", "x", None, 8, 9, False))
    assert check(h).ok


def test_a_read_concurrent_with_a_write_may_see_either_value() -> None:
    for seen in ("1", "2"):
        h = story(("a", "put", "x", "1", 0, 1, None), ("a", "put", "x", "2", 2, 6, None),
                  ("b", "get", "x", None, 3, 4, seen))
        assert check(h).ok


def test_a_stale_read_after_an_acknowledged_write_is_a_violation() -> None:
    h = story(("a", "put", "x", "1", 0, 1, None), ("a", "put", "x", "2", 2, 3, None),
              ("b", "get", "x", None, 4, 5, "1"))
    result = check(h)
    assert result.verdict is Verdict.VIOLATION
    text = result.explain()
    assert "key 'x'" in text
    # put 2 cannot go while the read of 1 is still to come, and nothing else writes 1
    assert "!! #1 " in text and "<< #2 " in text, text


def test_an_acknowledged_write_missing_from_the_final_state_is_lost() -> None:
    h = story(("a", "put", "x", "1", 0, 1, None), ("a", "put", "x", "2", 2, 3, None),
              ("b", "put", "y", "9", 0, 1, None))
    assert check(h).ok
    result = check_final_state(h, {"x": "1", "y": "9"})
    assert not result.ok
    assert any("acknowledged write lost" in p and "put('x', '2')" in p for p in result.problems)
    assert result.keys["x"].verdict is Verdict.VIOLATION
    assert result.keys["y"].verdict is Verdict.LINEARIZABLE
    assert len(h) == 3, "check_final_state must not modify the history"


def test_a_key_that_vanished_is_a_lost_write() -> None:
    h = story(("a", "put", "x", "1", 0, 1, None))
    assert lost_writes(h, {"x": None})
    assert not check_final_state(h, {"x": None}).ok
    assert check_final_state(h, {"x": "1"}).ok


def test_a_final_value_nobody_wrote_is_reported() -> None:
    h = story(("a", "put", "x", "1", 0, 1, None))
    assert "never written" in lost_writes(h, {"x": "zzz"})[0]


def test_final_reads_must_cover_every_key() -> None:
    h = story(("a", "put", "x", "1", 0, 1, None), ("a", "put", "y", "1", 0, 1, None))
    with pytest.raises(KeyError, match="no final value"):
        add_final_reads(h, {"x": "1"})
    reads = add_final_reads(h, {"x": "1", "y": "1"})
    assert all(r.invoke > 1 for r in reads)
    assert check(h).ok


def test_two_readers_seeing_two_writes_in_opposite_orders_is_a_violation() -> None:
    h = story(("w1", "put", "x", "1", 0, 10, None), ("w2", "put", "x", "2", 0, 10, None),
              ("a", "get", "x", None, 1, 2, "1"), ("a", "get", "x", None, 3, 4, "2"),
              ("b", "get", "x", None, 1, 2, "2"), ("b", "get", "x", None, 3, 4, "1"))
    assert check(h).verdict is Verdict.VIOLATION
    assert not brute_force_linearizable(h.ops)


def test_an_unknown_write_may_have_applied() -> None:
    h = story(("a", "put", "x", "1", 0, 1, None, Status.UNKNOWN),
              ("b", "get", "x", None, 50, 51, "1"))
    assert check(h).ok


def test_an_unknown_write_may_have_applied_long_after_the_client_gave_up() -> None:
    h = story(("a", "put", "x", "1", 0, 1, None, Status.UNKNOWN),
              ("b", "get", "x", None, 50, 51, None), ("b", "get", "x", None, 60, 61, "1"))
    assert check(h).ok


def test_an_unknown_write_may_never_have_applied() -> None:
    h = story(("a", "put", "x", "1", 0, 1, None), ("a", "put", "x", "2", 2, 3, None,
                                                   Status.UNKNOWN),
              ("b", "get", "x", None, 10, 11, "1"))
    assert check(h).ok


def test_an_unknown_delete_may_take_effect_after_a_later_write() -> None:
    h = story(("a", "delete", "x", None, 0, 1, None, Status.UNKNOWN),
              ("b", "put", "x", "1", 2, 3, None), ("b", "get", "x", None, 4, 5, "1"),
              ("b", "get", "x", None, 6, 7, None))
    assert check(h).ok


def test_an_unknown_write_cannot_be_seen_before_it_was_sent() -> None:
    h = story(("b", "get", "x", None, 0, 1, "1"),
              ("a", "put", "x", "1", 2, 3, None, Status.UNKNOWN))
    assert check(h).verdict is Verdict.VIOLATION


def test_once_an_unknown_write_is_seen_it_cannot_be_undone() -> None:
    h = story(("a", "put", "x", "1", 0, 1, None), ("a", "put", "x", "2", 2, 3, None,
                                                   Status.UNKNOWN),
              ("b", "get", "x", None, 10, 11, "2"), ("b", "get", "x", None, 12, 13, "1"))
    assert check(h).verdict is Verdict.VIOLATION


def test_a_failed_write_must_not_be_visible() -> None:
    h = story(("a", "put", "x", "1", 0, 1, None, Status.FAIL),
              ("b", "get", "x", None, 2, 3, "1"))
    assert check(h).verdict is Verdict.VIOLATION


def test_an_operation_still_pending_counts_as_unknown() -> None:
    h = History()
    op = h.invoke("a", "put", "x", "1")
    h.record("b", "get", "x", invoke=op.invoke + 1, complete=op.invoke + 2, output="1")
    assert op.status is Status.PENDING
    assert check(h).ok


def test_delete_must_report_whether_the_key_existed() -> None:
    h = story(("a", "delete", "x", None, 0, 1, True))
    assert check(h).verdict is Verdict.VIOLATION
    h = story(("a", "put", "x", "1", 0, 1, None), ("a", "delete", "x", None, 2, 3, False))
    assert check(h).verdict is Verdict.VIOLATION


def test_compare_and_set_must_match_the_mod_index() -> None:
    ok = story(("a", "put", "x", "1", 0, 1, 5), ("a", "cas", "x", "2", 2, 3, 6, Status.OK, 5),
               ("a", "get", "x", None, 4, 5, "2"))
    assert check(ok).ok
    wrong = story(("a", "put", "x", "1", 0, 1, 5),
                  ("a", "cas", "x", "2", 2, 3, 6, Status.OK, 4))
    assert check(wrong).verdict is Verdict.VIOLATION
    create = story(("a", "cas", "x", "1", 0, 1, 3, Status.OK, 0),
                   ("a", "cas", "x", "2", 2, 3, 4, Status.OK, 0))
    assert check(create).verdict is Verdict.VIOLATION


def test_a_refused_compare_and_set_must_have_been_refusable() -> None:
    refused_wrongly = story(("a", "put", "x", "1", 0, 1, 5),
                            ("a", "cas", "x", "2", 2, 3, False, Status.OK, 5))
    assert check(refused_wrongly).verdict is Verdict.VIOLATION
    refused_rightly = story(("a", "put", "x", "1", 0, 1, 5),
                            ("a", "cas", "x", "2", 2, 3, False, Status.OK, 4))
    assert check(refused_rightly).ok


def test_an_unknown_compare_and_set_may_or_may_not_apply() -> None:
    for seen in ("1", "2"):
        h = story(("a", "put", "x", "1", 0, 1, 5),
                  ("a", "cas", "x", "2", 2, 3, None, Status.UNKNOWN, 5),
                  ("b", "get", "x", None, 10, 11, seen))
        assert check(h).ok
    h = story(("a", "put", "x", "1", 0, 1, 5),
              ("a", "cas", "x", "2", 2, 3, None, Status.UNKNOWN, 4),
              ("b", "get", "x", None, 10, 11, "2"))
    assert check(h).verdict is Verdict.VIOLATION


def test_keys_are_judged_separately() -> None:
    h = story(("a", "put", "x", "1", 0, 1, None), ("a", "get", "x", None, 2, 3, "1"),
              ("a", "put", "y", "1", 0, 1, None), ("a", "get", "y", None, 2, 3, None))
    result = check(h)
    assert result.keys["x"].verdict is Verdict.LINEARIZABLE
    assert result.keys["y"].verdict is Verdict.VIOLATION
    assert "key 'y'" in result.explain() and "key 'x'" not in result.explain()


def test_the_explanation_shrinks_to_the_operations_that_prove_the_violation() -> None:
    specs = random_specs(random.Random(7), 400, keys=1, clients=5, p_unknown=0)
    specs = [s for s in specs if s.kind in ("get", "put")]
    h = execute(specs)
    ops = h.ops
    first_put = next(o for o in ops if o.kind is Kind.PUT)
    late_read = next(o for o in reversed(ops) if o.kind is Kind.GET
                     and o.invoke > first_put.deadline + 0.5 and o.output != first_put.value)
    late_read.output = first_put.value
    result = check(h)
    assert result.verdict is Verdict.VIOLATION
    text = result.explain()
    timeline = [line for line in text.splitlines() if line.startswith("  ") and "|" in line]
    assert 2 <= len(timeline) <= 8, text
    assert f"!! #{late_read.id} " in text or f"<< #{late_read.id} " in text, text
    assert f"#{first_put.id} " in text


def test_many_unknown_writes_of_unread_values_are_cheap() -> None:
    h = History()
    for i in range(200):
        h.record(f"c{i}", "put", "x", f"lost-{i}", invoke=i * 0.01, status=Status.UNKNOWN)
    h.record("a", "put", "x", "1", invoke=0, complete=1)
    for i in range(200):
        h.record("r", "get", "x", invoke=2 + i, complete=2.5 + i, output="1")
    h.record("a", "delete", "x", None, invoke=300, complete=301, output=True)
    started = time.monotonic()
    assert check(h, timeout=10).ok
    assert time.monotonic() - started < 5


def test_a_pathological_history_is_undecided_within_the_budget() -> None:
    h = History()
    for i in range(24):  # 24 concurrent writes: 2**24 subsets to refute the reads below
        h.record(f"w{i}", "put", "x", f"v{i}", invoke=0, complete=10)
    for t, seen in ((11, "v0"), (13, "v1"), (15, "v0")):
        h.record("r", "get", "x", invoke=t, complete=t + 1, output=seen)
    started = time.monotonic()
    result = check(h, timeout=0.5)
    assert result.undecided and not result.ok
    assert "undecided" in result.explain()
    assert time.monotonic() - started < 5


def test_a_stale_read_deep_inside_a_hot_key_is_found_quickly() -> None:
    rng = random.Random(3)
    specs = random_specs(rng, 4000, keys=1, clients=10, p_unknown=0.01)
    for spec in specs:
        if rng.random() < 0.05:
            spec.latency = rng.uniform(0.2, 2.0)
    h = execute(specs)
    ok = [o for o in h.ops if o.status is Status.OK]
    read = next(g for g in ok[3 * len(ok) // 4:] if g.kind is Kind.GET)
    put = max((p for p in ok if p.kind is Kind.PUT and p.deadline + 0.5 < read.invoke),
              key=lambda p: p.deadline)
    read.output = put.value
    started = time.monotonic()
    result = check(h, timeout=60)
    assert result.verdict is Verdict.VIOLATION
    assert time.monotonic() - started < 15
    assert "window" in result.explain()


def test_a_generated_history_of_20k_operations_checks_in_seconds() -> None:
    h = execute(random_specs(random.Random(1), 20_000, keys=100, clients=10))
    started = time.monotonic()
    result = check(h, timeout=60)
    elapsed = time.monotonic() - started
    assert result.ok, result.explain()
    assert elapsed < 15, f"{elapsed:.1f}s for 20k operations"


# ---------------------------------------------------------------------------------------------
# The recorder


def test_recording_from_threads_and_tasks_loses_nothing() -> None:
    h = History()

    def worker(n: int) -> None:
        for i in range(200):
            op = h.invoke(f"t{n}", "put", f"k{n}", f"{n}-{i}")
            h.ok(op, None)

    async def task(n: int) -> None:
        for i in range(200):
            op = h.invoke(f"a{n}", "get", f"other-{n}")
            await asyncio.sleep(0)
            h.unknown(op) if i % 2 else h.ok(op, None)

    async def tasks() -> None:
        await asyncio.gather(*(task(n) for n in range(4)))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    asyncio.run(tasks())
    for t in threads:
        t.join()
    ops = h.ops
    assert len(ops) == 1600
    assert sorted(o.id for o in ops) == list(range(1600))
    assert all(o.status is not Status.PENDING for o in ops)
    assert all(o.complete >= o.invoke for o in ops)
    assert check(h).ok


def test_an_operation_finishes_once() -> None:
    h = History()
    op = h.invoke("a", "put", "x", "1")
    h.ok(op, 3)
    with pytest.raises(ValueError, match="already finished"):
        h.fail(op)


@pytest.mark.parametrize(("kind", "value", "prev"), [
    ("put", None, None), ("cas", "v", None), ("cas", "v", -1), ("get", "v", None),
])
def test_malformed_operations_are_refused(kind: str, value: str | None, prev: int | None) -> None:
    with pytest.raises(ValueError):
        History().invoke("a", kind, "x", value, prev_index=prev)
