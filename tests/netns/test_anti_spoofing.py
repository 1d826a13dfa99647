"""Pod anti-spoofing (netagent/policy/antispoof.py) with real packets: a pod sending with another
pod's source address (built by scapy, sent on a raw socket, IPv4 and IPv6) is dropped at the
node while its own traffic passes, and a NetworkPolicy that admits pod x/a is not passable by
pod x/b spoofing x/a. Both attachments (bridge, routed) and both flavours (iptables: rpfilter /
physdev rules in raw; nftables: `fib` / the bridge table), on policy_lab.py's dual-stack node.

Each case first shows the hole (the spoofed packet arrives with no anti-spoofing rules, as on
the code before this module), then the rules close it.
"""
from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from functools import partial

import pytest

from cni.wiring import host_veth_name
from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.runner import IptablesRunner
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.antispoof import AntiSpoofing, ports_from_ipam
from proxy.backend import ProxyMode
from tests.conftest import require_root_netns
from tests.netns.policy_lab import Expect, PolicyLab
from tests.unit.policy.policy_objects import policy

PORT = 9999
RECEIVER = r"""
import select, socket, sys, time
socks = []
for family, any_address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
    s = socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind((any_address, int(sys.argv[1])))
    socks.append(s)
print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[2])
while (left := deadline - time.monotonic()) > 0:
    for s in select.select(socks, [], [], left)[0]:
        data, peer = s.recvfrom(2048)
        print(data.decode(), peer[0], flush=True)
"""
SENDER = r"""
import socket, sys
from scapy.all import IP, IPv6, UDP, Raw
port, args = int(sys.argv[1]), sys.argv[2:]
for source, target, marker in zip(args[0::3], args[1::3], args[2::3]):
    if ":" in target:
        packet = IPv6(src=source, dst=target) / UDP(sport=40000, dport=port) / Raw(marker.encode())
        s = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)   # IPV6_HDRINCL implied
    else:
        packet = IP(src=source, dst=target) / UDP(sport=40000, dport=port) / Raw(marker.encode())
        s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)    # IP_HDRINCL implied
    for _ in range(3):
        s.sendto(bytes(packet), (target, 0))
"""


def deliveries(lab: PolicyLab, sends: list[tuple[str, str, str]], family: IpFamily) -> set[str]:
    """Send every (sender pod, source address, target pod) once and return the markers that
    arrived (a marker names its send: "sender>source>target")."""
    addresses = lab.by_family[family]
    receivers = {}
    with contextlib.ExitStack() as stack:
        for target in {t for _, _, t in sends}:
            process = subprocess.Popen([*namespaces.exec_prefix(lab.netns_of[target]), sys.executable, "-c",
                                        RECEIVER, str(PORT), "60"], stdout=subprocess.PIPE, text=True)
            stack.callback(process.kill)
            assert process.stdout is not None and process.stdout.readline().strip() == "ready"
            receivers[target] = process
        for sender in sorted({s for s, _, _ in sends}):
            argv = [item for s, source, target in sends if s == sender
                    for item in (source, addresses[target], f"{sender}>{source}>{target}")]
            namespaces.run_in(lab.netns_of[sender], [sys.executable, "-c", SENDER, str(PORT), *argv], check=True)
        time.sleep(1.5)              # what is still in flight arrives; a dropped packet never does
        arrived = set()
        for process in receivers.values():
            process.terminate()
            out, _ = process.communicate(timeout=30)
            arrived |= {line.split()[0] for line in out.splitlines() if line.strip()}
    return arrived


def anti_spoofing(lab: PolicyLab) -> AntiSpoofing:
    network = os.listdir(lab.node.data_dir)[0]
    ports = partial(ports_from_ipam, os.path.join(lab.node.data_dir, network), partial(host_veth_name, network))
    if lab.dataplane is ProxyMode.NFTABLES:
        assert lab.nft is not None
        return AntiSpoofing(mode=lab.mode, ports=ports, nft=lab.nft)
    prefix = namespaces.exec_prefix(lab.node.node)
    return AntiSpoofing(mode=lab.mode, ports=ports, iptables=[
        IptablesRunner(backend=lab.backend, family=family, exec_prefix=prefix, lock_wait_seconds=60)
        for family in IpFamily])


CASES = [(m, d) for d in (ProxyMode.IPTABLES, ProxyMode.NFTABLES) for m in PodAttachment]


@pytest.fixture(scope="module", params=CASES, ids=lambda case: f"{case[0].value}-{case[1].value}")
def lab(request):
    require_root_netns()
    mode, dataplane = request.param
    with PolicyLab(mode=mode, dataplane=dataplane, dual=True) as built:
        yield built
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert not [name for name in listed if name.startswith(built.node.prefix)], "namespaces leaked"


