"""Big bodies on the peer port: checked before they are read, capped at a few MiB.

The review sent a 25 MiB batch carrying the *wrong* cluster id: the member read and decoded all
of it before looking at the id, and the leader stalled 8.7 s and lost its leadership. The
cluster id (from the request's headers, or the stream's handshake) is checked before a body is
read, a peer body or stream frame is capped at a few MiB, and a batch is decoded without
blocking the event loop. So each of these is refused within a second, and meanwhile the leader
keeps its term and every write to it is answered within a second:

* 25 MiB with the wrong id, on ``POST /raft/v1/messages`` (with a wrong ``Flotilla-Cluster-Id``
  header, and with none) and as one frame on a stream whose handshake named the right id;
* the same POST with only its first MiB sent: only a member that refuses before reading the
  body can answer it at all;
* ``OVER_CAP`` bytes with the right id (in the headers too): 413, declared or chunked, and a
  stream frame that size closes the stream.
"""

from __future__ import annotations

import time

from tests.harness.forger import Forger, MessageType, batch, message, packed
from tests.hostile.support import Findings, Write, brief, followers, leader_within, writing

BIG = 25 << 20
#: Over the peer body cap ("a few MiB": 8 MiB with the default --max-value-bytes), well under
#: the 64 MiB the member used to take.
OVER_CAP = 12 << 20
#: How soon a refusal must come, and the longest a write may take meanwhile.
PROMPT_S = 1.0
ROUNDS = 3
#: How long a refusal that did not come promptly is waited for (to report when it came).
GIVE_UP_S = 5.0


def heartbeats(cluster_id: str, to: str, frm: str, size: int) -> bytes:
    """A batch of about ``size`` bytes of heartbeats (tens of thousands of messages per MiB:
    what makes decoding it slow)."""
    one = packed(message(MessageType.HEARTBEAT, to, frm, 1))
    return batch(cluster_id, frm, [one], repeat=size // len(one) + 1)


def refused_promptly(findings: Findings, what: str, answer, status: int | None = None) -> None:
    wanted = f"{status}" if status else "a 4xx"
    ok = (answer.status == status if status else
          answer.status is not None and 400 <= answer.status < 500)
    findings.expect(ok and answer.elapsed < PROMPT_S, f"{what}: {answer}; wanted {wanted} "
                    f"within {PROMPT_S}s")


def frame_refused_promptly(findings: Findings, what: str, target: Forger, sender: str,
                           frame: bytes) -> None:
    with target.stream(sender) as stream:
        if stream.status != 101:
            answered = (f"got no answer ({stream.error})" if stream.status == 0 else
                        f"was answered {stream.status} {stream.body[:120]!r}")
            findings.expect(False, f"{what}: the handshake (right cluster id) {answered}")
            return
        start = time.monotonic()
        stream.send(frame)
        code = stream.closed_within(max(0.0, start + PROMPT_S - time.monotonic()))
        if code is None:
            code = stream.closed_within(GIVE_UP_S)
        took = time.monotonic() - start
    findings.expect(code is not None and took < PROMPT_S, f"{what}: the stream was "
                    f"{'closed' if code is not None else 'still open'} after {took:.2f}s "
                    f"(close code {code}); wanted it closed within {PROMPT_S}s")


def check_undisturbed(findings: Findings, keeper, leader: str, term: int,
                      done: list[Write]) -> None:
    slow = [(round(w.seconds, 2), brief(w.answer)[:40]) for w in done
            if w.seconds >= PROMPT_S or not w.ok]
    findings.expect(done and not slow, f"writes to the leader during the attack: {len(done)} "
                    f"sent, {len(slow)} slower than {PROMPT_S}s or not 200: {slow[:8]}")
    st = keeper.status(leader) or {}
    findings.expect(st.get("role") == "leader" and st.get("term") == term, f"{leader} led in "
                    f"term {term} before the attack; after it: role {st.get('role')}, term "
                    f"{st.get('term')}")


def test_a_25_mib_batch_with_the_wrong_cluster_id_is_refused_before_it_is_read(cluster, keeper):
    findings = Findings()
    leader = cluster.wait_leader(10)
    sender = followers(cluster, leader)[0]
    term = keeper.status(leader)["term"]
    wrong_id = "not-" + cluster.cluster_id
    body = heartbeats(wrong_id, leader, sender, BIG)
    headers = {"Flotilla-Cluster-Id": wrong_id, "Flotilla-Sender": sender}
    at_leader = Forger(cluster.peer_url(leader), cluster.cluster_id, timeout=GIVE_UP_S)
    with writing(keeper, leader, "hostile/during-big-batches") as done:
        for i in range(ROUNDS):
            refused_promptly(findings, f"round {i}: 25 MiB of another cluster on "
                             "/raft/v1/messages", at_leader.post_messages(body, headers=headers))
            frame_refused_promptly(findings, f"round {i}: 25 MiB of another cluster as a "
                                   "stream frame", at_leader, sender, body)
        refused_promptly(findings, "25 MiB of another cluster without a Flotilla-Cluster-Id "
                         "header", at_leader.post_messages(body, identify=False))
        refused_promptly(findings, "25 MiB of another cluster of which only the first MiB was "
                         "sent", at_leader.post_messages(body, headers=headers,
                                                         send_at_most=1 << 20, timeout=3.0))
    check_undisturbed(findings, keeper, leader, term, done)
    keeper.check_serving(findings, "25 MiB batches of another cluster")
    keeper.check_no_tracebacks(findings)
    findings.check()


def test_a_batch_over_the_peer_cap_is_refused_with_413(cluster, keeper):
    findings = Findings()
    leader = cluster.wait_leader(10)
    sender = followers(cluster, leader)[0]
    term = keeper.status(leader)["term"]
    # Addressed to nobody: a member that took it would have nothing to do with it.
    body = heartbeats(cluster.cluster_id, "nobody", sender, OVER_CAP)
    at_leader = Forger(cluster.peer_url(leader), cluster.cluster_id, timeout=GIVE_UP_S)
    with writing(keeper, leader, "hostile/during-big-batches") as done:
        refused_promptly(findings, f"{OVER_CAP >> 20} MiB with the right cluster id",
                         at_leader.post_messages(body), 413)
        refused_promptly(findings, f"{OVER_CAP >> 20} MiB with the right cluster id, chunked",
                         at_leader.post_messages(body, chunked=True), 413)
        refused_promptly(findings, f"{OVER_CAP >> 20} MiB with the right cluster id, of which "
                         "only the first MiB was sent",
                         at_leader.post_messages(body, send_at_most=1 << 20, timeout=3.0), 413)
        frame_refused_promptly(findings, f"a stream frame of {OVER_CAP >> 20} MiB", at_leader,
                               sender, body)
    check_undisturbed(findings, keeper, leader, term, done)
    findings.expect(leader_within(cluster, 2) == leader, f"{leader} lost its leadership")
    keeper.check_serving(findings, f"{OVER_CAP >> 20} MiB batches")
    keeper.check_no_tracebacks(findings)
    findings.check()
