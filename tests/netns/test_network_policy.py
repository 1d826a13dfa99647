"""NetworkPolicy truth tables on the real kernel: nine pods wired by our CNI plugin (bridge and
routed mode), every pair probed for each policy set, the whole matrix compared with a
hand-written expectation (see policy_lab.py; matrices are printed on failure).

One lab per mode and dataplane serves every case of that pair (building it costs a few
seconds); each case sets its own policies and labels and puts them back, so the cases do not
depend on order. Every case runs on both dataplanes with the same assertions: iptables chains
and ipsets, and the nft table `netagent run --proxy-mode nftables` programs.

IPv6 (issue 22): the cases taking `npf` also run on a dual-stack lab probed over IPv6 (routed
mode, both dataplanes: ip6tables with `inet6` sets, and `ip6 netagent-policy`), a
representative subset of the table; the dual-stack cases are test_network_policy_dual.py's.
The labs and fixtures are policy_cases.py's.
"""
from __future__ import annotations

import json

import pytest

from netagent.infra.sync_runner import SyncKind
from netagent.kernel import namespaces, owned
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.backend import IptablesBackend
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.shared import pod_chain
from proxy.backend import ProxyMode
from tests.netns.policy_cases import (  # noqa: F401 (fixtures)
    TCP80, TCP81, UDP80, UDP81, X, Y, Z, _root_and_no_leaks, cluster_block, host, labs, np, np_bridge,
    np_iptables, np_nft, npf, npf_iptables6, outside_block, pods, policy, status_of)
from tests.netns.policy_lab import Expect


def test_no_policy_everything_reaches_everything(np):
    np.check(Expect(True), [TCP80, UDP81])


def test_deny_all_ingress_in_a_namespace_but_replies_and_the_node_pass(npf):
    np = npf
    np.apply(policy("x", "deny-all", {"podSelector": {}, "policyTypes": ["Ingress"]}))
    np.check(Expect(True).deny(targets=X), [TCP80, UDP80])
    # the isolated pods still reach out, and their replies come back (conntrack)
    np.check(Expect(True), [TCP80], sources=X, targets=Y)
    # kubelet probes: the pod's own node reaches it
    node = np.netns_of["node"]
    assert namespaces.run_in(node, ["python3", "-c", f"import socket; socket.create_connection(('{np.addresses['x/a']}', 80), 10)"]).returncode == 0
    # in the probed family's own dataplane: ip6tables (kernel_text of the family) or the ip6 table
    kernel = np.kernel_text()
    assert pod_chain(owned.POLICY_INGRESS_PREFIX, "x/a") in kernel
    if np.dataplane is ProxyMode.NFTABLES:
        assert f"table {'ip6' if np.family is IpFamily.V6 else 'ip'} {owned.NFT_POLICY_TABLE}" in kernel


def test_allow_all_ingress_rule_opens_again(np_bridge):
    np_bridge.apply(policy("x", "deny-all", {"podSelector": {}, "policyTypes": ["Ingress"]}),
             policy("x", "allow-all", {"podSelector": {}, "ingress": [{}]}))
    np_bridge.check(Expect(True), [TCP80])


def test_pod_selector_peer_is_the_policy_namespace_only(np_bridge):
    np_bridge.apply(policy("x", "from-b", {"podSelector": pods(pod="a"), "ingress": [{"from": [{"podSelector": pods(pod="b")}]}]}))
    np_bridge.check(Expect(True).deny(targets=["x/a"]).allow(sources=["x/b"], targets=["x/a"]), [TCP80])


