"""What both policy dataplanes (iptables + ipset, nftables) share above their own renderers:
the settings a render takes, the pod chains' names, which directions and sets a pod's chains
use, the set members checked once, and when a one-pod removal applies. Pure; neither
dataplane's renderer imports the other's.

`ServicePath` says how Service connections reach their endpoint pods on this node, in the
policy's own words (the daemon sets it from the proxy mode, `daemon/policy_start.py`): through
FORWARD after a DNAT (the iptables, nftables and eBPF proxies, no proxy), or, as IPVS does,
taken locally and sent out anew through OUTPUT, so the hooks must sit in OUTPUT too.
"""
from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Container, Mapping
from dataclasses import dataclass

from netagent.kernel import owned
from netagent.kernel.families import IpFamily
from netagent.kernel.ipset.model import IpsetError, IpsetType, canonical_member
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.semantics import Allow, Member, NodePlan, PodPlan, PortMember, SetKind, SetRef, set_refs

INTERFACE_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,15}$")    # what the kernel takes as a name (IFNAMSIZ)

# the ipset type each kind's members are checked against (a named port's as its ipset spelling),
# so both dataplanes take members every tool can hold
SET_TYPES = {SetKind.PODS: IpsetType.HASH_IP, SetKind.EXCEPT: IpsetType.HASH_NET,
             SetKind.NAMED: IpsetType.HASH_IP_PORT, SetKind.NETS: IpsetType.HASH_NET}


class ServicePath(enum.Enum):
    """How a Service connection reaches an endpoint pod of this node."""
    FORWARD = "forward"     # DNAT before FORWARD: the FORWARD hook sees it
    OUTPUT = "output"       # taken locally and sent out anew (IPVS): it leaves through OUTPUT, hooked too


@dataclass(frozen=True)
class RenderSettings:
    mode: PodAttachment                        # how pods attach: the hooks match the bridge or the veth
    bridge: str = owned.DEFAULT_BRIDGE
    local_cidrs: tuple[str, ...] = ()          # this node's pod CIDRs: closed until programmed
    services: ServicePath = ServicePath.FORWARD   # OUTPUT: Service connections leave through OUTPUT, hook it too
    family: IpFamily = IpFamily.V4             # the family rendered (families.py: one dataplane per family,
                                               # handed local_cidrs of that family only)


def pod_chain(prefix: str, pod_key: str) -> str:
    return prefix + hashlib.sha256(pod_key.encode("utf-8", "surrogatepass")).hexdigest()[:15]


def pod_directions(pod: PodPlan) -> tuple[list[tuple[tuple[Allow, ...], str, bool]], set[SetRef]]:
    """(allows, chain name, ingress?) per direction the pod is isolated in (egress first), and
    the sets those allows use: what either dataplane's renderer turns into the pod's chains."""
    directions = []
    refs: set[SetRef] = set()
    for allows, prefix, ingress in ((pod.egress, owned.POLICY_EGRESS_PREFIX, False),
                                    (pod.ingress, owned.POLICY_INGRESS_PREFIX, True)):
        if allows is None:
            continue
        for allow in allows:
            refs.update(set_refs(allow))
        directions.append((allows, pod_chain(prefix, pod.key), ingress))
    return directions, refs


def removable_chains(pod: PodPlan, chains: Mapping[str, object] | Container[str], known: Container[str], *,
                     clean: bool) -> set[str] | None:
    """The names of `pod`'s chains when a one-pod removal applies: the state was `clean` (no pod
    pending or refused) and holds the pod as rendered (in KNOWN, every chain there); else None."""
    own = {chain for _, chain, _ in pod_directions(pod)[0]}
    return own if clean and pod.ip in known and all(name in chains for name in own) else None


def ipset_spelling(member: Member) -> str:
    """A set member as ipset spells it: an address or network as is, a named port `addr,proto:port`."""
    return f"{member.address},{member.protocol}:{member.port}" if isinstance(member, PortMember) else member


def _checked(kind: SetKind, member: Member) -> Member:
    """`member` canonical for a set of `kind`; IpsetError, ValueError or TypeError when it cannot be held."""
    if (kind is SetKind.NAMED) != isinstance(member, PortMember):
        raise TypeError(f"a {type(member).__name__} is not a member of a {kind.value} set")
    canonical = canonical_member(SET_TYPES[kind], ipset_spelling(member))    # checks every part
    if isinstance(member, PortMember):
        return PortMember(canonical_member(IpsetType.HASH_IP, member.address), member.protocol.lower(), member.port)
    return canonical


def checked_sets(plan: NodePlan, refused: list[str]) -> tuple[dict[SetRef, frozenset[Member]], set[SetRef]]:
    """Every set's members checked as the ipset model checks them, addresses in its canonical
    spelling (a named port stays a `PortMember`). A member no set can hold is left out of an
    allow set (it allows less); an except set with one is `broken` (leaving it out would allow
    more): the pods using it are refused."""
    members: dict[SetRef, frozenset[Member]] = {}
    broken: set[SetRef] = set()
    for ref, raw in plan.sets.items():
        good: set[Member] = set()
        for member in raw:
            try:
                good.add(_checked(ref.kind, member))
            except (IpsetError, ValueError, TypeError):
                refused.append(f"set {ref.key[:120]}: member {str(ipset_spelling(member))[:60]!r} cannot be written; "
                               + ("its pods stay closed" if ref.kind is SetKind.EXCEPT else "left out"))
                if ref.kind is SetKind.EXCEPT:
                    broken.add(ref)
        if len(good) > ref.capacity:
            refused.append(f"set {ref.key[:120]}: {len(good)} members exceed its capacity; its pods stay closed")
            broken.add(ref)
        members[ref] = frozenset(good)
    return members, broken
