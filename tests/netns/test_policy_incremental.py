"""The one-pod path on the real kernel (`PolicyEngine.bind_pod` -> `PolicyDataplane.render_with_pod` + `apply`),
both dataplanes: a node namespace with real pods wired by our CNI plugin (routed mode), the
policy engine in this process writing the node's iptables/ipset or its `ip netagent-policy`
table. A pod bound by its ADD (and released by its DEL) is programmed alone, in the writes counted here (nft: one batch;
iptables: one iptables-restore, then its sets and KNOWN in one ipset restore), connects to the server that allows it on the
first SYN (no SYN retransmitted), a pod the policy does not allow is dropped, and then a full
sync, the kubelet's report and a node programmed from scratch agree: nothing more is written
and the kernel holds the same state either way.
"""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from netagent.infra.sync_runner import SyncKind
from netagent.kernel import namespaces, owned
from netagent.kernel.ipset.runner import IpsetRunner
from netagent.kernel.iptables.backend import IptablesBackend
from netagent.kernel.iptables.runner import IptablesRunner
from netagent.kernel.nftables.model import ElementWrite
from netagent.kernel.nftables.runner import NftRunner
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.engine import PolicyEngine, PolicySettings
from netagent.policy.iptables.dataplane import IptablesDataplane
from netagent.kernel.nftables import tables
from netagent.policy.nftables.dataplane import NftablesDataplane
from netagent.policy.shared import RenderSettings
from netagent.policy.nftables.render import TABLE
from tests.netns.policy_lab import SERVER
from tests.unit.policy.policy_objects import namespace, pod, policy
from tests.unit.policy.test_policy_incremental import comparable