def test_namespace_selector_alone_means_every_pod_there(np_bridge):
    np_bridge.apply(policy("x", "from-y", {"podSelector": pods(pod="a"),
                                    "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"ns": "y"}}}]}]}))
    np_bridge.check(Expect(True).deny(targets=["x/a"]).allow(sources=Y, targets=["x/a"]), [TCP80])


def test_namespace_and_pod_selector_in_one_peer_is_and(np_bridge):
    np_bridge.apply(policy("x", "and", {"podSelector": pods(pod="a"), "ingress": [{"from": [
        {"namespaceSelector": {"matchLabels": {"ns": "y"}}, "podSelector": pods(pod="b")}]}]}))
    np_bridge.check(Expect(True).deny(targets=["x/a"]).allow(sources=["y/b"], targets=["x/a"]), [TCP80])


def test_two_peers_are_or(np_bridge):
    np_bridge.apply(policy("x", "or", {"podSelector": pods(pod="a"), "ingress": [{"from": [
        {"namespaceSelector": {"matchLabels": {"ns": "y"}}}, {"podSelector": pods(pod="b")}]}]}))
    np_bridge.check(Expect(True).deny(targets=["x/a"]).allow(sources=[*Y, "x/b"], targets=["x/a"]), [TCP80])


def test_match_expressions(np_bridge):
    np_bridge.apply(policy("x", "expr", {"podSelector": pods(pod="a"), "ingress": [{"from": [
        {"namespaceSelector": {"matchExpressions": [{"key": "ns", "operator": "NotIn", "values": ["x", "y"]}]},
         "podSelector": {"matchExpressions": [{"key": "pod", "operator": "In", "values": ["a", "c"]}]}}]}]}))
    np_bridge.check(Expect(True).deny(targets=["x/a"]).allow(sources=["z/a", "z/c"], targets=["x/a"]), [TCP80])


def test_ip_block_with_except_covers_pods_and_the_outside(npf):
    np = npf
    np.apply(policy("x", "block", {"podSelector": pods(pod="a"), "ingress": [{"from": [
        {"ipBlock": {"cidr": cluster_block(np), "except": [host(np, "y/b")]}},
        {"ipBlock": {"cidr": outside_block(np)}}]}]}))
    np.check(Expect(True).deny(sources=["y/b"], targets=["x/a"]), [TCP80])
    np.apply(policy("x", "block", {"podSelector": pods(pod="a"), "ingress": [{"from": [
        {"ipBlock": {"cidr": host(np, "z/c")}}]}]}))
    np.check(Expect(True).deny(targets=["x/a"]).allow(sources=["z/c"], targets=["x/a"]), [TCP80])


def test_ports_by_number_protocol_and_range(np_bridge):
    np_bridge.apply(policy("x", "ports", {"podSelector": {}, "ingress": [{"ports": [{"port": 80}]},
                                                                    {"ports": [{"protocol": "UDP", "port": 80,
                                                                                "endPort": 81}]}]}))
    np_bridge.check(Expect(True).deny(targets=X, probes=[TCP81]), [TCP80, TCP81, UDP80, UDP81])


def test_named_port_resolves_per_destination_pod(np_bridge):
    np_bridge.apply(policy("x", "named", {"podSelector": {}, "ingress": [{"ports": [{"port": "serve"}]}]}))
    # x/a names 80 "serve", x/b names 81, x/c has no such port
    np_bridge.check(Expect(True).deny(targets=X).allow(targets=["x/a"], probes=[TCP80])
             .allow(targets=["x/b"], probes=[TCP81]), [TCP80, TCP81])


def test_empty_from_list_is_every_source_but_empty_ingress_is_none(np_bridge):
    np_bridge.apply(policy("x", "empty-from", {"podSelector": pods(pod="a"), "ingress": [{"from": [], "ports": [{"port": 80}]}]}),
             policy("x", "no-rules", {"podSelector": pods(pod="b"), "policyTypes": ["Ingress"], "ingress": []}))
    np_bridge.check(Expect(True).deny(targets=["x/a"], probes=[TCP81]).deny(targets=["x/b"]), [TCP80, TCP81])


def test_egress_deny_all_keeps_ingress_and_replies(npf):
    np = npf
    np.apply(policy("x", "no-egress", {"podSelector": pods(pod="a"), "policyTypes": ["Egress"]}))
    np.check(Expect(True).deny(sources=["x/a"]), [TCP80, UDP80], sources=["x/a", "y/a", "ext"])


def test_egress_named_port_resolves_per_destination(npf):
    np = npf
    np.apply(policy("x", "egress-named", {"podSelector": pods(pod="a"),
                                          "egress": [{"to": [{"namespaceSelector": {}}],
                                                      "ports": [{"port": "serve"}, {"port": "serve-udp", "protocol": "UDP"}]}]}))
    # policyTypes defaulted to [Ingress, Egress]: x/a is closed for ingress too (no ingress rule)
    allowed_80 = [t for t in X + Y + Z if t.endswith("/a")]
    allowed_81 = [t for t in X + Y + Z if t.endswith("/b")]
    expect = (Expect(True).deny(targets=["x/a"]).deny(sources=["x/a"])
              .allow(sources=["x/a"], targets=allowed_80, probes=[TCP80, UDP80])
              .allow(sources=["x/a"], targets=allowed_81, probes=[TCP81, UDP81]))
    np.check(expect, [TCP80, TCP81, UDP80, UDP81], sources=["x/a", "x/b"])


def test_egress_to_a_namespace_on_one_port(np_bridge):
    np_bridge.apply(policy("x", "to-z", {"podSelector": pods(pod="b"), "policyTypes": ["Egress"], "egress": [
        {"to": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}], "ports": [{"port": 81, "protocol": "UDP"}]}]}))
    np_bridge.check(Expect(True).deny(sources=["x/b"]).allow(sources=["x/b"], targets=Z, probes=[UDP81]),
             [TCP81, UDP81], sources=["x/b", "y/b"])


def test_egress_section_without_policy_types_isolates_both_ways(np_bridge):
    np_bridge.apply(policy("y", "egress-only", {"podSelector": pods(pod="c"), "egress": [{"to": [{"podSelector": {}}]}]}),
             policy("z", "empty-egress", {"podSelector": pods(pod="c"), "egress": []}))
    # y/c: ingress closed, egress only to y's pods; z/c: `egress: []` defaults to Ingress only
    np_bridge.check(Expect(True).deny(targets=["y/c", "z/c"]).deny(sources=["y/c"]).allow(sources=["y/c"], targets=Y),
             [TCP80])


def test_relabelled_pod_and_namespace_change_set_members_only(np):
    np.apply(policy("x", "from-b-in-blue", {"podSelector": pods(pod="a"), "ingress": [{"from": [
        {"namespaceSelector": {"matchLabels": {"team": "blue"}}, "podSelector": pods(pod="b")}]}]}))
    np.check(Expect(True).deny(targets=["x/a"]), [TCP80], targets=["x/a"])
    try:
        np.relabel_namespace("z", {"ns": "z", "team": "blue"})
        np.sync()
        report = np.engine.last_report
        assert report is not None and report.chains_written == 0 and report.sets_changed >= 1
        np.check(Expect(True).deny(targets=["x/a"]).allow(sources=["z/b"], targets=["x/a"]), [TCP80], targets=["x/a"])
        np.relabel_pod("z/c", {"pod": "b"})
        np.sync()
        assert np.engine.last_report.chains_written == 0
        np.check(Expect(True).deny(targets=["x/a"]).allow(sources=["z/b", "z/c"], targets=["x/a"]), [TCP80],
                 targets=["x/a"])
    finally:
        np.relabel_pod("z/c", {"pod": "c"})
        np.relabel_namespace("z", {"ns": "z"})
        np.sync()


def test_policy_deleted_opens_and_removes_its_chains(np):
    np.apply(policy("x", "deny-all", {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}))
    np.check(Expect(True).deny(targets=X).deny(sources=X), [TCP80])
    np.apply()
    np.check(Expect(True), [TCP80])
    saved = np.kernel_text()
    assert "NETAGENT-NPI-" not in saved and "NETAGENT-NPE-" not in saved




def test_new_pods_are_closed_until_programmed_then_follow_the_policies(npf_iptables6):
    np = npf_iptables6
    np.apply(policy("x", "from-b", {"podSelector": pods(pod="a"), "ingress": [{"from": [{"podSelector": pods(pod="b")}]}]}))
    try:
        # wired by the CNI plugin, not yet seen by the engine: closed both ways, selected or not
        np.add_pod("x", "d", {"pod": "d"}, record=False)
        np.add_pod("x", "e", {"pod": "a"}, record=False)
        new = ["x/d", "x/e"]
        np.check(Expect(False), [TCP80], sources=["x/b", "y/a"], targets=new)
        np.check(Expect(False), [TCP80], sources=new, targets=["x/b", "y/a"])
        np.engine.pods.on_add(np.pod_objects["x/d"])
        np.engine.pods.on_add(np.pod_objects["x/e"])
        np.sync()
        # x/d is selected by nothing: open; x/e carries pod=a: only x/b reaches it
        np.check(Expect(True).deny(targets=["x/a", "x/e"]).allow(sources=["x/b"], targets=["x/a", "x/e"]), [TCP80],
                 sources=["x/b", "y/a", "x/d", "x/e"])
    finally:
        for key in ("x/d", "x/e"):
            if key in np.pod_objects:
                np.remove_pod(key)
        np.sync()


@pytest.mark.parametrize("backend", list(IptablesBackend), ids=lambda b: b.value)
def test_adoption_after_restart_writes_nothing_on_either_backend(np_iptables, backend):
    """Programs with one backend, restarts on it (a FULL sync must write nothing: what
    iptables-save prints compares equal with the rendered rules), then puts the lab back."""
    np = np_iptables
    used = np.backend
    np.apply(policy("x", "all-kinds", {"podSelector": {}, "ingress": [
        {"from": [{"podSelector": pods(pod="b")}, {"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.1.0/28"]}}],
         "ports": [{"port": "serve"}, {"port": 81, "endPort": 90, "protocol": "UDP"}]}],
        "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "serve"}]}, {"ports": [{"protocol": "UDP"}]}]}))
    try:
        if backend is not used:
            np.engine.dataplane.cleanup()
            np.restart_engine(backend)
            np.sync(SyncKind.FULL)
        engine = np.restart_engine()
        np.sync(SyncKind.FULL)
        assert engine.last_report is not None and not engine.last_report.wrote, engine.last_report
        np.check(Expect(True).deny(targets=X).allow(sources=["x/b"], targets=["x/a"], probes=[TCP80])
                 .deny(sources=X).allow(sources=X, targets=["x/a", "y/a", "z/a"], probes=[TCP80]),
                 [TCP80], sources=["x/a", "x/b", "y/b"], targets=["x/a", "y/a"])
    finally:
        if backend is not used:
            np.engine.dataplane.cleanup()
            np.restart_engine(used)
            np.sync(SyncKind.FULL)


def test_nft_adoption_writes_nothing_and_a_full_sync_repairs_drift(np_nft):
    """nftables: a restarted agent's FULL sync reads the table back and writes nothing; drift
    made by hand (a pod chain flushed, a KNOWN element and a verdict map element deleted, an
    `accept` put first in our base chain) is all repaired by the next FULL sync, in one
    transaction, and the probes say the policy holds again."""
    np = np_nft
    np.apply(policy("x", "all-kinds", {"podSelector": {}, "ingress": [
        {"from": [{"podSelector": pods(pod="b")}, {"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.1.0/28"]}}],
         "ports": [{"port": "serve"}, {"port": 81, "endPort": 90, "protocol": "UDP"}]}],
        "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "serve"}]}, {"ports": [{"protocol": "UDP"}]}]}))
    expect = (Expect(True).deny(targets=X).allow(sources=["x/b"], targets=["x/a"], probes=[TCP80])
              .deny(sources=X).allow(sources=X, targets=["x/a", "y/a", "z/a"], probes=[TCP80]))
    where = {"sources": ["x/a", "x/b", "y/b"], "targets": ["x/a", "y/a"]}
    engine = np.restart_engine()
    np.sync(SyncKind.FULL)
    assert engine.last_report is not None and not engine.last_report.wrote, engine.last_report
    np.check(expect, [TCP80], **where)

    table = f"ip {owned.NFT_POLICY_TABLE}"
    key = np.veths[np.addresses["x/a"]] if np.mode is PodAttachment.ROUTED else np.addresses["x/a"]
    key = f'"{key}"' if np.mode is PodAttachment.ROUTED else key
    for command in (f"flush chain {table} {pod_chain(owned.POLICY_INGRESS_PREFIX, 'x/a')}",
                    f"delete element {table} {owned.POLICY_KNOWN_SET} {{ {np.addresses['y/a']} }}",
                    f"delete element {table} {owned.POLICY_PREFIX}-EGRESS {{ {key} }}",
                    f"insert rule {table} {owned.POLICY_CHAIN} accept"):
        namespaces.run_in(np.netns_of["node"], ["nft", command], check=True)
    np.sync(SyncKind.PARTIAL)                  # nothing changed in the API: nothing read, nothing written
    assert "accept" in np.kernel_text().split(owned.POLICY_CHAIN)[1].split("}")[0]
    np.sync(SyncKind.FULL)
    report = engine.last_report
    assert report is not None and report.chains_written == 1 and report.jump_repaired and report.sets_changed == 2
    np.check(expect, [TCP80], **where)
    np.sync(SyncKind.FULL)
    assert not engine.last_report.wrote
    # and no iptables rule or ipset of ours on either iptables backend: the node needs none
    for tool in ("iptables-legacy-save", "iptables-nft-save", "ipset"):
        argv = [tool, "list", "-n"] if tool == "ipset" else [tool]
        assert owned.CHAIN_PREFIX not in namespaces.run_in(np.netns_of["node"], argv, check=True).stdout


def test_status_reads_policies_drops_and_traces_from_the_kernel(np_bridge):
    lab = np_bridge
    lab.apply(policy("x", "from-b", {"podSelector": pods(pod="a"), "ingress": [
        {"from": [{"podSelector": pods(pod="b")}], "ports": [{"port": 80}]}]}))
    lab.check(Expect(True).deny(sources=["y/b", "z/c"], targets=["x/a"]), [TCP80],
              sources=["x/b", "y/b", "z/c"], targets=["x/a"])

    def status(*args: str) -> str:
        return status_of(lab, *args)

    listing = json.loads(status("x/a", "--json"))
    assert [(c["pod"], c["direction"], c["policies"]) for c in listing] == [("x/a", "ingress", ["x/from-b"])]
    assert listing[0]["denied_packets"] >= 2          # y/b's and z/c's SYNs (and their retries)
    assert listing[0]["allows"][0].startswith("x/from-b ingress[0]: tcp/80 in set NETAGENT-NPS-")
    # an open pod has no chain of its own: the pod directory names it
    source = lab.addresses["x/b"]
    assert status("--trace", "x/b", "x/a", "80").startswith(f"{source} -> {lab.addresses['x/a']} tcp/80: ALLOWED")
    assert ": DENIED" in status("--trace", lab.addresses["y/b"], "x/a", "80")
    assert ": DENIED" in status("--trace", source, "x/a", "81/tcp")
    assert status("y/a").strip() == f"y/a {lab.addresses['y/a']}: not isolated by any policy on this node (open both ways)"
    assert f"ingress: x/b ({source}) is not isolated" in status("--trace", "x/a", "b", "80")
    assert "no pod of this node" in status("nosuch")


def test_egress_to_an_ip_block_outside_the_cluster_only(npf):
    np = npf
    np.apply(policy("x", "outside-only", {"podSelector": pods(pod="a"), "policyTypes": ["Egress"], "egress": [
        {"to": [{"ipBlock": {"cidr": outside_block(np)}}], "ports": [{"port": 80, "protocol": "UDP"}]}]}))
    np.check(Expect(True).deny(sources=["x/a"]).allow(sources=["x/a"], targets=["ext"], probes=[UDP80]),
             [TCP80, UDP80], sources=["x/a", "x/b"])


def test_sctp_ports_and_ranges(np):
    np.apply(policy("x", "sctp-80", {"podSelector": {}, "ingress": [{"ports": [{"protocol": "SCTP", "port": 80}]}]}),
             policy("y", "sctp-to-z", {"podSelector": pods(pod="b"), "policyTypes": ["Egress"], "egress": [
                 {"to": [{"namespaceSelector": {"matchLabels": {"ns": "z"}}}],
                  "ports": [{"protocol": "SCTP", "port": 80, "endPort": 81}]}]}))
    SCTP80, SCTP81 = ("sctp", 80), ("sctp", 81)
    np.check(Expect(True).deny(targets=X, probes=[SCTP81, TCP80]).deny(sources=["y/b"])
             .allow(sources=["y/b"], targets=Z, probes=[SCTP80, SCTP81]),
             [SCTP80, SCTP81, TCP80], sources=["x/b", "y/b", "z/a", "ext"], targets=["x/a", "y/a", "z/b", "ext"])


# ---- untrusted objects (issue 18): one bad object costs no other its change, and fails closed ----

def rejected(lab) -> dict[str, str]:
    return {f"{r.ref.kind} {r.ref.key}": r.reason for r in lab.engine.rejections.snapshot()}


def test_a_malformed_policy_in_one_namespace_does_not_stop_a_deny_all_in_another(np):
    """Fails on the old code: the bad policy raised in the drain, the deny-all drained with it
    was lost (and the next sync reported success without it)."""
    np.apply(policy("x", "bad", {"podSelector": pods(pod="a"), "ingress": [{"from": [
        {"ipBlock": {"cidr": "10.0.0.0/8", "except": 7}}]}]}),
        policy("y", "deny-all", {"podSelector": {}, "policyTypes": ["Ingress"]}))
    np.sync(SyncKind.FULL)
    assert rejected(np) == {"NetworkPolicy x/bad": "malformed"}
    # y is denied; x/a too: the bad policy's only peer is dropped, so it allows nothing
    np.check(Expect(True).deny(targets=[*Y, "x/a"]), [TCP80])


def test_a_policy_with_an_unreadable_field_isolates_the_pods_it_selects(np_bridge):
    """Fails on the old code: an unknown spec field was ignored (x/a open), a policy whose
    podSelector could not be read was ignored (z open), an unknown policyTypes value was
    dropped (y/b's egress open)."""
    np_bridge.apply(
        policy("x", "unknown-field", {"podSelector": pods(pod="a"), "ingress": [{}], "denyAll": True}),
        policy("y", "unknown-type", {"podSelector": pods(pod="b"), "policyTypes": ["Ingress", "Egres"],
                                     "ingress": [{}]}),
        policy("z", "bad-selector", {"podSelector": {"matchLabels": {"pod": 1}}, "ingress": [{}]}))
    assert rejected(np_bridge) == {"NetworkPolicy x/unknown-field": "malformed",
                                   "NetworkPolicy y/unknown-type": "malformed",
                                   "NetworkPolicy z/bad-selector": "malformed"}
    np_bridge.check(Expect(True).deny(targets=["x/a", *Z]).deny(sources=["y/b"]), [TCP80])


def test_a_pod_with_container_port_70000_does_not_stop_the_first_sync(np):
    """Fails on the old code: y/c's `serve` port 70000 reached the named-port set, `ipset
    restore` refused it and the whole sync failed (the first one, which CNI waits for, too)."""
    old = np.pod_objects["y/c"]
    new = json.loads(json.dumps(old))
    new["spec"]["containers"][0]["ports"] = [{"name": "serve", "containerPort": 70000, "protocol": "TCP"}]
    np.pod_objects["y/c"] = new
    try:
        np.apply(policy("x", "egress-named", {"podSelector": pods(pod="a"), "policyTypes": ["Egress"],
                                              "egress": [{"to": [{"namespaceSelector": {}}],
                                                          "ports": [{"port": "serve"}]}]}))
        np.restart_engine()                   # a restarted agent's first sync sees the pod
        np.sync(SyncKind.FULL)
        assert rejected(np) == {"Pod y/c": "malformed"}
        expect = (Expect(True).deny(sources=["x/a"]).allow(sources=["x/a"], targets=[t for t in X + Y + Z
                                                                                     if t.endswith("/a")],
                                                           probes=[TCP80])
                  .allow(sources=["x/a"], targets=[t for t in X + Y + Z if t.endswith("/b")], probes=[TCP81]))
        np.check(expect, [TCP80, TCP81], sources=["x/a", "x/b"], targets=[*Y, "z/a"])
    finally:
        np.engine.pods.on_update(new, old)
        np.pod_objects["y/c"] = old
        np.sync(SyncKind.FULL)


def test_ip_blocks_without_except_are_one_hash_net_set(np):
    """A rule's plain ipBlocks are one hash:net set (one rule per port, however many blocks)."""
    blocks = [{"ipBlock": {"cidr": f"172.{16 + n // 256}.{n % 256}.0/24"}} for n in range(500)]
    np.apply(policy("x", "blocks", {"podSelector": pods(pod="a"), "ingress": [{"from": [
        *blocks, {"ipBlock": {"cidr": np.addresses["z/c"] + "/32"}}, {"ipBlock": {"cidr": "192.0.2.0/24"}}],
        "ports": [{"port": 80}]}]}))
    plan = next(p for p in np.engine.plan.pods if p.key == "x/a")
    assert plan.ingress is not None and len(plan.ingress) == 1
    np.check(Expect(True).deny(targets=["x/a"]).allow(sources=["z/c", "ext"], targets=["x/a"]), [TCP80],
             sources=["z/c", "ext", "y/c", "x/b"], targets=["x/a", "x/b"])
