"""The kernel state a `NodePlan` asks for, rendered purely: chains of rules (as iptables-save
prints them, so they compare with what the kernel holds) and ipsets with their members.

filter FORWARD -> NETAGENT-NP-FORWARD (the first rule of FORWARD), in order:
  1. conntrack RELATED,ESTABLISHED: RETURN. Replies and related packets (ICMP errors) of any
     connection that was allowed when it started pass untouched, and per-pod chains are only
     walked by a connection's first packet.
     IPv6: neighbour discovery and MLD RETURN (`ndp.py`: never filtered, as ARP, when not routed).
  2. for each local pod CIDR: from / to an address in it that is not in NETAGENT-NP-KNOWN:
     DROP. KNOWN holds the local pods already programmed, so a new pod is closed from its
     first packet until the sync that covers it has written its chains (then it joins KNOWN).
  3. per pod isolated for egress, on its host interface: jump to NETAGENT-NPE-<hash>;
  4. per pod isolated for ingress, on its host interface: jump to NETAGENT-NPI-<hash>.
     These hooks sit in bucket chains (NETAGENT-NP-E<d>/-I<d> by the first hex digit of the
     veth name, matched with a `na<d>+` wildcard; -R<net> by /28 for routed ingress), so a
     new connection walks about 16 + n/16 hooks rather than one per isolated pod.
     Routed mode: `-i`/`-o` the host veth. Bridge mode: bridged packets pass FORWARD through
     br_netfilter with the bridge as `-i`/`-o` and the port as physdev: egress matches
     `--physdev-in veth` (bridged or routed out of the bridge); ingress matches
     `--physdev-out veth --physdev-is-bridged` for bridged packets and, for packets routed
     into the bridge (other nodes, the outside), whose output port is unknown in FORWARD,
     `-o bridge -d podIP ! --physdev-is-bridged`.
  A pod chain RETURNs what a rule allows (so a packet between two local pods is judged by the
  sender's egress chain, then the receiver's ingress chain) and ends in a counted DROP: no
  REJECT, which would tell the sender a policy exists. Before the DROP, an NFLOG rule (rate
  limited) hands what it drops to the flow records, prefixed with the chain's name. Nothing
  here ACCEPTs: what passes goes on through FORWARD as if the policy engine did not exist.

Traffic from the node itself to its pods (kubelet probes) never crosses FORWARD, so it passes,
as with the other plugins; the pods' traffic to their own node (INPUT) is not filtered.
Services: DNAT happens in PREROUTING, before FORWARD, so rules see the chosen endpoint; the
eBPF proxy rewrites connect() or translates at the pod veth's tc hook, also before FORWARD.

IPVS (`RenderSettings.services` `ServicePath.OUTPUT`: the daemon sets it for `--proxy-mode ipvs`): IPVS takes a Service connection
in INPUT and sends it, translated, out through OUTPUT and POSTROUTING, so FORWARD never sees
it. filter OUTPUT therefore jumps, for IPVS-forwarded packets only (`-m ipvs --ipvs --vdir
ORIGINAL`), to NETAGENT-NP-OUTPUT: replies RETURN; packets the node itself originates (a local
source address: the node's own clients of a Service, as kubelet probes) RETURN, as they pass
without IPVS; then the same KNOWN guard; then per pod, by address in /28 buckets (-S<net>,
-D<net>), since OUTPUT has no input interface and the bridge port is not chosen yet: egress
`-s podIP` into its egress chain, ingress `-d podIP -o <veth or bridge>` into its ingress chain.
The `ipvs` match needs the kernel's xt_ipvs, so nothing of this is written in the other modes.

The pod directory: chains NETAGENT-NP-N<net> (per /28), which nothing jumps to, hold one
target-less rule per programmed local pod, open or isolated (`-d podIP`, comment
"netagent policy: pod ns/name ip"), so `netagent status policy` can name open pods too, from
the kernel alone. They cost no packet anything; a pod coming or going rewrites one of them.

Nothing one object holds can fail the whole write: every set member is checked with the
ipset model's own validation before it is rendered (a bad member of an allow set is left
out; a pod whose rules would use a bad except set is left out), and each pod is rendered
inside a guard. A pod left out is `refused`: not in KNOWN, so it stays closed.
"""
from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from netagent.kernel import nflog, owned
from netagent.kernel.families import IpFamily
from netagent.policy import ndp
from netagent.kernel.ipset.model import IpsetSpec, canonical_member
from netagent.kernel.iptables.restore_format import RestoreBuilder, canonical_spec, jump_target
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.buckets import (
    BUCKET_KINDS,
    BUCKET_PREFIX,
    HEADER,
    POD_ENTRY,
    V6_KEY,
    block_bucket as _block_bucket,
    directory_bucket as _directory_bucket,
    interface_bucket as _interface_bucket,
)
from netagent.policy.pod_plan import PodAdded, PodRemoved
from netagent.policy.semantics import Allow, CidrMatch, Member, NodePlan, PodPlan, PortMatch, SetKind, SetRef
from netagent.policy.shared import (
    INTERFACE_NAME,
    SET_TYPES,
    RenderSettings,
    ServicePath,
    checked_sets,
    ipset_spelling,
    pod_chain,
    pod_directions,
    removable_chains,
)

