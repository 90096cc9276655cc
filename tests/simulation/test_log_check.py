"""The simulator checks a member's log invariants again only when something they depend on
changed (`SafetyChecker._check_log`); these tests keep that skip exact: the fields it compares
are every field `RaftLog.check_invariants` reads, and a change to any of them is seen."""

from __future__ import annotations

import ast
import inspect
import textwrap
from types import SimpleNamespace

import pytest
from flotilla.node.consensus import Entry, Membership, SnapshotMeta
from flotilla.node.consensus.raftlog import LogError, RaftLog

from .cluster import LOG_CHECK_FIELDS, SafetyChecker, log_check_state


def _fields_read(method: str, seen: set[str] | None = None) -> set[str]:
    """The attributes of `self` a RaftLog method reads, through the methods it calls on self."""
    seen = set() if seen is None else seen
    seen.add(method)
    tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(RaftLog, method))))
    read: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "self"):
            if callable(getattr(RaftLog, node.attr, None)):
                if node.attr not in seen:
                    read |= _fields_read(node.attr, seen)
            else:
                read.add(node.attr)
    return read


def test_the_compared_fields_are_every_field_the_check_reads():
    assert _fields_read("check_invariants") == set(LOG_CHECK_FIELDS), (
        "RaftLog.check_invariants reads other fields now: compare them in "
        "tests/simulation/cluster.py (LOG_CHECK_FIELDS and log_check_state)")


def _log() -> RaftLog:
    meta = SnapshotMeta(2, 1, Membership(voters=frozenset({"n1"})), ts_ms=5)
    return RaftLog(meta, [Entry(3, 1, ts_ms=6), Entry(4, 1, ts_ms=7)])


@pytest.mark.parametrize("field", LOG_CHECK_FIELDS)
def test_a_change_to_any_compared_field_is_seen(field: str):
    log = _log()
    before = log_check_state(log)
    if field == "entries":
        log.entries[-1] = Entry(4, 2, ts_ms=7)  # in place: same list, same length
    elif field == "snapshot":
        log.snapshot = SnapshotMeta(3, 1, log.snapshot.membership, ts_ms=6)
    else:
        setattr(log, field, getattr(log, field) + 1)
    assert log_check_state(log) != before


def test_a_log_broken_in_place_after_a_check_fails_the_next_one():
    checker = SafetyChecker(SimpleNamespace(nodes={}))  # type: ignore[arg-type]
    log = _log()
    checker._check_log("n1", log)
    checker._check_log("n1", log)  # unchanged: skipped, still fine
    log.entries[0] = Entry(5, 1, ts_ms=6)  # wrong index, same list
    with pytest.raises(LogError):
        checker._check_log("n1", log)
