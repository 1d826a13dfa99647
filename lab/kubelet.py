"""The lab's kubelet stand-in: runs the Pods that API clients create on the quick lab's nodes.

`lab_pods.py` plays kubelet for the pods the lab makes itself (`lab.add_pod`); nothing ran a Pod
a client created (`netagent connectivity-test`'s servers and clients, kubectl's). This process
(`python -m lab.kubelet --workdir W`, started by `LabCluster.create`, one per lab, in the host's
namespace) does, per lab node, what a kubelet does for them:
- it watches the Pods bound to that node (a reflector with `spec.nodeName=<node>`, started when
  the Node appears and the lab's state knows it, stopped when it goes), and runs each new one
  in a `kubelet_pod.PodWorker` thread: the sandbox through `LabPods.sandbox_up`/`sandbox_down`
  (the same CNI ADD and DEL as the lab's own pods, executed from the node), the container as the
  real agnhost binary (`scripts/build-kubernetes` builds it; `lab/kubernetes/binaries.py` says
  where) inside the pod's namespace by `nsenter`, as the user its securityContext names, in the
  node's cgroup in ebpf mode; its output in a log file per container;
- it serves the kubelet's port (`node_objects.KUBELET_PORT`, the Node's
  `daemonEndpoints.kubeletEndpoint`) on every address of the node's namespace: `/healthz` and
  `/containerLogs/NS/POD/CONTAINER?tailLines=N`, which the API server's `pods/NAME/log` reads
  (`apiserver/pod_logs.py`), as the real one proxies to the real kubelet.
The lab's own pods are left to `lab_pods.py` (`kubelet_status.ours`). On SIGTERM
(`LabCluster.down`) it tears every pod down while the agents still serve CNI, then exits.
"""
from __future__ import annotations

import argparse
import contextlib
import http.server
import logging
import os
import re
import signal
import socket
import subprocess
import threading
from urllib.parse import parse_qs, unquote, urlsplit

from lab import bpf_places, kubelet_status
from lab.cluster import LabCluster
from lab.kubelet_pod import Phase, PodWorker
from lab.kubelet_status import Container
from lab.kubernetes import binaries
from lab.node_objects import KUBELET_PORT
from lab.processes import Processes
from lab.state import LabState, PodState
from netagent.kernel import namespaces
from netagent.kube.reflector import Reflector
from netagent.kube.resources import NODES, PODS

_log = logging.getLogger("lab.kubelet")
MAX_LOG_BYTES = 4 << 20


def sandbox_name(prefix: str, uid: str) -> str:
    """The pod's network namespace: named for the lab (so `down` and the tests' leak checks find
    it) and the Pod's uid (two Pods of one name in two namespaces never collide)."""
    return f"{prefix}-k-{re.sub(r'[^a-z0-9]', '', uid.lower())[:16]}"


class LabRuntime:
    """`PodRuntime` on one lab node: sandboxes by the lab's CNI path, agnhost processes, TCP probes."""

    def __init__(self, lab: LabCluster, node: str, *, agnhost: str) -> None:
        self.lab = lab
        self.node = node
        self.agnhost = agnhost

    def _sandbox(self, pod: dict) -> PodState:
        meta = pod["metadata"]
        return PodState(name=meta["name"], node=self.node, netns=sandbox_name(self.lab.state.prefix, meta["uid"]),
                        container_id=f"{self.lab.state.prefix}-k-{meta['uid']}", ip="",
                        namespace=meta["namespace"])

    def log_path(self, namespace: str, name: str, uid: str, container: str) -> str:
        return os.path.join(self.lab.workdir, "kubelet", "pods", f"{namespace}_{name}_{uid}", f"{container}.log")

    def add_network(self, pod: dict) -> list[str]:
        return self.lab.sandbox_up(self._sandbox(pod))

    def del_network(self, pod: dict) -> None:
        meta = pod["metadata"]
        try:
            self.lab.sandbox_down(self._sandbox(pod))
        finally:
            with contextlib.suppress(OSError):
                directory = os.path.dirname(self.log_path(meta["namespace"], meta["name"], meta["uid"], "x"))
                for entry in os.listdir(directory):
                    os.unlink(os.path.join(directory, entry))
                os.rmdir(directory)

    def start(self, pod: dict, container: Container, *, restarts: int) -> subprocess.Popen:
        if not os.access(self.agnhost, os.X_OK):
            raise FileNotFoundError(f"no agnhost binary at {self.agnhost}: build it with scripts/build-kubernetes")
        meta = pod["metadata"]
        argv = ["nsenter", f"--net={namespaces.netns_path(self._sandbox(pod).netns)}"]
        if container.uid is not None:
            argv += [f"--setuid={container.uid}", f"--setgid={container.gid if container.gid is not None else container.uid}"]
        argv = bpf_places.in_cgroup_of(self.lab.state, self.node, [], [*argv, self.agnhost, *container.args])
        path = self.log_path(meta["namespace"], meta["name"], meta["uid"], container.name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "ab") as log:
            if restarts:
                log.write(f"--- restarted ({restarts}) ---\n".encode())
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd="/")

    def probe(self, address: str, port: int) -> bool:
        """A tcpSocket probe from the node's namespace, as the kubelet probes from its host."""
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = namespaces.made_in(self.lab.state.nodes[self.node].netns, lambda: socket.socket(family, socket.SOCK_STREAM))
        with sock:
            sock.settimeout(1.0)
            return sock.connect_ex((address, port)) == 0


