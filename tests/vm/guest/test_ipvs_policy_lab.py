"""NetworkPolicy with the IPVS proxy, on a kernel that has IPVS (Debian's, inside the VM tier's guest).

IPVS takes a pod's connection to a cluster IP in INPUT and sends it, translated, out through
OUTPUT: FORWARD, where the per-pod chains hang, never sees it. The agent in `--proxy-mode
ipvs --network-policy` therefore also hooks filter OUTPUT for IPVS-forwarded packets
(netagent/policy/iptables/render.py). One node, pods on the CNI bridge (br_netfilter loaded, as on
Kubernetes nodes): `web` (the Service's only endpoint), `friend` and `stranger`. Real
connections, each check polled until the kernel enforces it (the agent programs
asynchronously; bounded waits, no timing asserts):
- before any policy, both clients reach the web Service (so a later refusal is the policy's);
- with web isolated to role=friend: friend reaches it through the cluster IP, stranger does
  not (nor at the pod address), and the node itself still does (its own connections pass);
- with friend isolated for egress (no rule): friend no longer reaches it through the cluster IP.
"""
import json
import sys
import time

from tests.cluster.lab_tools import lab_cluster, serve
from tests.netns.policy_lab import PROBE

PORT = 8080
ISOLATE_WEB = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": "web-from-friends", "namespace": "default"},
               "spec": {"podSelector": {"matchLabels": {"app": "web"}},
                        "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "friend"}}}]}]}}
ISOLATE_FRIEND_EGRESS = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                         "metadata": {"name": "friend-no-egress", "namespace": "default"},
                         "spec": {"podSelector": {"matchLabels": {"role": "friend"}}, "policyTypes": ["Egress"]}}


def reaches(lab, source: str, targets: dict[str, tuple[str, int]]) -> dict[str, bool]:
    jobs = [[name, address, "tcp", port] for name, (address, port) in targets.items()]
    done = lab.exec(source, [sys.executable, "-c", PROBE, json.dumps(jobs), "2"], timeout=120, check=True)
    return json.loads(done.stdout)


def becomes(lab, expected: dict[tuple[str, str], bool], targets: dict[str, tuple[str, int]], *,
            timeout: float = 90.0) -> None:
    """Until every (source, target) answers as `expected` says."""
    deadline = time.monotonic() + timeout
    while True:
        seen = {}
        for source in sorted({source for source, _ in expected}):
            answers = reaches(lab, source, {t: targets[t] for s, t in expected if s == source})
            seen.update({(source, target): answer for target, answer in answers.items()})
        if seen == expected:
            return
        assert time.monotonic() < deadline, f"expected {expected}, saw {seen}"
        time.sleep(1)


def test_policies_apply_to_ipvs_forwarded_service_connections(modprobe):
    modprobe("xt_ipvs", "xt_addrtype", "xt_set", "ip_set_hash_ip", "xt_physdev")
    with lab_cluster(nodes=1, mode="host-gw", proxy_mode="ipvs", network_policy=True) as lab:
        lab.add_pod("web", node="node-1", labels={"app": "web"}, ports={"http": PORT})
        lab.add_pod("friend", node="node-1", labels={"role": "friend"})
        lab.add_pod("stranger", node="node-1")
        server = serve(lab, "web", "tcp", PORT, lifetime=600, named=True)
        try:
            service = lab.api().apply({"apiVersion": "v1", "kind": "Service",
                                       "metadata": {"name": "web", "namespace": "default"},
                                       "spec": {"selector": {"app": "web"},
                                                "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
            web_ip = lab.state.pods["web"].ip
            targets = {"service": (service["spec"]["clusterIP"], 80), "pod": (web_ip, PORT)}
            open_all = {(client, target): True for client in ("friend", "stranger") for target in targets}
            becomes(lab, open_all, targets)

            lab.api().apply(ISOLATE_WEB)
            becomes(lab, {**open_all, ("stranger", "service"): False, ("stranger", "pod"): False}, targets)
            becomes(lab, {("node-1", "service"): True, ("node-1", "pod"): True}, targets)   # the node's own pass

            lab.api().apply(ISOLATE_FRIEND_EGRESS)
            becomes(lab, {("friend", "service"): False, ("friend", "pod"): False,
                          ("stranger", "service"): False}, targets)
        finally:
            server.stop()
