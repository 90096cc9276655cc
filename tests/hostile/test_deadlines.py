"""Read deadlines on both ports.

The review held partial requests and idle connections open for over 200 s: nothing bounded how
long a member waits for a request's head or body. Every connection has read deadlines now; a
connection that stops part way is closed by the member within:

* ``HEAD_S`` of the last byte of a request line or headers cut short;
* ``BODY_S`` of the last byte of a body cut short (its Content-Length declared more);
* ``IDLE_S`` of the end of the last answer on an idle keep-alive connection (and of opening
  a connection that never sends a byte).

All of them, on the client port and the peer port, run at once in one test: it takes as long as
the longest deadline.
"""

from __future__ import annotations

import http.client
import select
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlsplit

from tests.harness.forger import MessageType, message
from tests.hostile.support import Findings, followers, in_name_of

HEAD_S = 15.0
BODY_S = 20.0
IDLE_S = 35.0
#: How long past its deadline a connection is watched before it counts as held.
WATCH_S = 2.0


@dataclass(frozen=True)
class Slow:
    """A connection that stops: ``first`` is a whole request sent (and answered) before,
    ``then`` what is sent before stopping."""

    port: str
    what: str
    deadline: float
    then: bytes = b""
    first: tuple[str, str, bytes, dict[str, str]] | None = None


def slow_connections(cluster, target: str, sender: str) -> list[tuple[Slow, str]]:
    """Each kind of stopped connection to ``target``, with the URL it goes to; on the peer
    port, requests come with the headers of ``sender``, another member."""
    client_url = cluster.nodes[target].url
    peer_url = cluster.peer_url(target)
    harmless = in_name_of(cluster, sender, [message(MessageType.HEARTBEAT_RESP, target, sender,
                                                    0)])
    identity = {"Flotilla-Cluster-Id": cluster.cluster_id, "Flotilla-Sender": sender}
    peer_head = ("POST /raft/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
                 + "".join(f"{k}: {v}\r\n" for k, v in identity.items()) + "\r\n").encode()
    cases = [
        (Slow("client", "a request line cut short", HEAD_S, b"GET /v1/sta"), client_url),
        (Slow("client", "headers cut short", HEAD_S,
              b"PUT /v1/kv/hostile/slow HTTP/1.1\r\nHost: x\r\nContent-Le"), client_url),
        (Slow("client", "a body cut short", BODY_S,
              b"PUT /v1/kv/hostile/slow HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n"
              + b"x" * 10), client_url),
        (Slow("client", "an idle keep-alive connection", IDLE_S,
              first=("GET", "/healthz", b"", {})), client_url),
        (Slow("client", "a connection that never sends a byte", IDLE_S), client_url),
        (Slow("peer", "a request line cut short", HEAD_S, b"POST /raft/v1/mess"), peer_url),
        (Slow("peer", "headers cut short", HEAD_S,
              b"POST /raft/v1/messages HTTP/1.1\r\nHost: x\r\nContent-Le"), peer_url),
        (Slow("peer", "a body cut short", BODY_S, peer_head + harmless[:10]), peer_url),
        (Slow("peer", "an idle keep-alive connection", IDLE_S,
              first=("POST", "/raft/v1/messages", harmless, identity)), peer_url),
        (Slow("peer", "a connection that never sends a byte", IDLE_S), peer_url),
    ]
    return cases


def held_for(slow: Slow, url: str) -> float | None:
    """Seconds until the member closed the connection after it stopped, or None if it still
    held it ``WATCH_S`` past the deadline."""
    parts = urlsplit(url)
    if slow.first is not None:
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)
        method, path, body, headers = slow.first
        conn.request(method, path, body=body, headers=headers)
        conn.getresponse().read()
        sock = conn.sock
        if sock is None:  # it closed the connection after the answer
            return 0.0
    else:
        sock = socket.create_connection((parts.hostname, parts.port), timeout=5)
    with sock:
        sock.sendall(slow.then)
        stopped = time.monotonic()
        end = stopped + slow.deadline + WATCH_S
        while (left := end - time.monotonic()) > 0:
            if not select.select([sock], [], [], left)[0]:
                break
            try:
                if not sock.recv(65536):  # an answer (a 408, a 400) may come first
                    return time.monotonic() - stopped
            except OSError:
                return time.monotonic() - stopped
    return None


def test_stopped_and_idle_connections_are_closed_on_both_ports(cluster, keeper):
    findings = Findings()
    leader = cluster.wait_leader(10)
    cases = slow_connections(cluster, leader, followers(cluster, leader)[0])
    with ThreadPoolExecutor(len(cases)) as pool:
        held = list(pool.map(lambda case: held_for(*case), cases))
    for (slow, url), seconds in zip(cases, held, strict=True):
        findings.expect(seconds is not None and seconds <= slow.deadline,
                        f"{slow.port} port ({url}), {slow.what}: "
                        + (f"still open {slow.deadline + WATCH_S:.0f}s later" if seconds is None
                           else f"closed only after {seconds:.1f}s")
                        + f"; wanted within {slow.deadline:.0f}s")
    keeper.check_serving(findings, "stopped and idle connections")
    keeper.check_no_tracebacks(findings)
    findings.check()
