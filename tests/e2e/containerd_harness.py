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

Isolation: one network namespace, private mount namespaces over a throwaway tmpfs, the
node's own cgroups and processes found again by its directory; `containerd_support.py`
says how, and holds the host-side pieces (records, the runner, the view script, teardown).
"""
from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.e2e.containerd_support import (ENV, OVERLAID, RECORDER, RUN_PREFIX, CniCall, Container, ContainerStartError,
                                          HarnessError, Link, clean_cgroups, kill_process, missing_prerequisites,
                                          pids_naming, run_tool, tail, view_script)
from tests.e2e.oci_image import ImageArchive

__all__ = ["CniCall", "Container", "ContainerStartError", "ContainerdNode", "HarnessError", "ImageArchive",
           "Link", "missing_prerequisites"]


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
                 name_prefix: str = RUN_PREFIX, record_cni_calls: bool = False,
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
            run_tool(["ip", "netns", "add", self.netns], timeout=10)
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
        if any(str(self.tmp_dir).startswith(p + "/") for p in OVERLAID):
            raise HarnessError(f"the node directory {self.tmp_dir} is under an overlaid path "
                               f"{OVERLAID}; set TMPDIR elsewhere (for example /tmp)")
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
                    wrapper.write_text(RECORDER.format(
                        real=shlex.quote(str(plugin)), name=shlex.quote(plugin.name),
                        log=shlex.quote(str(self.cni_calls_log))))
                    wrapper.chmod(0o755)
        self.plugin_dir = bin_dir  # what the runtime searches: the wrappers when recording
        (self.tmp_dir / "ctr-view.sh").write_text(view_script(
            self.tmp_dir / "ctr-view", overlays=OVERLAID, hidden=["/usr/lib/cni"],
            binds=[(bin_dir, "/opt/cni/bin"), (self.cni_conf_dir, "/etc/cni/net.d"),
                   (self.cni_cache_dir, "/var/lib/cni")]))
        (self.tmp_dir / "containerd-view.sh").write_text(view_script(
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
        return {**ENV, "TMPDIR": str(self.tmp_dir)}

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
                raise HarnessError(f"containerd exited with {self._containerd.returncode}:\n{tail(log)}")
            if self.address.exists() and self.ctr(["version"], check=False, timeout=5).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise HarnessError(f"containerd did not answer within {self.timeout}s:\n{tail(log)}")
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
        return run_tool(argv, timeout=timeout or self.timeout, check=check, env=self._env(), what="ctr")

    def cni_view_run(self, argv, *, input: str | None = None, env: dict | None = None,
                     check: bool = True, timeout: float | None = None) -> subprocess.CompletedProcess:
        """Run any command where ctr runs CNI plugins: in the node netns, with the node's
        /opt/cni/bin, /etc/cni/net.d and /var/lib/cni, and with `env` added to ctr's."""
        return run_tool(self._cni_view_argv(argv), timeout=timeout or self.timeout, check=check,
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
                    f"{tail(log_path)}{self._calls_note()}")
            if time.monotonic() > deadline:
                kill_process(process)
                self._remove_leftover(name)
                raise ContainerStartError(f"container {name} not running after {timeout}s:\n"
                                          f"{tail(log_path)}{self._calls_note()}")
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
        return run_tool(self._ctr_argv(["tasks", "exec", "--exec-id", f"e2e-{self._exec_seq}",
                                    "--fifo-dir", str(self.tmp_dir / "fifo"),
                                    container.name, *argv]),
                    timeout=timeout or self.timeout, check=check, env=self._env(),
                    what=f"exec in {container.name}")

    def container_interface(self, container: Container, ifname: str = "eth0") -> ipaddress.IPv4Interface:
        """The first IPv4 address (with its prefix) on IFNAME in the container's network namespace.

        Read from the host through the task's /proc/PID/ns/net, not with `ctr tasks exec`: ctr
        cancels an exec's output copy when the process exits, and on a loaded machine the
        output can be lost (seen: rc 0 and an empty stdout)."""
        proc = run_tool(["nsenter", f"--net=/proc/{container.pid}/ns/net", "ip", "-o", "-4", "addr", "show",
                         "dev", ifname], timeout=self.timeout, check=True, what=f"ip addr in {container.name}")
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
            kill_process(container.process)
            raise HarnessError(f"ctr run {container.name} did not finish within {timeout}s "
                               f"after SIGKILL:\n{tail(container.log_path)}") from None
        finally:
            self._containers.pop(container.name, None)
        self.timings[f"stop:{container.name}"] = time.monotonic() - t0
        log = container.log_path.read_text(errors="replace")
        if 'msg="network review"' in log:
            raise HarnessError(f"CNI DEL failed for {container.name} (ctr's log):\n{tail(container.log_path)}"
                               f"{self._calls_note()}")
        left = self.ctr(["containers", "ls", "--quiet"], timeout=10).stdout.split()
        if container.name in left:
            raise HarnessError(f"container {container.name} still exists after ctr run --rm ended:\n"
                               f"{tail(container.log_path)}")
        return container.exit_status

    # -- the node's side
    def daemon_argv(self) -> list[str]:
        """The argv prefix that runs a node daemon (the CNI agent) where the node's CNI
        plugins run: here the node's network namespace, with a sysfs that shows its links."""
        return ["ip", "netns", "exec", self.netns]

    def netns_run(self, argv, *, check: bool = True, timeout: float | None = None,
                  input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command in the node's network namespace (`ip netns exec`)."""
        return run_tool(["ip", "netns", "exec", self.netns, *argv], timeout=timeout or self.timeout,
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
                kill_process(self._containerd)
        if self.tmp_dir is not None:
            for _ in range(3):  # shims and ctr processes that outlived containerd
                pids = pids_naming(self.tmp_dir)
                if not pids:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)
            else:
                errors.append(f"processes still alive: {pids_naming(self.tmp_dir)}")
        clean_cgroups(self.namespace, errors)
        if self._netns_created:
            step("ip netns del", run_tool, ["ip", "netns", "del", self.netns], timeout=10)
            self._netns_created = False
        if self.tmp_dir is not None and self.tmp_dir.exists():
            mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
                      if line.split()[1].startswith(str(self.tmp_dir))]
            for mount in sorted(mounts, key=len, reverse=True):  # never expected: all are private
                errors.append(f"mount {mount} was visible on the host")
                run_tool(["umount", "-n", "-l", mount], timeout=10, check=False)
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
