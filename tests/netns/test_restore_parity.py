"""The fake iptables reads restore text exactly as the real iptables-restore does: the same
inputs (hand-made and generated adversarial lines with quotes, backslashes, `#`, Unicode,
control characters and newlines, and every renderer's output for adversarial names) go to
the real tool (legacy and nft, in a throwaway namespace) and to FakeIptables; both must
accept or refuse alike and hold the same rules, compared as iptables-save prints them.

And the regression test of issue 18 item 5 through the real path: a Service and port named
`x\\n-I INPUT -j ACCEPT\\n#`, rendered by the real proxy renderer and loaded with the real
iptables-restore, installs no INPUT rule (before the fix it installed `-A INPUT -j ACCEPT`).
"""
from __future__ import annotations

import random

import pytest

from netagent.kernel import namespaces
from netagent.kernel.ipset import IpsetRunner, IpsetSpec, IpsetType, sync_sets
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.restore_format import BUILTIN_CHAINS
from netagent.kernel.iptables.runner import FlushMode, IptablesError, IptablesRunner
from netagent.kernel.pod_attachment import PodAttachment
from netagent.noderoutes.masquerade import render_masquerade_rules
from netagent.policy.iptables.dataplane import KNOWN_SPEC
from netagent.policy.iptables.render import render_chains, render_wanted
from netagent.policy.shared import RenderSettings
from netagent.policy.semantics import plan_node
from proxy.iptables.render import IptablesProxySettings, JumpLines, render_ruleset
from proxy.model import Endpoint, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName
from tests.unit.policy.policy_objects import namespace, pod, policy
from tests.unit.policy.test_policy_semantics import view_of

ATTACK = "x\n-I INPUT -j ACCEPT\n#"
NAMES = [ATTACK, 'a" -j DROP "', "back\\slash\\", "\u2028-A INPUT -j ACCEPT", "é" * 140, "a\rb\x00c", "-j"]
PIECES = [" ", "\t", '"', "\\", "'", "#", "a", "é", "日", "𝕏", "\r", "\x0b", "\x85", "\u2028", "-j", "DROP",
          "\n", "\x00", '\\"', '""']
HAND_MADE = [
    '-m comment --comment "a b" -j ACCEPT', '-m comment --comment a"b c"d -j ACCEPT',
    '-m comment --comment "a\\"b" -j ACCEPT', '-m comment --comment a\\"b -j ACCEPT',
    '-m comment --comment "ab -j ACCEPT', "-m comment --comment 'a b' -j ACCEPT",
    '-m comment --comment """" -j ACCEPT', '-m comment --comment "a"b -j ACCEPT',
    "-m comment --comment a\x00b -j ACCEPT", "-m comment --comment a\tb -j ACCEPT",
    "-j ACCEPT # trailing", "-j ACCEPT\r", '-m comment --comment "' + "é" * 128 + '" -j ACCEPT',
    '-m comment --comment "' + "a" * 1024 + '" -j ACCEPT', "-m comment --comment -j -j ACCEPT",
]


@pytest.fixture
def real(netns, backend):
    return IptablesRunner(backend=backend, exec_prefix=namespaces.exec_prefix(netns), timeout=120,
                          lock_wait_seconds=60)


def comparable(save_text: str) -> list[str]:
    """Save text without its `#` lines and counters (a fresh namespace counts nothing)."""
    return [line.replace(" [0:0]", "") for line in save_text.split("\n") if line and not line.startswith("#")]


def outcome(iptables, text: str, *, tables: tuple[str, ...]) -> tuple[bool, list[str]]:
    try:
        iptables.restore(text)
        accepted = True
    except IptablesError as error:
        print("REFUSED", type(iptables).__name__, error)
        accepted = False
    return accepted, [line for table in tables for line in comparable(iptables.save(table))]


def reset(real: IptablesRunner, tables: tuple[str, ...]) -> None:
    real.restore("".join(f"*{table}\n" + "".join(f":{chain} ACCEPT [0:0]\n" for chain in BUILTIN_CHAINS[table])
                         + "COMMIT\n" for table in tables), flush=FlushMode.FLUSH_TABLES)


def assert_same(real: IptablesRunner, backend, texts: list[str], *, tables=("filter",)) -> int:
    for text in texts:
        reset(real, tables)
        fake = FakeIptables(backend=backend)
        got_real, got_fake = outcome(real, text, tables=tables), outcome(fake, text, tables=tables)
        assert got_real == got_fake, f"input {text!r}"
    return len(texts)


def block(*lines: str) -> str:
    return "*filter\n:NETAGENT-P - [0:0]\n" + "".join(f"-A NETAGENT-P {line}\n" for line in lines) + "COMMIT\n"


