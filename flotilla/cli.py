"""The `flotilla` command: run a member, a local cluster, and talk to a cluster.

Exit codes: 0 on success; 1 when the command could not do its job (key not found, no leader,
nothing answering, a cluster already running...), with one line on stderr; 2 for bad usage
(a flag, argument or environment variable the command cannot take), also one line on stderr;
4 when `up --restore-from` asks for an index or time outside the archive (nothing started).
No input ends in a traceback: an error is a sentence saying what to do next.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from flotilla.cmdline import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    emit,
    non_negative,
    positive,
    print_table,
    seconds,
)

EXIT_OUTSIDE = 4


DESCRIPTION = "Flotilla: Raft replicated-state-machine clusters."
EPILOG = """\
`flotilla COMMAND --help` describes each command; docs/cli.md describes them all.

Finding the cluster: up, down and scale work on the local cluster in --dir; status, kv,
member, leader and snapshot take --dir or --endpoints URL,URL. Without either flag they use
FLOTILLA_ENDPOINTS, else FLOTILLA_DIR, else ./.flotilla. Admin calls send --token (else
FLOTILLA_TOKEN, else DIR/admin-token when that file exists). https:// members are verified
against --cacert (else FLOTILLA_CACERT, else DIR/tls/ca.crt for a cluster of `up --tls`, else
the system's CAs); --cert and --key (FLOTILLA_CERT, FLOTILLA_KEY) are the client certificate
for members run with --client-cert-auth. A flag always beats the environment.

Output: status, kv ls and member list take -o json|yaml|table (status --json = -o json).
Shell completion: source <(flotilla completion bash), or zsh.

Exit codes: 0 success; 1 the command failed (one line on stderr); 2 bad usage (one line on
stderr); 4 a restore target outside the archive (up --restore-index/--restore-time).
"""


class CommandError(Exception):
    """A failure worth one line on stderr and exit code 1."""


class UsageError(Exception):
    """Input the command cannot take, found after parsing (the environment, flags that only
    conflict together): one line on stderr and exit code 2, like argparse's own errors."""


# --- argument types -------------------------------------------------------------------------


#: `flotilla up` names members n1..n99; with --base-port, clients listen at BASE+10+i.
MAX_REPLICAS, MAX_REPLICAS_FIXED_PORTS = 99, 10


def _replicas(text: str) -> int:
    value = positive(text)
    if value > MAX_REPLICAS:
        raise argparse.ArgumentTypeError(f"at most {MAX_REPLICAS} members, not {value}")
    return value


def _base_port(text: str) -> int:
    value = positive(text)
    top = 65535 - 10 - (MAX_REPLICAS_FIXED_PORTS - 1)
    if value > top:
        raise argparse.ArgumentTypeError(f"expected a port up to {top} (clients listen up to "
                                         f"BASE+19), not {value}")
    return value


def _time(text: str) -> int:
    """An RFC 3339 time with an offset, as ms since the epoch (the node's own parser)."""
    from flotilla.node.archive import parse_time

    try:
        return parse_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _key(text: str) -> str:
    if not text:
        raise argparse.ArgumentTypeError("a key is not empty")
    try:
        text.encode()
    except UnicodeEncodeError:
        raise argparse.ArgumentTypeError(f"a key is UTF-8 text, and {text!r} is not (bytes "
                                         "your locale cannot decode)") from None
    return text


def _word(what: str) -> Callable[[str], str]:
    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{what} is not empty")
        return text
    check.__name__ = what  # argparse names the type in "invalid <name> value" messages
    return check


def _member_url(text: str) -> str:
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname \
            or port is None:
        raise argparse.ArgumentTypeError(f"expected a URL like http://127.0.0.1:2380, not "
                                         f"{text!r}")
    return text


# --- the parser -----------------------------------------------------------------------------


def _add_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=None,
                   help="the local cluster's directory (default: FLOTILLA_DIR, else "
                        "./.flotilla); a regular file, or a path under one, is bad usage "
                        "(exit 2)")


