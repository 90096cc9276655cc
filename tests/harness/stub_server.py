"""A stand-in for one member's client API, for the harness's own tests.

It speaks the shapes of docs/contract.md ("The client API", ``/v1/status``,
``POST /v1/members``) from one in-memory dict behind a lock, so it is trivially linearizable,
and it has knobs to misbehave the ways a test needs: canned answers, slow answers, closing idle
connections, and acknowledging writes it then forgets. Standard library only.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["StubNode"]


class StubNode:
    """``with StubNode() as stub: KVClient(stub.url)...``"""

    def __init__(self, max_value_bytes: int = 1 << 20) -> None:
        self.max_value_bytes = max_value_bytes
        self.lock = threading.Lock()
        self.data: dict[str, tuple[bytes, int]] = {}  # key -> (value, mod index)
        self.index = 0
        self.sessions: dict[str, tuple[int, tuple[int, dict[str, str], bytes]]] = {}
        self.status_doc: dict[str, Any] = {"name": "stub", "role": "leader", "term": 1,
                                           "leader": "stub"}
        self.members: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        self.connections = 0
        # Knobs. `canned` answers are served first, one per request, before the real handling
        # (`None` entries mean "handle normally"); `apply_canned` decides whether a canned
        # answer to a write still applies it.
        self.canned: list[tuple[int, bytes] | None] = []
        self.apply_canned = False
        self.delay = 0.0
        self.forget_writes = False  # acknowledge puts without storing them (a lying server)
        self.close_after_each = False  # answer, then drop the connection without saying so
        self.hook: Callable[[str, str], None] | None = None
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> StubNode:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> StubNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the state machine ----------------------------------------------------------------

    def handle(self, method: str, target: str, headers: dict[str, str], body: bytes
               ) -> tuple[int, dict[str, str], bytes]:
        parts = urlsplit(target)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        path = parts.path
        with self.lock:
            self.requests.append((method, target, headers, body))
            if path == "/v1/status" and method == "GET":
                return _json(200, self.status_doc)
            if path == "/v1/members" and method == "POST":
                self.members.append(json.loads(body))
                self.index += 1
                return _json(200, {"index": self.index})
            if path == "/v1/kv" and method == "GET":
                keys = sorted(k for k in self.data if k.startswith(query.get("prefix", "")))
                if "limit" in query:
                    keys = keys[: int(query["limit"])]
                return _json(200, {"index": self.index, "keys": keys})
            if not path.startswith("/v1/kv/"):
                return _error(404, "not_found", f"no route for {method} {path}")
            key = unquote(path[len("/v1/kv/"):])
            if method == "GET":
                if key not in self.data:
                    return _error(404, "not_found", f"no key {key!r}")
                value, mod = self.data[key]
                return 200, {"Flotilla-Index": str(self.index),
                             "Flotilla-Mod-Index": str(mod)}, value
            session = headers.get("flotilla-client"), headers.get("flotilla-seq")
            if session[0] is not None and session[0] in self.sessions:
                seq, answer = self.sessions[session[0]]
                if str(seq) == session[1]:
                    return answer  # a retry: the first outcome, applied once
            answer = self._write(method, key, query, body)
            if session[0] is not None and session[1] is not None:
                self.sessions[session[0]] = (int(session[1]), answer)
            return answer

    def _write(self, method: str, key: str, query: dict[str, str], body: bytes
               ) -> tuple[int, dict[str, str], bytes]:
        if method == "DELETE":
            existed = self.data.pop(key, None) is not None
            self.index += 1
            return _json(200, {"index": self.index, "deleted": existed})
        if method != "PUT":
            return _error(400, "bad_request", f"{method} is not supported on keys")
        if len(body) > self.max_value_bytes:
            return _error(413, "too_large", f"values are limited to {self.max_value_bytes} bytes")
        if "prev_index" in query:
            want = int(query["prev_index"])
            have = self.data[key][1] if key in self.data else 0
            if want != have:
                return _error(412, "precondition_failed",
                              f"{key!r} has mod index {have}, not {want}")
        self.index += 1
        if not self.forget_writes:
            self.data[key] = (body, self.index)
        return _json(200, {"index": self.index}, {"Flotilla-Index": str(self.index),
                                                  "Flotilla-Mod-Index": str(self.index)})


def _json(status: int, doc: Any, headers: dict[str, str] | None = None
          ) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json", **(headers or {})}, \
        json.dumps(doc).encode()


def _error(status: int, code: str, sentence: str) -> tuple[int, dict[str, str], bytes]:
    return _json(status, {"error": sentence, "code": code})


def _handler_for(stub: StubNode) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as a real member

        def setup(self) -> None:
            super().setup()
            # Headers and body leave in two writes: without this, Nagle's algorithm holds the
            # body for the client's delayed ACK (40 ms a request).
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with stub.lock:
                stub.connections += 1

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            if stub.hook:
                stub.hook(self.command, self.path)
            if stub.delay:
                time.sleep(stub.delay)
            with stub.lock:
                canned = stub.canned.pop(0) if stub.canned else None
            if canned is not None:
                if stub.apply_canned:
                    stub.handle(self.command, self.path, headers, body)
                status, extra, payload = canned[0], {"Content-Type": "application/json"}, \
                    canned[1]
                if status == 503:
                    extra["Retry-After"] = "1"
            else:
                status, extra, payload = stub.handle(self.command, self.path, headers, body)
            self.send_response(status)
            for k, v in extra.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            try:
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                # the client gave up first (its timeout is what a test measures): nothing to
                # answer, and not worth a traceback on stderr
                self.close_connection = True
                return
            if stub.close_after_each:
                self.close_connection = True

        do_GET = do_PUT = do_POST = do_DELETE = _serve

    return Handler