def generated(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        token = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 10)))
        out.append(block(f"-m comment --comment {token} -j ACCEPT"))
        out.append(block(f'-m comment --comment "{token}" -j ACCEPT'))
    return out


def test_hand_made_lines_read_alike(real, backend):
    assert assert_same(real, backend, [block(line) for line in HAND_MADE]
                       + ["*filter\n:NETAGENT-P - [0:0]\n  \nCOMMIT\n", "*filter\n:NETAGENT-P - [0:0] junk\nCOMMIT\n",
                          "*filter\n :NETAGENT-P - [0:0]\nCOMMIT\n", "*filter\nCOMMIT \nCOMMIT\n"]) > 0


def test_generated_adversarial_lines_read_alike(real, backend):
    assert_same(real, backend, generated(seed=18, count=60))


def test_every_renderer_reads_alike_for_adversarial_names(netns, real, backend):
    node = NodeContext(name="node-a", zone="zone-1", cluster_cidr="10.244.0.0/16")
    services, endpoints = {}, {}
    for index, text in enumerate(NAMES):
        name = ServicePortName(text, text, text)
        services[name] = ServicePort(name=name, protocol=Protocol.TCP, port=80 + index,
                                     cluster_ip=f"10.96.0.{10 + index}", node_port=30080 + index)
        endpoints[name] = (Endpoint("10.244.1.5", 8080, node_name="node-a"),) if index % 2 else ()
    proxy_text = render_ruleset(ProxyState(node, services, endpoints),
                                settings=IptablesProxySettings()).restore_text(jumps=JumpLines.APPEND)

    objects = [namespace(text) for text in NAMES[:3]]
    for index, text in enumerate(NAMES[:3]):
        objects += [pod(text, text, f"10.0.0.{2 + index}", {"app": "a"}, ports=((text, 80, "TCP"),)),
                    policy(text, text, {"podSelector": {}, "ingress": [
                        {"from": [{"podSelector": {"matchLabels": {"app": "a"}}}], "ports": [{"port": text}]}]})]
    wanted = render_wanted(plan_node(view_of(*objects), node_name="node-1"),
                           settings=RenderSettings(PodAttachment.BRIDGE, local_cidrs=("10.0.0.0/24",)),
                           interface_of=lambda _: "na0123456789ab")
    hairpin = IpsetSpec(IptablesProxySettings().hairpin_set, IpsetType.HASH_IP_PORT_IP)
    sync_sets(IpsetRunner(exec_prefix=namespaces.exec_prefix(netns), timeout=30),
              {**wanted.sets, hairpin: frozenset(), KNOWN_SPEC: wanted.known})  # named by rules: the tool checks
    policy_text = render_chains(wanted.chains).text()
    masquerade_text = render_masquerade_rules(cluster_cidrs=["10.244.0.0/16"], pod_cidrs=["10.244.1.0/24"])

    for text in (proxy_text, policy_text, masquerade_text):
        assert outcome(real, "", tables=()) == (True, [])
        assert_same(real, backend, [text], tables=("filter", "nat"))
        real.restore(text)          # the real tool takes every renderer's text


def test_a_service_name_cannot_write_its_own_rule(netns, real):
    """Issue 18 item 5 through the real path; uses only what the code before the fix had."""
    IpsetRunner(exec_prefix=namespaces.exec_prefix(netns), timeout=30).ensure_set(
        IpsetSpec(IptablesProxySettings().hairpin_set, IpsetType.HASH_IP_PORT_IP))
    node = NodeContext(name="node-a", zone="zone-1", cluster_cidr="10.244.0.0/16")
    served, empty = ServicePortName("default", ATTACK, ATTACK), ServicePortName(ATTACK, ATTACK, ATTACK)
    state = ProxyState(node, {
        served: ServicePort(name=served, protocol=Protocol.TCP, port=80, cluster_ip="10.96.0.10", node_port=30080),
        empty: ServicePort(name=empty, protocol=Protocol.TCP, port=81, cluster_ip="10.96.0.11", node_port=30081),
    }, {served: (Endpoint("10.244.1.5", 8080, node_name="node-a"),), empty: ()})
    real.restore(render_ruleset(state, settings=IptablesProxySettings()).restore_text(jumps=JumpLines.APPEND))
    filter_input = [line for line in real.save("filter").split("\n") if line.startswith("-A INPUT ")]
    assert len(filter_input) == 1 and filter_input[0].endswith("-j NETAGENT-SVC-FILTER"), filter_input
    assert not [line for line in real.save("nat").split("\n") if line.startswith("-A INPUT ")]
    assert not [line for line in real.save().split("\n") if line.rstrip().endswith("-j ACCEPT")
                and "NETAGENT-SVC-FORWARD" not in line]
