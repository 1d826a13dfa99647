"""Arbitrary Unicode names through every renderer that writes restore text: the text read back
as iptables-restore reads it (the fake, whose tokenizer tests/netns/test_restore_parity.py
holds to the real tool) holds exactly the intended chains and rules, no line more, and every
comment is in its safe form (no control character, at most 255 bytes, `comment_text` of the
intended text). The ipset restore text holds exactly the intended sets and members.

Names come from Hypothesis's full Unicode text (control characters, quotes, backslashes,
newlines, U+2028, astral characters) plus a few hand-made attacks, among them the one from
issue 18 (`\\n-I INPUT -j ACCEPT\\n#`), which wrote its own rule before the fix. Service and
NetworkPolicy values are built straight from the model and the policy parser, so the test
holds even for a name an API parser would let through. `NETAGENT_FUZZ_EXAMPLES=N` runs more.
"""
from __future__ import annotations

import os
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netagent.kernel.ipset.restore import restore_lines
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.restore_format import BUILTIN_CHAINS, Table, parse_restore, stored_spec
from netagent.kernel.iptables.runner import FlushMode
from netagent.kernel.iptables.tokens import COMMENT_MAX_BYTES, comment_text, split_ipset_line
from netagent.kernel.pod_attachment import PodAttachment
from netagent.policy.iptables.render import render_chains, render_wanted
from netagent.policy.shared import RenderSettings
from netagent.policy.semantics import plan_node
from proxy.iptables.render import IptablesProxySettings, JumpLines, render_ruleset
from proxy.model import Endpoint, EntryKind, NodeContext, Protocol, ProxyState, ServicePort, ServicePortName
from tests.unit.policy.policy_objects import namespace, pod, policy
from tests.unit.policy.test_policy_semantics import view_of

EXAMPLES = int(os.environ.get("NETAGENT_FUZZ_EXAMPLES", "60"))
ATTACKS = ["x\n-I INPUT -j ACCEPT\n#", "x\n-A INPUT -j ACCEPT", '"', "\\", '\\"', 'a" -j ACCEPT "', "a\x00b",
           "a\rb", "\u2028-A INPUT -j ACCEPT", "\x85", "é" * 200, "𝕏" * 80, "#", "", " ", "\t", "a'b", "\ud800"]
NAMES = st.one_of(st.sampled_from(ATTACKS), st.text(max_size=90),
                  st.lists(st.sampled_from(ATTACKS + ["a", " ", "-j", "DROP"]), max_size=6).map("".join))
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
NODE = NodeContext(name="node-a", zone="zone-1", cluster_cidr="10.244.0.0/16")
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def comments(table: Table) -> list[str]:
    return [spec[index + 1] for chain in table.chains.values() for spec in chain.rules
            for index, token in enumerate(spec[:-1]) if token == "--comment"]


def assert_safe_comment(comment: str, intended: set[str]) -> None:
    assert not UNSAFE.search(comment), comment
    assert len(comment.encode()) <= COMMENT_MAX_BYTES
    assert comment in {comment_text(text) for text in intended}, comment


def loaded(text: str) -> dict[str, Table]:
    fake = FakeIptables()
    fake.restore(text, flush=FlushMode.FLUSH_TABLES)
    return fake.state()


# ---- the service proxy ---------------------------------------------------------------------------

@SETTINGS
@given(namespace_name=NAMES, service_name=NAMES, port_name=NAMES, empty_name=NAMES)
def test_proxy_ruleset_holds_exactly_the_intended_rules(namespace_name, service_name, port_name, empty_name):
    served = ServicePort(name=ServicePortName(namespace_name, service_name, port_name), protocol=Protocol.TCP,
                         port=80, cluster_ip="10.96.0.10", node_port=30080, external_ips=("192.0.2.7",))
    empty = ServicePort(name=ServicePortName(empty_name, empty_name, empty_name), protocol=Protocol.UDP,
                        port=53, cluster_ip="10.96.0.11", node_port=30053)
    endpoints = (Endpoint("10.244.1.5", 8080, node_name="node-a"), Endpoint("10.244.2.5", 8080, node_name="node-b"))
    state = ProxyState(NODE, {served.name: served, empty.name: empty}, {served.name: endpoints, empty.name: ()})
    ruleset = render_ruleset(state, settings=IptablesProxySettings())
    text = ruleset.restore_text(jumps=JumpLines.APPEND)

    tables = loaded(text)
    declared = sum(len(BUILTIN_CHAINS[table]) for table in ("filter", "nat")) + len(ruleset.chains())
    assert len(text.split("\n")) == 2 * 2 + declared + ruleset.rule_count + 1   # no line more
    intended = {f"{service.name} {kind.value}" for service in (served, empty) for kind in EntryKind}
    intended |= {jump.comment for jump in ruleset.jumps}
    for table in ("filter", "nat"):
        held = tables[table]
        ours = {chain.name: chain for chain in ruleset.chains(table)}
        assert set(held.chains) == set(BUILTIN_CHAINS[table]) | set(ours)
        for builtin in BUILTIN_CHAINS[table]:     # nothing but our jumps in a built-in chain
            assert held.chains[builtin].rules == [stored_spec(jump.spec) for jump in ruleset.jumps
                                                  if (jump.table, jump.chain) == (table, builtin)]
        for name, chain in ours.items():
            assert len(held.chains[name].rules) == len(chain.rules)
        for comment in comments(held):
            assert_safe_comment(comment, intended)
    assert len(comments(tables["nat"])) + len(comments(tables["filter"])) == text.count("--comment")


