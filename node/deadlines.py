"""Read deadlines on both ports: no connection holds a member's resources for long without
sending what it owes. All of them live in the connection's protocol handler, so no request
pays for them in its handler (no timer, no extra await on the hot path):

- A request's line and headers must be complete within HEADER_TIMEOUT of its first byte.
- A request body must keep coming: a connection whose body has sent nothing for BODY_TIMEOUT
  is closed (a long body, such as a streamed snapshot, may take as long as it keeps moving;
  while the member itself has paused reading, the client is not to blame and nothing is
  counted).
- A connection with no request under way is closed after IDLE_TIMEOUT: aiohttp's keep-alive
  timer after an answer, and this handler's own for a connection that never sends a byte
  (aiohttp arms its timer at a connection's start only from 3.14.4 on).
A WebSocket stream, once open, is kept alive by its pings instead (see transport).
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

HEADER_TIMEOUT = 10.0
IDLE_TIMEOUT = 30.0
BODY_TIMEOUT = 15.0
# After answering a request whose body was not read whole, the rest is read (and dropped) for
# at most this long before the connection closes, so the client sees the answer.
LINGER = 2.0


class _DeadlineHandler(RequestHandler):
    """aiohttp's request handler with deadlines on a request's headers and on its body."""

    __slots__ = ("_answered", "_body", "_body_seen", "_silent", "_timer")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._silent: asyncio.TimerHandle | None = None  # until the connection's first byte
        self._body: StreamReader | None = None  # the body still arriving, if any
        self._body_seen = 0.0  # loop time of its latest bytes
        self._answered = 0  # requests answered whole on a connection that stays open

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._silent = self._loop.call_later(IDLE_TIMEOUT, self._never_spoke)

    def data_received(self, data: bytes) -> None:
        if self._silent is not None:
            self._silent.cancel()
            self._silent = None
        # No request under way: the handler waits for one, or (uvloop delivers a connection's
        # first bytes before the handler's task has run) none has arrived yet.
        waiting = ((self._waiter is not None and not self._waiter.done())
                   or (self._request_count == 0 and not self._messages))
        before = self._request_count
        super().data_received(data)
        if self._body is not None:
            if not self._body.is_eof():
                self._body_seen = self._loop.time()
                return
            self._stop()
        if self._request_count != before:  # a request's headers are complete
            self._stop()
            body = self._messages[-1][1] if self._messages else None
            if body is not None and not body.is_eof():
                self._body, self._body_seen = body, self._loop.time()
                self._timer = self._loop.call_later(BODY_TIMEOUT, self._body_late)
        elif waiting and self._timer is None:
            self._timer = self._loop.call_later(HEADER_TIMEOUT, self._headers_late, before)

    async def finish_response(self, request: Any, resp: Any, start_time: float | None) -> Any:
        resp, reset = await super().finish_response(request, resp, start_time)
        if not reset and resp.keep_alive and not (self._close or self._force_close):
            self._answered += 1  # written whole, and the connection stays open after it
        return resp, reset

    def idle(self) -> bool:
        """Whether the handler has written the answer to every request it was given (the
        client lane's test before it serves the connection's next request itself). Its task
        may not be back waiting for the next request yet: uvloop hands a connection's bytes
        over before the task that wrote an answer has resumed the one that waits, and a
        client that sends its next request as soon as it has the answer often wins that race.
        On its way back the task neither writes to the connection nor closes it (an answer
        after which the connection closes is not counted: that connection stays aiohttp's)."""
        return self._answered == self._request_count  # (a request still queued is unanswered)

    def keep_open(self) -> None:
        """The connection served a request outside this handler (the client lane): aiohttp's
        keep-alive deadline starts again, as after one of its own answers."""
        self._next_keepalive_close_time = self._loop.time() + self._keepalive_timeout

    def _never_spoke(self) -> None:
        self._silent = None
        if self.transport is not None:
            self.force_close()

    def _headers_late(self, count: int) -> None:
        self._timer = None
        if self._request_count == count and self.transport is not None:
            self.force_close()

    def _body_late(self) -> None:
        self._timer = None
        body = self._body
        if body is None or body.is_eof() or self.transport is None:
            self._body = None
            return
        left = self._body_seen + BODY_TIMEOUT - self._loop.time()
        if self._reading_paused:  # our handler is behind, not the client
            self._body_seen, left = self._loop.time(), BODY_TIMEOUT
        if left > 0:
            self._timer = self._loop.call_later(left, self._body_late)
            return
        self._body = None
        self.force_close()

    def _stop(self) -> None:
        self._body = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop()
        if self._silent is not None:
            self._silent.cancel()
            self._silent = None
        super().connection_lost(exc)


class DeadlineSite(web.TCPSite):
    """A TCP site whose connections get HEADER_TIMEOUT, BODY_TIMEOUT and IDLE_TIMEOUT.

    `lane`, when given, makes each connection's first protocol: `lane.protocols(handler)`
    takes the factory of aiohttp's handler and returns the one of the lane's connections
    (client_lane.ClientLane), which serve what they can and hand the rest over."""

    def __init__(self, *args: Any, lane: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lane = lane

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        def handler() -> RequestHandler:
            kwargs = {"keepalive_timeout": IDLE_TIMEOUT, "lingering_time": LINGER,
                      **server._kwargs}
            return _DeadlineHandler(server, loop=loop, **kwargs)

        factory = handler if self._lane is None else self._lane.protocols(handler)
        self._server = await loop.create_server(
            factory, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port)
