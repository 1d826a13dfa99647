"""The proxy core against the Kubernetes API test server, with a recording backend.

Checks the seams: nothing is programmed before Services, EndpointSlices and the Node have
all listed; the first sync is full, later ones are partial and name exactly the changed
service ports; a failed sync makes the next one full; trigger times become
network_programming_duration_seconds; health-check node ports answer as kube-proxy's.
"""
from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

import pytest
from kubernetes import client

from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncKind
from netagent.kube.changes import ChangeRecorder, FanOut
from netagent.kube.reflector import Reflector
from netagent.kube.resources import ENDPOINT_SLICES, NODES, SERVICES
from proxy.backend import BackendSyncReport, ProgrammedService, ProxyBackend, ProxyMode
from proxy.catalog import ServiceCatalog
from proxy.healthcheck import HealthCheckAnswer, HealthCheckPorts
from proxy.model import NodeContext, ServicePortName
from proxy.service_proxy import NodeSource, ProxySettings, ServiceProxy, health_check_answers
from tests.unit.project.free_ports import ports_below_the_ephemeral_range
from tests.unit.proxy.proxy_objects import endpoint, endpoint_slice, service

WEB = ServicePortName("default", "web", "http")


class RecordingBackend(ProxyBackend):
    mode = ProxyMode.IPTABLES

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.fail_next = False

    def sync(self, state, *, changed):
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("injected failure")
        self.calls.append((state, changed))
        return BackendSyncReport(scope=SyncKind.FULL if changed is None else SyncKind.PARTIAL,
                                 services_written=len(state.services) if changed is None else len(changed),
                                 rules=sum(len(e) for e in state.endpoints.values()))

    def programmed(self) -> list[ProgrammedService]:
        return []

    def cleanup(self) -> None:
        pass


def wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def node(name="node-a", zone="zone-1"):
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"topology.kubernetes.io/zone": zone}}}


@pytest.fixture
def server(lab_api_servers):
    return lab_api_servers(bookmark_interval=0.5)


@pytest.fixture
def make_proxy(server):
    made = []

    def make(node_source=NodeSource.OWN_WATCH, **settings):
        backend = RecordingBackend()
        registry = Registry()
        proxy = ServiceProxy(api_client=client.ApiClient(client.Configuration(host=server.url)),
                             settings=ProxySettings(node_name="node-a", min_sync_period=0.05, sync_period=3600,
                                                    retry_period=0.05, **settings),
                             backend=backend, registry=registry, node_source=node_source)
        made.append(proxy)
        return proxy, backend, registry

    yield make
    for proxy in made:
        proxy.stop()


def test_recorder_collapses_changes_per_object():
    pokes = []
    recorder = ChangeRecorder("services", on_change=lambda: pokes.append(1))
    first, second = service("a"), service("a", cluster_ip="10.96.0.11")
    recorder.on_add(first)
    recorder.on_update(first, second)
    recorder.on_add(service("b"))
    recorder.on_delete(service("b"))
    assert recorder.drain() == {"default/a": (None, second)} and len(pokes) == 4
    recorder.on_update(first, second)
    recorder.on_delete(second)
    assert recorder.drain() == {"default/a": (first, None)} and recorder.drain() == {}


def test_catalog_reports_only_the_changed_service_ports():
    catalog = ServiceCatalog(NodeContext(name="node-a"))
    other = ServicePortName("default", "db", "")
    update = catalog.apply({"default/web": (None, service("web")),
                            "default/db": (None, service("db", cluster_ip="10.96.0.11", ports=[{"port": 5432}]))},
                           {"default/web-1": (None, endpoint_slice("web-1", "web", [endpoint("10.244.1.5")]))})
    assert update.changed == {WEB, other} and [e.ip for e in update.state.endpoints_of(WEB)] == ["10.244.1.5"]
    moved = endpoint_slice("web-1", "db", [endpoint("10.244.1.5")], ports=[{"port": 5432}])
    update = catalog.apply({}, {"default/web-1": (None, moved)})
    assert update.changed == {WEB, other} and update.state.endpoints_of(WEB) == ()
    assert catalog.apply({}, {"default/web-1": (None, moved)}).changed == frozenset()
    update = catalog.apply({"default/db": (None, None)}, {})
    assert update.changed == {other} and other not in update.state.services


