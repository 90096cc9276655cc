"""The built-in key-value state machine.

State: key (any str) -> (value bytes, mod_index), where mod_index is the log index of the entry
that last changed the key; plus client sessions (sessions.py) for exactly-once retries.

Commands are msgpack arrays (encode them with `encode_put` / `encode_delete`):
    [1, "put",    key, value, prev_index | nil, client | nil, seq | nil, ts]
    [1, "delete", key, b"",   nil,              client | nil, seq | nil, ts]
`1` is the command format version. `prev_index` turns a put into compare-and-set on the key's
mod index (0: the key must not exist). `ts` is the proposing leader's clock in milliseconds; it
drives session expiry and nothing else. Strings are UTF-8 with `surrogatepass`, so any Python
str is a valid key.

Results (plain dicts, also recorded in sessions and snapshots; treat them as read-only):
    put                 {"index": i, "mod_index": i}
    compare-and-set miss {"index": i, "error": "precondition_failed", "mod_index": current or 0}
    delete              {"index": i, "deleted": True | False}
    stale retry         {"index": i, "error": "stale_sequence", "last_seq": n}
    undecodable command {"index": i, "error": "bad_command", "reason": "..."}
A failed compare-and-set is an applied entry like any other, not an exception: every member
must reach the same verdict, and a retry must get the same answer.

Snapshot payloads (which the storage layer wraps in its snapshot file) are a stream of
msgpack objects, written one record at a time so a million keys never sit in one buffer:
    {"version": 1, "applied_index", "clock", "session_ttl_ms", "session_window",
     "keys": n, "sessions": m}
    n x [key, value, mod_index]                 ascending by key (code point order)
    m x [client, last_seq, last_active, [[seq, result], ...]]   by (last_active, client)
Everything is in a canonical order, so members that applied the same entries write identical
bytes, and a snapshot restored and written again is identical too.

Concurrent snapshots (`freeze`): the base dict is frozen and handed to the writer; until
`release`, writes go to an overlay dict (a deleted key maps to None) that reads consult first.
After `release` the overlay drains back into the base a few keys per apply (writes go to the
base again and drop their overlay entry), so no apply pays for the whole overlay at once.
Sessions are immutable values and the sorted key index copies a block before changing a frozen
one, so freezing them copies references, not keys.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from typing import Any, BinaryIO, NamedTuple

import msgpack

from .sessions import (
    DEFAULT_SESSION_TTL_MS,
    DEFAULT_SESSION_WINDOW,
    Session,
    SessionTable,
)
from .sessions import (
    snapshot_order as _snapshot_order,
)
from .sorted_keys import SortedKeyIndex

COMMAND_VERSION = 1
SNAPSHOT_VERSION = 1
PUT = "put"
DELETE = "delete"

_DRAIN_PER_APPLY = 16  # overlay entries folded back into the base dict per apply
_WRITE_RECORDS = 256  # snapshot records per write call
# (key, value, mod_index): the snapshot record itself, so writing packs it as it is and
# restoring stores the unpacked tuple without building another one per key.
_Entry = tuple[str, bytes, int]


class _Absent:
    __slots__ = ()


_ABSENT = _Absent()


class Command(NamedTuple):
    """A decoded command (a NamedTuple: decoding one per apply must be cheap)."""

    op: str  # PUT or DELETE
    key: str
    value: bytes = b""
    prev_index: int | None = None  # PUT only: compare-and-set on the mod index (0: absent)
    client: str | None = None
    seq: int | None = None
    ts: int = 0  # leader's clock at proposal, milliseconds

    def encode(self) -> bytes:
        _check_command(self)
        return _packb(
            [
                COMMAND_VERSION,
                self.op,
                self.key,
                self.value,
                self.prev_index,
                self.client,
                self.seq,
                self.ts,
            ]
        )


def encode_put(
    key: str,
    value: bytes,
    *,
    ts: int,
    prev_index: int | None = None,
    client: str | None = None,
    seq: int | None = None,
) -> bytes:
    """A put (compare-and-set when `prev_index` is given; 0 means the key must not exist).
    `ts` is the leader's clock in milliseconds at proposal time."""
    return Command(PUT, key, bytes(value), prev_index, client, seq, ts).encode()


