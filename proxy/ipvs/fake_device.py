"""`FakeAddressDevice`: the IPVS address device in memory, recording every write, for unit tests."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from netagent.kernel.families import IpFamily
from proxy.ipvs.device import DEFAULT_DEVICE, AddressDevice


@dataclass(frozen=True)
class DeviceWrite:
    operation: str      # "create", "add", "remove", "delete"
    detail: str = ""


class FakeAddressDevice(AddressDevice):
    def __init__(self, name: str = DEFAULT_DEVICE):
        self.name = name
        self.present = False
        self.held: set[str] = set()
        self.writes: list[DeviceWrite] = []

    def exists(self) -> bool:
        return self.present

    def ensure(self) -> bool:
        if self.present:
            return False
        self.present = True
        self.writes.append(DeviceWrite("create", self.name))
        return True

    def addresses(self, *, family: IpFamily = IpFamily.V4) -> frozenset[str]:
        return frozenset(address for address in self.held if IpFamily.of(address) is family)

    def add_address(self, address: str) -> None:
        if not self.present:
            raise LookupError(f"device {self.name} does not exist")
        address = str(ipaddress.ip_address(address))
        if address not in self.held:
            self.held.add(address)
            self.writes.append(DeviceWrite("add", address))

    def remove_address(self, address: str) -> None:
        address = str(ipaddress.ip_address(address))
        if address in self.held:
            self.held.discard(address)
            self.writes.append(DeviceWrite("remove", address))

    def delete(self) -> None:
        if self.present:
            self.present = False
            self.held.clear()
            self.writes.append(DeviceWrite("delete", self.name))