SUBNET = "10.244.1.0/24"
CONNECT = r"""
import socket, sys
s = socket.socket(); s.settimeout(float(sys.argv[2]))
try:
    s.connect((sys.argv[1], 80)); print("connected")
except OSError as error:
    print("failed", type(error).__name__)
retrans = dict(zip(*[l.split() for l in open("/proc/net/netstat") if l.startswith("TcpExt:")]))["TCPSynRetrans"]
print(retrans)
"""
ISOLATE_SERVER = policy("x", "server", {"podSelector": {"matchLabels": {"app": "server"}},
                                        "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "client"}}}]}]})
ISOLATE_CLIENT = policy("x", "client", {"podSelector": {"matchLabels": {"role": "client"}},   # its ADD writes a chain
                                        "policyTypes": ["Ingress"]})


class CountingIptables(IptablesRunner):
    restores = 0

    def restore(self, *args, **kwargs):
        self.restores += 1
        return super().restore(*args, **kwargs)


class CountingIpset(IpsetRunner):
    writes = 0

    def _apply(self, **kwargs):
        self.writes += 1
        return super()._apply(**kwargs)


class CountingNft(NftRunner):
    batches = 0          # transactions: text batches and netlink element writes

    def apply(self, batch: str) -> None:
        self.batches += 1
        super().apply(batch)

    def apply_elements(self, write: ElementWrite) -> None:
        self.batches += 1
        super().apply_elements(write)


class Dataplane:
    def __init__(self, kind: str, node_netns: str) -> None:
        self.kind = kind
        prefix = namespaces.exec_prefix(node_netns)
        if kind == "nft":
            self.nft = CountingNft(node_netns)
            self.programmer: IptablesDataplane | NftablesDataplane = NftablesDataplane(self.nft)
        else:
            backend = IptablesBackend.NFT if kind == "iptables-nft" else IptablesBackend.LEGACY
            self.iptables = CountingIptables(backend=backend, exec_prefix=prefix)
            self.ipset = CountingIpset(exec_prefix=prefix)
            self.programmer = IptablesDataplane(iptables=self.iptables, ipset=self.ipset)

    def writes(self) -> tuple[int, ...]:
        return (self.nft.batches,) if self.kind == "nft" else (self.iptables.restores, self.ipset.writes)

    def state(self) -> object:
        if self.kind == "nft":
            return comparable(tables.read_table("ip", TABLE, self.nft.list_table("ip", TABLE)))
        table = self.iptables.table("filter")
        chains = {name: tuple(chain.rules) for name, chain in table.chains.items()
                  if name.startswith(owned.POLICY_PREFIX)}
        return chains, self.programmer.read_sets()

    def close(self) -> None:
        self.programmer.cleanup()
        if self.kind == "nft":
            self.nft.close()


def engine_for(dataplane: Dataplane, veths: dict[str, str]) -> PolicyEngine:
    engine = PolicyEngine(PolicySettings("node-1", RenderSettings(PodAttachment.ROUTED, local_cidrs=(SUBNET,))),
                          dataplane=dataplane.programmer, interface_of=lambda plan: veths.get(plan.ip))
    for recorder in (engine.namespaces, engine.pods, engine.policies):
        recorder.on_synced()
    engine.namespaces.on_add(namespace("x"))
    engine.policies.on_add(ISOLATE_SERVER)
    engine.policies.on_add(ISOLATE_CLIENT)
    return engine


def host_veth(lab_pod) -> str:
    return next(i["name"] for i in lab_pod.result["interfaces"] if "sandbox" not in i)


def connect(node, source: str, address: str, timeout: float) -> tuple[str, int]:
    lines = node.exec_in(source, [sys.executable, "-c", CONNECT, address, str(timeout)],
                         timeout=120).stdout.split("\n")
    return lines[0], int(lines[1])


@pytest.mark.parametrize("dataplane", ["iptables", "iptables-nft", "nft"])
def test_a_pod_bound_alone_connects_at_once_and_nothing_more_is_written(make_node, dataplane):
    node = make_node(mode=PodAttachment.ROUTED, with_agent=False, subnets=(SUBNET,))
    node.exec_in("node", ["sysctl", "-qw", "net.ipv4.ip_forward=1"], check=True)
    server, denied = node.add_pod("server"), node.add_pod("denied")
    veths = {server.ip: host_veth(server), denied.ip: host_veth(denied)}
    proc = subprocess.Popen([*namespaces.exec_prefix(server.netns_name), sys.executable, "-c", SERVER, "80"],
                            stdout=subprocess.PIPE, text=True)
    first = Dataplane(dataplane, node.node)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        engine = engine_for(first, veths)
        engine.pods.on_add(pod("x", "server", server.ip, {"app": "server"}))
        engine.pods.on_add(pod("x", "denied", denied.ip, {"role": "other"}))
        engine.pods.on_add(pod("x", "client", None, {"role": "client"}, phase="Pending"))   # scheduled
        engine.sync(SyncKind.FULL)

        client = node.add_pod("client")
        veths[client.ip] = host_veth(client)
        before = first.writes()
        outcome = engine.bind_pod("x", "client", (f"{client.ip}/24",), veths[client.ip],
                                  container_id=client.container_id, deadline=time.monotonic() + 60)
        assert outcome.programmed and outcome.incremental
        written = tuple(after - was for after, was in zip(first.writes(), before))
        # nft: one batch. iptables: one iptables-restore (the edits), then one ipset restore: the client
        # into the role=client set and KNOWN
        assert written == ((1,) if dataplane == "nft" else (1, 1))

        assert connect(node, "client", server.ip, 30) == ("connected", 0)      # the first SYN answered
        assert connect(node, "denied", server.ip, 2)[0] == "failed TimeoutError"     # dropped, not refused

        after_bind = first.writes()
        engine.sync(SyncKind.FULL)
        engine.pods.on_update(pod("x", "client", None, {"role": "client"}, phase="Pending"),
                              pod("x", "client", client.ip, {"role": "client"}))
        engine.sync(SyncKind.PARTIAL)                       # the kubelet's report of the same address
        engine.sync(SyncKind.FULL)
        assert first.writes() == after_bind and engine.last_report is not None and not engine.last_report.wrote
        incremental = first.state()

        before = first.writes()                           # the DEL: the client alone, out again
        outcome = engine.unbind_pod("x", "client", container_id=client.container_id, deadline=time.monotonic() + 60)
        assert outcome.programmed and outcome.incremental
        written = tuple(after - was for after, was in zip(first.writes(), before))
        assert written == ((1,) if dataplane == "nft" else (1, 1))     # iptables: KNOWN and the set, then chains
        after_unbind = first.writes()
        engine.sync(SyncKind.FULL)
        assert first.writes() == after_unbind
        assert connect(node, "client", server.ip, 2)[0] == "failed TimeoutError"    # closed: not in KNOWN
    finally:
        first.close()
        proc.kill()
        proc.wait()

    second = Dataplane(dataplane, node.node)     # the same node programmed with the client from the start
    try:
        engine = engine_for(second, veths)
        for name, lab_pod, labels in (("server", server, {"app": "server"}), ("denied", denied, {"role": "other"}),
                                      ("client", client, {"role": "client"})):
            engine.pods.on_add(pod("x", name, lab_pod.ip, labels))
        engine.sync(SyncKind.FULL)
        assert second.state() == incremental
    finally:
        second.close()
