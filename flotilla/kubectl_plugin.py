"""`kubectl flotilla`: RaftClusters from kubectl, in the manner of `kubectl cnpg`.

Installed with the package as the console script `kubectl-flotilla`, which kubectl finds on
PATH and runs for `kubectl flotilla ARGS`. It talks to the API server the way kubectl does
(`--kubeconfig`, else KUBECONFIG, else ~/.kube/config, else the pod's service account;
`--context`; `-n/--namespace`, else the context's namespace, else `default`), and never to a
member's pod IP from outside the cluster:

- `status NAME`: the RaftCluster's status (members, roles, leader, lag, archive, conditions,
  the last requests), and each member's own `/v1/status` where the members can be reached from
  where the plugin runs (inside the cluster's network); unreachable members are said to be.
- `snapshot NAME` and `move-leader NAME MEMBER`: requests written as annotations on the
  RaftCluster, which the operator (the one that reaches the members, with their token and CA)
  carries out and answers in `status.requests` (`operator/requests.py`); the plugin watches
  for that answer.
- `restore NAME --as NEW [--to-time T | --to-index N]`: the RaftCluster NEW that restores
  NAME's archive (`spec.bootstrap.restore`), created, or printed with `--dry-run`.

Exit codes: 0 done; 1 the command failed (a missing cluster, an unknown member, a request the
operator refused or did not answer in time), one line on stderr; 2 bad usage, one line.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from flotilla.cmdline import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Parser, emit, print_table, seconds

PROG = "kubectl flotilla"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
FIELD_MANAGER = "kubectl-flotilla"  # who wrote what the plugin creates
LIVE_TIMEOUT = 2.0  # seconds a member may take to describe itself before it counts as unreachable

EPILOG = """\
Requests (snapshot, move-leader) are annotations on the RaftCluster that the operator carries
out; `kubectl flotilla status NAME` shows the last of each. docs/kubectl-plugin.md describes
every command.

