"""Services in a lab cluster, eBPF mode: the socket load balancer on each node's own cgroup.

One 2-node vxlan lab in `--proxy-mode ebpf`: each node's agent attaches the programs to that
node's cgroup and pins its maps in a bpffs under the lab's state directory; pod commands run
inside their node's cgroup. Servers answer with their pod's name and the peer address they
saw, so each test can say which endpoint answered and that the client address was kept (the
connection goes straight to the pod: no NAT at all). Rolling endpoints under load is the
iptables module's scenario (`roll_endpoints_under_load`), run here on the eBPF lab.
"""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pytest

from netagent.kernel import namespaces
from tests.cluster.lab_tools import ROOT, lab_cluster, serve, stop_stream, stream, wait_for
from tests.cluster.test_services import (
    answered_by,
    backends_on,
    http_port,
    manifest,
    pod_ips,
    poll,
    refusals,
    roll_endpoints_under_load,
    service_of,
    serving,
)

WEB_PORT, UDP_PORT = 8080, 5353
pytestmark = pytest.mark.usefixtures("_bcc")


@pytest.fixture(scope="module")
def _bcc():
    from tests.netns.ebpf_fixtures import require_bcc
    require_bcc()


def programmed(lab, node: str, address: str, expected: set[str]) -> None:
    """Wait until `node`'s maps (read back by `netagent status services`) balance `address` to `expected`."""
    serving(lab, node, {address: expected})


@pytest.fixture(scope="module")
def lab():
    with lab_cluster(nodes=2, mode="vxlan", proxy_mode="ebpf") as lab:
        node1, node2 = sorted(lab.state.nodes)
        lab.add_pod("web-1", node=node1, labels={"app": "web", "tier": "front"}, ports={"http": WEB_PORT})
        lab.add_pod("web-2", node=node2, labels={"app": "web"}, ports={"http": WEB_PORT, "dns": (UDP_PORT, "UDP")})
        lab.add_pod("client", node=node1)
        servers = [serve(lab, pod, "tcp", WEB_PORT, lifetime=600, named=True) for pod in ("web-1", "web-2")]
        servers.append(serve(lab, "web-2", "udp", UDP_PORT, lifetime=600, named=True))
        lab.api().apply(manifest("web", selector={"app": "web"}, ports=[http_port()]))
        lab.api().apply(manifest("web-sticky", selector={"app": "web"}, ports=[http_port()],
                                 sessionAffinity="ClientIP",
                                 sessionAffinityConfig={"clientIP": {"timeoutSeconds": 300}}))
        lab.api().apply(manifest("dns", selector={"app": "web"}, ports=[
            {"name": "dns", "port": 53, "targetPort": "dns", "protocol": "UDP"}]))
        lab.api().apply(manifest("nobody", selector={"app": "nobody"}, ports=[http_port()]))
        lab.api().apply(manifest("web-external", selector={"app": "web"}, type="NodePort", ports=[http_port()]))
        lab.api().apply(manifest("web-local", selector={"tier": "front"}, type="NodePort",
                                 externalTrafficPolicy="Local", ports=[http_port()]))
        pods = pod_ips(lab)
        for node in (node1, node2):
            programmed(lab, node, f"{service_of(lab, 'web')['spec']['clusterIP']}:80/TCP",
                       {pods["web-1"], pods["web-2"]})
        programmed(lab, node1, f"{service_of(lab, 'dns')['spec']['clusterIP']}:53/UDP", {pods["web-2"]})
        node_port = service_of(lab, "web-external")["spec"]["ports"][0]["nodePort"]
        local_port = service_of(lab, "web-local")["spec"]["ports"][0]["nodePort"]
        web = {pods["web-1"], pods["web-2"]}
        for node in (node1, node2):   # every service of the module, before any test relies on one
            serving(lab, node, {f"{lab.state.nodes[node].address}:{node_port}/TCP": web,
                                f"{service_of(lab, 'web-sticky')['spec']['clusterIP']}:80/TCP": web,
                                f"{service_of(lab, 'nobody')['spec']['clusterIP']}:80/TCP": set()})
        serving(lab, node1, {f"{lab.state.nodes[node1].address}:{local_port}/TCP": {pods["web-1"]}})
        try:
            yield lab
        finally:
            for server in servers:
                server.stop()


def test_cluster_ip_across_nodes_keeps_the_pod_source(lab):
    cluster_ip = service_of(lab, "web")["spec"]["clusterIP"]
    results = poll(lab, "client", cluster_ip, 80, 30)
    assert set(answered_by(results)) == {"web-1", "web-2"}, results
    assert {answer.split()[1] for answer, _ in results} == {pod_ips(lab)["client"]}


