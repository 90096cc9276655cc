"""A hostile peer: forged Raft batches sent to a member's peer port, byte for byte.

The node's own encoder (``flotilla.node.wire.encode_batch``) only writes what a member would
write; an attacker writes anything. So this module builds the msgpack arrays itself, in the
wire format of ``node/wire.py``::

    batch   = [version, cluster_id, sender, sender_peer_url, sender_client_url, [message...]]
    message = [type, to, frm, term, log_term, index, entries, commit, reject, hint_index,
               hint_term, snapshot, context, force]

with no check on any value: a term of 2**64 - 1, an index of 2**63, a sender that is not a
member, an advertised URL pointing anywhere. ``message()`` returns one message as a list;
``batch()`` packs a batch of them (``repeat`` makes a batch of a million messages cost one
``bytes * n``, not a million lists).

``Forger`` delivers them over the three peer routes, on plain sockets so that nothing on the
way (a client library's size limit, its retry, its wait for the whole upload) hides what the
member does:

* ``post(path, body)``: one HTTP/1.1 request. The body goes out in chunks while the socket is
  watched for an early answer, so a member that refuses before reading the body is seen doing
  so (``Answer.body_sent`` says how much it had been sent); ``send_at_most`` stops the upload
  part way and waits for an answer to what was sent.
* ``post_messages(batch)``: ``POST /raft/v1/messages`` with the headers a member sends
  (``Flotilla-Cluster-Id`` with the forger's id and ``Flotilla-Sender`` naming the batch's
  sender), unless told otherwise.
* ``stream(sender)``: the WebSocket of ``GET /raft/v1/stream`` (RFC 6455 by hand), one binary
  frame per batch; ``PeerStream.closed_within`` tells whether and how the member closed it.
* ``post_snapshot(header, payload)``: the snapshot route, its header batch in
  ``Flotilla-Message`` (and the member's headers, as above).

Every connection can be wrapped in TLS: pass an ``ssl.SSLContext`` (with a client certificate
loaded, or none, or one from another CA) to ``Forger`` for the mutual-TLS phase.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import select
import socket
import ssl
import struct
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import msgpack
from flotilla.node.consensus import MessageType  # packed as the integer the wire carries

__all__ = [
    "MAX_U64",
    "SIGNED_LIMIT",
    "Answer",
    "Forger",
    "MessageType",
    "PeerStream",
    "batch",
    "batch_sender",
    "message",
    "packed",
    "snapshot_meta",
]

#: The largest value msgpack can carry (and so the largest a forged field can hold).
MAX_U64 = (1 << 64) - 1
#: Terms, indexes and commits must stay below this (a signed 64-bit integer, as on disk).
SIGNED_LIMIT = 1 << 63
WIRE_VERSION = 1
CHUNK = 64 << 10
CLUSTER_HEADER = "Flotilla-Cluster-Id"
SENDER_HEADER = "Flotilla-Sender"


def message(kind: int, to: str, frm: str, term: int, *, log_term: int = 0, index: int = 0,
            entries: Sequence[Sequence[Any]] = (), commit: int = 0, reject: bool = False,
            hint_index: int = 0, hint_term: int = 0, snapshot: Sequence[Any] | None = None,
            context: Any = None, force: bool = False) -> list[Any]:
    """One message as the 14-field array of the wire, whatever the values (``kind`` is a
    ``MessageType`` or any integer)."""
    return [kind, to, frm, term, log_term, index, [list(e) for e in entries], commit, reject,
            hint_index, hint_term, None if snapshot is None else list(snapshot), context,
            force]


def snapshot_meta(index: int, term: int, voters: Iterable[str],
                  addresses: Mapping[str, str] | None = None, ts_ms: int = 0) -> list[Any]:
    """A snapshot message's metadata: ``[index, term, membership JSON, ts_ms]``."""
    doc: dict[str, Any] = {"voters": sorted(voters), "learners": []}
    if addresses:
        doc["addresses"] = dict(addresses)
    return [index, term, json.dumps(doc, separators=(",", ":")).encode(), ts_ms]