Exit codes: 0 done; 1 the command failed (one line on stderr); 2 bad usage (one line).
"""


class PluginError(Exception):
    """A failure worth one line on stderr and exit code 1."""


class UsageError(Exception):
    """Input the command cannot take: one line on stderr and exit code 2."""


# --- arguments ---------------------------------------------------------------------------------


def _index(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a log index, a whole number >= 1, not "
                                         f"{text!r}")
    return int(text)


def _time_point(text: str) -> str:
    try:
        return restore_time(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _connection_flags(suppress: bool) -> argparse.ArgumentParser:
    """kubectl's flags for finding the cluster. Taken before and after the command; after it
    they only count when given (SUPPRESS), so they never undo one given before it."""
    none = argparse.SUPPRESS if suppress else None
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--kubeconfig", default=none, metavar="FILE",
                   help="the kubeconfig to use (default: KUBECONFIG, else ~/.kube/config, "
                        "else the pod's service account)")
    p.add_argument("--context", default=none, help="the kubeconfig context to use")
    p.add_argument("-n", "--namespace", default=none,
                   help="the RaftCluster's namespace (default: the context's, else default)")
    return p


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, parents=[_connection_flags(False)],
                    description="Flotilla RaftClusters from kubectl: status, snapshots, "
                                "leadership, restores.",
                    epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    flags = [_connection_flags(True)]

    p = commands.add_parser(
        "status", parents=flags, help="members, roles, leader, lag, archive and conditions",
        description="The RaftCluster's status as the operator wrote it, and each member's own "
                    "/v1/status where members can be reached from here (inside the cluster's "
                    "network; with TLS, trusting the cluster's CA from its Secret when you may "
                    "read it). Exit 1 when the RaftCluster does not exist.")
    p.add_argument("name", metavar="NAME")
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table",
                   help="output format (default table)")
    p.set_defaults(run=cmd_status)

    p = commands.add_parser(
        "snapshot", parents=flags, help="snapshot the cluster now (the leader writes one and "
                                        "ships it to the archive)",
        description="Ask the operator for a snapshot now (the annotation "
                    "flotilla.dev/snapshot-requested-at) and wait for its answer: the leader "
                    "writes a snapshot and ships it to the archive, if there is one.")
    p.add_argument("name", metavar="NAME")
    _add_wait(p)
    p.add_argument("-o", "--output", choices=("plain", "json", "yaml"), default="plain",
                   help="output format (default plain)")
    p.set_defaults(run=cmd_snapshot)

    p = commands.add_parser(
        "move-leader", parents=flags, help="hand leadership to voter MEMBER",
        description="Ask the operator to hand leadership to voter MEMBER (the annotations "
                    "flotilla.dev/move-leader-to and flotilla.dev/move-leader-requested-at) "
                    "and wait until it leads.")
    p.add_argument("name", metavar="NAME")
    p.add_argument("member", metavar="MEMBER",
                   help="the voter to lead: its pod name (NAME-1) or its ordinal (1)")
    _add_wait(p)
    p.set_defaults(run=cmd_move_leader)

    p = commands.add_parser(
        "restore", parents=flags, help="a new RaftCluster restored from NAME's archive",
        description="Create the RaftCluster NEW, in NAME's namespace, whose members start from "
                    "NAME's archive (spec.bootstrap.restore): the state after the last entry "
                    "stamped at or before --to-time, exactly the state at --to-index, or "
                    "without either the newest archived snapshot. NEW takes NAME's spec "
                    "otherwise (replicas, image, storage, archive settings and credentials, "
                    "TLS), except a scheduled export, whose destination would be shared; it "
                    "archives under its own cluster id. NAME is only read.")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--as", dest="new", required=True, metavar="NEW",
                   help="the name of the new RaftCluster")
    point = p.add_mutually_exclusive_group()
    point.add_argument("--to-time", type=_time_point, metavar="T",
                       help="RFC 3339 with an offset, e.g. 2026-11-25T17:00:00.250Z (a "
                            "point-in-time restore, through the pipeline's Job first)")
    point.add_argument("--to-index", type=_index, metavar="N",
                       help="exactly the state at log index N")
    p.add_argument("--archive-url", metavar="URL",
                   help="where NEW archives (default: NAME's archive URL; NEW writes under "
                        "its own cluster id, beside NAME's)")
    p.add_argument("--dry-run", nargs="?", const="client", choices=("client",),
                   help="print the RaftCluster instead of creating it (like kubectl's "
                        "--dry-run=client)")
    p.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml",
                   help="the format --dry-run prints (default yaml)")
    p.set_defaults(run=cmd_restore)
    return parser


def _add_wait(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=seconds, default=60.0,
                   help="seconds to wait for the operator's answer (default 60)")
    p.add_argument("--no-wait", dest="wait", action="store_false",
                   help="write the request and return; `status` shows the answer")


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("flotilla")
    except metadata.PackageNotFoundError:
        from flotilla import __version__

        return __version__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    prog = f"{PROG} {args.command}"
    import urllib3

    from flotilla.operator.kube import ApiError

    try:
        target = connect(args.kubeconfig, args.context, args.namespace)
        return args.run(args, target)
    except UsageError as exc:
        print(f"{prog}: {exc} (see `{prog} --help`)", file=sys.stderr)
        return EXIT_USAGE
    except PluginError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except ApiError as exc:
        print(f"{prog}: the Kubernetes API refused: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except urllib3.exceptions.HTTPError as exc:
        print(f"{prog}: cannot reach the Kubernetes API server: {_reason(exc)}",
              file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_FAILED


def _reason(exc: BaseException) -> str:
    """urllib3's error in one line: the innermost reason, with where it was going."""
    reason = getattr(exc, "reason", None) or exc
    text = " ".join(str(reason).split())
    found = re.search(r"(\[Errno [^\]]+\][^')\"]*)", text)
    where = getattr(getattr(exc, "pool", None), "host", None)
    short = found.group(1).strip() if found else text[:200]
    return f"{short} (host {where})" if where else short


# --- the cluster --------------------------------------------------------------------------------


@dataclass
class Target:
    """Where the plugin works: the API (operator/kube.py's calls) and the namespace."""

    kube: Any  # flotilla.operator.kube.Kube
    namespace: str
    server: str