def _add_find(p: argparse.ArgumentParser, timeout: float = 5.0) -> None:
    """--dir or --endpoints, --timeout and --token: how a client command finds and calls the
    cluster."""
    _add_dir(p)
    p.add_argument("--endpoints", default=None, metavar="URL,URL",
                   help="client URLs of the cluster, comma-separated, instead of --dir "
                        "(default: FLOTILLA_ENDPOINTS)")
    p.add_argument("--token", type=_word("token"), default=None,
                   help="the admin token sent as a bearer token (default: FLOTILLA_TOKEN, "
                        "else DIR/admin-token when it exists)")
    p.add_argument("--timeout", type=seconds, default=timeout,
                   help=f"seconds a request may take, retries included (default {timeout:g})")
    p.add_argument("--cacert", dest="cacert_file", default=None, metavar="FILE",
                   help="verify https:// members against this CA (PEM) (default: "
                        "FLOTILLA_CACERT, else DIR/tls/ca.crt for a cluster of `up --tls`, "
                        "else the system's CAs)")
    p.add_argument("--cert", dest="cert_file", default=None, metavar="FILE",
                   help="client certificate (PEM) for members run with --client-cert-auth "
                        "(default: FLOTILLA_CERT)")
    p.add_argument("--key", dest="key_file", default=None, metavar="FILE",
                   help="the private key (PEM) of --cert (default: FLOTILLA_KEY)")


