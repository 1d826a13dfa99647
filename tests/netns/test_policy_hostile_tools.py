"""A sample of the hostile-object suite (tests/unit/policy/test_hostile_policy.py) through the real
tools: the policy engine programs a throwaway network namespace with the real
`iptables-restore` and `ipset restore`, so whatever hostile NetworkPolicies, Pods and
Namespaces make it render is accepted by the tools' own parsers (the fakes are checked
against the same draws in the unit suite), and a second FULL sync writes nothing: what
`iptables-save` and `ipset save` print back is exactly what was rendered.

Budget: 12 draws per iptables backend (each a few execs); `NETAGENT_FUZZ_EXAMPLES=N` runs N.
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netagent.infra.sync_runner import SyncKind, SyncResult
from netagent.kernel import namespaces, owned
from netagent.kernel.ipset.runner import IpsetRunner
from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.backend import IptablesBackend, missing_binaries
from netagent.kernel.iptables.runner import IptablesRunner
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.engine import PolicyEngine, PolicySettings
from netagent.policy.iptables.dataplane import IptablesDataplane
from netagent.policy.shared import RenderSettings
from tests.unit.policy.hostile_policy_objects import GOOD_PODS, LOCAL_CIDR, NODE, good_objects
from tests.unit.policy.test_hostile_policy import hostile_objects

EXAMPLES = int(os.environ.get("NETAGENT_FUZZ_EXAMPLES") or 12)


@pytest.fixture(params=list(IptablesBackend), ids=lambda b: b.value)
def node(request):
    backend = request.param
    if missing_binaries(IpFamily.V4, backend):
        pytest.skip(f"no iptables-{backend.value} tools")
    name = namespaces.unique_name("na-t-nph")
    namespaces.create(name)
    try:
        prefix = namespaces.exec_prefix(name)
        yield (IptablesRunner(backend=backend, exec_prefix=prefix, lock_wait_seconds=60),
               IpsetRunner(exec_prefix=prefix))
    finally:
        namespaces.remove(name)


def test_hostile_samples_are_accepted_by_the_real_tools(node):
    iptables, ipset = node

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              print_blob=True)
    @given(objects=hostile_objects, mode=st.sampled_from(list(PodAttachment)))
    def sample(objects, mode):
        programmer = IptablesDataplane(iptables=iptables, ipset=ipset)
        engine = PolicyEngine(PolicySettings(NODE, RenderSettings(mode, local_cidrs=(LOCAL_CIDR,))),
                              dataplane=programmer,
                              interface_of=lambda plan: "na" + plan.ip.replace(".", "")[-12:].rjust(12, "0"))
        for recorder in (engine.namespaces, engine.pods, engine.policies):
            recorder.on_synced()
        recorders = {"policy": engine.policies, "pod": engine.pods, "namespace": engine.namespaces}
        good_namespaces, good_pods, good_policies = good_objects()
        for obj in good_namespaces:
            engine.namespaces.on_add(obj)
        for kind, obj in objects:
            recorders[kind].on_add(obj)
        for obj in good_pods:
            engine.pods.on_add(obj)
        for obj in good_policies:
            engine.policies.on_add(obj)
        try:
            assert engine.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
            assert set(GOOD_PODS.values()) <= ipset.members(owned.POLICY_KNOWN_SET)
            assert engine.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
            assert engine.last_report is not None and not engine.last_report.wrote, engine.last_report
        finally:
            programmer.cleanup()

    sample()
