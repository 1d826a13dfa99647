"""`netagent connectivity-test`: run the plan of connectivity_plan.py on any cluster a kubeconfig
reaches, and always remove what it made.

The cluster is reached through `ClusterApi`, a seam of the dozen calls the test makes (plain
dicts in and out), so the whole run, its retries and its cleanup are tested against a fake;
`KubeClusterApi` is the real one, the official client's typed calls with their JSON read raw
(the user's kubeconfig loaded as netagent/kube/config.py loads one). These are the user's
permissions, not the agent's: nothing here runs in the DaemonSet.

Everything lives in one namespace of our own (a fresh name, labelled as ours): `run` creates
it first and removes it in a `finally`, with foreground deletion, waiting until it is gone, so
a failure, Ctrl-C or SIGTERM (turned into `_Terminated`, a KeyboardInterrupt) still cleans up.
Clients of one stage run at once and are polled with one pod list a second; a check whose
answer is not yet the expected one is retried with a new pod while its time lasts (a policy
or a Service takes a moment to be programmed on a real cluster), at most `MAX_ATTEMPTS` times.
After the checks, each failure and the expected block are explained from the agents' flow
records (connectivity_flows.py): `netagent flows --json` run in the agent pod of each node
through the exec stream, as `cilium connectivity test` asks its agents. Records that cannot be
read (no agent pod, exec refused or unsupported, flows off) are said once in the log, and the
reasons stay the clients' own: a check never fails for that.
Nothing here touches the local kernel.
"""
from __future__ import annotations

import dataclasses
import functools
import ipaddress
import json
import signal
import sys
import time
from collections.abc import Callable
from typing import Protocol, TextIO

from netagent.daemon import connectivity_flows as flows_
from netagent.daemon import connectivity_plan as plan_
from netagent.daemon.connectivity_flows import FlowsUnavailable
from netagent.daemon.connectivity_plan import Check, Expect, Plan, Stage
from netagent.daemon.connectivity_report import CheckResult, Status, judge, parse_outcome, skipped
from netagent.errors import NetagentError

MAX_ATTEMPTS = 3
ATTEMPT_COST = plan_.CONNECT_TIMEOUT + 5.0   # one more client: its start and its connect
DNS_SERVICE = ("kube-system", "kube-dns")


class ConnectivityTestError(NetagentError):
    """The test could not run (the servers never became Ready, the API refused us...)."""


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is so the cleanup in `run` runs."""


class ClusterApi(Protocol):
    def list_nodes(self) -> list[dict]: ...
    def service(self, namespace: str, name: str) -> dict | None: ...   # None: there is none
    def create(self, namespace: str | None, obj: dict) -> None: ...
    def list_pods(self, namespace: str, selector: str) -> list[dict]: ...
    def pod_log(self, namespace: str, name: str) -> str: ...
    def delete_pod(self, namespace: str, name: str) -> None: ...
    def ready_endpoints(self, namespace: str, service: str) -> int: ...
    def delete_namespace(self, name: str) -> None: ...
    def namespace_exists(self, name: str) -> bool: ...
    # `netagent flows --json --namespace NS` in the agent pod on `node`; FlowsUnavailable says why not
    def agent_flows(self, node: str, namespace: str) -> str: ...


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


@dataclasses.dataclass(frozen=True)
class Options:
    timeout: float = 90.0          # each stage: servers Ready, endpoints, each check with its retries
    image: str = plan_.DEFAULT_IMAGE
    external: str | None = None
    poll: float = 1.0


@dataclasses.dataclass(frozen=True)
class _Running:
    check: Check
    attempt: int
    started: float


def _ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _pod_ip(pod: dict) -> str:
    raw = (pod.get("status") or {}).get("podIP", "")
    try:
        return str(ipaddress.ip_address(str(raw)))
    except ValueError:
        raise ConnectivityTestError(f"pod {pod['metadata']['name']}: the API gave an invalid podIP {str(raw)[:64]!r}")


def _client_ip(pod: dict) -> str:
    """A client pod's address, '' when it has none or an invalid one (its flows are then not sought)."""
    raw = (pod.get("status") or {}).get("podIP", "")
    try:
        return str(ipaddress.ip_address(str(raw))) if raw else ""
    except ValueError:
        return ""


