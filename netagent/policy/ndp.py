"""IPv6 neighbour discovery and MLD, which NetworkPolicy never filters: the one home of which
ICMPv6 types pass every pod's policy and the rule each policy flavour writes for them.

ARP is not IP, so neither iptables nor nft's `ip` tables ever meet it; its IPv6 counterpart is
ICMPv6, which they do meet. In bridge mode br_netfilter hands bridged solicitations (to the
solicited-node group) to FORWARD, so a ports-only policy would leave an isolated pod unable to
resolve or be resolved. Each type passes only with the hop limit it is always sent with (NDP
255, RFC 4861; MLD 1, RFCs 2710 and 3810): a routed packet arrives with one less, so nothing
from off the link passes policy by calling itself neighbour discovery.
"""
from __future__ import annotations

from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.restore_format import canonical_spec

# ICMPv6 type -> (its nft name, the hop limit it is sent with)
NDP_TYPES = {130: ("mld-listener-query", 1), 131: ("mld-listener-report", 1), 132: ("mld-listener-done", 1),
             133: ("nd-router-solicit", 255), 134: ("nd-router-advert", 255), 135: ("nd-neighbor-solicit", 255),
             136: ("nd-neighbor-advert", 255), 137: ("nd-redirect", 255), 143: ("mld2-listener-report", 1)}
COMMENT = "netagent policy: IPv6 neighbour discovery and MLD (never filtered)"


def iptables_rules(family: IpFamily) -> list[tuple[str, ...]]:
    """The hook chain's RETURNs (ip6tables-save's spelling; one type per rule, as icmp6 matches
    one); none for IPv4."""
    if family is not IpFamily.V6:
        return []
    return [canonical_spec(["-p", "ipv6-icmp", "-m", "icmp6", "--icmpv6-type", str(kind), "-m", "hl",
                            "--hl-eq", str(limit), "-m", "comment", "--comment", COMMENT, "-j", "RETURN"])
            for kind, (_, limit) in NDP_TYPES.items()]


def nft_bodies(family: IpFamily) -> list[str]:
    """The ip6 base chain's rules (one per hop limit); none for IPv4."""
    if family is not IpFamily.V6:
        return []
    by_limit: dict[int, list[str]] = {}
    for name, limit in NDP_TYPES.values():
        by_limit.setdefault(limit, []).append(name)
    return [f"icmpv6 type {{ {', '.join(names)} }} ip6 hoplimit {limit} return"
            for limit, names in sorted(by_limit.items(), reverse=True)]
