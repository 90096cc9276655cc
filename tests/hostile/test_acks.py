"""An append reply claiming more than the leader ever sent that follower.

The review froze both followers of a three-member cluster and forged append replies in their
names: the leader acknowledged writes no other member held, and lost them all when it was
killed. Replies that claim only what the leader did send cannot be told from real ones without
peer authentication (the TLS phase); but a reply claiming a match index beyond anything the
leader sent that follower is a lie on its face, and the leader ignores it: it does not move
the follower's match index, so it never counts towards a commit. Checked here with claims of
the leader's last index + 1000 (in range: below 2^63), before and while both followers are
frozen with SIGSTOP; a write to the leader meanwhile must not be answered 200.
"""

from __future__ import annotations

import time

from tests.harness.forger import MessageType, message
from tests.hostile.support import (
    UNAVAILABILITY_BOUND_S,
    Findings,
    brief,
    followers,
    forger,
    in_name_of,
    leader_within,
    run_in_background,
)

OVERCLAIM = 1000  # entries beyond the leader's last index that the forged replies claim
PAUSE_S = 2.5  # five election timeouts of forged replies while both followers are frozen


def test_append_reply_beyond_what_the_leader_sent_is_ignored_and_nothing_commits_without_a_quorum(
        cluster, keeper):
    findings = Findings()
    leader = cluster.wait_leader(10)
    first, second = followers(cluster, leader)
    at_leader = forger(cluster, leader)
    term = keeper.status(leader)["term"]
    last_seen = [keeper.status(leader)["last_index"]]

    def overclaim(name: str) -> bytes:
        st = keeper.status(leader)
        if st is not None:
            last_seen[0] = st["last_index"]
        return in_name_of(cluster, name, [message(MessageType.APPEND_RESP, leader, name, term,
                                                  index=last_seen[0] + OVERCLAIM)])

    answer = at_leader.post_messages(overclaim(first))
    findings.expect(answer.status in (204, 400), f"the leader answered an append reply "
                    f"claiming {OVERCLAIM} entries it never sent with {answer}, not 204 "
                    "(ignored) or 400 (refused)")
    st = keeper.status(leader)
    match = st["members"][first]["match_index"]
    findings.expect(match <= st["last_index"], f"the leader took the claim: it believes "
                    f"{first} matches up to {match}, beyond its last index {st['last_index']}")
    keeper.check_commit_within_log(findings, "after the forged reply")

    # Both followers frozen: no quorum exists, whatever arrives in their names.
    committed = keeper.status(leader)["commit_index"]
    for name in (first, second):
        cluster.nodes[name].stop()
    try:
        started = time.monotonic()
        with keeper.client(leader, timeout=PAUSE_S + 0.5) as c:
            write = run_in_background(lambda: c.put("hostile/without-quorum", b"lost?"))
            while time.monotonic() - started < PAUSE_S:
                for name in (first, second):
                    at_leader.post_messages(overclaim(name), timeout=1.0)
                time.sleep(0.05)
            try:
                put = write(PAUSE_S + 1.0)
            except OSError as exc:  # no answer: not acknowledged
                put = f"no answer ({type(exc).__name__})"
        findings.expect(getattr(put, "status", None) != 200,
                        f"with both followers frozen the leader acknowledged a write: {brief(put)}")
        st = keeper.status(leader)
        if st is not None:
            findings.expect(st["commit_index"] <= committed, f"with both followers frozen the "
                            f"leader's commit index moved from {committed} to "
                            f"{st['commit_index']}")
    finally:
        for name in (first, second):
            cluster.nodes[name].cont()

    findings.expect(leader_within(cluster, UNAVAILABILITY_BOUND_S) is not None,
                    f"no leader within {UNAVAILABILITY_BOUND_S}s of the followers resuming")
    keeper.check_commit_within_log(findings, "after the followers resumed")
    keeper.check_serving(findings, "append replies claiming entries never sent")
    keeper.check_no_tracebacks(findings)
    findings.check()
