"""A fault-injecting TCP proxy for loopback, driven from synchronous test code.

Process-level fault tests put one of these between two endpoints and then, while a workload
runs, cut the link silently, delay it, or reset its connections::

    proxy = FaultProxy(target=("127.0.0.1", peer_port)).start()   # listens on 127.0.0.1:<any>
    ... point the client at proxy.port (or proxy.url) ...
    proxy.block()            # silent partition: nothing passes, nobody is told
    proxy.heal()             # new connections pass again
    proxy.delay(200, 50)     # 200 ms +- 50 ms each way; bytes keep their order
    proxy.reset()            # every current connection is closed with a TCP RST
    proxy.stop()

Faults, and what the endpoints observe:

* ``block(direction)``: bytes travelling the blocked way are read and thrown away, so the
  sender's writes succeed and the receiver hears nothing: a silent partition, not a refusal.
  New connections are accepted and black-holed the same way (the target is not even dialled
  while the forward way is blocked), so the client sees a timeout; pass ``refuse_new=True``
  to reset them instead, like a closed port. A connection that lost bytes stays a black hole
  in that direction until an endpoint closes it: TCP would never deliver the rest of a stream
  with a hole in it, and an endpoint that had not given up yet would see a stalled connection.
  ``heal()`` and ``unblock()`` therefore affect new connections and directions that have not
  lost anything; endpoints recover by timing out and reconnecting, as after a real partition.
  Closing one side of a black-holed direction is not passed on either.
* ``delay(ms, jitter_ms, direction)``: every chunk is held for ``ms`` plus a uniform
  ``[0, jitter_ms]``, never overtaking an earlier chunk (it is one TCP stream).
* ``reset()``: a one-shot action: every current connection is aborted with RST on both sides.
* ``heal()``: no block, no delay.

Directions are named from the proxy's point of view: ``"forward"`` is client to target
(requests), ``"reverse"`` target to client (responses), ``"both"`` is the default.

Asymmetric partitions between Raft peers: give every ordered pair of members its own proxy.
Member ``src`` must dial ``proxy[src, dst]`` whenever it talks to ``dst``, and that proxy
forwards to ``dst``'s real peer port; ``ProxyNet`` builds the N * (N - 1) proxies. Blocking
``proxy[a, b]`` (both of its directions) cuts what ``a`` initiates towards ``b``: ``a``'s
messages to ``b`` and the responses to them. ``b`` still reaches ``a`` through
``proxy[b, a]``, including the responses ``a`` sends back on ``b``'s connections. When peers
send each Raft message as a request on a connection the sender opened, that is exactly "a's
messages are lost, b's arrive". The pattern needs each member to have its own view of the
others' peer addresses (for example its own ``--initial-cluster``), since all it knows of
``dst`` is the address it dials::

    net = ProxyNet({"a": ("127.0.0.1", 7001), "b": ("127.0.0.1", 7002), ...}).start()
    view_of_a = {"a": "http://127.0.0.1:7001", "b": net.url("a", "b"), ...}
    net.block("a", "b")               # a -> b lost, b -> a fine
    net.partition({"a"}, {"b", "c"})  # both ways between the groups
    net.heal()

Everything runs on one asyncio event loop in a daemon thread (shared by all the proxies of a
``ProxyNet``); the public methods are plain synchronous calls, safe from any thread, and each
returns once the change is in force. Do not call them from the proxy's own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

__all__ = ["Direction", "FaultProxy", "LoopThread", "ProxyNet"]

T = TypeVar("T")
Address = tuple[str, int]
_CHUNK = 64 * 1024


class Direction(enum.StrEnum):
    FORWARD = "forward"  # client -> target
    REVERSE = "reverse"  # target -> client
    BOTH = "both"


def _directions(direction: Direction | str) -> tuple[Direction, ...]:
    direction = Direction(direction)
    if direction is Direction.BOTH:
        return (Direction.FORWARD, Direction.REVERSE)
    return (direction,)


class LoopThread:
    """An asyncio event loop running in a daemon thread, for synchronous callers."""

    def __init__(self, name: str = "faultproxy") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        self.loop.close()

    def run(self, make: Callable[[], Awaitable[T]], timeout: float = 10.0) -> T:
        """Run ``make()`` on the loop and wait for its result."""
        if threading.current_thread() is self._thread:
            raise RuntimeError("a synchronous proxy method was called from the proxy's own "
                               "event loop; call it from another thread")
        if not self._thread.is_alive():
            raise RuntimeError("the proxy event loop has been stopped")

        async def call() -> T:
            return await make()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout)

    def stop(self) -> None:
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)


@dataclass
class _Way:
    """The fault settings of one direction; read by the pumps for every chunk."""

    blocked: bool = False
    delay: float = 0.0  # seconds
    jitter: float = 0.0


@dataclass
class Stats:
    connections: int = 0  # accepted so far
    forwarded: dict[Direction, int] = field(
        default_factory=lambda: {Direction.FORWARD: 0, Direction.REVERSE: 0})
    discarded: dict[Direction, int] = field(
        default_factory=lambda: {Direction.FORWARD: 0, Direction.REVERSE: 0})


def _abort_with_rst(writer: asyncio.StreamWriter | None) -> None:
    if writer is None or writer.transport.is_closing():
        if writer is not None:
            writer.transport.abort()
        return
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class _Connection:
    """One client connection and, unless it was black-holed from the start, its upstream."""

    def __init__(self, proxy: FaultProxy, client: tuple[asyncio.StreamReader,
                                                         asyncio.StreamWriter]) -> None:
        self.proxy = proxy
        self.client_reader, self.client_writer = client
        self.upstream_reader: asyncio.StreamReader | None = None
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.lost = {Direction.FORWARD: False, Direction.REVERSE: False}  # stays a black hole
        self.eof = {Direction.FORWARD: False, Direction.REVERSE: False}
        self.tasks: list[asyncio.Task] = []

    def start(self, connect: bool) -> None:
        self.tasks.append(asyncio.create_task(self._run(connect)))

    async def _run(self, connect: bool) -> None:
        if not connect:
            self.lost[Direction.FORWARD] = True
            await self._pump(Direction.FORWARD, self.client_reader, None)
            self.close()  # the client closed first; nothing to pass on
            return
        try:
            self.upstream_reader, self.upstream_writer = await asyncio.open_connection(
                *self.proxy.target)
        except OSError:
            self.abort()  # the target refused: so does the proxy
            return
        await asyncio.gather(
            self._pump(Direction.FORWARD, self.client_reader, self.upstream_writer),
            self._pump(Direction.REVERSE, self.upstream_reader, self.client_writer),
        )
        self.close()

    async def _pump(self, direction: Direction, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter | None) -> None:
        """Read, apply the faults of ``direction``, and hand chunks to a delivery task."""
        way = self.proxy._ways[direction]
        stats = self.proxy.stats
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        deliver = asyncio.create_task(self._deliver(direction, queue, writer))
        self.tasks.append(deliver)
        last = 0.0
        try:
            while True:
                try:
                    data = await reader.read(_CHUNK)
                except (ConnectionError, OSError):
                    self.abort()
                    return
                if way.blocked or self.lost[direction] or writer is None:
                    self.lost[direction] = True
                    stats.discarded[direction] += len(data)
                    if not data:
                        return  # a partition does not pass a FIN on either
                    continue
                due = time.monotonic() + way.delay + (
                    self.proxy._rng.uniform(0, way.jitter) if way.jitter else 0.0)
                last = max(last, due)
                queue.put_nowait((last, data))
                if not data:
                    await deliver
                    return
        finally:
            # Normally the delivery task has finished (EOF passed on); otherwise the direction
            # is a black hole or the connection is being torn down.
            deliver.cancel()

    async def _deliver(self, direction: Direction, queue: asyncio.Queue,
                       writer: asyncio.StreamWriter | None) -> None:
        way = self.proxy._ways[direction]
        stats = self.proxy.stats
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if way.blocked or self.lost[direction] or writer is None:
                self.lost[direction] = True  # in flight when the partition started: lost
                stats.discarded[direction] += len(data)
                if not data:
                    return
                continue
            try:
                if not data:
                    self.eof[direction] = True
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
                stats.forwarded[direction] += len(data)
            except (ConnectionError, OSError, RuntimeError):
                self.abort()
                return

    def close(self) -> None:
        for writer in (self.client_writer, self.upstream_writer):
            if writer is not None:
                writer.close()
        self.proxy._connections.discard(self)

    def abort(self) -> None:
        _abort_with_rst(self.client_writer)
        _abort_with_rst(self.upstream_writer)
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()
        self.proxy._connections.discard(self)


class FaultProxy:
    """One listening port that forwards every connection to ``target``, with faults.

    ``target`` is the first (and only positional) argument; ``listen`` defaults to any free
    port on 127.0.0.1. ``rng`` draws the jitter (seed it to replay a run). ``loop`` lets many
    proxies share one ``LoopThread``; by default each proxy runs its own.
    """

    def __init__(
        self,
        target: Address,
        *,
        listen: Address = ("127.0.0.1", 0),
        name: str | None = None,
        rng: random.Random | None = None,
        loop: LoopThread | None = None,
    ) -> None:
        self.target = (target[0], int(target[1]))
        self.listen = (listen[0], int(listen[1]))
        self.name = name or f"proxy->{self.target[0]}:{self.target[1]}"
        self.stats = Stats()
        self._rng = rng or random.Random(0)
        self._ways = {Direction.FORWARD: _Way(), Direction.REVERSE: _Way()}
        self._refuse_new = False
        self._connections: set[_Connection] = set()
        self._server: asyncio.base_events.Server | None = None
        self._own_loop = loop is None
        self._loop = loop
        self.address: Address | None = None

    # ---- lifecycle

    def start(self) -> FaultProxy:
        if self._server is not None:
            return self
        if self._loop is None:
            self._loop = LoopThread(self.name)

        async def serve() -> Address:
            self._server = await asyncio.start_server(self._accept, *self.listen)
            return self._server.sockets[0].getsockname()[:2]

        self.address = self._loop.run(serve)
        return self

    def stop(self) -> None:
        """Stop listening and abort every connection (RST). Idempotent."""
        if self._server is None or self._loop is None:
            return
        server, self._server = self._server, None

        async def shutdown() -> None:
            server.close()
            tasks = [t for conn in self._connections for t in conn.tasks]
            for conn in list(self._connections):
                conn.abort()
            if tasks:
                await asyncio.wait(tasks, timeout=2)

        with contextlib.suppress(RuntimeError):
            self._loop.run(shutdown)
        if self._own_loop:
            self._loop.stop()
            self._loop = None

    close = stop

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self.address is None:
            raise RuntimeError(f"{self.name} is not started; call start() first")
        return self.address[1]

    @property
    def host(self) -> str:
        if self.address is None:
            raise RuntimeError(f"{self.name} is not started; call start() first")
        return self.address[0]

    @property
    def url(self) -> str:
        """``http://host:port`` of the listening side, for URL-configured clients."""
        return f"http://{self.host}:{self.port}"

    # ---- faults

    def block(self, direction: Direction | str = Direction.BOTH, *,
              refuse_new: bool = False) -> None:
        """Silently drop what travels ``direction`` (see the module docstring)."""
        ways = _directions(direction)

        def change() -> None:
            for d in ways:
                self._ways[d].blocked = True
            self._refuse_new = refuse_new

        self._apply(change)

    def unblock(self, direction: Direction | str = Direction.BOTH) -> None:
        """Let new traffic through ``direction`` again; delays stay as they are."""
        ways = _directions(direction)

        def change() -> None:
            for d in ways:
                self._ways[d].blocked = False
            self._refuse_new = False

        self._apply(change)

    def delay(self, ms: float, jitter_ms: float = 0.0,
              direction: Direction | str = Direction.BOTH) -> None:
        """Hold every chunk ``ms`` plus up to ``jitter_ms`` (uniform) before passing it on."""
        if ms < 0 or jitter_ms < 0:
            raise ValueError("delay and jitter must be >= 0 milliseconds")
        ways = _directions(direction)

        def change() -> None:
            for d in ways:
                self._ways[d].delay = ms / 1000
                self._ways[d].jitter = jitter_ms / 1000

        self._apply(change)

    def heal(self) -> None:
        """No block and no delay, both ways."""

        def change() -> None:
            for way in self._ways.values():
                way.blocked, way.delay, way.jitter = False, 0.0, 0.0
            self._refuse_new = False

        self._apply(change)

    def reset(self) -> None:
        """Abort every current connection with RST on both sides; new ones are unaffected."""

        def change() -> None:
            for conn in list(self._connections):
                conn.abort()

        self._apply(change)

    @property
    def blocked(self) -> bool:
        return any(way.blocked for way in self._ways.values())

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def _apply(self, change: Callable[[], None]) -> None:
        """Run ``change`` on the loop, so it is ordered with the pumps' reads of the settings."""
        if self._loop is None or self._server is None:
            change()
            return

        async def run() -> None:
            change()

        self._loop.run(run)

    # ---- connections

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        conn = _Connection(self, (reader, writer))
        if self._refuse_new:
            _abort_with_rst(writer)
            return
        self._connections.add(conn)
        conn.start(connect=not self._ways[Direction.FORWARD].blocked)


