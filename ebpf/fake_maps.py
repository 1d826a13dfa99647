"""`FakeBpfMap` and `fake_map_set()`: the maps as dicts, for unit tests of the eBPF backend.

Stateful like the kernel's hash maps: fixed key and value sizes (a wrong size is EINVAL), a
capacity (an update that would exceed it is E2BIG, and nothing of that batch is written, as
the kernel stops at the first failing element and the backend treats it as a failed sync),
deleting a missing key succeeds. Every write call is counted, so tests can assert that an
adopting sync wrote nothing and a one-endpoint change wrote O(1) entries.
"""
from __future__ import annotations

import errno
from collections.abc import Iterable, Mapping

from ebpf.mapset import BpfMap, MapSet
from ebpf.maps import LAYOUTS, MAP_NAMES


class FakeBpfMap(BpfMap):
    def __init__(self, name: str, *, max_entries: int = 1 << 20):
        layout = LAYOUTS[name]
        self.name = name
        self.key_size, self.value_size = layout.key_size, layout.value_size
        self.max_entries = max_entries
        self.entries: dict[bytes, bytes] = {}
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
        new = sum(1 for key in items if key not in self.entries)
        if len(self.entries) + new > self.max_entries:
            raise OSError(errno.E2BIG, f"{self.name}: map full ({self.max_entries} entries)")
        self.entries.update(items)
        self.updated += len(items)

    def delete(self, keys: Iterable[bytes]) -> None:
        for key in keys:
            self._check(key)
            if self.entries.pop(key, None) is not None:
                self.deleted += 1

    def lookup(self, key: bytes) -> bytes | None:
        self._check(key)
        return self.entries.get(key)

    def count(self) -> int:
        return len(self.entries)

    @property
    def writes(self) -> int:
        return self.updated + self.deleted


def fake_map_set(*, max_entries: int = 1 << 20) -> MapSet:
    return MapSet.from_maps({name: FakeBpfMap(name, max_entries=max_entries) for name in MAP_NAMES})


def writes(maps: MapSet) -> int:
    """Entries written or deleted over every fake map of the set."""
    return sum(m.writes for m in maps.by_name().values() if isinstance(m, FakeBpfMap))
