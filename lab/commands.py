"""`netagent lab ...`: the scriptable front of `LabCluster`.

    netagent lab                      the demo: a 3-node cluster, pods on each, cross-node pings, removed
    netagent lab up --nodes N --mode M [--segments 1|2] [--pods-per-node K] [--proxy-mode iptables|ipvs|ebpf|nftables|none]
                    [--ip-family ipv4|ipv6|dual]   (so does the demo: `netagent lab demo --ip-family dual`)
                                      build it and leave it running (--mode bgp: a BIRD top-of-rack
                                      router per segment, every agent peering with its own)
    netagent lab up --kubernetes [--nodes N] [--mode vxlan|host-gw|bgp] [--proxy-mode iptables|nftables|ebpf]
                                      a real Kubernetes (lab/kubernetes/), netagent installed with kubectl
    netagent lab status [--json]      nodes, pods, agents, services and their endpoints
    netagent lab exec POD -- CMD...   run a command in a pod (or node, "internet", "router")
    netagent lab node add [--name N] [--segment S] | node remove NAME
    netagent lab pod add NAME [--node NODE] [--labels k=v,...] [--ports name=port[/proto],...] [--namespace NS]
    netagent lab pod ready NAME --ready true|false       flip its Ready condition
    netagent lab pod remove NAME [--grace S]             terminating (still serving) S seconds, then gone
    netagent lab apply -f FILE.yaml | delete -f FILE.yaml    Services, EndpointSlices, Namespaces ("-" = stdin)
    netagent lab kubeconfig [--inside] [-o FILE]   a kubeconfig for kubectl: from this host (loopback,
                                      the default context) or from inside the lab (--inside)
    netagent lab down                 remove everything

One lab at a time lives in the state directory (`--state-dir`, default /run/netagent-lab);
every command loads it from there, so the lab survives between commands.
"""
from __future__ import annotations

import argparse
import typing
import json
import os
import subprocess
import sys
import time

import yaml

from lab import bgp_fabric, manifests, physical
from lab.cluster import MODES, LabCluster
from lab.demo_service import demo_service
from lab.kubeconfig import render_kubeconfig
from lab.pod_objects import PodSpecError, parse_ports
from lab.service_status import describe_service
from lab.state import IP_FAMILIES, LabError
from netagent.kernel.families import IpFamily
from proxy.backend import NO_PROXY, PROXY_MODE_CHOICES

if typing.TYPE_CHECKING:
    from lab.kubernetes.cluster import KubernetesLab

DEFAULT_STATE_DIR = os.environ.get("NETAGENT_LAB_DIR", "/run/netagent-lab")


