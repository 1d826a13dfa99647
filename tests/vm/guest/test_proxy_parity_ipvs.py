"""The shared behaviour suite's IPVS leg (tests/netns/test_proxy_parity.py): the same topology,
client and assertions as iptables and eBPF there, on a kernel that has IPVS (the guest's), in
each family (the topology is dual-stack; IPv6: AF_INET6 virtual servers, /128 addresses on the
device, the REJECT rule in ip6tables).

IPVS balances locally made connections in the client's own namespace (the cluster IPs on its
dummy device, the virtual servers there), replies come back translated from the service
address, and the backend's REJECT rule refuses the service without endpoints.
"""
from __future__ import annotations

import pytest

from netagent.kernel.iptables.backend import IptablesBackend
from proxy.factory import IpvsSpec, build_backend
from tests.netns.test_ebpf_socket_lb import ClientAndBackends
from tests.netns.test_proxy_parity import V4, V6, Addressing, assert_same_behaviour, client_in, programmed_by


@pytest.mark.parametrize("addressing", [V4, V6], ids=["ipv4", "ipv6"])
def test_ipvs_balances_answers_from_the_service_and_refuses_an_empty_one(modprobe, addressing: Addressing):
    modprobe("ip_vs", "ip_vs_rr", "nf_conntrack")
    with ClientAndBackends() as topology:
        client_ns = topology.names["cli"]
        backend = build_backend(IpvsSpec(IptablesBackend.NFT), netns=client_ns, family=addressing.family)
        with programmed_by(backend, client_in(client_ns, addressing), addressing) as run:
            assert_same_behaviour(run(), addressing)
