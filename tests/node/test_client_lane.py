"""The client port's lane (node/client_lane.py) against aiohttp's full API, byte for byte.

Two servers run in this process on loopback, each with the member's real client app
(`ClientAPI`) in front of the same stand-in for the member (it records each command proposed
and answers as a leader that commits at once): one is the plain aiohttp port, the other the
port as members run it, every connection starting in the lane. The same raw requests go to
both, on fresh connections, and the two must answer the same (status, headers but Date, body)
and propose the same commands (their timestamps aside). Requests come from a fixed list of the
odd and the hostile, and from a grammar (hypothesis) that mixes valid and invalid parts.

Further down, the lane's own duties on real connections: pipelined requests answered in
order, a connection that turns to other routes handed over whole, a head sent a byte at a
time, the deadlines, a write answered on a half-closed connection, and the refusals of a
member that cannot take the write (503 and 507, from the member's real exceptions).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from flotilla.node.alarms import NoSpace
from flotilla.node.client_lane import KV_ROUTE, ClientLane
from flotilla.node.consensus import NotLeader, TransferInProgress
from flotilla.node.http_api import ClientAPI
from flotilla.node.node import Overloaded
from flotilla.node.statemachine.kv import KVStateMachine, decode_command
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.node.site_thread import SiteThread

MAX_VALUE = 4096


class StandIn:
    """What the client API asks of a member, as a leader that commits every command at once.

    `refuse` set to an exception makes the next proposals raise it (as Runtime.submit does
    when it cannot append); `hold` keeps their futures unresolved until `release()`."""

    def __init__(self) -> None:
        self.cfg = SimpleNamespace(max_value_bytes=MAX_VALUE, admin_token="t" * 32)
        self.machine = KVStateMachine()
        self.metrics = SimpleNamespace(request=self._timed)
        self.requests: list[tuple[str, str, int]] = []
        self.commands: list[Any] = []
        self.refuse: BaseException | None = None
        self.hold = False
        self.held: list[tuple[asyncio.Future, dict[str, Any]]] = []
        self.leading = True
        self.admin_token_file = None

    def _timed(self, method: str, route: str, status: int, _seconds: float) -> None:
        self.requests.append((method, route, status))

    @property
    def applied(self) -> int:
        return len(self.commands)

    def is_leader(self) -> bool:
        return self.leading

    def leader(self) -> str | None:
        return "n0" if self.leading else None

    def leader_client_url(self) -> str | None:
        return None

    async def wait_leader_client_url(self, timeout: float) -> str | None:
        return None

    def submit(self, command: bytes) -> tuple[int, asyncio.Future]:
        if not self.leading:
            raise NotLeader(None)
        if self.refuse is not None:
            raise self.refuse
        decoded = decode_command(command)
        self.commands.append(decoded._replace(ts=0))
        index = len(self.commands)
        fut = asyncio.get_running_loop().create_future()
        result = ({"index": index, "deleted": False} if decoded.op == "DELETE" else
                  {"index": index, "mod_index": index})
        if self.hold:
            self.held.append((fut, result))
        else:
            fut.set_result(result)
        return index, fut

    def release(self) -> None:
        for fut, result in self.held:
            fut.set_result(result)
        self.held.clear()

    async def propose(self, command: bytes) -> tuple[int, Any]:
        index, fut = self.submit(command)
        return index, await fut

    async def read_barrier(self) -> int:
        return self.applied


class Port(SiteThread):
    """A client port on loopback in a thread of its own, with or without the lane."""

    def __init__(self, lane: bool, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.node = StandIn()
        super().__init__(lambda: ClientAPI(self.node).app(),  # type: ignore[arg-type]
                         lane=ClientLane(self.node) if lane else None,  # type: ignore[arg-type]
                         loop=loop)


@pytest.fixture(scope="module")
def ports() -> Iterator[tuple[Port, Port]]:
    plain, laned = Port(lane=False), Port(lane=True)
    try:
        yield plain, laned
    finally:
        plain.close()
        laned.close()


def read_answer(sock: socket.socket, wait: float,
                finals: int = 1) -> tuple[list[tuple[int, list, bytes]], bool]:
    """The answers read until `finals` final ones (interim 1xx kept), and whether the server
    closed first. Ask for every answer expected: bytes after the last one asked for are lost."""
    sock.settimeout(wait)
    buf, answers = b"", []
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            head = buf[:end].decode("latin-1").split("\r\n")
            status = int(head[0].split(" ")[1])
            headers = sorted((k.lower(), v.strip()) for k, _, v in
                             (line.partition(":") for line in head[1:]))
            length = int(dict(headers).get("content-length", 0))
            if len(buf) >= end + 4 + length:
                answers.append((status, [h for h in headers if h[0] != "date"],
                                buf[end + 4:end + 4 + length]))
                buf = buf[end + 4 + length:]
                finals -= status >= 200
                if not finals:
                    return answers, False
                continue
        try:
            data = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            return answers, True
        if not data:
            return answers, True
        buf += data


def exchange(port: Port, raw: bytes, wait: float = 2.0,
             finals: int = 1) -> tuple[Any, list, list]:
    """Send `raw` (`finals` requests) on a new connection: (answers, commands proposed, metric
    records)."""
    commands_before = len(port.node.commands)
    records_before = len(port.node.requests)
    with socket.create_connection(("127.0.0.1", port.port)) as sock:
        sock.sendall(raw)
        answers, _closed = read_answer(sock, wait, finals)
    # (both paths record the metric before they write the answer)
    return (answers, port.node.commands[commands_before:],
            port.node.requests[records_before:])


def same_everywhere(ports: tuple[Port, Port], raw: bytes, finals: int = 1) -> tuple[Any, list]:
    plain, laned = ports
    for port in ports:  # the indexes in the answers count from the same start
        port.call(port.node.commands.clear)
    want = exchange(plain, raw, finals=finals)
    got = exchange(laned, raw, finals=finals)
    assert got[0] == want[0], (raw[:300], got[0], want[0])
    assert got[1] == want[1], (raw[:300], got[1], want[1])
    assert got[2] == want[2], (raw[:300], got[2], want[2])
    return want[0], want[1]


def request(method: str = "PUT", target: str = "/v1/kv/a", body: bytes = b"v",
            headers: list[str] | None = None, version: str = "HTTP/1.1",
            length: bool = True) -> bytes:
    lines = [f"{method} {target} {version}", "Host: x"]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    lines += headers or []
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


ODD = [
    request(),
    request(body=b""),
    request(body=b"x" * MAX_VALUE),
    request(body=b"x" * (MAX_VALUE + 1)),
    request("DELETE", body=b"", length=False),
    request("DELETE", body=b""),
    request("DELETE", body=b"zz"),
    request("GET", body=b"", length=False),
    request("put"),
    request("POST"),
    request(version="HTTP/1.0"),
    request(target="/v1/kv/"),
    request(target="/v1/kv"),
    request(target="/v1/kv/a?prev_index=0"),
    request(target="/v1/kv/a?prev_index=x"),
    request(target="/v1/kv/a#frag"),
    request(target="/v1/kv/enc%2Fslash"),
    request(target="/v1/kv/%E2%82%AC"),
    request(target="/v1/kv/%FF"),
    request(target="/v1/kv/%zz"),
    request(target="/v1/kv/%"),
    request(target="/v1/kv/a/../b"),
    request(target="/v1/kv/a/%2E%2E/b"),
    request(target="/v1/kv/./a"),
    request(target="/v1/kv/a//b"),
    request(target="/v1/kv/" + "k" * 4096),
    request(target="/v1/kv/" + "k" * 4097),
    request(target="/v1/kv/" + "%C3%A9" * 2048),
    request(target="/v1/kv/" + "%C3%A9" * 2049),
    request(target="http://x/v1/kv/a"),
    request(target="/v1/kv/a b"),
    request(target="/v1/kv/a\tb"),
    request(target="/v1/kv/ümlaut"),
    request(headers=["Flotilla-Client: c1", "Flotilla-Seq: 1"]),
    request(headers=["Flotilla-Client: c1"]),
    request(headers=["Flotilla-Seq: 1"]),
    request(headers=["Flotilla-Client: ", "Flotilla-Seq: 1"]),
    request(headers=["Flotilla-Client: c1", "Flotilla-Seq: 0"]),
    request(headers=["Flotilla-Client: c1", "Flotilla-Seq: 007"]),
    request(headers=["Flotilla-Client: c1", "Flotilla-Seq: +7"]),
    request(headers=["Flotilla-Client: c1", "Flotilla-Seq: 9223372036854775808"]),
    request(headers=["Flotilla-Client: c1", "Flotilla-Seq: 9223372036854775807"]),
    request(headers=["Flotilla-Client: c1", "Flotilla-Client: c2", "Flotilla-Seq: 3"]),
    request(headers=["Flotilla-Client: c1", "Flotilla-Seq: 3", "Flotilla-Seq: 4"]),
    request(headers=["Flotilla-Client: c\u00e9", "Flotilla-Seq: 3"]),
    request(headers=["Content-Length: 1"]),
    request(headers=["Content-Length: 2"], body=b"vv"[:1]) + b"v",
    request(body=b"abc", length=False, headers=["Content-Length: +3"]),
    request(body=b"abc", length=False, headers=["Content-Length:  3 "]),
    request(body=b"abc", length=False, headers=["Content-Length: 03"]),
    request(body=b"abc", length=False, headers=["content-length: 3"]),
    request(headers=["Connection: close"]),
    request(headers=["Connection: keep-alive"]),
    request(headers=["Connection: Keep-Alive"]),
    request(headers=["Connection: upgrade", "Upgrade: websocket"]),
    request(headers=["Expect: 100-continue"]),
    request(headers=["Expect: 100-continue"], body=b"x" * (MAX_VALUE + 1)),
    request(headers=["Expect: magic"]),
    request(body=b"", length=False, headers=["Transfer-Encoding: chunked"])
    + b"1\r\nv\r\n0\r\n\r\n",
    request(headers=["X-Name : v"]),
    request(headers=["X-Folded: a", " b"]),
    request(headers=["X-Bin: \x01"]),
    request(headers=["X-Latin: \u00e9"]),
    request(headers=["Content-Type: application/json", "Accept: */*", "User-Agent: t"]),
    request(headers=["Flotilla-Forwarded: n1"]),
    b"PUT /v1/kv/a HTTP/1.1\nContent-Length: 1\n\nv",
    b"PUT /v1/kv/a HTTP/1.1\r\nContent-Length: 1\nX: y\r\n\r\nv",
    b"PUT  /v1/kv/a HTTP/1.1\r\nContent-Length: 1\r\n\r\nv",
    b"PUT /v1/kv/a HTTP/1.1 \r\nContent-Length: 1\r\n\r\nv",
    b"\r\nPUT /v1/kv/a HTTP/1.1\r\nContent-Length: 1\r\n\r\nv",
    b"PUT /v1/kv/a\x00 HTTP/1.1\r\nContent-Length: 1\r\n\r\nv",
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(40)) + b"\r\n\r\n",
]


@pytest.mark.parametrize("raw", ODD, ids=range(len(ODD)))
def test_the_lane_answers_as_the_full_api_does(ports, raw):
    same_everywhere(ports, raw)


@pytest.mark.parametrize("raw", [
    request(target="/v1/kv/p1") + request(target="/v1/kv/p2"),
    request(target="/v1/kv/p1") + request("GET", "/v1/kv/p1", b"", length=False),
    request("GET", "/v1/kv/p1", b"", length=False) + request(target="/v1/kv/p1"),
], ids=["put-put", "put-get", "get-put"])
def test_two_requests_in_one_segment_are_answered_as_the_full_api_does(ports, raw):
    same_everywhere(ports, raw, finals=2)


KEY_PARTS = st.sampled_from(["a", "b/c", "%2F", "%41", "%e2%82%ac", "%C3", "%zz", "%", ".",
                             "..", "/", "~", "-", "_", "?x=1", "#", ";", "+", " ", "\u00e9",
                             "%00", "%2e", "k" * 50])
HEADERS = st.sampled_from([
    "Flotilla-Client: c", "Flotilla-Seq: 5", "Flotilla-Seq: 0", "Flotilla-Seq: x",
    "Flotilla-Client:", "Connection: keep-alive", "Connection: close", "Expect: 100-continue",
    "Content-Type: text/plain", "X-A: b", "X-A:b", "X A: b", "X-A: \x7f", "Host: h",
    "Content-Length: 0", "Content-Length: -1", " folded",
])


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(method=st.sampled_from(["PUT", "PUT", "PUT", "DELETE", "GET", "Put"]),
       key=st.lists(KEY_PARTS, max_size=4).map("".join),
       headers=st.lists(HEADERS, max_size=3),
       body=st.binary(max_size=64),
       version=st.sampled_from(["HTTP/1.1", "HTTP/1.1", "HTTP/1.0"]))
def test_the_lane_answers_any_mix_as_the_full_api_does(ports, method, key, headers, body,
                                                       version):
    explicit = any(h.startswith("Content-Length") for h in headers)
    if explicit:
        body = b""  # the grammar's own framing: a body of 0 bytes, or an invalid length
    same_everywhere(ports, request(method, "/v1/kv/" + key, body, headers, version,
                                   length=not explicit))


# --- the lane's own duties --------------------------------------------------------------------


def laned(ports: tuple[Port, Port]) -> Port:
    return ports[1]


@contextlib.contextmanager
def connection(port: Port) -> Iterator[socket.socket]:
    with socket.create_connection(("127.0.0.1", port.port)) as sock:
        yield sock


def test_a_write_is_served_in_the_lane_with_the_full_apis_answer(ports):
    port = laned(ports)
    before = len(port.node.commands)
    answers, commands, records = exchange(port, request(target="/v1/kv/lane", body=b"v1"))
    (status, headers, body), = answers
    index = before + 1
    assert (status, body) == (200, b'{"index": %d}' % index)
    assert dict(headers)["content-type"] == "application/json; charset=utf-8"
    assert dict(headers)["flotilla-index"] == dict(headers)["flotilla-mod-index"] == str(index)
    assert dict(headers)["server"].startswith("Python/")
    assert [c.key for c in commands] == ["lane"]
    assert records == [("PUT", KV_ROUTE, 200)]


def aiohttp_holds(port: Port, sock: socket.socket) -> bool:
    """Whether aiohttp's handler has the server's end of `sock`."""
    mine = sock.getsockname()
    return port.call(lambda: any(
        t.get_extra_info("peername") == mine
        for t in port.runner.server._connections.values()))


def served_by_aiohttp(port: Port) -> int:
    """How many requests aiohttp's handlers have taken on this port."""
    return port.call(lambda: port.runner.server.requests_count)