def encode_delete(key: str, *, ts: int, client: str | None = None, seq: int | None = None) -> bytes:
    return Command(DELETE, key, b"", None, client, seq, ts).encode()


def decode_command(raw: bytes) -> Command:
    """Parse and validate a command; ValueError says what is wrong with it."""
    try:
        doc = msgpack.unpackb(raw, raw=False, use_list=False, unicode_errors="surrogatepass")
    except Exception as exc:
        raise ValueError(f"not a msgpack command: {exc}") from exc
    if not isinstance(doc, tuple) or len(doc) != 8 or doc[0] != COMMAND_VERSION:
        raise ValueError(f"not a version {COMMAND_VERSION} key-value command")
    command = Command(*doc[1:])
    _check_command(command)
    return command


def _check_command(c: Command) -> None:
    if c.op not in (PUT, DELETE):
        raise ValueError(f"unknown op {c.op!r}: expected {PUT!r} or {DELETE!r}")
    if type(c.key) is not str:
        raise ValueError("key must be a str")
    if type(c.value) is not bytes or (c.op == DELETE and c.value):
        raise ValueError("value must be bytes (and empty for a delete)")
    if c.prev_index is not None and (
        c.op != PUT or type(c.prev_index) is not int or c.prev_index < 0
    ):
        raise ValueError("prev_index must be an int >= 0, and only on a put")
    if (c.client is None) != (c.seq is None):
        raise ValueError("client and seq go together: give both or neither")
    if c.client is not None and (type(c.client) is not str or not c.client):
        raise ValueError("client must be a non-empty str")
    if c.seq is not None and (type(c.seq) is not int or c.seq < 1):
        raise ValueError("seq must be an int >= 1")
    if type(c.ts) is not int or c.ts < 0:
        raise ValueError("ts must be an int >= 0 (milliseconds)")


@dataclass(frozen=True, slots=True)
class GetQuery:
    key: str


@dataclass(frozen=True, slots=True)
class ListQuery:
    prefix: str = ""
    limit: int | None = None


