"""What the real kube-proxy left in the kernel of its namespace, read for bench/real_kube_proxy.py.

The figures of the real kube-proxy are read from the kernel, never from its log, so this
module owns every reading: the counts of a whole listing (`count_iptables_save`,
`count_nft_json`: rules, elements, endpoints DNATed, services in the dispatch), the chain
kube-proxy gave each service (`service_chains`), and three ways of seeing a write land,
cheapest first: the commit's own event (`NftMonitor`, nftables), the legacy nat table's entry
count by getsockopt (`LegacyEntries`, no lock and no parsing), and polling a listing of the
dispatch or of one service's chain (`Probe`, whose poll durations are the resolution printed
beside the figures). The shapes read are kube-proxy 1.37's: in nftables mode one numgen dnat per
service (earlier, an endpoint chain each), in iptables mode a KUBE-SEP chain per endpoint, with
no comments above 1,000 endpoints.
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import socket
import struct
import subprocess
import threading
import time

from netagent.kernel import namespaces

MODES = {"kube-proxy-iptables-legacy": ("iptables", "legacy"), "kube-proxy-iptables-nft": ("iptables", "nft"),
         "kube-proxy-nftables": ("nftables", None)}
NFT_TABLE = "kube-proxy"


class KubeProxyError(RuntimeError):
    pass


def count_iptables_save(text: str) -> dict:
    """Of `iptables-save -t nat` text: kube-proxy's rules (`-A KUBE-...`), its DNATs (one per
    endpoint) and the service dispatch's jumps (one per service port's cluster IP)."""
    rules = dnat = services = 0
    for line in text.splitlines():
        if not line.startswith("-A KUBE-"):
            continue
        rules += 1
        dnat += line.endswith("-j DNAT") or " -j DNAT " in line
        services += line.startswith("-A KUBE-SERVICES ") and " -j KUBE-SVC-" in line
    return {"rules": rules, "dnat": dnat, "services": services}


def count_nft_json(text: str) -> dict:
    """Of `nft -j list table ip kube-proxy`: rules, set and map elements, the endpoints its DNATs
    reach and the `service-ips` map's elements (one per service port's cluster IP)."""
    objects = json.loads(text)["nftables"]
    rules = [obj["rule"] for obj in objects if "rule" in obj]
    elements = sum(len(obj.get(kind, {}).get("elem", ())) for obj in objects for kind in ("set", "map"))
    services = sum(len(obj["map"].get("elem", ())) for obj in objects
                   if "map" in obj and obj["map"].get("name") == "service-ips")
    dnat = sum(_dnat_targets(expr["dnat"]) for rule in rules for expr in rule.get("expr", ()) if "dnat" in expr)
    return {"rules": len(rules), "elements": elements, "dnat": dnat, "services": services}


def _dnat_targets(dnat: dict) -> int:
    """Endpoints one nft `dnat` reaches: one address, or a numgen map's entries (kube-proxy 1.37
    picks among a service's endpoints in one rule; earlier it jumped to a chain per endpoint)."""
    addr = dnat.get("addr")
    if isinstance(addr, dict) and "map" in addr:
        return len(addr["map"].get("data", {}).get("set", ()))
    return 1


