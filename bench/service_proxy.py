"""Benchmark: the service proxy at 1,000 and 10,000 services x 10 endpoints, per backend, beside kube-proxy floors.

    sudo .venv/bin/python bench/service_proxy.py [--services 1000,10000] [--modes nftables,iptables-legacy,iptables-nft,ebpf]
        [--family ipv4|ipv6] [--connect 2000] [--json FILE] [--floor-timeout 600]
    scripts/vm-run -- .venv/bin/python bench/service_proxy.py --modes ipvs --services 1000   # IPVS: VM only

For each size and backend, in a fresh network namespace and a fresh process (so RSS is the mode's own):
1. full sync: the first `sync()` of the whole state (render + apply), as after an agent start;
2. one endpoint change: one endpoint of one service replaced, programmed by a partial sync
   (median of `--samples`), and the same change through the whole agent path: the
   EndpointSlice updated in the in-repo API server -> watch -> catalog -> sync returned
   (`--agent-modes`; every mode run by default);
3. a restart: a second backend's first (full) sync with the first one's kernel state in place,
   and how many service ports it wrote (nftables' goal: none);
4. rules: iptables rules in our chains, rules in our nft table (its map and set elements
   printed beside), IPVS real servers, or eBPF map entries (service entries + slots);
   memory: the measuring process's resident size after the full sync, which holds what an
   agent holds (the catalog, the state, the backend's memory of what it wrote);
5. the real kube-proxy (`bench/real_kube_proxy.py`, the version k8s/go.mod pins, built by
   scripts/build-kubernetes), beside each netagent mode of the same dataplane:
   `kube-proxy-iptables-legacy`, `kube-proxy-iptables-nft`, `kube-proxy-nftables`, each in a
   namespace of its own against the lab API server holding the same Services and
   EndpointSlices; its full sync (start, objects present -> every service in the kernel), one
   change (EndpointSlice update -> the new endpoint in the kernel: beside netagent's change
   through the API), connect(), rules, RSS and CPU read from the kernel and /proc. Its
   iptables-nft mode above 1,000 services is skipped unless `--kube-proxy-nft-at-10k` (the
   floor's restore did not finish in 25 minutes at 10,000); a run past `--kube-proxy-timeout`
   is cut and said so. kube-proxy's IPVS mode cannot run here (no ip_vs module: said in the notes);
6. the floors (`bench/kube_proxy_floor.py`), run only where the real kube-proxy could not
   (`--floors auto`; `always` beside it, `never`):
   `floor-kube-proxy-iptables-legacy`/`-nft` (`iptables-restore --noflush` of a kube-proxy
   shaped ruleset) and `floor-kube-proxy-nftables` (kube-proxy's nftables mode structure,
   `nft -f`), full load and one change on top (what kube-proxy's partial sync costs at
   least). A floor still loading after `--floor-timeout` is cut and said so. The iptables-nft
   floor above 1,000 services is skipped (ENVIRONMENT.md: more than 25 minutes at 10,000)
   unless `--nft-floor-at-10k`;
7. ebpf: programs compiled by bcc and attached to a cgroup the benchmark makes, maps pinned
   in a private bpffs it mounts (both removed after); compile and load times are printed,
   and what a /metrics scrape of the map fill costs;
8. `--connect N`: connect() latency (median, p99 over N connects) from a client in the
   benchmark's namespace (and cgroup, for ebpf) to the last service, whose one endpoint is a
   listener in that namespace (the nftables floor too): does it grow with the services?

`--family ipv6` runs every measurement on the IPv6 form of the same state (the family's
backend: ip6tables for the iptables modes), so its figures compare with an `--family ipv4`
run (the issue's goal: IPv6 within 1.2x of IPv4 per backend); the floors are kube-proxy's
IPv4 shape, so they run with IPv4 only.

Printed: one line per measurement as it ends, then per size a table of every mode side by
side with the ratios of nftables to the nftables floor and to iptables-legacy, and of each
netagent mode to the real kube-proxy's, then the issue's goals. `--json FILE` writes every
mode's record (`bench_records.py`), with the `version` of what ran and `cpu_s` (netagent: the
full sync's CPU, its nft/iptables children included; kube-proxy: from its start to its rules
complete, its children included).
"""
from __future__ import annotations

