"""The kubelet's runtime path: containerd 1.6's CRI plugin, driven over its gRPC socket.

kubelet never executes CNI plugins itself. It asks the runtime for a pod sandbox
(`RunPodSandbox`), and containerd's CRI plugin creates the pod's network namespace, runs the
pause image in it and calls the first network config of its CNI config directory, with the
pod's `K8S_*` CNI_ARGS and the capabilities the config asks for (`portMappings` from the
pod's hostPorts, `bandwidth` from its annotations). This module owns the pieces to do exactly
what kubelet does, with no kubelet:

* `cri_api(tmp_dir)`: Python stubs for the upstream CRI definition (`runtime.v1`), generated
  at test time with grpcio-tools from `shared/cri/api.proto` beside the repository (see
  `cri_definition()`) into a temporary directory; nothing generated is committed. Returns
  the reason instead (a string, for a skip) when grpcio, grpcio-tools or the definition is
  missing.
* the sandbox image is `oci_image.build_pause_image(dir)`: `pause.c`, compiled statically at
  test time, as the only file of a one-layer OCI image.
* `CriNode`: a `ContainerdNode` (the same isolation: its own root, state, socket, node
  network namespace and private mount namespace) with the CRI plugin enabled. Its config
  points the plugin's CNI bin and conf directories at the test's, puts pod network namespaces
  under the node's state directory (`netns_mounts_under_state_dir`, so none lands in
  /run/netns) and names the pause image as the sandbox image. `daemon_argv()` runs the CNI
  agent in the node's network namespace *and* containerd's mount namespace, the only place
  where the pods' netns bind mounts exist (as an agent's rslave /run/netns mount on a real
  node). `close()` stops and removes every sandbox a test left (containerd calls CNI DEL for
  each; the shim journals it when the agent is already gone) before the base class tears
  the node down.

containerd 1.6 and CNI, as measured here: CRI always prepends a loopback network (the
`loopback` plugin must be in the bin dir), passes `CNI_CONTAINERID=<sandbox id>`,
`CNI_NETNS=<state>/io.containerd.grpc.v1.cri/netns/cni-<uuid>`, `CNI_IFNAME=eth0` and
`CNI_ARGS=K8S_POD_NAMESPACE=..;K8S_POD_NAME=..;K8S_POD_INFRA_CONTAINER_ID=<id>;K8S_POD_UID=..;
IgnoreUnknown=1` (the order varies between calls) for the whole list (loopback, then the
conflist: netagent, portmap, bandwidth); StopPodSandbox calls DEL while the netns exists, then
unmounts and removes the netns file; RemovePodSandbox calls DEL again with an empty
`CNI_NETNS`, which every plugin must accept, and removes the sandbox.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

from tests.e2e.containerd_harness import ContainerdNode, HarnessError

REPO = Path(__file__).resolve().parents[2]
CRI_PLUGIN = "io.containerd.grpc.v1.cri"
CRI_NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin keeps its images and pods in


# ---------------------------------------------------------------- the CRI stubs

def cri_definition() -> Path | None:
    """The upstream CRI definition: $NETAGENT_CRI_PROTO, else `shared/cri/api.proto` in the
    repository's parent directory (CI: `../shared/cri/`) or a directory above it (a git
    worktree nested under the checkout's parent)."""
    override = os.environ.get("NETAGENT_CRI_PROTO")
    if override:
        return Path(override) if Path(override).is_file() else None
    for parent in REPO.parents:
        candidate = parent / "shared" / "cri" / "api.proto"
        if candidate.is_file():
            return candidate
    return None


@dataclasses.dataclass(frozen=True)
class CriApi:
    pb: ModuleType      # messages: api_pb2
    grpc: ModuleType    # stubs: api_pb2_grpc


def cri_api(out_dir: Path) -> CriApi | str:
    """Generate and import the CRI stubs into `out_dir`; a string says why that is impossible."""
    try:
        importlib.import_module("grpc")
        importlib.import_module("grpc_tools.protoc")
    except ImportError as exc:
        return f"grpcio and grpcio-tools are needed (the project's test extra): {exc}"
    proto = cri_definition()
    if proto is None:
        return (f"the CRI definition shared/cri/api.proto was not found above {REPO} "
                f"(nor at $NETAGENT_CRI_PROTO)")
    out_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto.parent}",
                           f"--python_out={out_dir}", f"--grpc_python_out={out_dir}", proto.name],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise HarnessError(f"protoc failed on {proto}:\n{proc.stderr}")
    # The generated stubs import their messages as the top-level module `api_pb2`.
    sys.path.insert(0, str(out_dir))
    try:
        pb = importlib.import_module("api_pb2")
        stubs = importlib.import_module("api_pb2_grpc")
    finally:
        sys.path.remove(str(out_dir))
    return CriApi(pb=pb, grpc=stubs)


