"""The DaemonSet's pod on each lab node, run with podman the way the kubelet runs it.

`AgentPods` takes the plan `daemonset.render_pod` makes for a node and carries it out: the
node's prerequisites (`provision_node`: what kubeadm's preflight checks), the
init containers one after another, each to completion (a failure stops the pod, with its
log), then the containers detached; the probes hit over HTTP (or TCP) at their ports on the
node's address from inside the node's namespace, as the kubelet's prober does for a
hostNetwork pod; a container restarted the kubelet's way (the old one removed, the same
spec started again, init containers not re-run); a rollout to another image (the pod
replaced: init containers again, then the new agent); removal of every container a lab
started, found by its label.

`host_view(node)` is the argv prefix for what the lab's container runtime executes "on the
node": a private mount namespace in which the node's root `run/` and `opt/` are mounted over
`/run` and `/opt` (with the real `/run/netns` kept inside), so the shim the init container
installed runs as `/opt/cni/bin/netagent` and reaches the agent at `/run/netagent/cni.sock`,
the paths the manifest and the agent's config name. Nothing is mounted in the host's own
mount namespace.

podman runs with runc (crun refuses this machine's hybrid cgroup layout) and the ulimits
root may set here; `--network ns:` makes podman leave networking alone entirely.
"""
from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable

from lab import daemonset
from lab.apiclient import LabApiClient, LabApiError
from lab.daemonset import ContainerPlan, NodeHost, PodPlan, ProbeKind
from lab.processes import tail
from lab.state import LabError, LabState
from netagent.cniserver import install as cni_install
from netagent.kernel import namespaces

LAB_LABEL = "netagent.lab"
AGENT_CONTAINER = "netagent"
DEFAULT_MANIFEST = os.path.join(cni_install.code_root(), "deploy", "netagent.yaml")
_HOST_VIEW = 'mount --rbind /run/netns "$1/run/netns" && mount --rbind "$1/run" /run ' \
             '&& mount --rbind "$1/opt" /opt && shift && exec "$@"'


def podman() -> list:
    """The podman command line's start: runc when it is installed."""
    if not shutil.which("podman"):
        raise LabError("podman is not installed (scripts/setup.sh installs it); the image lab needs it")
    return ["podman", *(["--runtime", "runc"] if shutil.which("runc") else [])]


