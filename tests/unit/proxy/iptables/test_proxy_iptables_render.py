"""The iptables service-proxy renderer: golden rulesets, one per behaviour, and its invariants.

Each golden file in tests/unit/golden/proxy_iptables/ is the complete output for a small
state: the self-contained restore text (built-in chains and the jumps into ours included)
followed by the hairpin set's members as `#` lines. They are compared exactly. After an
intended change of the rules, rewrite them with

    UPDATE_GOLDEN=1 .venv/bin/python -m pytest tests/unit/proxy/iptables/test_proxy_iptables_render.py -q

and read the diff (`git diff tests/unit/golden/`) before committing it: the diff is the review.
"""
import dataclasses
import os
import random
from pathlib import Path

import pytest

from netagent.kernel.families import IpFamily
from netagent.kernel.ipset import entry
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.restore_format import MAX_CHAIN_NAME_LENGTH, parse_save, split_tokens
from netagent.kernel.iptables.runner import PortRandomization
from proxy.iptables.names import HAIRPIN_SET6, PER_SERVICE_CHAIN, is_owned_chain
from proxy.iptables.render import IptablesProxySettings, JumpLines, MasqueradeScope, _probability, render_ruleset
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName, TrafficPolicy

GOLDEN_DIR = Path(__file__).resolve().parents[2] / "golden" / "proxy_iptables"
NODE = NodeContext(name="node-a", zone="zone-1", cluster_cidr="10.244.0.0/16")
SETTINGS = IptablesProxySettings()


def name(service: str, port: str = "http", namespace: str = "default") -> ServicePortName:
    return ServicePortName(namespace, service, port)


def local(ip: str, port: int = 8080, **conditions) -> Endpoint:
    return Endpoint(ip, port, node_name="node-a", **conditions)


def remote(ip: str, port: int = 8080, **conditions) -> Endpoint:
    return Endpoint(ip, port, node_name="node-b", **conditions)


THREE = (local("10.244.1.5"), remote("10.244.2.5"), remote("10.244.3.5"))
NODE6 = NodeContext(name="node-a", zone="zone-1", cluster_cidr="fd00:10:244::/56", family=IpFamily.V6)
SETTINGS6 = IptablesProxySettings(hairpin_set=HAIRPIN_SET6)
THREE6 = (local("fd00:10:244:1::5"), remote("fd00:10:244:2::5"), remote("fd00:10:244:3::5"))


def state(*entries: tuple[ServicePort, tuple[Endpoint, ...]], node: NodeContext = NODE) -> ProxyState:
    return ProxyState(node, {service.name: service for service, _ in entries},
                      {service.name: endpoints for service, endpoints in entries})


def web(**fields) -> ServicePort:
    fields.setdefault("name", name("web"))
    fields.setdefault("protocol", Protocol.TCP)
    fields.setdefault("port", 80)
    fields.setdefault("cluster_ip", "10.96.0.10")
    return ServicePort(**fields)


def web6(**fields) -> ServicePort:
    fields.setdefault("cluster_ip", "fd00:10:96::a")
    return web(**fields)


def golden_text(ruleset) -> str:
    members = "".join(f"# add {ruleset.settings.hairpin_set} {member}\n" for member in sorted(ruleset.hairpin_members))
    return ruleset.restore_text(jumps=JumpLines.APPEND) + f"# hairpin set {ruleset.settings.hairpin_set}\n" + members


