"""The key-value machine's commands and reads, as docs/contract.md's client API needs them."""

from __future__ import annotations

import pytest
from flotilla.node.statemachine import (
    GetQuery,
    KVStateMachine,
    ListQuery,
    StateMachine,
    SupportsFreeze,
    decode_command,
    encode_delete,
    encode_put,
)


def put(kv: KVStateMachine, index: int, key: str, value: bytes, **kw):
    return kv.apply(index, encode_put(key, value, ts=index, **kw))


def test_it_is_a_state_machine_that_supports_freeze():
    kv = KVStateMachine()
    assert isinstance(kv, StateMachine)
    assert isinstance(kv, SupportsFreeze)
    assert kv.kind == "kv"


def test_put_then_get_returns_value_and_the_index_that_wrote_it():
    kv = KVStateMachine()
    assert put(kv, 1, "k", b"v1") == {"index": 1, "mod_index": 1}
    assert kv.get("k") == (b"v1", 1)
    assert put(kv, 5, "k", b"v2") == {"index": 5, "mod_index": 5}
    assert kv.get("k") == (b"v2", 5)
    assert kv.get("missing") is None
    assert kv.applied_index == 5


def test_values_are_raw_bytes_kept_exactly():
    kv = KVStateMachine()
    blob = bytes(range(256)) * 4 + b"\x00"
    put(kv, 1, "bin", blob)
    put(kv, 2, "empty", b"")
    assert kv.get("bin") == (blob, 1)
    assert kv.get("empty") == (b"", 2)


@pytest.mark.parametrize(
    "key", ["", " ", "a/b/../c", "\x00\x01", "\udc80", "🚀 rocket", "ключ", "%2F", "a" * 5000]
)
def test_any_str_is_a_key(key):
    kv = KVStateMachine()
    put(kv, 1, key, b"v")
    assert kv.get(key) == (b"v", 1)
    assert kv.list() == [key]
    assert kv.apply(2, encode_delete(key, ts=2)) == {"index": 2, "deleted": True}
    assert kv.get(key) is None


def test_delete_says_whether_the_key_existed():
    kv = KVStateMachine()
    put(kv, 1, "k", b"v")
    assert kv.apply(2, encode_delete("k", ts=2)) == {"index": 2, "deleted": True}
    assert kv.get("k") is None
    assert kv.apply(3, encode_delete("k", ts=3)) == {"index": 3, "deleted": False}
    assert kv.list() == []


def test_compare_and_set_with_prev_index_zero_requires_absence():
    kv = KVStateMachine()
    assert put(kv, 1, "k", b"first", prev_index=0) == {"index": 1, "mod_index": 1}
    assert put(kv, 2, "k", b"second", prev_index=0) == {
        "index": 2,
        "error": "precondition_failed",
        "mod_index": 1,
    }
    assert kv.get("k") == (b"first", 1)


def test_compare_and_set_succeeds_only_on_the_current_mod_index():
    kv = KVStateMachine()
    put(kv, 1, "k", b"a")
    put(kv, 2, "other", b"x")
    assert put(kv, 3, "k", b"b", prev_index=2)["error"] == "precondition_failed"
    assert put(kv, 4, "k", b"b", prev_index=1) == {"index": 4, "mod_index": 4}
    assert put(kv, 5, "k", b"c", prev_index=1) == {
        "index": 5,
        "error": "precondition_failed",
        "mod_index": 4,
    }
    assert kv.get("k") == (b"b", 4)


def test_compare_and_set_on_a_deleted_key_sees_mod_index_zero():
    kv = KVStateMachine()
    put(kv, 1, "k", b"a")
    kv.apply(2, encode_delete("k", ts=2))
    assert put(kv, 3, "k", b"b", prev_index=1)["mod_index"] == 0
    assert put(kv, 4, "k", b"b", prev_index=0) == {"index": 4, "mod_index": 4}


