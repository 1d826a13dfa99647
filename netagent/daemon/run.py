"""`netagent run`: compose the daemon from its parts and run it until SIGTERM.

Two shapes: `--cni-only` serves the CNI plugin alone (plain containerd or podman hosts);
the default cluster mode adds the node agent (Kubernetes watch, node routes, masquerade),
the status server (/healthz, /livez, /readyz on `--status-bind`, what the kubelet probes) and
/metrics on `--metrics-bind-address` (loopback by default; the proxy's server when it runs),
whose /healthz alone carries the details (rejected objects, runner errors: status_server.py
serves them on loopback only). The CNI server starts only once the node
agent has its lease and has programmed the routes: until then the CNI shim finds no socket
and answers "try again later" (code 11; the runtime retries) and journals DELs, which the
agent adopts before it serves; the Python client (the lab's) works in-process instead.
This module only wires; each part owns its behaviour. It is handed the `DaemonConfig`
config.py parsed from the flags once (cli.py does it), and hands each part its typed piece:
`CniConfig` to the CNI server and the conflist writer, `AgentSettings` to the node agent,
`ProxyConfig`, `PolicyConfig`, `BgpConfig` and `StatusConfig` to theirs, with the `Dataplane`
dataplane.py resolves once at start (the proxy mode that runs, iptables or nftables).
What cannot start is raised, never printed here: errors of ours (`NetagentError`) and the
system's (`OSError`) as they are, another `RuntimeError` as a `StartupError` with its message;
the CLI reports it once (`netagent run: <message>`, exit code 1), after what had started is
stopped (`_Started`, in a `finally`).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from netagent import __version__
from netagent.errors import NetagentError
from netagent.cniserver.defaults import DEFAULT_DATA_DIR, DEFAULT_SOCKET
from netagent.daemon.config import CniConfig, ClusterConfig, DaemonConfig, PolicyConfig, StatusConfig
from netagent.kernel.pod_attachment import POD_ATTACHMENT_CHOICES, PodAttachment
from netagent.noderoutes.routing.model import Mode

if TYPE_CHECKING:
    from netagent.daemon.dataplane import Dataplane
    from netagent.noderoutes.host import Lease

log = logging.getLogger("netagent")


class StartupError(NetagentError, RuntimeError):
    """Something `netagent run` needs could not start (the message says what); cli.py reports
    it as every error of ours: `netagent run: <message>` on stderr, exit code 1."""


def add_run_arguments(run: argparse.ArgumentParser) -> None:
    run.add_argument("--cni-only", action="store_true",
                     help="serve the CNI plugin only, with no cluster (plain containerd/podman hosts)")
    run.add_argument("--cni-socket", default=DEFAULT_SOCKET)
    run.add_argument("--workers", type=int, default=8, help="CNI worker threads")
    cluster = run.add_argument_group("cluster mode")
    cluster.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, then in-cluster)")
    cluster.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                         help="this node's Node name (default: $NODE_NAME)")
    cluster.add_argument("--cluster-cidr", action="append", default=[],
                         help="the cluster's pod network, once per IP family (IPv4 and/or IPv6); every peer's pod CIDR "
                              "must lie inside it")
    cluster.add_argument("--service-cidr", action="append", default=[],
                         help="the cluster's Service range (repeat for dual stack; default 10.96.0.0/12 as "
                              "kubeadm): no peer's pod CIDR may overlap it")
    cluster.add_argument("--backend", choices=[mode.value for mode in Mode], default=Mode.VXLAN.value)
    cluster.add_argument("--auto-encap", choices=[Mode.VXLAN.value, Mode.IPIP.value], default=Mode.VXLAN.value,
                         help="in auto mode, the encapsulation for peers on other subnets")
    cluster.add_argument("--vxlan-vni", type=int, default=1)
    cluster.add_argument("--vxlan-port", type=int, default=4789)
    cluster.add_argument("--vxlan-checksum-offload", choices=["auto", "on", "off"], default="auto",
                         help="tx checksum offload on the VXLAN device; auto: off on kernels before 5.7 "
                              "(their NAT checksum bug) and behind NAT, on otherwise")
    from netagent.daemon.bgp_start import add_bgp_flags
    add_bgp_flags(cluster)
    cluster.add_argument("--iface", help="the underlay interface, by name (its IPv4 and global IPv6 addresses)")
    cluster.add_argument("--iface-regex", help="the underlay interface, by a regex that must match one")
    cluster.add_argument("--lease-timeout", type=float, default=60.0,
                         help="seconds to wait for this Node and its spec.podCIDR")
    cluster.add_argument("--masquerade", choices=["on", "off"], default="on",
                         help="masquerade pod traffic leaving the cluster CIDR")
    cluster.add_argument("--iptables-backend", choices=["auto", "legacy", "nft"], default="auto")
    cluster.add_argument("--cni-conf-dir", default="/etc/cni/net.d",
                         help="where to publish the network config with this node's pod CIDR ('' to skip)")
    cluster.add_argument("--cni-mode", choices=POD_ATTACHMENT_CHOICES, default=PodAttachment.BRIDGE.value)
    cluster.add_argument("--cni-portmap", choices=["auto", "on", "off"], default="auto",
                         help="chain the reference portmap plugin after netagent in the network config (pods' "
                              "hostPorts); auto: when --cni-bin-dir holds it")
    cluster.add_argument("--cni-bin-dir", default="/opt/cni/bin",
                         help="where the runtime finds CNI plugins (--cni-portmap auto looks for portmap there)")
    cluster.add_argument("--cni-data-dir", default=DEFAULT_DATA_DIR)
    cluster.add_argument("--status-bind", default="0.0.0.0:10258",
                         help="/healthz, /livez and /readyz (the kubelet's probes; /metrics: --metrics-bind-address)")
    cluster.add_argument("--resync-period", type=float, default=30.0,
                         help="seconds between full reconciles (drift repair)")
    cluster.add_argument("--min-sync-period", type=float, default=0.0,
                         help="minimum seconds between syncs (coalesces bursts of Node changes; the service "
                              "proxy uses at least 1 s, kube-proxy's default)")
    from netagent.daemon.proxy_start import add_proxy_arguments
    add_proxy_arguments(run)
    # Not given: iptables, or nftables where iptables cannot work (daemon/dataplane.py decides).
    run.set_defaults(proxy_mode=None)
    from netagent.daemon.policy_start import add_policy_arguments
    add_policy_arguments(run)


def _wait_for_signal() -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()


def _start_cni_server(cni: CniConfig, *, not_ready=lambda: None, runners: list | None = None, policy=None,
                      add_wait: float = 0.0, registry=None):
    """Serve the CNI socket; returns its stop. The DEL journal's runner joins `runners` (/healthz);
    its request metrics go to `registry` (`cniserver/metrics.py`) when given.
    With `policy` (the started engine) an ADD programs its pod before replying, waiting at most
    `add_wait` seconds for its Pod (policy_start.py)."""
    from cni.dispatch import Handlers
    from cni.handlers import PluginHandlers
    from netagent.cniserver.deferred_delete import DeferredDeleter, journal_dir_for
    from netagent.cniserver.server import CniServer

    handlers = PluginHandlers()
    deferred = DeferredDeleter(journal_dir_for(cni.socket), delete_now=handlers.delete_now)
    handlers.deferred = deferred
    deferred.start()
    served: Handlers = handlers
    if policy is not None:
        from netagent.cniserver.policy_binding import PolicyBoundHandlers
        served = PolicyBoundHandlers(handlers, policy.engine, wait=add_wait)
    from netagent.cniserver.metrics import CniMetrics
    server = CniServer(cni.socket, handlers=served, workers=cni.workers, not_ready=not_ready,
                       metrics=CniMetrics(registry) if registry is not None else None)
    try:
        server.start(before_serving=lambda: deferred.adopt_shim_records(handlers))
    except BaseException:
        deferred.stop()
        raise
    if runners is not None:
        runners.append(deferred.runner)

    def stop() -> None:
        server.stop()
        deferred.stop()
    return stop


class _Started:
    """What `netagent run` has started, stopped in reverse order: one shutdown for the error
    path and the normal one. A stop that raises is logged and the others still run."""

    def __init__(self) -> None:
        self._stops: list[Callable[[], object]] = []

    def add(self, stop: Callable[[], object]) -> None:
        self._stops.append(stop)

    def stop_all(self) -> None:
        while self._stops:
            stop = self._stops.pop()
            try:
                stop()
            except Exception:
                log.exception("stopping %s", getattr(stop, "__qualname__", stop))


def _with_runner_health(base, runners: Callable[[], list], *, stale_after: float):
    """`base` (the agent's /healthz), also unhealthy while a background runner is: the DEL
    journal's, the eBPF proxy's pod veth attacher. Each is listed in the details by name."""
    from netagent.infra.status_server import HealthReport, health_from_sync_runner

    def health() -> HealthReport:
        report = base()
        details, failing = dict(report.details), []
        for runner in runners():
            checked = health_from_sync_runner(runner, stale_after=stale_after)()
            details[runner.name] = {"healthy": checked.healthy, "reason": checked.reason, **checked.details}
            if not checked.healthy:
                failing.append(checked.reason)
        if not failing:
            return HealthReport(report.healthy, report.reason, details)
        reason = "; ".join(failing)
        return HealthReport(False, reason if report.healthy else f"{report.reason}; {reason}", details)
    return health


def _register_runner_metrics(registry, agent, proxy, started_policy: list, cni_runners: list) -> None:
    """Every sync runner of the process, as it is at scrape time (`infra/runner_metrics.py`)."""
    from netagent.infra.runner_metrics import register_runner_metrics
    background = _background_runners(proxy, cni_runners)

    def runners() -> list:
        found = [agent.runner, *(p.runner for p in (proxy.proxies if proxy is not None else ()))]
        for policy in started_policy:
            found.append(policy.runner)
            if policy.anti_spoofing is not None:
                found.append(policy.anti_spoofing.runner)
        return [runner for runner in (*found, *background()) if runner is not None]
    register_runner_metrics(registry, runners)


def _background_runners(proxy, cni_runners: list) -> Callable[[], list]:
    """The runners /healthz adds to the agent's: the CNI server's (once it serves) and the pod
    veth attacher of an eBPF proxy started with `--bpf-pod-veths`."""
    def runners() -> list:
        backend = getattr(proxy.proxy, "backend", None) if proxy is not None else None
        pod_veths = getattr(backend, "pod_veths", None)
        return [*cni_runners, *([pod_veths.runner] if pod_veths is not None else [])]
    return runners


def run_agent(config: DaemonConfig) -> int:
    """Run until SIGTERM: the CNI server alone (`--cni-only`: no `config.cluster`) or the
    whole cluster mode. 0 on a clean stop; what could not start is raised (`NetagentError`,
    `OSError`), what had started stopped first."""
    if config.cluster is None:
        try:
            stop_cni = _start_cni_server(config.cni)
        except NetagentError:
            raise
        except RuntimeError as exc:   # the system's (the socket is another agent's, ...)
            raise StartupError(str(exc)) from exc
        print(f"netagent {__version__}: serving CNI on {config.cni.socket}", flush=True)
        _wait_for_signal()
        stop_cni()
        return 0
    return _run_cluster_mode(config.cni, config.cluster)


def _cni_config_writer(cni: CniConfig) -> Callable[[Lease], None]:
    """The node agent's `on_lease`: publish the network config with this node's pod CIDRs and
    MTU (`--cni-conf-dir`; '' skips it)."""
    def write(lease: Lease) -> None:
        if not cni.conf_dir:
            return
        portmap = cni.portmap if cni.portmap is not None else os.access(os.path.join(cni.bin_dir, "portmap"),
                                                                          os.X_OK)
        from netagent.cniserver import install as cni_install
        from netagent.kernel import owned
        path = cni_install.write_conflist(
            conf_dir=cni.conf_dir, name=cni.network, subnets=[str(c) for c in lease.pod_cidrs],
            mode=cni.attachment, bridge=owned.DEFAULT_BRIDGE, mtu=lease.mtu, socket_path=cni.socket,
            data_dir=cni.data_dir, portmap=portmap)
        log.info("CNI config %s: pod CIDR(s) %s, MTU %d%s", path, ", ".join(map(str, lease.pod_cidrs)), lease.mtu,
                 ", portmap chained" if portmap else "")
    return write


def _run_cluster_mode(cni: CniConfig, cluster: ClusterConfig) -> int:
    from netagent.daemon.proxy_start import build_proxy
    from netagent.infra.metrics import Registry
    from netagent.infra.status_server import StatusServer
    from netagent.kernel.families import IpFamily
    from netagent.kernel.iptables.backend import BackendChoice, resolve_backend
    from netagent.kernel.iptables.runner import IptablesRunner
    from netagent.kernel.sysctl import ProcSysctls
    from netagent.kube.config import api_server_addresses, load_api_client
    from netagent.noderoutes.agent import NodeAgent
    from netagent.noderoutes.host import HostAccess, KubeNodeApi
    from netagent.noderoutes.routing.kernel import NetlinkKernel

    from netagent.daemon.dataplane import resolve_dataplane
    from netagent.kernel.nftables.runner import NftRunner
    # each raises an error of ours (KubeConfigError, DataplaneError, IptablesNotInstalled, NftError)
    api_client = load_api_client(kubeconfig=cluster.kubeconfig)
    settings = dataclasses.replace(cluster.routing, api_server_addresses=api_server_addresses(api_client))
    dataplane = resolve_dataplane(cluster.proxy.requested)
    log.info("dataplane: %s", dataplane.reason)
    # nftables mode needs no iptables; it uses the host's only for the FORWARD-drop case
    backend = resolve_backend(cluster.iptables_backend, family=IpFamily.V4) if dataplane.iptables else None
    nft = NftRunner() if dataplane.nftables else None
    registry = Registry()
    from netagent.infra.process_metrics import register_process_metrics
    register_process_metrics(registry)
    from netagent.daemon.rejection_reports import build_rejections, with_rejections
    rejections, event_poster = build_rejections(registry, api_client=api_client, node_name=settings.node_name)
    cluster_cidrs = {IpFamily.of(c): str(c) for c in reversed(settings.cluster_cidrs)}   # the first per family
    # /status on the metrics address; its policy read takes the backend resolved here (no detection per read)
    from netagent.daemon.status_page import AgentSources
    page = AgentSources(node_name=settings.node_name, routing_mode=settings.routing.mode.value,
                        proxy_mode=dataplane.proxy, policy_on=cluster.policy.enabled,
                        bgp_state_dir=cluster.bgp.state_dir if cluster.bgp.wanted else None,
                        iptables_backend=BackendChoice(backend.value) if backend else cluster.iptables_backend)
    proxy = build_proxy(cluster.proxy, mode=dataplane.proxy, metrics_binds=cluster.status.metrics_binds,
                        api_client=api_client, iptables_backend=backend, registry=registry,
                        cluster_cidrs=cluster_cidrs, rejections=rejections.scope("proxy"),
                        pages=page.pages())   # or ProxyStartError
    page.proxies = proxy.proxies if proxy is not None else ()
    # one Node reflector per process: the proxy hears about its own Node through the agent's
    from netagent.daemon.bgp_start import build_bgp
    bgp, bgp_config = build_bgp(cluster.bgp, api_client=api_client, rejections=rejections.scope("bgp"))
    # IPv4's iptables, and ip6tables with an IPv6 cluster CIDR (the IPv6 masquerade's)
    families = {IpFamily.V4} | {IpFamily.of(c) for c in settings.cluster_cidrs}
    host = HostAccess(kernel=NetlinkKernel(), sysctls=ProcSysctls(),
                      iptables={family: IptablesRunner(backend=backend, family=family) for family in IpFamily
                                if family in families} if backend is not None else {},
                      nft=nft, kernel_release=os.uname().release, bgp=bgp)
    agent = NodeAgent(settings, api=KubeNodeApi(api_client), host=host, registry=registry,
                      node_listeners=proxy.node_listeners if proxy is not None else [],
                      rejections=rejections.scope("noderoutes"), on_lease=_cni_config_writer(cni))
    page.agent = agent
    from netagent.daemon.policy_start import with_policy_health
    started_policy: list = []
    cni_runners: list = []
    _register_runner_metrics(registry, agent, proxy, started_policy, cni_runners)
    agent_health = _with_runner_health(agent.health, _background_runners(proxy, cni_runners), stale_after=60.0)
    health = with_rejections(
        with_policy_health(agent_health, started_policy, stale_after=max(2 * cluster.policy.sync_period, 60.0)),
        rejections)
    status = StatusServer(bind=cluster.status.status_bind, registry=None, health=health)   # off loopback: no details
    for server in proxy.servers if proxy is not None else ():
        if server.registry is not None:   # the metrics server (loopback): the whole agent's details
            server.serve_health(health)
    started = _Started()
    try:   # whatever has started is stopped, on SIGTERM and when something else cannot start
        started.add(event_poster.stop)
        if bgp_config is not None:
            started.add(bgp_config.stop)
        status.start()
        started.add(status.stop)
        policy = None
        metrics = _metrics_server(cluster.status, registry=registry, health=health,
                                  pages=page.pages()) if proxy is None else None
        try:
            started.add(agent.stop)   # before start: a start that fails half-way is stopped too
            agent.start()
            if proxy is not None:
                started.add(proxy.stop)
                proxy.start()
            if metrics is not None:
                started.add(metrics.stop)
                metrics.start()
            policy = _start_policy(cluster.policy, dataplane=dataplane, api_client=api_client, backend=backend,
                                   registry=registry,
                                   rejections=rejections.scope("policy"),
                                   pod_cidrs=[str(c) for c in agent.pod_cidrs],   # both families: one dataplane each
                                   timeout=settings.lease_timeout)
            if policy is not None:
                started_policy.append(policy)
                started.add(policy.stop)
                policy.serve_flows([metrics, *(proxy.servers if proxy is not None else ())])   # /flows
            else:
                _start_anti_spoofing_alone(cluster.policy, dataplane=dataplane, backend=backend,
                                           pod_cidrs=[str(c) for c in agent.pod_cidrs],
                                           started=started)
            from netagent.daemon.proxy_start import start_ebpf_flows   # eBPF mode: the socket LB's flows
            started.add(start_ebpf_flows(proxy, policy.flows if policy is not None else None))
            started.add(_start_cni_server(cni, runners=cni_runners, policy=policy,
                                          add_wait=cluster.policy.add_wait, registry=registry))
        except (NetagentError, OSError) as exc:   # ours (AgentStartError, ...) or the system's
            log.error("%s", exc)
            raise
        except RuntimeError as exc:   # the system's, reported as ours
            log.error("%s", exc)
            raise StartupError(str(exc)) from exc
        print(f"netagent {__version__}: node {settings.node_name} ready ({settings.routing.mode.value}, "
              f"iptables {backend.value if backend is not None else 'unused'}, proxy {dataplane.proxy_mode.value}, "
              f"network policy {'on' if policy is not None else 'off'}); serving CNI on {cni.socket}, "
              f"status on {cluster.status.status_bind}", flush=True)
        _wait_for_signal()
    finally:
        started.stop_all()
    return 0


def _metrics_server(status: StatusConfig, *, registry, health, pages=None):
    """/metrics (and `pages`: /status) on `--metrics-bind-address` when no proxy serves it (the
    proxy's server does)."""
    from netagent.infra.status_server import StatusServer
    binds = list(status.metrics_binds)
    return StatusServer(bind=binds, registry=registry, health=health, pages=pages) if binds else None


def _start_anti_spoofing_alone(config: PolicyConfig, *, dataplane: Dataplane, backend, pod_cidrs: list[str],
                               started: _Started) -> None:
    """Pod anti-spoofing is not NetworkPolicy: with the policy off it runs on its own (its flag
    decides; `build_anti_spoofing` removes a previous run's rules when it is off)."""
    from netagent.daemon.policy_start import build_anti_spoofing
    guard = build_anti_spoofing(config, netfilter=dataplane.netfilter, iptables_backend=backend, pod_cidrs=pod_cidrs)
    if guard is not None:
        started.add(guard.stop)
        guard.start()


def _start_policy(config: PolicyConfig, *, dataplane: Dataplane, api_client, backend, registry, rejections,
                  pod_cidrs, timeout: float):
    """Start NetworkPolicy enforcement and wait for its first sync, BEFORE the CNI server
    serves (policy_start.py says why); with the flag off, remove what a previous run left."""
    from netagent.daemon.policy_start import build_policy, remove_policy_state
    if not config.enabled:
        for removed in remove_policy_state(backend):   # backend None: iptables cannot work here
            log.info("network policy off: removed %s", removed)
        return None
    policy = build_policy(config, dataplane=dataplane, api_client=api_client, iptables_backend=backend,
                          registry=registry, rejections=rejections, pod_cidrs=pod_cidrs)
    policy.start()
    if not policy.wait_first_sync(timeout):
        policy.stop()
        raise StartupError(f"network policy: no first sync within {timeout:.0f} s (the NetworkPolicy, "
                           f"Pod and Namespace watches must list; see the log)")
    return policy
