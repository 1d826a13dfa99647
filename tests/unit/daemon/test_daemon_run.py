"""`netagent run`'s small pieces of composition: one shutdown (what started, stopped in
reverse, a failing stop costing the others nothing), /healthz over the background runners, and
what cannot start raised to the CLI, reported there once, after what had started is stopped."""
from __future__ import annotations

import types

import pytest

from netagent.cli import build_parser, main
from netagent.daemon.config import parse_run_config
from netagent.daemon import run
from netagent.daemon.run import StartupError, _Started, _with_runner_health
from netagent.infra.fake_clock import FakeClock
from netagent.infra.status_server import HealthReport
from netagent.infra.sync_runner import SyncRunner


def test_what_started_stops_in_reverse_and_a_failing_stop_does_not_stop_the_rest():
    stopped = []
    started = _Started()
    started.add(lambda: stopped.append("status"))
    started.add(lambda: 1 / 0)
    started.add(lambda: stopped.append("cni"))
    started.stop_all()
    started.stop_all()   # nothing twice
    assert stopped == ["cni", "status"]


def test_a_background_runner_is_in_health_and_unhealthy_until_it_has_run():
    runner = SyncRunner(name="cni-deferred-delete", sync=lambda kind: None, min_interval=0.0, max_interval=60.0,
                        retry_interval=1.0, clock=FakeClock())
    runners: list = []
    health = _with_runner_health(lambda: HealthReport(True, "ok", {"node": 1}), lambda: runners, stale_after=60)
    assert health() == HealthReport(True, "ok", {"node": 1})   # not started yet: not listed
    runners.append(runner)
    report = health()
    assert not report.healthy and report.reason == "cni-deferred-delete: not synced yet"
    runner.start()
    try:
        runner.request()
        assert runner.wait_settled(30)
        report = health()
        assert report.healthy and report.details["node"] == 1
        assert report.details["cni-deferred-delete"]["healthy"] is True
    finally:
        runner.stop()


CLUSTER = ["run", "--node-name", "node-1", "--cluster-cidr", "10.244.0.0/16"]


@pytest.mark.parametrize("error", [RuntimeError("another agent is already serving /run/na.sock"),
                                   PermissionError("another agent is already serving /run/na.sock")])
def test_a_cni_server_that_cannot_start_is_reported_once_by_the_cli(error, capsys, monkeypatch):
    def cannot_start(cni):
        raise error
    monkeypatch.setattr(run, "_start_cni_server", cannot_start)
    assert main(["run", "--cni-only"]) == 1
    captured = capsys.readouterr()
    assert captured.err == "netagent run: another agent is already serving /run/na.sock\n" and captured.out == ""


def test_the_system_s_runtime_error_reaches_the_cli_as_a_startup_error(monkeypatch):
    cause = RuntimeError("/run/na.sock exists and is not a socket")
    monkeypatch.setattr(run, "_start_cni_server", lambda cni: (_ for _ in ()).throw(cause))
    with pytest.raises(StartupError, match="^/run/na.sock exists and is not a socket$") as raised:
        run.run_agent(parse_run_config(build_parser().parse_args(["run", "--cni-only"])))
    assert raised.value.__cause__ is cause


def test_a_cluster_that_cannot_be_reached_is_reported_once_by_the_cli(capsys, monkeypatch):
    from netagent.kube import config as kube_config

    def unreachable(kubeconfig):
        raise kube_config.KubeConfigError("no kubeconfig: set --kubeconfig or $KUBECONFIG")
    monkeypatch.setattr(kube_config, "load_api_client", unreachable)
    assert main(CLUSTER) == 1
    assert capsys.readouterr().err == "netagent run: no kubeconfig: set --kubeconfig or $KUBECONFIG\n"


def test_a_part_that_cannot_start_stops_what_had_started_before_the_cli_reports_it(capsys, monkeypatch):
    """The node agent fails to start: the status server, the event poster and the agent itself
    (half started) are stopped, in reverse, and the CLI prints the message once."""
    from netagent.daemon import bgp_start, dataplane, proxy_start, rejection_reports
    from netagent.infra import status_server
    from netagent.kube import config as kube_config
    from netagent.noderoutes import agent as node_agent
    from netagent.noderoutes.agent_inputs import AgentStartError
    from netagent.noderoutes.routing import kernel as routing_kernel
    from proxy.backend import ProxyMode
    events: list[str] = []

    class Part:
        def __init__(self, name: str, fails: bool = False) -> None:
            self.name, self.fails = name, fails

        def start(self) -> None:
            events.append(f"start {self.name}")
            if self.fails:
                raise AgentStartError("no lease within 60 s")

        def stop(self) -> None:
            events.append(f"stop {self.name}")

    class Agent(Part):
        health = staticmethod(lambda: None)
        pod_cidrs: list = []

        def __init__(self, *args, **kwargs) -> None:
            super().__init__("agent", fails=True)

    monkeypatch.setattr(kube_config, "load_api_client", lambda kubeconfig: object())
    monkeypatch.setattr(kube_config, "api_server_addresses", lambda client: ())
    monkeypatch.setattr(dataplane, "resolve_dataplane", lambda requested: dataplane.Dataplane(
        proxy_mode=ProxyMode.IPTABLES, reason="test", iptables=False))
    rejections = types.SimpleNamespace(scope=lambda name: None)
    monkeypatch.setattr(rejection_reports, "build_rejections",
                        lambda registry, **kw: (rejections, Part("event poster")))
    monkeypatch.setattr(proxy_start, "build_proxy", lambda *args, **kw: None)
    monkeypatch.setattr(bgp_start, "build_bgp", lambda *args, **kw: (None, None))
    monkeypatch.setattr(routing_kernel, "NetlinkKernel", lambda: object())
    monkeypatch.setattr(node_agent, "NodeAgent", Agent)
    monkeypatch.setattr(status_server, "StatusServer", lambda bind, **kw: Part(f"status {bind}"))
    assert main([*CLUSTER, "--proxy-mode", "iptables", "--metrics-bind-address", ""]) == 1
    assert events == ["start status 0.0.0.0:10258", "start agent",
                      "stop agent", "stop status 0.0.0.0:10258", "stop event poster"]
    assert capsys.readouterr().err == "netagent run: no lease within 60 s\n"
