"""The `netagent` command line: run, cni install, cleanup, lab.

Each subcommand is a thin layer over a module that owns the work, imported only when the
command runs (`--help` and argument parsing import no such module); this file only parses
arguments and reports errors in one consistent way: a `NetagentError` (the root of every
exception of ours, netagent/errors.py) or an `OSError` from any command is caught once, in
`main`, as a message on stderr and exit code 1; usage errors are argparse's, exit code 2.
"""
from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys

from netagent import __version__
from netagent.cniserver.defaults import DEFAULT_DATA_DIR, DEFAULT_SOCKET
from netagent.errors import NetagentError
from netagent.kernel import owned
from netagent.kernel.pod_attachment import POD_ATTACHMENT_CHOICES, PodAttachment

LAB_HELP = "a cluster of nodes and pods in network namespaces (demo and test bed)"


# what `main` turns into a message and exit code 1: ours, and the system's (a missing file, a
# refused permission), whichever command meets them
COMMAND_ERRORS = (NetagentError, OSError)


def _cmd_run(args) -> int:
    """`netagent run`: its flags parsed once into the daemon's configuration (a bad value is a
    `ConfigError` naming its flag), then nothing reads `args` again. What cannot start is raised
    by run.py (what had started stopped first) and, like a bad value, reported by `main`."""
    from netagent.daemon.config import parse_run_config
    from netagent.daemon.run import run_agent
    return run_agent(parse_run_config(args))


def _subnet(text: str) -> str:
    """`--subnet`: a network, checked while parsing (a usage error otherwise)."""
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _cmd_cni_install(args) -> int:
    from netagent.cniserver import install as cni_install
    paths = cni_install.install(bin_dir=args.bin_dir, conf_dir=args.conf_dir, name=args.name,
                                subnets=args.subnet, mode=PodAttachment(args.mode), bridge=args.bridge,
                                mtu=args.mtu, socket_path=args.socket, data_dir=args.data_dir,
                                shim=args.shim)
    for path in paths:
        print(path)
    return 0


def _cmd_cleanup(args) -> int:
    from netagent.daemon.cleanup import (
        remove_owned_chains,
        remove_owned_links,
        remove_owned_nft_tables,
        remove_owned_routing,
        remove_ebpf_state,
        remove_proxy_state,
    )
    from netagent.daemon.policy_start import remove_policy_state_everywhere
    removed = (remove_ebpf_state(bpf_root=args.bpf_root, cgroup=args.cgroup_root) + remove_proxy_state()
               + remove_policy_state_everywhere())
    removed += [f"interface {name}" for name in remove_owned_links()]
    from netagent.daemon.cleanup import remove_bgp_state
    removed += (remove_bgp_state(args.bgp_state_dir) + remove_owned_routing() + remove_owned_chains()
                + remove_owned_nft_tables())
    for line in removed:
        print(f"removed {line}")
    print(f"{len(removed)} item(s) removed")
    return 0


def _cmd_status_services(args) -> int:
    from netagent.daemon.status_services import status_services
    from netagent.kernel.iptables.backend import BackendChoice
    print(status_services(iptables_backend=BackendChoice(args.iptables_backend), as_json=args.json, bpf_root=args.bpf_root))
    return 0


def _cmd_status_bgp(args) -> int:
    from netagent.daemon.status_bgp import bgp_status, render_bgp_status
    print(render_bgp_status(bgp_status(state_dir=args.bgp_state_dir), as_json=args.json))
    return 0


def _cmd_status_bpf(args) -> int:
    from netagent.daemon.status_bpf import bpf_status, render_bpf_status
    print(render_bpf_status(bpf_status(bpf_root=args.bpf_root, cgroup=args.cgroup_root), as_json=args.json))
    return 0


def _cmd_status_policy(args) -> int:
    from netagent.daemon.status_policy import status_policy
    from netagent.kernel.iptables.backend import BackendChoice
    print(status_policy(pod=args.pod, trace_args=args.trace, iptables_backend=BackendChoice(args.iptables_backend),
                        as_json=args.json))
    return 0


def _cmd_status_html(args) -> int:
    from netagent.daemon.status_page import kernel_page
    from netagent.kernel.iptables.backend import BackendChoice
    page = kernel_page(node=args.node_name or os.uname().nodename, iptables_backend=BackendChoice(args.iptables_backend),
                       bpf_root=args.bpf_root, bgp_state_dir=args.bgp_state_dir)
    if args.html == "-":
        sys.stdout.write(page)
    else:
        with open(args.html, "w", encoding="utf-8") as out:
            out.write(page)
        print(f"wrote {args.html}")
    return 0


