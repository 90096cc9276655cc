"""One member of a PySyncObj cluster behind the slice of Flotilla's client API the benchmarks use.

PySyncObj (PyPI ``pysyncobj``) is a pure-Python Raft library. This process runs one member of a
``SyncObj`` whose state is a dict of key -> bytes, **in memory with no durability** (no journal
file, no dump file: nothing is written to disk, let alone fsynced), and serves it over HTTP with
aiohttp so that ``bench/compare_etcd.py`` drives it with the same load generator as Flotilla:

* ``PUT /v1/kv/{key}`` (body = value): 200 once PySyncObj has committed the write and applied
  it on this member, with ``Flotilla-Index`` the Raft log index of the entry; 503 (JSON error,
  ``Retry-After``) when PySyncObj reports no leader or a lost command; 413 over 1 MiB. A member
  that is not the leader hands the command to the leader itself (PySyncObj does that).
* ``GET /v1/kv/{key}``: this member's applied value or 404 (serializable only: PySyncObj has no
  read index, so no linearizable read is offered).
* ``GET /v1/status``: ``{name, leader, role, term, commit_index, applied_index}``, names as in
  ``--members``.
* ``GET /healthz``.

PySyncObj runs its own thread (``autoTick``); a write is handed to it with a callback that
resolves an asyncio future through ``call_soon_threadsafe``, so the event loop never blocks.
Both threads share one process (and the GIL), so the process's CPU time is the member's whole
cost. Plain HTTP and plain TCP between members only: PySyncObj has no TLS (its optional
``password`` encryption is not TLS and is not used here).

Usage (``bench/compare_etcd.py`` starts three of these)::

    python bench/pysyncobj_server.py --name p0 \\
        --members p0=127.0.0.2:7001,p1=127.0.0.3:7001,p2=127.0.0.4:7001 \\
        --listen-client 127.0.0.2:8001
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

from aiohttp import web
from flotilla.node.main import event_loop

try:
    from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated
    from pysyncobj.version import VERSION
except ImportError:  # pragma: no cover - said once, clearly, by the bench and here
    print("pysyncobj_server: PySyncObj is not installed; install it with "
          "`.venv/bin/pip install -e '.[bench]'` (or `.venv/bin/pip install pysyncobj`)",
          file=sys.stderr)
    sys.exit(2)

MAX_VALUE = 1 << 20
HEARTBEAT_S = 0.1  # the bench's heartbeat and election timeout, as for etcd and Flotilla
ELECTION_TIMEOUT_S = 1.0
FAILURES = {getattr(FAIL_REASON, n): n.lower() for n in dir(FAIL_REASON) if n.isupper()}
ROLES = {0: "follower", 1: "candidate", 2: "leader"}

log = logging.getLogger("pysyncobj_server")


class KV(SyncObj):
    """The replicated key-value dict: ``put`` runs on every member once the entry commits."""

    def __init__(self, self_addr: str, partners: list[str], conf: SyncObjConf) -> None:
        super().__init__(self_addr, partners, conf)
        self.data: dict[str, bytes] = {}

    @replicated
    def put(self, key: str, value: bytes) -> int:
        self.data[key] = value
        return self.raftLastApplied + 1  # PySyncObj counts the entry as applied after this


def make_conf(batch: bool) -> SyncObjConf:
    """PySyncObj in memory (no journal, no dump file), with the bench's timing: a heartbeat every
    100 ms and election timeouts drawn from [1 s, 2 s), as etcd draws them.

    ``batch`` is PySyncObj's ``appendEntriesUseBatch``: entries wait for the next heartbeat and
    go out together (its default, built for throughput). Off, the leader sends as soon as a
    command arrives and wakes its thread through a pipe, which is what a closed-loop client
    with one write at a time needs; the bench runs it that way (see compare_etcd.py)."""
    return SyncObjConf(
        journalFile=None, fullDumpFile=None,
        appendEntriesPeriod=HEARTBEAT_S,
        raftMinTimeout=ELECTION_TIMEOUT_S, raftMaxTimeout=2 * ELECTION_TIMEOUT_S,
        appendEntriesUseBatch=batch,
        dynamicMembershipChange=False,
    )


def _error(status: int, message: str, code: str, **headers: str) -> web.Response:
    return web.Response(status=status, body=json.dumps({"error": message, "code": code}),
                        content_type="application/json", headers=headers)


class API:
    def __init__(self, kv: KV, name: str, names: dict[str, str]) -> None:
        self.kv = kv
        self.name = name
        self.names = names  # raft address -> member name

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_VALUE + 1024)
        app.router.add_put("/v1/kv/{key:.+}", self.put)
        app.router.add_get("/v1/kv/{key:.+}", self.get)
        app.router.add_get("/v1/status", self.status)
        app.router.add_get("/healthz", self.healthz)
        return app

    async def put(self, request: web.Request) -> web.Response:
        if (request.content_length or 0) > MAX_VALUE:
            return _error(413, f"a value is at most {MAX_VALUE} bytes", "too_large")
        value = await request.read()
        if len(value) > MAX_VALUE:
            return _error(413, f"a value is at most {MAX_VALUE} bytes", "too_large")
        loop = asyncio.get_running_loop()
        done: asyncio.Future[tuple[int | None, int]] = loop.create_future()

        def settled(result: int | None, error: int) -> None:  # on PySyncObj's thread
            loop.call_soon_threadsafe(_settle, done, result, error)

        self.kv.put(request.match_info["key"], value, callback=settled)
        index, error = await done
        if error != FAIL_REASON.SUCCESS:
            return _error(503, f"PySyncObj did not commit the write: {FAILURES.get(error, error)}",
                          "unavailable", **{"Retry-After": "1"})
        return web.Response(status=200, headers={"Flotilla-Index": str(index)})

    async def get(self, request: web.Request) -> web.Response:
        value = self.kv.data.get(request.match_info["key"])
        if value is None:
            return _error(404, "no such key", "not_found")
        return web.Response(body=value, headers={"Flotilla-Index": str(self.kv.raftLastApplied)})

    async def status(self, _: web.Request) -> web.Response:
        status = self.kv.getStatus()
        leader = status.get("leader")
        doc = {
            "name": self.name,
            "leader": self.names.get(str(leader), "") if leader is not None else "",
            "role": ROLES.get(status["state"], str(status["state"])),
            "term": status["raft_term"],
            "commit_index": status["commit_idx"],
            "applied_index": status["last_applied"],
            "system": f"pysyncobj {VERSION}",
        }
        return web.json_response(doc)

    async def healthz(self, _: web.Request) -> web.Response:
        return web.json_response({"ok": True})


def _settle(done: asyncio.Future, result: int | None, error: int) -> None:
    if not done.done():  # the request may have been cancelled (client gone)
        done.set_result((result, error))


def _host_port(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def serve(kv: KV, api: API, listen: tuple[str, int]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    runner = web.AppRunner(api.app(), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, listen[0], listen[1], reuse_address=True).start()
    log.info("serving clients on http://%s:%d", *listen)
    await stop.wait()
    await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--name", required=True, help="this member's name (one of --members)")
    p.add_argument("--members", required=True,
                   help="NAME=HOST:PORT,... every member's PySyncObj (Raft) address")
    p.add_argument("--listen-client", required=True, help="HOST:PORT of the HTTP API")
    p.add_argument("--batch", action="store_true",
                   help="PySyncObj's appendEntriesUseBatch (send entries with the next "
                        "heartbeat); off by default, see make_conf")
    p.add_argument("--loop", choices=("auto", "asyncio", "uvloop"),
                   default=os.environ.get("FLOTILLA_EVENT_LOOP", "auto"),
                   help="the HTTP side's event loop (default: uvloop when installed, as the "
                        "node; FLOTILLA_EVENT_LOOP=asyncio forces the standard loop)")
    args = p.parse_args(argv)
    members = dict(m.split("=", 1) for m in args.members.split(",") if m)
    if args.name not in members:
        p.error(f"--name {args.name} is not one of --members ({', '.join(members)})")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s")
    try:  # the node's own choice of loop, so both sides of the comparison run on the same
        factory, loop_name = event_loop("" if args.loop == "auto" else args.loop)
    except ValueError as exc:
        p.error(str(exc))
    log.info("pysyncobj %s in memory (no durability), batch=%s, event loop: %s", VERSION,
             args.batch, loop_name)
    kv = KV(members[args.name], [a for n, a in members.items() if n != args.name],
            make_conf(args.batch))
    api = API(kv, args.name, {addr: name for name, addr in members.items()})
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(serve(kv, api, _host_port(args.listen_client)))
    finally:
        kv.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
