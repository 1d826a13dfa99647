"""Shared test switches: which tiers can run on this machine, and why not when they can't."""
import os
import shutil
from pathlib import Path

import pytest


def require_root_netns():
    if os.geteuid() != 0:
        pytest.skip("needs root to build network namespaces")
    if not shutil.which("ip"):
        pytest.skip("iproute2's `ip` is not installed")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/tests/netns/" in str(item.fspath) or "/tests/cluster/" in str(item.fspath):
            item.add_marker(pytest.mark.netns)


def processes_with(*needles: bytes) -> dict[int, str]:
    """pid -> command line of every process whose command line contains all `needles`."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if all(needle in cmdline for needle in needles):
                found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace")
    return found