CASES = {
    "cluster_ip": lambda: state((web(), THREE)),
    "cluster_ip_single_endpoint": lambda: state((web(), THREE[:1])),
    "masquerade_all_old_iptables_other_mark": lambda: (
        state((web(), THREE)),
        IptablesProxySettings(masquerade_mark=0x8000, masquerade=MasqueradeScope.ALL,
                              ports=PortRandomization.KERNEL_DEFAULT)),
    "masquerade_without_cluster_cidr": lambda: state((web(node_port=30080), THREE),
                                                     node=NodeContext(name="node-a")),
    "node_port_all_addresses": lambda: state((web(node_port=30080), THREE)),
    "node_port_addresses": lambda: state(
        (web(node_port=30080), THREE),
        node=dataclasses.replace(NODE, nodeport_addresses=("192.168.0.5", "10.10.0.0/24"))),
    "external_ips": lambda: state((web(external_ips=("192.0.2.10", "192.0.2.11")), THREE)),
    "load_balancer": lambda: state((web(load_balancer_ips=("198.51.100.7",)), THREE)),
    "load_balancer_source_ranges": lambda: state(
        (web(load_balancer_ips=("198.51.100.7",), node_port=30080,
             load_balancer_source_ranges=("203.0.113.0/24", "192.0.2.99")), THREE)),
    "protocols": lambda: state(
        (web(), THREE),
        (web(name=name("dns", "dns-udp"), protocol=Protocol.UDP, port=53, cluster_ip="10.96.0.53"),
         (local("10.244.1.9", 53), remote("10.244.2.9", 53))),
        (web(name=name("signal", "sctp"), protocol=Protocol.SCTP, port=9999, cluster_ip="10.96.0.99"),
         (remote("10.244.2.7", 9999),))),
    "affinity": lambda: state((web(affinity_timeout=600, node_port=30080), THREE)),
    "internal_local": lambda: state(
        (web(internal_policy=TrafficPolicy.LOCAL, node_port=30080), THREE),
        (web(name=name("remote-only"), cluster_ip="10.96.0.11", internal_policy=TrafficPolicy.LOCAL),
         THREE[1:])),
    "external_local_with_local_endpoints": lambda: state(
        (web(external_policy=TrafficPolicy.LOCAL, node_port=30080, health_check_node_port=32000,
             external_ips=("192.0.2.10",)), THREE)),
    "external_local_without_local_endpoints": lambda: state(
        (web(external_policy=TrafficPolicy.LOCAL, node_port=30080, load_balancer_ips=("198.51.100.7",)),
         THREE[1:])),
    "terminating_fallback": lambda: state(
        (web(), (local("10.244.1.5", ready=False, serving=True, terminating=True),
                 remote("10.244.2.5", ready=False, serving=False, terminating=True),
                 remote("10.244.3.5", ready=False, serving=True, terminating=True))),
        (web(name=name("rolling"), cluster_ip="10.96.0.12"),
         (local("10.244.1.6", ready=False, serving=True, terminating=True), remote("10.244.2.6")))),
    "topology_prefer_close": lambda: state(
        (web(prefer_close=True), (
            dataclasses.replace(THREE[0], zone="zone-1", zone_hints=frozenset({"zone-1"})),
            dataclasses.replace(THREE[1], zone="zone-2", zone_hints=frozenset({"zone-2"})),
            dataclasses.replace(THREE[2], zone="zone-1", zone_hints=frozenset({"zone-1"}))))),
    "no_endpoints_reject": lambda: state(
        (web(node_port=30080, external_ips=("192.0.2.10",), load_balancer_ips=("198.51.100.7",)), ()),
        (web(name=name("dns", "dns-udp"), protocol=Protocol.UDP, port=53, cluster_ip="10.96.0.53"),
         (remote("10.244.2.9", 53, ready=False, serving=False, terminating=True),))),
    "hairpin_set_shared_endpoint": lambda: state(
        (web(), THREE[:2]),
        (web(name=name("web", "metrics"), port=9090, cluster_ip="10.96.0.10"), (local("10.244.1.5", 9090),))),
    "ipv6_cluster_ip_node_port": lambda: (state((web6(node_port=30080), THREE6), node=NODE6), SETTINGS6),
    "ipv6_affinity_external_local_source_ranges": lambda: (state(
        (web6(affinity_timeout=600, node_port=30080, external_policy=TrafficPolicy.LOCAL,
              external_ips=("2001:db8::10",), load_balancer_ips=("2001:db8::7",),
              load_balancer_source_ranges=("2001:db8:1::/48", "2001:db8::99")), THREE6), node=NODE6), SETTINGS6),
    "ipv6_no_endpoints_reject_node_port_addresses": lambda: (state(
        (web6(node_port=30080), ()),
        (web6(name=name("dns", "dns-udp"), protocol=Protocol.UDP, port=53, cluster_ip="fd00:10:96::35"),
         (remote("fd00:10:244:2::9", 53),)),
        node=dataclasses.replace(NODE6, nodeport_addresses=("2001:db8::5", "2001:db8:2::/64"))), SETTINGS6),
}


def render_case(case: str):
    made = CASES[case]()
    the_state, settings = made if isinstance(made, tuple) else (made, SETTINGS)
    return render_ruleset(the_state, settings=settings)


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden(case):
    text = golden_text(render_case(case))
    path = GOLDEN_DIR / f"{case}.txt"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 to create it"
    assert text == path.read_text()