def test_nothing_is_programmed_before_every_source_listed(make_proxy):
    proxy, backend, _ = make_proxy()
    proxy.runner.start()  # the reflectors stay off: the test plays their part
    proxy.services.on_add(service("web"))
    proxy.services.on_synced()
    proxy.slices.on_add(endpoint_slice("web-1", "web", [endpoint("10.244.1.5")]))
    proxy.slices.on_synced()
    time.sleep(0.3)
    assert backend.calls == [] and not proxy.synced
    proxy.node.on_add(node())
    proxy.node.on_synced()
    wait_for(lambda: backend.calls)
    state, changed = backend.calls[0]
    assert changed is None and state.node.zone == "zone-1"
    assert [e.address for e in state.endpoints_of(WEB)] == ["10.244.1.5:8080"]


def test_partial_syncs_name_the_changed_ports_and_a_failure_makes_the_next_full(server, make_proxy):
    server.create(node())
    server.create(service("web"))
    server.create(service("db", cluster_ip="10.96.0.11", ports=[{"name": "pg", "port": 5432}]))
    proxy, backend, registry = make_proxy()
    proxy.start()
    wait_for(lambda: backend.calls)
    server.create(endpoint_slice("web-1", "web", [endpoint("10.244.1.5")], trigger_time="2026-01-01T00:00:00Z"))
    wait_for(lambda: len(backend.calls) >= 2)
    state, changed = backend.calls[-1]
    assert changed == {WEB} and state.endpoints_of(WEB)
    # the proxy records a run's metrics after the backend returns: wait for them, not for the call
    wait_for(lambda: "kubeproxy_network_programming_duration_seconds_count 1" in registry.render())
    backend.fail_next = True
    server.delete(SERVICES, "db", namespace="default")
    wait_for(lambda: len(backend.calls) >= 3)
    state, changed = backend.calls[-1]
    assert changed is None and ServicePortName("default", "db", "pg") not in state.services
    wait_for(lambda: "kubeproxy_sync_full_proxy_rules_duration_seconds_count 2" in registry.render())
    metrics = registry.render()
    assert "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures_total 1" in metrics


def test_services_of_another_proxy_and_headless_slices_are_not_watched(server, make_proxy):
    server.create(node())
    server.create(service("theirs", cluster_ip="10.96.0.99",
                          labels={"service.kubernetes.io/service-proxy-name": "other"}))
    headless = endpoint_slice("h-1", "web", [endpoint("10.244.1.7")])
    headless["metadata"]["labels"]["service.kubernetes.io/headless"] = ""
    server.create(headless)
    server.create(service("web"))
    proxy, backend, _ = make_proxy()
    proxy.start()
    wait_for(lambda: backend.calls)
    state, _ = backend.calls[0]
    assert list(state.services) == [WEB] and state.endpoints_of(WEB) == ()


def test_a_shared_node_watch_gives_the_proxy_only_its_own_node(server, make_proxy):
    server.create(node("node-b", zone="zone-9"))
    server.create(node(zone="zone-2"))
    server.create(service("web"))
    proxy, backend, _ = make_proxy(node_source=NodeSource.SHARED)
    assert [r.resource for r in proxy.reflectors] == [SERVICES, ENDPOINT_SLICES]
    every_node = ChangeRecorder("nodes")
    shared = Reflector(api_client=client.ApiClient(client.Configuration(host=server.url)), resource=NODES,
                       handler=FanOut(every_node, proxy.node))
    proxy.start()
    shared.start()
    try:
        wait_for(lambda: backend.calls)
        assert backend.calls[0][0].node.zone == "zone-2"
        assert every_node.drain().keys() == {"node-a", "node-b"}
        own_changes = proxy.node.total_changes
        server.update(node("node-b", zone="zone-8"))
        wait_for(lambda: every_node.pending())
        assert proxy.node.total_changes == own_changes
        server.update(node(zone="zone-3"))
        wait_for(lambda: backend.calls[-1][0].node.zone == "zone-3")
    finally:
        shared.stop()