class LabPodApi:
    """`PodApi` through the lab API server's unix socket."""

    def __init__(self, lab: LabCluster) -> None:
        self.lab = lab

    def patch_status(self, namespace: str, name: str, patch: dict) -> None:
        self.lab.api().patch("v1", "Pod", name, patch, namespace=namespace, subresource="status")

    def delete_pod(self, namespace: str, name: str) -> None:
        self.lab.api().delete("v1", "Pod", name, namespace=namespace, grace_period_seconds=0)


def _node_address(node: dict) -> str:
    for address in (node.get("status") or {}).get("addresses") or []:
        if address.get("type") == "InternalIP":
            return str(address.get("address", ""))
    return ""


class NodeKubelet:
    """One node's part: the Pod watch, the pod workers, the kubelet port."""

    def __init__(self, lab: LabCluster, node: dict, *, api_client, agnhost: str) -> None:
        self.name = node["metadata"]["name"]
        self.host_ip = _node_address(node)
        self.runtime = LabRuntime(lab, self.name, agnhost=agnhost)
        self.api = LabPodApi(lab)
        self.workers: dict[str, PodWorker] = {}      # by uid
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.reflector = Reflector(api_client=api_client, resource=PODS, handler=self,
                                   field_selector=f"spec.nodeName={self.name}")
        self.server = namespaces.made_in(lab.state.nodes[self.name].netns, lambda: _listen(self, ipv6=lab.ipv6))

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, name=f"kubelet-port-{self.name}", daemon=True).start()
        self.reflector.start()

    # the reflector's handler: start a worker, or tell one its Pod is going
    def on_add(self, obj: dict) -> None:
        self._seen(obj)

    def on_update(self, old: dict, new: dict) -> None:
        self._seen(new)

    def on_delete(self, obj: dict) -> None:
        worker = self.workers.get(str(obj["metadata"].get("uid")))
        if worker is not None:
            worker.deleted(graceful=False)

    def on_synced(self) -> None:
        pass

    def _seen(self, pod: dict) -> None:
        meta = pod.get("metadata") or {}
        if not kubelet_status.ours(pod):
            return   # the lab's own pod (lab_pods.py runs it), or no pod any kubelet runs
        uid = str(meta.get("uid"))
        with self.lock:
            worker = self.workers.get(uid)
            if worker is None:
                if meta.get("deletionTimestamp"):
                    return
                worker = self.workers[uid] = PodWorker(pod, runtime=self.runtime, api=self.api, host_ip=self.host_ip)
                thread = threading.Thread(target=worker.run, name=f"pod-{meta.get('namespace')}-{meta.get('name')}",
                                          daemon=True)
                self.threads.append(thread)
                thread.start()
        if meta.get("deletionTimestamp"):
            worker.deleted(graceful=True, grace=float(meta.get("deletionGracePeriodSeconds") or 0))

    def log_file(self, namespace: str, name: str, container: str) -> str | None:
        for worker in list(self.workers.values()):
            if (worker.namespace, worker.name) == (namespace, name) and worker.container is not None \
                    and worker.container.name == container and worker.phase is not Phase.GONE:
                return self.runtime.log_path(namespace, name, str(worker.pod["metadata"]["uid"]), container)
        return None

    def stop(self) -> None:
        self.reflector.stop()
        for worker in list(self.workers.values()):
            worker.deleted(graceful=False)
        for thread in self.threads:
            thread.join(30)
        self.server.shutdown()
        self.server.server_close()