def proc_figures(pid: int) -> tuple[float, float]:
    """(RSS MiB, CPU seconds: user + system + waited-for children's) of a process, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = sum(int(value) for value in fields[11:15]) / ticks   # utime stime cutime cstime
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024
    return rss, cpu


def service_chains(mode: str, listing: str) -> dict[str, str]:
    """cluster IP -> the chain kube-proxy gave that service port, from the whole listing
    (`iptables-save` text, or `nft -j list table` JSON for nftables)."""
    chains: dict[str, str] = {}
    if MODES[mode][0] == "nftables":
        for obj in json.loads(listing)["nftables"]:
            if obj.get("map", {}).get("name") != "service-ips":
                continue
            for elem in obj["map"].get("elem", ()):
                key, verdict = elem
                ip = key["concat"][0]
                chains[ip] = verdict["goto"]["target"]
        return chains
    for line in listing.splitlines():
        if line.startswith("-A KUBE-SERVICES ") and " -j KUBE-SVC-" in line:
            words = line.split()
            chains[words[words.index("-d") + 1].split("/")[0]] = words[-1]
    return chains


class Probe:
    """Reads kube-proxy's kernel state in the namespace for one mode."""

    def __init__(self, mode: str, netns: str) -> None:
        self.kind, self.backend = MODES[mode]
        self.netns = netns
        self.durations: list[float] = []
        self.endpoint_chains: set[str] = set()   # iptables: the KUBE-SEP chains seen (`known`)

    def known(self, listing: str) -> None:
        """Remember the endpoint chains of a whole listing (iptables): a change's is a new one."""
        if self.kind == "iptables":
            self.endpoint_chains |= set(re.findall(r"^:(KUBE-SEP-\w+)", listing, re.MULTILINE))

    def _run(self, argv: list[str]) -> str:
        done = namespaces.run_in(self.netns, argv, timeout=1800)
        return done.stdout if done.returncode == 0 else ""   # not there yet: an empty listing

    def listing(self) -> str:
        if self.kind == "nftables":
            return self._run(["nft", "-j", "list", "table", "ip", NFT_TABLE]) or '{"nftables": []}'
        return self._run([f"iptables-{self.backend}-save"])

    def counts(self, listing: str) -> dict:
        return count_nft_json(listing) if self.kind == "nftables" else count_iptables_save(listing)

    def dispatch_size(self) -> int:
        """Service ports in the dispatch (a listing of it alone: cheaper than the whole)."""
        if self.kind == "nftables":
            text = self._run(["nft", "-j", "list", "map", "ip", NFT_TABLE, "service-ips"])
            return count_nft_json(text)["services"] if text else 0
        text = self._run([f"iptables-{self.backend}", "-t", "nat", "-S", "KUBE-SERVICES"])
        return sum(" -j KUBE-SVC-" in line for line in text.splitlines())

    def chain_holds(self, chain: str, ip: str) -> bool:
        """Whether the service's chain picks an endpoint at `ip` (nft: its numgen map holds
        `IP . PORT`, or before 1.37 an endpoint chain named `...__IP/PORT`; iptables: a KUBE-SEP
        chain it jumps to, new since the full sync, DNATs to `IP:PORT`: above 1,000 endpoints
        kube-proxy writes no comments that would name it)."""
        if self.kind == "nftables":
            text = self._run(["nft", "list", "chain", "ip", NFT_TABLE, chain])
            return f"__{ip}/" in text or f" {ip} . " in text
        command = f"iptables-{self.backend}"
        for endpoint_chain in re.findall(r"-j (KUBE-SEP-\w+)", self._run([command, "-t", "nat", "-S", chain])):
            if endpoint_chain not in self.endpoint_chains:
                rules = self._run([command, "-t", "nat", "-S", endpoint_chain])
                if f"--to-destination {ip}:" in rules:
                    self.endpoint_chains.add(endpoint_chain)
                    return True
        return False

    def until(self, check, started: float, timeout: float, alive) -> float:
        """Seconds from `started` to the probe that first saw `check()` true (its midpoint: the
        kernel was read during it); each poll's duration is kept as the resolution."""
        while True:
            before = time.perf_counter()
            ok = check()
            after = time.perf_counter()
            self.durations.append(after - before)
            if ok:
                return (before + after) / 2 - started
            alive()
            if after - started > timeout:
                raise KubeProxyError(f"not in the kernel after {timeout:.0f} s")
            time.sleep(min(0.05, (after - before) / 2))


class MonitorLost(KubeProxyError):
    """`nft monitor` ended (its socket overran, say): the run fails and says so."""


