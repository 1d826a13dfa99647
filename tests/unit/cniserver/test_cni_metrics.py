"""The CNI server's request metrics (`cniserver/metrics.py`) through a real socket: each
executed request is observed once under its command, plugin and result; a caller's invented
command is counted as `other`, so no local caller can add series; the exposition carries the
histogram the shipped alert and dashboard read (deploy/monitoring/)."""
from __future__ import annotations

import pytest

from cni import client
from netagent.cniserver.metrics import CniMetrics
from netagent.infra.metrics import Registry
from tests.unit.cni.test_cni_transport_hostile import Agent


@pytest.fixture
def measured():
    registry = Registry()
    metrics = CniMetrics(registry)
    agent = Agent(metrics=metrics)
    yield agent, metrics, registry
    agent.close()


def count(metrics: CniMetrics, **labels: str) -> int:
    return metrics.duration.labels(**labels).count


def test_each_request_is_observed_once_under_bounded_labels(measured):
    agent, metrics, registry = measured
    code, _ = client._relay(agent.socket_path, agent.pod_env("c1"), agent.config())
    assert code == 0
    assert count(metrics, command="ADD", plugin="main", result="ok") == 1
    code, _ = client._relay(agent.socket_path, agent.pod_env("c2", command="ADD"), b"{not json")
    assert code != 0
    assert count(metrics, command="ADD", plugin="main", result="error") == 1
    for invented in ("EVIL", "ADD\nx", "A" * 200):
        client._relay(agent.socket_path, agent.pod_env("c3", command=invented), agent.config())
    assert count(metrics, command="other", plugin="main", result="error") == 3
    text = registry.render()
    assert 'netagent_cni_request_duration_seconds_count{command="ADD",plugin="main",result="ok"} 1' in text
    assert "EVIL" not in text
