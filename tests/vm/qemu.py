"""Run a command inside Debian's own kernel under qemu (TCG), on this machine's root filesystem.

This module owns the VM tier's harness. The host kernel lacks IPIP and IPVS; Debian's
`linux-image-amd64` ships them as modules. So the harness boots that kernel and only that:
everything else in the guest (Python, the venv, the project, iproute2, tcpdump) is this
machine's own root filesystem, shared read-only over 9p. Inside the guest, tests build network
namespaces exactly as on the host.

    result = run_in_vm(["uname", "-r"], modules=("ipip",))
    result.returncode, result.output          # the command's exit code and its output
    result.boot_seconds, result.run_seconds   # qemu start -> command start -> command end

How a run is shaped, and why
----------------------------
* Kernel and initramfs: `guest_boot.py` finds Debian's kernel, boots its decompressed PVH
  vmlinux when it can, and builds (and caches) the busybox initramfs that reaches the root.
* Root: the 9p share of "/" is exported read-only by qemu (`readonly=on`) and becomes the lower
  layer of an overlayfs whose upper layer is a tmpfs. Measured on 6.1: overlay over a 9p lower
  works, costs nothing measurable, and makes the whole tree writable inside the guest (pip
  caches, /etc, /var/lib, /root, pytest's temporary directories) while no write can reach the
  host. Fresh tmpfs mounts replace /run (host state such as pid files and /run/netns must not
  leak in) and /tmp, /var/tmp (unless the project lives under one of them, in which case the
  overlay view of it is kept so the project stays visible). proc, sysfs, devtmpfs, devpts,
  /dev/shm, bpffs and cgroup2 (at /sys/fs/cgroup/unified, the host's layout) are mounted.
  The command runs chrooted, while the kernel's own module requests (`ip link add type veth`
  loads veth.ko on demand) run /sbin/modprobe from the initramfs root; there a two-line shim
  chroots into the guest root and runs the real modprobe, so auto-loading works as on a host.
* Job: each run gets a host directory shared read-write (9p, tag `netagent-share`), mounted at
  `GUEST_SHARE` in the guest. The harness writes `job.sh` there (cd, environment, modprobe of
  the requested modules, exec of argv): no quoting through the kernel command line. Tests also
  leave their reports there (see `share_dir`).
* Channels: ttyS0 is the kernel console (saved, shown when something goes wrong); ttyS1 carries
  only the command's stdout and stderr (streamed to the host); ttyS2 carries only status lines
  from the guest's init ("booted", "command", "exit N", "init-failed ..."). Keeping the status on
  its own port means neither kernel messages nor the command's output can garble it.
* Ending: init powers the guest off; qemu runs with `-no-reboot` and the kernel with `panic=-1`,
  so a crash of init also ends qemu. The host kills qemu on timeout, on any exception
  (KeyboardInterrupt included), and qemu gets PR_SET_PDEATHSIG so it dies with its parent.
* Speed (measured here, TCG, 2 vCPUs): qemu start to the command about 5 s; `python -c pass`
  1-3 s; `import pyroute2` 5-8 s. Python code runs 15-20x slower than on the host, so the tier
  should boot once and run many guest tests in one pytest process.
"""
from __future__ import annotations

import ctypes
import dataclasses
import os
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Iterable

from tests.vm.guest_boot import (BUSYBOX, GUEST_SHARE, ROOT_TAG, SHARE_TAG, STATUS_PREFIX, GuestKernel,
                                  VmUnavailable, ensure_boot_image, ensure_initramfs, find_guest_kernel)
from tests.elf import is_static_elf

QEMU = "qemu-system-x86_64"
PROJECT_DIR = Path(__file__).resolve().parents[2]
GUEST_ENV_FLAG = "NETAGENT_VM_GUEST"
GUEST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

KERNEL_ARGS = ("console=ttyS0", "quiet", "panic=-1", "cryptomgr.notests")


class VmFailure(RuntimeError):
    """The guest did not run the command to completion (init failed, crash, timeout)."""

    def __init__(self, message: str, *, output: str = "", console: str = ""):
        super().__init__(message)
        self.output = output
        self.console = console

    def __str__(self):
        return (f"{self.args[0]}\n--- command output ---\n{_tail(self.output)}"
                f"\n--- guest console ---\n{_tail(self.console)}")


class VmTimeout(VmFailure):
    """The run exceeded its timeout; qemu was killed."""


