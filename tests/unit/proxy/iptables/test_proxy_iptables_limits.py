"""The iptables backend is bounded and scale-safe (issue 18, item 3 for Services):

- the hairpin set is sized from the state and replaced by a larger one (filled before the
  restore points the rule at it, the old one destroyed after), so `Hash is full` never fails
  a sync (it failed every sync, nothing programmed, at 262,144 members);
- a service port whose lines the tool refuses is left out and everything else programmed;
  it is reported in `unprogrammed`, stays out while unchanged, and is retried when it changes.

FakeIpset refuses members past `maxelem` as the real tool does ("Hash is full"); a small
minimum capacity stands for 262,144 so the test stays quick. The real tools: tests/netns/
test_proxy_iptables.py.
"""
from __future__ import annotations

from netagent.infra.metrics import Registry
from netagent.infra.rejections import Rejections
from netagent.infra.sync_runner import SyncKind
from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.restore_format import parse_restore
from netagent.kernel.iptables.runner import IptablesError
from proxy.iptables import IptablesProxy
from proxy.iptables.names import HAIRPIN_SET, POSTROUTING_CHAIN
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName
from proxy.service_proxy import ProxySettings, ServiceProxy
from tests.unit.proxy.proxy_objects import endpoint, endpoint_slice, service

NODE = NodeContext(name="node-a", cluster_cidr="10.244.0.0/16")


def state(services: int, ports: int, pods: int) -> ProxyState:
    """`services` x `ports` (each its own target port) over the same `pods`."""
    found, eps = {}, {}
    for s in range(services):
        for p in range(ports):
            name = ServicePortName("default", f"svc{s}", f"p{p}")
            found[name] = ServicePort(name=name, protocol=Protocol.TCP, port=1000 + p, cluster_ip=f"10.96.0.{s + 1}")
            eps[name] = tuple(Endpoint(f"10.244.1.{i + 1}", 2000 + s * ports + p, node_name="node-a")
                              for i in range(pods))
    return ProxyState(NODE, found, eps)


def kernel():
    iptables = FakeIptables()
    return iptables, FakeIpset(in_use=iptables_references(iptables))


def hairpin_rule_set(iptables: FakeIptables) -> str:
    rule = iptables.table("nat").chains[POSTROUTING_CHAIN].rules[0]
    return rule[list(rule).index("--match-set") + 1]


def test_the_hairpin_set_grows_past_its_first_capacity_instead_of_failing():
    iptables, ipset = kernel()
    backend = IptablesProxy(iptables=iptables, ipset=ipset, hairpin_minimum=64)
    backend.sync(state(1, 2, 10), changed=None)
    assert hairpin_rule_set(iptables) == HAIRPIN_SET and len(ipset.members(HAIRPIN_SET)) == 20
    big = state(3, 10, 10)                  # 300 members: > 64, the old fixed cap's stand-in
    report = backend.sync(big, changed=frozenset(big.services))   # a partial sync grows it
    grown = hairpin_rule_set(iptables)
    assert grown == "NETAGENT-HAIRPIN-10" and len(ipset.members(grown)) == 300   # 1,024: room for 2x
    assert HAIRPIN_SET not in ipset.sets and report.scope is SyncKind.PARTIAL
    bigger = state(3, 30, 10)               # 900 > 7/8 of 1,024: a full sync grows it (2 x 900 > 7/8 of 2,048)
    backend.sync(bigger, changed=None)
    assert hairpin_rule_set(iptables) == "NETAGENT-HAIRPIN-12" and set(ipset.sets) == {"NETAGENT-HAIRPIN-12"}
    assert len(ipset.members("NETAGENT-HAIRPIN-12")) == 900


def test_a_restarted_agent_adopts_the_larger_set_and_removes_the_rest():
    iptables, ipset = kernel()
    IptablesProxy(iptables=iptables, ipset=ipset, hairpin_minimum=64).sync(state(3, 10, 10), changed=None)
    assert hairpin_rule_set(iptables) == "NETAGENT-HAIRPIN-10"
    restarted = IptablesProxy(iptables=iptables, ipset=ipset, hairpin_minimum=64)
    restarted.sync(state(1, 1, 2), changed=None)     # fits the adopted set: kept, not shrunk
    assert hairpin_rule_set(iptables) == "NETAGENT-HAIRPIN-10" and set(ipset.sets) == {"NETAGENT-HAIRPIN-10"}
    restarted.cleanup()
    assert ipset.sets == {}


REFUSED_ENDPOINT = "10.244.9.9"


class PickyIptables(FakeIptables):
    """FakeIptables that refuses every rule naming REFUSED_ENDPOINT, naming the line, as
    iptables-restore refuses a rule the running kernel or tool cannot take (tests/netns shows
    the real one refusing a cluster IP that is no address)."""

    def restore(self, text, **kwargs):
        for block in parse_restore(text):
            for entry in block.entries:
                if any(REFUSED_ENDPOINT in token for token in entry.spec or ()):
                    line = text.splitlines()[entry.line_number - 1]
                    raise IptablesError("Port not valid", line_number=entry.line_number, line=line)
        return super().restore(text, **kwargs)


def refused_port() -> tuple[ServicePortName, ServicePort]:
    name = ServicePortName("default", "refused", "http")
    return name, ServicePort(name=name, protocol=Protocol.TCP, port=80, cluster_ip="10.96.1.1")


