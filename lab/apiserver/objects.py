"""How stored objects are shaped, shared by the store, the watches and the HTTP layer.

The store keeps objects without `kind`/`apiVersion` (the resource says both) and never
mutates one: every write builds new dicts, so lists, snapshots and watch events share them
without copies. `typed` puts kind and apiVersion back on the way out, `bare` takes them off
on the way in, and `clone` is the deep copy handed to in-process callers. `Subresource` and
`STATUS_SUBRESOURCE` say which half of an object a write may change: the resources listed
there have a `/status` subresource, as in the real server, and writes to the main resource
leave their `status` alone (writes to `/status` leave the spec alone and apply the metadata).
"""
from __future__ import annotations

import enum
import json
from typing import Any

from lab.apiserver.kinds import SERVED
from netagent.kube.resources import Resource

# Resources whose writes to the main resource leave `status` alone (and `/status` the spec).
STATUS_SUBRESOURCE = frozenset(kind.resource for kind in SERVED if kind.status)


class Subresource(enum.Enum):
    MAIN = ""
    STATUS = "status"


def typed(resource: Resource, obj: dict) -> dict:
    return {"kind": resource.kind, "apiVersion": resource.api_version, **obj}


def bare(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def clone(value: Any) -> Any:
    """A deep copy of JSON data (several times faster than copy.deepcopy)."""
    return json.loads(json.dumps(value))