class Runner:
    """One run against one cluster; `log` gets the progress lines (stderr: stdout is the report)."""

    def __init__(self, api: ClusterApi, options: Options, *, clock: Clock = time, log: TextIO = sys.stderr) -> None:
        self.api = api
        self.options = options
        self.clock = clock
        self.log = log

    def say(self, text: str) -> None:
        print(f"connectivity-test: {text}", file=self.log, flush=True)

    def prepare(self) -> Plan:
        nodes, ignored = plan_.usable_nodes(self.api.list_nodes())
        dns = "" if self.api.service(*DNS_SERVICE) is not None else \
            "no kube-dns Service in kube-system: the cluster has no DNS to test"
        return plan_.plan_checks(nodes, namespace=plan_.new_namespace(), image=self.options.image, ignored=ignored,
                                 external=self.options.external, dns=dns)

    def run(self, plan: Plan) -> list[CheckResult]:
        """Every check of the plan, in its order; the namespace is removed whatever happens."""
        ns = plan.namespace
        self.say(f"namespace {ns}, nodes {', '.join(n.name for n in plan.nodes)}"
                 + (f" (ignored: {'; '.join(plan.ignored)})" if plan.ignored else ""))
        self.api.create(None, plan_.namespace_object(ns))
        try:
            return self._checks(plan)
        finally:
            self.remove(ns)

    def _checks(self, plan: Plan) -> list[CheckResult]:
        ns, image = plan.namespace, plan.image
        for name, node in plan.servers.items():
            role = "guarded" if name == "guarded" else "echo"
            self.api.create(ns, plan_.server_pod(name, node, image=image, role=role))
        self.api.create(ns, plan_.service(plan_.ECHO_SERVICE, "ClusterIP"))
        self.api.create(ns, plan_.service(plan_.NODEPORT_SERVICE, "NodePort"))
        self.api.create(ns, plan_.deny_policy())
        values = self._servers_up(plan)
        results = {c.name: skipped(c) for c in plan.checks if c.skip}
        todo = [c.resolved(values) for c in plan.checks if not c.skip]
        results.update(self.probe(ns, [c for c in todo if c.stage is Stage.BASE], image=image))
        if any(c.stage is Stage.ALLOWED for c in todo):
            self.api.create(ns, plan_.allow_policy())
            results.update(self.probe(ns, [c for c in todo if c.stage is Stage.ALLOWED], image=image))
        return self.explain(plan, [results[c.name] for c in plan.checks])

    def explain(self, plan: Plan, results: list[CheckResult]) -> list[CheckResult]:
        """Each FAIL, and each expected block, with the verdicts of its flows on the plan's nodes."""
        wanted = [r for r in results if r.client and r.check.target and
                  (r.status is Status.FAIL or (r.status is Status.PASS and r.check.expect is Expect.BLOCKED))]
        if not wanted:
            return results
        flows, unread = {}, []
        started = self.clock.monotonic()
        for node in plan.nodes:
            try:
                flows[node.name] = flows_.parse_lines(self.api.agent_flows(node.name, plan.namespace))
            except FlowsUnavailable as error:
                unread.append(f"{node.name}: {error}")
        if unread:
            self.say(f"flow records not read ({'; '.join(unread)}): those nodes' verdicts are not in the reasons")
        if flows:
            self.say(f"flow records of {', '.join(flows)} read in {self.clock.monotonic() - started:.1f} s")
        explained = {id(r): dataclasses.replace(r, reason=flows_.with_verdicts(
            r.reason, flows_.verdicts(flows, r.client, r.check.target))) for r in wanted}
        return [explained.get(id(r), r) for r in results]

    def _servers_up(self, plan: Plan) -> dict[str, object]:
        """Wait for the servers to be Ready and the Services to have both endpoints; the values
        the checks' targets need."""
        ns = plan.namespace
        selector = f"{plan_.LABEL_ROLE} in (echo,guarded)"
        pods = self._wait("the server pods to be Ready", lambda: self._all_ready(ns, selector, len(plan.servers)),
                          lambda: self._not_ready(ns, selector))
        ips = {p["metadata"]["name"]: plan_.bracketed(_pod_ip(p)) for p in pods}
        self.say("servers Ready: " + ", ".join(f"{name} {ip}" for name, ip in sorted(ips.items())))
        for name in (plan_.ECHO_SERVICE, plan_.NODEPORT_SERVICE):
            self._wait(f"Service {name} to have 2 ready endpoints",
                       functools.partial(self._has_endpoints, ns, name), lambda: "")
        cluster_ip = (self.api.service(ns, plan_.ECHO_SERVICE) or {}).get("spec", {}).get("clusterIP", "")
        nodeport = (self.api.service(ns, plan_.NODEPORT_SERVICE) or {}).get("spec", {}).get("ports", [{}])[0]
        try:
            address = ipaddress.ip_address(str(cluster_ip))
        except ValueError:
            raise ConnectivityTestError(f"Service {plan_.ECHO_SERVICE}: no valid clusterIP ({str(cluster_ip)[:64]!r})")
        port = nodeport.get("nodePort")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ConnectivityTestError(f"Service {plan_.NODEPORT_SERVICE}: no valid nodePort ({str(port)[:16]!r})")
        return {"pod_ip": ips, "cluster_ip": plan_.bracketed(str(address)), "node_port": str(port)}

    def _has_endpoints(self, ns: str, service: str) -> bool:
        return self.api.ready_endpoints(ns, service) >= 2

    def _all_ready(self, ns: str, selector: str, count: int) -> list[dict] | None:
        pods = self.api.list_pods(ns, selector)
        return pods if len(pods) == count and all(_ready(p) and p.get("status", {}).get("podIP") for p in pods) \
            else None

    def _not_ready(self, ns: str, selector: str) -> str:
        from netagent.daemon.connectivity_report import pod_state
        return "; ".join(f"{p['metadata']['name']}: {pod_state(p)}" for p in self.api.list_pods(ns, selector)
                         if not _ready(p))

    def _wait(self, what: str, condition: Callable[[], object], why_not: Callable[[], str]):
        deadline = self.clock.monotonic() + self.options.timeout
        while True:
            found = condition()
            if found:
                return found
            if self.clock.monotonic() > deadline:
                why = why_not()
                raise ConnectivityTestError(f"timed out after {self.options.timeout:.0f} s waiting for {what}"
                                            + (f": {why}" if why else ""))
            self.clock.sleep(self.options.poll)

    def probe(self, ns: str, checks: list[Check], *, image: str) -> dict[str, CheckResult]:
        """Run the checks' clients at once; each result when its answer is the expected one, or
        its attempts or its time are spent."""
        running: dict[str, _Running] = {}

        def start(check: Check, attempt: int, started: float) -> None:
            name = plan_.client_name(check, attempt)
            self.api.create(ns, plan_.client_pod(name, check, image=image))
            running[name] = _Running(check, attempt, started)

        for check in checks:
            start(check, 1, self.clock.monotonic())
        results: dict[str, CheckResult] = {}
        budget = self.options.timeout
        while running:
            pods = {p["metadata"]["name"]: p for p in self.api.list_pods(ns, f"{plan_.LABEL_ROLE}=client")}
            now = self.clock.monotonic()
            for name, run in list(running.items()):
                pod = pods.get(name, {})
                phase = (pod.get("status") or {}).get("phase")
                outcome = parse_outcome(pod, self.api.pod_log(ns, name) if phase == "Failed" else "")
                spent = now - run.started
                if outcome.finished:
                    status, reason = judge(run.check, outcome)
                    del running[name]
                    if status is Status.FAIL and run.attempt < MAX_ATTEMPTS and spent + ATTEMPT_COST <= budget:
                        self.api.delete_pod(ns, name)
                        start(run.check, run.attempt + 1, run.started)
                        continue
                    if status is Status.FAIL and run.attempt > 1:
                        reason += f" ({run.attempt} attempts)"
                    results[run.check.name] = CheckResult(run.check, status, reason, run.attempt, spent,
                                                          _client_ip(pod))
                    self.say(f"{run.check.name}: {status.value}" + (f" ({reason})" if reason else ""))
                elif spent > budget:
                    del running[name]
                    reason = f"no answer in {budget:.0f} s: {outcome.detail}"
                    results[run.check.name] = CheckResult(run.check, Status.FAIL, reason, run.attempt, spent,
                                                          _client_ip(pod))
                    self.say(f"{run.check.name}: FAIL ({reason})")
            if running:
                self.clock.sleep(self.options.poll)
        return results

    def remove(self, ns: str) -> None:
        """Delete the namespace (foreground) and wait until it is gone. The delete request is
        sent with SIGINT and SIGTERM held off; a signal while waiting stops only the wait."""
        self.say(f"removing namespace {ns}")
        with _signals_ignored():
            self.api.delete_namespace(ns)
        deadline = self.clock.monotonic() + max(self.options.timeout, 60.0)
        try:
            while self.api.namespace_exists(ns):
                if self.clock.monotonic() > deadline:
                    raise ConnectivityTestError(f"namespace {ns} is still there after its deletion; remove it with "
                                                f"`kubectl delete namespace {ns}`")
                self.clock.sleep(self.options.poll)
        except KeyboardInterrupt:
            self.say(f"not waiting: namespace {ns} is being deleted")
            raise
        self.say(f"namespace {ns} removed")