def packed(msg: Sequence[Any]) -> bytes:
    """A message packed on its own (``batch`` takes these as they are)."""
    return msgpack.packb(list(msg), use_bin_type=True)


def batch(cluster_id: str, sender: str, messages: Iterable[Sequence[Any] | bytes], *,
          peer_url: str = "", client_url: str = "", version: int = WIRE_VERSION,
          repeat: int = 1) -> bytes:
    """A peer batch; each message is a list (``message()``) or already packed bytes. With
    ``repeat``, the messages appear that many times over (a batch of millions costs one
    ``bytes * repeat``)."""
    items = [m if isinstance(m, bytes) else packed(m) for m in messages]
    head = msgpack.Packer(use_bin_type=True)
    parts = [head.pack_array_header(6)]
    parts += [head.pack(x) for x in (version, cluster_id, sender, peer_url, client_url)]
    parts.append(head.pack_array_header(len(items) * repeat))
    return b"".join(parts) + b"".join(items) * repeat


def batch_sender(body: bytes) -> str | None:
    """The sender a batch names, read from its head alone (a batch may be 25 MiB)."""
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(body[:4096])
    try:
        if unpacker.read_array_header() != 6:
            return None
        unpacker.skip()  # the version
        unpacker.skip()  # the cluster id
        sender = unpacker.unpack()
    except Exception:  # not a batch's head: nobody to name
        return None
    return sender if isinstance(sender, str) else None


# ---------------------------------------------------------------------------------------------
# Sending


@dataclass(frozen=True)
class Answer:
    """What the member did with one request.

    ``status`` is None when it closed the connection without answering (or did not answer
    within the timeout: then ``timed_out``). ``elapsed`` runs from the first byte sent to the
    answer (or the close); ``body_sent`` is how much of the body went out before that."""

    status: int | None
    headers: Mapping[str, str]
    body: bytes
    elapsed: float
    body_sent: int
    timed_out: bool = False
    error: str | None = None

    def __str__(self) -> str:
        if self.status is None:
            what = "no answer (timed out)" if self.timed_out else f"no answer ({self.error})"
        else:
            what = f"{self.status} {self.body[:160]!r}"
        return f"{what} after {self.elapsed:.2f}s, {self.body_sent} body bytes sent"


