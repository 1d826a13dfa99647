"""The typed nftables model (`kernel/nftables/model.py`, `tables.py`): the rendered batch, the
digest, a table read back through `FakeNft` equal to the one written (sets, interval sets,
concatenated keys, verdict maps, base and regular chains), the differ's sentences, and the
write-only-when-drifted contract of `ensure_table`."""
from __future__ import annotations

import pytest

from netagent.kernel.nftables import model, tables, text
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.nftables.model import BaseChain, Chain, Element, Map, Rule, Set, Table

ADDRS = Set("ADDRS", ("ipv4_addr",), (), (Element(("10.0.0.1",)), Element(("10.0.0.2",))))
NETS = Set("NETS", ("ipv4_addr",), ("interval",), (Element(("10.0.0.0/8",)), Element(("192.168.1.1/32",))))
PAIRS = Set("PAIRS", ("ipv4_addr", "inet_service"), (), (Element(("10.0.0.1", "80")),))
VMAP = Map("DISPATCH", ("ipv4_addr", "inet_service"), "verdict", (),
           (Element(("10.0.0.1", "80"), "goto SVC-A"), Element(("10.0.0.2", "443"), "drop")))


def sample() -> Table:
    base = BaseChain("filter", "input", -10, "filter - 10")
    return Table("ip", "netagent-test", (
        Chain("INPUT", (
            model.digested_rule(f"ip saddr {model.ref('NETS')} accept", "from the networks", sets=("NETS",)),
            model.digested_rule(f"ip saddr . tcp dport {model.ref('DISPATCH')}", "dispatch", sets=("DISPATCH",)),
            Rule("ip saddr @ADDRS drop", None, ("ADDRS",))), base),
        Chain("SVC-A", (model.digested_rule("accept", "service a"),))),
        (ADDRS, NETS, PAIRS, VMAP))


def test_render_is_one_replacing_transaction_each_name_declared_before_use():
    batch = model.render_table(sample())
    lines = batch.splitlines()
    assert lines[:3] == ["add table ip netagent-test", "delete table ip netagent-test", "add table ip netagent-test"]
    assert "add set ip netagent-test NETS { type ipv4_addr; flags interval; }" in lines
    assert "add element ip netagent-test PAIRS { 10.0.0.1 . 80 }" in lines
    assert "add map ip netagent-test DISPATCH { type ipv4_addr . inet_service : verdict; }" in lines
    assert "add element ip netagent-test DISPATCH { 10.0.0.1 . 80 : goto SVC-A, 10.0.0.2 . 443 : drop }" in lines
    assert ("add chain ip netagent-test INPUT { type filter hook input priority filter - 10; policy accept; }"
            in lines)
    assert "add chain ip netagent-test SVC-A" in lines
    assert "add rule ip netagent-test INPUT ip saddr @ADDRS drop" in lines     # no comment: none written
    # every name exists before it is used: regular chains, sets and maps, base chains and rules,
    # then the verdict map's elements (they name chains)
    assert lines.index("add chain ip netagent-test SVC-A") == 3
    assert max(i for i, line in enumerate(lines) if line.startswith(("add set", "add map"))) < \
        min(i for i, line in enumerate(lines) if line.startswith("add chain ip netagent-test INPUT"))
    assert lines[-1].startswith("add element ip netagent-test DISPATCH")
    FakeNft().apply(batch)


def test_the_digest_is_the_hash_of_the_statements_and_the_comment_is_safe():
    rule = model.digested_rule("ip saddr 10.0.0.1 drop", "a purpose")
    assert rule.comment == f"netagent: a purpose [{model.digest('ip saddr 10.0.0.1 drop')}]"
    assert model.digest("ip saddr 10.0.0.1 drop") != model.digest("ip saddr 10.0.0.2 drop")
    hostile = model.digest_comment('x" ; add table ip evil', "accept")
    assert '"' not in hostile and text.comment(hostile).count('"') == 2