def test_a_connection_lends_aiohttp_one_request_and_serves_the_next_write_again(ports):
    port = laned(ports)
    with connection(port) as sock:
        before = served_by_aiohttp(port)
        sock.sendall(request(target="/v1/kv/mine", body=b"m"))
        assert read_answer(sock, 5)[0][0][0] == 200
        assert not aiohttp_holds(port, sock)
        assert served_by_aiohttp(port) == before
        sock.sendall(request("GET", "/v1/kv/mine?consistency=serializable", b"",
                             length=False))
        (status, _headers, body), = read_answer(sock, 5)[0]
        assert status == 404  # the stand-in applies nothing: the GET is the full API's
        assert b"not_found" in body
        assert served_by_aiohttp(port) == before + 1
        for raw in (request(target="/v1/kv/mine", body=b"m2"),
                    request("DELETE", "/v1/kv/mine", b"", length=False)):
            sock.sendall(raw)
            assert read_answer(sock, 5)[0][0][0] == 200
        assert served_by_aiohttp(port) == before + 1  # both in the lane again
    assert [(c.op, c.value) for c in port.node.commands[-2:]] == [("put", b"m2"),
                                                                  ("delete", b"")]


# A client in a process of its own: on one connection, a linearizable read (aiohttp's) and
# then a write, each sent as soon as the answer before it is in, `rounds` times; prints the
# statuses.
TAKING_TURNS = r"""
import socket, sys
port, rounds = int(sys.argv[1]), int(sys.argv[2])
turns = (b"GET /v1/kv/turn HTTP/1.1\r\nHost: x\r\n\r\n",
         b"PUT /v1/kv/turn HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nv")
statuses, buf = [], b""
with socket.create_connection(("127.0.0.1", port)) as sock:
    sock.settimeout(10)
    for _ in range(rounds):
        for raw in turns:
            sock.sendall(raw)
            while True:
                end = buf.find(b"\r\n\r\n")
                if end >= 0:
                    head = buf[:end].split(b"\r\n")
                    length = int([line for line in head if line.lower().startswith(
                        b"content-length:")][0].split(b":")[1])
                    if len(buf) >= end + 4 + length:
                        break
                data = sock.recv(65536)
                if not data:
                    sys.exit("the server closed the connection after " + repr(statuses))
                buf += data
            statuses.append(int(head[0].split()[1]))
            buf = buf[end + 4 + length:]
print(" ".join(map(str, statuses)))
"""