def run_podman(args: list, *, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.run([*podman(), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise LabError(f"podman {' '.join(args[:2])} failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc


def require_image(image: str) -> None:
    if run_podman(["image", "exists", image], check=False).returncode != 0:
        raise LabError(f"image {image} is not here: build it with scripts/build-image (the lab pulls nothing)")


# What kubeadm's preflight requires of every node before the pod network is installed
# (FileContent--proc-sys-net-ipv4-ip_forward): the manifest's agent is not privileged, so
# /proc/sys is read-only to it and it can only check this, as on a real node.
NODE_SYSCTLS = (("net.ipv4.ip_forward", "1"),)


def provision_node(node: NodeHost) -> None:
    """Set the node prerequisites above in the lab node's namespace (never the host's)."""
    for key, value in NODE_SYSCTLS:
        proc = subprocess.run([*namespaces.exec_prefix(node.netns), "sysctl", "-qw", f"{key}={value}"],
                              capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise LabError(f"{node.name}: sysctl {key}={value}: {proc.stderr.strip()}")


def probe_once(netns: str, address: str, port: int, path: str | None, *, timeout: float) -> bool:
    """One probe from inside `netns`: an HTTP GET with a 2xx/3xx answer, or (no path) a TCP connect."""
    fd = os.open(namespaces.netns_path(netns), os.O_RDONLY | os.O_CLOEXEC)
    try:
        with namespaces.entered(fd):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # born in the node's namespace
    finally:
        os.close(fd)
    try:
        sock.settimeout(timeout)
        sock.connect((address, port))
        if path is None:
            return True
        conn = http.client.HTTPConnection(address, port, timeout=timeout)
        conn.sock = sock
        conn.request("GET", path, headers={"User-Agent": "kube-probe/lab", "Connection": "close"})
        response = conn.getresponse()
        response.read()  # all of it: closing with unread bytes would reset the connection
        return 200 <= response.status < 400
    except OSError:
        return False
    finally:
        sock.close()


def ensure_host_path(host: str, kind: str) -> None:
    """What the kubelet checks or creates for a hostPath `type` (no type: the lab creates a missing
    directory, as a node's filesystem would have it, where the runtime would fail)."""
    if kind == "DirectoryOrCreate" or (kind == "" and not os.path.exists(host)):
        os.makedirs(host, mode=0o755, exist_ok=True)
    elif kind == "FileOrCreate":
        os.makedirs(os.path.dirname(host), exist_ok=True)
        if not os.path.exists(host):
            with open(host, "a"):
                pass
            os.chmod(host, 0o644)
    elif kind == "Directory" and not os.path.isdir(host):
        raise LabError(f"hostPath {host} is not a directory")
    elif kind == "File" and not os.path.isfile(host):
        raise LabError(f"hostPath {host} is not a file")
    elif kind not in ("", "DirectoryOrCreate", "FileOrCreate", "Directory", "File"):
        raise LabError(f"hostPath type {kind!r} is not supported by the lab")


class AgentPods:
    """The DaemonSet's pods of one lab: started, probed, restarted, rolled, removed."""

    def __init__(self, *, manifest: str, image: str, workdir: str, prefix: str, kubeconfig: str,
                 agent_flags: dict, config_maps: Callable[[str, str], dict | None] | None = None) -> None:
        self.daemonset = daemonset.load_daemonset(manifest)
        self.image = image
        self.workdir = workdir
        self.prefix = prefix
        self.kubeconfig = kubeconfig
        self.agent_flags = dict(agent_flags)
        self.config_maps = config_maps or (lambda namespace, name: None)

    @classmethod
    def for_lab(cls, state: LabState, *, api: Callable[[], LabApiClient]) -> "AgentPods":
        """A lab's pods: its image and manifest, its kubeconfig, its mode, proxy mode and policy switch."""
        flags: dict[str, str | bool] = {"--backend": state.mode, "--proxy-mode": state.proxy_mode,
                                         "--resync-period": str(state.resync_period),
                                         "--network-policy": state.network_policy}
        if state.mode == "auto":
            flags["--auto-encap"] = state.auto_encap

        def config_map(namespace: str, name: str) -> dict | None:
            try:
                return api().get("v1", "ConfigMap", name, namespace=namespace).get("data") or {}
            except LookupError:  # the lab's API server serves no ConfigMaps: none exists
                return None
            except LabApiError as error:
                if error.code == 404:
                    return None
                raise LabError(f"ConfigMap {namespace}/{name}: {error}") from None
        return cls(manifest=state.manifest or DEFAULT_MANIFEST, image=state.agent_image or "",
                   workdir=state.workdir, prefix=state.prefix, kubeconfig=os.path.join(state.workdir, "kubeconfig"),
                   agent_flags=flags, config_maps=config_map)

    # ------------------------------------------------------------ naming and planning
    def node_dir(self, node: str) -> str:
        return os.path.join(self.workdir, "nodes", node)

    def node_root(self, node: str) -> str:
        return os.path.join(self.node_dir(node), "root")

    def container_name(self, node: str, container: str) -> str:
        return f"{self.prefix}-{node}-{container}"

    def log_path(self, node: str, container: str) -> str:
        if container == AGENT_CONTAINER:
            return os.path.join(self.node_dir(node), "agent.log")  # where the lab's status points
        return os.path.join(self.node_dir(node), f"{container}.log")

    def plan(self, node: NodeHost, *, with_config_maps: bool = True) -> PodPlan:
        """The pod for `node`; without ConfigMaps (no API calls) for reading its paths and probes."""
        if not with_config_maps:
            return daemonset.render_pod(self.daemonset, node=node, image=self.image, kubeconfig=self.kubeconfig,
                                        agent_flags=self.agent_flags, config_maps=None)
        template = self.daemonset["spec"]["template"]["spec"]
        namespace = self.daemonset["metadata"].get("namespace", "default")
        config_maps = {}
        for container in [*template.get("initContainers", []), *template["containers"]]:
            for source in container.get("envFrom") or []:
                name = (source.get("configMapRef") or {}).get("name")
                if name and name not in config_maps:
                    config_maps[name] = self.config_maps(namespace, name)
        return daemonset.render_pod(self.daemonset, node=node, image=self.image, kubeconfig=self.kubeconfig,
                                    agent_flags=self.agent_flags,
                                    config_maps={k: v for k, v in config_maps.items() if v is not None})

    def agent(self, node: NodeHost) -> ContainerPlan:
        (container,) = [c for c in self.plan(node, with_config_maps=False).containers if c.name == AGENT_CONTAINER]
        return container

    def host_path(self, node: NodeHost, container_path: str) -> str:
        """Where the agent container's `container_path` is on the host."""
        return daemonset.host_path_of(self.agent(node), container_path)

    def agent_flag(self, node: NodeHost, flag: str) -> str:
        value = daemonset.flag_value(self.agent(node).args, flag)
        if value is None:
            raise LabError(f"the manifest's agent has no {flag}")
        return value

    def cni_socket(self, node: NodeHost) -> str:
        """The agent's CNI socket (its --cni-socket) on the host."""
        return self.host_path(node, self.agent_flag(node, "--cni-socket"))

    def conf_dir(self, node: NodeHost) -> str:
        """Where the agent publishes the network config (its --cni-conf-dir) on the host."""
        return self.host_path(node, self.agent_flag(node, "--cni-conf-dir"))

    # ------------------------------------------------------------ life cycle
    def _labels(self, pod: PodPlan, node: NodeHost, container: ContainerPlan) -> dict:
        return {LAB_LABEL: self.prefix, f"{LAB_LABEL}.node": node.name, "io.kubernetes.pod.name": pod.name,
                "io.kubernetes.pod.namespace": pod.namespace, "io.kubernetes.container.name": container.name}

    def _run(self, pod: PodPlan, node: NodeHost, container: ContainerPlan, *,
             detach: bool) -> subprocess.CompletedProcess:
        name = self.container_name(node.name, container.name)
        run_podman(["rm", "--force", "--time", "0", name], check=False)
        for mount in container.mounts:
            ensure_host_path(mount.host, mount.host_type)
        log = self.log_path(node.name, container.name)
        os.makedirs(os.path.dirname(log), exist_ok=True)
        argv = daemonset.podman_run_argv(container, pod=pod, node=node, name=name, detach=detach, log_path=log,
                                         labels=self._labels(pod, node, container))
        return run_podman(argv, check=False, timeout=300)

    def start(self, node: NodeHost) -> int:
        """The pod on `node`: init containers to completion, then the containers; the agent's pid."""
        require_image(self.image)
        os.makedirs(os.path.join(self.node_root(node.name), "run", "netns"), exist_ok=True)
        resolv_conf = daemonset.resolv_conf(node)
        if not os.path.exists(resolv_conf):
            os.makedirs(os.path.dirname(resolv_conf), exist_ok=True)
            with open(resolv_conf, "w") as f:
                f.write("# a lab node: no name server\n")
        provision_node(node)
        pod = self.plan(node)
        for container in pod.init_containers:
            proc = self._run(pod, node, container, detach=False)
            run_podman(["rm", "--force", self.container_name(node.name, container.name)], check=False)
            if proc.returncode != 0:
                raise LabError(f"init container {container.name} on {node.name} exited {proc.returncode}: "
                               f"{proc.stderr.strip()}\n{tail(self.log_path(node.name, container.name))}")
        return self.start_containers(node, pod)

    def start_containers(self, node: NodeHost, pod: PodPlan | None = None) -> int:
        """The pod's (non-init) containers, detached; the agent container's pid."""
        pod = pod or self.plan(node)
        for container in pod.containers:
            proc = self._run(pod, node, container, detach=True)
            if proc.returncode != 0:
                raise LabError(f"container {container.name} on {node.name} did not start: {proc.stderr.strip()}")
        return self.agent_pid(node.name)

    def restart_agent(self, node: NodeHost) -> int:
        """What the kubelet does when the agent container exits or fails liveness: start it again
        (a new container from the same spec; init containers do not run again)."""
        pod = self.plan(node)
        (container,) = [c for c in pod.containers if c.name == AGENT_CONTAINER]
        proc = self._run(pod, node, container, detach=True)
        if proc.returncode != 0:
            raise LabError(f"the agent container on {node.name} did not start: {proc.stderr.strip()}")
        return self.agent_pid(node.name)

    def roll(self, node: NodeHost, image: str, *, wait: Callable[[], None]) -> int:
        """A DaemonSet rollout on one node: the old pod stops (grace period), the new one starts."""
        self.stop(node.name)
        self.image = image
        pid = self.start(node)
        wait()
        return pid

    def agent_pid(self, node: str) -> int:
        proc = run_podman(["inspect", "--format", "{{.State.Pid}}", self.container_name(node, AGENT_CONTAINER)])
        pid = int(proc.stdout.strip() or 0)
        if pid <= 0:
            raise LabError(f"the agent container on {node} is not running:\n"
                           f"{tail(self.log_path(node, AGENT_CONTAINER))}")
        return pid

    def running(self, node: str) -> bool:
        proc = run_podman(["inspect", "--format", "{{.State.Running}}", self.container_name(node, AGENT_CONTAINER)],
                          check=False)
        return proc.stdout.strip() == "true"

    def kill(self, node: str, *, sig: int = signal.SIGKILL, container: str = AGENT_CONTAINER) -> None:
        """Signal the container's process and wait for the container to exit; it stays (exited)."""
        name = self.container_name(node, container)
        run_podman(["kill", "--signal", str(int(sig)), name], check=False)
        run_podman(["wait", name], check=False, timeout=60)

    def stop(self, node: str, *, sig: int = signal.SIGTERM) -> None:
        """The pod's containers stopped (SIGTERM and the grace period, or `sig` at once) and removed."""
        grace = int(self.daemonset["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30))
        for container in self.daemonset["spec"]["template"]["spec"]["containers"]:
            name = self.container_name(node, container["name"])
            if sig == signal.SIGTERM:
                run_podman(["stop", "--time", str(grace), name], check=False, timeout=grace + 30)
            else:
                self.kill(node, sig=sig, container=container["name"])
            run_podman(["rm", "--force", "--time", "0", name], check=False)

    def remove_all(self) -> None:
        """Every container this lab started, whatever its state (none when podman is gone)."""
        if not shutil.which("podman"):
            return
        found = run_podman(["ps", "--all", "--quiet", "--filter", f"label={LAB_LABEL}={self.prefix}"], check=False)
        ids = found.stdout.split()
        if ids:
            run_podman(["rm", "--force", "--time", "0", *ids], check=False)

    def run_once(self, node: NodeHost, args: list, *, timeout: float = 120) -> subprocess.CompletedProcess:
        """The image with `args` as a one-off privileged container in the node's namespace (for
        `netagent cleanup` and such); removed when it exits."""
        argv = ["run", "--rm", "--pull", "never", "--privileged", "--network", f"ns:/run/netns/{node.netns}",
                "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768",
                "--label", f"{LAB_LABEL}={self.prefix}", self.image, *args]
        return run_podman(argv, check=False, timeout=timeout)

    # ------------------------------------------------------------ probes and readiness
    def probe(self, node: NodeHost, kind: ProbeKind) -> bool:
        probe = self.agent(node).probes.get(kind)
        if probe is None:
            return True  # no probe: the kubelet counts it as passing
        return probe_once(node.netns, node.address, probe.port, probe.path, timeout=probe.timeout)

    def wait_ready(self, node: NodeHost, *, serving: Callable[[], bool], timeout: float | None = None) -> None:
        """Until the startup and readiness probes pass and `serving()` (the CNI socket is there).

        The kubelet probes every periodSeconds; the lab polls faster but allows the startup
        probe's whole budget (periodSeconds x failureThreshold) unless `timeout` is given."""
        probes = self.agent(node).probes
        startup = probes.get(ProbeKind.STARTUP)
        budget = timeout if timeout is not None else (startup.period * startup.failure_threshold if startup else 180)
        deadline = time.monotonic() + budget
        while not (serving() and self.probe(node, ProbeKind.STARTUP) and self.probe(node, ProbeKind.READINESS)):
            if not self.running(node.name) or time.monotonic() > deadline:
                state = "exited" if not self.running(node.name) else f"not ready after {budget:.0f} s"
                raise LabError(f"the agent container on {node.name} {state}:\n"
                               f"{tail(self.log_path(node.name, AGENT_CONTAINER))}")
            time.sleep(0.1)

    # ------------------------------------------------------------ the node's own view
    def host_view(self, node: str) -> list:
        """argv prefix: run a program with the node's /run and /opt (see the module docstring)."""
        root = self.node_root(node)
        with contextlib.suppress(FileExistsError):
            os.makedirs(os.path.join(root, "run", "netns"))
        os.makedirs(os.path.join(root, "opt"), exist_ok=True)
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", _HOST_VIEW, "host-view", root]
