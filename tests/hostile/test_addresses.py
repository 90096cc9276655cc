"""Who a member dials, and what it keeps, because of what arrives on its peer port.

The review advertised its own client URL in batches sent in the leader's name: the followers
then forwarded writes to it (19 of 20 answered 200 by the fake leader, never committed) and
the admin `Authorization` header with them. 3000 made-up sender names made a member dial 3000
URLs the review chose. Addresses are learned only from the configuration and committed
membership, never from what a batch advertises; messages from non-members are dropped without
creating state (no task, no metric series, no dial) and change nothing, not even a term.

The attacker's two ``Listener`` servers (one advertised as a peer URL, one as a client URL)
record every connection: the defended outcome is that they see none.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from tests.harness.forger import Forger, MessageType, batch, message
from tests.hostile.support import (
    Findings,
    brief,
    failed,
    followers,
    forger,
    leader_within,
    metric_lines_naming,
    open_fds,
    rss_bytes,
    unread,
    writes,
    writing,
)

#: Allowed growth of the member's resident memory over 3000 made-up senders (3000 batches
#: from a real member grow it by well under 1 MiB).
RSS_SLACK = 8 << 20
#: Allowed growth of its open file descriptors (connections still closing, log files).
FD_SLACK = 32
#: What a member may answer a batch from a non-member: refused, or taken and dropped.
NON_MEMBER_ANSWERS = (204, 403)


def advertising(cluster, listeners, sender: str, msgs: list) -> bytes:
    """A batch in ``sender``'s name advertising the attacker's listeners as its URLs."""
    peer, client = listeners
    return batch(cluster.cluster_id, sender, msgs, peer_url=peer.url, client_url=client.url)


def stale_heartbeat(to: str, frm: str) -> list:
    """A heartbeat of term 0: a member answers it (with its own term), to the sender."""
    return message(MessageType.HEARTBEAT, to, frm, 0)


@contextlib.contextmanager
def flooding(frames: list[tuple[Forger, bytes]]) -> Iterator[None]:
    """Send ``frames`` over and over (each to its member) while the block runs: the real
    leader re-advertises its own URLs with every heartbeat, so the review kept advertising."""
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            for target, frame in frames:
                target.post_messages(frame, timeout=1.0)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def attackers_urls_held(keeper, listeners) -> set[str]:
    """"member holds URL for other" for each of the attacker's URLs a member's status shows
    (the URLs it dials, and forwards to)."""
    theirs = {listener.url for listener in listeners}
    held = set()
    for name in keeper.cluster.members:
        for other, doc in ((keeper.status(name) or {}).get("members") or {}).items():
            for kind in ("peer_url", "client_url"):
                if doc.get(kind) in theirs:
                    held.add(f"{name} holds {doc[kind]} as the {kind} of {other}")
    return held


def nothing_reached(findings: Findings, listeners) -> None:
    for listener in listeners:
        findings.expect(listener.seen() is None, listener.seen())
        findings.expect(not listener.authorization_seen(), "the admin token reached the "
                        f"attacker: {listener.authorization_seen()}")


def test_advertised_urls_are_ignored_and_followers_forward_to_the_real_leader(
        cluster, keeper, listeners):
    findings = Findings()
    leader = cluster.wait_leader(10)
    members = list(cluster.members)
    frames = []
    for target in members:
        at_target = forger(cluster, target)
        # Every other member's name, and a made-up one.
        for sender in [*(m for m in members if m != target), "eve"]:
            frame = advertising(cluster, listeners, sender, [stale_heartbeat(target, sender)])
            frames.append((at_target, frame))
            with at_target.stream(sender) as stream:
                if stream.status == 101:
                    stream.send(frame)
                    stream.closed_within(0.2)
    voters = {"voters": sorted(keeper.status(leader)["config"]["voters"])}
    first, second = followers(cluster, leader)
    held: set[str] = set()
    with flooding(frames):
        done = [*writes(keeper, first, "hostile/forwarded-by-first", 10),
                *writes(keeper, second, "hostile/forwarded-by-second", 10)]
        admin = {}
        for f in (first, second):
            with keeper.client(f) as c:
                admin[f] = c.post_json("/v1/config", voters, method="PUT")
            held |= attackers_urls_held(keeper, listeners)
        # Leadership moves to a member in whose name the attacker advertised, while a member
        # that forwards is written to: it must find the new leader's real URL at once.
        with writing(keeper, second, "hostile/forwarded-across-a-transfer") as moved:
            with keeper.client(leader) as c:
                transfer = c.post_json("/v1/leader", {"name": first})
            time.sleep(1.0)
        held |= attackers_urls_held(keeper, listeners)
    findings.expect(not failed(done), f"writes sent to the followers: {failed(done)}")
    missing = unread(keeper, leader, done)
    findings.expect(not missing, f"{len(missing)} of {len(done)} writes acknowledged by the "
                    f"followers are not on the leader {leader}: {missing[:4]}")
    for f, answer in admin.items():
        findings.expect(answer.status == 200, f"the admin request PUT /v1/config sent to {f} "
                        f"(forwarded to the leader) answered {brief(answer)}")
    findings.expect(not held, f"members took the attacker's URLs: {sorted(held)}")
    findings.expect(transfer.status == 200, f"moving leadership to {first} answered "
                    f"{brief(transfer)}")
    # A write may be refused while no leader is known (503, retried by clients); what is
    # acknowledged must be on the leader.
    findings.expect(any(w.ok for w in moved[len(moved) // 2:]), f"no write sent to {second} "
                    f"was acknowledged after leadership moved to {first}: {failed(moved)[-4:]}")
    new_leader = leader_within(cluster, 5)
    if new_leader is not None:
        missing = unread(keeper, new_leader, moved)
        findings.expect(not missing, f"{len(missing)} of {len(moved)} writes acknowledged by "
                        f"{second} while leadership moved are not on {new_leader}: "
                        f"{missing[:4]}")
    keeper.check_serving(findings, "batches advertising the attacker's URLs")
    nothing_reached(findings, listeners)
    keeper.check_no_tracebacks(findings)
    findings.check()


def test_thousands_of_made_up_senders_create_nothing(cluster, keeper, listeners):
    findings = Findings()
    target = cluster.wait_leader(10)
    pid = cluster.nodes[target].pid
    rss, fds = rss_bytes(pid), open_fds(pid)
    names = [f"intruder-{i:04d}" for i in range(3000)]
    kinds = (MessageType.HEARTBEAT, MessageType.APPEND)

    def send(share: list[str]) -> Counter:
        at_target, answers = forger(cluster, target), Counter()
        for i, name in enumerate(share):
            frame = advertising(cluster, listeners, name, [message(kinds[i % 2], target, name, 0)])
            answers[at_target.post_messages(frame).status] += 1
        return answers

    with ThreadPoolExecutor(8) as pool:
        answers = sum(pool.map(send, [names[i::8] for i in range(8)]), Counter())
    time.sleep(1.0)  # a member that dials does so at once
    findings.expect(set(answers) <= set(NON_MEMBER_ANSWERS), f"{target} answered the 3000 "
                    f"made-up senders with {dict(answers)}, not only {NON_MEMBER_ANSWERS}")
    nothing_reached(findings, listeners)
    series = metric_lines_naming(cluster, target, r"intruder-\d")
    findings.expect(series == [], f"{target}'s /metrics names made-up senders: "
                    f"{(series or ['no answer'])[:3]} ({len(series or [])} lines)")
    grown_rss, grown_fds = rss_bytes(pid), open_fds(pid)
    if rss is not None and grown_rss is not None:
        findings.expect(grown_rss - rss < RSS_SLACK, f"{target}'s resident memory grew by "
                        f"{(grown_rss - rss) >> 20} MiB over 3000 made-up senders")
    if fds is not None and grown_fds is not None:
        findings.expect(grown_fds - fds < FD_SLACK, f"{target} holds {grown_fds - fds} more "
                        "file descriptors after 3000 made-up senders")
    keeper.check_serving(findings, "3000 made-up senders")
    keeper.check_no_tracebacks(findings)
    findings.check()


def test_messages_from_a_non_member_change_nothing(cluster, keeper, listeners):
    findings = Findings()
    leader = cluster.wait_leader(10)
    first, second = followers(cluster, leader)
    before = {n: keeper.status(n)["term"] for n in cluster.members}
    term = max(before.values()) + 5
    last = keeper.status(leader)["last_index"] + 100  # a log that would win any vote

    def to(name: str, kind: int, **fields) -> bytes:
        return advertising(cluster, listeners, "mallory", [message(kind, name, "mallory", term,
                                                                   **fields)])

    answers = {
        f"a heartbeat to {first}": forger(cluster, first).post_messages(
            to(first, MessageType.HEARTBEAT)),
        f"a leadership handover to {first}": forger(cluster, first).post_messages(
            to(first, MessageType.TIMEOUT_NOW)),
        f"a forced vote request to {leader}": forger(cluster, leader).post_messages(
            to(leader, MessageType.VOTE, index=last, log_term=term, force=True)),
        f"a pre-vote request to {leader}": forger(cluster, leader).post_messages(
            to(leader, MessageType.PREVOTE, index=last, log_term=term)),
    }
    for what, answer in answers.items():
        findings.expect(answer.status in NON_MEMBER_ANSWERS, f"{what} from the non-member "
                        f"mallory was answered {answer}, not one of {NON_MEMBER_ANSWERS}")
    with forger(cluster, second).stream("mallory") as stream:
        if stream.status == 101:
            stream.send(to(second, MessageType.APPEND, commit=last))
            stream.closed_within(0.5)
    time.sleep(1.0)

    after = {n: (keeper.status(n) or {}).get("term") for n in cluster.members}
    findings.expect(after == before, f"terms moved on messages from a non-member: {before} -> "
                    f"{after}")
    findings.expect(leader_within(cluster, 2) == leader, f"{leader} no longer leads after "
                    "messages from a non-member")
    nothing_reached(findings, listeners)
    for name in cluster.members:
        series = metric_lines_naming(cluster, name, "mallory")
        findings.expect(series == [], f"{name}'s /metrics names the non-member: {series}")
    keeper.check_serving(findings, "messages from a non-member")
    keeper.check_no_tracebacks(findings)
    findings.check()
