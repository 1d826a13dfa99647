"""Hypothesis strategies of hostile NetworkPolicies, Pods and Namespaces, and the fixed good
objects they are mixed with, for tests/unit/policy/test_hostile_policy.py and the netns sample in
tests/netns/test_network_policy.py.

Hostile objects are what a lax or compromised API server could deliver: nulls and wrong
types at any depth, unknown fields and operators, huge lists (built by `map`, cheap to draw),
odd ports (0, 70000, floats, strings, bools), protocols, CIDRs (IPv6, /0, host bits, octal,
trailing newlines) and unicode everywhere. Their metadata always carries a namespace and
name, as the reflector keys objects by them; names are unicode without control characters
(what reaches rule comments is the escaping layer's concern, tested there).

They live in namespaces `h` and `h2` (hostile namespaces are never named x or y), so by the
rules of NetworkPolicy they cannot change the good pods' programming; `h/victim` is a local pod
every hostile policy may select.
"""
from __future__ import annotations

from hypothesis import strategies as st

from tests.unit.policy.policy_objects import namespace, pod, policy

NODE = "node-1"
LOCAL_CIDR = "10.0.0.0/24"
HOSTILE_NAMESPACES = ("h", "h2")
GOOD_PODS = {"x/a": "10.0.0.2", "x/b": "10.0.0.3", "y/c": "10.0.0.4"}
VICTIM = "h/victim"


def good_objects() -> tuple[list[dict], list[dict], list[dict]]:
    """(namespaces, pods, policies): y/c admits x/a on TCP 80 and named port `web`; x/b has no policy."""
    namespaces = [namespace("x", team="red"), namespace("y", team="blue"), namespace("h"), namespace("h2")]
    pods = [pod("x", "a", "10.0.0.2", {"pod": "a"}), pod("x", "b", "10.0.0.3", {"pod": "b"}),
            pod("y", "c", "10.0.0.4", {"pod": "c"}, ports=(("web", 8080, "TCP"),)),
            pod("x", "far", "10.0.1.2", {"pod": "a"}, node="node-2"),
            pod("h", "victim", "10.0.0.200", {"app": "victim"})]
    policies = [policy("y", "allow-a", {"podSelector": {"matchLabels": {"pod": "c"}}, "ingress": [
        {"from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "x"}},
                   "podSelector": {"matchLabels": {"pod": "a"}}}],
         "ports": [{"port": 80}, {"port": "web"}]}]})]
    return namespaces, pods, policies


names = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=40) \
    .filter(lambda text: "/" not in text)
any_text = st.text(max_size=30)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True), any_text)
junk = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(any_text, inner, max_size=4)), max_leaves=12)


def maybe(strategy: st.SearchStrategy) -> st.SearchStrategy:
    """The strategy, or junk (a wrong type, null) in its place."""
    return st.one_of(strategy, strategy, junk)


label_keys = st.one_of(st.sampled_from(["app", "pod", "team", "kubernetes.io/metadata.name", ""]), any_text)
label_values = st.one_of(st.sampled_from(["victim", "a", "c", "red", "x", "h"]), any_text)
labels = maybe(st.dictionaries(label_keys, maybe(label_values), max_size=4))
operators = st.one_of(st.sampled_from(["In", "NotIn", "Exists", "DoesNotExist", "in", "Gt", ""]), junk)
expression = maybe(st.fixed_dictionaries({"key": maybe(label_keys)}, optional={
    "operator": operators, "values": maybe(st.lists(maybe(label_values), max_size=3)), "weight": junk}))
selector = st.one_of(st.none(), junk, st.fixed_dictionaries({}, optional={
    "matchLabels": labels, "matchExpressions": maybe(st.lists(expression, max_size=3)), "matchFields": junk}))

v4 = st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), st.integers(0, 255), st.integers(0, 32))
cidrs = st.one_of(
    v4.map(lambda t: f"{t[0]}.{t[1]}.{t[2]}.{t[3]}/{t[4]}"),
    st.sampled_from(["0.0.0.0/0", "::/0", "fe80::/64", "2001:db8::1/128", "10.0.0.1/32", "10.0.0.0/33",
                     "300.1.1.1/8", "010.0.0.0/8", "10.0.0.0/8\n", " 10.0.0.0/8", "10.0.0.0", "10.0.0.0/-1",
                     "10.0.0.0/255.0.0.0", "10.0.0.0/8/8", "", "١٠.0.0.0/8",
                     # IPv6 (issue 22): v4-mapped, zones, bad prefixes, odd spellings
                     "::ffff:10.0.0.0/104", "::ffff:0:0/96", "fe80::1%eth0/64", "fd00::/129", "fd00::/-1",
                     "fd00:::1/64", "FD00:0::/16", "fd00::/16\n", "2001:db8::/32", "::1/128"]),
    junk)
ip_block = maybe(st.fixed_dictionaries({"cidr": cidrs}, optional={
    "except": maybe(st.lists(cidrs, max_size=4)), "exceptAll": junk}))
