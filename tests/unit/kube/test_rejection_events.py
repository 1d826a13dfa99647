"""Refused objects reach the cluster as Warning Events (through the lab API server, the real
client) and /healthz's details, without making the node unhealthy."""
from __future__ import annotations

import threading
import time

from kubernetes import client

from netagent.infra.metrics import Registry
from netagent.infra.rejections import ObjectRef
from netagent.infra.status_server import HealthReport
from netagent.daemon.rejection_reports import EVENT_REASON, build_rejections, with_rejections
from netagent.kube.events import OVERALL, PER_OBJECT, BucketLimit, EventPoster
from tests.unit.lab.kube_apiserver_support import SETTLE, api_client, core, server  # noqa: F401 (fixtures)


def _events(core_api, namespace: str) -> list:
    return core_api.list_namespaced_event(namespace).items


def _wait_events(core_api, namespace: str, count: int) -> list:
    deadline = time.monotonic() + SETTLE
    while time.monotonic() < deadline:
        items = _events(core_api, namespace)
        if len(items) >= count:
            return items
        time.sleep(0.05)
    return _events(core_api, namespace)


def test_a_rejection_posts_one_warning_event_on_the_object(api_client, core) -> None:  # noqa: F811
    rejections, poster = build_rejections(Registry(), api_client=api_client, node_name="node-1")
    try:
        scope = rejections.scope("proxy")
        ref = ObjectRef.of("Service", {"metadata": {"namespace": "default", "name": "web\nx", "uid": "u-1"}})
        scope.reject(ref, reason="too-large", detail="70000 ports; the limit is 1000")
        scope.reject(ref, reason="too-large", detail="70000 ports; the limit is 1000")  # unchanged: no 2nd Event
        scope.reject(ObjectRef.of("Node", {"metadata": {"name": "thief"}}), reason="conflict", detail="MAC")
        default = _wait_events(core, "default", 2)
    finally:
        poster.stop()
    assert len(default) == 2, [e.message for e in default]
    by_kind = {e.involved_object.kind: e for e in default}
    service_event = by_kind["Service"]
    assert (service_event.type, service_event.reason) == ("Warning", EVENT_REASON)
    assert service_event.involved_object.uid == "u-1" and service_event.involved_object.name == "web\nx"
    assert service_event.message == "proxy: too-large: 70000 ports; the limit is 1000"
    assert service_event.source.host == "node-1"
    assert by_kind["Node"].involved_object.namespace in (None, "")
    assert poster.posted == 2 and poster.dropped == 0


def test_the_poster_never_blocks_and_drops_past_its_capacity() -> None:
    release, sent = threading.Event(), []

    def stuck_send(namespace: str, body: dict) -> None:  # an API server that does not answer
        release.wait(SETTLE)
        sent.append(body["involvedObject"]["name"])
    poster = EventPoster(None, component="netagent", host="n", capacity=2, send=stuck_send)
    for index in range(6):
        poster.post(ObjectRef("Node", "", f"n{index}"), reason="R", message="m")  # returns at once
    release.set()
    poster.stop()
    assert poster.dropped >= 3 and len(sent) == 6 - poster.dropped and sent[0] == "n0"


def test_health_lists_rejections_and_stays_healthy() -> None:
    rejections, poster = build_rejections(Registry(), api_client=None, node_name="n")
    poster.stop()
    health = with_rejections(lambda: HealthReport(True, "synced", {"routes": 3}), rejections)
    assert health().details == {"routes": 3}
    rejections.scope("policy").reject(ObjectRef("NetworkPolicy", "ns", "p"), reason="malformed", detail="bad")
    report = health()
    assert report.healthy and report.details["routes"] == 3
    assert report.details["rejected_objects"] == ["policy: NetworkPolicy ns/p rejected (malformed): bad"]