def tail_lines(data: bytes, lines: int | None) -> bytes:
    if lines is None:
        return data
    if lines <= 0:
        return b""
    kept = data.splitlines(keepends=True)[-lines:]
    return b"".join(kept)


class _Handler(http.server.BaseHTTPRequestHandler):
    kubelet: NodeKubelet

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (stdlib's name)
        _log.debug("kubelet port: " + format, *args)

    def _send(self, code: int, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        if parts == ["healthz"]:
            return self._send(200, b"ok")
        if len(parts) != 4 or parts[0] != "containerLogs":
            return self._send(404, b"not found")
        query = parse_qs(url.query)
        try:
            lines = int(query["tailLines"][0]) if "tailLines" in query else None
            limit = int(query["limitBytes"][0]) if "limitBytes" in query else MAX_LOG_BYTES
        except ValueError:
            return self._send(400, b"tailLines and limitBytes are whole numbers")
        path = self.kubelet.log_file(*parts[1:])
        if path is None:
            return self._send(404, f"container {parts[3]} of pod {parts[1]}/{parts[2]} has not started on this node"
                                   .encode())
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - MAX_LOG_BYTES))
                data = f.read()
        except FileNotFoundError:
            data = b""
        self._send(200, tail_lines(data, lines)[-max(0, min(limit, MAX_LOG_BYTES)):] if limit else b"")


def _listen(kubelet: NodeKubelet, *, ipv6: bool) -> http.server.ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"kubelet": kubelet})

    class Server(http.server.ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ipv6 else socket.AF_INET
        daemon_threads = True

        def server_bind(self) -> None:
            if ipv6:
                self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            super().server_bind()

    return Server(("::" if ipv6 else "0.0.0.0", KUBELET_PORT), handler)


class LabKubelet:
    """Every node's part, started and stopped as their Nodes come and go."""

    def __init__(self, workdir: str) -> None:
        self.workdir = workdir
        self.lab = LabCluster.load(workdir)
        if not self.lab.host_api_url:
            raise SystemExit("lab kubelet: the lab's API server has no host address yet")
        from kubernetes.client.api_client import ApiClient
        from kubernetes.client.configuration import Configuration
        configuration = Configuration()
        configuration.host = self.lab.host_api_url
        self.api_client = ApiClient(configuration=configuration)
        self.agnhost = os.path.join(binaries.bin_dir(), "agnhost")
        self.nodes: dict[str, NodeKubelet] = {}
        self.lock = threading.Lock()
        self.reflector = Reflector(api_client=self.api_client, resource=NODES, handler=self)

    def on_add(self, obj: dict) -> None:
        self._node(obj)

    def on_update(self, old: dict, new: dict) -> None:
        self._node(new)

    def on_delete(self, obj: dict) -> None:
        with self.lock:
            node = self.nodes.pop(obj["metadata"]["name"], None)
        if node is not None:
            threading.Thread(target=node.stop, daemon=True).start()

    def on_synced(self) -> None:
        pass

    def _node(self, obj: dict) -> None:
        name = obj["metadata"]["name"]
        with self.lock:
            if name in self.nodes:
                return
            self.lab = LabCluster.load(self.workdir)     # a node is in the state before its Node is created
            if name not in self.lab.state.nodes:
                return
            node = self.nodes[name] = NodeKubelet(self.lab, obj, api_client=self.api_client, agnhost=self.agnhost)
        node.start()
        _log.info("node %s: watching its pods", name)

    def run(self) -> None:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        self.reflector.start()
        stop.wait()
        self.reflector.stop()
        with self.lock:
            nodes, self.nodes = list(self.nodes.values()), {}
        for node in nodes:
            node.stop()
        _log.info("stopped: every pod torn down")


def stop(processes: Processes, state: LabState) -> None:
    """`LabCluster.down`'s first step: the stand-in stopped (it tears its pods down while the agents
    serve CNI), then whatever of it outlived it: its process group, its pods' namespaces."""
    pid = state.kubelet_pid
    if pid is not None:
        processes.kill(pid, timeout=60.0)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for name in (line.split()[0] for line in listed.splitlines() if line.strip()):
        if name.startswith(f"{state.prefix}-k-"):
            namespaces.remove(name)
    state.kubelet_pid = None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.kubelet", description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True, help="the lab's state directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    LabKubelet(args.workdir).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
