"""Cluster DNS for processes on one machine: `POD.SERVICE.NS.svc` names resolved to the
loopback address and port the stand-in kubelet gave that pod.

Members speak TLS under their Kubernetes names: a member's certificate names
`demo-0.demo-peers.default.svc`, and whoever dials it (a peer, the operator, a test's client)
checks that name. So the names stay as the operator rendered them, and only the resolver
changes: `socket.getaddrinfo` answers for the names in a JSON table that the kubelet rewrites
as pods come and go, `{"HOST": {"PORT": ["127.0.0.1", REAL_PORT]}}` (every pod listens on a
port of its own on 127.0.0.1, so the table maps the port too). asyncio and aiohttp (without
aiodns), http.client and `socket.create_connection` all resolve through it; uvloop does not, so
members started here run on the standard loop (FLOTILLA_EVENT_LOOP=asyncio). Other `.svc` names
fail at once, as cluster DNS fails for a pod that does not exist; any other name is resolved
as usual.

`python -m tests.operator.clusterdns TABLE MODULE [ARGS...]` installs it and runs `python -m
MODULE ARGS...` in the same process (how the kubelet starts members and the tests start the
operator); `installed(TABLE)` does it for the test process itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_real_getaddrinfo = socket.getaddrinfo


class _Table:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._hosts: dict[str, dict[str, list[Any]]] = {}

    def lookup(self, host: str, port: object) -> tuple[str, int] | None:
        try:
            stat = self.path.stat()
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp != self._stamp:
                self._hosts, self._stamp = json.loads(self.path.read_text()), stamp
        except (OSError, ValueError):
            pass
        target = (self._hosts.get(host) or {}).get(str(port))
        return (str(target[0]), int(target[1])) if target else None


def _resolver(table: _Table):
    def getaddrinfo(host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0,
                    flags: int = 0) -> list[Any]:
        name = host.decode() if isinstance(host, bytes) else host
        if isinstance(name, str):
            name = name.rstrip(".").lower()
            if name.endswith(".svc") or name.endswith(".svc.cluster.local"):
                found = table.lookup(name, port)
                if found is None:
                    raise socket.gaierror(socket.EAI_NONAME, f"{name}: no such pod (yet)")
                return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", found)]
        return _real_getaddrinfo(host, port, family, type, proto, flags)
    return getaddrinfo


def install(path: str | os.PathLike[str]) -> None:
    socket.getaddrinfo = _resolver(_Table(Path(path)))


@contextlib.contextmanager
def installed(path: str | os.PathLike[str]) -> Iterator[None]:
    before = socket.getaddrinfo
    install(path)
    try:
        yield
    finally:
        socket.getaddrinfo = before


def command(table: str | os.PathLike[str], module: str, *args: str) -> list[str]:
    """The command line that runs `python -m module args` with this resolver."""
    return [sys.executable, "-m", "tests.operator.clusterdns", str(table), module, *args]


def main() -> None:
    table, module, *args = sys.argv[1:]
    install(table)
    # uvloop resolves names in libuv, past `socket.getaddrinfo`: a member started here runs on
    # the standard loop, which resolves through this table.
    os.environ["FLOTILLA_EVENT_LOOP"] = "asyncio"
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
