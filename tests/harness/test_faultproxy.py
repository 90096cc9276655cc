"""The fault proxy against a real echo server on loopback: what each fault looks like from
the two ends of a connection."""

from __future__ import annotations

import socket
import socketserver
import threading
import time
from collections.abc import Iterator

import pytest

from tests.harness.faultproxy import Direction, FaultProxy, ProxyNet

SILENCE = 0.2  # how long "nothing arrives" is watched for


class EchoServer:
    """Echoes every byte back, prefixed once per connection by ``tag``; remembers all it got."""

    def __init__(self, tag: bytes = b"") -> None:
        outer = self
        self.tag = tag
        self.received = bytearray()
        self.connections = 0
        self.resets = 0
        self._lock = threading.Lock()

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                with outer._lock:
                    outer.connections += 1
                first = True
                while True:
                    try:
                        data = self.request.recv(65536)
                    except ConnectionResetError:
                        with outer._lock:
                            outer.resets += 1
                        return
                    if not data:
                        return
                    with outer._lock:
                        outer.received += data
                    try:
                        self.request.sendall((outer.tag if first else b"") + data)
                    except OSError:
                        return
                    first = False

        class Server(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.address = self._server.server_address
        self.port = self.address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def echo() -> Iterator[EchoServer]:
    server = EchoServer()
    yield server
    server.stop()


@pytest.fixture
def proxy(echo: EchoServer) -> Iterator[FaultProxy]:
    with FaultProxy(("127.0.0.1", echo.port)) as p:
        yield p


def connect(port: int, host: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection((host, port), timeout=5)
    sock.settimeout(5)
    return sock


def receive(sock: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def roundtrip(sock: socket.socket, data: bytes, expect: bytes | None = None) -> bytes:
    sock.sendall(data)
    expect = data if expect is None else expect
    return receive(sock, len(expect))


def assert_silent(sock: socket.socket) -> None:
    sock.settimeout(SILENCE)
    with pytest.raises(TimeoutError):
        sock.recv(1)
    sock.settimeout(5)


def test_bytes_pass_through_both_ways(proxy: FaultProxy, echo: EchoServer) -> None:
    with connect(proxy.port) as s:
        assert roundtrip(s, b"hello") == b"hello"
        big = bytes(range(256)) * 8192  # 2 MiB
        s.sendall(big)
        assert receive(s, len(big)) == big
    assert echo.received == b"hello" + big
    assert proxy.stats.forwarded[Direction.FORWARD] == len(big) + 5
    assert proxy.url == f"http://127.0.0.1:{proxy.port}"


def test_a_blocked_proxy_black_holes_new_connections(proxy: FaultProxy, echo: EchoServer) -> None:
    proxy.block()
    with connect(proxy.port) as s:  # the handshake with the proxy succeeds...
        s.sendall(b"anyone there?")
        assert_silent(s)  # ...and then nothing: a timeout, not a refusal
    assert echo.connections == 0 and echo.received == b""
    assert proxy.stats.discarded[Direction.FORWARD] == len(b"anyone there?")


def test_blocking_silences_an_open_connection_and_it_stays_dead_after_healing(
        proxy: FaultProxy, echo: EchoServer) -> None:
    with connect(proxy.port) as s:
        assert roundtrip(s, b"before") == b"before"
        proxy.block()
        s.sendall(b"during")
        assert_silent(s)
        proxy.heal()
        s.sendall(b"after")  # this stream lost bytes: it never carries anything again
        assert_silent(s)
        with connect(proxy.port) as fresh:
            assert roundtrip(fresh, b"new") == b"new"
    assert echo.received == b"beforenew"


def test_forward_block_passes_nothing_to_the_target(proxy: FaultProxy, echo: EchoServer) -> None:
    proxy.block(Direction.FORWARD)
    with connect(proxy.port) as s:
        s.sendall(b"request")
        assert_silent(s)
    assert echo.received == b""


def test_reverse_block_delivers_requests_but_no_answers(proxy: FaultProxy,
                                                       echo: EchoServer) -> None:
    proxy.block("reverse")
    with connect(proxy.port) as s:
        s.sendall(b"request")
        assert_silent(s)
    assert echo.received == b"request"
    assert proxy.stats.discarded[Direction.REVERSE] == len(b"request")


def test_unblock_keeps_the_delay(proxy: FaultProxy) -> None:
    proxy.delay(100)
    proxy.block()
    proxy.unblock()
    with connect(proxy.port) as s:
        started = time.monotonic()
        assert roundtrip(s, b"x") == b"x"
        assert time.monotonic() - started >= 0.2


def test_delay_holds_each_direction(proxy: FaultProxy) -> None:
    proxy.delay(150)
    with connect(proxy.port) as s:
        started = time.monotonic()
        assert roundtrip(s, b"ping") == b"ping"
        assert time.monotonic() - started >= 0.3  # 150 ms there and 150 ms back
    proxy.heal()
    proxy.delay(150, direction=Direction.FORWARD)
    with connect(proxy.port) as s:
        started = time.monotonic()
        assert roundtrip(s, b"ping") == b"ping"
        assert time.monotonic() - started >= 0.15


def test_jitter_never_reorders_a_stream(proxy: FaultProxy) -> None:
    proxy.delay(2, jitter_ms=30)
    payload = b"".join(b"%05d," % i for i in range(300))
    with connect(proxy.port) as s:
        for i in range(0, len(payload), 18):
            s.sendall(payload[i:i + 18])
            time.sleep(0.0005)
        assert receive(s, len(payload)) == payload


def test_reset_aborts_open_connections_with_rst(proxy: FaultProxy, echo: EchoServer) -> None:
    with connect(proxy.port) as s:
        assert roundtrip(s, b"hi") == b"hi"
        assert proxy.connection_count == 1
        proxy.reset()
        with pytest.raises(ConnectionResetError):
            s.recv(1)
    deadline = time.monotonic() + 5
    while echo.resets == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert echo.resets == 1  # the target side was reset too, not closed
    with connect(proxy.port) as s:
        assert roundtrip(s, b"again") == b"again"


def test_refusing_new_connections_resets_them(proxy: FaultProxy, echo: EchoServer) -> None:
    proxy.block(refuse_new=True)
    # reset at connect or at the first read
    with pytest.raises(ConnectionResetError), connect(proxy.port) as s:
        s.sendall(b"x")
        s.recv(1)
    assert echo.connections == 0


def test_a_target_that_is_down_resets_the_client() -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))
        dead_port = placeholder.getsockname()[1]  # bound, never listening: refuses
        with FaultProxy(("127.0.0.1", dead_port)) as p, pytest.raises(
                (ConnectionResetError, ConnectionAbortedError)), connect(p.port) as s:
            s.sendall(b"x")
            if not s.recv(1):
                raise ConnectionAbortedError("closed")


def test_stop_releases_the_port(echo: EchoServer) -> None:
    p = FaultProxy(("127.0.0.1", echo.port), listen=("127.0.0.1", 0)).start()
    port = p.port
    with connect(port) as s:
        assert roundtrip(s, b"x") == b"x"
        p.stop()
        with pytest.raises(ConnectionResetError):
            s.recv(1)
    with pytest.raises(ConnectionRefusedError):
        connect(port)
    p.stop()  # idempotent


def test_two_positional_addresses_are_refused() -> None:
    with pytest.raises(TypeError):
        FaultProxy(("127.0.0.1", 0), ("127.0.0.1", 1))  # type: ignore[misc]


# ---------------------------------------------------------------------------------------------
# ProxyNet: one proxy per ordered pair


@pytest.fixture
def members() -> Iterator[dict[str, EchoServer]]:
    servers = {name: EchoServer(tag=name.encode() + b":") for name in "abc"}
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture
def net(members: dict[str, EchoServer]) -> Iterator[ProxyNet]:
    with ProxyNet({name: s.address for name, s in members.items()}) as n:
        yield n


def reaches(net: ProxyNet, src: str, dst: str, expected: bool = True) -> bool:
    """Whether a message from src gets dst's answer: waited for generously when expected (a
    loaded machine is slow), for SILENCE when it should not come."""
    with connect(net.address(src, dst)[1]) as s:
        s.settimeout(5 if expected else SILENCE)
        s.sendall(b"?")
        try:
            return receive(s, 3) == dst.encode() + b":?"
        except TimeoutError:
            return False


def assert_links(net: ProxyNet, expected: set[tuple[str, str]]) -> None:
    pairs = [(s, d) for s in net.members for d in net.members if s != d]
    actual = {p for p in pairs if reaches(net, *p, expected=p in expected)}
    assert actual == expected


def test_every_ordered_pair_has_its_own_proxy_to_the_right_member(net: ProxyNet) -> None:
    assert len({net.address(s, d) for s in "abc" for d in "abc" if s != d}) == 6
    assert_links(net, {(s, d) for s in "abc" for d in "abc" if s != d})
    view = net.view("a")
    assert view["b"] == net.url("a", "b") and view["c"] == net.url("a", "c")
    assert view["a"].startswith("http://127.0.0.1:")


def test_block_cuts_one_direction_only(net: ProxyNet) -> None:
    net.block("a", "b")
    assert not reaches(net, "a", "b", expected=False)
    assert reaches(net, "b", "a")
    assert net.blocked_pairs() == {("a", "b")}


def test_partition_cuts_across_groups_both_ways_and_heal_restores(net: ProxyNet) -> None:
    net.partition({"a"}, {"b", "c"})
    assert_links(net, {("b", "c"), ("c", "b")})
    net.heal()
    assert_links(net, {(s, d) for s in "abc" for d in "abc" if s != d})


def test_isolate_and_members_left_out_of_a_partition(net: ProxyNet) -> None:
    net.isolate("c")
    assert_links(net, {("a", "b"), ("b", "a")})
    net.heal()
    net.partition({"a", "b"})  # c, named nowhere, is on its own
    assert net.blocked_pairs() == {("a", "c"), ("c", "a"), ("b", "c"), ("c", "b")}


def test_a_member_added_later_gets_its_pairs(net: ProxyNet) -> None:
    d = EchoServer(tag=b"d:")
    try:
        net.add_member("d", d.address)
        assert reaches(net, "a", "d") and reaches(net, "d", "a")
        net.block("d", "a")
        assert not reaches(net, "d", "a", expected=False) and reaches(net, "a", "d")
        net.remove_member("d")
        assert "d" not in net.members
    finally:
        d.stop()
