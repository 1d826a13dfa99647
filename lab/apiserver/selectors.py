"""Label and field selectors, parsed as the real server parses them, and the list/watch filter.

`LabelSelector` understands =, ==, !=, in, notin, exists, !key, > and <; `FieldSelector`
only the field labels the real server supports for the resource (metadata.name and
metadata.namespace everywhere, pods also spec.nodeName and status.phase); anything else is
400 BadRequest, as there. `Filter` joins both with the namespace scope of the request: it is
what a list, a watch and a deletecollection select with. Pure functions of their text, so
the HTTP layer parses once and the store and the watch streams only call `matches`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from lab.apiserver.errors import bad_request
from lab.apiserver.kinds import kind_of
from netagent.kube.resources import Resource

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_SET_REQUIREMENT = re.compile(rf"^({_KEY})\s+(in|notin)\s*\(([^()]*)\)$")
_EQUALITY_REQUIREMENT = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*({_VALUE})$")
_ORDER_REQUIREMENT = re.compile(rf"^({_KEY})\s*(>|<)\s*(-?\d+)$")
_NOT_EXISTS_REQUIREMENT = re.compile(rf"^!\s*({_KEY})$")
_EXISTS_REQUIREMENT = re.compile(rf"^({_KEY})$")
# field labels that are not the object's path
_FIELD_PATHS: dict[tuple[str, ...], tuple[str, ...]] = {("source",): ("source", "component")}
_FIELD_REQUIREMENT = re.compile(r"^([A-Za-z][A-Za-z.]*)\s*(==|=|!=)\s*(.*)$")


def integer(text: str | None) -> int | None:
    """`text` as an int, or None when it is missing or not a whole number."""
    if text is None:
        return None
    try:
        return int(text)
    except (TypeError, ValueError):  # a label value read from stored JSON may be anything
        return None


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside `in (...)` value sets."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    parts.append("".join(current).strip())
    return parts


class LabelSelector:
    """A parsed `labelSelector`; requirements are (key, operator, values)."""

    def __init__(self, requirements: list[tuple[str, str, tuple[str, ...]]]) -> None:
        self.requirements = requirements

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        if not text or not text.strip():
            return cls([])
        requirements = []
        for part in _split_top_level(text):
            requirements.append(cls._parse_requirement(part))
        return cls(requirements)

    @staticmethod
    def _parse_requirement(part: str) -> tuple[str, str, tuple[str, ...]]:
        if match := _SET_REQUIREMENT.match(part):
            values = tuple(v.strip() for v in match.group(3).split(",") if v.strip())
            if not values or not all(re.fullmatch(_VALUE, v) for v in values):
                raise bad_request(f"unable to parse requirement {part!r}: bad value set")
            return match.group(1), match.group(2), values
        if match := _EQUALITY_REQUIREMENT.match(part):
            operator = "!=" if match.group(2) == "!=" else "="
            return match.group(1), operator, (match.group(3),)
        if match := _ORDER_REQUIREMENT.match(part):
            return match.group(1), match.group(2), (match.group(3),)
        if match := _NOT_EXISTS_REQUIREMENT.match(part):
            return match.group(1), "!", ()
        if match := _EXISTS_REQUIREMENT.match(part):
            return match.group(1), "exists", ()
        raise bad_request(f"unable to parse requirement {part!r} in the label selector")

    def matches(self, labels: dict | None) -> bool:
        labels = labels or {}
        for key, operator, values in self.requirements:
            present = key in labels
            value = labels.get(key)
            if operator == "=":
                ok = present and value == values[0]
            elif operator == "!=":
                ok = not present or value != values[0]
            elif operator == "in":
                ok = present and value in values
            elif operator == "notin":
                ok = not present or value not in values
            elif operator == "exists":
                ok = present
            elif operator == "!":
                ok = not present
            else:
                number = integer(value)
                ok = present and number is not None and (
                    number > int(values[0]) if operator == ">" else number < int(values[0])
                )
            if not ok:
                return False
        return True


class FieldSelector:
    """A parsed `fieldSelector`; requirements are (path, equal?, value)."""

    def __init__(self, requirements: list[tuple[tuple[str, ...], str, str]]) -> None:
        self.requirements = requirements

    @classmethod
    def parse(cls, text: str | None, *, resource: Resource) -> FieldSelector:
        if not text or not text.strip():
            return cls([])
        supported = ("metadata.name", "metadata.namespace") + kind_of(resource).field_labels
        requirements = []
        for part in text.split(","):
            match = _FIELD_REQUIREMENT.match(part.strip())
            if not match:
                raise bad_request(f"invalid field selector requirement {part!r}")
            label, operator, value = match.groups()
            if label not in supported:
                raise bad_request(f'field label not supported for {resource.plural}: "{label}"')
            requirements.append((tuple(label.split(".")), "!=" if operator == "!=" else "=", value))
        return cls(requirements)

    def matches(self, obj: dict) -> bool:
        for path, operator, value in self.requirements:
            node: object = obj
            for step in _FIELD_PATHS.get(path, path):
                node = node.get(step) if isinstance(node, dict) else None
            actual = "" if node is None else str(node).lower() if isinstance(node, bool) else str(node)
            if (actual == value) != (operator == "="):
                return False
        return True


@dataclass(frozen=True)
class Filter:
    """Which objects a list or watch sees: namespace scope plus both selectors."""

    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector

    @property
    def selects_all(self) -> bool:
        return self.namespace is None and not self.labels.requirements and not self.fields.requirements

    def matches(self, obj: dict) -> bool:
        metadata = obj["metadata"]
        if self.namespace is not None and metadata.get("namespace") != self.namespace:
            return False
        return self.labels.matches(metadata.get("labels")) and self.fields.matches(obj)