Rules = tuple[tuple[str, ...], ...]


def spelled(ref: SetRef, members: frozenset[Member]) -> frozenset[str]:
    """A set's members as ipset spells them: a named-port set's `PortMember`s as `addr,proto:port`,
    the others' (addresses and networks, checked_sets' canonical text) as they are."""
    if ref.kind is SetKind.NAMED:
        return frozenset(ipset_spelling(member) for member in members)
    return cast(frozenset[str], members)
TABLE = "filter"
PARENT_CHAIN = "FORWARD"
JUMP_COMMENT = "netagent: network policy"
OUTPUT_PARENT = "OUTPUT"
OUTPUT_CHAIN = owned.POLICY_PREFIX + "-OUTPUT"     # filter OUTPUT jumps here, IPVS-forwarded packets only
OUTPUT_JUMP_MATCH = ("-m", "ipvs", "--ipvs", "--vdir", "ORIGINAL")
OUTPUT_JUMP_COMMENT = "netagent: network policy (IPVS-forwarded)"


def known_set(family: IpFamily) -> str:
    """KNOWN's name in this family (ipset's names are shared by both families)."""
    return owned.POLICY_KNOWN_SET if family is IpFamily.V4 else owned.POLICY_KNOWN_SET6


@dataclass(frozen=True)
class WantedState:
    chains: Mapping[str, Rules]                # every chain of ours, the hook chain(s) first
    sets: Mapping[IpsetSpec, frozenset[str]]   # selector, except and named-port sets
    known: frozenset[str]                      # local pod addresses programmed by this state
    pending: tuple[str, ...] = ()              # local pods left closed: no host interface found
    refused: tuple[str, ...] = ()              # why local pods were left closed: they could not be rendered


def _rule(*match: str, comment: str, target: str) -> tuple[str, ...]:
    return canonical_spec([*match, "-m", "comment", "--comment", comment[:250], "-j", target])


def _peer_match(peer: SetRef | CidrMatch | None, side: str) -> list[str]:
    if peer is None:
        return []
    if isinstance(peer, SetRef):
        return ["-m", "set", "--match-set", peer.name, side]
    # iptables-save omits a /0 address match, so it is not written (it would look like drift)
    match = [] if peer.cidr.endswith("/0") else ["-s" if side == "src" else "-d", peer.cidr]
    if peer.excepts is not None:
        match += ["-m", "set", "!", "--match-set", peer.excepts.name, side]
    return match


def _port_match(port: PortMatch | None) -> list[str]:
    if port is None:
        return []
    protocol = port.protocol.value.lower()
    if port.first is None:
        return ["-p", protocol]
    ports = str(port.first) if port.last in (None, port.first) else f"{port.first}:{port.last}"
    return ["-p", protocol, "-m", protocol, "--dport", ports]


def header_comment(pod: PodPlan, *, ingress: bool) -> str:
    """The first rule's comment: whose chain this is and which policies make it (read back by
    `netagent status policy`; the rule has no target, so it only counts)."""
    policies = pod.ingress_policies if ingress else pod.egress_policies
    text = f"{HEADER}{'ingress' if ingress else 'egress'} {pod.key} {pod.ip} selected by {','.join(policies)}"
    return text if len(text) <= 250 else text[:247] + "..."


