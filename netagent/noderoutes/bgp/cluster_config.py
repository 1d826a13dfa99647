"""The BGP settings the cluster gives, read defensively: each value parsed into its type alone.

- `parse_topology(data, defaults)`: the topology ConfigMap's `data` (strings): `asNumber`,
  `nodeToNodeMesh` (`true`/`false`), `bfd`, `reflectorLabel`, `externalPeers` (a JSON list of
  `{address, as, password?, subnet?}`). A bad value is refused with its reason and the default
  kept; every other value still applies.
- `parse_node_peers(text)`: a Node's `netagent.io/bgp-peers` annotation, a JSON list of
  `{address, as, password?}` (at most `MAX_EXTERNAL_PEERS`); each entry judged alone.
- `is_reflector(node, label)`: whether a raw Node object carries the reflector label as "true".
  The label must lie under `node-restriction.kubernetes.io/` (`topology.TRUSTED_LABEL_PREFIX`),
  which the NodeRestriction admission plugin forbids a kubelet to set on its own Node: any other
  key (`reflectorLabel`, `--bgp-reflector-label`) is refused, and `is_reflector` is False for it,
  so no node can make itself everyone's route reflector.

Nothing here raises on input: a refusal is a (key, reason) pair the caller records through its
`RejectionScope` (scope `bgp`), and every accepted value is one of `model.py`'s types, which the
renderer alone turns into text.
"""
from __future__ import annotations

import dataclasses
import json
from ipaddress import IPv4Address, IPv4Network

from netagent.kube import labels
from netagent.noderoutes.bgp.model import BgpConfigError, check_as_number, check_password
from netagent.noderoutes.bgp.topology import TRUSTED_LABEL_PREFIX, ExternalPeer, TopologySettings

PEERS_ANNOTATION = "netagent.io/bgp-peers"
MAX_EXTERNAL_PEERS = 16
MAX_TEXT = 16384


def _boolean(value: object, key: str) -> bool:
    if value in ("true", "false"):
        return value == "true"
    raise BgpConfigError(f"{key} must be 'true' or 'false'")


def _as_number(value: object, key: str) -> int:
    if isinstance(value, str) and value.isdigit() and len(value) <= 10:
        return check_as_number(int(value), what=key)
    if isinstance(value, int):
        return check_as_number(value, what=key)
    raise BgpConfigError(f"{key} must be a decimal AS number")


def _external_peer(entry: object, *, with_subnet: bool) -> ExternalPeer:
    if not isinstance(entry, dict):
        raise BgpConfigError("a peer must be an object {address, as, password?}")
    allowed = {"address", "as", "password"} | ({"subnet"} if with_subnet else set())
    unknown = sorted(k for k in entry if k not in allowed)
    if unknown:
        raise BgpConfigError(f"unknown peer field(s) {[str(k)[:40] for k in unknown[:3]]}")
    address = entry.get("address")
    if not isinstance(address, str) or len(address) > 15:
        raise BgpConfigError("a peer's address must be an IPv4 address")
    try:
        ip = IPv4Address(address)
        subnet = IPv4Network(entry["subnet"]) if with_subnet and isinstance(entry.get("subnet"), str) else None
    except ValueError as err:
        raise BgpConfigError(f"a peer's address or subnet is malformed: {err}") from None
    if with_subnet and "subnet" in entry and subnet is None:
        raise BgpConfigError("a peer's subnet must be an IPv4 network")
    if ip.is_unspecified or ip.is_loopback or ip.is_multicast:
        raise BgpConfigError(f"a peer's address {ip} is not a unicast address")
    password = entry.get("password")
    return ExternalPeer(address=ip, asn=_as_number(entry.get("as"), "peer AS number"),
                        password=check_password(password) if password is not None else None, subnet=subnet)


def _peer_list(text: object, *, with_subnet: bool) -> tuple[tuple, list]:
    """(peers, refusals): the list as a whole, then each entry alone."""
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        return (), [f"must be a JSON list of at most {MAX_TEXT} characters"]
    try:
        entries = json.loads(text)
    except (ValueError, RecursionError):
        return (), ["is not valid JSON"]
    if not isinstance(entries, list) or len(entries) > MAX_EXTERNAL_PEERS:
        return (), [f"must be a JSON list of at most {MAX_EXTERNAL_PEERS} peers"]
    peers, refusals = [], []
    for index, entry in enumerate(entries):
        try:
            peers.append(_external_peer(entry, with_subnet=with_subnet))
        except BgpConfigError as err:
            refusals.append(f"peer {index}: {err}")
    return tuple(peers), refusals


def parse_node_peers(text: object) -> tuple[tuple, list]:
    """A Node's `netagent.io/bgp-peers` annotation: (peers, refusals)."""
    return _peer_list(text, with_subnet=False)


def parse_topology(data: object, defaults: TopologySettings) -> tuple[TopologySettings, list]:
    """The ConfigMap's `data` over `defaults`: (settings, refusals as "key: reason")."""
    if data is None:
        return defaults, []
    if not isinstance(data, dict):
        return defaults, ["data: must be a map of strings"]
    changes: dict = {}
    refusals: list[str] = []
    readers = {"asNumber": ("asn", lambda v: _as_number(v, "asNumber")),
               "nodeToNodeMesh": ("mesh", lambda v: _boolean(v, "nodeToNodeMesh")),
               "bfd": ("bfd", lambda v: _boolean(v, "bfd")),
               "reflectorLabel": ("reflector_label", check_label)}
    for key, value in sorted(data.items(), key=lambda kv: str(kv[0])):
        if key in readers:
            field, read = readers[key]
            try:
                changes[field] = read(value)
            except BgpConfigError as err:
                refusals.append(f"{key}: {err}")
        elif key == "externalPeers":
            peers, refused = _peer_list(value, with_subnet=True)
            changes["external"] = peers
            refusals.extend(f"externalPeers: {why}" for why in refused)
        else:
            refusals.append(f"{str(key)[:63]}: not a known option")
    return dataclasses.replace(defaults, **changes), refusals


def check_label(value: object) -> str:
    """A label key under `node-restriction.kubernetes.io/` (the reflector label), or `BgpConfigError`."""
    if not labels.valid_key(value):
        raise BgpConfigError("reflectorLabel must be a label key")
    if not value.startswith(TRUSTED_LABEL_PREFIX) or value == TRUSTED_LABEL_PREFIX:
        raise BgpConfigError(f"reflectorLabel must lie under {TRUSTED_LABEL_PREFIX} (a kubelet may set any "
                             f"other label on its own Node)")
    return value


def is_reflector(node: object, label: str) -> bool:
    if not label.startswith(TRUSTED_LABEL_PREFIX):
        return False  # a label its own kubelet could set makes no node a reflector
    metadata = node.get("metadata") if isinstance(node, dict) else None
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    return isinstance(labels, dict) and labels.get(label) == "true"


def node_annotation(node: object, key: str) -> object:
    metadata = node.get("metadata") if isinstance(node, dict) else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return annotations.get(key) if isinstance(annotations, dict) else None
