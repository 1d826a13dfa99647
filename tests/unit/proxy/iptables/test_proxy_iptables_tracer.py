"""Packets traced through rendered service rulesets: which endpoint, with what chance,
masqueraded or not, refused or dropped. One test per behaviour of the service proxy (the
tracer's own rules are in test_iptables_tracer.py)."""
import dataclasses

import pytest

from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from netagent.noderoutes.masquerade import MasqueradeManager
from proxy.iptables import IptablesProxy
from proxy.iptables.names import HAIRPIN_SET, endpoint_chain
from netagent.kernel.iptables.tracer import Hook, Outcome, Packet, Verdict, destinations, tables_from_text, trace_packet
from proxy.iptables.render import IptablesProxySettings, render_ruleset
from proxy.iptables.tracer import ruleset_tables, trace_service_packet
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName, TrafficPolicy

NODE_IP = "192.168.0.5"
LOCAL_ADDRESSES = [NODE_IP, "10.244.1.1"]
NODE = NodeContext(name="node-a", zone="zone-1", cluster_cidr="10.244.0.0/16")
WEB = ServicePortName("default", "web", "http")
VIP = "10.96.0.10"
POD = "10.244.1.77"          # a pod on this node (a client)
OUTSIDE = "203.0.113.9"      # a client off the cluster
LOCAL_EP, REMOTE_EP_1, REMOTE_EP_2 = "10.244.1.5", "10.244.2.5", "10.244.3.5"
THREE = (Endpoint(LOCAL_EP, 8080, node_name="node-a"), Endpoint(REMOTE_EP_1, 8080, node_name="node-b"),
         Endpoint(REMOTE_EP_2, 8080, node_name="node-c"))


def web(**fields) -> ServicePort:
    return ServicePort(name=WEB, protocol=fields.pop("protocol", Protocol.TCP), port=80, cluster_ip=VIP, **fields)


class Node:
    """A rendered ruleset and the tracer's view of it."""

    def __init__(self, *services: tuple[ServicePort, tuple[Endpoint, ...]], node: NodeContext = NODE,
                 settings: IptablesProxySettings = IptablesProxySettings(), forward_policy: str = "ACCEPT"):
        state = ProxyState(node, {s.name: s for s, _ in services}, {s.name: e for s, e in services})
        self.ruleset = render_ruleset(state, settings=settings)
        self.tables = ruleset_tables(self.ruleset)
        self.tables["filter"].chains["FORWARD"].policy = forward_policy

    def trace(self, source: str, destination: str, port: int = 80, *, hook: Hook = Hook.PREROUTING,
              protocol: Protocol = Protocol.TCP, recent=None) -> list[Outcome]:
        return trace_service_packet(self.ruleset, Packet(source, destination, protocol, port, hook=hook),
                                    local_addresses=LOCAL_ADDRESSES, tables=self.tables, recent=recent)


def spread(outcomes) -> dict[str, float]:
    return {destination: round(chance, 6) for destination, chance in destinations(outcomes).items()}


def masqueraded(outcomes) -> set[bool]:
    return {outcome.masqueraded for outcome in outcomes}


THIRD = round(1 / 3, 6)
EVERY_ENDPOINT = {f"{LOCAL_EP}:8080": THIRD, f"{REMOTE_EP_1}:8080": THIRD, f"{REMOTE_EP_2}:8080": THIRD}


def test_cluster_ip_spreads_evenly_and_masquerades_only_clients_outside_the_cluster():
    node = Node((web(), THREE))
    from_pod = node.trace(POD, VIP)
    assert spread(from_pod) == EVERY_ENDPOINT and masqueraded(from_pod) == {False}
    from_host = node.trace(NODE_IP, VIP, hook=Hook.OUTPUT)
    assert spread(from_host) == EVERY_ENDPOINT and masqueraded(from_host) == {True}
    from_outside = node.trace(OUTSIDE, VIP)
    assert spread(from_outside) == EVERY_ENDPOINT and masqueraded(from_outside) == {True}
    assert spread(node.trace(POD, VIP, port=81)) == {f"{VIP}:81": 1.0}   # another port: not ours


def test_ten_endpoints_get_a_tenth_each():
    many = tuple(Endpoint(f"10.244.2.{host}", 8080) for host in range(1, 11))
    assert set(spread(Node((web(), many)).trace(POD, VIP)).values()) == {0.1}


