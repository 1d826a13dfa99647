"""Reading `Nft.list_table` answers: the parts consumers compare with what they rendered.

Pure helpers over the libnftables JSON objects (real or `FakeNft`'s), so every consumer reads
them one way: chains by name, rules of a chain in order, sets and maps by name, and a set's
or map's elements as (key, value) pairs with the `{"elem": {"val": ...}}` wrapper (elements
with a timeout, an expiry or a comment) taken off. Element order is the kernel's hash order:
compare elements as sets or dicts, never as lists. `element_text` spells one element, key
or map value back as the text nft and our renderers write (the policy's and the proxy's
readback both compare in that spelling).
"""
from __future__ import annotations

import json
from typing import Any


def chains(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Chain name -> its JSON body (`type`, `hook`, `prio`, `policy` for base chains)."""
    return {entry["chain"]["name"]: entry["chain"] for entry in objects if "chain" in entry}


def rules(objects: list[dict[str, Any]], chain: str) -> list[dict[str, Any]]:
    """The rules of `chain` in order (each with `handle`, optionally `comment`)."""
    return [entry["rule"] for entry in objects if "rule" in entry and entry["rule"]["chain"] == chain]


def rules_by_chain(objects: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Every chain's rules in order, in one pass (`rules` of each chain of a large table would
    read the listing once per chain)."""
    found: dict[str, list[dict[str, Any]]] = {}
    for entry in objects:
        if "rule" in entry:
            found.setdefault(entry["rule"]["chain"], []).append(entry["rule"])
    return found


def sets(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Set and map name -> its JSON body (a map's has `map`, the data type)."""
    found = {}
    for entry in objects:
        body = entry.get("set") or entry.get("map")
        if body is not None:
            found[body["name"]] = body
    return found


def unwrap(element: Any) -> Any:
    """An element's key without the `{"elem": {"val": ...}}` wrapper."""
    if isinstance(element, dict) and "elem" in element:
        return element["elem"]["val"]
    return element


def element_text(value: Any) -> str:
    """One element, key, key part or map value as text: an address, `a/len`, `a-b`,
    `a . tcp . 80`, `goto IP-C-3`, `drop`; a wrapped element (`{"elem": {"val": ...}}`) as its key."""
    if isinstance(value, dict):
        if "elem" in value:
            return element_text(value["elem"].get("val"))
        if "prefix" in value:
            return f"{value['prefix']['addr']}/{value['prefix']['len']}"
        if "range" in value:
            low, high = value["range"]
            return f"{element_text(low)}-{element_text(high)}"
        if "concat" in value:
            return " . ".join(element_text(item) for item in value["concat"])
        for verdict in ("goto", "jump"):
            if verdict in value:
                return f"{verdict} {value[verdict]['target']}"
        if len(value) == 1:
            (word,) = value
            return str(word)   # {"drop": null}, {"accept": null}
    return str(value)


def comment(element: Any) -> str | None:
    """An element's comment (its `{"elem": {"val": ..., "comment": ...}}` wrapper), or None."""
    if isinstance(element, dict) and "elem" in element:
        found = element["elem"].get("comment")
        return None if found is None else str(found)
    return None


def commented_elements(body: dict[str, Any]) -> list[tuple[Any, Any, str | None]]:
    """(key, value, comment) of every element of a set (value None) or map body."""
    found = []
    for element in body.get("elem", []):
        if "map" in body:
            found.append((unwrap(element[0]), element[1], comment(element[0])))
        else:
            found.append((unwrap(element), None, comment(element)))
    return found


def elements(body: dict[str, Any]) -> list[tuple[Any, Any]]:
    """(key, value) of every element of a set (value None) or map body."""
    found = []
    for element in body.get("elem", []):
        if "map" in body:
            found.append((unwrap(element[0]), element[1]))
        else:
            found.append((unwrap(element), None))
    return found


def element_dict(body: dict[str, Any]) -> dict[str, Any]:
    """A map's (or set's) elements keyed by the canonical JSON text of the key."""
    return {key_text(key): value for key, value in elements(body)}


def key_text(key: Any) -> str:
    """One canonical string for a JSON key (for comparing and hashing)."""
    return json.dumps(key, sort_keys=True, separators=(",", ":"))
