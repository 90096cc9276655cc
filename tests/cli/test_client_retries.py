"""The client's retry rules against a stub member (no node process): which answers are
retried, that a retry re-sends the same exactly-once pair, Retry-After, failover, timeouts."""

from __future__ import annotations

import socket
import time

import pytest

from flotilla.client import (
    BadRequest,
    Client,
    FlotillaError,
    NotFound,
    TLSFailure,
    Unavailable,
    Unreachable,
    key_path,
    normalize_endpoint,
)
from tests.harness.stub_server import StubNode

UNAVAILABLE = (503, b'{"error": "no leader is known yet; retry", "code": "unavailable"}')
OVERLOADED = (503, b'{"error": "8192 writes are already waiting; retry shortly", '
                   b'"code": "overloaded"}')


@pytest.fixture
def stub():
    with StubNode() as node:
        yield node


def dead_url() -> str:
    """A loopback URL where nothing listens (connection refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def writes(stub: StubNode) -> list[tuple[str, str, dict[str, str]]]:
    return [(m, t, h) for m, t, h, _ in stub.requests if m in ("PUT", "DELETE")]


def test_every_write_carries_a_new_sequence_number_of_one_session(stub):
    with Client(stub.url, client_id="me") as c:
        c.put("a", b"1")
        c.put("a", b"2")
        c.delete("a")
    sent = [(h["flotilla-client"], h["flotilla-seq"]) for _, _, h in writes(stub)]
    assert sent == [("me", "1"), ("me", "2"), ("me", "3")]


def test_a_write_retried_after_503_reuses_its_sequence_number_and_applies_once(stub):
    stub.canned = [UNAVAILABLE]
    stub.apply_canned = True  # the first attempt was applied, only its answer was lost
    # prefer_leader=False: no status request first, which would take the canned answer.
    with Client(stub.url, client_id="me", timeout=5, prefer_leader=False) as c:
        began = time.monotonic()
        result = c.put("k", b"v")
        waited = time.monotonic() - began
    seqs = [h["flotilla-seq"] for _, _, h in writes(stub)]
    assert seqs == ["1", "1"]
    assert stub.index == 1 and result.index == 1  # one application; the retry got its outcome
    # "No leader yet" is over within an election: the client's own short backoff, not the
    # whole second Retry-After allows.
    assert waited < 0.7


def test_an_overloaded_leader_is_given_the_retry_after_it_asks_for(stub):
    stub.canned = [OVERLOADED]
    with Client(stub.url, client_id="me", timeout=5, prefer_leader=False) as c:
        began = time.monotonic()
        c.put("k", b"v")
        waited = time.monotonic() - began
    assert waited >= 0.7  # Retry-After: 1 (with +-20% jitter)
    assert [h["flotilla-seq"] for _, _, h in writes(stub)] == ["1"]  # refused ones unrecorded
    assert stub.index == 1  # the refused try did nothing; the retry applied once


def test_unavailable_is_raised_within_the_timeout(stub):
    stub.canned = [UNAVAILABLE] * 100
    with Client(stub.url, timeout=1.5) as c:
        began = time.monotonic()
        with pytest.raises(Unavailable) as caught:
            c.put("k", b"v")
        assert time.monotonic() - began < 2.0
    assert caught.value.code == "unavailable"
    assert "no leader is known yet" in str(caught.value)
    assert stub.index == 0


def test_an_unreachable_endpoint_is_skipped_at_once(stub):
    with Client([dead_url(), stub.url], timeout=3) as c:
        began = time.monotonic()
        for i in range(5):
            c.put(f"k{i}", b"v")
        assert time.monotonic() - began < 1.0
        assert c.get("k4").value == b"v"


def test_nothing_answering_ends_in_unavailable_naming_the_endpoints():
    url = dead_url()
    with Client(url, timeout=0.5) as c, pytest.raises(Unavailable) as caught:
        c.get("k")
    assert url in str(caught.value)


def test_every_endpoint_refusing_ends_at_once_when_asked_to():
    urls = [dead_url(), dead_url()]
    with Client(urls, timeout=30, stop_when_refused=True) as c:
        began = time.monotonic()
        with pytest.raises(Unreachable) as caught:
            c.get("k")
        assert time.monotonic() - began < 2.0
    assert caught.value.code == "unreachable"
    assert all(url in str(caught.value) for url in urls)


def test_one_endpoint_answering_is_enough_when_the_others_refuse(stub):
    with Client([dead_url(), stub.url, dead_url()], timeout=3, stop_when_refused=True) as c:
        c.put("k", b"v")
        assert c.get("k").value == b"v"


def test_no_leader_is_still_waited_out_when_refusals_end_calls(stub):
    stub.canned = [UNAVAILABLE] * 3
    with Client([dead_url(), stub.url], timeout=5, stop_when_refused=True,
                prefer_leader=False) as c:
        c.put("k", b"v")
    assert stub.index == 1


def test_a_keep_alive_connection_closed_by_the_server_is_replaced(stub):
    stub.close_after_each = True
    with Client(stub.url) as c:
        for i in range(4):
            c.put("k", str(i).encode())
    assert stub.index == 4 and len(writes(stub)) == 4


def test_client_errors_are_not_retried_and_carry_status_and_code(stub):
    stub.canned = [(400, b'{"error": "prev_index must be a whole number", '
                         b'"code": "bad_request"}')]
    seen: list[str] = []
    stub.hook = lambda method, target: seen.append(method)
    with Client(stub.url, prefer_leader=False) as c, pytest.raises(BadRequest) as caught:
        c.put("k", b"v")
    assert (caught.value.status, caught.value.code) == (400, "bad_request")
    assert isinstance(caught.value, FlotillaError)
    assert seen == ["PUT"]


def test_a_missing_key_reads_as_none_but_other_404s_raise(stub):
    with Client(stub.url) as c:
        assert c.get("nope").value is None
        stub.canned = [(404, b'{"error": "n9 is not a member", "code": "not_found"}')]
        c.prefer_leader = False
        with pytest.raises(NotFound):
            c.remove_member("n9")


@pytest.mark.parametrize("key", ["a/b", "a b", "ü/ß", "100%", "q?x=1", "frag#x", "a/../b",
                                 "/lead", "a%2Fb"])
def test_keys_travel_percent_encoded_and_arrive_unchanged(stub, key):
    path = key_path(key)
    assert "/" not in path[len("/v1/kv/"):] and "?" not in path and "#" not in path
    with Client(stub.url) as c:
        c.put(key, b"v")
        assert c.get(key).value == b"v"
        assert c.list(key).keys == [key]
    assert list(stub.data) == [key]


def test_endpoints_are_normalised_and_checked():
    assert normalize_endpoint("127.0.0.1:2379/") == "http://127.0.0.1:2379"
    assert Client("http://a:1,b:2").endpoints == ["http://a:1", "http://b:2"]
    assert Client("https://a:1/").endpoints == ["https://a:1"]
    for wrong in ("ftp://a:1", "https://a", "http://:1"):
        with pytest.raises(ValueError):
            Client(wrong)
    with pytest.raises(ValueError):
        key_path("")


def test_an_https_endpoint_where_plain_http_listens_fails_at_once(stub):
    url = stub.url.replace("http://", "https://")
    began = time.monotonic()
    with Client(url, timeout=5) as c, pytest.raises(TLSFailure) as failed:
        c.get("k")
    assert time.monotonic() - began < 2  # not retried until the timeout
    assert failed.value.code == "not_tls" and f"use {stub.url}" in str(failed.value)
    assert stub.requests == []
