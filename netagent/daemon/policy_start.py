"""NetworkPolicy enforcement inside `netagent run`: its flag, its watches, and starting it.

`--network-policy` turns it on (the DaemonSet passes it). It then watches NetworkPolicies,
Pods and Namespaces (one reflector each, into the engine's recorders) and runs the engine's
sync on its own `SyncRunner`. Off means no policy rules at all: an agent started without the
flag removes whatever policy chains and sets a previous run left.

New pods are never open while their policy is being programmed, and have it when their CNI
ADD returns. The engine's first sync completes before the CNI server starts serving (run.py
waits for it), and that sync installs, for this node's pod CIDRs, a DROP for every address
that is not in the KNOWN set of programmed pods. Then the CNI server, after a successful ADD
and before replying (cniserver/policy_binding.py), binds the address the ADD chose to the pod
`CNI_ARGS` names and has the engine write that pod's policy (its chains, its membership in
every selector set, its place in KNOWN) from the reflectors' caches (policy/pod_binding.py):
no API call on the CNI path, and no wait for the kubelet to report the address, whose later
report changes nothing the plan reads (that sync writes nothing). A Pod the cache does not
hold yet is waited for at most `--policy-add-wait` seconds; the ADD then returns with the pod
closed and the engine's runner programs it as soon as the Pod arrives. A failure to program
never fails the ADD: the pod stays closed (fail-closed) and the runner retries. A DEL unbinds
the same way. `netagent_policy_pod_programming_seconds` measures ADD to programmed, and
`netagent_policy_pods_closed_after_add_total{reason}` counts ADDs that returned closed.

Every watched object is untrusted (policy/kube_objects.py): one the engine cannot read fully
is rejected in the `RejectionScope` given to `build_policy` (the daemon's, so the metric,
the log line and the Event are shared) and listed in /healthz's `network_policy.rejected`,
while it is enforced closed. `--policy-max-*` bound what one NetworkPolicy may hold
(`PolicyLimits`); above them it is rejected `too-large` and isolates the pods it selects.

A pod's host interface comes from the CNI plugin's IPAM store: the reservation file of its
address names the container and interface, from which the plugin named the host veth.

The dataplane follows the proxy mode: `--proxy-mode nftables` programs the `ip netagent-policy`
nft table (policy/nftables/), so no iptables rule of ours exists; every other mode the
iptables chains and ipsets (policy/iptables/). The engine sees one `PolicyDataplane`
either way. What the other dataplane left (a node switched between modes) is removed at start.

Dual-stack: one dataplane per family of this node's pod CIDRs (`policy_families`; none given
is IPv4), built with that family (ip6tables and `inet6` sets, or the `ip6 netagent-policy`
table), under one `FamilyDataplanes` (policy/families.py), which gives each the plan as its
family sees it. Removal and cleanup take both families.

Pod anti-spoofing (policy/antispoof.py: a pod's packets must carry its own source address) is
not NetworkPolicy, so it has its own flag, `--pod-anti-spoofing on|off` (on by default), and
its own `AntiSpoofParts` (`build_anti_spoofing`): a `SyncRunner` that writes the rules at
start and, in bridge mode, rescans the IPAM store every `ANTISPOOF_RESCAN` seconds. Off
removes what a previous run left. The flavour follows the netfilter dataplane as the policy's
does. With `--network-policy` the policy parts start and stop it (`PolicyParts.anti_spoofing`);
without, `run.py` does.

Flow records (`--flows on`, the default; `--flow-ring-size`): each pod chain logs what it drops
to an nflog group (rate limited in the kernel), and `PolicyFlows` (policy/flows.py) records
those drops, named with the pod and the policies, in a bounded ring served at `/flows` on the
loopback metrics address (`serve_flows`), read by `netagent flows`. On by default because it
costs nothing on the forwarding path: only packets a policy drops reach a log rule, a
connection's first packets, at most `LOG_RATE` a second per chain (bench/flows.py measures it);
and when the group cannot be bound (another listener, no nfnetlink_log) the policy runs
without it, with a warning. `--flow-conntrack on` (off by default: conntrack sends an event
for every new connection of the node once anyone listens, a cost on allowed traffic) adds
forwarded and Service-translated connections of local pods to the same ring
(policy/conntrack_flows.py).

The flags are declared here and parsed once by config.py: `build_policy` and
`build_anti_spoofing` take its `PolicyConfig` and the `Dataplane` dataplane.py chose (its
`Netfilter` picks the dataplane; `--proxy-mode ipvs` also hooks OUTPUT).
"""
from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from proxy.limits import positive_int

