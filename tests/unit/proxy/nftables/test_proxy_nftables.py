"""The nftables service proxy against FakeNft: what it renders, and that partial and full syncs,
adoption, drift repair and failures all reach the same table (the real kernel: tests/netns/
test_proxy_nftables.py and the parity suite)."""
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from netagent.kernel.nftables import tables
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.nftables.model import Element
from netagent.kernel.nftables.runner import NftError
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName, TrafficPolicy
from proxy.nftables import NftablesProxy
from proxy.nftables import names as N
from proxy.nftables.render import NftProxySettings, render_port

NODE = NodeContext(name="node", cluster_cidr="10.244.0.0/16")


def port(name: str, ip: str, **kwargs) -> ServicePort:
    kwargs.setdefault("protocol", Protocol.TCP)
    return ServicePort(ServicePortName("default", name, "p"), port=80, cluster_ip=ip, **kwargs)


def eps(*ips: str, node: str = "node") -> tuple[Endpoint, ...]:
    return tuple(Endpoint(ip, 8080, node_name=node) for ip in ips)


def state(*entries) -> ProxyState:
    return ProxyState(NODE, {s.name: s for s, _ in entries}, {s.name: e for s, e in entries})


def table(nft: FakeNft, family: str = "ip"):
    """The table read back as a comparable value: each set's and map's shape and elements (in
    no order), each chain's spec and rule comments (each carries its statements' digest)."""
    held = tables.read_table(family, N.TABLE, nft.list_table(family, N.TABLE))
    assert held is not None
    return ({entry.name: (tables.shape(entry), frozenset(entry.elements)) for entry in held.sets},
            {chain.name: (chain.base, [rule.comment for rule in chain.rules]) for chain in held.chains})


def elements(proxy_or_nft, holder: str) -> dict[tuple[str, ...], Element]:
    """A map's or set's elements read back, by key (a tuple of parts)."""
    nft = proxy_or_nft.nft if isinstance(proxy_or_nft, NftablesProxy) else proxy_or_nft
    held = tables.read_table("ip", N.TABLE, nft.list_table("ip", N.TABLE))
    found = held.set(holder) if held else None
    assert found is not None
    return {element.key: element for element in found.elements}


def rendered(service: ServicePort, s: ProxyState) -> dict[tuple[str, tuple[str, ...]], Element]:
    """A service port's elements, by (holder, key)."""
    objects = render_port(service, s.selection(service.name), node=NODE, settings=NftProxySettings())
    return {(holder, element.key): element for holder, elements in objects.elements for element in elements}


WEB = port("web", "10.96.0.10", node_port=30080, external_ips=("192.0.2.1",))


# ---- render -------------------------------------------------------------------------------------

def test_a_service_port_is_one_dispatch_element_and_one_slot_per_endpoint():
    s = state((WEB, eps("10.244.2.2", "10.244.1.2", "10.244.3.2")))
    found = rendered(WEB, s)
    assert found[(N.SERVICE_IPS, ("10.96.0.10", "tcp", "80"))] == Element(("10.96.0.10", "tcp", "80"), "goto IP-C-3")
    assert found[(N.SERVICE_IPS, ("192.0.2.1", "tcp", "80"))].value == "goto IP-X-3"
    assert found[(N.SERVICE_NODEPORTS, ("tcp", "30080"))].value == "goto NP-X-3"
    assert [found[("ENDPOINTS-TCP", ("10.96.0.10", "80", str(slot)))].value for slot in range(3)] == [
        "10.244.1.2 . 8080", "10.244.2.2 . 8080", "10.244.3.2 . 8080"]     # slots in address order
    assert found[("NODEPORT-ENDPOINTS-TCP", ("30080", "2"))].value == "10.244.3.2 . 8080"
    assert found[(N.IP_NAMES, ("10.96.0.10", "tcp", "80"))] == Element(("10.96.0.10", "tcp", "80"), None,
                                                                       "default/web:p ClusterIP")
    assert (N.HAIRPIN, ("10.244.1.2", "10.244.1.2")) in found


