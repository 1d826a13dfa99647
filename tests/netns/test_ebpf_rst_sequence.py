"""The tc path ends a NodePort flow on a RST only when its sequence number is the expected one
(ebpf/nodeport_flow.c, `ct_rst_ok`), with real packets (tests/netns/ebpf_ct_lab.py's lab: the
client's connections to the NodePort, DNATed and SNATed to a backend beside it).

An off-path RST forged with the client's address and port, or with the backend's address and
the flow's SNAT port, but a wrong sequence number, is sent from the out namespace as a raw frame
(scapy): both conntrack entries stay and the connection keeps echoing (before the check, the
RST deleted them, the next segment got a new SNAT port and the backend reset the connection).
A RST carrying the sequence number the flow expects of the client (read from the entry's
`seq_end`) still ends the flow. Both families.
"""
import subprocess
import sys

import pytest

from ebpf import maps as M
from ebpf.mapset import MapSet
from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from tests.cluster.lab_tools import wait_for
from tests.netns.ebpf_ct_lab import NODE_PORT, HeldConnections
from tests.netns.ebpf_fixtures import bpf_root, test_cgroup  # noqa: F401
from tests.netns.test_ebpf_conntrack import flows, lab  # noqa: F401

FORGE = r"""
import sys
from scapy.all import Ether, IP, IPv6, TCP, sendp
dst_mac, src, dst, sport, dport, seq = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
l3 = IPv6(src=src, dst=dst) if ":" in src else IP(src=src, dst=dst)
sendp(Ether(dst=dst_mac) / l3 / TCP(sport=sport, dport=dport, flags="R", seq=seq), iface="out0", verbose=0)
"""


def forge_rst(topology, src: str, dst: str, sport: int, dport: int, seq: int) -> None:
    done = subprocess.run([*namespaces.exec_prefix(topology.names["out"]), sys.executable, "-c", FORGE,
                           topology.node_mac(), src, dst, str(sport), str(dport), str(seq)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def forward_entry(maps: MapSet, client: str, port: int) -> tuple[M.CtEntry, int]:
    """The client's direction of its flow from `port`, and the sequence number the flow expects next of it."""
    for bpf_map in (maps.ct, maps.ct_new):
        for key, value in bpf_map.read_all().items():
            entry = M.parse_ct(key, value)
            if (entry.saddr, entry.sport, entry.dir) == (client, port, 1):
                layout = M.CtValue6 if len(value) == M.CT6_VALUE.size else M.CtValue
                raw = layout.from_buffer_copy(value)
                assert raw.flags & M.CT_F_SEQ
                return entry, raw.seq_end
    raise AssertionError(f"no entry for {client}:{port}")


def snat_port(maps: MapSet, client: str, port: int) -> int:
    """The source port the flow's packets have towards the backend (its SNAT port)."""
    for bpf_map in (maps.ct, maps.ct_new):
        for key, value in bpf_map.read_all().items():
            entry = M.parse_ct(key, value)
            if entry.dir == 2 and (entry.nat_daddr, entry.nat_dport) == (client, port):
                return entry.dport   # the reply's destination: the SNAT address and port
    raise AssertionError(f"no reply entry for {client}:{port}")


@pytest.mark.parametrize("lab", list(IpFamily), ids=lambda f: f.label, indirect=True)
def test_a_forged_rst_with_a_wrong_sequence_number_leaves_the_nodeport_flow_working(lab):  # noqa: F811
    topology, maps = lab
    client, node, backend = topology.client_ip, topology.node_ip, topology.backend_ip
    with HeldConnections(topology, 2) as held:
        assert all(flows(maps, client, port) == 2 for port in held.ports)
        victim = held.ports[0]
        _, expected = forward_entry(maps, client, victim)
        sport = snat_port(maps, client, victim)
        for wrong in ((expected + 2**31) % 2**32, (expected + 1) % 2**32, (expected - 1) % 2**32):
            forge_rst(topology, client, node, victim, NODE_PORT, wrong)     # as the client
            forge_rst(topology, backend, node, 8080, sport, wrong)          # as the backend
        assert flows(maps, client, victim) == 2
        assert held.check() == [True, True]
        assert flows(maps, client, victim) == 2
        # the sequence number the flow expects of the client ends it (the backend's socket too)
        _, expected = forward_entry(maps, client, victim)
        forge_rst(topology, client, node, victim, NODE_PORT, expected)
        wait_for(lambda: flows(maps, client, victim) == 0, timeout=30, what="the flow ended by the right RST")
        assert flows(maps, client, held.ports[1]) == 2
