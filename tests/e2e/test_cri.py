"""End-to-end: pods made as kubelet makes them, through containerd 1.6's CRI plugin.

This file owns the tests of the kubelet's path to netagent: the test speaks CRI (`runtime.v1`)
to a throwaway containerd (`cri_harness.CriNode`), whose CRI plugin calls the first conflist
of its CNI config directory. That conflist is the one `netagent cni install` writes, with
the reference `portmap` and `bandwidth` plugins chained after it as a cluster that serves
hostPorts and bandwidth annotations does; the static shim relays to `netagent run --cni-only` in the node's namespace.

* `test_run_pod_sandbox_gets_address_from_netagent`: RunPodSandbox returns a ready sandbox
  whose address (PodSandboxStatus) is the one on the pod's eth0, from the pod subnet, reached
  by packets from the node; the plugin saw the pod's K8S_* CNI_ARGS.
* `test_host_port_through_chained_portmap`: a pod's hostPort (CRI PortMapping -> the
  `portMappings` capability) forwards a TCP connection from another namespace, sent to the
  node's address, to a server in the pod's network namespace.
* `test_bandwidth_annotations_shape_the_pod`: the pod's bandwidth annotations (-> the
  `bandwidth` capability) put token buckets on its host-side veth and on an ifb.
* `test_run_pod_sandbox_without_agent_fails_cleanly_then_retry_succeeds`: with no agent
  listening, RunPodSandbox fails with the shim's reason and containerd undoes the sandbox;
  the DEL it makes is journaled by the shim and carried out when the agent starts; kubelet's
  retry then succeeds.
* `test_concurrent_pods_get_distinct_addresses_and_reach_each_other`: eight RunPodSandbox
  at once (kubelet starts a node's pods in parallel), then eight releases at once.
* Every test ends with StopPodSandbox + RemovePodSandbox and asserts that nothing is left:
  no veth or ifb, no IPAM reservation, no pod network namespace (mount or file), no portmap
  rule, no sandbox; CNI DEL ran on stop and again, with the netns gone, on remove.
"""
from __future__ import annotations

import importlib
import ipaddress
import json
import secrets
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.containerd_support import RUN_PREFIX
from tests.e2e.cri_harness import CriNode, cri_api
from tests.e2e.oci_image import build_pause_image
from tests.e2e.netagent_support import (NETAGENT, NETAGENT_MISSING, REFERENCE_PLUGINS, agent_in, bridge_name,
                                        chain_reference_plugins, install_netagent, missing_reference_plugins,
                                        reservations, settle)

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not NETAGENT.exists(), reason=NETAGENT_MISSING)]

SUBNET = ipaddress.ip_network("10.88.11.0/24")
GATEWAY = "10.88.11.1"


def _or_skip(made):
    """The harness returns the reason (a string) instead when this machine cannot make it."""
    if isinstance(made, str):
        pytest.skip(made)
    return made


@pytest.fixture(scope="session")
def cri(e2e_prerequisites, tmp_path_factory):
    return _or_skip(cri_api(tmp_path_factory.mktemp("cri-stubs")))


@pytest.fixture(scope="session")
def pause_image(e2e_prerequisites, tmp_path_factory):
    return _or_skip(build_pause_image(tmp_path_factory.mktemp("pause-image")))


class Netagent:
    """The test's CNI directories with netagent installed, and what to check them by."""

    def __init__(self, tmp_path: Path):
        missing = missing_reference_plugins()
        if missing:
            pytest.skip(f"reference plugins {missing} missing in {REFERENCE_PLUGINS} "
                        f"(Debian package containernetworking-plugins)")
        self.bin_dir, self.conf_dir = tmp_path / "bin", tmp_path / "conf"
        self.data_dir = tmp_path / "ipam"
        self.data_dir.mkdir()
        self.socket = tmp_path / "run" / "cni.sock"
        conflist = install_netagent(bin_dir=self.bin_dir, conf_dir=self.conf_dir, subnet=str(SUBNET),
                                    data_dir=self.data_dir, socket_path=self.socket)
        self.bridge = bridge_name(conflist)
        chain_reference_plugins(self.bin_dir, conflist)


def grpc_error() -> type[Exception]:
    """The exception a failed call raises (grpc.RpcError, with code() and details())."""
    return importlib.import_module("grpc").RpcError


