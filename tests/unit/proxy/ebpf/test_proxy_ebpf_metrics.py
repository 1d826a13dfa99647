"""The eBPF backend's metrics through the proxy core, on the fake map set: the entries and
capacity of every map (read at scrape time, so they follow each sync) and the sync durations
under kube-proxy's names, full then partial."""
from __future__ import annotations

import re

from kubernetes import client

from ebpf.fake_maps import fake_map_set
from ebpf.maps import MAP_NAMES, SLOTS_MAP, SVC_MAP
from netagent.infra.metrics import Registry
from proxy.ebpf.backend import EbpfProxy
from proxy.metrics import ProxyMetrics
from proxy.service_proxy import ProxySettings, ServiceProxy
from tests.unit.proxy.proxy_objects import endpoint, endpoint_slice, service
from tests.unit.proxy.test_service_proxy import node, server, wait_for  # noqa: F401 (server: a fixture)


def samples(registry: Registry, name: str) -> dict[str, float]:
    """label value -> sample of one single-label family, as the scrape shows it."""
    return {match.group(1): float(match.group(2))
            for match in re.finditer(rf'^{name}{{\w+="([^"]+)"}} (\S+)$', registry.render(), re.M)}


def value(registry: Registry, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", registry.render(), re.M)
    assert match, f"{name} not in the scrape"
    return float(match.group(1))


def value_or_none(registry: Registry, name: str) -> float | None:
    match = re.search(rf"^{name} (\S+)$", registry.render(), re.M)
    return float(match.group(1)) if match else None


def test_map_entries_and_capacity_of_every_map_follow_the_syncs(server):  # noqa: F811
    maps = fake_map_set(max_entries=4096)
    registry = Registry()
    server.create(node())
    server.create(service("web"))
    server.create(endpoint_slice("web-1", "web", [endpoint("10.244.1.5")]))
    proxy = ServiceProxy(api_client=client.ApiClient(client.Configuration(host=server.url)),
                         settings=ProxySettings(node_name="node-a", min_sync_period=0.05, sync_period=3600,
                                                retry_period=0.05),
                         backend=EbpfProxy(maps=maps), registry=registry)
    proxy.start()
    try:
        # the maps change inside the sync, its durations are observed after it: wait for both
        wait_for(lambda: samples(registry, "netagent_proxy_bpf_map_entries").get(SLOTS_MAP) == 1
                 and value_or_none(registry, "kubeproxy_sync_full_proxy_rules_duration_seconds_count") == 1)
        assert samples(registry, "netagent_proxy_bpf_map_max_entries") == {name: 4096 for name in MAP_NAMES}
        entries = samples(registry, "netagent_proxy_bpf_map_entries")
        assert entries == {name: bpf_map.count() for name, bpf_map in maps.by_name().items()}
        assert entries[SVC_MAP] == 1   # the cluster IP
        assert value(registry, "kubeproxy_sync_full_proxy_rules_duration_seconds_count") == 1
        server.create(endpoint_slice("web-2", "web", [endpoint("10.244.1.6"), endpoint("10.244.1.7")]))
        wait_for(lambda: samples(registry, "netagent_proxy_bpf_map_entries").get(SLOTS_MAP) == 3
                 and (value_or_none(registry, "kubeproxy_sync_partial_proxy_rules_duration_seconds_count") or 0) >= 1
                 and (value_or_none(registry, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") or 0) > 0)
        assert value(registry, "kubeproxy_sync_partial_proxy_rules_duration_seconds_count") >= 1
        assert value(registry, "kubeproxy_sync_proxy_rules_duration_seconds_count") >= 2
        assert value(registry, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") > 0
    finally:
        proxy.stop()


def test_backends_without_fixed_size_tables_export_no_map_series():
    registry = Registry()
    ProxyMetrics(registry, table_fill=dict)
    assert "bpf_map" not in registry.render()
