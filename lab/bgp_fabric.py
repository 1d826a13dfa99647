"""`--mode bgp`: the lab's BGP fabric, one top-of-rack router per segment running BIRD 2.

`physical.build_tors` wires the ToR namespaces; this module gives each its BIRD (configuration
from `tor_bird.py`'s typed values, its own control socket, config and log under
`<workdir>/bgp/tor<k>/`, started with `-f` as a lab process so `lab down` stops it by pid),
reloads it (`birdc configure`), and reads its sessions back (`birdc show protocols all`, parsed by the product's `bgp/status.py`). The nodes'
side is the agent's (`--backend bgp`): every node peers with its segment's ToR, which
`topology_configmap` tells the agents (the topology ConfigMap, peers per underlay subnet).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from ipaddress import IPv4Network, IPv6Network

from lab import physical
from lab.apiclient import LabApiClient
from lab.processes import Processes, process_alive, tail
from lab.state import LabError, LabState
from lab.tor_bird import FabricPeer, TorConfig, render_tor_config, tor_asn
from netagent.kernel import namespaces
from netagent.kube.resources import CONFIG_MAPS
from netagent.noderoutes.bgp.status import parse_protocols
from netagent.noderoutes.bgp.topology import DEFAULT_AS
from netagent.noderoutes.routing.model import Mode

MODE = Mode.BGP.value        # the lab's --mode (the agents' --backend) that builds a fabric
CLUSTER_ASN = DEFAULT_AS     # the nodes' AS (the agents' topology ConfigMap says so)
TOPOLOGY_CONFIGMAP = ("kube-system", "netagent-bgp")   # the agents' --bgp-config
BIRDC_TIMEOUT = 30.0
ROUTED_TIMEOUT = 180.0       # sessions start within seconds; generous for a loaded machine


@dataclass
class TorState:
    segment: int
    netns: str
    address: str
    asn: int
    directory: str               # its config, control socket and log
    bird_pid: int | None = None

    @property
    def socket(self) -> str:
        return os.path.join(self.directory, "bird.ctl")

    @property
    def config_path(self) -> str:
        return os.path.join(self.directory, "bird.conf")

    @property
    def log(self) -> str:
        return os.path.join(self.directory, "bird.log")


def tor_config(state: LabState, segment: int, *, cluster_cidr: IPv4Network) -> TorConfig:
    """What the ToR of `segment` runs, from the lab's shape alone."""
    fabric = tuple(FabricPeer(address=physical.fabric_address(other), asn=tor_asn(other),
                              local_address=physical.fabric_address(segment))
                   for other in range(1, state.segments + 1) if other != segment)
    return TorConfig(router_id=physical.tor_address(segment), asn=tor_asn(segment),
                     segment=physical.segment_network(segment), node_asn=CLUSTER_ASN, cluster_cidr=cluster_cidr,
                     fabric=fabric)


def birdc(netns: str, socket: str, *argv: str) -> str:
    """One `birdc` command against the BIRD at `socket`; its output (LabError if it fails)."""
    done = namespaces.run_in(netns, ["birdc", "-s", socket, *argv], timeout=BIRDC_TIMEOUT)
    if done.returncode != 0:
        raise LabError(f"birdc {' '.join(argv)} on {socket}: {done.stdout}{done.stderr}")
    return done.stdout


class BgpFabric:
    """The ToRs of one lab: build, start, reload, read, remove."""

    def __init__(self, state: LabState, processes: Processes) -> None:
        self.state = state
        self.processes = processes

    @property
    def tors(self) -> list:
        return [TorState(**tor) for _, tor in sorted(self.state.tors.items())]

    def build(self, *, cluster_cidr: IPv4Network | IPv6Network) -> None:
        """The ToR namespaces, their links and their BIRDs (running, not yet peered)."""
        if not isinstance(cluster_cidr, IPv4Network):
            raise LabError(f"bgp mode: the lab's fabric is IPv4; cluster CIDR {cluster_cidr}")
        names = {segment: f"{self.state.prefix}-tor{segment}" for segment in range(1, self.state.segments + 1)}
        for segment, netns in names.items():
            self.state.tors[str(segment)] = vars(TorState(
                segment=segment, netns=netns, address=str(physical.tor_address(segment)), asn=tor_asn(segment),
                directory=os.path.join(self.state.workdir, "bgp", f"tor{segment}")))
        physical.build_tors(switch=self.state.switch, tors=names)
        for tor in self.tors:
            self._write_config(tor, cluster_cidr=cluster_cidr)
            self._start(tor)

    def publish_topology(self, api: LabApiClient) -> None:
        """The topology ConfigMap into the lab's API server, before any agent starts."""
        config = self.topology_configmap()
        api.request("POST", CONFIG_MAPS.list_path(config["metadata"]["namespace"]), body=config)

    def topology_configmap(self) -> dict:
        """The agents' topology: the cluster's AS, no node-to-node mesh, and per underlay subnet
        its ToR as the external peer (so a node learns its peer from where it is plugged)."""
        peers = [{"address": tor.address, "as": tor.asn, "subnet": str(physical.segment_network(tor.segment))}
                 for tor in self.tors]
        namespace, name = TOPOLOGY_CONFIGMAP
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"namespace": namespace, "name": name},
                "data": {"asNumber": str(CLUSTER_ASN), "nodeToNodeMesh": "false",
                         "externalPeers": json.dumps(peers)}}

    def agent_arguments(self, node_dir: str) -> list:
        """What an agent on a node of this lab runs with, besides `--backend bgp`."""
        # the flags say what the ConfigMap says: an agent may configure BIRD before it has read the
        # ConfigMap, and should not start with mesh peers it drops a moment later (a peer dropped
        # while a restarted BIRD recovers (-R) holds every learnt route for the recovery's wait)
        return ["--bgp-state-dir", node_bird_dir(node_dir), "--bgp-config", "/".join(TOPOLOGY_CONFIGMAP),
                "--bgp-as", str(CLUSTER_ASN), "--bgp-mesh", "off"]

    def _write_config(self, tor: TorState, *, cluster_cidr: IPv4Network) -> None:
        os.makedirs(tor.directory, exist_ok=True)
        text = render_tor_config(tor_config(self.state, tor.segment, cluster_cidr=cluster_cidr))
        with open(tor.config_path + ".tmp", "w") as f:
            f.write(text)
        os.replace(tor.config_path + ".tmp", tor.config_path)

    def _start(self, tor: TorState) -> None:
        pid = self.processes.spawn(tor.netns, ["bird", "-f", "-s", tor.socket, "-c", tor.config_path], tor.log)
        self.state.tors[str(tor.segment)]["bird_pid"] = pid
        deadline = time.monotonic() + BIRDC_TIMEOUT
        while not os.path.exists(tor.socket):
            if not process_alive(pid) or time.monotonic() > deadline:
                raise LabError(f"BIRD on the ToR of segment {tor.segment} did not start:\n{tail(tor.log)}")
            time.sleep(0.05)

    def sessions(self) -> list:
        """Each ToR with its BGP sessions (from its BIRD), or why they could not be read."""
        found = []
        for tor in self.tors:
            entry = {"segment": tor.segment, "netns": tor.netns, "address": tor.address, "asn": tor.asn,
                     "socket": tor.socket, "running": process_alive(tor.bird_pid)}
            try:
                entry["sessions"] = [session.as_dict() for session in
                                     parse_protocols(birdc(tor.netns, tor.socket, "show", "protocols", "all"))]
            except (LabError, OSError, subprocess.SubprocessError) as error:
                entry["error"] = str(error)
            found.append(entry)
        return found

    def down(self, node_dirs: list) -> None:
        """Stop every ToR's BIRD and remove its namespace, and any BIRD an agent left on a node
        (`node_dirs`); safe to repeat."""
        for node_dir in node_dirs:
            kill_node_bird(node_dir)
        for tor in self.tors:
            self.processes.kill(tor.bird_pid)
            namespaces.remove(tor.netns)