def add_lab_arguments(lab: argparse.ArgumentParser) -> None:
    lab.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="where a running lab keeps its state")
    lab.set_defaults(func=_cmd_demo, nodes=3, mode="vxlan", segments=1, pods_per_node=2, auto_encap="vxlan",
                     proxy_mode="iptables", network_policy=False, agent_image=None, manifest=None,
                     pod_status_delay=0.0, ip_family="ipv4")
    sub = lab.add_subparsers(dest="lab_command")

    def cluster_shape(p: argparse.ArgumentParser, *, pods: int) -> None:
        p.add_argument("--nodes", type=int, default=3)
        p.add_argument("--mode", choices=MODES, default="vxlan")
        p.add_argument("--segments", type=int, choices=[1, 2], default=1)
        p.add_argument("--pods-per-node", type=int, default=pods)
        p.add_argument("--auto-encap", choices=["vxlan", "ipip"], default="vxlan")
        p.add_argument("--proxy-mode", choices=PROXY_MODE_CHOICES, default="iptables",
                       help="the agents' service proxy (none: the agents run without one)")
        p.add_argument("--network-policy", action="store_true",
                       help="the agents enforce NetworkPolicies (apply them with `lab apply -f`)")
        p.add_argument("--pod-status-delay", type=float, default=0.0, metavar="SECONDS",
                       help="the lab's kubelet reports a new pod's address in its status this long after "
                            "the CNI ADD, as a loaded kubelet would (default 0: at once)")
        p.add_argument("--ip-family", choices=list(IP_FAMILIES), default="ipv4",
                       help="the families of pods and Services: ipv4 (the default), ipv6, or dual (IPv4 "
                            "primary); the nodes' wires carry IPv6 too unless ipv4")
        p.add_argument("--agent-image", metavar="IMAGE",
                       help="run each node's agent from this local image (scripts/build-image) as the "
                            "DaemonSet in --manifest says, with podman, as the kubelet would")
        p.add_argument("--manifest", metavar="FILE", help="the DaemonSet manifest for --agent-image "
                                                          "(default: the checkout's deploy/netagent.yaml)")

    demo = sub.add_parser("demo", help="build a cluster, show cross-node traffic, remove it (the default)")
    cluster_shape(demo, pods=2)
    demo.set_defaults(func=_cmd_demo)
    up = sub.add_parser("up", help="build a cluster and leave it running")
    cluster_shape(up, pods=0)
    up.add_argument("--kubernetes", action="store_true",
                    help="a real Kubernetes (built by scripts/build-kubernetes): kube-apiserver, controller "
                         "manager, scheduler, a containerd and kubelet per node, netagent applied as the "
                         "DaemonSet, CoreDNS; drive it with kubectl (`lab kubeconfig`)")
    up.set_defaults(func=_cmd_up)
    status = sub.add_parser("status", help="show the running lab")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=_cmd_status)
    run = sub.add_parser("exec", help="run a command in a pod or node: lab exec POD -- CMD...")
    run.add_argument("target")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    run.set_defaults(func=_cmd_exec)
    kubeconfig = sub.add_parser("kubeconfig", help="print (or write) a kubeconfig for kubectl against the lab")
    kubeconfig.add_argument("--inside", action="store_true",
                            help="make the in-lab address current (for kubectl run in a node or pod)")
    kubeconfig.add_argument("-o", "--output", metavar="FILE", help="write it here instead of printing it")
    kubeconfig.set_defaults(func=_cmd_kubeconfig)
    down = sub.add_parser("down", help="remove the lab")
    down.set_defaults(func=_cmd_down)

    node = sub.add_parser("node", help="add or remove a node").add_subparsers(dest="node_command", required=True)
    node_add = node.add_parser("add")
    node_add.add_argument("--name")
    node_add.add_argument("--segment", type=int, default=1)
    node_add.set_defaults(func=_cmd_node_add)
    node_remove = node.add_parser("remove")
    node_remove.add_argument("name")
    node_remove.set_defaults(func=_cmd_node_remove)

    pod = sub.add_parser("pod", help="add or remove a pod, or set its readiness").add_subparsers(
        dest="pod_command", required=True)
    pod_add = pod.add_parser("add")
    pod_add.add_argument("name")
    pod_add.add_argument("--node")
    pod_add.add_argument("--labels", default="", help="k=v,k2=v2")
    pod_add.add_argument("--ports", default="", help="named container ports: http=8080,dns=53/UDP")
    pod_add.add_argument("--namespace", default="default")
    pod_add.set_defaults(func=_cmd_pod_add)
    pod_ready = pod.add_parser("ready", help="set the pod's Ready condition")
    pod_ready.add_argument("name")
    pod_ready.add_argument("--ready", required=True, choices=["true", "false"])
    pod_ready.set_defaults(func=_cmd_pod_ready)
    pod_remove = pod.add_parser("remove")
    pod_remove.add_argument("name")
    pod_remove.add_argument("--grace", type=int, default=0, metavar="SECONDS",
                            help="terminate gracefully: terminating (still serving) this long, then removed")
    pod_remove.set_defaults(func=_cmd_pod_remove)

    for verb, func, text in (("apply", _cmd_apply, "create or update objects from manifests"),
                             ("delete", _cmd_delete, "delete the objects a manifest names")):
        command = sub.add_parser(verb, help=f"{text} (Service, EndpointSlice, Namespace, NetworkPolicy)")
        command.add_argument("-f", "--filename", required=True, metavar="FILE", help="YAML or JSON; - for stdin")
        command.set_defaults(func=func)


def parse_labels(text: str) -> dict:
    labels = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise LabError(f"label {item!r}: expected key=value")
        labels[key] = value
    return labels


def run_lab_command(args) -> int:
    if os.geteuid() != 0:
        print("netagent lab: needs root (it builds network namespaces)", file=sys.stderr)
        return 1
    try:
        return args.func(args)
    except LabError as exc:
        print(f"netagent lab: {exc}", file=sys.stderr)
        return 1


def _load(args) -> LabCluster:
    lab = _load_any(args)
    if not isinstance(lab, LabCluster):
        raise LabError("this lab runs a real Kubernetes: drive it with kubectl (`netagent lab kubeconfig`)")
    return lab


