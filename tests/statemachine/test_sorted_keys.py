"""The sorted key index against the dumbest correct version: a Python set, sorted on demand."""

from __future__ import annotations

from flotilla.node.statemachine import sorted_keys
from flotilla.node.statemachine.sorted_keys import SortedKeyIndex
from hypothesis import given, settings
from hypothesis import strategies as st

# Small blocks, so that splits and merges happen within a few hundred operations (Hypothesis
# cannot use function-scoped fixtures, so the block size is set for the whole module).
_ORIGINAL_LOAD = sorted_keys._LOAD


def setup_module() -> None:
    sorted_keys._LOAD = 4


def teardown_module() -> None:
    sorted_keys._LOAD = _ORIGINAL_LOAD


_keys = st.text(alphabet="abcdé\x00🚀", max_size=4)
_ops = st.lists(st.tuples(st.booleans(), _keys), max_size=400)


def apply(ops: list[tuple[bool, str]], index: SortedKeyIndex, model: set[str]) -> set[str]:
    """Add or discard each key in both the index and the model (only where that is legal)."""
    for add, key in ops:
        if add and key not in model:
            index.add(key)
            model.add(key)
        elif not add and key in model:
            index.discard(key)
            model.discard(key)
    return model


@settings(max_examples=200, deadline=None)
@given(st.lists(_keys), _ops, _keys, st.integers(0, 30))
def test_index_matches_a_sorted_set(initial, ops, prefix, limit):
    index = SortedKeyIndex(set(initial))
    model = apply(ops, index, set(initial))
    index.check_invariants()
    assert list(index) == sorted(model)
    assert len(index) == len(model)
    expected = sorted(k for k in model if k.startswith(prefix))
    assert index.with_prefix(prefix) == expected
    assert index.with_prefix(prefix, limit) == expected[:limit]
    assert list(index.iter_from(prefix)) == sorted(k for k in model if k >= prefix)


@settings(max_examples=200, deadline=None)
@given(st.lists(_keys, unique=True), _ops)
def test_a_frozen_view_does_not_change_while_the_index_does(initial, ops):
    index = SortedKeyIndex(initial)
    frozen = index.frozen()
    before = [list(block) for block in frozen]
    model = apply(ops, index, set(initial))
    assert [list(block) for block in frozen] == before
    assert [k for block in frozen for k in block] == sorted(initial)
    assert list(index) == sorted(model)
    index.unshare()
    index.check_invariants()


def test_discarding_an_absent_key_is_an_error():
    index = SortedKeyIndex(["a", "c"])
    for key in ("b", "d", ""):
        try:
            index.discard(key)
        except KeyError:
            continue
        raise AssertionError(f"discard({key!r}) of an absent key passed")


def test_blocks_stay_bounded_at_scale(monkeypatch):
    monkeypatch.setattr(sorted_keys, "_LOAD", _ORIGINAL_LOAD)
    index = SortedKeyIndex()
    for i in range(20_000):
        index.add(f"{(i * 7919) % 20_000:06d}")
    for i in range(0, 20_000, 3):
        index.discard(f"{i:06d}")
    index.check_invariants()
    assert len(index) == 20_000 - len(range(0, 20_000, 3))
    assert max(map(len, index.blocks())) <= 2 * sorted_keys._LOAD
