"""Fixtures for the eBPF tests: a private bpffs and a cgroup v2 directory, both made by the test.

The bpffs is mounted on a temporary directory the test owns (never the host's /sys/fs/bpf);
the cgroup is a child of the cgroup v2 mount made for the test; processes that must be load
balanced are started inside it by `run_in_cgroup`; everything is detached, unpinned, unmounted
and removed afterwards. `private_bpffs` and `child_cgroup` are the same as context managers,
for a module that compiles its programs once (a module-scoped fixture). `compiler_mappings`
reads a process's maps for bcc and LLVM (an agent must have none: ebpf/compiler.py).
"""
import contextlib
import os
import subprocess
import time
import uuid

import pytest

COMPILER_LIBRARIES = ("libLLVM", "libclang", "libbcc")   # what importing bcc maps into a process


def compiler_mappings(pid: int | str) -> set[str]:
    """The compiler's shared objects process `pid` ("self": this one) has mapped, by file name."""
    with open(f"/proc/{pid}/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/" in line}
    return {os.path.basename(path) for path in paths if any(lib in path for lib in COMPILER_LIBRARIES)}


def require_bcc():
    try:
        import bcc  # noqa: F401
    except ImportError:
        pytest.skip("bcc (python3-bpfcc) is not importable")
    if not os.path.exists(f"/lib/modules/{os.uname().release}/build/include"):
        pytest.skip("no kernel headers for bcc (scripts/setup.sh links them)")


@contextlib.contextmanager
def private_bpffs(directory):
    """A bpffs mounted on `directory` (made here), our pins removed and unmounted after."""
    from ebpf.loader import remove_pins
    root = directory / "bpffs"
    root.mkdir()
    subprocess.run(["mount", "-t", "bpf", "bpf", str(root)], check=True)
    try:
        yield str(root)
    finally:
        remove_pins(str(root))
        subprocess.run(["umount", str(root)], check=True)


@contextlib.contextmanager
def child_cgroup():
    """A child cgroup of the cgroup v2 mount; its processes are killed and it is removed after."""
    from ebpf.loader import detach_owned
    from lab.bpf_places import BpfPlacesError, cgroup2_mount
    try:
        mount = cgroup2_mount()
    except BpfPlacesError:
        pytest.skip("no cgroup v2 mount")
    path = os.path.join(mount, f"netagent-test-{uuid.uuid4().hex[:8]}")
    os.mkdir(path)
    try:
        yield path
    finally:
        detach_owned(path)
        with open(os.path.join(path, "cgroup.procs")) as procs:
            for pid in procs.read().split():
                try:
                    os.kill(int(pid), 9)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 60  # the killed processes leave it when the kernel has reaped them
        while True:
            try:
                os.rmdir(path)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@pytest.fixture
def bpf_root(tmp_path):
    """A private bpffs mounted under the test's temporary directory."""
    with private_bpffs(tmp_path) as root:
        yield root


@pytest.fixture
def test_cgroup():
    """A child cgroup made for this test."""
    with child_cgroup() as path:
        yield path


def run_in_cgroup(cgroup: str, netns: str, script: str, *, timeout: float = 120.0) -> subprocess.CompletedProcess:
    """Run a Python `script` in `netns` as a process of `cgroup` (it moves itself in first)."""
    import sys
    shell = f'echo $$ > {cgroup}/cgroup.procs && exec ip netns exec {netns} {sys.executable} -c "$0"'
    return subprocess.run(["sh", "-c", shell, script], capture_output=True, text=True, timeout=timeout)
