"""What the fault tests share: timing, the workload, the unavailability measure, the checks.

Every test follows the same story: start a cluster, run concurrent clients (``Workload``) that
record a history, inject a fault meanwhile, heal, stop the clients, and then ``check_history``:
the members converge on the same state, a linearizable read of every key returns it, and the
history plus those final reads is linearizable per key with no acknowledged write lost
(``check_final_state``).

Diagnosis: assertion messages carry the workload summary and the checker's explanation; the
``local_cluster`` fixture prints each member's log tail on failure; ``check_history`` writes
every operation, with the member it was sent to, to ``history.txt`` next to the members' logs
(run with ``--basetemp DIR`` to keep them).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tests.harness.kvclient import (
    TRANSPORT_ERRORS,
    FinalRead,
    KVClient,
    Response,
    Workload,
    classify,
    read_final_reads,
)
from tests.harness.linearizability import History, Kind, Op, Status, check_final_state
from tests.harness.polling import wait_for
from tests.harness.processes import LocalCluster

FAST = {"election_timeout_ms": 500, "heartbeat_ms": 50}
ELECTION_S = FAST["election_timeout_ms"] / 1000
#: Generous bound for "the cluster serves again" on a loaded two-core machine.
UNAVAILABILITY_BOUND_S = 10 * ELECTION_S
KEYS = [f"key{i}" for i in range(6)]


def others(cluster: LocalCluster, name: str) -> list[str]:
    return [m for m in cluster.members if m != name]


def member_urls(cluster: LocalCluster, exclude: Iterable[str] = ()) -> Callable[[], list[str]]:
    """Client URLs of the running members of the configuration (paused ones included) except
    ``exclude`` (a set the test may change meanwhile), asked again for every request, so the
    workload follows kills, restarts and membership changes."""

    def urls() -> list[str]:
        return [cluster.nodes[m].url for m in list(cluster.members)
                if m not in exclude and cluster.nodes[m].running]

    return urls


class TracedHistory(History):
    """A ``History`` that also remembers which member URL each operation was sent to (set by
    ``TracedWorkload`` for the calling thread), for diagnostics."""

    def __init__(self) -> None:
        super().__init__()
        self.targets: dict[int, str] = {}
        self.local = threading.local()

    def invoke(self, client, kind, key, value=None, *, prev_index=None) -> Op:
        op = super().invoke(client, kind, key, value, prev_index=prev_index)
        url = getattr(self.local, "url", None)
        if url is not None:
            self.targets[op.id] = url
        return op


class TracedWorkload(Workload):
    """A ``Workload`` whose history knows where each request went, and whose clients pause
    ``backoff`` seconds after a request without a definite answer (503, connection refused), as
    real clients do, rather than recording thousands of refused requests while a member is
    down."""

    history: TracedHistory
    backoff = 0.02
    prefix = ""  # client names (and so put values) stay unique when workloads share a history

    def _one(self, client: KVClient, name: str, *args: Any) -> str:
        self.history.local.url = client.url
        try:
            outcome = super()._one(client, self.prefix + name, *args)
        finally:
            self.history.local.url = None
        if outcome == "unknown":
            time.sleep(self.backoff)
        return outcome


def workload(cluster: LocalCluster, *, seed: int, clients: int = 4,
             urls: Callable[[], Sequence[str]] | None = None, **options: Any) -> TracedWorkload:
    """A workload over ``KEYS`` that runs until stopped (the duration is only a backstop)."""
    options.setdefault("timeout", 2.0)
    options.setdefault("mix", {"put": 0.4, "get": 0.4, "delete": 0.1, "cas": 0.1})
    options.setdefault("history", TracedHistory())
    options.setdefault("ssl_context", cluster.ssl_context)  # https:// members of tls=True
    return TracedWorkload(urls or member_urls(cluster), KEYS, clients=clients, duration=120.0,
                          seed=seed, **options)


def write_probes(cluster: LocalCluster, w: Workload, *, seed: int, clients: int = 2,
                 urls: Callable[[], Sequence[str]] | None = None) -> TracedWorkload:
    """Writers with a short timeout that share ``w``'s history (and keys): they measure when
    the cluster acknowledges writes more finely than the main clients, which can all be
    waiting out their 2 s timeout on requests that a fault left hanging."""
    probes = workload(cluster, seed=seed, clients=clients, urls=urls, timeout=0.5,
                      mix={"put": 1.0}, history=w.history)
    probes.prefix = "w"
    return probes


def diagnostics(w: Workload) -> str:
    errors = "\n  ".join(w.errors[:8])
    return f"workload: {w.summary()}\nfirst errors:\n  {errors}"


# ---------------------------------------------------------------------------------------------
# Measuring unavailability


def _is_write(op: Op) -> bool:
    return op.kind in (Kind.PUT, Kind.DELETE, Kind.CAS)


def write_acks(history: History, only: Callable[[Op], bool] | None = None) -> list[float]:
    """When each acknowledged (200, or 412 for compare-and-set) write's answer arrived."""
    return sorted(op.complete for op in history.ops
                  if _is_write(op) and op.status is Status.OK and op.complete is not None
                  and (only is None or only(op)))


