"""The service-address device: a dummy interface holding every address a virtual server listens on.

IPVS only sees packets the node delivers locally (its hooks sit in LOCAL_IN and LOCAL_OUT), so
every cluster IP, external IP and load-balancer IP must be a local address of the node. They
are put, as /32s (IPv6: /128s), on one dummy device of ours (`na-ipvs0`) that is never brought up: an
address on a device that is down still gets its local route (the kernel adds it with the
address), the device answers nothing itself (no ARP, no routes through it), and removing the
device removes every address at once. NodePort virtual servers listen on the node's own
addresses and need nothing here.

Which virtual servers are ours is decided from this device: one whose address is on it was
made by this backend (NodePort ones are recognised through our ipsets, see proxy/ipvs/rules.py).

`AddressDevice` is the interface; `NetlinkAddressDevice` (proxy/ipvs/netlink.py) is the real
one over pyroute2's IPRoute, `FakeAddressDevice` (fake_device.py) keeps the addresses in memory. Adding an
address already there and removing one already gone are quiet in both.

Dual-stack: the IPv4 and IPv6 backends share the one device. Each reads only its own family's
addresses (`addresses(family=)`), so a sync of one never removes the other's; `delete` is for
the last family to clean up (`IpvsProxy.cleanup` removes its own addresses and deletes the device
only when no address of the other family is left on it).
"""
from __future__ import annotations

import abc

from netagent.kernel import owned
from netagent.kernel.families import IpFamily

DEFAULT_DEVICE = owned.IPVS_DEVICE


class AddressDevice(abc.ABC):
    name: str

    @abc.abstractmethod
    def exists(self) -> bool: ...

    @abc.abstractmethod
    def ensure(self) -> bool:
        """Create the dummy device if missing (left down). Returns whether it was created."""

    @abc.abstractmethod
    def addresses(self, *, family: IpFamily = IpFamily.V4) -> frozenset[str]:
        """The host addresses of `family` on the device (empty when it does not exist)."""

    @abc.abstractmethod
    def add_address(self, address: str) -> None: ...

    @abc.abstractmethod
    def remove_address(self, address: str) -> None: ...

    @abc.abstractmethod
    def delete(self) -> None:
        """Remove the device and its addresses; quiet when it does not exist."""