import argparse
import os
import resource
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))

from bench_records import PEER_PREFIX, floor_mode, print_goals, print_table, record, write_json  # noqa: E402
from kube_proxy_floor import bench_iptables_floor, bench_nftables_floor  # noqa: E402
from real_kube_proxy import MODES as KUBE_PROXY_MODES  # noqa: E402
from real_kube_proxy import bench_kube_proxy  # noqa: E402
from service_proxy_kit import (ENDPOINTS, NETAGENT_MODES, IsolatedError, bench_agent_path,  # noqa: E402
                               bench_backend, isolated)

LARGE = 10_000      # above this a run takes hours (floors: minutes per 10,000 chains)


def comma_list(choices: tuple[str, ...] | None = None):
    def parse(text: str) -> list[str]:
        items = [item.strip() for item in text.split(",") if item.strip()]
        bad = [item for item in items if choices is not None and item not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list of {', '.join(choices or ())}")
        return items
    return parse


def sizes(text: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected numbers of services, e.g. 1000,10000") from None
    if any(value < 1 for value in values):
        raise argparse.ArgumentTypeError(f"{text!r}: every size must be at least 1")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--services", type=sizes, default=[1000, 10000], metavar="N,N",
                        help=f"sizes (services x {ENDPOINTS} endpoints); above {LARGE:,} allowed, it takes hours")
    parser.add_argument("--modes", type=comma_list(NETAGENT_MODES), default=["nftables", "iptables-legacy", "iptables-nft"],
                        metavar="MODE,MODE", help=f"netagent backends: {', '.join(NETAGENT_MODES)}")
    parser.add_argument("--agent-modes", type=comma_list(NETAGENT_MODES), default=None, metavar="MODE,MODE",
                        help="modes whose change is also timed through the API and the agent (default: every mode run)")
    parser.add_argument("--no-agent-path", action="store_true", help="skip the change through the API")
    parser.add_argument("--kube-proxy", type=comma_list(tuple(KUBE_PROXY_MODES)), default=list(KUBE_PROXY_MODES),
                        metavar="MODE,MODE", help=f"the real kube-proxy's modes: {', '.join(KUBE_PROXY_MODES)}")
    parser.add_argument("--no-kube-proxy", action="store_true", help="skip the real kube-proxy")
    parser.add_argument("--kube-proxy-timeout", type=float, default=900, metavar="SECONDS",
                        help="cut a kube-proxy run whose rules are not complete after this long, and say so")
    parser.add_argument("--kube-proxy-nft-at-10k", action="store_true",
                        help="run kube-proxy's iptables-nft mode above 1,000 services too")
    parser.add_argument("--floors", choices=("auto", "always", "never"), default="auto",
                        help="the kube-proxy-shaped floors: only where the real kube-proxy did not run (auto)")
    parser.add_argument("--no-floors", action="store_true", help="the same as --floors never")
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--floor-timeout", type=float, default=600, metavar="SECONDS",
                        help="cut a floor's full load (and each change) after this long, and say so")
    parser.add_argument("--nft-floor-at-10k", action="store_true",
                        help="run the iptables-nft floor above 1,000 services too (more than 25 minutes at 10,000)")
    parser.add_argument("--connect", type=int, default=0, metavar="N",
                        help="also measure connect() latency to the last service over N connects")
    parser.add_argument("--family", choices=("ipv4", "ipv6"), default="ipv4",
                        help="the IP family of the services, endpoints and backend (default ipv4)")
    parser.add_argument("--json", metavar="FILE", help="write every mode's record to FILE")
    return parser.parse_args(argv)


