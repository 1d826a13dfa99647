"""The one interface the policy engine programs the kernel through, whichever dataplane holds
the rules: `PolicyDataplane`. The engine plans (semantics.py) and hands the plan to
`render`, then the result to `apply`; it never learns which tables or tools are behind them.
A CNI ADD or DEL takes the same `apply`: the planner gives one pod's change (pod_plan.py), the
dataplane renders the state with or without that pod (`render_with_pod`, `render_without_pod`),
and a PARTIAL apply writes the difference, which is that pod's.

Two implementations, one sub-package each (as proxy/'s backends): `iptables.dataplane.IptablesDataplane`
(iptables chains and ipsets, `iptables/render.py`) and `nftables.dataplane.NftablesDataplane` (the
`ip netagent-policy` nft table, `nftables/render.py`);
`daemon/policy_start.py` chooses by the proxy mode. Both keep the same contract: a PARTIAL
apply writes only what changed since the last one, a FULL one compares with the kernel (a
restarted agent adopts with zero writes, drift is repaired), the writes never open a pod, and
after any failure the next apply reads the kernel again. Both read back (each its `readback.py`) into
readback.py's
`KernelPolicy` (and the selector sets' members in ipset spelling), so `netagent status policy`,
its tracer and the denied-packets metric are the same code for either.
"""
from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

if TYPE_CHECKING:
    from netagent.policy.readback import KernelPolicy
    from netagent.policy.shared import RenderSettings
    from netagent.policy.pod_plan import PodAdded, PodRemoved
from netagent.policy.semantics import NodePlan, PodPlan


class Rendered(Protocol):
    """What the engine reads of a rendered state: the pods it had to leave closed."""
    @property
    def pending(self) -> tuple[str, ...]: ...      # no host interface found yet

    @property
    def refused(self) -> tuple[str, ...]: ...      # could not be rendered (why, in words)


@dataclass(frozen=True)
class ApplyReport:
    chains_written: int = 0
    chains_removed: int = 0
    sets_changed: int = 0          # sets (and, nft, verdict maps) whose members changed, or created
    sets_destroyed: int = 0
    jump_repaired: bool = False    # the hook (iptables: our jump; nft: the base chain) was repaired

    @property
    def wrote(self) -> bool:
        return bool(self.chains_written or self.chains_removed or self.sets_changed or self.sets_destroyed
                    or self.jump_repaired)


W = TypeVar("W", bound=Rendered)


class PolicyDataplane(abc.ABC, Generic[W]):
    """`W`: the dataplane's rendered state (iptables/render.py's `WantedState`,
    nftables/render.py's `NftPolicy`)."""

    @abc.abstractmethod
    def render(self, plan: NodePlan, *, settings: RenderSettings,
               interface_of: Callable[[PodPlan], str | None]) -> W:
        """What the plan asks of this dataplane (pure)."""

    @abc.abstractmethod
    def apply(self, wanted: W, *, full: bool) -> ApplyReport:
        """Make the kernel hold `wanted` (a `render` or one-pod render result of this
        dataplane): PARTIAL, the difference from the last apply (shared values skipped by
        identity, the rest compared by value); FULL, from what the kernel holds."""

    def render_with_pod(self, wanted: W, added: PodAdded, *, settings: RenderSettings,
                        interface_of: Callable[[PodPlan], str | None]) -> W | None:
        """The one-pod render of a CNI ADD (pure): `wanted` (what the last apply wrote) with
        `added.pod`, equal to `render(added.plan)` and sharing every unchanged value with
        `wanted`, so `apply(new, full=False)` finds the difference by identity in a few steps.
        None when it does not apply (the caller renders the whole plan)."""
        return None

    def render_without_pod(self, wanted: W, removed: PodRemoved, *, settings: RenderSettings) -> W | None:
        """`render_with_pod`'s reverse, for a DEL: `wanted` without `removed.pod`."""
        return None

    @abc.abstractmethod
    def cleanup(self) -> list[str]:
        """Remove every rule, chain and set of the policy engine; what was removed."""

    @abc.abstractmethod
    def read_policy(self) -> KernelPolicy:
        """The pod chains as the kernel holds them, with their denied-packet counters."""

    @abc.abstractmethod
    def read_sets(self) -> Mapping[str, frozenset[str]]:
        """The policy sets' members, in ipset spelling (what the tracer matches)."""