def connect(kubeconfig: str | None, context: str | None, namespace: str | None) -> Target:
    """The API server and namespace as kubectl finds them (see the module doc)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    from flotilla.operator.kube import Kube

    cfg = client.Configuration()
    if kubeconfig is not None and not os.path.isfile(os.path.expanduser(kubeconfig)):
        raise UsageError(f"--kubeconfig {kubeconfig}: no such file")
    source = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    files = [os.path.expanduser(p) for p in source.split(os.pathsep) if p]
    if not any(os.path.isfile(f) for f in files):
        if context is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
            try:
                config.load_incluster_config(client_configuration=cfg)
            except ConfigException as exc:
                raise PluginError(f"no kubeconfig at {source} and no usable service account "
                                  f"in this pod ({exc})") from None
            return Target(Kube(client.ApiClient(cfg)), namespace or _pod_namespace(),
                          cfg.host)
        raise PluginError(f"no kubeconfig at {source}: give --kubeconfig FILE or set "
                          "KUBECONFIG (the file kubectl uses)")
    try:
        contexts, active = config.list_kube_config_contexts(config_file=source)
        chosen = active if context is None else next(
            (c for c in contexts if c.get("name") == context), None)
        if chosen is None:
            names = ", ".join(sorted(c.get("name", "?") for c in contexts)) or "none"
            raise UsageError(f"--context {context}: no such context in {source} (contexts: "
                             f"{names})")
        config.load_kube_config(config_file=source, context=context, client_configuration=cfg)
    except ConfigException as exc:
        raise PluginError(f"cannot use the kubeconfig {source}: "
                          f"{' '.join(str(exc).split())}") from None
    default = (chosen.get("context") or {}).get("namespace") or "default"
    return Target(Kube(client.ApiClient(cfg)), namespace or default, cfg.host)


def _pod_namespace() -> str:
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


def get_cluster(target: Target, name: str) -> dict[str, Any]:
    found = target.kube.get("RaftCluster", target.namespace, name)
    if found is None:
        raise PluginError(f"RaftCluster {name} not found in namespace {target.namespace} "
                          "(`kubectl get raft -A` lists them all; -n picks the namespace)")
    return found


def _stamp() -> str:
    """A request's value: now, in RFC 3339 with milliseconds (the node's own format)."""
    from flotilla.node.archive import format_ms

    return format_ms(time.time_ns() // 1_000_000)


# --- status -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Live:
    """One member's own /v1/status (`doc`, parsed as `status`), or why it was not had."""

    doc: dict[str, Any] | None = None
    status: Any = None  # flotilla.operator.memberstatus.MemberStatus
    problem: str | None = None


def cmd_status(args: argparse.Namespace, target: Target) -> int:
    body = get_cluster(target, args.name)
    status = body.get("status") or {}
    names = _member_names(body)
    live, note = ask_members(target, body, names)
    if args.output != "table":
        members = {name: (found.doc if found.doc is not None else
                          {"unreachable": found.problem}) for name, found in live.items()}
        emit({"name": args.name, "namespace": target.namespace, "status": status,
               "members": members, **({"note": note} if note else {})}, args.output,
             sort_keys=False)
        return EXIT_OK
    _print_status(args.name, target.namespace, body, names, live, note)
    return EXIT_OK


def _ordinal(member: str) -> int:
    found = re.search(r"-(\d+)$", member)
    return int(found.group(1)) if found else -1


def _member_names(body: Mapping[str, Any]) -> list[str]:
    """The members status knows, and the pods spec.replicas asks for."""
    name = body["metadata"]["name"]
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    replicas = spec.get("replicas") if isinstance(spec.get("replicas"), int) else 3
    known = {m.get("name") for m in status.get("members") or [] if m.get("name")}
    known |= {f"{name}-{i}" for i in range(max(0, min(replicas, 99)))}
    return sorted(known, key=lambda member: (_ordinal(member), member))


