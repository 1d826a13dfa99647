"""Every Service and EndpointSlice is untrusted: one bad object is rejected alone, never costs
another its change, and nothing drained is lost (issue 18, items 1 and 4 for Services).

Through the real path short of the API: the proxy's own recorders, `_sync`, the catalog and
a recording backend; the iptables backend's parts are in test_proxy_iptables_limits.py.
"""
from __future__ import annotations

import copy

import pytest

from netagent.infra.metrics import Registry
from netagent.infra.rejections import Rejections
from netagent.infra.sync_runner import SyncKind
from proxy.catalog import ServiceCatalog
from proxy.limits import ProxyLimits
from proxy.model import NodeContext, ServicePortName
from proxy.service_proxy import ProxySettings, ServiceProxy
from tests.unit.proxy.proxy_objects import endpoint, endpoint_slice, service
from tests.unit.proxy.test_service_proxy import RecordingBackend


def web(name: str, ip: str = "10.96.0.10", **kwargs) -> dict:
    return service(name, cluster_ip=ip, **kwargs)


def http(name: str) -> ServicePortName:
    return ServicePortName("default", name, "http")


def make_proxy(**settings):
    rejections = Rejections()
    backend = RecordingBackend()
    proxy = ServiceProxy(api_client=None, settings=ProxySettings(node_name="node-a", **settings), backend=backend,
                         registry=Registry(), rejections=rejections.scope("proxy"))
    return proxy, backend, rejections


def test_a_null_annotation_costs_no_service_at_start():
    """The regression: `_prefers_close` called .lower() on None and the whole drained batch
    (every Service, at start) was lost."""
    proxy, backend, rejections = make_proxy()
    null_annotated = web("lax", annotations={"service.kubernetes.io/topology-mode": None,
                                             "service.beta.kubernetes.io/load-balancer-source-ranges": None})
    for obj in (web("a"), null_annotated, web("b", "10.96.0.11")):
        proxy.services.on_add(obj)
    proxy._sync(SyncKind.FULL)
    state, _ = backend.calls[-1]
    assert {http("a"), http("b"), http("lax")} <= set(state.services)
    assert rejections.snapshot() == []


def test_a_malformed_service_is_rejected_alone_and_accepted_when_fixed():
    proxy, backend, rejections = make_proxy()
    bad = web("bad")
    bad["spec"]["ports"] = "80"          # a string, not a list
    proxy.services.on_add(web("good"))
    proxy.services.on_add(bad)
    proxy._sync(SyncKind.FULL)
    state, _ = backend.calls[-1]
    assert set(state.services) == {http("good")}
    [record] = rejections.snapshot()
    assert (record.ref.kind, record.ref.key, record.reason) == ("Service", "default/bad", "malformed")
    assert "spec.ports is str" in record.detail
    proxy.services.on_update(bad, web("bad", "10.96.0.12"))
    proxy._sync(SyncKind.PARTIAL)
    state, changed = backend.calls[-1]
    assert http("bad") in state.services and changed == {http("bad")}
    assert rejections.snapshot() == []


def test_a_malformed_slice_is_rejected_and_the_other_slices_keep_their_endpoints():
    proxy, backend, rejections = make_proxy()
    proxy.services.on_add(web("web"))
    proxy.slices.on_add(endpoint_slice("web-1", "web", [endpoint("10.244.1.5")]))
    bad = endpoint_slice("web-2", "web", [endpoint("10.244.1.6")])
    bad["endpoints"][0]["conditions"] = ["ready"]
    proxy.slices.on_add(bad)
    proxy._sync(SyncKind.FULL)
    state, _ = backend.calls[-1]
    assert [e.ip for e in state.endpoints_of(http("web"))] == ["10.244.1.5"]
    [record] = rejections.snapshot()
    assert (record.ref.kind, record.ref.key, record.reason) == ("EndpointSlice", "default/web-2", "malformed")
    proxy.slices.on_delete(bad)
    proxy._sync(SyncKind.PARTIAL)
    assert rejections.snapshot() == []


