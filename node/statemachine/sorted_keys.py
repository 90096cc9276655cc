"""The key-value machine's keys in sorted order: cheap to update, and cheap to freeze.

Sorted order serves prefix listing and deterministic snapshots (members that applied the same
entries must write byte-identical files). Neither re-sorting on demand nor one big sorted list
works at a million keys: a sort holds the GIL for half a second, and `bisect.insort` into one
list moves the whole list. Any O(n) pass is worse still while a forked child writes a snapshot,
because touching every key's reference count makes the kernel copy every page of the heap.

So the keys live in a list of sorted blocks, as in the `sortedcontainers` package: every
operation touches one block of at most `2 * _LOAD` keys plus the short list of block maxima,
and nothing ever walks all keys except an explicit iteration.

Invariants (checked by `check_invariants`):
    every block is non-empty and sorted, holds at most 2 * _LOAD keys, and
    blocks[i][-1] == maxes[i] < blocks[i + 1][0]
Freezing (for a snapshot written by another thread) copies the list of blocks, about
n / _LOAD references, and marks those blocks shared; a shared block is copied before its first
change (copy-on-write per block), so the frozen view never changes under its reader.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from itertools import chain, pairwise

_LOAD = 1024  # target block size: a block splits above 2 * _LOAD, merges below _LOAD // 4


class SortedKeyIndex:
    __slots__ = ("_blocks", "_len", "_maxes", "_shared")

    def __init__(self, keys: Iterable[str] = (), *, presorted: bool = False) -> None:
        ordered = list(keys)
        if not presorted:
            ordered.sort()
        self._blocks: list[list[str]] = [
            ordered[i : i + _LOAD] for i in range(0, len(ordered), _LOAD)
        ]
        self._maxes: list[str] = [block[-1] for block in self._blocks]
        self._len = len(ordered)
        self._shared: set[int] = set()  # ids of blocks a frozen view still reads

    def __len__(self) -> int:
        return self._len

    def _own(self, i: int) -> list[str]:
        """Block i, copied first if a frozen view shares it."""
        block = self._blocks[i]
        if self._shared and id(block) in self._shared:
            self._shared.discard(id(block))
            block = self._blocks[i] = block.copy()
        return block

    def add(self, key: str) -> None:
        """Record a key that was not live until now."""
        maxes = self._maxes
        self._len += 1
        if not maxes:
            self._blocks.append([key])
            maxes.append(key)
            return
        i = bisect_left(maxes, key)
        if i == len(maxes):
            i -= 1  # larger than every key: goes to the end of the last block
        block = self._own(i)
        insort(block, key)
        maxes[i] = block[-1]
        if len(block) > 2 * _LOAD:
            self._blocks[i : i + 1] = [block[:_LOAD], block[_LOAD:]]
            maxes[i : i + 1] = [block[_LOAD - 1], block[-1]]

    def discard(self, key: str) -> None:
        """Record that a live key was deleted."""
        maxes = self._maxes
        i = bisect_left(maxes, key)
        block = self._blocks[i] if i < len(maxes) else []
        pos = bisect_left(block, key)
        if pos == len(block) or block[pos] != key:
            raise KeyError(key)
        block = self._own(i)
        del block[pos]
        self._len -= 1
        if not block:
            del self._blocks[i]
            del maxes[i]
            return
        maxes[i] = block[-1]
        if len(block) < _LOAD // 4 and len(self._blocks) > 1:
            j = i if i + 1 < len(self._blocks) else i - 1  # merge blocks j and j + 1
            merged = self._blocks[j] + self._blocks[j + 1]
            if len(merged) > 2 * _LOAD:
                half = len(merged) // 2
                self._blocks[j : j + 2] = [merged[:half], merged[half:]]
                maxes[j : j + 2] = [merged[half - 1], merged[-1]]
            else:
                self._blocks[j : j + 2] = [merged]
                maxes[j : j + 2] = [merged[-1]]

    def frozen(self) -> list[list[str]]:
        """The sorted blocks of this moment; they will not change until `unshare()`."""
        blocks = list(self._blocks)
        self._shared = {id(block) for block in blocks}
        return blocks

    def blocks(self) -> list[list[str]]:
        """The live sorted blocks, for a reader that finishes before the next change."""
        return self._blocks

    def unshare(self) -> None:
        """The frozen view is no longer read: stop copying its blocks."""
        self._shared = set()

    def __iter__(self) -> Iterator[str]:
        return chain.from_iterable(self._blocks)

    def iter_from(self, start: str) -> Iterator[str]:
        """Live keys >= `start`, ascending."""
        blocks = self._blocks
        i = bisect_left(self._maxes, start)
        if i < len(blocks):
            block = blocks[i]
            yield from block[bisect_left(block, start) :]
            for j in range(i + 1, len(blocks)):
                yield from blocks[j]

    def with_prefix(self, prefix: str, limit: int | None = None) -> list[str]:
        """Up to `limit` (None: all) keys starting with `prefix`, ascending."""
        out: list[str] = []
        if limit is not None and limit <= 0:
            return out
        for key in self.iter_from(prefix):
            if not key.startswith(prefix):
                break
            out.append(key)
            if limit is not None and len(out) >= limit:
                break
        return out

    def check_invariants(self) -> None:
        blocks, maxes = self._blocks, self._maxes
        assert len(blocks) == len(maxes)
        assert sum(map(len, blocks)) == self._len, "length out of date"
        for block, top in zip(blocks, maxes, strict=True):
            assert block, "empty block"
            assert len(block) <= 2 * _LOAD, "block too big"
            assert block[-1] == top, "stale block maximum"
            assert all(a < b for a, b in pairwise(block)), "block not sorted"
        assert all(a[-1] < b[0] for a, b in pairwise(blocks)), "blocks overlap"
