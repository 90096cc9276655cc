"""A stand-in for ``flotilla node`` that the harness's own tests start as a real process.

It takes the node's flags, prints its command line, serves ``GET /v1/status`` on
``--listen-client``, logs every POST (``POST /v1/members``...) and answers it 200, and exits 0
(or ``FAKE_NODE_EXIT_CODE``) on SIGTERM, so NodeProcess and LocalCluster can be tested
(signals, restarts, logs, wait_leader) before and independently of the real server. What it
says in its status comes from the JSON file named by ``FAKE_NODE_STATUS`` (re-read on every
request, so a test can change it), with this member's name filled in. Standard library only:
it runs as a script, not as part of the tests package.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser()
    for flag in ("--name", "--data-dir", "--listen-peer", "--listen-client",
                 "--initial-cluster", "--initial-cluster-state", "--cluster-id",
                 "--election-timeout-ms", "--heartbeat-ms"):
        parser.add_argument(flag, required=flag in ("--name", "--listen-client"))
    args, _ = parser.parse_known_args()
    print("fake node argv:", json.dumps(sys.argv[1:]), flush=True)
    host, port = args.listen_client.rsplit(":", 1)

    def status() -> dict[str, Any]:
        doc: dict[str, Any] = {"role": "follower", "term": 1, "leader": None}
        path = os.environ.get("FAKE_NODE_STATUS")
        if path and os.path.exists(path):
            with open(path) as f:
                shared = json.load(f)
            doc.update(shared.get(args.name, shared.get("*", {})))
        doc["name"] = args.name
        return doc

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *a: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/v1/status":
                self._answer(200, json.dumps(status()).encode())
            else:
                self._answer(404, b'{"error": "not here", "code": "not_found"}')

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            print(f"fake node: POST {self.path} {body.decode(errors='replace')}", flush=True)
            self._answer(200, b'{"index": 1}')

        def _answer(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((host, int(port)), Handler)
    server.daemon_threads = True

    def on_term(signum: int, frame: Any) -> None:
        print("fake node: SIGTERM, exiting", flush=True)
        os._exit(int(os.environ.get("FAKE_NODE_EXIT_CODE", "0")))

    signal.signal(signal.SIGTERM, on_term)
    print(f"fake node {args.name}: serving on {host}:{port}", flush=True)
    server.serve_forever(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main())
