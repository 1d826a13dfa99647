"""The host-side pieces of the containerd harness (`containerd_harness.ContainerdNode`).

What it needs of the machine (`missing_prerequisites`), the records it hands to tests
(`Container`, `CniCall`, `Link`), its errors, the subprocess runner, the shell prelude that
builds a private mount view, the CNI call recorder, and the teardown of what could outlive a
node (processes, cgroups). Kept apart from the node so that the node module reads as the
runtime's life cycle (start, run, exec, stop, close) and this one as how it stays isolated.

Isolation (see /work/shared/ENVIRONMENT.md for the rules)
---------------------------------------------------------
* Network: one namespace `<prefix>-node-<random>`. containerd (and so every shim and every
  container's parent) runs inside it via `nsenter --net`; ctr and the CNI plugins run inside
  it via `ip netns exec`, which also gives the plugins a sysfs that shows the node's links.
  The root network namespace is only read.
* Files: containerd gets its own config, `--root`, `--state`, gRPC/ttrpc sockets and FIFO
  directory under the node's temporary directory. Paths that containerd 1.6 and libcni
  hard-code (`/run/containerd/s` shim sockets, `/run/containerd/runc`, `/var/lib/cni`,
  `/opt/cni/bin`, `/etc/cni/net.d`) are made visible only inside private mount namespaces
  (`unshare -m --propagation private`): `/run`, `/var/lib`, `/opt` and `/etc` are overlaid
  with a throwaway tmpfs upper layer (so a stray write never reaches the host), and the
  test's directories are bind-mounted at the CNI paths. `mount -n` keeps util-linux from
  creating `/run/mount/utab` on the host. containerd's image snapshots and container rootfs
  mounts therefore exist only in its own mount namespace and vanish with it.
* Cgroups: runc creates `/<namespace>/<id>` in every hierarchy and removes only the leaf;
  the namespace is unique per node and `close()` removes `/<namespace>`.
* Processes: everything is found again by the node's unique directory (in the command lines
  of containerd, its shims and ctr) or by the node's cgroups, and killed by pid.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.e2e.oci_image import BUSYBOX

# What every name of this test process's nodes starts with (network namespaces, containerd
# namespaces and their cgroups, node directories, client namespaces): one per process, so
# that what a check calls "ours" is never another test run's on the same machine.
RUN_PREFIX = f"na-e2e-{secrets.token_hex(2)}"
from tests.elf import is_static_elf

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The paths the private views overlay; the node's temporary directory must not be under them.
OVERLAID = ("/run", "/var/lib", "/opt", "/etc")
_TOOLS = {  # binary -> Debian package that ships it
    "ctr": "containerd",
    "containerd": "containerd",
    "containerd-shim-runc-v2": "containerd",
    "runc": "runc",
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "mount": "mount",
    "umount": "mount",
    "ip": "iproute2",
}
ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}


class HarnessError(RuntimeError):
    """The harness could not set up, drive or tear down the node."""


class ContainerStartError(HarnessError):
    """`ctr run --cni` failed (for example the CNI ADD failed); the message holds ctr's output."""


# ---------------------------------------------------------------- prerequisites

def missing_prerequisites() -> list[str]:
    """Why this machine cannot run the harness; empty when it can."""
    missing = []
    if os.geteuid() != 0:
        missing.append("needs root (network and mount namespaces, containerd)")
    for tool, package in _TOOLS.items():
        if shutil.which(tool, path=ENV["PATH"]) is None:
            missing.append(f"{tool} not found (Debian package {package})")
    if not os.path.exists(BUSYBOX):
        missing.append(f"{BUSYBOX} not found (Debian package busybox-static)")
    elif not is_static_elf(BUSYBOX):
        missing.append(f"{BUSYBOX} is dynamically linked (install busybox-static)")
    try:
        filesystems = Path("/proc/filesystems").read_text()
    except OSError:
        filesystems = ""
    if "overlay" not in filesystems.split():
        missing.append("the kernel has no overlay filesystem (containerd's snapshotter needs it)")
    return missing


# ---------------------------------------------------------------- handles and records

@dataclasses.dataclass
class Container:
    """A container started by `ContainerdNode.run` (a foreground `ctr run --rm --cni`)."""
    name: str
    cni_container_id: str          # what ctr passes as CNI_CONTAINERID: "<namespace>-<name>"
    argv: list[str]
    pid: int                       # the task's pid in the host pid namespace
    log_path: Path                 # ctr's output: the container's stdout/stderr and ctr's log
    process: subprocess.Popen = dataclasses.field(repr=False)
    exit_status: int | None = None  # ctr's exit status once stopped (137 after SIGKILL)


