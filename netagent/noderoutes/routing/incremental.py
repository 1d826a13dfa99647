"""`IncrementalPlanner`: the plan after a few Nodes changed, equal to `render_plan` of every peer,
at a cost that does not grow with the number of peers.

A Node change used to re-render the whole plan (every peer admitted and rendered again: about
4 ms at 100 peers, 40 ms at 1,000 on the sync thread) to find that one peer changed. Here the
full render fills an `Admission` over a `ReleasableClaims` index and the planner keeps it with
each peer's outcome; a change then releases what the changed peers held and plans just them
against every claim still held (`plan.plan_peer`, the full render's own step).

That equals the full render because a peer's outcome depends on the others only through
conflicts (a CIDR, public IP or VTEP MAC held by an older peer):
- a changed peer that conflicts with nobody is admitted in either;
- one that conflicts with a holder while younger than every other peer is refused in either,
  naming the same holder (the index answers the oldest);
- removing or changing a peer can free a claim only for a peer refused over a conflict;
- a peer's new claims can change only a younger refused peer's refusal (the checks run in an
  order, and a conflict is found before a reserved range).
Anything else is left to the full render: a changed peer conflicting while not the youngest
(it might take a claim from a younger holder), one holding claims while a younger peer is
refused, any peer refused over a conflict before the change, different inputs (local node, settings, bounds), and BGP's learnt routes (bgp and
auto with BGP plan every peer from BIRD's table, which changes on its own).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from netagent.noderoutes.routing.admission import Admission, ReleasableClaims
from netagent.noderoutes.routing.model import (
    LocalNode,
    Peer,
    PeerBounds,
    PeerPlan,
    Plan,
    RefusalReason,
    Refused,
    RoutingSettings,
)
from netagent.noderoutes.routing.plan import file_outcome, ignored_cidrs, plan_peer, render_devices, render_plan

CONFLICTS = frozenset({RefusalReason.OVERLAP, RefusalReason.CONFLICT})  # outcomes that depend on other peers


@dataclass
class _Held:
    """What the last plan holds, per peer, and the admission holding their claims."""
    inputs: tuple  # (local, settings, bounds) the plan was made with
    devices: tuple
    admission: Admission
    planned: dict[str, PeerPlan] = field(default_factory=dict)
    refused: dict[str, Refused] = field(default_factory=dict)
    pending: dict[str, str] = field(default_factory=dict)
    ignored: dict[str, list[str]] = field(default_factory=dict)


class IncrementalPlanner:
    """Plans one family: `full` renders every peer; `change` only the named ones (or says None: render fully)."""

    def __init__(self) -> None:
        self._held: _Held | None = None
        self._peers: Mapping[str, Peer] = {}  # the peers of the last call (the claims' seniority)

    def full(self, local: LocalNode, peers: Mapping[str, Peer], settings: RoutingSettings, *,
             bounds: PeerBounds, learnt: Mapping | None = None) -> Plan:
        """`render_plan` of every peer, remembered for `change` (not with BGP's learnt routes)."""
        if learnt is not None:
            self._held = None
            return render_plan(local, peers.values(), settings, bounds=bounds, learnt=learnt)
        devices = render_devices(local, settings)
        self._peers = peers
        admission = Admission(local, (), bounds=bounds, devices=devices,
                              claims=ReleasableClaims(local.family, self._rank))
        plan = render_plan(local, peers.values(), settings, bounds=bounds, admission=admission)
        self._held = _Held(inputs=(local, settings, bounds), devices=devices, admission=admission,
                           planned=dict(plan.peers), refused=dict(plan.refused), pending=dict(plan.pending),
                           ignored={name: found for name, peer in peers.items()
                                    if name != local.name and (found := ignored_cidrs(local, peer))})
        return plan

    def change(self, local: LocalNode, peers: Mapping[str, Peer], settings: RoutingSettings, *,
               bounds: PeerBounds, names: Iterable[str]) -> Plan | None:
        """The plan after the peers `names` changed (`peers` already holds their new values, the
        removed ones gone), or None when only a full render can tell (see the module docstring)."""
        held = self._held
        if held is None or held.inputs != (local, settings, bounds) or \
                any(refused.label in CONFLICTS for refused in held.refused.values()):
            return None
        self._peers = peers
        changed = set(names) - {local.name}
        for name in changed:
            held.admission.release(name)
            for outcomes in (held.planned, held.refused, held.pending, held.ignored):
                outcomes.pop(name, None)
        for peer in sorted((peers[name] for name in changed if name in peers), key=lambda p: p.seniority):
            result = plan_peer(local, peer, settings, admission=held.admission, learnt={})
            if isinstance(result, Refused) and result.label in CONFLICTS and not _youngest(peer, peers, local) or \
                    held.admission.holds(peer.name) and any(peers[name].seniority > peer.seniority
                                                            for name in held.refused if name in peers):
                self._held = None  # half-changed: the full render starts afresh
                return None
            file_outcome(peer.name, result, planned=held.planned, refused=held.refused, pending=held.pending)
            found = ignored_cidrs(local, peer)
            if found:
                held.ignored[peer.name] = found
        ignored = sorted(entry for entries in held.ignored.values() for entry in entries)
        return Plan(devices=held.devices, peers=dict(held.planned), refused=dict(held.refused),
                    pending=dict(held.pending), ignored_ipv6=tuple(ignored_cidrs(local) + ignored))

    def _rank(self, owner: str) -> tuple:
        """The full render's claim order: this node first, then the peers by seniority."""
        peer = self._peers.get(owner)
        return (0,) if peer is None else (1, peer.seniority)


def _youngest(peer: Peer, peers: Mapping[str, Peer], local: LocalNode) -> bool:
    """No other peer is younger: it can take no claim from anyone."""
    return all(other.seniority < peer.seniority for name, other in peers.items()
               if name != peer.name and name != local.name)
