"""`netagent status services` for the nftables proxy: the entry points its table holds, read back.

From the table as `tables.read_table` reads it (`model.Table`): each element of `SERVICE-IPS`
and `SERVICE-NODEPORTS` is an entry point, its label the comment of the element of
`SERVICE-*-NAMES` under the same key; the verdict names the balancing chain (`IP-C-3`: slots
0-2 of `ENDPOINTS-<proto>` under the entry point's address and port), a `LOCAL-*` chain (the
entry point looked up again in `LOCAL-*-INSIDE` and `-OUTSIDE`), or an affinity chain, whose
rules' purposes name their endpoints (render.py's `AFFINITY_PURPOSE`).
"""
from __future__ import annotations

from netagent.kernel.families import IpFamily
from netagent.kernel.nftables.model import Element, Table, purpose_of
from proxy.backend import ProgrammedService
from proxy.nftables import names as N
from proxy.nftables.render import AFFINITY_PURPOSE, Key
from proxy.nftables.spelling import spelling

ANY_LOCAL_ADDRESS = "*"
_Held = dict[str, dict[Key, Element]]


def programmed_services(table: Table, family: IpFamily = IpFamily.V4) -> list[ProgrammedService]:
    spell = spelling(family)
    held: _Held = {entry.name: {element.key: element for element in entry.elements} for entry in table.sets
                   if entry.name in N.ELEMENT_HOLDERS}
    found: list[ProgrammedService] = []
    for holder, names, space, arity in ((N.SERVICE_IPS, N.IP_NAMES, N.KeySpace.ADDRESS, 3),
                                        (N.SERVICE_NODEPORTS, N.NODEPORT_NAMES, N.KeySpace.NODEPORT, 2)):
        labels = held.get(names, {})
        for key, element in sorted(held.get(holder, {}).items()):
            if len(key) != arity:
                continue   # not an entry point this version writes
            named = labels.get(key)
            label, _, kind = ((named.comment if named else None) or "").rpartition(" ")
            if space is N.KeySpace.ADDRESS:
                address, proto, port = key
                shown = f"{spell.host_port(address, port)}/{proto.upper()}"
            else:
                proto, port = key
                shown = f"{ANY_LOCAL_ADDRESS}:{port}/{proto.upper()}"
            found.append(ProgrammedService(label or "?", shown, kind or "?",
                                           tuple(_backends(table, held, space, key, element.value or "", family))))
    return found


def _backends(table: Table, held: _Held, space: N.KeySpace, key: Key, verdict: str, family: IpFamily) -> list[str]:
    spell = spelling(family)
    target = verdict.split()[-1] if verdict else ""   # `goto IP-C-3`, `goto REJECT-NEW`, `drop`
    if target in (N.LOCAL_IP, N.LOCAL_NODEPORT):
        inside = N.LOCAL_IPS_INSIDE if space is N.KeySpace.ADDRESS else N.LOCAL_NODEPORTS_INSIDE
        outside = N.LOCAL_IPS_OUTSIDE if space is N.KeySpace.ADDRESS else N.LOCAL_NODEPORTS_OUTSIDE
        seen: dict[str, None] = {}
        for holder in (inside, outside):
            found = held.get(holder, {}).get(key)
            if found is not None and found.value:
                seen.update(dict.fromkeys(_backends(table, held, space, key, found.value, family)))
        return list(seen)
    counted = N.COUNT_CHAIN.fullmatch(target)
    if counted is not None:
        proto = key[-2]
        slots = held.get(N.endpoint_map(N.KeySpace(counted.group(1)), N.Role(counted.group(2)), proto), {})
        prefix = (key[0], key[2]) if space is N.KeySpace.ADDRESS else (key[1],)
        out = []
        for slot in range(int(counted.group(3))):
            found = slots.get((*prefix, str(slot)))
            if found is not None and found.value:
                ip, _, port = found.value.rpartition(" . ")   # the map's value as listed: `10.244.1.5 . 8080`
                out.append(spell.host_port(ip, port))
        return out
    chain = table.chain(target) if target.startswith("AFF-") else None
    if chain is not None:
        purposes = (purpose_of(rule.comment) for rule in chain.rules if rule.comment)
        return [purpose.removeprefix(AFFINITY_PURPOSE) for purpose in purposes if purpose.startswith(AFFINITY_PURPOSE)]
    return []   # reject or drop: no endpoints for this traffic
