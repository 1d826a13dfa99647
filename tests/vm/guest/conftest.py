"""Guest-side switches and fixtures: these tests run only inside the VM tier's guest.

The guest's init exports NETAGENT_VM_GUEST=1 (tests/vm/qemu.py). Anywhere else, every test in
this folder is skipped at collection, so the host's pytest run never builds IPIP or IPVS
topologies on a kernel that lacks them; the host-side tests in tests/vm/test_vm_tier.py boot the
guest once per session and run this folder there, asserting per guest module.

Inside the guest the machine is throwaway, but the tests keep the host's rules anyway (build
everything in namespaces they create and remove), so a guest test reads like a netns test.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from netagent.kernel import namespaces

GUEST_FLAG = "NETAGENT_VM_GUEST"
NAMESPACE_PREFIX = "na-t"
HERE = Path(__file__).resolve().parent


def inside_vm_guest() -> bool:
    return os.environ.get(GUEST_FLAG) == "1"


def pytest_collection_modifyitems(config, items):
    if inside_vm_guest():
        return
    skip = pytest.mark.skip(reason="guest-side test: runs inside the VM tier's guest "
                                   "(tests/vm/test_vm_tier.py boots it)")
    for item in items:
        if HERE == Path(str(item.fspath)).resolve().parent:
            item.add_marker(skip)


@pytest.fixture
def modprobe():
    """Load kernel modules of the guest kernel (its /lib/modules comes with the shared root)."""

    def load(*names: str) -> None:
        proc = subprocess.run(["modprobe", "-a", *names], capture_output=True, text=True)
        assert proc.returncode == 0, f"modprobe {' '.join(names)}: {proc.stderr.strip()}"

    return load


@pytest.fixture
def make_namespace():
    """Create named namespaces (loopback up); all are removed after the test, also on failure."""
    created: list[str] = []

    def make() -> str:
        name = namespaces.unique_name(NAMESPACE_PREFIX)
        namespaces.create(name)
        created.append(name)
        return name

    yield make
    for name in reversed(created):
        namespaces.remove(name)
    leaked = [n for n in created if os.path.exists(namespaces.netns_path(n))]
    assert not leaked, f"namespaces leaked: {leaked}"
