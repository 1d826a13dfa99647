"""Room in the eBPF backend's fixed-size maps: which service ports fit, and how full each map is.

`na_svc`, `na_slots`, `na_setname` and `na_lbsrc` are hash maps (LPM trie) of a fixed
`max_entries` (ebpf/sizes.py): a full one refuses an insert, and a refused batch leaves
what came before it written. So the backend never asks for more than fits: a full sync admits
service ports one by one (`admit`), the ones already in the maps first (a new Service never
pushes out a working one), then by name, each with all of its entries or none; a port that
does not fit is left out and rejected (`map-full`) while the others are written. Room is
counted at the sync's peak: updates are written before stale entries are deleted, so a stale
entry still takes its place until the end of the sync (the backend syncs once more when that
left a port out). A partial sync only checks that its additions fit (`fits`), else the
backend does a full sync instead.

`Fill` is what the maps hold after a sync, by map, kept without reading the kernel, and
warned about in the log when a map passes `NEAR_FULL` of its capacity.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from ebpf import maps as M
from ebpf.mapset import MapSet
from ebpf.sizes import NEAR_FULL
from proxy.ebpf.render import PortEntries
from proxy.model import ServicePortName

log = logging.getLogger("netagent.proxy.ebpf")

PROGRAMMED_MAPS = (M.SVC_MAP, M.SLOTS_MAP, M.SETNAME_MAP, M.LBSRC_MAP)   # the backend's own maps


def capacities(maps: MapSet) -> dict[str, int]:
    """Each programmed map's capacity, by role (0 for a map the family has not: IPv6's `na_lbsrc`)."""
    by_role = maps.by_role()
    return {role: by_role[role].max_entries if role in by_role else 0 for role in PROGRAMMED_MAPS}


def port_keys(entries: PortEntries) -> dict[str, set[bytes]]:
    """Every key one service port writes, by map."""
    return {M.SVC_MAP: set(entries.svc),
            M.SLOTS_MAP: {M.slot_key(sid, i) for sid, backends in entries.sets.items() for i in range(len(backends))},
            M.SETNAME_MAP: {M.set_id_key(sid) for sid in entries.set_names},
            M.LBSRC_MAP: set(entries.lbsrc)}


@dataclass
class Admission:
    """Which service ports a full sync writes (`admitted`, in order) and which it leaves out for
    want of room (`rejected`: port -> one line for the operator)."""

    admitted: dict[ServicePortName, PortEntries] = field(default_factory=dict)
    rejected: dict[ServicePortName, str] = field(default_factory=dict)


def admit(ports: Mapping[ServicePortName, PortEntries], *, present: Mapping[str, Mapping[bytes, bytes]],
          capacity: Mapping[str, int], first: frozenset[ServicePortName] = frozenset()) -> Admission:
    """Admit `ports` while they fit beside `present` (the maps' entries now, stale ones
    included): `first` (the ports already programmed) before the others, each in name order."""
    taken = {name: set(present[name]) for name in PROGRAMMED_MAPS}
    admission = Admission()
    for name in sorted(ports, key=lambda n: (n not in first, n)):
        keys = port_keys(ports[name])
        needs = {m: len(keys[m] - taken[m]) for m in PROGRAMMED_MAPS}
        short = [m for m in PROGRAMMED_MAPS if len(taken[m]) + needs[m] > capacity[m]]
        if short:
            admission.rejected[name] = "; ".join(
                f"{m} is full ({len(taken[m])} of {capacity[m]} entries, {needs[m]} more needed)" for m in short)
            continue
        for m in PROGRAMMED_MAPS:
            taken[m] |= keys[m]
        admission.admitted[name] = ports[name]
    return admission


@dataclass
class Fill:
    """Entries programmed in each of the backend's maps, and the maps warned about."""

    entries: dict[str, int] = field(default_factory=lambda: dict.fromkeys(PROGRAMMED_MAPS, 0))
    warned: set[str] = field(default_factory=set)

    def fits(self, added: Mapping[str, int], capacity: Mapping[str, int]) -> bool:
        return all(self.entries[m] + added.get(m, 0) <= capacity[m] for m in PROGRAMMED_MAPS)

    def warn_near_capacity(self, capacity: Mapping[str, int]) -> None:
        """Log once when a map passes NEAR_FULL of its capacity (again after it fell below 80 %)."""
        for m in PROGRAMMED_MAPS:
            if not capacity[m]:
                continue   # a map this family has not
            ratio = self.entries[m] / capacity[m]
            if ratio >= NEAR_FULL and m not in self.warned:
                self.warned.add(m)
                log.warning("ebpf: map %s is %d%% full (%d of %d entries): raise it with --bpf-map-max %s=N "
                            "before service ports are rejected", m, int(ratio * 100), self.entries[m], capacity[m], m)
            elif ratio < 0.8:
                self.warned.discard(m)