class Forger:
    """Requests to one member's peer port (``peer_url``, http:// or https://), as anybody."""

    def __init__(self, peer_url: str, cluster_id: str, *,
                 ssl_context: ssl.SSLContext | None = None, timeout: float = 10.0) -> None:
        parts = urlsplit(peer_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
            raise ValueError(f"expected a peer URL like http://127.0.0.1:2380, got {peer_url!r}")
        if parts.scheme == "https" and ssl_context is None:
            raise ValueError(f"{peer_url} needs an ssl_context")
        self.url = peer_url.rstrip("/")
        self.host, self.port = parts.hostname, parts.port
        self.cluster_id = cluster_id
        self.ssl_context = ssl_context
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"Forger({self.url!r})"

    def connect(self, timeout: float | None = None) -> socket.socket:
        """A connected socket to the member (TLS-wrapped when there is a context)."""
        sock = socket.create_connection((self.host, self.port),
                                        timeout=self.timeout if timeout is None else timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl_context is not None:
            try:
                sock = self.ssl_context.wrap_socket(sock, server_hostname=self.host)
            except BaseException:
                sock.close()
                raise
        return sock

    # -- HTTP -----------------------------------------------------------------------------

    def post(self, path: str, body: bytes, *, headers: Mapping[str, str] | None = None,
             chunked: bool = False, send_at_most: int | None = None,
             timeout: float | None = None) -> Answer:
        """POST ``body`` (with Content-Length, or ``chunked``) and read the answer.

        The body leaves in 64 KiB pieces; before each the socket is checked for an answer, and
        the upload stops at the first one. With ``send_at_most``, at most that many body bytes
        are sent and the rest is withheld while waiting: only a member that answers without
        the whole body answers at all."""
        timeout = self.timeout if timeout is None else timeout
        head = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}",
                "Content-Type: application/octet-stream"]
        head.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {len(body)}")
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        start = time.monotonic()
        try:
            sock = self.connect(timeout)
        except OSError as exc:
            return Answer(None, {}, b"", time.monotonic() - start, 0, error=repr(exc))
        with sock:
            sent = 0
            limit = len(body) if send_at_most is None else min(send_at_most, len(body))
            try:
                sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
                while sent < limit and not _readable(sock):
                    piece = body[sent:min(limit, sent + CHUNK)]
                    sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                    sent += len(piece)
                if chunked and sent == len(body) and not _readable(sock):
                    sock.sendall(b"0\r\n\r\n")
            except OSError as exc:  # the member closed the connection on us: read what it said
                early = _read_answer(sock, start, sent, timeout)
                return early if early.status is not None else Answer(
                    None, {}, b"", time.monotonic() - start, sent, error=repr(exc))
            return _read_answer(sock, start, sent, timeout)

    def identity(self, batch: bytes) -> dict[str, str]:
        """The headers a member sends with ``batch``: this forger's cluster id and the sender
        the batch names (what the receiver checks before reading a body)."""
        headers = {CLUSTER_HEADER: self.cluster_id}
        sender = batch_sender(batch)
        if sender is not None:
            headers[SENDER_HEADER] = sender
        return headers

    def post_messages(self, body: bytes, *, identify: bool = True, **options: Any) -> Answer:
        """``POST /raft/v1/messages``, with the headers a member sends (``identity``) unless
        ``identify`` is false; ``headers`` given in ``options`` win; the rest as for
        ``post``."""
        headers = {**(self.identity(body) if identify else {}), **options.pop("headers", {})}
        return self.post("/raft/v1/messages", body, headers=headers, **options)

    def post_snapshot(self, header: bytes, payload: bytes, *, identify: bool = True,
                      **options: Any) -> Answer:
        """``POST /raft/v1/snapshot``: ``header`` is a batch holding the snapshot message (sent
        hex-encoded in ``Flotilla-Message``), ``payload`` the state machine's bytes."""
        headers = {**(self.identity(header) if identify else {}),
                   "Flotilla-Message": header.hex(), **options.pop("headers", {})}
        return self.post("/raft/v1/snapshot", payload, headers=headers, **options)

    # -- the stream -----------------------------------------------------------------------

    def stream(self, sender: str, *, cluster_id: str | None = None,
               headers: Mapping[str, str] | None = None) -> PeerStream:
        """Open ``GET /raft/v1/stream`` as ``sender``. The handshake's answer is in
        ``PeerStream.status``: 101 when the member took the stream, 0 when it did not answer
        (why in ``PeerStream.error``)."""
        key = base64.b64encode(os.urandom(16)).decode()
        head = [
            "GET /raft/v1/stream HTTP/1.1", f"Host: {self.host}:{self.port}",
            "Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}",
            "Sec-WebSocket-Version: 13",
            f"{CLUSTER_HEADER}: {self.cluster_id if cluster_id is None else cluster_id}",
            f"{SENDER_HEADER}: {sender}",
        ]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        try:
            sock = self.connect()
        except OSError as exc:
            return PeerStream(None, 0, b"", error=repr(exc))
        try:
            sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
            status, rest = _read_head(sock)
        except (OSError, http.client.HTTPException) as exc:
            sock.close()
            return PeerStream(None, 0, b"", error=repr(exc))
        if status != 101:
            sock.close()
            return PeerStream(None, status, rest)
        return PeerStream(sock, 101, b"", rest)  # `rest`: frames sent right after the head


