"""The floors of the service proxy benchmark: kube-proxy-shaped rulesets loaded by the tools alone.

What the kernel and the stock tools cost for the same services and endpoints as the bench
state (`service_proxy_kit.make_state`), written the way kube-proxy structures them, with no
agent around: a lower bound on what kube-proxy pays, to hold netagent's figures against.

- iptables (`floor-kube-proxy-iptables-legacy`, `-iptables-nft`): KUBE-SERVICES, a KUBE-SVC
  chain per service with a `statistic` rule per endpoint, a KUBE-SEP chain per endpoint with
  its masquerade-mark and DNAT rules; loaded with `iptables-restore --noflush`.
- nftables (`floor-kube-proxy-nftables`), the structure of kube-proxy's nftables mode
  (KEP-3866): table `ip kube-proxy` whose `services` chain looks the destination up in the
  verdict maps `service-ips` (`ip daddr . meta l4proto . th dport`) and `service-nodeports`;
  a chain per service port (`service-<hash>-<ns>/<name>/<proto>/<port>`) that marks
  off-cluster clients for masquerade and picks an endpoint with
  `numgen random mod N vmap { 0 : goto endpoint-..., ... }`; a chain per endpoint with the
  hairpin masquerade mark and `dnat to`; an `external-` chain per NodePort; the
  no-endpoint and firewall maps, cluster-ips checks, and the mark-for-masquerade and
  masquerading chains. Written as `add` commands in one `nft -f` transaction, as kube-proxy
  does. The one change is what kube-proxy's partial sync writes for one endpoint replaced:
  the new endpoint's chain, the service chain flushed and rewritten, the stale endpoint
  chain flushed (deleted by a later sync).

Rendered here from the bench state (pure functions), loaded into a bench namespace.

Since the bench runs the real kube-proxy (`bench/real_kube_proxy.py`), a floor runs only where
the real one did not (`--floors auto`), or beside it when asked (`--floors always`). The
nftables shape here is an earlier kube-proxy's: the real v1.37.2 writes no chain per endpoint
(one `dnat to numgen random mod N map { ... }` rule per service), so the two differ there.
"""
from __future__ import annotations

import base64
import hashlib
import resource
import statistics
import subprocess
import time

from netagent.kernel import namespaces
from proxy.model import ProxyState, ServicePortName
from service_proxy_kit import (ENDPOINTS, bench_namespace, connect_latency, count_nft, last_service, make_state,
                               pod_ip, vip, with_listener, with_one_endpoint_changed)

TABLE = "kube-proxy"
SERVICE_CIDR = "10.96.0.0/12"
MASQUERADE_BIT = "0x4000"


# ---- iptables: kube-proxy's iptables mode

def iptables_shaped(services: int) -> str:
    """A ruleset shaped as kube-proxy's iptables mode writes it (chains, comments, SEP pairs)."""
    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:16].upper()
    chains, rules = [":KUBE-SERVICES - [0:0]", ":KUBE-MARK-MASQ - [0:0]"], []
    rules.append("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000")
    for i in range(services):
        svc = f"KUBE-SVC-{digest(f'svc{i}')}"
        chains.append(f":{svc} - [0:0]")
        name = f"bench/svc-{i}:http"
        rules.append(f'-A KUBE-SERVICES -d {vip(i)}/32 -p tcp -m comment --comment "{name} cluster IP" '
                     f"-m tcp --dport 80 -j {svc}")
        rules.append(f'-A {svc} ! -s 10.128.0.0/9 -d {vip(i)}/32 -p tcp -m comment --comment "{name} cluster IP" '
                     f"-m tcp --dport 80 -j KUBE-MARK-MASQ")
        for e in range(ENDPOINTS):
            ip = pod_ip(i * ENDPOINTS + e)
            sep = f"KUBE-SEP-{digest(f'svc{i}/{e}')}"
            chains.append(f":{sep} - [0:0]")
            probability = f"-m statistic --mode random --probability {1 / (ENDPOINTS - e):.10f} " \
                if e < ENDPOINTS - 1 else ""
            rules.append(f'-A {svc} -m comment --comment "{name} -> {ip}:8080" {probability}-j {sep}')
            rules.append(f'-A {sep} -s {ip}/32 -m comment --comment "{name}" -j KUBE-MARK-MASQ')
            rules.append(f'-A {sep} -p tcp -m comment --comment "{name}" -m tcp -j DNAT --to-destination {ip}:8080')
    return "\n".join(["*nat", *chains, *rules, "COMMIT", ""])


def iptables_change() -> str:
    svc = f"KUBE-SVC-{hashlib.sha256(b'svc5').hexdigest()[:16].upper()}"
    return "\n".join(["*nat", f":{svc} - [0:0]", ":KUBE-SEP-BENCHCHANGE - [0:0]", f"-A {svc} -j KUBE-SEP-BENCHCHANGE",
                      "-A KUBE-SEP-BENCHCHANGE -p tcp -m tcp -j DNAT --to-destination 10.250.0.1:8080",
                      "COMMIT", ""])


