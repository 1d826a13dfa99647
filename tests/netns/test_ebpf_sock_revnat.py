"""The socket load balancer's reverse translation lives in each socket (`na_sock_revnat`, socket
storage): a pod opening sockets without end cannot evict another socket's. A long-lived
unconnected UDP socket keeps seeing its replies come from the service address after other
sockets of the cgroup made more translated sends than the old shared LRU held (131,072)."""
import json
import subprocess
import sys

import pytest

from netagent.kernel import namespaces
from proxy.ebpf.backend import EbpfPaths
from proxy.factory import build_ebpf_backend
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName
from tests.netns.ebpf_fixtures import bpf_root, require_bcc, test_cgroup  # noqa: F401
from tests.netns.test_ebpf_socket_lb import BACKENDS, ClientAndBackends

DNS = ServicePortName("kube-system", "dns", "dns")
SINK = ServicePortName("default", "sink")
CHURN = 140_000


def state() -> ProxyState:
    services = {DNS: ServicePort(name=DNS, protocol=Protocol.UDP, port=53, cluster_ip="10.96.0.53"),
                SINK: ServicePort(name=SINK, protocol=Protocol.UDP, port=9, cluster_ip="10.96.0.9")}
    return ProxyState(node=NodeContext(name="node-1", local_addresses=("10.77.0.1",)), services=services,
                      endpoints={DNS: tuple(Endpoint(ip=ip, port=5353) for ip in BACKENDS),
                                 SINK: (Endpoint(ip="10.77.0.200", port=9),)})   # nobody: a black hole


LONG_LIVED = r"""
import json, socket, sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(30)
def ask(tag):
    sources = []
    for i in range(8):
        u.sendto(b"%s%d" % (tag, i), ("10.96.0.53", 53)); sources.append(list(u.recvfrom(512)[1]))
    return sources
print(json.dumps(ask(b"before")), flush=True)
sys.stdin.readline()
print(json.dumps(ask(b"after")), flush=True)
"""

CHURN_SCRIPT = r"""
import socket, sys
for i in range(int(sys.argv[1])):   # a fresh socket each time: one translation each
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"x", ("10.96.0.9", 9)); s.close()
print("done")
"""


def in_cgroup(cgroup: str, netns: str) -> list[str]:
    return ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec ip netns exec {netns} {sys.executable} -c "$0" "$@"']


@pytest.fixture
def lab(bpf_root, test_cgroup):  # noqa: F811
    require_bcc()
    with ClientAndBackends() as topology:
        paths = EbpfPaths(bpf_root=bpf_root, cgroup=test_cgroup)
        backend = build_ebpf_backend(paths)
        try:
            backend.sync(state(), changed=None)
            yield topology, paths
        finally:
            backend.cleanup()


def test_other_sockets_churning_cannot_evict_a_live_sockets_reverse_translation(lab):
    topology, paths = lab
    netns = topology.names["cli"]
    namespaces.run_in(netns, ["ip", "route", "add", "10.77.0.200/32", "dev", "lo"], check=True)   # sink: no ARP
    held = subprocess.Popen([*in_cgroup(paths.cgroup, netns), LONG_LIVED], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(held.stdout.readline()) == [["10.96.0.53", 53]] * 8
        churn = subprocess.run([*in_cgroup(paths.cgroup, netns), CHURN_SCRIPT, str(CHURN)], capture_output=True,
                               text=True, timeout=600)
        assert churn.stdout.strip() == "done", churn.stderr
        held.stdin.write("\n")
        held.stdin.flush()
        assert json.loads(held.stdout.readline()) == [["10.96.0.53", 53]] * 8
    finally:
        held.kill()
        held.wait()
