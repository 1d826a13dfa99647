"""Chain and set names of the iptables service proxy: what it owns, and how to recognise it.

Every name starts with `NETAGENT-` (the project's prefix) and fits iptables' 28 characters.
A service port's chains share one hash (`proxy/service_hash.py`, the nftables backend's too):
`NETAGENT-<KIND>-` plus the first 15 characters of base32(sha256("namespace/name:port/PROTOCOL")),
so a chain's kind and owner are readable from its name, the same service port always gets the
same names (an agent restart adopts them), and a stale chain is recognisable by its shape alone (`PER_SERVICE_CHAIN`). Endpoint
chains (only with ClientIP affinity) hash the endpoint address in as well.

The fixed chains are named apart from masquerade.py's `NETAGENT-POSTRTG` and
`NETAGENT-FORWARD`, which this backend never touches. `NETAGENT-SVC-POSTRTG` starts like a
service chain but is not one: service chains end in exactly 15 base32 characters.
"""
from __future__ import annotations

import enum
import re

from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.runner import OWNED_PREFIX
from proxy.model import Endpoint, ServicePort
from proxy.service_hash import HASH_LENGTH, service_hash, text_hash

# Fixed chains.
SERVICES_CHAIN = f"{OWNED_PREFIX}SERVICES"          # nat, from PREROUTING and OUTPUT
NODEPORTS_CHAIN = f"{OWNED_PREFIX}NODEPORTS"        # nat, from NETAGENT-SERVICES
POSTROUTING_CHAIN = f"{OWNED_PREFIX}SVC-POSTRTG"    # nat, from POSTROUTING
FILTER_CHAIN = f"{OWNED_PREFIX}SVC-FILTER"          # filter, from INPUT, FORWARD, OUTPUT (new connections)
FORWARD_CHAIN = f"{OWNED_PREFIX}SVC-FORWARD"        # filter, from FORWARD
FIXED_CHAINS = {"nat": (SERVICES_CHAIN, NODEPORTS_CHAIN, POSTROUTING_CHAIN),
                "filter": (FILTER_CHAIN, FORWARD_CHAIN)}

HAIRPIN_SET = f"{OWNED_PREFIX}HAIRPIN"
HAIRPIN_SET6 = f"{OWNED_PREFIX}HAIRPIN6"   # ipsets are per namespace, not per family: IPv6's own


def hairpin_set_name(family: IpFamily) -> str:
    return HAIRPIN_SET if family is IpFamily.V4 else HAIRPIN_SET6


class ChainKind(str, enum.Enum):
    """The per-service-port chains (all in the nat table)."""
    SERVICE = "SVC"     # the endpoints for cluster-IP traffic
    SECOND = "SVL"      # the endpoints for external traffic when they differ (Local policy)
    EXTERNAL = "EXT"    # NodePort / external IP / load-balancer entry: masquerade and policy
    FIREWALL = "FW"     # load-balancer source ranges
    ENDPOINT = "SEP"    # one endpoint, only with ClientIP affinity


PER_SERVICE_CHAIN = re.compile(
    rf"^{re.escape(OWNED_PREFIX)}(?:{'|'.join(kind.value for kind in ChainKind)})-[A-Z2-7]{{{HASH_LENGTH}}}$")


def chain_name(kind: ChainKind, service_port_hash: str) -> str:
    return f"{OWNED_PREFIX}{kind.value}-{service_port_hash}"


def service_chain(kind: ChainKind, service: ServicePort) -> str:
    return chain_name(kind, service_hash(service.name, service.protocol))


def endpoint_chain(service: ServicePort, endpoint: Endpoint) -> str:
    return chain_name(ChainKind.ENDPOINT, text_hash(f"{service.name}/{service.protocol.value}/{endpoint.address}"))


def is_owned_chain(name: str) -> bool:
    """A chain this backend owns: fixed or per service port (never masquerade.py's)."""
    return name in FIXED_CHAINS["nat"] or name in FIXED_CHAINS["filter"] or bool(PER_SERVICE_CHAIN.match(name))


def chain_kind(name: str) -> ChainKind | None:
    if not PER_SERVICE_CHAIN.match(name):
        return None
    return ChainKind(name[len(OWNED_PREFIX):].split("-", 1)[0])
