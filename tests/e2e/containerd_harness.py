"""Run real containers with containerd 1.6's `ctr run --cni`, isolated from this machine.

This module owns the end-to-end harness: a throwaway containerd ("the node") whose containers
get their network from the CNI plugin a test chooses. Everything the harness creates lives in
one temporary directory, one network namespace and a few private mount namespaces, and
`ContainerdNode.close()` removes all of it, also when a test fails half-way.

    image = oci_image.build_busybox_image(tmp_dir)           # once per session
    with ContainerdNode(cni_bin_dir=b, cni_conf_dir=c, image=image) as node:
        c1 = node.run("c1", ["sleep", "300"])
        ip = node.container_ip(c1)
        node.exec(c1, ["ping", "-c", "1", "-W", "2", ip])   # subprocess.CompletedProcess
        node.stop(c1)                                        # ctr itself runs CNI DEL here
        node.links()                                         # what the plugin left on the node

What ctr 1.6 (1.6.20 measured here) does and does not do for CNI
-------------------------------------------------------------------
* `ctr run --cni` loads one network: the lexically first `*.conf`/`*.conflist`/`*.json` in
  `/etc/cni/net.d`, and finds plugins in `/opt/cni/bin`. It has no flags for either path,
  hence the bind mounts below. Debian's build adds `/usr/lib/cni` as a second plugin
  directory (plugins see `CNI_PATH=/opt/cni/bin:/usr/lib/cni`); the harness hides
  `/usr/lib/cni` behind an empty tmpfs so that only the test's binaries can run. A
  consequence: a bin dir must hold copies of Debian's plugins, not symlinks into
  `/usr/lib/cni`.
* ADD: after the task is created and before it starts, with `CNI_CONTAINERID=<namespace>-<id>`
  (`Container.cni_container_id`), `CNI_NETNS=/proc/<task pid>/ns/net`, `CNI_IFNAME=eth0`,
  empty `CNI_ARGS`. libcni caches the result under `/var/lib/cni/results` (here, a directory
  of the node).
* The loopback plugin is never called and is not needed: runc itself brings `lo` up in the
  container's new network namespace.
* DEL: `ctr run -d` followed by `ctr task kill` / `ctr task rm` / `ctr container rm` never
  calls CNI DEL (measured: the IPAM reservation and the libcni cache entry stay; only the
  veth disappears, because the kernel deletes it with the container's network namespace).
  The one path where ctr calls DEL is a foreground `ctr run --rm --cni`: when the task exits,
  ctr calls DEL for the same network with the same container id and ifname but with an empty
  `CNI_NETNS` (the namespace is already gone), then deletes the task and the container. A
  failed DEL does not change ctr's exit status; ctr only logs
  `level=error msg="network review" error="..."`.
  So `run()` starts exactly that foreground `ctr run --rm --cni` as a background process and
  `stop()` SIGKILLs the task and waits for ctr to finish: the DEL a test observes is the one
  the runtime really makes, through the same plugin with the same environment.
  `stop()` raises `HarnessError` when ctr logged a failed DEL.
* When ADD fails, ctr calls DEL, exits non-zero and leaves the stopped task and the container
  behind; `run()` removes them and raises `ContainerStartError` with ctr's output.

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
import ipaddress
import json
import os
import secrets
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.e2e.oci_image import BUSYBOX, ImageArchive

CGROUP_ROOT = Path("/sys/fs/cgroup")
# The paths the private views overlay; the node's temporary directory must not be under them.
_OVERLAID = ("/run", "/var/lib", "/opt", "/etc")
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
_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
}


class HarnessError(RuntimeError):
    """The harness could not set up, drive or tear down the node."""


class ContainerStartError(HarnessError):
    """`ctr run --cni` failed (for example the CNI ADD failed); the message holds ctr's output."""


# ---------------------------------------------------------------- prerequisites