if TYPE_CHECKING:  # imported when building: `netagent run --help` stays light
    from netagent.daemon.config import PolicyConfig
    from netagent.daemon.dataplane import Dataplane, Netfilter
    from netagent.infra.rejections import RejectionScope
    from netagent.infra.status_server import HealthFunction
    from netagent.infra.sync_runner import SyncRunner
    from netagent.kernel.nftables.runner import NftRunner
    from netagent.kube.reflector import Reflector
    from netagent.policy.engine import PolicyEngine
    from netagent.policy.conntrack_flows import ConntrackFlows
    from netagent.policy.flows import PolicyFlows
    from netagent.policy.semantics import PodPlan

log = logging.getLogger("netagent.daemon.policy_start")


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("network policy")
    group.add_argument("--network-policy", action="store_true",
                       help="enforce networking.k8s.io/v1 NetworkPolicies on this node's pods "
                            "(without it, any policy rules a previous run left are removed)")
    group.add_argument("--policy-add-wait", type=_add_wait, default=2.0, metavar="SECONDS",
                       help="how long a CNI ADD waits for its Pod in the cache to program its policy "
                            "before returning with the pod closed (programmed when the Pod arrives)")
    group.add_argument("--policy-sync-period", type=float, default=30.0,
                       help="seconds between full policy syncs (drift repair)")
    group.add_argument("--pod-anti-spoofing", choices=["on", "off"], default="on",
                       help="drop packets a pod sends with a source address that is not its own "
                            "(both families; off removes the rules a previous run left)")
    group.add_argument("--flows", choices=["on", "off"], default="on",
                       help="record what the policy drops (pod, policy, direction) in a ring the agent serves "
                            "at /flows on its metrics address, read by `netagent flows`")
    group.add_argument("--flow-conntrack", choices=["on", "off"], default="off",
                       help="with --flows on, record forwarded and Service-translated connections of local pods "
                            "too, from conntrack events (off by default: a cost on every new connection)")
    group.add_argument("--flow-ring-size", type=_ring_size, default=4096, metavar="N",
                       help="how many recent flows the agent keeps (16 to 1048576; the oldest go first)")
    from netagent.policy.kube_objects import DEFAULT_LIMITS
    for field, what in LIMIT_FLAGS:
        group.add_argument(f"--policy-max-{field.replace('_', '-')}", type=positive_int, metavar="N",
                           default=getattr(DEFAULT_LIMITS, field),
                           help=f"at most N {what} in one NetworkPolicy (default %(default)s); a policy above "
                                f"it is rejected as too large and isolates the pods it selects")


def _add_wait(text: str) -> float:
    """0 to 60 seconds: an ADD must not hold the runtime (its own CNI timeout) for long."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= 60:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 60 seconds")
    return value


def _ring_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of flows") from None
    if not 16 <= value <= 1 << 20:
        raise argparse.ArgumentTypeError(f"{text} is not between 16 and 1048576")
    return value


LIMIT_FLAGS = (("rules", "ingress + egress rules"), ("peers", "from/to peers, over all rules"),
               ("ip_blocks", "ipBlock peers"), ("excepts", "ipBlock except entries"),
               ("ports", "ports items, over all rules"),
               ("pairs", "(peer x port) pairs, summed over its rules"))


def ipam_interface_lookup(data_dir: str, network: str):
    """PodPlan -> host veth name, from the CNI IPAM reservation of the pod's address."""
    from cni.wiring import host_veth_name

    directory = os.path.join(data_dir, network)

    def lookup(plan: PodPlan) -> str | None:
        try:
            with open(os.path.join(directory, plan.ip), newline="") as reservation:
                lines = reservation.read().split()       # "container-id\r\nifname", as host-local writes
        except OSError:
            return None
        return host_veth_name(network, lines[0], lines[1] if len(lines) > 1 else "eth0") if lines else None
    return lookup


@dataclass
class AntiSpoofParts:
    """Pod anti-spoofing's runner: rules written at start, the IPAM store rescanned (bridge
    mode) every ANTISPOOF_RESCAN seconds. Stopping leaves the rules: a restarting agent keeps
    its pods unable to spoof."""
    runner: SyncRunner
    nft: NftRunner | None = None      # its own libnftables worker (nftables flavour), closed on stop

    def start(self) -> None:
        from netagent.infra.sync_runner import SyncKind
        self.runner.start()
        self.runner.request(SyncKind.FULL)      # a runner runs nothing before its first request

    def stop(self) -> None:
        self.runner.stop()
        if self.nft is not None:
            self.nft.close()


