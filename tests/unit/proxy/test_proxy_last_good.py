"""A bad update of a good Service keeps its last good version programmed (issue 29, item 11).

An update that cannot be read, names another Service, or is above a per-object limit is
rejected (reason and detail in the proxy's rejection scope, which posts the Event) while the
Service's last good ports stay programmed with the current endpoints, as kube-proxy keeps its
last good view. Deleting the Service, or recreating it under a new uid, still drops it.
Through the proxy's own recorders and `_sync` (`test_proxy_untrusted.make_proxy`) and the
catalog the sync drains into.
"""
from __future__ import annotations

import copy

from netagent.infra.rejections import Rejections
from netagent.infra.sync_runner import SyncKind
from proxy.catalog import ServiceCatalog
from proxy.limits import ProxyLimits
from proxy.model import NodeContext, ServicePortName
from tests.unit.proxy.proxy_objects import endpoint, endpoint_slice, service
from tests.unit.proxy.test_proxy_untrusted import make_proxy

HTTP = ServicePortName("default", "web", "http")


def web(*, uid: str = "uid-1", **spec) -> dict:
    obj = service("web", cluster_ip="10.96.0.10", **spec)
    obj["metadata"]["uid"] = uid
    return obj


def catalog(**limits) -> tuple[ServiceCatalog, Rejections]:
    rejections = Rejections()
    return ServiceCatalog(NodeContext(name="node-a"), limits=ProxyLimits(**limits),
                          rejections=rejections.scope("proxy")), rejections


def test_a_malformed_update_keeps_the_last_good_version_with_the_rejection_reported():
    proxy, backend, rejections = make_proxy()
    good = web()
    proxy.services.on_add(good)
    proxy.slices.on_add(endpoint_slice("web-1", "web", [endpoint("10.244.1.5")]))
    proxy._sync(SyncKind.FULL)
    assert HTTP in backend.calls[-1][0].services
    bad = copy.deepcopy(good)
    bad["spec"]["ports"] = "80"   # a string, not a list
    proxy.services.on_update(good, bad)
    proxy._sync(SyncKind.PARTIAL)
    state, _ = backend.calls[-1]
    assert state.services[HTTP] == proxy.catalog.state().services[HTTP]
    assert HTTP in state.services and [e.ip for e in state.endpoints_of(HTTP)] == ["10.244.1.5"]
    [record] = rejections.snapshot()
    assert (record.ref.key, record.reason) == ("default/web", "malformed")
    assert "spec.ports is str" in record.detail and "last good version stays programmed" in record.detail
    # the endpoints still follow their slices while the Service is rejected
    proxy.slices.on_update(endpoint_slice("web-1", "web", [endpoint("10.244.1.5")]),
                           endpoint_slice("web-1", "web", [endpoint("10.244.1.6")]))
    proxy._sync(SyncKind.PARTIAL)
    assert [e.ip for e in backend.calls[-1][0].endpoints_of(HTTP)] == ["10.244.1.6"]
    # fixed: the new version, and the rejection cleared
    fixed = web(ports=[{"name": "http", "port": 81, "protocol": "TCP"}])
    proxy.services.on_update(bad, fixed)
    proxy._sync(SyncKind.PARTIAL)
    assert backend.calls[-1][0].services[HTTP].port == 81 and rejections.snapshot() == []
    # deleted while rejected: gone
    proxy.services.on_update(fixed, bad)
    proxy._sync(SyncKind.PARTIAL)
    assert backend.calls[-1][0].services[HTTP].port == 81
    proxy.services.on_delete(bad)
    proxy._sync(SyncKind.PARTIAL)
    assert HTTP not in backend.calls[-1][0].services and rejections.snapshot() == []


def test_an_update_above_the_port_limit_keeps_the_last_good_version():
    cat, rejections = catalog(ports_per_service=3)
    good = web()
    cat.apply({"default/web": (None, good)}, {})
    huge = web(ports=[{"name": f"p{i}", "port": 1000 + i, "protocol": "TCP"} for i in range(4)])
    update = cat.apply({"default/web": (good, huge)}, {})
    assert set(update.state.services) == {HTTP} and update.changed == frozenset()
    [record] = rejections.snapshot()
    assert record.reason == "too-large" and "--proxy-max-ports-per-service" in record.detail
    assert "last good version stays programmed" in record.detail


def test_an_update_above_the_per_service_cost_cap_keeps_the_last_good_version():
    cat, rejections = catalog(endpoint_ports_per_service=5)
    good = web()
    cat.apply({"default/web": (None, good)}, {})
    wide = web(externalIPs=[f"198.51.100.{i}" for i in range(1, 10)])
    update = cat.apply({"default/web": (good, wide)}, {})
    assert set(update.state.services) == {HTTP} and update.state.services[HTTP].external_ips == ()
    [record] = rejections.snapshot()
    assert record.reason == "too-large" and "last good version stays programmed" in record.detail
    update = cat.apply({"default/web": (wide, None)}, {})
    assert update.state.services == {} and rejections.snapshot() == []


def test_an_update_naming_another_service_keeps_the_last_good_version_and_takes_nothing():
    cat, rejections = catalog()
    good = web()
    cat.apply({"default/web": (None, good)}, {})
    other = copy.deepcopy(good)
    other["metadata"]["name"] = "api"
    update = cat.apply({"default/web": (good, other)}, {})
    assert set(update.state.services) == {HTTP}
    assert [record.reason for record in rejections.snapshot()] == ["malformed"]


def test_a_recreated_service_that_is_malformed_does_not_inherit_the_old_ones_version():
    cat, rejections = catalog()
    good = web(uid="uid-1")
    cat.apply({"default/web": (None, good)}, {})
    bad = web(uid="uid-2")
    bad["spec"]["ports"] = "80"
    update = cat.apply({"default/web": (good, bad)}, {})   # deleted and recreated between two syncs
    assert update.state.services == {} and update.changed == {HTTP}
    [record] = rejections.snapshot()
    assert record.reason == "malformed" and "last good" not in record.detail


def test_a_service_that_was_never_good_is_not_programmed():
    cat, rejections = catalog()
    bad = web()
    bad["spec"]["ports"] = "80"
    update = cat.apply({"default/web": (None, bad)}, {})
    assert update.state.services == {} and [r.reason for r in rejections.snapshot()] == ["malformed"]
