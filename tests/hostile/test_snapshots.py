"""A junk snapshot streamed in the leader's name.

The review streamed garbage to a member's snapshot route: the member stored it, installed it,
failed, and then exited 1 on every restart (its newest snapshot file could not be restored). A
received snapshot must be restored into a fresh machine and verified before it replaces
anything, so a bad one is refused (a 4xx) and the member goes on with what it had, and starts
normally after SIGTERM. The header is valid and names the real leader with a higher term; the
payloads are garbage, a kv snapshot cut short, and a whole snapshot file (header, kv payload,
trailer) whose checksums are wrong.
"""

from __future__ import annotations

import io
import random
import struct
import time

from flotilla.node.consensus import Membership, SnapshotMeta
from flotilla.node.statemachine.kv import KVStateMachine, encode_put
from flotilla.node.storage.snapshots import encode_header

from tests.harness.forger import MessageType, message, snapshot_meta
from tests.harness.kvclient import TRANSPORT_ERRORS
from tests.hostile.support import (
    UNAVAILABILITY_BOUND_S,
    Findings,
    brief,
    followers,
    forger,
    in_name_of,
    leader_within,
)

KEY, VALUE = "hostile/before-the-snapshot", b"kept through junk snapshots"


def kv_payload(keys: int) -> bytes:
    """A real kv snapshot payload, as a leader streams it."""
    machine = KVStateMachine()
    for i in range(keys):
        machine.apply(i + 1, encode_put(f"planted/{i}", b"intruder's value", ts=1))
    out = io.BytesIO()
    machine.write_snapshot(out)
    return out.getvalue()


def file_with_bad_checksums(meta: SnapshotMeta) -> bytes:
    """A snapshot file as the store writes it, but whose trailer's checksums are wrong."""
    payload = kv_payload(3)
    return (encode_header(meta, "kv", len(payload)) + payload
            + struct.pack("<II8s", 0xDEADBEEF, 0xDEADBEEF, b"FLOTSEND"))


def test_junk_snapshots_are_refused_and_the_member_keeps_running_and_restarts(cluster, keeper):
    findings = Findings()
    leader = cluster.wait_leader(10)
    victim = followers(cluster, leader)[0]
    with keeper.client(leader) as c:
        written = c.put(KEY, VALUE)
    assert written.status == 200, written
    assert keeper.caught_up(victim, written.index, 5), f"{victim} did not apply the write"
    st = keeper.status(victim)
    term, index = st["term"] + 1, st["commit_index"] + 50
    voters = st["config"]["voters"]
    addresses = {n: cluster.peer_url(n) for n in voters}
    header = in_name_of(cluster, leader, [message(
        MessageType.SNAPSHOT, victim, leader, term,
        snapshot=snapshot_meta(index, term, voters, addresses))])
    meta = SnapshotMeta(index, term, Membership(frozenset(voters)))
    payloads = {
        "garbage": random.Random(14).randbytes(256 << 10),
        "a kv snapshot cut short": kv_payload(50)[:-7],
        "a snapshot file with wrong checksums": file_with_bad_checksums(meta),
    }
    at_victim = forger(cluster, victim)
    for what, payload in payloads.items():
        answer = at_victim.post_snapshot(header, payload)
        findings.expect(answer.status is not None and 400 <= answer.status < 500,
                        f"{victim} answered {what} on /raft/v1/snapshot with {answer}, not a 4xx")
        time.sleep(0.3)  # an install that fails would end the member about now
        findings.expect(cluster.nodes[victim].running, f"{victim} exited with "
                        f"{cluster.nodes[victim].returncode} after {what}")
    keeper.check_serving(findings, "junk snapshots")

    node = cluster.nodes[victim]
    running = node.running
    code = node.terminate()
    findings.expect(code == 0, f"{victim} exited {code} on SIGTERM after the junk snapshots, "
                    "not 0" if running else f"{victim} had exited {code} by itself")
    node.start()
    try:
        node.wait_serving(15)
    except (RuntimeError, TimeoutError) as exc:
        findings.expect(False, f"{victim} did not start again after the junk snapshots: "
                        f"{str(exc).splitlines()[0]}")
    if findings.expect(leader_within(cluster, UNAVAILABILITY_BOUND_S) is not None,
                       f"no leader within {UNAVAILABILITY_BOUND_S}s of {victim} restarting"):
        try:
            with keeper.client(victim) as c:
                got = c.get(KEY, consistency="serializable")
            kept, said = got.status == 200 and got.body == VALUE, brief(got)
        except TRANSPORT_ERRORS as exc:
            kept, said = False, f"no answer ({type(exc).__name__}: {exc})"
        findings.expect(kept, f"{victim} after its restart serves {said} for {KEY!r}, not "
                        f"200 {VALUE!r}")
    keeper.check_serving(findings, "junk snapshots and a restart")
    keeper.check_no_tracebacks(findings)
    findings.check()
