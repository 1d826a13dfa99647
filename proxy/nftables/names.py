"""Names and hook priorities of the nftables service proxy: its table, maps, sets and chains.

Everything lives in ONE table per family, `owned.NFT_PROXY_TABLE` ("netagent": `ip netagent`
and `ip6 netagent`, the same names in both; spelling.py says how the two differ), so cleanup
is `delete table` and nothing of ours can sit in another user's table. Inside it every name
holds an uppercase letter (`netagent/kernel/nftables/text.py`'s `name` rule: no nft keyword
does), so none can be read as a keyword.

Hook priorities (chosen as kube-proxy's nftables mode chose its own, so both coexist with
iptables-nft, iptables-legacy and other nft tables; ARCHITECTURE.md says the same):
- `PREROUTING` and `OUTPUT`: type nat, priority `dstnat` (-100), where iptables' nat
  PREROUTING/OUTPUT sit: the first DNAT among the tables at that hook wins, as between two
  iptables tools. Drops and rejects of ours (no endpoints, source ranges) happen there too,
  on a connection's first packet only: a nat chain sees nothing else, so established traffic
  and traffic that is not to a service address never meets a rule of ours but the lookups.
- `POSTROUTING`: type nat, priority `srcnat` (100), where iptables' nat POSTROUTING sits.
A packet we do not serve falls through every chain with `policy accept`: untouched.

Chains per endpoint COUNT, never per Service (chains are what cost nft time; elements are
cheap): `IP-C-<n>` balances cluster-IP traffic over n slots, and so on (`count_chain`).
Only ClientIP affinity has chains per service port (`AFF-<hash>-<role>`, `AFE-<hash>-<ep>`)
and a dynamic set per endpoint (`AFS-<hash>-<ep>`), as kube-proxy's: rare, and said so.
"""
from __future__ import annotations

import enum
import re

from netagent.kernel import owned

TABLE = owned.NFT_PROXY_TABLE
FAMILIES = ("ip", "ip6")     # every name here is family-free
PRIORITY_DSTNAT = -100       # `dstnat`; written as a number: nft 1.0.6 refuses the name on the output hook
PRIORITY_SRCNAT = 100        # `srcnat`

# base chains (hooked) and the fixed regular chains
PREROUTING = "PREROUTING"
OUTPUT = "OUTPUT"
POSTROUTING = "POSTROUTING"
SERVICES = "SERVICES"          # from PREROUTING and OUTPUT: firewall, service addresses, node ports
LOCAL_IP = "LOCAL-IP"          # external address with externalTrafficPolicy Local
LOCAL_NODEPORT = "LOCAL-NODEPORT"
REJECT = "REJECT-NEW"          # a service port with no endpoints at all: refused at once

# maps and sets (all static but the affinity sets)
SERVICE_IPS = "SERVICE-IPS"                    # daddr . proto . dport : verdict
SERVICE_NODEPORTS = "SERVICE-NODEPORTS"        # proto . dport : verdict
LOCAL_IPS_INSIDE = "LOCAL-IPS-INSIDE"          # Local policy, pods and the node: like a cluster IP
LOCAL_IPS_OUTSIDE = "LOCAL-IPS-OUTSIDE"        # Local policy, everyone else: local endpoints only
LOCAL_NODEPORTS_INSIDE = "LOCAL-NODEPORTS-INSIDE"
LOCAL_NODEPORTS_OUTSIDE = "LOCAL-NODEPORTS-OUTSIDE"
# endpoints, one map per protocol (`ENDPOINTS-TCP`: daddr . dport . slot : endpoint . port;
# `NODEPORT-ENDPOINTS-TCP`: dport . slot : ...): see spelling.py's `endpoint_typeof` for why
ENDPOINTS = "ENDPOINTS"
LOCAL_ENDPOINTS = "LOCAL-ENDPOINTS"
NODEPORT_ENDPOINTS = "NODEPORT-ENDPOINTS"
NODEPORT_LOCAL_ENDPOINTS = "NODEPORT-LOCAL-ENDPOINTS"
PROTOCOLS = ("tcp", "udp", "sctp")
FIREWALL_IPS = "FIREWALL-IPS"                  # load-balancer addresses with source ranges
FIREWALL_ALLOW = "FIREWALL-ALLOW"              # ... . saddr interval: who may reach them
HAIRPIN = "HAIRPIN"                            # endpoint . endpoint: masqueraded to itself
# the entry points again, each with the comment "namespace/name:port Kind" (status): a set, since
# nft 1.0.6 writes a map element's comment between key and value, which FakeNft does not read
IP_NAMES = "SERVICE-IP-NAMES"
NODEPORT_NAMES = "SERVICE-NODEPORT-NAMES"

