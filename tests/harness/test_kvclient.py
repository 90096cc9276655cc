"""The test client and workload runner against a stub member (no node process needed).

The stub is linearizable by construction, so a workload run against it must check out; a stub
that acknowledges writes and forgets them must not. In between, the client's contract: the
request shapes of docs/contract.md, keep-alive, and which answers become ok, fail or unknown.
"""

from __future__ import annotations

import json

import pytest

from tests.harness.kvclient import KVClient, Response, Workload, classify, read_finals
from tests.harness.linearizability import Status, check, check_final_state
from tests.harness.stub_server import StubNode


@pytest.fixture
def stub():
    with StubNode() as s:
        yield s


def test_put_get_delete_list_speak_the_contract_shapes(stub):
    with KVClient(stub.url) as c:
        put = c.put("a/b c", b"\x00value")
        assert put.status == 200 and put.index == 1 and put.mod_index == 1
        method, target, _, body = stub.requests[-1]
        assert (method, target, body) == ("PUT", "/v1/kv/a/b%20c", b"\x00value")

        got = c.get("a/b c")
        assert (got.status, got.body, got.mod_index) == (200, b"\x00value", 1)
        assert c.get("a/b c", consistency="serializable").status == 200
        assert stub.requests[-1][1] == "/v1/kv/a/b%20c?consistency=serializable"

        missing = c.get("nope")
        assert missing.status == 404 and missing.error_code == "not_found"

        c.put("a/x", "text")
        listing = c.list("a/", limit=1)
        assert listing.json() == {"index": 2, "keys": ["a/b c"]}
        assert stub.requests[-1][1] == "/v1/kv?prefix=a%2F&limit=1"

        deleted = c.delete("a/x")
        assert deleted.json() == {"index": 3, "deleted": True}
        assert c.delete("a/x").json()["deleted"] is False


def test_response_unpacks_as_status_headers_body(stub):
    with KVClient(stub.url) as c:
        status, headers, body = c.put("k", b"v")
    assert status == 200 and headers["flotilla-index"] == "1" and json.loads(body)["index"] == 1


def test_compare_and_set_sends_prev_index_and_gets_412_on_mismatch(stub):
    with KVClient(stub.url) as c:
        assert c.put("k", b"1", prev_index=0).status == 200
        refused = c.put("k", b"2", prev_index=0)
        assert refused.status == 412 and refused.error_code == "precondition_failed"
        assert c.put("k", b"2", prev_index=1).status == 200
    assert stub.requests[-1][1] == "/v1/kv/k?prev_index=1"


def test_exactly_once_headers_ride_on_writes(stub):
    with KVClient(stub.url) as c:
        first = c.put("k", b"1", client_id="cli", seq=7)
        again = c.put("k", b"1", client_id="cli", seq=7)
        c.delete("k", client_id="cli", seq=8)
    assert first.index == again.index == 1
    assert stub.requests[0][2]["flotilla-client"] == "cli"
    assert stub.requests[0][2]["flotilla-seq"] == "7"
    with pytest.raises(ValueError, match="both"):
        KVClient(stub.url).put("k", b"1", client_id="cli")


def test_one_keep_alive_connection_per_client(stub):
    with KVClient(stub.url) as c:
        for i in range(20):
            c.put(f"k{i}", b"v")
            c.get(f"k{i}")
    assert stub.connections == 1


def test_idle_connection_closed_by_the_server_is_reopened_only_for_safe_requests(stub):
    stub.close_after_each = True
    with KVClient(stub.url) as c:
        c.get("k")
        assert c.get("k").status == 404  # a read is resent on a fresh connection
        assert c.put("k", b"1", client_id="cli", seq=1).status == 200  # so is a session write
        with pytest.raises(ConnectionError):
            c.put("k", b"2")  # a plain write is not: the caller must decide
        assert c.put("k", b"3").status == 200  # the next request opens a new connection


def test_timeout_raises_and_the_next_request_reconnects(stub):
    with KVClient(stub.url, timeout=0.2) as c:
        stub.delay = 0.5
        with pytest.raises(TimeoutError):
            c.get("k")
        stub.delay = 0
        assert c.get("k").status == 404


def test_refused_connection_raises_oserror():
    with StubNode() as s:
        url = s.url
    with pytest.raises(OSError):
        KVClient(url, timeout=1).get("k")


def test_admin_helpers(stub):
    with KVClient(stub.url) as c:
        assert c.status()["role"] == "leader"
        assert c.add_member("n9", "http://127.0.0.1:1", "http://127.0.0.1:2").status == 200
    assert stub.members == [{"name": "n9", "peer_url": "http://127.0.0.1:1",
                             "client_url": "http://127.0.0.1:2"}]