class ProxyNet:
    """One ``FaultProxy`` per ordered pair of members, on one shared event loop.

    ``targets`` maps each member to the address its peers must reach (its real peer port).
    ``address(src, dst)`` / ``url(src, dst)`` is what ``src`` must dial to reach ``dst``.
    """

    def __init__(self, targets: Mapping[str, Address], *, host: str = "127.0.0.1",
                 rng: random.Random | None = None) -> None:
        self.host = host
        self._rng = rng or random.Random(0)
        self._targets: dict[str, Address] = {}
        self._proxies: dict[tuple[str, str], FaultProxy] = {}
        self._loop: LoopThread | None = None
        for name, address in targets.items():
            self._targets[name] = (address[0], int(address[1]))

    @property
    def members(self) -> list[str]:
        return list(self._targets)

    def start(self) -> ProxyNet:
        if self._loop is None:
            self._loop = LoopThread("proxynet")
            for src in self._targets:
                for dst in self._targets:
                    if src != dst:
                        self._open(src, dst)
        return self

    def stop(self) -> None:
        for proxy in self._proxies.values():
            proxy.stop()
        self._proxies.clear()
        if self._loop is not None:
            self._loop.stop()
            self._loop = None

    close = stop

    def __enter__(self) -> ProxyNet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add_member(self, name: str, target: Address) -> None:
        """A new member: proxies for every pair it is part of."""
        if name in self._targets:
            raise ValueError(f"member {name!r} is already in the net")
        self._targets[name] = (target[0], int(target[1]))
        if self._loop is not None:
            for other in self._targets:
                if other != name:
                    self._open(name, other)
                    self._open(other, name)

    def remove_member(self, name: str) -> None:
        for pair in [p for p in self._proxies if name in p]:
            self._proxies.pop(pair).stop()
        self._targets.pop(name, None)

    def _open(self, src: str, dst: str) -> None:
        proxy = FaultProxy(self._targets[dst], listen=(self.host, 0), name=f"{src}->{dst}",
                           rng=random.Random(self._rng.random()), loop=self._loop)
        self._proxies[(src, dst)] = proxy.start()

    def proxy(self, src: str, dst: str) -> FaultProxy:
        try:
            return self._proxies[(src, dst)]
        except KeyError:
            raise KeyError(f"no proxy for {src} -> {dst}: members are {self.members}, and "
                           "the net must be started") from None

    def address(self, src: str, dst: str) -> Address:
        proxy = self.proxy(src, dst)
        return (proxy.host, proxy.port)

    def url(self, src: str, dst: str, scheme: str = "http") -> str:
        host, port = self.address(src, dst)
        return f"{scheme}://{host}:{port}"

    def view(self, member: str, own_url: Callable[[str], str] | None = None,
             scheme: str = "http") -> dict[str, str]:
        """``member``'s peer URLs: its own real address, and the pair proxies for the rest."""
        view = {}
        for other, (host, port) in self._targets.items():
            if other == member:
                view[other] = own_url(other) if own_url else f"{scheme}://{host}:{port}"
            else:
                view[other] = self.url(member, other, scheme)
        return view

    # ---- faults

    def block(self, src: str, dst: str) -> None:
        """Cut what ``src`` initiates towards ``dst``; ``dst`` still reaches ``src``."""
        self.proxy(src, dst).block()

    def unblock(self, src: str, dst: str) -> None:
        self.proxy(src, dst).unblock()

    def partition(self, *groups: Iterable[str]) -> None:
        """Cut every pair across groups, both ways, and heal the pairs inside a group.

        A member named in no group is isolated on its own.
        """
        group_of: dict[str, int] = {}
        for n, group in enumerate(groups):
            for member in group:
                if member not in self._targets:
                    raise KeyError(f"unknown member {member!r}; members are {self.members}")
                if member in group_of:
                    raise ValueError(f"member {member!r} is in two groups")
                group_of[member] = n
        for member in self._targets:
            group_of.setdefault(member, -1 - len(group_of))
        for (src, dst), proxy in self._proxies.items():
            if group_of[src] == group_of[dst]:
                proxy.unblock()
            else:
                proxy.block()

    def isolate(self, member: str) -> None:
        """Cut ``member`` from everyone, both ways; other pairs are left as they are."""
        for (src, dst), proxy in self._proxies.items():
            if member in (src, dst):
                proxy.block()

    def delay(self, ms: float, jitter_ms: float = 0.0, *, src: str | None = None,
              dst: str | None = None) -> None:
        """Delay the pairs matching ``src`` and ``dst`` (None: any member)."""
        for proxy in self._matching(src, dst):
            proxy.delay(ms, jitter_ms)

    def reset(self, *, src: str | None = None, dst: str | None = None) -> None:
        for proxy in self._matching(src, dst):
            proxy.reset()

    def heal(self) -> None:
        for proxy in self._proxies.values():
            proxy.heal()

    def blocked_pairs(self) -> set[tuple[str, str]]:
        return {pair for pair, proxy in self._proxies.items() if proxy.blocked}

    def _matching(self, src: str | None, dst: str | None) -> list[FaultProxy]:
        return [p for (s, d), p in self._proxies.items()
                if src in (None, s) and dst in (None, d)]

    def __getitem__(self, pair: tuple[str, str]) -> FaultProxy:
        return self.proxy(*pair)

    def __repr__(self) -> str:
        return f"ProxyNet({self.members}, blocked={sorted(self.blocked_pairs())})"
