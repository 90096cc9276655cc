"""The key-value machine's state at an index, computed in parallel pieces instead of one replay.

Replaying entries one by one through `KVStateMachine` is the definition of the state (and the
oracle in tests). This module computes the same snapshot payload, byte for byte, from steps
that each need only part of the log, so Spark can spread them over many cores. `synthesize`
runs them in one process, in the order Spark runs its stages, with the same functions
(`changes` does the same for the effective changes):

1. **decode** every normal entry (`decode_fields`): independent per entry.
2. **clock**: the machine's clock after an entry is the running maximum of `ts` over every
   decodable command so far, whichever client sent it: a running maximum within each run of
   consecutive segments, then a prefix over the runs.
3. **sessions, per client** (`fold_client`, `fold_clients`): whether a command with a client
   id is applied or answered from the session (a retry, a stale sequence) depends only on that
   client's commands, their clocks and the session rules: never on what the commands did to
   keys. The result is the indexes it skipped and a sketch of the final session, whose
   recorded results are still named by the index that produced them.
4. **keys, per key** (`fold_keys`): the applied commands in index order, from the base entry:
   the final record, and the result of each command whose client's session records it. Or,
   from the same rows, each *effective* change (`fold_changes`: what export and compaction
   take from the log).
5. **assemble** (`assemble_payload`): key records in code-point order, sessions with their
   results filled in and expired ones dropped at the final clock, the header.

Keys and client ids travel as UTF-8 bytes (`key_bytes`, lone surrogates kept): the binary
order of UTF-8 is the code-point order the machine sorts keys by, so a byte sort (Spark's, or
Python's on bytes) is the snapshot's order.

Traps, each one a byte difference once (see the project's pipeline notes): `applied_index` is
the last *normal* entry at or below N, not N; the clock is global, not per client; keys and
client ids may hold lone surrogates (`surrogatepass`); and "the last command per key" is not
the state, since failed compare-and-sets, deletes of absent keys and de-duplicated retries are
commands that change nothing.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

import msgpack
from flotilla.node.statemachine.kv import (
    COMMAND_VERSION,
    DELETE,
    PUT,
    packer,
    payload_header,
    session_record,
)
from flotilla.node.statemachine.sessions import Session, snapshot_order

__all__ = [
    "CREATED",
    "DELETED",
    "OP_BASE",
    "OP_DELETE",
    "OP_PUT",
    "READ",
    "UPDATED",
    "BaseState",
    "Change",
    "ClientFold",
    "Fields",
    "KeyRow",
    "SessionSketch",
    "assemble_payload",
    "changes",
    "decode_fields",
    "finish_session",
    "fold_changes",
    "fold_client",
    "fold_clients",
    "fold_keys",
    "key_bytes",
    "key_text",
    "synthesize",
]

_unpackb = msgpack.unpackb
KeyEntry = tuple[str, bytes, int]  # (key, value, mod_index): the snapshot's key record
OP_PUT, OP_DELETE, OP_BASE = 0, 1, 2  # a put (or compare-and-set), a delete, a base entry
# A decoded command: (op, key, value, prev_index, client, seq, ts), key and client as UTF-8.
Fields = tuple[int, bytes, bytes, int | None, bytes | None, int | None, int]
# What the key fold takes: (key as UTF-8, index, op, value, prev_index); see `fold_keys`.
KeyRow = tuple[bytes, int, int, bytes | None, int | None]
# An effective change: (key as UTF-8, index, op, before, after), op one of the four below,
# before and after the key's value (None: absent).
Change = tuple[bytes, int, str, bytes | None, bytes | None]
# Debezium's op codes: a put on an absent key, a put on a present key (the same value still
# moves the mod index), a delete that removed the key, and a key as a snapshot holds it.
CREATED, UPDATED, DELETED, READ = "c", "u", "d", "r"


def key_bytes(key: str) -> bytes:
    """Keys and client ids as the fold carries them: UTF-8 bytes, lone surrogates kept."""
    return key.encode("utf-8", "surrogatepass")


def key_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogatepass")


def decode_fields(data: bytes) -> Fields | None:
    """A normal entry's command, or None for one that does not decode: such a command is
    applied (it advances `applied_index`) but changes nothing, not even the clock.

    Exactly `decode_command`'s verdict (tests/pipeline/test_kvfold.py checks it on arbitrary
    msgpack), without building a `Command`: this runs once per entry of the log, and the
    checks in one function cost half of what the two calls did."""
    try:
        doc = _unpackb(data, raw=False, use_list=False, unicode_errors="surrogatepass")
    except Exception:
        return None
    if not isinstance(doc, tuple) or len(doc) != 8 or doc[0] != COMMAND_VERSION:
        return None
    _, op, key, value, prev, client, seq, ts = doc
    if op == PUT:
        code = OP_PUT
    elif op == DELETE:
        if value:
            return None
        code = OP_DELETE
    else:
        return None
    if type(key) is not str or type(value) is not bytes:
        return None
    if prev is not None and (code != OP_PUT or type(prev) is not int or prev < 0):
        return None
    if client is None:
        if seq is not None:
            return None
    elif type(client) is not str or not client or type(seq) is not int or seq < 1:
        return None
    if type(ts) is not int or ts < 0:
        return None
    return (code, key.encode("utf-8", "surrogatepass"), value, prev,
            None if client is None else client.encode("utf-8", "surrogatepass"), seq, ts)


@dataclass(frozen=True, slots=True)
class BaseState:
    """The state the fold starts from: a snapshot's, or the empty machine's."""

    applied_index: int = 0
    clock: int = 0
    session_ttl_ms: int = 10 * 60 * 1000
    session_window: int = 16
    sessions: Mapping[str, Session] | None = None


@dataclass(frozen=True, slots=True)
class SessionSketch:
    """A session whose recorded results are still to be filled in: each recorded seq names
    either the index of the command that produced its result or, for results carried over
    from the base snapshot, the result itself."""

    client: str
    last_seq: int
    last_active: int
    recorded: tuple[tuple[int, int | dict[str, Any]], ...]  # (seq, index or result)


@dataclass(frozen=True, slots=True)
class ClientFold:
    skipped: tuple[int, ...]  # this client's commands answered from its session: not applied
    session: SessionSketch | None  # before expiry at the final clock


def fold_client(client: str, base: Session | None, commands: Iterable[tuple[int, int, int]],
                ttl_ms: int, window: int) -> ClientFold:
    """Replay `SessionTable`'s rules for one client. `commands` are (index, seq, clock at that
    command) in index order, where the clock is the machine's after the command's `ts` (as
    `SessionTable.advance` sets it before the command is judged).

    A session can only expire when the clock moves, and the clock is the same for every
    client, so "dropped before this command" is exactly "idle longer than the TTL at this
    command's clock", whichever client's command moved the clock past it.

    The session lives in local variables (this runs once per command of the log): `seqs` and
    `refs` are its recorded seqs, ascending, and what names each one's result."""
    live = base is not None
    last_seq = last_active = 0
    seqs: list[int] = []
    refs: list[int | dict[str, Any]] = []
    if base is not None:
        last_seq, last_active = base.last_seq, base.last_active
        seqs = [seq for seq, _ in base.results]
        refs = [result for _, result in base.results]
    skipped: list[int] = []
    for index, seq, clock in commands:
        if live and last_active < clock - ttl_ms:
            live = False  # expired: the retry guarantee ends, a new session starts
        if not live:
            live, last_seq, last_active, seqs, refs = True, seq, clock, [seq], [index]
            continue
        if seq <= last_seq and (seq in seqs or seq <= last_seq - window):
            last_active = clock  # a retry, or too old to tell: answered, touched
            skipped.append(index)
            continue
        # New, or overtaken and never applied: applied and recorded.
        last_active = clock
        if seq > last_seq:
            last_seq = seq
            seqs.append(seq)
            refs.append(index)
            floor = seq - window
            drop = 0
            while seqs[drop] <= floor:
                drop += 1
            if drop:
                del seqs[:drop], refs[:drop]
        else:  # within the window (a stale one was answered above)
            at = bisect_left(seqs, seq)
            seqs.insert(at, seq)
            refs.insert(at, index)
    session = (SessionSketch(client, last_seq, last_active, tuple(zip(seqs, refs, strict=True)))
               if live else None)
    return ClientFold(tuple(skipped), session)


