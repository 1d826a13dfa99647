"""The service proxy inside `netagent run`: its flags, and starting and stopping it.

kube-proxy's operational surface, so existing probes, scrapes and habits carry over:
`--proxy-mode iptables|ipvs|ebpf|none` (ebpf also needs `--bpf-root`, a bpffs mount for its pinned
maps, and `--cgroup-root`, the cgroup v2 directory whose sockets it balances), `--nodeport-addresses CIDR,...`, `--sync-period`
(full resync; the agent's `--min-sync-period` also spaces proxy syncs, as kube-proxy's
does), healthz on `--healthz-bind-address` (0.0.0.0:10256: /healthz and /livez only, what cloud
load balancers probe, as kube-proxy serves there) and metrics on `--metrics-bind-address`
(127.0.0.1:10249, loopback unless an operator exposes it; repeat it for more addresses, ""
for none). Both servers are the agent's `StatusServer`: the healthz one answers for the proxy
alone, the metrics one serves the agent's whole registry, kube-proxy's `/proxyMode`, and
`/services` (what `netagent status services` shows, with the names the running agent knows).
With `--proxy-mode none`, `netagent run` serves the registry on the same metrics addresses.
In eBPF mode with flow records on, `start_ebpf_flows` adds the socket LB's events to the
policy's flow ring (conntrack never sees the Service address the socket LB rewrote).

One proxy per IP family of the cluster (the families of `--cluster-cidr`), as kube-proxy runs
one proxier per family: each with its own backend (iptables through ip6tables for IPv6, the
others built with `family=`), catalog, sync runner (`proxy`, `proxy-ipv6`) and rejection
scope (`proxy`, `proxy-ipv6`), sharing one `ProxyMetrics` (kube-proxy's names, no new label)
and the two servers. /healthz is healthy when every family's proxy is: a single-stack node's
report keeps today's shape, a dual-stack node's lists each family's under its runner's name
(`all_healthy`). An IPv4-only cluster builds exactly the one IPv4 proxy of before.

The flags are declared here and parsed once by config.py: `build_proxy` takes its
`ProxyConfig` (limits, nodeport CIDRs, periods, the eBPF flags as `EbpfConfig`), the proxy
mode dataplane.py chose (a `ProxyMode`; None for `none`) and the metrics addresses.
"""
from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from netagent.kernel.families import IpFamily

from netagent.daemon.config import DEFAULT_METRICS_BIND
from proxy.backend import PROXY_MODE_CHOICES, ProxyMode
from proxy.limits import add_limit_arguments
from netagent.errors import NetagentError

if TYPE_CHECKING:  # imported when building: `netagent run --help` stays light
    from netagent.daemon.config import ProxyConfig
    from netagent.infra.rejections import RejectionScope
    from netagent.infra.status_server import HealthFunction, StatusServer
    from netagent.policy.flows import PolicyFlows
    from proxy.service_proxy import ServiceProxy

log = logging.getLogger("netagent.daemon.proxy_start")

DEFAULT_MIN_SYNC_PERIOD = 1.0