def test_dns_over_udp_answers_from_the_service_address(lab):
    cluster_ip = service_of(lab, "dns")["spec"]["clusterIP"]
    out = lab.exec("client", [sys.executable, "-c", (
        "import socket,sys\n"
        "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(5)\n"
        f"s.sendto(b'query',('{cluster_ip}',53)); data,src=s.recvfrom(512)\n"
        "print(data.decode().split()[0], src[0], src[1])")], timeout=30)
    assert out.stdout.split() == ["web-2", cluster_ip, "53"], out.stderr


def test_a_service_without_endpoints_refuses_at_once(lab):
    cluster_ip = service_of(lab, "nobody")["spec"]["clusterIP"]
    results, retransmitted = refusals(lab, "client", cluster_ip, 80, 3)
    assert all("ConnectionRefusedError" in answer for answer, _ in results) and retransmitted == 0, \
        (results, retransmitted)


def test_session_affinity_pins_a_client(lab):
    cluster_ip = service_of(lab, "web-sticky")["spec"]["clusterIP"]
    assert len(set(answered_by(poll(lab, "client", cluster_ip, 80, 20)))) == 1


def test_agent_kill_9_and_restart_keeps_connections_and_rewrites_nothing(lab):
    node1 = sorted(lab.state.nodes)[0]
    cluster_ip = service_of(lab, "web")["spec"]["clusterIP"]
    tcp = stream(lab, "client", "tcp", cluster_ip, 80)   # established: it has had an answer
    compiled = open(lab.agent_log(node1)).read().count("compiled in")
    lab.stop_agent(node1, sig=signal.SIGKILL)
    lab.start_agent(node1)   # returns once it serves CNI: after it loaded the programs and the proxy started
    summary = stop_stream(tcp)   # its last line was answered after the restart
    assert summary["error"] is None and summary["answered"] == summary["sent"] > 1, summary
    log = open(lab.agent_log(node1)).read()
    assert log.count("compiled in") == compiled + 1, log[-3000:]   # this log is the restarted agent's too
    assert "kept na_connect4, na_sendmsg4, na_recvmsg4, na_getpeername4" in log.split("compiled in")[-1]
    wait_for(lambda: "full sync" in open(lab.agent_log(node1)).read().split("compiled in")[-1],
             what="the restarted agent's first sync")
    # that agent programmed everything there is now (a NodePort on an address that appeared after the
    # first agent's last full sync included); a second restart finds all of it and writes nothing
    lab.stop_agent(node1, sig=signal.SIGKILL)
    lab.start_agent(node1)
    wait_for(lambda: "full sync" in open(lab.agent_log(node1)).read().split("compiled in")[-1],
             what="the second restarted agent's first sync")
    assert "0 map entries written" in open(lab.agent_log(node1)).read().split("compiled in")[-1]
    assert len(set(answered_by(poll(lab, "client", cluster_ip, 80, 20)))) == 2



def test_no_agent_maps_the_compiler(lab):
    """bcc and LLVM compile in a child of the agent that has exited (ebpf/compiler.py): the
    agents serving this lab map none of them (issue 31: 227 MiB at 10k Services with them)."""
    from tests.netns.ebpf_fixtures import compiler_mappings
    assert compiler_mappings("self"), "the check sees LLVM where it is: this process imported bcc"
    for name, node in sorted(lab.state.nodes.items()):
        with open(f"/proc/{node.agent_pid}/cmdline") as cmdline:
            assert "run" in cmdline.read().split("\0"), name   # the agent itself, not a wrapper
        assert compiler_mappings(node.agent_pid) == set(), name


def test_metrics_show_map_fill_and_sync_durations(lab):
    node1 = sorted(lab.state.nodes)[0]
    text = lab.exec(node1, [sys.executable, "-c", "import urllib.request; print(urllib.request.urlopen("
                                                  "'http://127.0.0.1:10249/metrics', timeout=10).read().decode())"],
                    timeout=30).stdout
    fill = {m.group(1): int(m.group(2)) for m in re.finditer(r'^netagent_proxy_bpf_map_entries{map="(\w+)"} (\d+)$',
                                                              text, re.M)}
    pinned = json.loads(lab.exec(node1, [sys.executable, "-m", "netagent.cli", "status", "bpf", "--json",
                                         "--bpf-root", lab.bpf_root(node1)]).stdout)["maps"]
    assert fill["na_svc"] == len(backends_on(lab, node1)) > 0, fill
    for owned in ("na_svc", "na_slots", "na_setname", "na_lbsrc", "na_config"):   # the agent's, not the LRUs
        assert fill[owned] == next(m["entries"] for m in pinned if m["name"] == owned), (owned, fill, pinned)
    assert re.search(r'^netagent_proxy_bpf_map_max_entries{map="na_svc"} [1-9]', text, re.M), text
    assert re.search(r"^kubeproxy_sync_full_proxy_rules_duration_seconds_count [1-9]", text, re.M), text


