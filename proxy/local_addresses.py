"""The node's own IPv4 addresses, read from the kernel: the `LocalAddresses` seam.

The proxy asks at every full sync (NodePorts answer on them; `--nodeport-addresses` picks
among them), and `netagent run` asks once at start to check that flag. The kernel is read
through one small interface so that what counts as a node address (every link but loopback
and the IPVS backend's own service-address device) is decided here once, and unit tests
drive it with `FakeLocalAddresses` (fake_local_addresses.py): `NetlinkLocalAddresses`
reads the links and addresses of the agent's network namespace over rtnetlink.
"""
from __future__ import annotations

import abc
import ipaddress
from collections.abc import Mapping

from netagent.kernel import owned

NOT_NODE_ADDRESS_LINKS = frozenset({"lo", owned.IPVS_DEVICE})


class LocalAddresses(abc.ABC):
    @abc.abstractmethod
    def by_link(self) -> Mapping[str, tuple[str, ...]]:
        """Every link's name -> its IPv4 addresses (no prefix length)."""

    def ipv4(self) -> tuple[str, ...]:
        """Every IPv4 address on this namespace's links except loopback and the proxy's own
        device, each once, in numeric order."""
        found = {address for link, addresses in self.by_link().items() if link not in NOT_NODE_ADDRESS_LINKS
                 for address in addresses}
        return tuple(sorted(found, key=lambda a: int(ipaddress.IPv4Address(a))))


class NetlinkLocalAddresses(LocalAddresses):
    """Reads the current namespace's links and addresses (one rtnetlink socket per call)."""

    def by_link(self) -> Mapping[str, tuple[str, ...]]:
        from pyroute2 import IPRoute
        with IPRoute() as ipr:
            names = {link["index"]: link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}
            found: dict[str, list[str]] = {name: [] for name in names.values()}
            for address in ipr.get_addr(family=2):
                name = names.get(address["index"])
                if name is not None:
                    found[name].append(address.get_attr("IFA_ADDRESS"))
        return {name: tuple(addresses) for name, addresses in found.items()}
