"""flotilla.client against a real three-member cluster: the key-value API, compare-and-set,
odd keys, leader discovery, exactly-once retries, and what it does without a quorum."""

from __future__ import annotations

import threading
import time

import pytest

from flotilla.client import (
    BadRequest,
    Client,
    NotFound,
    PreconditionFailed,
    TooLarge,
    Unavailable,
)
from tests.cli.conftest import FAST

ODD_KEYS = ["dir/sub/leaf", "with space", "ünï/cødé ✓", "100%", "what?x=1&y", "frag#ment",
            "a/../b", "./dot", "/leading", "trailing/", "a//b", "a%2Fb", "plus+sign", ".", "..",
            "new\nline", "tab\there"]


def follower_of(cluster) -> str:
    leader = cluster.wait_leader(20)
    return next(n for n in cluster.members if n != leader)


def test_put_get_delete_list_round_trip(cluster):
    with Client(cluster.urls) as c:
        first = c.put("rt/a", b"\x00binary\xff")
        assert first.index > 0 and first.mod_index == first.index
        got = c.get("rt/a")
        assert got.value == b"\x00binary\xff" and got.found
        assert got.mod_index == first.index and got.index >= first.index
        c.put("rt/b", b"2")
        c.put("rt/c", b"3")
        listing = c.list("rt/")
        assert listing.keys == ["rt/a", "rt/b", "rt/c"] and listing.index >= first.index
        assert c.list("rt/", limit=2).keys == ["rt/a", "rt/b"]
        index, deleted = c.delete("rt/b")
        assert deleted and index > first.index
        assert c.delete("rt/b").deleted is False
        missing = c.get("rt/b")
        assert (missing.value, missing.mod_index, missing.found) == (None, None, False)
        assert c.get("rt/c", consistency="serializable").value in (b"3", None)


def test_compare_and_set_on_the_mod_index(cluster):
    with Client(cluster.urls) as c:
        created = c.put("cas", b"v1", prev_index=0)
        with pytest.raises(PreconditionFailed) as caught:
            c.put("cas", b"again", prev_index=0)
        assert caught.value.status == 412 and caught.value.code == "precondition_failed"
        assert caught.value.mod_index == created.index
        updated = c.put("cas", b"v2", prev_index=created.index)
        with pytest.raises(PreconditionFailed):
            c.put("cas", b"stale", prev_index=created.index)
        assert c.get("cas") == (b"v2", c.get("cas").index, updated.index)


def test_bad_input_gets_the_matching_error(cluster):
    with Client(cluster.urls, token=cluster.admin_token) as c:
        with pytest.raises(BadRequest):
            c.put("k", b"v", prev_index=-1)
        with pytest.raises(TooLarge):
            c.put("big", b"x" * ((1 << 20) + 1))
        with pytest.raises(NotFound):
            c.remove_member("no-such-member")
        assert c.get("big").value is None


@pytest.mark.parametrize("key", ODD_KEYS)
def test_odd_keys_arrive_exactly_as_given(cluster, key):
    with Client(cluster.urls) as c:
        put = c.put(key, key.encode())
        assert c.get(key).value == key.encode()
        assert key in c.list(key).keys
        assert c.get(key).mod_index == put.index
        assert c.delete(key).deleted
        assert c.get(key).value is None


@pytest.mark.parametrize("key", ODD_KEYS)
def test_odd_keys_survive_forwarding_by_a_follower(cluster, key):
    """A follower forwards the path as it came: a URL library on the way must not resolve
    dot segments or decode %2F."""
    follower = cluster.nodes[follower_of(cluster)].url
    with Client(follower, prefer_leader=False) as c:
        c.put(key, b"fwd")
        assert c.get(key).value == b"fwd"
        assert c.list(key).keys[:1] == [key]
        assert c.delete(key).deleted


def test_given_only_a_follower_the_client_finds_and_uses_the_leader(cluster):
    leader = cluster.wait_leader(20)
    follower = follower_of(cluster)
    with Client(cluster.nodes[follower].url) as c:
        assert c.leader_url is None
        c.put("discovered", b"yes")
        assert c.leader_url == cluster.nodes[leader].url
        status = c.status()
        assert status["role"] == "leader" and status["name"] == leader
        assert c.status(cluster.nodes[follower].url)["name"] == follower


def test_the_same_sequence_number_twice_applies_once(cluster):
    """What a retry after a lost answer looks like to the cluster: the second request (same
    client id, same seq, another value) gets the first outcome and changes nothing."""
    with Client(cluster.urls, client_id="dup-test") as first:
        original = first.put("once", b"first")
    with Client(cluster.urls, client_id="dup-test", first_seq=1) as again:
        replay = again.put("once", b"second")
    assert replay.index == original.index
    with Client(cluster.urls) as c:
        got = c.get("once")
        assert got.value == b"first" and got.mod_index == original.index


def test_a_leader_killed_mid_stream_loses_no_write_and_applies_none_twice(local_cluster):
    """A counter advanced by compare-and-set from its own last mod index: a write applied twice
    would answer 412 to its retry; a lost one would leave the counter short."""
    cluster = local_cluster(3, **FAST)
    leader = cluster.wait_leader(20)
    total, progress, errors = 60, [], []
    with Client(cluster.urls, timeout=20) as c:
        c.get("counter")  # discover the leader before the stream starts

        def stream() -> None:
            prev = 0
            try:
                for i in range(1, total + 1):
                    prev = c.put("counter", str(i).encode(), prev_index=prev).mod_index
                    progress.append(prev)
            except Exception as exc:
                errors.append(exc)

        writer = threading.Thread(target=stream)
        writer.start()
        deadline = time.monotonic() + 20
        while len(progress) < 15 and writer.is_alive() and time.monotonic() < deadline:
            time.sleep(0.005)
        cluster.nodes[leader].kill()
        writer.join(60)
        assert not writer.is_alive()
        assert errors == []
        assert progress == sorted(set(progress)) and len(progress) == total
        assert c.leader_url != cluster.nodes[leader].url
        final = c.get("counter")
        assert final.value == str(total).encode() and final.mod_index == progress[-1]


def test_without_a_quorum_calls_fail_with_unavailable_within_the_timeout(local_cluster):
    cluster = local_cluster(3, **FAST)
    cluster.wait_leader(20)
    survivor = cluster.members[0]
    with Client(cluster.urls) as c:
        index = c.put("before", b"quorum").index
        # The survivor must hold the write to serve it below: a follower learns a commit with
        # the leader's next message (within a few milliseconds), which the kill may cut off.
        deadline = time.monotonic() + 10
        while c.status(cluster.nodes[survivor].url)["applied_index"] < index:
            assert time.monotonic() < deadline, f"{survivor} never applied index {index}"
            time.sleep(0.01)
    for name in cluster.members[1:]:
        cluster.nodes[name].kill()
    with Client(cluster.urls, timeout=2.0) as c:
        for call in (lambda: c.put("after", b"no quorum"), lambda: c.get("before")):
            began = time.monotonic()
            with pytest.raises(Unavailable):
                call()
            assert time.monotonic() - began < 3.0
    with Client(cluster.nodes[survivor].url, timeout=2.0) as c:
        assert c.get("before", consistency="serializable").value == b"quorum"