def _load_any(args) -> LabCluster | KubernetesLab:
    lab = LabCluster.load(args.state_dir)
    if lab.state.kubernetes is None:
        return lab
    from lab.kubernetes.cluster import KubernetesLab  # the real cluster's modules only when one runs
    return KubernetesLab.load(lab.state)


def print_kubernetes_status(status: dict) -> None:
    from lab.kubernetes.cluster import print_status
    print_status(status)


def _create(args, *, workdir: str | None) -> LabCluster:
    return LabCluster.create(nodes=args.nodes, mode=args.mode, segments=args.segments,
                             pods_per_node=args.pods_per_node, auto_encap=args.auto_encap, workdir=workdir,
                             proxy_mode=args.proxy_mode, network_policy=args.network_policy,
                             agent_image=args.agent_image, manifest=args.manifest,
                             pod_status_delay=args.pod_status_delay, ip_family=args.ip_family)


def _cmd_up(args) -> int:
    if os.path.exists(os.path.join(args.state_dir, "state.json")):
        raise LabError(f"a lab is already up in {args.state_dir}; `netagent lab down` first")
    started = time.monotonic()
    if getattr(args, "kubernetes", False):
        from lab.kubernetes.cluster import KubernetesLab
        kube = KubernetesLab.create(nodes=args.nodes, mode=args.mode, proxy_mode=args.proxy_mode,
                                    workdir=args.state_dir)
        print(f"netagent lab: Kubernetes {kube.kube.version}, {args.nodes} node(s), {args.mode} mode, "
              f"up in {time.monotonic() - started:.1f} s; state in {args.state_dir}")
        print_kubernetes_status(kube.status())
        return 0
    lab = _create(args, workdir=args.state_dir)
    print(f"netagent lab: {args.nodes} node(s), {args.mode} mode, {args.segments} segment(s), up in "
          f"{time.monotonic() - started:.1f} s; state in {args.state_dir}")
    _print_status(lab.status())
    return 0


def _print_status(status: dict) -> None:
    api = status["apiServer"]
    from_host = f", {api['hostUrl']} from this host (`netagent lab kubeconfig`)" if api.get("hostUrl") else ""
    print(f"  API server {api['url']}{from_host} ({'running' if api['running'] else 'STOPPED'})")
    for node in status["nodes"]:
        address = ",".join(filter(None, (node["address"], node.get("address6"))))
        print(f"  node {node['name']:<10} {address:<14} segment {node['segment']}  podCIDR "
              f"{','.join(node['podCIDRs']):<15} agent {'running' if node['agent']['running'] else 'STOPPED'}")
        if "bgp" in node:
            print(f"       bgp: {bgp_fabric.describe(node['bgp'])}")
    for tor in status.get("tors") or []:
        print(f"  tor  segment {tor['segment']} {tor['address']:<14} AS {tor['asn']}  bgp: {bgp_fabric.describe(tor)}")
    for pod in status["pods"]:
        labels = ",".join(f"{k}={v}" for k, v in pod["labels"].items())
        state = {True: "", False: " NOT-READY", None: ""}[pod.get("ready")]
        state += " TERMINATING" if pod.get("terminating") else ""
        namespace = "" if pod.get("namespace", "default") == "default" else f"{pod['namespace']}/"
        print(f"  pod  {namespace + pod['name']:<16} on {pod['node']:<10} {','.join(pod['ips']):<14} {labels}{state}")
    for service in status.get("services") or []:
        print(describe_service(service))
    if status["apiServer"].get("error"):
        print(f"  (services unknown: {status['apiServer']['error']})")


def _cmd_status(args) -> int:
    lab = _load_any(args)
    status = lab.status()
    if args.json:
        print(json.dumps(status, indent=1))
    elif not isinstance(lab, LabCluster):
        print_kubernetes_status(status)
    else:
        _print_status(status)
    return 0


def _cmd_exec(args) -> int:
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        raise LabError("nothing to run: lab exec POD -- CMD...")
    return subprocess.run([*_load_any(args).exec_prefix(args.target), *argv]).returncode


def _cmd_kubeconfig(args) -> int:
    lab = _load_any(args)
    if not isinstance(lab, LabCluster):
        with open(lab.admin_kubeconfig if args.inside else lab.host_kubeconfig) as f:
            text = f.read()
    else:
        servers = {"lab-inside": lab.api_url}
        if lab.host_api_url is not None:
            servers = {"lab": lab.host_api_url, **servers}
        text = yaml.safe_dump(render_kubeconfig(servers, current="lab-inside" if args.inside else None),
                              sort_keys=False)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"netagent lab: wrote {args.output}; try KUBECONFIG={args.output} kubectl get nodes", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def _cmd_down(args) -> int:
    _load_any(args).down()
    print("netagent lab: removed")
    return 0


