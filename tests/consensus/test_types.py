"""`Entry` has a hand-written constructor (it is on every hot path); it must behave exactly like
the frozen dataclass it replaces the generated constructor of."""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
from flotilla.node.consensus import Entry, EntryKind
from hypothesis import given
from hypothesis import strategies as st


@dataclasses.dataclass(frozen=True, slots=True)
class PlainEntry:
    """The dumb version: what `@dataclass` generates on its own."""

    index: int
    term: int
    kind: int = EntryKind.NORMAL
    data: bytes = b""
    ts_ms: int = 0


def fields(entry) -> tuple:
    return tuple(getattr(entry, f.name) for f in dataclasses.fields(entry))


@given(st.integers(0, 2**64), st.integers(0, 2**64), st.sampled_from(list(EntryKind)),
       st.binary(max_size=8), st.integers(0, 2**64))
def test_entry_is_built_as_the_generated_constructor_builds_it(index, term, kind, data, ts):
    for args, kwargs in [((index, term), {}), ((index, term, kind, data), {}),
                         ((index, term, kind, data, ts), {}),
                         ((), {"index": index, "term": term, "ts_ms": ts, "data": data})]:
        entry, plain = Entry(*args, **kwargs), PlainEntry(*args, **kwargs)
        assert fields(entry) == fields(plain)
        assert repr(entry) == repr(plain).replace("PlainEntry", "Entry")
        assert entry == Entry(*args, **kwargs) and hash(entry) == hash(Entry(*args, **kwargs))
        assert dataclasses.replace(entry, ts_ms=7) == Entry(*fields(entry)[:4], 7)
        assert pickle.loads(pickle.dumps(entry)) == entry == copy.copy(entry)


def test_entry_stays_frozen_and_strict_about_its_arguments():
    entry = Entry(1, 2, EntryKind.NOOP, b"", 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.ts_ms = 4
    with pytest.raises(TypeError):
        Entry(1)
    with pytest.raises(TypeError):
        Entry(1, 2, 0, b"", 3, "extra")
    with pytest.raises(TypeError):
        Entry(1, 2, when=3)
    assert entry != Entry(1, 2, EntryKind.NOOP, b"", 4)
    assert Entry.__match_args__ == ("index", "term", "kind", "data", "ts_ms")
