"""Pod egress masquerade in nftables (`--proxy-mode nftables`): `masquerade.py`'s behaviour in
our own table `ip netagent-masq` (owned.NFT_MASQUERADE_TABLE), no iptables rule at all; for an
IPv6 cluster CIDR the same table in family ip6 (`ip6 netagent-masq`, built with
`family=IpFamily.V6`: one manager per family, the same names, `ip6 saddr`/`ipv6_addr`).

The table holds two sets and two base chains:
- `CLUSTER-CIDRS` (the cluster CIDRs) and `LOCAL-POD-CIDRS` (this node's pod CIDRs), interval
  sets, so the rules stay four and two whatever the number of CIDRs;
- `POSTROUTING`: type nat, hook postrouting, priority `srcnat + 10` (110), the four rules of
  `masquerade.py` in the same order and for the same reasons: cluster -> cluster returns
  (pod to pod keeps the pod address), cluster -> not multicast is masqueraded, -> local pods
  returns (outside clients keep their address), -> other cluster pods is masqueraded (the
  return path). `masquerade fully-random` always: nf_tables has it on every kernel we run on.
- `FORWARD`: type filter, hook forward, priority `filter + 10` (10): cluster source or
  cluster destination accepted.

Hook priorities, and what they mean across tables. Every base chain at a hook sees the
packet, in priority order; `accept` ends the packet's walk through ONE base chain, never
through the others, while `drop` anywhere is final.
- NAT: a connection's first packet gets its source NAT from the first nat chain that
  decides one (nf_nat stops at the first binding). iptables' nat POSTROUTING (legacy and
  iptables-nft alike) and kube-proxy's nftables `nat-postrouting` sit at srcnat (100); ours at
  srcnat + 10 runs after them, so an administrator's explicit SNAT and a service proxy's
  masquerade decide first, and ours masquerades what nobody translated. Our `return` for pod
  to pod traffic cannot stop another table from masquerading it (it could not in iptables
  either, where such a rule ahead of our jump would win); none of the usual tools does.
- FORWARD: an accept of ours does not save a packet from another table's forward chain that
  drops it. A node without iptables has nobody else to drop; but a host whose iptables filter
  FORWARD policy is DROP (Docker sets it, on either iptables backend) drops forwarded pod
  traffic whatever our table says. So when the manager is given the host's iptables and its
  FORWARD policy is DROP, it also keeps `masquerade.py`'s iptables forward accept
  (`NETAGENT-FORWARD`, jumped to first from FORWARD) and says so in the log; when the policy
  is ACCEPT (or there is no iptables), no iptables rule of ours exists, and one left from a
  DROP period is removed. Our forward priority is after iptables' (filter, 0): nothing of
  ours drops, so the order only decides who counts the packet first.

`render_masquerade_nft` is pure: the batch that (re)creates the table. `NftMasqueradeManager`
has `MasqueradeManager`'s contract: `check()` lists the drift, `ensure()` compares the table
read back (chains with hook/type/priority/policy, set elements, each chain's rule comments)
with the rendering and writes only when it drifted, in one transaction (the table deleted and
recreated: conntrack keeps the NAT bindings of existing connections); `cleanup()` deletes the
table. Every rule's comment ends with a hash of its text, so a changed rendering (another
version of netagent) is drift too.
"""
from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.runner import Iptables, IptablesError
from netagent.kernel.nftables import listing, text
from netagent.kernel.nftables.runner import Nft
from netagent.noderoutes.masquerade import MULTICAST, IpNetwork, MasqueradeManager, validated_networks

log = logging.getLogger("netagent.noderoutes.masquerade")

FAMILY = IpFamily.V4.nft  # the IPv4 table's; `MasqueradeTable.family` says each table's
TABLE = owned.NFT_MASQUERADE_TABLE
POSTROUTING_CHAIN = "POSTROUTING"
FORWARD_CHAIN = "FORWARD"
CLUSTER_SET = "CLUSTER-CIDRS"
LOCAL_PODS_SET = "LOCAL-POD-CIDRS"
POSTROUTING_PRIORITY = ("srcnat + 10", 110)
FORWARD_PRIORITY = ("filter + 10", 10)


@dataclass(frozen=True)
class NftChain:
    name: str
    type: str
    hook: str
    priority: tuple[str, int]
    rules: tuple[tuple[str, str], ...]     # (statements, comment), comment already safe

    def spec(self) -> dict[str, Any]:
        return {"type": self.type, "hook": self.hook, "prio": self.priority[1], "policy": "accept"}