def _add_output(p: argparse.ArgumentParser, choices: Sequence[str], default: str) -> None:
    p.add_argument("-o", "--output", choices=choices, default=default,
                   help=f"output format: {', '.join(choices)} (default {default})")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="flotilla", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"flotilla {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    commands.add_parser("node", add_help=False,
                        help="run one cluster member (flotilla node --help)")

    p = commands.add_parser(
        "up",
        help="start a local cluster of N member processes (or resume a stopped one)",
        description="Start N `flotilla node` processes on 127.0.0.1 with free ports, each with "
                    "its own data dir and log under --dir, and return once a leader serves a "
                    "linearizable read. If --dir holds a stopped cluster, its members are "
                    "restarted with the flags they first ran with.")
    _add_dir(p)
    p.add_argument("--replicas", type=_replicas, default=3,
                   help=f"members, 1 to {MAX_REPLICAS} ({MAX_REPLICAS_FIXED_PORTS} with "
                        "--base-port; default 3)")
    p.add_argument("--archive", default=None,
                   help="where snapshots and log segments are shipped: s3://bucket/prefix or "
                        "file:///path (default file://DIR/archive)")
    p.add_argument("--restore-from", default=None,
                   help="a new cluster starts from this archive (the --archive URL an old "
                        "cluster used): its newest state, --restore-index N or "
                        "--restore-time T")
    p.add_argument("--restore-cluster-id", default=None, metavar="ID",
                   help="with --restore-from: which cluster of that archive (default: the "
                        "only one there), e.g. one `flotilla pipeline snapshot-at` published")
    point = p.add_mutually_exclusive_group()
    point.add_argument("--restore-index", type=positive, default=None,
                       help="with --restore-from: exactly the state at this log index")
    point.add_argument("--restore-time", type=_time, default=None, metavar="T",
                       help="with --restore-from: the state after the last entry stamped at "
                            "or before T, an RFC 3339 time such as 2026-11-25T17:00:00.250Z "
                            "(exit 4, naming the restorable times, when the archive has none)")
    p.add_argument("--archive-signing-key-file", default=None, metavar="FILE[,FILE...]",
                   help="members sign archive manifests with the key in the first file and "
                        "verify with any (default: $FLOTILLA_ARCHIVE_SIGNING_KEY_FILE)")
    p.add_argument("--state-machine", default=None, metavar="MODULE:CLASS",
                   help="the members' replicated state machine (default: the built-in "
                        "key-value machine); the module must be importable, e.g. "
                        "flotilla.examples.counter:Counter")
    p.add_argument("--election-timeout-ms", type=positive, default=1000,
                   help="members' election timeout (default 1000)")
    p.add_argument("--heartbeat-ms", type=positive, default=100,
                   help="members' heartbeat interval (default 100)")
    p.add_argument("--base-port", type=_base_port, default=None,
                   help="fixed ports: peers at BASE+i, clients at BASE+10+i (default: free "
                        "ports)")
    p.add_argument("--tls", action="store_true",
                   help="TLS on both ports: a CA and one certificate per member under "
                        "DIR/tls/, https:// URLs, mutual TLS between members (a new cluster "
                        "only)")
    p.add_argument("--timeout", type=seconds, default=60.0,
                   help="seconds to wait for a leader to serve (default 60)")
    p.set_defaults(run=cmd_up)

    p = commands.add_parser(
        "status",
        help="show the members of a cluster (-o json: the leader's /v1/status)",
        description="A table of the members: role, term, commit and applied index, client URL "
                    "and, for a local cluster, whether its pid is alive. The leader named is a "
                    "member that answered and says it leads. Exits 1 when no leader is known.")
    _add_find(p)
    _add_output(p, ("table", "json", "yaml"), "table")
    p.add_argument("--json", dest="output", action="store_const", const="json",
                   help="the same as -o json: the leader's /v1/status document")
    p.set_defaults(run=cmd_status)

    p = commands.add_parser(
        "down",
        help="stop a local cluster (SIGTERM, then SIGKILL); data is kept",
        description="SIGTERM every member (a leader hands leadership over first), SIGKILL "
                    "those still running after --timeout. Data dirs and logs are kept: "
                    "`flotilla up` resumes the cluster.")
    _add_dir(p)
    p.add_argument("--timeout", type=seconds, default=15.0,
                   help="seconds to wait after SIGTERM before SIGKILL (default 15)")
    p.set_defaults(run=cmd_down)

    p = commands.add_parser(
        "scale",
        help="change a local cluster to exactly N voters (joint consensus, one step at a time)",
        description="Through the operator's planner: new members start empty and join as "
                    "learners, catch up, and become voters in one joint-consensus change; "
                    "leaving members hand leadership over first, leave in one joint change, "
                    "then stop. Returns once the configuration is exactly N voters, not "
                    "joint.")
    _add_dir(p)
    p.add_argument("replicas", type=_replicas, metavar="N", help="voters wanted")
    p.add_argument("--timeout", type=seconds, default=300.0,
                   help="seconds to wait for the change to finish (default 300)")
    p.add_argument("--catch-up-timeout", type=seconds, default=600.0,
                   help="a learner still behind after this many seconds is removed and added "
                        "again, never promoted (default 600)")
    p.add_argument("--keep-removed-data", action="store_true",
                   help="keep the data dirs of removed members (they never rejoin on it: a "
                        "slot that comes back is wiped first)")
    p.set_defaults(run=cmd_scale)

    commands.add_parser("operator", add_help=False,
                        help="run the Kubernetes operator (flotilla operator --help)")
    commands.add_parser("pipeline", add_help=False,
                        help="Spark jobs over a cluster's archive (flotilla pipeline --help)")

    kv = commands.add_parser("kv", help="the command-line client: kv put|get|del|ls",
                             description="The command-line client of the key-value API.")
    ops = kv.add_subparsers(dest="op", metavar="OP", required=True)
    p = ops.add_parser("put", help="write KEY = VALUE",
                       description="Write VALUE (or, with `-`, the bytes of stdin) under KEY "
                                   "and print the write's index.")
    p.add_argument("key", type=_key)
    p.add_argument("value", help="the value, or - to read it from stdin")
    p.add_argument("--prev-index", type=non_negative, default=None,
                   help="compare-and-set: only if the key's mod index is this (0: must not "
                        "exist); exit 1 otherwise")
    _add_find(p)
    p.set_defaults(run=cmd_kv_put)
    p = ops.add_parser("get", help="print KEY's value",
                       description="Write KEY's value, as raw bytes, to stdout. Exit 1 with "
                                   "'key not found' when it does not exist.")
    p.add_argument("key", type=_key)
    p.add_argument("--serializable", action="store_true",
                   help="answer from the member's local state (may be stale; works without a "
                        "leader)")
    _add_find(p)
    p.set_defaults(run=cmd_kv_get)
    p = ops.add_parser("del", help="delete KEY",
                       description="Delete KEY; prints 1 if it existed, 0 if it did not.")
    p.add_argument("key", type=_key)
    _add_find(p)
    p.set_defaults(run=cmd_kv_del)
    p = ops.add_parser("ls", help="list keys",
                       description="Print the keys starting with PREFIX, one per line, "
                                   "ascending (-o json|yaml: with the index they reflect).")
    p.add_argument("prefix", nargs="?", default="")
    p.add_argument("--limit", type=positive, default=None, help="at most this many keys")
    _add_find(p)
    _add_output(p, ("plain", "json", "yaml", "table"), "plain")
    p.set_defaults(run=cmd_kv_ls)

    member = commands.add_parser(
        "member", help="list, add and remove members (admin API)",
        description="The cluster's membership through the admin API (POST /v1/members, "
                    "DELETE /v1/members/NAME), as the leader sees it.")
    ops = member.add_subparsers(dest="op", metavar="OP", required=True)
    p = ops.add_parser("list", help="one row per member: role, URLs, match index",
                       description="Every member as the leader sees it: name, role "
                                   "(leader, follower, learner), peer and client URL, and "
                                   "the index up to which the leader knows its log matches.")
    _add_find(p)
    _add_output(p, ("table", "json", "yaml"), "table")
    p.set_defaults(run=cmd_member_list)
    p = ops.add_parser("add", help="add NAME as a learner",
                       description="Add NAME as a learner (it receives the log but does not "
                                   "vote); returns once that configuration is committed. "
                                   "Start NAME with --initial-cluster-state existing.")
    p.add_argument("name", type=_word("name"), metavar="NAME")
    p.add_argument("--peer-url", type=_member_url, required=True,
                   help="the URL other members dial for Raft traffic")
    p.add_argument("--client-url", type=_member_url, required=True,
                   help="the URL clients and forwarding members use")
    _add_find(p, timeout=30.0)
    p.set_defaults(run=cmd_member_add)
    p = ops.add_parser("remove", help="remove NAME (a learner, or a voter by joint consensus)",
                       description="Remove a learner, or a voter through joint consensus; "
                                   "returns once the new configuration is committed.")
    p.add_argument("name", type=_word("name"), metavar="NAME")
    _add_find(p, timeout=30.0)
    p.set_defaults(run=cmd_member_remove)

    leader = commands.add_parser("leader", help="move leadership (admin API)",
                                 description="Leadership through the admin API "
                                             "(POST /v1/leader).")
    ops = leader.add_subparsers(dest="op", metavar="OP", required=True)
    p = ops.add_parser("move", help="hand leadership to voter NAME",
                       description="Hand leadership to voter NAME; returns once it leads.")
    p.add_argument("name", type=_word("name"), metavar="NAME")
    _add_find(p, timeout=30.0)
    p.set_defaults(run=cmd_leader_move)

    p = commands.add_parser(
        "snapshot", help="snapshot the leader's state now (admin API)",
        description="The leader writes a snapshot now and ships it to its archive, if it has "
                    "one; prints its index, term, size and location.")
    _add_find(p, timeout=60.0)
    _add_output(p, ("plain", "json", "yaml"), "plain")
    p.set_defaults(run=cmd_snapshot)

    p = commands.add_parser(
        "completion", help="print a shell completion script: bash or zsh",
        description="Print a completion script for SHELL. bash: `source <(flotilla "
                    "completion bash)` (in ~/.bashrc to keep it). zsh: `source <(flotilla "
                    "completion zsh)`, or save it as _flotilla in a directory of $fpath.")
    p.add_argument("shell", choices=("bash", "zsh"), metavar="SHELL", help="bash or zsh")
    p.set_defaults(run=cmd_completion)
    return parser


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("flotilla")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        from flotilla import __version__

        return __version__


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "node":
        from flotilla.node.main import main as node_main

        return node_main(argv[1:])
    if argv and argv[0] == "operator":
        from flotilla.operator.main import main as operator_main

        return operator_main(argv[1:])
    if argv and argv[0] == "pipeline":
        from flotilla.pipeline.main import main as pipeline_main

        return pipeline_main(argv[1:])
    parser = build_parser()
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help, --version (0) or a usage error (2)
        return int(exc.code or 0)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from flotilla.client import FlotillaError
    from flotilla.local import BadOption, LocalClusterError, OutsideArchive

    try:
        _locate(args, os.environ)
        return args.run(args)
    except UsageError as exc:
        _fail(args, f"{exc} (see `{_prog(args)} --help`)")
        return EXIT_USAGE
    except BadOption as exc:  # an option local.py cannot start a cluster with
        _fail(args, str(exc))
        return EXIT_USAGE
    except OutsideArchive as exc:  # a restore target the archive cannot give
        _fail(args, str(exc))
        return EXIT_OUTSIDE
    except (CommandError, FlotillaError, LocalClusterError) as exc:
        _fail(args, _explain(args, exc))
        return EXIT_FAILED
    except json.JSONDecodeError as exc:
        # Something answers at the endpoint, but not with a member's JSON.
        _fail(args, f"the answer is not JSON ({exc}): is this a flotilla member's client URL?")
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`flotilla kv ls | head`): not an error worth a traceback.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED
    except OSError as exc:
        # The file system said no (a --dir we may not write, a full disk): its sentence is
        # the whole story, with the path.
        where = f": {exc.filename}" if exc.filename else ""
        _fail(args, f"{exc.strerror or exc}{where}")
        return EXIT_FAILED


