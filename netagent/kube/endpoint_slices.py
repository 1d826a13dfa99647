"""How to read an EndpointSlice's endpoints: one reading for the proxy and the lab's views.

The discovery.k8s.io/v1 API leaves conditions unset when unknown, and gives each unset one
a meaning that consumers must apply alike: `ready` unset is ready, `serving` unset follows
`ready`, `terminating` unset is not terminating. Reading them in one place keeps the proxy
(which programs endpoints) and `netagent lab services` (which shows them) in agreement.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # the Service a slice belongs to


@dataclass(frozen=True)
class EndpointConditions:
    ready: bool
    serving: bool
    terminating: bool


def endpoint_conditions(endpoint: Mapping) -> EndpointConditions:
    """An endpoint's conditions with the API's meaning of unset ones applied."""
    conditions = endpoint.get("conditions") or {}
    ready = conditions.get("ready")
    ready = True if ready is None else bool(ready)
    serving = conditions.get("serving")
    return EndpointConditions(ready=ready, serving=ready if serving is None else bool(serving),
                              terminating=bool(conditions.get("terminating")))
