"""How many entries each BPF map of ours holds (`max_entries`), chosen at start by the operator.

The programs' maps are fixed-size: a hash map that is full refuses an insert, an LRU map
evicts its least recently used entry. Their capacities are compile-time constants of the C
(`NA_MAX_<MAP>`, defaults there and here alike); the loader passes the chosen ones to bcc
as defines. `--bpf-map-max NAME=N` (repeatable) overrides a default: a cluster with more
service addresses than `na_svc` holds needs a larger one (the backend writes what fits and
rejects the rest with `map-full`), a small test a tiny one. A pinned map of another size
left by an earlier run is recreated at the new size by the loader (ebpf/loader.py).

Defaults (hash maps are BPF_F_NO_PREALLOC: an unused entry costs no memory; LRU maps are
preallocated, roughly 100 bytes an entry):
  na_svc 262,144 service addresses (10,000 Services x ~26 addresses), na_slots 2,097,152
  backends over all sets, na_setname 524,288 sets, na_lbsrc 65,536 source ranges,
  na_affinity 65,536 (LRU), na_ct 262,144 confirmed tc-path flow directions (two per flow)
  and na_ct_new 65,536 new or closing ones. The socket load balancer's reverse translation
  is socket storage (`na_sock_revnat`): it grows and shrinks with the sockets, no size.
  IPv6's maps (`na_svc6`, ..., `na_ct6`: the IPv4 name with a 6) have the IPv4 ones'
  defaults and are sized on their own (`--bpf-map-max na_svc6=N`); while IPv6 is unused only
  its LRU maps (`na_affinity6`, `na_ct6`, `na_ct_new6`, preallocated) take memory: shrink
  them on an IPv4-only node if it matters.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from ebpf import maps as M
from netagent.errors import NetagentError

DEFAULT_MAX_ENTRIES: Mapping[str, int] = MappingProxyType({
    M.SVC_MAP: 262_144, M.SLOTS_MAP: 2_097_152, M.SETNAME_MAP: 524_288, M.AFFINITY_MAP: 65_536,
    M.CT_MAP: 262_144, M.CT_NEW_MAP: 65_536, M.LBSRC_MAP: 65_536,
    M.v6_name(M.SVC_MAP): 262_144, M.v6_name(M.SLOTS_MAP): 2_097_152, M.v6_name(M.SETNAME_MAP): 524_288,
    M.v6_name(M.AFFINITY_MAP): 65_536, M.v6_name(M.CT_MAP): 262_144, M.v6_name(M.CT_NEW_MAP): 65_536,
    M.v6_name(M.LBSRC_MAP): 65_536,
})
MIN_ENTRIES = 16            # LRU maps keep per-CPU free lists: fewer entries than this evict at random
MAX_ENTRIES = 1 << 26       # 67M: beyond any cluster (and an LRU map this large would take gigabytes)
NEAR_FULL = 0.9             # a map this full is warned about (log) before it refuses


class MapSizeError(NetagentError, ValueError):
    pass


def define_name(map_name: str) -> str:
    """`na_ct_new` -> `NA_MAX_CT_NEW`: the C macro of a map's capacity."""
    return "NA_MAX_" + map_name.removeprefix("na_").upper()


@dataclass(frozen=True)
class MapSizes:
    """Every sized map's max_entries (the defaults, with the operator's overrides)."""

    max_entries: Mapping[str, int] = field(default_factory=lambda: DEFAULT_MAX_ENTRIES)

    def __post_init__(self) -> None:
        for name, size in self.max_entries.items():
            if name not in DEFAULT_MAX_ENTRIES:
                raise MapSizeError(f"--bpf-map-max: no sized map {name!r} (maps: {', '.join(DEFAULT_MAX_ENTRIES)})")
            if isinstance(size, bool) or not isinstance(size, int) or not MIN_ENTRIES <= size <= MAX_ENTRIES:
                raise MapSizeError(f"--bpf-map-max {name}={size!r}: an integer from {MIN_ENTRIES} to {MAX_ENTRIES}")
        object.__setattr__(self, "max_entries", MappingProxyType({**DEFAULT_MAX_ENTRIES, **self.max_entries}))

    def __getitem__(self, name: str) -> int:
        return self.max_entries[name]

    def defines(self) -> list[str]:
        return [f"#define {define_name(name)} {size}" for name, size in sorted(self.max_entries.items())]

    @classmethod
    def parse(cls, values: Iterable[str]) -> MapSizes:
        """From `--bpf-map-max` values, each `NAME=N` or a comma-separated list of them."""
        sizes: dict[str, int] = {}
        for value in values:
            for item in filter(None, (part.strip() for part in value.split(","))):
                name, sep, number = item.partition("=")
                if not sep:
                    raise MapSizeError(f"--bpf-map-max {item!r}: expected NAME=N (e.g. na_svc=524288)")
                try:
                    sizes[name.strip()] = int(number.strip().replace("_", ""))
                except ValueError:
                    raise MapSizeError(f"--bpf-map-max {item!r}: {number.strip()!r} is not a number") from None
        return cls(sizes)


DEFAULT_SIZES = MapSizes()
