"""`FakeNft` against the behaviours of nf_tables it models (each measured on nft 1.0.6 in a
namespace; tests/netns/test_nft_parity.py runs GOOD_BATCHES and BAD_BATCHES below on the real
kernel and on the fake and compares): atomic batches, refusals, and the listing's JSON shape.
"""
from __future__ import annotations

import pytest

from netagent.kernel.nftables import listing
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.nftables.runner import NftError

T = "ip netagent-test"
SETUP = f"""add table {T}
add chain {T} POST {{ type nat hook postrouting priority srcnat; policy accept; }}
add chain {T} FWD {{ type filter hook forward priority filter - 10; policy accept; }}
add chain {T} SVC-A
add chain {T} SVC-B
add set {T} NETS {{ type ipv4_addr; flags interval; }}
add set {T} IFS {{ typeof iifname; }}
add set {T} AFF {{ type ipv4_addr; size 4; flags timeout; timeout 3h; }}
add map {T} SERVICES {{ type ipv4_addr . inet_proto . inet_service : verdict; }}
add map {T} EPS {{ typeof numgen random mod 4 : ip daddr . th dport; }}
add element {T} NETS {{ 10.0.0.0/8, 192.168.1.1, 172.16.0.1-172.16.0.9 }}
add element {T} IFS {{ "na0", "eth1" }}
add element {T} AFF {{ 1.2.3.4, 1.2.3.5 timeout 10s }}
add element {T} SERVICES {{ 10.96.0.1 . tcp . 443 : goto SVC-A, 10.96.0.10 . udp . 53 : jump SVC-B, 10.96.0.11 . sctp . 9 : drop }}
add element {T} EPS {{ 0 : 10.1.0.1 . 8080, 3 : 10.1.0.2 . 8080 }}
add rule {T} POST ip saddr @NETS ip daddr != @NETS masquerade fully-random comment "pods out"
add rule {T} FWD iifname @IFS accept
add rule {T} SVC-A meta l4proto tcp counter comment "svc a \u00e9"
add rule {T} SVC-B jump SVC-A
"""
# Each applies on top of SETUP and succeeds on the real kernel.
GOOD_BATCHES = {
    "delete then re-add an element": f"delete element {T} SERVICES {{ 10.96.0.1 . tcp . 443 }}\n"
                                     f"add element {T} SERVICES {{ 10.96.0.1 . tcp . 443 : jump SVC-B }}",
    "re-add the same element": f"add element {T} SERVICES {{ 10.96.0.11 . sctp . 9 : drop }}",
    "flush and refill a map": f"flush map {T} EPS\nadd element {T} EPS {{ 1 : 10.1.0.3 . 80 }}",
    "flush a chain, delete it once unreferenced": f"flush chain {T} SVC-B\n"
                                                  f"delete element {T} SERVICES {{ 10.96.0.10 . udp . 53 }}\n"
                                                  f"delete chain {T} SVC-B",
    "policy change of a base chain": f"add chain {T} FWD {{ type filter hook forward priority -10; policy drop; }}",
    "flush table keeps chains and sets": f"flush table {T}",
    "add existing table, chain and set": f"add table {T}\nadd chain {T} SVC-A\n"
                                         f"add set {T} NETS {{ type ipv4_addr; flags interval; }}",
    "a new set used in the same batch": f"add set {T} NEW {{ type inet_service; }}\n"
                                        f"add element {T} NEW {{ 80, 443 }}\nadd rule {T} SVC-A tcp dport @NEW accept",
    "delete the table": f"delete table {T}",
    "delete a chain with its rules": f"delete element {T} SERVICES {{ 10.96.0.10 . udp . 53, 10.96.0.1 . tcp . 443 }}\n"
                                     f"delete chain {T} SVC-B\ndelete chain {T} SVC-A",
}
# Each is refused by the real kernel; the state afterwards equals SETUP's.
BAD_BATCHES = {
    "missing table": "add chain ip netagent-nope C",
    "missing chain for a rule": f"add rule {T} NOPE accept",
    "jump to a missing chain": f"add rule {T} SVC-A jump NOPE",
    "verdict to a missing chain": f"add element {T} SERVICES {{ 10.96.0.2 . tcp . 80 : goto NOPE }}",
    "jump to a base chain": f"add rule {T} SVC-A jump FWD",
    "missing set": f"add rule {T} SVC-A ip saddr @NOPE accept",
    "create an existing chain": f"create chain {T} SVC-A",
    "create an existing table": f"create table {T}",
    "create an existing element": f"create element {T} IFS {{ \"na0\" }}",
    "another value for a key": f"add element {T} SERVICES {{ 10.96.0.11 . sctp . 9 : accept }}",
    "delete a missing element": f"delete element {T} IFS {{ \"nope\" }}",
    "delete a referenced chain": f"flush chain {T} SVC-A\ndelete chain {T} SVC-A",
    "delete a referenced set": f"delete set {T} NETS",
    "another hook for a base chain": f"add chain {T} FWD {{ type filter hook input priority -10; policy accept; }}",
    "other flags for an existing set": f"add set {T} IFS {{ typeof iifname; flags interval; }}",
    "a prefix without interval": f"add element {T} SERVICES {{ 10.96.0.0/16 . tcp . 80 : drop }}",
    "an overlapping interval": f"add element {T} NETS {{ 10.1.0.0/16 }}",
    "over the size": f"add element {T} AFF {{ 1.1.1.1, 1.1.1.2, 1.1.1.3 }}",
    "comment over 128 bytes": f"add rule {T} SVC-A counter comment \"{'a' * 129}\"",
    "a wrong key type": f"add element {T} SERVICES {{ 10.96.0.1 . tcp : drop }}",
    "good lines then a bad one": f"add element {T} IFS {{ \"na1\" }}\nadd chain {T} SVC-C\n"
                                 f"add rule {T} SVC-C jump NOPE",
    "delete a missing table": "delete table ip netagent-nope",
}