@functools.lru_cache(maxsize=16384)
def render_pod_chain(allows: tuple[Allow, ...], *, pod: PodPlan, ingress: bool) -> Rules:
    """A pod chain; cached, since a sync re-renders every pod and most chains do not change."""
    side = "src" if ingress else "dst"
    rules = [canonical_spec(["-m", "comment", "--comment", header_comment(pod, ingress=ingress)])]
    for allow in allows:
        match = _peer_match(allow.peer, side) + _port_match(allow.port)
        if allow.named is not None:
            match += ["-m", "set", "--match-set", allow.named.name, "dst,dst"]
        rules.append(_rule(*match, comment=f"netagent policy: allow {allow.origin}", target="RETURN"))
    word = "ingress to" if ingress else "egress from"
    rules.append(_log_rule(pod, ingress=ingress))
    rules.append(_rule(comment=f"netagent policy: deny {word} {pod.key}", target="DROP"))
    return tuple(rules)


def _log_rule(pod: PodPlan, *, ingress: bool) -> tuple[str, ...]:
    """What reaches the DROP first goes to the policy's nflog group (at most nflog.LOG_RATE a
    second per chain), prefixed with the chain's name: `netagent flows` names the pod and policies
    from it (policy/flows.py). The prefix is the chain name, ours and plain; escaped as any
    token by the restore writer."""
    chain = pod_chain(owned.POLICY_INGRESS_PREFIX if ingress else owned.POLICY_EGRESS_PREFIX, pod.key)
    limit, target = nflog.iptables_log(chain)
    return canonical_spec([*limit, "-m", "comment", "--comment", f"netagent policy: log denied {pod.key}"[:250], *target])


def _hooks(plan: PodPlan, interface: str, settings: RenderSettings, *, chain: str,
           ingress: bool) -> list[tuple[str | None, tuple[str, ...]]]:
    """(bucket, rule) per hook of a pod chain; bucket None: straight in the hook chain."""
    comment = f"netagent policy: {'ingress to' if ingress else 'egress from'} {plan.key}"
    digit = _interface_bucket(interface)
    bucket = None if digit is None else f"{BUCKET_PREFIX}{'I' if ingress else 'E'}{digit}"
    if settings.mode is PodAttachment.ROUTED:
        return [(bucket, _rule("-o" if ingress else "-i", interface, comment=comment, target=chain))]
    if not ingress:
        return [(bucket, _rule("-m", "physdev", "--physdev-in", interface, comment=comment, target=chain))]
    return [(bucket, _rule("-o", settings.bridge, "-m", "physdev", "--physdev-out", interface,
                           "--physdev-is-bridged", comment=comment, target=chain)),
            (_block_bucket("R", plan.ip),
             _rule("-d", plan.ip, "-o", settings.bridge, "-m", "physdev", "!", "--physdev-is-bridged",
                   comment=comment + " (routed)", target=chain))]


def _output_hook(plan: PodPlan, interface: str, settings: RenderSettings, *, chain: str,
                 ingress: bool) -> tuple[str | None, tuple[str, ...]]:
    """(bucket, rule) of a pod chain in NETAGENT-NP-OUTPUT, for IPVS-forwarded packets."""
    comment = f"netagent policy: {'ingress to' if ingress else 'egress from'} {plan.key} (IPVS)"
    if not ingress:
        return _block_bucket("S", plan.ip), _rule("-s", plan.ip, comment=comment, target=chain)
    device = interface if settings.mode is PodAttachment.ROUTED else settings.bridge
    return _block_bucket("D", plan.ip), _rule("-d", plan.ip, "-o", device, comment=comment, target=chain)


