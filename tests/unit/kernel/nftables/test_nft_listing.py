"""`listing.element_text`: libnftables JSON element parts back to the text our renderers write.

The policy readback and the proxy readback both compare in this spelling, so each JSON shape
nft 1.0.6 lists (a wrapped element, a prefix, a range, a concatenation, a verdict) is pinned here.
"""
from __future__ import annotations

from netagent.kernel.nftables.listing import element_text


def test_plain_values_are_their_text():
    assert element_text("10.96.0.10") == "10.96.0.10"
    assert element_text(80) == "80"


def test_prefix_range_and_concatenation():
    assert element_text({"prefix": {"addr": "192.168.0.0", "len": 16}}) == "192.168.0.0/16"
    assert element_text({"range": ["10.0.0.1", "10.0.0.9"]}) == "10.0.0.1-10.0.0.9"
    assert element_text({"range": [8000, 8080]}) == "8000-8080"
    assert element_text({"concat": ["10.96.0.10", "tcp", 80, 0]}) == "10.96.0.10 . tcp . 80 . 0"
    assert element_text({"concat": [{"prefix": {"addr": "10.1.0.0", "len": 24}}, {"range": [1, 9]}]}) \
        == "10.1.0.0/24 . 1-9"


def test_a_wrapped_element_is_its_key():
    wrapped = {"elem": {"val": {"concat": ["10.244.1.5", 8080]}, "comment": "default/web"}}
    assert element_text(wrapped) == "10.244.1.5 . 8080"


def test_verdicts():
    assert element_text({"goto": {"target": "IP-C-3"}}) == "goto IP-C-3"
    assert element_text({"jump": {"target": "POL-IN-1"}}) == "jump POL-IN-1"
    assert element_text({"drop": None}) == "drop"
    assert element_text({"accept": None}) == "accept"
