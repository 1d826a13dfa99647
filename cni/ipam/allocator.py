"""Allocation, release, check and garbage collection of addresses over a store.

Semantics are host-local's (`plugins/ipam/host-local/backend/allocator`): per range set,
round robin starting after the set's `last_reserved_ip.<n>` (so a crash-looping pod does
not get its old address straight back), wrapping across the set's ranges in order,
skipping gateways; one address per set; "duplicate allocation is not allowed"; release
by (containerID, ifname) by scanning the files, falling back to the old container-ID-only
format when nothing in the current format matched.

Where this differs from host-local it is on purpose: the whole ADD runs under one lock
hold (host-local locks per range set), so a failure in set 2 rolls back exactly what this
call reserved in set 1 and nothing else; `last_reserved_ip.<n>` is only written once
every set succeeded; the duplicate check also applies to requested addresses; and every
gateway of the set is skipped, not only the current range's.

Cost per operation: one lock, one directory listing, one read per reservation file in
the ranges (the owner check host-local also makes), one O_EXCL create per address
handed out. Candidates are tested against the listing held as a set of integers, so a
nearly full /16 is searched in memory, never with a `stat` per address.
"""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

from cni.errors import CniError, ErrorCode
from cni.ipam.config import Address, IpamConf, RangeSet
from cni.ipam.store import ReservationStore, owner_text

_FAMILIES = ((socket.AF_INET, 4), (socket.AF_INET6, 6))


@dataclass(frozen=True, kw_only=True)
class Lease:
    """One address handed out from range set `set_index`."""

    set_index: int
    address: Address
    prefixlen: int
    gateway: Address

    @property
    def name(self) -> str:
        return str(self.address)

    @property
    def interface(self) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
        return ipaddress.ip_interface((self.address, self.prefixlen))

    def to_result_ip(self) -> dict:
        return {"address": f"{self.address}/{self.prefixlen}", "gateway": str(self.gateway)}


def address_key(name: str) -> tuple | None:
    """(IP version, integer) for a file named by an address, None for anything else."""
    for family, version in _FAMILIES:
        try:
            return version, int.from_bytes(socket.inet_pton(family, name), "big")
        except (OSError, ValueError):
            continue
    return None


def _reservations(store) -> dict:
    """name -> (version, int) for every file in the listing named by an address."""
    keys = {}
    for name in store.names():
        key = address_key(name)
        if key is not None:
            keys[name] = key
    return keys


def _set_bounds(range_set: RangeSet) -> list:
    return [(int(r.start), int(r.end), r) for r in range_set.ranges]


def _in_set(key: tuple, range_set: RangeSet) -> bool:
    version, value = key
    return version == range_set.version and any(
        int(r.start) <= value <= int(r.end) for r in range_set.ranges)


def _owned_by(content: str | None, *, container_id: str, ifname: str) -> bool:
    """host-local's match: the current format, or the old format naming only the ID."""
    return content is not None and content in (owner_text(container_id, ifname),
                                               container_id.strip())


def _segments(range_set: RangeSet, *, after: int | None) -> list:
    """(first, last, range) runs in round-robin order, resuming after `after`."""
    bounds = _set_bounds(range_set)
    for index, (start, end, ip_range) in enumerate(bounds):
        if after is not None and start <= after <= end:
            rotated = bounds[index + 1:] + bounds[:index]
            return [(after + 1, end, ip_range), *rotated, (start, after, ip_range)]
    return bounds


def _candidates(range_set: RangeSet, *, after: int | None):
    """Every address of the set once, in round-robin order, gateways excluded."""
    gateways = {int(g) for g in range_set.gateways}
    for first, last, ip_range in _segments(range_set, after=after):
        for value in range(first, last + 1):
            if value not in gateways:
                yield value, ip_range


def _last_reserved(store: ReservationStore, *, set_index: int, range_set: RangeSet) -> int | None:
    text = store.last_reserved(set_index)
    key = address_key(text) if text else None
    return key[1] if key is not None and _in_set(key, range_set) else None


def _exhausted(range_set: RangeSet) -> CniError:
    return CniError(ErrorCode.RANGE_EXHAUSTED,
                    f"no IP addresses available in range set: {range_set}")


def _take_next(store: ReservationStore, *, range_set: RangeSet, set_index: int, taken: set, owner: str) -> Lease:
    after = _last_reserved(store, set_index=set_index, range_set=range_set)
    version = range_set.version
    for value, ip_range in _candidates(range_set, after=after):
        if (version, value) in taken:
            continue
        address = ipaddress.IPv4Address(value) if version == 4 else ipaddress.IPv6Address(value)
        if store.reserve(str(address), owner=owner):
            return Lease(set_index=set_index, address=address,
                         prefixlen=ip_range.subnet.prefixlen, gateway=ip_range.gateway)
        taken.add((version, value))  # created behind our back by a writer without the lock
    raise _exhausted(range_set)