def test_a_table_reads_back_through_the_fake_as_written():
    nft = FakeNft()
    wanted = sample()
    assert tables.ensure_table(nft, wanted) == ["table ip netagent-test missing"]
    held = tables.read_table("ip", "netagent-test", nft.list_table("ip", "netagent-test"))
    assert held is not None
    assert tables.drift(wanted, held) == []
    dispatch = held.set("DISPATCH")
    assert isinstance(dispatch, Map) and dispatch.value_type == "verdict"
    assert {e.key: e.value for e in dispatch.elements} == {("10.0.0.1", "80"): "goto SVC-A",
                                                          ("10.0.0.2", "443"): "drop"}
    assert held.set("PAIRS").elements == (Element(("10.0.0.1", "80")),)    # key parts, not a joined string
    assert tables.ensure_table(nft, wanted) == [] and len(nft.batches) == 1


@pytest.mark.parametrize("damage, problem", [
    ("flush chain ip netagent-test INPUT", "chain INPUT: 0 rule(s) differ from the 3 wanted"),
    ("add rule ip netagent-test SVC-A drop", "chain SVC-A: 2 rule(s) differ from the 1 wanted"),
    ("delete element ip netagent-test NETS { 10.0.0.0/8 }", "set NETS holds other networks than"),
    ("add element ip netagent-test ADDRS { 10.0.0.3 }", "set ADDRS holds other addresses than"),
    ("delete element ip netagent-test DISPATCH { 10.0.0.2 . 443 }", "map DISPATCH holds other elements than"),
    ("add chain ip netagent-test INPUT { type filter hook input priority -10; policy drop; }", "chain INPUT is not"),
    ("add chain ip netagent-test EXTRA", "chains not ours to keep: ['EXTRA']"),
    ("add set ip netagent-test MORE { type ipv4_addr; }", "sets or maps not ours to keep: ['MORE']"),
    ("delete table ip netagent-test", "table ip netagent-test missing"),
])
def test_drift_is_one_sentence_per_difference_and_ensure_repairs_it(damage, problem):
    nft = FakeNft()
    wanted = sample()
    tables.ensure_table(nft, wanted)
    nft.apply(damage)
    found = tables.table_drift(nft, wanted)
    assert any(line.startswith(problem) for line in found), found
    assert tables.ensure_table(nft, wanted) == found
    assert tables.table_drift(nft, wanted) == [] and len(nft.batches) == 3


def test_a_changed_rule_text_is_drift_through_its_digest():
    nft = FakeNft()
    tables.ensure_table(nft, sample())
    changed = Table("ip", "netagent-test", (
        Chain("INPUT", (
            model.digested_rule(f"ip saddr {model.ref('NETS')} drop", "from the networks", sets=("NETS",)),
            *sample().chains[0].rules[1:]), sample().chains[0].base), sample().chains[1]), sample().sets)
    assert tables.table_drift(nft, changed) == ["chain INPUT: 3 rule(s) differ from the 3 wanted"]


def test_elements_compare_in_one_spelling():
    assert tables.canonical_part('"na0"') == "na0"
    assert tables.canonical_part("192.168.1.1/32") == "192.168.1.1"
    assert tables.canonical_part("fd00::1/128") == "fd00::1"
    assert tables.canonical_part("10.0.0.0/8") == "10.0.0.0/8"
    listed = Table("ip", "t", (), (Set("S", ("ipv4_addr",), ("interval",), (Element(("192.168.1.1",)),)),))
    wanted = Table("ip", "t", (), (Set("S", ("ipv4_addr",), ("interval",), (Element(("192.168.1.1/32",)),)),))
    assert tables.drift(wanted, listed) == []


@pytest.mark.parametrize("bad", [
    Table("ip", "netagent-t", (Chain("C", (Rule("ip saddr @GONE drop", None, ("GONE",)),)),)),
    Table("ip", "netagent-t", (Chain("C"), Chain("C"))),
    Table("ip", "netagent-t", (), (Set("S", ("ipv4_addr", "inet_service"), (), (Element(("10.0.0.1",)),)),)),
    Table("ip", "netagent-t", (), (Map("M", ("ipv4_addr",), "verdict", (), (Element(("10.0.0.1",)),)),)),
    Table("ip", "bad name", ()),
])
def test_a_table_the_kernel_would_refuse_is_refused_before_any_text(bad):
    with pytest.raises(text.UnsafeNftText):
        model.render_table(bad)


def test_remove_table_is_quiet_when_gone():
    nft = FakeNft()
    tables.ensure_table(nft, sample())
    assert tables.remove_table(nft, "ip", "netagent-test") is True
    assert tables.remove_table(nft, "ip", "netagent-test") is False
    assert nft.tables() == [] and len(nft.batches) == 2
