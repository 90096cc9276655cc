"""The operator's own metrics, served on `--metrics-port` (plain HTTP, path /metrics).

The daemon of each RaftCluster reports every round (`OperatorMetrics.round_done`,
`round_failed`) and forgets its cluster when it ends. As in a member (node/metrics.py), the
counts are plain values rendered by a collector at scrape time, the clusters' state included
(`ClusterHealth`), so a deleted cluster's series go with it. The registry is the operator's
own, with prometheus_client's process, platform and garbage-collector collectors.
"""

from __future__ import annotations

import errno
import platform
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flotilla.node.metrics import Histogram
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from flotilla import __version__

from .planner import Step

if TYPE_CHECKING:
    from .memberstatus import MemberStatus
    from .reconcile import Outcome

#: The phases the CRD declares (status.phase): each has a series, 0 when no cluster is in it.
PHASES = ("Pending", "Restoring", "RestoreFailed", "Bootstrapping", "Ready", "Scaling",
          "Healing", "Upgrading", "Degraded", "Deleting", "Invalid")
#: A round observes Kubernetes and every member, and may take a step: up to a minute.
ROUND_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STEPS = tuple(step.value for step in Step if step not in (Step.WAIT, Step.DONE))

Where = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class ClusterHealth:
    """One cluster as its last round found it."""

    phase: str
    voters: tuple[str, ...]  # of the newest configuration known
    unavailable: tuple[str, ...]  # voters that did not answer
    ready: bool

    @property
    def fault_tolerance(self) -> int:
        """Voters that may fail with a quorum left: floor((voters - 1) / 2)."""
        return max(0, (len(self.voters) - 1) // 2)


def health(outcome: Outcome, before: ClusterHealth | None) -> ClusterHealth:
    """What `outcome` says of the cluster. The voters are the leader's configuration, else
    the newest one a member that answered holds (as the planner judges a quorum without a
    leader), else what the previous round knew; a voter is unavailable when it did not
    answer its /v1/status this round. A round that observed no member (an invalid spec, a
    restore's Job still running) keeps what the previous round knew of them."""
    status = outcome.status
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    ready = conditions.get("Ready") == "True"
    phase = str(status.get("phase") or "Pending")
    if outcome.plan is None:
        return ClusterHealth(phase, before.voters if before else (),
                             before.unavailable if before else (), ready)
    answering: Mapping[str, MemberStatus] = {
        name: found for name, found in outcome.statuses.items() if found is not None}
    lead = outcome.plan.leader_status
    if lead is not None:
        voters = tuple(sorted(lead.config.voters))
    elif answering:
        newest = max(answering.values(), key=lambda s: (s.term, s.commit_index))
        voters = tuple(sorted(newest.config.voters))
    else:
        voters = before.voters if before else ()
    return ClusterHealth(phase, voters, tuple(v for v in voters if v not in answering), ready)


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.duration = Histogram(ROUND_BUCKETS)
        self.errors = 0
        self.steps = dict.fromkeys(STEPS, 0)
        self._lock = threading.Lock()
        self._clusters: dict[Where, ClusterHealth] = {}
        # The uid of the RaftCluster whose finalizer is done, by place: a round of it that
        # ends afterwards must not bring its series back.
        self._gone: dict[Where, str] = {}
        self.registry.register(_ClusterCollector(self))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)

    def round_done(self, where: Where, seconds: float, outcome: Outcome, uid: str = "") -> None:
        action = outcome.plan.action if outcome.plan is not None else None
        with self._lock:
            self.duration.observe(seconds)
            if outcome.step_error is not None:
                self.errors += 1
            elif action is not None and action.step.value in STEPS:
                self.steps[action.step.value] += 1
            if uid and self._gone.get(where) == uid:
                return
            self._gone.pop(where, None)  # a new RaftCluster of that name
            self._clusters[where] = health(outcome, self._clusters.get(where))

    def round_failed(self, where: Where, seconds: float) -> None:
        with self._lock:
            self.duration.observe(seconds)
            self.errors += 1

    def deleting(self, where: Where) -> None:
        """The RaftCluster is being deleted: its finalizer runs (then `forget`)."""
        with self._lock:
            before = self._clusters.get(where)
            if before is not None:
                self._clusters[where] = ClusterHealth("Deleting", before.voters,
                                                      before.unavailable, False)

    def forget(self, where: Where, uid: str = "") -> None:
        """The cluster is no longer watched, or (`uid` given) its finalizer is done: its
        series go, and a round of that RaftCluster still ending brings none back."""
        with self._lock:
            self._clusters.pop(where, None)
            if uid:
                self._gone[where] = uid

    def clusters(self) -> dict[Where, ClusterHealth]:
        with self._lock:
            return dict(self._clusters)

    def counts(self) -> tuple[list[tuple[str, int]], float, int, dict[str, int]]:
        """The rounds' duration histogram (cumulative buckets, sum), errors and steps."""
        with self._lock:
            return (self.duration.cumulative(), self.duration.total, self.errors,
                    dict(self.steps))

    def serve(self, port: int) -> None:
        """Serve /metrics on `port` of every address, from a thread of its own. OSError when
        the port cannot be bound (in use, not allowed)."""
        try:
            start_http_server(port, addr="::", registry=self.registry)
        except OSError as exc:  # no IPv6 on this host: IPv4 only
            if exc.errno not in (errno.EAFNOSUPPORT, errno.EADDRNOTAVAIL):
                raise
            start_http_server(port, addr="0.0.0.0", registry=self.registry)


