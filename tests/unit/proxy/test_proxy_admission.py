"""Fair, bounded Service admission (issue 29, item 3): no single Service or namespace takes the
node's endpoint-port budget, what is programmed is never pushed out, an update of an admitted
Service never evicts another, and no rejection tells how much room is left.

Through the catalog the proxy drains its recorders into (`proxy/catalog.py` over
`proxy/admission.py`), with the same rejection scope that posts the Events.
"""
from __future__ import annotations

import dataclasses
import re

from netagent.infra.rejections import Rejections
from proxy.catalog import ServiceCatalog
from proxy.limits import DEFAULT_LIMITS, ProxyLimits
from proxy.model import NodeContext, ServicePortName
from tests.unit.proxy.proxy_objects import endpoint, endpoint_slice, service


def limits(**values) -> ProxyLimits:
    """The limits named that this ProxyLimits knows (so the tests also run, and fail for what the
    code does, against a catalog without the per-Service and per-namespace limits)."""
    known = {field.name for field in dataclasses.fields(ProxyLimits)}
    return ProxyLimits(**{name: value for name, value in values.items() if name in known})


def catalog(**values) -> tuple[ServiceCatalog, Rejections]:
    rejections = Rejections()
    return ServiceCatalog(NodeContext(name="node-a"), limits=limits(**values),
                          rejections=rejections.scope("proxy")), rejections


def svc(key: str, ports: int, created: str, ip: str, **spec) -> dict:
    namespace, _, name = key.partition("/")
    obj = service(name, namespace=namespace, cluster_ip=ip,
                  ports=[{"name": f"p{i}", "port": 1000 + i, "protocol": "TCP"} for i in range(ports)], **spec)
    obj["metadata"]["creationTimestamp"] = created
    return obj


def programmed(cat: ServiceCatalog) -> dict[str, int]:
    """service key -> how many of its ports are programmed."""
    found: dict[str, int] = {}
    for name in cat.state().services:
        key = f"{name.namespace}/{name.name}"
        found[key] = found.get(key, 0) + 1
    return found


def rejected(rejections: Rejections) -> dict[str, str]:
    return {record.ref.key: record.detail for record in rejections.snapshot()}


def test_a_thousand_ports_by_a_thousand_addresses_is_rejected_alone_and_the_next_service_is_admitted():
    """The per-object limits allowed 1,000 ports x 999 external IPs: 1,000,000 endpoint-ports, the
    whole default budget, after which every later Service on every node was rejected."""
    cat, rejections = catalog()
    assert cat.limits.endpoint_ports == DEFAULT_LIMITS.endpoint_ports == 1_000_000
    hog = svc("tenant/hog", 1000, "2024-01-01T00:00:00Z", "10.96.0.10",
              externalIPs=[f"198.51.{i // 250}.{i % 250 + 1}" for i in range(999)])
    cat.apply({"tenant/hog": (None, hog)}, {})
    assert programmed(cat) == {}
    assert set(rejected(rejections)) == {"tenant/hog"}
    assert "--proxy-max-endpoint-ports-per-service" in rejected(rejections)["tenant/hog"]
    web = svc("default/web", 2, "2025-01-01T00:00:00Z", "10.96.0.11")
    cat.apply({"default/web": (None, web)}, {})
    assert programmed(cat) == {"default/web": 2}
    assert set(rejected(rejections)) == {"tenant/hog"}


def test_one_namespace_flooding_cannot_evict_or_starve_another_namespace():
    cat, rejections = catalog(endpoint_ports=100, endpoint_ports_per_service=30, endpoint_ports_per_namespace=50)
    early = svc("tenant/early", 1, "2020-01-01T00:00:00Z", "10.96.1.1")
    api = svc("team/api", 10, "2024-01-01T00:00:00Z", "10.96.0.10")
    cat.apply({"tenant/early": (None, early), "team/api": (None, api)}, {})
    assert programmed(cat) == {"tenant/early": 1, "team/api": 10}
    # the flood: ten new Services of 20 ports, and the tenant's oldest Service grown to 95 ports
    flood = {f"tenant/f{i}": (None, svc(f"tenant/f{i}", 20, f"2025-01-01T00:00:{i:02}Z", f"10.96.2.{i + 1}"))
             for i in range(10)}
    flood["tenant/early"] = (early, svc("tenant/early", 95, "2020-01-01T00:00:00Z", "10.96.1.1"))
    cat.apply(flood, {})
    now = programmed(cat)
    assert now["team/api"] == 10, "another namespace's admitted Service stays programmed"
    assert sum(count for key, count in now.items() if key.startswith("tenant/")) <= 50
    # the other namespace still gets room for a new Service, though the tenant's flood is older
    web = svc("team/web", 10, "2026-01-01T00:00:00Z", "10.96.0.11")
    cat.apply({"team/web": (None, web)}, {})
    assert programmed(cat)["team/web"] == 10 and "team/web" not in rejected(rejections)