def bench_iptables_floor(backend: str, services: int, timeout: float) -> dict:
    """Full load and one change of the iptables shape; `full` None when cut at `timeout`."""
    with bench_namespace() as netns:
        text = iptables_shaped(services)
        rules = text.count("\n-A ")
        started = time.perf_counter()
        try:
            namespaces.run_in(netns, [f"iptables-{backend}-restore", "--noflush"], input=text, timeout=timeout,
                              check=True)
        except subprocess.TimeoutExpired:
            return {"full": None, "change": None, "rules": rules, "cut": timeout}
        full = time.perf_counter() - started
        started = time.perf_counter()
        namespaces.run_in(netns, [f"iptables-{backend}-restore", "--noflush"], input=iptables_change(),
                          timeout=timeout, check=True)
        return {"full": full, "change": time.perf_counter() - started, "rules": rules}


# ---- nftables: kube-proxy's nftables mode (KEP-3866)

def _hash(text: str) -> str:
    return base64.b32encode(hashlib.sha256(text.encode()).digest()).decode()[:8]


def _port_id(name: ServicePortName) -> str:
    return f"{name.namespace}/{name.name}/tcp/{name.port}"


def service_chain(name: ServicePortName) -> str:
    return f"service-{_hash(_port_id(name))}-{_port_id(name)}"


def external_chain(name: ServicePortName) -> str:
    return f"external-{_hash(_port_id(name))}-{_port_id(name)}"


def endpoint_chain(name: ServicePortName, ip: str, port: int) -> str:
    ident = f"{_port_id(name)}__{ip}/{port}"
    return f"endpoint-{_hash(ident)}-{ident}"


def _base(node_ip: str) -> list[str]:
    t = f"ip {TABLE}"
    proto_port = "inet_proto . inet_service : verdict"
    addr_proto_port = f"ipv4_addr . {proto_port}"
    hooks = {"filter-prerouting-pre-dnat": "filter hook prerouting priority -110",
             "filter-output-pre-dnat": "filter hook output priority -110",
             "filter-forward": "filter hook forward priority 0", "filter-input": "filter hook input priority 0",
             "filter-output": "filter hook output priority 0", "nat-prerouting": "nat hook prerouting priority -100",
             "nat-output": "nat hook output priority -100", "nat-postrouting": "nat hook postrouting priority 100"}
    lines = [f"add table {t}",
             f"add set {t} cluster-ips {{ type ipv4_addr ; }}", f"add set {t} nodeport-ips {{ type ipv4_addr ; }}",
             *(f"add map {t} {m} {{ type {k} ; }}" for m, k in (
                 ("service-ips", addr_proto_port), ("service-nodeports", proto_port),
                 ("no-endpoint-services", addr_proto_port), ("no-endpoint-nodeports", proto_port),
                 ("firewall-ips", addr_proto_port))),
             *(f"add chain {t} {chain} {{ type {hook} ; }}" for chain, hook in hooks.items()),
             *(f"add chain {t} {chain}" for chain in (
                 "services", "service-endpoints-check", "nodeport-endpoints-check", "cluster-ips-check",
                 "firewall-check", "mark-for-masquerade", "masquerading", "reject-chain"))]
    rules = {"filter-prerouting-pre-dnat": ["ct state new jump firewall-check"],
             "filter-output-pre-dnat": ["ct state new jump firewall-check"],
             "filter-forward": ["ct state new jump service-endpoints-check", "ct state new jump cluster-ips-check"],
             "filter-input": ["ct state new jump nodeport-endpoints-check", "ct state new jump service-endpoints-check"],
             "filter-output": ["ct state new jump service-endpoints-check", "ct state new jump cluster-ips-check"],
             "nat-prerouting": ["jump services"], "nat-output": ["jump services"],
             "nat-postrouting": ["jump masquerading"],
             "services": ["ip daddr . meta l4proto . th dport vmap @service-ips",
                          "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports"],
             "service-endpoints-check": ["ip daddr . meta l4proto . th dport vmap @no-endpoint-services"],
             "nodeport-endpoints-check": ["ip daddr @nodeport-ips meta l4proto . th dport vmap @no-endpoint-nodeports"],
             "cluster-ips-check": ["ip daddr @cluster-ips reject", f"ip daddr {{ {SERVICE_CIDR} }} drop"],
             "firewall-check": ["ip daddr . meta l4proto . th dport vmap @firewall-ips"],
             "mark-for-masquerade": [f"mark set mark or {MASQUERADE_BIT}"],
             "masquerading": [f"mark and {MASQUERADE_BIT} == 0 return", f"mark set mark xor {MASQUERADE_BIT}",
                              "masquerade fully-random"],
             "reject-chain": ["reject"]}
    lines += [f"add rule {t} {chain} {rule}" for chain, chain_rules in rules.items() for rule in chain_rules]
    lines.append(f"add element {t} nodeport-ips {{ {node_ip} }}")
    return lines