def run_mode(mode: str, size: int, args, records: list, notes: list, restarts: dict[int, int]) -> None:
    result = isolated(bench_backend, mode, size, args.samples, args.connect, args.family)
    records.append(record(mode, size, full=result["full"], change=result["change"], connect=result.get("connect"),
                          rss=result["rss"], rules=result["rules"], cpu=result.get("cpu"),
                          version=netagent_version()))
    print(f"  {mode:<34} full {result['full']:.3f} s, change {result['change'] * 1e3:.2f} ms "
          f"(max {result['change_max'] * 1e3:.2f}), rules {result['rules']}, RSS {result['rss']:.0f} MiB", flush=True)
    if "elements" in result:
        notes.append(f"{mode}: {result['rules']} rules and {result['elements']} map/set elements in the table")
    if "restart" in result:
        seconds, written, unit = result["restart"]
        if mode == "nftables":
            restarts[size] = written
        notes.append(f"{mode}: restart (new backend, table in place): first full sync {seconds:.3f} s, "
                     f"wrote {written} {unit} ({result['restart_detail']})")
    if "compile" in result:
        notes.append(f"ebpf: bcc compile {result['compile']:.3f} s, load+attach {result['load']:.3f} s, open maps "
                     f"{result['start'] - result['compile'] - result['load']:.3f} s; /metrics map fill "
                     f"{result['entries']} entries counted in {result['scrape'] * 1e3:.1f} ms")


def netagent_version() -> str:
    """netagent's version and the commit measured (`+dirty` when the tree has changes)."""
    from netagent import __version__
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(["git", "-C", top, "describe", "--always", "--dirty=+dirty"], capture_output=True,
                          text=True)
    return f"{__version__} ({done.stdout.strip()})" if done.returncode == 0 else __version__


def run_kube_proxy(name: str, size: int, args, records: list, notes: list) -> bool:
    """The real kube-proxy's `name` mode at one size; False when it was skipped."""
    if name == "kube-proxy-iptables-nft" and size > 1000 and not args.kube_proxy_nft_at_10k:
        records.append(record(name, size))
        notes.append(f"{name}: skipped above 1,000 services (the same iptables-nft-restore path did not finish "
                     "in 25 minutes at 10,000: ENVIRONMENT.md); --kube-proxy-nft-at-10k runs it")
        print(f"  {name:<34} skipped (--kube-proxy-nft-at-10k runs it)", flush=True)
        return False
    result = isolated(bench_kube_proxy, name, size, args.samples, args.connect, args.kube_proxy_timeout)
    records.append(record(name, size, full=result["full"], change=result["change"], agent=result["change"],
                          connect=result.get("connect"), rss=result["rss"], rules=result["rules"], cpu=result["cpu"],
                          version=result["version"]))
    seen = "nft monitor events" if not result["change_poll"] else f"poll {result['change_poll'] * 1e3:.0f} ms"
    print(f"  {name:<34} full {result['full']:.3f} s (poll {result['full_poll'] * 1e3:.0f} ms), change "
          f"{result['change'] * 1e3:.2f} ms (max {result['change_max'] * 1e3:.2f}, {seen}), rules {result['rules']}, "
          f"RSS {result['rss']:.0f} MiB, CPU {result['cpu']:.2f} s", flush=True)
    elements = f" and {result['elements']} map/set elements" if "elements" in result else ""
    notes.append(f"{name} {result['version']}: {result['rules']} rules{elements}, {result['dnat']} endpoints "
                 f"DNATed; read from the kernel (full sync to within its poll, {result['full_poll'] * 1e3:.0f} ms; "
                 f"change: {seen}); full sync from its start (the list of every object included), change from the "
                 "EndpointSlice update (its change_s and agent_change_s are that one path)")
    return True


def run_floor(mode: str, size: int, args, records: list, notes: list) -> None:
    name = floor_mode(mode)
    if mode == "iptables-nft" and size > 1000 and not args.nft_floor_at_10k:
        records.append(record(name, size))
        notes.append(f"{name}: skipped: iptables-nft-restore of the kube-proxy shape does not finish in 25 minutes "
                     "at 10,000 services (ENVIRONMENT.md); --nft-floor-at-10k runs it")
        print(f"  {name:<34} skipped (> 25 min at 10,000: --nft-floor-at-10k runs it)", flush=True)
        return
    if mode == "nftables":
        result = isolated(bench_nftables_floor, size, args.samples, args.floor_timeout, args.connect)
    else:
        result = isolated(bench_iptables_floor, mode.split("-")[1], size, args.floor_timeout)
    records.append(record(name, size, full=result["full"], change=result["change"], connect=result.get("connect"),
                          rules=result["rules"]))
    if result["full"] is None:
        notes.append(f"{name}: CUT: the full load was still running after --floor-timeout {result['cut']:.0f} s")
        print(f"  {name:<34} cut after {result['cut']:.0f} s (--floor-timeout)", flush=True)
        return
    change = "cut" if result["change"] is None else f"{result['change'] * 1e3:.2f} ms"
    print(f"  {name:<34} full {result['full']:.3f} s, change {change}, rules {result['rules']}", flush=True)
    if "elements" in result:
        notes.append(f"{name}: {result['rules']} rules and {result['elements']} map/set elements in the table; "
                     f"`nft -f` peaked at {result['nft_rss']:.0f} MiB RSS loading it")


