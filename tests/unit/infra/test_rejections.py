"""The process's record of refused objects: one record per object and component, counted by
kind and reason, logged and notified once per change, cleared on accept."""
from __future__ import annotations

import pytest

from netagent.infra.metrics import Registry
from netagent.infra.rejections import ObjectRef, Rejections, printable


def test_reject_counts_notifies_once_and_accept_clears() -> None:
    registry = Registry()
    told = []
    rejections = Rejections(registry, notify=told.append)
    proxy, routes = rejections.scope("proxy"), rejections.scope("noderoutes")
    ref = ObjectRef.of("Service", {"metadata": {"namespace": "ns", "name": "web", "uid": "u1"}})
    proxy.reject(ref, reason="too-large", detail="100000 ports")
    proxy.reject(ref, reason="too-large", detail="100000 ports")  # unchanged: not told again
    routes.reject(ObjectRef.of("Node", {"metadata": {"name": "n1"}}), reason="conflict", detail="x")
    assert [r.ref.key for r in told] == ["ns/web", "n1"]
    assert told[0].ref.uid == "u1"
    text = registry.render()
    assert 'netagent_rejected_objects{kind="Service",reason="too-large"} 1' in text
    assert 'netagent_rejected_objects{kind="Node",reason="conflict"} 1' in text
    routes.accept(kind="Service", key="ns/web")  # another component's accept clears nothing
    assert len(proxy.snapshot()) == 1
    proxy.accept(kind="Service", key="ns/web")
    assert proxy.snapshot() == [] and len(rejections.snapshot()) == 1
    assert 'kind="Service"' not in registry.render()


def test_malformed_objects_still_get_a_reference_and_details_are_one_safe_line() -> None:
    ref = ObjectRef.of("Service", {"metadata": {"name": ["not", "a", "string"]}}, key="ns/odd")
    assert (ref.namespace, ref.name, ref.key) == ("ns", "odd", "ns/odd")
    assert ObjectRef.of("Node", None, key="n").key == "n"
    line = printable("a\nb\x00c\u2028d" + "x" * 2000)
    assert "\n" not in line and "\x00" not in line and len(line) == 512
    scope = Rejections().scope("c")
    scope.reject(ref, reason="malformed", detail="line1\nline2")
    assert scope.health_details() == ["c: Service ns/odd rejected (malformed): line1?line2"]


def test_a_reason_is_a_bounded_label() -> None:
    scope = Rejections().scope("c")
    with pytest.raises(ValueError):
        scope.reject(ObjectRef("Node", "", "n"), reason="Has Spaces and\nnewlines", detail="")
