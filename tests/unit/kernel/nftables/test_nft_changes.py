"""The one differ (`kernel/nftables/changes.py`): from a table read back (or applied last) to
the wanted one, on `FakeNft`: a missing table is written whole; an unchanged one costs no
write; a changed element, rule, set type or base chain is written in the fewest commands, in
an order the transaction accepts; what was held and is no longer wanted is deleted; an object
read back that our gates cannot write again makes the table rebuilt. Each walk ends with the
kernel (the fake) holding exactly the wanted table, checked by reading it back."""
from __future__ import annotations

from dataclasses import replace

import pytest

from netagent.kernel.nftables import model, tables
from netagent.kernel.nftables.changes import Changes, table_changes
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.nftables.runner import Nft
from netagent.kernel.nftables.model import BaseChain, Chain, Element, Map, Set, Table

FAMILY, NAME = "ip", "netagent-test"


def table(*, addresses=("10.0.0.1", "10.0.0.2"), verdicts=(("10.0.0.1", "80", "goto SVC-A"),),
          chains=("SVC-A",), key_type=("ipv4_addr",), priority=-10, comment="pod a") -> Table:
    base = BaseChain("filter", "forward", priority)
    match = "ip saddr" if key_type == ("ipv4_addr",) else "ip saddr . tcp dport"
    rules = (model.digested_rule(f"{match} {model.ref('ADDRS')} drop", "addresses", sets=("ADDRS",)),
             model.digested_rule(f"ip daddr . tcp dport vmap {model.ref('DISPATCH')}", "dispatch",
                                 sets=("DISPATCH",)))
    regular = tuple(Chain(name, (model.digested_rule("counter accept", name),)) for name in chains)
    elements = tuple(Element((a,), None, comment if i == 0 else None) for i, a in enumerate(addresses))
    return Table(FAMILY, NAME, (Chain("FORWARD", rules, base), *regular), (
        Set("ADDRS", key_type, (), elements if key_type == ("ipv4_addr",) else ()),
        Map("DISPATCH", ("ipv4_addr", "inet_service"), "verdict", (),
            tuple(Element((a, p), v) for a, p, v in verdicts))))


def held(nft: Nft) -> Table | None:
    return tables.read_table(FAMILY, NAME, nft.list_table(FAMILY, NAME))


def converge(nft: Nft, wanted: Table) -> Changes:
    """Write the difference; the table then reads back with no difference left."""
    changes = table_changes(wanted, held(nft))
    changes.apply(nft)   # on the real runner: elements through netlink.py (tests/netns/test_nft_changes.py)
    assert not table_changes(wanted, held(nft)), "the table holds what was wanted"
    assert not tables.drift(wanted, held(nft))
    return changes


@pytest.fixture
def nft() -> FakeNft:
    made = FakeNft()
    converge(made, table())
    return made


def test_a_missing_table_is_written_whole_and_an_unchanged_one_costs_nothing():
    nft = FakeNft()
    changes = table_changes(table(), held(nft))
    assert changes.rebuild == table()
    nft.apply(changes.text())
    again = table_changes(table(), held(nft))
    assert not again and again.text() == "" and again.writes == 0


def test_an_element_change_writes_only_that_element(nft):
    changes = converge(nft, table(addresses=("10.0.0.1", "10.0.0.3")))
    assert changes.text().splitlines() == [
        "delete element ip netagent-test ADDRS { 10.0.0.2 }",
        "add element ip netagent-test ADDRS { 10.0.0.3 }"]


def test_an_element_comment_or_map_value_change_replaces_the_element(nft):
    changes = converge(nft, table(comment="pod b"))
    assert changes.text().splitlines() == [
        "delete element ip netagent-test ADDRS { 10.0.0.1 }",
        'add element ip netagent-test ADDRS { 10.0.0.1 comment "pod b" }']
    changes = converge(nft, table(comment="pod b", verdicts=(("10.0.0.1", "80", "drop"),)))
    assert changes.writes == 2


