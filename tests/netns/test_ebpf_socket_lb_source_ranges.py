"""loadBalancerSourceRanges on the socket load balancer (ebpf/sock_lb.c, sock_lb6.c), real sockets.

The client namespace of test_ebpf_socket_lb's topology gets a second address of each family,
outside the Service's ranges (the first is the only one inside). A process of the test's cgroup
connects (TCP) or sends (UDP) to the fenced load-balancer IP:
- bound to the address inside the ranges: served by a backend;
- bound to the address outside: refused with EPERM, never translated (what a local socket sees
  of a packet dropped on its way out, as the tc path drops it);
- unbound: the source is chosen by the route after the hook, so the socket LB leaves the call
  untranslated (the client namespace has no route to the load-balancer IP: ENETUNREACH);
- the Service's cluster IP is not fenced, from either address.
Both families; a v4-mapped load-balancer IP on an AF_INET6 socket is fenced by the IPv4 ranges.
"""
import errno
import json

import pytest

from netagent.kernel.families import IpFamily
from proxy.model import Endpoint, Protocol, ProxyState, ServicePort, ServicePortName
from tests.netns.ebpf_fixtures import bpf_root, require_bcc, run_in_cgroup, test_cgroup  # noqa: F401
from tests.netns.test_ebpf_socket_lb import (BACKENDS, BACKENDS6, NODE, NODE6, SERVED_BY, family_backend,  # noqa: F401
                                             lab)

FENCED = ServicePortName("default", "fenced", "http")
FENCED_UDP = ServicePortName("default", "fenced", "dns")


class Scenario:
    def __init__(self, inside: str, outside: str, lb_ip: str, cluster_ip: str, cluster_ip_udp: str, prefix: int):
        self.inside, self.outside, self.lb_ip = inside, outside, lb_ip
        self.cluster_ip, self.cluster_ip_udp, self.prefix = cluster_ip, cluster_ip_udp, prefix


SCENARIOS = {IpFamily.V4: Scenario("10.77.0.1", "10.77.0.9", "198.51.100.9", "10.96.1.10", "10.96.1.53", 24),
             IpFamily.V6: Scenario("fd77::1", "fd77::9", "fd00:51::9", "fd00:10:96::1:10", "fd00:10:96::1:53", 64)}


def fenced_state(family: IpFamily) -> ProxyState:
    s = SCENARIOS[family]
    ranges = (f"{s.inside}/{32 if family is IpFamily.V4 else 128}",)
    services = {
        FENCED: ServicePort(name=FENCED, protocol=Protocol.TCP, port=80, cluster_ip=s.cluster_ip,
                            load_balancer_ips=(s.lb_ip,), load_balancer_source_ranges=ranges),
        FENCED_UDP: ServicePort(name=FENCED_UDP, protocol=Protocol.UDP, port=53, cluster_ip=s.cluster_ip_udp,
                                load_balancer_ips=(s.lb_ip,), load_balancer_source_ranges=ranges),
    }
    endpoints = {FENCED: tuple(Endpoint(ip=ip, port=8080) for ip in SERVED_BY[family]),
                 FENCED_UDP: tuple(Endpoint(ip=ip, port=5353) for ip in SERVED_BY[family])}
    return ProxyState(node=NODE if family is IpFamily.V4 else NODE6, services=services, endpoints=endpoints)


CLIENT = r"""
import json, socket
INET = getattr(socket, INET)
def tcp(dest, source):
    s = socket.socket(INET); s.settimeout(10)
    try:
        if source: s.bind((source, 0))
        s.connect((dest, 80)); return s.recv(64).decode()
    except OSError as error:
        return error.errno
    finally:
        s.close()
def udp(dest, source):
    u = socket.socket(INET, socket.SOCK_DGRAM); u.settimeout(10)
    try:
        if source: u.bind((source, 0))
        u.sendto(b"q", (dest, 53)); return u.recvfrom(512)[0].decode().split()[0]
    except OSError as error:
        return error.errno
    finally:
        u.close()
out = {}
for label, source in (("inside", INSIDE), ("outside", OUTSIDE), ("unbound", None)):
    out[label] = {"lb_tcp": tcp(LB, source), "lb_udp": udp(LB, source),
                  "cluster_tcp": tcp(CLUSTER, source), "cluster_udp": udp(CLUSTER_UDP, source)}
print(json.dumps(out))
"""


def client(family: IpFamily, *, mapped: bool = False) -> str:
    s = SCENARIOS[family]
    m = (lambda a: f"::ffff:{a}") if mapped else (lambda a: a)
    inet = "AF_INET6" if mapped or family is IpFamily.V6 else "AF_INET"
    return (f"INSIDE, OUTSIDE, LB, CLUSTER, CLUSTER_UDP, INET = {m(s.inside)!r}, {m(s.outside)!r}, {m(s.lb_ip)!r}, "
            f"{m(s.cluster_ip)!r}, {m(s.cluster_ip_udp)!r}, {inet!r}\n" + CLIENT)


def add_outside_addresses(topology) -> None:
    veth = f"na-e{topology.names['cli'][-6:]}"
    topology.run("cli", "ip", "addr", "add", "10.77.0.9/24", "dev", veth)
    topology.run("cli", "ip", "addr", "add", "fd77::9/64", "dev", veth, "nodad")


def assert_fenced(out: dict, family: IpFamily) -> None:
    served = set(SERVED_BY[family])
    inside, outside, unbound = out["inside"], out["outside"], out["unbound"]
    assert inside["lb_tcp"] in served and inside["lb_udp"] in served, out
    assert outside["lb_tcp"] == errno.EPERM and outside["lb_udp"] == errno.EPERM, out
    assert unbound["lb_tcp"] == errno.ENETUNREACH and unbound["lb_udp"] == errno.ENETUNREACH, out   # untranslated
    for where in (inside, outside, unbound):   # the cluster IP is not fenced
        assert where["cluster_tcp"] in served and where["cluster_udp"] in served, out


@pytest.fixture(autouse=True)
def _bcc():
    require_bcc()


@pytest.mark.parametrize("family", list(IpFamily), ids=lambda f: f.label)
def test_a_fenced_load_balancer_ip_is_served_only_to_sources_inside_its_ranges(lab, family):  # noqa: F811
    topology, backend, paths = lab
    add_outside_addresses(topology)
    family_backend(backend, family).sync(fenced_state(family), changed=None)
    result = run_in_cgroup(paths.cgroup, topology.names["cli"], client(family))
    assert result.returncode == 0, result.stderr
    assert_fenced(json.loads(result.stdout), family)


def test_a_v4_mapped_fenced_load_balancer_ip_is_fenced_by_the_ipv4_ranges(lab):  # noqa: F811
    topology, backend, paths = lab
    add_outside_addresses(topology)
    backend.sync(fenced_state(IpFamily.V4), changed=None)
    result = run_in_cgroup(paths.cgroup, topology.names["cli"], client(IpFamily.V4, mapped=True))
    assert result.returncode == 0, result.stderr
    assert_fenced(json.loads(result.stdout), IpFamily.V4)
