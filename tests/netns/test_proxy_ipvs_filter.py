"""The IPVS backend's filter for service addresses, on the real kernel with real packets (issue 29, item 4).

IPVS makes every service address local (on `na-ipvs0`), so without a filter every socket of the
node listening on a wildcard address answers on a Service's address, on any port: a tenant's
externalIP became a second address of the node's sshd and kubelet. IPVS itself cannot run on
this kernel (the VM tier runs it: tests/vm/), so the backend runs here with its real device,
real ipsets and real iptables (legacy and nft) in a namespace this test makes, and a fake IPVS
table. What stands for IPVS on the service port is the node's own server on that port: reached,
it proves the address is local and the port passes; every other port of a service address must
go unanswered, while the node's own address still answers on it.

    cli 192.168.78.2 -- 192.168.78.1 [node: na-ipvs0 (down), the rules; servers on 0.0.0.0:80 and :2222]
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from netagent.kernel import namespaces
from netagent.kernel.fake_sysctl import FakeSysctls
from netagent.kernel.ipset import IpsetRunner
from netagent.kernel.iptables.runner import IptablesRunner
from proxy.ipvs.device import DEFAULT_DEVICE as DEVICE
from proxy.ipvs.fake_table import FakeIpvsTable
from proxy.ipvs.netlink import NetlinkAddressDevice
from proxy.ipvs.proxy import IpvsProxy
from proxy.ipvs.sysctls import IPVS_SYSCTLS
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName, TrafficPolicy
from tests.netns.test_proxy_iptables import PROBE, SERVER
from tests.netns.topology import NamespaceTopology

NODE_ADDRESS, CLIENT = "192.168.78.1", "192.168.78.2"
CLUSTER_IP, EXTERNAL_IP = "10.96.0.10", "203.0.113.7"
SERVICE_PORT, OTHER_PORT = 80, 2222


class Lab(NamespaceTopology):
    def __init__(self):
        super().__init__(("node", "cli"))

    def _build(self):
        self.run("node", "ip", "link", "add", "n-cli", "type", "veth", "peer", "name", "eth0",
                 "netns", self.names["cli"])
        self.run("node", "ip", "addr", "add", f"{NODE_ADDRESS}/24", "dev", "n-cli")
        self.run("node", "ip", "link", "set", "n-cli", "up")
        self.run("node", "ip", "link", "set", "lo", "up")
        self.run("cli", "ip", "addr", "add", f"{CLIENT}/24", "dev", "eth0")
        self.run("cli", "ip", "link", "set", "eth0", "up")
        self.run("cli", "ip", "route", "add", "default", "via", NODE_ADDRESS)
        # the service-address device, left down as the backend leaves it: a dummy where the kernel
        # has the module (the backend creates it), else made here as a veth (this kernel has none)
        try:
            self.run("node", "ip", "link", "add", DEVICE, "type", "dummy")
        except subprocess.CalledProcessError:
            self.run("node", "ip", "link", "add", DEVICE, "type", "veth", "peer", "name", "na-ipvs0-peer")
        for port in (SERVICE_PORT, OTHER_PORT):
            self.start_server("node", [sys.executable, "-c", SERVER, f"node:{port}", str(port)])

    def answer(self, role: str, host: str, port: int, *, timeout: float) -> str:
        done = namespaces.run_in(self.names[role], [sys.executable, "-c", PROBE, "tcp", host, str(port), "1",
                                                    str(timeout)], check=True, timeout=timeout + 30)
        return done.stdout.strip().rsplit("|", 1)[0]


@pytest.fixture
def lab():
    with Lab() as lab:
        yield lab


def test_a_service_address_answers_only_on_its_service_ports(lab, backend):
    prefix = namespaces.exec_prefix(lab.names["node"])
    device = NetlinkAddressDevice(netns=lab.names["node"])
    proxy = IpvsProxy(table=FakeIpvsTable(), device=device, ipset=IpsetRunner(exec_prefix=prefix),
                      iptables=IptablesRunner(backend=backend, exec_prefix=prefix, timeout=120, lock_wait_seconds=60),
                      sysctls=FakeSysctls({s.key: "0" for s in IPVS_SYSCTLS}))
    node = NodeContext(name="node", cluster_cidr="10.244.0.0/16", local_addresses=(NODE_ADDRESS,))
    web = ServicePort(ServicePortName("default", "web", "http"), Protocol.TCP, SERVICE_PORT, CLUSTER_IP)
    edge = ServicePort(ServicePortName("tenant", "edge", "http"), Protocol.TCP, SERVICE_PORT, "10.96.0.11",
                       external_ips=(EXTERNAL_IP,), external_policy=TrafficPolicy.LOCAL)
    endpoint = (Endpoint("10.244.0.5", 8080, node_name="node"),)
    state = ProxyState(node, {web.name: web, edge.name: edge}, {web.name: endpoint, edge.name: endpoint})
    try:
        proxy.sync(state, changed=None)
        assert device.addresses() == {CLUSTER_IP, "10.96.0.11", EXTERNAL_IP}
        for address in (CLUSTER_IP, EXTERNAL_IP):   # the service port passes (the address is local)
            assert lab.answer("cli", address, SERVICE_PORT, timeout=15).startswith(f"node:{SERVICE_PORT} ")
        for address in (CLUSTER_IP, EXTERNAL_IP):   # any other port is dropped, from outside and from the node
            assert lab.answer("cli", address, OTHER_PORT, timeout=2) == "timeout"
            assert lab.answer("node", address, OTHER_PORT, timeout=2) == "timeout"
        assert lab.answer("cli", NODE_ADDRESS, OTHER_PORT, timeout=15).startswith(f"node:{OTHER_PORT} ")
        # the Service gone: its address is no longer local, and nothing of ours is left behind
        proxy.sync(ProxyState(node, {web.name: web}, {web.name: endpoint}), changed=None)
        assert device.addresses() == {CLUSTER_IP}
        assert lab.answer("cli", EXTERNAL_IP, OTHER_PORT, timeout=2) != f"node:{OTHER_PORT} {CLIENT}"
        assert lab.answer("cli", CLUSTER_IP, OTHER_PORT, timeout=2) == "timeout"
    finally:
        proxy.cleanup()
        proxy.close()