def fold_clients(rows: Iterable[tuple[bytes, int, int, int]], base: Mapping[str, Session],
                 ttl_ms: int, window: int) -> Iterator[tuple[str, ClientFold]]:
    """`fold_client` over rows (client as UTF-8, index, seq, clock) sorted by client, then
    index: each client's fold, in client order."""
    current: bytes | None = None
    commands: list[tuple[int, int, int]] = []
    for client, index, seq, clock in rows:
        if client != current:
            if current is not None:
                name = key_text(current)
                yield name, fold_client(name, base.get(name), commands, ttl_ms, window)
            current, commands = client, []
        commands.append((index, seq, clock))
    if current is not None:
        name = key_text(current)
        yield name, fold_client(name, base.get(name), commands, ttl_ms, window)


def fold_keys(rows: Iterable[KeyRow], wanted: frozenset[int] | set[int],
              results: dict[int, dict[str, Any]]) -> Iterator[bytes]:
    """Apply each key's applied commands, in index order, to its base entry. `rows` are
    (key as UTF-8, index, op, value, prev_index) sorted by key, then index, where op is
    OP_PUT, OP_DELETE, or OP_BASE for a base snapshot's entry (index: its mod index, below
    every command's). Yields each key's final record, packed, in key order (nothing for a key
    that ends absent), and puts in `results` the result of each command whose index is in
    `wanted` (those a session records)."""
    pack = packer().pack
    current: bytes | None = None
    mod = 0  # the key's mod index; 0 while it is absent
    value: bytes | None = None  # its value; None while it is absent
    for key, index, op, data, prev in rows:
        if key != current:
            if value is not None:
                yield pack((key_text(current), value, mod))  # type: ignore[arg-type]
            current, mod, value = key, 0, None
        if op == OP_PUT:
            if prev is not None and prev != mod:
                if index in wanted:
                    results[index] = {"index": index, "error": "precondition_failed",
                                      "mod_index": mod}
                continue
            mod, value = index, data
            if index in wanted:
                results[index] = {"index": index, "mod_index": index}
        elif op == OP_DELETE:
            if index in wanted:
                results[index] = {"index": index, "deleted": value is not None}
            mod, value = 0, None
        else:
            mod, value = index, data
    if value is not None:
        yield pack((key_text(current), value, mod))  # type: ignore[arg-type]


