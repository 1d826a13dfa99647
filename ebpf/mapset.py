"""The maps as the agent's API: `BpfMap` (one map, entries as bytes) and `MapSet` (all of ours).

A backend reads a whole map once (`read_all`, a batch lookup), computes what differs from
what it wants, and writes only that (`update`, `delete`: batch calls). `PinnedMap` is the
real one, working from a file descriptor of a map pinned in the agent's bpffs directory, so
read-back and adoption need no compiler; `FakeBpfMap` (ebpf/fake_maps.py) keeps the same
state in a dict and refuses what the kernel refuses (wrong sizes, a full map).
Entries are the packed bytes of ebpf/maps.py's layouts.

A MapSet is one family's: the IPv4 set (`na_svc`, ...) carries the IPv6 one (`na_svc6`, ...)
as `v6`, so whoever opens the pinned maps hands one object to either family's backend
(`of(family)`). The tc-path maps (`ct`, `ct_new`, `lbsrc`, `config`) may be None only in a
set built by hand (a test's); open_pinned and fake_map_set give both families all of theirs.
"""
from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ebpf import syscall
from ebpf.maps import (
    AFFINITY_MAP,
    CONFIG_MAP,
    CT_MAP,
    CT_NEW_MAP,
    LAYOUTS,
    LBSRC_MAP,
    MAP_NAMES,
    MAP_NAMES6,
    SETNAME_MAP,
    SLOTS_MAP,
    SVC_MAP,
    v6_name,
)
from netagent.kernel.families import IpFamily


class BpfMap(ABC):
    name: str
    key_size: int
    value_size: int
    max_entries: int

    @abstractmethod
    def read_all(self) -> dict[bytes, bytes]:
        """Every entry now in the map."""

    @abstractmethod
    def update(self, items: Mapping[bytes, bytes]) -> None:
        """Create or replace these entries (one batch)."""

    @abstractmethod
    def delete(self, keys: Iterable[bytes]) -> None:
        """Remove these keys; a key already gone is not an error."""

    @abstractmethod
    def lookup(self, key: bytes) -> bytes | None:
        """One entry, or None."""

    @abstractmethod
    def count(self) -> int:
        """How many entries the map holds."""


class PinnedMap(BpfMap):
    """A map by file descriptor (opened from its pin, or handed over by the loader)."""

    def __init__(self, name: str, fd: int):
        self.name = name
        self.fd = fd
        info = syscall.map_info(fd)
        layout = LAYOUTS[name]
        if (info.key_size, info.value_size) != (layout.key_size, layout.value_size):
            raise syscall.BpfError(0, f"map {name}: key/value sizes {info.key_size}/{info.value_size} in the "
                                      f"kernel, {layout.key_size}/{layout.value_size} expected")
        self.key_size, self.value_size, self.max_entries = info.key_size, info.value_size, info.max_entries

    @classmethod
    def open(cls, name: str, path: str) -> PinnedMap:
        return cls(name, syscall.obj_get(path))

    def read_all(self) -> dict[bytes, bytes]:
        return syscall.map_read_all(self.fd, self.key_size, self.value_size)

    def update(self, items: Mapping[bytes, bytes]) -> None:
        syscall.map_update_batch(self.fd, list(items.items()))

    def delete(self, keys: Iterable[bytes]) -> None:
        syscall.map_delete_batch(self.fd, list(keys))

    def lookup(self, key: bytes) -> bytes | None:
        return syscall.map_lookup(self.fd, key, self.value_size)

    def count(self) -> int:
        return syscall.map_count(self.fd, self.key_size, self.value_size)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass
class MapSet:
    """One family's maps of ours (the socket load balancer's and the tc path's), by role."""

    svc: BpfMap
    slots: BpfMap
    setname: BpfMap
    affinity: BpfMap
    ct: BpfMap | None = None       # the tc path's
    ct_new: BpfMap | None = None
    lbsrc: BpfMap | None = None
    config: BpfMap | None = None
    v6: MapSet | None = None       # the IPv4 set's IPv6 sibling (None: maps pinned before IPv6 existed)

    def by_role(self) -> dict[str, BpfMap]:
        """Role (the IPv4 map's name) -> this family's map, for the maps it has."""
        roles = {SVC_MAP: self.svc, SLOTS_MAP: self.slots, SETNAME_MAP: self.setname, AFFINITY_MAP: self.affinity,
                 CT_MAP: self.ct, CT_NEW_MAP: self.ct_new, LBSRC_MAP: self.lbsrc, CONFIG_MAP: self.config}
        return {role: bpf_map for role, bpf_map in roles.items() if bpf_map is not None}

    def by_name(self) -> dict[str, BpfMap]:
        """Each map of this family by its own name (`na_svc6` in the IPv6 set)."""
        return {bpf_map.name: bpf_map for bpf_map in self.by_role().values()}

    def of(self, family: IpFamily) -> MapSet:
        """This set (IPv4), or its IPv6 sibling; LookupError when there is none."""
        if family is IpFamily.V4:
            return self
        if self.v6 is None:
            raise LookupError("no IPv6 maps pinned (an agent from before IPv6 pinned these maps)")
        return self.v6

    @classmethod
    def from_maps(cls, maps: Mapping[str, BpfMap]) -> MapSet:
        """From maps by name: the IPv4 ones, and the IPv6 ones when all of them are there."""
        v6 = None
        if all(name in maps for name in MAP_NAMES6):
            v6 = cls(svc=maps[v6_name(SVC_MAP)], slots=maps[v6_name(SLOTS_MAP)], setname=maps[v6_name(SETNAME_MAP)],
                     affinity=maps[v6_name(AFFINITY_MAP)], ct=maps[v6_name(CT_MAP)], ct_new=maps[v6_name(CT_NEW_MAP)],
                     lbsrc=maps[v6_name(LBSRC_MAP)], config=maps[v6_name(CONFIG_MAP)])
        return cls(svc=maps[SVC_MAP], slots=maps[SLOTS_MAP], setname=maps[SETNAME_MAP], affinity=maps[AFFINITY_MAP],
                   ct=maps[CT_MAP], ct_new=maps[CT_NEW_MAP], lbsrc=maps[LBSRC_MAP],
                   config=maps[CONFIG_MAP], v6=v6)

    @classmethod
    def open_pinned(cls, pin_dir: str) -> MapSet:
        """The pinned maps in `pin_dir` (IPv6's too, when pinned); FileNotFoundError when any
        IPv4 one is missing."""
        opened: dict[str, BpfMap] = {}
        try:
            for name in (*MAP_NAMES, *MAP_NAMES6):
                path = os.path.join(pin_dir, name)
                if not os.path.exists(path):
                    if name in MAP_NAMES6:
                        continue
                    raise FileNotFoundError(f"no pinned map {path}")
                opened[name] = PinnedMap.open(name, path)
        except BaseException:
            for bpf_map in opened.values():
                if isinstance(bpf_map, PinnedMap):
                    bpf_map.close()
            raise
        return cls.from_maps(opened)

    def close(self) -> None:
        for bpf_map in self.by_name().values():
            if isinstance(bpf_map, PinnedMap):
                bpf_map.close()
        if self.v6 is not None:
            self.v6.close()
