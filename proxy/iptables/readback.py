"""Reading the service proxy's rules back from iptables-save: for status, and for a full sync.

`programmed_services` answers `netagent status services` from the kernel, not from memory,
so it also works for an agent that just restarted. Rules carry no comments except those
that enter a service port (NETAGENT-SERVICES, NETAGENT-NODEPORTS and the filter chain),
each `"namespace/name:port Kind"`; everything else is derived from the chain structure:
a ClusterIP rule's SVC chain holds one DNAT per endpoint (or, with affinity, jumps to SEP
chains holding them); an EXT chain's last unconditional jump into SVC/SVL is where external
traffic ends up; a FW chain admits sources into the EXT chain. Service ports whose traffic
is refused or dropped (no endpoints) appear with no backends, from the filter chain.

`read_kernel_view` is the cheap parse a full sync needs at 10,000 services: it keeps the
names of every chain but the rules only of chains not named `NETAGENT-` (built-in and other
tools' chains, where jumps into ours may sit), so it never tokenises the 100,000 rules the
sync is about to replace anyway. Chains under our prefix that are not this backend's
(masquerade.py's) never jump into service chains, so skipping their rules loses nothing.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from netagent.kernel.iptables.restore_format import Chain, Table, jump_target, parse_save
from netagent.kernel.iptables.runner import OWNED_PREFIX
from proxy.backend import ProgrammedService
from proxy.iptables.names import FILTER_CHAIN, NODEPORTS_CHAIN, SERVICES_CHAIN, ChainKind, chain_kind
from proxy.model import EntryKind

ANY_LOCAL_ADDRESS = "*"


def read_kernel_view(save_text: str) -> dict[str, Table]:
    """Tables with every chain, and the rules of every chain this backend does not own."""
    return parse_save(save_text, skip_rules_of=OWNED_PREFIX)


# ---- status -----------------------------------------------------------------------------------

def programmed_services(tables: Mapping[str, Table]) -> list[ProgrammedService]:
    found: list[ProgrammedService] = []
    nat = tables.get("nat")
    if nat is not None and SERVICES_CHAIN in nat.chains:
        nodeport_addresses = []
        for rule in nat.chains[SERVICES_CHAIN].rules:
            target = jump_target(rule)
            if target == NODEPORTS_CHAIN:
                nodeport_addresses.append(_destination(rule))
                continue
            label = _label(rule)
            if label is None:
                continue
            found.append(ProgrammedService(label[0], _address(rule, _destination(rule)), label[1].value,
                                           _backends(nat, target)))
        for rule in nat.chains.get(NODEPORTS_CHAIN, Chain(NODEPORTS_CHAIN, "-")).rules:
            label = _label(rule)
            if label is None:
                continue
            backends = _backends(nat, jump_target(rule))
            found.extend(ProgrammedService(label[0], _address(rule, address), label[1].value, backends)
                         for address in nodeport_addresses)
    listed = {(service.name, service.address) for service in found}
    filter_table = tables.get("filter")
    if filter_table is not None and FILTER_CHAIN in filter_table.chains:
        for rule in filter_table.chains[FILTER_CHAIN].rules:
            label = _label(rule)
            if label is None:
                continue
            address = _address(rule, _destination(rule))
            if (label[0], address) not in listed:
                listed.add((label[0], address))
                found.append(ProgrammedService(label[0], address, label[1].value, ()))
    return sorted(found, key=lambda service: (service.name, service.kind, service.address))


def _value(rule: Sequence[str], option: str) -> str | None:
    for index, token in enumerate(rule[:-1]):
        if token == option:
            return rule[index + 1]
    return None


def _label(rule: Sequence[str]) -> tuple[str, EntryKind] | None:
    comment = _value(rule, "--comment")
    if comment is None or " " not in comment:
        return None
    name, _, kind = comment.rpartition(" ")
    try:
        return name, EntryKind(kind)
    except ValueError:
        return None


def _destination(rule: Sequence[str]) -> str:
    """The rule's destination address; ANY_LOCAL_ADDRESS for "any local address" rules."""
    for index, token in enumerate(rule[:-1]):
        if token == "-d" and (index == 0 or rule[index - 1] != "!"):
            return rule[index + 1].removesuffix("/32").removesuffix("/128")
    return ANY_LOCAL_ADDRESS


def _address(rule: Sequence[str], host: str) -> str:
    protocol = (_value(rule, "-p") or "?").upper()
    host = f"[{host}]" if ":" in host else host   # an IPv6 address, as DNAT spells it
    return f"{host}:{_value(rule, '--dport')}/{protocol}"


def _backends(nat: Table, chain: str | None, depth: int = 0) -> tuple[str, ...]:
    if chain is None or chain not in nat.chains or depth > 4:
        return ()
    kind = chain_kind(chain)
    rules = nat.chains[chain].rules
    if kind in (ChainKind.SERVICE, ChainKind.SECOND, ChainKind.ENDPOINT):
        found: dict[str, None] = {}
        for rule in rules:
            target = jump_target(rule)
            if target == "DNAT":
                found[_value(rule, "--to-destination") or "?"] = None
            elif chain_kind(target or "") is ChainKind.ENDPOINT and "--rcheck" not in rule:
                found.update(dict.fromkeys(_backends(nat, target, depth + 1)))
        return tuple(found)
    if kind is ChainKind.EXTERNAL:
        for rule in reversed(rules):
            target = jump_target(rule)
            if (chain_kind(target or "") in (ChainKind.SERVICE, ChainKind.SECOND)
                    and "-s" not in rule and "--src-type" not in rule):
                return _backends(nat, target, depth + 1)
        return ()
    if kind is ChainKind.FIREWALL:
        for rule in rules:
            if chain_kind(jump_target(rule) or "") is ChainKind.EXTERNAL:
                return _backends(nat, jump_target(rule), depth + 1)
    return ()
