"""`flotilla node`: run one member until SIGTERM.

Exit codes (the contract): 0 after a clean shutdown on SIGTERM/SIGINT (a leader hands
leadership over first, within 5 s); 2 for bad flags or a listen address it cannot bind, with
a one-line reason; 3 for a data dir this member will not use (corruption, another cluster's
data, a missing hard state next to a log, a log shorter than the commit index it recorded, a
dir another live process holds), naming the file and offset, or a storage failure while running
(a full disk, at start or later, names the file and the bytes still free); 4 for a restore
target (`--restore-index`, `--restore-time`) outside the archive, naming what it can restore,
with nothing written to the data dir; 1 when the member's main loop failed for another reason
(a bug: the log says where), so a supervisor restarts it instead of it lingering half-alive.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence

from aiohttp import web
from flotilla.node.archive import ArchiveError
from flotilla.node.storage import StorageError
from flotilla.node.storage.space import disk_full

from flotilla import logs

from . import config, restore, tls
from .client_lane import ClientLane
from .deadlines import DeadlineSite
from .http_api import ClientAPI, peer_app
from .node import Node

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_DATA, EXIT_OUTSIDE = 0, 1, 2, 3, 4


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        cfg = config.parse(argv)
    except config.UsageError as exc:
        print(f"flotilla node: {exc}", file=sys.stderr)
        return EXIT_USAGE
    logs.configure(cfg.log_format, cfg.log_level, prefix=cfg.name, fields={"member": cfg.name})
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    def fatal(message: str) -> None:
        logs.fatal("flotilla node", message, cfg.log_format)

    try:
        contexts = tls.NodeContexts.from_config(cfg)
    except tls.TLSError as exc:
        fatal(f"cannot use TLS: {exc}")
        return EXIT_USAGE
    # Whatever the member creates (data dir, downloaded snapshots, a file:// archive) is
    # readable by its own user only; storage also gives its modes explicitly.
    os.umask(0o077)
    node = Node(cfg, contexts)
    try:
        node.open()
    except (StorageError, OSError) as exc:
        exc = disk_full(exc, cfg.data_dir) or exc
        fatal(f"refusing to start: {exc}")
        return EXIT_DATA
    except restore.OutsideArchive as exc:
        fatal(f"cannot restore: {exc}")
        return EXIT_OUTSIDE
    except ArchiveError as exc:
        fatal(f"cannot restore from {cfg.restore_from}: {exc}")
        return EXIT_DATA
    try:
        loop_factory, loop_name = event_loop(os.environ.get("FLOTILLA_EVENT_LOOP", ""))
    except ValueError as exc:
        fatal(str(exc))
        return EXIT_USAGE
    try:
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            return runner.run(_serve(node, loop_name))
    except ListenError as exc:
        fatal(f"cannot listen: {exc}")
        return EXIT_USAGE


def event_loop(choice: str) -> tuple[Callable[[], asyncio.AbstractEventLoop], str]:
    """(loop factory, its name) for FLOTILLA_EVENT_LOOP: uvloop when it is installed (its
    transports, TLS included, are compiled: less CPU per request), unless ``asyncio`` asks for
    the standard loop; ``uvloop`` insists on uvloop."""
    if choice not in ("", "asyncio", "uvloop"):
        raise ValueError(f"FLOTILLA_EVENT_LOOP={choice}: use asyncio or uvloop (or leave it "
                         "unset: uvloop when installed)")
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise ValueError("FLOTILLA_EVENT_LOOP=uvloop, but uvloop is not installed "
                                 "(pip install uvloop, or unset it)") from None
        else:
            return uvloop.new_event_loop, "uvloop"
    return asyncio.new_event_loop, "asyncio"


class ListenError(Exception):
    """A listen address cannot be bound (in use, not an address of this host): a usage error."""


async def _listen(node: Node) -> list[web.AppRunner]:
    """Bind both ports, or raise ListenError with nothing left open behind it."""
    cfg = node.cfg
    runners: list[web.AppRunner] = []
    tls_contexts = node.tls
    client_app = ClientAPI(node).app()
    client_lane = ClientLane(node)
    client_app.on_cleanup.append(client_lane.close)
    for app, (host, port), flag, context, lane in (
            (peer_app(node), cfg.listen_peer, "--listen-peer", tls_contexts.peer_server, None),
            (client_app, cfg.listen_client, "--listen-client", tls_contexts.client_server,
             client_lane)):
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        runners.append(runner)
        try:
            await runner.setup()
            await DeadlineSite(runner, host, port, reuse_address=True, ssl_context=context,
                               lane=lane).start()
        except OSError as exc:
            for opened in runners:
                await opened.cleanup()
            # errno > 0 is the kernel's refusal; a failed name lookup has a negative one.
            reason = (os.strerror(exc.errno) if exc.errno and exc.errno > 0
                      else exc.strerror or str(exc)).lower()
            raise ListenError(f"{host}:{port} ({flag}): {reason}") from exc
    return runners


async def _serve(node: Node, loop_name: str | None = None) -> int:
    cfg = node.cfg
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Bind first: a member that cannot listen has started nothing that needs undoing. Requests
    # that arrive before `start` only queue, as they would during any busy moment.
    runners = await _listen(node)
    logging.getLogger(__name__).info("event loop: %s",
                                     loop_name or type(loop).__module__.split(".")[0])
    await node.start()
    logging.getLogger(__name__).info("serving peers on %s, clients on %s",
                                     cfg.advertise_peer, cfg.advertise_client)
    stopped = asyncio.create_task(stop.wait())
    died = asyncio.create_task(node.dead.wait())
    await asyncio.wait((stopped, died), return_when=asyncio.FIRST_COMPLETED)
    for task in (stopped, died):
        task.cancel()
    await node.stop()
    for runner in runners:
        await runner.cleanup()
    if node.fatal is not None:
        logs.fatal("flotilla node", f"stopped after a fatal error: {node.fatal}",
                   cfg.log_format)
        return EXIT_DATA if isinstance(node.fatal, StorageError) else EXIT_FAILED
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
