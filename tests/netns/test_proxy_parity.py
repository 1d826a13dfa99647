"""One behaviour suite, the same assertions for every backend and both IP families: a client
in one namespace (the node), two backends in another, real sockets. Parity is shown, not
claimed: a backend that behaves differently fails under its own id. iptables (both of its
backends) and eBPF (the socket load balancer, and the tc path of pods outside its cgroup) and
nftables run here, each with IPv4 and with IPv6 (cluster IPs, endpoints and a NodePort on the
node's own IPv6 address; DAD off with `nodad`); IPVS needs a kernel with IPVS, so its leg
(tests/vm/guest/test_proxy_parity_ipvs.py) runs in the VM tier's guest with this module's
scenario: `programmed_by` and `assert_same_behaviour`."""
import contextlib
import dataclasses
import errno
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from ebpf.loader import SocketLbLoader
from ebpf.tc import attach_tc
from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.backend import IptablesBackend
from proxy.backend import ProxyBackend
from proxy.ebpf.backend import EbpfPaths
from proxy.factory import IptablesSpec, NftablesSpec, build_backend, build_ebpf_backend
from proxy.model import Endpoint, NodeContext, ProxyState
from tests.netns.ebpf_fixtures import bpf_root, require_bcc, run_in_cgroup, test_cgroup  # noqa: F401
from tests.netns.test_ebpf_socket_lb import (BACKENDS, BACKENDS6, CLIENT6, DNS, EMPTY, EMPTY_UDP, WEB,
                                             ClientAndBackends, service_state)

NODE_PORT = 30080


@dataclass(frozen=True)
class Addressing:
    """One family's addresses in the suite: the node (client), the backends, the service IPs."""
    family: IpFamily
    node: str
    backends: tuple[str, ...]
    web: str
    dns: str
    empty: str
    empty_udp: str
    service_cidr: str


V4 = Addressing(IpFamily.V4, "10.77.0.1", BACKENDS, "10.96.0.10", "10.96.0.53", "10.96.0.99", "10.96.0.98",
                "10.96.0.0/16")
V6 = Addressing(IpFamily.V6, CLIENT6, BACKENDS6, "fd00:10:96::a", "fd00:10:96::35",
                "fd00:10:96::63", "fd00:10:96::62", "fd00:10:96::/112")

CLIENT = r"""
import json, socket
family, node, web, dns, empty, empty_udp, node_port = ARGS
family, node_port = getattr(socket, family), int(node_port)
out = {"tcp": [], "peer": set(), "udp": set(), "udp_from": set(), "node_port": set()}
for _ in range(40):   # two backends picked at random: all 40 alike has odds of 2 in 2**40
    s = socket.create_connection((web, 80), timeout=30)
    out["peer"].add(s.getpeername()[:2]); out["tcp"].append(s.recv(64).decode()); s.close()
for _ in range(40 if node_port else 0):   # the NodePort on the node's own address
    s = socket.create_connection((node, node_port), timeout=30)
    out["node_port"].add(s.recv(64).decode()); s.close()
for i in range(40):
    u = socket.socket(family, socket.SOCK_DGRAM); u.settimeout(30)
    u.sendto(b"q", (dns, 53)); data, source = u.recvfrom(512)
    out["udp"].add(data.decode().split()[0]); out["udp_from"].add(source[:2])
e = socket.socket(family); e.settimeout(30)
try:
    e.connect((empty, 80)); out["empty"] = 0
except OSError as error:
    out["empty"] = error.errno
print(json.dumps({k: sorted(v) if isinstance(v, set) else v for k, v in out.items()}))
"""


def parity_state(addressing: Addressing = V4) -> ProxyState:
    """The suite's services in one family: web (TCP, with a NodePort), dns (UDP), two empty."""
    state = service_state()
    ips = {WEB: addressing.web, DNS: addressing.dns, EMPTY: addressing.empty, EMPTY_UDP: addressing.empty_udp}
    services = {name: dataclasses.replace(port, cluster_ip=ips[name], node_port=NODE_PORT if name == WEB else None)
                for name, port in state.services.items()}
    endpoints = {name: tuple(Endpoint(ip=ip, port=old[0].port) for ip in addressing.backends)
                 for name, old in state.endpoints.items()}
    node = NodeContext(name=state.node.name, local_addresses=(addressing.node,), family=addressing.family)
    return ProxyState(node=node, services=services, endpoints=endpoints)


@contextlib.contextmanager
def programmed_by(backend: ProxyBackend, run: Callable[[], subprocess.CompletedProcess],
                  addressing: Addressing = V4):
    """`run` (the client) with the suite's services programmed by `backend`, removed after."""
    try:
        backend.sync(parity_state(addressing), changed=None)
        yield run
    finally:
        backend.cleanup()