def test_a_new_chain_and_the_element_naming_it_come_in_an_order_the_batch_accepts(nft):
    wanted = table(chains=("SVC-A", "SVC-B"), verdicts=(("10.0.0.1", "80", "goto SVC-A"),
                                                        ("10.0.0.2", "443", "goto SVC-B")))
    lines = converge(nft, wanted).text().splitlines()
    assert lines.index("add chain ip netagent-test SVC-B") < lines.index(
        "add element ip netagent-test DISPATCH { 10.0.0.2 . 443 : goto SVC-B }")


def test_a_chain_no_longer_wanted_is_flushed_and_deleted_after_its_elements(nft):
    converge(nft, table(chains=("SVC-A", "SVC-B"), verdicts=(("10.0.0.2", "443", "goto SVC-B"),)))
    lines = converge(nft, table(chains=("SVC-B",), verdicts=(("10.0.0.2", "443", "goto SVC-B"),))).text().splitlines()
    assert lines == ["flush chain ip netagent-test SVC-A", "delete chain ip netagent-test SVC-A"]


def test_a_changed_rule_rewrites_its_chain_only(nft):
    wanted = table()
    forward = wanted.chains[0]
    rules = (*forward.rules, model.digested_rule("counter drop", "the end"))
    wanted = replace(wanted, chains=(replace(forward, rules=rules), *wanted.chains[1:]))
    lines = converge(nft, wanted).text().splitlines()
    assert lines[0] == "flush chain ip netagent-test FORWARD"
    assert all(line.startswith("add rule ip netagent-test FORWARD") for line in lines[1:]) and len(lines) == 4


def test_a_set_of_another_type_is_recreated_and_the_chains_using_it_rewritten(nft):
    # a set read back with another key type: deleted, added again, FORWARD (which uses it)
    # flushed first (the kernel refuses deleting a set a rule still uses) and rewritten
    lines = converge(nft, table(key_type=("ipv4_addr", "inet_service"))).text().splitlines()
    assert "delete set ip netagent-test ADDRS" in lines
    assert "add set ip netagent-test ADDRS { type ipv4_addr . inet_service; }" in lines
    assert lines[0] == "flush chain ip netagent-test FORWARD"
    assert lines.index("delete set ip netagent-test ADDRS") < lines.index(
        "add set ip netagent-test ADDRS { type ipv4_addr . inet_service; }")


def test_a_base_chain_with_another_priority_rebuilds_the_table(nft):
    changes = converge(nft, table(priority=-5))
    assert changes.rebuild is not None
    assert changes.text().startswith(f"add table ip {NAME}\ndelete table ip {NAME}\n")


def test_objects_not_ours_are_deleted_and_unwritable_ones_rebuild(nft):
    nft.apply("add set ip netagent-test EXTRA { type ipv4_addr; }\n"
              "add map ip netagent-test EXTRA-MAP { type ipv4_addr : verdict; }\n"
              "add chain ip netagent-test EXTRA-CHAIN\n")
    lines = converge(nft, table()).text().splitlines()
    assert sorted(lines) == ["delete chain ip netagent-test EXTRA-CHAIN", "delete map ip netagent-test EXTRA-MAP",
                             "delete set ip netagent-test EXTRA", "flush chain ip netagent-test EXTRA-CHAIN"]
    nft.apply("add chain ip netagent-test lowercase\n")   # a name `text.name` refuses to write
    assert converge(nft, table()).rebuild is not None


def test_the_table_applied_last_is_compared_without_reading_the_kernel():
    first, second = table(), table(addresses=("10.0.0.9",))
    changes = table_changes(second, first, read_back=False)
    assert changes.delete_elements == {"ADDRS": {("10.0.0.1",), ("10.0.0.2",)}}
    assert set(changes.add_elements["ADDRS"]) == {("10.0.0.9",)}


def test_many_elements_are_written_in_bounded_commands():
    addresses = tuple(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}" for i in range(12001))
    nft = FakeNft()
    converge(nft, table(addresses=("10.0.0.1",)))
    changes = converge(nft, table(addresses=addresses))
    adds = [line for line in changes.text().splitlines() if line.startswith("add element ip netagent-test ADDRS")]
    assert len(adds) == 3
