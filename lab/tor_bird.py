"""The lab's top-of-rack routers as BGP speakers: their typed configuration and its BIRD text (pure).

In `--mode bgp` each segment has a ToR router (`bgp_fabric.py` builds it) running BIRD 2. Its
design, chosen so that the nodes' side stays exactly what the product renders for any cluster:

- eBGP everywhere: the nodes keep the cluster's one AS (the agent's configuration), each ToR
  has an AS of its own (`TOR_AS_BASE` + segment), the ToRs peer with each other over a
  point-to-point fabric link. eBGP passes routes on without route-reflection rules, sets the
  next hop to the ToR for routes from the other segment and keeps a same-segment node's own
  address as next hop (BIRD's third-party next hop on a shared subnet), so traffic within a
  segment goes straight from node to node and only cross-segment traffic takes the ToRs.
- the ToR accepts any node of its segment with no reconfiguration: one `neighbor range` (BIRD's
  dynamic BGP) over the segment's subnet; the node connects (the ToR is passive to them), so a
  node added to the lab needs nothing on the ToR, and a removed one's session and routes go.
- the nodes share one AS, so a route from another node carries that AS in its path and a node's
  BIRD would drop it as a loop: the product's external sessions say `allow local as`, and the
  ToR also removes the cluster's AS from the paths it sends to nodes (`bgp_path.delete`, what a
  data-centre ToR does with "as-override"), so either side alone suffices.
- import filters are exact, never accept-all: from nodes only prefixes inside the cluster CIDR
  (a /16../32 of it), from the other ToR the same.

Why the lab renders this itself rather than through the product's `render_bird_config`: that
renderer's model is a node (it announces its own CIDRs, accepts an exact list per peer, exports
into the agent's table); a transit router with dynamic neighbours and path rewriting is not a
node, and the product has no use for one. The values here are typed and checked with the
product's own validators (`check_as_number`, `Timers`, `Bfd`) and rendered from those types only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from ipaddress import IPv4Address, IPv4Network

from netagent.noderoutes.bgp.bird_config import bfd_timing
from netagent.noderoutes.bgp.model import Bfd, BgpConfigError, Timers, check_as_number

TOR_AS_BASE = 65000          # ToR of segment k: AS 65000 + k (private range)
HEADER = "# The lab's top-of-rack router (lab/tor_bird.py); rewritten by the lab. Do not edit.\n"


def tor_asn(segment: int) -> int:
    return check_as_number(TOR_AS_BASE + segment, what="ToR AS number")


@dataclass(frozen=True)
class FabricPeer:
    """Another ToR across the fabric link."""
    address: IPv4Address
    asn: int
    local_address: IPv4Address      # our end of the link to it

    def __post_init__(self) -> None:
        if not isinstance(self.address, IPv4Address) or not isinstance(self.local_address, IPv4Address):
            raise BgpConfigError("fabric peer addresses must be IPv4Address values")
        check_as_number(self.asn, what="fabric peer AS number")


@dataclass(frozen=True)
class TorConfig:
    """One ToR's BIRD: who it is, which segment's nodes it accepts, its fabric peers."""
    router_id: IPv4Address          # also its address on the segment (the nodes' peer address)
    asn: int
    segment: IPv4Network            # nodes connect from here (dynamic neighbours)
    node_asn: int                   # the cluster's AS: the nodes' side of every node session
    cluster_cidr: IPv4Network       # pod CIDRs are inside it: all a ToR accepts
    fabric: tuple = ()              # FabricPeer, ...
    timers: Timers = field(default_factory=Timers)
    bfd: Bfd | None = None          # set: BFD on every session

    def __post_init__(self) -> None:
        if not isinstance(self.router_id, IPv4Address) or self.router_id not in self.segment:
            raise BgpConfigError(f"ToR address {self.router_id!r} must be an IPv4Address in {self.segment}")
        if not isinstance(self.segment, IPv4Network) or not isinstance(self.cluster_cidr, IPv4Network):
            raise BgpConfigError("segment and cluster CIDR must be IPv4Network values")
        check_as_number(self.asn, what="ToR AS number")
        check_as_number(self.node_asn, what="cluster AS number")
        if self.asn == self.node_asn:
            raise BgpConfigError(f"ToR AS {self.asn} must differ from the cluster's (eBGP to the nodes)")
        if not isinstance(self.fabric, tuple) or not all(isinstance(p, FabricPeer) for p in self.fabric):
            raise BgpConfigError("fabric must be a tuple of FabricPeer")
        if not isinstance(self.timers, Timers) or not (self.bfd is None or isinstance(self.bfd, Bfd)):
            raise BgpConfigError("timers must be Timers, bfd a Bfd or None")


def _session_lines(config: TorConfig) -> list:
    timers = config.timers
    lines = [f"  hold time {int(timers.hold)};", f"  keepalive time {int(timers.keepalive)};",
             f"  connect retry time {int(timers.connect_retry)};",
             f"  connect delay time {int(timers.connect_delay)};", "  direct;"]
    if config.bfd is not None:
        lines.append("  bfd on;")
    return lines


def render_tor_config(config: TorConfig) -> str:
    """The whole BIRD configuration of one ToR (pure; same input, same text)."""
    if not isinstance(config, TorConfig):
        raise TypeError(f"not a TorConfig: {config!r}")
    cluster = IPv4Network(config.cluster_cidr)
    accept = f"[ {cluster}{{{cluster.prefixlen},32}} ]"
    lines = [HEADER.rstrip("\n"), f"router id {config.router_id};",
             "log stderr { info, remote, warning, error, auth, fatal, bug };",
             "timeformat protocol iso long;", "",
             "protocol device device1 {", "  scan time 10;", "}", "",
             "protocol kernel kernel4 {", "  ipv4 { import none; export where source = RTS_BGP; };", "  learn off;",
             "}", "",
             "filter pod_cidrs {", f"  if net ~ {accept} then accept;", "  reject;", "}", "",
             "filter to_nodes {",
             f"  if source = RTS_BGP && net ~ {accept} then {{ bgp_path.delete({int(config.node_asn)}); accept; }}",
             "  reject;", "}", ""]
    if config.bfd is not None:
        lines += ["protocol bfd bfd1 {", f'  interface "*" {{ {bfd_timing(config.bfd)} }};', "}", ""]
    lines += ["protocol bgp nodes {", f"  local {config.router_id} as {int(config.asn)};",
              f"  neighbor range {config.segment} as {int(config.node_asn)};", '  dynamic name "node";',
              *_session_lines(config),
              "  ipv4 { import filter pod_cidrs; export filter to_nodes; };", "}", ""]
    for number, peer in enumerate(config.fabric, start=1):
        lines += [f"protocol bgp fabric{number} {{", f"  local {peer.local_address} as {int(config.asn)};",
                  f"  neighbor {peer.address} as {int(peer.asn)};", *_session_lines(config),
                  "  ipv4 { import filter pod_cidrs; export where source = RTS_BGP; };", "}", ""]
    return "\n".join(lines).rstrip("\n") + "\n"
