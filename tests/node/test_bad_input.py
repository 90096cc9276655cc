"""Bad input on the client and admin API of a real 3-member cluster (docs/contract.md: "a bad
request never harms a member or its data").

Every bad request must be answered with the contract's JSON error (status, a code word and a
sentence that says what is wrong), and afterwards the cluster must still serve (a put and a
linearizable get work) with everything written before intact (``Canary``). One cluster serves
the whole module.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from urllib.parse import quote

import pytest

from tests.harness import ports
from tests.node.badinput import (
    MIB,
    address,
    assert_error,
    leader_client,
    parse_raw,
    raw_error,
    raw_exchange,
    raw_exchanges,
)

JSON = {"Content-Type": "application/json"}




@pytest.fixture(scope="module")
def unused_peer_url():
    """A peer URL nobody listens on: a learner there never catches up."""
    port = ports.allocate_ports(1)[0]
    yield f"http://127.0.0.1:{port}"
    ports.release_port(port)


def follower_of(cluster) -> str:
    leader = cluster.wait_leader(30)
    return next(m for m in cluster.members if m != leader)


# --- malformed admin bodies -------------------------------------------------------------------

NOT_JSON = [b"{not json", b'{"name": "x",}', b"\xff\xfe\x00", b"[" * 100_000, b"nul\x00l"]


@pytest.mark.parametrize("method,path", [("POST", "/v1/members"), ("PUT", "/v1/config"),
                                         ("POST", "/v1/leader")])
@pytest.mark.parametrize("body", NOT_JSON, ids=["brace", "trailing-comma", "binary",
                                                 "deep-nesting", "nul"])
def test_a_body_that_is_not_json_is_400(cluster, canary, method, path, body):
    for member in (cluster.wait_leader(30), follower_of(cluster)):
        with cluster.client(member) as c:
            resp = c.request(method, path, body, headers=JSON)
        assert_error(resp, 400, "bad_request", "JSON")
    canary.check(f"{method} {path} {body[:10]!r}")


WRONG_SHAPES = [
    ("POST", "/v1/members", [], "JSON object"),
    ("POST", "/v1/members", "n9", "JSON object"),
    ("POST", "/v1/members", None, "JSON object"),
    ("POST", "/v1/members", {}, "name"),
    ("POST", "/v1/members", {"name": 7, "peer_url": "http://127.0.0.1:1"}, "name"),
    ("POST", "/v1/members", {"name": ["n9"], "peer_url": "http://127.0.0.1:1"}, "name"),
    ("POST", "/v1/members", {"name": "n9"}, "peer_url"),
    ("POST", "/v1/members", {"name": "n9", "peer_url": 5}, "peer_url"),
    ("POST", "/v1/members", {"name": "n9", "peer_url": "not a url"}, "peer_url"),
    ("POST", "/v1/members", {"name": "n9", "peer_url": "ftp://127.0.0.1:1"}, "peer_url"),
    ("POST", "/v1/members", {"name": "n9", "peer_url": "http://"}, "peer_url"),
    ("POST", "/v1/members", {"name": "n9", "peer_url": "http://h:99999"}, "peer_url"),
    ("POST", "/v1/members", {"name": "n9", "peer_url": "http://127.0.0.1:1",
                             "client_url": 3}, "client_url"),
    ("POST", "/v1/members", {"name": "n9", "peer_url": "http://127.0.0.1:1",
                             "client_url": "nowhere"}, "client_url"),
    ("PUT", "/v1/config", [], "JSON object"),
    ("PUT", "/v1/config", ["n0", "n1"], "JSON object"),
    ("PUT", "/v1/config", {}, "voters"),
    ("PUT", "/v1/config", {"voters": "n0,n1,n2"}, "voters"),
    ("PUT", "/v1/config", {"voters": []}, "voters"),
    ("PUT", "/v1/config", {"voters": [0, 1, 2]}, "voters"),
    ("PUT", "/v1/config", {"voters": ["n0", None]}, "voters"),
    ("PUT", "/v1/config", {"voters": ["n0", ""]}, "voters"),
    ("PUT", "/v1/config", {"voters": {"n0": True}}, "voters"),
    ("POST", "/v1/leader", [], "JSON object"),
    ("POST", "/v1/leader", {}, "name"),
    ("POST", "/v1/leader", {"name": 1}, "name"),
    ("POST", "/v1/leader", {"name": ""}, "name"),
    ("POST", "/v1/leader", {"name": ["n0"]}, "name"),
]


@pytest.mark.parametrize("method,path,doc,says", WRONG_SHAPES)
def test_json_of_the_wrong_shape_is_400(cluster, canary, method, path, doc, says):
    with leader_client(cluster) as c:
        assert_error(c.post_json(path, doc, method=method), 400, "bad_request", says)
    with cluster.client(follower_of(cluster)) as c:  # refused before it is forwarded, too
        assert_error(c.post_json(path, doc, method=method), 400, "bad_request", says)
    canary.check(f"{method} {path} {doc!r}")
    status = cluster.status(cluster.wait_leader(30))
    assert sorted(status["config"]["voters"]) == cluster.members
    assert status["config"]["learners"] == [] and status["config"]["joint"] is None


def test_a_json_body_without_a_json_content_type_is_read_all_the_same(cluster, canary):
    leader = cluster.wait_leader(30)
    with cluster.client(leader) as c:
        for ctype in ("text/plain", "application/x-www-form-urlencoded", None):
            headers = {} if ctype is None else {"Content-Type": ctype}
            resp = c.request("POST", "/v1/leader", json.dumps({"name": leader}).encode(),
                             headers=headers)
            assert resp.status == 200, resp.body  # a transfer to the leader itself: a no-op
            assert resp.json()["leader"] == leader
    canary.check("content types")


# --- query parameters and session headers ------------------------------------------------------

@pytest.mark.parametrize("prev", ["abc", "-1", "1.5", "", " 1", "0x10", "1e3", "\u00b2",
                                  "\u0663", str(1 << 63), "9" * 40])
def test_a_bad_prev_index_is_400_and_writes_nothing(cluster, canary, prev):
    key = f"cas/{canary.prefix}{len(canary.written)}"
    for member in cluster.members:
        with cluster.client(member) as c:
            resp = c.request("PUT", "/v1/kv/" + quote(key), b"x", query={"prev_index": prev})
            assert_error(resp, 400, "bad_request", "prev_index")
            assert c.get(key).status == 404
    canary.check(f"prev_index={prev!r}")


def test_prev_index_given_twice_is_400(cluster, canary):
    with leader_client(cluster) as c:
        resp = c.request("PUT", "/v1/kv/cas-twice?prev_index=0&prev_index=0", b"x")
        assert_error(resp, 400, "bad_request", "prev_index")
        assert c.get("cas-twice").status == 404
    canary.check("prev_index twice")


@pytest.mark.parametrize("path", ["/v1/kv/some-key", "/v1/kv"])
@pytest.mark.parametrize("consistency", ["strong", "LINEARIZABLE", "", "serializable\x00"])
def test_a_bad_consistency_is_400(cluster, canary, path, consistency):
    for member in cluster.members:
        with cluster.client(member) as c:
            resp = c.request("GET", path, query={"consistency": consistency})
            assert_error(resp, 400, "bad_request", "consistency")
    canary.check(f"consistency={consistency!r}")


@pytest.mark.parametrize("limit", ["0", "-1", "x", "", "2.5", "\u00b2", str(1 << 63), "9" * 30])
def test_a_bad_limit_is_400(cluster, canary, limit):
    for member in cluster.members:
        with cluster.client(member) as c:
            resp = c.request("GET", "/v1/kv", query={"prefix": "", "limit": limit})
            assert_error(resp, 400, "bad_request", "limit")
    canary.check(f"limit={limit!r}")


@pytest.mark.parametrize("headers,says", [
    ({"Flotilla-Client": "c1"}, "Flotilla-Seq"),
    ({"Flotilla-Seq": "1"}, "Flotilla-Client"),
    ({"Flotilla-Client": "", "Flotilla-Seq": "1"}, "Flotilla-Client"),
    ({"Flotilla-Client": "c1", "Flotilla-Seq": "0"}, "Flotilla-Seq"),
    ({"Flotilla-Client": "c1", "Flotilla-Seq": "-4"}, "Flotilla-Seq"),
    ({"Flotilla-Client": "c1", "Flotilla-Seq": "one"}, "Flotilla-Seq"),
    ({"Flotilla-Client": "c1", "Flotilla-Seq": "\u00b2"}, "Flotilla-Seq"),  # latin-1 0xb2
    ({"Flotilla-Client": "c1", "Flotilla-Seq": str(1 << 64)}, "Flotilla-Seq"),
])
def test_bad_session_headers_are_400_and_write_nothing(cluster, canary, headers, says):
    for method in ("PUT", "DELETE"):
        with leader_client(cluster) as c:
            resp = c.request(method, "/v1/kv/session-key", b"x" if method == "PUT" else None,
                             headers=headers)
            assert_error(resp, 400, "bad_request", says)
            assert c.get("session-key").status == 404
    canary.check(f"session {headers}")


# --- value size ----------------------------------------------------------------------------------

def test_a_value_of_exactly_the_limit_is_accepted_through_any_member(cluster, canary):
    value = bytes(range(256)) * (MIB // 256)
    assert len(value) == MIB
    for member in cluster.members:  # the leader, and followers that forward it
        with cluster.client(member, timeout=20) as c:
            put = c.put(f"big/{member}", value)
            assert put.status == 200, put.body[:300]
            got = c.get(f"big/{member}")
            assert got.status == 200 and got.body == value
    canary.check("1 MiB values")


@pytest.mark.parametrize("size", [MIB + 1, 2 * MIB])
def test_a_value_over_the_limit_is_413_through_any_member(cluster, canary, size):
    for member in cluster.members:
        with cluster.client(member, timeout=20) as c:
            resp = c.put(f"too-big/{size}", b"v" * size)
            assert_error(resp, 413, "too_large", [str(MIB), "limit"])
            assert c.get(f"too-big/{size}").status == 404
    canary.check(f"{size} bytes")


def test_a_chunked_value_over_the_limit_is_413(cluster, canary):
    host, port = address(cluster.nodes[follower_of(cluster)].url)
    conn = http.client.HTTPConnection(host, port, timeout=20)
    try:
        conn.request("PUT", "/v1/kv/too-big-chunked",
                     body=iter([b"c" * (256 << 10)] * 8), encode_chunked=True)
        answer = conn.getresponse()
        body = answer.read()
    finally:
        conn.close()
    assert answer.status == 413, body
    assert json.loads(body)["code"] == "too_large"
    with leader_client(cluster) as c:
        assert c.get("too-big-chunked").status == 404
    canary.check("chunked 2 MiB")


@pytest.mark.parametrize("path", ["/v1/kv/huge-declared", "/v1/members"])
def test_an_enormous_content_length_is_refused_before_the_body(cluster, canary, path):
    method = "PUT" if path.startswith("/v1/kv") else "POST"
    for member in cluster.members:
        host, port = address(cluster.nodes[member].url)
        started = time.monotonic()
        answer = raw_exchange(host, port, (
            f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n"
            f"Content-Length: {1 << 40}\r\n\r\n").encode() + b"only a few bytes", timeout=10)
        assert time.monotonic() - started < 5, "the member waited for the declared body"
        doc = raw_error(answer, 413, "too_large")
        assert str(MIB) in doc["error"]
    canary.check("Content-Length 1 TiB")


@pytest.mark.parametrize("path", ["/v1/kv/expect-too-big", "/v1/members"])
def test_an_oversized_body_announced_with_expect_100_continue_is_413_without_inviting_it(
        cluster, canary, path):
    """`Expect: 100-continue` (what curl sends for a large body): the refusal comes instead of
    `100 Continue`, so the client never sends the body, and the connection is closed."""
    method = "PUT" if path.startswith("/v1/kv") else "POST"
    exchanges = []
    for member in cluster.members:
        host, port = address(cluster.nodes[member].url)
        exchanges.append((host, port, (
            f"{method} {path} HTTP/1.1\r\nHost: {host}\r\nExpect: 100-continue\r\n"
            f"Content-Length: {2 * MIB}\r\n\r\n").encode()))
    # Every member at once: each one lingers a moment before it closes the connection.
    for answer in raw_exchanges(exchanges, timeout=10, read_until_close=True):
        assert not answer.startswith(b"HTTP/1.1 100"), answer[:200]
        doc = raw_error(answer, 413, "too_large")
        assert str(2 * MIB) in doc["error"] and str(MIB) in doc["error"]
        assert parse_raw(answer)[1].get("connection", "").lower() == "close"
    with leader_client(cluster) as c:
        assert c.get("expect-too-big").status == 404
    canary.check("Expect: 100-continue with 2 MiB")


def test_a_body_within_the_limit_announced_with_expect_100_continue_is_invited(cluster,
                                                                               canary):
    value = b"e" * 1000
    for member in cluster.members:  # the leader, and followers that forward it
        host, port = address(cluster.nodes[member].url)
        with socket.create_connection((host, port), timeout=20) as sock:
            sock.sendall((f"PUT /v1/kv/expect/{member} HTTP/1.1\r\nHost: {host}\r\n"
                          "Expect: 100-continue\r\nConnection: close\r\n"
                          f"Content-Length: {len(value)}\r\n\r\n").encode())
            interim = b""
            while not interim.endswith(b"\r\n\r\n"):
                chunk = sock.recv(1)
                assert chunk, interim
                interim += chunk
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(value)
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert parse_raw(answer)[0] == 200, answer[:300]
        with cluster.client(member, timeout=20) as c:
            assert c.get(f"expect/{member}").body == value
    canary.check("Expect: 100-continue within the limit")


def test_an_unknown_expectation_is_417_json(cluster, canary):
    host, port = address(cluster.nodes[cluster.members[0]].url)
    answer = raw_exchange(host, port, (
        f"PUT /v1/kv/expect-odd HTTP/1.1\r\nHost: {host}\r\nExpect: 200-ok\r\n"
        "Content-Length: 1\r\n\r\nx").encode(), timeout=10)
    raw_error(answer, 417, "expectation_failed")
    canary.check("Expect: 200-ok")


def test_concurrent_snapshot_requests_never_fail_with_500(cluster, canary):
    with leader_client(cluster) as c:  # a few MiB of state, so that snapshots take a while
        for i in range(4):
            assert c.put(f"bulk/{i}", bytes([i]) * MIB).status == 200
    answers: list = []

    def snapshot(member):
        with cluster.client(member, timeout=30) as c:
            answers.append(c.request("POST", "/v1/snapshot"))

    threads = [threading.Thread(target=snapshot, args=(m,)) for m in cluster.members * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(answers) == len(threads)
    for resp in answers:
        if resp.status != 200:
            assert_error(resp, 503, "unavailable", "snapshot")
    assert any(resp.status == 200 for resp in answers)
    with leader_client(cluster) as c:
        for i in range(4):
            assert c.delete(f"bulk/{i}").status == 200
    canary.check("concurrent snapshots")


# --- keys --------------------------------------------------------------------------------------

ODD_KEYS = [
    "a/b", "/leading-slash", "trailing-slash/", "a//double", "sp ace", "tab\tkey",
    "\u00fcn\u00efc\u00f6d\u00e9/\u65e5\u672c\u8a9e/\U0001f680", "%2F", "%", "%zz", "100%",
    "question?mark", "a?b=c&d=e", "hash#tag", "#", "?", "plus+sign", "semi;colon",
    "..", ".", "a/../b", "./x", "back\\slash", "quote\"s", "<angle>", "new\nline", "nul\x00byte",
    "emoji\u200dzwj", "x" * 4096,
]


@pytest.mark.parametrize("key", ODD_KEYS, ids=lambda k: repr(k)[:30])
def test_odd_keys_round_trip_exactly(cluster, canary, key):
    value = ("value of " + key[:50]).encode()
    follower = follower_of(cluster)
    with cluster.client(follower) as c:  # forwarded to the leader: the path must not change
        put = c.put(key, value)
        assert put.status == 200, put.body
    for member in cluster.members:
        with cluster.client(member) as c:
            got = c.get(key)
            assert (got.status, got.body) == (200, value), (member, got.body[:200])
            assert got.mod_index == put.index
            listed = c.list(prefix=key).json()["keys"]
            assert listed[0] == key, listed[:3]
    with cluster.client(follower) as c:
        assert c.delete(key).json()["deleted"] is True
        assert c.get(key).status == 404
    canary.check(f"key {key[:20]!r}")


def test_an_encoded_slash_is_a_slash(cluster, canary):
    with leader_client(cluster) as c:
        assert c.request("PUT", "/v1/kv/enc%2Fslash", b"s").status == 200
        got = c.get("enc/slash")
        assert (got.status, got.body) == (200, b"s")
        assert c.list(prefix="enc").json()["keys"] == ["enc/slash"]
    canary.check("encoded slash")


def test_a_key_of_the_limit_in_multibyte_characters_fits_the_request_line(cluster, canary):
    key = "\u00e9" * 2048  # 4096 bytes of UTF-8, 12288 characters percent-encoded
    with cluster.client(follower_of(cluster)) as c:
        assert c.put(key, b"e", prev_index=0).status == 200
        assert c.get(key, consistency="serializable").status in (200, 404)
        assert c.get(key).body == b"e"
    canary.check("4096-byte multibyte key")


@pytest.mark.parametrize("key", ["x" * 4097, "\u00e9" * 2049, "y" * 5000])
def test_a_key_over_the_limit_is_400(cluster, canary, key):
    for member in cluster.members:
        with cluster.client(member) as c:
            for resp in (c.put(key, b"v"), c.get(key), c.delete(key)):
                assert_error(resp, 400, "bad_request", ["key", "4096"])
    canary.check("long key")


def test_a_url_beyond_any_key_is_refused_by_the_parser(cluster, canary):
    with leader_client(cluster) as c:
        resp = c.request("PUT", "/v1/kv/" + "z" * 20000, b"v")
        assert resp.status in (400, 414)  # aiohttp's parser: no route, so no JSON here
    canary.check("20 kB URL")


@pytest.mark.parametrize("method", ["PUT", "GET", "DELETE"])
def test_an_empty_key_is_400(cluster, canary, method):
    for member in cluster.members:
        with cluster.client(member) as c:
            resp = c.request(method, "/v1/kv/", b"v" if method == "PUT" else None)
            assert_error(resp, 400, "bad_request", "key is empty")
    canary.check(f"empty key {method}")


@pytest.mark.parametrize("raw", ["%FF", "ok%C3", "%ED%A0%80", "%C0%AF"])
def test_a_key_that_is_not_utf8_is_400(cluster, canary, raw):
    with leader_client(cluster) as c:
        for method in ("PUT", "GET", "DELETE"):
            resp = c.request(method, "/v1/kv/" + raw, b"v" if method == "PUT" else None)
            assert_error(resp, 400, "bad_request", "UTF-8")
        assert c.get(raw).status == 404  # the literal text was not written either
    canary.check(f"key {raw}")


# --- unknown routes and methods ----------------------------------------------------------------

@pytest.mark.parametrize("method,path,allowed", [
    ("DELETE", "/v1/status", "GET"),
    ("POST", "/v1/kv/some-key", "DELETE"),
    ("PATCH", "/v1/kv/some-key", "PUT"),
    ("PUT", "/v1/kv", "GET"),
    ("GET", "/v1/members", "POST"),
    ("GET", "/v1/config", "PUT"),
    ("GET", "/v1/leader", "POST"),
    ("GET", "/v1/snapshot", "POST"),
    ("POST", "/metrics", "GET"),
    ("PUT", "/v1/members/n0", "DELETE"),
])
def test_a_wrong_method_is_405_json_with_allow(cluster, canary, method, path, allowed):
    with cluster.client(follower_of(cluster)) as c:
        resp = c.request(method, path, b"{}" if method in ("POST", "PUT", "PATCH") else None)
    assert_error(resp, 405, "method_not_allowed", [method, allowed])
    assert allowed in resp.headers.get("Allow", ""), resp.headers.get("Allow")
    canary.check(f"{method} {path}")


@pytest.mark.parametrize("path", ["/v2/kv/x", "/v1", "/", "/v1/members/", "/raft/v1/messages"])
def test_an_unknown_path_is_404_json(cluster, canary, path):
    with leader_client(cluster) as c:
        assert_error(c.request("GET", path), 404, "not_found", path)
    canary.check(f"GET {path}")


# --- membership --------------------------------------------------------------------------------

def test_removing_an_unknown_member_is_404(cluster, canary):
    for member in cluster.members:
        with cluster.client(member) as c:
            assert_error(c.request("DELETE", "/v1/members/nosuch"), 404, "not_found", "nosuch")
            assert_error(c.request("DELETE", "/v1/members/no%20such"), 404, "not_found")
    canary.check("DELETE nosuch")


def test_a_transfer_to_an_unknown_member_is_404(cluster, canary):
    leader = cluster.wait_leader(30)
    term = cluster.status(leader)["term"]
    for member in cluster.members:
        with cluster.client(member) as c:
            assert_error(c.post_json("/v1/leader", {"name": "nosuch"}), 404, "not_found",
                         "nosuch")
    assert cluster.wait_leader(30) == leader and cluster.status(leader)["term"] == term
    canary.check("transfer to nosuch")


def test_a_config_with_a_voter_that_is_not_a_member_is_422(cluster, canary):
    with cluster.client(follower_of(cluster)) as c:
        resp = c.post_json("/v1/config", {"voters": [*cluster.members, "nosuch"]}, method="PUT")
        assert_error(resp, 422, "not_a_learner", "nosuch")
        resp = c.post_json("/v1/config", {"voters": ["nosuch"]}, method="PUT")
        assert_error(resp, 422, "not_a_learner", "nosuch")
    canary.check("config with nosuch")
    assert sorted(cluster.status(cluster.wait_leader(30))["config"]["voters"]) == cluster.members


def test_putting_the_current_config_again_is_a_no_op(cluster, canary):
    with cluster.client(follower_of(cluster)) as c:
        resp = c.post_json("/v1/config", {"voters": list(reversed(cluster.members))},
                           method="PUT")
        assert resp.status == 200, resp.body
        assert resp.json()["config"]["voters"] == sorted(cluster.members)
    canary.check("same config")


@pytest.mark.parametrize("name", ["n0", "n1", "n2"])
def test_adding_an_existing_member_is_409(cluster, canary, name, unused_peer_url):
    with cluster.client(follower_of(cluster)) as c:
        resp = c.add_member(name, unused_peer_url, "http://127.0.0.1:1")
    assert_error(resp, 409, "member_exists", name)
    canary.check(f"add {name} again")


def test_adding_a_member_at_another_members_peer_url_is_409(cluster, canary):
    taken = cluster.peer_url("n1")
    with leader_client(cluster) as c:
        resp = c.add_member("newcomer", taken, "http://127.0.0.1:1")
    assert_error(resp, 409, "peer_url_exists", "n1")
    canary.check("add at a taken URL")


@pytest.mark.parametrize("name", ["bad name", "a/b", "x=y", "a,b", "-dash", ".dot", "\u00e9",
                                  "n" * 64, "tab\t", "new\nline", "", "..", "%2F"])
def test_a_member_name_with_invalid_characters_is_400(cluster, canary, name, unused_peer_url):
    with leader_client(cluster) as c:
        resp = c.add_member(name, unused_peer_url, "http://127.0.0.1:1")
    assert_error(resp, 400, "bad_request", "name")
    canary.check(f"add {name!r}")
    config = cluster.status(cluster.wait_leader(30))["config"]
    assert config["learners"] == [], config


def test_a_learner_that_never_caught_up_cannot_become_a_voter_or_lead(cluster, canary,
                                                                      unused_peer_url):
    leader = cluster.wait_leader(30)
    with cluster.client(leader, timeout=20) as c:
        resp = c.add_member("ghost", unused_peer_url, "http://127.0.0.1:1")
        assert resp.status == 200, resp.body  # a learner's configuration commits without it
        try:
            resp = c.post_json("/v1/config", {"voters": [*cluster.members, "ghost"]},
                               method="PUT")
            assert_error(resp, 422, "not_caught_up", "ghost")
            resp = c.post_json("/v1/leader", {"name": "ghost"})
            assert_error(resp, 422, None, "ghost")
            resp = c.add_member("ghost", unused_peer_url, "http://127.0.0.1:1")
            assert_error(resp, 409, "member_exists", "ghost")
        finally:
            resp = c.request("DELETE", "/v1/members/ghost")
            assert resp.status == 200, resp.body
    assert cluster.status(cluster.wait_leader(30))["config"]["learners"] == []
    canary.check("ghost learner")


# --- a configuration change while another runs ----------------------------------------------------

def _pending_change(cluster, leader, unused_peer_url):
    """Pause both followers so that the leader cannot commit, start adding a learner (the
    request then waits), and return (thread, outcome) once the leader has the change in its log."""
    outcome: dict = {}

    def first_change():
        try:
            with cluster.client(leader, timeout=60) as c:
                outcome["resp"] = c.add_member("inflight", unused_peer_url, "http://127.0.0.1:1")
        except Exception as exc:  # reported by the test
            outcome["exc"] = exc

    thread = threading.Thread(target=first_change, daemon=True)
    thread.start()
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        if "inflight" in cluster.status(leader)["config"]["learners"]:
            return thread, outcome
        time.sleep(0.02)
    raise AssertionError(f"the first change never reached the leader's log: {outcome}")


def test_a_config_change_while_another_runs_is_409(cluster, canary, unused_peer_url):
    attempts = []
    for _attempt in range(3):
        leader = cluster.wait_leader(30)
        followers = [m for m in cluster.members if m != leader]
        for f in followers:
            cluster.nodes[f].stop()  # SIGSTOP: the leader can no longer commit anything
        thread = None
        try:
            thread, outcome = _pending_change(cluster, leader, unused_peer_url)
            with cluster.client(leader, timeout=5) as c:
                answers = [
                    c.add_member("second", "http://127.0.0.1:2", "http://127.0.0.1:3"),
                    c.post_json("/v1/config", {"voters": cluster.members}, method="PUT"),
                    c.post_json("/v1/config", {"voters": [*cluster.members, "inflight"]},
                                method="PUT"),
                    c.request("DELETE", "/v1/members/inflight"),
                    c.request("DELETE", f"/v1/members/{followers[0]}"),
                ]
            still_leading = cluster.status(leader)["role"] == "leader"
        finally:
            for f in followers:
                cluster.nodes[f].cont()
        thread.join(70)
        assert not thread.is_alive()
        attempts.append([a.status for a in answers])
        if still_leading:  # otherwise check-quorum deposed it meanwhile: answers may be 503
            for answer in answers:
                assert_error(answer, 409, "change_in_progress", "has not finished")
            break
    else:
        pytest.fail(f"the leader stepped down during every attempt: {attempts}")
    assert "exc" not in outcome, outcome
    assert outcome["resp"].status in (200, 503), outcome["resp"].body
    # Once the followers are back the first change commits (or a new leader drops it).
    deadline = time.monotonic() + 30
    while True:
        leader = cluster.wait_leader(30)
        with cluster.client(leader, timeout=20) as c:
            config = cluster.status(leader)["config"]
            if "inflight" not in config["learners"] and config["joint"] is None:
                break
            resp = c.request("DELETE", "/v1/members/inflight")
            if resp.status == 200:
                continue
        assert time.monotonic() < deadline, (resp.status, resp.body, config)
        time.sleep(0.2)
    assert "second" not in config["learners"]
    assert sorted(config["voters"]) == cluster.members
    canary.check("after the concurrent changes")


# --- raw bytes on the client port ---------------------------------------------------------------

@pytest.mark.parametrize("junk", [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(40),
                                  bytes(range(256)) * 4, b"GET\r\n\r\n",
                                  b"PUT /v1/kv/x HTTP/1.1\r\nHost: h\r\nContent-Length: zz"
                                  b"\r\n\r\nv",
                                  b"PUT /v1/kv/x HTTP/1.1\r\nHost: h\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\nzz\r\nv\r\n0\r\n\r\n",
                                  b"PUT /v1/kv/x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked"
                                  b"\r\n\r\n3\r\nabcdef\r\n0\r\n\r\n",
                                  b"PUT /v1/kv/x HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n"
                                  b"Content-Length: 6\r\n\r\nvvvvvv",
                                  b"PUT /v1/kv/x HTTP/1.1\r\nHost: h\r\nX-Bad\x01Name: v\r\n\r\n"],
                         ids=["tls-hello", "binary", "no-version", "bad-length", "bad-chunk-size",
                              "overlong-chunk", "two-lengths", "bad-header-name"])
def test_raw_bytes_on_the_client_port_are_refused(cluster, canary, junk):
    leader = cluster.wait_leader(30)
    term = cluster.status(leader)["term"]
    for member in cluster.members:
        host, port = address(cluster.nodes[member].url)
        answer = raw_exchange(host, port, junk, timeout=3, read_until_close=True)
        if answer:
            assert parse_raw(answer)[0] == 400, answer[:300]
    assert cluster.wait_leader(30) == leader and cluster.status(leader)["term"] == term
    canary.check(f"junk {junk[:8]!r}")
    with leader_client(cluster) as c:
        assert c.get("x").status == 404


# --- the snapshot route still works for a real learner --------------------------------------------

def test_a_learner_added_after_compaction_catches_up_from_a_snapshot(cluster, canary):
    """The strict peer decoder still lets a leader's snapshot through its own route."""
    leader = cluster.wait_leader(30)
    with cluster.client(leader, timeout=30) as c:
        snap = c.request("POST", "/v1/snapshot")
        assert snap.status == 200, snap.body
    assert cluster.status(leader)["first_index"] > 1  # the log was compacted
    node = cluster.add_member("n3", timeout=60)
    try:
        deadline = time.monotonic() + 30
        while True:
            status = cluster.status("n3")
            if status["applied_index"] >= snap.json()["index"]:
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
        assert status["snapshot"]["index"] >= snap.json()["index"], status
        with node.client() as c:
            first = sorted(canary.written)[0]
            assert c.get(first, consistency="serializable").body == canary.written[first]
            metrics = c.request("GET", "/metrics").body.decode()
        assert 'flotilla_snapshots_installed_total{source="leader"} 1' in metrics, metrics
    finally:
        with leader_client(cluster, timeout=30) as c:
            assert c.request("DELETE", "/v1/members/n3").status == 200
        cluster.members.remove("n3")
        node.kill()
    canary.check("after the learner left")