def _is_static_elf(path: str) -> bool:
    """True when the ELF file has no PT_INTERP program header (no dynamic loader)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:  # 64-bit only: this machine is amd64
            return False
        endian = "<" if head[5] == 1 else ">"
        phoff, = struct.unpack_from(endian + "Q", head, 32)
        phentsize, phnum = struct.unpack_from(endian + "HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    return all(struct.unpack_from(endian + "I", table, i * phentsize)[0] != 3 for i in range(phnum))


def missing_prerequisites() -> list[str]:
    """Why this machine cannot run the harness; empty when it can."""
    missing = []
    if os.geteuid() != 0:
        missing.append("needs root (network and mount namespaces, containerd)")
    for tool, package in _TOOLS.items():
        if shutil.which(tool, path=_ENV["PATH"]) is None:
            missing.append(f"{tool} not found (Debian package {package})")
    if not os.path.exists(BUSYBOX):
        missing.append(f"{BUSYBOX} not found (Debian package busybox-static)")
    elif not _is_static_elf(BUSYBOX):
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

def _run(argv, *, timeout: float, check: bool = True, env=None, input=None,
         what: str = "") -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=env if env is not None else _ENV, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"{what or argv[0]}: timed out after {timeout}s: {shlex.join(argv)}\n"
                           f"stdout: {exc.stdout!r}\nstderr: {exc.stderr!r}") from None
    if check and proc.returncode != 0:
        raise HarnessError(f"{what or argv[0]} failed ({proc.returncode}): {shlex.join(argv)}\n"
                           f"stdout: {proc.stdout}\nstderr: {proc.stderr}")
    return proc


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _view_script(private_dir: Path, overlays, binds, hidden) -> str:
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


_RECORDER = """#!/bin/sh
# Recording wrapper written by the e2e harness: logs this CNI call, then runs the real plugin.
{real} "$@"
rc=$?
printf '%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' {name} "$CNI_COMMAND" "$CNI_CONTAINERID" \\
    "$CNI_NETNS" "$CNI_IFNAME" "$CNI_ARGS" "$CNI_PATH" "$rc" >> {log}
