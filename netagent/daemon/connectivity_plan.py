"""`netagent connectivity-test`'s plan: which nodes, which objects, which checks, from the API's Nodes.

Pure (no API calls), so the plan is tested from a node list alone: `usable_nodes` keeps the
Ready, schedulable nodes whose name and InternalIP validate (anything the API says is input,
not trusted: a name goes into a pod's `nodeName`, an address into a client's argv), and
`plan_checks` lays the checks out over the first two of them. With one node, each check that
needs a second says SKIP with that reason instead of quietly testing the same node twice.

The objects are plain manifests (dicts) of the namespace, the agnhost `netexec` servers, the
Services and the two NetworkPolicies; every object carries `LABEL_OWNER` so a leftover is
recognisable as ours. Each check is one client pod (`restartPolicy: Never`) running `agnhost
connect HOST:PORT`, so its verdict is read from the pod's phase and log: no exec or attach.
"""
from __future__ import annotations

import dataclasses
import enum
import ipaddress
import re
import uuid

from netagent.errors import NetagentError

# registry.k8s.io's agnhost, the tag the pinned Kubernetes' e2e suite uses (the lab builds this
# reference: lab/kubernetes/images.py AGNHOST_IMAGE; tests/unit/daemon holds the two equal)
DEFAULT_IMAGE = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
LABEL_OWNER = "app.kubernetes.io/managed-by"
OWNER = "netagent-connectivity-test"
LABEL_ROLE = "connectivity-test.netagent.io/role"
LABEL_ACCESS = "connectivity-test.netagent.io/access"   # the label the allow policy admits
NAMESPACE_PREFIX = "netagent-ct-"
HTTP_PORT = 8080
UDP_PORT = 8081
SERVICE_PORT = 80
ECHO_SERVICE = "echo"
NODEPORT_SERVICE = "echo-nodeport"
DENY_POLICY = "deny-ingress-to-guarded"
ALLOW_POLICY = "allow-labelled-clients-to-guarded"
DEFAULT_KUBELET_PORT = 10250
CONNECT_TIMEOUT = 5   # seconds one `agnhost connect` waits

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_EXTERNAL_HOST = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?$")
# what the "restricted" Pod Security Standard asks, so a namespace default of it admits our pods
_SECURITY = {"runAsNonRoot": True, "runAsUser": 65534, "allowPrivilegeEscalation": False,
             "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}


class ConnectivityPlanError(NetagentError, ValueError):
    """The input cannot make a plan: no usable node, a malformed --external."""


class Expect(enum.Enum):
    CONNECT = "connect"
    BLOCKED = "blocked"


class Stage(enum.Enum):
    """When a check's client starts: BASE with the deny policy in place (it guards only its own
    server), ALLOWED once the allow policy is added."""

    BASE = "base"
    ALLOWED = "allowed"


@dataclasses.dataclass(frozen=True)
class Node:
    name: str
    address: str          # its first InternalIP, validated
    kubelet_port: int


@dataclasses.dataclass(frozen=True)
class Check:
    """One check: a client on `node` connecting to `target` (HOST:PORT) or, when `skip` is set,
    a SKIP with that reason. `target` may hold `{...}` fields only known once the servers run
    (`pod_ip[a]`, `cluster_ip`, `node_port`), filled by `Check.resolved`."""

    name: str
    source: str
    destination: str
    node: str = ""
    target: str = ""
    protocol: str = "tcp"
    expect: Expect = Expect.CONNECT
    stage: Stage = Stage.BASE
    labels: tuple[tuple[str, str], ...] = ()
    skip: str = ""
    why: str = ""          # a note for the table (which port, and why)

    def resolved(self, values: dict[str, object]) -> "Check":
        return dataclasses.replace(self, target=self.target.format_map(values))


@dataclasses.dataclass(frozen=True)
class Plan:
    namespace: str
    image: str
    nodes: tuple[Node, ...]
    ignored: tuple[str, ...]    # nodes left out, each with why
    checks: tuple[Check, ...]

    @property
    def servers(self) -> dict[str, Node]:
        """server pod name -> its node: `server-a` and `server-b` behind the Services, on the
        first two nodes (both on the one when there is one); `guarded` behind the policies."""
        first = self.nodes[0]
        second = self.nodes[1] if len(self.nodes) > 1 else first
        return {"server-a": first, "server-b": second, "guarded": second}


def bracketed(host: str) -> str:
    """An address as it goes before `:port` (IPv6 in brackets)."""
    return f"[{host}]" if ":" in host else host


def host_port(host: str, port: int | str) -> str:
    return f"{bracketed(host)}:{port}"


def valid_node_name(name: object) -> bool:
    return isinstance(name, str) and 0 < len(name) <= 253 and bool(_DNS_SUBDOMAIN.match(name))


def _internal_ip(node: dict) -> str | None:
    for address in node.get("status", {}).get("addresses") or []:
        if isinstance(address, dict) and address.get("type") == "InternalIP":
            try:
                parsed = ipaddress.ip_address(str(address.get("address", "")))
            except ValueError:
                continue
            if not (parsed.is_unspecified or parsed.is_multicast or parsed.is_loopback):
                return str(parsed)
    return None


def _kubelet_port(node: dict) -> int:
    port = node.get("status", {}).get("daemonEndpoints", {}).get("kubeletEndpoint", {}).get("Port")
    return port if isinstance(port, int) and 0 < port < 65536 else DEFAULT_KUBELET_PORT


def _unusable(node: dict) -> str:
    """Why the node cannot hold our pods ('' when it can)."""
    status = node.get("status", {})
    os_label = (node.get("metadata", {}).get("labels") or {}).get("kubernetes.io/os", "linux")
    if os_label != "linux":
        return f"not a Linux node ({str(os_label)[:32]})"
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    if not ready:
        return "not Ready"
    if node.get("spec", {}).get("unschedulable"):
        return "cordoned"
    taints = [t for t in node.get("spec", {}).get("taints") or [] if t.get("effect") in ("NoSchedule", "NoExecute")]
    if taints:
        return f"tainted {str(taints[0].get('key', ''))[:63]}:{taints[0].get('effect')}"
    if _internal_ip(node) is None:
        return "no valid InternalIP"
    return ""


def usable_nodes(items: list[dict]) -> tuple[list[Node], list[str]]:
    """(the nodes our pods may go to, by name; the others, each 'name: why')."""
    nodes, ignored = [], []
    for item in items:
        name = item.get("metadata", {}).get("name")
        if not valid_node_name(name):
            ignored.append(f"{str(name)[:64]!r}: not a valid node name")
            continue
        why = _unusable(item)
        if why:
            ignored.append(f"{name}: {why}")
            continue
        nodes.append(Node(name=name, address=_internal_ip(item) or "", kubelet_port=_kubelet_port(item)))
    return sorted(nodes, key=lambda n: n.name), ignored


def parse_external(value: str) -> tuple[str, int]:
    """--external HOST:PORT, HOST a name or an address ([v6]:port), PORT 1-65535."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConnectivityPlanError(f"--external {value!r}: want HOST:PORT with a port 1-65535")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if len(host) > 253 or not _EXTERNAL_HOST.match(host):
            raise ConnectivityPlanError(f"--external {value!r}: the host is neither an address nor a DNS name")
    return host, int(port)


def new_namespace() -> str:
    return f"{NAMESPACE_PREFIX}{uuid.uuid4().hex[:10]}"


def plan_checks(nodes: list[Node], *, namespace: str, image: str = DEFAULT_IMAGE, ignored: list[str] | None = None,
                external: str | None = None, dns: str = "") -> Plan:
    """The checks over the first two nodes. `dns`: why DNS is skipped ('' when the cluster has it)."""
    if not nodes:
        raise ConnectivityPlanError("no Ready, schedulable node with a valid InternalIP" +
                                    (f" (ignored: {'; '.join(ignored)})" if ignored else ""))
    a = nodes[0]
    b = nodes[1] if len(nodes) > 1 else None
    one_node = "one usable node: nothing to cross" if b is None else ""
    far = b or a
    http = HTTP_PORT
    kubelet = ("the kubelet's port from the Node's status.daemonEndpoints: it listens on every node "
               "address, on any cluster")
    checks = [
        Check("pod-to-pod", f"client@{a.name}", f"server-a@{a.name}", a.name, f"{{pod_ip[server-a]}}:{http}"),
        Check("pod-to-pod/cross-node", f"client@{a.name}", f"server-b@{far.name}", a.name,
              f"{{pod_ip[server-b]}}:{http}", skip=one_node),
        Check("pod-to-pod/udp", f"client@{a.name}", f"server-b@{far.name}", a.name,
              f"{{pod_ip[server-b]}}:{UDP_PORT}", protocol="udp"),
        Check("pod-to-clusterip", f"client@{a.name}", f"service/{ECHO_SERVICE}", a.name,
              f"{{cluster_ip}}:{SERVICE_PORT}"),
        Check("pod-to-nodeport", f"client@{a.name}", f"{a.name} nodePort", a.name,
              host_port(a.address, "{node_port}")),
        Check("pod-to-nodeport/cross-node", f"client@{a.name}", f"{far.name} nodePort", a.name,
              host_port(far.address, "{node_port}"), skip=one_node),
        Check("dns", f"client@{a.name}", f"{ECHO_SERVICE}.{namespace}.svc", a.name,
              f"{ECHO_SERVICE}.{namespace}.svc:{SERVICE_PORT}", skip=dns),
        Check("pod-to-host", f"client@{a.name}", f"{a.name} {host_port(a.address, a.kubelet_port)}", a.name,
              host_port(a.address, a.kubelet_port), why=kubelet),
        Check("pod-to-host/cross-node", f"client@{a.name}", f"{far.name} {host_port(far.address, far.kubelet_port)}",
              a.name, host_port(far.address, far.kubelet_port), why=kubelet, skip=one_node),
    ]
    if external:
        host, port = parse_external(external)
        checks.append(Check("egress/external", f"client@{a.name}", external, a.name, host_port(host, port)))
    else:
        checks.append(Check("egress/external", f"client@{a.name}", "outside the cluster",
                            skip="no --external HOST:PORT given"))
    allowed = ((LABEL_ACCESS, "allowed"),)
    checks += [
        Check("policy/deny", f"client@{a.name}", f"guarded@{far.name}", a.name, f"{{pod_ip[guarded]}}:{http}",
              expect=Expect.BLOCKED, labels=allowed, why=f"{DENY_POLICY} selects the server"),
        Check("policy/allow", f"client@{a.name}", f"guarded@{far.name}", a.name, f"{{pod_ip[guarded]}}:{http}",
              stage=Stage.ALLOWED, labels=allowed, why=f"{ALLOW_POLICY} admits {LABEL_ACCESS}=allowed"),
    ]
    return Plan(namespace=namespace, image=image, nodes=tuple(nodes[:2]), ignored=tuple(ignored or ()),
                checks=tuple(checks))


# ------------------------------------------------------------------ manifests
def _meta(name: str, **labels: str) -> dict:
    return {"name": name, "labels": {LABEL_OWNER: OWNER, **labels}}


def namespace_object(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(name)}


def server_pod(name: str, node: Node, *, image: str, role: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(name, **{LABEL_ROLE: role}),
            "spec": {"nodeName": node.name, "terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "netexec", "image": image,
                                     "args": ["netexec", f"--http-port={HTTP_PORT}", f"--udp-port={UDP_PORT}"],
                                     "ports": [{"containerPort": HTTP_PORT, "name": "http"},
                                               {"containerPort": UDP_PORT, "name": "udp", "protocol": "UDP"}],
                                     "securityContext": _SECURITY,
                                     "readinessProbe": {"tcpSocket": {"port": HTTP_PORT}, "periodSeconds": 1}}]}}


def service(name: str, kind: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": _meta(name),
            "spec": {"type": kind, "selector": {LABEL_ROLE: "echo"},
                     "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": HTTP_PORT, "protocol": "TCP"}]}}


def deny_policy() -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(DENY_POLICY),
            "spec": {"podSelector": {"matchLabels": {LABEL_ROLE: "guarded"}}, "policyTypes": ["Ingress"]}}


def allow_policy() -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": _meta(ALLOW_POLICY),
            "spec": {"podSelector": {"matchLabels": {LABEL_ROLE: "guarded"}}, "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"podSelector": {"matchLabels": {LABEL_ACCESS: "allowed"}}}],
                                  "ports": [{"port": HTTP_PORT, "protocol": "TCP"}]}]}}


def client_pod(name: str, check: Check, *, image: str) -> dict:
    args = ["connect", check.target, f"--timeout={CONNECT_TIMEOUT}s", f"--protocol={check.protocol}"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _meta(name, **{LABEL_ROLE: "client"}, **dict(check.labels)),
            "spec": {"nodeName": check.node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "activeDeadlineSeconds": 300,
                     "containers": [{"name": "connect", "image": image, "args": args,
                                     "securityContext": _SECURITY}]}}


def client_name(check: Check, attempt: int) -> str:
    """A pod name (DNS label) from the check's name and the attempt."""
    return f"{re.sub(r'[^a-z0-9]+', '-', check.name).strip('-')}-{attempt}"
