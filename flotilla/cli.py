"""The `flotilla` command: run a member, a local cluster, and talk to a cluster.

Exit codes: 0 on success; 1 when the command could not do its job (key not found, no leader,
a cluster already running...), with one line on stderr; 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

DESCRIPTION = "Flotilla: Raft replicated-state-machine clusters."
EPILOG = """\
`flotilla COMMAND --help` describes each command. up, status, scale, down and kv find the local
cluster in --dir (default ./.flotilla); kv and status also take --endpoints URL,URL.
Exit codes: 0 success, 1 the command failed (one line on stderr), 2 bad usage.
"""


class CommandError(Exception):
    """A failure worth one line on stderr and exit code 1."""


# --- parsers --------------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, not {value}")
    return value


def _non_negative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, not {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="flotilla", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    commands.add_parser("node", add_help=False,
                        help="run one cluster member (flotilla node --help)")

    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--dir", default=None,
                       help="the local cluster's directory (default ./.flotilla)")
    find = argparse.ArgumentParser(add_help=False, parents=[where])
    find.add_argument("--endpoints", default=None,
                      help="client URLs of the cluster, comma-separated (instead of --dir)")
    find.add_argument("--timeout", type=float, default=5.0,
                      help="seconds a request may take, retries included (default 5)")

    p = commands.add_parser(
        "up", parents=[where],
        help="start a local cluster of N member processes (or resume a stopped one)",
        description="Start N `flotilla node` processes on 127.0.0.1 with free ports, each with "
                    "its own data dir and log under --dir, and return once a leader serves a "
                    "linearizable read. If --dir holds a stopped cluster, its members are "
                    "restarted with the flags they first ran with.")
    p.add_argument("--replicas", type=_positive, default=3, help="members (default 3)")
    p.add_argument("--archive", default=None,
                   help="where snapshots and log segments are shipped: s3://bucket/prefix or "
                        "file:///path (default file://DIR/archive)")
    p.add_argument("--restore-from", default=None,
                   help="a new cluster starts from this archive (the --archive URL an old "
                        "cluster used): its newest state, or --restore-index N")
    p.add_argument("--restore-index", type=_positive, default=None,
                   help="with --restore-from: exactly the state at this log index")
    p.add_argument("--election-timeout-ms", type=_positive, default=1000,
                   help="members' election timeout (default 1000)")
    p.add_argument("--heartbeat-ms", type=_positive, default=100,
                   help="members' heartbeat interval (default 100)")
    p.add_argument("--base-port", type=_positive, default=None,
                   help="fixed ports: peers at BASE+i, clients at BASE+10+i (default: free "
                        "ports)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds to wait for a leader to serve (default 60)")
    p.set_defaults(run=cmd_up)

    p = commands.add_parser(
        "status", parents=[find],
        help="show the members of a cluster (--json: the leader's /v1/status)",
        description="A table of the members: role, term, commit and applied index, client URL "
                    "and, for a local cluster, whether its pid is alive. Exits 1 when no "
                    "leader is known.")
    p.add_argument("--json", action="store_true",
                   help="print the leader's /v1/status document instead")
    p.set_defaults(run=cmd_status)

    p = commands.add_parser(
        "down", parents=[where],
        help="stop a local cluster (SIGTERM, then SIGKILL); data is kept",
        description="SIGTERM every member (a leader hands leadership over first), SIGKILL "
                    "those still running after --timeout. Data dirs and logs are kept: "
                    "`flotilla up` resumes the cluster.")
    p.add_argument("--timeout", type=float, default=15.0,
                   help="seconds to wait after SIGTERM before SIGKILL (default 15)")
    p.set_defaults(run=cmd_down)

    p = commands.add_parser(
        "scale", parents=[where],
        help="change a local cluster to exactly N voters (joint consensus, one step at a time)",
        description="Through the operator's planner: new members start empty and join as "
                    "learners, catch up, and become voters in one joint-consensus change; "
                    "leaving members hand leadership over first, leave in one joint change, "
                    "then stop. Returns once the configuration is exactly N voters, not "
                    "joint.")
    p.add_argument("replicas", type=_positive, metavar="N", help="voters wanted")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds to wait for the change to finish (default 300)")
    p.add_argument("--catch-up-timeout", type=float, default=600.0,
                   help="a learner still behind after this many seconds is removed and added "
                        "again, never promoted (default 600)")
    p.add_argument("--keep-removed-data", action="store_true",
                   help="keep the data dirs of removed members (they never rejoin on it: a "
                        "slot that comes back is wiped first)")
    p.set_defaults(run=cmd_scale)

    commands.add_parser("operator", add_help=False,
                        help="run the Kubernetes operator (flotilla operator --help)")

    kv = commands.add_parser("kv", help="the command-line client: kv put|get|del|ls",
                             description="The command-line client of the key-value API.")
    ops = kv.add_subparsers(dest="op", metavar="OP", required=True)
    p = ops.add_parser("put", parents=[find], help="write KEY = VALUE",
                       description="Write VALUE (or, with `-`, the bytes of stdin) under KEY "
                                   "and print the write's index.")
    p.add_argument("key")
    p.add_argument("value", help="the value, or - to read it from stdin")
    p.add_argument("--prev-index", type=_non_negative, default=None,
                   help="compare-and-set: only if the key's mod index is this (0: must not "
                        "exist); exit 1 otherwise")
    p.set_defaults(run=cmd_kv_put)
    p = ops.add_parser("get", parents=[find], help="print KEY's value",
                       description="Write KEY's value, as raw bytes, to stdout. Exit 1 with "
                                   "'key not found' when it does not exist.")
    p.add_argument("key")
    p.add_argument("--serializable", action="store_true",
                   help="answer from the member's local state (may be stale; works without a "
                        "leader)")
    p.set_defaults(run=cmd_kv_get)
    p = ops.add_parser("del", parents=[find], help="delete KEY",
                       description="Delete KEY; prints 1 if it existed, 0 if it did not.")
    p.add_argument("key")
    p.set_defaults(run=cmd_kv_del)
    p = ops.add_parser("ls", parents=[find], help="list keys",
                       description="Print the keys starting with PREFIX, one per line, "
                                   "ascending.")
    p.add_argument("prefix", nargs="?", default="")
    p.add_argument("--limit", type=_positive, default=None, help="at most this many keys")
    p.set_defaults(run=cmd_kv_ls)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "node":
        from flotilla.node.main import main as node_main

        return node_main(argv[1:])
    if argv and argv[0] == "operator":
        from flotilla.operator.main import main as operator_main

        return operator_main(argv[1:])
    parser = build_parser()
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return int(exc.code or 0)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from flotilla.client import FlotillaError
    from flotilla.local import BadOption, LocalClusterError

    try:
        return args.run(args)
    except BadOption as exc:
        _fail(args, str(exc))
        return EXIT_USAGE
    except (CommandError, FlotillaError, LocalClusterError) as exc:
        _fail(args, str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`flotilla kv ls | head`): not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


def _fail(args: argparse.Namespace, message: str) -> None:
    name = " ".join(x for x in ("flotilla", args.command, getattr(args, "op", None)) if x)
    print(f"{name}: {message}", file=sys.stderr)


# --- local clusters -------------------------------------------------------------------------


def _dir(args: argparse.Namespace) -> Path:
    from flotilla.local import DEFAULT_DIR

    return Path(args.dir or DEFAULT_DIR)


def _say(text: str) -> None:
    print(text, flush=True)


def cmd_up(args: argparse.Namespace) -> int:
    from flotilla import local

    root = _dir(args)
    resuming = local.LocalCluster.exists(root)
    cluster, leader = local.up(
        root, args.replicas, election_timeout_ms=args.election_timeout_ms,
        heartbeat_ms=args.heartbeat_ms, archive=args.archive, base_port=args.base_port,
        timeout=args.timeout, say=_say, restore_from=args.restore_from,
        restore_index=args.restore_index)
    state = cluster.state
    verb = "resumed" if resuming else "started"
    _say(f"{verb} {len(cluster.members)} members in {root} (cluster id {state.cluster_id})")
    width = max(len(n) for n in cluster.names)
    for m in cluster.members:
        _say(f"  {m.name:<{width}}  {m.client_url}  pid {m.pid}  log {_rel(m.log_file)}")
    for note in state.notes:
        _say(f"note: {note}")
    _say(f"leader: {leader}")
    _say(f"endpoints: {','.join(cluster.endpoints)}")
    return EXIT_OK


def cmd_down(args: argparse.Namespace) -> int:
    from flotilla import local

    root = _dir(args)
    local.LocalCluster.load(root)  # says so when there is no cluster, before any lock file
    with local.locked(root):
        report = local.LocalCluster.load(root).stop(timeout=args.timeout)
    for name, what in report.items():
        _say(f"{name}: {what}")
    _say(f"the cluster in {root} is down; its data is kept (`flotilla up --dir {root}` "
         "resumes it)")
    return EXIT_OK


def cmd_scale(args: argparse.Namespace) -> int:
    from flotilla import scaling

    root = _dir(args)
    result = scaling.scale(root, args.replicas, timeout=args.timeout,
                           catch_up_timeout=args.catch_up_timeout,
                           keep_removed_data=args.keep_removed_data, say=_say)
    voters = (result.leader_status or {}).get("config", {}).get("voters", [])
    _say(f"voters: {', '.join(voters)} (leader {result.leader})")
    return EXIT_OK


def _rel(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


# --- status ---------------------------------------------------------------------------------


def _client(args: argparse.Namespace):
    """A client for --endpoints, else for the members recorded in --dir."""
    from flotilla.client import Client
    from flotilla.local import LocalCluster

    if args.endpoints:
        try:
            return Client(args.endpoints, timeout=args.timeout)
        except ValueError as exc:
            raise CommandError(f"--endpoints: {exc}") from None
    return Client(LocalCluster.load(_dir(args)).endpoints, timeout=args.timeout)


def cmd_status(args: argparse.Namespace) -> int:
    from flotilla.client import Client, FlotillaError
    from flotilla.local import LocalCluster

    cluster = None if args.endpoints else LocalCluster.load(_dir(args))
    with _client(args) as client:
        if args.json:
            try:
                doc = client.status()
            except FlotillaError as exc:
                raise CommandError(f"no leader answered: {exc}") from None
            print(json.dumps(doc, indent=2, sort_keys=True))
            return EXIT_OK
        rows: list[dict[str, Any]] = []
        if cluster is not None:
            members = [(m.name, m.client_url) for m in cluster.members]
        else:
            members = _members_from_endpoints(client)
        docs: dict[str, dict[str, Any] | None] = {}
        for name, url in members:
            try:
                with Client(url, timeout=min(1.0, args.timeout), retries=0) as one:
                    docs[name] = one.status(url)
            except (FlotillaError, ValueError):
                docs[name] = None
        for name, url in members:
            doc = docs[name]
            if cluster is not None:
                pid = cluster.member(name).pid
                alive = cluster.is_alive(name)
                process = f"{pid} alive" if alive else (f"{pid} dead" if pid else "stopped")
            else:
                process = "-"
            rows.append({
                "MEMBER": name,
                "ROLE": doc.get("role", "?") if doc else "no answer",
                "TERM": doc.get("term", "") if doc else "-",
                "COMMIT": doc.get("commit_index", "") if doc else "-",
                "APPLIED": doc.get("applied_index", "") if doc else "-",
                "CLIENT URL": url,
                "PID": process,
            })
    leaders = {d.get("leader") for d in docs.values() if d and d.get("leader")}
    answering = [d for d in docs.values() if d]
    cluster_id = answering[0].get("cluster_id") if answering else (
        cluster.state.cluster_id if cluster else "?")
    where = f" in {_dir(args)}" if cluster is not None else ""
    leader_text = ", ".join(sorted(leaders)) if leaders else "none known"
    print(f"cluster {cluster_id}{where}: {len(members)} members, leader {leader_text}")
    _print_table(rows)
    return EXIT_OK if leaders else EXIT_FAILED


def _members_from_endpoints(client) -> list[tuple[str, str]]:
    """(name, client URL) of every member, from the leader's status (or any member's)."""
    from flotilla.client import FlotillaError

    try:
        doc = client.status()
    except FlotillaError:
        doc = None
        for url in client.endpoints:
            try:
                doc = client.status(url)
                break
            except FlotillaError:
                continue
    if doc is None:
        raise CommandError(f"no member answered at {','.join(client.endpoints)}")
    return [(name, m.get("client_url") or "?") for name, m in sorted(doc["members"].items())]


def _print_table(rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in columns}
    print("  ".join(f"{c:<{widths[c]}}" for c in columns).rstrip())
    for r in rows:
        print("  ".join(f"{r[c]!s:<{widths[c]}}" for c in columns).rstrip())


# --- kv -------------------------------------------------------------------------------------


def _with_client(fn: Callable[[Any, argparse.Namespace], int]) -> Callable[..., int]:
    def run(args: argparse.Namespace) -> int:
        with _client(args) as client:
            return fn(client, args)
    run.__doc__ = fn.__doc__
    return run


@_with_client
def cmd_kv_put(client, args: argparse.Namespace) -> int:
    from flotilla.client import PreconditionFailed

    value = sys.stdin.buffer.read() if args.value == "-" else os.fsencode(args.value)
    try:
        result = client.put(args.key, value, prev_index=args.prev_index)
    except PreconditionFailed as exc:
        raise CommandError(f"precondition failed: {args.key!r} has mod index "
                           f"{exc.mod_index}, not {args.prev_index}") from None
    print(f"OK index {result.index}")
    return EXIT_OK


@_with_client
def cmd_kv_get(client, args: argparse.Namespace) -> int:
    result = client.get(args.key, "serializable" if args.serializable else "linearizable")
    if result.value is None:
        raise CommandError(f"key not found: {args.key!r}")
    sys.stdout.buffer.write(result.value)
    sys.stdout.buffer.flush()
    return EXIT_OK


@_with_client
def cmd_kv_del(client, args: argparse.Namespace) -> int:
    result = client.delete(args.key)
    print(1 if result.deleted else 0)
    return EXIT_OK


@_with_client
def cmd_kv_ls(client, args: argparse.Namespace) -> int:
    result = client.list(args.prefix, limit=args.limit)
    out = sys.stdout
    for key in result.keys:
        out.write(key + "\n")
    out.flush()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
