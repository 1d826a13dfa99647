"""The EndpointSlices a Service should have, from its pods and their nodes: the controller's pure half.

Behaviour follows Kubernetes' EndpointSlice controller (read as documentation, not code), so
that a plain Service manifest in the lab feeds a proxy exactly what a cluster would:

- Only Services with a non-empty selector and a type other than ExternalName get slices;
  the others are left to their users. Slices are labelled `kubernetes.io/service-name` and
  `endpointslice.kubernetes.io/managed-by: endpointslice-controller.netagent.lab`, carry
  the Service's own labels (and `service.kubernetes.io/headless` for headless ones), are
  owned by the Service (ownerReferences). One set of slices per family of the Service's
  `spec.ipFamilies` (IPv4 when it has none), each of `addressType` that family; slices of a
  family the Service no longer has are deleted (headless Services too: their families are
  filled by the API server like any other's).
- Endpoints are the pods of the Service's namespace whose labels match the selector, that
  have an address of the slice's family in `status.podIPs` (or `podIP`) and have not finished
  (phase Succeeded/Failed). Conditions:
  `serving` = the pod's Ready condition, `terminating` = it has a deletionTimestamp,
  `ready` = serving and not terminating (or true whatever the pod says when the Service
  has `publishNotReadyAddresses`). With `nodeName`, `zone` (the node's
  `topology.kubernetes.io/zone` label), `targetRef`, and `hostname` when the pod's
  `spec.subdomain` names the Service.
- Ports: each Service port with its name (`""` when unnamed), protocol and appProtocol,
  and the target port resolved *per pod*: a number is used as is, a name is looked up
  among the pod's container ports of that name and protocol. A pod lacking the name gets
  that port left out of its port list, so pods resolving differently (different numbers,
  or a missing name) land in different slices, one group per distinct port list, as in
  Kubernetes; a pod resolving none of the ports sits in a slice without ports, which a
  proxy never sends traffic to.
- `trafficDistribution` PreferClose (and PreferSameZone) give each endpoint the hint
  `forZones: [its own zone]`; PreferSameNode adds `forNodes: [its own node]`. That is what
  Kubernetes does for these values; the proportional `topology-mode: Auto` hints are not
  computed here.
- At most `max_per_slice` (100) endpoints per slice. A Service with no endpoints of a family
  keeps one empty placeholder slice of it (no ports, no endpoints), as Kubernetes does.

`plan_slices` turns the desired endpoint groups and the existing managed slices into the
fewest writes: endpoints stay in the slice they are in, new ones fill slices that change
anyway before others, slices whose port list is no longer wanted are rewritten for a new
group before any slice is created, and what remains empty is deleted. A slice whose
content (endpoints, ports, labels, owner) is already right is not written at all; slices
that are written get `endpoints.kubernetes.io/last-change-trigger-time` set to the
caller's trigger time (or removed when it has none, so a repair never reports a stale
latency).
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from netagent.kernel.families import IpFamily
from netagent.kube.endpoint_slices import SERVICE_NAME_LABEL

MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "endpointslice-controller.netagent.lab"
HEADLESS_LABEL = "service.kubernetes.io/headless"
ZONE_LABEL = "topology.kubernetes.io/zone"
TRIGGER_TIME_ANNOTATION = "endpoints.kubernetes.io/last-change-trigger-time"
MAX_ENDPOINTS_PER_SLICE = 100

PortList = tuple[tuple[str, str, int, str | None], ...]  # (name, protocol, port, appProtocol) in Service order


# --------------------------------------------------------------------------------------------
# Which objects take part
# --------------------------------------------------------------------------------------------
def selects_pods(service: dict) -> bool:
    """Does the controller manage this Service's slices? (a selector, and not ExternalName)"""
    spec = service.get("spec") or {}
    return bool(spec.get("selector")) and spec.get("type") != "ExternalName"


def selector_matches(selector: dict, labels: dict | None) -> bool:
    labels = labels or {}
    return all(labels.get(key) == value for key, value in selector.items())