def _bucket_entry(bucket: str, settings: RenderSettings) -> tuple[str, ...]:
    """The hook chain's rule into a bucket: by interface digit, or by /28 for routed ingress."""
    kind, key = bucket[len(BUCKET_PREFIX)], bucket[len(BUCKET_PREFIX) + 1:]
    if kind in "SD" and len(key) == V6_KEY:
        return _rule(comment=f"netagent policy: IPv6 pods (IPVS, {'egress' if kind == 'S' else 'ingress'})",
                     target=bucket)
    if kind in "RSD":
        block = f"{ipaddress.IPv4Address(int(key, 16))}/28"
        if kind == "S":
            return _rule("-s", block, comment=f"netagent policy: pods in {block} (IPVS, egress)", target=bucket)
        if kind == "D":
            return _rule("-d", block, comment=f"netagent policy: pods in {block} (IPVS, ingress)", target=bucket)
        return _rule("-d", block, "-o", settings.bridge, "-m", "physdev", "!", "--physdev-is-bridged",
                     comment=f"netagent policy: pods in {block} (routed)", target=bucket)
    wildcard = owned.HOST_VETH_PREFIX + key + "+"
    comment = f"netagent policy: pods on {wildcard}"
    if settings.mode is PodAttachment.ROUTED:
        return _rule("-o" if kind == "I" else "-i", wildcard, comment=comment, target=bucket)
    if kind == "E":
        return _rule("-m", "physdev", "--physdev-in", wildcard, comment=comment, target=bucket)
    return _rule("-o", settings.bridge, "-m", "physdev", "--physdev-out", wildcard, "--physdev-is-bridged",
                 comment=comment, target=bucket)


def render_wanted(plan: NodePlan, *, settings: RenderSettings,
                  interface_of: Callable[[PodPlan], str | None]) -> WantedState:
    """Everything the plan asks of the kernel. Pods whose host interface is unknown are left
    out (and out of KNOWN, so they stay closed) and listed in `pending`.

    The per-pod hooks are grouped in bucket chains (by the veth's first hex digit; routed
    ingress in bridge mode by the pod's /28), so a new connection walks about 16 + n/16
    hooks instead of n."""
    chains: dict[str, Rules] = {}
    hooks: dict[str | None, list[tuple[str, ...]]] = {}
    known, pending = set(), []
    refused: list[str] = []
    directory: dict[str, list[tuple[str, ...]]] = {}
    used: set[SetRef] = set()
    members, broken = checked_sets(plan, refused)
    for pod in plan.pods:
        try:
            interface = interface_of(pod) if pod.isolated else ""
            if interface is None:
                pending.append(pod.key)
                continue
            done = _render_pod(pod, interface, settings, broken=broken)
        except Exception as error:     # the guard: this pod stays closed (not in KNOWN), the others go on
            refused.append(f"pod {pod.key}: cannot be rendered ({type(error).__name__}: {str(error)[:160]}); "
                           f"it stays closed")
            continue
        pod_chains, pod_hooks, refs, entry = done
        known.add(pod.ip)
        directory.setdefault(_directory_bucket(pod.ip), []).append(entry)
        chains.update(pod_chains)
        for bucket, rule in pod_hooks:
            hooks.setdefault(bucket, []).append(rule)
        used.update(refs)
    buckets = [b for b in hooks if b is not None]
    heads = _heads(settings, hooks.get(None, ()), buckets)
    sets = {set_spec(ref): spelled(ref, held) for ref, held in members.items() if ref in used}
    pods_by_block = {name: tuple(sorted(directory[name])) for name in sorted(directory)}
    return WantedState({**heads, **{b: tuple(sorted(hooks[b])) for b in _ordered(buckets)}, **chains, **pods_by_block},
                       sets, frozenset(known), tuple(pending), tuple(refused))


def set_spec(ref: SetRef) -> IpsetSpec:
    return IpsetSpec(ref.name, SET_TYPES[ref.kind], comment=ref.key[:200], max_elements=ref.capacity,
                     family=ref.family.ipset)