def build_anti_spoofing(config: PolicyConfig, *, netfilter: Netfilter, iptables_backend,
                        pod_cidrs: Sequence[str]) -> AntiSpoofParts | None:
    """`--pod-anti-spoofing on`: the runner, not started, of `netfilter`'s flavour (nftables too
    where iptables cannot work: `iptables_backend` None); off: None, leftovers removed."""
    from functools import partial

    from cni.wiring import host_veth_name
    from netagent.infra.sync_runner import SyncRunner
    from netagent.kernel.iptables.backend import missing_binaries
    from netagent.daemon.dataplane import Netfilter
    from netagent.kernel.iptables.runner import IptablesRunner
    from netagent.policy.antispoof import ANTISPOOF_RESCAN, AntiSpoofing, ports_from_ipam

    network = config.cni_network
    ports = partial(ports_from_ipam, os.path.join(config.cni_data_dir, network), partial(host_veth_name, network))
    mode = config.attachment
    on = config.anti_spoofing
    use_nft = netfilter is Netfilter.NFTABLES or iptables_backend is None
    iptables = [] if iptables_backend is None else [
        IptablesRunner(backend=iptables_backend, family=family) for family in policy_families(pod_cidrs)
        if not missing_binaries(family, iptables_backend)]
    nft = None
    if use_nft or not on:
        from netagent.kernel.nftables.runner import NftError, NftRunner
        try:
            nft = NftRunner()
        except NftError:
            if use_nft and on:
                raise
    stale = [AntiSpoofing(mode=mode, ports=ports, iptables=[runner]) for runner in iptables if use_nft or not on]
    if nft is not None and not on:
        stale.append(AntiSpoofing(mode=mode, ports=ports, nft=nft))
    for leftover in stale:            # off: every flavour's rules; on: the other flavour's (a node switched)
        for item in leftover.remove():
            log.info("pod anti-spoofing: removed %s", item)
    if not on:
        if nft is not None:
            nft.close()
        return None
    guard = (AntiSpoofing(mode=mode, ports=ports, nft=nft) if use_nft and nft is not None
             else AntiSpoofing(mode=mode, ports=ports, iptables=iptables))
    log.info("pod anti-spoofing on (%s mode, %s)", mode.value, "nftables" if guard.nft is not None else "iptables")
    if guard.nft is None and nft is not None:
        nft.close()
    return AntiSpoofParts(SyncRunner(name="pod-anti-spoofing", sync=guard.sync, min_interval=0.0,
                                     max_interval=ANTISPOOF_RESCAN, retry_interval=1.0), nft=nft if guard.nft else None)


