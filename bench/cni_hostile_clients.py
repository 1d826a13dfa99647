#!/usr/bin/env python3
"""How much hostile local callers delay another pod's ADD through the agent (issue 10).

A lab node runs the real agent (`netagent run --cni-only`) with the static shim as its CNI
binary. The benchmark times sequential pod ADDs through the shim, first alone, then while
`--idle` connections that never send and `--slow` connections that send one byte a second
are held open on the agent's socket (the agent's request deadline is 5 s, so the slow ones
are re-opened as it drops them). It prints median, p95 and max per phase and the added
delay, and how many hostile connections were open when the last ADD finished.

    sudo .venv/bin/python bench/cni_hostile_clients.py [--pods 30] [--idle 8] [--slow 8]
"""
from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lab import LabNode  # noqa: E402
from netagent.cniserver.install import PluginBinary  # noqa: E402
from netagent.kernel import namespaces  # noqa: E402


class HostileClients:
    """Idle and byte-a-second connections to `path`, kept open (re-opened when dropped)."""

    def __init__(self, path: str, *, idle: int, slow: int) -> None:
        self.path = path  # a unix socket is reached by its path from any network namespace
        self.stop = threading.Event()
        self.open_now: dict[int, bool] = {}
        self.threads = [threading.Thread(target=self._hold, args=(i, i >= idle), daemon=True)
                        for i in range(idle + slow)]
        for thread in self.threads:
            thread.start()

    def _hold(self, index: int, slow: bool) -> None:
        while not self.stop.is_set():
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.path)
                self.open_now[index] = True
                for byte in b"NACNI1 10 1000\n" + b"x" * 1000:
                    if self.stop.wait(1.0):
                        return
                    if slow:
                        sock.send(bytes([byte]))
                    elif sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b"":
                        break
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                pass
            finally:
                self.open_now[index] = False
                sock.close()

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=5)


def timed_adds(node: LabNode, label: str, count: int) -> list[float]:
    times = []
    for i in range(count):
        netns_name = node.new_pod_netns(f"{label}{i}")
        started = time.perf_counter()
        code, out = node.cni("ADD", container_id=f"{label}{i}", netns=namespaces.netns_path(netns_name))
        times.append(time.perf_counter() - started)
        if code != 0:
            raise RuntimeError(f"ADD failed: {out}")
    return times


def describe(label: str, times: list[float]) -> str:
    ordered = sorted(times)
    p95 = ordered[max(0, int(len(ordered) * 0.95) - 1)]
    return (f"{label:<28} median {statistics.median(ordered) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms   "
            f"max {ordered[-1] * 1000:7.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=30, help="ADDs per phase")
    parser.add_argument("--idle", type=int, default=8, help="connections that send nothing")
    parser.add_argument("--slow", type=int, default=8, help="connections that send a byte a second")
    args = parser.parse_args()
    with LabNode(prefix="na-bench-h", subnets=("10.64.0.0/16",), plugin=PluginBinary.SHIM) as node:
        timed_adds(node, "warm", 3)
        alone = timed_adds(node, "alone", args.pods)
        hostile = HostileClients(node.socket_path, idle=args.idle, slow=args.slow)
        try:
            time.sleep(1.5)
            attacked = timed_adds(node, "attacked", args.pods)
            still_open = sum(hostile.open_now.values())
        finally:
            hostile.close()
        print(describe("ADD alone", alone))
        print(describe(f"ADD with {args.idle} idle + {args.slow} slow", attacked))
        added = (statistics.median(attacked) - statistics.median(alone)) * 1000
        worst = (max(attacked) - statistics.median(alone)) * 1000
        print(f"added delay: median {added:+.1f} ms, worst {worst:+.1f} ms; hostile connections open at "
              f"the end: {still_open} of {args.idle + args.slow}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
