"""The names of the policy engine's bucket chains (iptables dataplane): which bucket a pod's hook
goes in, and the pod directory chain of an address. Pure naming, split out of render.py.

Why buckets: the per-pod hooks are grouped in bucket chains (by the host veth's first hex
digit; routed ingress in bridge mode and the IPVS hooks by the pod's IPv4 /28), so a new
connection walks about 16 + n/16 hooks instead of n. A chain name holds at most 28
characters, too few for an IPv6 block's address, so IPv6 names use a digest of the /120.
"""
from __future__ import annotations

import hashlib
import ipaddress

from netagent.kernel import owned
from netagent.kernel.families import IpFamily

HEADER = "netagent policy: "
HEX = "0123456789abcdef"
BUCKET_PREFIX = owned.POLICY_CHAIN.removesuffix("FORWARD")   # "NETAGENT-NP-": + E3, I3, R<network>
BUCKET_KINDS = "EIRSD"        # FORWARD: egress, ingress by veth digit, routed ingress; OUTPUT: source, destination
DIRECTORY_PREFIX = BUCKET_PREFIX + "N"      # + /28 network: the pod directory (never jumped to)
POD_ENTRY = HEADER + "pod "                 # a directory rule's comment: + "ns/name ip"


def block_bucket(kind: str, ip: str) -> str | None:
    """The bucket of an IPv4 address's /28 (R, S, D). IPv6: a /120's name would not fit a chain
    name, so R hooks sit in the hook chain itself and S, D buckets are named by a digest of the
    /120 and entered unconditionally (each hook in them matches its own address)."""
    if IpFamily.of(ip) is IpFamily.V6:
        return None if kind == "R" else directory_bucket(ip).replace(DIRECTORY_PREFIX, BUCKET_PREFIX + kind, 1)
    block = ipaddress.IPv4Network(f"{ip}/28", strict=False)
    return f"{BUCKET_PREFIX}{kind}{int(block.network_address):08x}"


V6_KEY = 15            # hex digits of an IPv6 bucket's digest (an IPv4 /28's key has 8)


def directory_bucket(ip: str) -> str:
    """The pod directory chain of an address: its /28 (IPv4), or a digest of its /120 (IPv6)."""
    if ":" not in ip:
        return f"{DIRECTORY_PREFIX}{int(ipaddress.IPv4Network(f'{ip}/28', strict=False).network_address):08x}"
    block = str(ipaddress.IPv6Network(f"{ip}/120", strict=False))
    return f"{DIRECTORY_PREFIX}{hashlib.sha256(block.encode()).hexdigest()[:V6_KEY]}"


def interface_bucket(interface: str) -> str | None:
    """Our host veths are `na` + hex: the first hex digit splits them 16 ways."""
    prefix = owned.HOST_VETH_PREFIX
    return interface[len(prefix)] if interface.startswith(prefix) and len(interface) > len(prefix) + 1 \
        and interface[len(prefix)] in HEX else None


