"""Services in a lab cluster, in iptables and in nftables mode: real connections from pods and
from outside, with the same assertions in both.

One 2-node vxlan lab per proxy mode (the module fixture is parameterised over the modes), with the EndpointSlice controller deriving slices
from the pods' labels exactly as `kubectl apply` of a plain Service would in a cluster.
Servers answer with their pod's name and the peer address they saw, so each test can say
which endpoint answered and whether the proxy masqueraded. `roll_endpoints_under_load`,
`backends_on` and `settled` work in any proxy mode (the eBPF module uses them too); what a
test must read of the kernel itself (a restarted agent's rules, what a deleted service leaves)
it reads through `proxy_ruleset`, the one place that knows each mode's kernel spelling.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from netagent.kernel import namespaces, owned
from tests.cluster.lab_tools import ROOT, lab_cluster, serve, stop_stream, stream, syn_retransmits, traffic, wait_for

WEB_PORT, UDP_PORT = 8080, 5353


def manifest(name: str, *, selector: dict, ports: list, **spec) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
            "spec": {"selector": selector, "ports": ports, **spec}}


def http_port(**extra) -> dict:
    return {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP", **extra}


def service_of(lab, name: str) -> dict:
    return lab.api().get("v1", "Service", name, namespace="default")


def slice_addresses(lab, name: str) -> set[str]:
    slices = lab.api().list("discovery.k8s.io/v1", "EndpointSlice", namespace="default",
                            label_selector=f"kubernetes.io/service-name={name}")
    return {e["addresses"][0] for s in slices for e in s.get("endpoints") or []
            if (e.get("conditions") or {}).get("ready", True)}


def poll(lab, pod: str, address: str, port: int, count: int) -> list:
    return json.loads(traffic(lab, pod, "poll-tcp", address, str(port), str(count)).stdout)


def answered_by(results: list) -> list[str]:
    return [answer.split()[0] for answer, _ in results if not answer.startswith("error")]


def programmed(lab, node: str, service: str, expected: set[str], port: int = WEB_PORT) -> None:
    """Wait until the slices list `expected` and the node's cluster IP entries of `service` send to
    exactly those endpoints on `port` (read back by `netagent status services`, any proxy mode)."""
    wait_for(lambda: slice_addresses(lab, service) == expected, what=f"slices of {service}")
    wanted = {f"{ip}:{port}" for ip in expected}

    def entries_ready() -> bool:
        entries = [s for s in listed_on(lab, node) if s["kind"] == "ClusterIP"
                   and s["name"].startswith(f"default/{service}:")]
        return bool(entries) and all(set(s["backends"]) == wanted for s in entries)
    wait_for(entries_ready, what=f"the cluster IP of {service} on {node} to send to {sorted(wanted)}")


def listed_on(lab, node: str) -> list[dict]:
    """`netagent status services --json` on `node`: each entry point it has programmed, as
    {"name", "address", "kind", "backends"}, read back from the kernel (any proxy mode)."""
    argv = [sys.executable, "-m", "netagent.cli", "status", "services", "--json"]
    if lab.state.proxy_mode == "ebpf":
        argv += ["--bpf-root", lab.bpf_root(node)]
    out = lab.exec(node, argv).stdout
    return json.loads(out)["services"] if out else []


def backends_on(lab, node: str) -> dict[str, set[str]]:
    """Each service address `node` balances ("10.96.0.10:80/TCP") -> the endpoint addresses it
    sends to, read back from the kernel by `netagent status services` (any proxy mode)."""
    found: dict[str, set[str]] = {}
    for service in listed_on(lab, node):
        found.setdefault(service["address"], set()).update(b.split(":")[0] for b in service["backends"])
    return found


def node_port_on(lab, node: str, node_port: int) -> bool:
    """Whether `node` has programmed TCP `node_port` with at least one endpoint."""
    return any(address.endswith(f":{node_port}/TCP") and endpoints
               for address, endpoints in backends_on(lab, node).items())


def proxy_ruleset(lab, node: str) -> list[str]:
    """The proxy's kernel state on `node` in a form that compares equal when nothing was written:
    iptables mode, our nat chains and every nat rule (`iptables-save`); nftables mode, every
    object of `table ip netagent` (`nft -j`) without handles, counter values, or the elements
    of the sets with timeouts the packet path fills (ClientIP affinity: clients seen)."""
    if lab.state.proxy_mode == "iptables":
        saved = lab.exec(node, ["iptables-save", "-t", "nat"], check=True).stdout.splitlines()
        return sorted([line.split()[0] for line in saved if line.startswith(f":{owned.CHAIN_PREFIX}")]
                      + [line for line in saved if line.startswith("-A")])
    assert lab.state.proxy_mode == "nftables", lab.state.proxy_mode
    listed = lab.exec(node, ["nft", "-j", "list", "table", "ip", owned.NFT_PROXY_TABLE], check=True).stdout

    def steady(value):
        if isinstance(value, dict):
            return {key: steady(inner) for key, inner in value.items() if key not in ("handle", "packets", "bytes")}
        return [steady(inner) for inner in value] if isinstance(value, list) else value
    objects = []
    for item in json.loads(listed)["nftables"]:
        if "set" in item and "timeout" in item["set"].get("flags", ()):   # nft lists "dynamic" as this
            item["set"].pop("elem", None)
        objects.append(json.dumps(steady(item), sort_keys=True))
    return sorted(objects)


def settled(lab) -> None:
    """Wait until every node sends only to pods that exist (after pods went away), or to the API
    server (the endpoint of `default/kubernetes`)."""
    api_server = lab.api_url.split("//")[1].rsplit(":", 1)[0]
    for node in sorted(lab.state.nodes):
        def only_live_targets() -> bool:
            live = set(pod_ips(lab).values()) | {api_server}
            return all(found <= live for found in backends_on(lab, node).values())
        wait_for(only_live_targets, what=f"{node}'s services to forget removed pods")


def serving(lab, node: str, expected: dict[str, set[str]]) -> None:
    """Wait until `node` balances each service address ("10.96.0.10:80/TCP") of `expected` to its
    set of endpoint addresses (an empty set: the service refuses)."""
    def matches() -> bool:
        found = backends_on(lab, node)
        return all(found.get(address) == endpoints for address, endpoints in expected.items())
    wait_for(matches, what=f"{node} to serve {expected}")


def refusals(lab, pod: str, address: str, port: int, count: int, *, in_cgroup: bool = True) -> tuple[list, int]:
    """`count` connections from `pod` (`in_cgroup` False: outside its node's cgroup in ebpf mode),
    and how many SYNs its namespace retransmitted meanwhile (0: every refusal came at once)."""
    prefix = lab.exec_prefix(pod) if in_cgroup else namespaces.exec_prefix(lab.netns_of(pod))
    before = syn_retransmits(prefix)
    out = subprocess.run([*prefix, sys.executable, "-m", "tests.cluster.traffic", "poll-tcp", address, str(port),
                          str(count)], capture_output=True, text=True, timeout=120, cwd=ROOT, check=True).stdout
    return json.loads(out), syn_retransmits(prefix) - before


@pytest.fixture(scope="module", params=["iptables", "nftables"])
def lab(request):
    with lab_cluster(nodes=2, mode="vxlan", proxy_mode=request.param) as lab:
        node1, node2 = sorted(lab.state.nodes)
        lab.add_pod("web-1", node=node1, labels={"app": "web", "tier": "front"}, ports={"http": WEB_PORT})
        lab.add_pod("web-2", node=node2, labels={"app": "web"}, ports={"http": WEB_PORT})
        lab.add_pod("web-3", node=node1, labels={"app": "web"}, ports={"http": WEB_PORT})
        lab.add_pod("client", node=node1)
        servers = [serve(lab, pod, "tcp", WEB_PORT, lifetime=600, named=True) for pod in ("web-1", "web-2", "web-3")]
        lab.api().apply(manifest("web", selector={"app": "web"}, ports=[http_port()]))
        lab.api().apply(manifest("web-sticky", selector={"app": "web"}, ports=[http_port()],
                                 sessionAffinity="ClientIP",
                                 sessionAffinityConfig={"clientIP": {"timeoutSeconds": 300}}))
        lab.api().apply(manifest("web-local", selector={"tier": "front"}, type="LoadBalancer",
                                 externalTrafficPolicy="Local", ports=[http_port()]))
        lab.api().apply(manifest("web-external", selector={"app": "web"}, type="NodePort", ports=[http_port()]))
        lab.api().apply(manifest("nobody", selector={"app": "nobody"}, ports=[http_port()]))
        pods = {p["name"]: p["ip"] for p in lab.status()["pods"]}
        node_port = service_of(lab, "web-external")["spec"]["ports"][0]["nodePort"]
        web = {pods["web-1"], pods["web-2"], pods["web-3"]}
        for node in (node1, node2):   # every service of the module, before any test relies on one
            programmed(lab, node, "web", web)
            programmed(lab, node, "web-local", {pods["web-1"]})
            wait_for(lambda: node_port_on(lab, node, node_port), what=f"the NodePort {node_port} on {node}")
            serving(lab, node, {f"{service_of(lab, name)['spec']['clusterIP']}:80/TCP": endpoints
                                for name, endpoints in (("web-sticky", web), ("web-external", web), ("nobody", set()))})
        try:
            yield lab
        finally:
            for server in servers:
                server.stop()


def pod_ips(lab) -> dict:
    return {p["name"]: p["ip"] for p in lab.status()["pods"]}


def node_address(lab, name: str) -> str:
    return lab.state.nodes[name].address


def test_cluster_ip_reaches_every_endpoint_and_keeps_the_pod_source(lab):
    cluster_ip = service_of(lab, "web")["spec"]["clusterIP"]
    results = poll(lab, "client", cluster_ip, 80, 40)
    assert set(answered_by(results)) == {"web-1", "web-2", "web-3"}, results
    assert {answer.split()[1] for answer, _ in results} == {pod_ips(lab)["client"]}


def test_node_port_from_outside_the_cluster(lab):
    node_port = service_of(lab, "web-external")["spec"]["ports"][0]["nodePort"]
    for node in sorted(lab.state.nodes):
        results = poll(lab, "internet", node_address(lab, node), node_port, 20)
        assert len(answered_by(results)) == 20 and set(answered_by(results)) <= {"web-1", "web-2", "web-3"}, results


def test_external_traffic_policy_local_keeps_the_client_address(lab):
    service = service_of(lab, "web-local")
    node1, node2 = sorted(lab.state.nodes)
    node_port = service["spec"]["ports"][0]["nodePort"]
    results = poll(lab, "internet", node_address(lab, node1), node_port, 10)
    assert answered_by(results) == ["web-1"] * 10, results
    assert {answer.split()[1] for answer, _ in results} == {lab.status()["internet"]["address"]}
    health_port = service["spec"]["healthCheckNodePort"]
    for node, code, local in ((node1, 200, 1), (node2, 503, 0)):
        out = lab.exec("internet", [sys.executable, "-c", (
            "import json,sys,urllib.request,urllib.error\n"
            f"try: r=urllib.request.urlopen('http://{node_address(lab, node)}:{health_port}/',timeout=5)\n"
            "except urllib.error.HTTPError as e: r=e\n"
            "print(r.status if hasattr(r,'status') else r.code, r.read().decode())")],
            ).stdout.split(" ", 1)
        assert int(out[0]) == code and json.loads(out[1])["localEndpoints"] == local, out


def test_session_affinity_pins_a_client(lab):
    cluster_ip = service_of(lab, "web-sticky")["spec"]["clusterIP"]
    answers = answered_by(poll(lab, "client", cluster_ip, 80, 15))
    assert len(answers) == 15 and len(set(answers)) == 1, answers


def test_a_service_without_endpoints_refuses_at_once(lab):
    cluster_ip = service_of(lab, "nobody")["spec"]["clusterIP"]
    ((answer, seconds),), retransmitted = refusals(lab, "client", cluster_ip, 80, 1)
    assert "ConnectionRefusedError" in answer and retransmitted == 0, (answer, seconds, retransmitted)


def test_hairpin_a_pod_reaches_itself_through_its_service(lab):
    cluster_ip = service_of(lab, "web-local")["spec"]["clusterIP"]  # web-1 is its only endpoint
    results = poll(lab, "web-1", cluster_ip, 80, 3)
    assert answered_by(results) == ["web-1"] * 3, results
    assert {answer.split()[1] for answer, _ in results} != {pod_ips(lab)["web-1"]}  # masqueraded


def test_udp_client_moves_to_the_new_endpoint_when_the_old_one_goes(lab):
    node1, node2 = sorted(lab.state.nodes)
    lab.add_pod("dns-1", node=node2, labels={"app": "dns"}, ports={"dns": (UDP_PORT, "UDP")})
    old = serve(lab, "dns-1", "udp", UDP_PORT, lifetime=120, named=True)
    try:
        lab.api().apply(manifest("dns", selector={"app": "dns"},
                                 ports=[{"name": "dns", "port": 53, "targetPort": "dns", "protocol": "UDP"}]))
        cluster_ip = service_of(lab, "dns")["spec"]["clusterIP"]
        programmed(lab, node1, "dns", {pod_ips(lab)["dns-1"]}, port=UDP_PORT)
        # at most 120 s; it ends 20 answers after dns-2's first (a client stuck on dns-1 never does)
        udp = stream(lab, "client", "udp", cluster_ip, 53, "--until", "dns-2")   # dns-1 has answered
        lab.add_pod("dns-2", node=node1, labels={"app": "dns"}, ports={"dns": (UDP_PORT, "UDP")}, ready=False)
        new = serve(lab, "dns-2", "udp", UDP_PORT, lifetime=120, named=True)
        lab.set_pod_ready("dns-2", ready=True)
        try:
            lab.remove_pod("dns-1")
            answers = stop_stream(udp, wait=180)
            names = [answer.split()[0] for _, answer in answers]
            assert names[0] == "dns-1" and names[-1] == "dns-2", names
            last_old = max(t for t, answer in answers if answer.startswith("dns-1"))
            first_new = min(t for t, answer in answers if answer.startswith("dns-2"))
            assert first_new > last_old, names
        finally:
            new.stop()
            lab.remove_pod("dns-2")
            settled(lab)
    finally:
        old.stop()


def test_rolling_the_endpoints_under_load_loses_no_connection(lab):
    node1, node2 = sorted(lab.state.nodes)
    roll_endpoints_under_load(lab, leaving="web-2", joining={"web-4": node1, "web-5": node2})


def roll_endpoints_under_load(lab, *, leaving: str, joining: dict[str, str]) -> None:
    """Long TCP connections through "web" stay up while the `joining` pods (name -> node) are
    added and `leaving` terminates; connections made during and after the change all succeed,
    and `leaving` is gone from the answers once the client's node has forgotten it. Any proxy
    mode: what is programmed is read back by `netagent status services`. Removes `leaving` and
    `joining` at the end and waits until every node has forgotten them."""
    cluster_ip = service_of(lab, "web")["spec"]["clusterIP"]
    client_node = lab.state.pods["client"].node
    before = slice_addresses(lab, "web")
    streams = [stream(lab, "client", "tcp", cluster_ip, 80) for _ in range(4)]   # each answered once
    new_servers = []
    try:
        for name, node in joining.items():
            lab.add_pod(name, node=node, labels={"app": "web"}, ports={"http": WEB_PORT}, ready=False)
            new_servers.append(serve(lab, name, "tcp", WEB_PORT, lifetime=120, named=True))
            lab.set_pod_ready(name, ready=True)  # the readiness probe passes once it listens
        lab.terminate_pod(leaving)  # terminating: serving, not ready; its network stays until finished
        during = poll(lab, "client", cluster_ip, 80, 20)  # new connections while the change propagates
        ips = pod_ips(lab)
        expected = (before - {ips[leaving]}) | {ips[name] for name in joining}
        wait_for(lambda: backends_on(lab, client_node).get(f"{cluster_ip}:80/TCP") == expected,
                 what=f"web's new endpoints on {client_node}")
        wait_for(lambda: not any(ips[leaving] in found for found in backends_on(lab, client_node).values()),
                 what=f"{leaving} out of every service on {client_node}")
        after = poll(lab, "client", cluster_ip, 80, 60)   # each of 4 endpoints misses 60 picks at 3e-8
        # up from before the change until now, every line answered, the last one after all of it
        summaries = [stop_stream(running) for running in streams]
        assert all(s["error"] is None and s["answered"] == s["sent"] > 1 for s in summaries), summaries
        assert len(answered_by(during)) == 20, during
        assert len(answered_by(after)) == 60 and leaving not in answered_by(after), after
        assert set(joining) <= set(answered_by(after)), after
    finally:
        for running in streams:
            running.stop()
        for server in new_servers:
            server.stop()
        for name in (leaving, *joining):  # the leaving pod's grace period ends: its network goes
            if name in lab.state.pods:
                lab.remove_pod(name)
        settled(lab)


def test_agent_restart_keeps_connections_and_traffic_through_services(lab):
    node1 = sorted(lab.state.nodes)[0]
    cluster_ip = service_of(lab, "web")["spec"]["clusterIP"]
    settled(lab)
    before = proxy_ruleset(lab, node1)
    tcp = stream(lab, "client", "tcp", cluster_ip, 80)   # established: it has had an answer
    lab.stop_agent(node1, sig=signal.SIGKILL)
    during = poll(lab, "client", cluster_ip, 80, 10)  # no agent on the node: the kernel keeps serving
    lab.start_agent(node1)
    after = poll(lab, "client", cluster_ip, 80, 10)
    summary = stop_stream(tcp)   # its last line was answered after the restart
    assert summary["error"] is None and summary["answered"] == summary["sent"] > 1, summary
    assert len(answered_by(during)) == 10 and len(answered_by(after)) == 10, (during, after)
    wait_for(lambda: proxy_ruleset(lab, node1) == before, what="the restarted agent's rules equal the ones it adopted")


def test_status_services_lists_what_is_programmed(lab):
    node1 = sorted(lab.state.nodes)[0]
    out = lab.exec(node1, [sys.executable, "-m", "netagent.cli", "status", "services", "--json"],
                   )
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)
    web = [s for s in listed["services"] if s["name"] == "default/web:http" and s["kind"] == "ClusterIP"]
    assert listed["mode"] == lab.state.proxy_mode and len(web) == 1
    assert set(web[0]["backends"]) >= {f"{pod_ips(lab)[p]}:{WEB_PORT}" for p in ("web-1", "web-3")}


def test_deleted_service_leaves_no_chain(lab):
    node1 = sorted(lab.state.nodes)[0]
    settled(lab)
    before = proxy_ruleset(lab, node1)
    lab.api().apply(manifest("short-lived", selector={"app": "web"}, ports=[http_port()]))
    address = f"{service_of(lab, 'short-lived')['spec']['clusterIP']}:80/TCP"
    wait_for(lambda: backends_on(lab, node1).get(address), what=f"short-lived balanced on {node1}")
    assert proxy_ruleset(lab, node1) != before    # what the service added, the deletion must remove
    lab.api().delete("v1", "Service", "short-lived", namespace="default")
    wait_for(lambda: address not in backends_on(lab, node1), what=f"short-lived gone from {node1}")
    wait_for(lambda: proxy_ruleset(lab, node1) == before, what=f"{node1}'s rules back to before short-lived")