@pytest.fixture(scope="module")
def uvloop_port() -> Iterator[Port]:
    """The laned port on uvloop, the loop members run by default."""
    uvloop = pytest.importorskip("uvloop")
    port = Port(lane=True, loop=uvloop.new_event_loop())
    try:
        yield port
    finally:
        port.close()


def test_a_write_sent_the_moment_aiohttp_answered_a_read_is_served_in_the_lane(uvloop_port):
    """On uvloop, a client's next request can arrive before aiohttp's task that wrote the
    answer to the lent one has resumed the one that waits for the next request: the lane must
    see that aiohttp has answered (not that it is back waiting), or it hands the connection to
    aiohttp for good and every later write on it pays aiohttp's cost (a 1-client bench run's
    leader spent a third more CPU per write when that happened).

    The race is arranged, not hoped for: a member's loop has other work (peers' messages, its
    batches), here a callback that takes 1 ms in every turn of the loop and ends each read's
    wait for its barrier just before it takes its own turn. So the read's answer is written,
    then the other work runs while the client sends its write, and uvloop hands the write's
    bytes over before the task that wrote the answer has resumed."""
    port = uvloop_port
    node, loop = port.node, port.loop
    rounds = 100
    before, commands = served_by_aiohttp(port), len(node.commands)
    barriers: list[asyncio.Future] = []
    busy = True

    async def read_barrier() -> int:
        barriers.append(loop.create_future())
        await barriers[-1]
        return node.applied

    def other_work() -> None:
        while barriers:
            barriers.pop().set_result(None)
        until = time.perf_counter() + 0.001
        while time.perf_counter() < until:
            pass
        if busy:
            loop.call_soon(other_work)

    node.read_barrier = read_barrier
    port.call(other_work)
    try:
        done = subprocess.run([sys.executable, "-c", TAKING_TURNS, str(port.port),
                               str(rounds)], capture_output=True, text=True, timeout=120)
    finally:
        busy = False
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["404", "200"] * rounds
    assert len(node.commands) - commands == rounds
    assert served_by_aiohttp(port) - before == rounds  # the reads, and none of the writes