class PeerStream:
    """One WebSocket to a member's peer port, written frame by frame."""

    def __init__(self, sock: socket.socket | None, status: int, body: bytes,
                 buffered: bytes = b"", error: str | None = None) -> None:
        self.sock = sock
        # The handshake's answer: 101, the refusal's status, or 0 for none (then `error`).
        self.status = status
        self.body = body  # the start of the refusal's body
        self.error = error
        self._buffer = bytearray(buffered)
        self.close_code: int | str | None = None  # once closed: its code, or "eof"/"reset"

    @property
    def open(self) -> bool:
        return self.sock is not None and self.close_code is None

    def send(self, frame: bytes) -> bool:
        """Send one binary frame (a batch); False when the member closed the stream first,
        or stopped reading it (the socket's timeout ran out, the stream stays open)."""
        if not self.open:
            return False
        assert self.sock is not None
        # A zero masking key is a valid one (RFC 6455 5.3) and leaves 25 MiB unchanged.
        header = bytearray([0x82])
        n = len(frame)
        if n < 126:
            header.append(0x80 | n)
        elif n < 1 << 16:
            header += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            header += bytes([0x80 | 127]) + struct.pack("!Q", n)
        header += b"\0\0\0\0"
        try:
            self.sock.sendall(bytes(header))
            view = memoryview(frame)
            for at in range(0, n, CHUNK):
                if _readable(self.sock):  # it answered (a close) before taking the frame
                    self.closed_within(0.0)
                    if not self.open:
                        return False
                self.sock.sendall(view[at:at + CHUNK])
        except TimeoutError:
            return False
        except OSError:
            self.close_code = "reset"
            return False
        return True

    def closed_within(self, seconds: float) -> int | str | None:
        """Wait up to ``seconds`` for the member to close the stream; the close code (or
        "eof"/"reset" for a connection that just ended), or None while it stays open."""
        if self.sock is None:
            return self.status
        deadline = time.monotonic() + seconds
        while self.close_code is None:
            code = self._close_in_buffer()
            if code is not None:
                self.close_code = code
                break
            if not _readable(self.sock, max(0.0, deadline - time.monotonic())):
                return None
            try:
                data = self.sock.recv(CHUNK)
            except OSError:
                self.close_code = "reset"
                break
            if not data:
                self.close_code = "eof"
                break
            self._buffer += data
        return self.close_code

    def _close_in_buffer(self) -> int | str | None:
        """Consume whole frames from the buffer; the code of a close frame if one came."""
        buf = self._buffer
        while len(buf) >= 2:
            opcode, n, at = buf[0] & 0x0F, buf[1] & 0x7F, 2
            if n == 126:
                if len(buf) < 4:
                    return None
                n, at = struct.unpack("!H", buf[2:4])[0], 4
            elif n == 127:
                if len(buf) < 10:
                    return None
                n, at = struct.unpack("!Q", buf[2:10])[0], 10
            if buf[1] & 0x80:
                at += 4  # a server never masks, but a hostile one might
            if len(buf) < at + n:
                return None
            payload = bytes(buf[at:at + n])
            del buf[:at + n]
            if opcode == 0x8:
                return struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
        return None

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                if self.close_code is None:
                    self.sock.sendall(b"\x88\x82\0\0\0\0" + struct.pack("!H", 1000))
            self.sock.close()
            self.sock = None

    def __enter__(self) -> PeerStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _readable(sock: socket.socket, wait: float = 0.0) -> bool:
    """Whether the member has sent something (or closed), waiting up to ``wait`` seconds."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return True
    return bool(select.select([sock], [], [], wait)[0])


def _read_head(sock: socket.socket) -> tuple[int, bytes]:
    """Read an HTTP response head; its status and the bytes that came after it."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(CHUNK)
        if not more:
            raise http.client.RemoteDisconnected("the member closed the connection before "
                                                 f"answering the handshake ({data[:80]!r})")
        data += more
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise http.client.BadStatusLine(status_line)
    return int(parts[1]), rest


def _read_answer(sock: socket.socket, start: float, sent: int, timeout: float) -> Answer:
    sock.settimeout(max(0.01, timeout - (time.monotonic() - start)))
    response = http.client.HTTPResponse(sock)
    try:
        response.begin()
        body = response.read()
    except TimeoutError:
        return Answer(None, {}, b"", time.monotonic() - start, sent, timed_out=True)
    except (OSError, http.client.HTTPException) as exc:
        return Answer(None, {}, b"", time.monotonic() - start, sent, error=repr(exc))
    return Answer(response.status, dict(response.getheaders()), body, time.monotonic() - start,
                  sent)
