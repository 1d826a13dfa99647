"""What the Kubernetes lab applies with kubectl once its nodes exist: deploy/netagent.yaml with
the operator's edits, and CoreDNS. Pure: manifests in, YAML text out.

netagent's manifest is the user's file (for the eBPF proxy, the user's overlay `deploy/ebpf/`,
built by `kubectl kustomize` as `kubectl apply -k` does); the lab changes only what an operator
would edit for the lab's choices (`--backend`, `--proxy-mode`, and for bgp the capability
NET_BIND_SERVICE that deploy/README.md says BIRD needs), through the same `with_flag` the
image lab uses, and leaves everything else (RBAC, mounts, capabilities, probes) as shipped, so the real
authorizer and kubelet judge the real thing. CoreDNS is kubeadm's shape (its ClusterRole, a
two-replica Deployment, the `kube-dns` Service at the cluster's DNS address) with one change:
no `forward` to an upstream resolver, since the lab has no DNS beyond the cluster.
"""
from __future__ import annotations

import os

import yaml

from lab.daemonset import with_flag
from lab.state import LabError
from netagent.cniserver import install as cni_install

MANIFEST = os.path.join(cni_install.code_root(), "deploy", "netagent.yaml")
# the proxy modes a user installs with `kubectl apply -k <overlay>` instead of the manifest
OVERLAYS = {"ebpf": os.path.join(cni_install.code_root(), "deploy", "ebpf")}
AGENT_CONTAINER = "netagent"


def netagent_manifest(*, mode: str, proxy_mode: str, path: str = MANIFEST, built: str | None = None) -> str:
    """deploy/netagent.yaml (or `built`: the YAML `kubectl kustomize` made of the proxy mode's
    overlay) with the agent's `--backend` and `--proxy-mode` set."""
    try:
        if built is not None:
            documents = [doc for doc in yaml.safe_load_all(built) if doc]
        else:
            with open(path) as f:
                documents = [doc for doc in yaml.safe_load_all(f) if doc]
    except (OSError, yaml.YAMLError) as error:
        raise LabError(f"cannot read the manifest {path}: {error}") from None
    daemonsets = [d for d in documents if d.get("kind") == "DaemonSet"]
    if len(daemonsets) != 1:
        raise LabError(f"{path} holds {len(daemonsets)} DaemonSets; expected one")
    containers = daemonsets[0]["spec"]["template"]["spec"]["containers"]
    agent = next((c for c in containers if c.get("name") == AGENT_CONTAINER), None)
    if agent is None:
        raise LabError(f"{path}: the DaemonSet has no container named {AGENT_CONTAINER}")
    args = with_flag(list(agent.get("args", [])), "--backend", mode)
    agent["args"] = with_flag(args, "--proxy-mode", proxy_mode)
    capabilities = agent.get("securityContext", {}).get("capabilities")
    if mode == "bgp" and capabilities is not None:   # deploy/README.md: BIRD binds port 179
        capabilities["add"] = [*capabilities.get("add", []), "NET_BIND_SERVICE"]
    return yaml.safe_dump_all(documents, sort_keys=False)


def _corefile(domain: str) -> str:
    return f""".:53 {{
    errors
    health {{
        lameduck 5s
    }}
    ready
    kubernetes {domain} in-addr.arpa ip6.arpa {{
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }}
    prometheus :9153
    cache 30
    reload
    loadbalance
}}
"""


def coredns_manifest(*, dns_ip: str, domain: str, image: str) -> str:
    labels = {"k8s-app": "kube-dns"}
    meta = {"name": "coredns", "namespace": "kube-system"}
    documents: list[dict] = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:coredns"},
         "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"Corefile": _corefile(domain)}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {**meta, "labels": labels},
         "spec": {"replicas": 2, "selector": {"matchLabels": labels},
                  "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "serviceAccountName": "coredns", "priorityClassName": "system-cluster-critical",
                      "dnsPolicy": "Default",
                      "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "effect": "NoSchedule"}],
                      "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                          {"weight": 100, "podAffinityTerm": {"labelSelector": {"matchLabels": labels},
                                                              "topologyKey": "kubernetes.io/hostname"}}]}},
                      "containers": [{
                          "name": "coredns", "image": image, "imagePullPolicy": "IfNotPresent",
                          "args": ["-conf", "/etc/coredns/Corefile"],
                          "ports": [{"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                    {"name": "metrics", "containerPort": 9153, "protocol": "TCP"}],
                          "securityContext": {"allowPrivilegeEscalation": False,
                                              "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                                              "readOnlyRootFilesystem": True},
                          "livenessProbe": {"httpGet": {"path": "/health", "port": 8080},
                                            "initialDelaySeconds": 10, "periodSeconds": 10, "failureThreshold": 5},
                          "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 5},
                          "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": True}],
                      }],
                      "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                  }}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": "kube-system",
                      "labels": {**labels, "kubernetes.io/name": "CoreDNS"}},
         "spec": {"selector": labels, "clusterIP": dns_ip,
                  "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                            {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                            {"name": "metrics", "port": 9153, "protocol": "TCP", "targetPort": 9153}]}},
    ]
    return yaml.safe_dump_all(documents, sort_keys=False)