def test_changes_drained_before_a_failed_apply_are_applied_by_the_next_sync(monkeypatch):
    proxy, backend, _ = make_proxy()
    proxy.services.on_add(web("a"))
    real_apply = proxy.catalog.apply
    calls = []

    def failing_once(services, slices):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected")
        return real_apply(services, slices)
    monkeypatch.setattr(proxy.catalog, "apply", failing_once)
    with pytest.raises(RuntimeError):
        proxy._sync(SyncKind.FULL)
    proxy.services.on_add(web("b", "10.96.0.11"))
    proxy._sync(SyncKind.FULL)
    state, _ = backend.calls[-1]
    assert {http("a"), http("b")} == set(state.services)


def test_a_failed_backend_sync_loses_no_change():
    proxy, backend, _ = make_proxy()
    proxy.services.on_add(web("a"))
    backend.fail_next = True
    with pytest.raises(RuntimeError):
        proxy._sync(SyncKind.FULL)
    proxy._sync(SyncKind.FULL)       # the runner makes every sync after a failure a full one
    state, changed = backend.calls[-1]
    assert changed is None and http("a") in state.services


def test_a_malformed_node_never_raises_on_the_watch_thread():
    proxy, _, _ = make_proxy()
    for node in ({}, {"metadata": None}, {"metadata": {"name": 5}}, {"metadata": {"name": "node-a", "labels": []}}):
        proxy.node.on_add(node)
    proxy._sync(SyncKind.FULL)
    assert proxy.catalog.node.zone is None


# ---- limits -----------------------------------------------------------------------------------

def catalog(**limits) -> tuple[ServiceCatalog, Rejections]:
    rejections = Rejections()
    return ServiceCatalog(NodeContext(name="node-a"), limits=ProxyLimits(**limits),
                          rejections=rejections.scope("proxy")), rejections


def many_ports(name: str, count: int, ip: str = "10.96.0.10") -> dict:
    return web(name, ip, ports=[{"name": f"p{i}", "port": 1000 + i, "protocol": "TCP"} for i in range(count)])


def test_a_service_above_the_port_limit_is_rejected_too_large():
    cat, rejections = catalog(ports_per_service=10)
    update = cat.apply({"default/huge": (None, many_ports("huge", 11)), "default/ok": (None, many_ports("ok", 10))},
                       {})
    assert {name.name for name in update.state.services} == {"ok"}
    [record] = rejections.snapshot()
    assert record.reason == "too-large" and "11 ports" in record.detail and "--proxy-max-ports-per-service" in \
        record.detail


def test_a_service_port_above_the_endpoint_limit_is_rejected_until_it_shrinks():
    cat, rejections = catalog(endpoints_per_service_port=3)
    big = endpoint_slice("web-1", "web", [endpoint(f"10.244.1.{i}") for i in range(4)])
    update = cat.apply({"default/web": (None, web("web"))}, {"default/web-1": (None, big)})
    assert update.state.services == {}
    assert [r.reason for r in rejections.snapshot()] == ["too-large"]
    small = endpoint_slice("web-1", "web", [endpoint(f"10.244.1.{i}") for i in range(3)])
    update = cat.apply({}, {"default/web-1": (big, small)})
    assert len(update.state.endpoints_of(http("web"))) == 3 and rejections.snapshot() == []


def test_the_node_budget_admits_the_oldest_services_and_never_pushes_a_programmed_one_out():
    cat, rejections = catalog(endpoint_ports=8)
    old = many_ports("old", 5)
    old["metadata"]["creationTimestamp"] = "2024-01-01T00:00:00Z"
    new = many_ports("new", 5, "10.96.0.11")
    new["metadata"]["creationTimestamp"] = "2025-01-01T00:00:00Z"
    both = cat.apply({"default/new": (None, new), "default/old": (None, old)}, {})   # together: the older wins
    assert {n.name for n in both.state.services} == {"old"}
    [record] = rejections.snapshot()
    assert (record.ref.key, record.reason) == ("default/new", "too-large") and "budget" in record.detail
    update = cat.apply({"default/old": (old, None)}, {})     # room again: the newcomer is admitted
    assert {n.name for n in update.state.services} == {"new"} and rejections.snapshot() == []
    update = cat.apply({"default/old": (None, old)}, {})     # programmed stays programmed, whatever its age
    assert {n.name for n in update.state.services} == {"new"} and update.changed == set()
    [record] = rejections.snapshot()
    assert (record.ref.key, record.reason) == ("default/old", "too-large")


