"""Service ports the kernel refused: which one a refused restore line belongs to, and leaving it out.

iptables-restore applies all of its input or nothing, so one service port whose rules the
kernel or the tool refuses (a comment past the 256 characters xt_comment holds, a match the
running kernel lacks) used to fail the whole sync: nothing programmed on the node, /healthz
red after a minute. The tool names the line it refused (`IptablesError.line`); `owner_of_line`
finds the service port that contributed it (one of its chains, or one of its lines in the
shared chains), and the backend writes everything else again without it.

A port left out stays out while its definition and endpoints are what was refused
(`leave_out_known`), so the refusal costs one extra restore, not one per sync; any change to
it and it is tried again.
"""
from __future__ import annotations

from dataclasses import dataclass

from proxy.iptables.names import FILTER_CHAIN, NODEPORTS_CHAIN, SERVICES_CHAIN
from proxy.iptables.render import Ruleset
from proxy.model import Endpoint, ProxyState, ServicePort, ServicePortName


@dataclass(frozen=True)
class LeftOut:
    """A service port as it was when the kernel refused it, and why."""
    service: ServicePort
    endpoints: tuple[Endpoint, ...]
    reason: str


def _lines_of(rules) -> list[str]:
    lines = []
    for chain in rules.chains:
        lines.append(chain.declaration)
        lines.extend(chain.rules)
        lines.append(f"-X {chain.name}")
    for chain_name, own in ((SERVICES_CHAIN, rules.services), (NODEPORTS_CHAIN, rules.nodeports),
                            (FILTER_CHAIN, rules.filter)):
        lines.extend(f"-A {chain_name} {line}" for line in own)
    return lines


def owner_of_line(ruleset: Ruleset, line: str | None) -> ServicePortName | None:
    """The service port whose rules hold `line` (a restore input line); None when it is no
    single service port's (a shared rule, a COMMIT). A line the tool cut short (a carriage
    return in a name: the fake splits lines there) is matched by its start when that names
    one service port only."""
    if not line or not line.strip():
        return None
    line = line.strip()
    starting = set()
    for name, rules in ruleset.ports.items():
        for own in _lines_of(rules):
            if own == line:
                return name
            if own.startswith(line):
                starting.add(name)
    return starting.pop() if len(starting) == 1 and len(line) > 16 else None


def without(state: ProxyState, names: set[ServicePortName] | frozenset[ServicePortName]) -> ProxyState:
    """`state` minus the service ports `names`."""
    return ProxyState(node=state.node,
                      services={n: s for n, s in state.services.items() if n not in names},
                      endpoints={n: e for n, e in state.endpoints.items() if n not in names})


def leave_out_known(state: ProxyState, changed: frozenset[ServicePortName] | None, *,
                    left_out: dict[ServicePortName, LeftOut]) -> tuple[ProxyState, frozenset[ServicePortName] | None]:
    """Drop from `state` the ports refused before and unchanged since; forget (so retry) the
    ones that changed or are gone. `left_out` is updated in place."""
    keep = set()
    for name, left in list(left_out.items()):
        if state.services.get(name) == left.service and state.endpoints_of(name) == left.endpoints:
            keep.add(name)
        else:
            del left_out[name]
    if not keep:
        return state, changed
    return without(state, keep), (changed - keep if changed is not None else None)
