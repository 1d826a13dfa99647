"""`kernel/nftables/text.py` by property: any string either renders as safe nft text or is
refused, and a rendered comment, rule or element list, read back by the fake's tokenizer
(`fake_parse.commands`, the reading the netns parity test holds to the real nft), is exactly
the intended command, no token more. Adversarial strings include quote breaks, backslashes,
newlines, `;` and `#` (nft's command separator and comment), U+2028 and lone surrogates.
tests/netns/test_nft_parity.py feeds the same attacks to the real nft parser."""
from __future__ import annotations

import os
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from netagent.kernel import owned
from netagent.kernel.iptables.tokens import UnsafeText
from netagent.kernel.nftables import text
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.nftables.fake_parse import commands
from netagent.kernel.nftables.text import UnsafeNftText

EXAMPLES = int(os.environ.get("NETAGENT_FUZZ_EXAMPLES", "80"))
ATTACKS = ['x"\nadd rule ip netagent C accept\n#', '"', "\\", '\\"', 'a" accept "', "a;b", "a\nb",
           "#", "a\x00b", "a\rb", "\u2028", "\x85", "é" * 100, "𝕏" * 40, "", " ", "{", "}", "$x",
           "@set", "\ud800", "na*", "a b", "ip6", "counter", "accept"]
STRINGS = st.one_of(st.sampled_from(ATTACKS), st.text(max_size=140),
                    st.lists(st.sampled_from(ATTACKS + ["a", "Z", "-", "_", "0"]), max_size=8).map("".join))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff\"\\\\]")


def base() -> FakeNft:
    nft = FakeNft()
    nft.apply(f"add table ip {owned.NFT_PROXY_TABLE}\nadd chain ip {owned.NFT_PROXY_TABLE} C")
    return nft


@SETTINGS
@given(STRINGS)
def test_a_comment_renders_safely_and_reads_back_as_the_safe_text(value: str) -> None:
    rendered = text.comment(value)
    safe = text.safe_comment_text(value)
    assert rendered == f'"{safe}"'
    assert not UNSAFE.search(safe)
    assert len(safe.encode("utf-8")) <= text.COMMENT_MAX_BYTES
    assert text.safe_comment_text(safe) == safe
    nft = base()
    nft.apply(f"add rule ip {owned.NFT_PROXY_TABLE} C counter comment {rendered}")
    listed = nft.list_table("ip", owned.NFT_PROXY_TABLE) or []
    rules = [entry["rule"] for entry in listed if "rule" in entry]
    assert len(rules) == 1 and rules[0]["comment"] == safe and rules[0]["text"] == "counter"


@SETTINGS
@given(STRINGS)
def test_a_name_is_refused_or_one_keyword_proof_bare_word(value: str) -> None:
    try:
        rendered = text.name(value)
    except UnsafeNftText:
        return
    assert rendered == value
    assert re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]{0,254}", rendered)
    assert re.search("[A-Z]", rendered) or rendered.startswith(owned.NFT_TABLE_PREFIX)
    assert commands(f"add chain ip t {rendered}") == [["add", "chain", "ip", "t", rendered]]


@SETTINGS
@given(STRINGS)
def test_an_interface_is_refused_or_one_quoted_token(value: str) -> None:
    for render, suffix in ((text.interface, ""), (text.interface_prefix, "*")):
        try:
            rendered = render(value)
        except UnsafeNftText:
            continue
        assert rendered == f'"{value}{suffix}"'
        assert len(value.encode()) <= text.IFNAME_MAX_BYTES and value.isascii() and value.isprintable()
        assert not re.search(r'[\s"\\/:]', value) and "*" not in value
        assert commands(f"add rule ip t C iifname {rendered} accept")[0][-2:] == [rendered, "accept"]


@pytest.mark.parametrize("good", ["SVC-ABC", "Chain_1", "x-Y", owned.NFT_PROXY_TABLE,
                                  owned.NFT_MASQUERADE_TABLE, owned.NFT_POLICY_TABLE, "A" * 255])
def test_names_we_generate_are_accepted(good: str) -> None:
    assert text.name(good) == good


@pytest.mark.parametrize("bad", ["ip6", "counter", "accept", "svc-abc", "1ABC", "A B", "A;B", "A\nB",
                                 '"A"', "A" * 256, "", "Ä", "A.B", "A/B"])
def test_names_that_could_be_keywords_or_break_text_are_refused(bad: str) -> None:
    with pytest.raises(UnsafeNftText):
        text.name(bad)


def test_refusals_are_unsafe_text_so_callers_catch_one_class() -> None:
    with pytest.raises(UnsafeText):
        text.interface("a b")


def test_values_are_validated_and_canonical() -> None:
    assert text.address("10.0.0.1") == "10.0.0.1"
    assert text.address("fd00::0001") == "fd00::1"
    assert text.network("10.1.0.0/16") == "10.1.0.0/16"
    assert text.port(80) == "80" and text.protocol("TCP") == "tcp" and text.number(0x4000) == "16384"
    cases: list[tuple[Any, Any]] = [(text.address, "10.0.0.1 accept"), (text.network, "10.0.0.1/8"),
                                    (text.port, 70000), (text.port, True), (text.protocol, "icmp"), (text.number, -1)]
    for call, value in cases:
        with pytest.raises(UnsafeNftText):
            call(value)


ZONED = ["fe80::1%eth0", "fe80::1%eth0\nflush ruleset", "fe80::%0/64", "fe80::%eth0\nflush ruleset/64",
         "fe80::1%eth0/128", "fe80::1%"]


@pytest.mark.parametrize("value", ZONED)
def test_an_ipv6_zone_is_refused_by_address_and_network(value: str) -> None:
    call = text.network if "/" in value else text.address
    with pytest.raises(UnsafeNftText):
        call(value)


@SETTINGS
@given(st.one_of(st.sampled_from(ZONED), st.builds("{}%{}".format, st.sampled_from(["fe80::1", "fd00::", "::"]),
                                                    STRINGS)))
def test_whatever_ipaddress_reads_an_address_or_network_is_hex_dots_colons_or_refused(value: str) -> None:
    for call in (text.address, text.network, lambda v: text.network(v + "/64")):
        try:
            rendered = call(value)
        except UnsafeNftText:
            continue
        assert re.fullmatch(r"[0-9a-f.:]+(/[0-9]+)?", rendered), rendered


def test_elements_join_with_the_spacing_the_fake_reads() -> None:
    key = text.concat([text.address("10.0.0.1"), text.protocol("tcp"), text.port(80)])
    block = text.element_block([text.element(key, text.goto("SVC-A")), text.element(key.replace("80", "81"), "drop")])
    assert block == "{ 10.0.0.1 . tcp . 80 : goto SVC-A, 10.0.0.1 . tcp . 81 : drop }"
    with pytest.raises(UnsafeNftText):
        text.element_block([])
    with pytest.raises(UnsafeNftText):
        text.jump("accept")
