"""`netagent run`'s flow records: the flags (on by default, a ring size in bounds), the parsed
config, the listener started with the policy and left off (with the policy running) when its
group cannot be bound, and /flows served on loopback status servers only."""
from __future__ import annotations

import errno

import pytest

from netagent.cli import build_parser
from netagent.daemon.config import parse_run_config
from netagent.daemon.policy_start import PolicyParts
from netagent.infra.flows import FlowRing
from netagent.infra.metrics import Registry
from netagent.infra.status_server import HealthReport, StatusServer
from netagent.kernel.nflog import NflogError
from netagent.policy.flows import FlowNames, PolicyFlows

BASE = ["run", "--node-name", "n", "--cluster-cidr", "10.244.0.0/16"]


def test_the_flags():
    parser = build_parser()
    assert parser.parse_args(BASE).flows == "on"
    config = parse_run_config(parser.parse_args([*BASE, "--flows", "off", "--flow-ring-size", "100"]))
    assert config.cluster is not None
    assert (config.cluster.policy.flows, config.cluster.policy.flow_ring_size) == (False, 100)
    default = parse_run_config(parser.parse_args(BASE)).cluster
    assert default is not None and (default.policy.flows, default.policy.flow_ring_size) == (True, 4096)
    assert default.policy.flow_conntrack is False
    conntrack = parse_run_config(parser.parse_args([*BASE, "--flow-conntrack", "on"])).cluster
    assert conntrack is not None and conntrack.policy.flow_conntrack is True
    for bad in ("0", "15", "2000000", "many"):
        with pytest.raises(SystemExit):
            parser.parse_args([*BASE, "--flow-ring-size", bad])


class Runner:
    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def refused():
    raise NflogError(errno.EBUSY, "group taken")


def parts(open_socket) -> PolicyParts:
    flows = PolicyFlows(FlowRing(), FlowNames(lambda: None), open_socket=open_socket)
    return PolicyParts(engine=None, runner=Runner(), reflectors=[], flows=flows)  # type: ignore[arg-type]


def test_a_group_that_cannot_be_bound_leaves_flows_off_and_the_policy_on(caplog):
    started = parts(refused)
    started.start()
    assert started.flows is None and "flow records off" in caplog.text
    started.serve_flows([object()])        # nothing to serve: no page, no error
    started.stop()


def test_flows_are_served_on_loopback_only():
    started = parts(refused)
    started.flows = PolicyFlows(FlowRing(), FlowNames(lambda: None))       # not started: only its ring is read
    health = lambda: HealthReport(True, "ok")      # noqa: E731
    loopback = StatusServer(bind="127.0.0.1:0", registry=Registry(), health=health)
    outside = StatusServer(bind="0.0.0.0:0", registry=Registry(), health=health)
    health_only = StatusServer(bind="127.0.0.1:0", registry=None, health=health)
    started.serve_flows([None, loopback, outside, health_only])
    assert "/flows" in loopback.pages and "/flows" not in outside.pages and "/flows" not in health_only.pages
    assert loopback.snapshot("/flows").get().startswith('{"flows": []')