def ask_members(target: Target, body: Mapping[str, Any], names: list[str]
                ) -> tuple[dict[str, Live], str | None]:
    """Each member's own /v1/status, asked in parallel at its client URL (as the operator
    reaches it), and a note when none could be asked at all (then every entry says why)."""
    from flotilla.operator.kube import ApiError
    from flotilla.operator.members import Members
    from flotilla.operator.spec import ClusterSpec, SpecError

    try:
        spec = ClusterSpec.from_body(body)
    except SpecError as exc:
        return _nobody(names, f"the spec is invalid ({exc})")
    context = None
    if spec.tls.enabled:
        from flotilla.operator import tlsassets

        try:
            trust, client_cert = tlsassets.trusted(target.kube, spec, names)
        except ApiError as exc:
            return _nobody(names, f"members not asked: cannot read the cluster's CA from its "
                                  f"Secrets ({exc}); the table is the operator's view")
        if trust is None:
            return _nobody(names, "members not asked: the cluster's CA is in no Secret yet")
        if spec.tls.client_cert_auth and client_cert is None:
            return _nobody(names, "members not asked: they ask clients for a certificate and "
                                  f"the Secret {spec.client_tls_secret} holds none")
        context = tlsassets.client_context(trust, client_cert)
    members = Members(spec, None, context)

    def ask(member: str) -> Live:
        return _ask(members.client_url(member), context)

    with ThreadPoolExecutor(max_workers=min(8, max(1, len(names)))) as pool:
        live = dict(zip(names, pool.map(ask, names), strict=True))
    if live and all(found.problem is not None for found in live.values()):
        first = next(iter(live))
        return live, (f"no member could be reached from here (e.g. {first}: "
                      f"{live[first].problem}); the table is the operator's view")
    return live, None


def _nobody(names: list[str], why: str) -> tuple[dict[str, Live], str]:
    return {name: Live(problem=why) for name in names}, why


def _ask(url: str, context: Any) -> Live:
    from flotilla.client import Client, FlotillaError
    from flotilla.operator.memberstatus import MemberStatus, NotAStatus

    try:
        with Client(url, timeout=LIVE_TIMEOUT, retries=0, ssl_context=context) as client:
            doc = client.status(url)
        return Live(doc=doc, status=MemberStatus.from_json(doc))
    except NotAStatus as exc:
        return Live(problem=f"{url} answered with something that is not a status ({exc})")
    except (FlotillaError, OSError, ValueError) as exc:
        return Live(problem=" ".join(str(exc).split())[:200] or type(exc).__name__)


def _print_status(name: str, namespace: str, body: Mapping[str, Any], names: list[str],
                  live: Mapping[str, Live], note: str | None) -> None:
    status = body.get("status") or {}
    spec = body.get("spec") or {}
    phase = status.get("phase") or "unknown (the operator has written no status yet)"
    leader = status.get("leader") or "none"
    config = status.get("configuration") or {}
    voters = config.get("voters") or []
    print(f"RaftCluster {name} in namespace {namespace}: phase {phase}, "
          f"{len(voters)} voters, leader {leader}"
          + (f" (term {status['term']})" if status.get("term") else ""))
    rows = [("cluster id", status.get("clusterId") or "-"),
            ("last action", status.get("lastAction") or "-"),
            ("configuration", f"voters {', '.join(voters) or 'none'}; learners "
                              f"{', '.join(config.get('learners') or []) or 'none'}"
                              + ("; joint (a membership change is under way)"
                                 if config.get("joint") else "")),
            ("commit index", str(status.get("commitIndex", "-")))]
    snap = status.get("lastSnapshot") or {}
    if snap:
        rows.append(("last snapshot", f"index {snap.get('index', 0)}, term "
                                      f"{snap.get('term', 0)}, {snap.get('bytes', 0)} bytes"))
    archive = status.get("archive")
    wanted = (spec.get("archive") or {}).get("url")
    rows.append(("archive", _describe_archive(archive) if archive else
                 f"{wanted}: nothing reported yet" if wanted else "none"))
    width = max(len(label) for label, _ in rows) + 1
    for label, value in rows:
        print(f"{label + ':':<{width}} {value}")

    commit = status.get("commitIndex")
    progress = {m.get("name"): m for m in status.get("members") or []}
    table = []
    for member in names:
        seen = progress.get(member) or {}
        match = seen.get("matchIndex")
        found = live.get(member) or Live(problem="not asked")
        own = found.status
        table.append({
            "MEMBER": member,
            "ROLE": seen.get("role") or "-",
            "READY": {True: "yes", False: "no"}.get(seen.get("ready"), "-"),
            "MATCH": match if match is not None else "-",
            "LAG": (commit - match) if isinstance(commit, int) and isinstance(match, int)
            and seen else "-",
            "LIVE ROLE": own.role if own is not None else "-",
            "TERM": own.term if own is not None else "-",
            "COMMIT": own.commit_index if own is not None else "-",
            "APPLIED": own.applied_index if own is not None else "-",
        })
    print()
    print_table(table)
    if note:
        print(f"note: {note}")
    else:
        for member, found in live.items():
            if found.problem is not None:
                print(f"note: {member} could not be reached from here: {found.problem}")

    conditions = status.get("conditions") or []
    if conditions:
        print()
        print_table([{"CONDITION": c.get("type", "?"), "STATUS": c.get("status", "?"),
                 "REASON": c.get("reason", ""), "MESSAGE": c.get("message", "")}
                for c in conditions])
    asked = status.get("requests") or {}
    if asked:
        print()
        for kind, label in (("snapshot", "snapshot"), ("moveLeader", "move-leader")):
            entry = asked.get(kind)
            if entry:
                to = f" to {entry['member']}" if entry.get("member") else ""
                print(f"requested {label}{to} (at {entry.get('requestedAt')}): "
                      f"{entry.get('outcome', 'pending')}: {entry.get('message', '')}")


