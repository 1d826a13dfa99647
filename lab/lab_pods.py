"""The lab's pods: what the kubelet and the container runtime do for `LabCluster`.

A pod is a network namespace wired by executing the node's CNI plugin as containerd would,
plus its v1 Pod object (`pod_objects.py` renders it), kept Ready or not as a readiness probe
would, terminated with a grace period, and torn down (plugin DEL, then the object). It is a
mixin of `LabCluster` (which owns the state, the nodes and the API client) so that the
cluster keeps one public API (`lab.add_pod`, `lab.remove_pod`, ...) while this module keeps
the pods' life cycle apart from the nodes' and the control plane's. The sandbox (`sandbox_up`,
`sandbox_down`: the namespace and the plugin's ADD and DEL) is shared with the kubelet stand-in
(`kubelet.py`), which runs the Pods API clients create.

In the kubelet's order: the Pod object exists (scheduled, no address) before the runtime's ADD,
which names it in `CNI_ARGS` (`K8S_POD_NAMESPACE`, `K8S_POD_NAME`); the address reaches the
Pod's status (`podIPs`: one per family of the cluster, the primary first, from the ADD's result)
`pod_status_delay` seconds after the ADD (`lab up --pod-status-delay`: a loaded
kubelet; 0: at once), reported from a timer so `add_pod` returns as the ADD does.
"""
from __future__ import annotations

import contextlib
import json
import math
import threading
import time
from typing import TYPE_CHECKING

from cni.errors import CniError
from lab import pod_objects
from lab.apiclient import LabApiClient, LabApiError
from lab.node import exec_plugin, raise_for_failure
from lab.state import LabError, LabState, NodeState, PodState
from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily

if TYPE_CHECKING:
    from lab.agent_pods import AgentPods


def result_addresses(result: dict, families: tuple[IpFamily, ...]) -> list[str]:
    """The pod's addresses from an ADD's result, one per family of the cluster in its order
    (the primary first), as the kubelet reports `status.podIPs`."""
    by_family: dict[IpFamily, str] = {}
    for entry in result.get("ips") or []:
        address = str(entry.get("address", "")).split("/")[0]
        try:
            by_family.setdefault(IpFamily.of(address), address)
        except ValueError:
            continue
    return [by_family[family] for family in families if family in by_family]


