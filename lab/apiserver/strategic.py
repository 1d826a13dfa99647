"""Strategic merge patch: how the real server applies `application/strategic-merge-patch+json`.

Like a merge patch (objects merge, null deletes), except that lists merge where the type says
so (`patch_meta.py`: lists of objects by their merge key, lists of scalars as sets; other
lists are replaced), and the directives kubectl sends are obeyed, never stored:

- `$patch: replace` in an object replaces the original object; as a list item, the list
  becomes the patch's other items; `$patch: delete` in an object deletes it (as a list item:
  the original item with the same merge key; `$patch: merge` is the default);
- `$setElementOrder/FIELD`: the order of the merged list (`apply` sends it with every list it
  touches); items the server has that the order does not name keep their relative order after;
- `$retainKeys`: the merged object keeps only the listed keys (volumes' `merge,retainKeys`);
- `$deleteFromPrimitiveList/FIELD`: values removed from a list of scalars.

A pure function of (kind, original, patch), applied by the store to a copy of the stored
object; a malformed directive is 400 BadRequest as on the real server.
"""
from __future__ import annotations

from lab.apiserver.errors import bad_request
from lab.apiserver.objects import clone
from lab.apiserver.patch_meta import PatchStrategy, strategy_for

_ORDER = "$setElementOrder/"
_DELETE_FROM = "$deleteFromPrimitiveList/"
_DIRECTIVES = ("$patch", "$retainKeys")


def strategic_merge_patch(kind: str, original: dict, patch: object) -> dict:
    if not isinstance(patch, dict):
        raise bad_request("a strategic merge patch must be a JSON object")
    merged = _merge_map(kind, (), original, patch)
    if merged is None:
        raise bad_request("a strategic merge patch cannot delete the whole object")
    return merged


def _merge_map(kind: str, path: tuple[str, ...], original: object, patch: dict) -> dict | None:
    directive = patch.get("$patch", "merge")
    if directive == "delete":
        return None
    plain = {k: v for k, v in patch.items() if k not in _DIRECTIVES and not k.startswith((_ORDER, _DELETE_FROM))}
    if directive == "replace":
        return {k: _strip(kind, (*path, k), v) for k, v in plain.items()}
    if directive != "merge":
        raise bad_request(f"unknown $patch directive {directive!r} at {'.'.join(path) or 'the object'}")
    result = dict(original) if isinstance(original, dict) else {}
    for key, value in plain.items():
        child = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(kind, child, result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(kind, child, result.get(key), value)
        else:
            result[key] = clone(value)
    for key, values in patch.items():
        if key.startswith(_DELETE_FROM) and isinstance(values, list):
            field = key[len(_DELETE_FROM):]
            result[field] = [v for v in result.get(field) or [] if v not in values]
        elif key.startswith(_ORDER):
            field = key[len(_ORDER):]
            if not isinstance(values, list):
                raise bad_request(f"{key} must be a list")
            if isinstance(result.get(field), list):
                result[field] = _ordered(strategy_for(kind, (*path, field)), result[field], values)
    retain = patch.get("$retainKeys")
    if retain is not None:
        if not isinstance(retain, list):
            raise bad_request("$retainKeys must be a list of field names")
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _strip(kind: str, path: tuple[str, ...], value: object) -> object:
    """A replacing value with its (meaningless) nested directives removed."""
    if isinstance(value, dict):
        return {k: _strip(kind, (*path, k), v) for k, v in value.items()
                if k not in _DIRECTIVES and not k.startswith((_ORDER, _DELETE_FROM))}
    if isinstance(value, list):
        return [_strip(kind, path, v) for v in value]
    return clone(value)


def _merge_list(kind: str, path: tuple[str, ...], original: object, patch: list) -> list:
    strategy = strategy_for(kind, path)
    replace = any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch)
    items = [item for item in patch if not (isinstance(item, dict) and item.get("$patch") == "replace")]
    if strategy is None or replace or not isinstance(original, list):
        return [_strip(kind, path, item) if not isinstance(item, dict) else _merge_map(kind, path, {}, item) or {}
                for item in items if not (isinstance(item, dict) and item.get("$patch") == "delete")]
    if not strategy.key:  # a set of scalars
        return original + [item for item in items if item not in original]
    result = list(original)
    for item in items:
        if not isinstance(item, dict) or strategy.key not in item:
            raise bad_request(f"{'.'.join(path)}: every item needs its merge key {strategy.key!r}")
        index = next((i for i, old in enumerate(result) if isinstance(old, dict)
                      and old.get(strategy.key) == item[strategy.key]), None)
        merged = _merge_map(kind, path, result[index] if index is not None else {}, item)
        if index is None:
            if merged is not None:
                result.append(merged)
        elif merged is None:
            del result[index]
        else:
            result[index] = merged
    return result


def _ordered(strategy: PatchStrategy | None, items: list, order: list) -> list:
    """`items` in the order `$setElementOrder` gives; the others after, as they were."""
    def identity(item: object) -> object:
        if strategy is not None and strategy.key and isinstance(item, dict):
            return item.get(strategy.key)
        return item

    wanted = [identity(o) for o in order]
    named = sorted((item for item in items if identity(item) in wanted), key=lambda item: wanted.index(identity(item)))
    return named + [item for item in items if identity(item) not in wanted]
