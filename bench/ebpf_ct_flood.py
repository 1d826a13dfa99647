"""Benchmark: do established NodePort flows through the tc path survive a SYN flood?

    sudo .venv/bin/python bench/ebpf_ct_flood.py [--held 200] [--flood 100000] [--ct-max 4096]
        [--ct-new-max 1024] [--baseline GIT-REV]

In namespaces (tests/netns/ebpf_ct_lab.py: a client and a remote backend outside, the node
with the tc programs on its underlay, SNAT to the node): `--held` connections are opened
to the NodePort and each echoes one byte (established, confirmed); then `--flood` SYNs,
each from its own address and port of 10.79.0.0/16, are sent at the NodePort (raw frames);
then every held connection sends one byte again. Printed per variant: conntrack entries
before and after the flood (na_ct, na_ct_new), and how many held flows still echo (a flow
whose entries were evicted gets a new SNAT port and the backend resets it).

Variants: this tree's programs (na_ct `--ct-max`, na_ct_new `--ct-new-max`), and with
`--baseline REV` the programs of that git revision (one LRU na_ct, given the same total,
`--ct-max + --ct-new-max` entries), compiled from `git show REV:ebpf/*.c` over the same maps.
A private bpffs is mounted for each variant and removed after.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from ebpf import maps as M  # noqa: E402
from ebpf.fake_maps import FakeBpfMap  # noqa: E402
from ebpf.loader import SocketLbLoader, remove_pins  # noqa: E402
from ebpf.mapset import MapSet, PinnedMap  # noqa: E402
from ebpf.sizes import MapSizes  # noqa: E402
from proxy.ebpf.backend import EbpfProxy  # noqa: E402
from tests.netns.ebpf_ct_lab import HeldConnections, NodePortLab, nodeport_state, syn_flood  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class BaselineLoader(SocketLbLoader):
    """The programs of another revision (its one na_ct sized `ct_max`), with this loader's defines."""

    def __init__(self, *, rev: str, ct_max: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.rev, self.ct_max = rev, ct_max

    def source(self) -> str:
        here = super().source()
        defines = here[:here.index("/*")]   # NA_PIN_DIR and the rest, before the first source's comment
        texts = [subprocess.run(["git", "-C", REPO, "show", f"{self.rev}:ebpf/{name}"], check=True,
                                capture_output=True, text=True).stdout for name in ("sock_lb.c", "nodeport.c")]
        tc = re.sub(r"(na_ct, )(262144|NA_MAX_CT)", rf"\g<1>{self.ct_max}", texts[1])
        return defines + texts[0] + "\n" + tc


@contextlib.contextmanager
def private_bpffs():
    with tempfile.TemporaryDirectory(prefix="na-bench-bpffs-") as root:
        subprocess.run(["mount", "-t", "bpf", "bpf", root], check=True)
        try:
            yield root
        finally:
            remove_pins(root)
            subprocess.run(["umount", root], check=True)


def open_maps(pin_dir: str) -> MapSet:
    found: dict[str, M.Any] = {}
    for name in M.MAP_NAMES:
        path = os.path.join(pin_dir, name)
        found[name] = PinnedMap.open(name, path) if os.path.exists(path) else FakeBpfMap(name)   # the baseline's
    return MapSet.from_maps(found)


def run_variant(label: str, *, held: int, flood: int, sizes: MapSizes, baseline: str | None) -> dict:
    with private_bpffs() as bpf_root, NodePortLab() as lab:
        if baseline:
            loader: SocketLbLoader = BaselineLoader(rev=baseline, ct_max=sizes[M.CT_MAP] + sizes[M.CT_NEW_MAP],
                                                    bpf_root=bpf_root, cgroup="", sizes=sizes)
        else:
            loader = SocketLbLoader(bpf_root=bpf_root, cgroup="", sizes=sizes)
        with loader.load_tc() as programs:
            maps = open_maps(loader.pin_dir)
            try:
                EbpfProxy(maps=maps, tc_snat=True).sync(nodeport_state(), changed=None)
                lab.attach(programs.fds)
                with HeldConnections(lab, held) as connections:
                    before = (maps.ct.count(), maps.ct_new.count())
                    started = time.monotonic()
                    sent = syn_flood(lab, flood)
                    flood_seconds = time.monotonic() - started
                    after = (maps.ct.count(), maps.ct_new.count())
                    alive = sum(1 for ok in connections.check() if ok)
            finally:
                maps.close()
    return {"label": label, "held": held, "sent": sent, "flood_s": flood_seconds, "before": before,
            "after": after, "alive": alive, "ct_max": maps.ct.max_entries,
            "ct_new_max": maps.ct_new.max_entries if not baseline else 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--held", type=int, default=200)
    parser.add_argument("--flood", type=int, default=100_000)
    parser.add_argument("--ct-max", type=int, default=4096)
    parser.add_argument("--ct-new-max", type=int, default=1024)
    parser.add_argument("--baseline", help="a git revision whose programs to measure too (e.g. main)")
    args = parser.parse_args()
    sizes = MapSizes({M.CT_MAP: args.ct_max, M.CT_NEW_MAP: args.ct_new_max})
    variants = [("this tree", None)] + ([(f"baseline {args.baseline}", args.baseline)] if args.baseline else [])
    print(f"{args.held} established NodePort flows, then {args.flood} SYNs from distinct sources")
    print(f"{'programs':<22} {'na_ct max':>9} {'na_ct_new max':>13} {'entries before':>15} {'entries after':>15} "
          f"{'flows alive':>12} {'flood s':>8}")
    for label, rev in variants:
        r = run_variant(label, held=args.held, flood=args.flood, sizes=sizes, baseline=rev)
        new_max = str(r["ct_new_max"]) if r["ct_new_max"] else "-"
        print(f"{label:<22} {r['ct_max']:>9} {new_max:>13} {'%d + %d' % r['before']:>15} "
              f"{'%d + %d' % r['after']:>15} {'%d / %d' % (r['alive'], r['held']):>12} {r['flood_s']:>8.1f}",
              flush=True)


if __name__ == "__main__":
    main()