def _resp(status: int, body: bytes = b"", **headers: str) -> Response:
    import http.client
    import io

    raw = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    return Response(status, http.client.parse_headers(io.BytesIO(raw.encode())), body)


@pytest.mark.parametrize(("kind", "resp", "expected"), [
    ("put", _resp(200, b'{"index": 5}', Flotilla_Index="5"), ("ok", 5)),
    ("put", _resp(200, b"{}"), ("ok", None)),
    ("get", _resp(200, b"v"), ("ok", b"v")),
    ("get", _resp(404, b'{"code": "not_found"}'), ("ok", None)),
    ("delete", _resp(200, b'{"index": 3, "deleted": true}'), ("ok", True)),
    ("delete", _resp(200, b'{"index": 3, "deleted": false}'), ("ok", False)),
    ("cas", _resp(412, b'{"code": "precondition_failed"}'), ("ok", False)),
    ("cas", _resp(200, b"{}", Flotilla_Index="9"), ("ok", 9)),
    ("put", _resp(400, b'{"code": "bad_request"}'), ("fail", None)),
    ("put", _resp(413, b'{"code": "too_large"}'), ("fail", None)),
    # 503 may come after the write was appended: unknown unless the server says otherwise.
    ("put", _resp(503, b'{"code": "unavailable"}'), ("unknown", None)),
    ("put", _resp(503, b'{"code": "unavailable", "applied": false}'), ("fail", None)),
    ("delete", _resp(503, b"not json"), ("unknown", None)),
    ("put", _resp(500, b""), ("unknown", None)),
    ("put", _resp(408, b""), ("unknown", None)),
])
def test_classify(kind, resp, expected):
    assert classify(kind, resp) == expected


def test_workload_against_a_linearizable_stub_checks_out(stub):
    w = Workload([stub.url], keys=["a", "b", "c"], clients=4, duration=1.0,
                 mix={"put": 4, "get": 4, "delete": 1, "cas": 1}, seed=1)
    history = w.run()
    assert len(history) > 50, w.summary()
    assert {(k, "ok") for k in ("put", "get", "delete", "cas")} <= set(w.counts), w.summary()
    assert all(op.status is not Status.PENDING for op in history.ops)
    finals = read_finals([stub.url], ["a", "b", "c"])
    result = check_final_state(history, finals, timeout=30)
    assert result.ok, result.explain()


def test_workload_catches_a_server_that_forgets_acknowledged_writes(stub):
    w = Workload([stub.url], keys=["a"], clients=2, duration=0.5, mix={"put": 1, "get": 1})
    with w:
        pass  # runs for `duration`, then joins
    stub.forget_writes = True
    lost = w.history.invoke("liar", "put", "a", b"acknowledged-then-lost")
    assert KVClient(stub.url).put("a", b"acknowledged-then-lost").status == 200
    w.history.ok(lost)
    result = check_final_state(w.history, read_finals([stub.url], ["a"]), timeout=30)
    assert not result.ok
    assert "acknowledged write lost" in result.explain()


def test_workload_records_503_and_timeouts_as_unknown(stub):
    stub.canned = [(503, b'{"error": "no leader", "code": "unavailable"}')] * 5
    stub.apply_canned = True  # the 503s were applied all the same: the checker must allow it
    w = Workload([stub.url], keys=["a"], clients=1, duration=0.5, timeout=0.3,
                 mix={"put": 1}, sessions=False)
    w.run()
    assert w.counts[("put", "unknown")] == 5
    assert w.counts[("put", "ok")] > 0
    names = {op.client for op in w.history.ops}
    assert {"c0", "c0.1", "c0.5"} <= names  # a new client name after every unknown outcome
    finals = read_finals([stub.url], ["a"])
    assert check_final_state(w.history, finals, timeout=30).ok

    stub.delay = 0.5
    slow = Workload([stub.url], keys=["a"], clients=1, duration=0.2, timeout=0.1,
                    mix={"get": 1, "put": 1})
    slow.run()
    assert sum(n for (_, o), n in slow.counts.items() if o == "unknown") >= 1
    assert any("TimeoutError" in e for e in slow.errors)
    assert check(slow.history).ok


def test_workload_spreads_requests_over_members():
    with StubNode() as a, StubNode() as b:
        w = Workload([a.url, b.url], clients=2, duration=0.3, mix={"get": 1})
        w.run()
        assert a.requests and b.requests
        assert a.connections <= 2 and b.connections <= 2


def test_workload_rejects_unknown_operation_kinds():
    with pytest.raises(ValueError, match="kinds"):
        Workload(["http://127.0.0.1:1"], mix={"increment": 1})