def test_updates_of_a_malformed_service_with_a_changing_detail_post_one_event(api_client, core) -> None:  # noqa: F811
    """Through the lab API server: 50 rejections of one Service, each with another detail (an
    update per second of a malformed Service), are one Event; before, one per update."""
    rejections, poster = build_rejections(Registry(), api_client=api_client, node_name="node-1")
    try:
        scope = rejections.scope("proxy")
        ref = ObjectRef.of("Service", {"metadata": {"namespace": "default", "name": "web", "uid": "u-1"}})
        for update in range(50):
            scope.reject(ref, reason="malformed", detail=f"spec.ports[0].port: {70000 + update} is not a port")
        time.sleep(0.2)
        default = _wait_events(core, "default", 1)
    finally:
        poster.stop()
    assert [e.message for e in default] == ["proxy: malformed: spec.ports[0].port: 70000 is not a port"]
    assert (poster.posted, poster.suppressed) == (1, 49)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def recording_poster(**kwargs) -> tuple[EventPoster, list[dict], Clock]:
    sent: list[dict] = []
    clock = Clock()
    poster = EventPoster(None, component="netagent", host="n", send=lambda namespace, body: sent.append(body),
                         clock=clock, **kwargs)
    return poster, sent, clock


def test_a_repeat_of_object_and_reason_is_suppressed_and_counted_in_the_next_event() -> None:
    poster, sent, clock = recording_poster()
    web = ObjectRef("Service", "default", "web", "u-1")
    for update in range(100):
        poster.post(web, reason=EVENT_REASON, message=f"detail {update}")
    poster.post(ObjectRef("Service", "default", "other"), reason=EVENT_REASON, message="x")   # another object
    poster.post(web, reason="OtherReason", message="y")                                      # another reason
    clock.now += 599.0
    poster.post(web, reason=EVENT_REASON, message="still inside the window")
    clock.now += 2.0
    poster.post(web, reason=EVENT_REASON, message="detail 101")
    poster.stop()
    ours = [(e["involvedObject"]["name"], e["reason"], e["message"], e["count"]) for e in sent]
    assert ours == [("web", EVENT_REASON, "detail 0", 1), ("other", EVENT_REASON, "x", 1), ("web", "OtherReason", "y", 1),
                    ("web", EVENT_REASON, "detail 101", 101)]   # 99 + 1 suppressed, then this one
    assert sent[-1]["firstTimestamp"] <= sent[-1]["lastTimestamp"]
    assert (poster.posted, poster.suppressed, poster.rate_limited) == (4, 100, 0)


def test_events_are_rate_limited_per_object_and_overall() -> None:
    # per object: dedup off (every message a new reason), the object's bucket bounds them
    poster, sent, clock = recording_poster(per_object=BucketLimit(5, 300.0))
    web = ObjectRef("Service", "default", "web")
    for update in range(100):
        poster.post(web, reason=f"R{update}", message="m")
    assert poster.rate_limited == 95
    clock.now += 300.0
    for update in range(100, 110):
        poster.post(web, reason=f"R{update}", message="m")
    poster.stop()
    assert len(sent) == 6 and poster.rate_limited == 95 + 9
    # overall: many objects (a tenant's malformed Services), the process's bucket bounds them
    poster, sent, clock = recording_poster()
    for index in range(1000):
        poster.post(ObjectRef("Service", "t", f"s{index}"), reason=EVENT_REASON, message="m")
    clock.now += OVERALL.refill_every
    poster.post(ObjectRef("Service", "t", "late"), reason=EVENT_REASON, message="m")
    poster.stop()
    assert len(sent) == OVERALL.burst + 1 and sent[-1]["involvedObject"]["name"] == "late"
    assert PER_OBJECT.refill_every == 300.0 and OVERALL.burst <= 25   # the documented limits


def test_a_rate_limited_event_is_not_remembered_as_posted() -> None:
    poster, sent, clock = recording_poster(overall=BucketLimit(1, 10.0))
    poster.post(ObjectRef("Service", "t", "a"), reason=EVENT_REASON, message="m")
    poster.post(ObjectRef("Service", "t", "b"), reason=EVENT_REASON, message="first try")   # no token left
    clock.now += 10.0
    poster.post(ObjectRef("Service", "t", "b"), reason=EVENT_REASON, message="second try")
    poster.stop()
    assert [(e["involvedObject"]["name"], e["message"], e["count"]) for e in sent] == [
        ("a", "m", 1), ("b", "second try", 2)]