@dataclass
class PolicyParts:
    engine: PolicyEngine
    runner: SyncRunner
    reflectors: list[Reflector]
    anti_spoofing: AntiSpoofParts | None = None
    flows: PolicyFlows | None = None          # --flows on: the nflog listener (started here)
    connections: ConntrackFlows | None = None  # --flow-conntrack on: conntrack events into the same ring

    def start(self) -> None:
        if self.anti_spoofing is not None:
            self.anti_spoofing.start()
        self.runner.start()
        for reflector in self.reflectors:
            reflector.start()
        if self.flows is not None:
            try:
                self.flows.start()
            except OSError as error:          # flows are for looking: the policy runs without them
                log.warning("flow records off: cannot listen to the policy's nflog group: %s", error)
                self.flows = None
        if self.connections is not None:
            try:
                self.connections.start()
            except OSError as error:
                log.warning("forwarded flows off: cannot listen to conntrack events: %s", error)
                self.connections = None

    def wait_first_sync(self, timeout: float) -> bool:
        """Until the caches are synced and one sync has written the kernel (the KNOWN guard
        is in, even when some pod still waits for its interface)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.engine.last_report is not None:
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self.connections is not None:
            self.connections.stop()
        if self.flows is not None:
            self.flows.stop()
        for reflector in self.reflectors:
            reflector.stop()
        self.runner.stop()
        if self.anti_spoofing is not None:
            self.anti_spoofing.stop()

    def serve_flows(self, servers) -> None:
        """`/flows` (the ring as JSON) on the status servers among `servers` that serve details
        (loopback: the metrics address), once the listener runs."""
        from netagent.infra.status_server import Snapshot, serves_details
        if self.flows is None:
            return
        for server in servers:
            if server is not None and server.registry is not None and serves_details(server.host):
                server.pages["/flows"] = ("application/json", Snapshot(self.flows.ring.to_json))

    def health(self, stale_after: float) -> HealthFunction:
        from netagent.infra.status_server import health_from_sync_runner
        return health_from_sync_runner(self.runner, stale_after=stale_after)


def with_policy_health(base: HealthFunction, holder: list[PolicyParts], *, stale_after: float) -> HealthFunction:
    """The agent's /healthz, unhealthy also while a policy change waits unprogrammed longer
    than `stale_after` (once `holder` has the started policy engine; the node agent's own
    report is unchanged otherwise)."""
    from netagent.infra.status_server import HealthReport

    def health() -> HealthReport:
        report = base()
        if not holder:
            return report
        policy = holder[0].health(stale_after)()
        engine = holder[0].engine
        section: dict = {"healthy": policy.healthy, "reason": policy.reason}
        if engine is not None:  # refused objects: the daemon lists every rejection (rejection_reports.py)
            section["unprogrammed"] = list(engine.unprogrammed)
        details = {**report.details, "network_policy": section}
        if policy.healthy:
            return HealthReport(report.healthy, report.reason, details)
        reason = f"network policy: {policy.reason}"
        return HealthReport(False, reason if report.healthy else f"{report.reason}; {reason}", details)
    return health


def remove_policy_state(iptables_backend, *, iptables: bool = True, nft: bool = True) -> list[str]:
    """What `--network-policy` off does at start: remove every policy chain and set (of the
    iptables dataplane, the nft table, or both)."""
    from netagent.kernel.ipset.model import IpsetError
    from netagent.kernel.ipset.runner import IpsetRunner
    from netagent.kernel.families import IpFamily
    from netagent.kernel.iptables.backend import missing_binaries
    from netagent.kernel.iptables.runner import IptablesError, IptablesRunner
    from netagent.policy.iptables.dataplane import IptablesDataplane

    removed = remove_nft_policy_state() if nft else []
    if not iptables or iptables_backend is None:
        return removed
    for family in (IpFamily.V6, IpFamily.V4):     # IPv6 first: ipset destroys only sets no rule names
        if family is IpFamily.V6 and missing_binaries(family, iptables_backend):
            continue
        try:
            programmer = IptablesDataplane(iptables=IptablesRunner(backend=iptables_backend, family=family),
                                          ipset=IpsetRunner(), family=family)
            removed += programmer.cleanup()
        except (IptablesError, IpsetError, OSError) as error:
            log.warning("network policy: could not check for leftover %s policy rules: %s", family.command, error)
    return removed


def remove_nft_policy_state() -> list[str]:
    """The policy's nft table, when this host has nftables and the table."""
    from netagent.kernel.nftables.runner import NftError, NftRunner
    from netagent.kernel.families import IpFamily
    from netagent.policy.nftables.dataplane import NftablesDataplane
    try:
        nft = NftRunner()
    except NftError:
        return []                    # no libnftables here: no table of ours either
    try:
        return [item for family in IpFamily for item in NftablesDataplane(nft, family=family).cleanup()]
    except NftError as error:
        log.warning("network policy: could not check for a leftover nft policy table: %s", error)
        return []
    finally:
        nft.close()


def remove_policy_state_everywhere() -> list[str]:
    """`netagent cleanup`: the policy chains on every iptables backend present, and the sets."""
    from netagent.kernel.families import IpFamily
    from netagent.kernel.iptables.backend import IptablesBackend, missing_binaries
    removed = [f"network policy {item}" for item in remove_nft_policy_state()]
    for backend in IptablesBackend:
        if not missing_binaries(IpFamily.V4, backend):
            removed += [f"network policy ({backend.value}) {item}"
                        for item in remove_policy_state(backend, nft=False)]
    return removed


def policy_families(pod_cidrs: Sequence[str]):
    """The families the policy engine programs: those of this node's pod CIDRs (IPv4 when none)."""
    from netagent.kernel.families import IpFamily
    found = {IpFamily.of(cidr) for cidr in pod_cidrs}
    return [family for family in IpFamily if family in found] or [IpFamily.V4]


def _denied(chains) -> dict[tuple[str, ...], float]:
    """Denied packets per pod and direction, both families' chains summed."""
    found: dict[tuple[str, ...], float] = {}
    for chain in chains:
        found[(chain.pod, chain.direction)] = found.get((chain.pod, chain.direction), 0.0) + chain.denied_packets
    return found