def unavailability(history: History, fault_at: float, end: float,
                   only: Callable[[Op], bool] | None = None) -> float | None:
    """How long the cluster stopped acknowledging writes around a fault: the longest gap
    between consecutive acknowledged writes from half a second before ``fault_at`` to ``end``
    (counting from ``fault_at`` if nothing was acknowledged just before it). None when no write
    was acknowledged between ``fault_at`` and ``end``. ``only`` filters the operations."""
    acks = [t for t in write_acks(history, only) if fault_at - 0.5 <= t <= end]
    if not any(t > fault_at for t in acks):
        return None
    points = acks if acks[0] <= fault_at else [fault_at, *acks]
    return max(b - a for a, b in itertools.pairwise(points))


def acknowledged_writes_after(history: History, t: float) -> int:
    return sum(1 for at in write_acks(history) if at > t)


# ---------------------------------------------------------------------------------------------
# Probes: single requests recorded in the same history, so the checker judges them too


def probe(history: History, client: KVClient, name: str, kind: str, key: str,
          value: bytes | None = None, timeout: float | None = None) -> Response | None:
    """Send one request and record it under the client name ``name``; None when no answer
    arrived (transport error or timeout)."""
    if isinstance(history, TracedHistory):
        history.local.url = client.url
    try:
        op = history.invoke(name, kind, key, value)
    finally:
        if isinstance(history, TracedHistory):
            history.local.url = None
    try:
        if kind == "get":
            resp = client.get(key, timeout=timeout)
        elif kind == "put":
            assert value is not None
            resp = client.put(key, value, timeout=timeout)
        elif kind == "delete":
            resp = client.delete(key, timeout=timeout)
        else:
            raise ValueError(kind)
    except TRANSPORT_ERRORS:
        history.unknown(op)
        return None
    outcome, output = classify(kind, resp)
    if outcome == "ok":
        history.ok(op, output)
    elif outcome == "fail":
        history.fail(op)
    else:
        history.unknown(op)
    return resp


def put_until_ok(history: History, cluster: LocalCluster, name: str, key: str, value: bytes,
                 timeout: float = 20.0, among: Iterable[str] | None = None) -> Response:
    """Write through the leader (as agreed by ``among``) until acknowledged; every attempt is
    recorded under its own client name (an unknown attempt may still apply later)."""
    deadline = time.monotonic() + timeout
    attempt = 0
    last: Any = None
    while time.monotonic() < deadline:
        leader = cluster.wait_leader(max(1.0, deadline - time.monotonic()), among=among)
        with cluster.client(leader, timeout=2.0) as c:
            resp = probe(history, c, f"{name}.{attempt}", "put", key, value)
        attempt += 1
        if resp is not None and resp.status == 200:
            return resp
        last = resp if resp is None else (resp.status, resp.body[:200])
        time.sleep(0.1)
    raise AssertionError(f"could not write {key}={value!r} within {timeout}s; last: {last}")


# ---------------------------------------------------------------------------------------------
# Convergence and the final checks