def _describe_archive(archive: Mapping[str, Any]) -> str:
    text = (f"{archive.get('url', '?')}: archived up to index "
            f"{archive.get('lastArchivedIndex', 0)} (lag {archive.get('lag', 0)}), newest "
            f"snapshot there at {archive.get('lastSnapshotIndex', 0)}")
    error = archive.get("error")
    return text + (f"; error: {error}" if error else "")


# --- requests: snapshot, move-leader --------------------------------------------------------------


def request(target: Target, name: str, annotations: Mapping[str, str]) -> None:
    """Write a request's annotations on the RaftCluster (a merge patch of its metadata)."""
    from flotilla.operator.kube import ApiError

    try:
        target.kube.patch("RaftCluster", target.namespace, name,
                          {"metadata": {"annotations": dict(annotations)}})
    except ApiError as exc:
        if exc.status == 404:
            raise PluginError(f"RaftCluster {name} not found in namespace "
                              f"{target.namespace}") from None
        if exc.status == 403:
            raise PluginError(f"not allowed to annotate RaftCluster {name} ({exc}): the "
                              "request needs patch on raftclusters.flotilla.dev") from None
        raise


def await_answer(target: Target, name: str, kind: str, stamp: str,
                 timeout: float) -> dict[str, Any]:
    """The operator's answer to the request `stamp` (status.requests.<kind>), watched for;
    PluginError after `timeout` seconds, saying where the cluster stands."""

    def answered(body: Mapping[str, Any]) -> dict[str, Any] | None:
        entry = ((body.get("status") or {}).get("requests") or {}).get(kind) or {}
        return dict(entry) if entry.get("requestedAt") == stamp else None

    entry, last = watch_until(target, name, answered, timeout)
    if entry is not None:
        return entry
    status = (last or {}).get("status") or {}
    raise PluginError(
        f"the operator has not answered within {timeout:g}s (phase "
        f"{status.get('phase') or 'unknown'}, last action: {status.get('lastAction') or '-'}); "
        "the request stays on the RaftCluster and is carried out when the operator gets to "
        "it: is the operator running? `kubectl flotilla status "
        f"{name}` shows the answer")


def watch_until(target: Target, name: str, check: Callable[[Mapping[str, Any]], Any],
                timeout: float) -> tuple[Any, dict[str, Any] | None]:
    """(what `check` returns for the RaftCluster, the RaftCluster) as soon as `check` returns
    something other than None, watching the object; (None, the last seen) after `timeout`."""
    deadline = time.monotonic() + timeout
    body = target.kube.get("RaftCluster", target.namespace, name)
    while True:
        if body is None:
            raise PluginError(f"RaftCluster {name} was deleted meanwhile")
        found = check(body)
        if found is not None:
            return found, body
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, body
        version = (body.get("metadata") or {}).get("resourceVersion")
        for event in _watch(target, name, version, remaining):
            if event.get("type") == "DELETED":
                raise PluginError(f"RaftCluster {name} was deleted meanwhile")
            seen = event.get("object") or {}
            if event.get("type") in ("ADDED", "MODIFIED") and check(seen) is not None:
                return check(seen), seen
        body = target.kube.get("RaftCluster", target.namespace, name)  # the watch ended


