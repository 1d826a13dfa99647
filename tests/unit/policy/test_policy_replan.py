"""Incremental planning (incremental.py) against planning the whole node (semantics.plan_node).

The property: after any sequence of pod, namespace and policy changes, each planned from the
last plan, the incremental plan equals `plan_node` of the same view, also when set capacities
cross their thresholds (made tiny here) so sets are renamed and the pods naming them planned
again. The objects go through the real parsers (kube_objects.py), unreadable ones included.
"""
from __future__ import annotations

from unittest import mock

from hypothesis import HealthCheck, given, settings, strategies as st

from netagent.policy import semantics
from netagent.policy.incremental import Basis, changed_keys, replan, snapshot
from netagent.policy.kube_objects import parse_namespace, parse_pod, parse_policy
from netagent.policy.semantics import ClusterView, plan_node
from tests.unit.policy.policy_objects import namespace, pod, policy

NODE = "node-1"
NAMESPACES = ("x", "y", "z")
KEYS, VALUES = ("app", "tier"), ("a", "b")
LABELS = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2)
PORTS = st.sampled_from(((), (("http", 80, "TCP"),), (("http", 8080, "TCP"), ("dns", 53, "UDP"))))


def selectors() -> st.SearchStrategy[dict]:
    requirement = st.builds(lambda key, op, value: {"key": key, "operator": op, "values": [value]},
                            st.sampled_from(KEYS), st.sampled_from(("In", "NotIn")), st.sampled_from(VALUES))
    return st.one_of(st.builds(lambda labels: {"matchLabels": labels}, LABELS),
                     st.builds(lambda req: {"matchExpressions": [req]}, requirement))


def peers() -> st.SearchStrategy[dict]:
    selector = selectors()
    return st.one_of(
        st.builds(lambda s: {"podSelector": s}, selector),
        st.builds(lambda s, n: {"podSelector": s, "namespaceSelector": n}, selector, selector),
        st.builds(lambda n: {"namespaceSelector": n}, selector),
        st.just({"ipBlock": {"cidr": "10.0.0.0/16", "except": ["10.0.0.0/28"]}}),
        st.just({"ipBlock": {"cidr": "10.1.0.0/24"}}))


def specs() -> st.SearchStrategy[dict]:
    port = st.sampled_from(({"port": 80}, {"port": "http"}, {"port": "dns", "protocol": "UDP"}))
    rule = st.fixed_dictionaries({"peers": st.one_of(st.none(), st.lists(peers(), min_size=1, max_size=2)),
                                  "ports": st.one_of(st.none(), st.lists(port, min_size=1, max_size=2))})

    def spec(selector: dict, types: list[str], rules: list[dict]) -> dict:
        made: dict = {"podSelector": selector, "policyTypes": types}
        for direction, field in (("Ingress", "from"), ("Egress", "to")):
            if direction in types:
                made[direction.lower()] = [{**({field: r["peers"]} if r["peers"] else {}),
                                            **({"ports": r["ports"]} if r["ports"] else {})} for r in rules]
        return made
    readable = st.builds(spec, selectors(), st.sampled_from((["Ingress"], ["Egress"], ["Ingress", "Egress"])),
                         st.lists(rule, max_size=2))
    return st.one_of(readable, readable, readable, st.just({"podSelector": {"matchLabels": 7}}))   # unreadable: closed


def pod_objects() -> st.SearchStrategy[dict | None]:
    ip = st.sampled_from([f"10.0.0.{n}" for n in range(2, 9)] + ["10.1.0.5", "10.3.0.1", None])
    made = st.builds(lambda ns, ip, labels, node, ports, host: pod(ns, "?", ip, labels, node=node, ports=ports,
                                                                   host_network=host),
                     st.sampled_from(NAMESPACES), ip, st.one_of(LABELS, st.just(None)),
                     st.sampled_from((NODE, "node-2")), PORTS, st.sampled_from((False, False, False, True)))
    return st.one_of(made, made, made, st.none())         # (one_of picks a branch evenly)


def populated() -> st.SearchStrategy[list[tuple]]:
    """Every namespace, pod and policy set first (so later changes land in a populated cluster), then changes."""
    def sequence(namespaces: list, pods: list, policies: list, changes: list) -> list[tuple]:
        return [*(("namespace", name, labels) for name, labels in zip(NAMESPACES, namespaces)),
                *(("pod", index, obj) for index, obj in enumerate(pods)),
                *(("policy", index, (ns, spec)) for index, (ns, spec) in enumerate(policies)), *changes]
    return st.builds(sequence, st.lists(LABELS, min_size=3, max_size=3), st.lists(pod_objects(), min_size=8, max_size=8),
                     st.lists(st.tuples(st.sampled_from(NAMESPACES), specs()), min_size=1, max_size=4),
                     st.lists(CHANGES, min_size=1, max_size=12))