# ---------------------------------------------------------------- the node

@dataclasses.dataclass
class Sandbox:
    """A pod sandbox made by `CriNode.run_pod`."""
    id: str
    name: str
    uid: str
    config: object               # the runtime.v1.PodSandboxConfig it was made with
    run_seconds: float           # how long RunPodSandbox took


class CriNode(ContainerdNode):
    """A throwaway containerd with its CRI plugin serving pods networked by the test's CNI dirs.

    api       the stubs from `cri_api()`
    image     the pause image from `oci_image.build_pause_image()`, the sandbox image
    Other arguments as for ContainerdNode.
    """

    _disabled_plugins: tuple[str, ...] = ()

    def __init__(self, *, api: CriApi, **kwargs):
        super().__init__(**kwargs)
        self.api = api
        self.ctr_namespace = CRI_NAMESPACE
        self._channel = None
        self._runtime = None
        self._sandboxes: dict[str, Sandbox] = {}

    def _containerd_config(self) -> list[str]:
        section = f'[plugins."{CRI_PLUGIN}"]'
        return [
            *super()._containerd_config(),
            section,
            f"  sandbox_image = {json.dumps(self.image.ref)}",
            "  netns_mounts_under_state_dir = true",  # pod netns files under the node's state dir
            "  disable_apparmor = true",
            "  restrict_oom_score_adj = true",  # root here lacks CAP_SYS_RESOURCE
            "  disable_tcp_service = true",
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            f'{section[:-1]}.cni]',
            f"  bin_dir = {json.dumps(str(self.plugin_dir))}",
            f"  conf_dir = {json.dumps(str(self.cni_conf_dir))}",
            "  max_conf_num = 1",
            f'{section[:-1]}.containerd]',
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            f'{section[:-1]}.containerd.runtimes.runc]',
            '  runtime_type = "io.containerd.runc.v2"',
        ]

    def _start_containerd(self) -> None:
        # The CRI stream server listens on the node's loopback.
        self.netns_run(["ip", "link", "set", "lo", "up"])
        super()._start_containerd()

    @property
    def containerd_pid(self) -> int:
        if self._containerd is None or self._containerd.poll() is not None:
            raise HarnessError("containerd is not running")
        return self._containerd.pid  # nsenter, unshare and the view script all exec

    def daemon_argv(self) -> list[str]:
        """Node daemons run in the node's network namespace and containerd's mount namespace,
        where the pods' netns files are mounted (the agent opens CNI_NETNS)."""
        return ["nsenter", f"--mount=/proc/{self.containerd_pid}/ns/mnt",
                f"--net=/run/netns/{self.netns}"]

    # -- CRI
    @property
    def runtime(self):
        """The RuntimeService stub on containerd's socket (as kubelet dials it)."""
        if self._runtime is None:
            grpc = importlib.import_module("grpc")
            self._channel = grpc.insecure_channel(f"unix://{self.address}")
            self._runtime = self.api.grpc.RuntimeServiceStub(self._channel)
        return self._runtime

    def pod_config(self, name: str, *, port_mappings=(), annotations=None, host_network: bool = False):
        """A PodSandboxConfig as kubelet sends it for a pod in namespace "default"
        (`host_network`: a hostNetwork pod, for which containerd calls no CNI plugin)."""
        pb = self.api.pb
        uid = f"{self.namespace}-{name}-uid"
        return pb.PodSandboxConfig(
            metadata=pb.PodSandboxMetadata(name=name, uid=uid, namespace="default", attempt=0),
            hostname="" if host_network else name,  # kubelet sets none for hostNetwork pods
            labels={"app": name},
            annotations=annotations or {},
            port_mappings=[pb.PortMapping(protocol=pb.TCP, container_port=c, host_port=h)
                           for c, h in port_mappings],
            linux=pb.LinuxPodSandboxConfig(
                # runc puts the pod in /<node namespace>/<pod>: the base class removes it.
                cgroup_parent=f"/{self.namespace}/pod-{name}",
                security_context=pb.LinuxSandboxSecurityContext(
                    namespace_options=pb.NamespaceOption(network=pb.NODE if host_network else pb.POD,
                                                         pid=pb.CONTAINER,
                                                         ipc=pb.POD))))

    def run_pod(self, name: str, **config) -> Sandbox:
        """RunPodSandbox, as kubelet calls it; returns once the sandbox is ready (CNI ADD done)."""
        pod = self.pod_config(name, **config)
        t0 = time.monotonic()
        reply = self.runtime.RunPodSandbox(self.api.pb.RunPodSandboxRequest(config=pod),
                                           timeout=self.timeout)
        sandbox = Sandbox(id=reply.pod_sandbox_id, name=name, uid=pod.metadata.uid, config=pod,
                          run_seconds=time.monotonic() - t0)
        self._sandboxes[sandbox.id] = sandbox
        self.timings[f"RunPodSandbox:{name}"] = sandbox.run_seconds
        return sandbox

    def status(self, sandbox: Sandbox):
        """(PodSandboxStatus, the verbose info dict containerd adds: pid, runtimeSpec, ...)."""
        reply = self.runtime.PodSandboxStatus(
            self.api.pb.PodSandboxStatusRequest(pod_sandbox_id=sandbox.id, verbose=True),
            timeout=self.timeout)
        return reply.status, json.loads(reply.info.get("info", "{}"))

    def pod_pid(self, sandbox: Sandbox) -> int:
        return int(self.status(sandbox)[1]["pid"])

    def pod_netns_path(self, sandbox: Sandbox) -> str:
        spec = self.status(sandbox)[1]["runtimeSpec"]
        return next(n["path"] for n in spec["linux"]["namespaces"] if n["type"] == "network")

    def stop_pod(self, sandbox: Sandbox) -> float:
        """StopPodSandbox (CNI DEL happens here); returns how long it took."""
        t0 = time.monotonic()
        self.runtime.StopPodSandbox(self.api.pb.StopPodSandboxRequest(pod_sandbox_id=sandbox.id),
                                    timeout=self.timeout)
        self.timings[f"StopPodSandbox:{sandbox.name}"] = elapsed = time.monotonic() - t0
        return elapsed

    def remove_pod(self, sandbox: Sandbox) -> None:
        self.runtime.RemovePodSandbox(self.api.pb.RemovePodSandboxRequest(pod_sandbox_id=sandbox.id),
                                      timeout=self.timeout)
        self._sandboxes.pop(sandbox.id, None)

    def list_pods(self) -> list:
        return list(self.runtime.ListPodSandbox(self.api.pb.ListPodSandboxRequest(),
                                                timeout=self.timeout).items)

    def netns_mounts(self) -> list[str]:
        """The pods' network namespaces mounted in containerd's mount namespace (under the
        node's directory; the inherited host mounts such as the node's own are left out)."""
        mountinfo = Path(f"/proc/{self.containerd_pid}/mountinfo").read_text().splitlines()
        return [line.split()[4] for line in mountinfo
                if " - nsfs " in line and line.split()[4].startswith(f"{self.tmp_dir}/")]

    def pod_exec_argv(self, sandbox: Sandbox) -> list[str]:
        """The argv prefix that runs a command in the pod's network namespace."""
        return ["nsenter", f"--net=/proc/{self.pod_pid(sandbox)}/ns/net"]

    # -- teardown
    def close(self, *, raise_errors: bool = True) -> None:
        errors = []
        if self._containerd is not None and self._containerd.poll() is None:
            for sandbox in list(self._sandboxes.values()):
                try:
                    self.stop_pod(sandbox)
                    self.remove_pod(sandbox)
                except Exception as exc:  # keep tearing down
                    errors.append(f"stop/remove sandbox {sandbox.name}: {exc}")
        if self._channel is not None:
            self._channel.close()
            self._channel = self._runtime = None
        try:
            super().close(raise_errors=raise_errors)
        finally:
            if errors:
                message = f"CRI teardown of node {self.netns}:\n  " + "\n  ".join(errors)
                if raise_errors:
                    raise HarnessError(message)
                print(message, file=sys.stderr)
