"""The tc path's connection tracking with real packets (tests/netns/ebpf_ct_lab.py): established
NodePort flows survive a SYN flood many times larger than the conntrack maps, and flows closed
by FIN both ways or by a RST leave no entry behind (over IPv4 and over IPv6: a NodePort on
the node's IPv6 address through the tc path, with real packets). The maps are made small
through the sizes the agent's `--bpf-map-max` sets, so the flood stays short."""
import pytest

from ebpf import maps as M
from ebpf.loader import SocketLbLoader
from ebpf.mapset import MapSet
from ebpf.sizes import MapSizes
from proxy.ebpf.backend import EbpfPaths, EbpfProxy
from tests.cluster.lab_tools import wait_for
from netagent.kernel.families import IpFamily
from tests.netns.ebpf_ct_lab import HeldConnections, NodePortLab, nodeport_state, syn_flood
from tests.netns.ebpf_fixtures import bpf_root, require_bcc, test_cgroup  # noqa: F401

SIZES = MapSizes({M.CT_MAP: 128, M.CT_NEW_MAP: 64, M.v6_name(M.CT_MAP): 128, M.v6_name(M.CT_NEW_MAP): 64})
HELD = 24          # 48 entries in na_ct
FLOOD = 3000       # 6000 entries wanted: 94 times na_ct_new, 47 times na_ct


@pytest.fixture
def lab(bpf_root, test_cgroup, request):  # noqa: F811
    """The NodePort lab of the test's family (IPv4 unless parametrised), and that family's maps."""
    family = getattr(request, "param", IpFamily.V4)
    require_bcc()
    with NodePortLab(family) as topology:
        loader = SocketLbLoader(bpf_root=bpf_root, cgroup=test_cgroup, sizes=SIZES)
        with loader.load_tc() as programs:
            maps = MapSet.open_pinned(loader.pin_dir)
            backend = EbpfProxy(maps=maps, paths=EbpfPaths(bpf_root=bpf_root, cgroup=test_cgroup), tc_snat=True,
                                family=family)
            try:
                backend.sync(nodeport_state(family), changed=None)
                topology.attach(programs.fds)
                yield topology, backend.maps
            finally:
                maps.close()


def flows(maps: MapSet, client: str, client_port: int) -> int:
    """Entries (both maps, both directions) of the client's flow from `client_port`."""
    count = 0
    for bpf_map in (maps.ct, maps.ct_new):
        for key, value in bpf_map.read_all().items():
            entry = M.parse_ct(key, value)   # forward: from the client; reply: translated to the client
            count += (entry.saddr, entry.sport) == (client, client_port) or \
                (entry.nat_daddr, entry.nat_dport) == (client, client_port)
    return count


def test_established_flows_survive_a_syn_flood_larger_than_the_maps(lab):
    topology, maps = lab
    assert (maps.ct.max_entries, maps.ct_new.max_entries) == (128, 64)
    with HeldConnections(topology, HELD) as held:
        assert maps.ct.count() == 2 * HELD   # confirmed by their handshakes: both directions in na_ct
        assert syn_flood(topology, FLOOD) == FLOOD
        assert maps.ct_new.count() > 0 and maps.ct.count() == 2 * HELD   # the flood stayed in na_ct_new
        assert held.check() == [True] * HELD


@pytest.mark.parametrize("lab", list(IpFamily), ids=lambda f: f.label, indirect=True)
def test_flows_closed_by_fin_or_rst_leave_no_entries(lab):
    topology, maps = lab
    client = topology.client_ip
    with HeldConnections(topology, 6) as held:   # six NodePort connections through the tc path, echoing
        assert all(flows(maps, client, port) == 2 for port in held.ports)
        held.close_some("fin", [0, 1])
        held.close_some("rst", [2, 3])
        wait_for(lambda: all(flows(maps, client, held.ports[i]) == 0 for i in range(4)), timeout=60,
                 what="the closed flows' entries gone")
        assert held.check() == [None] * 4 + [True, True]
        assert all(flows(maps, client, held.ports[i]) == 2 for i in (4, 5))
        assert maps.ct.count() == 4
