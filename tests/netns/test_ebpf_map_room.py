"""A full `na_svc` with the real programs (sized small through `--bpf-map-max`'s sizes): the
services that fit answer through the socket load balancer, the rest are rejected (map-full)
and have nothing in any map; a restart with another size recreates the pinned maps, copies
what fits and re-attaches the programs, and the sync then programs what the new size holds."""
import errno
import json

import pytest

from ebpf import maps as M
from ebpf import syscall
from ebpf.loader import PROGRAMS
from ebpf.sizes import MapSizes
from netagent.infra.rejections import Rejections
from proxy.ebpf.backend import EbpfPaths
from proxy.factory import build_ebpf_backend
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName
from tests.netns.ebpf_fixtures import bpf_root, require_bcc, run_in_cgroup, test_cgroup  # noqa: F401
from tests.netns.test_ebpf_socket_lb import ClientAndBackends

SERVICES = 20
NODE = NodeContext(name="node-1", local_addresses=("10.77.0.1",))


def many_services() -> ProxyState:
    names = [ServicePortName("default", f"s{i:02}") for i in range(SERVICES)]
    return ProxyState(node=NODE, services={n: ServicePort(name=n, protocol=Protocol.TCP, port=80,
                                                          cluster_ip=f"10.96.1.{i + 1}") for i, n in enumerate(names)},
                      endpoints={n: (Endpoint(ip="10.77.0.2", port=8080),) for n in names})


CONNECT_ALL = r"""
import json, socket
out = []
for i in range(%d):
    try:
        s = socket.create_connection(("10.96.1.%%d" %% (i + 1), 80), timeout=30)
        out.append(s.recv(64).decode()); s.close()
    except OSError as error:
        out.append(error.errno)
print(json.dumps(out))
""" % SERVICES


def answers(topology, paths) -> list:
    result = run_in_cgroup(paths.cgroup, topology.names["cli"], CONNECT_ALL)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def programmed_names(backend) -> set[str]:
    maps = backend.maps
    names = {M.parse_set_name(v)[0] for v in maps.setname.read_all().values()}
    assert {M.parse_svc(k, v).set_id for k, v in maps.svc.read_all().items()} == \
        {M.parse_set_id(k) for k in maps.setname.read_all()} == {M.parse_slot_key(k)[0] for k in maps.slots.read_all()}
    return names


@pytest.fixture
def lab(bpf_root, test_cgroup):  # noqa: F811
    require_bcc()
    with ClientAndBackends() as topology:
        yield topology, bpf_root, test_cgroup


def test_a_full_svc_map_serves_the_services_that_fit_and_rejects_the_rest(lab):
    topology, bpf_root, cgroup = lab
    paths = EbpfPaths(bpf_root=bpf_root, cgroup=cgroup, map_sizes=MapSizes({M.SVC_MAP: 16}))
    rejections = Rejections()
    backend = build_ebpf_backend(paths, rejections=rejections.scope("proxy"))
    try:
        assert backend.maps.svc.max_entries == 16
        backend.sync(many_services(), changed=None)
        assert programmed_names(backend) == {f"default/s{i:02}" for i in range(16)}   # whole ports only
        assert {r.ref.key: r.reason for r in rejections.snapshot()} == \
            {f"default/s{i:02}": "map-full" for i in range(16, SERVICES)}
        got = answers(topology, paths)
        assert got[:16] == ["10.77.0.2"] * 16 and got[16:] == [errno.ENETUNREACH] * 4   # untouched: no route

        # a restart with a larger na_svc: recreated, its 16 entries copied, programs re-attached
        bigger = EbpfPaths(bpf_root=bpf_root, cgroup=cgroup, map_sizes=MapSizes({M.SVC_MAP: 32}))
        backend.maps.close()
        backend = build_ebpf_backend(bigger, rejections=rejections.scope("proxy"))
        assert backend.load_report.resized == ("na_svc: 16 -> 32 entries, 16 copied",)
        assert len(backend.load_report.attached) == len(PROGRAMS) and backend.load_report.kept == ()   # all 8
        assert backend.maps.svc.max_entries == 32 == syscall.map_info(backend.maps.svc.fd).max_entries
        assert answers(topology, paths)[:16] == ["10.77.0.2"] * 16   # served before the first sync
        backend.sync(many_services(), changed=None)
        assert len(programmed_names(backend)) == SERVICES and rejections.snapshot() == []
        assert answers(topology, paths) == ["10.77.0.2"] * SERVICES

        # and back to a smaller one: 20 entries do not fit in 16, the sync writes what fits
        backend.maps.close()
        backend = build_ebpf_backend(paths, rejections=rejections.scope("proxy"))
        assert backend.load_report.resized == ("na_svc: 32 -> 16 entries; its 20 entries do not fit, left to the sync",)
        backend.sync(many_services(), changed=None)
        assert len(programmed_names(backend)) == 16 and len(rejections.snapshot()) == 4
    finally:
        backend.cleanup()