def test_only_endpoints_on_this_node_get_a_hairpin_element():
    s = state((WEB, eps("10.244.1.2") + eps("10.244.3.2", node="other") + (Endpoint("10.244.4.2", 8080),)))
    assert {key for holder, key in rendered(WEB, s) if holder == N.HAIRPIN} == {("10.244.1.2", "10.244.1.2"),
                                                                                ("10.244.4.2", "10.244.4.2")}


def test_no_endpoints_rejects_and_no_local_endpoint_drops():
    empty = port("empty", "10.96.0.11", protocol=Protocol.SCTP)
    local = port("local", "10.96.0.12", node_port=30081, external_policy=TrafficPolicy.LOCAL)
    s = state((empty, ()), (local, eps("10.244.3.2", node="other")))
    assert rendered(empty, s)[(N.SERVICE_IPS, ("10.96.0.11", "sctp", "80"))].value == "goto REJECT-NEW"
    found = rendered(local, s)
    assert found[(N.SERVICE_NODEPORTS, ("tcp", "30081"))].value == "goto LOCAL-NODEPORT"
    assert found[(N.LOCAL_NODEPORTS_OUTSIDE, ("tcp", "30081"))].value == "drop"          # no local endpoint
    assert found[(N.LOCAL_NODEPORTS_INSIDE, ("tcp", "30081"))].value == "goto NP-C-1"    # pods: cluster-wide


def test_terminating_endpoints_serve_when_none_is_ready_and_hints_keep_traffic_close():
    close = port("close", "10.96.0.16", prefer_close=True)
    terminating = (Endpoint("10.244.1.2", 8080, ready=False, serving=True, terminating=True),
                   Endpoint("10.244.2.2", 8080, ready=False, serving=False, terminating=True))
    hinted = (Endpoint("10.244.1.2", 8080, node_hints=frozenset({"node"})),
              Endpoint("10.244.2.2", 8080, node_hints=frozenset({"other"})))
    s = state((WEB, terminating), (close, hinted))
    for service in (WEB, close):
        found = rendered(service, s)
        assert found[(N.SERVICE_IPS, (service.cluster_ip, "tcp", "80"))].value == "goto IP-C-1"
        assert found[("ENDPOINTS-TCP", (service.cluster_ip, "80", "0"))].value == "10.244.1.2 . 8080"


def test_source_ranges_are_collapsed_into_one_interval_element_each():
    lb = port("lb", "10.96.0.13", load_balancer_ips=("203.0.113.7",),
              load_balancer_source_ranges=("10.0.0.0/8", "10.1.0.0/16", "192.168.1.9/32", "2001:db8::/32"))
    found = rendered(lb, state((lb, eps("10.244.1.2"))))
    assert {key for holder, key in found if holder == N.FIREWALL_ALLOW} == {
        ("203.0.113.7", "tcp", "80", "10.0.0.0/8"), ("203.0.113.7", "tcp", "80", "192.168.1.9")}
    assert (N.FIREWALL_IPS, ("203.0.113.7", "tcp", "80")) in found


def test_chains_do_not_grow_with_services():
    many = [(port(f"s{i}", f"10.96.{i // 250}.{i % 250 + 1}"), eps("10.244.1.2", "10.244.2.2")) for i in range(500)]
    proxy = NftablesProxy(nft=FakeNft())
    proxy.sync(state(*many), changed=None)
    _, chains = table(proxy.nft)
    assert {chain for chain in chains if N.COUNT_CHAIN.fullmatch(chain)} == {"IP-C-2"}
    assert len(elements(proxy, N.SERVICE_IPS)) == 500 and len(elements(proxy, "ENDPOINTS-TCP")) == 1000