def build_policy(config: PolicyConfig, *, dataplane: Dataplane, api_client, iptables_backend, registry,
                 pod_cidrs: Sequence[str], rejections: RejectionScope | None = None) -> PolicyParts:
    """The engine, its runner and watches (not started) on `dataplane`'s netfilter, one
    dataplane per family of `pod_cidrs`; anti-spoofing's runner beside them."""
    from netagent.infra.metrics import CallbackGauge
    from netagent.infra.sync_runner import SyncKind, SyncRunner
    from netagent.kernel.ipset.runner import IpsetRunner
    from netagent.kernel.families import IpFamily
    from netagent.kernel.iptables.runner import IptablesRunner
    from netagent.kube.reflector import Reflector
    from netagent.kube.resources import NAMESPACES, NETWORK_POLICIES, PODS
    from netagent.policy.engine import PolicyEngine, PolicySettings
    from netagent.policy.iptables.dataplane import IptablesDataplane
    from netagent.policy.shared import RenderSettings, ServicePath
    from proxy.backend import ProxyMode

    from netagent.daemon.dataplane import Netfilter
    from netagent.policy.dataplane import PolicyDataplane
    from netagent.policy.families import FamilyDataplanes

    families = policy_families(pod_cidrs)
    dataplanes: dict[IpFamily, PolicyDataplane] = {}
    if dataplane.netfilter is Netfilter.NFTABLES:
        from netagent.kernel.nftables.runner import NftRunner
        from netagent.policy.nftables.dataplane import NftablesDataplane
        for removed in remove_policy_state(iptables_backend, nft=False):   # a node switched from iptables
            log.info("network policy (nftables): removed the iptables dataplane's %s", removed)
        nft = NftRunner()
        for family in families:
            dataplanes[family] = NftablesDataplane(nft, family=family)
    else:
        for removed in remove_nft_policy_state():
            log.info("network policy (iptables): removed the nftables dataplane's %s", removed)
        ipset = IpsetRunner()
        for family in families:
            dataplanes[family] = IptablesDataplane(iptables=IptablesRunner(backend=iptables_backend, family=family),
                                                  ipset=ipset, family=family)
    programmer = FamilyDataplanes(dataplanes)
    services = ServicePath.OUTPUT if dataplane.proxy is ProxyMode.IPVS else ServicePath.FORWARD   # IPVS: past FORWARD
    settings = PolicySettings(config.node_name, RenderSettings(config.attachment,
                                                              local_cidrs=tuple(pod_cidrs), services=services),
                              limits=config.limits)
    engine = PolicyEngine(settings, dataplane=programmer, registry=registry, rejections=rejections,
                          interface_of=ipam_interface_lookup(config.cni_data_dir, config.cni_network))
    runner = SyncRunner(name="network-policy", sync=engine.sync, min_interval=config.min_sync_period,
                        max_interval=config.sync_period, retry_interval=1.0)
    engine.set_requester(lambda: runner.request(SyncKind.PARTIAL))
    registry.register(CallbackGauge(
        "netagent_policy_denied_packets", "packets dropped by network policy, per pod and direction "
        "(the kernel's counters of each pod chain's DROP rule, read at scrape time)",
        lambda: _denied(programmer.read_policy().pods),
        labels=("pod", "direction")))
    flows = connections = None
    if config.flows:
        from netagent.infra.flows import FlowRing
        from netagent.policy.flows import FlowNames, PolicyFlows
        names = FlowNames(lambda: engine.plan)
        flows = PolicyFlows(FlowRing(size=config.flow_ring_size, registry=registry), names)
        if config.flow_conntrack:
            from netagent.policy.conntrack_flows import ConntrackFlows
            connections = ConntrackFlows(flows.ring, names)
    reflectors = [Reflector(api_client=api_client, resource=NETWORK_POLICIES, handler=engine.policies),
                  Reflector(api_client=api_client, resource=PODS, handler=engine.pods),
                  Reflector(api_client=api_client, resource=NAMESPACES, handler=engine.namespaces)]
    return PolicyParts(engine, runner, reflectors,
                       anti_spoofing=build_anti_spoofing(config, netfilter=dataplane.netfilter,
                                                         iptables_backend=iptables_backend, pod_cidrs=pod_cidrs),
                       flows=flows, connections=connections)
