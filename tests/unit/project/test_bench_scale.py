"""bench/scale.py's pure parts: the sizes, the address plan, every object it creates (read back
through the agent's own parsers, as the agent will read them), the record's fields, the
readers of iptables-save, ipset, audit-log and /metrics text, and the agent's and API server's
argv. The run itself needs root, the real kube-apiserver and minutes: it is the bench's."""
from __future__ import annotations

import ipaddress
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        import scale
        import scale_cluster
        import scale_kernel
        import scale_objects
        yield scale, scale_objects, scale_kernel, scale_cluster
    finally:
        sys.path.remove(str(BENCH))


def test_sizes_are_parsed_and_checked(bench) -> None:
    _, objects, _, _ = bench
    sizes = objects.parse_sizes("100:3000, 1000:30000", services=500)
    assert [(s.nodes, s.pods, s.services) for s in sizes] == [(100, 3000, 500), (1000, 30000, 500)]
    assert sizes[1].namespaces == 100 and "1000 nodes / 30000 pods" in sizes[1].label
    for bad in ("1000", "1k:3000", "1:10", "10:5", "10:10000", "", "40000:80000"):
        with pytest.raises(objects.SizeError):
            objects.parse_sizes(bad)
    with pytest.raises(objects.SizeError):
        objects.parse_sizes("10:100", services=0)


def test_the_plan_gives_every_pod_its_own_address_in_its_nodes_cidr(bench) -> None:
    _, objects, _, _ = bench
    size = objects.Size(7, 1000, 30)
    addresses = [objects.pod_address(size, p) for p in range(size.pods)]
    assert len(set(addresses)) == size.pods
    for p in range(size.pods):
        node, _ = objects.pod_place(size, p)
        assert ipaddress.ip_address(addresses[p]) in ipaddress.ip_network(objects.pod_cidr(node))
    assert all(objects.pod_place(size, p)[0] == 0 for p in objects.local_pods(size))
    assert len(objects.local_pods(size)) == 143
    cluster = ipaddress.ip_network(objects.CLUSTER_CIDR)
    assert ipaddress.ip_network(objects.pod_cidr(32767)).subnet_of(cluster)
    assert objects.node_address(0) != objects.API_ADDRESS
    assert all(len(objects.service_endpoints(size, s)) == objects.ENDPOINTS for s in range(size.services))


def test_nodes_are_read_by_the_agent_as_peers(bench) -> None:
    from netagent.noderoutes.node_objects import NotYet, read_peer
    _, objects, _, _ = bench
    own = objects.node(0, mode="host-gw")
    assert isinstance(read_peer(own), NotYet)       # the measured agent announces itself
    peer = read_peer(objects.node(5, mode="vxlan"))
    assert str(peer.public_ip) == objects.node_address(5)
    assert [str(c) for c in peer.pod_cidrs] == [objects.pod_cidr(5)]
    assert peer.vtep_mac == "0e:42:00:05:00:01"
    assert read_peer(objects.node(5, mode="host-gw")).vtep_mac is None


def test_pods_namespaces_and_policies_are_what_the_policy_engine_reads(bench) -> None:
    from netagent.policy.kube_objects import parse_namespace, parse_pod, parse_policy
    _, objects, _, _ = bench
    size = objects.Size(10, 700)
    pod = objects.pod(size, 613)
    assert pod["metadata"]["namespace"] == "scale-ns-2" and pod["spec"]["nodeName"] == "scale-3"
    assert pod["status"]["podIP"] == objects.pod_address(size, 613) and pod["metadata"]["labels"]["role"] == "client"
    assert objects.pod_status_patch(pod) == {"status": pod["status"]}
    info = parse_pod(pod)
    assert not info.problems and dict(info.value.labels)["role"] == "client"
    assert objects.pod(size, 613, role="server")["metadata"]["labels"]["role"] == "server"
    namespace = parse_namespace(objects.namespace(12))
    assert not namespace.problems and dict(namespace.value.labels)["team"] == "t2"
    policy = parse_policy(objects.network_policy(12))
    assert not policy.problems and not policy.reason
    peer = objects.network_policy(12)["spec"]["ingress"][0]["from"][0]
    assert peer["namespaceSelector"] == {"matchLabels": {"team": "t2"}}
    assert objects.service_account(3)["metadata"] == {"name": "default", "namespace": "scale-ns-3"}


def test_services_and_their_slices(bench) -> None:
    _, objects, _, _ = bench
    size = objects.Size(10, 300, 40)
    service = objects.service(size, 7)
    assert service["spec"]["ports"][0]["targetPort"] == 8080 and "clusterIP" not in service["spec"]
    created = {**service, "metadata": {**service["metadata"], "uid": "u-7"}}
    slice_ = objects.endpoint_slice(size, created, 7)
    assert slice_["metadata"]["labels"]["kubernetes.io/service-name"] == "svc-7"
    assert slice_["metadata"]["ownerReferences"][0]["uid"] == "u-7"
    assert [e["addresses"][0] for e in slice_["endpoints"]] == \
        [objects.pod_address(size, p) for p in objects.service_endpoints(size, 7)]
    assert all(e["conditions"]["ready"] for e in slice_["endpoints"])
    grown = objects.endpoint_slice(size, created, 7, extra=[objects.extra_endpoint_pod(size, 3)])
    added = grown["endpoints"][-1]
    assert len(grown["endpoints"]) == 11 and added["nodeName"] == "scale-9"
    assert added["addresses"] == ["10.128.9.203"]
    assert added["addresses"][0] not in {objects.pod_address(size, p) for p in range(size.pods)}


