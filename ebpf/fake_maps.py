"""`FakeBpfMap` and `fake_map_set()`: the maps as dicts, for unit tests of the eBPF backend.

Stateful like the kernel's maps: fixed key and value sizes (a wrong size is EINVAL, nothing
written), a capacity: a hash map refuses a new key when full (E2BIG), and a batch stops there,
its earlier elements written, as the kernel's MAP_UPDATE_BATCH does; an LRU map (ebpf/maps.py's
LRU_MAPS) never refuses, it evicts its least recently used entry. Deleting a missing key
succeeds. Every write call is counted, so tests can assert that an
adopting sync wrote nothing and a one-endpoint change wrote O(1) entries.
"""
from __future__ import annotations

import errno
from collections.abc import Iterable, Mapping

from ebpf.mapset import BpfMap, MapSet
from ebpf.maps import LAYOUTS, LRU_MAPS, MAP_NAMES, MAP_NAMES6


class FakeBpfMap(BpfMap):
    def __init__(self, name: str, *, max_entries: int = 1 << 20):
        layout = LAYOUTS[name]
        self.name = name
        self.key_size, self.value_size = layout.key_size, layout.value_size
        self.max_entries = max_entries
        self.lru = name in LRU_MAPS
        self.entries: dict[bytes, bytes] = {}   # least recently used first (LRU maps)
        self.evicted = 0
        self.updated = 0      # entries written, over all update calls
        self.deleted = 0      # keys deleted
        self.fail_next_update: OSError | None = None

    def _check(self, key: bytes, value: bytes | None = None) -> None:
        if len(key) != self.key_size or (value is not None and len(value) != self.value_size):
            raise OSError(errno.EINVAL, f"{self.name}: wrong key or value size")

    def read_all(self) -> dict[bytes, bytes]:
        return dict(self.entries)

    def update(self, items: Mapping[bytes, bytes]) -> None:
        if self.fail_next_update is not None:
            error, self.fail_next_update = self.fail_next_update, None
            raise error
        for key, value in items.items():
            self._check(key, value)
        for key, value in items.items():
            if key not in self.entries and len(self.entries) >= self.max_entries:
                if not self.lru:
                    raise OSError(errno.E2BIG, f"{self.name}: map full ({self.max_entries} entries)")
                del self.entries[next(iter(self.entries))]
                self.evicted += 1
            self.entries.pop(key, None)
            self.entries[key] = value
            self.updated += 1

    def delete(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            self._check(key)
            if self.entries.pop(key, None) is not None:
                self.deleted += 1

    def lookup(self, key: bytes) -> bytes | None:
        self._check(key)
        value = self.entries.get(key)
        if value is not None and self.lru:   # a lookup is a use
            self.entries[key] = self.entries.pop(key)
        return value

    def count(self) -> int:
        return len(self.entries)

    @property
    def writes(self) -> int:
        return self.updated + self.deleted


def fake_map_set(*, max_entries: int = 1 << 20, sizes: Mapping[str, int] | None = None) -> MapSet:
    """Every map of ours (IPv6's as `.v6`), each `max_entries` big unless `sizes` names it."""
    sizes = sizes or {}
    return MapSet.from_maps({name: FakeBpfMap(name, max_entries=sizes.get(name, max_entries))
                             for name in (*MAP_NAMES, *MAP_NAMES6)})


def writes(maps: MapSet) -> int:
    """Entries written or deleted over every fake map of the set (and its IPv6 sibling's)."""
    sets = [maps] if maps.v6 is None else [maps, maps.v6]
    return sum(m.writes for one in sets for m in one.by_name().values() if isinstance(m, FakeBpfMap))