def _cmd_flows(args) -> int:
    from netagent.daemon.status_flows import show_flows
    from netagent.infra.flows import FlowFilter, Verdict
    keep = FlowFilter(pod=args.pod or "", namespace=args.namespace or "",
                      verdict=Verdict(args.verdict) if args.verdict else None)
    try:
        return show_flows(args.address, keep, as_json=args.json, follow=args.follow)
    except KeyboardInterrupt:
        return 0


def _cmd_connectivity_test(args) -> int:
    from netagent.daemon.connectivity_plan import DEFAULT_IMAGE
    from netagent.daemon.connectivity_test import Options, main as connectivity_test
    options = Options(timeout=args.timeout, image=args.image or DEFAULT_IMAGE, external=args.external)
    return connectivity_test(kubeconfig=args.kubeconfig, as_json=args.json, options=options)


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds")
    if not 1 <= seconds <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: want 1 to 3600 seconds")
    return seconds


def _cmd_lab(args, lab_argv: list[str]) -> int:
    """`netagent lab ...`: the lab (`lab/`, beside this package: a client of the product, not
    part of it, and not in the image) parses its own arguments; imported only here."""
    try:
        from lab.commands import add_lab_arguments, run_lab_command
    except ModuleNotFoundError as exc:
        if exc.name != "lab":
            raise
        print("netagent lab: the lab is not installed here (it is the checkout's lab/ package; "
              "the image ships the agent only)", file=sys.stderr)
        return 1
    lab = argparse.ArgumentParser(prog="netagent lab")
    add_lab_arguments(lab)
    return run_lab_command(lab.parse_args(lab_argv, namespace=args))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="netagent", description="Kubernetes node network agent")
    parser.add_argument("--version", action="version", version=f"netagent {__version__}")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the node agent")
    from netagent.daemon.run import add_run_arguments
    add_run_arguments(run)
    run.set_defaults(func=_cmd_run)

    cni = sub.add_parser("cni", help="CNI plugin management").add_subparsers(dest="cni_command", required=True)
    install = cni.add_parser("install", help="install the plugin binaries and a network config")
    install.add_argument("--bin-dir", required=True)
    install.add_argument("--conf-dir")
    install.add_argument("--name", default="netagent")
    install.add_argument("--subnet", action="append", default=[], type=_subnet,
                         help="pod subnet (repeat for dual stack)")
    install.add_argument("--mode", choices=POD_ATTACHMENT_CHOICES, default=PodAttachment.BRIDGE.value)
    install.add_argument("--bridge", default=owned.DEFAULT_BRIDGE)
    install.add_argument("--mtu", type=int, default=1500)
    install.add_argument("--socket", default=DEFAULT_SOCKET)
    install.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    install.add_argument("--shim", help="a prebuilt CNI shim to install as `netagent` (default: the "
                                        "project's build/cni-shim/netagent, built when missing or stale)")
    install.set_defaults(func=_cmd_cni_install)

    cleanup = sub.add_parser("cleanup", help="remove every interface, route, device and iptables chain netagent created on this node")
    cleanup.add_argument("--bpf-root", help="also unpin the eBPF proxy's maps under this bpffs directory")
    cleanup.add_argument("--cgroup-root", help="also detach the eBPF proxy's programs from this cgroup")
    cleanup.add_argument("--bgp-state-dir", default=owned.BIRD_STATE_DIR, help="where our BIRD keeps its pid file")
    cleanup.set_defaults(func=_cmd_cleanup)

    status = sub.add_parser("status", help="what netagent has programmed on this node").add_subparsers(
        dest="status_command", required=True)
    services = status.add_parser("services", help="service addresses and their backends, read from the kernel")
    services.add_argument("--json", action="store_true")
    services.add_argument("--iptables-backend", choices=["auto", "legacy", "nft"], default="auto")
    services.add_argument("--bpf-root", help="read the eBPF proxy's maps pinned under this bpffs directory")
    services.set_defaults(func=_cmd_status_services)
    bpf = status.add_parser("bpf", help="the eBPF proxy's programs, attachments and map fill")
    bpf.add_argument("--json", action="store_true")
    bpf.add_argument("--bpf-root", help="the bpffs directory the agent pins its maps in")
    bpf.add_argument("--cgroup-root", help="the cgroup the agent attaches its programs to")
    bpf.set_defaults(func=_cmd_status_bpf)
    bgp = status.add_parser("bgp", help="BGP sessions of our BIRD (--backend bgp): peer, AS, state, routes")
    bgp.add_argument("--json", action="store_true")
    bgp.add_argument("--bgp-state-dir", default=owned.BIRD_STATE_DIR, help="where our BIRD's control socket is")
    bgp.set_defaults(func=_cmd_status_bgp)
    policy = status.add_parser("policy", help="which policies isolate this node's pods, what they allow, what "
                                              "they denied; --trace: would FROM reach TO? (read from the kernel)")
    policy.add_argument("pod", nargs="?", help="ns/name, name or address (default: every isolated pod)")
    policy.add_argument("--trace", nargs=3, metavar=("FROM", "TO", "PORT[/PROTO]"),
                        help="judge a new connection from FROM to TO (pods or addresses)")
    policy.add_argument("--json", action="store_true")
    policy.add_argument("--iptables-backend", choices=["auto", "legacy", "nft"], default="auto")
    policy.set_defaults(func=_cmd_status_policy)
    page = status.add_parser("html", help="this node, its peers, Services, pods' policy and BGP sessions as one HTML "
                                          "page (the agent serves it at /status on its metrics address)")
    page.add_argument("--html", metavar="FILE", default="-", help="write the page here (default: stdout)")
    page.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                      help="this node's name on the page (default: $NODE_NAME, then the host name)")
    page.add_argument("--iptables-backend", choices=["auto", "legacy", "nft"], default="auto")
    page.add_argument("--bpf-root", help="read the eBPF proxy's maps pinned under this bpffs directory")
    page.add_argument("--bgp-state-dir", default=owned.BIRD_STATE_DIR, help="where our BIRD's control socket is")
    page.set_defaults(func=_cmd_status_html)

    flows = sub.add_parser("flows", help="recent flows on this node and their verdicts (policy drops naming the "
                                         "policy), read from the agent")
    flows.add_argument("--pod", help="only flows from or to this pod (ns/name or name)")
    flows.add_argument("--namespace", help="only flows from or to pods of this namespace")
    flows.add_argument("--verdict", choices=["forwarded", "dropped", "translated"])
    flows.add_argument("--follow", "-f", action="store_true", help="then print new flows as they come, until ^C")
    flows.add_argument("--json", action="store_true", help="one JSON object per line")
    flows.add_argument("--address", default="127.0.0.1:10249", metavar="HOST:PORT",
                       help="the agent's metrics address, where it serves /flows (default %(default)s)")
    flows.set_defaults(func=_cmd_flows)

    connectivity = sub.add_parser("connectivity-test", help="check a cluster's network with test pods of its own "
                                                            "(pod to pod, Services, DNS, host, egress, NetworkPolicy)")
    connectivity.add_argument("--kubeconfig", help="the cluster's kubeconfig (default: $KUBECONFIG, then in-cluster)")
    connectivity.add_argument("--image", help="the agnhost image of the servers and clients (default: the one "
                                              "the pinned Kubernetes' e2e suite uses)")
    connectivity.add_argument("--timeout", type=_positive_seconds, default=90.0, metavar="S",
                              help="seconds each stage may take: servers Ready, each check with its retries "
                                   "(default %(default)s)")
    connectivity.add_argument("--external", metavar="HOST:PORT", help="also check egress to this address outside the "
                                                                      "cluster (skipped otherwise)")
    connectivity.add_argument("--json", action="store_true")
    connectivity.set_defaults(func=_cmd_connectivity_test)

    # The lab's own arguments are parsed by _cmd_lab: building this parser never imports it.
    sub.add_parser("lab", help=LAB_HELP, add_help=False)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "lab":
        return _cmd_lab(args, rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        return args.func(args)
    except COMMAND_ERRORS as exc:
        print(f"{_command_name(args)}: {exc}", file=sys.stderr)
        return 1


def _command_name(args) -> str:
    """`netagent status policy`, `netagent cni install`, ...: the words the user typed."""
    words = [args.command, getattr(args, "cni_command", None), getattr(args, "status_command", None)]
    return " ".join(["netagent", *(word for word in words if word)])


if __name__ == "__main__":
    sys.exit(main())