def _cmd_node_add(args) -> int:
    node = _load(args).add_node(name=args.name, segment=args.segment)
    print(f"node {node.name} {node.address} podCIDR {', '.join(node.pod_cidrs or [node.pod_cidr])}")
    return 0


def _cmd_node_remove(args) -> int:
    _load(args).remove_node(args.name)
    print(f"node {args.name} removed")
    return 0


def _cmd_pod_add(args) -> int:
    try:
        ports = parse_ports(args.ports)
    except PodSpecError as error:
        raise LabError(str(error)) from None
    pod = _load(args).add_pod(args.name, node=args.node, labels=parse_labels(args.labels), ports=ports,
                              namespace=args.namespace)
    print(f"pod {pod.name} on {pod.node}: {', '.join(pod.ips or [pod.ip])}")
    return 0


def _cmd_pod_ready(args) -> int:
    ready = args.ready == "true"
    _load(args).set_pod_ready(args.name, ready=ready)
    print(f"pod {args.name} {'ready' if ready else 'not ready'}")
    return 0


def _cmd_pod_remove(args) -> int:
    if args.grace < 0:
        raise LabError("--grace: seconds >= 0")
    lab = _load(args)
    if args.grace:
        lab.terminate_pod(args.name, grace_period=args.grace)
        print(f"pod {args.name} terminating for {args.grace} s", flush=True)
        time.sleep(args.grace)
    lab.finish_pod_removal(args.name)
    print(f"pod {args.name} removed")
    return 0


def _read_manifests(path: str) -> list[dict]:
    try:
        if path == "-":
            text, source = sys.stdin.read(), "<stdin>"
        else:
            with open(path) as f:
                text, source = f.read(), path
    except OSError as error:
        raise LabError(f"cannot read {path}: {error.strerror}") from None
    try:
        return manifests.load_manifests(text, source=source)
    except manifests.ManifestError as error:
        raise LabError(f"{error} (nothing applied)") from None


def _report(outcomes: list) -> int:
    for outcome in outcomes:
        print(outcome.describe(), file=sys.stderr if outcome.failed else sys.stdout)
    return 1 if any(outcome.failed for outcome in outcomes) else 0


def _cmd_apply(args) -> int:
    objects = _read_manifests(args.filename)
    lab = _load(args)
    try:
        return _report(manifests.apply_manifests(lab.api(), objects))
    except OSError as error:
        raise LabError(f"the API server is not reachable at {lab.api_socket}: {error}") from None


def _cmd_delete(args) -> int:
    objects = _read_manifests(args.filename)
    lab = _load(args)
    try:
        return _report(manifests.delete_manifests(lab.api(), objects))
    except OSError as error:
        raise LabError(f"the API server is not reachable at {lab.api_socket}: {error}") from None


def _cmd_demo(args) -> int:
    """A cluster in namespaces, pods pinging across nodes and the internet, then removed."""
    started = time.monotonic()
    print(f"netagent lab: building {args.nodes} nodes ({args.mode}, {args.segments} segment(s)), "
          f"{args.pods_per_node} pods each")
    with _create(args, workdir=None) as lab:
        print(f"  up in {time.monotonic() - started:.1f} s")
        _print_status(lab.status())
        pods = list(lab.state.pods.values())
        checks = [(a.name, ip, f"{b.name} on {b.node}") for a in pods for b in pods if a.node != b.node
                  for ip in b.ips or [b.ip]]
        internet = {IpFamily.V4: physical.INTERNET_HOST, IpFamily.V6: physical.INTERNET6_HOST}
        checks += [(a.name, str(internet[family]), "the internet (masqueraded)") for a in pods[:1]
                   for family in lab.state.families]
        failures = 0
        for source, address, what in checks:
            ok = lab.ping(source, address)
            failures += not ok
            print(f"  ping {source:<16} -> {address:<14} {what:<28} {'ok' if ok else 'FAILED'}")
        print(f"  {len(checks) - failures}/{len(checks)} answered across nodes")
        if lab.state.proxy_mode != NO_PROXY:
            failures += demo_service(lab)
    print("netagent lab: removed")
    return 1 if failures else 0
