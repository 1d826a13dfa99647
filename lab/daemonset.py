"""deploy/netagent.yaml's DaemonSet as the kubelet would run it on a lab node: the pure part.

`render_pod` reads the DaemonSet's pod template and turns it, for one node, into what a
kubelet hands its runtime: each init container and container with its image, its args with
`$(VAR)` expanded, its environment (values, the downward API's fieldRefs, ConfigMaps named
by envFrom), its securityContext (privileged, or the capabilities it adds and drops, and
allowPrivilegeEscalation; any other field is refused rather than ignored), and every volume
mount resolved to a host path with its propagation; plus the probes to hit. `podman_run_argv` turns one container into the
`podman run` that starts it (`agent_pods.py` runs them).

What the lab changes, and why, in one place:
- `hostPath`s point into the lab node's own filesystem root (`<node dir>/root/<path>`): each
  lab node is a namespace on one machine, so `/opt/cni/bin`, `/etc/cni/net.d`,
  `/run/netagent`, `/var/lib/cni/networks`, `/run/xtables.lock` and `/lib/modules` are per
  node, and the real host's are never touched. The one exception is `/run/netns`, where the
  lab's runtime (like containerd) pins every pod's namespace: it is the real one.
- hostNetwork is the node's namespace: `--network ns:/run/netns/<node>`, with the node's
  hostname and the node's resolv.conf (dnsPolicy ClusterFirst means Default on the host
  network): `<root>/etc/resolv.conf`, which names no server, as lab nodes have no DNS. (With
  podman's copy of the real host's, every lookup waits out a timeout.)
- The service account is stood in for by the lab's kubeconfig (read-only, `$KUBECONFIG`):
  the lab's API server speaks plain HTTP and issues no tokens.
- An operator's edits of the agent's args: the lab's `--backend`, `--proxy-mode`,
  `--resync-period` (and `--auto-encap` in auto mode) replace the manifest's or join them,
  `--network-policy` is there exactly when the lab asks for it (`lab up --network-policy`),
  and `image:` is the one asked for.
"""
from __future__ import annotations

import dataclasses
import enum
import os
import re
from dataclasses import dataclass, field

import yaml

from lab.state import LabError

SHARED_HOST_PATHS = ("/run/netns",)  # the runtime's pod namespace pins: the real directory
KUBECONFIG_IN_CONTAINER = "/var/lib/netagent-lab/kubeconfig"
_ENV_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


class ProbeKind(enum.Enum):
    STARTUP = "startupProbe"
    LIVENESS = "livenessProbe"
    READINESS = "readinessProbe"


class Propagation(enum.Enum):
    """`mountPropagation` and the bind option it means to the runtime."""
    NONE = "None"
    HOST_TO_CONTAINER = "HostToContainer"
    BIDIRECTIONAL = "Bidirectional"

    @property
    def bind_option(self) -> str:
        return {"None": "rprivate", "HostToContainer": "rslave", "Bidirectional": "rshared"}[self.value]


@dataclass(frozen=True)
class NodeHost:
    """What a kubelet knows of its node: name, namespace, address, and its filesystem root."""
    name: str
    netns: str
    address: str
    root: str


@dataclass(frozen=True)
class Mount:
    host: str
    container: str
    read_only: bool = False
    propagation: Propagation = Propagation.NONE
    host_type: str = ""  # the hostPath's `type`: what to check or create before starting

    def volume_option(self) -> str:
        options = ["ro" if self.read_only else "rw", self.propagation.bind_option]
        return f"{self.host}:{self.container}:{','.join(options)}"


@dataclass(frozen=True)
class Probe:
    kind: ProbeKind
    port: int
    path: str | None  # None: a tcpSocket probe
    period: float
    timeout: float
    failure_threshold: int


@dataclass(frozen=True)
class Security:
    """A container's securityContext as the runtime applies it."""
    privileged: bool = False
    add: tuple[str, ...] = ()    # capabilities, as Kubernetes spells them (NET_ADMIN; ALL)
    drop: tuple[str, ...] = ()
    no_new_privileges: bool = False   # allowPrivilegeEscalation: false

    def podman_options(self) -> list:
        if self.privileged:
            return ["--privileged"]
        options = [option for cap in self.drop for option in ("--cap-drop", cap.lower() if cap == "ALL" else cap)]
        options += [option for cap in self.add for option in ("--cap-add", cap)]
        return [*options, *(["--security-opt", "no-new-privileges"] if self.no_new_privileges else [])]


SECURITY_FIELDS = {"privileged", "capabilities", "allowPrivilegeEscalation"}


def security_of(container: dict) -> Security:
    context = container.get("securityContext") or {}
    unknown = sorted(set(context) - SECURITY_FIELDS)
    if unknown:
        raise LabError(f"{container['name']}: securityContext {', '.join(unknown)} is not run by the lab "
                       f"(it runs {', '.join(sorted(SECURITY_FIELDS))})")
    capabilities = context.get("capabilities") or {}
    return Security(privileged=bool(context.get("privileged")), add=tuple(capabilities.get("add") or ()),
                    drop=tuple(capabilities.get("drop") or ()),
                    no_new_privileges=context.get("allowPrivilegeEscalation") is False)


