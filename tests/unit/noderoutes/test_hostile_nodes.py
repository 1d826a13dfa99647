"""Hostile Nodes (Hypothesis): wrongly typed, oversized and adversarial Node objects through the
agent's real reading (`read_peer`), planner (`admission.py`, `plan.py`) and reconciler (over
`FakeKernel`), mixed with good Nodes.

A case is two good peers (node-2, node-3, the oldest Nodes), then one to five hostile Nodes,
each a good-looking Node with several fields replaced: by any JSON value, huge strings, deep
JSON (up to 20,000 levels), or adversarial values (IPv6, host routes, 0.0.0.0/0, the metadata
address, the service range, the node subnet, our own or a good peer's pod CIDR, public IP or
VTEP MAC, the top-of-rack router's or the gateway's address), labels a kubelet may set (the old
reflector label among them), or the whole object, its metadata or its spec by junk. Hostile Nodes are always
younger than the good ones (creationTimestamp is set by the API server: a Node cannot backdate
itself) or undated. After every sync, partial and full:

- the sync did not raise;
- the good peers have exactly the routes, neighbours and FDB entries they have without the
  hostile Nodes;
- every route lies inside the cluster CIDR, clear of the service range, of our own pod CIDR
  and of every good peer's; no FDB entry but a good peer's points at a good peer's address;
- a good node added afterwards (the youngest) is routed.

In `bgp` mode (the agent's speaker over `FakeBird`, a top-of-rack router in the topology
ConfigMap), after every sync: the router's session keeps its AS and password, no node is a
reflector, every Node's session accepts its own CIDR only (never a good peer's), and the good
peers' learnt routes reach main through their owners.

Budget: 150 cases per mode in CI; `NETAGENT_FUZZ_EXAMPLES=N` runs N.
"""
from __future__ import annotations

import json
import os
import re
from datetime import datetime, timezone
from ipaddress import IPv4Address, IPv4Network

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netagent.infra.sync_runner import SyncKind
from netagent.noderoutes import node_objects as nodes
from netagent.noderoutes.routing.model import Mode
from netagent.noderoutes.routing.vxlan import vtep_mac
from tests.unit.noderoutes.node_agent_support import CLUSTER, LOCAL_CIDR, LOCAL_IP, SERVICES, AgentHarness, node

CASES = int(os.environ.get("NETAGENT_FUZZ_EXAMPLES") or 150)
OLDEST = "2026-01-01T00:00:00Z"
GOOD_NAMES = ("node-2", "node-3")
GOOD_CIDRS = {IPv4Network("10.244.2.0/24"), IPv4Network("10.244.3.0/24")}
GOOD_IPS = {IPv4Address("198.18.16.12"), IPv4Address("198.18.16.13")}
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)

ODD_CIDRS = ["169.254.169.254/32", "0.0.0.0/0", "10.96.0.0/16", "10.96.0.10/32", "10.96.0.0/12",
             "198.18.16.0/20", "198.18.16.12/32", "198.18.16.11/32", "10.244.0.0/16", "10.244.1.0/24",
             "10.244.1.128/25", "10.244.2.0/24", "10.244.2.0/23", "10.244.3.7/32", "10.244.0.0/15", "fd00::/64",
             "::/0", "2001:db8::/32", "10.244.77.0/24", "10.244.78.0/24", "10.244.77.0/25", "10.244.2.0/24 ",
             "10.244.2.0", "300.1.1.1/24", "10.244.2.0/24\n", "", "10.244.2.1/24", "127.0.0.0/8"]
ODD_IPS = ["198.18.16.12", "198.18.16.13", "198.18.16.11", "0.0.0.0", "127.0.0.1", "255.255.255.255",
           "224.0.0.1", "10.244.2.1", "10.96.0.1", "::1", "198.18.16.77", "198.18.16.78", " 198.18.16.77", "",
           "198.18.16.77\n", "240.0.0.1", "198.18.16.2", "198.18.16.1"]  # the ToR's, the gateway's (bgp)
