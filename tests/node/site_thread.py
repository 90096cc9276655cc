"""An aiohttp app behind the member's DeadlineSite on loopback, its event loop in a thread of its
own: in-process tests of how the ports handle connections (test_client_lane.py,
test_deadlines.py) talk to it over real sockets from the test's thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web
from flotilla.node.deadlines import DeadlineSite


class SiteThread:
    """`make_app()` (called on the loop) served on 127.0.0.1:`port`; `lane`, when given, is the
    client lane in front of it; `runner_args` go to aiohttp's AppRunner."""

    def __init__(self, make_app: Callable[[], web.Application], *, lane: Any = None,
                 loop: asyncio.AbstractEventLoop | None = None, **runner_args: Any) -> None:
        self.loop = loop or asyncio.new_event_loop()
        self.port = 0

        async def setup() -> None:
            self.runner = web.AppRunner(make_app(), access_log=None, handle_signals=False,
                                        **runner_args)
            await self.runner.setup()
            site = DeadlineSite(self.runner, "127.0.0.1", 0, lane=lane)
            await site.start()
            self.port = site._server.sockets[0].getsockname()[1]

        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(setup())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(10)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the loop and return its result."""
        done = threading.Event()
        box: list[Any] = []

        def run() -> None:
            box.append(fn())
            done.set()

        self.loop.call_soon_threadsafe(run)
        assert done.wait(10)
        return box[0]

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
