"""Values no honest member sends: a match index or a term of 2^63 or more.

The review sent one append reply claiming match index 2^64-1 in a follower's name, and the
leader stopped replicating to that follower for good, logging nothing; one heartbeat with term
2^64-1 left all three members candidates for ever (msgpack cannot encode the next term), across
restarts. Terms, indexes and commits must stay below 2^63 (a signed 64-bit integer, as on
disk), so such a batch is refused where it is decoded: ``POST /raft/v1/messages`` answers 400,
and the stream that carried it is closed. Both values are tried: 2^64-1 (the largest msgpack
carries) and 2^63 (the first one out of range).
"""

from __future__ import annotations

import pytest

from tests.harness.forger import MAX_U64, SIGNED_LIMIT, MessageType, message
from tests.hostile.support import (
    UNAVAILABILITY_BOUND_S,
    Findings,
    failed,
    followers,
    forger,
    in_name_of,
    leader_within,
    refused_on_stream,
    writes,
)

OUT_OF_RANGE = pytest.mark.parametrize("value", [MAX_U64, SIGNED_LIMIT],
                                       ids=["2^64-1", "2^63"])


@OUT_OF_RANGE
def test_append_reply_with_an_out_of_range_match_index_is_refused_and_replication_continues(
        cluster, keeper, value):
    findings = Findings()
    leader = cluster.wait_leader(10)
    victim = followers(cluster, leader)[0]
    term = keeper.status(leader)["term"]
    reply = in_name_of(cluster, victim, [message(MessageType.APPEND_RESP, leader, victim, term,
                                                 index=value)])
    at_leader = forger(cluster, leader)
    answer = at_leader.post_messages(reply)
    findings.expect(answer.status == 400, f"the leader answered the forged append reply "
                    f"(match index {value}) on /raft/v1/messages with {answer}, not 400")
    problem = refused_on_stream(at_leader, victim, reply)
    findings.expect(problem is None, f"the same reply on the stream to the leader: {problem}")

    # Replication to the follower whose name was used goes on.
    refused = failed(writes(keeper, leader, f"after-match-{value}", 10))
    findings.expect(not refused, f"writes to the leader after the forged reply: {refused}")
    st = keeper.status(leader)
    if findings.expect(st is not None, f"the leader {leader} does not answer /v1/status"):
        match = st["members"][victim]["match_index"]
        findings.expect(match is not None and match <= st["last_index"],
                        f"the leader believes {victim} matches its log up to {match}, beyond "
                        f"its own last index {st['last_index']}")
        findings.expect(keeper.caught_up(victim, st["commit_index"], UNAVAILABILITY_BOUND_S),
                        f"{victim} did not apply the leader's commit index "
                        f"{st['commit_index']} within {UNAVAILABILITY_BOUND_S}s (it is at "
                        f"{(keeper.status(victim) or {}).get('applied_index')}): replication "
                        "to it stopped")
    keeper.check_terms_bounded(findings, f"a match index of {value}")
    keeper.check_serving(findings, f"an append reply claiming match index {value}")
    keeper.check_no_tracebacks(findings)
    findings.check()


@OUT_OF_RANGE
def test_heartbeat_with_an_out_of_range_term_is_refused_and_the_cluster_still_elects(
        cluster, keeper, value):
    findings = Findings()
    leader = cluster.wait_leader(10)
    first, second = followers(cluster, leader)

    def heartbeat(to: str, frm: str) -> bytes:
        return in_name_of(cluster, frm, [message(MessageType.HEARTBEAT, to, frm, value)])

    answer = forger(cluster, first).post_messages(heartbeat(first, leader))
    findings.expect(answer.status == 400, f"{first} answered a heartbeat with term {value} in "
                    f"the leader's name on /raft/v1/messages with {answer}, not 400")
    problem = refused_on_stream(forger(cluster, second), leader, heartbeat(second, leader))
    findings.expect(problem is None, f"the same heartbeat on the stream to {second}: {problem}")
    answer = forger(cluster, leader).post_messages(heartbeat(leader, first))
    findings.expect(answer.status == 400, f"the leader answered a heartbeat with term {value} "
                    f"in {first}'s name with {answer}, not 400")

    kept = leader_within(cluster, UNAVAILABILITY_BOUND_S)
    if findings.expect(kept is not None, f"no leader within {UNAVAILABILITY_BOUND_S}s of "
                       f"heartbeats with term {value}"):
        refused = failed(writes(keeper, kept, f"after-term-{value}", 5))
        findings.expect(not refused, f"writes to {kept}: {refused}")
    keeper.check_terms_bounded(findings, f"heartbeats with term {value}")

    # What the members hold on disk still lets them elect a leader.
    for node in cluster.nodes.values():
        node.kill()
    for node in cluster.nodes.values():
        node.start()
    findings.expect(leader_within(cluster, 15) is not None,
                    "after restarting every member there is no leader within 15s")
    keeper.check_terms_bounded(findings, f"heartbeats with term {value} and a restart")
    keeper.check_serving(findings, f"heartbeats with term {value} and a restart")
    keeper.check_no_tracebacks(findings)
    findings.check()