def add_proxy_arguments(parser: argparse.ArgumentParser) -> None:
    proxy = parser.add_argument_group("service proxy (kube-proxy replacement)")
    proxy.add_argument("--proxy-mode", choices=PROXY_MODE_CHOICES, default="iptables",
                       help="how Services are programmed; none leaves them to another proxy")
    proxy.add_argument("--nodeport-addresses", action="append", default=[],
                       help="CIDRs: NodePorts answer only on local addresses inside them (default: all)")
    proxy.add_argument("--sync-period", type=float, default=30.0,
                       help="seconds between full proxy syncs (drift repair)")
    proxy.add_argument("--healthz-bind-address", default="0.0.0.0:10256",
                       help="the proxy's /healthz and /livez, as kube-proxy's")
    proxy.add_argument("--metrics-bind-address", action="append",
                       help=f"the agent's Prometheus /metrics (every mode), as kube-proxy's; default {DEFAULT_METRICS_BIND} "
                            "(loopback: pass the node's or 0.0.0.0:10249 to expose it); repeatable; '' for none")
    proxy.add_argument("--ipvs-scheduler", default="rr", help="IPVS scheduler (rr, wrr, lc, sh, ...)")
    proxy.add_argument("--bpf-root", help="ebpf mode: a bpffs mount where the maps are pinned (kept across restarts)")
    proxy.add_argument("--cgroup-root", help="ebpf mode: the cgroup v2 directory whose sockets are load balanced "
                                             "(a hybrid host's /sys/fs/cgroup stands for its unified directory)")
    proxy.add_argument("--bpf-nodeport-device",
                       help="ebpf mode: the underlay device whose traffic from outside the node is translated "
                            "(NodePorts, external and load-balancer IPs); auto: the underlay interface, chosen as "
                            "for routing (--iface, --iface-regex or the default route's); none: only this node's "
                            "sockets are served")
    proxy.add_argument("--bpf-map-max", action="append", default=[], metavar="MAP=N",
                       help="ebpf mode: a map's capacity (max_entries), e.g. na_svc=524288 (repeatable; "
                            "defaults and maps in ebpf/sizes.py); a pinned map of another size is recreated")
    proxy.add_argument("--bpf-pod-veths", action="store_true",
                       help="ebpf mode: also translate on pod host veths, for pods whose processes are outside "
                            "--cgroup-root (their connections to any service address)")
    add_limit_arguments(proxy)


def ebpf_paths(config: ProxyConfig, families: tuple[IpFamily, ...] = (IpFamily.V4,)):
    """The eBPF backend's places from the flags, or None when neither was given."""
    from ebpf.loader import cgroup2_directory
    from proxy.ebpf.backend import EbpfPaths
    ebpf = config.ebpf
    if not ebpf.given:
        return None
    tc_device = ebpf.nodeport_device
    if tc_device == "auto":
        tc_device = underlay_device(config, families)
    cgroup = cgroup2_directory(ebpf.cgroup_root) if ebpf.cgroup_root else ""
    return EbpfPaths(bpf_root=ebpf.bpf_root or "", cgroup=cgroup, tc_device=tc_device, pod_veths=ebpf.pod_veths,
                     map_sizes=ebpf.map_sizes)


def underlay_device(config: ProxyConfig, families: tuple[IpFamily, ...]) -> str:
    """`--bpf-nodeport-device auto`: the interface routing would choose as this node's underlay."""
    from pyroute2 import IPRoute

    from netagent.noderoutes.underlay import UnderlayError, choose_underlay, read_underlay_snapshot
    with IPRoute() as ipr:
        snapshot = read_underlay_snapshot(ipr)
    try:
        return choose_underlay(snapshot, iface=config.iface, iface_regex=config.iface_regex,
                               families=families).ifname
    except UnderlayError as error:
        raise ProxyStartError(f"--bpf-nodeport-device auto: {error}") from None


class ProxyStartError(NetagentError):
    pass


@dataclass
class ProxyParts:
    """The proxies (one per family, IPv4 first) and their two servers, built but not started
    (`start`, then `stop`)."""
    proxies: tuple[ServiceProxy, ...]
    servers: tuple[StatusServer, ...]
    started: list[StatusServer] = field(default_factory=list)
    running: list[ServiceProxy] = field(default_factory=list)

    @property
    def proxy(self) -> ServiceProxy:
        """The first family's proxy (the only one on a single-stack node)."""
        return self.proxies[0]

    @property
    def node_listeners(self) -> list:
        """What the caller's Node reflector feeds: every proxy's own-Node recorder."""
        return [proxy.node for proxy in self.proxies]

    def start(self) -> None:
        for server in self.servers:
            server.start()
            self.started.append(server)
        for proxy in self.proxies:
            proxy.start()
            self.running.append(proxy)

    def stop(self) -> None:
        while self.running:
            self.running.pop().stop()
        while self.started:
            self.started.pop().stop()


