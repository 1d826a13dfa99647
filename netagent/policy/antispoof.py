"""Anti-spoofing on pod interfaces: a packet a pod sends must carry that pod's own address.

Without it a pod (NET_RAW is a default capability) could send with an allowed pod's source
address and pass another pod's ingress NetworkPolicy, which matches by source address. It is
not NetworkPolicy: the daemon runs it whether `--network-policy` is on or not
(`--pod-anti-spoofing`, on by default; off removes it). Both families, both attachments, both
flavours (nftables with `--proxy-mode nftables`, iptables otherwise); nothing per pod in
routed mode.

- routed mode (the host veth stands alone, a /32 (/128) route to the pod through it): the
  kernel's reverse-path lookup, strict, on packets that come in on a host veth `na<hex>`:
  nft `fib saddr . iif oif missing drop` (table `inet netagent-antispoof`, prerouting at
  priority raw), iptables `-m rpfilter --invert -j DROP` (raw PREROUTING, chain
  `NETAGENT-ANTISPOOF`). Only the pod's own address routes back through its veth, so another
  local pod's (its route is another veth), a remote pod's (the tunnel or gateway) or anyone
  else's (the default route) is dropped, with no rule or element per pod. The lookup ignores
  the destination, and raw prerouting runs before DNAT, so packets to Services pass as any.
- bridge mode (the host veth is a port of `na0`): the bridge holds the whole pod subnet, so a
  reverse-path lookup cannot tell one pod from another; the port can. nftables: table
  `bridge netagent-antispoof` (no br_netfilter needed), prerouting: a port in the set of
  guarded ports must send from an element of `port . address` (`ifname . ipv4_addr`, one
  lookup per packet). iptables: br_netfilter hands bridged packets to raw PREROUTING with the
  port as physdev: one rule per pod and family, `-m physdev --physdev-in <veth> ! -s <its
  address> -j DROP`, in 16 bucket chains by the veth name's first hex digit (about 16 + n/16
  rules walked; an ipset `hash:net,iface` with `physdev:` elements would be one lookup, but
  kernel/ipset/ does not know that type yet). The pod's
  ports and addresses come from the CNI plugin's IPAM store (a reservation file per address
  names its container and interface, whence the host veth's name): the node's own truth,
  nothing the API says. A port the store does not name yet (a pod between its ADD and the
  next rescan, at most `ANTISPOOF_RESCAN` seconds) is not guarded: fail-open for that window.

The nftables flavour only builds its table (`nft_table`: `kernel/nftables/model.py` values,
every rule's comment carrying the digest of its text); rendering, read-back and the differ are
the model's (`render_nft`, `AntiSpoofing.check`).

What always passes: IPv6 from `::` and link-local `fe80::/10` (NDP, MLD: a link-local source
cannot be routed off the link, and no pod is reached by one through the node's routes),
everything that does not come in on a pod's host veth (tunnels, the underlay, the node),
and ARP (not IP; see the report of issue 29 for what remains).
"""
from __future__ import annotations

import ipaddress
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.runner import FlushMode, IptablesRunner
from netagent.kernel.nftables import model, tables, text
from netagent.kernel.nftables.runner import Nft
from netagent.kernel.pod_attachment import PodAttachment

log = logging.getLogger("netagent.policy.antispoof")

NFT_TABLE = owned.NFT_TABLE_PREFIX + "-antispoof"    # `inet` (routed) or `bridge` (bridge mode)
CHAIN = owned.CHAIN_PREFIX + "ANTISPOOF"             # raw PREROUTING jumps here (iptables)
BUCKETS = tuple(f"{CHAIN}-{digit}" for digit in "0123456789abcdef")   # bridge mode: by the veth's first digit
NFT_CHAIN = "PREROUTING"
PORTS_SET = "PORTS"                                  # bridge mode: ports guarded
ALLOWED = {IpFamily.V4: "PODS4", IpFamily.V6: "PODS6"}
PURPOSE = "pod anti-spoofing"
COMMENT = "netagent: " + PURPOSE                     # iptables' rules and jump
ANTISPOOF_RESCAN = 1.0                               # seconds between rescans of the IPAM store
_LINK_LOCAL = ("::/128", "fe80::/10")


@dataclass(frozen=True, order=True)
class PodPort:
    """A pod's host veth and the addresses the pod may send from (one per family)."""
    interface: str
    addresses: tuple[str, ...]

    def of(self, family: IpFamily) -> tuple[str, ...]:
        return tuple(a for a in self.addresses if IpFamily.of(a) is family)