def run_agent_path(mode: str, size: int, args, records: list) -> None:
    seconds = isolated(bench_agent_path, mode, size, args.samples, args.family)
    for rec in records:
        if rec["mode"] == mode and rec["services"] == size:
            rec["agent_change_s"] = seconds
    shown = "none programmed in 120 s" if seconds is None else f"{seconds * 1e3:.2f} ms"
    print(f"  {mode + ' through the API':<34} change {shown} (EndpointSlice update -> programmed)", flush=True)


def guarded(step, name: str, size: int, records: list, notes: list, *args) -> bool:
    """Run one measurement; a failure is a null record and a note, and the run goes on. True when
    it measured (a step may answer False: skipped)."""
    try:
        return step(*args) is not False
    except IsolatedError as error:
        reason = str(error).strip().splitlines()[-1]
        print(f"  {name:<34} FAILED: {reason}", flush=True)
        notes.append(f"{name}: FAILED: {reason}")
        if not any(rec["mode"] == name and rec["services"] == size for rec in records):
            records.append(record(name, size))
        return False


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # run the clean-ups (namespace, cgroup, bpffs)
    if max(args.services) > LARGE:
        print(f"warning: {max(args.services):,} services: the floors load {ENDPOINTS + 1} chains per service "
              f"(about 17 s per 10,000 chains here), so expect hours; --no-floors and --floor-timeout shorten it",
              file=sys.stderr, flush=True)
    agent_modes = [] if args.no_agent_path else (args.agent_modes or args.modes)
    floors = "never" if args.no_floors or args.family != "ipv4" else args.floors   # both kube-proxies: IPv4 here
    peers = [] if args.no_kube_proxy or args.family != "ipv4" else args.kube_proxy
    print(f"# service proxy benchmark: {args.family}, {ENDPOINTS} endpoints per service, {args.samples} one-endpoint "
          f"changes, kernel {os.uname().release}, {os.cpu_count()} CPUs", flush=True)
    records: list[dict] = []
    notes: dict[int, list[str]] = {}
    restarts: dict[int, int] = {}   # nftables: service ports a restarted agent's first sync wrote
    for size in args.services:
        print(f"# {size} services", flush=True)
        size_notes = notes.setdefault(size, [])
        ran = []
        for mode in args.modes:
            if guarded(run_mode, mode, size, records, size_notes, mode, size, args, records, size_notes, restarts):
                ran.append(mode)
            peer = PEER_PREFIX + mode
            peer_ran = peer in peers and guarded(run_kube_proxy, peer, size, records, size_notes, peer, size, args,
                                                 records, size_notes)
            if mode not in ("ebpf", "ipvs") and (floors == "always" or (floors == "auto" and not peer_ran)):
                guarded(run_floor, floor_mode(mode), size, records, size_notes, mode, size, args, records, size_notes)
        for peer in peers:   # the real kube-proxy's modes whose netagent mode was not asked for
            if peer.removeprefix(PEER_PREFIX) not in args.modes:
                guarded(run_kube_proxy, peer, size, records, size_notes, peer, size, args, records, size_notes)
        if peers and not os.path.exists("/proc/net/ip_vs"):
            size_notes.append("kube-proxy-ipvs: not run: this kernel has no IPVS (no ip_vs module, no /proc/net/ip_vs)")
        for mode in agent_modes:
            if mode in ran:
                guarded(run_agent_path, mode, size, records, size_notes, mode, size, args, records)
        if args.json:
            write_json(args.json, records)   # after every size: a cut run keeps what it measured
    for size in args.services:
        print_table(size, [rec for rec in records if rec["services"] == size], notes[size])
    print_goals(records, restarts)
    if args.json:
        write_json(args.json, records)
        print(f"# {len(records)} records written to {args.json}")
    print(f"# peak RSS of the driving process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
