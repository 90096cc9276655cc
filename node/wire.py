"""The peer wire format: Raft messages as msgpack arrays.

A batch is one HTTP body: `[version, cluster_id, sender, sender_peer_url, sender_client_url,
[message, ...]]`. A message is a flat array in `Message` field order, entries as
`[index, term, kind, data, ts_ms]` and a snapshot as `[index, term, membership, ts_ms]`; the
snapshot's payload never rides here (it is streamed on its own). Decoding checks every field's
type, so garbage on the peer port becomes a `WireError`, never a crash.

Members of the first release send entries without `ts_ms` (`[index, term, kind, data]`) and
snapshots as `[index, term, membership]`; both are still accepted, with time 0 (unknown), so a
cluster can be upgraded one member at a time.
"""

from __future__ import annotations

from typing import Any

import msgpack
from flotilla.node.consensus import (
    Entry,
    EntryKind,
    Membership,
    Message,
    MessageType,
    Snapshot,
    SnapshotMeta,
)

VERSION = 1
#: Terms, indexes, commits and times are below 2^63 (etcd's are uint64, but a value no member
#: can add one to would wedge the sender that must encode the next term).
MAX_VALUE = (1 << 63) - 1
#: Messages in one batch, and entries in all of its messages, at most: a sender splits larger
#: ones (see PeerTransport), so more is a broken or hostile peer.
MAX_MESSAGES = 4096
MAX_ENTRIES = 65536
_TYPES = {int(t): t for t in MessageType}
_KINDS = {int(k) for k in EntryKind}


class WireError(ValueError):
    pass


def encode_batch(
    cluster_id: str, sender: str, peer_url: str, client_url: str, messages: list[Message]
) -> bytes:
    return msgpack.packb(
        [VERSION, cluster_id, sender, peer_url, client_url, [_encode(m) for m in messages]],
        use_bin_type=True,
    )


def _encode(m: Message) -> list[Any]:
    snap = None
    if m.snapshot is not None:
        meta = m.snapshot.meta
        snap = [meta.index, meta.term, meta.membership.encode(), meta.ts_ms]
    return [
        int(m.type), m.to, m.frm, m.term, m.log_term, m.index,
        [[e.index, e.term, int(e.kind), e.data, e.ts_ms] for e in m.entries],
        m.commit, m.reject, m.hint_index, m.hint_term, snap, m.context, m.force,
    ]


class Batch:
    __slots__ = ("client_url", "cluster_id", "messages", "peer_url", "sender")

    def __init__(self, cluster_id: str, sender: str, peer_url: str, client_url: str,
                 messages: list[Message]) -> None:
        self.cluster_id = cluster_id
        self.sender = sender
        self.peer_url = peer_url
        self.client_url = client_url
        self.messages = messages


def decode_batch(body: bytes, *, snapshot: bool = False) -> Batch:
    """Decode and check a batch. A snapshot message is refused unless `snapshot` (the snapshot
    route, where its payload follows): in a plain batch it would reach the core without the
    file that installing it needs."""
    try:
        doc = msgpack.unpackb(body, raw=False, use_list=True, strict_map_key=True)
    except Exception as exc:
        raise WireError(f"not a msgpack peer batch: {str(exc) or exc.__class__.__name__}"
                        ) from exc
    if not isinstance(doc, list) or len(doc) != 6 or doc[0] != VERSION:
        raise WireError(f"not a version {VERSION} peer batch")
    _, cluster_id, sender, peer_url, client_url, raw = doc
    if not all(isinstance(x, str) for x in (cluster_id, sender, peer_url, client_url)):
        raise WireError("batch header fields must be strings")
    if not isinstance(raw, list):
        raise WireError("batch messages must be a list")
    if len(raw) > MAX_MESSAGES:
        raise WireError(f"a batch carries at most {MAX_MESSAGES} messages, not {len(raw)}")
    messages = []
    entries = 0
    for item in raw:
        m = _decode(item)
        if m.frm != sender:
            raise WireError(f"message from {m.frm!r} inside a batch from {sender!r}")
        entries += len(m.entries)
        if entries > MAX_ENTRIES:
            raise WireError(f"a batch carries at most {MAX_ENTRIES} entries")
        if not snapshot and (m.type is MessageType.SNAPSHOT or m.snapshot is not None):
            raise WireError("a snapshot message travels alone on the snapshot route, with its "
                            "payload, never in a batch")
        messages.append(m)
    return Batch(cluster_id, sender, peer_url, client_url, messages)