def _prog(args: argparse.Namespace) -> str:
    return " ".join(x for x in ("flotilla", args.command, getattr(args, "op", None)) if x)


def _fail(args: argparse.Namespace, message: str) -> None:
    print(f"{_prog(args)}: {message}", file=sys.stderr)


def _explain(args: argparse.Namespace, exc: Exception) -> str:
    """The error's sentence, and what to do about it when that is ours to know."""
    from flotilla.client import TLSFailure, Unauthorized, Unreachable

    text = str(exc)
    if isinstance(exc, Unreachable) and not getattr(args, "endpoints", None):
        text += f"; is the cluster stopped? `flotilla up --dir {args.dir}` starts it again"
    elif isinstance(exc, Unauthorized):
        text += "; give the admin token with --token or FLOTILLA_TOKEN"
    elif isinstance(exc, TLSFailure):
        text += _TLS_ADVICE.get(exc.code, "")
    return text


#: What a TLS failure asks of the command's user, after the client's own sentence.
_TLS_ADVICE = {
    "untrusted_certificate": " with --cacert FILE (or FLOTILLA_CACERT); a cluster of "
                             "`flotilla up --tls` keeps it in DIR/tls/ca.crt",
    "client_certificate": "; give one with --cert FILE --key FILE (or FLOTILLA_CERT and "
                          "FLOTILLA_KEY)",
    "not_tls": " in --endpoints",
    "tls_required": " in --endpoints, and its CA with --cacert FILE (or FLOTILLA_CACERT)",
}