def test_catalog_does_not_keep_a_reference_to_the_callers_objects():
    cat, _ = catalog()
    obj = web("a")
    before = copy.deepcopy(obj)
    cat.apply({"default/a": (None, obj)}, {})
    assert obj == before


def test_health_lists_the_rejected_without_turning_unhealthy_and_the_flags_set_the_limits():
    from netagent.cli import build_parser
    from netagent.daemon.rejection_reports import with_rejections
    from netagent.infra.rejections import ObjectRef
    from netagent.infra.status_server import HealthReport
    from proxy.limits import limits_from_args

    scope = Rejections().scope("proxy")
    health = with_rejections(lambda: HealthReport(healthy=True, reason="ok", details={"runs": 3}), scope)
    assert health().details == {"runs": 3}
    scope.reject(ObjectRef("Service", "default", "bad"), reason="malformed", detail="spec.ports is str, not a list")
    report = health()
    assert report.healthy and report.details["runs"] == 3
    assert report.details["rejected_objects"] == ["proxy: Service default/bad rejected (malformed): spec.ports is str, "
                                          "not a list"]
    args = build_parser().parse_args(["run", "--proxy-max-ports-per-service", "7", "--proxy-max-endpoint-ports", "9"])
    assert limits_from_args(args) == ProxyLimits(ports_per_service=7, endpoint_ports=9)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--proxy-max-endpoints-per-port", "0"])


def test_a_service_with_too_many_addresses_is_rejected_and_addresses_count_against_the_budget():
    cat, rejections = catalog(addresses_per_service=3, endpoint_ports=10)
    crowded = web("crowded", externalIPs=[f"192.0.2.{i}" for i in range(4)])
    update = cat.apply({"default/crowded": (None, crowded)}, {})
    assert update.state.services == {} and "4 external IPs" in rejections.snapshot()[0].detail
    two = many_ports("two", 2, "10.96.0.11")
    two["spec"]["externalIPs"] = ["192.0.2.1", "192.0.2.2", "192.0.2.3"]   # 2 ports x (1 + 3 addresses) = 8
    two["metadata"]["creationTimestamp"] = "2024-01-01T00:00:00Z"
    fits = cat.apply({"default/two": (None, two)}, {})
    assert len(fits.state.services) == 2
    three = many_ports("three", 3, "10.96.0.12")                            # 3 more: 11 > 10
    three["metadata"]["creationTimestamp"] = "2024-06-01T00:00:00Z"
    over = cat.apply({"default/three": (None, three)}, {})
    assert {n.name for n in over.state.services} == {"two"}


def test_stale_udp_flow_deletions_are_bounded_per_sync():
    from proxy.conntrack import MAX_FLOW_FILTERS, stale_flows
    from proxy.model import Endpoint, Protocol, ProxyState, ServicePort
    name = ServicePortName("default", "dns", "dns")
    port = ServicePort(name=name, protocol=Protocol.UDP, port=53, cluster_ip="10.96.0.53", node_port=30053,
                       external_ips=tuple(f"192.0.2.{i}" for i in range(1, 11)))
    node = NodeContext(name="node-a")
    before = ProxyState(node, {name: port}, {name: tuple(Endpoint(f"10.244.{i // 250}.{i % 250 + 1}", 53)
                                                         for i in range(1000))})
    after = ProxyState(node, {name: port}, {name: before.endpoints[name][:1]})
    flows = stale_flows(before, after, frozenset({name}))   # 12 entry points x 999 gone endpoints
    assert len(flows) == 12 <= MAX_FLOW_FILTERS and all(flow.reply_source is None for flow in flows)
    few = ProxyState(node, {name: port}, {name: before.endpoints[name][:3]})
    assert len(stale_flows(few, after, frozenset({name}))) == 24     # small changes stay precise