def wait_caught_up(cluster: LocalCluster, name: str, timeout: float = 30.0) -> tuple[int, int]:
    """Wait until ``name`` has applied the leader's commit index as read now; returns
    (that commit index, ``name``'s applied index)."""
    leader = cluster.wait_leader(timeout)
    target = cluster.status(leader)["commit_index"]
    applied = wait_for(lambda: (a := cluster.status(name)["applied_index"]) >= target and a,
                       timeout, f"{name} to apply the leader's commit index {target}")
    return target, applied


def _brief(status: dict[str, Any]) -> str:
    return " ".join(f"{k}={status.get(k)}" for k in ("role", "term", "leader", "commit_index",
                                                      "applied_index", "last_index"))


@dataclass(frozen=True)
class Settled:
    """The state every running member serves from its local state once the cluster is quiet."""

    leader: str
    index: int  # the commit index every member has applied
    values: dict[str, bytes | None]  # key -> value, identical on every member
    mod_index: dict[str, int | None]


def settle(cluster: LocalCluster, keys: Iterable[str], timeout: float = 30.0,
           quiet: float = 0.5) -> Settled:
    """Wait until the cluster is quiet and converged: a leader agreed by every running member of
    the configuration, every member has applied the leader's commit index, nothing changed for
    ``quiet`` seconds, and every member serves the same value for every key from its local
    state (serializable reads). Members that disagree at the same applied index have diverged:
    that fails at once, with what each serves."""
    keys = list(keys)
    deadline = time.monotonic() + timeout
    last = "no attempt"
    while time.monotonic() < deadline:
        try:
            leader = cluster.wait_leader(max(1.0, deadline - time.monotonic()))
            names = [m for m in cluster.members if cluster.nodes[m].running]
            before = {m: cluster.status(m) for m in names}
            commit = before[leader]["commit_index"]
            if any(st["applied_index"] != commit for st in before.values()):
                last = "applied indexes differ: " + "; ".join(
                    f"{m}: {_brief(st)}" for m, st in before.items())
                time.sleep(0.1)
                continue
            time.sleep(quiet)
            served: dict[str, dict[str, tuple[int, bytes | None, int | None]]] = {}
            for m in names:
                with cluster.client(m, timeout=2.0) as c:
                    served[m] = {}
                    for key in keys:
                        resp = c.get(key, consistency="serializable")
                        if resp.status not in (200, 404):
                            raise RuntimeError(f"{m}: serializable GET {key!r} answered "
                                               f"{resp.status} {resp.body[:200]!r}")
                        served[m][key] = (resp.index, resp.body if resp.status == 200 else None,
                                          resp.mod_index)
            after = {m: cluster.status(m) for m in names}
        except (*TRANSPORT_ERRORS, RuntimeError, TimeoutError) as exc:
            last = f"{type(exc).__name__}: {exc}"
            time.sleep(0.1)
            continue
        if any(after[m]["applied_index"] != commit or after[m]["commit_index"] != commit
               for m in names) or any(i != commit for m in names for i, _, _ in
                                      served[m].values()):
            last = "still moving: " + "; ".join(f"{m}: {_brief(st)}" for m, st in after.items())
            continue
        diverged = [
            f"key {key!r}: " + ", ".join(f"{m} serves {served[m][key][1]!r} (Mod-Index "
                                         f"{served[m][key][2]})" for m in names)
            for key in keys if len({served[m][key][1:] for m in names}) > 1]
        assert not diverged, (f"members diverge, all at applied index {commit}:\n"
                              + "\n".join(diverged))
        first = served[names[0]]
        return Settled(leader, commit, {k: first[k][1] for k in keys},
                       {k: first[k][2] for k in keys})
    raise AssertionError(f"the cluster did not settle within {timeout}s; {last}\n"
                         f"{cluster.log_tails(10)}")


def final_reads(cluster: LocalCluster, keys: Iterable[str], timeout: float = 30.0
                ) -> dict[str, FinalRead]:
    """Read every key linearizably, spread over the running members (retrying one that does
    not answer 200/404), keeping who answered and the indexes."""
    running = {m: cluster.nodes[m].url for m in cluster.members if cluster.nodes[m].running}
    return read_final_reads(running, keys, timeout=timeout, ssl_context=cluster.ssl_context)