@dataclass(frozen=True)
class MasqueradeTable:
    """What `ip netagent-masq` must hold."""
    cluster: tuple[IpNetwork, ...]
    local_pods: tuple[IpNetwork, ...]
    chains: tuple[NftChain, NftChain]
    family: IpFamily = IpFamily.V4


def _rule(statements: str, purpose: str) -> tuple[str, str]:
    digest = hashlib.sha256(statements.encode()).hexdigest()[:8]
    return statements, text.safe_comment_text(f"netagent: {purpose} [{digest}]")


def masquerade_table(*, cluster_cidrs: Iterable[IpNetwork | str],
                     pod_cidrs: Iterable[IpNetwork | str], family: IpFamily = IpFamily.V4) -> MasqueradeTable:
    """The wanted table; the CIDRs checked as the iptables rendering checks them
    (`masquerade.validated_networks`)."""
    cluster_list, pods_list = validated_networks(cluster_cidrs=cluster_cidrs, pod_cidrs=pod_cidrs)
    cluster, pods = tuple(cluster_list), tuple(pods_list)
    if cluster[0].version != family.value:
        raise ValueError(f"the nftables masquerade table of {family.label} is table {family.nft} {TABLE}; "
                         f"{cluster[0]} is not {family.label}")
    cluster_set, pods_set = f"@{text.name(CLUSTER_SET)}", f"@{text.name(LOCAL_PODS_SET)}"
    multicast = text.network(str(MULTICAST[family.value]))
    ip = family.nft  # the address match: `ip saddr`, `ip6 saddr`
    postrouting = NftChain(POSTROUTING_CHAIN, "nat", "postrouting", POSTROUTING_PRIORITY, (
        _rule(f"{ip} saddr {cluster_set} {ip} daddr {cluster_set} return", "pod to pod keeps the pod address"),
        _rule(f"{ip} saddr {cluster_set} {ip} daddr != {multicast} masquerade fully-random",
              "pods leaving the cluster use the node address"),
        _rule(f"{ip} daddr {pods_set} return", "outside to local pods keeps the client address"),
        _rule(f"{ip} daddr {cluster_set} masquerade fully-random",
              "outside to remote pods is masqueraded for the return path")))
    forward = NftChain(FORWARD_CHAIN, "filter", "forward", FORWARD_PRIORITY, (
        _rule(f"{ip} saddr {cluster_set} accept", "forward from pods"),
        _rule(f"{ip} daddr {cluster_set} accept", "forward to pods")))
    return MasqueradeTable(cluster=cluster, local_pods=pods, chains=(postrouting, forward), family=family)


def render_masquerade_nft(wanted: MasqueradeTable) -> str:
    """One batch that replaces the table with `wanted` (the `add` first makes the `delete`
    succeed when the table is missing; the whole batch is one transaction)."""
    table = f"{wanted.family.nft} {text.name(TABLE)}"
    address_type = wanted.family.nft_address_type
    lines = [f"add table {table}", f"delete table {table}", f"add table {table}"]
    for name, networks in ((CLUSTER_SET, wanted.cluster), (LOCAL_PODS_SET, wanted.local_pods)):
        lines.append(f"add set {table} {text.name(name)} {{ type {address_type}; flags interval; }}")
        if networks:
            lines.append(f"add element {table} {text.name(name)} "
                         f"{text.element_block(text.network(str(n)) for n in networks)}")
    for chain in wanted.chains:
        lines.append(f"add chain {table} {text.name(chain.name)} {{ type {chain.type} hook {chain.hook} "
                     f"priority {chain.priority[0]}; policy accept; }}")
        for statements, comment in chain.rules:
            lines.append(f"add rule {table} {chain.name} {statements} comment {text.comment(comment)}")
    return "\n".join(lines) + "\n"


def table_drift(objects: list[dict[str, Any]] | None, wanted: MasqueradeTable) -> list[str]:
    """What differs between the table read back and `wanted`, one sentence per problem."""
    if objects is None:
        return [f"table {wanted.family.nft} {TABLE} missing"]
    problems = []
    chains, sets = listing.chains(objects), listing.sets(objects)
    for name, networks in ((CLUSTER_SET, wanted.cluster), (LOCAL_PODS_SET, wanted.local_pods)):
        held = sets.get(name)
        want = sorted(listing.key_text(_network_json(n)) for n in networks)
        if held is None:
            problems.append(f"set {name} missing")
        elif sorted(listing.key_text(key) for key, _ in listing.elements(held)) != want:
            problems.append(f"set {name} holds other networks than {[str(n) for n in networks]}")
    for chain in wanted.chains:
        held_chain = chains.get(chain.name)
        if held_chain is None:
            problems.append(f"chain {chain.name} missing")
            continue
        if {key: held_chain.get(key) for key in ("type", "hook", "prio", "policy")} != chain.spec():
            problems.append(f"chain {chain.name} is not {chain.spec()}")
        comments = [rule.get("comment") for rule in listing.rules(objects, chain.name)]
        if comments != [comment for _, comment in chain.rules]:
            problems.append(f"chain {chain.name}: {len(comments)} rule(s) differ from the {len(chain.rules)} wanted")
    extra = set(chains) - {chain.name for chain in wanted.chains}
    if extra:
        problems.append(f"chains not ours to keep: {sorted(extra)}")
    return problems