def _locate(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """Settle --dir, --endpoints and --token from the flags, else the environment (a flag
    beats env; FLOTILLA_ENDPOINTS beats FLOTILLA_DIR), and check them, so that commands only
    ever see usable values."""
    if not hasattr(args, "dir"):
        return
    finds = hasattr(args, "endpoints")  # the commands that may talk to any cluster
    if finds:
        if args.dir is not None and args.endpoints is not None:
            raise UsageError("give --dir or --endpoints, not both")
        if args.endpoints is not None:
            _check_endpoints(args.endpoints, "--endpoints")
        elif args.dir is None and env.get("FLOTILLA_ENDPOINTS"):
            args.endpoints = env["FLOTILLA_ENDPOINTS"]
            _check_endpoints(args.endpoints, "FLOTILLA_ENDPOINTS")
        if args.token is None and env.get("FLOTILLA_TOKEN"):
            args.token = env["FLOTILLA_TOKEN"]
        _locate_tls(args, env)
        if args.endpoints is not None:
            return
    if args.dir is not None:
        _check_dir(args.dir, "--dir")
    elif env.get("FLOTILLA_DIR"):
        args.dir = env["FLOTILLA_DIR"]
        _check_dir(args.dir, "FLOTILLA_DIR")
    else:
        from flotilla.local import DEFAULT_DIR

        args.dir = DEFAULT_DIR


#: The TLS files a client command takes: flag -> (attribute of args, environment variable).
_TLS_FILES = {"--cacert": ("cacert_file", "FLOTILLA_CACERT"),
              "--cert": ("cert_file", "FLOTILLA_CERT"), "--key": ("key_file", "FLOTILLA_KEY")}


def _locate_tls(args: argparse.Namespace, env: Mapping[str, str]) -> None:
    """--cacert, --cert and --key, else FLOTILLA_CACERT, FLOTILLA_CERT and FLOTILLA_KEY: each
    a readable file (their content is checked when the client is made)."""
    for source, (attr, variable) in _TLS_FILES.items():
        if getattr(args, attr) is None and env.get(variable):
            setattr(args, attr, env[variable])
            source = variable
        path = getattr(args, attr)
        if path is None:
            continue
        if not path:
            raise UsageError(f"{source} is empty: give a PEM file")
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise UsageError(f"{source}: cannot read {path}: "
                             f"{exc.strerror or exc}") from None
    if args.key_file is not None and args.cert_file is None:
        raise UsageError("--key (FLOTILLA_KEY) goes with --cert (FLOTILLA_CERT): the client "
                         "certificate it belongs to")


def _check_dir(text: str, source: str) -> None:
    if not text:
        raise UsageError(f"{source} is empty: give a directory")
    path = Path(text)
    for at in (path, *path.parents):
        try:
            if not at.exists() or at.is_dir():
                continue
        except OSError:
            return  # not ours to judge (permissions): the command says what failed
        what = "it is" if at == path else f"{at} is"
        raise UsageError(f"{source}: cannot use {text} as the cluster directory: {what} a "
                         "file, not a directory")


def _check_endpoints(text: str, source: str) -> None:
    from flotilla.client import normalize_endpoint

    urls = [e for e in text.split(",") if e.strip()]
    if not urls:
        raise UsageError(f"{source} is empty: give client URLs like http://127.0.0.1:2379")
    for url in urls:
        try:
            normalize_endpoint(url)
        except ValueError as exc:
            raise UsageError(f"{source}: {exc}") from None


# --- local clusters -------------------------------------------------------------------------


def _dir(args: argparse.Namespace) -> Path:
    from flotilla.local import DEFAULT_DIR

    return Path(args.dir or DEFAULT_DIR)


def _say(text: str) -> None:
    print(text, flush=True)


def cmd_up(args: argparse.Namespace) -> int:
    from flotilla import local

    if args.base_port is not None and args.replicas > MAX_REPLICAS_FIXED_PORTS:
        raise UsageError(f"--replicas is at most {MAX_REPLICAS_FIXED_PORTS} with --base-port "
                         f"(clients listen at BASE+10+i), not {args.replicas}")
    root = _dir(args)
    resuming = local.LocalCluster.exists(root)
    cluster, leader = local.up(
        root, args.replicas, election_timeout_ms=args.election_timeout_ms,
        heartbeat_ms=args.heartbeat_ms, archive=args.archive, base_port=args.base_port,
        timeout=args.timeout, say=_say, restore_from=args.restore_from,
        restore_index=args.restore_index, restore_time=args.restore_time,
        restore_cluster_id=args.restore_cluster_id, tls=args.tls,
        signing_key_file=args.archive_signing_key_file, state_machine=args.state_machine)
    state = cluster.state
    verb = "resumed" if resuming else "started"
    _say(f"{verb} {len(cluster.members)} members in {root} (cluster id {state.cluster_id})")
    width = max(len(n) for n in cluster.names)
    for m in cluster.members:
        _say(f"  {m.name:<{width}}  {m.client_url}  pid {m.pid}  log {_rel(m.log_file)}")
    for note in state.notes:
        _say(f"note: {note}")
    if cluster.restored is not None:
        _say(f"restored: {cluster.restored.describe()}")
    _say(f"leader: {leader}")
    _say(f"endpoints: {','.join(cluster.endpoints)}")
    if cluster.ca_file is not None:
        _say(f"ca: {_rel(cluster.ca_file)} (TLS: other clients verify the members with it, "
             f"e.g. --cacert or curl --cacert)")
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
    lead = result.leader_status
    voters = sorted(lead.config.voters) if lead is not None else []
    _say(f"voters: {', '.join(voters)} (leader {result.leader})")
    return EXIT_OK


def _rel(path: str) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return path


# --- finding and calling a cluster ----------------------------------------------------------


def _token(args: argparse.Namespace) -> str | None:
    """--token or FLOTILLA_TOKEN (settled by `_locate`), else the token `flotilla up` keeps
    in the local cluster's directory."""
    from flotilla.local import TOKEN_FILE, read_token

    if args.token is not None or args.endpoints is not None:
        return args.token
    try:
        return read_token(_dir(args))
    except OSError as exc:
        path = _dir(args) / TOKEN_FILE
        raise CommandError(f"cannot read the admin token in {path}: {exc.strerror}") from None


def _ssl_context(args: argparse.Namespace, cluster=None):
    """The TLS context for https:// members: --cacert (else the CA of a local cluster of
    `up --tls`, else the system's CAs) and --cert/--key; None when nothing asks for TLS."""
    from flotilla.node.tls import TLSError, client_context

    ca = args.cacert_file
    if ca is None and cluster is not None:
        ca = cluster.ca_file
    if ca is None and args.cert_file is None:
        return None
    try:
        return client_context(ca, args.cert_file, args.key_file)
    except TLSError as exc:
        raise CommandError(f"cannot use TLS: {exc}") from None


def _client_options(args: argparse.Namespace, cluster=None) -> dict[str, Any]:
    return {"token": _token(args), "ssl_context": _ssl_context(args, cluster)}


def _client(args: argparse.Namespace):
    """A client for --endpoints, else for the members recorded in --dir. A user waits on it:
    when nothing listens at any endpoint it says so at once, rather than after --timeout."""
    from flotilla.client import Client
    from flotilla.local import LocalCluster

    cluster = None if args.endpoints else LocalCluster.load(_dir(args))
    endpoints = args.endpoints or cluster.endpoints
    return Client(endpoints, timeout=args.timeout, stop_when_refused=True,
                  **_client_options(args, cluster))


def _with_client(fn: Callable[[Any, argparse.Namespace], int]) -> Callable[..., int]:
    def run(args: argparse.Namespace) -> int:
        with _client(args) as client:
            return fn(client, args)
    run.__doc__ = fn.__doc__
    return run


# --- status ---------------------------------------------------------------------------------


def known_leader(docs: Mapping[str, Mapping[str, Any] | None]) -> str | None:
    """The leader `flotilla status` names, from each member's own /v1/status (None: no answer).

    Only a member that answered and says it leads: the others' `leader` field may name a
    leader that has just died (they learn of it only when their election timer fires). Of
    several that say so (an old leader cut off from the rest still believes it leads), the one
    in the highest term.
    """
    claims = [(int(doc.get("term") or 0), name) for name, doc in docs.items()
              if doc is not None and doc.get("role") == "leader"]
    return max(claims)[1] if claims else None


def cmd_status(args: argparse.Namespace) -> int:
    from flotilla.client import Client, FlotillaError, Unreachable
    from flotilla.local import LocalCluster

    cluster = None if args.endpoints else LocalCluster.load(_dir(args))
    options = _client_options(args, cluster)
    with _client(args) as client:
        if args.output != "table":
            try:
                doc = client.status()
            except Unreachable:
                raise
            except FlotillaError as exc:
                raise CommandError(f"no leader answered: {exc}") from None
            emit(doc, args.output)
            return EXIT_OK
        if cluster is not None:
            members = [(m.name, m.client_url) for m in cluster.members]
        else:
            members = _members_from_endpoints(client)
    docs: dict[str, dict[str, Any] | None] = {}
    for name, url in members:
        try:
            with Client(url, timeout=min(1.0, args.timeout), retries=0, **options) as one:
                docs[name] = one.status(url)
        except (FlotillaError, ValueError):
            docs[name] = None
    rows: list[dict[str, Any]] = []
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
    leader = known_leader(docs)
    answering = [d for d in docs.values() if d]
    cluster_id = answering[0].get("cluster_id") if answering else (
        cluster.state.cluster_id if cluster else "?")
    where = f" in {_dir(args)}" if cluster is not None else ""
    print(f"cluster {cluster_id}{where}: {len(members)} members, leader "
          f"{leader or 'none known'}")
    print_table(rows)
    return EXIT_OK if leader else EXIT_FAILED


def _members_from_endpoints(client) -> list[tuple[str, str]]:
    """(name, client URL) of every member, from the leader's status (or any member's)."""
    from flotilla.client import FlotillaError, Unreachable

    try:
        doc = client.status()
    except Unreachable:
        raise
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


# --- kv -------------------------------------------------------------------------------------


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
    if args.output in ("json", "yaml"):
        emit({"index": result.index, "keys": result.keys}, args.output)
    elif args.output == "table":
        print_table([{"KEY": key} for key in result.keys])
    else:
        out = sys.stdout
        for key in result.keys:
            out.write(key + "\n")
        out.flush()
    return EXIT_OK


# --- admin ----------------------------------------------------------------------------------


@_with_client
def cmd_member_list(client, args: argparse.Namespace) -> int:
    doc = client.status()
    # A member's client URL is in the configuration once it has led (or was added with one);
    # before that, a local cluster's state file knows it.
    known = {}
    if not args.endpoints:
        from flotilla.local import LocalCluster

        known = {m.name: m.client_url for m in LocalCluster.load(_dir(args)).members}
    members = [{"name": name, "role": m.get("role"), "peer_url": m.get("peer_url"),
                "client_url": m.get("client_url") or known.get(name),
                "match_index": m.get("match_index")}
               for name, m in sorted((doc.get("members") or {}).items())]
    if args.output != "table":
        emit({"leader": doc.get("leader"), "term": doc.get("term"), "members": members},
             args.output)
        return EXIT_OK
    print_table([{"NAME": m["name"], "ROLE": m["role"] or "?",
                  "PEER URL": m["peer_url"] or "-", "CLIENT URL": m["client_url"] or "-",
                  "MATCH INDEX": "-" if m["match_index"] is None else m["match_index"]}
                 for m in members])
    return EXIT_OK


@_with_client
def cmd_member_add(client, args: argparse.Namespace) -> int:
    client.add_member(args.name, args.peer_url, args.client_url)
    print(f"added {args.name} as a learner (peer {args.peer_url}, client {args.client_url})")
    return EXIT_OK


@_with_client
def cmd_member_remove(client, args: argparse.Namespace) -> int:
    client.remove_member(args.name)
    print(f"removed {args.name}")
    return EXIT_OK


@_with_client
def cmd_leader_move(client, args: argparse.Namespace) -> int:
    result = client.transfer_leader(args.name)
    term = result.get("term")
    print(f"leader: {result.get('leader') or args.name}" + (f" (term {term})" if term else ""))
    return EXIT_OK


@_with_client
def cmd_snapshot(client, args: argparse.Namespace) -> int:
    doc = client.snapshot()
    if args.output != "plain":
        emit(doc, args.output)
        return EXIT_OK
    for field in ("index", "term", "bytes", "location"):
        print(f"{field}: {doc.get(field) if doc.get(field) is not None else '-'}")
    return EXIT_OK


# --- completion -----------------------------------------------------------------------------


def cmd_completion(args: argparse.Namespace) -> int:
    from flotilla import completion

    sys.stdout.write(completion.script(args.shell, build_parser()))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
