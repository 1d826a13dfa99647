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

`masquerade_table` is pure: the table as `kernel/nftables/model.py` values, which render
(`model.render_table`), read back, diff and digest it: every rule's comment ends with a hash of
its text, so a changed rendering (another version of netagent) is drift too.
`NftMasqueradeManager` has `MasqueradeManager`'s contract: `check()` lists the drift,
`ensure()` compares the table read back (chains with hook/type/priority/policy, set elements,
each chain's rule comments) with the wanted one and writes only when it drifted, in one
transaction (the table deleted and recreated: conntrack keeps the NAT bindings of existing
connections); `cleanup()` deletes the table.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.runner import Iptables, IptablesError
from netagent.kernel.nftables import model, tables, text
from netagent.kernel.nftables.runner import Nft
from netagent.noderoutes.masquerade import MULTICAST, IpNetwork, MasqueradeManager, validated_networks

log = logging.getLogger("netagent.noderoutes.masquerade")

FAMILY = IpFamily.V4.nft  # the IPv4 table's; a table's `family` says each table's
TABLE = owned.NFT_MASQUERADE_TABLE
POSTROUTING_CHAIN = "POSTROUTING"
FORWARD_CHAIN = "FORWARD"
CLUSTER_SET = "CLUSTER-CIDRS"
LOCAL_PODS_SET = "LOCAL-POD-CIDRS"
POSTROUTING = model.BaseChain("nat", "postrouting", 110, "srcnat + 10")
FORWARD = model.BaseChain("filter", "forward", 10, "filter + 10")


def masquerade_table(*, cluster_cidrs: Iterable[IpNetwork | str],
                     pod_cidrs: Iterable[IpNetwork | str], family: IpFamily = IpFamily.V4) -> model.Table:
    """The wanted table; the CIDRs checked as the iptables rendering checks them
    (`masquerade.validated_networks`)."""
    cluster, pods = validated_networks(cluster_cidrs=cluster_cidrs, pod_cidrs=pod_cidrs)
    if not family.holds(cluster[0]):
        raise ValueError(f"the nftables masquerade table of {family.label} is table {family.nft} {TABLE}; "
                         f"{cluster[0]} is not {family.label}")
    cluster_set, pods_set = model.ref(CLUSTER_SET), model.ref(LOCAL_PODS_SET)
    multicast = text.network(str(MULTICAST[family]))
    ip = family.nft  # the address match: `ip saddr`, `ip6 saddr`
    cluster_only, pods_only = (CLUSTER_SET,), (LOCAL_PODS_SET,)
    postrouting = model.Chain(POSTROUTING_CHAIN, (
        model.digested_rule(f"{ip} saddr {cluster_set} {ip} daddr {cluster_set} return",
                            "pod to pod keeps the pod address", sets=cluster_only),
        model.digested_rule(f"{ip} saddr {cluster_set} {ip} daddr != {multicast} masquerade fully-random",
                            "pods leaving the cluster use the node address", sets=cluster_only),
        model.digested_rule(f"{ip} daddr {pods_set} return", "outside to local pods keeps the client address",
                            sets=pods_only),
        model.digested_rule(f"{ip} daddr {cluster_set} masquerade fully-random",
                            "outside to remote pods is masqueraded for the return path", sets=cluster_only)),
        POSTROUTING)
    forward = model.Chain(FORWARD_CHAIN, (
        model.digested_rule(f"{ip} saddr {cluster_set} accept", "forward from pods", sets=cluster_only),
        model.digested_rule(f"{ip} daddr {cluster_set} accept", "forward to pods", sets=cluster_only)), FORWARD)
    sets = tuple(model.Set(name, (family.nft_address_type,), ("interval",),
                           tuple(model.Element((text.network(str(n)),)) for n in networks))
                 for name, networks in ((CLUSTER_SET, cluster), (LOCAL_PODS_SET, pods)))
    return model.Table(family.nft, TABLE, (postrouting, forward), sets)


def render_masquerade_nft(wanted: model.Table) -> str:
    """One batch that replaces the table with `wanted` (`model.render_table`)."""
    return model.render_table(wanted)


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
        problems = tables.table_drift(self.nft, self.wanted)
        if self.forward_accept is not None:
            if self._iptables_forward_drops():
                problems += self.forward_accept.check()
            elif self._iptables_forward_held():
                problems.append("iptables forward accept present while FORWARD accepts")
        return problems

    def ensure(self) -> list[str]:
        """Repair whatever drifted; return what was repaired. Writes nothing when in sync."""
        problems = tables.ensure_table(self.nft, self.wanted)
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
        tables.remove_table(self.nft, self.family.nft, TABLE)
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
