"""The real kube-proxy (the pinned k8s/go.mod version) beside netagent's proxy modes, same objects, same machine.

`bench/service_proxy.py` calls `bench_kube_proxy` per mode and size, in a child process
(`isolated`), so each run is a fresh namespace, a fresh API server and a fresh kube-proxy:

- the binary is `scripts/build-kubernetes`'s (lab/kubernetes/binaries.py's directory); the
  version recorded is the pinned one, checked against what the binary prints;
- the namespace is the bench's own (`service_proxy_kit.bench_namespace`: the listener's veth
  and route); kube-proxy runs in it with `ip netns exec`, never in the root namespace, its
  metrics and healthz on loopback ports there, its settings in a KubeProxyConfiguration file
  (`render_config`) and `--hostname-override` naming the Node object made here;
- the API server is the lab's (lab/apiserver), in this process, serving on a socket opened
  inside the namespace (kube-proxy reaches 127.0.0.1 there); it holds the very state netagent
  programs (`service_proxy_kit.make_state`, the last service's one endpoint the listener),
  as Services and EndpointSlices (`api_objects`) created before kube-proxy starts;
- the iptables backend is picked as kube-proxy's images end up doing (their wrapper links
  `iptables` to one variant): `iptables`, `iptables-save`, `iptables-restore` (and
  ip6tables') first on its PATH are links to the `-legacy` or `-nft` binaries (`backend_links`);
- every figure is read from the kernel (`kube_proxy_kernel.py` owns the readings), never from
  kube-proxy's log. Full sync: kube-proxy's start (objects present) to the service dispatch
  (KUBE-SERVICES jumps, or the nftables `service-ips` map) holding every service, confirmed by
  a whole count of the endpoints DNATed; on iptables-legacy, the moment the nat table reached
  its final entry count (sampled every 2 ms). One change: an EndpointSlice update in the API
  server to the new endpoint's address in that service's chain, seen by `nft monitor` (the
  commit's own event) in nftables mode, by polling the service's chain in iptables mode. Each
  poll's duration is the resolution and is printed with the figures. RSS and CPU (user +
  system, its waited-for children `iptables-restore`/`nft` included) come from /proc of the
  kube-proxy process when its rules are complete.

The lab API server does not serve networking.k8s.io ServiceCIDRs nor events.k8s.io Events:
kube-proxy logs that it cannot list the one and that its start event was rejected, and works on
(the ServiceCIDR informer does not hold back its first sync).
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time

from lab.apiserver import ApiServer
from lab.apiserver.objects import Subresource
from lab.kubernetes import binaries
from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from kube_proxy_kernel import (MODES, KubeProxyError, LegacyEntries, NftMonitor, Probe, proc_figures,
                               service_chains)
from proxy.model import ProxyState, ServicePortName
from service_proxy_kit import (NODE, SERVICE_CIDRS, bench_namespace, connect_latency, last_service, make_state,
                               with_listener, with_one_endpoint_changed)

NODE_NAME = "node-a"
METRICS_PORT, HEALTHZ_PORT = 10249, 10256   # loopback of the bench namespace
IPTABLES_TOOLS = ("iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore")


def binary() -> str:
    path = os.path.join(binaries.bin_dir(), "kube-proxy")
    if not os.access(path, os.X_OK):
        raise KubeProxyError(f"no kube-proxy at {path}: run scripts/build-kubernetes (it builds the pinned version)")
    return path


def version() -> str:
    """The pinned version (k8s/go.mod), after checking the binary says the same."""
    pinned = binaries.version()
    said = subprocess.run([binary(), "--version"], capture_output=True, text=True, timeout=60).stdout.split()
    if pinned not in said:
        raise KubeProxyError(f"{binary()} says {' '.join(said)!r}, k8s/go.mod pins {pinned}: rebuild it")
    return pinned


def render_kubeconfig(server: str) -> str:
    """A kubeconfig (JSON is YAML) for an unauthenticated plain-HTTP server."""
    return json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "bench",
                       "clusters": [{"name": "bench", "cluster": {"server": server}}],
                       "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "bench"}}],
                       "users": [{"name": "bench", "user": {}}]}, indent=1)


def render_config(mode: str, *, kubeconfig: str, cluster_cidr: str) -> str:
    """The KubeProxyConfiguration for one of `MODES`: its proxy mode, the lab server's kubeconfig,
    local traffic told by the cluster CIDR (netagent's setting), metrics and healthz on the
    namespace's loopback, and conntrack sysctls left alone (the host's are not ours to size)."""
    if mode not in MODES:
        raise KubeProxyError(f"{mode!r}: not a kube-proxy mode ({', '.join(MODES)})")
    return json.dumps({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "mode": MODES[mode][0],
        "clientConnection": {"kubeconfig": kubeconfig, "qps": 50, "burst": 100},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": cluster_cidr, "detectLocalMode": "ClusterCIDR",
        "metricsBindAddress": f"127.0.0.1:{METRICS_PORT}", "healthzBindAddress": f"127.0.0.1:{HEALTHZ_PORT}",
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
        "oomScoreAdj": 0,
    }, indent=1)


def backend_links(backend: str, directory: str, sbin: str = "/usr/sbin") -> None:
    """`iptables` & co. in `directory` linked to the `-legacy`/`-nft` binaries of `backend`."""
    if backend not in ("legacy", "nft"):
        raise KubeProxyError(f"{backend!r}: an iptables backend is legacy or nft")
    for tool in IPTABLES_TOOLS:
        command, _, verb = tool.partition("-")
        target = os.path.join(sbin, f"{command}-{backend}" + (f"-{verb}" if verb else ""))
        if not os.path.exists(target):
            raise KubeProxyError(f"{target} is missing: iptables-{backend} is not installed")
        os.symlink(target, os.path.join(directory, tool))


def api_objects(state: ProxyState) -> list[dict]:
    """The Node (its addresses the node's), the namespaces, and per service port a Service and
    its EndpointSlice."""
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": state.node.name},
            "status": {"addresses": [{"type": "InternalIP", "address": a} for a in state.node.local_addresses]}}
    objects: list[dict] = [node]
    for namespace in sorted({name.namespace for name in state.services}):
        objects.append({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for name, port in state.services.items():
        spec_port = {"name": name.port, "port": port.port, "targetPort": 8080, "protocol": port.protocol.value}
        if port.node_port:
            spec_port["nodePort"] = port.node_port
        objects.append({"apiVersion": "v1", "kind": "Service",
                        "metadata": {"name": name.name, "namespace": name.namespace},
                        "spec": {"type": "NodePort" if port.node_port else "ClusterIP", "clusterIP": port.cluster_ip,
                                 "clusterIPs": [port.cluster_ip], "ipFamilies": [state.family.label],
                                 "ports": [spec_port]}})
        objects.append(endpoint_slice(state, name))
    return objects


def endpoint_slice(state: ProxyState, name: ServicePortName) -> dict:
    endpoints = state.endpoints.get(name, ())
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{name.name}-1", "namespace": name.namespace,
                         "labels": {"kubernetes.io/service-name": name.name}},
            "addressType": state.family.label,
            "ports": [{"name": name.port, "port": endpoints[0].port if endpoints else 8080,
                       "protocol": state.services[name].protocol.value}],
            "endpoints": [{"addresses": [e.ip], "conditions": {"ready": True}, "nodeName": e.node_name}
                          for e in endpoints]}


@contextlib.contextmanager
def api_server_in(netns: str, objects: list[dict], service_cidr: str):
    """The lab API server, holding `objects`, serving on a socket opened inside `netns`; yields
    (server, URL seen from the namespace)."""
    fd = os.open(namespaces.netns_path(netns), os.O_RDONLY | os.O_CLOEXEC)
    try:
        with namespaces.entered(fd):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
    finally:
        os.close(fd)
    api = ApiServer(service_cidr=service_cidr)
    api.start(listening=(sock,))
    try:
        for obj in objects:
            api.create(obj)
            if "status" in obj:   # what a create drops, as the real server does
                api.update(obj, part=Subresource.STATUS)
        yield api, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        api.stop()


def bench_kube_proxy(mode: str, services: int, samples: int, connects: int = 0, timeout: float = 1800) -> dict:
    """One kube-proxy mode at one size: full sync, `samples` one-endpoint changes through the API
    server, connect() latency over `connects`, rules, RSS and CPU; the bench's record figures."""
    kind, backend = MODES.get(mode, (None, None))
    if kind is None:
        raise KubeProxyError(f"{mode!r}: not a kube-proxy mode ({', '.join(MODES)})")
    pinned = version()
    state = with_listener(make_state(services))
    with tempfile.TemporaryDirectory(prefix="na-bench-kube-proxy-") as work, bench_namespace() as netns, \
            api_server_in(netns, api_objects(state), SERVICE_CIDRS[IpFamily.V4]) as (api, url):
        env = dict(os.environ)
        if backend is not None:
            links = os.path.join(work, "bin")
            os.mkdir(links)
            backend_links(backend, links)
            env["PATH"] = f"{links}:{env.get('PATH', '/usr/sbin:/usr/bin:/sbin:/bin')}"
        config = render_config(mode, kubeconfig=os.path.join(work, "kubeconfig"), cluster_cidr=NODE.cluster_cidr or "")
        for file_name, text in (("kubeconfig", render_kubeconfig(url)), ("config.yaml", config)):
            with open(os.path.join(work, file_name), "w") as f:
                f.write(text)
        log_path = os.path.join(work, "kube-proxy.log")
        probe = Probe(mode, netns)
        entries = LegacyEntries(netns) if backend == "legacy" else None
        with open(log_path, "wb") as log:
            started = time.perf_counter()
            proc = subprocess.Popen([*namespaces.exec_prefix(netns), binary(), "--config",
                                     os.path.join(work, "config.yaml"), f"--hostname-override={NODE_NAME}", "-v=1"],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env)

        def alive() -> None:
            if proc.poll() is not None:
                with open(log_path, errors="replace") as f:
                    tail = f.read()[-3000:]
                raise KubeProxyError(f"kube-proxy exited {proc.returncode}; its log ends:\n{tail}")

        try:
            want_services, want_endpoints = len(state.services), sum(len(e) for e in state.endpoints.values())
            while True:   # the dispatch is written in the same transaction as the rest: confirm by a whole count
                full = probe.until(lambda: probe.dispatch_size() >= want_services, started, timeout, alive)
                rss, cpu = proc_figures(proc.pid)
                listing = probe.listing()
                counted = probe.counts(listing)
                if counted["dnat"] >= want_endpoints:
                    break
                if time.perf_counter() - started > timeout:
                    raise KubeProxyError(f"every service in the dispatch but {counted['dnat']} of {want_endpoints} "
                                         f"endpoints' DNAT rules after {timeout:.0f} s")
            full_poll = probe.durations[-1]
            if entries is not None:   # the table replace itself, to within a 2 ms sample
                landed = entries.reached(entries.entries())
                if landed is not None:   # a poll's midpoint misleads here: it waits for kube-proxy's xtables lock
                    full, full_poll = landed - started, 0.002
                entries.close()
                entries = None
            chains = service_chains(mode, listing)
            probe.known(listing)
            changes, last, polls = [], last_service(state), len(probe.durations)
            monitor = NftMonitor(netns) if kind == "nftables" else None
            try:
                change_timeout = max(120.0, 5 * full)
                if monitor is not None:
                    monitor.ready(max(300.0, 5 * full))
                for sample in range(samples):
                    time.sleep(1.1)   # past kube-proxy's minSyncPeriod (1 s): a lone change in a quiet cluster
                    state, name = with_one_endpoint_changed(state, sample)
                    new_ip, chain = state.endpoints[name][0].ip, chains[state.services[name].cluster_ip]
                    began = time.perf_counter()
                    api.update(endpoint_slice(state, name))
                    if monitor is not None:
                        changes.append(monitor.first(new_ip, began, change_timeout) - began)
                        alive()
                    else:
                        changes.append(probe.until(lambda: probe.chain_holds(chain, new_ip), began, change_timeout,
                                                   alive))
                if monitor is not None:   # the event was the commit: the chain holds the address now
                    if not probe.chain_holds(chain, new_ip):
                        raise KubeProxyError(f"an event named {new_ip} but {chain} does not hold it")
            finally:
                if monitor is not None:
                    monitor.close()
            change_polls = probe.durations[polls:] if monitor is None else [0.0]
            result = {"version": pinned, "full": full, "full_poll": full_poll, "rss": rss, "cpu": cpu,
                      "change": statistics.median(changes) if changes else None,
                      "change_max": max(changes) if changes else None,
                      "change_poll": statistics.median(change_polls) if changes else None,
                      "rules": counted["rules"], "dnat": counted["dnat"], **({"elements": counted["elements"]}
                                                                              if "elements" in counted else {})}
            if connects:
                listener_state = with_listener(state)
                if listener_state.endpoints[last] != state.endpoints[last]:   # a change hit the last service
                    api.update(endpoint_slice(listener_state, last))
                    vip = state.services[last].cluster_ip
                    probe.until(lambda: probe.chain_holds(chains[vip], listener_state.endpoints[last][0].ip),
                                time.perf_counter(), 120, alive)
                result["connect"] = connect_latency(netns, None, state.services[last].cluster_ip, connects)
            alive()
            return result
        finally:
            if entries is not None:
                entries.close()
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