def _service_rules(state: ProxyState, name: ServicePortName) -> list[str]:
    """The service chain's rules and its endpoint chains (chain, rules) for one service port."""
    t = f"ip {TABLE}"
    port = state.services[name]
    chain = service_chain(name)
    endpoints = state.endpoints.get(name, ())
    picks = " , ".join(f"{n} : goto {endpoint_chain(name, e.ip, e.port)}" for n, e in enumerate(endpoints))
    return [f"add rule {t} {chain} ip daddr {port.cluster_ip} ip saddr != {state.node.cluster_cidr} "
            f"jump mark-for-masquerade",
            f"add rule {t} {chain} numgen random mod {len(endpoints)} vmap {{ {picks} }}"]


def _endpoint(name: ServicePortName, ip: str, port: int) -> list[str]:
    t, chain = f"ip {TABLE}", endpoint_chain(name, ip, port)
    return [f"add chain {t} {chain}", f"add rule {t} {chain} ip saddr {ip} jump mark-for-masquerade",
            f"add rule {t} {chain} meta l4proto tcp dnat to {ip}:{port}"]


def nftables_shaped(state: ProxyState) -> str:
    """The whole table for `state`, as kube-proxy's first (full) sync writes it."""
    t = f"ip {TABLE}"
    lines = _base(state.node.local_addresses[0])
    for name, port in state.services.items():
        lines += [f"add chain {t} {service_chain(name)}"]
        for endpoint in state.endpoints.get(name, ()):
            lines += _endpoint(name, endpoint.ip, endpoint.port)
        lines += _service_rules(state, name)
        lines.append(f"add element {t} cluster-ips {{ {port.cluster_ip} }}")
        lines.append(f"add element {t} service-ips {{ {port.cluster_ip} . tcp . {port.port} : "
                     f"goto {service_chain(name)} }}")
        if port.node_port:
            external = external_chain(name)
            lines += [f"add chain {t} {external}",
                      f"add rule {t} {external} jump mark-for-masquerade",
                      f"add rule {t} {external} goto {service_chain(name)}",
                      f"add element {t} service-nodeports {{ tcp . {port.node_port} : goto {external} }}"]
    return "\n".join([*lines, ""])


def nftables_change(old: ProxyState, new: ProxyState, name: ServicePortName) -> str:
    """kube-proxy's partial sync for `name`'s endpoints going from `old` to `new`."""
    t = f"ip {TABLE}"
    before = {(e.ip, e.port) for e in old.endpoints.get(name, ())}
    after = {(e.ip, e.port) for e in new.endpoints.get(name, ())}
    lines = [f"add table {t}"]
    for ip, port in sorted(after - before):
        lines += _endpoint(name, ip, port)
    lines += [f"flush chain {t} {service_chain(name)}", *_service_rules(new, name)]
    lines += [f"flush chain {t} {endpoint_chain(name, ip, port)}" for ip, port in sorted(before - after)]
    return "\n".join([*lines, ""])


def bench_nftables_floor(services: int, samples: int, timeout: float, connects: int = 0) -> dict:
    """Full load, `samples` one-endpoint changes (median) and connect() latency of the nft shape."""
    state = with_listener(make_state(services))
    with bench_namespace() as netns:
        text = nftables_shaped(state)
        rules = sum(1 for line in text.splitlines() if line.startswith("add rule "))
        started = time.perf_counter()
        try:
            namespaces.run_in(netns, ["nft", "-f", "-"], input=text, timeout=timeout, check=True)
        except subprocess.TimeoutExpired:
            return {"full": None, "change": None, "rules": rules, "cut": timeout}
        except subprocess.CalledProcessError as error:
            raise RuntimeError(f"nft -f refused the kube-proxy shape: {error.stderr[-2000:]}") from None
        full = time.perf_counter() - started
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024   # nft's, the largest child yet
        changes = []
        for sample in range(samples):
            new, name = with_one_endpoint_changed(state, sample)
            change = nftables_change(state, new, name)
            started = time.perf_counter()
            try:
                namespaces.run_in(netns, ["nft", "-f", "-"], input=change, timeout=timeout, check=True)
            except subprocess.TimeoutExpired:
                break
            changes.append(time.perf_counter() - started)
            state = new
        result: dict = {"full": full, "change": statistics.median(changes) if changes else None, "rules": rules,
                        "nft_rss": peak}
        if connects:
            listened = with_listener(state)
            last = last_service(listened)
            if listened.endpoints[last] != state.endpoints[last]:
                namespaces.run_in(netns, ["nft", "-f", "-"], input=nftables_change(state, listened, last),
                                  timeout=timeout, check=True)
            result["connect"] = connect_latency(netns, None, listened.services[last].cluster_ip, connects)
        result["rules"], result["elements"] = count_nft(netns, TABLE)
        return result
