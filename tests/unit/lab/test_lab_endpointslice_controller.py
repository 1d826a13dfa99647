"""The lab's EndpointSlice controller against an in-process API server.

Most tests drive it step by step (`attach()`, write, `run_pending()`) with a fake clock, so
each asserts exactly what one round writes; the last ones run it on its thread behind the
HTTP interface and across a server restart, as the lab does.
"""
from __future__ import annotations

import time

import pytest

from lab import endpointslices, pod_objects
from lab.apiclient import LabApiClient
from lab.apiserver import ApiServer, Subresource
from lab.endpointslice_controller import EndpointSliceController, format_trigger_time
from netagent.infra.fake_clock import FakeClock
from netagent.kube.resources import ENDPOINT_SLICES, NODES, PODS, SERVICES

SERVICE_LABEL = endpointslices.SERVICE_NAME_LABEL


@pytest.fixture
def server():
    with ApiServer() as api:
        api.create({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": "n1", "labels": {"topology.kubernetes.io/zone": "zone-a"}}})
        api.create({"apiVersion": "v1", "kind": "Node",
                    "metadata": {"name": "n2", "labels": {"topology.kubernetes.io/zone": "zone-b"}}})
        yield api


@pytest.fixture
def clock():
    return FakeClock(start=1_700_000_000.0, wall_offset=0.0)


@pytest.fixture
def controller(server, clock):
    controller = EndpointSliceController(server.store, clock=clock)
    controller.attach()
    assert controller.run_pending() == 0
    yield controller
    controller.detach()


def service(name: str = "web", *, selector: dict | None = None, ports: list | None = None,
            namespace: str = "default", **spec) -> dict:
    body = {"ports": ports or [{"name": "http", "port": 80, "targetPort": "http"}], **spec}
    if selector is not None:
        body["selector"] = selector
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": namespace}, "spec": body}


def pod(name: str, ip: str, *, labels: dict | None = None, node: str = "n1", ports: dict | None = None,
        namespace: str = "default", ready: bool = True) -> dict:
    return pod_objects.render_pod(name, namespace=namespace, node=node, host_ip="192.0.2.1", pod_ip=ip,
                                  labels={"app": "web"} if labels is None else labels,
                                  ports=pod_objects.normalize_ports({"http": 8080} if ports is None else ports),
                                  ready=ready)


def slices_of(server: ApiServer, name: str = "web", namespace: str = "default") -> list[dict]:
    return sorted(server.list(ENDPOINT_SLICES, namespace=namespace, label_selector=f"{SERVICE_LABEL}={name}"),
                  key=lambda s: s["metadata"]["name"])


def endpoints_by_ip(server: ApiServer, name: str = "web") -> dict[str, tuple[dict, list]]:
    """ip -> (endpoint, ports of its slice)."""
    return {e["addresses"][0]: (e, s["ports"]) for s in slices_of(server, name) for e in s["endpoints"]}


def test_a_service_without_matching_pods_gets_one_placeholder_slice(server, controller):
    server.create(service(selector={"app": "web"}))
    controller.run_pending()
    (placeholder,) = slices_of(server)
    assert placeholder["endpoints"] == [] and placeholder["ports"] == []
    assert placeholder["addressType"] == "IPv4"
    labels = placeholder["metadata"]["labels"]
    assert labels[SERVICE_LABEL] == "web"
    assert labels[endpointslices.MANAGED_BY_LABEL] == endpointslices.MANAGED_BY
    owner = placeholder["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("Service", "web", True)


def test_endpoints_are_the_matching_pods_of_the_namespace_with_an_address(server, controller):
    server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "other"}})
    server.create(service(selector={"app": "web"}))
    server.create(pod("web-1", "10.244.1.2", node="n1"))
    server.create(pod("web-2", "10.244.2.2", labels={"app": "web", "extra": "yes"}, node="n2"))
    server.create(pod("db-1", "10.244.1.3", labels={"app": "db"}))
    server.create(pod("web-elsewhere", "10.244.1.4", namespace="other"))
    no_address = pod("web-starting", "10.244.1.5")
    no_address["status"].pop("podIP")
    no_address["status"].pop("podIPs")
    server.create(no_address)
    finished = pod("web-done", "10.244.1.6")
    finished["status"]["phase"] = "Succeeded"
    server.create(finished)
    controller.run_pending()
    found = endpoints_by_ip(server)
    assert sorted(found) == ["10.244.1.2", "10.244.2.2"]
    endpoint, ports = found["10.244.2.2"]
    assert endpoint["nodeName"] == "n2" and endpoint["zone"] == "zone-b"
    assert endpoint["targetRef"]["name"] == "web-2" and endpoint["targetRef"]["kind"] == "Pod"
    assert endpoint["conditions"] == {"ready": True, "serving": True, "terminating": False}
    assert ports == [{"name": "http", "protocol": "TCP", "port": 8080}]
    assert "hints" not in endpoint
    assert len(slices_of(server)) == 1  # the placeholder went once there were endpoints


