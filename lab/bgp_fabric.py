"""`--mode bgp`: the lab's BGP fabric, one top-of-rack router per segment running BIRD 2.

`physical.build_tors` wires the ToR namespaces; this module gives each its BIRD (configuration
from `tor_bird.py`'s typed values, its own control socket, config and log under
`<workdir>/bgp/tor<k>/`, started with `-f` as a lab process so `lab down` stops it by pid),
reloads it (`birdc configure`), and reads its sessions back (`birdc show protocols`). The nodes'
side is the agent's (`--backend bgp`): every node peers with its segment's ToR, which
`topology_configmap` tells the agents (the topology ConfigMap, peers per underlay subnet).
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from ipaddress import IPv4Network

from lab import physical
from lab.processes import Processes, process_alive, tail
from lab.state import LabError, LabState
from lab.tor_bird import FabricPeer, TorConfig, render_tor_config, tor_asn
from netagent.kernel import namespaces

CLUSTER_ASN = 64512          # the nodes' AS (the agents' topology ConfigMap says so)
BIRDC_TIMEOUT = 30.0


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


def parse_protocols(text: str) -> list:
    """`birdc show protocols` -> the BGP ones: name, state, since, info (Established, Active, ...)."""
    sessions = []
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 5 and words[1] == "BGP":
            sessions.append({"name": words[0], "state": words[3], "since": words[4],
                             "info": " ".join(words[5:])})
    return sessions


class BgpFabric:
    """The ToRs of one lab: build, start, reload, read, remove."""

    def __init__(self, state: LabState, processes: Processes) -> None:
        self.state = state
        self.processes = processes

    @property
    def tors(self) -> list:
        return [TorState(**tor) for _, tor in sorted(self.state.tors.items())]

    def build(self, *, cluster_cidr: IPv4Network) -> None:
        """The ToR namespaces, their links and their BIRDs (running, not yet peered)."""
        names = {segment: f"{self.state.prefix}-tor{segment}" for segment in range(1, self.state.segments + 1)}
        for segment, netns in names.items():
            self.state.tors[str(segment)] = vars(TorState(
                segment=segment, netns=netns, address=str(physical.tor_address(segment)), asn=tor_asn(segment),
                directory=os.path.join(self.state.workdir, "bgp", f"tor{segment}")))
        physical.build_tors(switch=self.state.switch, tors=names)
        for tor in self.tors:
            self._write_config(tor, cluster_cidr=cluster_cidr)
            self._start(tor)

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
                entry["sessions"] = parse_protocols(birdc(tor.netns, tor.socket, "show", "protocols"))
            except (LabError, OSError, subprocess.SubprocessError) as error:
                entry["error"] = str(error)
            found.append(entry)
        return found

    def down(self) -> None:
        """Stop every ToR's BIRD and remove its namespace; safe to repeat."""
        for tor in self.tors:
            self.processes.kill(tor.bird_pid)
            namespaces.remove(tor.netns)
