"""`netagent run`'s settings, parsed once: the argparse namespace becomes a frozen `DaemonConfig`
right after parsing (`parse_run_config`), and nothing reads the namespace afterwards.

Modes are enums (`ProxyMode`, `Mode`, `PodAttachment`, `BackendChoice`, ...), on/off flags are
bools, addresses and CIDRs are checked values, durations floats in seconds. A bad value is a
`ConfigError` (a `NetagentError`: `netagent run: ...`, exit code 1) that names its flag.

The configuration comes in typed pieces, one per part of the daemon, each handed to the part
that needs it: `CniConfig` (the CNI server and the network config it publishes), `routing`
(the node agent's `AgentSettings`), `ProxyConfig` (proxy_start.py), `PolicyConfig`
(policy_start.py, anti-spoofing included), `BgpConfig` (bgp_start.py) and `StatusConfig`
(/healthz and /metrics). `--cni-only` has no cluster: `cluster` is None then, and the cluster
flags are neither needed nor checked.

The proxy mode asked for (`ProxyConfig.requested`: a `ProxyMode`, `NO_PROXY` for
`--proxy-mode none`, None when not given) is not yet the mode that runs: dataplane.py
decides that once, from the host, and the daemon hands the decision (`Dataplane`) on.
"""
from __future__ import annotations

import argparse
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from netagent.errors import NetagentError
from netagent.kernel.iptables.backend import BackendChoice
from netagent.kernel.pod_attachment import PodAttachment
from netagent.noderoutes.routing.model import Mode

if TYPE_CHECKING:  # imported when parsing: `netagent run --help` stays light
    from ebpf.sizes import MapSizes
    from netagent.noderoutes.agent_inputs import AgentSettings
    from netagent.policy.kube_objects import PolicyLimits
    from proxy.backend import ProxyMode
    from proxy.limits import ProxyLimits

CNI_NETWORK = "netagent"   # the network config's name, the IPAM store's directory under --cni-data-dir
DEFAULT_METRICS_BIND = "127.0.0.1:10249"   # --metrics-bind-address, as kube-proxy's: loopback


class ConfigError(NetagentError, ValueError):
    """A `netagent run` flag with a value the daemon cannot use; the message names the flag."""


class NoProxy(enum.Enum):
    """`--proxy-mode none`: Services are left to another proxy."""
    NONE = "none"


NO_PROXY = NoProxy.NONE


@dataclass(frozen=True)
class CniConfig:
    socket: str                      # --cni-socket
    workers: int                     # --workers
    conf_dir: str                    # --cni-conf-dir ('': publish no network config)
    attachment: PodAttachment        # --cni-mode
    portmap: bool | None             # --cni-portmap on/off; None: auto (when bin_dir holds portmap)
    bin_dir: str                     # --cni-bin-dir
    data_dir: str                    # --cni-data-dir
    network: str = CNI_NETWORK


@dataclass(frozen=True)
class EbpfConfig:
    """The eBPF proxy's flags (`--bpf-*`, `--cgroup-root`); the paths are resolved at start."""
    bpf_root: str | None
    cgroup_root: str | None
    nodeport_device: str | None      # a name, "auto" (the underlay) or "none"
    map_sizes: MapSizes
    pod_veths: bool

    @property
    def given(self) -> bool:
        return bool(self.bpf_root or self.cgroup_root)


@dataclass(frozen=True)
class ProxyConfig:
    requested: ProxyMode | NoProxy | None   # --proxy-mode; None: not given (dataplane.py decides)
    node_name: str
    nodeport_cidrs: tuple[str, ...]  # --nodeport-addresses, each a CIDR
    sync_period: float               # --sync-period
    min_sync_period: float           # --min-sync-period (the proxy uses at least 1 s)
    healthz_bind: str                # --healthz-bind-address
    ipvs_scheduler: str
    ebpf: EbpfConfig
    limits: ProxyLimits              # --proxy-max-*, --deny-external-ips, --service-cidr
    iface: str | None                # --iface, --iface-regex: --bpf-nodeport-device auto's underlay
    iface_regex: str | None


@dataclass(frozen=True)
class PolicyConfig:
    enabled: bool                    # --network-policy
    node_name: str
    attachment: PodAttachment        # --cni-mode: what the hooks match
    add_wait: float                  # --policy-add-wait
    sync_period: float               # --policy-sync-period
    min_sync_period: float           # --min-sync-period
    anti_spoofing: bool              # --pod-anti-spoofing
    limits: PolicyLimits             # --policy-max-*
    cni_data_dir: str                # the IPAM store: a pod address's host interface
    cni_network: str = CNI_NETWORK
    flows: bool = True               # --flows: policy drops recorded for `netagent flows`
    flow_ring_size: int = 4096       # --flow-ring-size
    flow_conntrack: bool = False     # --flow-conntrack: forwarded and translated flows too


