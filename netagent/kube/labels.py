"""Label syntax, as the API server validates it: the one check of a label key and value.

The agent re-checks what it keys kernel state by. A selector's text names a policy's sets
(`LabelSelector.describe`), and that text is only one-to-one while keys and values keep the
API's syntax: a value like `b,c=d` would make `{a: "b,c=d"}` and `{a: b, c: d}` one set, the
members of one policy's peers allowed by another's. A key is an optional DNS subdomain
prefix (at most 253 characters) and `/`, then a name of at most 63; a value is empty or such
a name.
"""
from __future__ import annotations

import re
from typing import TypeGuard

NAME_MAX, PREFIX_MAX = 63, 253
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?\Z")


def valid_key(key: object) -> TypeGuard[str]:
    if not isinstance(key, str):
        return False
    prefix, slash, name = key.rpartition("/")
    if slash and not (0 < len(prefix) <= PREFIX_MAX and _SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= NAME_MAX and bool(_NAME.match(name))


def valid_value(value: object) -> TypeGuard[str]:
    return isinstance(value, str) and (value == "" or (len(value) <= NAME_MAX and bool(_NAME.match(value))))
