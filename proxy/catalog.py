"""The service catalog: recorded Service and EndpointSlice changes in, `ProxyState` snapshots out.

The watch side is `netagent.kube.changes.ChangeRecorder` (record only, on the watch thread);
`ServiceCatalog` lives on the sync thread. `apply(service_changes, slice_changes)` parses only
what changed, keeps the parsed Services and EndpointSlices, recomputes endpoints only for the
services touched, and answers the new `ProxyState`, the service ports that changed, and the
EndpointSlice trigger times the sync is about to honour (for
`network_programming_duration_seconds`). At 10,000 services a one-endpoint change costs one
slice parse and one merge, not a rebuild.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from netagent.kube.changes import Change
from proxy.kube_objects import ParsedSlice, merge_endpoints, parse_endpoint_slice, parse_service
from proxy.model import Endpoint, NodeContext, ProxyState, ServicePort, ServicePortName

log = logging.getLogger("netagent.proxy.catalog")


@dataclass(frozen=True)
class CatalogUpdate:
    state: ProxyState
    changed: frozenset[ServicePortName]
    trigger_times: tuple[float, ...]  # of the slices whose changes this state includes


def _service_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


class ServiceCatalog:
    """Parsed Services and EndpointSlices, and the `ProxyState` they add up to (sync thread only)."""

    def __init__(self, node: NodeContext) -> None:
        self._node = node
        self._ports_by_service: dict[str, dict[ServicePortName, ServicePort]] = {}
        self._slices_by_service: dict[str, dict[str, ParsedSlice]] = {}
        self._slice_owner: dict[str, str] = {}   # slice key -> service key it was filed under
        self._services: dict[ServicePortName, ServicePort] = {}
        self._names_by_service: dict[str, set[ServicePortName]] = {}
        self._endpoints: dict[ServicePortName, tuple[Endpoint, ...]] = {}
        self.problems: dict[str, tuple[str, ...]] = {}  # service key -> why parts are not programmed

    @property
    def node(self) -> NodeContext:
        return self._node

    def set_node(self, node: NodeContext) -> bool:
        """Replace the node context; True when it differs (every service must then be re-rendered)."""
        changed = node != self._node
        self._node = node
        return changed

    def state(self) -> ProxyState:
        return ProxyState(node=self._node, services=self._services, endpoints=self._endpoints)

    def apply(self, service_changes: Mapping[str, Change], slice_changes: Mapping[str, Change]) -> CatalogUpdate:
        touched: set[str] = set()
        for key, (_, current) in service_changes.items():
            touched.add(key)
            self._set_service(key, current)
        trigger_times = []
        for key, (_, current) in slice_changes.items():
            owner = self._set_slice(key, current)
            touched.update(owner)
            if current is not None:
                parsed = self._slices_by_service.get(self._slice_owner.get(key, ""), {}).get(key)
                if parsed is not None and parsed.trigger_time is not None:
                    trigger_times.append(parsed.trigger_time)
        changed: set[ServicePortName] = set()
        for service_key in touched:
            changed.update(self._refresh(service_key))
        return CatalogUpdate(state=self.state(), changed=frozenset(changed), trigger_times=tuple(trigger_times))

    # -- services --------------------------------------------------------------------------------
    def _set_service(self, key: str, current: dict | None) -> None:
        if current is None:
            self._ports_by_service.pop(key, None)
            self.problems.pop(key, None)
            return
        parsed = parse_service(current)
        self._ports_by_service[key] = parsed.ports
        if parsed.problems:
            if self.problems.get(key) != parsed.problems:
                log.info("service %s: %s", key, "; ".join(parsed.problems))
            self.problems[key] = parsed.problems
        else:
            self.problems.pop(key, None)

    # -- slices ----------------------------------------------------------------------------------
    def _set_slice(self, key: str, current: dict | None) -> set[str]:
        """File the slice under its service; answers the service keys whose endpoints may change."""
        touched = set()
        previous_owner = self._slice_owner.pop(key, None)
        if previous_owner is not None:
            self._slices_by_service.get(previous_owner, {}).pop(key, None)
            if not self._slices_by_service.get(previous_owner):
                self._slices_by_service.pop(previous_owner, None)
            touched.add(previous_owner)
        parsed = parse_endpoint_slice(current) if current is not None else None
        if parsed is not None:
            owner = _service_key(parsed.namespace, parsed.service)
            self._slices_by_service.setdefault(owner, {})[key] = parsed
            self._slice_owner[key] = owner
            touched.add(owner)
            if parsed.problems:
                log.info("endpoint slice %s: %s", key, "; ".join(parsed.problems))
        return touched

    # -- the merged view -------------------------------------------------------------------------
    def _refresh(self, service_key: str) -> set[ServicePortName]:
        """Recompute one service's ports and endpoints; answers the service ports that changed."""
        old_names = self._names_by_service.pop(service_key, set())
        ports = self._ports_by_service.get(service_key, {})
        slices = [self._slices_by_service.get(service_key, {})[k]
                  for k in sorted(self._slices_by_service.get(service_key, {}))]
        changed = set()
        for name in old_names - set(ports):
            del self._services[name]
            self._endpoints.pop(name, None)
            changed.add(name)
        for name, port in ports.items():
            endpoints = merge_endpoints(port, slices)
            if self._services.get(name) != port or self._endpoints.get(name, ()) != endpoints:
                changed.add(name)
            self._services[name] = port
            if endpoints:
                self._endpoints[name] = endpoints
            else:
                self._endpoints.pop(name, None)
        if ports:
            self._names_by_service[service_key] = set(ports)
        return changed
