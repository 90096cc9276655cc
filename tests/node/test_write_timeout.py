"""A write that cannot commit is answered 503 after the proposal timeout, and may still commit.

In-process: one member that leads; its log's fsync is held, so nothing commits. The client
gets 503 once the timeout has passed (swept by the runtime's ticker, not one timer per write),
and when the disk comes back the write it was told had an unknown outcome is applied.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time

import aiohttp
from flotilla.node import runtime
from flotilla.node.main import _serve

from tests.node.test_fatal_loop import _node, _until_leader


def test_a_write_not_committed_in_time_gets_503_and_may_still_be_applied(tmp_path, monkeypatch):
    monkeypatch.setattr(runtime, "PROPOSAL_TIMEOUT_S", 0.5)
    node = _node(tmp_path)
    disk_back = threading.Event()

    async def scenario() -> None:
        serving = asyncio.create_task(_serve(node))
        await _until_leader(node)
        storage = node.runtime.storage
        sync = storage.sync

        def held_sync() -> None:
            disk_back.wait(30)
            sync()

        storage.sync = held_sync
        host, port = node.cfg.listen_client
        url = f"http://{host}:{port}/v1/kv/late"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
            began = time.monotonic()
            async with session.put(url, data=b"v") as resp:
                waited = time.monotonic() - began
                body = await resp.json()
                assert resp.status == 503, body
                assert resp.headers.get("Retry-After") == "1"
                assert "did not answer in time" in body["error"], body
            # Within a tick or two of the timeout: not at once, and not never.
            assert 0.5 <= waited < 3, waited
            assert node.machine.get("late") is None
            storage.sync = sync
            disk_back.set()
            for _ in range(250):
                if node.machine.get("late") is not None:
                    break
                await asyncio.sleep(0.02)
            assert node.machine.get("late") is not None, "the write was lost, not just late"
            async with session.put(url, data=b"w") as resp:  # and the member serves on
                assert resp.status == 200, await resp.text()
        signal.raise_signal(signal.SIGTERM)  # what `flotilla node` stops on
        assert await asyncio.wait_for(serving, 10) == 0

    try:
        asyncio.run(scenario())
    finally:
        disk_back.set()
