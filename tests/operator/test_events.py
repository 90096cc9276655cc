"""Events are aggregated as client-go's EventRecorder aggregates them: the same type, reason
and message about the same object again is one Event whose count and lastTimestamp grow, even
after the operator restarted (a new client, with no memory of the counts); against kmock."""

from __future__ import annotations

from typing import Any

from flotilla.operator.kube import Kube

NS = "events"


def cluster(name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": "flotilla.dev/v1alpha1", "kind": "RaftCluster",
            "metadata": {"name": name, "namespace": NS, "uid": uid}}


def posted(api: Kube, name: str) -> list[dict[str, Any]]:
    return sorted((e for e in api.list("Event", NS, "")
                   if e["involvedObject"]["name"] == name), key=lambda e: e["message"])


def test_a_repeated_event_is_one_object_whose_count_and_last_time_grow(kmock_api):
    api = kmock_api
    demo = cluster("demo", "uid-demo")
    api.event(demo, "Warning", "InvalidSpec", "spec.replicas (0) must be at least 1")
    (first,) = posted(api, "demo")
    assert (first["count"], first["type"], first["reason"]) == (1, "Warning", "InvalidSpec")
    assert first["involvedObject"]["uid"] == "uid-demo"
    name = first["metadata"]["name"]
    # as if it had been posted a while ago: the repeat moves lastTimestamp, not firstTimestamp
    api.patch("Event", NS, name, {"firstTimestamp": "2020-01-01T00:00:00Z",
                                  "lastTimestamp": "2020-01-01T00:00:00Z"})
    api.event(demo, "Warning", "InvalidSpec", "spec.replicas (0) must be at least 1")
    (again,) = posted(api, "demo")
    assert again["metadata"]["name"] == name and again["count"] == 2
    assert again["firstTimestamp"] == "2020-01-01T00:00:00Z"
    assert again["lastTimestamp"] > "2020-01-01T00:00:00Z"

    # an operator that restarted counts on from what the API server holds
    restarted = Kube(api.api)
    restarted.event(demo, "Warning", "InvalidSpec", "spec.replicas (0) must be at least 1")
    (third,) = posted(api, "demo")
    assert third["count"] == 3

    # another message, or the same one about another object, is another Event
    api.event(demo, "Warning", "InvalidSpec", "spec.replicas (100) must be at most 99")
    api.event(cluster("other", "uid-other"), "Warning", "InvalidSpec",
              "spec.replicas (0) must be at least 1")
    assert [e["count"] for e in posted(api, "demo")] == [3, 1]
    assert [e["count"] for e in posted(api, "other")] == [1]


def test_an_expired_event_starts_a_new_count(kmock_api):
    api = kmock_api
    demo = cluster("expiring", "uid-expiring")
    for _ in range(2):
        api.event(demo, "Normal", "VotersChanged", "change-voters to a, b, c")
    (event,) = posted(api, "expiring")
    assert event["count"] == 2
    api.delete("Event", NS, event["metadata"]["name"])  # what the API server's TTL does
    api.event(demo, "Normal", "VotersChanged", "change-voters to a, b, c")
    (fresh,) = posted(api, "expiring")
    assert fresh["count"] == 1
