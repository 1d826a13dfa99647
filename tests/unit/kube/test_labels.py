"""kube/labels.py: the API's label syntax, and why it matters here: with it, a selector's text
(which names a policy's sets) is one-to-one; without it, `{a: "b,c=d"}` and `{a: b, c: d}` were one."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from netagent.kube import labels
from netagent.policy.kube_objects import ObjectError, parse_selector


@pytest.mark.parametrize("key", ["app", "a", "example.com/app", "k8s.io/x_y.z-1", "A" * 63,
                                 "a" * 253 + "/n"])
def test_keys_the_api_accepts(key):
    assert labels.valid_key(key)


@pytest.mark.parametrize("key", ["", "/app", "a b", "x=y", "a,b", "-a", "a-", "A" * 64, "Example.com/app",
                                 "a" * 254 + "/n", "a/b/c", "app/", None, 7])
def test_keys_the_api_refuses(key):
    assert not labels.valid_key(key)


@pytest.mark.parametrize("value", ["", "web", "web-1", "a.b_c", "Z" * 63])
def test_values_the_api_accepts(value):
    assert labels.valid_value(value)


@pytest.mark.parametrize("value", ["b,c=d", "a b", "(x)", "-a", "a" * 64, "é", None])
def test_values_the_api_refuses(value):
    assert not labels.valid_value(value)


def test_the_colliding_selector_is_refused_so_two_selectors_never_share_a_name():
    with pytest.raises(ObjectError, match="not a label value"):
        parse_selector({"matchLabels": {"a": "b,c=d"}}, where="spec.podSelector")
    with pytest.raises(ObjectError, match="not a label value"):
        parse_selector({"matchExpressions": [{"key": "a", "operator": "In", "values": ["b) ,c In (d"]}]},
                       where="spec.podSelector")
    with pytest.raises(ObjectError, match="not a label key"):
        parse_selector({"matchExpressions": [{"key": "a=b", "operator": "Exists"}]}, where="spec.podSelector")


NAME = st.text(alphabet="ab=,", min_size=1, max_size=5)     # few letters: look-alikes are likely


@given(st.dictionaries(NAME, NAME, min_size=1, max_size=3))
def test_a_selector_read_is_the_only_one_its_name_reads_back_as(match_labels):
    """Whatever parses, read back from its text alone, is itself: no other selector has its name."""
    try:
        one = parse_selector({"matchLabels": match_labels}, where="s")
    except ObjectError:
        return
    parts = [part.split("=", 1) for part in one.describe().split(",")]
    assert all(len(part) == 2 for part in parts) and dict(parts) == match_labels