def test_a_record_has_the_issue_fields_first(bench) -> None:
    _, objects, _, _ = bench
    rec = objects.record(objects.Size(100, 3000), start_s=4.2, relist_bytes=10, mode="host-gw", notes="n")
    assert list(rec)[:len(objects.FIELDS)] == list(objects.FIELDS)
    assert list(rec)[len(objects.FIELDS):] == list(objects.EXTRA_FIELDS)
    assert rec["nodes"] == 100 and rec["pods"] == 3000 and rec["services"] == 1000
    assert rec["start_s"] == 4.2 and rec["cpu_s"] is None and rec["mode"] == "host-gw"
    assert json.loads(objects.records_json([rec])) == [rec]
    with pytest.raises(KeyError):
        objects.record(objects.Size(2, 2), start=1)


SAVED = """*nat
:NETAGENT-SERVICES - [0:0]
-A NETAGENT-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "default/kubernetes:https" -m tcp --dport 443 -j NETAGENT-SVC-AAA
-A NETAGENT-SERVICES -d 10.96.0.12/32 -p tcp -m comment --comment "ns/svc-1:http ClusterIP" -m tcp --dport 80 -j NETAGENT-SVC-BBB
-A NETAGENT-SVC-AAA -p tcp -j DNAT --to-destination 172.20.0.1:6443
-A NETAGENT-SVC-BBB ! -s 10.128.0.0/9 -j MARK --set-xmark 0x4000/0x4000
-A NETAGENT-SVC-BBB -p tcp -m statistic --mode random --probability 0.5 -j DNAT --to-destination 10.128.0.3:8080
-A NETAGENT-SVC-BBB -p tcp -j DNAT --to-destination 10.128.1.3:8080
-A KUBE-SOMETHING -j DNAT --to-destination 10.9.9.9:1
COMMIT
"""


def test_the_kernel_readers(bench) -> None:
    _, _, kernel, _ = bench
    assert kernel.dnat_count(SAVED) == 3
    assert kernel.chain_of_service(SAVED, "10.96.0.12") == "NETAGENT-SVC-BBB"
    assert kernel.chain_of_service(SAVED, "10.96.0.1") == "NETAGENT-SVC-AAA"   # not 10.96.0.12's
    with pytest.raises(LookupError):
        kernel.chain_of_service(SAVED, "10.96.0.2")
    members = kernel.set_members("create NETAGENT-NP-KNOWN hash:ip family inet\nadd NETAGENT-NP-KNOWN 10.128.0.2\n"
                                 "create NETAGENT-NPP-X hash:ip family inet\ncreate OTHER hash:ip\nadd OTHER 1.2.3.4\n")
    assert members == {"NETAGENT-NP-KNOWN": {"10.128.0.2"}, "NETAGENT-NPP-X": set()}


def test_the_audit_and_metrics_readers(bench) -> None:
    _, _, kernel, _ = bench
    events = [{"auditID": "a", "verb": "list", "stage": "ResponseComplete", "user": {"username": "netagent-scale"}},
              {"auditID": "b", "verb": "watch", "stage": "ResponseStarted", "user": {"username": "netagent-scale"}},
              {"auditID": "b", "verb": "watch", "stage": "ResponseComplete", "user": {"username": "netagent-scale"}},
              {"auditID": "c", "verb": "list", "user": {"username": "kubernetes-admin"}}]
    text = "\n".join(json.dumps(e) for e in events) + "\nnot json\n"
    assert kernel.audit_requests(text, "netagent-scale") == {"list": 1, "watch": 1}
    metrics = "\n".join([
        "# HELP apiserver_response_sizes_sum x",
        'apiserver_response_sizes_sum{component="apiserver",group="",resource="pods",scope="cluster",'
        'subresource="",verb="LIST",version="v1"} 1000',
        'apiserver_response_sizes_sum{component="apiserver",group="",resource="pods",scope="resource",'
        'subresource="",verb="GET",version="v1"} 50',
        'apiserver_response_sizes_sum{component="apiserver",group="",resource="secrets",scope="cluster",'
        'subresource="",verb="LIST",version="v1"} 7',
        'apiserver_response_sizes_sum{component="apiserver",group="networking.k8s.io",resource="networkpolicies",'
        'scope="cluster",subresource="",verb="LIST",version="v1"} 2.5e+03'])
    assert kernel.metric_sum(metrics, "apiserver_response_sizes_sum") == 3500


def test_the_agent_and_api_server_argv(bench, tmp_path) -> None:
    scale, _, _, cluster = bench
    machines = cluster.Machines(mode="vxlan", agent_root=str(tmp_path), workdir=str(tmp_path))
    argv = machines.agent_argv()
    assert argv[argv.index("--backend") + 1] == "vxlan" and argv[argv.index("--proxy-mode") + 1] == "iptables"
    assert argv[argv.index("--iptables-backend") + 1] == "legacy" and "--network-policy" in argv
    assert argv[argv.index("--node-name") + 1] == cluster.AGENT_NODE
    apiserver = machines.apiserver_argv()
    policy = json.loads(Path(apiserver[apiserver.index("--audit-policy-file") + 1]).read_text())
    assert policy["rules"][0] == {"level": "Metadata", "users": [cluster.AGENT_USER]}
    assert policy["rules"][-1] == {"level": "None"}
    machines.reserve_local_pods(["10.128.0.2"])
    assert (Path(machines.ipam_dir()) / "10.128.0.2").read_bytes() == b"scale-10.128.0.2\r\neth0"
    args = scale.parse_args(["--sizes", "100:3000", "--mode", "vxlan", "--json", "x.json"])
    assert [s.nodes for s in args.sizes] == [100] and args.mode == "vxlan" and args.json == "x.json"
    for bad in (["--sizes", "3000"], ["--mode", "ipip"], ["--samples", "0"], ["--workers", "100"]):
        with pytest.raises(SystemExit):
            scale.parse_args(bad)