def test_named_target_ports_resolve_per_pod_into_separate_slices(server, controller):
    server.create(service(selector={"app": "web"}, ports=[
        {"name": "http", "port": 80, "targetPort": "http"},
        {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": "dns"},
        {"name": "fixed", "port": 9000, "targetPort": 9001},
    ]))
    server.create(pod("a", "10.244.1.2", ports={"http": 8080, "dns": (5353, "UDP")}))
    server.create(pod("b", "10.244.1.3", ports={"http": 8080, "dns": (5353, "UDP")}))
    server.create(pod("c", "10.244.1.4", ports={"http": 9090, "dns": (5353, "UDP")}))
    server.create(pod("d", "10.244.1.5", ports={"http": 8080, "dns": (5353, "TCP")}))  # dns: wrong protocol
    controller.run_pending()
    by_ports = {tuple((p["name"], p["port"]) for p in s["ports"]): sorted(e["addresses"][0] for e in s["endpoints"])
                for s in slices_of(server)}
    assert by_ports == {
        (("http", 8080), ("dns", 5353), ("fixed", 9001)): ["10.244.1.2", "10.244.1.3"],
        (("http", 9090), ("dns", 5353), ("fixed", 9001)): ["10.244.1.4"],
        (("http", 8080), ("fixed", 9001)): ["10.244.1.5"],
    }


def test_a_pod_resolving_no_port_is_published_without_ports(server, controller):
    server.create(service(selector={"app": "web"}))
    server.create(pod("a", "10.244.1.2", ports={"metrics": 9100}))
    controller.run_pending()
    (only,) = slices_of(server)
    assert only["ports"] == [] and [e["addresses"][0] for e in only["endpoints"]] == ["10.244.1.2"]


def test_readiness_and_termination_conditions(server, controller):
    server.create(service(selector={"app": "web"}))
    server.create(pod("a", "10.244.1.2"))
    server.create(pod("b", "10.244.1.3"))
    controller.run_pending()
    patch = pod_objects.with_readiness(server.get(PODS, "a", namespace="default"), ready=False)
    server.patch(PODS, "a", patch, namespace="default", part=Subresource.STATUS)
    server.delete(PODS, "b", namespace="default", grace_period_seconds=30)
    controller.run_pending()
    found = endpoints_by_ip(server)
    assert found["10.244.1.2"][0]["conditions"] == {"ready": False, "serving": False, "terminating": False}
    assert found["10.244.1.3"][0]["conditions"] == {"ready": False, "serving": True, "terminating": True}
    server.delete(PODS, "b", namespace="default")
    controller.run_pending()
    assert sorted(endpoints_by_ip(server)) == ["10.244.1.2"]


def test_publish_not_ready_addresses_marks_every_endpoint_ready(server, controller):
    server.create(service(selector={"app": "web"}, publishNotReadyAddresses=True))
    server.create(pod("a", "10.244.1.2", ready=False))
    controller.run_pending()
    assert endpoints_by_ip(server)["10.244.1.2"][0]["conditions"] == {"ready": True, "serving": False,
                                                                     "terminating": False}


def test_trigger_time_is_the_earliest_unpublished_change(server, controller, clock):
    server.create(service(selector={"app": "web"}))
    controller.run_pending()
    first = clock.advance(5)
    server.create(pod("a", "10.244.1.2"))
    clock.advance(3)
    server.create(pod("b", "10.244.1.3"))
    controller.run_pending()
    (written,) = slices_of(server)
    annotation = written["metadata"]["annotations"][endpointslices.TRIGGER_TIME_ANNOTATION]
    assert annotation == format_trigger_time(first)
    later = clock.advance(10)
    server.delete(PODS, "a", namespace="default")
    controller.run_pending()
    (written,) = slices_of(server)
    assert written["metadata"]["annotations"][endpointslices.TRIGGER_TIME_ANNOTATION] == format_trigger_time(later)
    assert format_trigger_time(1_700_000_000.25) == "2023-11-14T22:13:20.250000Z"


def test_nothing_is_written_when_nothing_changed(server, controller):
    server.create(service(selector={"app": "web"}))
    server.create(pod("a", "10.244.1.2"))
    controller.run_pending()
    revision = server.resource_version
    writes = controller.writes
    server.patch(PODS, "a", {"metadata": {"annotations": {"note": "irrelevant"}}}, namespace="default")
    server.patch(PODS, "a", {"metadata": {"labels": {"app": "web", "more": "labels"}}}, namespace="default")
    controller.run_pending()
    assert controller.writes == writes
    assert server.resource_version == revision + 2  # the two pod patches, no slice write
    restarted = EndpointSliceController(server.store)
    restarted.attach()  # a fresh start-up sync of the same state
    controller.detach()
    restarted.run_pending()
    assert restarted.writes == 0 and restarted.syncs >= 1
    restarted.detach()


def test_services_without_a_selector_are_left_to_their_users(server, controller):
    server.create(service("manual"))
    user_slice = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                  "metadata": {"name": "manual-1", "labels": {SERVICE_LABEL: "manual"}},
                  "addressType": "IPv4", "endpoints": [{"addresses": ["192.0.2.10"]}],
                  "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    server.create(user_slice)
    server.create(pod("a", "10.244.1.2"))
    controller.run_pending()
    assert [s["metadata"]["name"] for s in slices_of(server, "manual")] == ["manual-1"]
    # a selector Service that loses its selector loses the slices we made, never the users'
    server.create(service(selector={"app": "web"}))
    controller.run_pending()
    server.create({**user_slice, "metadata": {"name": "web-by-hand", "labels": {SERVICE_LABEL: "web"}}})
    assert len(slices_of(server)) == 2
    web = server.get(SERVICES, "web", namespace="default")
    del web["spec"]["selector"]
    server.update(web)
    controller.run_pending()
    assert [s["metadata"]["name"] for s in slices_of(server)] == ["web-by-hand"]


def test_deleting_a_service_deletes_its_managed_slices(server, controller):
    server.create(service(selector={"app": "web"}))
    server.create(pod("a", "10.244.1.2"))
    controller.run_pending()
    assert slices_of(server)
    server.delete(SERVICES, "web", namespace="default")
    controller.run_pending()
    assert slices_of(server) == []


def test_at_most_100_endpoints_per_slice_and_one_write_per_change(server, controller):
    server.create(service(selector={"app": "web"}))
    for index in range(150):
        server.create(pod(f"p{index}", f"10.244.{1 + index // 200}.{10 + index % 200}"))
    controller.run_pending()
    sizes = sorted(len(s["endpoints"]) for s in slices_of(server))
    assert sizes == [50, 100]
    before = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices_of(server)}
    writes = controller.writes
    server.delete(PODS, "p3", namespace="default")
    server.create(pod("p-new", "10.244.9.9"))
    controller.run_pending()
    after = {s["metadata"]["name"]: s["metadata"]["resourceVersion"] for s in slices_of(server)}
    assert before.keys() == after.keys()
    assert controller.writes - writes == 1  # the slice that lost p3 took the newcomer
    assert sum(before[name] != after[name] for name in before) == 1
    assert sum(len(s["endpoints"]) for s in slices_of(server)) == 150