def _node(tmp_path, cri, pause_image, netagent: Netagent) -> CriNode:
    return CriNode(api=cri, cni_bin_dir=netagent.bin_dir, cni_conf_dir=netagent.conf_dir,
                   image=pause_image, record_cni_calls=True, log_dir=tmp_path / "logs")


def _assert_released(node: CriNode, netagent: Netagent, sandboxes, *, own_links=()) -> None:
    """After StopPodSandbox + RemovePodSandbox: nothing of the pods is left on the node
    (`own_links`: the test's own links on the node, not the pods')."""
    settle(netagent.socket.parent / "pending-del")
    ids = [s.id for s in sandboxes]
    assert node.list_pods() == []
    leftover = [l for l in node.links() if l.name not in own_links and
                (l.kind in ("veth", "ifb") or (l.name.startswith("na") and l.name != netagent.bridge))]
    assert leftover == [], leftover
    assert reservations(netagent.data_dir, ids) == [], sorted(netagent.data_dir.rglob("*"))
    assert node.netns_mounts() == [], "pod network namespaces still mounted"
    # portmap makes one CNI-DN-<hash> chain per pod with hostPorts, removed by its DEL.
    nat = node.netns_run(["iptables-save", "-t", "nat"]).stdout
    assert "CNI-DN-" not in nat, nat
    netns_dir = node.tmp_dir / "state" / "io.containerd.grpc.v1.cri" / "netns"
    assert not netns_dir.exists() or list(netns_dir.iterdir()) == [], sorted(netns_dir.iterdir())
    calls = [c for c in node.cni_calls() if c.container_id in ids]
    assert all(c.exit_code == 0 for c in calls), calls
    for sandbox in sandboxes:
        # StopPodSandbox: DEL while the netns exists; RemovePodSandbox: DEL again, the netns
        # gone (CNI_NETNS empty), which must succeed too.
        mine = [(c.command, bool(c.netns)) for c in calls
                if c.container_id == sandbox.id and c.plugin == "netagent"]
        assert mine == [("ADD", True), ("DEL", True), ("DEL", False)], mine