def proxy_families(cluster_cidrs: Mapping[IpFamily, str]) -> tuple[IpFamily, ...]:
    """The families to proxy: those of the cluster CIDRs, IPv4 first; IPv4 when none is known."""
    return tuple(family for family in IpFamily if family in cluster_cidrs) or (IpFamily.V4,)


def build_proxy(config: ProxyConfig, *, mode: ProxyMode | None, metrics_binds: Sequence[str], api_client,
                iptables_backend, registry, cluster_cidrs: Mapping[IpFamily, str],
                rejections: RejectionScope | None = None,
                pages: Mapping[str, tuple[str, Callable[[], str]]] | None = None) -> ProxyParts | None:
    """Build the proxies of `mode` (one per family of `cluster_cidrs`: family -> that family's
    cluster CIDR) and their servers, /metrics on `metrics_binds`; None when `mode` is None
    (--proxy-mode none). What depends on the node (local addresses inside
    --nodeport-addresses, the eBPF places) is checked here.

    The proxies' Node events are shared (`NodeSource.SHARED`): the caller feeds
    `parts.node_listeners` from the Node reflector it already runs. Services and EndpointSlices
    a proxy refuses are recorded in `rejections` (a private scope when None; the IPv6 proxy's
    in a scope of its own beside it) and listed in /healthz's details (on the loopback metrics
    server only; 10256 says healthy or not) without making the node unhealthy. `pages` are the
    caller's extra pages on the metrics server (the agent's `/status`)."""
    if mode is None:
        return None
    running: ProxyMode = mode   # for the pages' lambdas
    from netagent.daemon.rejection_reports import with_rejections
    from netagent.daemon.status_services import services_json
    from netagent.infra.rejections import standalone
    from netagent.infra.status_server import StatusServer, all_healthy, health_from_sync_runner
    from netagent.kernel.iptables.backend import IptablesNotInstalled
    from proxy.conntrack import ConntrackCommand
    from proxy.factory import BackendConfigError, BackendSpec, EbpfSpec, IpvsSpec, build_backend, spec_for
    from proxy.healthcheck import HealthCheckPorts
    from proxy.local_addresses import NetlinkLocalAddresses
    from proxy.metrics import ProxyMetrics
    from proxy.nodeport_addresses import nodeport_addresses, of_family
    from proxy.service_proxy import NodeSource, ProxySettings, ServiceProxy, runner_name

    cidrs = config.nodeport_cidrs
    families = proxy_families(cluster_cidrs)
    local_addresses = NetlinkLocalAddresses()
    for family in families:
        wanted = of_family(cidrs, family)
        local = local_addresses.of_family(family) if wanted else ()
        if wanted and not nodeport_addresses(local, wanted):
            raise ProxyStartError(f"--nodeport-addresses {','.join(wanted)}: no local address is inside them "
                                  f"(local: {', '.join(local) or 'none'})")
    min_sync = config.min_sync_period or DEFAULT_MIN_SYNC_PERIOD
    limits = config.limits
    ebpf = ebpf_paths(config, families)
    scope = rejections if rejections is not None else standalone("proxy")
    metrics: ProxyMetrics | None = None
    proxies: list[ServiceProxy] = []
    healths: dict[str, HealthFunction] = {}
    health_checks = HealthCheckPorts(max_ports=limits.health_check_ports)
    for family in families:
        settings = ProxySettings(node_name=config.node_name, cluster_cidr=cluster_cidrs.get(family),
                                 nodeport_cidrs=cidrs, min_sync_period=min_sync, sync_period=config.sync_period,
                                 limits=limits, family=family)
        name = runner_name(family)
        family_scope = scope if not proxies else scope.rejections.scope(name)
        try:
            # the eBPF backend's map-full records: a scope of their own, so the catalog accepting a
            # Service never clears them (and they never overwrite the catalog's)
            if mode is ProxyMode.EBPF:
                spec: BackendSpec = EbpfSpec(ebpf, first=proxies[0].backend if proxies else None,
                                             rejections=scope.rejections.scope(name.replace("proxy", "proxy-ebpf", 1)))
            elif mode is ProxyMode.IPVS:
                spec = IpvsSpec(iptables_backend, scheduler=config.ipvs_scheduler)
            else:
                spec = spec_for(mode, iptables_backend=iptables_backend)
            backend = build_backend(spec, family=family)
        except (BackendConfigError, ValueError, IptablesNotInstalled) as error:
            raise ProxyStartError(str(error)) from None
        _log_load_report(backend)
        if metrics is None:
            metrics = ProxyMetrics(registry, table_fill=backend.table_fill)
        # the health-check node ports are one set of listeners: the first family's proxy
        # answers them (kube-proxy serves them once per node too)
        proxy = ServiceProxy(api_client=api_client, settings=settings, backend=backend, registry=registry,
                             conntrack=ConntrackCommand(family=family),
                             healthcheck=health_checks if not proxies else None,
                             local_addresses=local_addresses, node_source=NodeSource.SHARED,
                             rejections=family_scope, metrics=metrics)
        proxies.append(proxy)
        # a change left unprogrammed for longer than this makes the proxy unhealthy
        healths[name] = with_rejections(
            health_from_sync_runner(proxy.runner, stale_after=max(2 * config.sync_period, 60.0)), family_scope)
    # one family: its health as before; two: each under its runner's name (`proxy`, `proxy-ipv6`)
    health = next(iter(healths.values())) if len(healths) == 1 else all_healthy(healths)
    health_checks.proxy_healthy = lambda: health().healthy

    healthz = StatusServer(bind=config.healthz_bind, registry=None, health=health)
    binds = list(metrics_binds)
    metrics_server = StatusServer(bind=binds, registry=registry, health=health, pages={
        "/proxyMode": ("text/plain; charset=utf-8", lambda: running.value),
        "/services": ("application/json",
                      lambda: services_json(running, [s for p in proxies for s in p.backend.programmed()])),
        **(pages or {}),
    }) if binds else None
    servers = (healthz, metrics_server) if metrics_server is not None else (healthz,)
    return ProxyParts(proxies=tuple(proxies), servers=servers)


