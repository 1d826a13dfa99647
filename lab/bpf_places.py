"""Where a lab in eBPF proxy mode keeps each node's dataplane: its own cgroup and its own bpffs.

The socket load balancer acts on the sockets of one cgroup, whatever their network namespace,
so each lab node gets a cgroup of its own, `<lab prefix>/<node>` in the cgroup v2 hierarchy,
and every process of that node runs inside it: its agent, and whatever the lab runs in its pods
(`lab exec`, the demo's client). Its maps are pinned in a private bpffs mounted at
`<node dir>/bpffs`, under the lab's state directory, never the host's /sys/fs/bpf. `remove`
undoes both: it stops what still runs in the cgroup, detaches our programs, unpins our maps,
unmounts the bpffs and removes the directories; it is safe to repeat.

The hierarchy is mounted again at `<state dir>/cgroup2` (the same tree as the host's mount)
because `ip netns exec` remounts /sys for the processes it starts, which hides
/sys/fs/cgroup from the agents and the pods' processes; the lab's mount is unmounted by `down`.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence

from ebpf import syscall
from ebpf.loader import detach_owned, remove_pins
from lab.state import LabState

CGROUP2_MOUNTS = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")


class BpfPlacesError(Exception):
    pass


def cgroup2_mount() -> str:
    for path in CGROUP2_MOUNTS:
        with contextlib.suppress(OSError):
            if syscall.fs_magic(path) == syscall.CGROUP2_SUPER_MAGIC:
                return path
    raise BpfPlacesError("no cgroup v2 hierarchy is mounted (needed by --proxy-mode ebpf)")


def cgroup_mount(workdir: str) -> str:
    return os.path.join(workdir, "cgroup2")


def lab_cgroup(workdir: str, prefix: str) -> str:
    return os.path.join(cgroup_mount(workdir), prefix)


def node_cgroup(workdir: str, prefix: str, node: str) -> str:
    return os.path.join(lab_cgroup(workdir, prefix), node)


def in_cgroup(cgroup: str, argv: list) -> list:
    """`argv` run as a process of `cgroup` (it moves itself in, then execs: the pid is kept)."""
    return ["sh", "-c", 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"', "sh", cgroup, *argv]


def in_cgroup_of(state: LabState, target: str, prefix: list, argv: Sequence[str] = ()) -> list:
    """`prefix` + `argv`, run in the cgroup of `target` (a node or a pod's node) when the lab
    `state` is in ebpf mode; unchanged otherwise."""
    node = state.pods[target].node if target in state.pods else target
    if state.proxy_mode != "ebpf" or node not in state.nodes:
        return [*prefix, *argv]
    return [*prefix, *in_cgroup(node_cgroup(state.workdir, state.prefix, node), list(argv))]


def ensure_node(*, workdir: str, prefix: str, node: str, bpf_root: str) -> tuple[str, str]:
    """The node's cgroup and mounted bpffs, made when missing; (bpf root, cgroup)."""
    mount = cgroup_mount(workdir)
    os.makedirs(mount, exist_ok=True)
    if syscall.fs_magic(mount) != syscall.CGROUP2_SUPER_MAGIC:
        cgroup2_mount()   # refuses clearly when the host has no cgroup v2 at all
        subprocess.run(["mount", "-t", "cgroup2", "none", mount], check=True)
    cgroup = node_cgroup(workdir, prefix, node)
    os.makedirs(cgroup, exist_ok=True)
    os.makedirs(bpf_root, exist_ok=True)
    if syscall.fs_magic(bpf_root) != syscall.BPF_FS_MAGIC:
        subprocess.run(["mount", "-t", "bpf", "bpf", bpf_root], check=True)
    return bpf_root, cgroup


def remove_node(*, workdir: str, prefix: str, node: str, bpf_root: str) -> None:
    cgroup = node_cgroup(workdir, prefix, node)
    if _mounted(cgroup_mount(workdir), syscall.CGROUP2_SUPER_MAGIC) and os.path.isdir(cgroup):
        _stop_processes(cgroup)
        detach_owned(cgroup)
        _rmdir(cgroup)
    if _mounted(bpf_root, syscall.BPF_FS_MAGIC):
        remove_pins(bpf_root)
        subprocess.run(["umount", bpf_root], check=True)


def remove_lab(*, workdir: str, prefix: str) -> None:
    """The lab's cgroup directory (once its nodes' are gone) and the lab's cgroup v2 mount."""
    mount = cgroup_mount(workdir)
    if not _mounted(mount, syscall.CGROUP2_SUPER_MAGIC):
        return
    root = lab_cgroup(workdir, prefix)
    if os.path.isdir(root):
        for child in os.listdir(root):
            path = os.path.join(root, child)
            if os.path.isdir(path):
                _stop_processes(path)
                detach_owned(path)
                _rmdir(path)
        _rmdir(root)
    subprocess.run(["umount", mount], check=True)


def _mounted(path: str, magic: int) -> bool:
    try:
        return os.path.isdir(path) and syscall.fs_magic(path) == magic
    except OSError:
        return False


def _stop_processes(cgroup: str) -> None:
    with open(os.path.join(cgroup, "cgroup.procs")) as procs:
        for pid in procs.read().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def _rmdir(path: str) -> None:
    for _ in range(100):   # a killed process leaves its cgroup when it has been reaped
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    os.rmdir(path)