def test_run_pod_sandbox_gets_address_from_netagent(tmp_path, cri, pause_image):
    netagent = Netagent(tmp_path)
    with _node(tmp_path, cri, pause_image, netagent) as node, \
            agent_in(node, netagent.socket, tmp_path / "agent.log"):
        sandbox = node.run_pod("web")
        status, info = node.status(sandbox)
        assert status.state == cri.pb.SANDBOX_READY
        address = ipaddress.ip_address(status.network.ip)
        assert address in SUBNET and str(address) != GATEWAY, status.network

        # The address CRI reports is the one on the pod's eth0, with the pod subnet's prefix.
        inside = subprocess.run([*node.pod_exec_argv(sandbox), "ip", "-json", "-4", "addr", "show", "eth0"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
        assert [(a["local"], a["prefixlen"]) for a in json.loads(inside)[0]["addr_info"]] == \
            [(str(address), SUBNET.prefixlen)]
        ping = node.netns_run(["ping", "-c", "1", "-W", "2", str(address)], check=False)
        assert ping.returncode == 0, ping.stdout + ping.stderr

        # containerd called the first conflist with the pod's Kubernetes arguments.
        add = next(c for c in node.cni_calls() if c.plugin == "netagent" and c.command == "ADD")
        args = dict(kv.split("=", 1) for kv in add.args.split(";"))
        assert args == {"IgnoreUnknown": "1", "K8S_POD_NAMESPACE": "default", "K8S_POD_NAME": "web",
                        "K8S_POD_INFRA_CONTAINER_ID": sandbox.id, "K8S_POD_UID": sandbox.uid}, add
        assert add.container_id == sandbox.id and add.ifname == "eth0"
        assert add.netns == node.pod_netns_path(sandbox) and add.netns in node.netns_mounts()
        assert info["pid"] > 0

        node.stop_pod(sandbox)
        assert node.status(sandbox)[0].state == cri.pb.SANDBOX_NOTREADY
        node.remove_pod(sandbox)
        _assert_released(node, netagent, [sandbox])
        print(f"RunPodSandbox {sandbox.run_seconds * 1000:.1f} ms, timings (s):",
              {k: round(v, 3) for k, v in node.timings.items()})


_SERVER = """
import socket, sys
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", int(sys.argv[1])))
srv.listen(1)
print("listening", flush=True)
srv.settimeout(30)
conn, peer = srv.accept()
conn.sendall(("pod saw " + peer[0]).encode())
conn.close()
"""

_CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10) as s:
    print(s.recv(100).decode())
"""


class _Client:
    """A namespace outside the node, linked to it by a veth: where a hostPort user connects from."""

    def __init__(self, node: CriNode, node_address: str, client_address: str):
        self.node, self.netns = node, f"{RUN_PREFIX}-client-{secrets.token_hex(3)}"
        self.node_address, self.address = node_address, client_address
        self.uplink = "uplink"  # the node's end of the veth

    def __enter__(self) -> _Client:
        subprocess.run(["ip", "netns", "add", self.netns], check=True, timeout=10)
        try:
            # Made in the node namespace, one end moved: the root namespace never sees either.
            self.node.netns_run(["ip", "link", "add", self.uplink, "type", "veth", "peer", "name", "eth0",
                                 "netns", self.netns])
            self.node.netns_run(["ip", "addr", "add", f"{self.node_address}/24", "dev", self.uplink])
            self.node.netns_run(["ip", "link", "set", self.uplink, "up"])
            self.node.netns_run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])  # the node's own
            for cmd in (["ip", "addr", "add", f"{self.address}/24", "dev", "eth0"],
                        ["ip", "link", "set", "eth0", "up"], ["ip", "link", "set", "lo", "up"]):
                subprocess.run(["ip", "netns", "exec", self.netns, *cmd], check=True, timeout=10)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["ip", "netns", "del", self.netns], timeout=10, check=False)

    def connect(self, port: int) -> subprocess.CompletedProcess:
        return subprocess.run(["ip", "netns", "exec", self.netns, sys.executable, "-c", _CLIENT,
                               self.node_address, str(port)], capture_output=True, text=True, timeout=30)


def _hostport_rules(node: CriNode, port: int) -> list[str]:
    rules = node.netns_run(["iptables-save", "-t", "nat"]).stdout.splitlines()
    return [r for r in rules if f"--dport {port}" in r]


def test_host_port_through_chained_portmap(tmp_path, cri, pause_image):
    netagent = Netagent(tmp_path)
    host_port, container_port = 30080, 8080
    with _node(tmp_path, cri, pause_image, netagent) as node, \
            agent_in(node, netagent.socket, tmp_path / "agent.log"), \
            _Client(node, "192.168.211.1", "192.168.211.2") as client:
        sandbox = node.run_pod("hostport", port_mappings=[(container_port, host_port)])
        pod_ip = node.status(sandbox)[0].network.ip
        rules = _hostport_rules(node, host_port)
        assert rules and any("CNI-DN-" in r for r in rules), "portmap wrote no DNAT rule for the hostPort"

        server = subprocess.Popen([*node.pod_exec_argv(sandbox), sys.executable, "-c", _SERVER,
                                   str(container_port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        try:
            assert server.stdout.readline().strip() == "listening", server.stderr.read()
            reply = client.connect(host_port)
            assert reply.returncode == 0, reply.stderr
            # DNAT to the pod, no SNAT: the pod sees the client's own address.
            assert reply.stdout.strip() == f"pod saw {client.address}"
            assert server.wait(timeout=10) == 0
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()

        node.stop_pod(sandbox)
        node.remove_pod(sandbox)
        assert _hostport_rules(node, host_port) == [], "portmap's DEL left its rules"
        after = client.connect(host_port)  # the node itself refuses: no DNAT any more
        assert after.returncode != 0 and "ConnectionRefusedError" in after.stderr, after.stderr
        _assert_released(node, netagent, [sandbox], own_links=[client.uplink])
        print(f"RunPodSandbox with a hostPort {sandbox.run_seconds * 1000:.1f} ms to {pod_ip}")


def _tbf_rates(node: CriNode) -> dict[str, int]:
    """Token-bucket rates (bytes/s) on the node's links, by link kind: "veth" (the pod's
    host-side end: traffic into the pod) and "ifb" (where its egress is redirected)."""
    kinds = {l.name: l.kind for l in node.links()}
    qdiscs = json.loads(node.netns_run(["tc", "-json", "qdisc", "show"]).stdout or "[]")
    return {kinds.get(q["dev"], "?"): q["options"]["rate"] for q in qdiscs if q["kind"] == "tbf"}


def test_bandwidth_annotations_shape_the_pod(tmp_path, cri, pause_image):
    netagent = Netagent(tmp_path)
    with _node(tmp_path, cri, pause_image, netagent) as node, \
            agent_in(node, netagent.socket, tmp_path / "agent.log"):
        # kubelet leaves the annotations to the runtime, which passes the `bandwidth` capability.
        sandbox = node.run_pod("shaped", annotations={"kubernetes.io/ingress-bandwidth": "10M",
                                                      "kubernetes.io/egress-bandwidth": "20M"})
        assert _tbf_rates(node) == {"veth": 10_000_000 // 8, "ifb": 20_000_000 // 8}
        pod_ip = node.status(sandbox)[0].network.ip
        ping = node.netns_run(["ping", "-c", "1", "-W", "2", pod_ip], check=False)
        assert ping.returncode == 0, ping.stdout + ping.stderr  # shaped, still connected

        node.stop_pod(sandbox)
        node.remove_pod(sandbox)
        assert [l for l in node.links() if l.kind == "ifb"] == [], "bandwidth's DEL left its ifb"
        _assert_released(node, netagent, [sandbox])


def test_run_pod_sandbox_without_agent_fails_cleanly_then_retry_succeeds(tmp_path, cri, pause_image):
    netagent = Netagent(tmp_path)
    journal = netagent.socket.parent / "pending-del"
    with _node(tmp_path, cri, pause_image, netagent) as node:
        # No agent yet (a node whose DaemonSet pod is still starting): the shim fails with
        # CNI error 11 "try again later" and the reason; containerd undoes the sandbox, calling
        # DEL, which the shim journals for the agent and acknowledges.
        with pytest.raises(grpc_error()) as failure:
            node.run_pod("early")
        details = failure.value.details()
        assert "netagent agent is not running" in details and str(netagent.socket) in details, details
        failed = [c for c in node.cni_calls() if c.plugin == "netagent"]
        assert [(c.command, c.exit_code != 0) for c in failed][:2] == [("ADD", True), ("DEL", False)], failed
        assert node.list_pods() == [] and node.netns_mounts() == []
        assert [l for l in node.links() if l.kind == "veth"] == []
        assert [p.suffix for p in journal.iterdir()] == [".wire"]

        with agent_in(node, netagent.socket, tmp_path / "agent.log"):
            settle(journal)  # the agent carried out the journaled DEL when it started
            # kubelet retries the pod, now served.
            sandbox = node.run_pod("early")
            assert ipaddress.ip_address(node.status(sandbox)[0].network.ip) in SUBNET
            node.stop_pod(sandbox)
            node.remove_pod(sandbox)
            _assert_released(node, netagent, [sandbox])
            assert reservations(netagent.data_dir, [failed[0].container_id]) == []


def test_concurrent_pods_get_distinct_addresses_and_reach_each_other(tmp_path, cri, pause_image):
    netagent = Netagent(tmp_path)
    names = [f"pod{i}" for i in range(8)]
    with _node(tmp_path, cri, pause_image, netagent) as node, \
            agent_in(node, netagent.socket, tmp_path / "agent.log"):
        # kubelet starts a node's pods in parallel (one worker per pod).
        with ThreadPoolExecutor(len(names)) as pool:
            sandboxes = list(pool.map(node.run_pod, names))
        addresses = [node.status(s)[0].network.ip for s in sandboxes]
        assert len(set(addresses)) == len(names), addresses
        assert all(ipaddress.ip_address(a) in SUBNET and a != GATEWAY for a in addresses), addresses
        for sandbox, peer in zip(sandboxes, addresses[1:] + addresses[:1]):
            ping = subprocess.run([*node.pod_exec_argv(sandbox), "ping", "-c", "1", "-W", "2", peer],
                                  capture_output=True, text=True, timeout=10)
            assert ping.returncode == 0, f"{sandbox.name} -> {peer}: {ping.stdout}{ping.stderr}"

        def release(sandbox):
            node.stop_pod(sandbox)
            node.remove_pod(sandbox)

        with ThreadPoolExecutor(len(names)) as pool:
            list(pool.map(release, sandboxes))
        _assert_released(node, netagent, sandboxes)
        print("RunPodSandbox, 8 at once (ms):", sorted(round(s.run_seconds * 1000) for s in sandboxes))
