"""Reading the proxy's table back from libnftables JSON: for a full sync, and for status.

`read_table` turns `Nft.list_table`'s objects into a `TableView` in the very spelling
render.py writes (keys `10.96.0.10 . tcp . 80 . 0`, values `goto IP-C-3`, `10.244.1.5 . 8080`,
prefixes `192.168.0.0/16`, a /32 as the bare address: measured with nft 1.0.6), so a full
sync compares strings: element by element, and chain by chain through the digest comment each
rule carries (render.rule). The elements of the affinity sets are the packet path's own
(clients seen) and are not read. `skeleton_ok` says whether the fixed maps, sets and hooked
chains are what this version declares; when not (an older layout, a hand edit), the backend
replaces the whole table in one transaction.

`programmed_services` answers `netagent status services` from the same view: each element of
`SERVICE-IPS` and `SERVICE-NODEPORTS` is an entry point, its
label is in `SERVICE-*-NAMES` under the same key; the verdict names the balancing chain (`IP-C-3`: 3 slots of ENDPOINTS under the same key) or the
affinity chains (`AFE-<hash>-<endpoint>` name their endpoint).
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from netagent.kernel.families import IpFamily
from netagent.kernel.nftables.listing import element_text
from proxy.backend import ProgrammedService
from proxy.nftables import names as N
from proxy.nftables.render import BASE_CHAINS, ElementValue
from proxy.nftables.spelling import spelling

ANY_LOCAL_ADDRESS = "*"
_GOTO = re.compile(r"goto (AFE-[A-Za-z0-9_-]+)")   # FakeNft keeps a rule as its text



@dataclass
class TableView:
    elements: dict[str, dict[str, ElementValue]] = field(default_factory=dict)
    chains: dict[str, tuple[str, ...]] = field(default_factory=dict)   # name -> rule digests
    hooks: dict[str, tuple[Any, Any, Any]] = field(default_factory=dict)   # base chain -> type, hook, prio
    holders: dict[str, tuple[Any, Any, tuple[str, ...]]] = field(default_factory=dict)
    sets: dict[str, str] = field(default_factory=dict)   # other sets -> declaration as render writes it
    chain_targets: dict[str, list[str]] = field(default_factory=dict)   # AFF chains -> the AFE chains they use

    def skeleton_ok(self, family: IpFamily = IpFamily.V4) -> bool:
        for holder, expected in spelling(family).expected_holders.items():
            if self.holders.get(holder) != expected:
                return False
        for chain, declaration in BASE_CHAINS.items():
            kind, _, hook, _, priority = declaration.split(";")[0].split()[1:6]
            if self.hooks.get(chain) != (kind, hook, int(priority)):
                return False
        return True


def _element(item: Any) -> tuple[str, str | None]:
    """(key, comment) of one listed element."""
    if isinstance(item, dict) and "elem" in item:
        inner = item["elem"]
        return element_text(inner.get("val")), inner.get("comment")
    return element_text(item), None


def read_table(objects: Iterable[dict[str, Any]]) -> TableView:
    view = TableView()
    for entry in objects:
        if "map" in entry or "set" in entry:
            body: dict[str, Any] = entry.get("map") or entry.get("set") or {}
            name = body["name"]
            if name in N.ELEMENT_HOLDERS:
                view.holders[name] = (body.get("type"), body.get("map"), tuple(body.get("flags", ())))
                held: dict[str, ElementValue] = {}
                for item in body.get("elem", ()):
                    if "map" in entry:
                        key, comment = _element(item[0])
                        held[key] = (element_text(item[1]), comment)
                    else:
                        key, comment = _element(item)
                        held[key] = (None, comment)
                view.elements[name] = held
            else:
                flags = set(body.get("flags", ()))
                view.sets[name] = (f"type {body.get('type')}; flags dynamic,timeout; timeout {body.get('timeout')}s; "
                                   f"size {body.get('size')}") if "timeout" in flags else f"other {body.get('type')}"
        elif "chain" in entry:
            body = entry["chain"]
            view.chains.setdefault(body["name"], ())
            if "hook" in body:
                view.hooks[body["name"]] = (body.get("type"), body.get("hook"), body.get("prio"))
        elif "rule" in entry:
            body = entry["rule"]
            chain = body["chain"]
            view.chains[chain] = (*view.chains.get(chain, ()), str(body.get("comment")))
            if chain.startswith("AFF-"):
                view.chain_targets.setdefault(chain, []).extend(_gotos(body.get("expr", ()))
                                                                + _GOTO.findall(str(body.get("text", ""))))
    return view


def _gotos(expressions: Any) -> list[str]:
    """Every chain a rule's expressions name in goto/jump verdicts (in anonymous vmaps too)."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("goto", "jump") and isinstance(value, dict) and "target" in value:
                    found.append(value["target"])
                else:
                    walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)
    walk(expressions)
    return found


