"""Reading the eBPF backend's maps back: slot layouts (for adoption) and services (for status).

`netagent status services` shows what the maps hold, not what the agent meant: each `na_svc`
entry with the name its set carries in `na_setname` and the backends in its slots, in slot
order. The set shown is the one the socket load balancer uses (the cluster set); when the
external set differs (externalTrafficPolicy Local), its backends follow, marked "(external)".
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

from ebpf import maps as M
from ebpf.mapset import MapSet
from proxy.backend import ProgrammedService
from proxy.ebpf.render import MAP_KIND

ENTRY_KIND = {code: kind for kind, code in MAP_KIND.items()}   # the map's code -> the one EntryKind


def slot_layouts(slots: Mapping[bytes, bytes]) -> dict[int, tuple[bytes, ...]]:
    """set id -> packed backends in slot order, up to the first missing slot."""
    by_set: dict[int, dict[int, bytes]] = defaultdict(dict)
    for key, value in slots.items():
        sid, slot = M.parse_slot_key(key)
        by_set[sid][slot] = value
    layouts = {}
    for sid, positions in by_set.items():
        ordered: list[bytes] = []
        while len(ordered) in positions:
            ordered.append(positions[len(ordered)])
        layouts[sid] = tuple(ordered)
    return layouts


def programmed_services(maps: MapSet) -> list[ProgrammedService]:
    layouts = slot_layouts(maps.slots.read_all())
    names = {M.parse_set_id(k): M.parse_set_name(v)[0] for k, v in maps.setname.read_all().items()}
    out = []
    for key, value in maps.svc.read_all().items():
        entry = M.parse_svc(key, value)
        backends = [M.parse_backend(b) for b in layouts.get(entry.set_id, ())[:entry.count]]
        if entry.ext_set_id != entry.set_id:
            backends += [f"{M.parse_backend(b)} (external)"
                         for b in layouts.get(entry.ext_set_id, ())[:entry.ext_count]]
        if entry.affinity_timeout:
            backends = [f"{b} (affinity {entry.affinity_timeout}s)" for b in backends]
        out.append(ProgrammedService(name=names.get(entry.set_id, f"set {entry.set_id}"),
                                     address=f"{entry.address}:{entry.port}/{entry.protocol}",
                                     kind=ENTRY_KIND[entry.kind].value, backends=tuple(backends)))
    return sorted(out, key=lambda s: (s.name, s.kind, s.address))
