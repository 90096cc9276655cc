"""Peer transport: Raft messages as msgpack batches over one persistent stream per peer.

Each member dials a WebSocket (`GET /raft/v1/stream`) to every peer it sends to and writes
each batch as one binary frame; the peer's answers come back on the stream that peer dialled.
A frame costs a few microseconds where an HTTP request costs hundreds, and that difference is
most of a write's latency. Each peer has one sender task: messages queue while it is busy and
leave as one batch with its next frame, so a busy leader sends few, large frames (batching
without a timer). The stream pings every `ping_interval` seconds and is dropped when no pong
comes back, so a silently broken link (a partition that swallows bytes) is noticed and dialled
again; each ping carries the time it left, so its pong measures the round trip to that peer
(`round_trips`, a metric) at no cost to the messages. Raft tolerates loss: a failed send drops
its batch and tells the core the peer is unreachable; the core then probes again. Snapshots are
not messages: their payload is streamed from the snapshot file in an HTTP request of its own.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import struct
from collections.abc import Callable
from typing import BinaryIO

import aiohttp
import msgpack
from flotilla.node.consensus import Message, MessageType

from .metrics import PEER_RTT_BUCKETS, Histogram
from .wire import MAX_ENTRIES, MAX_MESSAGES, encode_batch

log = logging.getLogger(__name__)

MESSAGES_PATH = "/raft/v1/messages"
SNAPSHOT_PATH = "/raft/v1/snapshot"
STREAM_PATH = "/raft/v1/stream"
# A snapshot request carrying these instead of a payload: fetch it from the archive.
SNAPSHOT_KEY_HEADER = "Flotilla-Snapshot-Key"
SNAPSHOT_SHA_HEADER = "Flotilla-Snapshot-Sha256"
SNAPSHOT_SIZE_HEADER = "Flotilla-Snapshot-Bytes"
CLUSTER_HEADER = "Flotilla-Cluster-Id"
SENDER_HEADER = "Flotilla-Sender"
#: What a receiver takes in one peer body or stream frame, at least (a member whose
#: `--max-value-bytes` is larger takes a little more than its largest entry: see peer_body_limit).
PEER_BODY_LIMIT = 8 << 20
# Entry bytes in one frame at most: a larger batch leaves as several frames.
FRAME_ENTRY_BYTES = 4 << 20
# Entry bytes that may wait for one peer while its stream is busy; more is dropped (see send).
MAX_QUEUED_BYTES = 8 << 20
# Where a peer URL came from, strongest first (see PeerTransport.learn). What a peer's batch
# says of itself (ADVERTISED) is heard only by a member that knows no configuration yet.
CONFIGURED, MEMBERSHIP, ADVERTISED = "configured", "membership", "advertised"
# A sender task that failed is started again after this long (it logs why).
SENDER_RESTART_DELAY = 0.1
SNAPSHOT_CHUNK = 1 << 20


class PeerTransport:
    def __init__(
        self,
        name: str,
        cluster_id: str,
        peer_url: str,
        client_url: str,
        on_unreachable: Callable[[str], None],
        on_snapshot_sent: Callable[[str, bool, str], None],
        snapshot_source: Callable[[Message], BinaryIO | None],
        snapshot_reference: Callable[[Message], dict[str, str] | None] = lambda m: None,
        ping_interval: float = 1.0,
        ssl_context: ssl.SSLContext | None = None,
        frame_entry_bytes: int = FRAME_ENTRY_BYTES,
    ) -> None:
        self.name = name
        self.cluster_id = cluster_id
        self.peer_url = peer_url
        self.client_url = client_url
        self.peer_urls: dict[str, str] = {}
        self._url_source: dict[str, str] = {}
        self.client_urls: dict[str, str] = {}
        self._on_unreachable = on_unreachable
        self._on_snapshot_sent = on_snapshot_sent
        self._snapshot_source = snapshot_source
        self._snapshot_reference = snapshot_reference
        self.ping_interval = ping_interval
        self.ssl_context = ssl_context
        self.frame_entry_bytes = frame_entry_bytes
        self.sender_failures = 0  # sender tasks restarted after a failure (a metric)
        self.dials: dict[str, int] = {}  # streams opened per peer (a metric)
        self.snapshot_bytes_streamed = 0  # snapshot payload sent to peers (a metric)
        self.round_trips: dict[str, Histogram] = {}  # ping -> pong per peer (a metric)
        self._queues: dict[str, list[Message]] = {}
        self._queued_bytes: dict[str, int] = {}  # entry bytes waiting in each queue
        self._wakeups: dict[str, asyncio.Event] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._snapshots_in_flight: set[str] = set()
        self._streams: set[asyncio.Task] = set()
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit_per_host=4, force_close=False,
                                           ssl=self.ssl_context if self.ssl_context else True),
            timeout=aiohttp.ClientTimeout(total=5, connect=1),
        )

    async def close(self) -> None:
        tasks = [*self._tasks.values(), *self._streams]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def learn(self, name: str, peer_url: str | None = None, client_url: str | None = None,
              source: str = MEMBERSHIP) -> None:
        """Record how to reach `name`. Sources rank: CONFIGURED (this member's own flags:
        --initial-cluster, its own URLs) is never overridden, since that route may go through
        a proxy or a NAT; MEMBERSHIP (a committed configuration, an admin add) replaces what
        came from the membership before, so a member re-added at a new URL is dialled there;
        ADVERTISED (a peer's own say-so, heard only by a member that knows no configuration
        yet, so that it can answer the leader adding it) only fills in the unknown. Client URLs
        come from the membership alone."""
        if peer_url:
            url = peer_url.rstrip("/")
            held = self._url_source.get(name)
            if held is None or (source != ADVERTISED and (held != CONFIGURED
                                                          or source == CONFIGURED)):
                self.peer_urls[name] = url
                self._url_source[name] = source
        if source == ADVERTISED:
            return
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
            if m.entries:
                size = sum(len(e.data) for e in m.entries)
                queued = self._queued_bytes.get(m.to, 0)
                if queued and queued + size > MAX_QUEUED_BYTES:
                    # The link is stalled (a full socket, a dial in progress): entries would
                    # pile up without bound and leave as one huge frame. Raft tolerates the
                    # loss; the core probes again once the peer answers.
                    self._on_unreachable(m.to)
                    continue
                self._queued_bytes[m.to] = queued + size
            queue.append(m)
            self._wakeups[m.to].set()

    async def _sender(self, peer: str) -> None:
        """Run `peer`'s sender for as long as the transport lives: a failure is a bug, so it is
        logged with its traceback and the sender starts again (its stream is dialled anew)."""
        while True:
            try:
                await self._send_loop(peer)
            except asyncio.CancelledError:
                raise
            except Exception:
                self.sender_failures += 1
                log.exception("the sender to %s failed; starting it again", peer)
                self._on_unreachable(peer)
                await asyncio.sleep(SENDER_RESTART_DELAY)

    def _frames(self, batch: list[Message]) -> list[bytes]:
        """`batch` as frames of at most MAX_MESSAGES messages, MAX_ENTRIES entries and about
        frame_entry_bytes of entry data each (one message is never split), in order."""
        frames, part, size, count = [], [], 0, 0
        for m in batch:
            grows = sum(len(e.data) for e in m.entries) if m.entries else 0
            if part and (len(part) >= MAX_MESSAGES or size + grows > self.frame_entry_bytes
                         or count + len(m.entries) > MAX_ENTRIES):
                frames.append(part)
                part, size, count = [], 0, 0
            part.append(m)
            size += grows
            count += len(m.entries)
        frames.append(part)
        return [encode_batch(self.cluster_id, self.name, self.peer_url, self.client_url, f)
                for f in frames]

    async def _send_loop(self, peer: str) -> None:
        wakeup = self._wakeups[peer]
        stream: aiohttp.ClientWebSocketResponse | None = None
        dialled = None  # the URL `stream` goes to
        while True:
            await wakeup.wait()
            wakeup.clear()
            batch = self._queues[peer]
            if not batch:
                continue
            self._queues[peer] = []
            self._queued_bytes[peer] = 0
            url = self.peer_urls.get(peer)
            if url is None:
                log.debug("no address for %s; dropping %d messages", peer, len(batch))
                self._on_unreachable(peer)
                continue
            frames = self._frames(batch)
            try:
                if stream is not None and dialled != url:  # the member moved
                    await stream.close()
                if stream is None or stream.closed:
                    dialled = url
                    stream = await self._dial(peer, url)
                    if stream is None:
                        self._on_unreachable(peer)
                        continue
                for frame in frames:
                    await stream.send_bytes(frame)
            except (TimeoutError, aiohttp.ClientError, OSError, RuntimeError) as exc:
                log.debug("sending to %s failed: %s", peer, exc)
                stream = None
                self._on_unreachable(peer)

    def _headers(self) -> dict[str, str]:
        """Who is asking, read by the receiver before any body: the cluster and the sender."""
        return {CLUSTER_HEADER: self.cluster_id, SENDER_HEADER: self.name}

    async def _dial(self, peer: str, url: str) -> aiohttp.ClientWebSocketResponse | None:
        """Open the stream to `peer`, or log why not and return None (the core retries)."""
        self.dials[peer] = self.dials.get(peer, 0) + 1
        try:
            # A dial into a black hole must not hold this peer's messages for long.
            async with asyncio.timeout(self.ping_interval):
                stream = await self._session.ws_connect(
                    url + STREAM_PATH, headers=self._headers(),
                    heartbeat=self.ping_interval, max_msg_size=PEER_BODY_LIMIT,
                    timeout=aiohttp.ClientWSTimeout(ws_close=1.0), autoclose=True, compress=0,
                    autoping=False,  # `_watch` reads the pongs of `_probe`'s pings
                )
        except aiohttp.WSServerHandshakeError as exc:
            log.warning("peer %s refused the stream: %s %s", peer, exc.status, exc.message)
            return None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.debug("cannot reach %s: %s", peer, exc)
            return None
        watcher = asyncio.create_task(self._watch(peer, stream))
        self._streams.add(watcher)
        watcher.add_done_callback(self._streams.discard)
        return stream

    async def _watch(self, peer: str, stream: aiohttp.ClientWebSocketResponse) -> None:
        """Read the stream's control frames (pongs, close) so a dead link is noticed, and
        time the pongs of `_probe`'s pings."""
        loop = asyncio.get_running_loop()
        pinged: list[bytes] = []  # the payload of the ping whose pong is awaited
        probe = asyncio.create_task(self._probe(stream, pinged))
        try:
            async for msg in stream:
                if msg.type is aiohttp.WSMsgType.PONG:
                    if pinged and msg.data == pinged[0]:  # ours, not a stray or forged one
                        pinged.clear()
                        rtt = loop.time() - struct.unpack("!d", msg.data)[0]
                        histogram = self.round_trips.get(peer)
                        if histogram is None:
                            histogram = self.round_trips[peer] = Histogram(PEER_RTT_BUCKETS)
                        histogram.observe(rtt)
                elif msg.type is aiohttp.WSMsgType.PING:
                    await stream.pong(msg.data)
                elif msg.type is aiohttp.WSMsgType.ERROR:
                    break
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            log.debug("stream to %s failed: %s", peer, exc)
        finally:
            probe.cancel()
            if not stream.closed:
                await stream.close()
            if stream.close_code not in (None, aiohttp.WSCloseCode.OK,
                                         aiohttp.WSCloseCode.GOING_AWAY):
                log.warning("stream to %s closed: code %s", peer, stream.close_code)

    async def _probe(self, stream: aiohttp.ClientWebSocketResponse, pinged: list[bytes]) -> None:
        """Ping every `ping_interval` seconds with the loop's time as the payload (the peer's
        pong echoes it). These pongs also keep aiohttp's own heartbeat from pinging."""
        loop = asyncio.get_running_loop()
        try:
            while not stream.closed:
                payload = struct.pack("!d", loop.time())
                pinged[:] = [payload]
                await stream.ping(payload)
                await asyncio.sleep(self.ping_interval)
        except (aiohttp.ClientError, OSError, RuntimeError) as exc:
            log.debug("pinging a peer stream failed: %s", exc)

    def _send_snapshot(self, m: Message) -> None:
        if m.to in self._snapshots_in_flight:
            return
        self._snapshots_in_flight.add(m.to)
        task = asyncio.create_task(self._stream_snapshot(m))
        self._streams.add(task)  # a task nobody references may be collected mid-run
        task.add_done_callback(self._streams.discard)

    async def _stream_snapshot(self, m: Message) -> None:
        ok = False
        via = "leader"
        try:
            url = self.peer_urls.get(m.to)
            if url is None:
                return
            header = encode_batch(self.cluster_id, self.name, self.peer_url, self.client_url, [m])
            reference = self._snapshot_reference(m)
            if reference is not None:
                ok = await self._refer(m, url, header, reference)
                if ok:
                    via = "archive"
                    return
            payload = self._snapshot_source(m)
            if payload is None:
                return

            async def chunks():
                with payload:  # verifies the snapshot's checksum as it is read
                    while chunk := await asyncio.to_thread(payload.read, SNAPSHOT_CHUNK):
                        self.snapshot_bytes_streamed += len(chunk)
                        yield chunk

            timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
            headers = {"Flotilla-Message": header.hex(), **self._headers()}
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
            self._on_snapshot_sent(m.to, ok, via)

    async def _refer(self, m: Message, url: str, header: bytes,
                     reference: dict[str, str]) -> bool:
        """Point the peer at the archived copy of snapshot `m` (no payload from us): True once
        it has fetched and stored it; False (stream it instead) when it cannot."""
        headers = {"Flotilla-Message": header.hex(), **reference, **self._headers()}
        timeout = aiohttp.ClientTimeout(total=None, sock_read=600)  # it downloads meanwhile
        try:
            async with self._session.post(url + SNAPSHOT_PATH, data=b"", headers=headers,
                                          timeout=timeout) as resp:
                if resp.status == 204:
                    return True
                text = (await resp.text())[:300]
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            text = str(exc)
        log.warning("%s could not fetch snapshot %d from the archive (%s); streaming it",
                    m.to, m.snapshot.meta.index, text)
        return False