CHANGES = st.one_of(
    st.tuples(st.just("pod"), st.integers(0, 7), pod_objects()),
    st.tuples(st.just("namespace"), st.sampled_from(NAMESPACES), st.one_of(LABELS, LABELS, st.none())),
    st.tuples(st.just("policy"), st.integers(0, 3), st.tuples(st.sampled_from(NAMESPACES), st.one_of(specs(), specs(), st.none()))))


def apply_change(view: ClusterView, change: tuple) -> None:
    kind, which, value = change
    if kind == "pod":
        key = f"{value['metadata']['namespace'] if value else 'x'}/pod{which}"
        for other in [k for k in view.pods if k.endswith(f"/pod{which}")]:
            del view.pods[other]
        if value is not None:
            if value["metadata"]["labels"] is None:
                value["metadata"]["labels"] = "unreadable"
            view.pods[key] = parse_pod(value, key=key).value
    elif kind == "namespace":
        if value is None:
            view.namespaces.pop(which, None)
        else:
            view.namespaces[which] = parse_namespace(namespace(which, **value), key=which).value
    else:
        ns, spec = value
        for other in [k for k in view.policies if k.endswith(f"/p{which}")]:
            del view.policies[other]
        if spec is not None:
            view.policies[f"{ns}/p{which}"] = parse_policy(policy(ns, f"p{which}", spec), key=f"{ns}/p{which}").value


def check_sequence(changes: list[tuple]) -> int:
    """Plan after every change from the last plan; each equals the whole node's. How many were incremental."""
    view = ClusterView()
    basis = Basis(snapshot(view), plan_node(view, node_name=NODE))
    incremental = 0
    for change in changes:
        apply_change(view, change)
        whole = plan_node(view, node_name=NODE)
        planned = replan(basis, view, node_name=NODE)
        if planned is not None:
            assert planned == whole, change
            incremental += 1
        basis = Basis(snapshot(view), planned if planned is not None else whole)
    return incremental


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=populated())
def test_incremental_plans_equal_whole_node_plans(changes):
    check_sequence(changes)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=populated())
def test_incremental_plans_equal_whole_node_plans_across_set_capacities(changes):
    with mock.patch.object(semantics, "DEFAULT_MAX_ELEMENTS", 2):     # a set's capacity doubles at 2, 3, 5 members...
        check_sequence(changes)


def test_most_changes_are_planned_incrementally():
    changes = [("namespace", "x", {"tier": "a"}), ("namespace", "y", {}),
               ("policy", 0, ("x", {"podSelector": {"matchLabels": {"app": "a"}}, "policyTypes": ["Ingress"],
                                    "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": "b"}},
                                                           "namespaceSelector": {}}]}]}))]
    changes += [("pod", n, pod("x" if n % 2 else "y", "?", f"10.0.0.{n + 2}", {"app": "a", "tier": "b"}))
                for n in range(6)]
    changes += [("pod", 3, pod("x", "?", "10.0.0.5", {"app": "a", "tier": "a"})), ("namespace", "y", {"tier": "a"}),
                ("pod", 4, None)]
    assert check_sequence(changes) == len(changes)


def test_a_label_change_keeps_every_other_value_of_the_plan():
    view = ClusterView()
    for change in [("namespace", "x", {}), *(("pod", n, pod("x", "?", f"10.0.0.{n + 2}", {"app": "a", "tier": "a"}))
                                            for n in range(4)),
                   ("policy", 0, ("x", {"podSelector": {"matchLabels": {"app": "a"}}, "policyTypes": ["Ingress"],
                                        "ingress": [{"from": [{"podSelector": {"matchLabels": {"tier": "b"}}}]},
                                                    {"from": [{"podSelector": {"matchLabels": {"tier": "a"}}}]}]}))]:
        apply_change(view, change)
    before = plan_node(view, node_name=NODE)
    basis = Basis(snapshot(view), before)
    assert replan(basis, view, node_name=NODE) is before          # nothing changed: the same plan
    apply_change(view, ("pod", 1, pod("x", "?", "10.0.0.3", {"app": "a", "tier": "b"})))
    after = replan(basis, view, node_name=NODE)
    assert after is not None and after == plan_node(view, node_name=NODE)
    assert all(new is old for new, old in zip(after.pods, before.pods))   # no pod's own plan changed
    changed = [ref for ref in after.sets if after.sets[ref] is not before.sets.get(ref)]
    assert sorted(ref.key for ref in changed) == ["ns=x pods[tier=a]", "ns=x pods[tier=b]"]


def test_changed_keys_compares_by_identity_then_value():
    one, same, other = semantics.NamespaceInfo("x", ()), semantics.NamespaceInfo("x", ()), semantics.NamespaceInfo("y", ())
    assert changed_keys({"a": one, "b": one}, {"a": same, "c": other}) == ["c", "b"]