def test_prefer_close_gives_each_endpoint_its_own_zone_as_hint(server, controller):
    server.create(service(selector={"app": "web"}, trafficDistribution="PreferClose"))
    server.create(pod("a", "10.244.1.2", node="n1"))
    server.create(pod("b", "10.244.2.2", node="n2"))
    controller.run_pending()
    found = endpoints_by_ip(server)
    assert found["10.244.1.2"][0]["hints"] == {"forZones": [{"name": "zone-a"}]}
    assert found["10.244.2.2"][0]["hints"] == {"forZones": [{"name": "zone-b"}]}
    node = server.get(NODES, "n2")
    node["metadata"]["labels"]["topology.kubernetes.io/zone"] = "zone-c"
    server.update(node)
    controller.run_pending()
    assert endpoints_by_ip(server)["10.244.2.2"][0]["hints"] == {"forZones": [{"name": "zone-c"}]}


def test_headless_services_get_the_headless_label(server, controller):
    server.create(service("db", selector={"app": "web"}, clusterIP="None"))
    server.create(pod("a", "10.244.1.2"))
    controller.run_pending()
    (only,) = slices_of(server, "db")
    assert only["metadata"]["labels"][endpointslices.HEADLESS_LABEL] == ""


def test_a_tampered_managed_slice_is_repaired_without_a_trigger_time(server, controller, clock):
    server.create(service(selector={"app": "web"}))
    server.create(pod("a", "10.244.1.2"))
    controller.run_pending()
    (managed,) = slices_of(server)
    managed["endpoints"] = []
    server.update(managed)
    controller.run_pending()
    (repaired,) = slices_of(server)
    assert [e["addresses"][0] for e in repaired["endpoints"]] == ["10.244.1.2"]
    assert endpointslices.TRIGGER_TIME_ANNOTATION not in (repaired["metadata"].get("annotations") or {})
    server.delete(ENDPOINT_SLICES, repaired["metadata"]["name"], namespace="default")
    controller.run_pending()
    assert [e["addresses"][0] for s in slices_of(server) for e in s["endpoints"]] == ["10.244.1.2"]


