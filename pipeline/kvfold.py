"""The key-value machine's state at an index, computed in parallel pieces instead of one replay.

Replaying entries one by one through `KVStateMachine` is the definition of the state (and the
oracle in tests). This module computes the same snapshot payload, byte for byte, from steps
that each need only part of the log, so Spark can spread them over many cores:

1. **decode** every normal entry (`decode`): independent per entry.
2. **clock**: the machine's clock after an entry is the running maximum of `ts` over every
   decodable command so far, whichever client sent it (`clock_prefix`): per-partition maxima,
   then a prefix over the partitions.
3. **sessions, per client** (`fold_client`): whether a command with a client id is applied or
   answered from the session (a retry, a stale sequence) depends only on that client's
   commands, their clocks and the session rules: never on what the commands did to keys. The
   result is the set of applied indexes and a sketch of the final session, whose recorded
   results are still named by the index that produced them.
4. **keys, per key** (`fold_key`): the applied commands in index order, from the base value:
   the final entry, and the result of each command whose client's session records it.
5. **assemble** (`assemble_payload`): key records in code-point order, sessions with their
   results filled in and expired ones dropped at the final clock, the header.

Traps, each one a byte difference once (see the project's pipeline notes): `applied_index` is
the last *normal* entry at or below N, not N; the clock is global, not per client; keys and
client ids may hold lone surrogates (`surrogatepass`); and "the last command per key" is not
the state, since failed compare-and-sets, deletes of absent keys and de-duplicated retries are
commands that change nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO

from flotilla.node.statemachine.kv import (
    DELETE,
    PUT,
    decode_command,
    packer,
    payload_header,
    session_record,
)
from flotilla.node.statemachine.sessions import Session, snapshot_order

__all__ = [
    "BaseState",
    "ClientFold",
    "Op",
    "SessionSketch",
    "assemble_payload",
    "clock_prefix",
    "decode",
    "fold_client",
    "fold_key",
    "synthesize",
]

KeyEntry = tuple[str, bytes, int]  # (key, value, mod_index): the snapshot's key record


@dataclass(frozen=True, slots=True)
class Op:
    """One normal entry, decoded. `op` is None for a command that does not decode: it is
    applied (it advances `applied_index`) but changes nothing, not even the clock."""

    index: int
    op: str | None
    key: str = ""
    value: bytes = b""
    prev_index: int | None = None
    client: str | None = None
    seq: int | None = None
    ts: int = 0


def decode(index: int, data: bytes) -> Op:
    try:
        c = decode_command(data)
    except ValueError:
        return Op(index, None)
    return Op(index, c.op, c.key, c.value, c.prev_index, c.client, c.seq, c.ts)


def clock_prefix(ops: Iterable[Op], start: int) -> Iterator[tuple[Op, int]]:
    """Each op with the machine's clock once it is applied (`start`: the clock before)."""
    clock = start
    for op in ops:
        if op.op is not None and op.ts > clock:
            clock = op.ts
        yield op, clock


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
    applied: frozenset[int]  # indexes of this client's commands that are applied
    session: SessionSketch | None  # before expiry at the final clock


