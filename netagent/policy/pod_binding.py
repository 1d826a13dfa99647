"""Pods bound to their addresses by the CNI ADD, before the kubelet reports them.

Why. A new pod is closed (out of the KNOWN set) until its policy is programmed, and the engine
learns a pod's address from the Pod's `status.podIP`, which the kubelet reports only after the
sandbox exists: seconds on a loaded node, never while the API is unreachable. The CNI ADD
chooses that address and names the pod (`K8S_POD_NAMESPACE`, `K8S_POD_NAME` in `CNI_ARGS`),
so the CNI server binds the two here (`PolicyEngine.bind_pod`) and the engine plans the pod
with the bound address, from the reflector's cache (its labels, its namespace's), before the
ADD replies. No API call is made on the CNI path.

What this module owns:
- `PodBindings`: pod key -> `Binding` (container, addresses, host interface); `overlay` lays
  them over the parsed `ClusterView` (a bound address wins over the status one, and a status
  address that another pod is now bound to, or that the pod's own DEL released, is nobody's);
- the group commit: every caller records its binding and bumps `epoch`; a sync (on the
  runner's thread or on a caller, under the engine's one sync lock) takes every binding
  recorded before it started, so a burst of ADDs coalesces into a few writes, each caller
  waiting only until a sync that started after its binding has succeeded (`wait`);
- `ClosedReason`: why an ADD returned with its pod still closed (the metric's label);
- `pod_key`: CNI_ARGS' pod identity, checked (DNS-1123 label namespace, subdomain name);
  anything else is an unknown pod, never looked up.

A binding outlives the ADD's wait: a pod not yet in the cache when the wait ends is programmed
by the first sync that sees it (the Pod's arrival requests one). The kubelet's later report of
the same address changes nothing the plan reads, so that sync writes nothing. Bindings live in
memory only: a restarted agent plans from the status addresses, as before.
"""
from __future__ import annotations

import enum
import ipaddress
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace

from netagent.policy.semantics import ClusterView, PodPlan

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
NAMESPACE_MAX, NAME_MAX = 63, 253


def pod_key(namespace: object, name: object) -> str | None:
    """`namespace/name` when both are well-formed Kubernetes names, else None (unknown pod)."""
    if not isinstance(namespace, str) or not isinstance(name, str):
        return None
    if not 0 < len(namespace) <= NAMESPACE_MAX or not _LABEL.match(namespace):
        return None
    if not 0 < len(name) <= NAME_MAX or not _SUBDOMAIN.match(name):
        return None
    return f"{namespace}/{name}"


def bound_addresses(addresses: Iterable[str]) -> tuple[str, ...]:
    """The addresses the policy engine enforces, of those an ADD chose: the first of each
    family, IPv4 first (the primary, as kube_objects.py orders a Pod's `status.podIPs`);
    v4-mapped, zoned and link-local ones are never a pod's."""
    found: dict[int, str] = {}
    for text in addresses:
        try:
            address = ipaddress.ip_interface(text).ip
        except ValueError:
            continue
        if "%" in text or address.is_link_local or (isinstance(address, ipaddress.IPv6Address)
                                                   and address.ipv4_mapped is not None):
            continue
        found.setdefault(address.version, str(address))
    return tuple(found[version] for version in (4, 6) if version in found)


class ClosedReason(enum.Enum):
    UNKNOWN_POD = "unknown-pod"                    # CNI_ARGS name no pod, or not a well-formed one
    ENGINE_NOT_SYNCED = "engine-not-synced"        # the caches have not listed yet
    POD_NOT_IN_CACHE = "pod-not-in-cache"          # no Pod object within the wait
    NOT_PROGRAMMABLE = "pod-not-programmable"      # cached, but not a local pod network pod (node, phase)
    PROGRAMMING_FAILED = "programming-failed"      # the sync raised; the runner retries
    ENGINE_BUSY = "engine-busy"                    # a sync held the lock past the deadline


@dataclass(frozen=True)
class Binding:
    container_id: str
    ip: str                         # the primary address (the pod's identity in the plan)
    interface: str
    bound_at: float                 # monotonic: the programming-latency metric's start
    ips: tuple[str, ...] = ()       # dual-stack: every address, `ip` first


@dataclass(frozen=True)
class BindOutcome:
    programmed: bool
    reason: ClosedReason | None = None
    syncs_run: int = 0              # syncs this caller ran itself (the rest it found done)
    incremental: bool = False       # programmed alone (PolicyEngine._one_pod), not by a sync