def wait_until(predicate, *, timeout: float = 30.0):  # generous: never reached when passing
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_thread_follows_writes_made_over_http_and_resumes_after_a_restart(tmp_path):
    state = str(tmp_path / "api.json")
    api = ApiServer(state_file=state)
    controller = EndpointSliceController(api.store)
    controller.start()
    api.start()
    try:
        client = LabApiClient(url=api.url)
        client.create(service(selector={"app": "web"}))
        client.create(pod("a", "10.244.1.2"))
        wait_until(lambda: sorted(endpoints_by_ip(api)) == ["10.244.1.2"])
    finally:
        controller.stop()
        api.stop()
    # offline, the pod goes and a stray managed slice appears; the restarted controller fixes both
    offline = ApiServer(state_file=state)
    offline.delete(PODS, "a", namespace="default")
    managed_by = {endpointslices.MANAGED_BY_LABEL: endpointslices.MANAGED_BY}
    offline.create({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": "gone-x", "labels": {SERVICE_LABEL: "gone", **managed_by}},
                    "addressType": "IPv4", "endpoints": [], "ports": []})
    offline.stop()
    again = ApiServer(state_file=state)
    controller = EndpointSliceController(again.store)
    controller.start()
    try:
        wait_until(lambda: controller.idle() and not slices_of(again, "gone"))
        (placeholder,) = slices_of(again)
        assert placeholder["endpoints"] == []
    finally:
        controller.stop()
        again.stop()