@dataclass(frozen=True)
class ContainerPlan:
    name: str
    image: str
    args: list
    env: dict
    mounts: list
    security: Security
    probes: dict = field(default_factory=dict)  # ProbeKind -> Probe

    @property
    def privileged(self) -> bool:
        return self.security.privileged


@dataclass(frozen=True)
class PodPlan:
    name: str
    namespace: str
    init_containers: list
    containers: list
    grace_period: int
    host_network: bool


def load_daemonset(path: str) -> dict:
    """The one DaemonSet of a manifest file."""
    try:
        with open(path) as f:
            documents = [doc for doc in yaml.safe_load_all(f) if doc]
    except (OSError, yaml.YAMLError) as error:
        raise LabError(f"cannot read the manifest {path}: {error}") from None
    found = [doc for doc in documents if isinstance(doc, dict) and doc.get("kind") == "DaemonSet"]
    if len(found) != 1:
        raise LabError(f"{path} holds {len(found)} DaemonSets; the lab runs exactly one")
    return found[0]


def host_path_on_node(node: NodeHost, path: str) -> str:
    """Where a hostPath lives for this lab node (see the module docstring)."""
    if not path.startswith("/"):
        raise LabError(f"hostPath {path!r} is not absolute")
    if any(path == shared or path.startswith(shared + "/") for shared in SHARED_HOST_PATHS):
        return path
    return os.path.join(node.root, path.lstrip("/"))


def expand_references(text: str, env: dict) -> str:
    """`$(VAR)` as the kubelet expands it: defined variables only, `$$` is a literal `$`."""
    def substitute(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)
    return _ENV_REFERENCE.sub(substitute, text)


def with_flag(args: list, flag: str, value: str | bool) -> list:
    """`args` with `--flag=value` replacing the flag's value(s), appended when absent; a switch
    (value True or False) is there bare, or not at all."""
    if isinstance(value, bool):
        kept = [arg for arg in args if arg != flag]
        return [*kept, flag] if value else kept
    out, skip, found = [], False, False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == flag or arg.startswith(flag + "="):
            skip = arg == flag
            if not found:
                out.append(f"{flag}={value}")
            found = True
            continue
        out.append(arg)
    return out if found else [*out, f"{flag}={value}"]


def _field_ref(path: str, *, pod_name: str, namespace: str, node: NodeHost, spec: dict) -> str:
    values = {"spec.nodeName": node.name, "metadata.name": pod_name, "metadata.namespace": namespace,
              "status.hostIP": node.address, "status.podIP": node.address,  # hostNetwork: the node's
              "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
              "metadata.uid": f"lab-{namespace}-{pod_name}"}
    if path not in values:
        raise LabError(f"fieldRef {path!r} is not supported by the lab (have: {', '.join(sorted(values))})")
    return values[path]


def _environment(container: dict, *, pod_name: str, namespace: str, node: NodeHost, spec: dict,
                 config_maps: dict | None) -> dict:
    env: dict = {}
    for source in container.get("envFrom") or []:
        if config_maps is None:
            break
        ref = source.get("configMapRef")
        if ref is None:
            raise LabError(f"envFrom {source}: only configMapRef is supported by the lab")
        data = config_maps.get(ref["name"])
        if data is None and not ref.get("optional"):
            raise LabError(f"ConfigMap {namespace}/{ref['name']} (envFrom) does not exist")
        env.update({source.get("prefix", "") + k: v for k, v in (data or {}).items()})
    for entry in container.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = expand_references(str(entry["value"]), env)
        elif "fieldRef" in (entry.get("valueFrom") or {}):
            env[entry["name"]] = _field_ref(entry["valueFrom"]["fieldRef"]["fieldPath"], pod_name=pod_name,
                                            namespace=namespace, node=node, spec=spec)
        else:
            raise LabError(f"env {entry['name']}: only value and fieldRef are supported by the lab")
    return env


def _probes(container: dict) -> dict:
    named_ports = {p["name"]: p["containerPort"] for p in container.get("ports") or [] if "name" in p}
    probes = {}
    for kind in ProbeKind:
        spec = container.get(kind.value)
        if not spec:
            continue
        action = spec.get("httpGet") or spec.get("tcpSocket")
        if action is None:
            raise LabError(f"{container['name']}: {kind.value} needs httpGet or tcpSocket in the lab")
        if (spec.get("httpGet") or {}).get("scheme", "HTTP") != "HTTP":
            raise LabError(f"{container['name']}: {kind.value} over HTTPS is not supported by the lab")
        port = action["port"]
        port = named_ports[port] if isinstance(port, str) else int(port)
        probes[kind] = Probe(kind=kind, port=port, path=spec["httpGet"].get("path", "/") if "httpGet" in spec else None,
                             period=float(spec.get("periodSeconds", 10)), timeout=float(spec.get("timeoutSeconds", 1)),
                             failure_threshold=int(spec.get("failureThreshold", 3)))
    return probes


