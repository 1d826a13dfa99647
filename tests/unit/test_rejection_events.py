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
from netagent.kube.events import EventPoster
from tests.unit.kube_apiserver_support import SETTLE, api_client, core, server  # noqa: F401 (fixtures)


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
