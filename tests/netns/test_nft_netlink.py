"""`netlink.py`'s element batches on the real kernel: the same elements written as nft text
into one table and as netlink messages into another list back the same (keys, values,
comments; IPv4 and IPv6; verdicts; numgen slots), deletions through netlink leave the same
table, a batch of many messages is one transaction, and a refused batch changes nothing."""
from __future__ import annotations

import pytest

from netagent.kernel.nftables import netlink
from netagent.kernel.nftables.model import Chain, Element, ElementWrite, Map, Set, Table, render_table
from netagent.kernel.nftables.runner import NftError, NftRunner
from netagent.kernel.nftables.tables import read_table

NUMGEN4 = "ip daddr . th dport . numgen random mod 1 : ip daddr . tcp dport"
NUMGEN6 = "ip6 daddr . th dport . numgen random mod 1 : ip6 daddr . udp dport"


def skeleton(family: str, name: str) -> Table:
    v4 = family == "ip"
    addr = "ipv4_addr" if v4 else "ipv6_addr"
    return Table(family, name, (Chain("TARGET-A"), Chain("TARGET-B")), (
        Map("VERDICTS", (addr, "inet_proto", "inet_service"), "verdict"),
        Map("PORTS", ("inet_proto", "inet_service"), "verdict"),
        Map("SLOTS", (addr, "inet_service", "integer"), f"{addr} . inet_service", typeof=NUMGEN4 if v4 else NUMGEN6),
        Set("NAMES", (addr, "inet_proto", "inet_service")),
        Set("PAIRS", (addr, addr)),
        Set("SERVICES", ("inet_service",)),
    ))


def elements(family: str, count: int = 40) -> dict[str, tuple[Element, ...]]:
    def address(i: int) -> str:
        return f"10.{i // 65536}.{(i // 256) % 256}.{i % 256}" if family == "ip" else f"fd00::{i + 1:x}"
    verdicts = ("goto TARGET-A", "jump TARGET-B", "drop", "accept", "return")
    return {
        "VERDICTS": tuple(Element((address(i), ("tcp", "udp", "sctp")[i % 3], str(80 + i)), verdicts[i % 5])
                          for i in range(count)),
        "PORTS": tuple(Element(("tcp", str(30000 + i)), "goto TARGET-A") for i in range(count)),
        "SLOTS": tuple(Element((address(i // 10), "80", str(i % 10)), f"{address(50000 + i)} . 8080")
                       for i in range(count)),
        "NAMES": tuple(Element((address(i), "tcp", "80"), None, f"ns/svc-{i}:http ClusterIP \u00e9")
                       for i in range(count)),
        "PAIRS": tuple(Element((address(i), address(i))) for i in range(count)),
        "SERVICES": tuple(Element((str(i + 1),)) for i in range(count)),
    }


def listed(nft: NftRunner, family: str, name: str) -> dict[str, set[Element]]:
    table = read_table(family, name, nft.list_table(family, name))
    assert table is not None
    return {entry.name: set(entry.elements) for entry in table.sets}


@pytest.fixture
def nft(netns):
    runner = NftRunner(netns)
    yield runner
    runner.close()


@pytest.mark.parametrize("family", ["ip", "ip6"])
def test_netlink_elements_list_back_as_the_text_written_ones(nft, family):
    text_table, native_table = skeleton(family, "netagent-text"), skeleton(family, "netagent-native")
    wanted = elements(family)
    for table in (text_table, native_table):
        nft.apply(render_table(table))
    declared = {entry.name: entry for entry in native_table.sets}
    nft.apply(ElementWrite(family, "netagent-text", declared, {}, wanted).text())
    nft.apply_elements(ElementWrite(family, "netagent-native", declared, {}, wanted))
    as_text, as_netlink = listed(nft, family, "netagent-text"), listed(nft, family, "netagent-native")
    assert as_netlink == as_text
    assert all(len(as_netlink[holder]) == len(items) for holder, items in wanted.items())
    assert any(e.comment == "ns/svc-3:http ClusterIP \u00e9" for e in as_netlink["NAMES"])

    gone = {holder: tuple(e.key for e in items[::2]) for holder, items in wanted.items()}
    nft.apply(ElementWrite(family, "netagent-text", declared, gone, {}).text())
    nft.apply_elements(ElementWrite(family, "netagent-native", declared, gone, {}))
    assert listed(nft, family, "netagent-native") == listed(nft, family, "netagent-text")
    assert len(listed(nft, family, "netagent-native")["SLOTS"]) == len(wanted["SLOTS"]) // 2


def test_a_batch_of_many_messages_is_one_transaction(nft):
    table = skeleton("ip", "netagent-native")
    nft.apply(render_table(table))
    declared = {entry.name: entry for entry in table.sets}
    many = elements("ip", 12000)
    write = ElementWrite("ip", "netagent-native", declared, {}, many)
    assert len(netlink.encode(write)[1]) > 6          # several messages of each holder
    nft.apply_elements(write)
    assert {holder: len(found) for holder, found in listed(nft, "ip", "netagent-native").items()} == \
        {holder: len(items) for holder, items in many.items()}
    # the same batch with one verdict naming a missing chain: refused, and NOTHING of it written
    nft.apply_elements(ElementWrite("ip", "netagent-native", declared,
                                    {holder: tuple(e.key for e in items) for holder, items in many.items()}, {}))
    broken = dict(many, PORTS=(*many["PORTS"], Element(("udp", "9"), "goto MISSING")))
    with pytest.raises(NftError, match="No such file or directory"):
        nft.apply_elements(ElementWrite("ip", "netagent-native", declared, {}, broken))
    assert all(not found for found in listed(nft, "ip", "netagent-native").values())


def test_a_duplicate_key_with_another_value_is_refused_as_the_text_is(nft):
    table = skeleton("ip", "netagent-native")
    nft.apply(render_table(table))
    declared = {entry.name: entry for entry in table.sets}
    nft.apply_elements(ElementWrite("ip", "netagent-native", declared, {},
                                    {"PORTS": (Element(("tcp", "80"), "goto TARGET-A"),)}))
    with pytest.raises(NftError):
        nft.apply(ElementWrite("ip", "netagent-native", declared, {},
                               {"PORTS": (Element(("tcp", "80"), "goto TARGET-B"),)}).text())
    with pytest.raises(NftError, match="File exists|Device or resource busy"):
        nft.apply_elements(ElementWrite("ip", "netagent-native", declared, {},
                                        {"PORTS": (Element(("tcp", "80"), "goto TARGET-B"),)}))
    assert listed(nft, "ip", "netagent-native")["PORTS"] == {Element(("tcp", "80"), "goto TARGET-A")}


def test_what_netlink_does_not_encode_goes_as_text(nft):
    table = Table("ip", "netagent-native", (), (Set("RANGES", ("ipv4_addr",), ("interval",)),))
    nft.apply(render_table(table))
    nft.apply_elements(ElementWrite("ip", "netagent-native", {"RANGES": table.sets[0]}, {},
                                    {"RANGES": (Element(("10.0.0.0/8",)),)}))
    assert listed(nft, "ip", "netagent-native")["RANGES"] == {Element(("10.0.0.0/8",))}
