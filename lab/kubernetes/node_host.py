"""One machine of a Kubernetes lab: its own network namespace, mount namespace and cgroup
subtree, with a real containerd and a real kubelet in them.

kind gives each node a container; this is the same shape with bare namespaces, because
what a kubelet needs of "its machine" is a short list:
- the node's network namespace (the lab's, wired to the switch) for containerd, the kubelet
  and every hostNetwork pod;
- a private mount namespace held open by a sleeping "holder" process, in which the paths that
  a node's DaemonSets and runtime name are the node's own: copy-on-write overlays on /etc,
  /opt and /var (so `/etc/cni/net.d`, `/opt/cni/bin`, `/var/lib/cni`, `/var/log/pods` are per
  node, the host's own CNI networks are not in it, and the host's files never change), a fresh
  tmpfs on /run (`/run/netns`, where containerd pins pod namespaces, shared so HostToContainer
  mounts see new ones; `/run/netagent`), and the kubelet's kernel tunables (`vm.overcommit_memory`, `kernel.panic`,
  ...) shadowed by files holding the values it wants, so it never writes the host's sysctls;
  the reference plugins in `/opt/cni/bin` (containerd runs `loopback` for every pod), as
  kubeadm's kubernetes-cni package puts them there;
  the lab's own state directory is moved back in place on top of all that;
- a cgroup subtree `/<lab prefix>/<node>` in every hierarchy: the kubelet's `cgroupRoot`
  (two kubelets sharing a root kill each other's pods), with the node's own daemons in
  `system/` below it, so stopping the node kills exactly what is in the subtree; in the
  node's mount namespace its v2 subtree is bound over `/sys/fs/cgroup/unified` and a bpffs of
  its own is mounted at `/sys/fs/bpf`, so a DaemonSet's hostPath mounts of them (the eBPF
  proxy's `--cgroup-root`, `--bpf-root`) reach this node's alone, never the host's.
containerd keeps its root, state, sockets and runc root in the node's directory (the overlayfs
snapshotter cannot sit on an overlay), and the kubelet runs with `failCgroupV1: false` (this
machine's controllers are in cgroup v1), the cgroupfs driver, image garbage collection off
(nothing can be pulled again) and eviction thresholds that a shared disk does not trip.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import time

from lab.processes import Processes, process_alive, tail
from lab.state import LabError

CGROUP_ROOT = "/sys/fs/cgroup"
CRI_PLUGIN = "io.containerd.grpc.v1.cri"
# kubelet's setupKernelTunables: the values it writes unless already there (host-wide sysctls)
KERNEL_TUNABLES = {"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10",
                   "kernel/panic_on_oops": "1", "kernel/keys/root_maxkeys": "1000000",
                   "kernel/keys/root_maxbytes": "25000000"}

# Run by the holder in its new mount namespace: $1 node dir, $2 lab state dir, $3 the node's
# cgroup v2 directory (host path; empty without a v2 hierarchy).
_HOLDER_SCRIPT = r"""
set -e
node=$1 state=$2 unified=$3
mount --make-rslave /
mount --bind "$state" /mnt
for d in etc opt var; do
  mkdir -p "$node/fs/$d.upper" "$node/fs/$d.work"
  mount -t overlay overlay -o "lowerdir=/$d,upperdir=$node/fs/$d.upper,workdir=$node/fs/$d.work" "/$d"