def test_growing_an_admitted_service_beyond_what_is_free_keeps_its_last_version_and_evicts_nothing():
    cat, rejections = catalog(endpoint_ports=20)
    old = svc("default/old", 5, "2024-01-01T00:00:00Z", "10.96.0.10")
    young = svc("default/young", 10, "2025-01-01T00:00:00Z", "10.96.0.11")
    cat.apply({"default/old": (None, old), "default/young": (None, young)}, {})
    assert programmed(cat) == {"default/old": 5, "default/young": 10}
    grown = svc("default/old", 12, "2024-01-01T00:00:00Z", "10.96.0.10")   # needs 7 more, 5 are free
    update = cat.apply({"default/old": (old, grown)}, {})
    assert programmed(cat) == {"default/old": 5, "default/young": 10}, "the older Service's update evicted nothing"
    assert update.changed == set()
    assert "previous version stays programmed" in rejected(rejections)["default/old"]
    # growth through endpoints is an update too: the young Service's slice grows past what is free
    slice_ = endpoint_slice("young-1", "young", [endpoint(f"10.244.1.{i}") for i in range(1, 9)],
                            ports=[{"name": "p0", "port": 8080, "protocol": "TCP"}])
    cat.apply({}, {"default/young-1": (None, slice_)})
    assert programmed(cat) == {"default/old": 5, "default/young": 10}
    assert cat.state().endpoints_of(ServicePortName("default", "young", "p0")) == ()
    cat.apply({"default/young": (young, None)}, {})   # room made: the held update is taken now
    assert programmed(cat) == {"default/old": 12} and rejected(rejections) == {}


def test_room_goes_to_the_namespace_holding_least_then_the_oldest_service():
    cat, _ = catalog(endpoint_ports=20)
    big = svc("big/a", 10, "2024-01-01T00:00:00Z", "10.96.0.10")
    filler = svc("small/filler", 10, "2024-01-01T00:00:00Z", "10.96.0.11")
    cat.apply({"big/a": (None, big), "small/filler": (None, filler)}, {})
    waiting = {"big/b": (None, svc("big/b", 5, "2024-06-01T00:00:00Z", "10.96.0.12")),
               "small/b": (None, svc("small/b", 5, "2025-06-01T00:00:00Z", "10.96.0.13")),
               "other/b": (None, svc("other/b", 5, "2025-09-01T00:00:00Z", "10.96.0.14"))}
    cat.apply(waiting, {})
    assert set(programmed(cat)) == {"big/a", "small/filler"}   # no room: all three wait
    cat.apply({"small/filler": (filler, None)}, {})   # 10 free: the two namespaces holding least go first
    assert set(programmed(cat)) == {"big/a", "other/b", "small/b"}


def test_budget_rejections_do_not_tell_the_room_left():
    cat, rejections = catalog(endpoint_ports=20)
    first = svc("default/first", 15, "2024-01-01T00:00:00Z", "10.96.0.10")
    second = svc("default/second", 4, "2025-01-01T00:00:00Z", "10.96.0.11")
    cat.apply({"default/first": (None, first), "default/second": (None, second)}, {})
    cat.apply({"default/late": (None, svc("default/late", 3, "2026-01-01T00:00:00Z", "10.96.0.12")),
               "default/second": (second, svc("default/second", 6, "2025-01-01T00:00:00Z", "10.96.0.11"))}, {})
    details = rejected(rejections)
    assert set(details) == {"default/late", "default/second"}
    for detail in details.values():
        assert "budget" in detail and not re.search(r"\d", detail), detail


def test_the_flags_set_the_per_service_and_per_namespace_limits():
    from netagent.cli import build_parser
    from proxy.limits import limits_from_args
    args = build_parser().parse_args(["run", "--proxy-max-endpoint-ports-per-service", "7",
                                      "--proxy-max-endpoint-ports-per-namespace", "9"])
    assert limits_from_args(args) == ProxyLimits(endpoint_ports_per_service=7, endpoint_ports_per_namespace=9)