def test_a_service_port_the_tool_refuses_is_left_out_and_the_rest_programmed():
    iptables = PickyIptables()
    backend = IptablesProxy(iptables=iptables, ipset=FakeIpset(in_use=iptables_references(iptables)))
    good = state(2, 2, 3)
    bad_name, bad = refused_port()
    whole = ProxyState(NODE, {**good.services, bad_name: bad},
                       {**good.endpoints, bad_name: (Endpoint(REFUSED_ENDPOINT, 80),)})
    report = backend.sync(whole, changed=None)
    assert set(report.unprogrammed) == {bad_name} and "not valid" in report.unprogrammed[bad_name]
    assert {s.name for s in backend.programmed()} == {str(n) for n in good.services}
    # unchanged, it stays out without another refused restore; the rest still syncs partially
    restores = len(iptables.restores)
    more = ProxyState(NODE, whole.services, {**whole.endpoints, ServicePortName("default", "svc0", "p0"): ()})
    report = backend.sync(more, changed=frozenset({ServicePortName("default", "svc0", "p0")}))
    assert report.scope is SyncKind.PARTIAL and set(report.unprogrammed) == {bad_name}
    assert len(iptables.restores) == restores + 1
    # fixed (here: gone), it is no longer reported
    report = backend.sync(good, changed=frozenset({bad_name}))
    assert report.unprogrammed == {}


def test_a_service_port_whose_rules_cannot_be_rendered_safely_is_left_out_too():
    iptables = FakeIptables()
    backend = IptablesProxy(iptables=iptables, ipset=FakeIpset(in_use=iptables_references(iptables)))
    good = state(1, 1, 2)
    bad_name, bad = refused_port()
    # a value past the parser (a hand-built model): the token rules refuse its newline
    whole = ProxyState(NODE, {**good.services, bad_name: bad},
                       {**good.endpoints, bad_name: (Endpoint("10.244.2.9\n-A INPUT -j ACCEPT", 80),)})
    report = backend.sync(whole, changed=None)
    assert set(report.unprogrammed) == {bad_name} and "cannot be rendered" in report.unprogrammed[bad_name]
    assert {s.name for s in backend.programmed()} == {str(n) for n in good.services}
    assert "INPUT -j ACCEPT" not in "\n".join(str(r) for r in iptables.restores)


def test_the_proxy_rejects_the_unprogrammable_service_and_stays_healthy():
    iptables = PickyIptables()
    backend = IptablesProxy(iptables=iptables, ipset=FakeIpset(in_use=iptables_references(iptables)))
    rejections = Rejections()
    proxy = ServiceProxy(api_client=None, settings=ProxySettings(node_name="node-a"), backend=backend,
                         registry=Registry(), rejections=rejections.scope("proxy"))
    long = service("y" * 1100, cluster_ip="10.96.1.1")
    proxy.services.on_add(service("web"))
    proxy.services.on_add(long)
    proxy.slices.on_add(endpoint_slice("web-1", "web", [endpoint("10.244.1.5")]))
    proxy.slices.on_add(endpoint_slice("long-1", "y" * 1100, [endpoint(REFUSED_ENDPOINT)]))
    proxy._sync(SyncKind.FULL)         # does not raise: the sync succeeds for the rest
    assert {s.name for s in backend.programmed()} == {"default/web:http"}
    [record] = rejections.snapshot()
    assert (record.ref.key, record.reason) == (f"default/{'y' * 1100}", "unprogrammable")
    assert proxy.rejections.health_details() and "not valid" in proxy.rejections.health_details()[0]
    proxy.services.on_delete(long)
    proxy._sync(SyncKind.PARTIAL)
    assert rejections.snapshot() == []


# ---- the IPVS backend's hairpin set grows the same way ----------------------------------------

def ipvs_kernel():
    from netagent.kernel.fake_sysctl import FakeSysctls
    from proxy.ipvs.fake_device import FakeAddressDevice
    from proxy.ipvs.fake_table import FakeIpvsTable
    from proxy.ipvs.proxy import IpvsProxy
    from proxy.ipvs.sysctls import IPVS_SYSCTLS
    iptables, ipset = kernel()
    proxy = IpvsProxy(table=FakeIpvsTable(), device=FakeAddressDevice(), ipset=ipset, iptables=iptables,
                      sysctls=FakeSysctls({s.key: "0" for s in IPVS_SYSCTLS}), hairpin_minimum=64)
    return proxy, iptables, ipset


def ipvs_hairpin_rule_set(iptables: FakeIptables) -> str:
    rule = iptables.table("nat").chains["NETAGENT-IPVS-POSTRTG"].rules[0]
    return rule[list(rule).index("--match-set") + 1]


def test_the_ipvs_hairpin_set_grows_too():
    proxy, iptables, ipset = ipvs_kernel()
    small = state(1, 2, 10)
    proxy.sync(small, changed=None)
    assert ipvs_hairpin_rule_set(iptables) == "NETAGENT-IPVS-HAIRPIN"
    big = state(3, 10, 10)          # 300 members > 64: the partial sync becomes a full one that grows it
    report = proxy.sync(big, changed=frozenset(big.services) - frozenset(small.services))
    assert report.scope is SyncKind.FULL
    assert ipvs_hairpin_rule_set(iptables) == "NETAGENT-IPVS-HAIRPIN-10"
    assert len(ipset.members("NETAGENT-IPVS-HAIRPIN-10")) == 300 and "NETAGENT-IPVS-HAIRPIN" not in ipset.sets
    more = state(3, 11, 10)         # 330 still fits: partial, into the grown set
    report = proxy.sync(more, changed=frozenset(more.services) | frozenset(big.services))
    assert report.scope is SyncKind.PARTIAL and len(ipset.members("NETAGENT-IPVS-HAIRPIN-10")) == 330
    proxy.cleanup()
    assert not [name for name in ipset.sets if "HAIRPIN" in name]
