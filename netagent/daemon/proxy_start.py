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
"""
from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from proxy.backend import NO_PROXY, PROXY_MODE_CHOICES
from proxy.limits import add_limit_arguments, limits_from_args
from netagent.errors import NetagentError

if TYPE_CHECKING:  # imported when building: `netagent run --help` stays light
    from netagent.infra.rejections import RejectionScope
    from netagent.infra.status_server import StatusServer
    from proxy.service_proxy import ServiceProxy

log = logging.getLogger("netagent.daemon.proxy_start")

DEFAULT_MIN_SYNC_PERIOD = 1.0
DEFAULT_METRICS_BIND = "127.0.0.1:10249"


def metrics_binds(args) -> list[str]:
    """The addresses /metrics is served on: `--metrics-bind-address` (each time given), default
    loopback; an empty one turns metrics off."""
    given = getattr(args, "metrics_bind_address", None) or [DEFAULT_METRICS_BIND]
    return [] if "" in given else list(given)


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
    proxy.add_argument("--cgroup-root", help="ebpf mode: the cgroup v2 directory whose sockets are load balanced")
    proxy.add_argument("--bpf-nodeport-device",
                       help="ebpf mode: the underlay device whose traffic from outside the node is translated "
                            "(NodePorts, external and load-balancer IPs); none: only this node's sockets are served")
    proxy.add_argument("--bpf-map-max", action="append", default=[], metavar="MAP=N",
                       help="ebpf mode: a map's capacity (max_entries), e.g. na_svc=524288 (repeatable; "
                            "defaults and maps in ebpf/sizes.py); a pinned map of another size is recreated")
    proxy.add_argument("--bpf-pod-veths", action="store_true",
                       help="ebpf mode: also translate on pod host veths, for pods whose processes are outside "
                            "--cgroup-root (their connections to any service address)")
    add_limit_arguments(proxy)


def ebpf_paths(args):
    """The eBPF backend's places from the flags, or None when neither was given."""
    from ebpf.sizes import MapSizes
    from proxy.ebpf.backend import EbpfPaths
    bpf_root, cgroup = getattr(args, "bpf_root", None), getattr(args, "cgroup_root", None)
    return EbpfPaths(bpf_root=bpf_root or "", cgroup=cgroup or "",
                     tc_device=getattr(args, "bpf_nodeport_device", None),
                     pod_veths=bool(getattr(args, "bpf_pod_veths", False)),
                     map_sizes=MapSizes.parse(getattr(args, "bpf_map_max", None) or [])) if bpf_root or cgroup else None


class ProxyStartError(NetagentError):
    pass


@dataclass
class ProxyParts:
    """The proxy and its two servers, built but not started (`start`, then `stop`)."""
    proxy: ServiceProxy
    servers: tuple[StatusServer, ...]
    started: list[StatusServer] = field(default_factory=list)

    def start(self) -> None:
        for server in self.servers:
            server.start()
            self.started.append(server)
        self.proxy.start()

    def stop(self) -> None:
        self.proxy.stop()
        while self.started:
            self.started.pop().stop()


def build_proxy(args, *, api_client, iptables_backend, registry, cluster_cidr: str | None,
                rejections: RejectionScope | None = None) -> ProxyParts | None:
    """Check the flags and build the proxy and its servers; None with --proxy-mode none.

    The proxy's Node events are shared (`NodeSource.SHARED`): the caller feeds
    `parts.proxy.node` from the Node reflector it already runs. Services and EndpointSlices
    the proxy refuses are recorded in `rejections` (a private scope when None) and listed in
    /healthz's details (`rejected`) without making the node unhealthy."""
    if args.proxy_mode == NO_PROXY:
        return None
    from netagent.daemon.status_services import services_json
    from netagent.infra.rejections import standalone
    from netagent.infra.status_server import StatusServer, health_from_sync_runner
    from proxy.conntrack import ConntrackCommand
    from proxy.factory import BackendConfigError, build_backend
    from proxy.healthcheck import HealthCheckPorts
    from proxy.local_addresses import NetlinkLocalAddresses
    from proxy.nodeport_addresses import NodePortAddressError, nodeport_addresses, parse_nodeport_cidrs
    from proxy.service_proxy import NodeSource, ProxySettings, ServiceProxy

    try:
        cidrs = parse_nodeport_cidrs(args.nodeport_addresses)
    except NodePortAddressError as error:
        raise ProxyStartError(str(error)) from None
    local_addresses = NetlinkLocalAddresses()
    local = local_addresses.ipv4() if cidrs else ()
    if cidrs and not nodeport_addresses(local, cidrs):
        raise ProxyStartError(f"--nodeport-addresses {','.join(cidrs)}: no local address is inside them "
                              f"(local: {', '.join(local) or 'none'})")
    min_sync = args.min_sync_period or DEFAULT_MIN_SYNC_PERIOD
    try:
        limits = limits_from_args(args)
    except ValueError as error:
        raise ProxyStartError(str(error)) from None
    settings = ProxySettings(node_name=args.node_name, cluster_cidr=cluster_cidr, nodeport_cidrs=cidrs,
                             min_sync_period=min_sync, sync_period=args.sync_period, limits=limits)
    scope = rejections if rejections is not None else standalone("proxy")
    try:
        # the eBPF backend's map-full records: a scope of their own, so the catalog accepting a
        # Service never clears them (and they never overwrite the catalog's)
        backend = build_backend(args.proxy_mode, iptables_backend=iptables_backend, scheduler=args.ipvs_scheduler,
                                ebpf=ebpf_paths(args), rejections=scope.rejections.scope("proxy-ebpf"))
    except (BackendConfigError, ValueError) as error:   # ValueError: a bad --bpf-map-max
        raise ProxyStartError(str(error)) from None
    report = getattr(backend, "load_report", None)
    if report is not None:
        log.info("ebpf: compiled in %.2f s, loaded and attached in %.3f s (attached %s; kept %s)",
                 report.compile_seconds, report.load_seconds, ", ".join(report.attached) or "none",
                 ", ".join(report.kept) or "none")
        for line in report.resized:
            log.warning("ebpf: pinned map changed: %s", line)
    health_checks = HealthCheckPorts()
    proxy = ServiceProxy(api_client=api_client, settings=settings, backend=backend, registry=registry,
                         conntrack=ConntrackCommand(), healthcheck=health_checks,
                         local_addresses=local_addresses, node_source=NodeSource.SHARED, rejections=scope)
    # a change left unprogrammed for longer than this makes the proxy unhealthy
    from netagent.daemon.rejection_reports import with_rejections
    health = with_rejections(health_from_sync_runner(proxy.runner, stale_after=max(2 * args.sync_period, 60.0)),
                             scope)
    health_checks.proxy_healthy = lambda: health().healthy

    healthz = StatusServer(bind=args.healthz_bind_address, registry=None, health=health)
    binds = metrics_binds(args)
    metrics = StatusServer(bind=binds, registry=registry, health=health, pages={
        "/proxyMode": ("text/plain; charset=utf-8", lambda: args.proxy_mode),
        "/services": ("application/json", lambda: services_json(args.proxy_mode, backend.programmed())),
    }) if binds else None
    return ProxyParts(proxy=proxy, servers=(healthz, metrics) if metrics is not None else (healthz,))