def _heads(settings: RenderSettings, loose: Sequence[tuple[str, ...]], buckets: Sequence[str]) -> dict[str, Rules]:
    """The hook chain(s): replies, (IPv6) neighbour discovery, the KNOWN guard, hooks outside any
    bucket (sorted: each pod's hooks match only its own interface or address, so their order
    decides nothing), then one entry per bucket."""
    replies = _rule("-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED",
                    comment="netagent policy: replies of allowed connections", target="RETURN")
    guard: list[tuple[str, ...]] = []
    for cidr in settings.local_cidrs:
        guard.append(_rule("-s", cidr, "-m", "set", "!", "--match-set", known_set(settings.family), "src",
                          comment="netagent policy: pod not programmed yet", target="DROP"))
        guard.append(_rule("-d", cidr, "-m", "set", "!", "--match-set", known_set(settings.family), "dst",
                          comment="netagent policy: pod not programmed yet", target="DROP"))
    ordered = _ordered(buckets)
    hook = [replies, *ndp.iptables_rules(settings.family), *guard, *sorted(loose)]
    hook.extend(_bucket_entry(bucket, settings) for bucket in ordered if bucket[len(BUCKET_PREFIX)] in "EIR")
    heads = {owned.POLICY_CHAIN: tuple(hook)}
    if settings.services is ServicePath.OUTPUT:
        local = _rule("-m", "addrtype", "--src-type", "LOCAL",
                      comment="netagent policy: connections the node makes (IPVS)", target="RETURN")
        heads[OUTPUT_CHAIN] = (replies, local, *guard, *(_bucket_entry(bucket, settings) for bucket in ordered
                                                         if bucket[len(BUCKET_PREFIX)] in "SD"))
    return heads


def _ordered(buckets: Sequence[str]) -> list[str]:
    return sorted(buckets, key=lambda b: (BUCKET_KINDS.index(b[len(BUCKET_PREFIX)]), b))


def render_wanted_with_pod(previous: WantedState, added: PodAdded, *, settings: RenderSettings,
                           interface_of: Callable[[PodPlan], str | None]) -> WantedState | None:
    """`previous` (`render_wanted` of the plan without the pod) with `added.pod`: what
    `render_wanted(added.plan)` gives, from the pod's own pieces (its chains, its hooks sorted
    into their buckets, its directory entry, its address in the sets it joined and in KNOWN).
    None when the pod would be pending or refused, or has a hook outside the buckets."""
    pod = added.pod
    if previous.refused or pod.ip in previous.known:
        return None
    interface = interface_of(pod) if pod.isolated else ""
    if interface is None:
        return None
    pod_chains, pod_hooks, refs, entry = _render_pod(pod, interface, settings, broken=set())
    if any(name in previous.chains for name in pod_chains) or any(bucket is None for bucket, _ in pod_hooks):
        return None
    specs = {spec.name: spec for spec in previous.sets}
    grown = {ref: frozenset((pod.ip,)) for ref in added.grown if ref.name in specs}
    new = {ref: members for ref, members in added.new.items() if ref in refs and ref.name not in specs}
    refused: list[str] = []
    members, broken = checked_sets(NodePlan((), {**grown, **new}), refused)
    if refused or broken or any(ref.name not in specs and ref not in new for ref in refs):
        return None
    sets = dict(previous.sets)
    for ref in grown:
        sets[specs[ref.name]] = previous.sets[specs[ref.name]] | spelled(ref, members[ref])
    for ref in new:
        sets[set_spec(ref)] = spelled(ref, members[ref])
    chains = dict(previous.chains)
    chains.update(pod_chains)
    block = _directory_bucket(pod.ip)
    chains[block] = tuple(sorted((*chains.get(block, ()), entry)))
    fresh = [bucket for bucket, _ in pod_hooks if bucket is not None and bucket not in chains]
    for bucket, rule in pod_hooks:
        assert bucket is not None
        chains[bucket] = tuple(sorted((*chains.get(bucket, ()), rule)))
    if fresh:
        _rehead(chains, previous, settings)
    return WantedState(chains, sets, previous.known | {pod.ip}, previous.pending, previous.refused)


def render_wanted_without_pod(previous: WantedState, removed: PodRemoved, *,
                              settings: RenderSettings) -> WantedState | None:
    """`previous` without `removed.pod`: what `render_wanted(removed.plan)` gives (its chains,
    hooks, directory entry, set memberships and KNOWN entry gone; buckets, directory chains and
    sets left empty gone too). None when the pod is not there as rendered, or pods are pending."""
    pod = removed.pod
    own = removable_chains(pod, previous.chains, previous.known, clean=not (previous.refused or previous.pending))
    if own is None:
        return None
    chains = {name: rules for name, rules in previous.chains.items() if name not in own}
    emptied = False
    for name in [name for name in chains if own and _is_bucket(name)]:
        kept = tuple(rule for rule in chains[name] if jump_target(rule) not in own)
        if not kept:
            del chains[name]
            emptied = True
        elif len(kept) != len(chains[name]):
            chains[name] = kept
    block, entry = _directory_bucket(pod.ip), _directory_entry(pod)
    if entry not in chains.get(block, ()):
        return None
    chains[block] = tuple(rule for rule in chains[block] if rule != entry)
    if not chains[block]:
        del chains[block]
    if emptied:
        _rehead(chains, previous, settings)
    specs = {spec.name: spec for spec in previous.sets}
    sets = {spec: members for spec, members in previous.sets.items()
            if spec.name not in {ref.name for ref in removed.dropped}}
    for ref in removed.shrunk:
        spec = specs.get(ref.name)
        if spec is not None and spec in sets:
            sets[spec] = sets[spec] - {canonical_member(spec.type, pod.ip)}
    return WantedState(chains, sets, previous.known - {pod.ip}, previous.pending, previous.refused)