# ---- NetworkPolicy and its ipsets ------------------------------------------------------------------

@SETTINGS
@given(namespace_name=NAMES, pod_name=NAMES, policy_name=NAMES, port_name=NAMES)
def test_policy_rules_and_sets_hold_exactly_the_intended_ones(namespace_name, pod_name, policy_name, port_name):
    objects = (pod(namespace_name, pod_name, "10.0.0.2", {"app": "a"}, ports=((port_name or "p", 80, "TCP"),)),
               pod(namespace_name, "peer", "10.0.0.3", {"app": "b"}), namespace(namespace_name),
               policy(namespace_name, policy_name, {"podSelector": {"matchLabels": {"app": "a"}}, "ingress": [
                   {"from": [{"podSelector": {"matchLabels": {"app": "b"}}}], "ports": [{"port": port_name or "p"}]},
                   {"from": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.1.0/24"]}}]}]}))
    plan = plan_node(view_of(*objects), node_name="node-1")
    wanted = render_wanted(plan, settings=RenderSettings(PodAttachment.BRIDGE, local_cidrs=("10.0.0.0/24",)),
                           interface_of=lambda _: "na0123456789ab")
    text = render_chains(wanted.chains).text()

    held = loaded(text)["filter"]
    assert set(wanted.chains) <= set(held.chains)
    assert set(held.chains) - set(wanted.chains) <= set(BUILTIN_CHAINS["filter"])
    for name, rules in wanted.chains.items():
        assert held.chains[name].rules == list(rules)      # canonical specs: what the kernel keeps
    entries = [entry for block in parse_restore(text) for entry in block.entries]
    assert len(entries) == len(wanted.chains) + sum(len(rules) for rules in wanted.chains.values())
    for comment in comments(held):
        assert not UNSAFE.search(comment) and len(comment.encode()) <= COMMENT_MAX_BYTES

    members = {spec.name: (sorted(found), []) for spec, found in wanted.sets.items()}
    lines = restore_lines(create=list(wanted.sets), changes=members)
    assert len("\n".join(lines).split("\n")) == len(wanted.sets) + sum(len(m) for m, _ in members.values())
    parsed = [split_ipset_line(line) for line in lines]
    assert [tokens[:2] for tokens in parsed if tokens and tokens[0] == "create"] == [
        ["create", spec.name] for spec in wanted.sets]
    assert [tokens for tokens in parsed if tokens and tokens[0] == "add"] == [
        ["add", name, member] for name, (found, _) in members.items() for member in found]


# ---- the escaping itself -------------------------------------------------------------------------

@settings(max_examples=EXAMPLES * 5, deadline=None, derandomize=True)
@given(text=st.one_of(NAMES, st.text(alphabet=st.characters(), max_size=400)))
def test_any_comment_is_one_token_that_reads_back_as_its_safe_form(text):
    fake = FakeIptables()
    fake.restore("*filter\n:NETAGENT-X - [0:0]\n"
                 + "-A NETAGENT-X -m comment --comment " + _quoted(text) + " -j ACCEPT\nCOMMIT\n")
    assert fake.state()["filter"].chains["NETAGENT-X"].rules == [
        ("-m", "comment", "--comment", comment_text(text), "-j", "ACCEPT")]


def _quoted(text: str) -> str:
    from netagent.kernel.iptables.tokens import quote_comment
    return quote_comment(text)


# ---- no drift: what the kernel keeps is what the renderer meant ----------------------------------

def test_adversarial_and_long_names_program_once_and_then_look_in_sync():
    """A comment longer than 255 bytes was cut by the kernel (inside a character, even) while
    the renderer kept its own text, so every FULL sync saw drift and rewrote the chains; a
    name with a newline could not be written at all. Now the spec carries the safe form."""
    from netagent.infra.sync_runner import SyncKind, SyncResult
    from tests.unit.policy.iptables.test_policy_programmer import Node

    node = Node()
    for index, text in enumerate(["é" * 200, "x\n-I INPUT -j ACCEPT\n#", "𝕏" * 70 + '"\\']):
        node.engine.pods.on_add(pod("x", text, f"10.0.0.{5 + index}", {"pod": "a"}))
        node.engine.policies.on_add(policy("x", text, {"podSelector": {"matchLabels": {"pod": "a"}},
                                                       "ingress": [{"from": [{"podSelector": {}}]}]}))
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    written = node.writes()
    assert node.sync(SyncKind.FULL) is SyncResult.SUCCEEDED
    assert node.writes() == written
    for comment in comments(node.iptables.state()["filter"]):
        assert not UNSAFE.search(comment) and len(comment.encode()) <= COMMENT_MAX_BYTES
    assert node.iptables.state()["filter"].chains["INPUT"].rules == []