peer = maybe(st.fixed_dictionaries({}, optional={
    "podSelector": selector, "namespaceSelector": selector, "ipBlock": ip_block, "serviceAccount": junk}))
port_values = st.one_of(st.integers(-1, 70000), st.sampled_from([0, 65535, 65536, 70000, 80.0, 80.5, True, "80",
                                                                  "web", "WEB", "we b", "a" * 16, "", "٨٠"]), junk)
port = maybe(st.fixed_dictionaries({}, optional={
    "protocol": st.one_of(st.sampled_from(["TCP", "UDP", "SCTP", "ICMP", "tcp", ""]), junk),
    "port": port_values, "endPort": port_values, "hostPort": junk}))


def rule(peer_field: str) -> st.SearchStrategy:
    return maybe(st.fixed_dictionaries({}, optional={
        peer_field: maybe(st.lists(peer, max_size=4)), "ports": maybe(st.lists(port, max_size=3)), "action": junk}))


def huge_rule(peer_field: str) -> st.SearchStrategy:
    """One rule with thousands of ipBlocks or ports (around and above the default limits)."""
    def build(args: tuple[int, bool, int]) -> dict:
        blocks, excepts, ports = args
        items = [{"ipBlock": {"cidr": f"{11 + i // 65536}.{i // 256 % 256}.{i % 256}.0/24",
                              **({"except": [f"{11 + i // 65536}.{i // 256 % 256}.{i % 256}.128/25"]}
                                 if excepts else {})}} for i in range(blocks)]
        return {peer_field: items, "ports": [{"port": 1 + n} for n in range(ports)]}
    return st.tuples(st.sampled_from([0, 2, 2001, 10001, 40000]), st.booleans(),
                     st.sampled_from([0, 1, 3, 1001])).map(build)


spec = st.fixed_dictionaries({}, optional={
    "podSelector": st.one_of(selector, st.just({"matchLabels": {"app": "victim"}}), st.just({})),
    "policyTypes": maybe(st.lists(st.one_of(st.sampled_from(["Ingress", "Egress", "ingress", "Both"]), junk),
                                  max_size=3)),
    "ingress": maybe(st.lists(st.one_of(rule("from"), huge_rule("from")), max_size=3)),
    "egress": maybe(st.lists(st.one_of(rule("to"), huge_rule("to")), max_size=3)),
    "denyAll": junk})


@st.composite
def hostile_policy(draw) -> dict:
    obj = policy(draw(st.sampled_from(HOSTILE_NAMESPACES)), draw(names), {})
    obj["spec"] = draw(st.one_of(spec, spec, spec, junk))
    if draw(st.booleans()):
        obj["metadata"]["labels"] = draw(junk)
    return obj


local_or_not = st.one_of(st.integers(128, 191).map(lambda n: f"10.0.0.{n}"),
                         st.integers(2, 250).map(lambda n: f"10.0.5.{n}"),
                         st.sampled_from(["fd00::5", "10.0.0.999", "010.0.0.130", "10.0.0.130\n", "", "0.0.0.0",
                                          "::ffff:10.0.0.130", "fe80::1%eth0", "fd00::5%1", "FD00::0005"]),
                         junk)
container_port = maybe(st.fixed_dictionaries({}, optional={
    "name": st.one_of(st.sampled_from(["web", "WEB", "web-2", "a" * 16]), junk),
    "containerPort": port_values, "protocol": st.one_of(st.sampled_from(["TCP", "UDP", "SCTP", "ICMP"]), junk)}))
container = maybe(st.fixed_dictionaries({"name": any_text}, optional={
    "ports": maybe(st.lists(container_port, max_size=4))}))


@st.composite
def hostile_pod(draw) -> dict:
    obj = pod(draw(st.sampled_from(HOSTILE_NAMESPACES)), draw(names), None, {})
    obj["metadata"]["labels"] = draw(labels)
    obj["spec"] = draw(st.one_of(st.fixed_dictionaries({}, optional={
        "nodeName": st.one_of(st.sampled_from([NODE, "node-2", ""]), junk),
        "hostNetwork": st.one_of(st.booleans(), junk),
        "containers": maybe(st.lists(container, max_size=3))}), junk))
    obj["status"] = draw(st.one_of(st.fixed_dictionaries({}, optional={
        "podIP": local_or_not, "podIPs": maybe(st.lists(maybe(st.fixed_dictionaries({"ip": local_or_not})),
                                                        max_size=2)),
        "phase": st.one_of(st.sampled_from(["Running", "Pending", "Succeeded", "Failed"]), junk)}), junk))
    return obj


@st.composite
def hostile_namespace(draw) -> dict:
    obj = {"metadata": {"name": draw(st.one_of(st.sampled_from(HOSTILE_NAMESPACES),
                                               names.filter(lambda n: n not in ("x", "y"))))}}
    obj["metadata"]["labels"] = draw(labels)
    if draw(st.booleans()):
        obj["spec"] = draw(junk)
    return obj
