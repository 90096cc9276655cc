"""Peer transport: Raft messages as msgpack batches over persistent aiohttp connections.

Each peer has one sender task. Messages queue while a request is in flight and leave as one
batch with the next request, so a busy leader sends few, large requests (batching without a
timer). Raft tolerates loss, so a failed request drops its batch and tells the core the peer is
unreachable; the core then probes again. Snapshots are not messages: their payload is streamed
from the snapshot file in a request of its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import BinaryIO

import aiohttp
import msgpack
from flotilla.node.consensus import Message, MessageType

from .wire import encode_batch

log = logging.getLogger(__name__)

MESSAGES_PATH = "/raft/v1/messages"
SNAPSHOT_PATH = "/raft/v1/snapshot"
SNAPSHOT_CHUNK = 1 << 20


class PeerTransport:
    def __init__(
        self,
        name: str,
        cluster_id: str,
        peer_url: str,
        client_url: str,
        on_unreachable: Callable[[str], None],
        on_snapshot_sent: Callable[[str, bool], None],
        snapshot_source: Callable[[Message], BinaryIO | None],
    ) -> None:
        self.name = name
        self.cluster_id = cluster_id
        self.peer_url = peer_url
        self.client_url = client_url
        self.peer_urls: dict[str, str] = {}
        self.client_urls: dict[str, str] = {}
        self._on_unreachable = on_unreachable
        self._on_snapshot_sent = on_snapshot_sent
        self._snapshot_source = snapshot_source
        self._queues: dict[str, list[Message]] = {}
        self._wakeups: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._snapshots_in_flight: set[str] = set()
        self._streams: set[asyncio.Task] = set()
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit_per_host=4, force_close=False),
            timeout=aiohttp.ClientTimeout(total=5, connect=1),
        )

    async def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def learn(self, name: str, peer_url: str | None = None, client_url: str | None = None) -> None:
        """Record how to reach `name`. The first peer URL known for a member wins (this
        member's own --initial-cluster comes first): what a peer advertises must not override
        the route this member was configured with, which may go through a proxy or a NAT."""
        if peer_url and name not in self.peer_urls:
            self.peer_urls[name] = peer_url.rstrip("/")
        if client_url:
            self.client_urls[name] = client_url.rstrip("/")

    def send(self, messages: tuple[Message, ...] | list[Message]) -> None:
        for m in messages:
            if m.type is MessageType.SNAPSHOT:
                self._send_snapshot(m)
                continue
            queue = self._queues.get(m.to)
            if queue is None:
                queue = self._queues[m.to] = []
                self._wakeups[m.to] = asyncio.Event()
                self._tasks[m.to] = asyncio.create_task(self._sender(m.to))
            queue.append(m)
            self._wakeups[m.to].set()

    async def _sender(self, peer: str) -> None:
        wakeup = self._wakeups[peer]
        while True:
            await wakeup.wait()
            wakeup.clear()
            batch = self._queues[peer]
            if not batch:
                continue
            self._queues[peer] = []
            url = self.peer_urls.get(peer)
            if url is None:
                log.debug("no address for %s; dropping %d messages", peer, len(batch))
                self._on_unreachable(peer)
                continue
            body = encode_batch(self.cluster_id, self.name, self.peer_url, self.client_url, batch)
            try:
                async with self._session.post(url + MESSAGES_PATH, data=body) as resp:
                    if resp.status != 204:
                        text = await resp.text()
                        log.warning("peer %s refused messages: %s %s", peer, resp.status,
                                    text[:200])
                        self._on_unreachable(peer)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                log.debug("sending to %s failed: %s", peer, exc)
                self._on_unreachable(peer)

    def _send_snapshot(self, m: Message) -> None:
        if m.to in self._snapshots_in_flight:
            return
        self._snapshots_in_flight.add(m.to)
        task = asyncio.create_task(self._stream_snapshot(m))
        self._streams.add(task)  # a task nobody references may be collected mid-run
        task.add_done_callback(self._streams.discard)

    async def _stream_snapshot(self, m: Message) -> None:
        ok = False
        try:
            url = self.peer_urls.get(m.to)
            payload = self._snapshot_source(m) if url is not None else None
            if payload is None:
                return
            header = encode_batch(self.cluster_id, self.name, self.peer_url, self.client_url, [m])

            async def chunks():
                with payload:  # verifies the snapshot's checksum as it is read
                    while chunk := await asyncio.to_thread(payload.read, SNAPSHOT_CHUNK):
                        yield chunk

            timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
            headers = {"Flotilla-Message": header.hex()}
            async with self._session.post(url + SNAPSHOT_PATH, data=chunks(), headers=headers,
                                          timeout=timeout) as resp:
                ok = resp.status == 204
                if not ok:
                    log.warning("peer %s refused snapshot %d: %s %s", m.to,
                                m.snapshot.meta.index, resp.status, (await resp.text())[:200])
        except (TimeoutError, aiohttp.ClientError, OSError, msgpack.PackException) as exc:
            log.warning("streaming snapshot to %s failed: %s", m.to, exc)
        finally:
            self._snapshots_in_flight.discard(m.to)
            self._on_snapshot_sent(m.to, ok)
