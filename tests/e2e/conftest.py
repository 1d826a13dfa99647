"""Fixtures for the end-to-end tests in this folder (real containerd, real containers).

This file owns three things, shaped by the machine's safety rules (no change to the host):
* the `e2e` marker, registered here so the folder works on its own;
* `e2e_prerequisites`: skip, with the precise reason, when root, containerd, runc,
  busybox-static or util-linux's unshare/nsenter are missing; and `busybox_image`, the OCI
  archive built once per session (it takes tens of milliseconds, each node imports it);
* `host_untouched` (autouse): a snapshot of what the harness must never change on the host
  (the root network namespace's links, addresses, routes, forwarding sysctls and firewall;
  network namespaces, host mounts, cgroups and processes named like this process's nodes
  (`RUN_PREFIX`), and the CNI and containerd paths that the harness only mounts inside private
  namespaces; other test tiers and other runs may build their own namespaces and nodes at the
  same time, so those are left out),
  compared after each test. A difference fails the test in teardown.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import processes_with
from tests.e2e.containerd_harness import missing_prerequisites
from tests.e2e.containerd_support import RUN_PREFIX
from tests.e2e.oci_image import build_busybox_image

PREFIX = RUN_PREFIX   # this process's: other runs' nodes on the machine are not compared
_WATCHED_PATHS = ["/opt/cni", "/etc/cni", "/var/lib/cni", "/run/containerd",
                  "/var/lib/containerd", "/run/mount"]
_SYSCTLS = ["/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"]


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: drives a real container runtime")


@pytest.fixture(scope="session")
def e2e_prerequisites():
    missing = missing_prerequisites()
    if missing:
        pytest.skip("containerd e2e harness unavailable: " + "; ".join(missing))


@pytest.fixture(scope="session")
def busybox_image(e2e_prerequisites, tmp_path_factory):
    return build_busybox_image(tmp_path_factory.mktemp("busybox-image"))


def _cmd(argv) -> str:
    if shutil.which(argv[0]) is None:
        return f"<{argv[0]} not installed>"
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=20,
                          stdin=subprocess.DEVNULL)
    return proc.stdout if proc.returncode == 0 else f"<{argv[0]} failed: {proc.stderr.strip()}>"


def _firewall(argv) -> list[str]:
    # Rule text only: counters ([packets:bytes]) and the dated header comments change by themselves.
    return [re.sub(r"\[\d+:\d+\]", "", line) for line in _cmd(argv).splitlines()
            if not line.startswith("#")]


def _links():
    return sorted((l["ifname"], l.get("link_type", ""), l.get("linkinfo", {}).get("info_kind", ""))
                  for l in json.loads(_cmd(["ip", "-json", "-details", "link", "show"]) or "[]"))


def _addresses():
    return sorted((a["ifname"], i["local"], i["prefixlen"])
                  for a in json.loads(_cmd(["ip", "-json", "addr", "show"]) or "[]")
                  for i in a.get("addr_info", []))


def _our_processes():
    # containerd, its shims and ctr all name the node directory /tmp/na-e2e-*; a
    # container's own processes are covered by the cgroup check.
    return set(processes_with(f"/{PREFIX}-".encode()).items())


def _host_state() -> dict:
    return {
        "root netns links": _links(),
        "root netns addresses": _addresses(),
        "root netns routes": sorted(_cmd(["ip", "route", "show", "table", "all"]).splitlines()),
        "root netns sysctls": {p: Path(p).read_text().strip() for p in _SYSCTLS if Path(p).exists()},
        "iptables-legacy": _firewall(["iptables-legacy-save"]),
        "iptables-nft": _firewall(["iptables-nft-save"]),
        # Other test tiers may build their own namespaces meanwhile: only ours are compared.
        "network namespaces named like ours": sorted(
            l for l in _cmd(["ip", "netns", "list"]).splitlines() if l.startswith(PREFIX)),
        "host mounts of ours or on CNI/containerd paths": sorted(
            l for l in Path("/proc/self/mounts").read_text().splitlines()
            if PREFIX in l or any(f" {p}" in l for p in _WATCHED_PATHS + ["/usr/lib/cni"])),
        "CNI/containerd paths present": [p for p in _WATCHED_PATHS if os.path.lexists(p)],
        "cgroups named like ours": sorted(str(p) for p in Path("/sys/fs/cgroup").glob(f"*/{PREFIX}-*")),
        "processes named like ours": _our_processes(),
    }


@pytest.fixture(autouse=True)
def host_untouched():
    if os.geteuid() != 0:  # the e2e tests skip anyway; reading iptables needs root
        yield
        return
    before = _host_state()
    yield
    after = _host_state()
    changed = {k: {"before": before[k], "after": after[k]} for k in before if before[k] != after[k]}
    assert not changed, "the host changed during the test:\n" + json.dumps(changed, indent=1, default=str)
