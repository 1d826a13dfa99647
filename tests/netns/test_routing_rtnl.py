"""`routing/rtnl.py` against the real kernel, in a throwaway namespace: the hand-packed writes
land as `ip` shows them (IPv4 and IPv6, neighbour and FDB on a VXLAN device), a refusal comes
back as `KernelError` with the kernel's errno, deleting what is gone succeeds, and the address
listener says "changed" exactly when a link or address changed."""
import errno
import json
import subprocess
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network

import pytest

from netagent.kernel import namespaces
from netagent.kernel.errors import KernelError
from netagent.noderoutes.routing.kernel import NetlinkKernel
from netagent.noderoutes.routing.model import FdbEntry, Neighbour, Route


def ip(netns: str, *argv: str) -> str:
    return subprocess.run([*namespaces.exec_prefix(netns), "ip", *argv], check=True, capture_output=True,
                          text=True).stdout


@pytest.fixture
def node():
    name = namespaces.unique_name("na-rtnl")
    namespaces.create(name)
    try:
        for line in ("link add eth0 type veth peer name eth1", "addr add 192.0.2.1/24 dev eth0",
                     "addr add 2001:db8::1/64 dev eth0 nodad", "link set eth0 up", "link set eth1 up",
                     "link add vx0 type vxlan id 1 dstport 4789 dev eth0 nolearning", "link set vx0 up"):
            ip(name, *line.split())
        kernel = NetlinkKernel.in_namespace(name)
        yield name, kernel
        kernel.close()
    finally:
        namespaces.remove(name)


def test_writes_land_as_ip_shows_them_and_deletes_of_absent_objects_succeed(node):
    name, kernel = node
    mac = "0e:42:00:00:00:02"
    kernel.replace_neighbour(Neighbour(address=IPv4Address("10.244.2.0"), mac=mac, ifname="vx0"))
    kernel.replace_fdb(FdbEntry(mac=mac, dst=IPv4Address("192.0.2.2"), ifname="vx0"))
    route = Route(dst=IPv4Network("10.244.2.0/24"), gateway=IPv4Address("10.244.2.0"), ifname="vx0", onlink=True)
    kernel.replace_route(route)
    kernel.replace_route(route)  # replace twice: still one route
    v6 = Route(dst=IPv6Network("fd00:10:244:2::/64"), gateway=IPv6Address("2001:db8::2"), ifname="eth0")
    kernel.replace_route(v6)
    shown = json.loads(ip(name, "-j", "route", "show", "proto", "78"))
    assert [(r["dst"], r["gateway"], r["dev"], r.get("flags")) for r in shown] == [
        ("10.244.2.0/24", "10.244.2.0", "vx0", ["onlink"])]
    assert ip(name, "-6", "route", "show", "proto", "78").startswith("fd00:10:244:2::/64 via 2001:db8::2 dev eth0 ")
    assert "10.244.2.0 lladdr 0e:42:00:00:00:02 PERMANENT" in ip(name, "neigh", "show", "dev", "vx0")
    assert f"{mac} dst 192.0.2.2 self permanent" in subprocess.run(
        [*namespaces.exec_prefix(name), "bridge", "fdb", "show", "dev", "vx0"], capture_output=True, text=True).stdout
    assert set(kernel.dump_routes()) == {route} and kernel.dump_fdb("vx0")[0].mac == mac
    for _ in range(2):  # the second round deletes what is gone: quiet
        kernel.delete_route(route)
        kernel.delete_route(v6)
        kernel.delete_neighbour(Neighbour(address=IPv4Address("10.244.2.0"), mac=mac, ifname="vx0"))
        kernel.delete_fdb(FdbEntry(mac=mac, dst=IPv4Address("192.0.2.2"), ifname="vx0"))
    assert ip(name, "route", "show", "proto", "78") == "" and kernel.dump_fdb("vx0") == []
    assert kernel.dump_neighbours("vx0") == []


def test_a_refusal_carries_the_kernels_errno(node):
    _, kernel = node
    unreachable = Route(dst=IPv4Network("10.244.3.0/24"), gateway=IPv4Address("203.0.113.1"), ifname="eth0")
    with pytest.raises(KernelError) as refused:
        kernel.replace_route(unreachable)  # the gateway is on no connected network, and not onlink
    assert refused.value.code == errno.ENETUNREACH
    assert str(refused.value).startswith("replace route 10.244.3.0/24 via 203.0.113.1 dev eth0")


def test_the_listener_says_changed_only_after_a_link_or_address_changed(node):
    name, kernel = node
    assert kernel.addresses_changed()  # the first look: whatever was there counts
    assert not kernel.addresses_changed()
    kernel.replace_route(Route(dst=IPv4Network("10.244.4.0/24"), gateway=IPv4Address("192.0.2.4"), ifname="eth0"))
    assert not kernel.addresses_changed()  # a route is no address
    ip(name, "addr", "add", "198.51.100.1/24", "dev", "eth1")
    assert kernel.addresses_changed() and not kernel.addresses_changed()
