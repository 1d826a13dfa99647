"""The tunnel source filter (`noderoutes/tunnel_filter.py`) on the real kernel: VXLAN packets
reach node-1's pods only from admitted peers' underlay addresses.

The VXLAN lab of `test_routing_backends.py` (three nodes on one segment, namespaces created here
and removed afterwards; the root namespace is untouched). node-1's filter admits node-2 only;
node-3 plays an underlay host that is no admitted peer: it knows node-1's VTEP and encapsulates
to it, its inner packet carrying node-2's pod address (a pod node-1 admits). Without the filter
(the control) that packet reaches node-1's pod; with it, it is dropped before decapsulation,
while node-2's own encapsulated traffic still passes; admitting node-3 later changes only the
set's members. Both iptables backends (the set: the real `ipset`, in node-1's namespace), and the
nftables table (`tunnel_filter_nft.py`).
"""
import subprocess
import sys
from ipaddress import ip_address

import pytest

from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset.runner import IpsetRunner
from netagent.kernel.iptables.runner import IptablesRunner
from netagent.kernel.nftables.runner import NftRunner
from netagent.noderoutes.routing.model import Mode, RoutingSettings
from netagent.noderoutes.tunnel_filter import TunnelFilter
from netagent.noderoutes.tunnel_filter_nft import NftTunnelFilter
from tests.netns.test_routing_backends import Lab, ping

PORT = 7788
SET = "NETAGENT-TUNNEL-PEERS"

LISTEN = r"""
import socket, sys
server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
server.bind(("0.0.0.0", int(sys.argv[1])))
server.settimeout(float(sys.argv[2]))
print("ready", flush=True)
try:
    while True:
        data, peer = server.recvfrom(64)
        print(peer[0], data.decode(), flush=True)
except socket.timeout:
    pass
"""

SEND = r"""
import socket, sys, time
client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
client.bind((sys.argv[1], 0))
for _ in range(20):
    client.sendto(sys.argv[4].encode(), (sys.argv[2], int(sys.argv[3])))
    time.sleep(0.05)
"""


@pytest.fixture
def lab():
    built = Lab()
    try:
        for _ in range(3):
            built.add_node()
        built.start_all(RoutingSettings(mode=Mode.VXLAN))
        yield built
    finally:
        built.close()


def received(lab: Lab, sends: list) -> list:
    """What node-1's pod's UDP server hears while each (node, source address, tag) sends to it."""
    n1 = lab.nodes[0]
    listener = subprocess.Popen([*namespaces.exec_prefix(n1.pod_netns), sys.executable, "-c", LISTEN, str(PORT), "3"],
                                stdout=subprocess.PIPE, text=True)
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        for node, source, tag in sends:
            namespaces.run_in(node.pod_netns, [sys.executable, "-c", SEND, source, n1.pod_ip, str(PORT), tag],
                              check=True)
        out, _ = listener.communicate(timeout=30)
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()
    return sorted({tuple(line.split()) for line in out.splitlines()})