def _take_requested(store: ReservationStore, *, range_set: RangeSet, set_index: int, address: Address,
                    taken: set, owner: str) -> Lease:
    ip_range = range_set.range_for(address)
    if ip_range is None or (address.version, int(address)) in taken or not store.reserve(str(address), owner=owner):
        raise CniError(ErrorCode.ADDRESS_CONFLICT,
                       f"requested IP address {address} is not available in range set "
                       f"{range_set}")
    return Lease(set_index=set_index, address=address, prefixlen=ip_range.subnet.prefixlen,
                 gateway=ip_range.gateway)


def _refuse_duplicates(store: ReservationStore, ipam: IpamConf, *, reservations: dict, container_id: str,
                       ifname: str) -> None:
    in_ranges = [name for name, key in reservations.items()
                 if any(_in_set(key, s) for s in ipam.range_sets)]
    for name, content in store.read_owners(in_ranges).items():
        if _owned_by(content, container_id=container_id, ifname=ifname):
            raise CniError(ErrorCode.ADDRESS_CONFLICT,
                           f"{name} has been allocated to {container_id}, duplicate "
                           "allocation is not allowed", f"interface {ifname}")


def _release_quietly(store: ReservationStore, leases: list) -> None:
    for lease in leases:
        try:
            store.release(lease.name)
        except CniError:
            pass


def allocate(store: ReservationStore, ipam: IpamConf, *, container_id: str, ifname: str,
             requested: dict | None = None) -> list:
    """One lease per range set for (container_id, ifname); all or nothing.

    `requested` maps a set index to the address that set must hand out (see
    `config.assign_requested`); other sets use round robin.
    """
    requested = requested or {}
    owner = owner_text(container_id, ifname)
    with store.locked():
        reservations = _reservations(store)
        _refuse_duplicates(store, ipam, reservations=reservations,
                           container_id=container_id, ifname=ifname)
        taken = set(reservations.values())
        leases: list = []
        try:
            for index, range_set in enumerate(ipam.range_sets):
                if index in requested:
                    leases.append(_take_requested(store, range_set=range_set, set_index=index,
                                                  address=requested[index], taken=taken,
                                                  owner=owner))
                else:
                    leases.append(_take_next(store, range_set=range_set, set_index=index,
                                             taken=taken, owner=owner))
            for lease in leases:
                store.set_last_reserved(lease.set_index, lease.name)
        except BaseException:
            _release_quietly(store, leases)
            raise
    return leases


def _owners(store) -> dict:
    """name -> trimmed content for every address-named file (unreadable ones left out)."""
    return store.read_owners(list(_reservations(store)))


def _release_all(store: ReservationStore, names, *, what: str) -> None:
    failures = []
    for name in names:
        try:
            store.release(name)
        except CniError as err:
            failures.append(f"{name}: {err.details or err.msg}")
    if failures:
        raise CniError(ErrorCode.IO_FAILURE, f"{what}: could not release {len(failures)} "
                       "reservation(s)", "; ".join(failures))


def release(store: ReservationStore, *, container_id: str, ifname: str) -> list:
    """Release every reservation of (container_id, ifname); return the names released.

    Nothing held is not an error. Like host-local, old-format files (container ID only)
    are released only when no current-format file matched.
    """
    if not store.exists():
        return []
    with store.locked():
        owners = _owners(store)
        current = owner_text(container_id, ifname)
        names = [n for n, content in owners.items() if content == current]
        if not names:
            names = [n for n, content in owners.items() if content == container_id.strip()]
        _release_all(store, names, what=f"release of {container_id}/{ifname}")
    return names


def missing_sets(store: ReservationStore, ipam: IpamConf, *, container_id: str, ifname: str) -> list:
    """Indexes of the range sets in which (container_id, ifname) holds no address."""
    if not store.exists():
        return list(range(len(ipam.range_sets)))
    with store.locked():
        held = [key for name, content in _owners(store).items()
                if _owned_by(content, container_id=container_id, ifname=ifname)
                and (key := address_key(name)) is not None]
    return [i for i, s in enumerate(ipam.range_sets) if not any(_in_set(k, s) for k in held)]


def collect_garbage(store: ReservationStore, *, valid) -> list:
    """Release every reservation whose owner is not in `valid` ((containerID, ifname) pairs).

    Old-format files survive when their container ID appears in `valid` with any ifname.
    Per-file failures do not stop the sweep; they are raised together at the end.
    """
    if not store.exists():
        return []
    keep = {owner_text(c, i) for c, i in valid} | {c.strip() for c, _ in valid}
    with store.locked():
        names = [n for n, content in _owners(store).items() if content not in keep]
        _release_all(store, names, what="GC")
    return names


def has_free_address(range_set: RangeSet, *, taken: set) -> bool:
    version = range_set.version
    return any((version, v) not in taken for v, _ in _candidates(range_set, after=None))


def exhausted_sets(store: ReservationStore, ipam: IpamConf) -> list:
    """Indexes of the range sets that have no address left to hand out."""
    with store.locked():
        taken = set(_reservations(store).values())
    return [i for i, s in enumerate(ipam.range_sets) if not has_free_address(s, taken=taken)]


def exhausted_error(ipam: IpamConf, index: int) -> CniError:
    return _exhausted(ipam.range_sets[index])