def _network_json(network: IpNetwork) -> Any:
    if network.prefixlen == network.max_prefixlen:
        return str(network.network_address)
    return {"prefix": {"addr": str(network.network_address), "len": network.prefixlen}}


class NftMasqueradeManager:
    """Keeps `ip netagent-masq` (`ip6 netagent-masq`) as rendered, through an `Nft`; with `forward_iptables` (the
    host's iptables, when it has one) also the iptables forward accept while that iptables'
    FORWARD policy is DROP."""

    def __init__(self, *, nft: Nft, cluster_cidrs: Sequence[IpNetwork | str], pod_cidrs: Sequence[IpNetwork | str],
                 forward_iptables: Iptables | None = None, family: IpFamily = IpFamily.V4) -> None:
        """`forward_iptables`: the host's iptables of `family` (ip6tables for IPv6)."""
        self.nft = nft
        self.family = family
        self.wanted = masquerade_table(cluster_cidrs=cluster_cidrs, pod_cidrs=pod_cidrs, family=family)
        self.forward_accept = None if forward_iptables is None else MasqueradeManager(
            runner=forward_iptables, cluster_cidrs=cluster_cidrs, pod_cidrs=pod_cidrs, forward_only=True)
        # the iptables nat chain an iptables-mode run left behind: removed at the first ensure
        self._iptables_nat_chain = None if forward_iptables is None else MasqueradeManager(
            runner=forward_iptables, cluster_cidrs=cluster_cidrs, pod_cidrs=pod_cidrs).chains[0]

    def check(self) -> list[str]:
        """What differs from the wanted state, one sentence per problem (empty: in sync)."""
        problems = table_drift(self.nft.list_table(self.family.nft, TABLE), self.wanted)
        if self.forward_accept is not None:
            if self._iptables_forward_drops():
                problems += self.forward_accept.check()
            elif self._iptables_forward_held():
                problems.append("iptables forward accept present while FORWARD accepts")
        return problems

    def ensure(self) -> list[str]:
        """Repair whatever drifted; return what was repaired. Writes nothing when in sync."""
        problems = table_drift(self.nft.list_table(self.family.nft, TABLE), self.wanted)
        if problems:
            self.nft.apply(render_masquerade_nft(self.wanted))
        if self.forward_accept is not None and self._iptables_nat_chain is not None:
            leftover, self._iptables_nat_chain = self._iptables_nat_chain, None
            if self.forward_accept.runner.delete_chains(leftover.table, [leftover.name]):
                problems.append(f"iptables {leftover.table} {leftover.name} of an iptables-mode run removed")
        if self.forward_accept is not None:
            if self._iptables_forward_drops():
                repaired = self.forward_accept.ensure()
                if repaired:
                    log.info("iptables FORWARD policy is DROP (%s backend): forward accept of pod traffic "
                             "kept in iptables too (%s)", self.forward_accept.runner.backend.value,
                             "; ".join(repaired))
                problems += repaired
            elif self._iptables_forward_held():
                self.forward_accept.cleanup()
                problems.append("iptables forward accept removed: FORWARD accepts")
        return problems

    def cleanup(self) -> None:
        """Delete the table (and an iptables forward accept of ours); quiet when gone."""
        if self.nft.list_table(self.family.nft, TABLE) is not None:
            self.nft.apply(f"delete table {self.family.nft} {text.name(TABLE)}\n")
        if self.forward_accept is not None:
            self.forward_accept.cleanup()

    def _iptables_forward_drops(self) -> bool:
        assert self.forward_accept is not None
        try:
            forward = self.forward_accept.runner.table("filter").chains.get("FORWARD")
        except IptablesError as error:
            log.warning("cannot read iptables filter FORWARD (%s); assuming it accepts", error)
            return False
        return forward is not None and forward.policy == "DROP"

    def _iptables_forward_held(self) -> bool:
        assert self.forward_accept is not None
        try:
            held = self.forward_accept.runner.table("filter").chains
        except IptablesError:
            return False
        return any(chain.name in held for chain in self.forward_accept.chains)
