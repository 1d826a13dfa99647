"""A fake cluster for `netagent connectivity-test`'s unit tests: the `ClusterApi` calls over
plain dicts, servers Ready at once, and each client pod ending as the test scripts it."""
from __future__ import annotations

import itertools


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
    repeats); a client not named there Succeeds. `on_list`: called at every pod list (a fault)."""

    def __init__(self, nodes: list[dict], *, dns: bool = True, servers_ready: bool = True,
                 answers: dict[str, list[tuple[str, str]]] | None = None, on_list=None) -> None:
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
            return {"phase": phase, "containerStatuses": [{"state": {"terminated": {"exitCode": 1}}}]}
        return {"phase": phase}

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

    # for the tests
    def pods(self, namespace: str | None = None) -> list[dict]:
        return [o for (ns, kind, _), o in self.objects.items() if kind == "Pod" and namespace in (None, ns)]
