"""The read deadline of a connection that never sends a byte (node/deadlines.py), in process.

aiohttp arms its keep-alive timer at a connection's start only from 3.14.4 on; before that, a
connection that never spoke was held for ever. The member's handler has a deadline of its own
for it, whatever aiohttp does. These tests give aiohttp a keep-alive far longer than the
deadline, so only the member's own can close the connection in time.
(tests/hostile/test_deadlines.py checks every deadline on real members, with the real ones.)
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest
from aiohttp import web
from flotilla.node import deadlines

from tests.node.site_thread import SiteThread

IDLE_S = 1.0
AIOHTTP_KEEPALIVE_S = 60.0


@pytest.fixture
def port(monkeypatch) -> Iterator[int]:
    monkeypatch.setattr(deadlines, "IDLE_TIMEOUT", IDLE_S)

    async def ping(_: web.Request) -> web.Response:
        return web.Response(text="pong")

    def app() -> web.Application:
        app = web.Application()
        app.router.add_get("/ping", ping)
        return app

    served = SiteThread(app, keepalive_timeout=AIOHTTP_KEEPALIVE_S)
    try:
        yield served.port
    finally:
        served.close()


def closed_after(sock: socket.socket, limit: float) -> float | None:
    """Seconds until the server closed `sock` (reading nothing more), or None within `limit`."""
    began = time.monotonic()
    sock.settimeout(limit)
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    return time.monotonic() - began


def test_a_connection_that_never_sends_a_byte_is_closed_after_the_idle_deadline(port):
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        held = closed_after(sock, IDLE_S * 5)
    assert held is not None, f"still open {IDLE_S * 5}s later"
    assert IDLE_S * 0.8 <= held <= IDLE_S * 3, held


def test_a_connection_that_spoke_is_not_cut_by_that_deadline(port):
    """The first byte ends the silent deadline: a connection that sent a request just before it
    and got its answer is then aiohttp's to keep alive (here: far longer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        time.sleep(IDLE_S * 0.6)
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        assert closed_after(sock, IDLE_S * 2) is None