def _watch(target: Target, name: str, version: str | None,
           timeout: float) -> Iterator[dict[str, Any]]:
    """The RaftCluster's watch events until `timeout` (server- and client-side) or the
    server ends the stream. The name is also checked here: a field selector is a filter the
    plugin does not rely on."""
    import urllib3
    from kubernetes.watch.watch import iter_resp_lines

    from flotilla.operator.kube import object_path

    query = {"watch": "true", "fieldSelector": f"metadata.name={name}",
             "timeoutSeconds": str(max(1, int(timeout)))}
    if version:
        query["resourceVersion"] = version
    api = target.kube.api
    headers = {"Accept": "application/json"}
    api.update_params_for_auth(headers, [], ["BearerToken"])
    url = f"{api.configuration.host}{object_path('RaftCluster', target.namespace)}?" \
          f"{urlencode(query)}"
    try:
        response = api.rest_client.request("GET", url, headers=headers, _preload_content=False,
                                           _request_timeout=(10, timeout))
    except Exception:  # a watch refused is a watch that ended: the caller reads the object
        return
    try:
        for line in iter_resp_lines(response):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            meta = ((event.get("object") or {}).get("metadata")) or {}
            if event.get("type") == "ERROR":
                return  # e.g. 410 Gone: the caller reads the object again
            if meta.get("name") == name:
                yield event
    except urllib3.exceptions.HTTPError:  # the read timed out: the time is up
        return
    finally:
        response.release_conn()


def cmd_snapshot(args: argparse.Namespace, target: Target) -> int:
    from flotilla.operator.requests import SNAPSHOT

    get_cluster(target, args.name)
    stamp = _stamp()
    request(target, args.name, {SNAPSHOT: stamp})
    if not args.wait:
        print(f"asked for a snapshot of {args.name} ({SNAPSHOT}={stamp}); `{PROG} status "
              f"{args.name}` shows the answer")
        return EXIT_OK
    entry = await_answer(target, args.name, "snapshot", stamp, args.timeout)
    if entry.get("outcome") != "Succeeded":
        raise PluginError(entry.get("message") or "the snapshot failed")
    if args.output != "plain":
        emit(entry, args.output, sort_keys=False)
        return EXIT_OK
    where = entry.get("location") or "kept on the members (no archive)"
    print(f"snapshot of {args.name}: index {entry.get('index')}, term {entry.get('term')}, "
          f"{entry.get('bytes')} bytes, {where}")
    return EXIT_OK


def member_name(cluster: str, given: str) -> str:
    """A member named by its pod name, or by its ordinal."""
    return f"{cluster}-{given}" if given.isdigit() else given


def cmd_move_leader(args: argparse.Namespace, target: Target) -> int:
    from flotilla.operator.requests import MOVE_LEADER, MOVE_LEADER_TO

    body = get_cluster(target, args.name)
    member = member_name(args.name, args.member)
    status = body.get("status") or {}
    config = status.get("configuration") or {}
    voters = config.get("voters") or []
    if voters and member not in voters:
        what = ("a learner" if member in (config.get("learners") or []) else
                f"not a member of {args.name}")
        raise PluginError(f"{member} is {what}: only a voter can lead (voters: "
                          f"{', '.join(voters)})")
    if status.get("leader") == member:
        print(f"{member} already leads {args.name} (term {status.get('term')})")
        return EXIT_OK
    stamp = _stamp()
    request(target, args.name, {MOVE_LEADER_TO: member, MOVE_LEADER: stamp})
    if not args.wait:
        print(f"asked for leadership of {args.name} to go to {member} ({MOVE_LEADER}="
              f"{stamp}); `{PROG} status {args.name}` shows the answer")
        return EXIT_OK
    entry = await_answer(target, args.name, "moveLeader", stamp, args.timeout)
    if entry.get("outcome") != "Succeeded":
        raise PluginError(entry.get("message") or "leadership was not moved")
    term = entry.get("term")
    print(f"leader of {args.name}: {entry.get('leader') or member}"
          + (f" (term {term})" if term is not None else "") + f": {entry.get('message')}")
    return EXIT_OK