OLD_REFLECTOR_LABEL = "netagent.io/route-reflector"
ODD_MACS = [vtep_mac("node-2"), vtep_mac("node-3"), vtep_mac("node-1"), vtep_mac("node-2").upper(),
            vtep_mac("node-2").replace(":", "-"), "ff:ff:ff:ff:ff:ff", "01:00:5e:00:00:01", "00:00:00:00:00:00",
            "zz:zz:zz:zz:zz:zz", "0e:00:00:00:00:77", "0e:00:00:00:00:78", ""]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)
deep = st.integers(min_value=5, max_value=20_000).map(lambda n: "[" * n + "]" * n)
deep_object = st.integers(min_value=5, max_value=5_000).map(lambda n: '{"vtepMAC":' + '{"a":' * n + "1" + "}" * n + "}")
huge = st.integers(min_value=100, max_value=300_000).map(lambda n: "x" * n)
junk = st.one_of(json_values, st.text(), huge, deep)
backend_data = st.one_of(junk, deep_object,
                         st.builds(lambda mac: json.dumps({"vtepMAC": mac}), st.sampled_from(ODD_MACS) | junk),
                         st.builds(lambda mac: json.dumps({"vtepMAC": mac, "x": [1, 2]}), st.sampled_from(ODD_MACS)))


def _younger_or_undated(value) -> bool:
    created = nodes._created({"creationTimestamp": value})
    return created is None or created > T0


FIELDS = {
    "public_ip": st.sampled_from(ODD_IPS) | junk,
    "backend_data": backend_data,
    "pod_cidr": st.sampled_from(ODD_CIDRS) | junk,
    "pod_cidrs": st.one_of(st.lists(st.sampled_from(ODD_CIDRS), max_size=4), st.lists(junk, max_size=3), junk,
                           st.integers(min_value=3, max_value=5000).map(lambda n: ["10.244.9.0/24"] * n)),
    "created": st.one_of(st.sampled_from(["2026-03-01T00:00:00Z", "2026-05-05T05:05:05.123456Z",
                                          "2026-02-01T00:00:00+00:00"]), junk).filter(_younger_or_undated),
    "uid": junk,
    "labels": st.one_of(junk, st.dictionaries(
        st.sampled_from([OLD_REFLECTOR_LABEL, "node-role.kubernetes.io/route-reflector", "kubernetes.io/hostname",
                         OLD_REFLECTOR_LABEL.upper(), "route-reflector"]) | st.text(max_size=40),
        st.sampled_from(["true", "True", "", "yes"]) | junk, max_size=4)),
    "backend_type": junk,
    "annotations": junk,
    "metadata": junk,
    "spec": junk,
    "whole": junk,
}


def _apply(obj, field: str, value):
    if not isinstance(obj, dict):  # already replaced whole
        return obj
    metadata, spec = obj.get("metadata"), obj.get("spec")
    notes = metadata["annotations"] if isinstance(metadata, dict) and isinstance(metadata.get("annotations"), dict) \
        else None
    if field == "whole":
        return value
    if field in ("public_ip", "backend_data", "backend_type") and notes is not None:
        notes[{"public_ip": nodes.PUBLIC_IP, "backend_data": nodes.BACKEND_DATA,
               "backend_type": nodes.BACKEND_TYPE}[field]] = value
    elif field in ("pod_cidr", "pod_cidrs") and isinstance(spec, dict):
        spec["podCIDR" if field == "pod_cidr" else "podCIDRs"] = value
    elif field in ("created", "uid", "annotations", "labels") and isinstance(metadata, dict):
        metadata[{"created": "creationTimestamp", "uid": "uid", "annotations": "annotations",
                  "labels": "labels"}[field]] = value
    elif field == "metadata":
        obj["metadata"] = value
    elif field == "spec":
        obj["spec"] = value
    return obj