@dataclass(frozen=True)
class BgpConfig:
    wanted: bool                     # BIRD runs: --backend bgp, or --backend auto --auto-bgp on
    state_dir: str                   # --bgp-state-dir
    asn: int                         # --bgp-as
    mesh: bool                       # --bgp-mesh
    bfd: bool                        # --bgp-bfd
    reflector_label: str             # --bgp-reflector-label
    config_map: str                  # --bgp-config, namespace/name


@dataclass(frozen=True)
class StatusConfig:
    status_bind: str                 # --status-bind: /healthz, /livez, /readyz
    metrics_binds: tuple[str, ...]   # --metrics-bind-address (empty: no /metrics)


@dataclass(frozen=True)
class ClusterConfig:
    """Everything cluster mode adds to the CNI server."""
    kubeconfig: str | None
    routing: AgentSettings
    iptables_backend: BackendChoice
    proxy: ProxyConfig
    policy: PolicyConfig
    bgp: BgpConfig
    status: StatusConfig


@dataclass(frozen=True)
class DaemonConfig:
    cni: CniConfig
    cluster: ClusterConfig | None    # None: --cni-only


def _on(value: str) -> bool:
    return value == "on"


def _tristate(value: str) -> bool | None:
    return None if value == "auto" else value == "on"


def _enum(kind, value, flag: str):
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"{flag}: {value!r} is not one of {', '.join(str(m.value) for m in kind)}") from None


def _positive(value, flag: str, *, zero: bool = False):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (value == 0 and not zero):
        raise ConfigError(f"{flag}: {value!r} must be {'zero or more' if zero else 'more than zero'}")
    return value


def _bind(value: str, flag: str) -> str:
    from netagent.infra.status_server import parse_bind
    try:
        parse_bind(value)
    except ValueError as error:
        raise ConfigError(f"{flag} {value!r}: {error}") from None
    return value


def metrics_binds(given) -> tuple[str, ...]:
    """The addresses /metrics is served on: `--metrics-bind-address` (each time given), default
    loopback; an empty one turns metrics off."""
    values = list(given or [DEFAULT_METRICS_BIND])
    return () if "" in values else tuple(values)


def proxy_mode(value: str | None) -> ProxyMode | NoProxy | None:
    """`--proxy-mode`'s text as its enum (None: not given)."""
    if value is None:
        return None
    if value == NO_PROXY.value:
        return NO_PROXY
    from proxy.backend import ProxyMode
    return _enum(ProxyMode, value, "--proxy-mode")


def _cni(args: argparse.Namespace) -> CniConfig:
    return CniConfig(socket=args.cni_socket, workers=_positive(args.workers, "--workers"),
                     conf_dir=args.cni_conf_dir, attachment=_enum(PodAttachment, args.cni_mode, "--cni-mode"),
                     portmap=_tristate(args.cni_portmap), bin_dir=args.cni_bin_dir, data_dir=args.cni_data_dir)


def _routing(args: argparse.Namespace) -> AgentSettings:
    from netagent.noderoutes.agent_inputs import AgentSettings, parse_cluster_cidrs, parse_service_cidrs
    from netagent.noderoutes.host import ChecksumOffloadPolicy, Masquerade
    from netagent.noderoutes.routing.model import RoutingSettings
    if not args.node_name:
        raise ConfigError("no node name: pass --node-name or set NODE_NAME (the DaemonSet sets it "
                          "from spec.nodeName)")
    if not args.cluster_cidr:
        raise ConfigError("--cluster-cidr is required in cluster mode (the cluster's pod network)")
    try:
        cluster_cidrs, service_cidrs = parse_cluster_cidrs(args.cluster_cidr), parse_service_cidrs(args.service_cidr)
    except NetagentError as error:
        raise ConfigError(str(error)) from None
    if not 0 < args.vxlan_vni < 1 << 24:
        raise ConfigError(f"--vxlan-vni: {args.vxlan_vni} is not between 1 and 16777215")
    if not 0 < args.vxlan_port < 1 << 16:
        raise ConfigError(f"--vxlan-port: {args.vxlan_port} is not a port")
    routing = RoutingSettings(mode=_enum(Mode, args.backend, "--backend"),
                              auto_encap=_enum(Mode, args.auto_encap, "--auto-encap"),
                              vxlan_vni=args.vxlan_vni, vxlan_port=args.vxlan_port)
    return AgentSettings(node_name=args.node_name, cluster_cidrs=cluster_cidrs, service_cidrs=service_cidrs,
                         routing=routing, iface=args.iface, iface_regex=args.iface_regex,
                         lease_timeout=_positive(args.lease_timeout, "--lease-timeout"),
                         masquerade=_enum(Masquerade, args.masquerade, "--masquerade"),
                         checksum_offload=_enum(ChecksumOffloadPolicy, args.vxlan_checksum_offload,
                                                "--vxlan-checksum-offload"),
                         min_sync_interval=_positive(args.min_sync_period, "--min-sync-period", zero=True),
                         resync_interval=_positive(args.resync_period, "--resync-period"))