def _closed_by_the_rules(lab: PolicyLab, family: IpFamily, *, own: set, spoofed: set, refused: frozenset | set = frozenset()):
    """Without the rules the spoofed sends arrive (the hole, as on the code before them), with
    them they do not; `own` arrives and `refused` does not, throughout."""
    guard = anti_spoofing(lab)
    guard.remove()
    sends = sorted(own | spoofed | refused)
    marks = lambda found: {f"{s}>{src}>{t}" for s, src, t in found}   # noqa: E731
    try:
        assert deliveries(lab, sends, family) == marks(own | spoofed), "the hole: spoofing passes without the rules"
        guard.sync()
        assert deliveries(lab, sends, family) == marks(own)
        lab.check(Expect(), sources=["x/a", "z/c"], targets=["x/b", "z/b", "ext"])   # TCP both ways, ARP/NDP too
    finally:
        guard.remove()


@pytest.mark.parametrize("family", list(IpFamily), ids=lambda f: f.label)
def test_a_pod_sending_as_another_pod_is_dropped_at_the_node(lab, family):
    """x/b sends as x/a, as z/c and as an address outside the cluster (no policy anywhere):
    dropped at the node; x/a's and x/b's own packets arrive."""
    lab.family = family
    a = lab.by_family[family]
    outside = "192.0.2.99" if family is IpFamily.V4 else "2001:db8:2::99"
    _closed_by_the_rules(lab, family, own={("x/a", a["x/a"], "z/a"), ("x/b", a["x/b"], "z/b")},
                         spoofed={("x/b", a["x/a"], "z/a"), ("x/b", a["z/c"], "z/b"), ("x/b", outside, "z/b")})


@pytest.mark.parametrize("family", list(IpFamily), ids=lambda f: f.label)
def test_an_ingress_policy_admitting_x_a_is_not_passable_by_x_b_spoofing_x_a(lab, family):
    """y/a admits UDP only from x/a: x/b as itself is refused by the policy, x/b as x/a passes
    it without the rules and is dropped with them. (In bridge mode over IPv6 x/a must first
    resolve y/a: neighbour discovery passes the policy chains, as ARP does.)"""
    lab.family = family
    a = lab.by_family[family]
    lab.apply(policy("y", "only-x-a", {
        "podSelector": {"matchLabels": {"pod": "a"}}, "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "x"}},
                               "podSelector": {"matchLabels": {"pod": "a"}}}],
                     "ports": [{"protocol": "UDP", "port": PORT}]}]}))
    try:
        _closed_by_the_rules(lab, family, own={("x/a", a["x/a"], "y/a")}, spoofed={("x/b", a["x/a"], "y/a")},
                             refused={("x/b", a["x/b"], "y/a")})
    finally:
        lab.apply()


SERVICE = {IpFamily.V4: ("10.96.0.10", "ip", "{}"), IpFamily.V6: ("fd00:96::10", "ip6", "[{}]")}
CONNECT = """
import socket, sys
socket.create_connection((sys.argv[1], 80), timeout=10).close()
"""


@pytest.mark.parametrize("family", list(IpFamily), ids=lambda f: f.label)
def test_a_pods_connection_to_a_service_address_passes_before_its_dnat(lab, family):
    """A Service's address is DNATed at prerouting's dstnat, after the raw-priority check: a pod
    reaches a Service backed by another pod (a DNAT rule in the node as a proxy writes one),
    with the rules in force."""
    service, nft_family, backend = SERVICE[family]
    table = f"{nft_family} svctest"
    rule = (f"{nft_family} daddr {service} tcp dport 80 dnat to "
            f"{backend.format(lab.by_family[family]['z/b'])}:80")
    namespaces.run_in(lab.node.node, ["nft", f"add table {table}; add chain {table} pre "
                                      f"{{ type nat hook prerouting priority dstnat; }}; add rule {table} pre {rule}"],
                      check=True)
    guard = anti_spoofing(lab)
    try:
        guard.sync()
        namespaces.run_in(lab.netns_of["x/a"], [sys.executable, "-c", CONNECT, service], check=True, timeout=30)
    finally:
        guard.remove()
        namespaces.run_in(lab.node.node, ["nft", f"delete table {table}"], check=True)


def test_ports_from_the_ipam_store_are_every_pods_veth_and_addresses(lab):
    """What the bridge mode's elements are made of: every pod's host veth with both its addresses."""
    network = os.listdir(lab.node.data_dir)[0]
    ports = ports_from_ipam(os.path.join(lab.node.data_dir, network), partial(host_veth_name, network))
    wanted = {}
    for family in IpFamily:
        for key, address in lab.by_family[family].items():
            if key != "ext":
                wanted.setdefault(lab.veths[address], set()).add(address)
    assert {p.interface: set(p.addresses) for p in ports} == wanted