# bgp mode: the takeovers of issue 29 drawn often, on otherwise good-looking Nodes
BGP_FIELDS = {**FIELDS, "reflector": st.just({OLD_REFLECTOR_LABEL: "true"}),
              "router_ip": st.sampled_from(["198.18.16.2", "198.18.16.1"])}


@st.composite
def hostile_nodes(draw, *, bgp: bool = False) -> list:
    fields = BGP_FIELDS if bgp else FIELDS
    names = sorted(fields) + (["reflector", "router_ip"] * 6 if bgp else [])
    hostile = []
    for index in range(draw(st.integers(min_value=1, max_value=5))):
        obj = node(f"h-{index}", 100 + index, created="2026-02-01T00:00:00Z",
                   public_ip=f"198.18.17.{index + 1}", mac=f"0e:00:00:00:01:{index:02x}")
        for field in draw(st.lists(st.sampled_from(names), min_size=1, max_size=4)):
            value = draw(fields[field])
            field = {"reflector": "labels", "router_ip": "public_ip"}.get(field, field)
            obj = _apply(obj, field, value)
        hostile.append(obj)
    return hostile


def good_objects(harness: AgentHarness) -> tuple[set, set, set]:
    """(routes, neighbours, FDB entries) of the good peers, as the fake kernel holds them."""
    routes = {r for r in harness.kernel.dump_routes() if r.dst in GOOD_CIDRS}
    neighbours = {n for n in harness.kernel.dump_neighbours("na-vxlan") if any(n.address in c for c in GOOD_CIDRS)} \
        if harness.kernel.links_with_prefix("na-vxlan") else set()
    fdb = {f for f in harness.kernel.dump_fdb("na-vxlan") if f.mac in {vtep_mac(n) for n in GOOD_NAMES}} \
        if harness.kernel.links_with_prefix("na-vxlan") else set()
    return routes, neighbours, fdb


def baseline(mode: Mode) -> tuple[set, set, set]:
    harness = AgentHarness(mode=mode)
    for index, name in enumerate(GOOD_NAMES, start=2):
        harness.put(node(name, index, created=OLDEST))
    harness.sync(SyncKind.FULL)
    return good_objects(harness)


BASELINE = {mode: baseline(mode) for mode in (Mode.VXLAN, Mode.HOST_GW)}


def check(harness: AgentHarness, mode: Mode) -> None:
    assert good_objects(harness) == BASELINE[mode]
    for route in harness.kernel.dump_routes():
        assert route.dst.subnet_of(CLUSTER), route
        assert not route.dst.overlaps(SERVICES) and not route.dst.overlaps(LOCAL_CIDR), route
        if route.dst not in GOOD_CIDRS:
            assert not any(route.dst.overlaps(c) for c in GOOD_CIDRS), route
            assert route.gateway not in GOOD_IPS | {LOCAL_IP}, route
    if harness.kernel.links_with_prefix("na-vxlan"):
        good_macs = {vtep_mac(n) for n in GOOD_NAMES}
        for entry in harness.kernel.dump_fdb("na-vxlan"):
            assert entry.mac in good_macs or entry.dst not in GOOD_IPS | {LOCAL_IP}, entry


