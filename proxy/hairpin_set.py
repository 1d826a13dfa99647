"""The hairpin ipset's size: chosen from the state, grown by replacing the set, never full.

Shared by the iptables and IPVS backends. The hairpin set (one `endpoint,proto:port,endpoint`
member per selected endpoint of every service port) grows with Services x ports x endpoints, and a hash set refuses
members past its `maxelem`: at the old fixed 262,144, 27 Services x 100 ports over the same
100 pods made `ipset restore` fail with `Hash is full` before the iptables restore, so
nothing at all was programmed on any node. A set's `maxelem` is fixed when it is created and
a set an iptables rule references cannot be destroyed, so growing means a *new* set:

- capacities are powers of two from `minimum` (262,144, ipset's default) up; the set of the
  smallest capacity keeps the plain name (`NETAGENT-HAIRPIN`, `NETAGENT-IPVS-HAIRPIN`: what
  earlier agents made) and a larger one is named for its capacity (`NETAGENT-HAIRPIN-20`
  holds 2^20), so a restarted agent recognises every set of ours by its name;
- a set is kept while its members stay under 7/8 of its capacity; past that the next
  capacity at least twice the members is chosen: the backend creates and fills it, the same
  restore that writes the rules points the MASQUERADE rule at it, and the old set is
  destroyed afterwards (`obsolete`). It never shrinks while the agent runs (no flapping).

A hash set's memory grows with its members, not its `maxelem`, so a large capacity costs
nothing until used. A set holds one family (`family`, ipset's `inet` or `inet6`): the IPv6
backend's set has a base name of its own.
"""
from __future__ import annotations

import re

from netagent.kernel.ipset import IpsetSpec, IpsetType
from netagent.kernel.ipset.model import DEFAULT_MAX_ELEMENTS

HAIRPIN_COMMENT = "netagent service proxy: endpoints reaching themselves through their service"


def fits(spec: IpsetSpec, members: int) -> bool:
    """Whether `members` leave `spec` the headroom we keep (an eighth of its capacity)."""
    return members <= spec.max_elements - spec.max_elements // 8


def hairpin_spec(base: str, capacity: int, *, minimum: int = DEFAULT_MAX_ELEMENTS, family: str = "inet") -> IpsetSpec:
    name = base if capacity == minimum else f"{base}-{capacity.bit_length() - 1}"
    return IpsetSpec(name, IpsetType.HASH_IP_PORT_IP, comment=HAIRPIN_COMMENT, max_elements=capacity,
                     family=family)


def choose(base: str, members: int, *, current: IpsetSpec | None,
           minimum: int = DEFAULT_MAX_ELEMENTS, family: str = "inet") -> IpsetSpec:
    """The set to hold `members`: `current` while they fit, else the smallest capacity (a power
    of two times `minimum`) with room for twice as many."""
    if current is not None and fits(current, members):
        return current
    capacity = minimum
    while not fits(IpsetSpec(base, IpsetType.HASH_IP_PORT_IP, max_elements=capacity), 2 * members):
        capacity *= 2
    return hairpin_spec(base, capacity, minimum=minimum, family=family)


def is_hairpin_set(base: str, name: str) -> bool:
    """A hairpin set of ours of any capacity (`base` or `base-<log2 capacity>`)."""
    return name == base or bool(re.fullmatch(rf"{re.escape(base)}-\d{{1,2}}", name))


def capacity_of(base: str, name: str, *, minimum: int = DEFAULT_MAX_ELEMENTS) -> int:
    """The capacity a set's name says it was made with."""
    return minimum if name == base else 1 << int(name.rsplit("-", 1)[1])
