"""The policy engine of one node: three watch recorders, the parsed view, and the sync function.

Seam 1 of ARCHITECTURE.md: the NetworkPolicy, Pod and Namespace reflectors deliver into
`ChangeRecorder`s that only keep (previous, current) and ask for a sync; updates that change
nothing the policies read (a pod's status conditions, a namespace's annotations) are not
even recorded. On the sync thread, `sync(kind)` drains them into a `ClusterView` (parsing
only what changed), plans (semantics.py), and hands the plan to its `PolicyDataplane` (dataplane.py: iptables
or nftables, the engine does not know which) to render and apply, which writes only the difference: a PARTIAL sync against what it last wrote, a FULL one
against the kernel (adoption, drift repair).

Every object is untrusted. A drained change not yet folded into the view goes back to its
recorder (`requeue`); each object is parsed alone (kube_objects.py never raises, and a guard here
reads anything unexpected closed), so one bad object costs no other its change. The view is
what the kernel must hold: a sync that fails after draining leaves its changes in the view,
and the next sync (FULL, the runner's rule) programs them. An object that could not be read
fully is *rejected* in the `RejectionScope` (log, `netagent_rejected_objects{kind,reason}`,
an Event, /healthz's details) while it stays in the view closed, and *accepted* again once
it is fixed or deleted.

A local pod whose host interface cannot be found stays closed (not in KNOWN); the sync says
which pods wait (log, `netagent_policy_pods{state="pending"}`) and every later sync looks again.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from netagent.infra.metrics import Gauge, Histogram, Registry, exponential_buckets
from netagent.infra.rejections import ObjectRef, RejectionScope, standalone
from netagent.infra.sync_runner import SyncKind, SyncResult
from netagent.kube.changes import ChangeRecorder
from netagent.policy.kube_objects import (
    DEFAULT_LIMITS,
    MALFORMED,
    PolicyLimits,
    Reading,
    parse_namespace,
    parse_pod,
    parse_policy,
)
from netagent.policy.model import LabelSelector, NamespaceInfo, NetworkPolicy, PolicyType
from netagent.policy.dataplane import ApplyReport, PolicyDataplane, Rendered
from netagent.policy.render import RenderSettings
from netagent.policy.semantics import ClusterView, NodePlan, PodPlan, plan_node

log = logging.getLogger("netagent.policy")

InterfaceLookup = Callable[[PodPlan], "str | None"]


@dataclass(frozen=True)
class PolicySettings:
    node_name: str
    render: RenderSettings
    limits: PolicyLimits = DEFAULT_LIMITS


def _guarded(relevant: Callable[[dict, dict], bool]) -> Callable[[dict, dict], bool]:
    """A `relevant` filter that cannot raise on the watch thread: unreadable means relevant."""
    def check(old: dict, new: dict) -> bool:
        try:
            return relevant(old, new)
        except Exception:
            return True
    return check


def _pod_relevant(old: dict, new: dict) -> bool:
    def read(obj: dict) -> tuple:
        meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
        ports = [c.get("ports") for c in spec.get("containers") or [] if isinstance(c, dict)]
        return (meta.get("labels"), spec.get("nodeName"), spec.get("hostNetwork"), status.get("podIP"),
                status.get("podIPs"), status.get("phase"), ports)
    return read(old) != read(new)


def _namespace_relevant(old: dict, new: dict) -> bool:
    return (old.get("metadata") or {}).get("labels") != (new.get("metadata") or {}).get("labels")


def _policy_relevant(old: dict, new: dict) -> bool:
    return old.get("spec") != new.get("spec")


class PolicyMetrics:
    def __init__(self, registry: Registry) -> None:
        self.sync_seconds = registry.register(Histogram(
            "netagent_policy_sync_duration_seconds", "network policy sync duration",
            buckets=exponential_buckets(0.001, 2, 15), labels=("kind",)))
        self.pods = registry.register(Gauge(
            "netagent_policy_pods", "local pods by policy state", labels=("state",)))


class PolicyEngine:
    """Owns the recorders and the view; `sync` is the SyncRunner's function."""

    def __init__(self, settings: PolicySettings, *, programmer: PolicyDataplane, interface_of: InterfaceLookup,
                 registry: Registry | None = None, rejections: RejectionScope | None = None) -> None:
        self.settings = settings
        self.programmer = programmer
        self.interface_of = interface_of
        self._request: Callable[[], None] = lambda: None
        poke = self._poke
        self.policies = ChangeRecorder("networkpolicies", on_change=poke, relevant=_guarded(_policy_relevant))
        self.pods = ChangeRecorder("pods", on_change=poke, relevant=_guarded(_pod_relevant))
        self.namespaces = ChangeRecorder("namespaces", on_change=poke, relevant=_guarded(_namespace_relevant))
        self.rejections = rejections if rejections is not None else standalone("policy")
        self.view = ClusterView()
        self.unprogrammed: tuple[str, ...] = ()     # what the last sync could not plan or render
        self.plan: NodePlan | None = None
        self.wanted: Rendered | None = None
        self.last_report: ApplyReport | None = None
        self._in_sync = False            # the last sync applied everything the view asks for
        self.metrics = PolicyMetrics(registry) if registry is not None else None

    def set_requester(self, request: Callable[[], None]) -> None:
        self._request = request

    def _poke(self) -> None:
        if self.caches_synced():
            self._request()

    def caches_synced(self) -> bool:
        return all(recorder.synced.is_set() for recorder in (self.policies, self.pods, self.namespaces))

    def drain(self) -> int:
        """Fold recorded changes into the view, each object alone; returns how many changed.
        A change not folded (the fold raised past its guard) is requeued for the next sync."""
        changed = 0
        for kind, recorder, fold in ((POLICY, self.policies, self._fold_policy), (POD, self.pods, self._fold_pod),
                                     (NAMESPACE, self.namespaces, self._fold_namespace)):
            pending = recorder.drain()
            try:
                while pending:
                    key, (_, current) = next(iter(pending.items()))
                    try:
                        fold(key, current)
                    except Exception as error:   # the guard behind the parsers' own: read it closed
                        self._fold_unreadable(kind, key, current, error)
                    del pending[key]
                    changed += 1
            finally:
                recorder.requeue(pending)   # what was not folded waits for the next sync
        return changed

    def _record(self, kind: str, key: str, obj: object, reading: Reading) -> None:
        if not reading.reason:
            self.rejections.accept(kind=kind, key=key)
            return
        self.rejections.reject(_ref(kind, key, obj), reason=reading.reason, detail="; ".join(reading.problems))

    def _fold_policy(self, key: str, current: dict | None) -> None:
        if current is None:
            self.view.policies.pop(key, None)
            self.rejections.accept(kind=POLICY, key=key)
            return
        reading = parse_policy(current, key=key, limits=self.settings.limits)
        self.view.policies[key] = reading.value
        self._record(POLICY, key, current, reading)

    def _fold_pod(self, key: str, current: dict | None) -> None:
        if current is None:
            self.view.pods.pop(key, None)
            self.rejections.accept(kind=POD, key=key)
            return
        reading = parse_pod(current, key=key)
        self.view.pods[key] = reading.value
        self._record(POD, key, current, reading)

    def _fold_namespace(self, key: str, current: dict | None) -> None:
        if current is None:
            self.view.namespaces.pop(key, None)
            self.rejections.accept(kind=NAMESPACE, key=key)
            return
        reading = parse_namespace(current, key=key)
        self.view.namespaces[key] = reading.value
        self._record(NAMESPACE, key, current, reading)

    def _fold_unreadable(self, kind: str, key: str, current: dict | None, error: Exception) -> None:
        namespace, _, name = key.rpartition("/")
        detail = f"{kind} {key}: cannot be read ({type(error).__name__}); "
        if kind == POLICY:
            self.view.policies[key] = NetworkPolicy(namespace, name, LabelSelector(),
                                                    frozenset(PolicyType), closed="unreadable")
            detail += f"it isolates every pod of {namespace} both ways"
        elif kind == POD:
            self.view.pods.pop(key, None)
            detail += "left unprogrammed"
        else:
            self.view.namespaces[key] = NamespaceInfo(key, (), labels_known=False)
            detail += "matched by no namespace selector but an empty one"
        self.rejections.reject(_ref(kind, key, current), reason=MALFORMED, detail=detail)

    def sync(self, kind: SyncKind) -> SyncResult:
        started = time.monotonic()
        changed = self.drain()
        if kind is SyncKind.PARTIAL and not changed and self._in_sync:
            return SyncResult.SUCCEEDED
        self._in_sync = False
        self.plan = plan_node(self.view, node_name=self.settings.node_name)
        self.wanted = wanted = self.programmer.render(self.plan, settings=self.settings.render,
                                                      interface_of=self.interface_of)
        unprogrammed = self.plan.problems + self.wanted.refused
        if unprogrammed != self.unprogrammed:        # said once, not every sync
            for problem in unprogrammed:
                log.warning("network policy: %s", problem)
        self.unprogrammed = unprogrammed
        self.last_report = self.programmer.apply(wanted, full=kind is SyncKind.FULL)
        self._in_sync = not self.wanted.pending
        if self.metrics is not None:
            self.metrics.sync_seconds.labels(kind=kind.value).observe(time.monotonic() - started)
            isolated = sum(1 for pod in self.plan.pods if pod.isolated)
            self.metrics.pods.labels(state="isolated").set(isolated)
            self.metrics.pods.labels(state="open").set(len(self.plan.pods) - isolated)
            self.metrics.pods.labels(state="pending").set(len(self.wanted.pending))
        if self.wanted.pending:
            # Not a failure: a failing runner turns /healthz red and the kubelet would restart the
            # agent over a pod it cannot program (one another plugin wired, a stale Pod object).
            # The next change or the periodic full sync looks again.
            log.warning("network policy: no host interface for %s; they stay closed until found",
                        ", ".join(self.wanted.pending))
        return SyncResult.SUCCEEDED


POLICY, POD, NAMESPACE = "NetworkPolicy", "Pod", "Namespace"


def _ref(kind: str, key: str, obj: object) -> ObjectRef:
    """The object's reference, named by its recorder key (so `accept` finds the same record)."""
    namespace, _, name = key.rpartition("/")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    uid = metadata.get("uid") if isinstance(metadata, dict) else None
    return ObjectRef(kind=kind, namespace=namespace, name=name, uid=uid if isinstance(uid, str) else "")
