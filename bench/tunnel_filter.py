#!/usr/bin/env python3
"""Benchmark: the tunnel source filter (netagent/noderoutes/tunnel_filter.py, tunnel_filter_nft.py)
at N peers: how long it takes to program, and what it costs every packet reaching INPUT.

    sudo .venv/bin/python bench/tunnel_filter.py [--sizes 100,1000,5000] [--flavours ipset,nftables,per-peer]
                                                 [--backend nft] [--connects 2000] [--rounds 3]

Everything happens in one network namespace the script creates and removes (the root
namespace's iptables, ipsets and nftables are never touched). Flavours:
- `ipset`: `TunnelFilter` (iptables, `--backend` nft or legacy): protocol-first DROP rules and
  the admitted peers in an ipset;
- `nftables`: `NftTunnelFilter` (our `netagent-tunnel` table, its set);
- `per-peer`: the former iptables shape, for comparison: one `-s <peer> -j RETURN` rule per
  peer before the drops, jumped to first from INPUT, written as its manager did (one
  iptables-save, then one restore of the whole chain at every peer change).

For each size and flavour, ROUNDS rounds on a clean namespace: TCP connect latency to a
listener on 127.0.0.1 with no filter (`off`), then the first sync timed (`first`: from nothing
to chain, jump and set), a sync with nothing to change (`steady`: what every agent sync pays),
one peer change (one peer leaves, another joins: `change`), the connect latency with the
filter on (`on`: each connection's SYN, SYN-ACK and ACK reach INPUT on lo, so they walk the
chain, though none is a tunnel packet), and the removal. Medians over rounds are printed.
"""
from __future__ import annotations

import argparse
import ipaddress
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from netagent.kernel import namespaces, owned  # noqa: E402
from netagent.kernel.families import IpFamily  # noqa: E402
from netagent.kernel.ipset.runner import IpsetRunner  # noqa: E402
from netagent.kernel.iptables.backend import IptablesBackend  # noqa: E402
from netagent.kernel.iptables.restore_format import RestoreBuilder, canonical_spec  # noqa: E402
from netagent.kernel.iptables.runner import IptablesRunner  # noqa: E402
from netagent.kernel.nftables.runner import NftRunner  # noqa: E402
from netagent.noderoutes.routing.model import Mode, RoutingSettings  # noqa: E402
from netagent.noderoutes.tunnel_filter import JUMP_COMMENT, TunnelFilter, tunnel_protocols  # noqa: E402
from netagent.noderoutes.tunnel_filter_nft import NftTunnelFilter  # noqa: E402

PORT = 6202
SETTINGS = RoutingSettings(mode=Mode.VXLAN)
OWN = ipaddress.IPv4Address("192.0.2.1")
SERVER = rf"""
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {PORT})); s.listen(512); print("ready", flush=True)
while True:
    c, _ = s.accept(); c.close()
"""
CONNECT = rf"""
import socket, statistics, sys, time
times = []
for _ in range(int(sys.argv[1])):
    start = time.perf_counter()
    s = socket.create_connection(("127.0.0.1", {PORT}), timeout=5)
    times.append(time.perf_counter() - start)
    s.close()
times.sort()
print(statistics.median(times) * 1e6, times[int(len(times) * 0.99)] * 1e6)
"""


class PerPeerChain:
    """The former iptables shape (one RETURN rule per admitted address), with its manager's writes."""

    def __init__(self, runner: IptablesRunner) -> None:
        self.runner, self.peers = runner, [OWN]
        self.written: list | None = None

    def update(self, peers) -> None:
        self.peers = [OWN, *peers]

    def ensure(self) -> None:
        self.runner.table("filter")     # its manager read the table, and wrote only when it drifted
        if self.written == self.peers:
            return
        builder = RestoreBuilder().declare_chain("filter", owned.TUNNEL_FILTER_CHAIN)
        for address in sorted(set(self.peers), key=int):
            builder.append("filter", owned.TUNNEL_FILTER_CHAIN, canonical_spec((
                "-s", str(address), "-m", "comment", "--comment", "netagent: admitted tunnel source", "-j", "RETURN")))
        for match in tunnel_protocols(SETTINGS, IpFamily.V4):
            builder.append("filter", owned.TUNNEL_FILTER_CHAIN, canonical_spec((
                *match, "-m", "comment", "--comment", "netagent: tunnel packet from a non-peer", "-j", "DROP")))
        if self.written is None:
            builder.insert("filter", "INPUT", canonical_spec((
                "-m", "comment", "--comment", JUMP_COMMENT, "-j", owned.TUNNEL_FILTER_CHAIN)))
        self.runner.restore(builder.text())
        self.written = list(self.peers)

    def cleanup(self) -> None:
        self.runner.delete_chains("filter", [owned.TUNNEL_FILTER_CHAIN])


