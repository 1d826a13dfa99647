"""PATCH bodies: JSON merge patch (RFC 7386) and JSON patch (RFC 6902, all six operations).

Both are pure functions from (object, patch) to a new object: the store applies them to a
typed copy of the stored object and then validates the result like any other update, so a
patch can do nothing a PUT could not. Strategic merge patch is `strategic.py`'s. A malformed
patch is 400; one that does not fit the document (a missing path, a failed `test`) is 422
Invalid, as the real server answers.
"""
from __future__ import annotations

import re

from lab.apiserver.errors import ApiError, bad_request
from lab.apiserver.objects import clone


def merge_patch(target: object, patch: object) -> object:
    """RFC 7386: objects merge recursively, null deletes, everything else replaces."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: object) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise bad_request(f"invalid JSON pointer {path!r}")
    if path == "":
        return []
    return [token.replace("~1", "/").replace("~0", "~") for token in path[1:].split("/")]


def _list_index(token: str, length: int, *, allow_end: bool) -> int:
    if token == "-" and allow_end:
        return length
    if not re.fullmatch(r"0|[1-9][0-9]*", token) or int(token) > length or (int(token) == length and not allow_end):
        raise ApiError(422, "Invalid", f"JSON patch: list index {token!r} out of range")
    return int(token)


def _resolve(document: object, tokens: list[str]) -> object:
    node = document
    for token in tokens:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list):
            node = node[_list_index(token, len(node), allow_end=False)]
        else:
            raise ApiError(422, "Invalid", f"JSON patch: path /{'/'.join(tokens)} does not exist")
    return node


def _pointer_add(document: object, tokens: list[str], value: object) -> object:
    if not tokens:
        return value
    parent = _resolve(document, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        parent.insert(_list_index(last, len(parent), allow_end=True), value)
    else:
        raise ApiError(422, "Invalid", f"JSON patch: cannot add below a scalar at /{'/'.join(tokens)}")
    return document


def _pointer_remove(document: object, tokens: list[str]) -> object:
    if not tokens:
        raise ApiError(422, "Invalid", "JSON patch: cannot remove the whole document")
    parent = _resolve(document, tokens[:-1])
    last = tokens[-1]
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list):
        del parent[_list_index(last, len(parent), allow_end=False)]
    else:
        raise ApiError(422, "Invalid", f"JSON patch: path /{'/'.join(tokens)} does not exist")
    return document


def json_patch(target: object, operations: object) -> object:
    """RFC 6902: add, remove, replace, move, copy and test, applied in order to a copy."""
    if not isinstance(operations, list):
        raise bad_request("a JSON patch is a list of operations")
    document = clone(target)
    for operation in operations:
        if not isinstance(operation, dict):
            raise bad_request("a JSON patch operation is an object")
        kind = operation.get("op")
        tokens = _pointer(operation.get("path"))
        if kind in ("add", "replace", "test") and "value" not in operation:
            raise bad_request(f"JSON patch {kind} needs a value")
        if kind == "add":
            document = _pointer_add(document, tokens, clone(operation["value"]))
        elif kind == "remove":
            document = _pointer_remove(document, tokens)
        elif kind == "replace":
            if tokens:
                _resolve(document, tokens)
                document = _pointer_remove(document, tokens)
            document = _pointer_add(document, tokens, clone(operation["value"]))
        elif kind in ("move", "copy"):
            source = _pointer(operation.get("from"))
            value = clone(_resolve(document, source))
            if kind == "move":
                document = _pointer_remove(document, source)
            document = _pointer_add(document, tokens, value)
        elif kind == "test":
            if _resolve(document, tokens) != operation["value"]:
                raise ApiError(422, "Invalid", f"JSON patch: test failed at {operation.get('path')}")
        else:
            raise bad_request(f"unknown JSON patch operation {kind!r}")
    return document