def test_a_hostile_name_reaches_the_table_only_as_a_bounded_comment():
    hostile = ServicePort(ServicePortName("default", 'x" ; flush ruleset ; "' + "y" * 300, "p"), Protocol.TCP, 80,
                          "10.96.0.14")
    proxy = NftablesProxy(nft=FakeNft())
    proxy.sync(state((hostile, eps("10.244.1.2"))), changed=None)
    (comment,) = [element.comment for element in elements(proxy, N.IP_NAMES).values()]
    assert '"' not in comment and len(comment.encode()) <= 128
    assert [service.address for service in proxy.programmed()] == ["10.96.0.14:80/TCP"]


# ---- sync -------------------------------------------------------------------------------------

def test_a_restarted_agent_adopts_the_table_with_no_write_and_drift_is_repaired():
    nft = FakeNft()
    desired = state((WEB, eps("10.244.1.2", "10.244.2.2")), (port("aff", "10.96.0.15", affinity_timeout=30),
                                                             eps("10.244.1.2")))
    NftablesProxy(nft=nft).sync(desired, changed=None)
    written = table(nft)
    restarted = NftablesProxy(nft=nft)
    report = restarted.sync(desired, changed=None)
    assert restarted.applies == 0 and report.scope.value == "full" and report.rules > 0
    nft.apply(f"delete element ip {N.TABLE} {N.SERVICE_IPS} {{ 10.96.0.10 . tcp . 80 }}\n"
              f"flush chain ip {N.TABLE} {N.POSTROUTING}\n"
              f"add element ip {N.TABLE} {N.HAIRPIN} {{ 10.9.9.9 . 10.9.9.9 }}\n")
    restarted.sync(desired, changed=None)
    assert table(nft) == written and restarted.applies == 1


def test_a_foreign_layout_is_replaced_in_one_transaction():
    nft = FakeNft()
    nft.apply(f"add table ip {N.TABLE}\nadd set ip {N.TABLE} {N.HAIRPIN} {{ type ipv4_addr; }}\n"
              f"add chain ip {N.TABLE} OLD-CHAIN\n")
    proxy = NftablesProxy(nft=nft)
    proxy.sync(state((WEB, eps("10.244.1.2"))), changed=None)
    assert proxy.applies == 1
    _, chains = table(nft)
    assert "OLD-CHAIN" not in chains and elements(proxy, N.HAIRPIN)


def test_an_object_added_by_hand_under_a_name_we_would_not_write_is_removed_with_the_table():
    nft = FakeNft()
    proxy = NftablesProxy(nft=nft)
    desired = state((WEB, eps("10.244.1.2")))
    proxy.sync(desired, changed=None)
    nft.apply(f"add chain ip {N.TABLE} foo\n")
    NftablesProxy(nft=nft).sync(desired, changed=None)
    assert table(nft) == table(_fresh(desired))


def test_a_failed_sync_raises_and_the_next_one_is_full():
    nft = FakeNft()
    proxy = NftablesProxy(nft=nft)
    proxy.sync(state((WEB, eps("10.244.1.2"))), changed=None)
    nft.fail_next = NftError("injected")
    moved = state((WEB, eps("10.244.2.2")))
    with pytest.raises(NftError):
        proxy.sync(moved, changed=frozenset({WEB.name}))
    assert proxy.sync(moved, changed=frozenset({WEB.name})).scope.value == "full"
    assert elements(proxy, "ENDPOINTS-TCP")[("10.96.0.10", "80", "0")].value == "10.244.2.2 . 8080"


def test_an_ipv6_address_is_left_out_and_reported_and_the_rest_programmed():
    bad = port("v6", "fd00::10")
    proxy = NftablesProxy(nft=FakeNft())
    report = proxy.sync(state((bad, eps("10.244.1.2")), (WEB, eps("10.244.1.2"))), changed=None)
    assert set(report.unprogrammed) == {bad.name} and "IPv6" in report.unprogrammed[bad.name]
    assert ("10.96.0.10", "tcp", "80") in elements(proxy, N.SERVICE_IPS)
    report = proxy.sync(state((WEB, eps("10.244.1.2"))), changed=frozenset({bad.name}))
    assert not report.unprogrammed


