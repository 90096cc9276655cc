"""The operator's own metrics, from rounds the real planner decides: a cluster's voters, those
that do not answer and its fault tolerance (with a leader, without one, with nobody
answering), steps and failed rounds counted, a deleted cluster's series gone, and an exposition
that `promtool check metrics` passes. `tests/operator/test_kopf_kmock.py` scrapes a running
operator."""

from __future__ import annotations

from typing import Any

from flotilla.operator.memberstatus import MemberStatus
from flotilla.operator.metrics import PHASES, OperatorMetrics, health
from flotilla.operator.planner import Observed, Record, Slot, plan
from flotilla.operator.reconcile import Outcome
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from flotilla import __version__
from tests.harness.promtool import check_metrics

NAMES = ["demo-0", "demo-1", "demo-2", "demo-3", "demo-4"]
WHERE = ("default", "demo")


def member(name: str, voters: list[str], leader: str | None, term: int = 4,
           commit: int = 100) -> MemberStatus:
    doc: dict[str, Any] = {
        "name": name, "member_uid": f"uid-{name}", "term": term, "leader": leader,
        "role": "leader" if name == leader else "follower", "commit_index": commit,
        "last_index": commit, "config": {"voters": voters, "learners": [], "joint": None}}
    if name == leader:
        doc["members"] = {v: {"match_index": commit} for v in voters}
    status = MemberStatus.parse(doc)
    assert status is not None
    return status


def round_of(answering: dict[str, MemberStatus | None], desired: int = 3,
             step_error: str | None = None) -> Outcome:
    """The Outcome of a round that found `answering` (None: running, not answering)."""
    names = NAMES[:max(desired, len(answering))]
    slots = {n: Slot(running=True, status=answering.get(n)) for n in answering}
    result = plan(Observed(desired=desired, size=len(answering), slots=slots, names=names,
                           record=Record(bootstrapped=True,
                                         uids={n: f"uid-{n}" for n in answering}),
                           now=1000.0))
    ready = result.phase == "Ready" and result.degraded is None
    status = {"phase": result.phase,
              "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    return Outcome(status, plan=result, step_error=step_error, statuses=answering)


def test_a_healthy_cluster_has_every_voter_available_and_tolerates_one_failure_of_three():
    voters = NAMES[:3]
    state = health(round_of({n: member(n, voters, "demo-0") for n in voters}), None)
    assert (state.phase, state.voters, state.unavailable, state.ready) == (
        "Ready", tuple(voters), (), True)
    assert state.fault_tolerance == 1


def test_a_voter_that_does_not_answer_is_unavailable_and_five_voters_tolerate_two():
    voters = NAMES[:5]
    answering: dict[str, MemberStatus | None] = {n: member(n, voters, "demo-0") for n in voters}
    answering["demo-3"] = None
    state = health(round_of(answering, desired=5), None)
    assert (len(state.voters), state.unavailable, state.fault_tolerance) == (5, ("demo-3",), 2)
    assert not state.ready


def test_without_a_leader_the_newest_configuration_an_answering_member_holds_counts():
    """Quorum lost: demo-0 alone answers, still naming the old leader it heard from last."""
    voters = NAMES[:3]
    answering: dict[str, MemberStatus | None] = {
        "demo-0": member("demo-0", voters, None, term=5),
        "demo-1": None, "demo-2": None}
    state = health(round_of(answering), None)
    assert state.phase == "Degraded"
    assert (state.voters, state.unavailable) == (tuple(voters), ("demo-1", "demo-2"))


def test_with_nobody_answering_the_voters_last_known_are_all_unavailable():
    voters = NAMES[:3]
    before = health(round_of({n: member(n, voters, "demo-0") for n in voters}), None)
    state = health(round_of(dict.fromkeys(voters)), before)
    assert (state.voters, state.unavailable) == (tuple(voters), tuple(voters))


def test_a_round_that_observed_no_member_keeps_what_the_last_one_knew():
    voters = NAMES[:3]
    before = health(round_of({n: member(n, voters, "demo-0") for n in voters}), None)
    invalid = Outcome({"phase": "Invalid",
                       "conditions": [{"type": "Ready", "status": "False"}]})
    state = health(invalid, before)
    assert (state.phase, state.ready, state.voters, state.unavailable) == (
        "Invalid", False, before.voters, ())


def samples(metrics: OperatorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(metrics.registry).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_rounds_steps_and_clusters_are_exported_and_a_deleted_cluster_leaves_no_series():
    metrics = OperatorMetrics()
    voters = NAMES[:3]
    healthy = {n: member(n, voters, "demo-0") for n in voters}
    metrics.round_done(WHERE, 0.2, round_of(healthy))
    grow = round_of(healthy, desired=5)  # the planner's step: grow the StatefulSet to 5
    assert grow.plan is not None and grow.plan.action.step.value == "resize"
    metrics.round_done(WHERE, 0.3, grow)
    metrics.round_done(WHERE, 0.1, round_of(healthy, desired=5, step_error="refused"))
    metrics.round_failed(WHERE, 2.0)
    metrics.round_done(("team-a", "other"), 0.1, Outcome(
        {"phase": "Invalid", "conditions": [{"type": "Ready", "status": "False"}]}))

    check_metrics(generate_latest(metrics.registry), "the operator's metrics")
    found = samples(metrics)
    cluster = (("namespace", "default"), ("raftcluster", "demo"))
    assert found[("flotilla_operator_reconcile_duration_seconds_count", ())] == 5
    assert found[("flotilla_operator_reconcile_duration_seconds_bucket", (("le", "1.0"),))] == 4
    assert found[("flotilla_operator_reconcile_errors_total", ())] == 2
    assert found[("flotilla_operator_steps_total", (("step", "resize"),))] == 1
    assert found[("flotilla_operator_steps_total", (("step", "add-learner"),))] == 0
    assert found[("flotilla_operator_cluster_voters", cluster)] == 3
    assert found[("flotilla_operator_cluster_unavailable_voters", cluster)] == 0
    assert found[("flotilla_operator_cluster_fault_tolerance", cluster)] == 1
    assert found[("flotilla_operator_cluster_ready", cluster)] == 0  # scaling: not as asked
    phases = {dict(labels)["phase"]: v for (name, labels), v in found.items()
              if name == "flotilla_operator_clusters"}
    assert set(PHASES) <= set(phases)
    assert (phases["Scaling"], phases["Invalid"], phases["Ready"]) == (1, 1, 0)
    assert [dict(labels)["version"] for name, labels in found
            if name == "flotilla_build_info"] == [__version__]
    assert any(name == "process_cpu_seconds_total" for name, _ in found)

    metrics.deleting(WHERE)  # its finalizer runs
    found = samples(metrics)
    assert found[("flotilla_operator_clusters", (("phase", "Deleting"),))] == 1
    assert found[("flotilla_operator_cluster_ready", cluster)] == 0
    metrics.forget(WHERE, "uid-1")  # its finalizer is done
    found = samples(metrics)
    assert not [key for key in found if key[1] == cluster]
    assert found[("flotilla_operator_clusters", (("phase", "Scaling"),))] == 0
    # A round of it that was still running ends: the deleted cluster does not come back...
    metrics.round_done(WHERE, 0.1, round_of(healthy), "uid-1")
    assert not [key for key in samples(metrics) if key[1] == cluster]
    # ...but a new RaftCluster of the same name counts.
    metrics.round_done(WHERE, 0.1, round_of(healthy), "uid-2")
    assert samples(metrics)[("flotilla_operator_cluster_voters", cluster)] == 3