done
mount -t tmpfs -o mode=755 tmpfs /run
mkdir -p /run/netns /run/netagent "$state"
mount --move /mnt "$state"
mount --make-rshared /run
for f in "$node"/tunables/*; do
  mount --bind "$f" "/proc/sys/$(basename "$f" | tr . /)"
done
# the node's own eBPF places, as a machine has them: a bpffs at /sys/fs/bpf, and its cgroup v2
# subtree as the root of the v2 hierarchy (what a DaemonSet's hostPath /sys/fs/cgroup shows)
mount -t bpf bpf /sys/fs/bpf
if [ -n "$unified" ]; then mount --bind "$unified" /sys/fs/cgroup/unified; fi
rm -rf /etc/cni/net.d  # the host's networks (podman's) are not the node's: whited out in the overlay
mkdir -p /opt/cni/bin /etc/cni/net.d /var/lib/cni /var/log/pods /var/log/containers
cp -a /usr/lib/cni/. /opt/cni/bin/  # the reference plugins, as kubeadm's kubernetes-cni package installs them
echo ready > "$node/holder.ready"
exec sleep infinity
"""


def hierarchies() -> list[str]:
    """Every mounted cgroup hierarchy's directory (v1 controllers, name=systemd, the v2 one)."""
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            fstype = fields[fields.index("-") + 1]
            if fstype in ("cgroup", "cgroup2") and fields[4].startswith(CGROUP_ROOT + "/"):
                found.append(fields[4])
    return sorted(set(found))


def _make_cgroup(hierarchy: str, path: str) -> None:
    """mkdir -p `path` in one hierarchy; cpuset levels get their parent's cpus and mems."""
    current = hierarchy
    for part in path.strip("/").split("/"):
        parent, current = current, os.path.join(current, part)
        if os.path.isdir(current):
            continue
        os.mkdir(current)
        for knob in ("cpuset.cpus", "cpuset.mems"):
            if os.path.exists(os.path.join(current, knob)):
                with open(os.path.join(parent, knob)) as src, open(os.path.join(current, knob), "w") as dst:
                    dst.write(src.read().strip() or "0")


class KubeletNode:
    """The namespaces, cgroups, containerd and kubelet of one lab node."""

    def __init__(self, *, name: str, netns: str, address: str, directory: str, state_dir: str,
                 cgroup: str, bin_dir: str, processes: Processes) -> None:
        self.name = name
        self.netns = netns
        self.address = address
        self.directory = directory
        self.state_dir = state_dir
        self.cgroup = cgroup              # the kubelet's cgroupRoot, "/<lab prefix>/<node>"
        self.bin_dir = bin_dir
        self.processes = processes

    # ------------------------------------------------------------ paths
    def path(self, *parts: str) -> str:
        return os.path.join(self.directory, *parts)

    @property
    def containerd_socket(self) -> str:
        return self.path("containerd", "containerd.sock")

    def log(self, component: str) -> str:
        return self.path("logs", f"{component}.log")

    @property
    def system_cgroup(self) -> str:
        return f"{self.cgroup}/system"

    def enter(self, holder: int) -> list[str]:
        """argv prefix: run in this node's system cgroup (joined by host path, before the node's
        mount namespace rebases the v2 hierarchy) and its network and mount namespaces."""
        procs = [os.path.join(h, self.system_cgroup.strip("/"), "cgroup.procs") for h in hierarchies()]
        join = " && ".join(f"echo $$ > {shlex.quote(p)}" for p in procs)
        return ["sh", "-c", f'{join} && exec nsenter -t {holder} -m -n -- "$@"', "node"]

    @property
    def unified_cgroup(self) -> str:
        """The node's subtree in the cgroup v2 hierarchy (host path), "" when none is mounted."""
        unified = next((h for h in hierarchies() if h.endswith("/unified") or h == CGROUP_ROOT), "")
        return os.path.join(unified, self.cgroup.strip("/")) if unified else ""

    def ctr(self, holder: int) -> list[str]:
        """argv prefix of `ctr` against this node's containerd, namespace k8s.io."""
        return [*self.enter(holder), "ctr", "--address", self.containerd_socket, "--namespace", "k8s.io"]

    # ------------------------------------------------------------ files
    def _write(self, relative: str, text: str) -> str:
        path = self.path(relative)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        return path

    def containerd_config(self, *, sandbox_image: str) -> str:
        base, cri = self.path("containerd"), f'[plugins."{CRI_PLUGIN}"'
        q = json.dumps
        lines = [
            "version = 2", f"root = {q(base + '/root')}", f"state = {q(base + '/state')}",
            "[grpc]", f"  address = {q(self.containerd_socket)}",
            "[ttrpc]", f"  address = {q(self.containerd_socket + '.ttrpc')}",
            '[plugins."io.containerd.internal.v1.opt"]', f"  path = {q(base + '/opt')}",
            f"{cri}]", f"  sandbox_image = {q(sandbox_image)}", "  disable_apparmor = true",
            "  restrict_oom_score_adj = true", "  disable_tcp_service = true",
            '  stream_server_address = "127.0.0.1"', '  stream_server_port = "0"',
            f"{cri}.cni]", '  bin_dir = "/opt/cni/bin"', '  conf_dir = "/etc/cni/net.d"', "  max_conf_num = 1",
            f"{cri}.containerd]", '  snapshotter = "overlayfs"', '  default_runtime_name = "runc"',
            f"{cri}.containerd.runtimes.runc]", '  runtime_type = "io.containerd.runc.v2"',
            f"{cri}.containerd.runtimes.runc.options]", "  SystemdCgroup = false",
            f"  Root = {q(base + '/runc')}",
        ]
        return self._write("containerd/config.toml", "\n".join(lines) + "\n")

    def kubelet_config(self, *, ca_cert: str, cluster_dns: str, dns_domain: str) -> str:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": ca_cert}},
            "authorization": {"mode": "Webhook"},
            "address": self.address, "port": 10250, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": 10248,
            "cgroupDriver": "cgroupfs", "cgroupRoot": self.cgroup, "failCgroupV1": False,
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "clusterDNS": [cluster_dns], "clusterDomain": dns_domain, "resolvConf": "/etc/resolv.conf",
            "failSwapOn": False, "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "nodefs.inodesFree": "1%",
                             "imagefs.available": "1%", "imagefs.inodesFree": "1%"},
            "serializeImagePulls": False, "maxPods": 110, "rotateCertificates": False,
            "podLogsDir": "/var/log/pods", "protectKernelDefaults": False,
        }
        return self._write("kubelet/config.json", json.dumps(config, indent=1))

    # ------------------------------------------------------------ life cycle
    def make_cgroups(self) -> None:
        for hierarchy in hierarchies():
            _make_cgroup(hierarchy, self.system_cgroup)

    def start_holder(self, *, timeout: float = 30.0) -> int:
        os.makedirs(self.path("tunables"), exist_ok=True)
        for key, value in KERNEL_TUNABLES.items():
            self._write(os.path.join("tunables", key.replace("/", ".")), value + "\n")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path("holder.ready"))
        pid = self.processes.spawn(None, [
            "nsenter", f"--net=/run/netns/{self.netns}", "--", "unshare", "--mount", "--propagation",
            "unchanged", "--", "sh", "-c", _HOLDER_SCRIPT, "holder", self.directory, self.state_dir,
            self.unified_cgroup],
            self.log("holder"))
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.path("holder.ready")):
            if not process_alive(pid) or time.monotonic() > deadline:
                raise LabError(f"node {self.name}: its mount namespace was not made:\n{tail(self.log('holder'))}")
            time.sleep(0.05)
        for hierarchy in hierarchies():
            with open(os.path.join(hierarchy, self.system_cgroup.strip("/"), "cgroup.procs"), "w") as f:
                f.write(str(pid))
        return pid

    def start_containerd(self, holder: int, *, sandbox_image: str, timeout: float = 60.0) -> int:
        config = self.containerd_config(sandbox_image=sandbox_image)
        pid = self.processes.spawn(None, [*self.enter(holder), "containerd", "--config", config,
                                          "--log-level", "warn"], self.log("containerd"))
        deadline = time.monotonic() + timeout
        while not os.path.exists(self.containerd_socket):
            if not process_alive(pid) or time.monotonic() > deadline:
                raise LabError(f"node {self.name}: containerd did not start:\n{tail(self.log('containerd'))}")
            time.sleep(0.05)
        return pid

    def start_kubelet(self, holder: int, *, kubeconfig: str, ca_cert: str, cluster_dns: str,
                      dns_domain: str) -> int:
        config = self.kubelet_config(ca_cert=ca_cert, cluster_dns=cluster_dns, dns_domain=dns_domain)
        return self.processes.spawn(None, [
            *self.enter(holder), os.path.join(self.bin_dir, "kubelet"), "--config", config,
            "--kubeconfig", kubeconfig, "--hostname-override", self.name, "--node-ip", self.address,
            "--root-dir", self.path("kubelet", "root"), "--v=1"], self.log("kubelet"))

    def remove(self) -> None:
        """Kill everything in the node's cgroup subtree (frozen first, so nothing forks away),
        then remove the subtree; the mount namespace goes with its last process. Safe to repeat."""
        hier = hierarchies()
        freezer = next((h for h in hier if h.endswith("/freezer")), None)
        state = os.path.join(freezer, self.cgroup.strip("/"), "freezer.state") if freezer else None
        for _ in range(50):
            pids = self._pids(hier)
            if not pids:
                break
            if state and os.path.exists(state):
                with contextlib.suppress(OSError), open(state, "w") as f:
                    f.write("FROZEN")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if state and os.path.exists(state):
                with contextlib.suppress(OSError), open(state, "w") as f:
                    f.write("THAWED")
            for pid in pids:
                self.processes.kill(pid, sig=signal.SIGKILL, timeout=1.0)
            time.sleep(0.1)
        for hierarchy in hier:
            root = os.path.join(hierarchy, self.cgroup.strip("/"))
            for current, _dirs, _files in sorted(os.walk(root), key=lambda w: -w[0].count("/")):
                with contextlib.suppress(OSError):
                    os.rmdir(current)

    def _pids(self, hier: list[str]) -> set[int]:
        found: set[int] = set()
        for hierarchy in hier:
            for current, _dirs, files in os.walk(os.path.join(hierarchy, self.cgroup.strip("/"))):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError), open(os.path.join(current, "cgroup.procs")) as f:
                        found.update(int(p) for p in f.read().split())
        return found
