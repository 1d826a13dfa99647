"""IptablesProxy against FakeIptables and FakeIpset: full and partial syncs reach the same
kernel state, stale chains go, failures make the next sync full, a restarted agent adopts
what is there, the hairpin set is written in the right order around the rules that use it,
and cleanup removes exactly what is ours."""
import dataclasses
import random

import pytest

from netagent.infra.sync_runner import SyncKind
from netagent.kernel.ipset import FakeIpset, IpsetError, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.restore_format import parse_save, split_tokens
from netagent.kernel.iptables.runner import IptablesError, PortRandomization
from netagent.noderoutes.masquerade import MasqueradeManager
from proxy.backend import ProgrammedService
from proxy.iptables import IptablesProxy
from proxy.iptables.names import HAIRPIN_SET, is_owned_chain
from proxy.iptables.render import render_ruleset
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName, TrafficPolicy

NODE = NodeContext(name="node-a", cluster_cidr="10.244.0.0/16")
WEB = ServicePortName("default", "web", "http")
DNS = ServicePortName("kube-system", "dns", "dns")


def service(name: ServicePortName, cluster_ip: str, **fields) -> ServicePort:
    return ServicePort(name=name, protocol=fields.pop("protocol", Protocol.TCP), port=fields.pop("port", 80),
                       cluster_ip=cluster_ip, **fields)


def endpoints(*hosts: int, subnet: int = 1, port: int = 8080, node: str = "node-a") -> tuple[Endpoint, ...]:
    return tuple(Endpoint(f"10.244.{subnet}.{host}", port, node_name=node) for host in hosts)


BASE = ProxyState(NODE,
                  {WEB: service(WEB, "10.96.0.10", node_port=30080),
                   DNS: service(DNS, "10.96.0.53", protocol=Protocol.UDP, port=53)},
                  {WEB: endpoints(2, 3, 4), DNS: endpoints(9, port=53)})


class Kernel:
    """A fake iptables and a fake ipset that knows which sets the iptables rules use."""

    def __init__(self):
        self.iptables = FakeIptables()
        self.ipset = FakeIpset(in_use=iptables_references(self.iptables))

    def backend(self, **kwargs) -> IptablesProxy:
        return IptablesProxy(iptables=self.iptables, ipset=self.ipset, **kwargs)

    def snapshot(self):
        members = self.ipset.members(HAIRPIN_SET) if HAIRPIN_SET in self.ipset.sets else None
        return self.iptables.save(), members


def fresh_full(state: ProxyState):
    kernel = Kernel()
    kernel.backend().sync(state, changed=None)
    return kernel.snapshot()