def ports_from_ipam(directory: str, host_veth_name: Callable[[str, str], str]) -> list[PodPort]:
    """Every pod port the IPAM store (one network's directory) names: a file per reserved
    address holding `container-id` and `ifname`; `host_veth_name(container, ifname)` is the
    CNI plugin's naming. Other files (the last reserved address, the lock) are skipped."""
    found: dict[str, list[str]] = {}
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    for name in names:
        try:
            address = str(ipaddress.ip_address(name))
        except ValueError:
            continue
        try:
            with open(os.path.join(directory, name), newline="") as reservation:
                lines = reservation.read().split()
        except OSError:
            continue                 # released while we read
        if lines:
            interface = host_veth_name(lines[0], lines[1] if len(lines) > 1 else "eth0")
            found.setdefault(interface, []).append(address)
    return sorted(PodPort(interface, tuple(sorted(addresses))) for interface, addresses in found.items())


def _valid_port(port: PodPort) -> bool:
    """A host veth name and addresses that can reach rule text (the store is ours, but a
    rule is only ever written from a name and addresses checked here)."""
    name = port.interface
    return (name.startswith(owned.HOST_VETH_PREFIX) and len(name) <= 15
            and all(c in "0123456789abcdef" for c in name[len(owned.HOST_VETH_PREFIX):]))


# ------------------------------------------------------------------- nftables

def nft_table(mode: PodAttachment, ports: Iterable[PodPort]) -> model.Table:
    """The wanted table (`kernel/nftables/model.py` values): `inet` in routed mode, `bridge`
    in bridge mode. Every rule carries a comment with the digest of its text, so the table
    read back is compared rule by rule (`check`)."""
    def rule(statements: str, purpose: str, *, sets: tuple[str, ...] = ()) -> model.Rule:
        return model.digested_rule(statements, purpose, sets=sets)

    link_local = text.element_block(text.network(n) for n in _LINK_LOCAL)
    head = (rule(f"iifname != {text.interface_prefix(owned.HOST_VETH_PREFIX)} accept", "not from a pod"),
            rule(f"iifname {text.interface_prefix(owned.DEVICE_PREFIX)} accept", "not from a pod: our devices"),
            rule(f"iifname {text.interface(owned.DEFAULT_BRIDGE)} accept", "not from a pod: the bridge"))
    if mode is PodAttachment.ROUTED:
        chain = model.Chain(NFT_CHAIN, (*head, rule(f"ip6 saddr {link_local} accept", "IPv6 link-local"),
                                        rule("fib saddr . iif oif missing counter drop", PURPOSE)),
                            model.BaseChain("filter", "prerouting", -300, "raw"))
        return model.Table("inet", NFT_TABLE, (chain,))
    guarded = [p for p in ports if _valid_port(p)]
    sets = [model.Set(PORTS_SET, ("ifname",), (), tuple(model.Element((text.interface(p.interface),))
                                                        for p in guarded))]
    for ip_family, name in ALLOWED.items():
        sets.append(model.Set(name, ("ifname", ip_family.nft_address_type), (),
                              tuple(model.Element((text.interface(p.interface), text.address(a)))
                                    for p in guarded for a in p.of(ip_family))))
    v4, v6 = ALLOWED[IpFamily.V4], ALLOWED[IpFamily.V6]
    chain = model.Chain(NFT_CHAIN, (
        *head, rule(f"iifname != {model.ref(PORTS_SET)} accept", "not a guarded port", sets=(PORTS_SET,)),
        rule(f"meta protocol ip iifname . ip saddr != {model.ref(v4)} counter drop", PURPOSE, sets=(v4,)),
        rule(f"meta protocol ip6 ip6 saddr {link_local} accept", "IPv6 link-local"),
        rule(f"meta protocol ip6 iifname . ip6 saddr != {model.ref(v6)} counter drop", PURPOSE, sets=(v6,))),
        model.BaseChain("filter", "prerouting", -300))
    return model.Table("bridge", NFT_TABLE, (chain,), tuple(sets))


def render_nft(mode: PodAttachment, ports: Iterable[PodPort]) -> str:
    """One transaction replacing the table whole (so what the kernel holds is exactly this),
    and removing the table of the other attachment's family (a node that switched modes)."""
    table = nft_table(mode, ports)
    return model.render_absent("bridge" if table.family == "inet" else "inet", NFT_TABLE) + model.render_table(table)


def remove_nft(nft: Nft) -> list[str]:
    """Delete the table in whichever family it is; what was removed."""
    return [f"nft table {family} {NFT_TABLE}" for family in ("inet", "bridge")
            if tables.remove_table(nft, family, NFT_TABLE)]


# ------------------------------------------------------------------- iptables

