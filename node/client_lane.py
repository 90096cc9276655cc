"""The client port's lane for plain writes: a leader's `PUT` and `DELETE /v1/kv/{key}` served
by the connection's protocol itself, without aiohttp's per-request machinery.

aiohttp spends about 50 us of the leader's CPU on every request (parsing into a Request,
routing, middleware, a Response and its serialisation): a third of what a write costs the
leader at 64 clients (`bench/http_overhead.py`, `bench/profile_node.py`). Every connection on
the client port starts here. A request is served in this lane only when it is, byte for byte,
the common case:

- `HTTP/1.1`, `PUT` or `DELETE`, a target `/v1/kv/<key>` of unreserved and percent-encoded
  characters only (no query), a key of valid UTF-8 within MAX_KEY_BYTES (dot segments are
  part of the key, as in the full API: the path is taken as sent);
- headers of token names and visible ASCII values, a single Content-Length within the value
  limit (a PUT has one, a DELETE none or 0), no Transfer-Encoding, Expect or Upgrade, no
  `Connection` but keep-alive, valid Flotilla-Client and Flotilla-Seq if any;
- this member leads and runs the key-value machine.

Anything else goes to aiohttp's handler for the connection, so that its answer, and every
check and error, is exactly the full API's, in one of two ways:

- **lent**: a request that is whole in the buffer with nothing behind it, its framing beyond
  doubt (every line well formed, one Content-Length or none, no Transfer-Encoding, Expect or
  Upgrade, `Connection` keep-alive if given): another route, a query, a follower's write to
  forward, a write with a wrong header. aiohttp gets exactly its bytes; once it has written
  its answer (its task need not be back waiting: bytes sent the moment the answer arrived are
  the lane's), the lane takes the connection's next bytes again. So a client that reads and
  writes on one keep-alive connection keeps the lane for its writes.
- **handed over for good**: anything whose extent the lane would have to guess (a bare CR or
  LF, a framing of any other kind, bytes that are no request of this port's), a request sent
  before aiohttp answered the one it has, a half-closed connection with a request incomplete:
  every byte received goes to aiohttp, and the transport's protocol becomes its handler.

So the lane only has to be right about what it accepts and about where a request ends, and
`tests/node/test_client_lane.py` sends the same requests, alone and taking turns on one
connection, down both paths and compares what was written and answered.

The lane keeps the port's deadlines (deadlines.py): the head within HEADER_TIMEOUT of its first
byte, a body that keeps coming within BODY_TIMEOUT, an idle connection closed after
IDLE_TIMEOUT; one timer per connection, re-armed lazily. Requests sent before their answers
(pipelining) are answered in order, one at a time; reading pauses while a request's worth of
bytes waits behind the one being served, and while the client does not read its answers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote_to_bytes

from aiohttp.http import SERVER_SOFTWARE
from flotilla.node.consensus import NotLeader
from flotilla.node.statemachine.kv import KVStateMachine, encode_delete, encode_put

from .deadlines import BODY_TIMEOUT, HEADER_TIMEOUT, IDLE_TIMEOUT
from .http_api import (
    CUT_SHORT,
    JSON_TYPE,
    KV_PREFIX,
    MAX_KEY_BYTES,
    MAX_URL_BYTES,
    MAX_WHOLE,
    refusal,
    unexpected,
    write_outcome,
)
from .node import Node

#: The metric's route label, the same as aiohttp's route pattern gives.
KV_ROUTE = KV_PREFIX + "{key}"
#: A head longer than this (without its end) goes to aiohttp, which judges it.
HEAD_LIMIT = MAX_URL_BYTES + 8192

_TOKEN = b"!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
# RFC 3986 unreserved characters, '%' of an escape and '/': no query, fragment or sub-delims
_PATH = b"-._~%/0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_VISIBLE = bytes(range(0x20, 0x7F)) + b"\t"
_PUNT = object()  # "hand the connection to aiohttp for good"
_METHODS = (b"GET", b"PUT", b"POST", b"DELETE", b"HEAD")  # what the client port routes
_STARTS = tuple(m + b" /" for m in _METHODS)
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_ANSWER_HEADERS = b"Content-Type: %s\r\nServer: %s\r\n" % (JSON_TYPE.encode(),
                                                              SERVER_SOFTWARE.encode())


def _lines_in_doubt(part: bytearray) -> bool:
    """Whether `part` holds a CR or LF that is not half of a CRLF: where a line ends would be
    a guess (one parser may end it where another does not)."""
    return not part.count(b"\r") == part.count(b"\n") == part.count(b"\r\n")


def _may_be_request(part: bytearray) -> bool:
    """Whether an incomplete head may still become a request this port serves: what aiohttp
    would refuse at once (a bare CR or LF, no method of the port's) goes to it at once too,
    rather than wait for an end of head that may never come."""
    if _lines_in_doubt(part[:-1] if part.endswith(b"\r") else part):  # a CRLF may be
        return False                                                    # arriving in halves
    start = bytes(part[:8])
    return any(start.startswith(m) or m.startswith(start) for m in _STARTS)


class ClientLane:
    """What the client port's connections share: the member, the way to make aiohttp's
    handler for a connection handed over, and the connections still in the lane."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.handler_factory: Callable[[], asyncio.Protocol] | None = None
        self.max_body = node.cfg.max_value_bytes
        self.connections: set[LaneConnection] = set()
        self._date_second = -1
        self._date = b""

    def protocols(self, handler_factory: Callable[[], asyncio.Protocol]
                  ) -> Callable[[], LaneConnection]:
        """The port's protocol factory, given the one of aiohttp's handler."""
        self.handler_factory = handler_factory
        return lambda: LaneConnection(self)

    def date(self) -> bytes:
        now = int(time.time())
        if now != self._date_second:
            self._date_second = now
            self._date = formatdate(now, usegmt=True).encode()
        return self._date

    def answer(self, status: int, body: bytes, headers: dict[str, str]) -> bytes:
        """The bytes of a JSON answer with aiohttp's headers (Date, Server, Content-Length)."""
        extra = b"".join(b"%s: %s\r\n" % (name.encode(), value.encode("latin-1"))
                         for name, value in headers.items())
        return (b"HTTP/1.1 %d %s\r\n%s%sContent-Length: %d\r\nDate: %s\r\n\r\n%s"
                % (status, _REASONS.get(status, b"Unknown"), _ANSWER_HEADERS, extra,
                   len(body), self.date(), body))

    def error(self, status: int, code: str, sentence: str, headers: dict[str, str]) -> bytes:
        return self.answer(status, json.dumps({"error": sentence, "code": code}).encode(),
                           headers)

    async def close(self, _app: Any = None) -> None:
        """Close the connections still in the lane (the port is shutting down)."""
        for connection in list(self.connections):
            connection.close()


class LaneConnection(asyncio.Protocol):
    """One client connection, until it is handed over to aiohttp."""

    def __init__(self, lane: ClientLane) -> None:
        self.lane = lane
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.need = 0  # the size of the request whose head is read and body is still coming
        self.busy = False  # a request is being served: no other is read until it is answered
        self.eof = False
        self.write_paused = False
        self.read_paused = False
        # aiohttp's handler, once a request needed it; `lent`: it has one now, and the
        # connection's bytes go to it until it is idle again; `handed`: the connection is
        # its for good (the transport's protocol, which this one hears nothing more from).
        self.handler: Any = None
        self.lent = False
        self.handed = False
        # One deadline at a time (header, body or idle), checked by one lazily re-armed timer.
        self.due: float | None = None
        self.timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.lane.connections.add(self)
        self._arm(IDLE_TIMEOUT)

    def data_received(self, data: bytes) -> None:
        if self.lent:
            if not self.handler.idle():  # it is not done: the rest is its too
                self.buf += data
                self._hand_over()
                return
            self.lent = False  # answered: the lane serves the connection again
        first = not self.buf
        self.buf += data
        if self.busy or self.write_paused:
            if len(self.buf) > self.lane.max_body + HEAD_LIMIT and not self.read_paused:
                self.read_paused = True
                self.transport.pause_reading()
            return
        if first:
            self._arm(HEADER_TIMEOUT)  # the head must be whole this long after its first byte
        elif len(self.buf) < self.need:
            self._arm(BODY_TIMEOUT)  # the body keeps coming: its deadline moves on
            return
        self._serve()

    def eof_received(self) -> bool | None:
        if self.lent and not self.handler.idle():
            return self.handler.eof_received()
        self.lent = False
        self.eof = True
        if self.busy or self.write_paused:
            return True  # answer what was asked, then close
        self._cut_short()
        return None  # the transport closes

    def _cut_short(self) -> None:
        """The client sent its last byte with a request incomplete in the buffer."""
        if self.need:  # a write's head came, and the end of its body never will
            self.transport.write(self.lane.error(400, "bad_request", CUT_SHORT, {}))
        # (A head still incomplete is no request to answer: complete heads the lane does not
        # serve were handed over already.)
        self.buf.clear()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.handler is not None:
            self.handler.connection_lost(exc)
        self.lane.connections.discard(self)
        self.transport = None
        self.due = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def pause_writing(self) -> None:
        if self.handler is not None:
            self.handler.pause_writing()
        self.write_paused = True
        if not self.busy:
            self._arm(IDLE_TIMEOUT)  # a client that reads none of its answers is let go

    def resume_writing(self) -> None:
        if self.handler is not None:
            self.handler.resume_writing()
        self.write_paused = False
        if not self.busy and not self.lent and self.transport is not None:
            self._serve()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # --- deadlines -------------------------------------------------------------------------

    def _arm(self, seconds: float) -> None:
        self.due = due = self.loop.time() + seconds
        timer = self.timer
        if timer is not None:
            if timer.when() <= due:
                return  # it fires first and moves itself on to `due`
            timer.cancel()
        self.timer = self.loop.call_at(due, self._expire)

    def _expire(self) -> None:
        self.timer = None
        if self.due is None or self.busy or self.lent or self.transport is None:
            return
        if self.loop.time() < self.due:
            self.timer = self.loop.call_at(self.due, self._expire)
            return
        if self.write_paused:  # it reads none of its answers: nothing would be flushed
            self.transport.abort()
        else:
            self.transport.close()  # as aiohttp's deadlines do: no answer to a late request

    # --- serving ---------------------------------------------------------------------------

    def _serve(self) -> None:
        """Serve the complete requests buffered, in order, until one is under way."""
        while (not (self.busy or self.lent or self.handed or self.write_paused)
               and self.transport is not None):
            if not self.buf:
                if self.eof:
                    self.transport.close()
                else:
                    self._arm(IDLE_TIMEOUT)
                return
            self.need = 0
            request = self._parse()
            if request is None:  # incomplete: wait for more (the deadline set stands)
                if self.eof:  # ... which will not come
                    self._cut_short()
                    self.transport.close()
                return
            if request is _PUNT:
                self._hand_over()
                return
            if len(request) == 1:  # aiohttp's request
                self._to_aiohttp(request[0])
                return
            self._start(*request)
        if self.read_paused and len(self.buf) <= self.lane.max_body + HEAD_LIMIT \
                and self.transport is not None:
            self.read_paused = False
            self.transport.resume_reading()

    def _parse(self) -> Any:
        """The next request: (size, method, key, body, client, seq) to serve in the lane;
        (size,) for one that is aiohttp's, whole and framed beyond doubt (a single
        Content-Length or none, no Transfer-Encoding, every line well formed); None while the
        request is incomplete; _PUNT when the connection is to be aiohttp's for good."""
        buf = self.buf
        end = buf.find(b"\r\n\r\n", 0, HEAD_LIMIT)
        if end < 0:
            return _PUNT if len(buf) >= HEAD_LIMIT or not _may_be_request(buf) else None
        head = buf[:end]
        if _lines_in_doubt(head):
            return _PUNT
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or parts[2] != b"HTTP/1.1" or parts[0] not in _METHODS:
            return _PUNT
        method, target = parts[0], parts[1]
        ours = ((method == b"PUT" or method == b"DELETE") and target.startswith(b"/v1/kv/")
                and len(target) > 7 and not target.translate(None, _PATH))
        length = client = seq = None
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name.translate(None, _TOKEN):
                return _PUNT
            value = value.strip(b" \t")
            if value.translate(None, _VISIBLE):
                return _PUNT
            name = name.lower()
            if name == b"content-length":
                if length is not None or not value.isdigit() or len(value) > 19:
                    return _PUNT
                length = int(value)
            elif name == b"flotilla-client":
                if client is not None or not value:
                    ours = False
                client = value.decode()
            elif name == b"flotilla-seq":
                if (seq is not None or not value.isdigit() or len(value) > 19
                        or not 1 <= int(value) <= MAX_WHOLE):
                    ours = False
                seq = value
            elif name == b"connection":
                if value.lower() != b"keep-alive":
                    return _PUNT
            elif name in (b"transfer-encoding", b"expect", b"upgrade"):
                return _PUNT
        if length is not None and length > self.lane.max_body:
            return _PUNT  # aiohttp refuses it (413) before its body
        size = end + 4 + (length or 0)
        if len(buf) < size:
            self.need = size
            self._arm(BODY_TIMEOUT)  # the body must keep coming
            return None
        if ours and (client is None) == (seq is None) and (
                length is not None if method == b"PUT" else not length):
            node = self.lane.node
            # forwarding, and other machines' answers, are the full API's
            if node.is_leader() and isinstance(node.machine, KVStateMachine):
                raw = unquote_to_bytes(bytes(target[7:]))
                if len(raw) <= MAX_KEY_BYTES:
                    try:
                        return (size, method, raw.decode("utf-8"), bytes(buf[end + 4:size]),
                                client, None if seq is None else int(seq))
                    except UnicodeDecodeError:
                        pass
        return (size,)

    def _start(self, size: int, method: bytes, key: str, body: bytes, client: str | None,
               seq: int | None) -> None:
        started = time.perf_counter()
        ts = int(time.time() * 1000)
        if self.handler is not None:
            self.handler.keep_open()  # aiohttp's idle deadline must not end a busy connection
        command = (encode_put(key, body, ts=ts, client=client, seq=seq) if method == b"PUT"
                   else encode_delete(key, ts=ts, client=client, seq=seq))
        name = method.decode()
        try:
            _index, fut = self.lane.node.submit(command)
        except NotLeader:  # no longer: the full API forwards it
            self._to_aiohttp(size)
            return
        except Exception as exc:
            del self.buf[:size]
            self._answer(name, started, None, exc)
            return
        del self.buf[:size]
        self.busy = True
        self.due = None  # the member owes the answer now, not the client
        fut.add_done_callback(lambda f: self._done(f, name, started))

    def _done(self, fut: asyncio.Future, name: str, started: float) -> None:
        self.busy = False
        if self.buf:
            self._arm(HEADER_TIMEOUT)  # the next request's bytes are here already
        if fut.cancelled():
            self._answer(name, started, None, TimeoutError())
        elif (exc := fut.exception()) is not None:
            self._answer(name, started, None, exc)
        else:
            self._answer(name, started, fut.result(), None)
        if self.transport is not None:
            self._serve()

    def _answer(self, method: str, started: float, result: dict[str, Any] | None,
                exc: BaseException | None) -> None:
        lane = self.lane
        if exc is None:
            status, body, headers = write_outcome(result)  # type: ignore[arg-type]
            data = lane.answer(status, body, headers)
        else:
            known = refusal(exc) or unexpected(method, KV_ROUTE, exc)
            status = known[0]
            data = lane.error(*known)
        lane.node.metrics.request(method, KV_ROUTE, status, time.perf_counter() - started)
        if self.transport is not None:
            self.transport.write(data)

    def _aiohttp(self) -> Any:
        """aiohttp's handler for this connection, made when first needed."""
        if self.handler is None:
            assert self.lane.handler_factory is not None
            self.handler = self.lane.handler_factory()
            self.handler.connection_made(self.transport)
        return self.handler

    def _to_aiohttp(self, size: int) -> None:
        """Give aiohttp the request of `size` bytes at the head of the buffer: lent when it is
        all the buffer holds, else (requests sent behind it are all aiohttp's, in order) the
        connection with it."""
        if size == len(self.buf) and not self.eof:
            self._lend()  # and have the connection back once it is answered
        else:
            self._hand_over()

    def _lend(self) -> None:
        """Give aiohttp the one whole request buffered; the connection stays in the lane."""
        handler = self._aiohttp()
        self.lent = True
        self.due = None  # aiohttp's deadlines apply while it has the request
        if self.read_paused:
            self.read_paused = False
            self.transport.resume_reading()
        data, self.buf = bytes(self.buf), bytearray()
        handler.data_received(data)

    def _hand_over(self) -> None:
        """Give the connection, and every byte received on it so far, to aiohttp for good."""
        transport = self.transport
        assert transport is not None and not self.busy
        self.lane.connections.discard(self)
        self.due = None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.read_paused:
            self.read_paused = False
            transport.resume_reading()
        handler = self._aiohttp()
        self.handed = True
        transport.set_protocol(handler)
        data, self.buf = bytes(self.buf), bytearray()
        if data:
            handler.data_received(data)
