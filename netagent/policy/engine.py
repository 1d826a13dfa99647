"""The policy engine of one node: three watch recorders, the parsed view, and the sync function.

Seam 1 of ARCHITECTURE.md: the NetworkPolicy, Pod and Namespace reflectors deliver into
`ChangeRecorder`s that only keep (previous, current) and ask for a sync; updates that change
nothing the policies read (a pod's status conditions, a namespace's annotations) are not
even recorded. On the sync thread, `sync(kind)` drains them into a `ClusterView` (parsing
only what changed, reporting what could not be read), plans (semantics.py), renders
(render.py) and applies (programmer.py), which writes only the difference: a PARTIAL sync
against what it last wrote, a FULL one against the kernel (adoption, drift repair).

A local pod whose host interface cannot be found stays closed (not in KNOWN); the sync says
which pods wait (log, `netagent_policy_pods{state="pending"}`) and every later sync looks again.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from netagent.infra.metrics import Counter, Gauge, Histogram, Registry, exponential_buckets
from netagent.infra.sync_runner import SyncKind, SyncResult
from netagent.kube.changes import ChangeRecorder
from netagent.policy.kube_objects import parse_namespace, parse_pod, parse_policy
from netagent.policy.programmer import ApplyReport, PolicyProgrammer
from netagent.policy.render import RenderSettings, WantedState, render_wanted
from netagent.policy.semantics import ClusterView, NodePlan, PodPlan, plan_node

log = logging.getLogger("netagent.policy")

InterfaceLookup = Callable[[PodPlan], "str | None"]


@dataclass(frozen=True)
class PolicySettings:
    node_name: str
    render: RenderSettings


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
        self.problems = registry.register(Counter(
            "netagent_policy_object_problems_total", "fields of policies and pods that could not be read"))


class PolicyEngine:
    """Owns the recorders and the view; `sync` is the SyncRunner's function."""

    def __init__(self, settings: PolicySettings, *, programmer: PolicyProgrammer, interface_of: InterfaceLookup,
                 registry: Registry | None = None) -> None:
        self.settings = settings
        self.programmer = programmer
        self.interface_of = interface_of
        self._request: Callable[[], None] = lambda: None
        poke = self._poke
        self.policies = ChangeRecorder("networkpolicies", on_change=poke, relevant=_policy_relevant)
        self.pods = ChangeRecorder("pods", on_change=poke, relevant=_pod_relevant)
        self.namespaces = ChangeRecorder("namespaces", on_change=poke, relevant=_namespace_relevant)
        self.view = ClusterView()
        self.problems: dict[str, list[str]] = {}
        self.plan: NodePlan | None = None
        self.wanted: WantedState | None = None
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

    def _note(self, key: str, problems: list[str]) -> None:
        if problems and problems != self.problems.get(key):
            for problem in problems:
                log.warning("%s", problem)
            if self.metrics is not None:
                self.metrics.problems.inc(len(problems))
        if problems:
            self.problems[key] = problems
        else:
            self.problems.pop(key, None)

    def drain(self) -> int:
        """Fold recorded changes into the view; returns how many objects changed."""
        changed = 0
        for key, (_, current) in self.policies.drain().items():
            changed += 1
            policy, problems = parse_policy(current) if current is not None else (None, [])
            self._note(f"networkpolicy {key}", problems)
            if policy is None:
                self.view.policies.pop(key, None)
            else:
                self.view.policies[key] = policy
        for key, (_, current) in self.pods.drain().items():
            changed += 1
            if current is None:
                self.view.pods.pop(key, None)
                self._note(f"pod {key}", [])
                continue
            pod, problems = parse_pod(current)
            self._note(f"pod {key}", problems)
            self.view.pods[key] = pod
        for key, (_, current) in self.namespaces.drain().items():
            changed += 1
            if current is None:
                self.view.namespaces.pop(key, None)
            else:
                self.view.namespaces[key] = parse_namespace(current)
        return changed

    def sync(self, kind: SyncKind) -> SyncResult:
        started = time.monotonic()
        changed = self.drain()
        if kind is SyncKind.PARTIAL and not changed and self._in_sync:
            return SyncResult.SUCCEEDED
        self._in_sync = False
        self.plan = plan_node(self.view, node_name=self.settings.node_name)
        self.wanted = render_wanted(self.plan, settings=self.settings.render, interface_of=self.interface_of)
        self.last_report = self.programmer.apply(self.wanted, full=kind is SyncKind.FULL)
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
