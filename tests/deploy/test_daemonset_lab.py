"""A lab cluster whose agents are the image, run as deploy/netagent.yaml's DaemonSet says.

One 2-node vxlan lab (iptables proxy) for the module: on each node podman ran the init
container (which installed the shim into the node's /opt/cni/bin) and the agent container, not
privileged but with exactly the manifest's capabilities, in the node's namespace with the
manifest's mounts, env and args; every pod is
wired by executing that installed shim from the node's own view, as a runtime on the host
would. The tests run in file order and leave the lab whole for the next one: services and
pods across nodes first, then the agent killed and restarted, a rollout to another image
under traffic, and last `netagent cleanup` run from the image.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys

import pytest

from cni.errors import CniError
from lab.agent_pods import AGENT_CONTAINER, run_podman
from lab.daemonset import ProbeKind
from tests.cluster.lab_tools import serve, stop_stream, stream, wait_for
from tests.cluster.test_services import answered_by, http_port, manifest, poll, programmed
from tests.deploy.conftest import deploy_lab
from tests.unit.deploy.test_deploy_manifests import AGENT_CAPABILITIES

pytestmark = pytest.mark.deploy
WEB_PORT = 8080


def pod_addresses(lab) -> dict:
    """Each pod's eth0 addresses, read from the pod's namespace (not from the lab's records)."""
    found = {}
    for name in sorted(lab.state.pods):
        out = lab.exec(name, ["ip", "-j", "-4", "addr", "show", "dev", "eth0"], check=True).stdout
        found[name] = sorted(f"{a['local']}/{a['prefixlen']}" for link in json.loads(out) for a in link["addr_info"])
    return found


def reservation_files(lab, node: str) -> set[str]:
    """The addresses the node's IPAM store holds (file names under its data dir on the host)."""
    root = lab.agent_pods.node_root(node)
    return {os.path.basename(p) for p in glob.glob(os.path.join(root, "var/lib/cni/networks/*/*.*.*.*"))}


def container_image(lab, node: str) -> str:
    name = lab.agent_pods.container_name(node, AGENT_CONTAINER)
    return run_podman(["inspect", "--format", "{{.ImageName}}", name]).stdout.strip()


@pytest.fixture(scope="module")
def lab(agent_image):
    with deploy_lab(nodes=2, mode="vxlan", proxy_mode="iptables", agent_image=agent_image) as lab:
        node1, node2 = sorted(lab.state.nodes)
        lab.add_pod("web-1", node=node1, labels={"app": "web"}, ports={"http": WEB_PORT})
        lab.add_pod("web-2", node=node2, labels={"app": "web"}, ports={"http": WEB_PORT})
        lab.add_pod("client", node=node1)
        servers = [serve(lab, pod, "tcp", WEB_PORT, lifetime=900, named=True) for pod in ("web-1", "web-2")]
        lab.api().apply(manifest("web", selector={"app": "web"}, ports=[http_port()]))
        lab.api().apply(manifest("web-external", selector={"app": "web"}, type="NodePort", ports=[http_port()]))
        ips = {p["name"]: p["ip"] for p in lab.status()["pods"]}
        node_port = lab.api().get("v1", "Service", "web-external", namespace="default")["spec"]["ports"][0]["nodePort"]
        for node in (node1, node2):   # both services, before any test relies on one
            programmed(lab, node, "web", {ips["web-1"], ips["web-2"]})
            wait_for(lambda: f"--dport {node_port} " in lab.exec(node, ["iptables-save", "-t", "nat"]).stdout,
                     what=f"the NodePort rule on {node}")
        try:
            yield lab
        finally:
            for server in servers:
                server.stop()


CAPABILITY_BITS = {"NET_ADMIN": 12, "NET_RAW": 13, "SYS_ADMIN": 21}


def effective_capabilities(pid: int) -> set[str]:
    """The capabilities the kernel says a process has (CapEff), by name; any bit we cannot name fails."""
    with open(f"/proc/{pid}/status") as f:
        mask = int(next(line.split()[1] for line in f if line.startswith("CapEff:")), 16)
    names = {bit: name for name, bit in CAPABILITY_BITS.items()}
    found = {names.get(bit, f"bit {bit}") for bit in range(64) if mask >> bit & 1}
    return found


def fetch(lab, node: str, url: str) -> int:
    """The HTTP status of a GET from inside the node's namespace (0: nothing listens)."""
    code = ("import sys, urllib.request, urllib.error\n"
            "try:\n    print(urllib.request.urlopen(sys.argv[1], timeout=30).status)\n"
            "except urllib.error.HTTPError as e:\n    print(e.code)\n"
            "except OSError:\n    print(0)\n")
    return int(lab.exec(node, [sys.executable, "-c", code, url], check=True, timeout=60).stdout)


def cluster_ip(lab) -> str:
    return lab.api().get("v1", "Service", "web", namespace="default")["spec"]["clusterIP"]


def test_each_node_runs_the_manifests_containers_and_the_installed_shim(lab, agent_image):
    status = {n["name"]: n for n in lab.status()["nodes"]}
    for node in sorted(lab.state.nodes):
        assert status[node]["agent"]["running"] and status[node]["agent"]["image"] == agent_image
        assert container_image(lab, node).endswith(agent_image.split("/", 1)[1])
        inspected = json.loads(run_podman(["inspect", lab.agent_pods.container_name(node, AGENT_CONTAINER)]).stdout)[0]
        # the manifest's securityContext: not privileged, exactly its capabilities, here and in the kernel
        assert inspected["HostConfig"]["Privileged"] is False
        assert sorted(inspected["EffectiveCaps"]) == sorted(f"CAP_{cap}" for cap in AGENT_CAPABILITIES)
        assert effective_capabilities(inspected["State"]["Pid"]) == AGENT_CAPABILITIES
        assert f"NODE_NAME={node}" in inspected["Config"]["Env"]
        assert f"--node-name={node}" in inspected["Args"]
        mounts = {m["Destination"]: m for m in inspected["Mounts"]}
        assert mounts["/run/netns"]["Source"] == "/run/netns" and "rslave" in mounts["/run/netns"]["Propagation"]
        assert mounts["/run/netagent"]["Source"] == os.path.join(lab.agent_pods.node_root(node), "run/netagent")
        assert mounts["/opt/cni/bin"]["RW"] is False
        # The init container's shim, run on the host: a static binary answering VERSION by itself.
        shim = os.path.join(lab.agent_pods.node_root(node), "opt/cni/bin/netagent")
        proc = subprocess.run([shim], env={"CNI_COMMAND": "VERSION"}, input=b"{}", capture_output=True, timeout=10)
        assert proc.returncode == 0 and "1.0.0" in json.loads(proc.stdout)["supportedVersions"], proc
        with open(lab.conflist_path(node)) as f:
            assert json.load(f)["plugins"][0]["agentSocket"] == "/run/netagent/cni.sock"
        host = lab.node_host(node)
        assert all(lab.agent_pods.probe(host, kind) for kind in ProbeKind)


def test_health_is_served_on_the_node_address_and_metrics_on_loopback_only(lab):
    for node in sorted(lab.state.nodes):
        address = lab.state.nodes[node].address
        assert fetch(lab, node, f"http://{address}:10258/healthz") == 200   # the kubelet's probes
        assert fetch(lab, node, f"http://{address}:10256/healthz") == 200   # load balancers'
        assert fetch(lab, node, f"http://{address}:10258/metrics") == 404
        assert fetch(lab, node, f"http://{address}:10256/metrics") == 404
        assert fetch(lab, node, f"http://{address}:10249/metrics") == 0     # not on the node's address
        assert fetch(lab, node, "http://127.0.0.1:10249/metrics") == 200


def test_pods_on_both_nodes_reach_each_other(lab):
    ips = {p["name"]: p["ip"] for p in lab.status()["pods"]}
    for node, pod in (("node-1", "web-1"), ("node-2", "web-2")):
        assert ips[pod] in reservation_files(lab, node)
    assert lab.ping("web-1", ips["web-2"], count=2)
    assert lab.ping("web-2", ips["client"], count=2)


def test_cluster_ip_and_node_port_reach_both_endpoints(lab):
    results = poll(lab, "client", cluster_ip(lab), 80, 30)
    assert set(answered_by(results)) == {"web-1", "web-2"}, results
    node_port = lab.api().get("v1", "Service", "web-external", namespace="default")["spec"]["ports"][0]["nodePort"]
    for node in sorted(lab.state.nodes):
        results = poll(lab, "internet", lab.state.nodes[node].address, node_port, 20)
        assert len(answered_by(results)) == 20 and set(answered_by(results)) <= {"web-1", "web-2"}, results


def test_agent_container_killed_then_restarted_by_the_kubelet(lab):
    node1 = "node-1"
    host = lab.node_host(node1)
    lab.add_pod("short", node=node1)
    short_ip = lab.state.pods["short"].ip
    before = pod_addresses(lab)
    lab.agent_pods.kill(node1, sig=signal.SIGKILL)
    assert not lab.agent_pods.running(node1)
    # No agent: the kernel keeps serving, a new pod is refused with "try again" (11), and a
    # pod's DEL is journaled by the shim and succeeds.
    assert len(answered_by(poll(lab, "client", cluster_ip(lab), 80, 10))) == 10
    with pytest.raises(CniError) as refused:
        lab.add_pod("too-early", node=node1)
    assert refused.value.code == 11
    lab.remove_pod("short")
    assert short_ip in reservation_files(lab, node1)  # not released yet: no agent to do it
    lab.state.nodes[node1].agent_pid = lab.agent_pods.restart_agent(host)
    lab.wait_for_agent(node1)
    wait_for(lambda: short_ip not in reservation_files(lab, node1), what="the journaled DEL replayed")
    before.pop("short")
    assert pod_addresses(lab) == before
    lab.add_pod("after-restart", node=node1)
    assert lab.ping("after-restart", lab.state.pods["web-2"].ip)
    lab.remove_pod("after-restart")


def test_rollout_to_another_image_under_traffic(lab, next_image):
    address = cluster_ip(lab)
    before = pod_addresses(lab)
    reserved = {node: reservation_files(lab, node) for node in lab.state.nodes}
    tcp = stream(lab, "client", "tcp", address, 80, seconds=600)   # established: it has had an answer
    for node in sorted(lab.state.nodes):  # maxUnavailable 1: one node after the other
        host = lab.node_host(node)
        lab.state.nodes[node].agent_pid = lab.agent_pods.roll(host, next_image,
                                                              wait=lambda node=node: lab.wait_for_agent(node))
        assert container_image(lab, node).endswith(next_image.split("/", 1)[1])
    summary = stop_stream(tcp)   # its last line was answered after both nodes rolled
    assert summary["error"] is None and summary["answered"] == summary["sent"] > 1, summary
    assert pod_addresses(lab) == before
    assert {node: reservation_files(lab, node) for node in lab.state.nodes} == reserved
    assert len(answered_by(poll(lab, "client", address, 80, 10))) == 10
    lab.add_pod("after-rollout", node="node-2")
    assert lab.ping("after-rollout", lab.state.pods["web-1"].ip)


def test_cleanup_from_the_image_removes_what_the_agent_made(lab):
    node = "node-2"
    for pod in [p for p in list(lab.state.pods.values()) if p.node == node]:
        lab.remove_pod(pod.name)
    lab.stop_agent(node)  # the DaemonSet is gone from this node
    links = lambda: {link["ifname"] for link in json.loads(lab.exec(node, ["ip", "-j", "link"]).stdout)}  # noqa: E731
    assert {"na0", "na-vxlan"} <= links()
    proc = lab.agent_pods.run_once(lab.node_host(node), ["cleanup"])
    assert proc.returncode == 0, proc.stderr
    assert "removed device na-vxlan (vxlan)" in proc.stdout and "removed interface na0" in proc.stdout
    assert not {name for name in links() if name.startswith("na")}
    assert "NETAGENT-" not in lab.exec(node, ["iptables-save"]).stdout
    assert lab.exec(node, ["ip", "route", "show", "proto", "78"]).stdout.strip() == ""
    assert lab.ping("web-1", lab.state.nodes["node-1"].address)  # the other node is untouched
