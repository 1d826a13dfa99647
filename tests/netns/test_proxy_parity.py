"""One behaviour suite, the same assertions for every backend: a client in one namespace, two
backends in another, real sockets. Parity is shown, not claimed: a backend that behaves
differently fails under its own id. iptables (both of its backends) and eBPF (the socket load
balancer, and the tc path of pods outside its cgroup) and nftables run here; IPVS
needs a kernel with IPVS, so its leg (tests/vm/guest/test_proxy_parity_ipvs.py) runs in the VM
tier's guest with this module's scenario: `programmed_by` and `assert_same_behaviour`."""
import contextlib
import errno
import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from ebpf.loader import SocketLbLoader
from ebpf.tc import attach_tc
from netagent.kernel import namespaces
from netagent.kernel.iptables.backend import IptablesBackend
from proxy.backend import ProxyBackend
from proxy.ebpf.backend import EbpfPaths
from proxy.factory import build_backend, build_ebpf_backend
from tests.netns.ebpf_fixtures import bpf_root, require_bcc, run_in_cgroup, test_cgroup  # noqa: F401
from tests.netns.test_ebpf_socket_lb import BACKENDS, ClientAndBackends, service_state

CLIENT = r"""
import json, socket
out = {"tcp": [], "peer": set(), "udp": set(), "udp_from": set()}
for _ in range(40):   # two backends picked at random: all 40 alike has odds of 2 in 2**40
    s = socket.create_connection(("10.96.0.10", 80), timeout=30)
    out["peer"].add(s.getpeername()); out["tcp"].append(s.recv(64).decode()); s.close()
for i in range(40):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(30)
    u.sendto(b"q", ("10.96.0.53", 53)); data, source = u.recvfrom(512)
    out["udp"].add(data.decode().split()[0]); out["udp_from"].add(source)
e = socket.socket(); e.settimeout(30)
try:
    e.connect(("10.96.0.99", 80)); out["empty"] = 0
except OSError as error:
    out["empty"] = error.errno
print(json.dumps({k: sorted(v) if isinstance(v, set) else v for k, v in out.items()}))
"""


@contextlib.contextmanager
def programmed_by(backend: ProxyBackend, run: Callable[[], subprocess.CompletedProcess]):
    """`run` (the client) with the suite's services programmed by `backend`, removed after."""
    try:
        backend.sync(service_state(), changed=None)
        yield run
    finally:
        backend.cleanup()


def client_in(client_ns: str) -> Callable[[], subprocess.CompletedProcess]:
    """The client, run in its namespace (in no particular cgroup)."""
    return lambda: subprocess.run([*namespaces.exec_prefix(client_ns), sys.executable, "-c", CLIENT],
                                  capture_output=True, text=True, timeout=120)


def assert_same_behaviour(result: subprocess.CompletedProcess) -> None:
    """What every backend must show the client: both backends answer TCP and UDP, getpeername
    and the UDP replies' source say the service address, and an empty service refuses."""
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert set(out["tcp"]) == set(BACKENDS)
    assert out["peer"] == [["10.96.0.10", 80]]
    assert set(out["udp"]) == set(BACKENDS)
    assert out["udp_from"] == [["10.96.0.53", 53]]
    assert out["empty"] == errno.ECONNREFUSED


@pytest.fixture(params=["iptables-legacy", "iptables-nft", "nftables", "ebpf", "ebpf-tc"])
def programmed(request):
    """How to run the client, with the services programmed by one backend. "ebpf" is the socket
    load balancer (the client in its cgroup); "ebpf-tc" the packet path a pod outside the cgroup
    takes (`na_tc_from_pod` and `na_tc_egress` on the backends' side of the link, as on a pod's
    host veth, with the client in no cgroup of ours)."""
    with ClientAndBackends() as topology, contextlib.ExitStack() as stack:
        client_ns = topology.names["cli"]
        if request.param.startswith("ebpf"):
            require_bcc()
            cgroup, bpf_root = request.getfixturevalue("test_cgroup"), request.getfixturevalue("bpf_root")
            backend = build_ebpf_backend(EbpfPaths(bpf_root=bpf_root, cgroup=cgroup))
            run = lambda: run_in_cgroup(cgroup, client_ns, CLIENT)  # noqa: E731
            if request.param == "ebpf-tc":
                programs = stack.enter_context(SocketLbLoader(bpf_root=bpf_root, cgroup=cgroup).load_tc())
                with open(namespaces.netns_path(topology.names["be"])) as netns, namespaces.entered(netns.fileno()):
                    attach_tc(f"na-f{client_ns[-6:]}", programs.fds, ingress="na_tc_from_pod")
                namespaces.run_in(client_ns, ["ip", "route", "add", "10.96.0.0/16", "via", BACKENDS[0]], check=True)
                run = client_in(client_ns)
        else:
            # iptables and nftables need a route to the cluster IPs: DNAT in OUTPUT comes after routing
            namespaces.run_in(client_ns, ["ip", "route", "add", "10.96.0.0/16", "dev",
                                          f"na-e{client_ns[-6:]}"], check=True)
            if request.param == "nftables":
                backend = build_backend("nftables", iptables_backend=IptablesBackend.NFT, netns=client_ns)
            else:
                backend = build_backend("iptables", iptables_backend=IptablesBackend(request.param.split("-")[1]),
                                        netns=client_ns)
            run = client_in(client_ns)
        with programmed_by(backend, run) as programmed_run:
            yield programmed_run


def test_every_backend_balances_answers_from_the_service_and_refuses_an_empty_one(programmed):
    assert_same_behaviour(programmed())
