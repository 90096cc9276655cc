"""Bad input on the peer port of a real 3-member cluster: another cluster's batches, garbage,
truncated and misshapen msgpack, an enormous Content-Length, raw bytes that are not HTTP.
Garbage is sent as a member would send it (the cluster id and sender in the headers, in the
name of member SENDER), so it reaches the decoder; what a non-member sends is refused before
(see tests/hostile).

Each must be refused with a 4xx JSON error (or, for what is not HTTP at all, a 400 from the
parser), the refusal must be logged with its reason, and afterwards the leader and its term
must be unchanged and the cluster must serve with its data intact (``Canary``). The last
tests check the decoder itself, without processes.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import msgpack
import pytest
from flotilla.node import transport as node_transport
from flotilla.node.consensus import (
    Entry,
    Membership,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)
from flotilla.node.wire import VERSION, WireError, decode_batch, encode_batch

from tests.node.badinput import (
    address,
    parse_raw,
    raw_error,
    raw_exchange,
    raw_exchanges,
)

MESSAGES = node_transport.MESSAGES_PATH
SNAPSHOT = node_transport.SNAPSHOT_PATH
HUGE_TERM = 10**9
#: Garbage is sent in this member's name to the other members.
SENDER = "n2"




@pytest.fixture
def unharmed(cluster, canary):
    """The leader and term before the test must be the leader and term after it, and the
    cluster must still serve everything written before."""
    leader = cluster.wait_leader(30)
    term = cluster.status(leader)["term"]
    yield leader
    assert cluster.wait_leader(30) == leader
    for member in cluster.members:
        status = cluster.status(member)
        assert (status["term"], status["leader"]) == (term, leader), status
    canary.check()


def post(url: str, body: bytes, headers: dict | None = None, method: str = "POST",
         cluster_id: str | None = None, sender: str = SENDER) -> tuple[int, dict, bytes]:
    """`body` to `url`; with `cluster_id`, with the headers a peer sends (its cluster id and
    its name)."""
    if cluster_id is not None:
        headers = {node_transport.CLUSTER_HEADER: cluster_id,
                   node_transport.SENDER_HEADER: sender, **(headers or {})}
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def assert_peer_error(answer, status: int, code: str, says: str = "") -> dict:
    got, headers, body = answer
    assert got == status, (got, body[:300])
    assert headers.get("Content-Type", "").startswith("application/json"), (headers, body)
    doc = json.loads(body)
    assert isinstance(doc.get("error"), str) and doc.get("code") == code, doc
    assert says in doc["error"], doc
    return doc


def disruptive(to: str, sender: str = "intruder") -> list[Message]:
    """Messages that would depose any leader if a member took them: a forced vote request and
    a leadership hand-over, both in a far-away term."""
    return [
        Message(MessageType.VOTE, to=to, frm=sender, term=HUGE_TERM, log_term=HUGE_TERM,
                index=HUGE_TERM, force=True),
        Message(MessageType.TIMEOUT_NOW, to=to, frm=sender, term=HUGE_TERM),
    ]


def log_text(cluster, member: str) -> str:
    return cluster.nodes[member].log_path.read_text(errors="replace")


def wait_log(cluster, member: str, *words: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        text = log_text(cluster, member)
        if all(w in text for w in words):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{member}'s log never said {words}:\n{text[-3000:]}")
        time.sleep(0.1)


# --- another cluster ------------------------------------------------------------------------------

def test_a_batch_of_another_cluster_is_refused_and_logged(cluster, unharmed):
    for member in cluster.members:
        body = encode_batch("someone-elses-cluster", "intruder", "http://127.0.0.1:1",
                            "http://127.0.0.1:2", disruptive(member))
        for _ in range(3):  # retried like a misconfigured peer would; logged once
            answer = post(cluster.peer_url(member) + MESSAGES, body,
                          cluster_id="someone-elses-cluster", sender="intruder")
            doc = assert_peer_error(answer, 403, "wrong_cluster", "someone-elses-cluster")
            assert cluster.cluster_id in doc["error"]
        wait_log(cluster, member, "refused a peer request from intruder",
                 "someone-elses-cluster")
        assert log_text(cluster, member).count("'someone-elses-cluster'") == 1


@pytest.mark.skipif(not hasattr(node_transport, "STREAM_PATH"), reason="no peer stream route")
def test_a_stream_of_another_cluster_is_refused(cluster, unharmed):
    for member in cluster.members:
        url = cluster.peer_url(member) + node_transport.STREAM_PATH
        answer = post(url, None, method="GET",
                      headers={node_transport.CLUSTER_HEADER: "someone-elses-cluster"})
        assert_peer_error(answer, 403, "wrong_cluster", "someone-elses-cluster")
        # The right cluster id, but not a WebSocket handshake: a JSON 400, not a 500.
        answer = post(url, None, method="GET",
                      headers={node_transport.CLUSTER_HEADER: cluster.cluster_id})
        assert 400 <= answer[0] < 500, answer
        assert answer[1].get("Content-Type", "").startswith("application/json"), answer


def test_a_snapshot_of_another_cluster_is_refused(cluster, unharmed):
    for member in cluster.members:
        meta = SnapshotMeta(HUGE_TERM, HUGE_TERM, Membership(voters=frozenset({"intruder"})))
        m = Message(MessageType.SNAPSHOT, to=member, frm="intruder", term=HUGE_TERM,
                    snapshot=Snapshot(meta))
        header = encode_batch("someone-elses-cluster", "intruder", "http://127.0.0.1:1",
                              "http://127.0.0.1:2", [m]).hex()
        answer = post(cluster.peer_url(member) + SNAPSHOT, b"payload",
                      headers={"Flotilla-Message": header},
                      cluster_id="someone-elses-cluster", sender="intruder")
        assert_peer_error(answer, 403, "wrong_cluster", "someone-elses-cluster")


# --- garbage with or without the right cluster id ----------------------------------------------

def _batch(cluster, member, messages) -> bytes:
    return encode_batch(cluster.cluster_id, SENDER, "http://127.0.0.1:1",
                        "http://127.0.0.1:2", messages)


def _raw_batch(cluster, *messages) -> bytes:
    return msgpack.packb([VERSION, cluster.cluster_id, SENDER, "http://127.0.0.1:1",
                          "http://127.0.0.1:2", list(messages)], use_bin_type=True)


def _raw_message(kind=int(MessageType.APPEND), to="n0", frm=SENDER, term=HUGE_TERM,
                 log_term=0, index=0, entries=(), snap=None):
    return [kind, to, frm, term, log_term, index, list(entries), 0, False, 0, 0, snap, None,
            False]


GARBAGE = {
    "empty": lambda cluster, m: b"",
    "random": lambda cluster, m: bytes((i * 7919 + 13) % 256 for i in range(4096)),
    "json": lambda cluster, m: json.dumps({"messages": []}).encode(),
    "truncated": lambda cluster, m: _batch(cluster, m, disruptive(m))[:-7],
    "trailing-bytes": lambda cluster, m: _batch(cluster, m, disruptive(m)) + b"\x00",
    "not-a-list": lambda cluster, m: msgpack.packb({"cluster": cluster.cluster_id}),
    "wrong-version": lambda cluster, m: msgpack.packb(
        [VERSION + 1, cluster.cluster_id, SENDER, "", "", []]),
    "int-header": lambda cluster, m: msgpack.packb([VERSION, cluster.cluster_id, 5, "", "", []]),
    "unknown-type": lambda cluster, m: _raw_batch(cluster, _raw_message(kind=99, to=m)),
    "negative-term": lambda cluster, m: _raw_batch(cluster, _raw_message(to=m, term=-1)),
    "float-index": lambda cluster, m: _raw_batch(cluster, _raw_message(to=m, index=1.5)),
    "other-sender": lambda cluster, m: _raw_batch(cluster, _raw_message(to=m, frm="n1")),
    # A valid, disruptive message followed by a broken one: the batch is refused whole.
    "valid-then-broken": lambda cluster, m: _raw_batch(
        cluster, _raw_message(kind=int(MessageType.TIMEOUT_NOW), to=m), [1, 2, 3]),
    "entry-not-bytes": lambda cluster, m: _raw_batch(
        cluster, _raw_message(to=m, entries=[[1, 1, 0, "text"]])),
    "entry-kind": lambda cluster, m: _raw_batch(
        cluster, _raw_message(to=m, entries=[[1, 1, 77, b"x"]])),
    "entries-with-a-gap": lambda cluster, m: _raw_batch(
        cluster, _raw_message(to=m, entries=[[1, 1, 0, b"x"], [3, 1, 0, b"y"]])),
    "entry-from-the-future": lambda cluster, m: _raw_batch(
        cluster, _raw_message(to=m, term=1, entries=[[1, 2, 0, b"x"]])),
    "snapshot-in-a-batch": lambda cluster, m: _raw_batch(cluster, _raw_message(
        kind=int(MessageType.SNAPSHOT), to=m,
        snap=[HUGE_TERM, HUGE_TERM, Membership(voters=frozenset({m})).encode()])),
    "membership-a-list": lambda cluster, m: _raw_batch(cluster, _raw_message(
        kind=int(MessageType.SNAPSHOT), to=m, snap=[5, 1, b"[1, 2]"])),
    "membership-not-json": lambda cluster, m: _raw_batch(cluster, _raw_message(
        kind=int(MessageType.SNAPSHOT), to=m, snap=[5, 1, b"\xff{"])),
    "deep-nesting": lambda cluster, m: b"\x91" * 5000 + b"\xc0",
}


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_garbage_batches_are_400_and_harm_nothing(cluster, unharmed, name):
    for member in cluster.members:
        if member == SENDER:
            continue
        body = GARBAGE[name](cluster, member)
        answer = post(cluster.peer_url(member) + MESSAGES, body, cluster_id=cluster.cluster_id)
        assert_peer_error(answer, 400, "bad_message")
    wait_log(cluster, cluster.members[0], "refused a peer request from")


def test_a_snapshot_route_without_a_valid_message_is_400(cluster, unharmed):
    for member in cluster.members:
        if member == SENDER:
            continue
        url = cluster.peer_url(member) + SNAPSHOT
        ours = cluster.cluster_id
        assert_peer_error(post(url, b"x", cluster_id=ours), 400, "bad_message")
        assert_peer_error(post(url, b"x", {"Flotilla-Message": "zz"}, cluster_id=ours), 400,
                          "bad_message")
        not_a_snapshot = _batch(cluster, member, disruptive(member, SENDER)[:1]).hex()
        assert_peer_error(post(url, b"x", {"Flotilla-Message": not_a_snapshot},
                               cluster_id=ours), 400, "bad_message")
        meta = SnapshotMeta(HUGE_TERM, HUGE_TERM, Membership(voters=frozenset({SENDER})))
        elsewhere = Message(MessageType.SNAPSHOT, to="someone-else", frm=SENDER,
                            term=HUGE_TERM, snapshot=Snapshot(meta))
        header = _batch(cluster, member, [elsewhere]).hex()
        assert_peer_error(post(url, b"x", {"Flotilla-Message": header}, cluster_id=ours), 400,
                          "bad_message", "someone-else")


def test_an_enormous_content_length_is_413_before_the_body(cluster, unharmed):
    for member in cluster.members:
        if member == SENDER:
            continue
        host, port = address(cluster.peer_url(member))
        started = time.monotonic()
        answer = raw_exchange(host, port, (
            f"POST {MESSAGES} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {1 << 40}\r\n"
            f"{node_transport.CLUSTER_HEADER}: {cluster.cluster_id}\r\n"
            f"{node_transport.SENDER_HEADER}: {SENDER}\r\n\r\n"
        ).encode() + b"\x96\x01", timeout=10)
        assert time.monotonic() - started < 5, "the member waited for the declared body"
        raw_error(answer, 413, "too_large")


@pytest.mark.parametrize("method,path,status", [
    ("GET", MESSAGES, 405), ("PUT", MESSAGES, 405), ("GET", SNAPSHOT, 405),
    ("GET", "/", 404), ("GET", "/v1/status", 404), ("PUT", "/v1/kv/x", 404),
    ("GET", "/raft/v2/messages", 404),
])
def test_unknown_routes_and_methods_on_the_peer_port_are_json(cluster, unharmed, method, path,
                                                               status):
    for member in cluster.members:
        answer = post(cluster.peer_url(member) + path, b"" if method != "GET" else None,
                      method=method)
        code = "method_not_allowed" if status == 405 else "not_found"
        assert_peer_error(answer, status, code, path)
        if status == 405:
            assert "POST" in answer[1].get("Allow", ""), answer[1]


@pytest.mark.parametrize("junk", [
    b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(60),
    bytes((i * 31 + 7) % 256 for i in range(2048)),
    b"SSH-2.0-OpenSSH_9.0\r\n",
    b"\r\n\r\n\r\n",
    b"POST /raft/v1/messages HTTP/1.1\r\nHost: h\r\nContent-Length: -5\r\n\r\n",
    b"POST /raft/v1/messages HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"fffffffffffffffffffff\r\n",
], ids=["tls-hello", "binary", "ssh", "blank-lines", "negative-length", "huge-chunk"])
def test_raw_bytes_on_the_peer_port_are_refused(cluster, unharmed, junk):
    # Every member at once: a member may keep a connection that never completes a request.
    exchanges = [(*address(cluster.peer_url(member)), junk) for member in cluster.members]
    for answer in raw_exchanges(exchanges, timeout=3, read_until_close=True):
        if answer:
            assert parse_raw(answer)[0] == 400, answer[:300]


# --- the decoder on its own -------------------------------------------------------------------

def test_the_decoder_round_trips_what_the_transport_sends():
    m = Message(MessageType.APPEND, to="b", frm="a", term=3, log_term=2, index=4,
                entries=[Entry(5, 2, 0, b"x", 1_800_000_000_000), Entry(6, 3, 2, b"", 2**62)],
                commit=5, context=7)
    batch = decode_batch(encode_batch("c", "a", "http://a:1", "http://a:2", [m]))
    assert (batch.cluster_id, batch.sender) == ("c", "a")
    got = batch.messages[0]
    assert (got.type, got.index, got.commit, got.context) == (MessageType.APPEND, 4, 5, 7)
    assert list(got.entries) == list(m.entries)  # times included: followers keep the stamp


def test_the_decoder_takes_entries_and_snapshots_of_the_first_release_with_time_zero():
    """Members of the first release send no times; a cluster is upgraded one member at a
    time, so what they send is still taken, as unknown time."""
    membership = Membership(voters=frozenset({"a", "b"}))
    body = msgpack.packb([VERSION, "c", "a", "", "", [
        _raw_message(to="b", frm="a", term=3, log_term=2, index=4,
                     entries=[[5, 2, 0, b"x"], [6, 3, 0, b"y"]]),
        _raw_message(kind=int(MessageType.SNAPSHOT), to="b", frm="a", term=3,
                     snap=[9, 2, membership.encode()])]], use_bin_type=True)
    append, snapshot = decode_batch(body, snapshot=True).messages
    assert list(append.entries) == [Entry(5, 2, 0, b"x", 0), Entry(6, 3, 0, b"y", 0)]
    assert snapshot.snapshot.meta == SnapshotMeta(9, 2, membership, 0)


@pytest.mark.parametrize("entry", [[5, 2, 0, b"x", -1], [5, 2, 0, b"x", 1.5],
                                   [5, 2, 0, b"x", "now"], [5, 2, 0, b"x", 7, 8]],
                         ids=["negative", "float", "text", "six-fields"])
def test_the_decoder_refuses_an_entry_with_a_bad_time(entry):
    body = msgpack.packb([VERSION, "c", "a", "", "", [
        _raw_message(to="b", frm="a", term=3, log_term=2, index=4, entries=[entry])]],
        use_bin_type=True)
    with pytest.raises(WireError):
        decode_batch(body)


def test_the_decoder_takes_a_snapshot_message_only_on_the_snapshot_route():
    meta = SnapshotMeta(9, 2, Membership(voters=frozenset({"a", "b"}),
                                         addresses=(("a", "http://a:1"),)), 1_800_000_000_123)
    m = Message(MessageType.SNAPSHOT, to="b", frm="a", term=2, snapshot=Snapshot(meta))
    body = encode_batch("c", "a", "http://a:1", "http://a:2", [m])
    with pytest.raises(WireError, match="snapshot"):
        decode_batch(body)
    got = decode_batch(body, snapshot=True).messages[0]
    assert got.snapshot.meta == meta


@pytest.mark.parametrize("membership", [b"[]", b"{}", b'{"voters": 3}', b'{"voters": [1]}',
                                        b'{"voters": ["a"], "addresses": [1]}',
                                        b'{"voters": ["a"], "addresses": {"a": 1}}',
                                        b"[" * 10000, b"\xff"])
def test_the_decoder_refuses_a_bad_snapshot_membership(membership):
    body = msgpack.packb([VERSION, "c", "a", "", "", [_raw_message(
        kind=int(MessageType.SNAPSHOT), to="b", frm="a", snap=[5, 1, membership])]],
        use_bin_type=True)
    with pytest.raises(WireError):
        decode_batch(body, snapshot=True)


@pytest.mark.parametrize("field", ["term", "log_term", "index"])
def test_the_decoder_refuses_values_of_2_to_the_63_or_more(field):
    fine = _raw_message(to="n0", **{field: (1 << 63) - 1})
    if field != "term":
        fine[3] = (1 << 63) - 1  # an entry-less append's term bounds nothing else
    decode_batch(msgpack.packb([VERSION, "c", SENDER, "", "", [fine]], use_bin_type=True))
    for value in (1 << 63, (1 << 64) - 1):
        bad = _raw_message(to="n0", **{field: value})
        with pytest.raises(WireError, match="2\\^63"):
            decode_batch(msgpack.packb([VERSION, "c", SENDER, "", "", [bad]],
                                       use_bin_type=True))


def test_the_decoder_refuses_a_batch_of_too_many_messages():
    from flotilla.node.wire import MAX_MESSAGES

    one = _raw_message(kind=int(MessageType.HEARTBEAT), to="n0")
    ok = msgpack.packb([VERSION, "c", SENDER, "", "", [one] * MAX_MESSAGES], use_bin_type=True)
    assert len(decode_batch(ok).messages) == MAX_MESSAGES
    over = msgpack.packb([VERSION, "c", SENDER, "", "", [one] * (MAX_MESSAGES + 1)],
                         use_bin_type=True)
    with pytest.raises(WireError, match="at most"):
        decode_batch(over)


def test_the_sender_splits_what_it_sends_into_frames_the_receiver_takes():
    from flotilla.node.transport import PeerTransport
    from flotilla.node.wire import MAX_MESSAGES

    transport = PeerTransport("n1", "c", "http://p", "http://c", on_unreachable=print,
                              on_snapshot_sent=print, snapshot_source=lambda m: None,
                              frame_entry_bytes=1000)
    big = [Message(MessageType.APPEND, to="n0", frm="n1", term=1, index=i, log_term=1,
                   entries=[Entry(i + 1, 1, 0, bytes(300))]) for i in range(10)]
    beats = [Message(MessageType.HEARTBEAT, to="n0", frm="n1", term=1, entries=[])] * (
        MAX_MESSAGES + 5)
    frames = transport._frames(big + beats)
    decoded = [decode_batch(f) for f in frames]
    assert [m for b in decoded for m in b.messages] == big + beats  # all of it, in order
    assert all(sum(len(e.data) for m in b.messages for e in m.entries) <= 1000
               for b in decoded)
    assert all(len(b.messages) <= MAX_MESSAGES for b in decoded)