def _rehead(chains: dict[str, Rules], previous: WantedState, settings: RenderSettings) -> None:
    """The hook chain(s) again, for the buckets `chains` now has (one came or went)."""
    head = previous.chains[owned.POLICY_CHAIN]
    fixed = 1 + len(ndp.iptables_rules(settings.family)) + 2 * len(settings.local_cidrs)   # replies, NDP, the KNOWN guard
    loose = [rule for rule in head[fixed:] if not _is_bucket(jump_target(rule) or "")]
    chains.update(_heads(settings, loose, [name for name in chains if _is_bucket(name)]))


def _is_bucket(name: str) -> bool:
    kind = name[len(BUCKET_PREFIX):len(BUCKET_PREFIX) + 1]
    return name.startswith(BUCKET_PREFIX) and kind != "" and kind in BUCKET_KINDS and name not in (
        owned.POLICY_CHAIN, OUTPUT_CHAIN)


def _render_pod(pod: PodPlan, interface: str, settings: RenderSettings, *,
                broken: set[SetRef]) -> tuple[dict[str, Rules], list[tuple[str | None, tuple[str, ...]]],
                                              set[SetRef], tuple[str, ...]]:
    """(chains, hooks, sets used, directory entry) of one pod; raises when it cannot be rendered."""
    if pod.isolated and not INTERFACE_NAME.match(interface):
        raise ValueError(f"host interface {interface[:40]!r} is not an interface name")
    if IpFamily.of(pod.ip) is not settings.family:
        raise ValueError(f"{pod.ip} is not of the rendered family ({settings.family.label})")
    chains: dict[str, Rules] = {}
    hooks: list[tuple[str | None, tuple[str, ...]]] = []
    directions, refs = pod_directions(pod)
    for allows, chain, ingress in directions:
        chains[chain] = render_pod_chain(allows, pod=pod, ingress=ingress)
        hooks.extend(_hooks(pod, interface, settings, chain=chain, ingress=ingress))
        if settings.services is ServicePath.OUTPUT:
            hooks.append(_output_hook(pod, interface, settings, chain=chain, ingress=ingress))
    if refs & broken:
        raise ValueError(f"it uses a set that cannot be written ({sorted(r.key[:60] for r in refs & broken)})")
    return chains, hooks, refs, _directory_entry(pod)


def _directory_entry(pod: PodPlan) -> tuple[str, ...]:
    return canonical_spec(["-d", pod.ip, "-m", "comment", "--comment", f"{POD_ENTRY}{pod.key} {pod.ip}"[:250]])


def render_chains(chains: Mapping[str, Rules], *, remove: Sequence[str] = (),
                  unhook: Sequence[tuple[str, tuple[str, ...]]] = ()) -> RestoreBuilder:
    """Restore input (for --noflush) that (re)writes `chains` and removes the chains in
    `remove`: every chain is declared before any rule, so jumps to new chains resolve, and the
    removed ones go last, once nothing written above refers to them. `unhook`: (built-in
    chain, rule) jumps into removed chains, deleted first."""
    builder = RestoreBuilder()
    for parent, rule in unhook:
        builder.delete(TABLE, parent, rule)
    for name in chains:
        builder.declare_chain(TABLE, name)
    for name, rules in chains.items():
        for spec in rules:
            builder.append(TABLE, name, spec)
    for name in remove:
        builder.flush_chain(TABLE, name)
    for name in remove:
        builder.delete_chain(TABLE, name)
    return builder
