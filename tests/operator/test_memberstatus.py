"""A member's `/v1/status` parsed once: the document a node serves today, one from an older
member, and documents that are not a status at all."""

from __future__ import annotations

import logging

import pytest
from flotilla.node.consensus.membership import change_in_flight
from flotilla.operator.memberstatus import Configuration, Joint, MemberStatus, Progress

LEADER = {
    "name": "demo-0", "cluster_id": "default-demo-1", "member_uid": "u0", "admission": None,
    "role": "leader", "term": 4, "leader": "demo-0", "commit_index": 120,
    "applied_index": 119, "alarms": [], "first_index": 1, "last_index": 121,
    "snapshot": {"index": 100, "term": 3, "bytes": 2048},
    "config": {"voters": ["demo-0", "demo-1", "demo-2"], "learners": ["demo-3"],
               "joint": None, "index": 118},
    "members": {
        "demo-0": {"peer_url": "https://p0", "client_url": "https://c0", "role": "leader",
                   "match_index": 121},
        "demo-3": {"peer_url": "https://p3", "client_url": "https://c3", "role": "learner",
                   "match_index": None}},
    "archive": {"url": "file:///a", "last_snapshot_index": 100, "last_archived_index": 110,
                "error": None},
}


def test_the_document_a_node_serves_is_read_whole():
    status = MemberStatus.parse(LEADER)
    assert status is not None and status.leads
    assert (status.name, status.term, status.commit_index, status.applied_index) == (
        "demo-0", 4, 120, 119)
    assert status.config == Configuration(frozenset({"demo-0", "demo-1", "demo-2"}),
                                          frozenset({"demo-3"}), None, 118)
    assert status.config.members == {"demo-0", "demo-1", "demo-2", "demo-3"}
    assert status.members["demo-3"] == Progress("learner", None, "https://p3", "https://c3")
    assert status.match("demo-0") == 121 and status.match("demo-3") is None
    assert status.match("demo-9") is None
    assert (status.snapshot.index, status.snapshot.bytes) == (100, 2048)
    assert (status.archive.last_archived_index, status.archive.error) == (110, None)


def test_a_joint_configuration_is_in_flight_by_the_shared_rule():
    doc = {**LEADER, "config": {"voters": ["a", "b"], "learners": [], "index": 90,
                                "joint": {"old": ["a"], "new": ["a", "b"]}}}
    config = MemberStatus.parse(doc).config
    assert config.joint == Joint(frozenset({"a"}), frozenset({"a", "b"}))
    assert change_in_flight(config.joint is not None, config.index, 120)


def test_an_older_member_without_newer_fields_parses_with_defaults():
    """Before `config.index`, `admission`, `alarms` and `archive` existed, and with nulls
    where a field has no value yet."""
    old = {"name": "n1", "role": "follower", "term": 2, "leader": None, "commit_index": 7,
           "config": {"voters": ["n1"], "learners": None, "joint": None},
           "members": None, "snapshot": None}
    status = MemberStatus.parse(old)
    assert status is not None and not status.leads
    assert status.config.index == 0 and status.config.learners == frozenset()
    assert status.admission is None and status.alarms == () and status.members == {}
    assert status.archive.last_archived_index is None and status.snapshot.index == 0
    # a configuration index of 0 leaves the joint flag alone to say a change runs
    assert not change_in_flight(False, status.config.index, status.commit_index)


@pytest.mark.parametrize("doc, reason", [
    ([1, 2], "the document is not an object"),
    ({"role": "leader"}, "no member name"),
    ({"name": "n1"}, "no role"),
    ({"name": "n1", "role": "leader", "term": "four"}, "term is not a whole number"),
    ({"name": "n1", "role": "leader", "term": True}, "term is not a whole number"),
    ({"name": "n1", "role": "leader", "config": {"voters": "n1"}}, "voters is not a list"),
    ({"name": "n1", "role": "leader", "config": []}, "config is not an object"),
    ({"name": "n1", "role": "leader", "members": {"n2": 5}}, "members.n2 is not an object"),
])
def test_a_document_that_is_not_a_status_is_none_with_the_reason_logged(doc, reason, caplog):
    with caplog.at_level(logging.WARNING, logger="flotilla.operator"):
        assert MemberStatus.parse(doc, source="demo-1") is None
    assert any(reason in r.getMessage() and "demo-1" in r.getMessage()
               for r in caplog.records), caplog.text


def test_no_document_is_no_status_and_nothing_to_log(caplog):
    with caplog.at_level(logging.WARNING, logger="flotilla.operator"):
        assert MemberStatus.parse(None) is None
    assert not caplog.records