class PodBindings:
    """The bindings and the group commit's bookkeeping; every method is thread-safe."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic,
                 observe: Callable[[float], None] = lambda seconds: None) -> None:
        self.clock = clock
        self._observe = observe
        self._cond = threading.Condition()
        self._bindings: dict[str, Binding] = {}
        self._released: dict[str, str] = {}           # pod key -> address its DEL released
        self._unobserved: set[str] = set()             # bound, not yet seen programmed
        self._programmed: dict[str, str] = {}          # pod key -> address, as the last sync left them
        self.version = 0                               # bumped by every bind and unbind
        self.epoch = 0                                 # bumped by those and by every watched change
        self.synced_epoch = -1                         # epoch at the start of the last good sync

    # ----------------------------------------------------------- changes (any thread)
    def bind(self, key: str, binding: Binding) -> int:
        with self._cond:
            self._bindings[key] = binding
            self._released.pop(key, None)
            self._unobserved.add(key)
            return self._bump(version=True)

    def unbind(self, key: str, container_id: str) -> int | None:
        """Forget the pod's binding if `container_id` made it; the epoch to sync to, or None."""
        with self._cond:
            binding = self._bindings.get(key)
            if binding is None or binding.container_id != container_id:
                return None
            del self._bindings[key]
            self._unobserved.discard(key)
            self._released[key] = binding.ip
            return self._bump(version=True)

    def changed(self) -> None:
        """A watched object changed: waiters look again (a sync may now program their pod)."""
        with self._cond:
            self._bump(version=False)

    def _bump(self, *, version: bool) -> int:
        if version:
            self.version += 1
        self.epoch += 1
        self._cond.notify_all()
        return self.epoch

    # ----------------------------------------------------------- the sync (under the engine's lock)
    def overlay(self, view: ClusterView, *, node_name: str) -> ClusterView:
        """The view with bound addresses: what the engine plans from."""
        with self._cond:
            bindings, released = dict(self._bindings), dict(self._released)
        if not bindings and not released:
            return view
        pods = dict(view.pods)
        effective = {key: binding for key, binding in bindings.items()
                     if (info := pods.get(key)) is not None and not info.host_network and info.node_name == node_name}
        owner = {binding.ip: key for key, binding in effective.items()}
        stale = []
        for key, info in view.pods.items():
            if info.ip is None:
                continue
            if owner.get(info.ip, key) != key or released.get(key) == info.ip:
                pods[key] = replace(info, ip=None)      # reused by a newer ADD, or released by a DEL
            elif key in released:
                stale.append(key)                       # the status moved on: nothing left to hide
        for key in (k for k in released if k not in view.pods):
            stale.append(key)
        for key, binding in effective.items():
            pods[key] = replace(pods[key], ip=binding.ip, ips=binding.ips if len(binding.ips) > 1 else ())
        if stale:
            with self._cond:
                for key in stale:
                    if self._released.get(key) == released[key]:
                        del self._released[key]
        return ClusterView(pods, view.namespaces, view.policies)

    def interface(self, plan: PodPlan) -> str | None:
        with self._cond:
            binding = self._bindings.get(plan.key)
        return binding.interface if binding is not None and plan.ip in (binding.ips or (binding.ip,)) else None

    def synced(self, epoch: int, plans: Iterable[PodPlan] | None, pending: Iterable[str] = (), *,
               added: PodPlan | None = None, gone: str | None = None) -> None:
        """A sync that started at `epoch` succeeded; `plans` what it programmed (None: unchanged),
        `added` one pod programmed on top of that, `gone` one removed (the incremental path)."""
        now = self.clock()
        with self._cond:
            if gone is not None:
                self._programmed.pop(gone, None)
            if added is not None:
                self._programmed[added.key] = added.ip
            if plans is not None:
                closed = set(pending)
                self._programmed = {plan.key: plan.ip for plan in plans if plan.key not in closed}
            for key in list(self._unobserved):
                binding = self._bindings.get(key)
                if binding is not None and self._programmed.get(key) == binding.ip:
                    self._unobserved.discard(key)
                    self._observe(max(0.0, now - binding.bound_at))
            self.synced_epoch = max(self.synced_epoch, epoch)
            self._cond.notify_all()

    # ----------------------------------------------------------- the caller's wait
    def is_programmed(self, key: str, ip: str) -> bool:
        with self._cond:
            return self._programmed.get(key) == ip

    def wait(self, key: str, ip: str, target: int, *, deadline: float, sync_to: Callable[[int, float], int],
             cached: Callable[[str], bool]) -> BindOutcome:
        """Until `key` is programmed with `ip`, or `deadline` (monotonic). `sync_to(epoch,
        deadline)` makes sure a sync that started at `epoch` or later has succeeded (running one
        if none has) and returns how many it ran; it raises on failure, TimeoutError when busy."""
        runs = 0
        while True:
            try:
                runs += sync_to(target, deadline)
            except TimeoutError:
                return BindOutcome(False, ClosedReason.ENGINE_BUSY, runs)
            except Exception:
                return BindOutcome(False, ClosedReason.PROGRAMMING_FAILED, runs)
            if self.is_programmed(key, ip):
                return BindOutcome(True, None, runs)
            with self._cond:           # wait for the next change (the Pod arriving, a policy)
                while self.epoch <= target:
                    remaining = deadline - self.clock()
                    if remaining <= 0:
                        reason = ClosedReason.NOT_PROGRAMMABLE if cached(key) else ClosedReason.POD_NOT_IN_CACHE
                        return BindOutcome(False, reason, runs)
                    self._cond.wait(remaining)
                target = self.epoch

    def bound(self) -> Mapping[str, Binding]:
        with self._cond:
            return dict(self._bindings)