# ---- status -----------------------------------------------------------------------------------

def programmed_services(view: TableView, family: IpFamily = IpFamily.V4) -> list[ProgrammedService]:
    spell = spelling(family)
    found: list[ProgrammedService] = []
    for holder, names, space in ((N.SERVICE_IPS, N.IP_NAMES, N.KeySpace.ADDRESS),
                                 (N.SERVICE_NODEPORTS, N.NODEPORT_NAMES, N.KeySpace.NODEPORT)):
        labels = view.elements.get(names, {})
        for key, (verdict, _) in sorted(view.elements.get(holder, {}).items()):
            label, _, kind = (labels.get(key, (None, None))[1] or "").rpartition(" ")
            fields = key.split(" . ")
            if space is N.KeySpace.ADDRESS:
                address = f"{spell.host_port(fields[0], fields[2])}/{fields[1].upper()}"
            else:
                address = f"{ANY_LOCAL_ADDRESS}:{fields[1]}/{fields[0].upper()}"
            found.append(ProgrammedService(label or "?", address, kind or "?",
                                           tuple(_backends(view, space, key, verdict or "", family))))
    return found


def _backends(view: TableView, space: N.KeySpace, key: str, verdict: str, family: IpFamily) -> list[str]:
    spell = spelling(family)
    target = verdict.split()[-1]
    if target in (N.LOCAL_IP, N.LOCAL_NODEPORT):
        inside = N.LOCAL_IPS_INSIDE if space is N.KeySpace.ADDRESS else N.LOCAL_NODEPORTS_INSIDE
        outside = N.LOCAL_IPS_OUTSIDE if space is N.KeySpace.ADDRESS else N.LOCAL_NODEPORTS_OUTSIDE
        seen: dict[str, None] = {}
        for holder in (inside, outside):
            value = view.elements.get(holder, {}).get(key)
            if value is not None and value[0]:
                seen.update(dict.fromkeys(_backends(view, space, key, value[0], family)))
        return list(seen)
    found = N.COUNT_CHAIN.fullmatch(target)
    if found is not None:
        fields = key.split(" . ")
        proto = fields[-2]
        holder = N.endpoint_map(N.KeySpace(found.group(1)), N.Role(found.group(2)), proto)
        slot_key = f"{fields[0]} . {fields[2]}" if space is N.KeySpace.ADDRESS else fields[1]
        held = view.elements.get(holder, {})
        out = []
        for slot in range(int(found.group(3))):
            value = held.get(f"{slot_key} . {slot}")
            if value is not None and value[0]:
                ip, port = value[0].split(" . ")
                out.append(spell.host_port(ip, port))
        return out
    if target.startswith("AFF-"):
        return [endpoint for endpoint in (N.endpoint_of_affinity_chain(chain)
                                          for chain in view.chain_targets.get(target, ())) if endpoint]
    return []   # reject or drop: no endpoints for this traffic
