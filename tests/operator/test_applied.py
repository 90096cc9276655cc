"""What a cluster's daemon keeps of the owned objects it brought in line (`applied.py`): a round
that renders them as before reads and writes none of them; one deleted or edited by someone
else, as its watch event shows, is read and repaired by the next round; an event that comes in
while a round reads the object keeps that round from trusting what it read; and forgetting (the
safety interval) makes the next round read everything. Reconciles against an in-memory API that
records every call."""

from __future__ import annotations

import copy
from typing import Any

from flotilla.operator.applied import Applied
from flotilla.operator.reconcile import reconcile

from tests.operator.test_archivejobs import PatchingKube, merge
from tests.operator.test_spec import body

NS = "prod"
KEPT = {"ConfigMap", "NetworkPolicy", "Service", "PodDisruptionBudget"}


class ReadingKube(PatchingKube):
    """PatchingKube whose reads are recorded too."""

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls.append(("get", kind, name))
        return super().get(kind, namespace, name)


def rounds(kube: ReadingKube, obj: dict[str, Any], applied: Applied | None,
           n: int = 1) -> list[tuple[str, str, str]]:
    """n reconciles (their status merged in as the daemon writes it); the calls they made."""
    first = len(kube.calls)
    for _ in range(n):
        outcome = reconcile(kube, obj, default_image="flotilla:test", applied=applied)
        obj["status"] = merge(obj.get("status") or {}, copy.deepcopy(outcome.status))
    return kube.calls[first:]


def about(calls: list[tuple[str, str, str]], kinds: set[str] = KEPT) -> list[tuple[str, str,
                                                                                str]]:
    return [c for c in calls if c[1] in kinds]


def created_cluster(applied: Applied | None) -> tuple[ReadingKube, dict[str, Any]]:
    kube, obj = ReadingKube(), body({"replicas": 3})
    calls = rounds(kube, obj, applied)
    assert {c[1:] for c in about(calls) if c[0] == "create"} == {
        ("ConfigMap", "demo-bootstrap"), ("NetworkPolicy", "demo"), ("Service", "demo-peers"),
        ("Service", "demo"), ("PodDisruptionBudget", "demo")}
    return kube, obj


def test_rounds_that_render_the_same_objects_neither_read_nor_write_them():
    kube, obj = created_cluster(None)
    applied = Applied()
    calls = rounds(kube, obj, applied)  # a daemon that just started reads them all
    assert sorted(about(calls)) == sorted([
        ("get", "ConfigMap", "demo-bootstrap"), ("get", "NetworkPolicy", "demo"),
        ("get", "Service", "demo-peers"), ("get", "Service", "demo"),
        ("get", "PodDisruptionBudget", "demo")])
    calls = rounds(kube, obj, applied, n=3)
    assert about(calls) == []
    # The StatefulSet is read every round (its size and revision are observed), still only
    # written when it differs; pods and volumes are listed every round.
    assert [c for c in calls if c[1] == "StatefulSet"] == [("get", "StatefulSet", "demo")] * 3
    assert [c[:2] for c in calls].count(("list", "Pod")) == 3


def test_without_what_the_daemon_keeps_every_round_reads_every_object():
    kube, obj = created_cluster(None)
    calls = rounds(kube, obj, None, n=2)
    assert len([c for c in about(calls) if c[0] == "get"]) == 2 * 5
    assert [c for c in about(calls) if c[0] != "get"] == []


def test_an_object_rendered_differently_is_read_and_applied_the_rest_not_even_read():
    applied = Applied()
    kube, obj = created_cluster(applied)
    rounds(kube, obj, applied)
    obj["spec"]["replicas"] = 5  # the budget follows spec.replicas while no member answers
    calls = rounds(kube, obj, applied)
    assert about(calls) == [("get", "PodDisruptionBudget", "demo"),
                            ("patch", "PodDisruptionBudget", "demo")]
    assert kube.objects[("PodDisruptionBudget", NS, "demo")]["spec"]["maxUnavailable"] == 2
    assert about(rounds(kube, obj, applied)) == []


def test_a_deleted_object_is_created_again_by_the_round_its_watch_event_calls_for():
    applied = Applied()
    kube, obj = created_cluster(applied)
    gone = kube.objects.pop(("Service", NS, "demo"))  # `kubectl delete service demo`
    assert applied.observe("Service", gone, deleted=True) is True  # the daemon is woken
    calls = rounds(kube, obj, applied)
    assert about(calls) == [("get", "Service", "demo"), ("create", "Service", "demo")]
    assert kube.objects[("Service", NS, "demo")]["spec"] == gone["spec"]
    assert about(rounds(kube, obj, applied)) == []


