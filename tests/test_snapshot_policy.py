"""The snapshot threshold policy: its syntax, and the bound the ratio rule promises
(see the proof in flotilla.node.snapshot_policy's docstring)."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from flotilla.node.snapshot_policy import (
    DEFAULT_FLOOR,
    EntriesRule,
    LogBytesRule,
    RatioRule,
    SnapshotPolicy,
    parse_size,
)
from hypothesis import given, settings
from hypothesis import strategies as st

MiB = 1 << 20


# -- syntax ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rules"),
    [
        ("ratio=0.1", (RatioRule(Decimal("0.1"), 4 * MiB),)),
        ("ratio=0.25,floor=1MiB", (RatioRule(Decimal("0.25"), MiB),)),
        ("floor=0, ratio=1", (RatioRule(Decimal(1), 0),)),
        ("log-bytes=64MiB", (LogBytesRule(64 * MiB),)),
        ("entries=10000", (EntriesRule(10000),)),
        ("LOG-BYTES = 512kib", (LogBytesRule(512 * 1024),)),
        (
            "entries=5,ratio=0.5,log-bytes=2GiB",
            (EntriesRule(5), RatioRule(Decimal("0.5")), LogBytesRule(2 << 30)),
        ),
        ("log-bytes=1.5GiB", (LogBytesRule(3 << 29),)),
        ("log-bytes=4096", (LogBytesRule(4096),)),
        ("log-bytes=100B", (LogBytesRule(100),)),
    ],
)
def test_good_policies_parse(text, rules):
    assert SnapshotPolicy.parse(text).rules == rules


def test_the_default_is_ratio_one_tenth_with_a_4mib_floor():
    policy = SnapshotPolicy.default()
    assert policy == SnapshotPolicy.parse("ratio=0.1")
    assert str(policy) == "ratio=0.1,floor=4MiB"
    assert 4 * MiB == DEFAULT_FLOOR


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("", "empty"),
        ("ratio=0.1,", "empty rule"),
        ("ratio", "not name=value"),
        ("ratio=", "not name=value"),
        ("ratio=0", "> 0"),
        ("ratio=-0.5", "> 0"),
        ("ratio=nan", "> 0"),
        ("ratio=abc", "a number"),
        ("floor=1MiB", "floor only applies to the ratio rule"),
        ("ratio=0.1,ratio=0.2", "given twice"),
        ("size=5", "unknown rule 'size'"),
        ("log-bytes=64MB", "KiB, MiB or GiB"),
        ("log-bytes=64 furlongs", "not a size"),
        ("log-bytes=0", "> 0"),
        ("log-bytes=0.3B", "whole number of bytes"),
        ("entries=1e4", "whole number"),
        ("entries=0", "> 0"),
        ("ratio=0.1;entries=5", "a number"),
    ],
)
def test_bad_policies_say_what_is_wrong_and_show_an_example(text, complaint):
    with pytest.raises(ValueError) as caught:
        SnapshotPolicy.parse(text)
    message = str(caught.value)
    assert complaint in message
    assert "ratio=0.1,floor=4MiB" in message  # a valid example to copy


_sizes = st.integers(1, 1 << 40)
_rules = st.one_of(
    st.builds(
        RatioRule,
        st.decimals(min_value=Decimal("0.001"), max_value=10, places=3).filter(lambda d: d > 0),
        st.integers(0, 1 << 35),
    ),
    st.builds(LogBytesRule, _sizes),
    st.builds(EntriesRule, st.integers(1, 10**9)),
)
_policies = st.lists(_rules, min_size=1, max_size=3, unique_by=lambda r: r.name).map(
    lambda rules: SnapshotPolicy(tuple(rules))
)


@settings(max_examples=300)
@given(_policies)
def test_str_round_trips(policy):
    assert SnapshotPolicy.parse(str(policy)) == policy
    assert str(SnapshotPolicy.parse(str(policy))) == str(policy)


@settings(max_examples=300)
@given(st.integers(0, 1 << 45))
def test_sizes_round_trip(size):
    from flotilla.node.snapshot_policy import format_size

    assert parse_size(format_size(size)) == size


# -- behaviour ---------------------------------------------------------------------------------


def test_ratio_rule_fires_strictly_above_the_ratio_and_only_from_the_floor():
    policy = SnapshotPolicy.parse("ratio=0.5,floor=100B")
    assert policy.should_snapshot(99, 1, 0) is None  # under the floor
    assert policy.should_snapshot(100, 1, 0) == "ratio"  # first snapshot once at the floor
    assert policy.should_snapshot(200, 1, 100) is None  # 200 * 0.5 == 100: not above
    assert policy.should_snapshot(202, 1, 100) == "ratio"
    # Exact decimal arithmetic: 0.1 is one tenth, not the float just above it.
    tenth = SnapshotPolicy.parse("ratio=0.1,floor=0")
    assert tenth.should_snapshot(10**18, 1, 10**17) is None
    assert tenth.should_snapshot(10**18 + 10, 1, 10**17) == "ratio"


def test_first_rule_that_fires_wins_in_the_given_order():
    policy = SnapshotPolicy.parse("entries=10,log-bytes=1KiB")
    assert policy.should_snapshot(2048, 10, 0) == "entries"
    assert policy.should_snapshot(2048, 9, 0) == "log-bytes"
    assert SnapshotPolicy.parse("log-bytes=1KiB,entries=10").should_snapshot(2048, 10, 0) == (
        "log-bytes"
    )
    assert policy.should_snapshot(1023, 9, 0) is None


def _condition(rule, log_bytes, entries, snapshot_bytes) -> bool:
    """Each rule's condition, restated independently of the implementation."""
    if isinstance(rule, RatioRule):
        u = Fraction(str(rule.ratio))
        return log_bytes >= rule.floor and log_bytes * u > snapshot_bytes
    if isinstance(rule, LogBytesRule):
        return log_bytes >= rule.limit
    return entries >= rule.limit