exit $rc
"""


# ---------------------------------------------------------------- the node

class ContainerdNode:
    """A throwaway containerd whose containers are networked by the given CNI directories.

    cni_bin_dir     plugins, seen by ctr as /opt/cni/bin (copies, not links into /usr/lib/cni)
    cni_conf_dir    network configs, seen by ctr as /etc/cni/net.d (the first file wins)
    image           the archive from `build_busybox_image`, imported at start
    name_prefix     prefix of the network namespace, containerd namespace and temp directory
    record_cni_calls  put recording wrappers in front of every plugin (see `cni_calls()`)
    log_dir         where to copy containerd's, ctr's and the call logs at close (optional)
    timeout         the limit for each single step (start, import, exec, stop), in seconds
    """

    def __init__(self, *, cni_bin_dir, cni_conf_dir, image: ImageArchive,
                 name_prefix: str = "na-e2e", record_cni_calls: bool = False,
                 log_dir=None, timeout: float = 30.0):
        self.cni_bin_dir = Path(cni_bin_dir).resolve()
        self.cni_conf_dir = Path(cni_conf_dir).resolve()
        self.image = image
        self.record_cni_calls = record_cni_calls
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.timeout = timeout
        token = secrets.token_hex(3)
        self.netns = f"{name_prefix}-node-{token}"
        self.namespace = f"{name_prefix}-{token}"      # containerd namespace and cgroup parent
        self.ctr_namespace = self.namespace
        self._prefix = name_prefix
        self.tmp_dir: Path | None = None
        self.plugin_dir = self.cni_bin_dir
        self.timings: dict[str, float] = {}
        self._containers: dict[str, Container] = {}
        self._containerd: subprocess.Popen | None = None
        self._netns_created = False
        self._exec_seq = 0

    # cri would watch /etc/cni/net.d and serve Kubernetes: cri_harness.CriNode enables it.
    _disabled_plugins: tuple[str, ...] = ("io.containerd.grpc.v1.cri",)

    # -- paths
    @property
    def address(self) -> Path:
        return self.tmp_dir / "state" / "containerd.sock"

    @property
    def cni_calls_log(self) -> Path:
        return self.tmp_dir / "cni-calls.log"

    @property
    def cni_cache_dir(self) -> Path:
        """What ctr's libcni sees as /var/lib/cni (its `results` cache lives here)."""
        return self.tmp_dir / "var-lib-cni"

    # -- lifecycle
    def __enter__(self) -> ContainerdNode:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(raise_errors=exc_type is None)

    def start(self) -> None:
        for d in (self.cni_bin_dir, self.cni_conf_dir):
            if not d.is_dir():
                raise HarnessError(f"{d} is not a directory")
        try:
            self._prepare_dirs()
            _run(["ip", "netns", "add", self.netns], timeout=10)
            self._netns_created = True
            self._start_containerd()
            t0 = time.monotonic()
            self.ctr(["images", "import", str(self.image.path)], timeout=self.timeout)
            self.timings["image_import"] = time.monotonic() - t0
        except BaseException:
            self.close(raise_errors=False)
            raise

    def _prepare_dirs(self) -> None:
        self.tmp_dir = Path(tempfile.mkdtemp(prefix=f"{self._prefix}-"))
        if any(str(self.tmp_dir).startswith(p + "/") for p in _OVERLAID):
            raise HarnessError(f"the node directory {self.tmp_dir} is under an overlaid path "
                               f"{_OVERLAID}; set TMPDIR elsewhere (for example /tmp)")
        for sub in ("root", "state", "fifo", "ctr-view", "containerd-view", "logs", "var-lib-cni"):
            (self.tmp_dir / sub).mkdir(mode=0o700)
        bin_dir = self.cni_bin_dir
        if self.record_cni_calls:
            bin_dir = self.tmp_dir / "cni-bin"
            bin_dir.mkdir()
            self.cni_calls_log.touch()
            for plugin in sorted(self.cni_bin_dir.iterdir()):
                if plugin.is_file() and os.access(plugin, os.X_OK):
                    wrapper = bin_dir / plugin.name
                    wrapper.write_text(_RECORDER.format(
                        real=shlex.quote(str(plugin)), name=shlex.quote(plugin.name),
                        log=shlex.quote(str(self.cni_calls_log))))
                    wrapper.chmod(0o755)
        self.plugin_dir = bin_dir  # what the runtime searches: the wrappers when recording
        (self.tmp_dir / "ctr-view.sh").write_text(_view_script(
            self.tmp_dir / "ctr-view", overlays=_OVERLAID, hidden=["/usr/lib/cni"],
            binds=[(bin_dir, "/opt/cni/bin"), (self.cni_conf_dir, "/etc/cni/net.d"),
                   (self.cni_cache_dir, "/var/lib/cni")]))
        (self.tmp_dir / "containerd-view.sh").write_text(_view_script(
            self.tmp_dir / "containerd-view", overlays=("/run", "/var/lib"), hidden=[], binds=[]))
        (self.tmp_dir / "containerd.toml").write_text("\n".join(self._containerd_config()) + "\n")

    def _containerd_config(self) -> list[str]:
        """containerd's config.toml, as lines; subclasses add plugin sections after these."""
        root, state = self.tmp_dir / "root", self.tmp_dir / "state"
        disabled = [*self._disabled_plugins, "io.containerd.internal.v1.opt",
                    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
        return [
            "version = 2",
            f"root = {json.dumps(str(root))}",
            f"state = {json.dumps(str(state))}",
            # opt writes /var/lib/containerd (overlaid, but needless).
            f"disabled_plugins = {json.dumps(disabled)}",
            "[grpc]", f"  address = {json.dumps(str(self.address))}",
            "[ttrpc]", f"  address = {json.dumps(str(state / 'containerd.ttrpc.sock'))}",
            "[debug]", '  address = ""',
            "[metrics]", '  address = ""',
        ]

    def _env(self) -> dict:
        return {**_ENV, "TMPDIR": str(self.tmp_dir)}

    def _start_containerd(self) -> None:
        log = self.tmp_dir / "logs" / "containerd.log"
        argv = ["nsenter", f"--net=/run/netns/{self.netns}",
                "unshare", "--mount", "--propagation", "private",
                "/bin/sh", str(self.tmp_dir / "containerd-view.sh"),
                "containerd", "--config", str(self.tmp_dir / "containerd.toml"), "--log-level", "info"]
        t0 = time.monotonic()
        with open(log, "wb") as out:
            self._containerd = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                                stderr=subprocess.STDOUT, env=self._env(),
                                                start_new_session=True)
        deadline = t0 + self.timeout
        while True:
            if self._containerd.poll() is not None:
                raise HarnessError(f"containerd exited with {self._containerd.returncode}:\n{_tail(log)}")
            if self.address.exists() and self.ctr(["version"], check=False, timeout=5).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise HarnessError(f"containerd did not answer within {self.timeout}s:\n{_tail(log)}")
            time.sleep(0.01)
        self.timings["containerd_start"] = time.monotonic() - t0

    # -- ctr
    def _ctr_argv(self, args) -> list[str]:
        return ["ctr", "--address", str(self.address), "--namespace", self.ctr_namespace,
                "--connect-timeout", "5s", *args]

    def _cni_view_argv(self, argv) -> list[str]:
        return ["ip", "netns", "exec", self.netns, "unshare", "--mount", "--propagation", "private",
                "/bin/sh", str(self.tmp_dir / "ctr-view.sh"), *argv]

    def ctr(self, args, *, cni_view: bool = False, check: bool = True,
            timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run `ctr ARGS` against this node; `cni_view=True` runs it as `run()` runs ctr
        (in the node netns, with the CNI directories mounted), which `--cni` needs."""
        argv = self._ctr_argv(args)
        if cni_view:
            argv = self._cni_view_argv(argv)
        return _run(argv, timeout=timeout or self.timeout, check=check, env=self._env(), what="ctr")

    def cni_view_run(self, argv, *, input: str | None = None, env: dict | None = None,
                     check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run any command where ctr runs CNI plugins: in the node netns, with the node's
        /opt/cni/bin, /etc/cni/net.d and /var/lib/cni, and with `env` added to ctr's."""
        return _run(self._cni_view_argv(argv), timeout=timeout or self.timeout, check=check,
                    env={**self._env(), **(env or {})}, input=input, what=argv[0])

    def _task_status(self, name: str) -> tuple[int, str] | None:
        for line in self.ctr(["tasks", "ls"], timeout=10).stdout.splitlines()[1:]:
            fields = line.split()
            if len(fields) == 3 and fields[0] == name:
                return int(fields[1]), fields[2]
        return None

    # -- containers
    def run(self, name: str, argv, *, timeout: float | None = None) -> Container:
        """Start a long-running container; return once its task runs, i.e. once CNI ADD is done.

        Runs `ctr run --rm --cni IMAGE NAME ARGV...` in the foreground of a background
        process, so that ctr calls CNI DEL itself when the task ends (see the module doc).
        """
        if name in self._containers:
            raise HarnessError(f"container {name} is already running")
        timeout = timeout or self.timeout
        log_path = self.tmp_dir / "logs" / f"ctr-run-{name}.log"
        cmd = self._cni_view_argv(self._ctr_argv([
            "run", "--rm", "--cni", "--fifo-dir", str(self.tmp_dir / "fifo"),
            self.image.ref, name, *argv]))
        t0 = time.monotonic()
        with open(log_path, "wb") as out:
            process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, env=self._env(),
                                       start_new_session=True)
        deadline = t0 + timeout
        while True:
            status = self._task_status(name)
            if status is not None and status[1] == "RUNNING":
                break
            if process.poll() is not None:
                self._remove_leftover(name)
                raise ContainerStartError(
                    f"ctr run {name} exited with {process.returncode} before its task was seen running:\n"
                    f"{_tail(log_path)}{self._calls_note()}")
            if time.monotonic() > deadline:
                self._kill_process(process)
                self._remove_leftover(name)
                raise ContainerStartError(f"container {name} not running after {timeout}s:\n"
                                          f"{_tail(log_path)}{self._calls_note()}")
            time.sleep(0.01)
        self.timings[f"run:{name}"] = time.monotonic() - t0
        container = Container(name=name, cni_container_id=f"{self.namespace}-{name}",
                              argv=list(argv), pid=status[0], log_path=log_path, process=process)
        self._containers[name] = container
        return container

    def _calls_note(self) -> str:
        if not self.record_cni_calls:
            return ""
        calls = "\n".join(f"  {c}" for c in self.cni_calls())
        return f"\nCNI calls so far:\n{calls}"

    def _remove_leftover(self, name: str) -> None:
        """After a failed run: ctr leaves the stopped task and the container; remove them."""
        self.ctr(["tasks", "kill", "--signal", "SIGKILL", name], check=False, timeout=10)
        self.ctr(["tasks", "delete", "--force", name], check=False, timeout=10)
        self.ctr(["containers", "delete", name], check=False, timeout=10)

    def exec(self, container: Container, argv, *, timeout: float | None = None,
             check: bool = False) -> subprocess.CompletedProcess:
        """Run ARGV inside the container (`ctr task exec`); stdout and stderr are captured."""
        self._exec_seq += 1
        return _run(self._ctr_argv(["tasks", "exec", "--exec-id", f"e2e-{self._exec_seq}",
                                    "--fifo-dir", str(self.tmp_dir / "fifo"),
                                    container.name, *argv]),
                    timeout=timeout or self.timeout, check=check, env=self._env(),
                    what=f"exec in {container.name}")

    def container_interface(self, container: Container, ifname: str = "eth0") -> ipaddress.IPv4Interface:
        """The first IPv4 address (with its prefix) on IFNAME, read inside the container."""
        proc = self.exec(container, ["ip", "-o", "-4", "addr", "show", "dev", ifname], check=True)
        for line in proc.stdout.splitlines():
            fields = line.split()
            if "inet" in fields:
                return ipaddress.IPv4Interface(fields[fields.index("inet") + 1])
        raise HarnessError(f"{container.name} has no IPv4 address on {ifname}:\n{proc.stdout}")

    def container_ip(self, container: Container, ifname: str = "eth0") -> str:
        """The first IPv4 address on IFNAME inside the container, as a string."""
        return str(self.container_interface(container, ifname).ip)

    def stop(self, container: Container, *, timeout: float | None = None) -> int:
        """SIGKILL the task; ctr then calls CNI DEL and deletes the task and the container.

        Returns ctr's exit status (137 after SIGKILL). Raises HarnessError when ctr reported
        a failed DEL or the container is still there afterwards.
        """
        timeout = timeout or self.timeout
        t0 = time.monotonic()
        if container.process.poll() is None:
            self.ctr(["tasks", "kill", "--signal", "SIGKILL", container.name], check=False,
                     timeout=timeout)
        try:
            container.exit_status = container.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill_process(container.process)
            raise HarnessError(f"ctr run {container.name} did not finish within {timeout}s "
                               f"after SIGKILL:\n{_tail(container.log_path)}") from None
        finally:
            self._containers.pop(container.name, None)
        self.timings[f"stop:{container.name}"] = time.monotonic() - t0
        log = container.log_path.read_text(errors="replace")
        if 'msg="network review"' in log:
            raise HarnessError(f"CNI DEL failed for {container.name} (ctr's log):\n{_tail(container.log_path)}"
                               f"{self._calls_note()}")
        left = self.ctr(["containers", "ls", "--quiet"], timeout=10).stdout.split()
        if container.name in left:
            raise HarnessError(f"container {container.name} still exists after ctr run --rm ended:\n"
                               f"{_tail(container.log_path)}")
        return container.exit_status

    # -- the node's side
    def daemon_argv(self) -> list[str]:
        """The argv prefix that runs a node daemon (the CNI agent) where the node's CNI
        plugins run: here the node's network namespace, with a sysfs that shows its links."""
        return ["ip", "netns", "exec", self.netns]

    def netns_run(self, argv, *, check: bool = True, timeout: float | None = None,
                  input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command in the node's network namespace (`ip netns exec`)."""
        return _run(["ip", "netns", "exec", self.netns, *argv], timeout=timeout or self.timeout,
                    check=check, input=input, what=argv[0])

    def links(self) -> list[Link]:
        """The node's network interfaces, from `ip -json -details link`."""
        out = self.netns_run(["ip", "-json", "-details", "link", "show"]).stdout
        return [Link(name=l["ifname"], kind=l.get("linkinfo", {}).get("info_kind", ""),
                     master=l.get("master", "")) for l in json.loads(out or "[]")]

    def cni_calls(self) -> list[CniCall]:
        """Every plugin execution so far, in order of completion (needs record_cni_calls)."""
        if not self.record_cni_calls:
            raise HarnessError("cni_calls() needs ContainerdNode(record_cni_calls=True)")
        calls = []
        for line in self.cni_calls_log.read_text().splitlines():
            f = line.split("\t")
            calls.append(CniCall(plugin=f[0], command=f[1], container_id=f[2], netns=f[3],
                                 ifname=f[4], args=f[5], path=f[6], exit_code=int(f[7])))
        return calls

    # -- teardown
    @staticmethod
    def _kill_process(process: subprocess.Popen) -> None:
        if process.poll() is None:
            try:
                os.kill(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def _our_pids(self) -> list[int]:
        """Processes whose command line names this node's directory: ctr, containerd, shims."""
        marker = str(self.tmp_dir).encode()
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

    def _cgroup_dirs(self) -> list[Path]:
        candidates = [CGROUP_ROOT / self.namespace]
        if CGROUP_ROOT.is_dir():
            candidates += [h / self.namespace for h in CGROUP_ROOT.iterdir() if h.is_dir()]
        return [d for d in candidates if d.is_dir()]

    def _clean_cgroups(self, errors: list[str]) -> None:
        dirs = self._cgroup_dirs()
        for top in dirs:  # processes runc left behind (only when a shim died)
            for procs in top.rglob("cgroup.procs"):
                try:
                    for pid in procs.read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + 5
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

    def close(self, *, raise_errors: bool = True) -> None:
        """Remove everything the node created; idempotent. Errors are collected, not fatal,
        so that every later step still runs; they are raised (or printed) at the end."""
        errors: list[str] = []

        def step(what, fn, *args, **kwargs):
            try:
                fn(*args, **kwargs)
            except Exception as exc:  # keep tearing down
                errors.append(f"{what}: {exc}")

        for container in list(self._containers.values()):
            step(f"stop {container.name}", self.stop, container, timeout=15)
        if self._containerd is not None and self._containerd.poll() is None:
            def remove_strays():
                for line in self.ctr(["tasks", "ls"], timeout=10).stdout.splitlines()[1:]:
                    self.ctr(["tasks", "kill", "--signal", "SIGKILL", line.split()[0]],
                             check=False, timeout=10)
                for name in self.ctr(["containers", "ls", "--quiet"], timeout=10).stdout.split():
                    self.ctr(["tasks", "delete", "--force", name], check=False, timeout=10)
                    self.ctr(["containers", "delete", name], check=False, timeout=10)
            step("remove leftover containers", remove_strays)
            self._containerd.send_signal(signal.SIGTERM)
            try:
                self._containerd.wait(timeout=10)
            except subprocess.TimeoutExpired:
                errors.append("containerd ignored SIGTERM for 10s; killed")
                self._kill_process(self._containerd)
        if self.tmp_dir is not None:
            for _ in range(3):  # shims and ctr processes that outlived containerd
                pids = self._our_pids()
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)
            else:
                errors.append(f"processes still alive: {self._our_pids()}")
        self._clean_cgroups(errors)
        if self._netns_created:
            step("ip netns del", _run, ["ip", "netns", "del", self.netns], timeout=10)
            self._netns_created = False
        if self.tmp_dir is not None and self.tmp_dir.exists():
            mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                      if line.split()[1].startswith(str(self.tmp_dir))]
            for mount in sorted(mounts, key=len, reverse=True):  # never expected: all are private
                errors.append(f"mount {mount} was visible on the host")
                _run(["umount", "-n", "-l", mount], timeout=10, check=False)
            if self.log_dir is not None:
                step("copy logs", shutil.copytree, self.tmp_dir / "logs", self.log_dir,
                     dirs_exist_ok=True)
                if self.record_cni_calls and self.cni_calls_log.exists():
                    step("copy call log", shutil.copy, self.cni_calls_log, self.log_dir)
            step("remove the node directory", shutil.rmtree, self.tmp_dir)
        self._containerd = None
        if errors:
            message = f"teardown of node {self.netns} left problems:\n  " + "\n  ".join(errors)
            if raise_errors:
                raise HarnessError(message)
            print(message, file=sys.stderr)