# --- restore ------------------------------------------------------------------------------------

#: Left out of the new cluster's spec: its own bootstrap and id, and a scheduled export, whose
#: destination two clusters must not share.
NOT_COPIED = ("bootstrap", "clusterId")


def restore_manifest(old: Mapping[str, Any], new: str, namespace: str, *,
                     time_point: str | None = None, index: int | None = None,
                     archive_url: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """The RaftCluster `new` that restores `old`'s archive, and notes on what was changed
    from `old`'s spec. `time_point` is already in the node's RFC 3339 form."""
    from flotilla.operator.spec import ClusterSpec, SpecError

    name = old["metadata"]["name"]
    spec = copy.deepcopy(dict(old.get("spec") or {}))
    archive = spec.get("archive")
    if not isinstance(archive, dict) or not archive.get("url"):
        raise PluginError(f"RaftCluster {name} has no archive (spec.archive.url): there is "
                          "nothing to restore from")
    try:
        cluster_id = ClusterSpec.from_body(old).cluster_id
    except SpecError as exc:
        raise PluginError(f"RaftCluster {name} has a spec the operator cannot read ({exc})") \
            from None
    notes = []
    for key in NOT_COPIED:
        spec.pop(key, None)
    if archive.pop("export", None) is not None:
        notes.append(f"spec.archive.export of {name} is not copied (two clusters would export "
                     "to one destination): add one with a destination of its own")
    restore: dict[str, Any] = {"url": archive["url"], "clusterId": cluster_id}
    if time_point is not None:
        restore["time"] = time_point
    if index is not None:
        restore["index"] = index
    if archive_url is not None:
        archive["url"] = archive_url
    spec["bootstrap"] = {"restore": restore}
    manifest = {"apiVersion": "flotilla.dev/v1alpha1", "kind": "RaftCluster",
                "metadata": {"name": new, "namespace": namespace}, "spec": spec}
    try:
        ClusterSpec.from_body(manifest)
    except SpecError as exc:
        raise UsageError(f"the new RaftCluster would be invalid: {exc}") from None
    return manifest, notes


def restore_time(text: str, now_ms: int | None = None) -> str:
    """A restore target as the node writes it; ValueError, saying why, for a time that is not
    RFC 3339 with an offset, or that is in the future (no archive can hold an entry stamped
    after now)."""
    from flotilla.node.archive import format_ms, parse_time

    ms = parse_time(text)
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    if ms > now_ms:
        raise ValueError(f"{format_ms(ms)} is in the future (now is {format_ms(now_ms)}): "
                         "an archive restores times up to its last archived entry")
    return format_ms(ms)


def cmd_restore(args: argparse.Namespace, target: Target) -> int:
    old = get_cluster(target, args.name)
    manifest, notes = restore_manifest(old, args.new, target.namespace, time_point=args.to_time,
                                       index=args.to_index, archive_url=args.archive_url)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    if args.dry_run:
        emit(manifest, args.output, sort_keys=False)
        return EXIT_OK
    if target.kube.get("RaftCluster", target.namespace, args.new) is not None:
        raise PluginError(f"RaftCluster {args.new} already exists in namespace "
                          f"{target.namespace}: give --as another name")
    target.kube.create(manifest, field_manager=FIELD_MANAGER)
    restore = manifest["spec"]["bootstrap"]["restore"]
    point = (f"as of {restore['time']}" if "time" in restore else
             f"at index {restore['index']}" if "index" in restore else
             "at its newest archived snapshot")
    print(f"raftcluster.flotilla.dev/{args.new} created: it restores {args.name} (cluster "
          f"{restore['clusterId']}) {point}; `{PROG} status {args.new}` follows it")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
