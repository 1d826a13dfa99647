"""`netagent flows` on a lab's real agents (issue 33): a policy isolates x-b, pods of another
namespace are refused (one on x-b's node, one across the overlay), and on x-b's node
`netagent flows --verdict dropped --json` (the agent's /flows on its loopback metrics address)
names the pod, the direction and the policy; an allowed connection is not among the drops.
Both policy dataplanes (iptables NFLOG, nft `log group`). The lab is test_network_policy.py's."""
from __future__ import annotations

import json
import sys
import time

import pytest

from tests.cluster.lab_tools import CONVERGE_SECONDS
from tests.cluster.test_network_policy import PODS, _no_leaks_per_module, lab_cli, policy_lab, probe  # noqa: F401

LOCK_B = """\
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-x, namespace: x}
spec:
  podSelector: {matchLabels: {app: b}}
  ingress:
  - from: [{podSelector: {}}]
"""


@pytest.fixture(scope="module", params=["iptables", "nftables"])
def lab(request):
    with policy_lab(request.param, PODS) as lab:
        yield lab


def flows(lab, node: str, *args: str) -> list[dict]:
    done = lab.exec(node, [sys.executable, "-m", "netagent.cli", "flows", "--json", *args], timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def test_a_denied_connection_is_found_with_the_policy_named(lab):
    lab_cli(lab, "apply", "-f", "-", stdin=LOCK_B)
    ip = {name: lab.state.pods[name].ip for name in PODS}
    deadline = time.monotonic() + CONVERGE_SECONDS
    while probe(lab, "y-c", [("b", ip["x-b"], 80)])["b"] or not probe(lab, "x-a", [("b", ip["x-b"], 80)])["b"]:
        assert time.monotonic() < deadline, "the policy was not enforced"
    probe(lab, "y-b", [("b", ip["x-b"], 80)])            # across the overlay: refused too
    wanted = {("y-c", "y/y-c"), ("y-b", "")}              # y-b lives on node-1: an address on node-2
    deadline = time.monotonic() + CONVERGE_SECONDS
    while True:
        dropped = flows(lab, "node-2", "--verdict", "dropped", "--pod", "x/x-b")
        seen = {(source, f["source_pod"]) for f in dropped for source in PODS if f["source"] == ip[source]}
        if wanted <= seen:
            break
        assert time.monotonic() < deadline, f"flows seen: {dropped}"
    for flow in dropped:
        assert (flow["verdict"], flow["reason"], flow["direction"]) == ("dropped", "policy", "ingress")
        assert (flow["pod"], flow["policies"], flow["destination_pod"]) == ("x/x-b", ["x/only-x"], "x/x-b")
        assert (flow["protocol"], flow["destination_port"], flow["destination"]) == ("tcp", 80, ip["x-b"])
    assert not [f for f in dropped if f["source"] == ip["x-a"]], "an allowed connection was recorded as dropped"
    table = lab.exec("node-2", [sys.executable, "-m", "netagent.cli", "flows", "--namespace", "y"],
                     timeout=60).stdout
    assert "dropped by policy x/only-x (ingress of x/x-b)" in table and "y/y-c:" in table, table
    lab_cli(lab, "delete", "-f", "-", stdin=LOCK_B)
