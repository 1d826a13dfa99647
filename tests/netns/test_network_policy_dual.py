"""NetworkPolicy over both families on the real kernel (issue 22): a dual-stack pod denied and
allowed alike on IPv4 and IPv6, ipBlocks of one family admitting no peer of the other, status
and traces over IPv6, and bridge mode over IPv6, where neighbour discovery must pass the pod
chains as ARP does. The labs and fixtures are policy_cases.py's (as test_network_policy.py's)."""
from __future__ import annotations

import json

from netagent.infra.sync_runner import SyncKind
from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from tests.netns.policy_cases import (  # noqa: F401 (fixtures)
    TCP80, TCP81, UDP80, Z, _root_and_no_leaks, host, labs, np_bridge6, np_dual, pods, policy, status_of)
from tests.netns.policy_lab import Expect


# ---- dual-stack (issue 22): one pod, two families, the same policy ----

def test_a_dual_stack_pod_is_denied_and_allowed_alike_on_both_families(np_dual):
    lab = np_dual
    lab.apply(policy("x", "from-b", {"podSelector": pods(pod="a"), "ingress": [
        {"from": [{"podSelector": pods(pod="b")}, {"namespaceSelector": {"matchLabels": {"ns": "z"}}}],
         "ports": [{"port": 80}, {"port": "serve-udp", "protocol": "UDP"}]}]}),
              policy("y", "no-egress", {"podSelector": pods(pod="c"), "policyTypes": ["Egress"]}))
    expect = (Expect(True).deny(targets=["x/a"]).allow(sources=["x/b", *Z], targets=["x/a"], probes=[TCP80, UDP80])
              .deny(sources=["y/c"]))
    for family in IpFamily:
        lab.family = family
        lab.check(expect, [TCP80, TCP81, UDP80], sources=["x/b", "x/c", "y/c", "z/a", "ext"],
                  targets=["x/a", "x/b", "y/a"])


def test_ipv4_ip_blocks_allow_no_ipv6_peer_and_ipv6_blocks_no_ipv4_peer(np_dual):
    lab = np_dual
    lab.family = IpFamily.V6
    lab.apply(policy("x", "v4-blocks", {"podSelector": pods(pod="a"), "ingress": [
        {"from": [{"ipBlock": {"cidr": "10.244.0.0/16"}}, {"ipBlock": {"cidr": "192.0.2.0/24"}}]}]}),
              policy("x", "v6-block", {"podSelector": pods(pod="b"), "ingress": [
                  {"from": [{"ipBlock": {"cidr": "fd00:10:244::/48", "except": [host(lab, "y/a")]}}]}]}))
    where = {"sources": ["y/a", "y/b", "ext"], "targets": ["x/a", "x/b"]}
    lab.check(Expect(True).deny(targets=["x/a"]).deny(targets=["x/b"], sources=["y/a", "ext"]), [TCP80], **where)
    lab.family = IpFamily.V4
    lab.check(Expect(True).deny(targets=["x/b"]), [TCP80], **where)


def test_status_shows_both_families_and_traces_an_ipv6_packet(np_dual):
    lab = np_dual
    lab.apply(policy("x", "from-b", {"podSelector": pods(pod="a"), "ingress": [
        {"from": [{"podSelector": pods(pod="b")}], "ports": [{"port": 80}]}]}))
    lab.check(Expect(True).deny(sources=["y/b"], targets=["x/a"]), [TCP80], sources=["x/b", "y/b"], targets=["x/a"])

    def status(*args: str) -> str:
        return status_of(lab, *args)

    listing = json.loads(status("x/a", "--json"))
    v4, v6 = lab.by_family[IpFamily.V4], lab.by_family[IpFamily.V6]
    assert sorted((c["ip"], c["direction"]) for c in listing) == sorted([(v4["x/a"], "ingress"),
                                                                         (v6["x/a"], "ingress")])
    assert next(c for c in listing if c["ip"] == v6["x/a"])["denied_packets"] >= 1
    allowed = status("--trace", v6["x/b"], v6["x/a"], "80")
    assert allowed.startswith(f"{v6['x/b']} -> {v6['x/a']} tcp/80: ALLOWED"), allowed
    assert ": DENIED" in status("--trace", v6["y/b"], "x/a", "80")
    assert ": DENIED" in status("--trace", v4["y/b"], "x/a", "80")


# ---- IPv6 in bridge mode: neighbour discovery passes the pod chains, as ARP does ----

def test_bridge_mode_ipv6_ports_only_policies_still_let_neighbour_discovery_through(np_bridge6):
    """x/a admits UDP 80 only, y/a may send TCP 80 only. Bridged neighbour solicitations (to a
    solicited-node group) and advertisements pass FORWARD through br_netfilter, into the pod
    chains (physdev-out / physdev-in; nft: y/a's source address): fails before the hook chain's
    NDP RETURNs (x/a and y/a unresolvable, nothing allowed gets through over IPv6). Neighbour
    caches are flushed first, so every probe needs a fresh resolution; then a restarted engine's
    FULL sync adopts the ip6tables / ip6 rules with no write (what the kernel lists compares
    equal with what is rendered)."""
    lab = np_bridge6
    lab.apply(policy("x", "udp-80-only", {"podSelector": pods(pod="a"), "policyTypes": ["Ingress"],
                                          "ingress": [{"ports": [{"protocol": "UDP", "port": 80}]}]}),
              policy("y", "tcp-80-out-only", {"podSelector": pods(pod="a"), "policyTypes": ["Egress"],
                                              "egress": [{"ports": [{"protocol": "TCP", "port": 80}]}]}))
    for netns in lab.netns_of.values():
        namespaces.run_in(netns, ["ip", "-6", "neigh", "flush", "all"], check=True)
    expect = Expect(True).deny(targets=["x/a"], probes=[TCP80]).deny(sources=["y/a"], probes=[UDP80])
    where = {"sources": ["x/a", "x/b", "y/a", "z/c", "ext"], "targets": ["x/a", "y/a", "y/b", "ext"]}
    lab.check(expect, [UDP80, TCP80], **where)
    engine = lab.restart_engine()
    lab.sync(SyncKind.FULL)
    assert engine.last_report is not None and not engine.last_report.wrote, engine.last_report
    lab.check(expect, [UDP80, TCP80], **where)