def _proxy(args: argparse.Namespace, node_name: str) -> ProxyConfig:
    from ebpf.sizes import MapSizes
    from proxy.limits import limits_from_args
    from proxy.nodeport_addresses import NodePortAddressError, parse_nodeport_cidrs
    try:
        nodeport_cidrs = parse_nodeport_cidrs(args.nodeport_addresses)
    except NodePortAddressError as error:
        raise ConfigError(str(error)) from None
    try:
        limits = limits_from_args(args)
    except ValueError as error:
        raise ConfigError(f"--service-cidr or --proxy-max-*: {error}") from None
    try:
        map_sizes = MapSizes.parse(args.bpf_map_max or [])
    except ValueError as error:
        raise ConfigError(f"--bpf-map-max: {error}") from None
    ebpf = EbpfConfig(bpf_root=args.bpf_root, cgroup_root=args.cgroup_root, nodeport_device=args.bpf_nodeport_device,
                      map_sizes=map_sizes, pod_veths=bool(args.bpf_pod_veths))
    return ProxyConfig(requested=proxy_mode(args.proxy_mode), node_name=node_name,
                       nodeport_cidrs=nodeport_cidrs, sync_period=_positive(args.sync_period, "--sync-period"),
                       min_sync_period=_positive(args.min_sync_period, "--min-sync-period", zero=True),
                       healthz_bind=_bind(args.healthz_bind_address, "--healthz-bind-address"),
                       ipvs_scheduler=args.ipvs_scheduler, ebpf=ebpf, limits=limits,
                       iface=args.iface, iface_regex=args.iface_regex)


def _policy(args: argparse.Namespace, node_name: str) -> PolicyConfig:
    from netagent.daemon.policy_start import LIMIT_FLAGS
    from netagent.policy.kube_objects import PolicyLimits
    try:
        limits = PolicyLimits(**{field: getattr(args, f"policy_max_{field}") for field, _ in LIMIT_FLAGS})
    except ValueError as error:
        raise ConfigError(f"--policy-max-*: {error}") from None
    return PolicyConfig(enabled=bool(args.network_policy), node_name=node_name,
                        attachment=_enum(PodAttachment, args.cni_mode, "--cni-mode"),
                        add_wait=_positive(args.policy_add_wait, "--policy-add-wait", zero=True),
                        sync_period=_positive(args.policy_sync_period, "--policy-sync-period"),
                        min_sync_period=_positive(args.min_sync_period, "--min-sync-period", zero=True),
                        anti_spoofing=_on(args.pod_anti_spoofing), limits=limits, cni_data_dir=args.cni_data_dir,
                        flows=_on(args.flows), flow_ring_size=args.flow_ring_size,
                        flow_conntrack=_on(args.flow_conntrack))


def _bgp(args: argparse.Namespace, mode: Mode) -> BgpConfig:
    from netagent.noderoutes.bgp.cluster_config import check_label
    from netagent.noderoutes.bgp.model import check_as_number
    wanted = mode is Mode.BGP or (mode is Mode.AUTO and _on(args.auto_bgp))
    try:
        asn = check_as_number(args.bgp_as, what="--bgp-as")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    try:
        label = check_label(args.bgp_reflector_label)
    except ValueError as error:
        raise ConfigError(f"--bgp-reflector-label: {error}") from None
    if not args.bgp_config.rpartition("/")[2]:
        raise ConfigError(f"--bgp-config {args.bgp_config!r}: namespace/name of a ConfigMap")
    return BgpConfig(wanted=wanted, state_dir=args.bgp_state_dir, asn=asn, mesh=_on(args.bgp_mesh),
                     bfd=_on(args.bgp_bfd), reflector_label=label, config_map=args.bgp_config)


def _status(args: argparse.Namespace) -> StatusConfig:
    binds = metrics_binds(args.metrics_bind_address)
    for bind in binds:
        _bind(bind, "--metrics-bind-address")
    return StatusConfig(status_bind=_bind(args.status_bind, "--status-bind"), metrics_binds=binds)


def parse_run_config(args: argparse.Namespace) -> DaemonConfig:
    """`netagent run`'s namespace, once, as a `DaemonConfig`; ConfigError names a bad flag."""
    cni = _cni(args)
    if args.cni_only:
        return DaemonConfig(cni=cni, cluster=None)
    routing = _routing(args)
    return DaemonConfig(cni=cni, cluster=ClusterConfig(
        kubeconfig=args.kubeconfig, routing=routing,
        iptables_backend=_enum(BackendChoice, args.iptables_backend, "--iptables-backend"),
        proxy=_proxy(args, routing.node_name), policy=_policy(args, routing.node_name),
        bgp=_bgp(args, routing.routing.mode), status=_status(args)))