def _membership(raw: bytes) -> Membership:
    """A snapshot's membership, checked as strictly as the rest of a batch."""
    try:
        membership = Membership.decode(raw)
    except Exception as exc:  # JSON of any shape arrives here: a list, nesting, odd types
        raise WireError(f"bad snapshot membership: {exc.__class__.__name__}: {exc}") from exc
    names = membership.voters | membership.learners | (membership.outgoing or frozenset())
    if not all(isinstance(n, str) for n in names) or not all(
            isinstance(n, str) and isinstance(u, str) for n, u in membership.addresses):
        raise WireError("bad snapshot membership: names and addresses must be strings")
    return membership


def _int(x: Any, what: str) -> int:
    if type(x) is not int or not 0 <= x <= MAX_VALUE:
        raise WireError(f"{what} must be an integer from 0 to 2^63-1")
    return x


def _decode(item: Any) -> Message:
    if not isinstance(item, list) or len(item) != 14:
        raise WireError("a message must be an array of 14 fields")
    (kind, to, frm, term, log_term, index, entries, commit, reject, hint_index, hint_term,
     snap, context, force) = item
    mtype = _TYPES.get(kind) if type(kind) is int else None
    if mtype is None:
        raise WireError(f"unknown message type {kind!r}")
    if not isinstance(to, str) or not isinstance(frm, str):
        raise WireError("message endpoints must be strings")
    if not isinstance(entries, list):
        raise WireError("entries must be a list")
    decoded = []
    for e in entries:
        if (not isinstance(e, list) or len(e) not in (4, 5) or type(e[0]) is not int
                or type(e[1]) is not int or type(e[2]) is not int or type(e[3]) is not bytes):
            raise WireError("an entry must be [index, term, kind, bytes, ts_ms]")
        if e[2] not in _KINDS:
            raise WireError(f"unknown entry kind {e[2]}")
        decoded.append(Entry(_int(e[0], "entry index"), _int(e[1], "entry term"),
                             e[2], e[3], _int(e[4], "entry ts_ms") if len(e) == 5 else 0))
    if decoded:  # what any leader's log slice looks like; anything else would corrupt a log
        first = _int(index, "index") + 1
        for i, e in enumerate(decoded):
            if e.index != first + i:
                raise WireError(f"entries must follow index {first - 1} one by one; entry "
                                f"{i} has index {e.index}")
            before = decoded[i - 1].term if i else _int(log_term, "log term")
            if e.term > _int(term, "term") or e.term < before:
                raise WireError("entry terms must not decrease nor exceed the message's term")
    snapshot = None
    if snap is not None:
        if not isinstance(snap, list) or len(snap) not in (3, 4) or type(snap[2]) is not bytes:
            raise WireError("a snapshot must be [index, term, membership, ts_ms]")
        membership = _membership(snap[2])
        snapshot = Snapshot(SnapshotMeta(_int(snap[0], "snapshot index"),
                                         _int(snap[1], "snapshot term"), membership,
                                         _int(snap[3], "snapshot ts_ms") if len(snap) == 4
                                         else 0))
    if context is not None and not isinstance(context, str):
        context = _int(context, "context")
    return Message(
        mtype, to, frm, _int(term, "term"), _int(log_term, "log term"), _int(index, "index"),
        decoded, _int(commit, "commit"), bool(reject), _int(hint_index, "hint index"),
        _int(hint_term, "hint term"), snapshot, context, bool(force),
    )