def render_iptables(mode: PodAttachment, family: IpFamily, ports: Iterable[PodPort]) -> str:
    """`iptables-restore --noflush` text for the raw table: our chains, flushed and refilled.
    Bridge mode's per-pod rules sit in 16 bucket chains by the veth name's first hex digit
    (`--physdev-in na<d>+`), so a packet walks about 16 + n/16 rules, not n."""
    rules = [f"-A {CHAIN} -i {owned.DEVICE_PREFIX}+ -j RETURN", f"-A {CHAIN} -i {owned.DEFAULT_BRIDGE} -j RETURN"]
    if family is IpFamily.V6:
        rules += [f"-A {CHAIN} -s {network} -j RETURN" for network in _LINK_LOCAL]
    chains = [CHAIN]
    if mode is PodAttachment.ROUTED:
        rules.append(f"-A {CHAIN} -i {owned.HOST_VETH_PREFIX}+ -m rpfilter --invert -j DROP")
    else:
        rules = rules[2:]            # bridged packets come in on na0: the port is the physdev
        chains += BUCKETS
        buckets: dict[str, list[str]] = {}
        for port in (p for p in ports if _valid_port(p)):
            own = port.of(family)
            bucket = buckets.setdefault(port.interface[len(owned.HOST_VETH_PREFIX)], [])
            chain = f"{CHAIN}-{port.interface[len(owned.HOST_VETH_PREFIX)]}"
            source = ["!", "-s", own[0]] if len(own) == 1 else []
            if len(own) > 1:         # not one address per family: allow each, then drop the rest
                bucket += [f"-A {chain} -m physdev --physdev-in {port.interface} -s {a} -j RETURN" for a in own]
            bucket.append(" ".join([f"-A {chain} -m physdev --physdev-in {port.interface}", *source, "-j DROP"]))
        for digit in sorted(buckets):
            rules.append(f"-A {CHAIN} -m physdev --physdev-in {owned.HOST_VETH_PREFIX}{digit}+ -j {CHAIN}-{digit}")
        rules += [rule for digit in sorted(buckets) for rule in buckets[digit]]
    return "\n".join(["*raw", *(f":{chain} - [0:0]" for chain in chains), *rules, "COMMIT"]) + "\n"


def apply_iptables(runner: IptablesRunner, text: str) -> None:
    runner.restore(text, flush=FlushMode.NO_FLUSH)
    runner.ensure_jump("raw", "PREROUTING", CHAIN, comment=COMMENT)


def remove_iptables(runner: IptablesRunner) -> list[str]:
    return [f"{runner.family.command} raw {CHAIN}"] if runner.delete_chains("raw", [CHAIN, *BUCKETS]) else []


# ------------------------------------------------------------------- the sync

class AntiSpoofing:
    """Keeps the kernel's anti-spoofing rules for this node's pods: `sync` rescans the IPAM
    store (bridge mode) and writes only when the wanted text changed, or every `reassert`
    syncs (drift repair: someone flushed our table or chain; nftables: only when the table
    read back drifted, `check`)."""

    def __init__(self, *, mode: PodAttachment, ports: Callable[[], Sequence[PodPort]],
                 nft: Nft | None = None, iptables: Sequence[IptablesRunner] = (), reassert: int = 30) -> None:
        if (nft is None) == (not iptables):
            raise ValueError("anti-spoofing needs exactly one flavour: an Nft or iptables runners")
        self.mode = mode
        self.ports = ports
        self.nft = nft
        self.iptables = tuple(iptables)
        self.reassert = reassert
        self._written: tuple[str, ...] | None = None
        self._syncs = 0

    def wanted(self) -> tuple[str, ...]:
        ports = self.ports() if self.mode is PodAttachment.BRIDGE else ()
        if self.nft is not None:
            return (render_nft(self.mode, ports),)
        return tuple(render_iptables(self.mode, runner.family, ports) for runner in self.iptables)

    def sync(self, *_: object) -> None:
        wanted = self.wanted()
        self._syncs += 1
        if wanted == self._written and self._syncs % self.reassert:
            return
        if self.nft is not None:
            if wanted != self._written or self.check():       # a reassert writes only what drifted
                self.nft.apply(wanted[0])
        else:
            for runner, text in zip(self.iptables, wanted):
                apply_iptables(runner, text)
        if wanted != self._written:
            log.info("pod anti-spoofing: rules written (%s mode)", self.mode.value)
        self._written = wanted

    def check(self) -> list[str]:
        """The nftables flavour's drift: the table read back against the wanted one, and the
        other attachment's table still present (one sentence per difference; [] for iptables)."""
        if self.nft is None:
            return []
        wanted = nft_table(self.mode, self.ports() if self.mode is PodAttachment.BRIDGE else ())
        other = "bridge" if wanted.family == "inet" else "inet"
        stale = [f"table {other} {NFT_TABLE} present"] if self.nft.list_table(other, NFT_TABLE) is not None else []
        return tables.table_drift(self.nft, wanted) + stale

    def remove(self) -> list[str]:
        removed = remove_nft(self.nft) if self.nft is not None else []
        for runner in self.iptables:
            removed += remove_iptables(runner)
        self._written = None
        return removed