def check_history(cluster: LocalCluster, w: Workload, *, min_ok: int = 30,
                  timeout: float = 90.0) -> Settled:
    """The end of every test, once the clients have stopped and the faults are healed.

    1. ``settle``: every running member applies the same commit index and serves the same
       values from its local state (convergence; a divergence fails here).
    2. A linearizable read of every key, spread over the members; each must return what the
       settled cluster holds. (If the state moved in between, for example because a request
       that a client gave up on was still queued in a member and is applied late, which
       linearizability allows, both steps are repeated.)
    3. ``check_final_state``: the history plus those final reads is linearizable per key, and
       no acknowledged write is lost.
    """
    history = w.history
    assert w.ok_count >= min_ok, f"too few successful operations\n{diagnostics(w)}"
    assert not [op for op in history.ops if op.status is Status.PENDING], \
        "the workload left requests without an outcome"
    keys = sorted({op.key for op in history.ops})
    for _ in range(3):
        settled = settle(cluster, keys)
        reads = final_reads(cluster, keys)
        moved = [r for r in reads.values() if r.index != settled.index]
        if not moved:
            break
        print(f"the state moved after settling at index {settled.index}: "
              + "; ".join(f"{r.key}: {r}" for r in moved[:3]))
    dump_history(cluster, history, reads)
    wrong = [f"key {k!r}: every member holds {settled.values[k]!r} (Mod-Index "
             f"{settled.mod_index[k]}) at applied index {settled.index}, but the linearizable "
             f"read returned {r}" for k, r in reads.items()
             if r.index == settled.index and r.value != settled.values[k]]
    assert not wrong, "\n".join(wrong)
    assert not moved, (f"the state kept moving after the run: {moved[:3]}\n"
                       f"{_late_writes(cluster, history, reads)}")
    result = check_final_state(history, {k: r.value for k, r in reads.items()},
                               timeout=timeout)
    assert result.ok, (f"{diagnostics(w)}\n{result.explain()}\n"
                       f"{_late_writes(cluster, history, reads)}")
    print(f"{w.summary()}; {len(history)} operations: {result.verdict} "
          f"(checked in {result.elapsed:.2f}s); all {len(cluster.members)} members settled "
          f"at index {settled.index}")
    return settled


def dump_history(cluster: LocalCluster, history: History,
                 reads: dict[str, FinalRead] | None = None) -> None:
    """Write every operation (with its target member) to ``<cluster root>/history.txt``, next
    to the members' logs, for a post-mortem."""
    t0 = min((op.invoke for op in history.ops), default=0.0)
    members = {node.url: name for name, node in cluster.nodes.items()}
    targets = history.targets if isinstance(history, TracedHistory) else {}
    with open(cluster.root / "history.txt", "w") as f:
        f.write(f"# t0 = {t0:.3f} (time.monotonic); times below are seconds after t0\n")
        for op in history.ops:
            end = "-" if op.complete is None else f"{op.complete - t0:.3f}"
            f.write(f"{op.invoke - t0:9.3f} {end:>9} {members.get(targets.get(op.id, ''), '?'):4}"
                    f" {op}\n")
        for r in (reads or {}).values():
            f.write(f"{r.at - t0:9.3f} final read of {r.key!r}: {r}\n")


def _late_writes(cluster: LocalCluster, history: History, reads: dict[str, FinalRead]) -> str:
    """For each final value: the recorded operations that wrote it, where they were sent and
    when (seconds after the first operation); a value written by an operation the client gave
    up on long before is a request that was applied late."""
    t0 = min((op.invoke for op in history.ops), default=0.0)
    members = {node.url: name for name, node in cluster.nodes.items()}
    targets = history.targets if isinstance(history, TracedHistory) else {}
    lines = []
    for key, r in reads.items():
        for op in history.ops:
            if op.key == key and op.kind in (Kind.PUT, Kind.CAS) and op.value == r.value \
                    and r.value is not None:
                end = "-" if op.complete is None else f"{op.complete - t0:.3f}"
                lines.append(f"  final {key!r} = {r} at {r.at - t0:.3f}, written by {op} [sent "
                             f"to {members.get(targets.get(op.id, ''), '?')}, invoked "
                             f"{op.invoke - t0:.3f}, done {end}]")
    return "final values and their writers:\n" + "\n".join(lines)