def fake() -> FakeNft:
    nft = FakeNft()
    nft.apply(SETUP)
    return nft


@pytest.mark.parametrize("name", sorted(BAD_BATCHES))
def test_a_refused_batch_changes_nothing(name: str) -> None:
    nft = fake()
    before = nft.list_table("ip", "netagent-test")
    with pytest.raises(NftError):
        nft.apply(BAD_BATCHES[name])
    assert nft.list_table("ip", "netagent-test") == before
    assert nft.tables() == [("ip", "netagent-test")]


@pytest.mark.parametrize("name", sorted(GOOD_BATCHES))
def test_good_batches_apply(name: str) -> None:
    fake().apply(GOOD_BATCHES[name])


def test_listing_has_libnftables_json_shape() -> None:
    objects = fake().list_table("ip", "netagent-test") or []
    assert objects[0] == {"table": {"family": "ip", "name": "netagent-test", "handle": 1}}
    chains = listing.chains(objects)
    assert chains["POST"] | {"handle": 0} == {"family": "ip", "table": "netagent-test", "name": "POST",
                                              "handle": 0, "type": "nat", "hook": "postrouting",
                                              "prio": 100, "policy": "accept"}
    assert chains["FWD"]["prio"] == -10 and "hook" not in chains["SVC-A"]
    sets = listing.sets(objects)
    assert sets["SERVICES"]["type"] == ["ipv4_addr", "inet_proto", "inet_service"]
    assert sets["SERVICES"]["map"] == "verdict"
    assert sets["EPS"]["type"] == "integer" and sets["EPS"]["map"] == "ipv4_addr . inet_service"
    assert sets["AFF"]["flags"] == ["timeout"] and sets["AFF"]["timeout"] == 10800 and sets["AFF"]["size"] == 4
    services = {listing.key_text(k): v for k, v in listing.elements(sets["SERVICES"])}
    assert services == {
        listing.key_text({"concat": ["10.96.0.1", "tcp", 443]}): {"goto": {"target": "SVC-A"}},
        listing.key_text({"concat": ["10.96.0.10", "udp", 53]}): {"jump": {"target": "SVC-B"}},
        listing.key_text({"concat": ["10.96.0.11", "sctp", 9]}): {"drop": None}}
    nets = sorted(listing.key_text(k) for k, _ in listing.elements(sets["NETS"]))
    assert nets == sorted(listing.key_text(k) for k in (
        {"prefix": {"addr": "10.0.0.0", "len": 8}}, "192.168.1.1", {"range": ["172.16.0.1", "172.16.0.9"]}))
    assert sorted(k for k, _ in listing.elements(sets["AFF"])) == ["1.2.3.4", "1.2.3.5"]
    assert sorted(k for k, _ in listing.elements(sets["IFS"])) == ["eth1", "na0"]
    assert [r.get("comment") for r in listing.rules(objects, "POST")] == ["pods out"]
    assert [r.get("comment") for r in listing.rules(objects, "SVC-A")] == ["svc a \u00e9"]


def test_flush_table_empties_chains_and_keeps_sets() -> None:
    nft = fake()
    nft.apply(GOOD_BATCHES["flush table keeps chains and sets"])
    objects = nft.list_table("ip", "netagent-test") or []
    assert not [entry for entry in objects if "rule" in entry]
    assert len(listing.elements(listing.sets(objects)["SERVICES"])) == 3


def test_missing_table_lists_as_none_and_delete_table_removes_all() -> None:
    nft = fake()
    assert nft.list_table("ip", "netagent-nope") is None
    nft.apply(GOOD_BATCHES["delete the table"])
    assert nft.list_table("ip", "netagent-test") is None and nft.tables() == []


def test_text_outside_the_subset_is_refused() -> None:
    nft = fake()
    for batch in (f"add rule {T} SVC-A counter comment \"open", "table ip x {\n chain c {\n }\n}",
                  f"add map {T} X {{ type integer : verdict; }}", f"replace rule {T} SVC-A handle 1 accept"):
        with pytest.raises(NftError):
            nft.apply(batch)


def test_injected_failure_and_batch_record() -> None:
    nft = fake()
    nft.fail_next = NftError("injected")
    with pytest.raises(NftError, match="injected"):
        nft.apply(f"add chain {T} X-Y")
    nft.apply(f"add chain {T} X-Y")
    assert len(nft.batches) == 2