def test_cleanup_deletes_only_our_table_and_is_idempotent():
    nft = FakeNft()
    nft.apply("add table ip other\n")
    proxy = NftablesProxy(nft=nft)
    proxy.sync(state((WEB, eps("10.244.1.2"))), changed=None)
    proxy.cleanup()
    proxy.cleanup()
    assert nft.tables() == [("ip", "other")]


# ---- partial == full, by property -------------------------------------------------------------

ADDRESSES = [f"10.244.{i}.2" for i in range(1, 7)]
SHAPES = [
    dict(),
    dict(node_port=30090),
    dict(node_port=30091, external_policy=TrafficPolicy.LOCAL, external_ips=("192.0.2.5",)),
    dict(internal_policy=TrafficPolicy.LOCAL),
    dict(affinity_timeout=60),
    dict(affinity_timeout=90, node_port=30092, external_policy=TrafficPolicy.LOCAL),
    dict(load_balancer_ips=("203.0.113.5",), load_balancer_source_ranges=("10.0.0.0/8",)),
    dict(protocol=Protocol.UDP),
]


def random_state(rng: random.Random) -> ProxyState:
    entries = []
    for index in range(rng.randint(0, 6)):
        shape = dict(rng.choice(SHAPES))
        service = port(f"s{index}", f"10.96.0.{index + 1}", **shape)
        chosen = rng.sample(ADDRESSES, rng.randint(0, 4))
        entries.append((service, tuple(Endpoint(ip, 8080, node_name=rng.choice(["node", "other"]),
                                                ready=rng.random() > 0.2, serving=True, terminating=rng.random() < 0.2)
                                       for ip in chosen)))
    return state(*entries)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2 ** 32), min_size=1, max_size=6))
def test_partial_after_partial_reaches_what_a_full_sync_writes(seeds):
    nft = FakeNft()
    proxy = NftablesProxy(nft=nft)
    previous = state()
    report = proxy.sync(previous, changed=None)
    for seed in seeds:
        current = random_state(random.Random(seed))
        report = proxy.sync(current, changed=current.changed_since(previous))
        previous = current
    fresh = FakeNft()
    full = NftablesProxy(nft=fresh).sync(previous, changed=None)
    assert table(nft) == table(fresh)
    assert report.rules == full.rules   # the size kept port by port is the size counted whole
    adopter = NftablesProxy(nft=nft)
    adopter.sync(previous, changed=None)
    assert adopter.applies == 0


def test_the_listing_is_json_the_readback_understands():
    nft = FakeNft()
    NftablesProxy(nft=nft).sync(state((WEB, eps("10.244.1.2"))), changed=None)
    assert json.dumps(nft.list_table("ip", N.TABLE))   # plain JSON, as libnftables gives


def test_node_ports_answer_on_every_local_address_or_only_the_configured_ones():
    from proxy.nftables.render import fixed_chains
    everywhere = fixed_chains(NODE, NftProxySettings())[N.SERVICES][-1].statements
    assert everywhere.startswith("fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap ")
    chosen = NodeContext(name="node", cluster_cidr="10.244.0.0/16", nodeport_addresses=("192.168.1.7", "10.0.0.1"))
    only = fixed_chains(chosen, NftProxySettings())[N.SERVICES][-1].statements
    assert only.startswith("ip daddr { 10.0.0.1, 192.168.1.7 } meta l4proto . th dport vmap ")
    nft = FakeNft()
    NftablesProxy(nft=nft).sync(ProxyState(chosen, {WEB.name: WEB}, {WEB.name: eps("10.244.1.2")}), changed=None)
    moved = NftablesProxy(nft=nft)   # the node's addresses changed: the chain is rewritten, nothing else
    moved.sync(state((WEB, eps("10.244.1.2"))), changed=None)
    assert moved.applies == 1 and table(nft) == table(_fresh(state((WEB, eps("10.244.1.2")))))


def _fresh(desired: ProxyState) -> FakeNft:
    nft = FakeNft()
    NftablesProxy(nft=nft).sync(desired, changed=None)
    return nft
