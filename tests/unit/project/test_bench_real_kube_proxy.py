"""bench/real_kube_proxy.py's pure parts: the configuration kube-proxy is given, the PATH that picks
its iptables backend, the API objects of the bench state; and bench/kube_proxy_kernel.py's
counting of its kernel state.

The bench itself needs root, the kube-proxy binary and minutes, so it is not run here; the
objects are created in the lab API server (in process: its validation is the real server's
rules), and the listings counted are written in the shapes kube-proxy 1.37 leaves in the
kernel (one numgen dnat per service in nftables mode, a KUBE-SEP chain per endpoint in
iptables mode).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"


@pytest.fixture(scope="module")
def kp():
    sys.path.insert(0, str(BENCH))
    try:
        import real_kube_proxy
        yield real_kube_proxy
    finally:
        sys.path.remove(str(BENCH))


@pytest.fixture(scope="module")
def kernel(kp):
    import kube_proxy_kernel
    return kube_proxy_kernel


def test_the_config_names_the_mode_the_server_and_loopback_ports(kp) -> None:
    for mode, proxy_mode in (("kube-proxy-nftables", "nftables"), ("kube-proxy-iptables-legacy", "iptables"),
                             ("kube-proxy-iptables-nft", "iptables")):
        config = json.loads(kp.render_config(mode, kubeconfig="/tmp/x y/kubeconfig", cluster_cidr="10.128.0.0/9"))
        assert config["kind"] == "KubeProxyConfiguration" and config["mode"] == proxy_mode
        assert config["clientConnection"]["kubeconfig"] == "/tmp/x y/kubeconfig"
        assert config["metricsBindAddress"].startswith("127.0.0.1:")
        assert config["healthzBindAddress"].startswith("127.0.0.1:")
        assert config["hostnameOverride"] == kp.NODE_NAME
        assert config["detectLocalMode"] == "ClusterCIDR" and config["clusterCIDR"] == "10.128.0.0/9"
        assert config["conntrack"]["maxPerCore"] == 0   # the host's conntrack table is left alone
    with pytest.raises(kp.KubeProxyError, match="not a kube-proxy mode"):
        kp.render_config("kube-proxy-ipvs", kubeconfig="k", cluster_cidr="10.0.0.0/8")
    kubeconfig = json.loads(kp.render_kubeconfig("http://127.0.0.1:4321"))
    assert kubeconfig["clusters"][0]["cluster"]["server"] == "http://127.0.0.1:4321"
    assert kubeconfig["contexts"][0]["context"]["cluster"] == kubeconfig["current-context"] == "bench"


def test_the_path_links_pick_the_iptables_backend(kp, tmp_path) -> None:
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    for backend in ("legacy", "nft"):
        for command in ("iptables", "ip6tables"):
            for verb in ("", "-save", "-restore"):
                (sbin / f"{command}-{backend}{verb}").write_text("")
    for backend in ("legacy", "nft"):
        links = tmp_path / backend
        links.mkdir()
        kp.backend_links(backend, str(links), sbin=str(sbin))
        assert {p.name: os.readlink(p) for p in links.iterdir()} == {
            "iptables": f"{sbin}/iptables-{backend}", "iptables-save": f"{sbin}/iptables-{backend}-save",
            "iptables-restore": f"{sbin}/iptables-{backend}-restore", "ip6tables": f"{sbin}/ip6tables-{backend}",
            "ip6tables-save": f"{sbin}/ip6tables-{backend}-save",
            "ip6tables-restore": f"{sbin}/ip6tables-{backend}-restore"}
    with pytest.raises(kp.KubeProxyError, match="legacy or nft"):
        kp.backend_links("nf_tables", str(tmp_path), sbin=str(sbin))
    (sbin / "ip6tables-nft-restore").unlink()
    empty = tmp_path / "again"
    empty.mkdir()
    with pytest.raises(kp.KubeProxyError, match="ip6tables-nft-restore is missing"):
        kp.backend_links("nft", str(empty), sbin=str(sbin))


def test_the_bench_state_becomes_objects_the_api_server_takes(kp) -> None:
    from lab.apiserver import ApiServer
    from lab.apiserver.kinds import ENDPOINT_SLICES, NODES, SERVICES
    from lab.apiserver.objects import Subresource
    from service_proxy_kit import make_state, with_listener
    state = with_listener(make_state(12))
    objects = kp.api_objects(state)
    assert [o["kind"] for o in objects[:2]] == ["Node", "Namespace"]
    assert sum(o["kind"] == "Service" for o in objects) == sum(o["kind"] == "EndpointSlice" for o in objects) == 12
    api = ApiServer()   # not started: in-process writes through the same validation
    for obj in objects:
        api.create(obj)
        if "status" in obj:
            api.update(obj, part=Subresource.STATUS)
    node = api.get(NODES, "node-a")
    assert node["status"]["addresses"] == [{"type": "InternalIP", "address": "198.18.16.11"}]
    services = {s["metadata"]["name"]: s for s in api.list(SERVICES, namespace="bench")}
    assert services["svc-10"]["spec"]["type"] == "NodePort" and services["svc-10"]["spec"]["ports"][0]["nodePort"] == 30001
    assert services["svc-3"]["spec"]["clusterIP"] == "10.96.0.3" and services["svc-3"]["spec"]["type"] == "ClusterIP"
    slices = {s["metadata"]["name"]: s for s in api.list(ENDPOINT_SLICES, namespace="bench")}
    assert slices["svc-3-1"]["metadata"]["labels"]["kubernetes.io/service-name"] == "svc-3"
    assert [e["addresses"][0] for e in slices["svc-3-1"]["endpoints"]][:2] == ["10.128.0.30", "10.128.0.31"]
    assert [e["addresses"] for e in slices["svc-11-1"]["endpoints"]] == [["10.255.255.1"]]   # the listener


IPTABLES_SAVE = """# Generated by iptables-nft-save
*nat
:KUBE-SERVICES - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d 10.96.0.0/32 -p tcp -m comment --comment "bench/svc-0:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-AAAA
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment "bench/svc-1:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-BBBB
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-AAAA -m comment --comment "bench/svc-0:http -> 10.128.0.1:8080" -m statistic --mode random --probability 0.5 -j KUBE-SEP-1
-A KUBE-SVC-AAAA -m comment --comment "bench/svc-0:http -> 10.128.0.2:8080" -j KUBE-SEP-2
-A KUBE-SEP-1 -p tcp -m comment --comment bench/svc-0:http -m tcp -j DNAT --to-destination 10.128.0.1:8080
-A KUBE-SEP-2 -p tcp -m comment --comment bench/svc-0:http -m tcp -j DNAT --to-destination 10.128.0.2:8080
-A KUBE-SEP-3 -s 10.128.0.3/32 -m comment --comment bench/svc-1:http -j KUBE-MARK-MASQ
COMMIT
"""


def test_iptables_listings_are_counted(kernel) -> None:
    assert kernel.count_iptables_save(IPTABLES_SAVE) == {"rules": 8, "dnat": 2, "services": 2}
    assert kernel.service_chains("kube-proxy-iptables-nft", IPTABLES_SAVE) == {"10.96.0.0": "KUBE-SVC-AAAA",
                                                                           "10.96.0.1": "KUBE-SVC-BBBB"}
    assert kernel.count_iptables_save("") == {"rules": 0, "dnat": 0, "services": 0}


def _numgen_dnat(ips: list[str]) -> dict:
    return {"dnat": {"family": "ip", "addr": {"map": {"key": {"numgen": {"mode": "random", "mod": len(ips)}},
                                                      "data": {"set": [[i, {"concat": [ip, 8080]}]
                                                                       for i, ip in enumerate(ips)]}}}}}


NFT = {"nftables": [
    {"metainfo": {"version": "1.0.6"}},
    {"table": {"family": "ip", "name": "kube-proxy"}},
    {"map": {"family": "ip", "name": "service-ips", "table": "kube-proxy", "elem": [
        [{"concat": ["10.96.0.0", "tcp", 80]}, {"goto": {"target": "service-X-bench/svc-0/tcp/http"}}],
        [{"concat": ["10.96.0.1", "tcp", 80]}, {"goto": {"target": "service-Y-bench/svc-1/tcp/http"}}]]}},
    {"set": {"family": "ip", "name": "cluster-ips", "table": "kube-proxy", "elem": ["10.96.0.0", "10.96.0.1"]}},
    {"rule": {"chain": "services", "expr": [{"vmap": {}}]}},
    {"rule": {"chain": "service-X-bench/svc-0/tcp/http",
              "expr": [{"match": {}}, _numgen_dnat(["10.128.0.1", "10.128.0.2", "10.128.0.3"])]}},
    {"rule": {"chain": "service-Y-bench/svc-1/tcp/http", "expr": [{"match": {}}, {"dnat": {"addr": "10.255.255.1",
                                                                                            "port": 8080}}]}},
]}


def test_nftables_listings_are_counted(kernel) -> None:
    text = json.dumps(NFT)
    assert kernel.count_nft_json(text) == {"rules": 3, "elements": 4, "dnat": 4, "services": 2}
    assert kernel.service_chains("kube-proxy-nftables", text) == {"10.96.0.0": "service-X-bench/svc-0/tcp/http",
                                                              "10.96.0.1": "service-Y-bench/svc-1/tcp/http"}
    assert kernel.count_nft_json('{"nftables": []}') == {"rules": 0, "elements": 0, "dnat": 0, "services": 0}


def test_proc_figures_read_a_live_process(kernel) -> None:
    rss, cpu = kernel.proc_figures(os.getpid())
    assert 5 < rss < 4096 and cpu > 0