VERDICT_MAPS = (SERVICE_IPS, SERVICE_NODEPORTS, LOCAL_IPS_INSIDE, LOCAL_IPS_OUTSIDE, LOCAL_NODEPORTS_INSIDE,
                LOCAL_NODEPORTS_OUTSIDE)
ADDRESS_KEYED = (SERVICE_IPS, LOCAL_IPS_INSIDE, LOCAL_IPS_OUTSIDE)   # the rest of the verdict maps: proto . port
ENDPOINT_MAPS = tuple(f"{base}-{proto.upper()}" for base in (ENDPOINTS, LOCAL_ENDPOINTS, NODEPORT_ENDPOINTS,
                                                               NODEPORT_LOCAL_ENDPOINTS) for proto in PROTOCOLS)
STATIC_SETS = (FIREWALL_IPS, FIREWALL_ALLOW, HAIRPIN, IP_NAMES, NODEPORT_NAMES)
ELEMENT_HOLDERS = (*VERDICT_MAPS, *ENDPOINT_MAPS, *STATIC_SETS)


class Role(str, enum.Enum):
    """What a balancing chain does before choosing: the masquerade mark, and which map."""
    CLUSTER = "C"    # mark unless the source is in the cluster CIDR; ENDPOINTS
    EXTERNAL = "X"   # mark always (Cluster policy: the reply must come back through us)
    LOCAL = "L"      # no mark (Local policy keeps the client's address); LOCAL-ENDPOINTS


class KeySpace(str, enum.Enum):
    """Whether an entry point is keyed by its address (cluster, external, load-balancer IPs)
    or only by protocol and port (a NodePort: any local address)."""
    ADDRESS = "IP"
    NODEPORT = "NP"


def count_chain(space: KeySpace, role: Role, count: int) -> str:
    """The chain balancing over `count` slots: `IP-C-10`, `NP-L-1`."""
    return f"{space.value}-{role.value}-{count}"


COUNT_CHAIN = re.compile(r"(IP|NP)-([CXL])-([1-9][0-9]*)")


def endpoint_map(space: KeySpace, role: Role, protocol: str) -> str:
    """`ENDPOINTS-TCP`, `NODEPORT-LOCAL-ENDPOINTS-UDP`: where a role's slots of a protocol are."""
    local = role is Role.LOCAL
    if space is KeySpace.ADDRESS:
        base = LOCAL_ENDPOINTS if local else ENDPOINTS
    else:
        base = NODEPORT_LOCAL_ENDPOINTS if local else NODEPORT_ENDPOINTS
    return f"{base}-{protocol.upper()}"


def affinity_chain(port_hash: str, role: Role) -> str:
    return f"AFF-{port_hash}-{role.value}"


def affinity_endpoint(port_hash: str, ip: str, port: int) -> str:
    """`AFE-<hash>-10-244-1-5-8080`: the endpoint is readable from the name."""
    return f"AFE-{port_hash}-{_endpoint_word(ip, port)}"


def affinity_set(port_hash: str, ip: str, port: int) -> str:
    return f"AFS-{port_hash}-{_endpoint_word(ip, port)}"


def _endpoint_word(ip: str, port: int) -> str:
    """`10-244-1-5-8080`, `fd00_10_244__5-8080` (IPv6: `:` as `_`)."""
    return f"{ip.replace('.', '-').replace(':', '_')}-{port}"
