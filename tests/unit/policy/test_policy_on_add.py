"""A pod's policy written inside its CNI ADD (policy/pod_binding.py, PolicyEngine.bind_pod),
against the stateful iptables and ipset fakes: bound before and after the Pod is cached, the
wait and its fallback, DEL, the kubelet's later report writing nothing, a burst coalescing."""
from __future__ import annotations

import threading
import time

import pytest

from cni.wiring import host_veth_name
from netagent.infra.metrics import Registry
from netagent.infra.sync_runner import SyncKind
from netagent.kernel import owned
from netagent.kernel.ipset import FakeIpset, iptables_references
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.engine import PolicyEngine, PolicySettings
from netagent.policy.pod_binding import ClosedReason, pod_key
from netagent.policy.iptables.dataplane import IptablesDataplane
from netagent.policy.shared import RenderSettings
from tests.unit.policy.policy_objects import namespace, pod, policy

ISOLATE_A = policy("x", "p", {"podSelector": {"matchLabels": {"app": "a"}},
                              "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "b"}}}]}]})
LONG = 30.0     # a deadline that is never reached when the test is right


def veth(container: str) -> str:
    return host_veth_name("netagent", container, "eth0")


class Node:
    """One node's engine over the fakes; `reservations` stands for the IPAM store's files."""

    def __init__(self) -> None:
        self.iptables = FakeIptables()
        self.ipset = FakeIpset(in_use=iptables_references(self.iptables))
        self.reservations: dict[str, str] = {}           # ip -> container
        self.registry = Registry()
        settings = RenderSettings(PodAttachment.BRIDGE, local_cidrs=("10.0.0.0/24",))
        self.engine = PolicyEngine(PolicySettings("node-1", settings),
                                   dataplane=IptablesDataplane(iptables=self.iptables, ipset=self.ipset),
                                   interface_of=self.lookup, registry=self.registry)
        self.requests = 0
        self.engine.set_requester(self._requested)
        for recorder in (self.engine.namespaces, self.engine.pods, self.engine.policies):
            recorder.on_synced()
        self.engine.namespaces.on_add(namespace("x"))
        self.engine.pods.on_add(pod("x", "b", "10.0.0.3", {"app": "b"}))
        self.reservations["10.0.0.3"] = "cb"
        self.engine.policies.on_add(ISOLATE_A)
        self.engine.sync(SyncKind.FULL)

    def _requested(self) -> None:
        self.requests += 1

    def lookup(self, plan) -> str | None:
        container = self.reservations.get(plan.ip)
        return veth(container) if container else None

    def add(self, name: str, ip: str, container: str, *, ns: str = "x", deadline: float = LONG):
        self.reservations[ip] = container
        return self.engine.bind_pod(ns, name, (f"{ip}/24",), veth(container), container_id=container,
                                    deadline=time.monotonic() + deadline)

    def known(self) -> frozenset[str]:
        return self.ipset.members(owned.POLICY_KNOWN_SET)

    def writes(self) -> tuple[int, int]:
        return len(self.iptables.restores), len(self.ipset.writes)

    def metric(self, text: str) -> str:
        return "\n".join(line for line in self.registry.render().splitlines() if line.startswith(text))


def scheduled(name: str, labels: dict) -> dict:
    """A Pod as the scheduler leaves it: on the node, no address yet."""
    return pod("x", name, None, labels, phase="Pending")


@pytest.fixture
def node() -> Node:
    return Node()


def test_a_cached_pod_is_programmed_before_the_add_returns(node):
    node.engine.pods.on_add(scheduled("a", {"app": "a"}))
    outcome = node.add("a", "10.0.0.2", "ca")
    assert outcome.programmed and outcome.reason is None
    assert node.known() == {"10.0.0.2", "10.0.0.3"}
    chains = node.iptables.list_chains("filter", prefix=owned.POLICY_PREFIX)
    assert any(veth("ca") in str(node.iptables.table("filter").chains[c].rules) for c in chains)
    assert 'netagent_policy_pod_programming_seconds_count 1' in node.metric("netagent_policy_pod_programming")


def test_a_bound_pod_joins_the_selector_sets_of_its_peers(node):
    node.engine.pods.on_add(pod("x", "a", "10.0.0.2", {"app": "a"}))
    node.reservations["10.0.0.2"] = "ca"
    node.engine.sync(SyncKind.PARTIAL)
    node.engine.pods.on_add(scheduled("b2", {"app": "b"}))
    assert node.add("b2", "10.0.0.4", "cb2").programmed
    members = [node.ipset.members(name) for name in node.ipset.list_names()
               if name.startswith(owned.POLICY_SET_PREFIX) and name != owned.POLICY_KNOWN_SET]
    assert {"10.0.0.3", "10.0.0.4"} in members


def test_the_kubelets_later_report_of_the_same_address_writes_nothing(node):
    node.engine.pods.on_add(scheduled("a", {"app": "a"}))
    assert node.add("a", "10.0.0.2", "ca").programmed
    before = node.writes()
    node.engine.pods.on_update(scheduled("a", {"app": "a"}), pod("x", "a", "10.0.0.2", {"app": "a"}))
    assert node.engine.pods.pending() == 1
    node.engine.sync(SyncKind.PARTIAL)
    node.engine.sync(SyncKind.FULL)
    assert node.writes() == before
    assert "10.0.0.2" in node.known()


def test_the_pod_arriving_during_the_wait_is_programmed_before_the_add_returns(node):
    outcomes = []
    adding = threading.Thread(target=lambda: outcomes.append(node.add("a", "10.0.0.2", "ca")))
    adding.start()
    # the ADD has recorded its binding and synced once, without the Pod: it now waits
    deadline = time.monotonic() + LONG
    while not (node.engine.bindings.bound() and node.engine.bindings.synced_epoch >= node.engine.bindings.epoch):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert "10.0.0.2" not in node.known()
    node.engine.pods.on_add(scheduled("a", {"app": "a"}))     # the watch delivers the Pod
    adding.join(LONG)
    assert outcomes[0].programmed and outcomes[0].syncs_run >= 1
    assert "10.0.0.2" in node.known()


def test_no_pod_within_the_wait_returns_closed_then_the_runner_programs_it(node):
    outcome = node.add("late", "10.0.0.5", "cl", deadline=0.2)
    assert not outcome.programmed and outcome.reason is ClosedReason.POD_NOT_IN_CACHE
    assert "10.0.0.5" not in node.known()
    assert 'reason="pod-not-in-cache"} 1' in node.metric("netagent_policy_pods_closed_after_add_total")
    requests = node.requests
    node.engine.pods.on_add(scheduled("late", {"app": "a"}))
    assert node.requests > requests                               # the Pod's arrival asks the runner
    node.engine.sync(SyncKind.PARTIAL)                            # the runner's sync
    assert "10.0.0.5" in node.known()
    assert 'netagent_policy_pod_programming_seconds_count 1' in node.metric("netagent_policy_pod_programming")


def test_a_pod_of_another_node_is_not_programmed_here(node):
    node.engine.pods.on_add(pod("x", "far", None, {"app": "a"}, node="node-2"))
    outcome = node.add("far", "10.0.0.6", "cf", deadline=0.2)
    assert outcome.reason is ClosedReason.NOT_PROGRAMMABLE
    assert "10.0.0.6" not in node.known()


def test_del_unbinds_and_the_stale_status_address_stays_closed(node):
    node.engine.pods.on_add(scheduled("a", {"app": "a"}))
    assert node.add("a", "10.0.0.2", "ca").programmed
    node.engine.pods.on_update(scheduled("a", {"app": "a"}), pod("x", "a", "10.0.0.2", {"app": "a"}))
    assert not node.engine.unbind_pod("x", "a", container_id="other", deadline=time.monotonic() + LONG).programmed
    assert "10.0.0.2" in node.known()                             # another sandbox's DEL: not ours
    assert node.engine.unbind_pod("x", "a", container_id="ca", deadline=time.monotonic() + LONG).programmed
    assert "10.0.0.2" not in node.known()
    assert not any(veth("ca") in str(node.iptables.table("filter").chains[c].rules)
                   for c in node.iptables.list_chains("filter", prefix=owned.POLICY_PREFIX))
    node.engine.sync(SyncKind.FULL)
    assert "10.0.0.2" not in node.known()                         # the status still says 10.0.0.2


def test_a_new_add_owns_an_address_a_stale_status_still_names(node):
    node.engine.pods.on_add(pod("x", "old", "10.0.0.7", {"app": "b"}))  # its kubelet has not caught up
    node.engine.pods.on_add(scheduled("new", {"app": "a"}))
    assert node.add("new", "10.0.0.7", "cn").programmed
    assert node.engine.plan is not None
    assert [p.key for p in node.engine.plan.pods if p.ip == "10.0.0.7"] == ["x/new"]


def burst_while_a_sync_runs(engine: PolicyEngine, add, count: int) -> list:
    """`count` ADDs at once (`add(i)` binds the i-th) while a sync holds the engine, so that every
    binding is recorded before any ADD can write: what a burst meets on a busy node."""
    outcomes: list = []
    version = engine.bindings.version
    engine._sync_lock.acquire()
    threads = [threading.Thread(target=lambda i=index: outcomes.append(add(i))) for index in range(count)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + LONG
    while engine.bindings.version < version + count:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    engine._sync_lock.release()
    for thread in threads:
        thread.join(LONG)
    return outcomes


def test_fifty_concurrent_adds_coalesce_into_one_write(node):
    for index in range(50):
        node.engine.pods.on_add(scheduled(f"p{index}", {"app": "b"}))
    node.engine.sync(SyncKind.PARTIAL)
    before = node.writes()
    outcomes = burst_while_a_sync_runs(node.engine, lambda i: node.add(f"p{i}", f"10.0.0.{100 + i}", f"c{i}"), 50)
    assert len(outcomes) == 50 and all(o.programmed for o in outcomes)
    assert sum(o.syncs_run for o in outcomes) == 1
    restores, ipset_writes = node.writes()
    assert restores - before[0] == 1
    assert {f"10.0.0.{100 + i}" for i in range(50)} <= node.known()


def test_a_failed_write_returns_closed_and_the_runner_retries(node, monkeypatch):
    node.engine.pods.on_add(scheduled("a", {"app": "a"}))
    real = node.iptables.restore

    def broken(text, **kwargs):
        raise RuntimeError("injected")
    monkeypatch.setattr(node.iptables, "restore", broken)
    requests = node.requests
    outcome = node.add("a", "10.0.0.2", "ca")
    assert outcome.reason is ClosedReason.PROGRAMMING_FAILED
    assert node.requests > requests and "10.0.0.2" not in node.known()
    monkeypatch.setattr(node.iptables, "restore", real)
    node.engine.sync(SyncKind.FULL)
    assert "10.0.0.2" in node.known()


def test_an_engine_still_listing_leaves_the_pod_to_the_runner():
    node = Node()
    node.engine.pods.synced.clear()
    assert node.add("a", "10.0.0.2", "ca").reason is ClosedReason.ENGINE_NOT_SYNCED
    node.engine.pods.on_synced()
    node.engine.pods.on_add(scheduled("a", {"app": "a"}))
    node.engine.sync(SyncKind.PARTIAL)
    assert "10.0.0.2" in node.known()


@pytest.mark.parametrize("namespace_, name", [
    ("", "a"), ("x", ""), ("X", "a"), ("x", "a b"), ("x" * 64, "a"), ("x", "a" * 254), ("x", "a/b"),
    ("x", "-a"), (None, "a"), ("x", "a\n"), ("x", "ä")])
def test_malformed_pod_names_are_an_unknown_pod(node, namespace_, name):
    assert pod_key(namespace_, name) is None
    outcome = node.engine.bind_pod(namespace_, name, ("10.0.0.9/24",), "na0", container_id="c",
                                   deadline=time.monotonic() + LONG)
    assert outcome.reason is ClosedReason.UNKNOWN_POD and not node.engine.bindings.bound()


def test_well_formed_names_make_a_key():
    assert pod_key("kube-system", "coredns-5d78c9869d-abcde") == "kube-system/coredns-5d78c9869d-abcde"
    assert pod_key("x", "a.b-c") == "x/a.b-c"
    assert pod_key("x" * 63, "a" * 253) is not None


class _Inner:
    """The plugin's handlers, as far as the wrapper sees them."""

    def __init__(self) -> None:
        self.deleted: list[str] = []

    def add(self, conf, req) -> dict:
        return {"interfaces": [], "ips": [{"address": "10.0.0.2/24", "interface": 1}]}

    def delete(self, conf, req) -> None:
        self.deleted.append(req.container_id)

    def check(self, conf, req) -> None: ...

    def gc(self, conf, req, valid) -> None: ...

    def status(self, conf, req) -> None: ...


def _request(command: str):
    from cni.config import parse_netconf
    from cni.request import CniRequest
    conf = parse_netconf(b'{"cniVersion": "1.0.0", "name": "netagent", "type": "netagent", '
                         b'"ipam": {"type": "netagent-ipam", "ranges": [[{"subnet": "10.0.0.0/24"}]]}}')
    return conf, CniRequest(command, container_id="ca", netns="/proc/1/ns/net", ifname="eth0",
                            args={"K8S_POD_NAMESPACE": "x", "K8S_POD_NAME": "a"})


def test_the_cni_server_binds_after_add_and_unbinds_after_del(node):
    from netagent.cniserver.policy_binding import PolicyBoundHandlers
    node.engine.pods.on_add(scheduled("a", {"app": "a"}))
    handlers = PolicyBoundHandlers(_Inner(), node.engine, wait=LONG)
    conf, req = _request("ADD")
    assert handlers.add(conf, req)["ips"][0]["address"] == "10.0.0.2/24"
    assert "10.0.0.2" in node.known()
    handlers.delete(conf, req)
    assert "10.0.0.2" not in node.known() and handlers.inner.deleted == ["ca"]


def test_a_binder_that_raises_never_fails_the_add():
    from netagent.cniserver.policy_binding import PolicyBoundHandlers

    class Broken:
        def bind_pod(self, *args, **kwargs):
            raise RuntimeError("injected")

        def unbind_pod(self, *args, **kwargs):
            raise RuntimeError("injected")
    inner = _Inner()
    handlers = PolicyBoundHandlers(inner, Broken(), wait=LONG)
    conf, req = _request("ADD")
    assert handlers.add(conf, req)["ips"]
    handlers.delete(conf, req)
    assert inner.deleted == ["ca"]


@pytest.mark.parametrize("value", ["-1", "61", "nan", "soon"])
def test_the_add_wait_flag_refuses_what_would_hold_the_runtime(value):
    import argparse

    from netagent.daemon.policy_start import add_policy_arguments
    parser = argparse.ArgumentParser()
    add_policy_arguments(parser)
    assert parser.parse_args([]).policy_add_wait == 2.0
    assert parser.parse_args(["--policy-add-wait", "0.5"]).policy_add_wait == 0.5
    with pytest.raises(SystemExit):
        parser.parse_args(["--policy-add-wait", value])