def connect_latency(netns: str, count: int) -> tuple[float, float]:
    done = namespaces.run_in(netns, [sys.executable, "-c", CONNECT, str(count)], check=True, timeout=300)
    median, p99 = done.stdout.split()
    return float(median), float(p99)


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def one_round(netns: str, flavour: str, size: int, backend: IptablesBackend, connects: int, nft) -> dict:
    peers = [ipaddress.IPv4Address("10.0.0.1") + i for i in range(size)]
    changed = [*peers[1:], ipaddress.IPv4Address("10.255.255.254")]   # one left, one joined
    prefix = namespaces.exec_prefix(netns)
    if flavour == "nftables":
        tunnel_filter = NftTunnelFilter(nft=nft, settings=SETTINGS, own=(OWN,))
    else:
        runner = IptablesRunner(backend=backend, exec_prefix=prefix, timeout=300)
        tunnel_filter = (PerPeerChain(runner) if flavour == "per-peer" else
                         TunnelFilter(runner=runner, settings=SETTINGS, own=(OWN,), ipset=IpsetRunner(exec_prefix=prefix)))
    off = connect_latency(netns, connects)
    tunnel_filter.update(peers)
    first = timed(tunnel_filter.ensure)
    steady = timed(tunnel_filter.ensure)
    tunnel_filter.update(changed)
    change = timed(tunnel_filter.ensure)
    on = connect_latency(netns, connects)
    tunnel_filter.cleanup()
    return {"first": first, "steady": steady, "change": change, "off": off, "on": on}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--flavours", default="ipset,nftables,per-peer")
    parser.add_argument("--backend", default="nft", choices=[b.value for b in IptablesBackend])
    parser.add_argument("--connects", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    backend = IptablesBackend(args.backend)
    netns = namespaces.unique_name("bench-tunnel")
    namespaces.create(netns)
    server = None
    try:
        server = subprocess.Popen([*namespaces.exec_prefix(netns), sys.executable, "-c", SERVER],
                                  stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        print(f"iptables backend {backend.value}, {args.connects} connects per latency figure, "
              f"median of {args.rounds} rounds; times in ms, connect latency in us (median / p99)")
        print(f"{'flavour':<10} {'peers':>6} {'first':>9} {'steady':>8} {'change':>8} "
              f"{'connect off':>14} {'connect on':>14} {'on/off':>7}")
        with NftRunner(netns) as nft:
            for size in (int(s) for s in args.sizes.split(",")):
                for flavour in args.flavours.split(","):
                    rounds = [one_round(netns, flavour, size, backend, args.connects, nft) for _ in range(args.rounds)]

                    def med(key, index=None):
                        values = [r[key] if index is None else r[key][index] for r in rounds]
                        return statistics.median(values)
                    print(f"{flavour:<10} {size:>6} {med('first') * 1e3:>9.1f} {med('steady') * 1e3:>8.1f} "
                          f"{med('change') * 1e3:>8.1f} {med('off', 0):>7.1f} /{med('off', 1):>5.0f} "
                          f"{med('on', 0):>7.1f} /{med('on', 1):>5.0f} {med('on', 0) / med('off', 0):>7.2f}",
                          flush=True)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        namespaces.remove(netns)
    return 0


if __name__ == "__main__":
    sys.exit(main())