class KVStateMachine:
    """The built-in machine; see the module docstring for commands, results and snapshots.

    Not thread-safe: one thread applies and queries. The only concurrency is a frozen state's
    `write`, which reads nothing that `apply` changes.
    """

    kind = "kv"

    def __init__(
        self,
        *,
        session_ttl_ms: int = DEFAULT_SESSION_TTL_MS,
        session_window: int = DEFAULT_SESSION_WINDOW,
    ) -> None:
        self.applied_index = 0
        self._data: dict[str, _Entry] = {}
        # While a snapshot is frozen, changes go to `_overlay` (None marks a deletion) and
        # `_data` is not touched. After release the overlay drains into `_data`
        # (`_draining`): changes go to `_data` again and drop the key's overlay entry.
        # Either way, a key's current entry is its overlay entry if it has one, else `_data`'s.
        self._overlay: dict[str, _Entry | None] | None = None
        self._draining = False
        self._keys = SortedKeyIndex()
        self._sessions = SessionTable(session_ttl_ms, session_window)

    # -- applying ---------------------------------------------------------------------------

    def apply(self, index: int, command: bytes) -> dict[str, Any]:
        if index <= self.applied_index:
            raise ValueError(
                f"apply out of order: index {index} after {self.applied_index} (a member bug)"
            )
        self.applied_index = index
        if self._draining:
            self._drain(_DRAIN_PER_APPLY)
        try:
            cmd = decode_command(command)
        except ValueError as exc:
            return {"index": index, "error": "bad_command", "reason": str(exc)}
        sessions = self._sessions
        sessions.advance(cmd.ts)
        if cmd.client is not None:
            prior = sessions.prior_outcome(cmd.client, cmd.seq, index)
            if prior is not None:
                return dict(prior)
        if cmd.op == PUT:
            result = self._put(index, cmd.key, cmd.value, cmd.prev_index)
        else:
            result = self._delete(index, cmd.key)
        if cmd.client is not None:
            sessions.record(cmd.client, cmd.seq, result)
            return dict(result)
        return result

    def _put(self, index: int, key: str, value: bytes, prev_index: int | None) -> dict[str, Any]:
        current = self._lookup(key)
        if prev_index is not None:
            current_mod = 0 if current is None else current[2]
            if current_mod != prev_index:
                return {"index": index, "error": "precondition_failed", "mod_index": current_mod}
        if current is None:
            self._keys.add(key)
        self._store(key, (key, value, index))
        return {"index": index, "mod_index": index}

    def _delete(self, index: int, key: str) -> dict[str, Any]:
        if self._lookup(key) is None:
            return {"index": index, "deleted": False}
        self._keys.discard(key)
        self._store(key, None)
        return {"index": index, "deleted": True}

    def _store(self, key: str, entry: _Entry | None) -> None:
        overlay = self._overlay
        if overlay is not None and not self._draining:
            overlay[key] = entry
            return
        if overlay is not None:
            overlay.pop(key, None)
        if entry is None:
            self._data.pop(key, None)
        else:
            self._data[key] = entry

    def _drain(self, budget: int) -> None:
        overlay, data = self._overlay, self._data
        assert overlay is not None and self._draining
        for _ in range(min(budget, len(overlay))):
            key, entry = overlay.popitem()
            if entry is None:
                data.pop(key, None)
            else:
                data[key] = entry
        if not overlay:
            self._overlay = None
            self._draining = False

    # -- reading ----------------------------------------------------------------------------

    def _lookup(self, key: str) -> _Entry | None:
        overlay = self._overlay
        if overlay is not None:
            entry = overlay.get(key, _ABSENT)
            if entry is not _ABSENT:
                return entry  # type: ignore[return-value]
        return self._data.get(key)

    def get(self, key: str) -> tuple[bytes, int] | None:
        """(value, mod_index), or None if the key does not exist."""
        entry = self._lookup(key)
        return None if entry is None else (entry[1], entry[2])

    def list(self, prefix: str = "", limit: int | None = None) -> list[str]:
        """Keys starting with `prefix`, ascending by code point, at most `limit` (None: all)."""
        if limit is not None and limit < 0:
            raise ValueError("limit must be >= 0")
        return self._keys.with_prefix(prefix, limit)

    def __len__(self) -> int:
        return len(self._keys)

    def query(self, request: Any) -> Any:
        """`GetQuery(key)` -> get(key); `ListQuery(prefix, limit)` -> list(prefix, limit)."""
        if isinstance(request, GetQuery):
            return self.get(request.key)
        if isinstance(request, ListQuery):
            return self.list(request.prefix, request.limit)
        raise TypeError(f"the kv machine answers GetQuery or ListQuery, not {request!r}")

    def session(self, client: str) -> Session | None:
        return self._sessions.get(client)

    @property
    def clock(self) -> int:
        """The largest command timestamp applied so far (milliseconds)."""
        return self._sessions.clock

    def canonical_state(self) -> dict[str, Any]:
        """Everything that defines this machine, as plain comparable data (for tests and for
        checking the pipeline against the node)."""
        keys = list(self._keys)
        return {
            "applied_index": self.applied_index,
            "clock": self._sessions.clock,
            "session_ttl_ms": self._sessions.ttl_ms,
            "session_window": self._sessions.window,
            "data": {key: self.get(key) for key in keys},
            "sessions": [
                (s.client, s.last_seq, s.last_active, s.results) for s in self._sessions.frozen()
            ],
        }

    def check_invariants(self) -> None:
        self._keys.check_invariants()
        self._sessions.check_invariants()
        live = {k for k in self._data if self._overlay is None or k not in self._overlay}
        if self._overlay is not None:
            live |= {k for k, v in self._overlay.items() if v is not None}
        assert live == set(self._keys), "sorted key index disagrees with the data"

    # -- snapshots --------------------------------------------------------------------------

    def _header(self, key_count: int, session_count: int) -> dict[str, Any]:
        return payload_header(self.applied_index, self._sessions.clock, self._sessions.ttl_ms,
                              self._sessions.window, key_count, session_count)

    def records(self) -> Iterator[_Entry]:
        """Every (key, value, mod_index), ascending by key: the snapshot's key records."""
        lookup = self._lookup
        for key in self._keys:
            yield lookup(key)  # type: ignore[misc]

    def sessions(self) -> list[Session]:
        """The sessions of this moment, in snapshot order."""
        return self._sessions.frozen()

    @property
    def session_ttl_ms(self) -> int:
        return self._sessions.ttl_ms

    @property
    def session_window(self) -> int:
        return self._sessions.window

    def write_snapshot(self, stream: BinaryIO) -> None:
        sessions = self._sessions.frozen()
        header = self._header(len(self), len(sessions))
        _write_payload(stream, header, self._keys.blocks(), self._lookup, sessions)

    def freeze(self) -> FrozenKV:
        if self._overlay is not None and not self._draining:
            raise RuntimeError("a snapshot of this machine is already being written")
        if self._draining:
            self._drain(len(self._overlay))  # type: ignore[arg-type]
        sessions = self._sessions.frozen()
        header = self._header(len(self), len(sessions))
        frozen = FrozenKV(self, header, self._keys.frozen(), self._data, sessions)
        self._overlay = {}
        return frozen

    def _thaw(self) -> None:
        """The frozen state's writer is done: start draining the overlay into the base."""
        self._keys.unshare()
        if self._overlay is not None and not self._draining:
            self._draining = True
            if not self._overlay:
                self._overlay, self._draining = None, False

    def restore(self, stream: BinaryIO) -> None:
        """Replace the whole state with a snapshot payload; on error nothing changes."""
        if self._overlay is not None and not self._draining:
            raise RuntimeError("cannot restore while a snapshot of this machine is being written")
        unpacker = msgpack.Unpacker(
            stream, raw=False, use_list=False, unicode_errors="surrogatepass"
        )
        with _gc_paused():
            self._restore_from(unpacker)

    def _restore_from(self, unpacker: msgpack.Unpacker) -> None:
        try:
            header = next(unpacker)
            if not isinstance(header, dict) or header.get("version") != SNAPSHOT_VERSION:
                raise ValueError(f"not a version {SNAPSHOT_VERSION} kv snapshot: {header!r:.200}")
            for field in ("applied_index", "clock", "keys", "sessions"):
                if type(header[field]) is not int or header[field] < 0:
                    raise ValueError(f"header field {field!r} is not an int >= 0")
            data: dict[str, _Entry] = {}
            previous = None
            for record in islice(unpacker, header["keys"]):
                key, value, mod_index = record
                if type(key) is not str or type(value) is not bytes or type(mod_index) is not int:
                    raise ValueError(f"bad key record for {key!r:.100}")
                if previous is not None and not previous < key:
                    raise ValueError(f"keys out of order at {key!r:.100}")
                data[key] = record
                previous = key
            if len(data) != header["keys"]:
                raise ValueError(f"truncated: {len(data)} of {header['keys']} key records")
            sessions = SessionTable(header["session_ttl_ms"], header["session_window"])
            loaded: list[Session] = []
            for client, last_seq, last_active, results in islice(unpacker, header["sessions"]):
                if type(client) is not str or type(last_seq) is not int:
                    raise ValueError(f"bad session record for {client!r:.100}")
                session = Session(client, last_seq, last_active, tuple(map(tuple, results)))
                if loaded and not _snapshot_order(loaded[-1]) < _snapshot_order(session):
                    raise ValueError(f"sessions out of order at {client!r:.100}")
                loaded.append(session)
            if len(loaded) != header["sessions"]:
                raise ValueError(f"truncated: {len(loaded)} of {header['sessions']} sessions")
            sessions.load(header["clock"], loaded)
            trailing = next(unpacker, _ABSENT)
        except (StopIteration, msgpack.OutOfData) as exc:
            raise ValueError("kv snapshot is truncated") from exc
        except (KeyError, TypeError, ValueError, msgpack.UnpackException) as exc:
            raise ValueError(f"kv snapshot is malformed: {exc}") from exc
        if trailing is not _ABSENT:
            raise ValueError("kv snapshot has trailing data after its last record")
        self.applied_index = header["applied_index"]
        self._data = data
        self._overlay, self._draining = None, False
        self._keys = SortedKeyIndex(data, presorted=True)
        self._sessions = sessions