def test_hairpin_is_masqueraded_and_other_pod_traffic_is_not():
    node = Node((web(), THREE))
    outcomes = {outcome.destination: outcome.masqueraded for outcome in node.trace(LOCAL_EP, VIP)}
    assert outcomes == {f"{LOCAL_EP}:8080": True, f"{REMOTE_EP_1}:8080": False, f"{REMOTE_EP_2}:8080": False}


def test_node_port_on_every_local_address_is_masqueraded():
    node = Node((web(node_port=30080), THREE))
    for source, destination, hook in [(OUTSIDE, NODE_IP, Hook.PREROUTING), (POD, "10.244.1.1", Hook.PREROUTING),
                                      (NODE_IP, NODE_IP, Hook.OUTPUT)]:
        outcomes = node.trace(source, destination, 30080, hook=hook)
        assert spread(outcomes) == EVERY_ENDPOINT and masqueraded(outcomes) == {True}
    assert spread(node.trace(NODE_IP, "127.0.0.1", 30080, hook=Hook.OUTPUT)) == {"127.0.0.1:30080": 1.0}
    assert spread(node.trace(OUTSIDE, "192.168.0.77", 30080)) == {"192.168.0.77:30080": 1.0}  # not ours


def test_node_port_only_on_the_configured_addresses():
    node = Node((web(node_port=30080), THREE), node=dataclasses.replace(NODE, nodeport_addresses=(NODE_IP,)))
    assert spread(node.trace(OUTSIDE, NODE_IP, 30080)) == EVERY_ENDPOINT
    assert spread(node.trace(POD, "10.244.1.1", 30080)) == {"10.244.1.1:30080": 1.0}


def test_external_ip_and_load_balancer_ip_reach_the_endpoints_masqueraded():
    node = Node((web(external_ips=("192.0.2.10",), load_balancer_ips=("198.51.100.7",)), THREE))
    for address in ("192.0.2.10", "198.51.100.7"):
        outcomes = node.trace(OUTSIDE, address)
        assert spread(outcomes) == EVERY_ENDPOINT and masqueraded(outcomes) == {True}


def test_load_balancer_source_ranges_admit_listed_sources_and_drop_the_rest():
    node = Node((web(load_balancer_ips=("198.51.100.7",), node_port=30080,
                     load_balancer_source_ranges=("203.0.113.0/24",)), THREE))
    assert spread(node.trace(OUTSIDE, "198.51.100.7")) == EVERY_ENDPOINT
    refused = node.trace("198.18.0.1", "198.51.100.7")
    assert [(o.verdict, o.probability) for o in refused] == [(Verdict.DROP, 1.0)]
    assert spread(node.trace("198.18.0.1", NODE_IP, 30080)) == EVERY_ENDPOINT   # the NodePort is not fenced
    assert spread(node.trace("198.18.0.1", VIP)) == EVERY_ENDPOINT              # nor the cluster IP


@pytest.mark.parametrize("protocol", list(Protocol))
def test_each_protocol_matches_only_itself(protocol):
    node = Node((web(protocol=protocol), THREE))
    assert spread(node.trace(POD, VIP, protocol=protocol)) == EVERY_ENDPOINT
    other = next(p for p in Protocol if p is not protocol)
    assert spread(node.trace(POD, VIP, protocol=other)) == {f"{VIP}:80": 1.0}


def test_affinity_pins_a_known_client_and_records_new_ones():
    service = web(affinity_timeout=600)
    node = Node((service, THREE))
    first = node.trace(POD, VIP)
    assert spread(first) == EVERY_ENDPOINT
    assert all(outcome.recent_set == (endpoint_chain(service, endpoint),)
               for outcome, endpoint in zip(first, THREE))
    pinned = node.trace(POD, VIP, recent={endpoint_chain(service, THREE[2]): [POD]})
    assert spread(pinned) == {f"{REMOTE_EP_2}:8080": 1.0}
    other_client = node.trace("10.244.1.78", VIP, recent={endpoint_chain(service, THREE[2]): [POD]})
    assert spread(other_client) == EVERY_ENDPOINT


def test_internal_local_uses_local_endpoints_and_drops_when_there_are_none():
    node = Node((web(internal_policy=TrafficPolicy.LOCAL), THREE))
    assert spread(node.trace(POD, VIP)) == {f"{LOCAL_EP}:8080": 1.0}
    none_here = Node((web(internal_policy=TrafficPolicy.LOCAL), THREE[1:]))
    assert [o.verdict for o in none_here.trace(POD, VIP)] == [Verdict.DROP]