def _mounts(container: dict, *, volumes: dict, node: NodeHost) -> list:
    mounts = []
    for mount in container.get("volumeMounts") or []:
        volume = volumes.get(mount["name"])
        if volume is None or "hostPath" not in volume:
            raise LabError(f"volume {mount['name']}: the lab mounts hostPath volumes only")
        if mount.get("subPath"):
            raise LabError(f"volume mount {mount['name']}: subPath is not supported by the lab")
        mounts.append(Mount(host=host_path_on_node(node, volume["hostPath"]["path"]), container=mount["mountPath"],
                            read_only=bool(mount.get("readOnly")), host_type=volume["hostPath"].get("type", ""),
                            propagation=Propagation(mount.get("mountPropagation", "None"))))
    return mounts


def render_pod(daemonset: dict, *, node: NodeHost, image: str, kubeconfig: str, agent_flags: dict,
               config_maps: dict | None) -> PodPlan:
    """The DaemonSet's pod on `node`, every container with `image`; `agent_flags` are the
    operator's edits of the `netagent run` container's args ({"--backend": "host-gw"}, a switch
    as True or False: {"--network-policy": False}).
    `config_maps` (name -> data) feed envFrom; None leaves envFrom out (for reading paths)."""
    template = daemonset["spec"]["template"]
    spec = template["spec"]
    namespace = daemonset["metadata"].get("namespace", "default")
    pod_name = f"{daemonset['metadata']['name']}-{node.name}"
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    lab_mount = Mount(host=kubeconfig, container=KUBECONFIG_IN_CONTAINER, read_only=True)

    def plan(container: dict) -> ContainerPlan:
        if container.get("command"):
            raise LabError(f"{container['name']}: the lab runs the image's entrypoint; drop `command`")
        env = _environment(container, pod_name=pod_name, namespace=namespace, node=node, spec=spec,
                           config_maps=config_maps)
        env.setdefault("KUBECONFIG", KUBECONFIG_IN_CONTAINER)
        args = [expand_references(str(arg), env) for arg in container.get("args") or []]
        if args[:1] == ["run"]:
            for flag, value in agent_flags.items():
                args = with_flag(args, flag, value)
        return ContainerPlan(name=container["name"], image=image, args=args, env=env,
                             mounts=[*_mounts(container, volumes=volumes, node=node), lab_mount],
                             security=security_of(container),
                             probes=_probes(container))

    return PodPlan(name=pod_name, namespace=namespace,
                   init_containers=[plan(c) for c in spec.get("initContainers") or []],
                   containers=[plan(c) for c in spec["containers"]],
                   grace_period=int(spec.get("terminationGracePeriodSeconds", 30)),
                   host_network=bool(spec.get("hostNetwork")))


def host_path_of(container: ContainerPlan, path: str) -> str:
    """Where a path inside the container lives on the host (the deepest mount holding it)."""
    best = None
    for mount in container.mounts:
        if path == mount.container or path.startswith(mount.container.rstrip("/") + "/"):
            if best is None or len(mount.container) > len(best.container):
                best = mount
    if best is None:
        raise LabError(f"{path} is on no volume of container {container.name}")
    return os.path.join(best.host, os.path.relpath(path, best.container)) if path != best.container else best.host


def flag_value(args: list, flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def resolv_conf(node: NodeHost) -> str:
    return os.path.join(node.root, "etc", "resolv.conf")


def podman_run_argv(container: ContainerPlan, *, pod: PodPlan, node: NodeHost, name: str, labels: dict,
                    detach: bool, log_path: str) -> list:
    """`podman run` for one container of the pod (global options such as --runtime come first)."""
    argv = ["run", "--name", name, "--pull", "never", "--hostname", node.name,
            "--ulimit", "nofile=20000:20000", "--ulimit", "nproc=32768:32768",
            "--log-driver", "k8s-file", "--log-opt", f"path={log_path}"]
    if pod.host_network:
        argv += ["--network", f"ns:/run/netns/{node.netns}", "--volume", f"{resolv_conf(node)}:/etc/resolv.conf:ro"]
    else:
        argv += ["--network", "none"]
    argv += ["--detach"] if detach else []
    argv += container.security.podman_options()
    for key, value in sorted(labels.items()):
        argv += ["--label", f"{key}={value}"]
    for key, value in container.env.items():
        argv += ["--env", f"{key}={value}"]
    for mount in container.mounts:
        argv += ["--volume", mount.volume_option()]
    return [*argv, container.image, *container.args]


def replace_image(pod: PodPlan, image: str) -> PodPlan:
    """The same pod with every container on `image` (a DaemonSet rollout's new template)."""
    return dataclasses.replace(
        pod, init_containers=[dataclasses.replace(c, image=image) for c in pod.init_containers],
        containers=[dataclasses.replace(c, image=image) for c in pod.containers])