class FrozenKV:
    """The state of a `KVStateMachine` at one moment, writable from another thread."""

    def __init__(
        self,
        machine: KVStateMachine,
        header: dict[str, Any],
        blocks: list[list[str]],
        data: dict[str, _Entry],
        sessions: list[Session],
    ) -> None:
        self._machine: KVStateMachine | None = machine
        self._header = header
        self._blocks = blocks
        self._data = data
        self._sessions = sessions

    def write(self, stream: BinaryIO) -> None:
        _write_payload(stream, self._header, self._blocks, self._data.get, self._sessions)

    def release(self) -> None:
        if self._machine is not None:
            self._machine._thaw()
            self._machine = None


def _write_payload(
    stream: BinaryIO,
    header: dict[str, Any],
    blocks: list[list[str]],
    lookup: Callable[[str], _Entry | None],
    sessions: list[Session],
) -> None:
    """Write a snapshot payload, `_WRITE_RECORDS` records per write call: memory stays flat,
    and a writer thread offers the GIL to the applying thread at every call."""
    pack = packer().pack
    write = stream.write
    write(pack(header))
    written = 0
    for block in blocks:
        for start in range(0, len(block), _WRITE_RECORDS):
            chunk = []
            for key in block[start : start + _WRITE_RECORDS]:
                entry = lookup(key)
                if entry is None:
                    raise AssertionError(f"key {key!r} is in the sorted index but has no value")
                chunk.append(pack(entry))
            written += len(chunk)
            write(b"".join(chunk))
    if written != header["keys"]:
        raise AssertionError(f"snapshot wrote {written} keys, its header says {header['keys']}")
    for s in sessions:
        write(pack(session_record(s)))


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Restoring creates millions of fresh tuples; letting the cyclic collector chase them
    through its generations more than doubles the restore time, and they hold no cycles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def payload_header(applied_index: int, clock: int, session_ttl_ms: int, session_window: int,
                   keys: int, sessions: int) -> dict[str, Any]:
    """The first record of a snapshot payload (its field order is part of the bytes)."""
    return {
        "version": SNAPSHOT_VERSION,
        "applied_index": applied_index,
        "clock": clock,
        "session_ttl_ms": session_ttl_ms,
        "session_window": session_window,
        "keys": keys,
        "sessions": sessions,
    }


def session_record(s: Session) -> tuple[str, int, int, tuple[tuple[int, Any], ...]]:
    """A session as the payload stores it."""
    return (s.client, s.last_seq, s.last_active, s.results)


def packer() -> msgpack.Packer:
    """The packer of commands and snapshot records (any str, lone surrogates included)."""
    return msgpack.Packer(unicode_errors="surrogatepass")


def _packb(obj: Any) -> bytes:
    return packer().pack(obj)
