"""The real-Kubernetes lab's pure parts: certificates and the identities they carry, the
components' flags, the node's containerd and kubelet configuration, the manifests it applies,
and its state's round trip. The cluster itself is tests/kubernetes/."""
from __future__ import annotations

import ipaddress
import json
import os
import stat
import subprocess

import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lab.kubernetes import addons, pki
from lab.kubernetes.cluster import NETWORK, KubernetesState, NodeProcesses, kubectl_binary
from lab.kubernetes.control_plane import ControlPlane, ControlPlanePids
from lab.kubernetes.node_host import KERNEL_TUNABLES, KubeletNode
from lab.processes import Processes
from lab.state import LabState


def load_cert(path: str) -> x509.Certificate:
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read())


def test_node_certificate_names_the_node_in_system_nodes(tmp_path):
    keys = pki.Pki(str(tmp_path / "pki"))
    cert_path, key_path = keys.client("kubelet-node-2", pki.node_identity("node-2"))
    cert = load_cert(cert_path)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:node-2"
    assert [a.value for a in cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["system:nodes"]
    assert cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == \
        x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])
    assert cert.issuer == load_cert(keys.ca_cert).subject
    assert stat.S_IMODE(os.stat(key_path).st_mode) == 0o600
    # the real verifier accepts the chain
    proc = subprocess.run(["openssl", "verify", "-CAfile", keys.ca_cert, cert_path], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_serving_certificate_covers_every_name_the_api_server_is_reached_by(tmp_path):
    plane = ControlPlane(directory=str(tmp_path), bin_dir="/bin", netns="rtr", address="198.18.16.1",
                         network=NETWORK, processes=Processes(cwd=str(tmp_path)))
    plane.write_credentials(host_port=40000)
    names = load_cert(plane.pki.path("apiserver.crt")).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert {"kubernetes.default.svc.cluster.local", "kubernetes"} <= set(names.get_values_for_type(x509.DNSName))
    assert {ipaddress.ip_address(a) for a in ("198.18.16.1", "10.96.0.1", "127.0.0.1")} <= \
        set(names.get_values_for_type(x509.IPAddress))
    host = json.loads(open(plane.kubeconfig("admin-host")).read())
    assert host["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:40000"
    # made once: a second call keeps the CA (kubeconfigs and running components trust it)
    ca = open(plane.pki.ca_cert).read()
    plane.write_credentials(host_port=40001)
    assert open(plane.pki.ca_cert).read() == ca


def test_control_plane_flags_turn_on_what_a_network_plugin_is_judged_by(tmp_path):
    plane = ControlPlane(directory=str(tmp_path), bin_dir="/k", netns="rtr", address="198.18.16.1",
                         network=NETWORK, processes=Processes(cwd=str(tmp_path)))
    api = plane.apiserver_argv()
    assert api[api.index("--authorization-mode") + 1] == "Node,RBAC"
    assert "NodeRestriction" in api[api.index("--enable-admission-plugins") + 1]
    assert api[api.index("--service-cluster-ip-range") + 1] == "10.96.0.0/16"
    kcm = plane.controller_manager_argv()
    assert "--allocate-node-cidrs=true" in kcm
    assert kcm[kcm.index("--cluster-cidr") + 1] == "10.244.0.0/16"
    assert kcm[kcm.index("--service-cluster-ip-range") + 1] == api[api.index("--service-cluster-ip-range") + 1]
    assert NETWORK.dns_service_ip == "10.96.0.10" and NETWORK.kubernetes_service_ip == "10.96.0.1"


def test_node_runtime_and_kubelet_keep_to_their_own_paths_and_cgroup(tmp_path):
    node = KubeletNode(name="node-1", netns="ns", address="198.18.16.11", directory=str(tmp_path / "n1"),
                       state_dir=str(tmp_path), cgroup="/lab/node-1", bin_dir="/k",
                       processes=Processes(cwd=str(tmp_path)))
    config = open(node.containerd_config(sandbox_image="registry.k8s.io/pause:3.10.1")).read()
    for line in ('sandbox_image = "registry.k8s.io/pause:3.10.1"', "SystemdCgroup = false",
                 f'Root = "{tmp_path}/n1/containerd/runc"', f'address = "{node.containerd_socket}"'):
        assert line in config
    kubelet = json.loads(open(node.kubelet_config(ca_cert="/ca", cluster_dns="10.96.0.10",
                                                  dns_domain="cluster.local")).read())
    assert kubelet["cgroupRoot"] == "/lab/node-1" and kubelet["failCgroupV1"] is False
    assert kubelet["imageGCHighThresholdPercent"] == 100   # nothing can be pulled again
    assert kubelet["containerRuntimeEndpoint"] == f"unix://{node.containerd_socket}"
    assert node.system_cgroup.startswith(kubelet["cgroupRoot"] + "/")
    # the values the kubelet's setupKernelTunables wants, so it never writes the host's
    assert KERNEL_TUNABLES["vm/overcommit_memory"] == "1" and KERNEL_TUNABLES["kernel/panic"] == "10"


def test_netagent_manifest_keeps_the_users_file_but_the_operators_edits():
    documents = list(yaml.safe_load_all(addons.netagent_manifest(mode="host-gw", proxy_mode="nftables")))
    with open(addons.MANIFEST) as f:
        shipped = [d for d in yaml.safe_load_all(f) if d]
    assert [d["kind"] for d in documents] == [d["kind"] for d in shipped]
    agent = next(c for d in documents if d["kind"] == "DaemonSet"
                 for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "netagent")
    assert "--backend=host-gw" in agent["args"] and "--proxy-mode=nftables" in agent["args"]
    assert "--backend=vxlan" not in agent["args"]
    assert [d for d in documents if d["kind"] == "ClusterRole"] == [d for d in shipped if d["kind"] == "ClusterRole"]
    assert "NET_BIND_SERVICE" not in agent["securityContext"]["capabilities"]["add"]


def test_bgp_adds_the_capability_bird_needs_and_ebpf_takes_the_overlay():
    def agent_of(text: str) -> dict:
        return next(c for d in yaml.safe_load_all(text) if d and d["kind"] == "DaemonSet"
                    for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == "netagent")
    bgp = agent_of(addons.netagent_manifest(mode="bgp", proxy_mode="iptables"))
    assert "--backend=bgp" in bgp["args"]
    assert bgp["securityContext"]["capabilities"]["add"] == ["NET_ADMIN", "NET_RAW", "SYS_ADMIN", "NET_BIND_SERVICE"]
    overlay = subprocess.run([kubectl_binary(), "kustomize", addons.OVERLAYS["ebpf"]], capture_output=True,
                             text=True, check=True).stdout
    ebpf = agent_of(addons.netagent_manifest(mode="bgp", proxy_mode="ebpf", built=overlay))
    assert ebpf["securityContext"] == {"privileged": True}   # privileged: no capability list to edit
    assert [a for a in ebpf["args"] if a.startswith(("--proxy-mode", "--backend"))] == \
        ["--backend=bgp", "--proxy-mode=ebpf"]


def test_coredns_manifest_serves_the_kube_dns_address():
    documents = list(yaml.safe_load_all(addons.coredns_manifest(dns_ip="10.96.0.10", domain="cluster.local",
                                                                image="example/coredns:1")))
    service = next(d for d in documents if d["kind"] == "Service")
    assert service["metadata"]["name"] == "kube-dns" and service["spec"]["clusterIP"] == "10.96.0.10"
    corefile = next(d for d in documents if d["kind"] == "ConfigMap")["data"]["Corefile"]
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa" in corefile


def test_kubernetes_state_round_trips_through_the_lab_state(tmp_path):
    kube = KubernetesState(version="v1.37.2", host_port=4000, control_plane=ControlPlanePids(etcd=1, apiserver=2),
                           nodes={"node-1": NodeProcesses(holder=3, containerd=4, kubelet=5)})
    state = LabState(prefix="p", workdir=str(tmp_path), mode="vxlan", auto_encap="vxlan", segments=1,
                     resync_period=30.0, switch="s", router="r", internet="i", kubernetes=kube.to_json())
    again = LabState.from_json(json.loads(json.dumps(state.to_json())))
    assert KubernetesState.from_json(again.kubernetes or {}) == kube