_workload = st.lists(
    st.tuples(st.integers(0, 63), st.integers(1, 64 * 1024)),  # (key id, entry bytes)
    min_size=1,
    max_size=400,
)


def _simulate(policy, entries, bytes_per_key, initial_snapshot):
    """Append entries, ask the policy after each, snapshot (sized by the state: distinct keys
    times bytes per key) when it fires. Checks the firing rule after every append."""
    keys: set[int] = set()
    log_since = entries_since = 0
    last_snapshot = initial_snapshot
    total_log = total_snapshots = 0
    quiet = []  # (log bytes, last snapshot bytes) after each append that did not fire
    firings = []  # (rule, size of the snapshot before the one it took)
    for key, size in entries:
        keys.add(key)
        log_since += size
        entries_since += 1
        total_log += size
        fired = policy.should_snapshot(log_since, entries_since, last_snapshot)
        verdicts = [_condition(r, log_since, entries_since, last_snapshot) for r in policy.rules]
        if fired is None:
            assert not any(verdicts), "a rule's condition held but the policy did not fire"
            quiet.append((log_since, last_snapshot))
            continue
        position = [r.name for r in policy.rules].index(fired)
        assert verdicts[position], f"{fired} fired although its condition is false"
        assert not any(verdicts[:position]), "an earlier rule should have won"
        firings.append((fired, last_snapshot))
        last_snapshot = len(keys) * bytes_per_key
        total_snapshots += last_snapshot
        log_since = entries_since = 0
    return total_log, total_snapshots, last_snapshot, firings, quiet


@settings(max_examples=400)
@given(
    st.decimals(min_value=Decimal("0.01"), max_value=2, places=2).filter(lambda d: d > 0),
    st.integers(0, 256 * 1024),
    _workload,
    st.integers(1, 256 * 1024),
    st.integers(0, 1 << 20),
)
def test_ratio_policy_writes_at_most_u_times_the_log_plus_one_snapshot(
    ratio, floor, entries, bytes_per_key, initial_snapshot
):
    policy = SnapshotPolicy((RatioRule(ratio, floor),))
    u = Fraction(str(ratio))
    total_log, total_snapshots, last, firings, quiet = _simulate(
        policy, entries, bytes_per_key, initial_snapshot
    )
    assert all(name == "ratio" for name, _ in firings)
    # The bound of the module docstring: sum S_i < u * sum L_i + S_k - S_0 (k >= 1).
    if firings:
        assert total_snapshots < u * total_log + last - initial_snapshot
    else:
        assert total_snapshots == 0
    # And while it does not fire, the log stays within max(floor - 1, S_last / u).
    for log_bytes, snapshot_bytes in quiet:
        assert log_bytes <= max(floor - 1, Fraction(snapshot_bytes) / u)


@settings(max_examples=400)
@given(_policies, _workload, st.integers(1, 256 * 1024))
def test_any_policy_fires_exactly_when_its_first_true_rule_says_so(policy, entries, per_key):
    total_log, total_snapshots, last, firings, _ = _simulate(policy, entries, per_key, 0)
    # The bound, extended to mixed policies: each firing not by the ratio rule adds at most
    # the size of the snapshot before it.
    ratio = next((r for r in policy.rules if isinstance(r, RatioRule)), None)
    u = Fraction(str(ratio.ratio)) if ratio else Fraction(0)
    extra = sum(previous for name, previous in firings if name != "ratio")
    assert total_snapshots <= u * total_log + last + extra