# One request each, answered without closing the connection: (raw, served in the lane)
TURNS = [
    (request(target="/v1/kv/t", body=b"1"), True),
    (request(target="/v1/kv/t%2Fu", body=b"22", headers=["Flotilla-Client: c",
                                                          "Flotilla-Seq: 9"]), True),
    (request("DELETE", "/v1/kv/t", b"", length=False), True),
    (request(target="/v1/kv/t?prev_index=0", body=b"3"), False),
    (request(target="/v1/kv/t", body=b"4", headers=["Flotilla-Seq: 1"]), False),
    (request("GET", "/v1/kv/t?consistency=serializable", b"", length=False), False),
    (request("GET", "/v1/kv/t", b"", length=False), False),
    (request("GET", "/v1/kv?prefix=t", b"", length=False), False),
    (request("GET", "/v1/status", b"", length=False), False),
    (request("GET", "/healthz", b"", length=False), False),
    (request("GET", "/nowhere", b"", length=False), False),
    (request("POST", "/v1/kv/t", b"x"), False),
    (request("DELETE", "/v1/kv/", b"", length=False), False),
    (request(target="/v1/kv/%FF", body=b"5"), False),
]


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.sampled_from(range(len(TURNS))), min_size=2, max_size=6))
def test_requests_taking_turns_on_one_connection_are_answered_as_the_full_api_does(ports,
                                                                                  turns):
    answers = []
    for port in ports:  # the indexes in the answers count from the same start
        port.call(port.node.commands.clear)
    for port in ports:
        before = served_by_aiohttp(port)
        commands = len(port.node.commands)
        got = []
        with connection(port) as sock:
            for turn in turns:
                sock.sendall(TURNS[turn][0])
                got.append(read_answer(sock, 5)[0])
        answers.append((got, port.node.commands[commands:]))
        if port is laned(ports):
            # the lane serves its requests on a connection that lent aiohttp others before
            assert served_by_aiohttp(port) - before == sum(not TURNS[t][1] for t in turns)
    assert answers[0] == answers[1]