class LabPods:
    """The pod verbs of `LabCluster`; what they need of it is declared below."""

    if TYPE_CHECKING:
        state: LabState
        agent_pods: AgentPods | None

        @property
        def bin_dir(self) -> str: ...

        def api(self) -> LabApiClient: ...

        def save(self) -> None: ...

        def conflist_path(self, name: str) -> str: ...

        def _node(self, name: str) -> NodeState: ...

    def add_pod(self, name: str, *, node: str | None = None, labels: dict | None = None,
                ports: dict | None = None, namespace: str = "default", ready: bool = True,
                scheduled: bool = True) -> PodState:
        """A pod: its v1 Pod object (scheduled), its network namespace wired by the CNI plugin,
        then its status (Running, Ready, its address) `state.pod_status_delay` seconds later.

        `ports` names container ports for named targetPorts: {"http": 8080, "dns": (53, "UDP")}.
        `ready=False` starts it not Ready, as a pod whose readiness probe has not passed yet
        (`set_pod_ready` flips it once its server listens). `scheduled=False`: no Pod object at
        all (the caller creates it, e.g. with `create_pod_object`, to test an ADD that comes first).
        """
        if name in self.state.pods:
            raise LabError(f"pod {name} already exists")
        try:
            pod_objects.check_pod_name(name)
            container_ports = pod_objects.normalize_ports(ports)
        except pod_objects.PodSpecError as error:
            raise LabError(str(error)) from None
        self._require_namespace(namespace)
        if node is None:  # the emptiest node, as a scheduler spreading pods would
            counts = {n: 0 for n in self.state.nodes}
            for pod in self.state.pods.values():
                counts[pod.node] += 1
            if not counts:
                raise LabError("the lab has no nodes")
            node = min(counts, key=lambda n: (counts[n], self.state.nodes[n].index))
        node_state = self._node(node)
        netns = f"{self.state.prefix}-p-{name}"[:60]
        container_id = f"{self.state.prefix}-{name}"
        pod = PodState(name=name, node=node, netns=netns, container_id=container_id, ip="",
                       labels=dict(labels or {}), namespace=namespace, ports=container_ports)
        self.state.pods[name] = pod
        self.save()
        wired = created = False
        try:
            if scheduled:
                self.create_pod_object(name)
                created = True
            pod.ips = self.sandbox_up(pod)
            wired = True
            pod.ip = pod.ips[0]
            if scheduled:
                status = {"status": self._rendered(pod, ready=ready)["status"]}
                self._report_status(pod, status, delay=self.state.pod_status_delay)
        except BaseException:
            if wired:
                with contextlib.suppress(Exception):
                    self.sandbox_down(pod)
            if created:
                with contextlib.suppress(Exception):
                    self.api().delete("v1", "Pod", name, namespace=namespace, grace_period_seconds=0)
            del self.state.pods[name]
            self.save()
            raise
        self.save()
        return pod

    def sandbox_up(self, pod: PodState) -> list[str]:
        """The runtime's sandbox: `pod.netns` created and wired by the node's plugin (ADD); its
        addresses, one per family of the cluster (the primary first). Undone when it fails."""
        namespaces.create(pod.netns)
        try:
            code, out = self._exec_plugin(pod, "ADD")
            raise_for_failure(code, out, "ADD")
        except BaseException:
            with contextlib.suppress(Exception):
                self._exec_plugin(pod, "DEL")
            namespaces.remove(pod.netns)
            raise
        return result_addresses(out, self.state.families) or [out["ips"][0]["address"].split("/")[0]]

    def sandbox_down(self, pod: PodState) -> None:
        """The sandbox's end: the plugin's DEL, then its namespace (removed even when DEL fails)."""
        try:
            code, out = self._exec_plugin(pod, "DEL")
        finally:
            namespaces.remove(pod.netns)
        raise_for_failure(code, out, "DEL")

    def _rendered(self, pod: PodState, *, ready: bool = True) -> dict:
        return pod_objects.render_pod(pod.name, namespace=pod.namespace, node=pod.node,
                                      host_ip=self._node(pod.node).address, pod_ip=pod.ip, pod_ips=pod.ips or None,
                                      labels=pod.labels,
                                      ports=pod.ports, ready=ready, container_id=pod.container_id)

    def create_pod_object(self, name: str) -> None:
        """The Pod as the scheduler leaves it: bound to its node, Pending, no address yet."""
        obj = self._rendered(self._pod(name))
        obj["status"] = {"phase": "Pending", "conditions": obj["status"]["conditions"][:1]}
        self.api().create(obj)

    def _report_status(self, pod: PodState, patch: dict, *, delay: float) -> None:
        """The kubelet's status report (the address, Running, Ready), `delay` seconds from now."""
        def report() -> None:
            with contextlib.suppress(LabApiError, OSError):     # the pod may be gone by then
                self.api().patch("v1", "Pod", pod.name, patch, namespace=pod.namespace, subresource="status")
        if delay <= 0:
            self.api().patch("v1", "Pod", pod.name, patch, namespace=pod.namespace, subresource="status")
            return
        timer = threading.Timer(delay, report)
        timer.name = f"lab-kubelet-{pod.name}"
        timer.start()

    def _require_namespace(self, namespace: str) -> None:
        try:
            self.api().get("v1", "Namespace", namespace)
        except LabApiError as error:
            if error.code == 404:
                raise LabError(f"namespace {namespace} does not exist: apply a Namespace manifest first") from None
            raise LabError(f"the API server refused to show namespace {namespace}: {error}") from None
        except OSError as error:
            raise LabError(f"the API server is not reachable ({error}); pods need it") from None

    def _exec_plugin(self, pod: PodState, command: str) -> tuple:
        """Run the node's plugin for `pod` as the runtime does: the lab's install, or (agents from
        an image) the shim the init container put in the node's /opt/cni/bin, seen from the node."""
        host_view = self.agent_pods.host_view(pod.node) if self.agent_pods else []
        return exec_plugin(node_netns=self._node(pod.node).netns, bin_dir="/opt/cni/bin" if host_view else self.bin_dir,
                           command=command, config=self._plugin_config(pod.node), container_id=pod.container_id,
                           netns=namespaces.netns_path(pod.netns), host_view=host_view,
                           args=f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod.namespace};K8S_POD_NAME={pod.name}")

    def _plugin_config(self, node: str) -> bytes:
        from cni import invoke
        try:
            with open(self.conflist_path(node)) as f:
                conflist = json.load(f)
        except FileNotFoundError:
            raise LabError(f"node {node} has no network config yet (its agent publishes it once it has "
                           f"its pod CIDR)") from None
        return invoke.plugin_config(conflist, 0, prev_result=None)

    def _pod(self, name: str) -> PodState:
        try:
            return self.state.pods[name]
        except KeyError:
            raise LabError(f"no pod {name} (have: {', '.join(self.state.pods) or 'none'})") from None

    def pod_object(self, name: str) -> dict:
        pod = self._pod(name)
        return self.api().get("v1", "Pod", name, namespace=pod.namespace)

    def set_pod_ready(self, name: str, *, ready: bool) -> None:
        """Flip the pod's Ready condition, as its readiness probe would."""
        pod = self._pod(name)
        try:
            patch = pod_objects.with_readiness(self.pod_object(name), ready=ready)
            if patch is not None:
                self.api().patch("v1", "Pod", name, patch, namespace=pod.namespace, subresource="status")
        except LabApiError as error:
            raise LabError(f"pod {name}: {error}") from None

    def terminate_pod(self, name: str, *, grace_period: int = 30) -> None:
        """Start a graceful deletion: the Pod gets its deletionTimestamp; its network stays up."""
        if grace_period < 1:
            raise LabError("a graceful termination needs a grace period of at least 1 s")
        pod = self._pod(name)
        try:
            self.api().delete("v1", "Pod", name, namespace=pod.namespace, grace_period_seconds=grace_period)
        except LabApiError as error:
            raise LabError(f"pod {name}: {error}") from None

    def remove_pod(self, name: str, *, grace_period: float = 0) -> None:
        """Remove the pod; with a grace period, it terminates (still serving) that long first."""
        self._pod(name)
        if grace_period > 0:
            self.terminate_pod(name, grace_period=max(1, math.ceil(grace_period)))
            time.sleep(grace_period)
        self.finish_pod_removal(name)

    def finish_pod_removal(self, name: str) -> None:
        """What the kubelet does at the end: tear the network down, then delete the Pod for good."""
        pod = self._pod(name)
        try:
            self.sandbox_down(pod)
            del_error = None
        except CniError as error:
            del_error = error
        del self.state.pods[name]
        self.save()
        api_error = None
        try:
            self.api().delete("v1", "Pod", name, namespace=pod.namespace, grace_period_seconds=0)
        except LabApiError as error:
            if error.code != 404:
                api_error = str(error)
        except OSError as error:
            api_error = f"the API server is not reachable ({error})"
        if del_error is not None:
            raise del_error
        if api_error:
            raise LabError(f"pod {name}: its network is gone but its Pod object is not: {api_error}; "
                           f"delete it with the API (namespace {pod.namespace}) once the server is back")