@dataclasses.dataclass(frozen=True)
class VmResult:
    returncode: int
    output: str
    boot_seconds: float
    run_seconds: float
    console: str = ""


def missing_reason() -> str | None:
    """Why the VM tier cannot run here, naming the package to install; None when it can."""
    missing = []
    if shutil.which(QEMU) is None:
        missing.append(f"{QEMU} not found (apt-get install qemu-system-x86)")
    kernel = find_guest_kernel()
    if kernel is None:
        missing.append("no /boot/vmlinuz-* with matching /lib/modules holding 9p and virtio "
                       "modules (apt-get install linux-image-amd64)")
    elif not os.access(kernel.vmlinuz, os.R_OK):
        missing.append(f"{kernel.vmlinuz} is not readable (run as root)")
    if not BUSYBOX.is_file() or not is_static_elf(BUSYBOX):
        missing.append(f"{BUSYBOX} missing or not statically linked (apt-get install busybox-static)")
    return "; ".join(missing) or None


# --------------------------------------------------------------------------- the job

def render_job_script(argv: list[str], *, cwd: Path, env: dict[str, str],
                      modules: Iterable[str]) -> str:
    """The shell script the guest runs in the chroot: environment, modules, then exec argv."""
    lines = ["# written by tests/vm/qemu.py for one guest run",
             f"fail() {{ echo \"{STATUS_PREFIX} init-failed $*\" > /dev/ttyS2; exit 1; }}",
             f"cd {shlex.quote(str(cwd))} || fail {shlex.quote(f'cd {cwd}')}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in env.items()]
    modules = list(modules)
    if modules:
        names = " ".join(shlex.quote(m) for m in modules)
        lines.append(f"modprobe -a {names} || fail {shlex.quote('modprobe ' + ' '.join(modules))}")
    lines.append(f"echo '{STATUS_PREFIX} command' > /dev/ttyS2")
    lines.append("exec " + " ".join(shlex.quote(a) for a in argv))
    return "\n".join(lines) + "\n"


def guest_environment(kernel: GuestKernel, extra: dict[str, str] | None) -> dict[str, str]:
    env = {"PATH": GUEST_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
           GUEST_ENV_FLAG: "1", "NETAGENT_VM_SHARE": GUEST_SHARE,
           "NETAGENT_VM_KERNEL": kernel.version}
    env.update(extra or {})
    return env


def _fresh_tmp_dirs(cwd: Path) -> list[str]:
    """/tmp and /var/tmp get fresh tmpfs mounts unless that would hide the working directory."""
    resolved = cwd.resolve()
    return [d for d in ("/tmp", "/var/tmp")
            if not (resolved == Path(d).resolve() or Path(d).resolve() in resolved.parents)]


def render_qemu_argv(*, image: Path, initramfs: Path, kernel_args: list[str], memory_mb: int,
                     console_log: Path, status_socket: Path, share_dir: Path) -> list[str]:
    return [
        QEMU, "-accel", "tcg,thread=multi", "-smp", "2", "-m", str(memory_mb),
        "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot", "-nic", "none",
        "-kernel", str(image), "-initrd", str(initramfs), "-append", " ".join(kernel_args),
        "-chardev", f"file,id=console,path={console_log}", "-serial", "chardev:console",
        "-chardev", "stdio,id=output,signal=off", "-serial", "chardev:output",
        "-chardev", f"socket,id=status,path={status_socket}", "-serial", "chardev:status",
        "-virtfs", f"local,path=/,mount_tag={ROOT_TAG},security_model=passthrough,readonly=on,"
                   "multidevs=remap",
        "-virtfs", f"local,path={share_dir},mount_tag={SHARE_TAG},security_model=none,"
                   "multidevs=remap",
    ]


# --------------------------------------------------------------------------- running

_PR_SET_PDEATHSIG = 1
# Resolved at import: the child between fork and exec must not take the dynamic loader's locks.
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def _tail(text: str, lines: int = 60) -> str:
    return "\n".join(text.splitlines()[-lines:])


class _StatusListener:
    """Accepts qemu's connection on the status socket and timestamps each status line."""

    def __init__(self, path: Path):
        self.lines: list[tuple[float, str]] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            conn, _ = self._server.accept()
        except OSError:
            return
        buffer = b""
        with conn:
            while chunk := conn.recv(4096):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    text = line.decode(errors="replace").strip()
                    if text.startswith(STATUS_PREFIX + " "):
                        self.lines.append((time.monotonic(), text[len(STATUS_PREFIX) + 1:]))

    def close(self) -> None:
        try:
            self._server.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._server.close()
        self._thread.join(timeout=5)

    def first(self, prefix: str) -> tuple[float, str] | None:
        return next(((t, s) for t, s in self.lines if s.split()[0] == prefix), None)


def _pump_output(stream, chunks: list[str], echo_to: Callable[[str], None] | None) -> None:
    while data := stream.read1(65536):
        text = data.decode(errors="replace").replace("\r\n", "\n")
        chunks.append(text)
        if echo_to is not None:
            echo_to(text)


def run_in_vm(argv: list[str], *, modules: Iterable[str] = ("ipip",), timeout: float = 600,
              env: dict[str, str] | None = None, memory_mb: int = 1536,
              cwd: Path | str = PROJECT_DIR, share_dir: Path | str | None = None,
              echo_to: Callable[[str], None] | None = None) -> VmResult:
    """Boot the guest kernel, run argv in `cwd` on the shared root, return its exit code and output.

    `modules` are modprobed inside the guest before argv starts. `share_dir` (a host directory,
    created when missing) appears read-write at GUEST_SHARE in the guest; without it a
    temporary one is used and removed. `echo_to` receives the command's output as it arrives.
    Raises VmUnavailable when tools are missing, VmTimeout / VmFailure when the guest does not
    report the command's exit.
    """
    reason = missing_reason()
    if reason:
        raise VmUnavailable(reason)
    kernel = find_guest_kernel()
    image = ensure_boot_image(kernel)
    initramfs = ensure_initramfs(kernel)
    cwd = Path(cwd)
    with tempfile.TemporaryDirectory(prefix="netagent-vm-") as run_dir_name:
        run_dir = Path(run_dir_name)
        share = Path(share_dir) if share_dir is not None else run_dir / "share"
        share.mkdir(parents=True, exist_ok=True)
        (share / "job.sh").write_text(render_job_script(
            list(argv), cwd=cwd, env=guest_environment(kernel, env), modules=modules))
        kernel_args = [*KERNEL_ARGS, f"netagent.fresh_tmp={','.join(_fresh_tmp_dirs(cwd))}"]
        console_log = run_dir / "console.log"
        status = _StatusListener(run_dir / "status.sock")
        qemu_argv = render_qemu_argv(image=image, initramfs=initramfs, kernel_args=kernel_args,
                                     memory_mb=memory_mb, console_log=console_log,
                                     status_socket=run_dir / "status.sock", share_dir=share)
        return _supervise(qemu_argv, status=status, console_log=console_log,
                          timeout=timeout, echo_to=echo_to)


def _supervise(qemu_argv: list[str], *, status: _StatusListener, console_log: Path,
               timeout: float, echo_to: Callable[[str], None] | None) -> VmResult:
    chunks: list[str] = []
    started = time.monotonic()
    stderr_log = console_log.with_name("qemu.stderr")
    with open(stderr_log, "wb") as stderr_file:
        proc = subprocess.Popen(qemu_argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=stderr_file, preexec_fn=_die_with_parent)
    pump = threading.Thread(target=_pump_output, args=(proc.stdout, chunks, echo_to), daemon=True)
    pump.start()
    timed_out = False
    try:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        pump.join(timeout=10)
        status.close()
    stderr = stderr_log.read_text(errors="replace")
    output = "".join(chunks)
    console = console_log.read_text(errors="replace") if console_log.exists() else ""
    if stderr.strip():
        console += f"\n--- qemu stderr (exit {proc.returncode}) ---\n{stderr}"
    if timed_out:
        raise VmTimeout(f"guest did not finish within {timeout:.0f} s; qemu killed",
                        output=output, console=console)
    failed = status.first("init-failed")
    if failed:
        raise VmFailure(f"guest init failed: {failed[1].split(maxsplit=1)[-1]}", output=output,
                        console=console)
    exited = status.first("exit")
    if exited is None:
        raise VmFailure(f"guest ended without reporting an exit status (qemu exit {proc.returncode})",
                        output=output, console=console)
    command = status.first("command")
    command_at = command[0] if command else exited[0]
    return VmResult(returncode=int(exited[1].split()[1]), output=output,
                    boot_seconds=command_at - started, run_seconds=exited[0] - command_at,
                    console=console)