def test_pipelined_writes_are_answered_in_order_one_at_a_time(ports):
    port = laned(ports)
    port.node.hold = True
    try:
        with connection(port) as sock:
            before = len(port.node.commands)
            sock.sendall(b"".join(request(target=f"/v1/kv/pipe/{i}", body=b"%d" % i)
                                  for i in range(50)))
            time.sleep(0.2)
            # one write at a time: the second is not read before the first is answered
            assert len(port.node.commands) == before + 1
            indexes = []
            for _ in range(50):
                port.call(port.node.release)
                (status, headers, _body), = read_answer(sock, 5)[0]
                assert status == 200
                indexes.append(int(dict(headers)["flotilla-index"]))
            assert indexes == list(range(before + 1, before + 51))
            assert [c.key for c in port.node.commands[before:]] == [
                f"pipe/{i}" for i in range(50)]
    finally:
        port.node.hold = False
        port.call(port.node.release)


def test_a_request_sent_behind_one_of_aiohttps_makes_the_connection_aiohttps(ports):
    port = laned(ports)
    with connection(port) as sock:
        sock.sendall(request(target="/v1/kv/turn", body=b"t1"))
        assert read_answer(sock, 5)[0][0][0] == 200
        # a GET and a write after it, in one segment: the GET is aiohttp's, and so is the
        # connection from then on
        sock.sendall(request("GET", "/v1/kv/turn?consistency=serializable", b"", length=False)
                     + request(target="/v1/kv/turn", body=b"t2"))
        answers, _ = read_answer(sock, 5, finals=2)
        # the stand-in applies nothing: the GET's is aiohttp's not found
        assert [a[0] for a in answers] == [404, 200]
        # the write sent behind the GET was aiohttp's, and so is the next one
        before = served_by_aiohttp(port)
        sock.sendall(request(target="/v1/kv/turn", body=b"t3"))
        assert read_answer(sock, 5)[0][0][0] == 200
        assert served_by_aiohttp(port) == before + 1
    assert [c.value for c in port.node.commands[-3:]] == [b"t1", b"t2", b"t3"]