def test_failed_compare_and_set_is_still_an_applied_entry():
    kv = KVStateMachine()
    put(kv, 1, "k", b"a")
    put(kv, 2, "k", b"b", prev_index=7)
    assert kv.applied_index == 2
    assert kv.get("k") == (b"a", 1)


def test_list_is_sorted_by_code_point_and_honours_prefix_and_limit():
    kv = KVStateMachine()
    keys = ["b", "a", "ab", "abc", "a/", "B", "é", "🚀", "aa", ""]
    for i, key in enumerate(keys, start=1):
        put(kv, i, key, b"v")
    assert kv.list() == sorted(keys)
    assert kv.list("a") == ["a", "a/", "aa", "ab", "abc"]
    assert kv.list("a", limit=2) == ["a", "a/"]
    assert kv.list("ab") == ["ab", "abc"]
    assert kv.list("zz") == []
    assert kv.list("", limit=0) == []
    assert kv.list("", limit=3) == ["", "B", "a"]
    with pytest.raises(ValueError):
        kv.list("", limit=-1)


def test_list_follows_deletes_and_reinserts():
    kv = KVStateMachine()
    for i in range(1, 3001):
        put(kv, i, f"key{i:05d}", b"v")
    for i in range(1, 3001, 2):
        kv.apply(3000 + i, encode_delete(f"key{i:05d}", ts=1))
    put(kv, 9000, "key00001", b"back")
    listed = kv.list("key")
    assert listed[:3] == ["key00001", "key00002", "key00004"]
    assert len(listed) == 1501
    assert len(kv) == 1501
    kv.check_invariants()


def test_query_answers_get_and_list_requests():
    kv = KVStateMachine()
    put(kv, 1, "a1", b"x")
    put(kv, 2, "a2", b"y")
    assert kv.query(GetQuery("a2")) == (b"y", 2)
    assert kv.query(GetQuery("nope")) is None
    assert kv.query(ListQuery("a", 1)) == ["a1"]
    with pytest.raises(TypeError):
        kv.query("get a1")


def test_a_command_that_cannot_be_decoded_is_answered_not_raised():
    kv = KVStateMachine()
    result = kv.apply(1, b"\xc1 not msgpack")
    assert result["index"] == 1 and result["error"] == "bad_command"
    result = kv.apply(2, b"\x93\x01\x02\x03")  # a msgpack array of the wrong shape
    assert result["error"] == "bad_command"
    assert kv.applied_index == 2
    assert kv.list() == []


def test_apply_refuses_indexes_that_do_not_increase():
    kv = KVStateMachine()
    put(kv, 3, "k", b"v")
    with pytest.raises(ValueError, match="out of order"):
        put(kv, 3, "k", b"again")
    with pytest.raises(ValueError, match="out of order"):
        put(kv, 2, "k", b"older")
    assert kv.get("k") == (b"v", 3)


def test_commands_round_trip_through_encoding():
    command = decode_command(encode_put("k\udc80", b"\x00v", ts=7, prev_index=0, client="c", seq=3))
    assert command.op == "put"
    assert command.key == "k\udc80"
    assert command.value == b"\x00v"
    assert (command.prev_index, command.client, command.seq, command.ts) == (0, "c", 3, 7)
    command = decode_command(encode_delete("k", ts=9))
    assert (command.op, command.key, command.client, command.ts) == ("delete", "k", None, 9)


@pytest.mark.parametrize(
    "build",
    [
        lambda: encode_put("k", b"v", ts=-1),
        lambda: encode_put("k", b"v", ts=1, prev_index=-1),
        lambda: encode_put("k", b"v", ts=1, client="c"),
        lambda: encode_put("k", b"v", ts=1, seq=1),
        lambda: encode_put("k", b"v", ts=1, client="", seq=1),
        lambda: encode_put("k", b"v", ts=1, client="c", seq=0),
        lambda: encode_put(b"k", b"v", ts=1),
        lambda: encode_put("k", "v", ts=1),
        lambda: encode_put("k", b"v", ts=1.5),
    ],
)
def test_encoders_reject_malformed_commands(build):
    with pytest.raises((ValueError, TypeError)):
        build()