def test_no_golden_file_is_orphaned():
    assert {path.stem for path in GOLDEN_DIR.glob("*.txt")} == set(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_ruleset_applies_to_a_validating_fake(case):
    ruleset = render_case(case)
    fake = FakeIptables(family=ruleset.node.family)
    fake.restore(ruleset.restore_text(jumps=JumpLines.APPEND))
    saved = parse_save(fake.save())
    for chain in ruleset.chains():   # rendered as save prints it: the fake's canonical form changes nothing
        assert saved[chain.table].chains[chain.name].rules == [tuple(split_tokens(line)[2:]) for line in chain.rules]


def test_chain_names_fit_and_are_recognised_as_ours():
    ruleset = render_case("affinity")
    names = [chain.name for chain in ruleset.chains()]
    assert all(len(chain) <= MAX_CHAIN_NAME_LENGTH for chain in names)
    assert all(is_owned_chain(chain) for chain in names)
    per_service = [chain for chain in names if PER_SERVICE_CHAIN.match(chain)]
    assert len(per_service) == len(names) - 5   # all but the five fixed chains
    assert not is_owned_chain("NETAGENT-POSTRTG") and not is_owned_chain("NETAGENT-FORWARD")
    assert not PER_SERVICE_CHAIN.match("NETAGENT-SVC-POSTRTG")


def test_no_comment_outside_the_entry_rules():
    ruleset = render_case("affinity")
    for chain in ruleset.chains("nat"):
        commented = [line for line in chain.rules if "--comment" in line]
        if chain.name in ("NETAGENT-SERVICES", "NETAGENT-NODEPORTS"):
            assert len(commented) == len(chain.rules) - (chain.name == "NETAGENT-SERVICES")
        else:
            assert commented == [], chain.name


def test_output_does_not_depend_on_endpoint_or_service_order():
    first = state((web(), THREE), (web(name=name("api"), cluster_ip="10.96.0.20"), THREE[:2]))
    second = ProxyState(NODE, dict(reversed(list(first.services.items()))),
                        {key: tuple(reversed(value)) for key, value in first.endpoints.items()})
    assert render_ruleset(first, settings=SETTINGS).restore_text() == \
        render_ruleset(second, settings=SETTINGS).restore_text()


@pytest.mark.parametrize("remaining, printed", [(2, "0.50000000000"), (3, "0.33333333349"),
                                                (4, "0.25000000000"), (7, "0.14285714272"),
                                                (10, "0.10000000009")])
def test_probability_is_spelled_as_iptables_save_prints_it(remaining, printed):
    assert _probability(remaining) == printed


def test_hairpin_members_are_ipsets_canonical_spelling():
    ruleset = render_case("protocols")
    expected = {entry(ip, protocol, port, extra_ip=ip) for ip, protocol, port in [
        ("10.244.1.5", "tcp", 8080), ("10.244.2.5", "tcp", 8080), ("10.244.3.5", "tcp", 8080),
        ("10.244.1.9", "udp", 53), ("10.244.2.9", "udp", 53), ("10.244.2.7", "sctp", 9999)]}
    assert ruleset.hairpin_members == expected


def test_mark_must_be_a_single_bit():
    with pytest.raises(ValueError):
        IptablesProxySettings(masquerade_mark=0x4001)
    with pytest.raises(ValueError):
        IptablesProxySettings(masquerade_mark=0)


def random_state(rng: random.Random, count: int) -> ProxyState:
    services, endpoints = {}, {}
    for index in range(count):
        service_name = name(f"svc{index}")
        services[service_name] = web(
            name=service_name, cluster_ip=f"10.96.1.{index}", protocol=rng.choice(list(Protocol)),
            node_port=30000 + index if rng.random() < 0.5 else None,
            affinity_timeout=rng.choice([None, None, 60]),
            external_policy=rng.choice(list(TrafficPolicy)), internal_policy=rng.choice(list(TrafficPolicy)))
        endpoints[service_name] = tuple(
            rng.choice([local, remote])(f"10.244.{index}.{host}", ready=rng.random() < 0.8)
            for host in range(rng.randrange(0, 4)))
    return ProxyState(NODE, services, endpoints)


def test_reuse_renders_the_same_as_a_full_render():
    rng = random.Random(4)
    previous_state = random_state(rng, 12)
    previous = render_ruleset(previous_state, settings=SETTINGS)
    for _ in range(20):
        current = random_state(rng, 12)
        changed = current.changed_since(previous_state)
        reused = render_ruleset(current, settings=SETTINGS, reuse=previous, changed=changed)
        assert reused.restore_text() == render_ruleset(current, settings=SETTINGS).restore_text()
        assert reused.hairpin_members == render_ruleset(current, settings=SETTINGS).hairpin_members
        previous_state, previous = current, reused


def test_reuse_is_ignored_when_the_node_changed():
    before = state((web(node_port=30080), THREE))
    after = state((web(node_port=30080), THREE), node=dataclasses.replace(NODE, cluster_cidr="10.245.0.0/16"))
    reused = render_ruleset(after, settings=SETTINGS, reuse=render_ruleset(before, settings=SETTINGS),
                            changed=frozenset())
    assert "10.245.0.0/16" in reused.restore_text()
