"""A fake cluster for `netagent connectivity-test`'s unit tests: the `ClusterApi` calls over
plain dicts, servers Ready at once, each client pod ending as the test scripts it, and the
agents' flow records as the test gives them (a node not given has no agent pod)."""
from __future__ import annotations

import itertools

from netagent.daemon.connectivity_flows import FlowsUnavailable


def node(name: str, address: str = "", *, ready: bool = True, taints: list | None = None,
         kubelet_port: int | None = 10250) -> dict:
    status: dict = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                    "addresses": [{"type": "Hostname", "address": name}]}
    if address:
        status["addresses"].append({"type": "InternalIP", "address": address})
    if kubelet_port is not None:
        status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": kubelet_port}}
    return {"metadata": {"name": name}, "spec": {"taints": taints or []}, "status": status}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeClusterApi:
    """`answers`: a check's client pod name prefix -> (phase, log) per attempt (the last one
    repeats); a client not named there Succeeds. `on_list`: called at every pod list (a fault).
    `flows`: node -> what `netagent flows --json` prints there; a node not named has no agent."""

    def __init__(self, nodes: list[dict], *, dns: bool = True, servers_ready: bool = True,
                 answers: dict[str, list[tuple[str, str]]] | None = None, on_list=None,
                 flows: dict[str, str] | None = None) -> None:
        self.flows = flows or {}
        self.flow_calls: list[tuple[str, str]] = []
        self.nodes = nodes
        self.dns = dns
        self.servers_ready = servers_ready
        self.answers = answers or {}
        self.on_list = on_list
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.namespaces: set[str] = set()
        self.deleted_namespaces: list[str] = []
        self.deleted_pods: list[str] = []
        self.created: list[tuple[str, str]] = []   # (kind, name) in order
        self.pod_specs: list[dict] = []             # every pod created, kept after its deletion
        self.ips = (f"10.244.0.{i}" for i in itertools.count(10))
        self.client_ips = (f"10.244.9.{i}" for i in itertools.count(10))

    # the ClusterApi calls
    def list_nodes(self) -> list[dict]:
        return self.nodes

    def service(self, namespace: str, name: str) -> dict | None:
        if (namespace, name) == ("kube-system", "kube-dns"):
            return {"spec": {}} if self.dns else None
        return self.objects.get((namespace, "Service", name))

    def create(self, namespace: str | None, obj: dict) -> None:
        kind, name = obj["kind"], obj["metadata"]["name"]
        self.created.append((kind, name))
        if kind == "Namespace":
            self.namespaces.add(name)
            return
        assert namespace in self.namespaces, f"{kind} {name} created outside our namespace"
        obj = {**obj, "status": {}}
        if kind == "Pod":
            self.pod_specs.append(obj)
            if obj["spec"].get("restartPolicy") == "Never":
                obj["ip"] = next(self.client_ips)
        if kind == "Service":
            obj["spec"] = {**obj["spec"], "clusterIP": "10.96.0.10"}
            if obj["spec"]["type"] == "NodePort":
                obj["spec"]["ports"] = [{**obj["spec"]["ports"][0], "nodePort": 30080}]
        self.objects[(namespace, kind, name)] = obj

    def _status(self, pod: dict) -> dict:
        name = pod["metadata"]["name"]
        if pod["spec"].get("restartPolicy") != "Never":     # a server
            if not self.servers_ready:
                return {"phase": "Pending", "containerStatuses": [
                    {"state": {"waiting": {"reason": "ErrImagePull", "message": "no such image"}}}]}
            if not pod["status"]:
                pod["status"] = {"phase": "Running", "podIP": next(self.ips),
                                 "conditions": [{"type": "Ready", "status": "True"}]}
            return pod["status"]
        check, _, attempt = name.rpartition("-")
        script = self.answers.get(check, [("Succeeded", "")])
        phase, log = script[min(int(attempt), len(script)) - 1]
        pod["log"] = log
        if phase == "Failed":
            return {"phase": phase, "podIP": pod["ip"],
                    "containerStatuses": [{"state": {"terminated": {"exitCode": 1}}}]}
        return {"phase": phase, "podIP": pod["ip"]}

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        if self.on_list:
            self.on_list(self)
        role = "client" if selector.endswith("=client") else None
        found = []
        for (ns, kind, _), pod in self.objects.items():
            if ns != namespace or kind != "Pod":
                continue
            is_client = pod["spec"].get("restartPolicy") == "Never"
            if (role == "client") == is_client:
                found.append({**pod, "status": self._status(pod)})
        return found

    def pod_log(self, namespace: str, name: str) -> str:
        return self.objects[(namespace, "Pod", name)].get("log", "")

    def delete_pod(self, namespace: str, name: str) -> None:
        self.deleted_pods.append(name)
        self.objects.pop((namespace, "Pod", name), None)

    def ready_endpoints(self, namespace: str, service: str) -> int:
        return 2

    def delete_namespace(self, name: str) -> None:
        self.deleted_namespaces.append(name)
        self.namespaces.discard(name)
        for key in [k for k in self.objects if k[0] == name]:
            del self.objects[key]

    def namespace_exists(self, name: str) -> bool:
        return name in self.namespaces

    def agent_flows(self, node: str, namespace: str) -> str:
        self.flow_calls.append((node, namespace))
        if node not in self.flows:
            raise FlowsUnavailable("no running agent pod (kube-system, app.kubernetes.io/name=netagent)")
        return self.flows[node]

    # for the tests
    def client_ip(self, pod: str) -> str:
        """The address a client pod (by name, e.g. policy-deny-1) had, deleted or not."""
        return next(p["ip"] for p in self.pod_specs if p["metadata"]["name"] == pod)

    def pods(self, namespace: str | None = None) -> list[dict]:
        return [o for (ns, kind, _), o in self.objects.items() if kind == "Pod" and namespace in (None, ns)]
