"""The node's own addresses of each IP family, read from the kernel: the `LocalAddresses` seam.

The proxy asks at every full sync (NodePorts answer on them; `--nodeport-addresses` picks
among them), and `netagent run` asks once at start to check that flag. The kernel is read
through one small interface so that what counts as a node address (every link but loopback
and the IPVS backend's own service-address device) is decided here once, and unit tests
drive it with `FakeLocalAddresses` (fake_local_addresses.py): `NetlinkLocalAddresses`
reads the links and addresses of the agent's network namespace over rtnetlink. IPv6
link-local addresses (fe80::/10) are not node addresses: a NodePort is not offered on them.
"""
from __future__ import annotations

import abc
import ipaddress
from collections.abc import Mapping

from netagent.kernel import owned
from netagent.kernel.families import IpFamily

NOT_NODE_ADDRESS_LINKS = frozenset({"lo", owned.IPVS_DEVICE})


class LocalAddresses(abc.ABC):
    @abc.abstractmethod
    def by_link(self, family: IpFamily = IpFamily.V4) -> Mapping[str, tuple[str, ...]]:
        """Every link's name -> its addresses of `family` (no prefix length)."""

    def of_family(self, family: IpFamily) -> tuple[str, ...]:
        """Every address of `family` on this namespace's links except loopback, the proxy's own
        device and IPv6 link-local ones, each once, in numeric order."""
        found = {ipaddress.ip_address(address) for link, addresses in self.by_link(family).items()
                 if link not in NOT_NODE_ADDRESS_LINKS for address in addresses}
        kept = (a for a in found if a.version == family.value and not a.is_link_local)
        return tuple(str(a) for a in sorted(kept))

    def ipv4(self) -> tuple[str, ...]:
        return self.of_family(IpFamily.V4)


class NetlinkLocalAddresses(LocalAddresses):
    """Reads the current namespace's links and addresses (one rtnetlink socket per call)."""

    def by_link(self, family: IpFamily = IpFamily.V4) -> Mapping[str, tuple[str, ...]]:
        import socket

        from pyroute2 import IPRoute
        with IPRoute() as ipr:
            names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
            found: dict[str, list[str]] = {name: [] for name in names.values()}
            kernel_family = socket.AF_INET if family is IpFamily.V4 else socket.AF_INET6
            for address in ipr.get_addr(family=kernel_family):
                name = names.get(address["index"])
                if name is not None:
                    found[name].append(address.get_attr("IFA_ADDRESS"))
        return {name: tuple(addresses) for name, addresses in found.items()}
