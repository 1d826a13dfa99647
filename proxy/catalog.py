"""The service catalog: recorded Service and EndpointSlice changes in, `ProxyState` snapshots out.

The watch side is `netagent.kube.changes.ChangeRecorder` (record only, on the watch thread);
`ServiceCatalog` lives on the sync thread. `apply(service_changes, slice_changes)` parses only
what changed, keeps the parsed Services and EndpointSlices, recomputes endpoints only for the
services touched, and answers the new `ProxyState`, the service ports that changed, and the
EndpointSlice trigger times the sync is about to honour (for
`network_programming_duration_seconds`). At 10,000 services a one-endpoint change costs one
slice parse and one merge, not a rebuild.

Every object is untrusted: each is parsed alone inside a guard, and one that cannot be read
(`malformed`) or is above a limit (`too-large`, `proxy/limits.py`) is *rejected* through the
proxy's `RejectionScope` and programmed as if absent; no other object loses its change, and
`apply` itself never raises for an object's sake. A rejection is cleared (`accept`) when the
object is fixed, fits again or is deleted. One Service may cost at most
`endpoint_ports_per_service` of the node-wide budget of endpoint-ports, and the budget is
shared by `admission.py`: what is programmed stays programmed (an admitted Service whose update
does not fit keeps its last admitted version), per namespace, then by age. No rejection says
how much room is left. Each external and load-balancer IP is screened (`external_ips.py`): one
that would hijack (the API server's, this node's, inside the pod or Service network) is left out
and the Service rejected `forbidden-address` naming it, its other addresses programmed; every
Service is screened again when what the screen knows changes (the node's addresses, the
`default/kubernetes` EndpointSlices that name the API servers).

A good Service is not lost to a bad update (issue 29, item 11): an update that cannot be read,
names another Service or is above a per-object limit is rejected (reason, Event) while the ports
of its last good version (`_last_good`, same uid) stay programmed with the current endpoints, as
kube-proxy keeps its last good view; deleting the Service (or recreating it: a new uid) drops it.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from netagent.infra.rejections import ObjectRef, RejectionScope, standalone
from netagent.kernel.families import IpFamily
from netagent.kube.changes import Change
from proxy.admission import Admission
from proxy.external_ips import AddressGuard, log_unknown_service_range
from proxy.kube_objects import (
    MalformedObject,
    ParsedSlice,
    TooLarge,
    merge_endpoints,
    parse_endpoint_slice,
    parse_service,
)
from proxy.limits import DEFAULT_LIMITS, ProxyLimits
from proxy.model import Endpoint, NodeContext, ProxyState, ServicePort, ServicePortName

log = logging.getLogger("netagent.proxy.catalog")

SERVICE, SLICE = "Service", "EndpointSlice"
API_SERVICE = "default/kubernetes"   # its EndpointSlices name the API servers
BUDGET_FLAGS = "(--proxy-max-endpoint-ports, --proxy-max-endpoint-ports-per-namespace)"


@dataclass(frozen=True)
class CatalogUpdate:
    state: ProxyState
    changed: frozenset[ServicePortName]
    trigger_times: tuple[float, ...]  # of the slices whose changes this state includes


@dataclass(frozen=True)
class _Wanted:
    """One Service as it would be programmed, before the node-wide budget is applied."""
    ports: Mapping[ServicePortName, ServicePort]
    endpoints: Mapping[ServicePortName, tuple[Endpoint, ...]]
    created: str
    cost: int   # endpoint-ports (a port without endpoints counting one) plus each port's addresses


def _service_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def _ref(kind: str, obj: object, *, key: str) -> ObjectRef:
    """The object named by its recorder key (what `accept` clears later), with its uid for an Event."""
    namespace, _, name = key.rpartition("/")
    return ObjectRef(kind=kind, namespace=namespace, name=name, uid=ObjectRef.of(kind, obj, key=key).uid)


def _verdict(error: Exception) -> tuple[str, str]:
    if isinstance(error, TooLarge):
        return "too-large", str(error)
    if isinstance(error, MalformedObject):
        return "malformed", str(error)
    return "malformed", f"cannot be read: {type(error).__name__}: {error}"


class ServiceCatalog:
    """Parsed Services and EndpointSlices of one IP family (the node's), and the `ProxyState`
    they add up to (sync thread only). The other family's Services and slices are absent."""

    def __init__(self, node: NodeContext, *, family: IpFamily = IpFamily.V4, limits: ProxyLimits = DEFAULT_LIMITS,
                 rejections: RejectionScope | None = None, api_servers: Iterable[str] = ()) -> None:
        self.family = family
        self._node = self._of_family(node)
        self.limits = limits
        self.rejections = rejections if rejections is not None else standalone("proxy")
        self._ports_by_service: dict[str, dict[ServicePortName, ServicePort]] = {}
        self._created: dict[str, str] = {}
        self._slices_by_service: dict[str, dict[str, ParsedSlice]] = {}
        self._slice_owner: dict[str, str] = {}   # slice key -> service key it was filed under
        self._wanted: dict[str, _Wanted] = {}
        self._last_good: dict[str, tuple[str, dict[ServicePortName, ServicePort]]] = {}   # key -> (uid, ports)
        self._kept: set[str] = set()   # service keys rejected while their last good version is programmed
        self._admission: Admission[_Wanted] = Admission(limits.endpoint_ports, limits.endpoint_ports_per_namespace)
        self._services: dict[ServicePortName, ServicePort] = {}
        self._names_by_service: dict[str, set[ServicePortName]] = {}
        self._endpoints: dict[ServicePortName, tuple[Endpoint, ...]] = {}
        self.problems: dict[str, tuple[str, ...]] = {}  # service key -> why parts are not programmed
        self._refs: dict[tuple[str, str], ObjectRef] = {}
        self._parse_verdicts: dict[tuple[str, str], tuple[str, str]] = {}   # (kind, key) -> (reason, detail)
        self._size_verdicts: dict[str, tuple[str, str]] = {}                # service key -> (reason, detail)
        self._told: dict[tuple[str, str], tuple[str, str]] = {}              # what the scope holds now
        self._address_verdicts: dict[str, tuple[str, str]] = {}             # service key -> (reason, detail)
        self._api_servers = tuple(api_servers)   # the agent's own view: its client's host, the env
        self._guard = AddressGuard.of(limits.external_ips, self._node, self._api_servers)
        log_unknown_service_range(limits.external_ips, family)

    @property
    def node(self) -> NodeContext:
        return self._node

    def set_node(self, node: NodeContext) -> bool:
        """Replace the node context; True when it differs (every service must then be re-rendered)."""
        node = self._of_family(node)
        changed = node != self._node
        self._node = node
        return changed

    def _of_family(self, node: NodeContext) -> NodeContext:
        if node.family is not self.family:
            raise ValueError(f"an {node.family.label} node context for the {self.family.label} catalog")
        return node

    def state(self) -> ProxyState:
        return ProxyState(node=self._node, services=self._services, endpoints=self._endpoints)

    def rejected(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(kind, key) -> (reason, detail) of every object this catalog refuses now."""
        return dict(self._told)

    def apply(self, service_changes: Mapping[str, Change], slice_changes: Mapping[str, Change]) -> CatalogUpdate:
        touched: set[str] = set()
        for key, (_, current) in service_changes.items():
            touched.add(key)
            self._set_service(key, current)
        trigger_times = []
        for key, (_, current) in slice_changes.items():
            touched.update(self._set_slice(key, current))
            if current is not None:
                parsed = self._slices_by_service.get(self._slice_owner.get(key, ""), {}).get(key)
                if parsed is not None and parsed.trigger_time is not None:
                    trigger_times.append(parsed.trigger_time)
        guard = AddressGuard.of(self.limits.external_ips, self._node,
                                self._api_servers + self._api_endpoint_addresses())
        if guard != self._guard:   # what may be claimed changed: screen every Service again
            self._guard = guard
            touched.update(self._ports_by_service)
        for service_key in touched:
            self._want(service_key)
        changed: set[ServicePortName] = set()
        for service_key in touched | self._admission.settle(self._wanted, touched):
            changed.update(self._publish(service_key))
        waiting = self._admission.refused | self._admission.held
        self._tell({(SERVICE, key) for key in touched} | {(SLICE, key) for key in slice_changes}
                   | {(SERVICE, key) for key in waiting} | set(self._told))
        return CatalogUpdate(state=self.state(), changed=frozenset(changed), trigger_times=tuple(trigger_times))

    # -- services --------------------------------------------------------------------------------
    def _set_service(self, key: str, current: dict | None) -> None:
        self._parse_verdicts.pop((SERVICE, key), None)
        if current is None:
            self._ports_by_service.pop(key, None)
            self._created.pop(key, None)
            self.problems.pop(key, None)
            self._refs.pop((SERVICE, key), None)
            self._last_good.pop(key, None)
            return
        self._refs[(SERVICE, key)] = _ref(SERVICE, current, key=key)
        good = self._last_good.get(key)
        if good is not None and good[0] != self._refs[(SERVICE, key)].uid:   # another object of that name
            del self._last_good[key]
        try:
            parsed = parse_service(current, family=self.family, max_ports=self.limits.ports_per_service,
                                   max_addresses=self.limits.addresses_per_service)
        except Exception as error:   # one object's fault, whatever it is: reject it alone
            self._parse_verdicts[(SERVICE, key)] = _verdict(error)
            self._ports_by_service.pop(key, None)
            self.problems.pop(key, None)
            return
        named = {_service_key(name.namespace, name.name) for name in parsed.ports}
        if named - {key}:   # another Service's name: it must not take over (or delete) that one's ports
            self._parse_verdicts[(SERVICE, key)] = ("malformed", f"its metadata names {sorted(named)[0]!r}, "
                                                                 f"not {key!r}")
            self._ports_by_service.pop(key, None)
            self.problems.pop(key, None)
            return
        self._ports_by_service[key] = parsed.ports
        self._created[key] = parsed.created
        if parsed.problems:
            if self.problems.get(key) != parsed.problems:
                log.info("service %s: %s", key, "; ".join(parsed.problems[:5]))
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
        self._parse_verdicts.pop((SLICE, key), None)
        self._refs.pop((SLICE, key), None)
        if current is None:
            return touched
        try:
            parsed = parse_endpoint_slice(current, family=self.family, max_endpoints=self.limits.endpoints_per_slice,
                                          max_ports=self.limits.ports_per_slice)
        except Exception as error:
            self._refs[(SLICE, key)] = _ref(SLICE, current, key=key)
            self._parse_verdicts[(SLICE, key)] = _verdict(error)
            return touched
        if parsed is not None and parsed.namespace != key.rpartition("/")[0]:
            self._refs[(SLICE, key)] = _ref(SLICE, current, key=key)
            self._parse_verdicts[(SLICE, key)] = ("malformed", f"its metadata names namespace "
                                                               f"{parsed.namespace!r}, not that of {key!r}")
            return touched
        if parsed is not None:
            owner = _service_key(parsed.namespace, parsed.service)
            self._slices_by_service.setdefault(owner, {})[key] = parsed
            self._slice_owner[key] = owner
            touched.add(owner)
            if parsed.problems:
                log.info("endpoint slice %s: %s", key, "; ".join(parsed.problems[:5]))
        return touched

    # -- what each service wants, and the budget ---------------------------------------------------
    def _api_endpoint_addresses(self) -> tuple[str, ...]:
        slices = self._slices_by_service.get(API_SERVICE, {})
        return tuple(sorted({endpoint.ip for parsed in slices.values() for endpoints in parsed.endpoints.values()
                             for endpoint in endpoints}))

    def _want(self, service_key: str) -> None:
        self._wanted.pop(service_key, None)
        self._size_verdicts.pop(service_key, None)
        self._address_verdicts.pop(service_key, None)
        self._kept.discard(service_key)
        good = self._last_good.get(service_key)
        if (SERVICE, service_key) in self._parse_verdicts:   # a bad update: its last good version, if any
            if good is not None and self._want_ports(service_key, good[1]) is None:
                self._kept.add(service_key)
            return
        ports = self._ports_by_service.get(service_key)
        if not ports:
            self._last_good.pop(service_key, None)
            return
        verdict = self._want_ports(service_key, ports)
        if verdict is None:
            uid = self._refs[(SERVICE, service_key)].uid if (SERVICE, service_key) in self._refs else ""
            self._last_good[service_key] = (uid, ports)
            return
        self._size_verdicts[service_key] = verdict
        if good is not None and good[1] != ports and self._want_ports(service_key, good[1]) is None:
            self._kept.add(service_key)

    def _want_ports(self, service_key: str, ports: Mapping[ServicePortName, ServicePort]) -> tuple[str, str] | None:
        """Want `ports` with the current endpoints; the size verdict when they are over a limit."""
        ports, refused = self._guard.screen(ports)
        if refused:
            self._address_verdicts[service_key] = (
                "forbidden-address", "; ".join(refused) + ": not programmed (the rest of the Service is)")
        else:
            self._address_verdicts.pop(service_key, None)
        by_name = self._slices_by_service.get(service_key, {})
        slices = [by_name[k] for k in sorted(by_name)]
        endpoints: dict[ServicePortName, tuple[Endpoint, ...]] = {}
        limit = self.limits.endpoints_per_service_port
        for name, port in ports.items():
            found = merge_endpoints(port, slices)
            if len(found) > limit:
                return ("too-large", f"port {name.port or '(unnamed)'} has {len(found)} endpoints, more than the "
                                     f"limit of {limit} per service port (--proxy-max-endpoints-per-port)")
            if found:
                endpoints[name] = found
        cost = sum(max(1, len(endpoints.get(name, ()))) + len(port.external_ips) + len(port.load_balancer_ips)
                   + len(port.load_balancer_source_ranges) for name, port in ports.items())
        cap = min(self.limits.endpoint_ports_per_service, self.limits.endpoint_ports)
        if cost > cap:   # the cap, never the Service's cost: an Event must not be a size gauge
            return ("too-large", f"its ports x (endpoints + addresses) are more than the limit of {cap} "
                                 f"endpoint-ports per Service (--proxy-max-endpoint-ports-per-service)")
        self._wanted[service_key] = _Wanted(ports=ports, endpoints=endpoints,
                                            created=self._created.get(service_key, ""), cost=cost)
        return None

    # -- the merged view -------------------------------------------------------------------------
    def _publish(self, service_key: str) -> set[ServicePortName]:
        """Make one service's published ports and endpoints its admitted version (nothing when it
        is rejected or waits for room); answers the service ports that changed."""
        wanted = self._admission.admitted.get(service_key)
        old_names = self._names_by_service.pop(service_key, set())
        ports = wanted.ports if wanted is not None else {}
        changed = set()
        for name in old_names - set(ports):
            del self._services[name]
            self._endpoints.pop(name, None)
            changed.add(name)
        for name, port in ports.items():
            endpoints = wanted.endpoints.get(name, ()) if wanted is not None else ()
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

    # -- rejections --------------------------------------------------------------------------------
    def _verdict_of(self, kind: str, key: str) -> tuple[str, str] | None:
        verdict = self._parse_verdicts.get((kind, key))
        if verdict is None and kind == SERVICE:
            verdict = self._size_verdicts.get(key)
        if verdict is not None and kind == SERVICE and key in self._kept:
            return verdict[0], f"{verdict[1]}; its last good version stays programmed"
        if verdict is None and kind == SERVICE:
            if verdict is None and key in self._admission.refused:
                verdict = ("too-large", f"no room for it in the node's budget of endpoint-ports now {BUDGET_FLAGS}; "
                                        f"it is programmed when room is made")
            elif verdict is None and key in self._admission.held:
                verdict = ("too-large", f"its update does not fit the node's budget of endpoint-ports now "
                                        f"{BUDGET_FLAGS}; its previous version stays programmed")
            if verdict is None:
                verdict = self._address_verdicts.get(key)
        return verdict

    def _tell(self, keys: set[tuple[str, str]]) -> None:
        """Bring the scope's records of `keys` in line with the verdicts: reject, or accept."""
        for kind, key in keys:
            verdict = self._verdict_of(kind, key)
            if verdict == self._told.get((kind, key)):
                continue
            if verdict is None:
                del self._told[(kind, key)]
                self.rejections.accept(kind=kind, key=key)
            else:
                self._told[(kind, key)] = verdict
                ref = self._refs.get((kind, key)) or _ref(kind, None, key=key)
                self.rejections.reject(ref, reason=verdict[0], detail=verdict[1])