class _signals_ignored:
    """SIGINT and SIGTERM ignored inside (main thread only; elsewhere a no-op)."""

    def __enter__(self) -> None:
        self.saved: list = []
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved.append((sig, signal.signal(sig, signal.SIG_IGN)))
        except ValueError:   # not the main thread
            pass

    def __exit__(self, *exc) -> None:
        for sig, handler in self.saved:
            signal.signal(sig, handler)


def _raise_terminated(signum, frame) -> None:
    raise _Terminated()


def connectivity_test(api: ClusterApi, options: Options, *, as_json: bool = False, out: TextIO = sys.stdout,
                      clock: Clock = time, log: TextIO = sys.stderr) -> int:
    """The command: 0 when nothing failed, 1 on a FAIL, 130 on SIGINT, 143 on SIGTERM."""
    from netagent.daemon.connectivity_report import failed, render_json, render_table
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        runner = Runner(api, options, clock=clock, log=log)
        plan = runner.prepare()
        results = runner.run(plan)
    except _Terminated:
        print("connectivity-test: terminated; cleaned up", file=log)
        return 143
    except KeyboardInterrupt:
        print("connectivity-test: interrupted; cleaned up", file=log)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        print(render_json(results, namespace=plan.namespace, nodes=[n.name for n in plan.nodes],
                          ignored=list(plan.ignored)), file=out)
    else:
        print(render_table(results), file=out)
    return 1 if failed(results) else 0