class NftMonitor:
    """`nft monitor` in the namespace: the kernel's nftables events, each line timestamped as it
    arrives. A commit is announced when it is made, so a change is timed without polling (a
    listing of one chain reads the whole table: 0.3 s at 1,000 services, 27 s at 10,000 with
    nft 1.0.6). `nft monitor` reads the whole ruleset before it reports (as long again), so
    `ready` makes a table of its own and waits to see it announced. Open question: at 10,000
    services kube-proxy v1.37.2 made no sync after its first while a monitor was attached (twice,
    its sync metrics still at 1 five minutes on; without one it took the change), so the
    nftables change there is unmeasured: polling one chain costs 27 s."""

    READY_TABLE = "netagent-bench-ready"

    def __init__(self, netns: str) -> None:
        self.netns = netns
        self.proc = subprocess.Popen([*namespaces.exec_prefix(netns), "nft", "monitor"], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[tuple[float, str]] = []
        self.arrived = threading.Condition()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.arrived:
                self.lines.append((time.perf_counter(), line))
                self.arrived.notify_all()

    def ready(self, timeout: float) -> float:
        """Seconds until the monitor reported a table added (and deleted) here to mark its start."""
        started = time.perf_counter()
        for verb in ("add", "delete"):
            namespaces.run_in(self.netns, ["nft", verb, "table", "ip", self.READY_TABLE], check=True, timeout=timeout)
        deadline = time.monotonic() + timeout
        with self.arrived:
            while not any(f"delete table ip {self.READY_TABLE}" in line for _, line in self.lines):
                left = deadline - time.monotonic()
                if self.proc.poll() is not None:
                    raise MonitorLost(f"nft monitor exited {self.proc.returncode} before it reported")
                if left <= 0:
                    raise KubeProxyError(f"nft monitor reported nothing in {timeout:.0f} s")
                self.arrived.wait(min(left, 1.0))
            del self.lines[:]
        return time.perf_counter() - started

    def first(self, address: str, since: float, timeout: float) -> float:
        """When the first event after `since` naming `address` arrived."""
        pattern = re.compile(rf"(?<![\d.]){re.escape(address)}(?![\d])")
        deadline, seen = time.monotonic() + timeout, 0
        with self.arrived:
            while True:
                for at, line in self.lines[seen:]:
                    if at >= since and pattern.search(line):
                        del self.lines[:]
                        return at
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if self.proc.poll() is not None:
                    raise MonitorLost(f"nft monitor exited {self.proc.returncode} after {len(self.lines)} lines")
                if left <= 0:
                    raise KubeProxyError(f"no nftables event naming {address} in {timeout:.0f} s "
                                         f"({len(self.lines)} event lines since the last match)")
                self.arrived.wait(min(left, 1.0))

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.reader.join(30)


IPT_SO_GET_INFO = 64                      # <linux/netfilter_ipv4/ip_tables.h>: IPT_BASE_CTL
_GET_INFO = struct.Struct("32sI5I5III")   # struct ipt_getinfo: name, hooks, entries, underflows, num_entries, size
_libc = ctypes.CDLL(None, use_errno=True)


class LegacyEntries:
    """The legacy nat table's entry count (getsockopt IPT_SO_GET_INFO on a raw socket opened in
    the namespace), sampled by a thread every 2 ms: no lock, no parsing, where a listing of one
    chain copies and parses the whole table (and waits for kube-proxy's xtables lock). A legacy
    table is replaced whole, so the first sample at the final count is when the full sync
    landed."""

    def __init__(self, netns: str) -> None:
        fd = os.open(namespaces.netns_path(netns), os.O_RDONLY | os.O_CLOEXEC)
        try:
            with namespaces.entered(fd):
                self.sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        finally:
            os.close(fd)
        self.samples: list[tuple[float, int]] = []   # (when, count) at each change
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def entries(self) -> int:
        """The nat table's entries now (-1: no nat table in the namespace yet)."""
        buf = ctypes.create_string_buffer(b"nat", _GET_INFO.size)
        size = ctypes.c_uint32(_GET_INFO.size)
        if _libc.getsockopt(self.sock.fileno(), socket.SOL_IP, IPT_SO_GET_INFO, buf, ctypes.byref(size)) != 0:
            return -1
        return _GET_INFO.unpack(buf.raw)[-2]

    def _sample(self) -> None:
        while not self.stop.is_set():
            count = self.entries()
            if not self.samples or self.samples[-1][1] != count:
                self.samples.append((time.perf_counter(), count))
            time.sleep(0.002)

    def reached(self, count: int) -> float | None:
        """When the count first was `count`."""
        return next((at for at, seen in self.samples if seen == count), None)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.sock.close()
