"""Read deadlines on both ports: no connection holds a member's resources for long without
sending what it owes.

- A request's line and headers must be complete within HEADER_TIMEOUT of its first byte.
- A connection with no request under way is closed after IDLE_TIMEOUT (aiohttp's keep-alive
  timer, which also covers a connection that never sends a byte).
- A request body must arrive within BODY_TIMEOUT (`read_body`); a streamed snapshot may take
  longer but no chunk may be BODY_TIMEOUT late (`chunks_within`).
A WebSocket stream, once open, is kept alive by its pings instead (see transport).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

HEADER_TIMEOUT = 10.0
IDLE_TIMEOUT = 30.0
BODY_TIMEOUT = 15.0
# After answering a request whose body was not read whole, the rest is read (and dropped) for
# at most this long before the connection closes, so the client sees the answer.
LINGER = 2.0


class BodyTimeout(Exception):
    """A request body did not arrive in time."""


class _DeadlineHandler(RequestHandler):
    """aiohttp's request handler with a deadline on a request's headers."""

    __slots__ = ("_header_timer",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def data_received(self, data: bytes) -> None:
        waiting = self._waiter is not None and not self._waiter.done()  # no request under way
        before = self._request_count
        super().data_received(data)
        if self._request_count != before:
            self._stop_header_timer()
        elif waiting and self._header_timer is None:
            self._header_timer = self._loop.call_later(HEADER_TIMEOUT, self._headers_late,
                                                       before)

    def _headers_late(self, count: int) -> None:
        self._header_timer = None
        if self._request_count == count and self.transport is not None:
            self.force_close()

    def _stop_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_header_timer()
        super().connection_lost(exc)


class DeadlineSite(web.TCPSite):
    """A TCP site whose connections get HEADER_TIMEOUT and IDLE_TIMEOUT."""

    async def start(self) -> None:
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        server = self._runner.server
        assert server is not None

        def handler() -> RequestHandler:
            kwargs = {"keepalive_timeout": IDLE_TIMEOUT, "lingering_time": LINGER,
                      **server._kwargs}
            return _DeadlineHandler(server, loop=loop, **kwargs)

        self._server = await loop.create_server(
            handler, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port)


async def read_body(request: web.BaseRequest) -> bytes:
    """The request's body (kept: `request.read()` returns it again), or BodyTimeout."""
    try:
        async with asyncio.timeout(BODY_TIMEOUT):
            return await request.read()
    except TimeoutError:
        raise BodyTimeout(f"the request body did not arrive within {BODY_TIMEOUT:g} s") from None


async def chunks_within(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`chunks`, each due within BODY_TIMEOUT of the one before, else BodyTimeout."""
    iterator = aiter(chunks)
    while True:
        try:
            async with asyncio.timeout(BODY_TIMEOUT):
                chunk = await anext(iterator)
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise BodyTimeout(f"the streamed body stalled for {BODY_TIMEOUT:g} s") from None
        yield chunk