def test_external_local_keeps_the_client_address_and_serves_pods_and_the_node_cluster_wide():
    node = Node((web(node_port=30080, external_policy=TrafficPolicy.LOCAL), THREE))
    outside = node.trace(OUTSIDE, NODE_IP, 30080)
    assert spread(outside) == {f"{LOCAL_EP}:8080": 1.0} and masqueraded(outside) == {False}
    from_pod = node.trace(POD, NODE_IP, 30080)
    assert spread(from_pod) == EVERY_ENDPOINT and masqueraded(from_pod) == {False}
    from_node = node.trace(NODE_IP, NODE_IP, 30080, hook=Hook.OUTPUT)
    assert spread(from_node) == EVERY_ENDPOINT and masqueraded(from_node) == {True}


def test_external_local_without_local_endpoints_drops_outside_traffic_only():
    node = Node((web(node_port=30080, external_policy=TrafficPolicy.LOCAL), THREE[1:]))
    assert [o.verdict for o in node.trace(OUTSIDE, NODE_IP, 30080)] == [Verdict.DROP]
    assert set(spread(node.trace(POD, NODE_IP, 30080))) == {f"{REMOTE_EP_1}:8080", f"{REMOTE_EP_2}:8080"}


def test_terminating_endpoints_serve_when_none_is_ready():
    terminating = tuple(dataclasses.replace(e, ready=False, serving=True, terminating=True) for e in THREE)
    node = Node((web(), (terminating[0], terminating[1], dataclasses.replace(THREE[2], ready=False, serving=False,
                                                                               terminating=True))))
    assert spread(node.trace(POD, VIP)) == {f"{LOCAL_EP}:8080": 0.5, f"{REMOTE_EP_1}:8080": 0.5}


def test_topology_hints_keep_traffic_in_the_zone():
    hinted = (dataclasses.replace(THREE[0], zone_hints=frozenset({"zone-1"})),
              dataclasses.replace(THREE[1], zone_hints=frozenset({"zone-2"})),
              dataclasses.replace(THREE[2], zone_hints=frozenset({"zone-1"})))
    node = Node((web(prefer_close=True), hinted))
    assert spread(node.trace(POD, VIP)) == {f"{LOCAL_EP}:8080": 0.5, f"{REMOTE_EP_2}:8080": 0.5}


@pytest.mark.parametrize("source, destination, port, hook", [
    (POD, VIP, 80, Hook.PREROUTING), (NODE_IP, VIP, 80, Hook.OUTPUT), (OUTSIDE, NODE_IP, 30080, Hook.PREROUTING),
    (OUTSIDE, "192.0.2.10", 80, Hook.PREROUTING), (NODE_IP, NODE_IP, 30080, Hook.OUTPUT)])
def test_no_endpoints_rejects(source, destination, port, hook):
    node = Node((web(node_port=30080, external_ips=("192.0.2.10",)), ()))
    assert [o.verdict for o in node.trace(source, destination, port, hook=hook)] == [Verdict.REJECT]


def test_forward_drop_policy_lets_marked_service_traffic_through():
    node = Node((web(node_port=30080), THREE), forward_policy="DROP")
    assert spread(node.trace(OUTSIDE, NODE_IP, 30080)) == EVERY_ENDPOINT     # marked: accepted
    assert {o.verdict for o in node.trace(POD, VIP)} == {Verdict.DROP}       # unmarked pod traffic: not ours to accept


def test_tracing_the_fake_kernel_after_a_sync_gives_what_tracing_the_render_gives():
    fake = FakeIptables()
    MasqueradeManager(runner=fake, cluster_cidrs=["10.244.0.0/16"], pod_cidrs=["10.244.1.0/24"]).ensure()
    ipset = FakeIpset(in_use=iptables_references(fake))
    service = web(node_port=30080, affinity_timeout=60)
    state = ProxyState(NODE, {WEB: service}, {WEB: THREE})
    IptablesProxy(iptables=fake, ipset=ipset).sync(state, changed=None)
    rendered = Node((service, THREE))
    kernel_tables = tables_from_text(fake.save())
    for source, destination, port in [(POD, VIP, 80), (OUTSIDE, NODE_IP, 30080), (LOCAL_EP, VIP, 80)]:
        packet = Packet(source, destination, Protocol.TCP, port)
        assert trace_packet(kernel_tables, packet, local_addresses=LOCAL_ADDRESSES,
                            ipsets={HAIRPIN_SET: ipset.members(HAIRPIN_SET)}) == \
            rendered.trace(source, destination, port)