def is_managed(endpoint_slice: dict) -> bool:
    return ((endpoint_slice.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


def service_of(endpoint_slice: dict) -> str | None:
    return ((endpoint_slice.get("metadata") or {}).get("labels") or {}).get(SERVICE_NAME_LABEL)


def pod_ip(pod: dict, family: IpFamily) -> str | None:
    """The pod's address of `family` (from `status.podIPs`, else `podIP`), or None."""
    status = pod.get("status") or {}
    candidates = [status.get("podIP")] + [entry.get("ip") for entry in status.get("podIPs") or []
                                          if isinstance(entry, dict)]
    for candidate in candidates:
        try:
            if isinstance(candidate, str) and candidate and IpFamily.of(ipaddress.ip_address(candidate)) is family:
                return candidate
        except ValueError:
            continue
    return None


def service_families(service: dict) -> list[IpFamily]:
    """The families a Service's slices are of: its `spec.ipFamilies` (known ones), else IPv4."""
    families: list[IpFamily] = []
    for label in (service.get("spec") or {}).get("ipFamilies") or []:
        try:
            family = IpFamily.from_label(label)
        except (TypeError, ValueError):
            continue
        if family not in families:
            families.append(family)
    return families or [IpFamily.V4]


def pod_is_ready(pod: dict) -> bool:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def pod_takes_part(pod: dict, family: IpFamily = IpFamily.V4) -> bool:
    """Has an address of `family` and has not finished: such a pod is published (ready or not)."""
    return pod_ip(pod, family) is not None and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


# --------------------------------------------------------------------------------------------
# Endpoints and their ports
# --------------------------------------------------------------------------------------------
def resolve_ports(service: dict, pod: dict) -> PortList:
    """The Service's ports with target ports resolved for this pod (unresolvable names left out)."""
    container_ports = [
        port
        for container in (pod.get("spec") or {}).get("containers") or []
        for port in container.get("ports") or []
    ]
    resolved = []
    for port in (service.get("spec") or {}).get("ports") or []:
        protocol = port.get("protocol", "TCP")
        target = port.get("targetPort", port.get("port"))
        if isinstance(target, str):
            number = next(
                (int(c["containerPort"]) for c in container_ports
                 if c.get("name") == target and c.get("protocol", "TCP") == protocol and c.get("containerPort")),
                None,
            )
            if number is None:
                continue
        else:
            number = int(target)
        resolved.append((port.get("name") or "", protocol, number, port.get("appProtocol")))
    return tuple(resolved)


def render_ports(ports: PortList) -> list[dict]:
    rendered = []
    for name, protocol, number, app_protocol in ports:
        entry: dict = {"name": name, "protocol": protocol, "port": number}
        if app_protocol:
            entry["appProtocol"] = app_protocol
        rendered.append(entry)
    return rendered


def ports_key(endpoint_slice: dict) -> PortList:
    return tuple(
        (p.get("name") or "", p.get("protocol", "TCP"), int(p["port"]), p.get("appProtocol"))
        for p in endpoint_slice.get("ports") or []
        if p.get("port") is not None
    )


def render_endpoint(service: dict, pod: dict, *, node: dict | None, family: IpFamily = IpFamily.V4) -> dict:
    spec = service.get("spec") or {}
    metadata = pod["metadata"]
    pod_spec = pod.get("spec") or {}
    serving = pod_is_ready(pod)
    terminating = bool(metadata.get("deletionTimestamp"))
    ready = bool(spec.get("publishNotReadyAddresses")) or (serving and not terminating)
    endpoint: dict = {
        "addresses": [pod_ip(pod, family)],
        "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
        "targetRef": {"kind": "Pod", "namespace": metadata.get("namespace", ""), "name": metadata["name"],
                      "uid": metadata.get("uid", "")},
    }
    node_name = pod_spec.get("nodeName")
    if node_name:
        endpoint["nodeName"] = node_name
    zone = ((((node or {}).get("metadata") or {}).get("labels")) or {}).get(ZONE_LABEL)
    if zone:
        endpoint["zone"] = zone
    if pod_spec.get("hostname") and pod_spec.get("subdomain") == service["metadata"]["name"]:
        endpoint["hostname"] = pod_spec["hostname"]
    distribution = spec.get("trafficDistribution")
    hints: dict = {}
    if distribution in ("PreferClose", "PreferSameZone", "PreferSameNode") and zone:
        hints["forZones"] = [{"name": zone}]
    if distribution == "PreferSameNode" and node_name:
        hints["forNodes"] = [{"name": node_name}]
    if hints:
        endpoint["hints"] = hints
    return endpoint


def desired_endpoints(service: dict, pods: list[dict], nodes: dict[str, dict], *,
                      family: IpFamily = IpFamily.V4) -> dict[PortList, list[dict]]:
    """Endpoints of `family` grouped by their resolved port list; `nodes` by name."""
    selector = (service.get("spec") or {}).get("selector") or {}
    namespace = service["metadata"].get("namespace", "")
    groups: dict[PortList, list[dict]] = {}
    for pod in pods:
        metadata = pod["metadata"]
        if metadata.get("namespace", "") != namespace or not selector_matches(selector, metadata.get("labels")):
            continue
        if not pod_takes_part(pod, family):
            continue
        node = nodes.get((pod.get("spec") or {}).get("nodeName") or "")
        groups.setdefault(resolve_ports(service, pod), []).append(
            render_endpoint(service, pod, node=node, family=family))
    return groups


def endpoint_key(endpoint: dict) -> tuple[str, str]:
    return ((endpoint.get("addresses") or [""])[0], (endpoint.get("targetRef") or {}).get("name", ""))


def _sorted_endpoints(endpoints: list[dict]) -> list[dict]:
    def order(endpoint: dict) -> tuple:
        address, name = endpoint_key(endpoint)
        try:
            return (int(ipaddress.ip_address(address)), name)
        except ValueError:
            return (0, name)

    return sorted(endpoints, key=order)


# --------------------------------------------------------------------------------------------
# Slices
# --------------------------------------------------------------------------------------------
def slice_labels(service: dict) -> dict:
    labels = {k: v for k, v in (service["metadata"].get("labels") or {}).items()
              if k not in (SERVICE_NAME_LABEL, MANAGED_BY_LABEL, HEADLESS_LABEL)}
    labels[SERVICE_NAME_LABEL] = service["metadata"]["name"]
    labels[MANAGED_BY_LABEL] = MANAGED_BY
    if (service.get("spec") or {}).get("clusterIP") == "None":
        labels[HEADLESS_LABEL] = ""
    return labels


def owner_references(service: dict) -> list[dict]:
    return [{"apiVersion": "v1", "kind": "Service", "name": service["metadata"]["name"],
             "uid": service["metadata"].get("uid", ""), "controller": True, "blockOwnerDeletion": True}]


@dataclass
class SlicePlan:
    """The writes that bring a Service's managed slices to the desired state, in a safe order:
    creates and updates (which add endpoints) before deletes (which may remove the last copy)."""

    create: list[dict] = field(default_factory=list)  # bodies with metadata.generateName
    update: list[dict] = field(default_factory=list)  # full objects, resourceVersion kept as precondition
    delete: list[str] = field(default_factory=list)  # slice names

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)


def _content(service: dict, ports: PortList, endpoints: list[dict], family: IpFamily) -> dict:
    return {
        "addressType": family.label,
        "endpoints": _sorted_endpoints(endpoints),
        "ports": render_ports(ports),
        "labels": slice_labels(service),
        "ownerReferences": owner_references(service),
    }


def _existing_content(endpoint_slice: dict) -> dict:
    metadata = endpoint_slice.get("metadata") or {}
    return {
        "addressType": endpoint_slice.get("addressType"),
        "endpoints": endpoint_slice.get("endpoints") or [],
        "ports": endpoint_slice.get("ports") or [],
        "labels": metadata.get("labels") or {},
        "ownerReferences": metadata.get("ownerReferences") or [],
    }


def _with_content(service: dict, *, base: dict | None, content: dict, trigger_time: str | None) -> dict:
    metadata = dict((base or {}).get("metadata") or {})
    if base is None:
        metadata["generateName"] = f"{service['metadata']['name']}-"
        metadata["namespace"] = service["metadata"].get("namespace", "default")
    annotations = {k: v for k, v in (metadata.get("annotations") or {}).items() if k != TRIGGER_TIME_ANNOTATION}
    if trigger_time:
        annotations[TRIGGER_TIME_ANNOTATION] = trigger_time
    if annotations:
        metadata["annotations"] = annotations
    else:
        metadata.pop("annotations", None)
    metadata["labels"] = content["labels"]
    metadata["ownerReferences"] = content["ownerReferences"]
    body = {k: v for k, v in (base or {}).items() if k not in ("metadata", "endpoints", "ports", "addressType")}
    body.update({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": metadata,
                 "addressType": content["addressType"], "endpoints": content["endpoints"], "ports": content["ports"]})
    return body


def plan_slices(
    service: dict,
    desired: dict[PortList, list[dict]],
    existing: list[dict],
    *,
    max_per_slice: int = MAX_ENDPOINTS_PER_SLICE,
    trigger_time: str | None = None,
    family: IpFamily = IpFamily.V4,
) -> SlicePlan:
    """The writes from `existing` (this Service's managed slices of `family`) to `desired`
    (see module doc)."""
    existing = sorted(existing, key=lambda s: s["metadata"]["name"])
    if not any(desired.values()):
        desired = {(): []}  # the placeholder: no ports, no endpoints
    # (slice or None, ports, endpoints) for every slice that will exist afterwards
    layout: list[tuple[dict | None, PortList, list[dict]]] = []
    leftovers: dict[PortList, list[dict]] = {}
    for ports, endpoints in desired.items():
        remaining = {endpoint_key(e): e for e in endpoints}
        mine = [s for s in existing if ports_key(s) == ports]
        for endpoint_slice in mine:
            present = map(endpoint_key, endpoint_slice.get("endpoints") or [])
            kept = [remaining.pop(k) for k in present if k in remaining]
            layout.append((endpoint_slice, ports, kept[:max_per_slice]))
            for extra in kept[max_per_slice:]:
                remaining[endpoint_key(extra)] = extra
        leftovers[ports] = _sorted_endpoints(list(remaining.values()))
    wanted_ports = set(desired)
    spares = [s for s in existing if ports_key(s) not in wanted_ports]

    def changes(entry: tuple[dict | None, PortList, list[dict]]) -> bool:
        endpoint_slice, ports, endpoints = entry
        return (endpoint_slice is None
                or _existing_content(endpoint_slice) != _content(service, ports, endpoints, family))

    for ports, waiting in leftovers.items():
        # Fill slices that are written anyway, then the others with room, then new (or spare) ones.
        candidates = [e for e in layout if e[1] == ports]
        candidates.sort(key=lambda e: (not changes(e), e[0]["metadata"]["name"] if e[0] else ""))
        for _, _, endpoints in candidates:
            while waiting and len(endpoints) < max_per_slice:
                endpoints.append(waiting.pop(0))
        while waiting:
            layout.append((spares.pop(0) if spares else None, ports, waiting[:max_per_slice]))
            waiting = waiting[max_per_slice:]
    plan = SlicePlan()
    placeholder_only = list(desired) == [()] and not desired[()]
    kept_any = False
    for planned, ports, endpoints in layout:
        if not endpoints and not (placeholder_only and not kept_any):
            if planned is not None:
                plan.delete.append(planned["metadata"]["name"])
            continue
        kept_any = True
        content = _content(service, ports, endpoints, family)
        if planned is None:
            plan.create.append(_with_content(service, base=None, content=content, trigger_time=trigger_time))
        elif _existing_content(planned) != content:
            plan.update.append(_with_content(service, base=planned, content=content, trigger_time=trigger_time))
    if placeholder_only and not kept_any:  # nothing existed: create the placeholder (or reuse a spare)
        content = _content(service, (), [], family)
        if spares:
            plan.update.append(_with_content(service, base=spares.pop(0), content=content, trigger_time=trigger_time))
        else:
            plan.create.append(_with_content(service, base=None, content=content, trigger_time=trigger_time))
    plan.delete.extend(s["metadata"]["name"] for s in spares)
    return plan