def test_an_edited_object_is_put_back_by_the_round_its_watch_event_calls_for():
    applied = Applied()
    kube, obj = created_cluster(applied)
    budget = kube.objects[("PodDisruptionBudget", NS, "demo")]
    budget["spec"]["maxUnavailable"] = 3  # someone loosened the budget
    assert applied.observe("PodDisruptionBudget", budget, deleted=False) is True
    config = kube.objects[("ConfigMap", NS, "demo-bootstrap")]
    config["data"]["initial-cluster-state"] = "existing"
    assert applied.observe("ConfigMap", config, deleted=False) is True
    calls = rounds(kube, obj, applied)
    assert sorted(about(calls)) == [
        ("get", "ConfigMap", "demo-bootstrap"), ("get", "PodDisruptionBudget", "demo"),
        ("patch", "ConfigMap", "demo-bootstrap"), ("patch", "PodDisruptionBudget", "demo")]
    assert kube.objects[("PodDisruptionBudget", NS, "demo")]["spec"]["maxUnavailable"] == 1
    assert kube.objects[("ConfigMap", NS, "demo-bootstrap")]["data"][
        "initial-cluster-state"] == "new"


def test_events_of_an_object_still_in_line_wake_nothing_and_cost_no_read():
    """The event of the operator's own apply, or of the API server filling in its status and
    defaults, shows the object as rendered: nothing to repair."""
    applied = Applied()
    kube, obj = created_cluster(applied)
    budget = copy.deepcopy(kube.objects[("PodDisruptionBudget", NS, "demo")])
    budget["metadata"]["resourceVersion"] = "41"
    budget["spec"]["unhealthyPodEvictionPolicy"] = "IfHealthyBudget"  # a server default
    budget["status"] = {"currentHealthy": 3, "desiredHealthy": 2, "disruptionsAllowed": 1}
    assert applied.observe("PodDisruptionBudget", budget, deleted=False) is False
    assert about(rounds(kube, obj, applied)) == []


def test_an_object_never_brought_in_line_wakes_the_daemon():
    """An event about an object this daemon knows nothing of (it just started, or forgot):
    the next round reads it anyway, and should come soon."""
    service = {"kind": "Service", "metadata": {"name": "demo", "namespace": NS}}
    assert Applied().observe("Service", service, deleted=False) is True


def test_a_round_that_read_an_object_before_an_event_about_it_does_not_trust_the_read():
    applied = Applied()
    kube, _ = created_cluster(None)
    rendered = copy.deepcopy(kube.objects[("Service", NS, "demo")])
    token = applied.token(rendered)  # the round is about to read it...
    edited = copy.deepcopy(rendered)
    edited["spec"]["ports"] = []
    assert applied.observe("Service", edited, deleted=False) is True  # ...someone edits it...
    applied.remember(rendered, token)  # ...and the round, done, would remember what it read
    assert applied.unchanged(rendered) is False
    applied.remember(rendered, applied.token(rendered))  # a later round's read counts
    assert applied.unchanged(rendered) is True


def test_the_echo_of_a_rounds_own_apply_before_it_remembers_costs_no_read_later():
    """The round patches the bootstrap ConfigMap to `existing`; the watch event of that very
    patch may arrive before the round remembers the object. It shows the object as the round
    is making it: the round's read stands, nothing is woken, and the next round reads nothing
    (a scale used to read the ConfigMap again when the echo won that race)."""
    applied = Applied()
    kube, _ = created_cluster(None)
    old = copy.deepcopy(kube.objects[("ConfigMap", NS, "demo-bootstrap")])
    rendered = copy.deepcopy(old)
    rendered["data"]["initial-cluster-state"] = "existing"
    token = applied.token(rendered)  # the round reads the old one and patches it...
    echo = copy.deepcopy(rendered)
    echo["metadata"]["resourceVersion"] = "42"
    assert applied.observe("ConfigMap", echo, deleted=False) is False  # ...its echo...
    applied.remember(rendered, token)  # ...and then the round remembers it
    assert applied.unchanged(rendered) is True
    # Once remembered, an event showing the old state is someone else's edit after all.
    assert applied.observe("ConfigMap", old, deleted=False) is True
    assert applied.unchanged(rendered) is False


def test_after_forgetting_the_next_round_reads_every_object_again():
    applied = Applied()
    kube, obj = created_cluster(applied)
    assert about(rounds(kube, obj, applied)) == []
    applied.forget()  # the safety interval, or a round that failed
    calls = rounds(kube, obj, applied)
    assert len([c for c in about(calls) if c[0] == "get"]) == 5
    assert about(rounds(kube, obj, applied)) == []


def test_an_object_no_longer_rendered_is_read_again_when_it_is_rendered_again():
    applied = Applied()
    kube, obj = created_cluster(applied)
    obj["spec"]["network"] = {"policy": False}
    calls = rounds(kube, obj, applied)
    assert about(calls, {"NetworkPolicy"}) == [("get", "NetworkPolicy", "demo"),
                                               ("delete", "NetworkPolicy", "demo")]
    obj["spec"]["network"] = {"policy": True}  # (its DELETED event lost, say)
    calls = rounds(kube, obj, applied)
    assert about(calls, {"NetworkPolicy"}) == [("get", "NetworkPolicy", "demo"),
                                               ("create", "NetworkPolicy", "demo")]