def test_a_head_sent_a_byte_at_a_time_is_served(ports):
    port = laned(ports)
    raw = request(target="/v1/kv/slow", body=b"s" * 100)
    with connection(port) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(len(raw)):
            sock.send(raw[i:i + 1])
            if i % 20 == 0:
                time.sleep(0.001)
        assert read_answer(sock, 5)[0][0][0] == 200
    assert port.node.commands[-1].value == b"s" * 100


def test_a_write_on_a_half_closed_connection_is_answered_then_closed(ports):
    port = laned(ports)
    with connection(port) as sock:
        sock.sendall(request(target="/v1/kv/half", body=b"h"))
        sock.shutdown(socket.SHUT_WR)
        answers, _ = read_answer(sock, 5)
        assert answers[0][0] == 200
        sock.settimeout(5)
        assert sock.recv(100) == b""  # then the server closes
    assert port.node.commands[-1].key == "half"


def test_a_half_close_while_a_write_is_under_way_answers_it_then_closes(ports):
    port = laned(ports)
    port.node.hold = True
    try:
        with connection(port) as sock:
            sock.sendall(request(target="/v1/kv/under-way") + b"PUT /v1/kv/never-end")
            time.sleep(0.1)
            sock.shutdown(socket.SHUT_WR)
            time.sleep(0.1)
            port.call(port.node.release)
            answers, _ = read_answer(sock, 5)
            assert [a[0] for a in answers] == [200]
            sock.settimeout(5)
            assert sock.recv(100) == b""  # the incomplete head is no request: closed
    finally:
        port.node.hold = False
        port.call(port.node.release)
    assert port.node.commands[-1].key == "under-way"