def test_vxlan_from_a_non_peer_underlay_host_never_reaches_the_pod(lab, backend):
    n1, n2, n3 = lab.nodes
    spoofed = n2.pod_ip  # an admitted pod's address, sent from node-3's pod
    namespaces.run_in(n3.pod_netns, ["ip", "addr", "add", f"{spoofed}/32", "dev", "eth0"], check=True)
    for setting in ("net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.pod0.rp_filter=0"):
        namespaces.run_in(n3.netns, ["sysctl", "-qw", setting], check=True)
    sends = [(n2, n2.pod_ip, "peer"), (n3, spoofed, "spoofed")]
    assert ping(n2, n1) and ping(n3, n1)
    assert received(lab, sends) == [(spoofed, "peer"), (spoofed, "spoofed")]  # the control: both pass

    runner = IptablesRunner(backend=backend, exec_prefix=namespaces.exec_prefix(n1.netns), timeout=120,
                            lock_wait_seconds=60)
    ipset = IpsetRunner(exec_prefix=namespaces.exec_prefix(n1.netns))
    tunnel_filter = TunnelFilter(runner=runner, settings=RoutingSettings(mode=Mode.VXLAN), own=(n1.public_ip,),
                                 ipset=ipset)
    tunnel_filter.update([n2.public_ip])
    assert tunnel_filter.ensure()
    assert tunnel_filter.check() == [] and tunnel_filter.ensure() == []  # what the kernel saves is what we render
    assert ipset.members(SET) == {str(n1.public_ip), str(n2.public_ip)}
    assert received(lab, sends) == [(spoofed, "peer")]
    assert ping(n2, n1)

    rules = runner.table("filter").chains["NETAGENT-TUNNEL-IN"].rules
    tunnel_filter.update([n2.public_ip, n3.public_ip])  # node-3 admitted at a later sync
    assert tunnel_filter.ensure() == [f"ipset {SET}: 1 admitted address(es) missing"]  # the set alone changes
    assert runner.table("filter").chains["NETAGENT-TUNNEL-IN"].rules == rules
    assert received(lab, sends) == [(spoofed, "peer"), (spoofed, "spoofed")]

    tunnel_filter.cleanup()
    assert "NETAGENT-TUNNEL-IN" not in runner.table("filter").chains and ipset.list_names() == []
    assert ping(n3, n1)


def test_ensure_repairs_a_flushed_chain_and_a_deleted_jump(lab, backend):
    n1, n2, _ = lab.nodes
    runner = IptablesRunner(backend=backend, exec_prefix=namespaces.exec_prefix(n1.netns), timeout=120,
                            lock_wait_seconds=60)
    ipset = IpsetRunner(exec_prefix=namespaces.exec_prefix(n1.netns))
    tunnel_filter = TunnelFilter(runner=runner, settings=RoutingSettings(mode=Mode.VXLAN), own=(n1.public_ip,),
                                 ipset=ipset)
    tunnel_filter.update([n2.public_ip])
    tunnel_filter.ensure()
    ipset.update(SET, remove=[str(n2.public_ip)])  # a member lost: repaired by member
    assert tunnel_filter.check() == [f"ipset {SET}: 1 admitted address(es) missing"]
    assert tunnel_filter.ensure() and ipset.members(SET) == {str(n1.public_ip), str(n2.public_ip)}
    runner.restore("*filter\n-F NETAGENT-TUNNEL-IN\nCOMMIT\n")
    assert tunnel_filter.check()
    assert tunnel_filter.ensure() and tunnel_filter.check() == []
    runner.restore('*filter\n-D INPUT -m comment --comment "netagent: tunnel packets only from admitted peers" '
                   '-j NETAGENT-TUNNEL-IN\nCOMMIT\n')
    assert tunnel_filter.check()
    assert tunnel_filter.ensure() == ["filter INPUT: no jump to NETAGENT-TUNNEL-IN"]
    assert tunnel_filter.check() == []
    tunnel_filter.cleanup()


@pytest.mark.parametrize("mode, family", [(Mode.IPIP, IpFamily.V4), (Mode.IPIP, IpFamily.V6),
                                          (Mode.VXLAN, IpFamily.V6), (Mode.AUTO, IpFamily.V4)],
                         ids=["ipip", "ipip6", "vxlan6", "auto"])
def test_what_the_kernel_saves_is_what_every_mode_renders(netns, backend, mode, family):
    runner = IptablesRunner(backend=backend, exec_prefix=namespaces.exec_prefix(netns), timeout=120,
                            lock_wait_seconds=60, family=family)
    ipset = IpsetRunner(exec_prefix=namespaces.exec_prefix(netns))
    own, peer = (("192.0.2.1", "192.0.2.2") if family is IpFamily.V4 else ("2001:db8::1", "2001:db8::2"))
    tunnel_filter = TunnelFilter(runner=runner, settings=RoutingSettings(mode=mode), own=(ip_address(own),),
                                 ipset=ipset)
    tunnel_filter.update([ip_address(peer)])
    assert tunnel_filter.ensure()
    assert tunnel_filter.check() == [] and tunnel_filter.ensure() == []
    assert ipset.members(SET if family is IpFamily.V4 else SET + "6") == {own, peer}
    tunnel_filter.cleanup()
    assert "NETAGENT-TUNNEL-IN" not in runner.table("filter").chains and ipset.list_names() == []