@pytest.mark.parametrize("mode", [Mode.VXLAN, Mode.HOST_GW], ids=lambda m: m.value)
def test_hostile_nodes_never_cost_good_peers_their_routes(mode):
    @settings(max_examples=CASES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(hostile=hostile_nodes())
    def case(hostile):
        harness = AgentHarness(mode=mode)
        for index, name in enumerate(GOOD_NAMES, start=2):
            harness.put(node(name, index, created=OLDEST))
        harness.sync(SyncKind.FULL)
        for index, obj in enumerate(hostile):
            recorded = harness.put(obj, key=f"h-{index}")
            harness.sync(SyncKind.PARTIAL if recorded else SyncKind.FULL)  # partial: the recorded changes
            check(harness, mode)
        harness.sync(SyncKind.FULL)
        check(harness, mode)
        assert set(harness.rejected()) <= {f"h-{i}" for i in range(len(hostile))}
        newcomer = node("node-4", 4, created="2027-01-01T00:00:00Z")
        harness.put(newcomer)
        harness.sync()
        check(harness, mode)
        assert IPv4Network("10.244.4.0/24") in harness.overlay_routes()
        recorded = all([harness.delete(f"h-{index}") for index in range(len(hostile))])
        harness.sync(SyncKind.PARTIAL if recorded else SyncKind.FULL)  # every hostile Node gone
        assert harness.rejected() == {}
        assert set(harness.overlay_routes()) == GOOD_CIDRS | {IPv4Network("10.244.4.0/24")}

    case()


TOR_IP = IPv4Address("198.18.16.2")
TOR_CONFIG = {"metadata": {"name": "netagent-bgp", "namespace": "kube-system"},
              "data": {"externalPeers": '[{"address": "198.18.16.2", "as": 65000, "password": "tor key"}]'}}
_SESSION = re.compile(r"protocol bgp (peer4_\S+) \{\n  local \S+ as \d+;\n  neighbor (\S+) as (\d+);")
_IMPORT = re.compile(r"filter import4_(peer4_\S+) \{\n(?:  if net ~ \[ (.*?) \] then accept;\n)?  reject;")


def check_bgp(world) -> None:
    """The router's session intact, no reflector, every Node's session its own CIDRs only."""
    text = world.bird.text
    sessions = {name: (IPv4Address(address), int(asn)) for name, address, asn in _SESSION.findall(text)}
    accepts = {name: {IPv4Network(c) for c in (cidrs.split(", ") if cidrs else ())}
               for name, cidrs in _IMPORT.findall(text)}
    by_address = {address: (name, asn) for name, (address, asn) in sessions.items()}
    assert by_address[TOR_IP][1] == 65000 and 'password "tor key";' in text, text
    assert "rr client" not in text and "rr cluster id" not in text, text
    for address, cidr in zip(sorted(GOOD_IPS), sorted(GOOD_CIDRS)):
        assert accepts[by_address[address][0]] == {cidr}, text
    for name, (address, asn) in sessions.items():
        if address != TOR_IP:
            assert asn == 64512 and LOCAL_CIDR not in accepts[name], text
            if address not in GOOD_IPS:
                assert not accepts[name] & GOOD_CIDRS, text
    routes = world.overlay_routes()
    for index, name in enumerate(GOOD_NAMES, start=2):
        assert routes[IPv4Network(f"10.244.{index}.0/24")].gateway == IPv4Address(f"198.18.16.{10 + index}")


def test_hostile_nodes_take_no_bgp_session_nor_route():
    from netagent.noderoutes.routing.model import Route
    from tests.unit.noderoutes.bgp.test_bgp_node_agent import BgpWorld

    @settings(max_examples=max(CASES // 3, 10), deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(hostile=hostile_nodes(bgp=True))
    def case(hostile):
        world = BgpWorld(config_map=TOR_CONFIG, peers=())
        world.table.main_gateways = (IPv4Address("198.18.16.1"),)
        for index, name in enumerate(GOOD_NAMES, start=2):
            world.put(node(name, index, created=OLDEST))
            world.table.learn(Route(dst=IPv4Network(f"10.244.{index}.0/24"),
                                    gateway=IPv4Address(f"198.18.16.{10 + index}"), ifname="eth0"))
        world.sync(SyncKind.FULL)
        check_bgp(world)
        for index, obj in enumerate(hostile):
            recorded = world.put(obj, key=f"h-{index}")
            world.sync(SyncKind.PARTIAL if recorded else SyncKind.FULL)
            check_bgp(world)
        world.sync(SyncKind.FULL)
        check_bgp(world)

    case()