def fold_client(client: str, base: Session | None, commands: Iterable[tuple[int, int, int]],
                ttl_ms: int, window: int) -> ClientFold:
    """Replay `SessionTable`'s rules for one client. `commands` are (index, seq, clock at that
    command) in index order, where the clock is the machine's after the command's `ts` (as
    `SessionTable.advance` sets it before the command is judged).

    A session can only expire when the clock moves, and the clock is the same for every
    client, so "dropped before this command" is exactly "idle longer than the TTL at this
    command's clock", whichever client's command moved the clock past it."""
    s = (None if base is None
         else SessionSketch(base.client, base.last_seq, base.last_active, base.results))
    applied: list[int] = []
    for index, seq, clock in commands:
        if s is not None and s.last_active < clock - ttl_ms:
            s = None  # expired: the retry guarantee ends, a new session starts
        recorded_seqs = () if s is None else [r[0] for r in s.recorded]
        if s is not None and seq <= s.last_seq:
            if seq in recorded_seqs:  # a retry: answered from the session, touched
                s = SessionSketch(client, s.last_seq, clock, s.recorded)
                continue
            if seq <= s.last_seq - window:  # too old to tell: stale, touched
                s = SessionSketch(client, s.last_seq, clock, s.recorded)
                continue
        applied.append(index)  # new, or overtaken and never applied: applied and recorded
        if s is None:
            s = SessionSketch(client, seq, clock, ((seq, index),))
            continue
        last_seq = max(s.last_seq, seq)
        recorded = sorted((*s.recorded, (seq, index)), key=_first)
        s = SessionSketch(client, last_seq, clock,
                          tuple(r for r in recorded if r[0] > last_seq - window))
    return ClientFold(frozenset(applied), s)


def fold_key(key: str, base: KeyEntry | None, ops: Iterable[Op], wanted: frozenset[int] | set[int]
             = frozenset()) -> tuple[KeyEntry | None, dict[int, dict[str, Any]]]:
    """Apply one key's applied commands (in index order) to its base entry; returns the final
    entry (None: absent) and the results of the commands whose index is in `wanted` (those a
    session records)."""
    entry = base
    results: dict[int, dict[str, Any]] = {}
    for op in ops:
        i = op.index
        if op.op == PUT:
            if op.prev_index is not None:
                current = 0 if entry is None else entry[2]
                if current != op.prev_index:
                    if i in wanted:
                        results[i] = {"index": i, "error": "precondition_failed",
                                      "mod_index": current}
                    continue
            entry = (key, op.value, i)
            if i in wanted:
                results[i] = {"index": i, "mod_index": i}
        elif op.op == DELETE:
            existed = entry is not None
            entry = None
            if i in wanted:
                results[i] = {"index": i, "deleted": existed}
    return entry, results


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
    ops = [decode(i, data) for i, data in entries]
    clocked = list(clock_prefix(ops, base.clock))
    final_clock = clocked[-1][1] if clocked else base.clock
    ttl, window = base.session_ttl_ms, base.session_window

    by_client: dict[str, list[tuple[int, int, int]]] = {}
    for op, clock in clocked:
        if op.client is not None:
            by_client.setdefault(op.client, []).append((op.index, op.seq, clock))  # type: ignore[arg-type]
    base_sessions = dict(base.sessions or {})
    folds = {c: fold_client(c, base_sessions.get(c), cmds, ttl, window)
             for c, cmds in by_client.items()}
    skipped = {op.index for op, _ in clocked
               if op.client is not None and op.index not in folds[op.client].applied}
    wanted = {i for f in folds.values() if f.session is not None
              for _, i in f.session.recorded if isinstance(i, int)}

    by_key: dict[str, list[Op]] = {}
    for op in ops:
        if op.op is not None and op.index not in skipped:
            by_key.setdefault(op.key, []).append(op)
    entries_by_key = {e[0]: e for e in base_keys}
    results: dict[int, dict[str, Any]] = {}
    for key, key_ops in by_key.items():
        final, got = fold_key(key, entries_by_key.get(key), key_ops, wanted)
        results.update(got)
        if final is None:
            entries_by_key.pop(key, None)
        else:
            entries_by_key[key] = final

    sessions = [finish_session(f.session, results) for f in folds.values()
                if f.session is not None]
    sessions += [s for c, s in base_sessions.items() if c not in folds]
    pack = packer().pack
    ordered = sorted(entries_by_key.values(), key=_first)
    assemble_payload(
        stream, applied_index=entries[-1][0] if entries else base.applied_index,
        clock=final_clock, ttl_ms=ttl, window=window, key_count=len(ordered),
        key_records=(pack(e) for e in ordered), sessions=sessions)


def _first(item: tuple[Any, ...]) -> Any:
    return item[0]