def test_a_body_cut_short_by_the_client_closing_writes_nothing(ports):
    port = laned(ports)
    before = len(port.node.commands)
    with connection(port) as sock:
        sock.sendall(request(target="/v1/kv/cut", body=b"x" * 10)[:-5])
        time.sleep(0.1)
        sock.shutdown(socket.SHUT_WR)
        answers, _ = read_answer(sock, 5)
        assert [a[0] for a in answers] == [400]
        assert b"closed before the whole request arrived" in answers[0][2]
    assert len(port.node.commands) == before


@pytest.mark.parametrize("refusal, status, code", [
    (Overloaded("10 writes are already waiting"), 503, "overloaded"),
    (NoSpace("the data dir has 1 MiB free"), 507, "no_space"),
    (TransferInProgress("n2"), 503, "unavailable"),
    # it led when the request was read and no longer does when it proposes: forwarded by the
    # full API, which finds no leader's address here
    (NotLeader(None), 503, "unavailable"),
])
def test_a_member_that_cannot_take_the_write_answers_as_the_full_api_does(ports, refusal,
                                                                          status, code):
    for port in ports:
        port.node.refuse = refusal
    try:
        answers, commands = same_everywhere(ports, request(target="/v1/kv/refused"))
    finally:
        for port in ports:
            port.node.refuse = None
    (got, _headers, body), = answers
    assert got == status and code.encode() in body and not commands


def test_a_write_reaching_a_member_that_stopped_leading_is_the_full_apis(ports):
    port = laned(ports)
    port.node.leading = False
    try:
        with connection(port) as sock:
            sock.sendall(request(target="/v1/kv/follower"))
            answers, _ = read_answer(sock, 5)
        # the full API forwards it: with no leader known to the stand-in, a 503
        assert answers[0][0] == 503
    finally:
        port.node.leading = True


def test_aiohttps_idle_deadline_does_not_end_a_connection_the_lane_keeps_busy(ports,
                                                                               monkeypatch):
    """After lending one request, aiohttp's keep-alive deadline runs from its answer: the
    lane's writes after it must move it on (`keep_open`), or aiohttp would close a busy
    connection as idle."""
    from flotilla.node import client_lane, deadlines

    monkeypatch.setattr(deadlines, "IDLE_TIMEOUT", 1.0)
    monkeypatch.setattr(client_lane, "IDLE_TIMEOUT", 1.0)
    port = laned(ports)
    with connection(port) as sock:
        sock.sendall(request("GET", "/v1/kv/busy?consistency=serializable", b"",
                             length=False))
        assert read_answer(sock, 5)[0][0][0] == 404  # lent to aiohttp
        for i in range(12):  # 2.4 s of writes, each 0.2 s after the last answer
            time.sleep(0.2)
            sock.sendall(request(target=f"/v1/kv/busy/{i}", body=b"b"))
            answers, closed = read_answer(sock, 5)
            assert not closed and answers[0][0] == 200, (i, answers)
        time.sleep(2.5)  # and idle for longer than the deadline: closed
        sock.settimeout(5)
        assert sock.recv(100) == b""
