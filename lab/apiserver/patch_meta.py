"""Patch strategies of the served kinds' list fields: what `patchStrategy`/`patchMergeKey` say in
Kubernetes' Go types, which the Python client's models do not carry.

A strategic merge patch (`strategic.py`) merges a list only where the type says so: lists of
objects by their merge key (a Service's `ports` by `port`, a container's `env` by `name`),
lists of strings as sets (`finalizers`, `podCIDRs`); every other list is replaced whole. The
same facts go into the OpenAPI documents as `x-kubernetes-patch-strategy` and
`x-kubernetes-patch-merge-key` (`openapi.py`), which is where kubectl reads them when it
computes the patch for `apply`, so client and server agree on every list.

Paths are dotted field names from the object's root, list items transparent
(`spec.containers.ports` is every container's ports). `PatchStrategy.key` is the merge key,
"" for a list of scalars merged as a set; `retain_keys` marks `merge,retainKeys` (volumes);
`map_keys` are server-side apply's keys where they are more than the merge key (ports are
told apart by number and protocol, TCP when unset).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PatchStrategy:
    key: str  # the merge key of a list of objects; "" for a list of scalars
    retain_keys: bool = False
    map_keys: tuple[str, ...] = ()  # server-side apply's list-map keys when more than the merge key

    @property
    def list_map_keys(self) -> tuple[str, ...]:
        return self.map_keys or (self.key,)

    @property
    def extension(self) -> str:
        return "merge,retainKeys" if self.retain_keys else "merge"


_BY_NAME = PatchStrategy("name")
_BY_TYPE = PatchStrategy("type")
_BY_IP = PatchStrategy("ip")
_SET = PatchStrategy("")


def _container_fields(prefix: str) -> dict[str, PatchStrategy]:
    return {
        prefix: _BY_NAME,
        f"{prefix}.ports": PatchStrategy("containerPort", map_keys=("containerPort", "protocol")),
        f"{prefix}.env": _BY_NAME,
        f"{prefix}.volumeMounts": PatchStrategy("mountPath"),
        f"{prefix}.volumeDevices": PatchStrategy("devicePath"),
    }


_METADATA = {"metadata.ownerReferences": PatchStrategy("uid"), "metadata.finalizers": _SET}

# kind -> path -> strategy; kinds without an entry have only the metadata lists.
STRATEGIES: dict[str, dict[str, PatchStrategy]] = {
    "Pod": {
        **_container_fields("spec.containers"),
        **_container_fields("spec.initContainers"),
        **_container_fields("spec.ephemeralContainers"),
        "spec.volumes": PatchStrategy("name", retain_keys=True),
        "spec.imagePullSecrets": _BY_NAME,
        "spec.hostAliases": _BY_IP,
        "spec.topologySpreadConstraints": PatchStrategy("topologyKey"),
        "spec.schedulingGates": _BY_NAME,
        "spec.resourceClaims": PatchStrategy("name", retain_keys=True),
        "status.conditions": _BY_TYPE,
        "status.podIPs": _BY_IP,
        "status.hostIPs": _BY_IP,
        "status.resourceClaimStatuses": _BY_NAME,
    },
    "Service": {"spec.ports": PatchStrategy("port", map_keys=("port", "protocol")), "status.conditions": _BY_TYPE},
    "Node": {"spec.podCIDRs": _SET, "status.conditions": _BY_TYPE, "status.addresses": _BY_TYPE},
    "Namespace": {"status.conditions": _BY_TYPE},
}


KEY_DEFAULTS = {"protocol": "TCP"}  # a list-map key's value when the item leaves it unset


def key_of(item: dict, strategy: PatchStrategy) -> dict:
    """An item's list-map key values (server-side apply), defaults filled in."""
    return {k: item.get(k, KEY_DEFAULTS.get(k)) for k in strategy.list_map_keys}


def strategy_for(kind: str, path: tuple[str, ...]) -> PatchStrategy | None:
    dotted = ".".join(path)
    return _METADATA.get(dotted) or STRATEGIES.get(kind, {}).get(dotted)