def start_ebpf_flows(parts: ProxyParts | None, flows: PolicyFlows | None) -> Callable[[], None]:
    """eBPF mode: the socket LB's translations and refusals (proxy/ebpf/flows.py) into the flow
    ring the policy's listener fills (`flows`; the ring exists with --flows on and the policy on),
    pods named as its drops are; without it, the programs' events are turned off (a run that
    ended without stopping may have left them on). What stops it (nothing to stop: a no-op)."""
    from proxy.ebpf.backend import EbpfProxy
    backend = parts.proxy.backend if parts is not None else None
    if not isinstance(backend, EbpfProxy) or backend.paths is None:
        return lambda: None
    from ebpf.loader import pin_dir
    from proxy.ebpf.flows import EbpfFlows, set_flow_events
    pins = pin_dir(backend.paths.bpf_root)
    try:
        if flows is None:
            set_flow_events(pins, on=False)
            return lambda: None
        listener = EbpfFlows(flows.ring, pins, name_pod=flows.names.pod)
        listener.start()
    except OSError as error:   # flows are for looking: the proxy runs without them
        log.warning("eBPF flow records off: cannot read the socket load balancer's ring buffer: %s", error)
        return lambda: None
    return listener.stop


def _log_load_report(backend) -> None:
    report = getattr(backend, "load_report", None)
    if report is not None:
        log.info("ebpf: compiled in %.2f s, loaded and attached in %.3f s (attached %s; kept %s)",
                 report.compile_seconds, report.load_seconds, ", ".join(report.attached) or "none",
                 ", ".join(report.kept) or "none")
        for line in report.resized:
            log.warning("ebpf: pinned map changed: %s", line)