def test_a_set_outgrowing_its_maxelem_is_swapped_in_while_the_rule_names_it(netns, backend):
    runner = IptablesRunner(backend=backend, exec_prefix=namespaces.exec_prefix(netns), timeout=120,
                            lock_wait_seconds=60)
    ipset = IpsetRunner(exec_prefix=namespaces.exec_prefix(netns))
    tunnel_filter = TunnelFilter(runner=runner, settings=RoutingSettings(mode=Mode.VXLAN),
                                 own=(ip_address("192.0.2.1"),), ipset=ipset)
    tunnel_filter.ensure()
    many = [ip_address("10.0.0.0") + i for i in range(1500)]
    tunnel_filter.update(many)
    assert tunnel_filter.ensure() == [f"ipset {SET}: maxelem 1024 is below the 1501 admitted"]
    info = ipset.describe(SET)
    assert info is not None and info.max_elements == 4096 and info.entries == 1501 and info.references == 1
    assert ipset.list_names() == [SET] and tunnel_filter.check() == []
    tunnel_filter.cleanup()
    assert ipset.list_names() == []


def test_the_nft_flavour_drops_a_non_peer_vxlan_packet_and_passes_the_peers(lab):
    n1, n2, n3 = lab.nodes
    spoofed = n2.pod_ip
    namespaces.run_in(n3.pod_netns, ["ip", "addr", "add", f"{spoofed}/32", "dev", "eth0"], check=True)
    for setting in ("net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.pod0.rp_filter=0"):
        namespaces.run_in(n3.netns, ["sysctl", "-qw", setting], check=True)
    sends = [(n2, n2.pod_ip, "peer"), (n3, spoofed, "spoofed")]
    assert received(lab, sends) == [(spoofed, "peer"), (spoofed, "spoofed")]  # the control
    with NftRunner(n1.netns) as nft:
        tunnel_filter = NftTunnelFilter(nft=nft, settings=RoutingSettings(mode=Mode.VXLAN), own=(n1.public_ip,))
        tunnel_filter.update([n2.public_ip])
        assert tunnel_filter.ensure()
        assert tunnel_filter.check() == [] and tunnel_filter.ensure() == []  # the kernel reads back as rendered
        assert received(lab, sends) == [(spoofed, "peer")]
        assert ping(n2, n1)
        tunnel_filter.cleanup()
        assert nft.list_table("ip", "netagent-tunnel") is None


@pytest.mark.parametrize("mode, family", [(Mode.IPIP, IpFamily.V4), (Mode.IPIP, IpFamily.V6),
                                          (Mode.VXLAN, IpFamily.V6), (Mode.AUTO, IpFamily.V4)],
                         ids=["ipip", "ipip6", "vxlan6", "auto"])
def test_the_nft_table_reads_back_as_every_mode_renders(netns, mode, family):
    own, peer = (("192.0.2.1", "192.0.2.2") if family is IpFamily.V4 else ("2001:db8::1", "2001:db8::2"))
    with NftRunner(netns) as nft:
        tunnel_filter = NftTunnelFilter(nft=nft, settings=RoutingSettings(mode=mode), own=(ip_address(own),),
                                        family=family)
        tunnel_filter.update([ip_address(peer)])
        assert tunnel_filter.ensure()
        assert tunnel_filter.check() == [] and tunnel_filter.ensure() == []
        tunnel_filter.cleanup()
        assert nft.list_table(family.nft, "netagent-tunnel") is None