class FaultyIptables:
    """Wraps an Iptables; `fail_next_restore()` makes the next restore raise before applying."""

    def __init__(self, inner):
        self.inner = inner
        self.failures = 0

    def fail_next_restore(self):
        self.failures += 1

    def restore(self, text, **kwargs):
        if self.failures:
            self.failures -= 1
            raise IptablesError("injected failure")
        return self.inner.restore(text, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


# ---- full sync ---------------------------------------------------------------------------------

def test_full_sync_writes_the_rendered_ruleset_and_the_jumps_on_top():
    kernel = Kernel()
    kernel.iptables.restore("*nat\n:OTHER - [0:0]\n-A PREROUTING -j OTHER\nCOMMIT\n")
    report = kernel.backend().sync(BASE, changed=None)
    ruleset = render_ruleset(BASE, settings=kernel.backend().settings)
    assert report.scope is SyncKind.FULL and report.services_written == 2 and report.rules == ruleset.rule_count
    saved = parse_save(kernel.iptables.save())
    for chain in ruleset.chains():
        assert saved[chain.table].chains[chain.name].rules == [tuple(split_tokens(line)[2:]) for line in chain.rules]
    owned = {name for table in saved.values() for name in table.chains if is_owned_chain(name)}
    assert owned == {chain.name for chain in ruleset.chains()}
    assert saved["nat"].chains["PREROUTING"].rules[0][-1] == "NETAGENT-SERVICES"
    assert saved["nat"].chains["PREROUTING"].rules[1] == ("-j", "OTHER")
    for hook in ("INPUT", "FORWARD", "OUTPUT"):
        assert saved["filter"].chains[hook].rules[0][-1] in ("NETAGENT-SVC-FILTER", "NETAGENT-SVC-FORWARD")
    assert kernel.ipset.members(HAIRPIN_SET) == ruleset.hairpin_members


def test_a_second_backend_adopts_without_changing_anything():
    kernel = Kernel()
    kernel.backend().sync(BASE, changed=None)
    before = kernel.snapshot()
    writes = len(kernel.ipset.writes)
    report = kernel.backend().sync(BASE, changed=None)   # a restarted agent: no memory
    assert report.scope is SyncKind.FULL
    assert kernel.snapshot() == before
    assert all(not write.added and not write.removed for write in kernel.ipset.writes[writes:])
    assert "-I" not in kernel.iptables.restores[-1].text   # the jumps were in place: not rewritten


def test_full_sync_removes_stale_chains_and_jumps_into_them():
    kernel = Kernel()
    kernel.backend().sync(BASE, changed=None)
    stale = ["NETAGENT-SVC-AAAAAAAAAAAAAAA", "NETAGENT-SEP-BBBBBBBBBBBBBBB", "NETAGENT-FW-CCCCCCCCCCCCCCC"]
    kernel.iptables.restore(
        "*nat\n" + "".join(f":{name} - [0:0]\n" for name in stale) +
        ":OTHER - [0:0]\n"
        f"-A {stale[0]} -j {stale[1]}\n-A {stale[2]} -j {stale[0]}\n"
        f"-A NETAGENT-SERVICES -d 10.96.9.9/32 -j {stale[0]}\n-A OTHER -j {stale[2]}\nCOMMIT\n")
    kernel.backend().sync(BASE, changed=None)
    assert kernel.snapshot() == fresh_full_with_other_chain(BASE)


def fresh_full_with_other_chain(state):
    kernel = Kernel()
    kernel.iptables.restore("*nat\n:OTHER - [0:0]\nCOMMIT\n")
    kernel.backend().sync(state, changed=None)
    return kernel.snapshot()


def test_full_sync_repairs_a_deleted_jump_and_a_flushed_chain():
    kernel = Kernel()
    backend = kernel.backend()
    backend.sync(BASE, changed=None)
    good = kernel.snapshot()
    kernel.iptables.restore('*nat\n-D PREROUTING -m comment --comment "netagent: service portals" '
                            '-j NETAGENT-SERVICES\n-F NETAGENT-SERVICES\nCOMMIT\n')
    kernel.ipset.update(HAIRPIN_SET, add=["10.244.7.7,tcp:80,10.244.7.7"])
    backend.sync(BASE, changed=None)
    assert kernel.snapshot() == good


# ---- partial sync ------------------------------------------------------------------------------

def random_state(rng: random.Random) -> ProxyState:
    services, endpoint_sets = {}, {}
    for index in rng.sample(range(8), rng.randrange(2, 8)):
        name = ServicePortName("ns", f"svc{index}", "p")
        services[name] = service(
            name, f"10.96.0.{index + 1}", protocol=rng.choice(list(Protocol)),
            node_port=30000 + index if rng.random() < 0.5 else None,
            external_ips=("192.0.2.1",) if rng.random() < 0.2 else (),
            load_balancer_ips=("198.51.100.1",) if rng.random() < 0.2 else (),
            load_balancer_source_ranges=("203.0.113.0/24",) if rng.random() < 0.5 else (),
            affinity_timeout=rng.choice([None, 30]),
            external_policy=rng.choice(list(TrafficPolicy)))
        endpoint_sets[name] = tuple(
            Endpoint(f"10.244.{index}.{host}", 8080, node_name=rng.choice(["node-a", "node-b"]),
                     ready=rng.random() < 0.8)
            for host in rng.sample(range(1, 6), rng.randrange(0, 5)))
    return ProxyState(NODE, services, endpoint_sets)


def test_partial_syncs_reach_the_same_state_as_a_full_sync_from_scratch():
    rng = random.Random(11)
    kernel = Kernel()
    backend = kernel.backend()
    current = random_state(rng)
    backend.sync(current, changed=None)
    for _ in range(25):
        following = random_state(rng)
        changed = following.changed_since(current)
        report = backend.sync(following, changed=changed)
        assert report.scope is SyncKind.PARTIAL
        assert kernel.snapshot() == fresh_full(following)
        current = following


def test_partial_sync_writes_only_the_changed_service_chains():
    kernel = Kernel()
    backend = kernel.backend()
    backend.sync(BASE, changed=None)
    moved = ProxyState(NODE, BASE.services, {**BASE.endpoints, WEB: endpoints(2, 3, 5)})
    report = backend.sync(moved, changed=frozenset({WEB}))
    text = kernel.iptables.restores[-1].text
    assert report.scope is SyncKind.PARTIAL and report.services_written == 1
    assert "*filter" not in text and "NETAGENT-SERVICES" not in text and "10.96.0.53" not in text
    assert "10.244.1.5:8080" in text
    assert kernel.snapshot() == fresh_full(moved)

    added = ProxyState(NODE, {**moved.services, DNS: dataclasses.replace(moved.services[DNS], node_port=30053)},
                       moved.endpoints)
    backend.sync(added, changed=frozenset({DNS}))
    text = kernel.iptables.restores[-1].text
    assert "NETAGENT-NODEPORTS" in text and "10.244.1.5:8080" not in text   # web's chains untouched
    assert kernel.snapshot() == fresh_full(added)


def test_nothing_changed_writes_nothing():
    kernel = Kernel()
    backend = kernel.backend()
    backend.sync(BASE, changed=None)
    restores, writes = len(kernel.iptables.restores), len(kernel.ipset.writes)
    assert backend.sync(BASE, changed=frozenset()).scope is SyncKind.PARTIAL
    assert len(kernel.iptables.restores) == restores and len(kernel.ipset.writes) == writes


def test_the_first_sync_is_full_even_when_given_changes():
    kernel = Kernel()
    assert kernel.backend().sync(BASE, changed=frozenset({WEB})).scope is SyncKind.FULL
    assert kernel.snapshot() == fresh_full(BASE)


def test_a_changed_node_makes_the_sync_full():
    kernel = Kernel()
    backend = kernel.backend()
    backend.sync(BASE, changed=None)
    moved = ProxyState(dataclasses.replace(NODE, cluster_cidr="10.245.0.0/16"), BASE.services, BASE.endpoints)
    assert backend.sync(moved, changed=frozenset()).scope is SyncKind.FULL
    assert kernel.snapshot() == fresh_full(moved)


def test_a_failed_restore_raises_and_the_next_sync_is_full():
    kernel = Kernel()
    faulty = FaultyIptables(kernel.iptables)
    backend = IptablesProxy(iptables=faulty, ipset=kernel.ipset)
    backend.sync(BASE, changed=None)
    moved = ProxyState(NODE, BASE.services, {**BASE.endpoints, WEB: endpoints(2)})
    faulty.fail_next_restore()
    with pytest.raises(IptablesError):
        backend.sync(moved, changed=frozenset({WEB}))
    report = backend.sync(moved, changed=frozenset())   # the core forgot to ask: still full
    assert report.scope is SyncKind.FULL
    assert kernel.snapshot() == fresh_full(moved)


def test_a_failed_hairpin_update_raises_and_the_next_sync_is_full():
    kernel = Kernel()
    backend = kernel.backend()
    backend.sync(BASE, changed=None)
    kernel.iptables.restore("*nat\n-F NETAGENT-SVC-POSTRTG\nCOMMIT\n")   # so the set can go
    kernel.ipset.destroy(HAIRPIN_SET)
    moved = ProxyState(NODE, BASE.services, {**BASE.endpoints, WEB: endpoints(2, 3, 4, 5)})
    with pytest.raises(IpsetError):
        backend.sync(moved, changed=frozenset({WEB}))
    assert backend.sync(moved, changed=frozenset({WEB})).scope is SyncKind.FULL
    assert kernel.snapshot() == fresh_full(moved)


# ---- the hairpin set's order around the rules ------------------------------------------------

class Journal:
    """Records restores and the ipset updates that change something, in one sequence."""

    def __init__(self, kernel: Kernel):
        self.events = []
        journal = self
        real_restore, real_update = kernel.iptables.restore, kernel.ipset.update

        def restore(text, **kwargs):
            journal.events.append("restore")
            return real_restore(text, **kwargs)

        def update(name, *, add=(), remove=()):
            add, remove = list(add), list(remove)
            if add or remove:
                journal.events.append(("add" if add else "") + ("remove" if remove else ""))
            return real_update(name, add=add, remove=remove)
        kernel.iptables.restore = restore
        kernel.ipset.update = update


@pytest.mark.parametrize("changed", [None, frozenset({WEB})], ids=["full", "partial"])
def test_members_are_added_before_the_restore_and_removed_after(changed):
    kernel = Kernel()
    backend = kernel.backend()
    backend.sync(BASE, changed=None)
    journal = Journal(kernel)
    backend.sync(ProxyState(NODE, BASE.services, {**BASE.endpoints, WEB: endpoints(2, 3, 4, 5)}), changed=changed)
    assert journal.events == ["add", "restore"]
    journal.events.clear()
    backend.sync(BASE, changed=changed)
    assert journal.events == ["restore", "remove"]


# ---- read back and clean up --------------------------------------------------------------------

def test_programmed_reads_names_addresses_and_backends_back_after_a_restart():
    state = ProxyState(
        NODE,
        {WEB: service(WEB, "10.96.0.10", node_port=30080, external_ips=("192.0.2.10",),
                      load_balancer_ips=("198.51.100.7",), load_balancer_source_ranges=("203.0.113.0/24",),
                      external_policy=TrafficPolicy.LOCAL, affinity_timeout=60),
         DNS: service(DNS, "10.96.0.53", protocol=Protocol.UDP, port=53)},
        {WEB: endpoints(2, 3) + endpoints(4, subnet=2, node="node-b")})
    kernel = Kernel()
    kernel.backend().sync(state, changed=None)
    local = ("10.244.1.2:8080", "10.244.1.3:8080")
    assert kernel.backend().programmed() == [
        ProgrammedService("default/web:http", "10.96.0.10:80/TCP", "ClusterIP", local + ("10.244.2.4:8080",)),
        ProgrammedService("default/web:http", "192.0.2.10:80/TCP", "ExternalIP", local),
        ProgrammedService("default/web:http", "198.51.100.7:80/TCP", "LoadBalancer", local),
        ProgrammedService("default/web:http", "*:30080/TCP", "NodePort", local),
        ProgrammedService("kube-system/dns:dns", "10.96.0.53:53/UDP", "ClusterIP", ()),
    ]


def test_programmed_lists_each_nodeport_address():
    state = ProxyState(dataclasses.replace(NODE, nodeport_addresses=("192.168.0.5", "192.168.1.5")),
                       {WEB: service(WEB, "10.96.0.10", node_port=30080)}, {WEB: endpoints(2)})
    kernel = Kernel()
    kernel.backend().sync(state, changed=None)
    nodeports = [entry.address for entry in kernel.backend().programmed() if entry.kind == "NodePort"]
    assert nodeports == ["192.168.0.5:30080/TCP", "192.168.1.5:30080/TCP"]


def test_cleanup_removes_ours_and_leaves_masquerade_and_other_tools_alone():
    kernel = Kernel()
    masquerade = MasqueradeManager(runner=kernel.iptables, cluster_cidrs=["10.244.0.0/16"],
                                   pod_cidrs=["10.244.1.0/24"])
    masquerade.ensure()
    kernel.iptables.restore("*nat\n:OTHER - [0:0]\n-A OUTPUT -j OTHER\n-A OTHER -p tcp -j RETURN\nCOMMIT\n")
    before = kernel.iptables.save()
    backend = kernel.backend()
    backend.sync(BASE, changed=None)
    backend.cleanup()
    assert kernel.iptables.save() == before
    assert masquerade.check() == []
    assert HAIRPIN_SET not in kernel.ipset.sets
    backend.cleanup()   # idempotent
    assert backend.sync(BASE, changed=frozenset({WEB})).scope is SyncKind.FULL   # memory forgotten


def test_old_iptables_gets_masquerade_without_random_fully():
    kernel = Kernel()
    kernel.iptables = FakeIptables(version=(1, 4, 21))
    kernel.ipset = FakeIpset(in_use=iptables_references(kernel.iptables))
    backend = kernel.backend()
    assert backend.settings.ports is PortRandomization.KERNEL_DEFAULT
    backend.sync(BASE, changed=None)
    assert "--random-fully" not in kernel.iptables.save()
