"""`FakeNft` and `NftRunner` (libnftables on the real kernel, in a throwaway namespace) fed
the same batches: what each consumer-relevant part of `list_table` returns is equal (chains
with their hook, type, priority and policy; sets and maps with types, flags, size, timeout
and elements compared as sets; rule comments per chain), and each bad batch is refused by
both with nothing changed. The real nft parser also gets `text.py`'s renderings of
adversarial strings: it accepts them and holds exactly the safe comment. And the runner acts
only in its namespace: a missing namespace raises, and a table made through it is not in the
root namespace."""
from __future__ import annotations

from typing import Any

import pytest

from netagent.kernel import namespaces, owned
from netagent.kernel.nftables import listing, text
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.nftables.runner import Nft, NftError, NftRunner, nftables_usable
from tests.unit.kernel.nftables.test_nft_fake import BAD_BATCHES, GOOD_BATCHES, SETUP
from tests.unit.kernel.nftables.test_nft_text import ATTACKS

TABLE = ("ip", "netagent-test")


@pytest.fixture
def runner(netns):
    made = NftRunner(netns)
    yield made
    made.close()


def relevant(objects: list[dict[str, Any]] | None) -> Any:
    """What consumers rely on: no handles, no counters, no rule statements, no order."""
    if objects is None:
        return None
    chains = {name: {k: v for k, v in body.items() if k != "handle"}
              for name, body in listing.chains(objects).items()}
    sets = {}
    for name, body in listing.sets(objects).items():
        shape = {k: v for k, v in body.items() if k not in ("handle", "elem")}
        shape["elements"] = sorted((listing.key_text(k), listing.key_text(v)) for k, v in listing.elements(body))
        sets[name] = shape
    comments = {name: [rule.get("comment") for rule in listing.rules(objects, name)] for name in chains}
    return {"chains": chains, "sets": sets, "comments": comments}


def both(runner: Nft, batch: str) -> tuple[Any, Any]:
    fake = FakeNft()
    for nft in (fake, runner):
        nft.apply(batch)
    return relevant(fake.list_table(*TABLE)), relevant(runner.list_table(*TABLE))


def test_setup_lists_the_same(runner):
    on_fake, on_kernel = both(runner, SETUP)
    assert on_fake == on_kernel
    assert on_kernel["sets"]["SERVICES"]["elements"]   # the comparison compared something


@pytest.mark.parametrize("name", sorted(GOOD_BATCHES))
def test_good_batches_list_the_same(runner, name):
    fake = FakeNft()
    for nft in (fake, runner):
        nft.apply(SETUP)
        nft.apply(GOOD_BATCHES[name])
    assert relevant(fake.list_table(*TABLE)) == relevant(runner.list_table(*TABLE))
    assert sorted(fake.tables()) == sorted(runner.tables())


@pytest.mark.parametrize("name", sorted(BAD_BATCHES))
def test_bad_batches_are_refused_by_both_and_change_nothing(runner, name):
    fake = FakeNft()
    for nft in (fake, runner):
        nft.apply(SETUP)
    before = relevant(runner.list_table(*TABLE))
    for nft in (fake, runner):
        with pytest.raises(NftError):
            nft.apply(BAD_BATCHES[name])
        assert relevant(nft.list_table(*TABLE)) == before, f"{type(nft).__name__} changed"


def test_adversarial_comments_and_interfaces_reach_the_kernel_as_rendered(runner):
    table = owned.NFT_PROXY_TABLE
    lines = [f"add table ip {table}", f"add chain ip {table} C"]
    expected = []
    for index, attack in enumerate(ATTACKS + ["x" * 200, "é" * 100 + "a"]):
        lines.append(f"add rule ip {table} C counter comment {text.comment(attack)}")
        expected.append(text.safe_comment_text(attack))
        try:
            ifname = text.interface(attack)
        except text.UnsafeNftText:
            continue
        lines.append(f"add rule ip {table} C iifname {ifname} counter comment \"if {index}\"")
        expected.append(f"if {index}")
    batch = "\n".join(lines)
    runner.apply(batch)
    FakeNft().apply(batch)
    rules = listing.rules(runner.list_table("ip", table) or [], "C")
    assert [rule.get("comment", "") for rule in rules] == expected
    interfaces = [expr["match"]["right"] for rule in rules for expr in rule["expr"]
                  if "match" in expr and expr["match"]["left"] == {"meta": {"key": "iifname"}}]
    assert interfaces and all(f'"{name}"' == text.interface(name) for name in interfaces)


@pytest.mark.parametrize("name", ["SVC-ABC", "Chain_1", "x-Y", "A" * 255, owned.NFT_MASQUERADE_TABLE,
                                  "COUNTER", "Accept", "IP6"])
def test_names_text_accepts_are_accepted_by_nft_everywhere(runner, name):
    rendered = text.name(name)
    runner.apply("\n".join([f"add table ip {owned.NFT_PROXY_TABLE}",
                            f"add chain ip {owned.NFT_PROXY_TABLE} {rendered}",
                            f"add chain ip {owned.NFT_PROXY_TABLE} FROM",
                            f"add rule ip {owned.NFT_PROXY_TABLE} FROM {text.jump(name)}",
                            f"add set ip {owned.NFT_PROXY_TABLE} {rendered} {{ type ipv4_addr; }}",
                            f"add rule ip {owned.NFT_PROXY_TABLE} FROM ip saddr @{rendered} accept",
                            f"add table ip {rendered}"]))
    assert (("ip", name)) in runner.tables()


def test_the_runner_acts_only_in_its_namespace(netns):
    missing = namespaces.unique_name("na-t-missing")
    with pytest.raises(NftError):
        NftRunner(missing)
    with NftRunner(netns) as inside:
        inside.apply("add table ip netagent-where")
        assert ("ip", "netagent-where") in inside.tables()
    root = namespaces.run_in(netns, ["true"])   # the namespace still exists; now read the root's
    assert root.returncode == 0
    with NftRunner() as here:      # the test runs in the root namespace: read-only there
        assert ("ip", "netagent-where") not in here.tables()
    assert nftables_usable(netns) == (True, "")


def test_a_closed_runner_refuses(netns):
    made = NftRunner(netns)
    made.close()
    with pytest.raises(NftError):
        made.tables()


def test_cleanup_removes_our_tables_from_the_kernel_in_every_family(runner):
    from netagent.daemon.cleanup import remove_owned_nft_tables
    runner.apply(f"add table ip {owned.NFT_PROXY_TABLE}\nadd table ip6 {owned.NFT_PROXY_TABLE}\n"
                 f"add table inet {owned.NFT_POLICY_TABLE}\nadd table ip other-tool\n")
    assert len(remove_owned_nft_tables(runner)) == 3
    assert runner.tables() == [("ip", "other-tool")]
