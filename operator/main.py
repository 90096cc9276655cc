"""`flotilla operator`: run the RaftCluster operator (kopf) until SIGTERM.

It talks to the API server as kubectl would: the pod's service account in a cluster, else
the local kubeconfig (KUBECONFIG). One replica at a time (kopf standalone mode: the chart runs
a single replica with the Recreate strategy).

It serves its own metrics on `--metrics-port` (default 8081, plain HTTP, /metrics; 0: none)
and logs on stderr as text or JSON (`--log-format`, `--log-level`; kopf's own records too).

Exit codes: 0 after a clean stop; 1 when it cannot reach Kubernetes at all (no in-cluster
service account and no usable kubeconfig), with one line saying what to do; 2 for bad flags
or a metrics port it cannot listen on.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from flotilla import logs
from flotilla.cmdline import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Parser, seconds

DEFAULT_METRICS_PORT = 8081


def kubernetes_config_problem() -> str | None:
    """Why kopf could not log in to any cluster, or None when it can.

    kopf logs in through the kubernetes client's loaders (in-cluster first, then the
    kubeconfig). Without either it retries inside its event loop and ends in a page of
    tracebacks; asking the same loaders first turns that into one sentence.
    """
    import yaml
    from kubernetes import config
    from kubernetes.config.config_exception import ConfigException

    try:
        config.load_incluster_config()
        return None
    except ConfigException as exc:
        in_cluster = str(exc).rstrip(".")
    try:
        config.load_kube_config()
        return None
    except (ConfigException, OSError, yaml.YAMLError) as exc:
        kubeconfig = " ".join(str(exc).split()).rstrip(".")
    where = os.environ.get("KUBECONFIG") or "~/.kube/config"
    return (f"no Kubernetes cluster to talk to: not running in a pod ({in_cluster}) and no "
            f"usable kubeconfig at {where} ({kubeconfig}); set KUBECONFIG to a kubeconfig "
            "file (the one kubectl uses), or run the operator inside a cluster")


def _port(text: str) -> int:
    if not text.strip().isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 0 to 65535, not {text!r}")
    return int(text)


def _log_format(text: str) -> str:
    try:
        return logs.parse_format(text, "")
    except logs.LogSettingError:
        raise argparse.ArgumentTypeError(f"expected text or json, not {text!r}") from None


def _log_level(text: str) -> str:
    try:
        return logs.parse_level(text, "")
    except logs.LogSettingError:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(logs.LEVELS)}, not "
                                         f"{text!r}") from None


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="flotilla operator",
        description="Reconcile RaftCluster objects (flotilla.dev/v1alpha1) into StatefulSets, "
                    "Services and PodDisruptionBudgets, and drive membership changes through "
                    "the members' admin API, one planned step at a time.")
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="watch only this namespace (repeatable; default: all namespaces). "
                        "Named exactly (no globs), the operator needs no cluster-wide "
                        "permission: a Role in each namespace is enough")
    p.add_argument("--all-namespaces", "-A", action="store_true",
                   help="watch every namespace (the default)")
    p.add_argument("--default-image", default=os.environ.get("FLOTILLA_DEFAULT_IMAGE"),
                   help="the image for RaftClusters without spec.image "
                        "(env FLOTILLA_DEFAULT_IMAGE)")
    p.add_argument("--interval", type=seconds,
                   # a string default goes through the type too, so a bad env value is a
                   # usage error, not a traceback
                   default=os.environ.get("FLOTILLA_OPERATOR_INTERVAL") or "30",
                   help="the safety interval: the longest a cluster goes without being "
                        "looked at when nothing happens (steps follow each other at once, "
                        "and events about the cluster, its pods and Jobs wake it; env "
                        "FLOTILLA_OPERATOR_INTERVAL; default 30)")
    p.add_argument("--liveness", default=None, metavar="URL",
                   help="serve a liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    p.add_argument("--metrics-port", type=_port, metavar="PORT",
                   default=os.environ.get("FLOTILLA_METRICS_PORT") or str(DEFAULT_METRICS_PORT),
                   help="serve the operator's Prometheus metrics on this port, path /metrics, "
                        f"plain HTTP (env FLOTILLA_METRICS_PORT; default {DEFAULT_METRICS_PORT};"
                        " 0: none)")
    p.add_argument("--log-format", type=_log_format, metavar="FORMAT",
                   default=os.environ.get("FLOTILLA_LOG_FORMAT") or "text",
                   help="text (default) or json: one object per line, kopf's records included "
                        "(env FLOTILLA_LOG_FORMAT)")
    p.add_argument("--log-level", type=_log_level, metavar="LEVEL",
                   default=os.environ.get("FLOTILLA_LOG_LEVEL") or None,
                   help="debug, info (default), warning or error (env FLOTILLA_LOG_LEVEL)")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="debug logging: the same as --log-level debug")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    if args.namespace and args.all_namespaces:
        print("flotilla operator: give --namespace or --all-namespaces, not both",
              file=sys.stderr)
        return EXIT_USAGE
    # Read by the handlers module at import.
    os.environ["FLOTILLA_OPERATOR_INTERVAL"] = str(args.interval)
    if args.default_image:
        os.environ["FLOTILLA_DEFAULT_IMAGE"] = args.default_image
    level = args.log_level or ("debug" if args.verbose else "info")
    logs.configure(args.log_format, level)

    problem = kubernetes_config_problem()
    if problem is not None:
        logs.fatal("flotilla operator", problem, args.log_format)
        return EXIT_FAILED

    import kopf

    from . import handlers  # registers the handlers
    from .metrics import METRICS

    if args.metrics_port:
        try:
            METRICS.serve(args.metrics_port)
        except OSError as exc:
            logs.fatal("flotilla operator", f"cannot listen on port {args.metrics_port} "
                       f"(--metrics-port): {os.strerror(exc.errno) if exc.errno else exc}; "
                       "choose another port, or 0 for no metrics", args.log_format)
            return EXIT_USAGE
        logging.getLogger("flotilla.operator").info(
            "serving metrics on port %d, path /metrics", args.metrics_port)

    handlers.STATIC_NAMESPACES = bool(args.namespace) and not any(
        set(ns) & set("*?[]!") for ns in args.namespace)
    kopf.run(standalone=True, clusterwide=not args.namespace,
             namespaces=args.namespace or (), liveness_endpoint=args.liveness)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