@dataclasses.dataclass(frozen=True)
class CniCall:
    """One plugin execution seen by the recording wrappers (`record_cni_calls=True`)."""
    plugin: str
    command: str
    container_id: str
    netns: str
    ifname: str
    args: str
    path: str
    exit_code: int


@dataclasses.dataclass(frozen=True)
class Link:
    name: str
    kind: str          # "veth", "bridge", ... ; "" for a plain device such as lo
    master: str        # the bridge it is enslaved to, "" when none


# ---------------------------------------------------------------- helpers

def run_tool(argv, *, timeout: float, check: bool = True, env=None, input=None,
         what: str = "") -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=env if env is not None else ENV, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"{what or argv[0]}: timed out after {timeout}s: {shlex.join(argv)}\n"
                           f"stdout: {exc.stdout!r}\nstderr: {exc.stderr!r}") from None
    if check and proc.returncode != 0:
        raise HarnessError(f"{what or argv[0]} failed ({proc.returncode}): {shlex.join(argv)}\n"
                           f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
    return proc


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def view_script(private_dir: Path, overlays, binds, hidden) -> str:
    """A /bin/sh prelude, run as `unshare -m --propagation private sh SCRIPT CMD...`.

    It mounts a tmpfs on the node's private directory (in this mount namespace only), overlays
    `overlays` with upper layers in that tmpfs, hides `hidden` behind empty tmpfs mounts,
    bind-mounts `binds` (source, target) and execs the command.
    """
    q = shlex.quote
    lines = ["set -eu", f"mount -n -t tmpfs -o mode=0700,size=64m na-e2e-view {q(str(private_dir))}"]
    for i, target in enumerate(overlays):
        upper, work = private_dir / f"{i}-upper", private_dir / f"{i}-work"
        lines.append(f"mkdir -p {q(str(upper))} {q(str(work))}")
        lines.append(f"mount -n -t overlay na-e2e-view -o "
                     f"{q(f'lowerdir={target},upperdir={upper},workdir={work}')} {q(target)}")
    for target in hidden:
        lines.append(f"if [ -d {q(target)} ]; then mount -n -t tmpfs -o mode=0755,size=1m "
                     f"na-e2e-hidden {q(target)}; fi")
    for source, target in binds:
        lines.append(f"mkdir -p {q(target)}")
        lines.append(f"mount -n --bind {q(str(source))} {q(target)}")
    lines.append('exec "$@"')
    return "\n".join(lines) + "\n"


RECORDER = """#!/bin/sh
# Recording wrapper written by the e2e harness: logs this CNI call, then runs the real plugin.
{real} "$@"
rc=$?
printf '%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' {name} "$CNI_COMMAND" "$CNI_CONTAINERID" \\
    "$CNI_NETNS" "$CNI_IFNAME" "$CNI_ARGS" "$CNI_PATH" "$rc" >> {log}
exit $rc
"""


# ---------------------------------------------------------------- teardown

def kill_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        try:
            os.kill(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def pids_naming(directory: Path) -> list[int]:
    """Processes whose command line names the node's directory: ctr, containerd, shims."""
    marker = str(directory).encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(entry))
    return pids


def _cgroup_dirs(namespace: str) -> list[Path]:
    candidates = [CGROUP_ROOT / namespace]
    if CGROUP_ROOT.is_dir():
        candidates += [h / namespace for h in CGROUP_ROOT.iterdir() if h.is_dir()]
    return [d for d in candidates if d.is_dir()]


def clean_cgroups(namespace: str, errors: list[str]) -> None:
    """Remove the `/<namespace>` cgroups runc made (killing what was left in them)."""
    dirs = _cgroup_dirs(namespace)
    for top in dirs:  # processes runc left behind (only when a shim died)
        for procs in top.rglob("cgroup.procs"):
            try:
                for pid in procs.read_text().split():
                    os.kill(int(pid), signal.SIGKILL)
            except (OSError, ValueError):
                pass
    deadline = time.monotonic() + 30   # until the killed processes have left their cgroups
    for top in dirs:
        for path in sorted((p for p in [top, *top.rglob("*")] if p.is_dir()),
                           key=lambda p: len(p.parts), reverse=True):
            while True:
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        errors.append(f"cgroup {path}: {exc}")
                        break
                    time.sleep(0.02)
