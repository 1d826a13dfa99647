"""The NetworkPolicy truth tables' shared parts: the labs (one per pod attachment, dataplane and,
for IPv6, a dual-stack one; built when first asked for, one set per test module), the fixtures
that pick them, and the small builders of policies and addresses the cases use."""
from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest

from netagent.kernel import namespaces
from netagent.kernel.families import IpFamily
from netagent.kernel.pod_attachment import PodAttachment
from proxy.backend import ProxyMode
from tests.conftest import require_root_netns
from tests.netns.policy_lab import PolicyLab

X = [f"x/{p}" for p in "abc"]
Y = [f"y/{p}" for p in "abc"]
Z = [f"z/{p}" for p in "abc"]
TCP80, TCP81, UDP80, UDP81 = ("tcp", 80), ("tcp", 81), ("udp", 80), ("udp", 81)


def policy(namespace: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"namespace": namespace, "name": name}, "spec": spec}


def pods(**labels) -> dict:
    return {"matchLabels": labels}


@pytest.fixture(autouse=True)
def _root_and_no_leaks():
    """Replaces netns/conftest.py's per-test check of every `na-t` namespace on the machine:
    the lab here lives for the module, and other suites running at the same time make their
    own; the lab fixture checks that none of ITS namespaces outlive it."""
    require_root_netns()
    yield


DATAPLANES = (ProxyMode.IPTABLES, ProxyMode.NFTABLES)
MODES = (PodAttachment.BRIDGE, PodAttachment.ROUTED)


@pytest.fixture(scope="module")
def labs():
    """The labs of this module, built when first asked for, one per (mode, dataplane) and, for
    the IPv6 cases, one dual-stack lab per (mode, dataplane)."""
    require_root_netns()
    built: dict[tuple[PodAttachment, ProxyMode, bool], PolicyLab] = {}
    with contextlib.ExitStack() as stack:
        def lab(mode: PodAttachment, dataplane: ProxyMode, family: IpFamily = IpFamily.V4) -> PolicyLab:
            dual = family is IpFamily.V6
            if (mode, dataplane, dual) not in built:
                built[(mode, dataplane, dual)] = stack.enter_context(PolicyLab(mode=mode, dataplane=dataplane,
                                                                               dual=dual))
            built[(mode, dataplane, dual)].family = family
            return built[(mode, dataplane, dual)]
        yield lab
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    left = [name for name in listed for lab in built.values() if name.startswith(lab.node.prefix)]
    assert not left, f"namespaces leaked: {left}"


def _clean(lab):
    lab.apply()
    yield lab
    lab.apply()


def _ids(pair) -> str:
    return "-".join(item.label if isinstance(item, IpFamily) else item.value for item in pair)


@pytest.fixture(params=[(m, d) for d in DATAPLANES for m in MODES], ids=_ids)
def np(request, labs):
    """Either mode on either dataplane (the cases where the hooks differ by mode), with no
    policy before and after."""
    yield from _clean(labs(*request.param))


FAMILY_CASES = [(m, d, IpFamily.V4) for d in DATAPLANES for m in MODES] + \
    [(PodAttachment.ROUTED, d, IpFamily.V6) for d in DATAPLANES]


@pytest.fixture(params=FAMILY_CASES, ids=_ids)
def npf(request, labs):
    """`np`'s cases, and IPv6 in routed mode on both dataplanes (a dual-stack lab probed over
    IPv6): the representative subset of the table run for IPv6."""
    yield from _clean(labs(*request.param))


@pytest.fixture(params=[case for case in FAMILY_CASES if case[1:] != (ProxyMode.NFTABLES, IpFamily.V6)], ids=_ids)
def npf_iptables6(request, labs):
    """`npf` but IPv6 on nftables: what costs most and whose IPv6 KNOWN set the other IPv6 cases
    already need (a pod not in it is dropped), within the suite's time budget."""
    yield from _clean(labs(*request.param))


@pytest.fixture(params=DATAPLANES, ids=lambda d: d.value)
def np_dual(request, labs):
    """The dual-stack lab (routed mode), probed over either family by the case itself."""
    lab = labs(PodAttachment.ROUTED, request.param, IpFamily.V6)
    yield from _clean(lab)
    lab.family = IpFamily.V6


def status_of(lab, *args: str) -> str:
    """`netagent status policy ARGS` run on the lab's node."""
    done = namespaces.run_in(lab.netns_of["node"], [sys.executable, "-m", "netagent.cli", "status", "policy",
                                                    "--iptables-backend", "legacy", *args])
    assert done.returncode == 0, done.stderr
    return done.stdout


def cluster_block(lab) -> str:
    """A block holding every pod address of the probed family (and the node's pod CIDR)."""
    return "10.244.0.0/16" if lab.family is IpFamily.V4 else "fd00:10:244::/48"


def outside_block(lab) -> str:
    """The block of `ext`, outside the cluster, in the probed family."""
    return "192.0.2.0/24" if lab.family is IpFamily.V4 else "2001:db8:2::/64"


def host(lab, key: str) -> str:
    return f"{lab.addresses[key]}/{lab.family.max_prefix}"


@pytest.fixture(params=DATAPLANES, ids=lambda d: d.value)
def np_bridge(request, labs):
    """Semantics that do not depend on how pods attach (the plan is the same; only the hooks on
    the interfaces differ, and the `np` cases cover those in both modes): bridge mode only."""
    yield from _clean(labs(PodAttachment.BRIDGE, request.param))


@pytest.fixture(params=MODES, ids=lambda m: m.value)
def np_iptables(request, labs):
    yield from _clean(labs(request.param, ProxyMode.IPTABLES))


@pytest.fixture(params=MODES, ids=lambda m: m.value)
def np_nft(request, labs):
    yield from _clean(labs(request.param, ProxyMode.NFTABLES))


@pytest.fixture(params=DATAPLANES, ids=lambda d: d.value)
def np_bridge6(request, labs):
    """Bridge mode probed over IPv6 (a dual-stack bridge lab): pods on the bridge resolve each
    other with neighbour discovery, which br_netfilter hands to FORWARD like any bridged packet."""
    yield from _clean(labs(PodAttachment.BRIDGE, request.param, IpFamily.V6))