def fold_changes(rows: Iterable[KeyRow], since: int = 0,
                 read_at: int | None = None) -> Iterator[Change]:
    """Each effective change of `rows`, the rows `fold_keys` takes (sorted by key, then index;
    OP_BASE rows carry the state before the range; commands answered from a session already
    left out), yielded in that order as (key, index, op, before, after):

    - CREATED: a put or a compare-and-set that took effect on an absent key (before None);
    - UPDATED: one on a present key, the same value included (the mod index moves);
    - DELETED: a delete that removed a present key (after None);
    - READ: with `read_at`, each base row, as (key, read_at, READ, None, value): the state
      before the range as a snapshot holds it (Debezium's snapshot read).

    A compare-and-set that missed (prev_index given and not the key's mod index) and a delete
    of an absent key change nothing and yield nothing. Rows at or below index `since` change
    the state the later ones see but yield nothing (nor does READ unless `read_at > since`):
    the state up to `since` comes from the same rows, only the changes after it are wanted."""
    current: bytes | None = None
    mod = 0  # the key's mod index; 0 while it is absent
    value: bytes | None = None  # its value; None while it is absent
    reads = read_at is not None and read_at > since
    for key, index, op, data, prev in rows:
        if key != current:
            current, mod, value = key, 0, None
        if op == OP_PUT:
            if prev is not None and prev != mod:
                continue
            if index > since:
                yield key, index, CREATED if value is None else UPDATED, value, data
            mod, value = index, data
        elif op == OP_DELETE:
            if value is None:
                continue
            if index > since:
                yield key, index, DELETED, value, None
            mod, value = 0, None
        else:
            mod, value = index, data
            if reads:
                yield key, read_at, READ, None, data  # type: ignore[misc]