class _ClusterCollector:
    def __init__(self, metrics: OperatorMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        clusters = self.metrics.clusters()
        buckets, total, errors, steps = self.metrics.counts()
        duration = HistogramMetricFamily(
            "flotilla_operator_reconcile_duration_seconds", "Duration of one reconcile round "
            "of one RaftCluster (observe, plan, one step).")
        duration.add_metric([], buckets, total)
        yield duration
        yield CounterMetricFamily("flotilla_operator_reconcile_errors", "Rounds that failed, "
                                  "or whose step failed (both are retried).", value=errors)
        taken = CounterMetricFamily("flotilla_operator_steps", "Steps the planner decided "
                                    "and the operator took, by kind.", labels=["step"])
        for step, count in sorted(steps.items()):
            taken.add_metric([step], count)
        yield taken
        build = GaugeMetricFamily("flotilla_build_info", "Version of the operator's Flotilla "
                                  "and Python; always 1.", labels=["version", "python_version"])
        build.add_metric([__version__, platform.python_version()], 1)
        yield build
        by_phase = dict.fromkeys(PHASES, 0)
        for state in clusters.values():
            by_phase[state.phase] = by_phase.get(state.phase, 0) + 1
        phases = GaugeMetricFamily("flotilla_operator_clusters", "RaftClusters by "
                                   "status.phase.", labels=["phase"])
        for phase, count in sorted(by_phase.items()):
            phases.add_metric([phase], count)
        yield phases
        families: dict[str, tuple[str, Any]] = {
            "flotilla_operator_cluster_voters": (
                "Voters in the cluster's newest known configuration.",
                lambda h: len(h.voters)),
            "flotilla_operator_cluster_unavailable_voters": (
                "Voters that did not answer the operator's last round.",
                lambda h: len(h.unavailable)),
            "flotilla_operator_cluster_fault_tolerance": (
                "Voters that may fail with a quorum left: floor((voters - 1) / 2).",
                lambda h: h.fault_tolerance),
            "flotilla_operator_cluster_ready": (
                "1 while the cluster's Ready condition is True.", lambda h: int(h.ready)),
        }
        for name, (doc, value) in families.items():
            family = GaugeMetricFamily(name, doc, labels=["namespace", "raftcluster"])
            for (namespace, cluster), state in sorted(clusters.items()):
                family.add_metric([namespace, cluster], value(state))
            yield family


#: The operator process's metrics (one operator per process).
METRICS = OperatorMetrics()
