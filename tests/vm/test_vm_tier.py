"""The VM tier's own tests: the harness boots Debian's kernel, and the guest suite passes there.

* `test_guest_*` smoke tests drive `run_in_vm` directly (one boot each): the guest runs the
  Debian kernel with its modules, exit codes pass through, the shared root stays untouched on
  the host while the share comes back, and a timeout leaves no qemu behind.
* `test_guest_module_passes_inside_the_vm[...]` runs once per module in tests/vm/guest/; all of
  them share ONE guest boot (the `vm` fixture's suite) and each asserts on its own cases.
* The initramfs test checks the archive the harness builds, without booting.
"""
from __future__ import annotations

import secrets
import shutil
import subprocess

import pytest

from tests.conftest import processes_with
from tests.vm import qemu
from tests.vm.conftest import GUEST_DIR, Outcome

GUEST_MODULES = sorted(GUEST_DIR.glob("test_*.py"))


def test_initramfs_holds_busybox_init_and_boot_modules_in_dependency_order():
    reason = qemu.missing_reason()
    if reason:
        pytest.skip(f"VM tier unavailable: {reason}")
    if shutil.which("cpio") is None:
        pytest.skip("GNU cpio is not installed (apt-get install cpio); it checks the archive")
    kernel = qemu.find_guest_kernel()
    archive = qemu.ensure_initramfs(kernel)
    listing = subprocess.run(["cpio", "-t", "--quiet"], input=archive.read_bytes(),
                             capture_output=True, check=True).stdout.decode().split()
    assert {"init", "bin/busybox", "sbin/modprobe", "modules.order"} <= set(listing)
    order = [line.strip() for line in subprocess.run(
        ["cpio", "-i", "--to-stdout", "--quiet", "modules.order"], input=archive.read_bytes(),
        capture_output=True, check=True).stdout.decode().splitlines()]
    assert set(order) >= {"virtio_pci.ko", "9pnet.ko", "9pnet_virtio.ko", "netfs.ko", "9p.ko",
                          "overlay.ko"}
    for before, after in [("virtio_ring.ko", "virtio.ko"), ("9pnet.ko", "9pnet_virtio.ko"),
                          ("netfs.ko", "fscache.ko"), ("fscache.ko", "9p.ko"),
                          ("virtio.ko", "virtio_pci.ko")]:
        assert order.index(before) < order.index(after), f"{before} must load before {after}"
    assert qemu.ensure_initramfs(kernel) == archive, "an unchanged input set must reuse the cache"


def test_guest_runs_debian_kernel_loads_ipip_and_passes_the_exit_code_through(vm, tmp_path):
    marker = f"na-vm-{secrets.token_hex(4)}"
    share = tmp_path / "share"
    script = f"""
        uname -r
        grep -o '^ipip ' /proc/modules
        ip netns add na-t-smoke
        ip -n na-t-smoke link add name na-ipip0 type ipip local 192.0.2.1 remote 192.0.2.2
        ip -n na-t-smoke -d -o link show na-ipip0
        echo written-in-guest > {marker}
        echo shared-back > "$NETAGENT_VM_SHARE/{marker}"
        exit 7
    """
    result = vm.run(["sh", "-c", script], modules=("ipip",), timeout=180, share_dir=share)
    lines = result.output.splitlines()
    assert result.returncode == 7, result.output
    assert lines[0] == vm.kernel.version and lines[0].startswith("6.1."), result.output
    assert lines[1] == "ipip ", "ipip.ko is not loaded in the guest"
    assert "link/ipip 192.0.2.1 peer 192.0.2.2" in lines[2], result.output
    assert not (qemu.PROJECT_DIR / marker).exists(), "a guest write reached the host's root"
    assert (share / marker).read_text() == "shared-back\n"
    assert 0 < result.boot_seconds < 120 and result.run_seconds >= 0


def _qemu_pids_mentioning(text: str) -> list[int]:
    return sorted(processes_with(qemu.QEMU.encode(), text.encode()))


def test_guest_that_overruns_its_timeout_is_killed_without_leaving_qemu(vm, tmp_path):
    share = tmp_path / "timeout-share"
    with pytest.raises(qemu.VmTimeout) as caught:
        vm.run(["sleep", "600"], modules=(), timeout=10, share_dir=share)
    assert "qemu killed" in str(caught.value)
    assert _qemu_pids_mentioning(str(share)) == []


@pytest.mark.parametrize("module", GUEST_MODULES, ids=lambda p: p.stem)
def test_guest_module_passes_inside_the_vm(vm, module):
    suite = vm.guest_suite()
    cases = suite.cases_of(module)
    output_tail = "\n".join(suite.result.output.splitlines()[-80:])
    assert cases, f"the guest run reported no test from {module.name}:\n{output_tail}"
    broken = [c for c in cases if c.outcome in (Outcome.FAILED, Outcome.ERROR)]
    assert not broken, "failed inside the VM:\n" + "\n\n".join(
        f"{c.name} ({c.outcome.value}):\n{c.detail}" for c in broken)
    if all(c.outcome is Outcome.SKIPPED for c in cases):
        pytest.skip("every guest test skipped: " + "; ".join(sorted({c.detail for c in cases})))