def free_port() -> int:
    """A port free now that no ephemeral allocation can take before HealthCheckPorts binds it."""
    for port in ports_below_the_ephemeral_range():
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below the ephemeral range")


def fetch(port: int) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_health_check_ports_answer_with_local_endpoint_counts(monkeypatch):
    def no_lookup(*args):  # opening a port must not wait on DNS (HTTPServer's getfqdn)
        raise AssertionError(f"a name lookup happened: {args}")

    monkeypatch.setattr(socket, "getfqdn", no_lookup)
    monkeypatch.setattr(socket, "gethostbyaddr", no_lookup)
    ports = HealthCheckPorts(bind_address="127.0.0.1")
    port = free_port()
    try:
        ports.sync({port: HealthCheckAnswer("default", "lb", 2)})
        assert fetch(port) == (200, {"service": {"namespace": "default", "name": "lb"}, "localEndpoints": 2,
                                     "serviceProxyHealthy": True})
        ports.sync({port: HealthCheckAnswer("default", "lb", 0)})
        assert fetch(port)[0] == 503
        ports.sync({})
        with pytest.raises(OSError):
            fetch(port)
    finally:
        ports.close()


def test_health_check_answers_count_distinct_local_ready_endpoints():
    catalog = ServiceCatalog(NodeContext(name="node-a"))
    lb = service("lb", kind="LoadBalancer", externalTrafficPolicy="Local", healthCheckNodePort=31000,
                 ports=[{"name": "a", "port": 80, "nodePort": 30080}, {"name": "b", "port": 81, "nodePort": 30081}])
    slice_ = endpoint_slice("lb-1", "lb", [endpoint("10.244.1.5"), endpoint("10.244.1.6", ready=False),
                                           endpoint("10.244.2.5", node="node-b")],
                            ports=[{"name": "a", "port": 8080}, {"name": "b", "port": 8081}])
    update = catalog.apply({"default/lb": (None, lb)}, {"default/lb-1": (None, slice_)})
    assert health_check_answers(update.state) == {31000: HealthCheckAnswer("default", "lb", 1)}


def test_status_services_asks_the_running_agent_first():
    from netagent.daemon.status_services import services_json, status_services
    from netagent.infra.status_server import HealthReport, StatusServer
    listing = [ProgrammedService(name="default/web:http", address="10.96.0.10:80/TCP", kind="ClusterIP",
                                 backends=("10.244.1.5:8080",))]
    server = StatusServer(bind="127.0.0.1:0", registry=Registry(), health=lambda: HealthReport(True, "ok"),
                          pages={"/services": ("application/json", lambda: services_json(ProxyMode.IPTABLES, listing))})
    server.start()
    try:
        url = f"http://127.0.0.1:{server.port}/services"
        assert json.loads(status_services(as_json=True, agent_url=url)) == {
            "mode": "iptables", "source": "agent", "services": [
                {"name": "default/web:http", "address": "10.96.0.10:80/TCP", "kind": "ClusterIP",
                 "backends": ["10.244.1.5:8080"]}]}
        text = status_services(agent_url=url)
        assert text.splitlines()[1].split() == ["default/web:http", "ClusterIP", "10.96.0.10:80/TCP", "->",
                                                "10.244.1.5:8080"]
    finally:
        server.stop()


def test_requeued_changes_keep_their_previous_and_take_a_newer_current():
    from netagent.kube.changes import ChangeRecorder
    recorder = ChangeRecorder("t")
    a1 = {"metadata": {"name": "a", "resourceVersion": "1"}}
    a2 = {"metadata": {"name": "a", "resourceVersion": "2"}}
    b = {"metadata": {"name": "b"}}
    recorder.on_add(a1)
    recorder.on_add(b)
    unapplied = recorder.drain()
    recorder.on_update(a1, a2)   # recorded while the failed sync ran
    recorder.on_delete(b)
    recorder.requeue(unapplied)
    assert recorder.drain() == {"a": (None, a2)}   # b: added then deleted, nothing to apply
