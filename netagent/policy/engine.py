"""The policy engine of one node: three watch recorders, the parsed view, and the sync function.

Seam 1 of ARCHITECTURE.md: the NetworkPolicy, Pod and Namespace reflectors deliver into
`ChangeRecorder`s that only keep (previous, current) and ask for a sync; updates that change
nothing the policies read (a pod's status conditions, a namespace's annotations) are not
even recorded. On the sync thread, `sync(kind)` drains them into a `ClusterView` (parsing
only what changed), plans (incremental.py: from the last plan, only the pods and sets the
changes reach; semantics.py's whole-node plan on a FULL sync, which checks the incremental one
against it, and whenever the incremental one cannot be sure), and hands the plan to its `PolicyDataplane` (dataplane.py: iptables
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

`bind_pod`/`unbind_pod` are the CNI server's entry (pod_binding.py): the address an ADD chose,
planned before the ADD replies. One lock (`_sync_lock`) serializes every sync, the runner's and
a CNI worker's alike, so there is one writer; the dataplane is not told who called.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from netagent.infra.metrics import Counter, Gauge, Histogram, Registry, exponential_buckets
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
from netagent.policy.pod_binding import BindOutcome, Binding, ClosedReason, PodBindings, bound_addresses, pod_key
from netagent.policy.shared import RenderSettings
from netagent.policy.incremental import Basis, replan, snapshot
from netagent.policy.pod_plan import PodAdded, PodRemoved, plan_with_pod, plan_without_pod
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
        self.programming_seconds = registry.register(Histogram(
            "netagent_policy_pod_programming_seconds", "from a pod's CNI ADD to its policy programmed",
            buckets=exponential_buckets(0.0005, 2, 16)))
        self.plans = registry.register(Counter(
            "netagent_policy_plans_total", "plans made: of the whole node, or incremental (only what a change "
            "reaches)", labels=("kind",)))
        self.plan_mismatches = registry.register(Counter(
            "netagent_policy_incremental_plan_mismatches_total", "FULL syncs whose whole-node plan differed from "
            "the incremental plan of the same view (the whole-node plan is programmed; a bug to report)"))
        self.closed_after_add = registry.register(Counter(
            "netagent_policy_pods_closed_after_add_total", "CNI ADDs that returned with the pod still closed "
            "(programmed later, when the reason clears)", labels=("reason",)))


class PolicyEngine:
    """Owns the recorders and the view; `sync` is the SyncRunner's function."""

    def __init__(self, settings: PolicySettings, *, dataplane: PolicyDataplane, interface_of: InterfaceLookup,
                 registry: Registry | None = None, rejections: RejectionScope | None = None) -> None:
        self.settings = settings
        self.dataplane = dataplane
        self.interface_of = interface_of
        self._request: Callable[[], None] = lambda: None
        poke = self._poke
        self.policies = ChangeRecorder("networkpolicies", on_change=poke, relevant=_guarded(_policy_relevant))
        self.pods = ChangeRecorder("pods", on_change=self._pod_changed, relevant=_guarded(_pod_relevant))
        self.namespaces = ChangeRecorder("namespaces", on_change=poke, relevant=_guarded(_namespace_relevant))
        self.rejections = rejections if rejections is not None else standalone("policy")
        self.view = ClusterView()
        self.unprogrammed: tuple[str, ...] = ()     # what the last sync could not plan or render
        self.plan: NodePlan | None = None
        self.wanted: Rendered | None = None
        self.last_report: ApplyReport | None = None
        self._in_sync = False            # the last sync applied everything the view asks for
        self.metrics = PolicyMetrics(registry) if registry is not None else None
        metrics = self.metrics
        self.bindings = PodBindings(observe=metrics.programming_seconds.observe if metrics else lambda s: None)
        self._sync_lock = threading.Lock()
        self._planned_bindings = -1          # bindings.version the last plan was made with
        self._planned_view = self.view       # what it was made from (bound addresses laid over)
        self._basis: Basis | None = None     # the plan and a snapshot of its view: the next plan's start

    def set_requester(self, request: Callable[[], None]) -> None:
        self._request = request

    def _pod_changed(self) -> None:
        self.bindings.changed()          # an ADD waiting for its Pod looks again
        self._poke()

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
        with self._sync_lock:
            return self._sync(kind)

    def _sync(self, kind: SyncKind) -> SyncResult:
        started = time.monotonic()
        epoch, version = self.bindings.epoch, self.bindings.version
        changed = self.drain()
        if kind is SyncKind.PARTIAL and not changed and self._in_sync and version == self._planned_bindings:
            self.bindings.synced(epoch, None)
            return SyncResult.SUCCEEDED
        self._in_sync = False
        self._planned_bindings = version
        self._planned_view = view = self.bindings.overlay(self.view, node_name=self.settings.node_name)
        self.plan = self._plan(view, full=kind is SyncKind.FULL)
        self.wanted = wanted = self.dataplane.render(self.plan, settings=self.settings.render,
                                                      interface_of=self._interface)
        unprogrammed = self.plan.problems + self.wanted.refused
        if unprogrammed != self.unprogrammed:        # said once, not every sync
            for problem in unprogrammed:
                log.warning("network policy: %s", problem)
        self.unprogrammed = unprogrammed
        self.last_report = self.dataplane.apply(wanted, full=kind is SyncKind.FULL)
        self._in_sync = not self.wanted.pending
        self.bindings.synced(epoch, self.plan.pods, self.wanted.pending)
        if self.metrics is not None:
            self.metrics.sync_seconds.labels(kind=kind.value).observe(time.monotonic() - started)
        self._count_pods()
        if self.wanted.pending:
            # Not a failure: a failing runner turns /healthz red and the kubelet would restart the
            # agent over a pod it cannot program (one another plugin wired, a stale Pod object).
            # The next change or the periodic full sync looks again.
            log.warning("network policy: no host interface for %s; they stay closed until found",
                        ", ".join(self.wanted.pending))
        return SyncResult.SUCCEEDED

    def _plan(self, view: ClusterView, *, full: bool) -> NodePlan:
        """Only what changed since the last plan (incremental.py), else the whole node. A FULL
        sync plans the whole node and checks the incremental plan against it: the safety net."""
        node, basis, metrics = self.settings.node_name, self._basis, self.metrics
        incremental = None
        if basis is not None:
            try:
                incremental = replan(basis, view, node_name=node)
            except Exception:
                log.exception("network policy: incremental planning failed; planning the whole node")
        if incremental is None or full:
            plan = plan_node(view, node_name=node)
            if incremental is not None and incremental != plan:
                log.error("network policy: the incremental plan differed from the whole node's; "
                          "the whole node's is programmed")
                if metrics is not None:
                    metrics.plan_mismatches.inc()
        else:
            plan = incremental
        if metrics is not None:
            metrics.plans.labels(kind="incremental" if plan is incremental else "node").inc()
        self._basis = Basis(snapshot(view), plan)
        return plan

    def _count_pods(self) -> None:
        if self.metrics is None or self.plan is None or self.wanted is None:
            return
        isolated = sum(1 for pod in self.plan.pods if pod.isolated)
        self.metrics.pods.labels(state="isolated").set(isolated)
        self.metrics.pods.labels(state="open").set(len(self.plan.pods) - isolated)
        self.metrics.pods.labels(state="pending").set(len(self.wanted.pending))

    def _interface(self, plan: PodPlan) -> str | None:
        return self.bindings.interface(plan) or self.interface_of(plan)

    # ------------------------------------------------------------ the CNI server's entry
    def bind_pod(self, namespace: object, name: object, addresses: tuple[str, ...], interface: str, *,
                 container_id: str, deadline: float) -> BindOutcome:
        """Bind the address an ADD chose to the pod CNI_ARGS name, and return once the pod's policy
        is written, or at `deadline` (monotonic) with the pod closed and the reason. Never raises:
        a failure leaves the pod closed (fail-closed) and the runner programs it later."""
        key, ips = pod_key(namespace, name), bound_addresses(addresses)
        if key is None or not ips:
            return self._closed(BindOutcome(False, ClosedReason.UNKNOWN_POD))
        ip = ips[0]
        target = self.bindings.bind(key, Binding(container_id, ip, interface, time.monotonic(), ips))
        if not self.caches_synced() or self.last_report is None:
            self._request()            # programmed by the runner once the caches list
            return self._closed(BindOutcome(False, ClosedReason.ENGINE_NOT_SYNCED))
        if self._one_pod(key, ips, deadline):
            return BindOutcome(True, None, 1, incremental=True)
        outcome = self.bindings.wait(key, ip, target, deadline=deadline, sync_to=self._sync_to,
                                     cached=lambda k: k in self.view.pods)
        return self._closed(outcome) if not outcome.programmed else outcome

    def _one_pod(self, key: str, ips: tuple[str, ...], deadline: float) -> bool:
        """The pod alone (`ips`: bound by an ADD, primary first; (): released by a DEL), when the engine holds
        the plan of everything else and nothing but this binding changed since: its chains, set
        memberships and KNOWN entry: pod_plan.py's change to the plan, the dataplane's render of
        the state with or without the pod (`render_with_pod`, `render_without_pod`), and the
        same PARTIAL `apply` as a sync, which writes that difference; the plan and wanted state
        as a full sync would leave them. False (nothing written) when that does not apply: the
        caller takes the full path."""
        if not self._sync_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            return False
        try:
            epoch, version = self.bindings.epoch, self.bindings.version
            if (not self._in_sync or self.plan is None or self.wanted is None or version != self._planned_bindings + 1
                    or any(r.pending() for r in (self.policies, self.pods, self.namespaces))):
                return False
            planned = self._planned_view          # nothing drained since: the view planned, but this pod
            info, reported = planned.pods.get(key), self.view.pods.get(key)
            if info is None or reported is None:
                return False
            ip = ips[0] if ips else None
            bound = replace(info, ip=ip, ips=ips if len(ips) > 1 else ())
            view = ClusterView({**planned.pods, key: bound}, planned.namespaces, planned.policies)
            node, render = self.settings.node_name, self.settings.render
            change: PodAdded | PodRemoved | None
            new: Rendered | None = None
            try:
                if ip is not None:
                    change = plan_with_pod(view, self.plan, key, node_name=node)
                    if change is not None:
                        new = self.dataplane.render_with_pod(self.wanted, change, settings=render,
                                                             interface_of=self._interface)
                else:
                    change = plan_without_pod(view, self.plan, key) if reported.ip in (None, info.ip) else None
                    if change is not None:
                        new = self.dataplane.render_without_pod(self.wanted, change, settings=render)
                if change is None or new is None:
                    return False
                report = self.dataplane.apply(new, full=False)
            except Exception:
                log.exception("network policy: programming one pod alone failed; a full sync follows")
                self._in_sync = False
                self._request()
                return False
            self.plan, self._planned_bindings, self._planned_view = change.plan, version, view
            self._basis = Basis(snapshot(view), change.plan)
            self.wanted, self.last_report = new, report
            self._count_pods()
            self.bindings.synced(epoch, None, added=change.pod if ip is not None else None,
                                 gone=key if ip is None else None)
            return True
        finally:
            self._sync_lock.release()

    def unbind_pod(self, namespace: object, name: object, *, container_id: str, deadline: float) -> BindOutcome:
        """A DEL: the pod's bound address is its no more (closed, out of every set) once this returns."""
        key = pod_key(namespace, name)
        target = self.bindings.unbind(key, container_id) if key is not None else None
        if target is None:
            return BindOutcome(False, ClosedReason.UNKNOWN_POD)
        if not self.caches_synced() or self.last_report is None:
            self._request()
            return BindOutcome(False, ClosedReason.ENGINE_NOT_SYNCED)
        if key is not None and self._one_pod(key, (), deadline):
            return BindOutcome(True, None, 1, incremental=True)
        try:
            return BindOutcome(True, None, self._sync_to(target, deadline))
        except TimeoutError:
            self._request()
            return BindOutcome(False, ClosedReason.ENGINE_BUSY)
        except Exception:
            return BindOutcome(False, ClosedReason.PROGRAMMING_FAILED)

    def _sync_to(self, epoch: int, deadline: float) -> int:
        """Make sure a sync that started at `epoch` or later has succeeded: the group commit.
        Returns 1 when this caller ran it, 0 when another had; raises what the sync raised."""
        if self.bindings.synced_epoch >= epoch:
            return 0
        if not self._sync_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError("a policy sync held the engine past the deadline")
        try:
            if self.bindings.synced_epoch >= epoch:
                return 0                  # a sync that started after ours was recorded covered it
            try:
                self._sync(SyncKind.PARTIAL)
            except Exception:
                log.exception("network policy: programming a new pod failed; it stays closed, retried")
                self._request()           # the dataplane reads the kernel again after a failure
                raise
            return 1
        finally:
            self._sync_lock.release()

    def _closed(self, outcome: BindOutcome) -> BindOutcome:
        if self.metrics is not None and outcome.reason is not None:
            self.metrics.closed_after_add.labels(reason=outcome.reason.value).inc()
        return outcome


POLICY, POD, NAMESPACE = "NetworkPolicy", "Pod", "Namespace"


def _ref(kind: str, key: str, obj: object) -> ObjectRef:
    """The object's reference, named by its recorder key (so `accept` finds the same record)."""
    namespace, _, name = key.rpartition("/")
    metadata = obj.get("metadata") if isinstance(obj, dict) else None
    uid = metadata.get("uid") if isinstance(metadata, dict) else None
    return ObjectRef(kind=kind, namespace=namespace, name=name, uid=uid if isinstance(uid, str) else "")