# ------------------------------------------------------------------ the real API
class KubeClusterApi:
    """`ClusterApi` over the official client (CoreV1, NetworkingV1, DiscoveryV1), JSON read raw."""

    def __init__(self, api_client) -> None:
        from kubernetes import client
        self.core = client.CoreV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.discovery = client.DiscoveryV1Api(api_client)

    @staticmethod
    def _call(method: Callable, *args, missing_ok: bool = False, **kwargs):
        from kubernetes.client.exceptions import ApiException
        from netagent.kube.config import KubeApiError
        try:
            response = method(*args, _preload_content=False, _request_timeout=30, **kwargs)
        except ApiException as error:
            if missing_ok and error.status == 404:
                return None
            raise KubeApiError.from_body(error.status or 0, error.body if isinstance(error.body, bytes) else
                                         str(error.body or error.reason).encode()) from None
        return response.data

    def _json(self, method: Callable, *args, **kwargs) -> dict | None:
        data = self._call(method, *args, **kwargs)
        return None if data is None else json.loads(data)

    def list_nodes(self) -> list[dict]:
        return (self._json(self.core.list_node) or {}).get("items", [])

    def service(self, namespace: str, name: str) -> dict | None:
        return self._json(self.core.read_namespaced_service, name, namespace, missing_ok=True)

    def create(self, namespace: str | None, obj: dict) -> None:
        kind = obj["kind"]
        if kind == "Namespace":
            self._call(self.core.create_namespace, obj)
        elif kind == "Pod":
            self._call(self.core.create_namespaced_pod, namespace, obj)
        elif kind == "Service":
            self._call(self.core.create_namespaced_service, namespace, obj)
        elif kind == "NetworkPolicy":
            self._call(self.networking.create_namespaced_network_policy, namespace, obj)
        else:
            raise ValueError(f"cannot create a {kind}")

    def list_pods(self, namespace: str, selector: str) -> list[dict]:
        return (self._json(self.core.list_namespaced_pod, namespace, label_selector=selector) or {}).get("items", [])

    def pod_log(self, namespace: str, name: str) -> str:
        data = self._call(self.core.read_namespaced_pod_log, name, namespace, tail_lines=20, missing_ok=True)
        return (data or b"").decode("utf-8", "replace")

    def delete_pod(self, namespace: str, name: str) -> None:
        self._call(self.core.delete_namespaced_pod, name, namespace, grace_period_seconds=0, missing_ok=True)

    def ready_endpoints(self, namespace: str, service: str) -> int:
        slices = self._json(self.discovery.list_namespaced_endpoint_slice, namespace,
                            label_selector=f"kubernetes.io/service-name={service}") or {}
        return sum(1 for s in slices.get("items", []) for e in s.get("endpoints") or []
                   if (e.get("conditions") or {}).get("ready") is not False)

    def delete_namespace(self, name: str) -> None:
        self._call(self.core.delete_namespace, name, propagation_policy="Foreground", missing_ok=True)

    def namespace_exists(self, name: str) -> bool:
        return self._call(self.core.read_namespace, name, missing_ok=True) is not None

    def agent_flows(self, node: str, namespace: str) -> str:
        from netagent.daemon.connectivity_exec import agent_flows
        return agent_flows(self, node, namespace)


def main(*, kubeconfig: str | None, options: Options, as_json: bool = False) -> int:
    """The CLI's entry: the arguments checked before the API is reached."""
    from netagent.kube.config import load_api_client
    if options.external:
        plan_.parse_external(options.external)
    return connectivity_test(KubeClusterApi(load_api_client(kubeconfig=kubeconfig)), options, as_json=as_json)