def test_node_port_from_outside_reaches_local_and_remote_endpoints(lab):
    node_port = service_of(lab, "web-external")["spec"]["ports"][0]["nodePort"]
    for node in sorted(lab.state.nodes):
        results = poll(lab, "internet", lab.state.nodes[node].address, node_port, 20)
        assert set(answered_by(results)) == {"web-1", "web-2"}, (node, results)


def test_external_traffic_policy_local_keeps_the_client_address(lab):
    node1 = sorted(lab.state.nodes)[0]
    node_port = service_of(lab, "web-local")["spec"]["ports"][0]["nodePort"]
    results = poll(lab, "internet", lab.state.nodes[node1].address, node_port, 10)
    assert answered_by(results) == ["web-1"] * 10, results
    assert {answer.split()[1] for answer, _ in results} == {lab.status()["internet"]["address"]}


def test_rolling_the_endpoints_under_load_loses_no_connection(lab):
    node1, node2 = sorted(lab.state.nodes)
    lab.add_pod("web-3", node=node2, labels={"app": "web"}, ports={"http": WEB_PORT})
    leaving = serve(lab, "web-3", "tcp", WEB_PORT, lifetime=120, named=True)
    try:
        programmed(lab, node1, f"{service_of(lab, 'web')['spec']['clusterIP']}:80/TCP",
                   {pod_ips(lab)[p] for p in ("web-1", "web-2", "web-3")})
        roll_endpoints_under_load(lab, leaving="web-3", joining={"web-4": node1, "web-5": node2})
    finally:
        leaving.stop()


def test_a_pod_outside_the_cgroup_reaches_services_through_its_host_veth(lab):
    """The socket load balancer does not see these clients (they run in a pod's namespace but
    not in the node's cgroup): `--bpf-pod-veths` translates their packets on the pod's host
    veth. web-1 is a backend of its own services: when it picks itself (a hairpin) it sees the
    service address as the source, otherwise every backend sees the pod's address."""
    node1 = sorted(lab.state.nodes)[0]
    node_port = service_of(lab, "web-external")["spec"]["ports"][0]["nodePort"]
    ips = pod_ips(lab)
    for client in ("client", "web-1"):
        for address, port in ((service_of(lab, "web")["spec"]["clusterIP"], 80),
                              (lab.state.nodes[node1].address, node_port)):   # its own node's NodePort
            out = subprocess.run([*namespaces.exec_prefix(lab.netns_of(client)), sys.executable, "-m",
                                  "tests.cluster.traffic", "poll-tcp", address, str(port), "20"],
                                 capture_output=True, text=True, timeout=120, cwd=ROOT)
            results = json.loads(out.stdout or "[]")
            assert set(answered_by(results)) == {"web-1", "web-2"}, (client, address, results, out.stderr)
            seen = {(answer.split()[0], answer.split()[1]) for answer, _ in results}
            assert seen == {("web-2", ips[client]), ("web-1", ips[client] if client != "web-1" else address)}, \
                (client, address, seen)


def test_the_tc_path_refuses_a_service_without_endpoints_at_once(lab):
    """A SYN to an empty service is answered with a reset from the service address: from the
    internet (the underlay's program) and from a pod outside the cgroup (its veth's)."""
    node1 = sorted(lab.state.nodes)[0]
    lab.api().apply(manifest("nobody-external", selector={"app": "nobody"}, type="NodePort", ports=[http_port()]))
    node_port = service_of(lab, "nobody-external")["spec"]["ports"][0]["nodePort"]
    address = lab.state.nodes[node1].address
    serving(lab, node1, {f"{address}:{node_port}/TCP": set()})
    try:
        for pod, target in (("internet", (address, node_port)),
                            ("client", (service_of(lab, "nobody")["spec"]["clusterIP"], 80))):
            results, retransmitted = refusals(lab, pod, *target, 3, in_cgroup=False)
            assert len(results) == 3 and all("ConnectionRefusedError" in answer for answer, _ in results) \
                and retransmitted == 0, (target, results, retransmitted)
    finally:
        lab.api().delete("v1", "Service", "nobody-external", namespace="default")
        wait_for(lambda: f"{address}:{node_port}/TCP" not in backends_on(lab, node1), what="nobody-external gone")