def finish_session(sketch: SessionSketch, results: Mapping[int, dict[str, Any]]) -> Session:
    return Session(sketch.client, sketch.last_seq, sketch.last_active,
                   tuple((seq, results[r] if isinstance(r, int) else r)
                         for seq, r in sketch.recorded))


def assemble_payload(stream: BinaryIO, *, applied_index: int, clock: int, ttl_ms: int,
                     window: int, key_count: int, key_records: Iterable[bytes],
                     sessions: Iterable[Session]) -> None:
    """Write the payload: `key_records` are packed key records (or runs of them) already in
    code-point order, `key_count` of them; `sessions` are dropped when expired at `clock` and
    written in snapshot order."""
    horizon = clock - ttl_ms
    live = sorted((s for s in sessions if s.last_active >= horizon), key=snapshot_order)
    pack = packer().pack
    stream.write(pack(payload_header(applied_index, clock, ttl_ms, window, key_count,
                                     len(live))))
    for run in key_records:
        stream.write(run)
    for s in live:
        stream.write(pack(session_record(s)))


def synthesize(base: BaseState, base_keys: Iterable[KeyEntry],
               entries: Sequence[tuple[int, bytes]], stream: BinaryIO) -> None:
    """The whole fold in one process, in the order Spark runs its stages: the payload of the
    machine that restored `base` (keys `base_keys`) and applied the normal `entries`
    ((index, command), ascending)."""
    ttl, window = base.session_ttl_ms, base.session_window
    rows, folds, clock = _applied_rows(base, base_keys, entries)
    wanted = {i for f in folds.values() if f.session is not None
              for _, i in f.session.recorded if isinstance(i, int)}
    results: dict[int, dict[str, Any]] = {}
    records = list(fold_keys(rows, wanted, results))

    sessions = [finish_session(f.session, results) for f in folds.values()
                if f.session is not None]
    sessions += [s for c, s in (base.sessions or {}).items() if c not in folds]
    assemble_payload(
        stream, applied_index=entries[-1][0] if entries else base.applied_index,
        clock=clock, ttl_ms=ttl, window=window, key_count=len(records),
        key_records=records, sessions=sessions)


def changes(base: BaseState, base_keys: Iterable[KeyEntry], entries: Sequence[tuple[int, bytes]],
            since: int = 0, read_at: int | None = None) -> list[Change]:
    """The effective changes (`fold_changes`) of the normal `entries` ((index, command),
    ascending) applied to the machine that restored `base` (keys `base_keys`), in one process
    with the functions Spark's stages run, in log order (READ rows first, by key)."""
    rows, _, _ = _applied_rows(base, base_keys, entries)
    return sorted(fold_changes(rows, since, read_at), key=_index_then_key)


def _applied_rows(base: BaseState, base_keys: Iterable[KeyEntry],
                  entries: Sequence[tuple[int, bytes]]
                  ) -> tuple[list[KeyRow], dict[str, ClientFold], int]:
    """Decode, clock and sessions: the key fold's rows (the base entries and the commands not
    answered from a session, by key then index), each client's fold, and the final clock."""
    clock = base.clock
    by_client: list[tuple[bytes, int, int, int]] = []
    by_key: list[KeyRow] = []
    for index, data in entries:
        fields = decode_fields(data)
        if fields is None:
            continue
        op, key, value, prev, client, seq, ts = fields
        clock = max(clock, ts)
        if client is not None:
            by_client.append((client, index, seq, clock))  # type: ignore[arg-type]
        by_key.append((key, index, op, value, prev))

    folds = dict(fold_clients(sorted(by_client), dict(base.sessions or {}),
                              base.session_ttl_ms, base.session_window))
    skipped = {i for f in folds.values() for i in f.skipped}
    rows = [row for row in by_key if row[1] not in skipped]
    rows += [(key_bytes(key), mod, OP_BASE, value, None) for key, value, mod in base_keys]
    rows.sort(key=_key_then_index)
    return rows, folds, clock


def _index_then_key(change: Change) -> tuple[int, bytes]:
    return change[1], change[0]


def _key_then_index(row: tuple[Any, ...]) -> tuple[bytes, int]:
    return row[0], row[1]