# ---------------------------------------------------------------- the nodes' BIRDs (the agents')
def node_bird_dir(node_dir: str) -> str:
    """The agent's `--bgp-state-dir` on a lab node: its BIRD's config, socket, pid file, log."""
    return os.path.join(node_dir, "bird")


def node_sessions(netns: str, node_dir: str) -> list:
    """The node's BGP sessions, read from its BIRD's control socket (as `netagent status bgp`)."""
    text = birdc(netns, os.path.join(node_bird_dir(node_dir), "bird.ctl"), "show", "protocols", "all")
    return [session.as_dict() for session in parse_protocols(text)]


def wait_routed(nodes: list, *, timeout: float = ROUTED_TIMEOUT) -> None:
    """Until every node of `nodes` ((netns, pod CIDR), ...) routes to every other one's pod CIDR:
    a bgp lab is up when its routes are, which takes the sessions' start (seconds), not only the
    agents' first sync (what `wait_for_agent` waits for)."""
    pending = {(netns, cidr) for netns, _ in nodes for other, cidr in nodes if other != netns}
    deadline = time.monotonic() + timeout
    while pending:
        for netns in {netns for netns, _ in pending}:
            done = namespaces.run_in(netns, ["ip", "-j", "route", "show"], timeout=BIRDC_TIMEOUT)
            routed = {route.get("dst") for route in json.loads(done.stdout or "[]")}
            pending = {(n, cidr) for n, cidr in pending if n != netns or cidr not in routed}
        if pending and time.monotonic() > deadline:
            raise LabError(f"BGP routes still missing after {timeout:.0f} s: "
                           + ", ".join(f"{cidr} on {netns}" for netns, cidr in sorted(pending)[:8]))
        if pending:
            time.sleep(0.1)


def node_status(netns: str, node_dir: str) -> dict:
    """`lab status`'s view of a node's BGP: its sessions, or why they could not be read."""
    try:
        return {"sessions": node_sessions(netns, node_dir)}
    except (LabError, OSError, subprocess.SubprocessError) as error:
        return {"error": str(error)}


def describe(entry: dict) -> str:
    """One line of `lab status` for a node's or ToR's BGP: each session's neighbour and state."""
    if "error" in entry:
        return f"sessions unknown ({entry['error'].strip().splitlines()[-1] if entry['error'].strip() else 'error'})"
    sessions = entry.get("sessions") or []
    return ", ".join(f"{s['name']} {s['neighbor'] or '(range)'} {s['bgpState'] or s['state']}" for s in sessions) \
        or "no sessions"


def withdraw_node(netns: str, node_dir: str) -> None:
    """Before a node leaves: its BIRD says goodbye (`birdc down`: a Cease to every peer), so its
    ToR and peers withdraw its routes now rather than after the graceful-restart time. Quiet
    when no BIRD answers (the agent already stopped)."""
    socket = os.path.join(node_bird_dir(node_dir), "bird.ctl")
    if os.path.exists(socket):
        namespaces.run_in(netns, ["birdc", "-s", socket, "down"], timeout=BIRDC_TIMEOUT)


def kill_node_bird(node_dir: str) -> None:
    """A BIRD an agent left (an agent killed with -9 leaves its child running): killed by its pid file."""
    with contextlib.suppress(OSError, ValueError):
        with open(os.path.join(node_bird_dir(node_dir), "bird.pid")) as f:
            pid = int(f.read().strip())
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "bird":
                return
        os.kill(pid, signal.SIGKILL)