def client_script(addressing: Addressing, *, node_port: bool = True) -> str:
    """The client for one family (its addresses set at the top: run_in_cgroup passes no argv);
    without `node_port` it does not try the NodePort."""
    family = "AF_INET" if addressing.family is IpFamily.V4 else "AF_INET6"
    args = [family, addressing.node, addressing.web, addressing.dns, addressing.empty, addressing.empty_udp,
            str(NODE_PORT if node_port else 0)]
    return f"ARGS = {json.dumps(args)}\n{CLIENT}"


def client_in(client_ns: str, addressing: Addressing = V4, *,
              node_port: bool = True) -> Callable[[], subprocess.CompletedProcess]:
    """The client, run in its namespace (in no particular cgroup)."""
    return lambda: subprocess.run([*namespaces.exec_prefix(client_ns), sys.executable, "-c",
                                   client_script(addressing, node_port=node_port)],
                                  capture_output=True, text=True, timeout=120)


def assert_same_behaviour(result: subprocess.CompletedProcess, addressing: Addressing = V4, *,
                          node_port: bool = True) -> None:
    """What every backend must show the client: both backends answer TCP (at the cluster IP and,
    with `node_port`, the node's NodePort) and UDP, getpeername and the UDP replies' source say
    the service address, and an empty service refuses."""
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out["tcp"]) == set(addressing.backends)
    assert out["peer"] == [[addressing.web, 80]]
    assert set(out["node_port"]) == (set(addressing.backends) if node_port else set())
    assert set(out["udp"]) == set(addressing.backends)
    assert out["udp_from"] == [[addressing.dns, 53]]
    assert out["empty"] == errno.ECONNREFUSED


@pytest.fixture(params=[V4, V6], ids=["ipv4", "ipv6"])
def addressing(request) -> Addressing:
    return request.param


@pytest.fixture(params=["iptables-legacy", "iptables-nft", "nftables", "ebpf", "ebpf-tc"])
def programmed(request, addressing):
    """How to run the client (and whether it tries the NodePort), with the services programmed
    by one backend in one family. "ebpf"
    is the socket load balancer (the client in its cgroup); "ebpf-tc" the packet path a pod
    outside the cgroup takes (`na_tc_from_pod` and `na_tc_egress` on the backends' side of the
    link, as on a pod's host veth, with the client in no cgroup of ours)."""
    family = addressing.family
    family_argument = {} if family is IpFamily.V4 else {"family": family}
    node_port = request.param != "ebpf-tc"
    with ClientAndBackends() as topology, contextlib.ExitStack() as stack:   # dual-stack
        client_ns = topology.names["cli"]
        if request.param.startswith("ebpf"):
            require_bcc()
            cgroup, bpf_root = request.getfixturevalue("test_cgroup"), request.getfixturevalue("bpf_root")
            backend = build_ebpf_backend(EbpfPaths(bpf_root=bpf_root, cgroup=cgroup), **family_argument)
            run = lambda: run_in_cgroup(cgroup, client_ns, client_script(addressing))  # noqa: E731
            if request.param == "ebpf-tc":
                programs = stack.enter_context(SocketLbLoader(bpf_root=bpf_root, cgroup=cgroup).load_tc())
                with open(namespaces.netns_path(topology.names["be"])) as netns, namespaces.entered(netns.fileno()):
                    attach_tc(f"na-f{client_ns[-6:]}", programs.fds, ingress="na_tc_from_pod")
                namespaces.run_in(client_ns, ["ip", "route", "add", addressing.service_cidr, "via",
                                              addressing.backends[0]], check=True)
                # the "node" here is the client's own namespace: a pod outside the cgroup reaches a
                # NodePort through its host veth, not on its own address, so no NodePort in this leg
                run = client_in(client_ns, addressing, node_port=node_port)
        else:
            # iptables and nftables need a route to the cluster IPs: DNAT in OUTPUT comes after routing
            namespaces.run_in(client_ns, ["ip", "route", "add", addressing.service_cidr, "dev",
                                          f"na-e{client_ns[-6:]}"], check=True)
            if request.param == "nftables":
                backend = build_backend(NftablesSpec(), netns=client_ns, family=family)
            else:
                backend = build_backend(IptablesSpec(IptablesBackend(request.param.split("-")[1])),
                                        netns=client_ns, family=family)
            run = client_in(client_ns, addressing)
        with programmed_by(backend, run, addressing) as programmed_run:
            yield programmed_run, node_port


def test_every_backend_balances_answers_from_the_service_and_refuses_an_empty_one(programmed, addressing):
    run, node_port = programmed
    assert_same_behaviour(run(), addressing, node_port=node_port)

