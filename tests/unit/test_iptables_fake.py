"""FakeIptables against handwritten restore input, and the pure pieces of the iptables layer
(format, jump repair, error extraction, backend choice) that the fake and the runner share.

Every rejection here was first observed with the real iptables-restore 1.8.9 (legacy and
nft) in a test namespace; tests/netns/test_iptables_runner.py replays a sequence of them
against both real backends and the fake side by side.
"""
import random
import subprocess
import sys

import pytest

from netagent.kernel.iptables.backend import (
    IpFamily,
    IptablesBackend,
    IptablesNotInstalled,
    choose_backend,
    missing_binaries,
)
from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.tokens import UnsafeText, comment_text, join_tokens
from netagent.kernel.iptables.restore_format import (
    RestoreBuilder,
    RestoreSyntaxError,
    canonical_spec,
    is_goto,
    jump_target,
    parse_restore,
    parse_save,
    quote_token,
    render_save,
    split_tokens,
    stored_spec,
)
from netagent.kernel.iptables.runner import (
    FlushMode,
    IptablesError,
    IptablesRunner,
    JumpPosition,
    explain_restore_failure,
)

# ---- the text format ------------------------------------------------------------------------


@pytest.mark.parametrize("line, tokens", [
    ('-A X -j ACCEPT', ["-A", "X", "-j", "ACCEPT"]),
    ('-A X -m comment --comment "a b"  -j ACCEPT', ["-A", "X", "-m", "comment", "--comment", "a b", "-j", "ACCEPT"]),
    (r'--comment "a \"quoted\" b"', ["--comment", 'a "quoted" b']),
    (r'--comment "it\'s" x', ["--comment", "it's", "x"]),
    (r'--comment "back\\slash"', ["--comment", "back\\slash"]),
    ('--comment ""', ["--comment", ""]),
])
def test_split_tokens_follows_restore_quoting(line, tokens):
    assert split_tokens(line) == tokens


# Each line's tokens as iptables-restore 1.8.9 read them (legacy and nft alike), measured in a
# namespace by restoring `-A X -m comment --comment <...> -j ACCEPT` and reading the rule back.
@pytest.mark.parametrize("line, tokens", [
    ('--comment "open\n', ["--comment", "open\n"]),                   # an open quote keeps the newline
    ('--comment "open', ["--comment", "open"]),
    ('--comment a"b c"d x', ["--comment", "ab c", "d", "x"]),          # the closing quote ends the token
    ('--comment "a"b', ["--comment", "a", "b"]),
    ('--comment ab"" x', ["--comment", "ab", "x"]),
    ('--comment """"', ["--comment", "", ""]),
    ('--comment a\\b x', ["--comment", "a\\b", "x"]),                # no escapes outside quotes
    ('--comment a\\"b -j X\n', ["--comment", "a\\b -j X\n"]),
    ('--comment "a\\xb"', ["--comment", "axb"]),                     # inside, any character is taken
    ('--comment "a\\', ["--comment", "a"]),
    ('--comment "\\\n', ["--comment", "\n"]),
    ("--comment 'a b'", ["--comment", "'a", "b'"]),
    ("--comment a\rb\x0bc\x0cd\x85e\u2028f x", ["--comment", "a\rb\x0bc\x0cd\x85e\u2028f", "x"]),
    ("--comment a\tb", ["--comment", "a", "b"]),
    ("  -A X\t-j  ACCEPT  \n", ["-A", "X", "-j", "ACCEPT"]),
    ("--comment #ab x", ["--comment", "#ab", "x"]),
])
def test_split_tokens_reads_like_iptables_restore(line, tokens):
    assert split_tokens(line) == tokens


@pytest.mark.parametrize("token", ["x", "10.0.0.0/8", "a b", 'say "hi"', "it's", "back\\slash", "", "a#b", "é日𝕏",
                                   '\\"', '"', "\\"])
def test_quote_token_round_trips(token):
    assert split_tokens(quote_token(token)) == [token]
    assert split_tokens(quote_token(token) + " x\n") == [token, "x"]


@pytest.mark.parametrize("token", ["a\nb", "a\rb", "a\x00b", "\x85", "\u2028", "\ud800", "a\tb", "x" * 1024,
                                   "é" * 512])
def test_quote_token_refuses_what_cannot_be_written(token):
    with pytest.raises(UnsafeText):
        quote_token(token)


def test_comment_text_replaces_control_characters_and_cuts_on_a_character_boundary():
    assert comment_text("ns/web:http ClusterIP") == "ns/web:http ClusterIP"
    assert comment_text("a\n-I INPUT -j ACCEPT\n#") == "a\ufffd-I INPUT -j ACCEPT\ufffd#"
    assert comment_text("\x00\r\t\x7f\x9f\u2028\u2029\udc80") == "\ufffd" * 8
    cut = comment_text("é" * 200)
    assert cut == "é" * 127 and len(cut.encode()) == 254
    assert comment_text("a" * 300) == "a" * 255
    assert comment_text("𝕏" * 70).encode() == ("𝕏" * 63).encode()
    for text in ["é" * 200, "a\nb" * 90, "x"]:
        assert comment_text(comment_text(text)) == comment_text(text)


def test_join_tokens_writes_comments_in_their_safe_form_and_canonical_spec_agrees():
    spec = ["-m", "comment", "--comment", "x\n-I INPUT -j ACCEPT\n#" + "é" * 200, "-j", "RETURN"]
    line = join_tokens(spec)
    assert "\n" not in line
    assert tuple(split_tokens(line)) == canonical_spec(spec)
    assert len(canonical_spec(spec)[3].encode()) <= 255
    assert split_tokens(join_tokens(["--comment", "--comment", "a b"])) == ["--comment", "--comment", "a b"]
    with pytest.raises(UnsafeText):
        join_tokens(["-j", "ACCEPT\n-A"])


def test_stored_spec_cuts_comments_at_255_bytes_as_the_kernel_does():
    """xt_comment cuts at 255 bytes even inside a character (measured: 128 x 'é' keeps 127 and
    a lone 0xc3); the fake keeps that byte as a surrogate escape, as the runner reads it."""
    stored = stored_spec(["-m", "comment", "--comment", "é" * 128, "-j", "ACCEPT"])
    assert stored[3].encode("utf-8", "surrogateescape") == ("é" * 128).encode()[:255]
    assert stored_spec(["--comment", "a\rb"]) == ("--comment", "a\rb")


def test_canonical_spec_orders_header_options_and_adds_prefix_lengths():
    spec = ["-p", "tcp", "!", "-s", "1.2.3.4", "-i", "lo", "-m", "comment", "--comment", "x", "-j", "ACCEPT"]
    assert canonical_spec(spec) == ("!", "-s", "1.2.3.4/32", "-i", "lo", "-p", "tcp",
                                    "-m", "comment", "--comment", "x", "-j", "ACCEPT")
    assert canonical_spec(["--source", "1.2.3.5", "--protocol", "udp", "-j", "ACCEPT"]) == (
        "-s", "1.2.3.5/32", "-p", "udp", "-j", "ACCEPT")


def test_canonical_spec_leaves_target_options_alone():
    spec = ("-s", "10.0.0.0/8", "-j", "SNAT", "--to-source", "1.2.3.4")
    assert canonical_spec(spec) == spec


REAL_SAVE = """# Generated by iptables-nft-save v1.8.9 (nf_tables) on Sun Nov 22 07:08:55 2026
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [3:180]
:NETAGENT-Y - [0:0]
-A POSTROUTING -m comment --comment "netagent: pod egress masquerade" -j NETAGENT-Y
-A NETAGENT-Y -s 10.244.0.0/16 -d 10.244.0.0/16 -j RETURN
COMMIT
# Completed on Sun Nov 22 07:08:55 2026
# Warning: iptables-legacy tables present, use iptables-legacy-save to see them
"""


def test_parse_save_reads_real_save_output():
    tables = parse_save(REAL_SAVE)
    nat = tables["nat"]
    assert list(nat.chains) == ["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING", "NETAGENT-Y"]
    assert nat.chains["POSTROUTING"].rules == [
        ("-m", "comment", "--comment", "netagent: pod egress masquerade", "-j", "NETAGENT-Y")]
    assert not nat.chains["NETAGENT-Y"].builtin and nat.chains["POSTROUTING"].builtin


def test_render_save_round_trips_through_parse_save():
    tables = parse_save(REAL_SAVE)
    assert parse_save(render_save(tables.values())) == tables


def test_restore_builder_groups_lines_per_table_in_call_order():
    builder = RestoreBuilder()
    builder.declare_chain("nat", "NETAGENT-A").append("filter", "FORWARD", ["-j", "ACCEPT"])
    builder.append("nat", "NETAGENT-A", ["-m", "comment", "--comment", "a b", "-j", "RETURN"])
    assert builder.text() == ("*nat\n:NETAGENT-A - [0:0]\n"
                              '-A NETAGENT-A -m comment --comment "a b" -j RETURN\nCOMMIT\n'
                              "*filter\n-A FORWARD -j ACCEPT\nCOMMIT\n")
    assert not RestoreBuilder() and RestoreBuilder().text() == ""


def test_parse_restore_yields_earlier_blocks_before_a_later_syntax_error():
    blocks = parse_restore("*filter\nCOMMIT\n*nat\n-A POSTROUTING -j\nCOMMIT\n")
    assert next(blocks).name == "filter"
    with pytest.raises(RestoreSyntaxError) as caught:
        next(blocks)
    assert caught.value.line_number == 4


# ---- the fake: good input, noflush semantics, round trip -------------------------------------

GOOD = """# comment lines and blank lines are ignored

*nat
:NETAGENT-SVC - [0:0]
:NETAGENT-SEP - [0:0]
-A PREROUTING -m comment --comment "netagent: services" -j NETAGENT-SVC
-A NETAGENT-SVC -d 10.96.0.10/32 -p udp -j NETAGENT-SEP
-A NETAGENT-SEP -p udp -j DNAT --to-destination 10.244.1.5:53
COMMIT
*filter
:NETAGENT-FWD - [0:0]
-A FORWARD -j NETAGENT-FWD
-A NETAGENT-FWD -s 10.244.0.0/16 -j ACCEPT
COMMIT
"""


def chains_of(fake, table):
    return {name: chain.rules for name, chain in fake.tables(table)[table].chains.items()}


def test_good_restore_lands_in_save_output():
    fake = FakeIptables()
    fake.restore(GOOD)
    nat = chains_of(fake, "nat")
    assert nat["NETAGENT-SEP"] == [("-p", "udp", "-j", "DNAT", "--to-destination", "10.244.1.5:53")]
    assert nat["PREROUTING"] == [("-m", "comment", "--comment", "netagent: services", "-j", "NETAGENT-SVC")]
    assert chains_of(fake, "filter")["NETAGENT-FWD"] == [("-s", "10.244.0.0/16", "-j", "ACCEPT")]
    assert fake.list_chains("nat") == {"NETAGENT-SVC", "NETAGENT-SEP"}


def test_save_output_restores_to_the_same_state():
    fake = FakeIptables()
    fake.restore(GOOD)
    saved = fake.save()
    other = FakeIptables()
    other.restore(saved, flush=FlushMode.FLUSH_TABLES)
    assert other.save() == saved


def test_noflush_declaration_empties_only_the_chain_it_names():
    fake = FakeIptables()
    fake.restore(GOOD)
    fake.restore("*nat\n:NETAGENT-SEP - [0:0]\n-A NETAGENT-SEP -p udp -j DNAT --to-destination 10.244.2.7:53\nCOMMIT\n")
    nat = chains_of(fake, "nat")
    assert nat["NETAGENT-SEP"] == [("-p", "udp", "-j", "DNAT", "--to-destination", "10.244.2.7:53")]
    assert nat["NETAGENT-SVC"] == [("-d", "10.96.0.10/32", "-p", "udp", "-j", "NETAGENT-SEP")]
    assert len(nat["PREROUTING"]) == 1


def test_noflush_declaration_of_a_builtin_chain_sets_policy_and_keeps_rules():
    fake = FakeIptables()
    fake.restore(GOOD)
    fake.restore("*filter\n:FORWARD DROP [0:0]\nCOMMIT\n")
    filter_table = fake.tables("filter")["filter"]
    assert filter_table.chains["FORWARD"].policy == "DROP"
    assert filter_table.chains["FORWARD"].rules == [("-j", "NETAGENT-FWD")]


@pytest.mark.parametrize("backend, policy_after", [(IptablesBackend.LEGACY, "DROP"), (IptablesBackend.NFT, "ACCEPT")])
def test_flush_mode_empties_the_named_tables_and_keeps_the_others(backend, policy_after):
    fake = FakeIptables(backend=backend)
    fake.restore(GOOD)
    fake.restore("*filter\n:FORWARD DROP [0:0]\nCOMMIT\n")
    fake.restore("*filter\n:NETAGENT-NEW - [0:0]\nCOMMIT\n", flush=FlushMode.FLUSH_TABLES)
    assert chains_of(fake, "filter") == {"INPUT": [], "FORWARD": [], "OUTPUT": [], "NETAGENT-NEW": []}
    assert fake.table("filter").chains["FORWARD"].policy == policy_after
    assert "NETAGENT-SVC" in chains_of(fake, "nat")


def test_commands_insert_delete_replace_new_flush_and_delete_chain():
    fake = FakeIptables()
    fake.restore("*filter\n-N NETAGENT-A\n-A INPUT -s 1.1.1.1 -j ACCEPT\n-I INPUT -s 2.2.2.2 -j ACCEPT\n"
                 "-I INPUT 3 -s 3.3.3.3 -j NETAGENT-A\n-R INPUT 1 -s 4.4.4.4 -j DROP\n"
                 "-D INPUT -s 1.1.1.1/32 -j ACCEPT\n-P INPUT DROP\nCOMMIT\n")
    assert chains_of(fake, "filter")["INPUT"] == [("-s", "4.4.4.4/32", "-j", "DROP"),
                                                  ("-s", "3.3.3.3/32", "-j", "NETAGENT-A")]
    fake.restore("*filter\n-D INPUT 2\n-F NETAGENT-A\n-X NETAGENT-A\nCOMMIT\n")
    assert chains_of(fake, "filter") == {"INPUT": [("-s", "4.4.4.4/32", "-j", "DROP")], "FORWARD": [], "OUTPUT": []}


def test_a_chain_emptied_earlier_in_the_same_block_can_be_deleted():
    fake = FakeIptables()
    fake.restore("*nat\n:NETAGENT-Y - [0:0]\n:NETAGENT-Z - [0:0]\n-A NETAGENT-Y -j NETAGENT-Z\nCOMMIT\n")
    fake.restore("*nat\n:NETAGENT-Y - [0:0]\n-X NETAGENT-Z\nCOMMIT\n")
    assert fake.list_chains("nat") == {"NETAGENT-Y"}


def test_a_loop_not_reachable_from_a_builtin_chain_is_accepted():
    fake = FakeIptables()
    fake.restore("*filter\n:NETAGENT-L1 - [0:0]\n:NETAGENT-L2 - [0:0]\n-A NETAGENT-L1 -j NETAGENT-L2\n"
                 "-A NETAGENT-L2 -j NETAGENT-L1\nCOMMIT\n")
    with pytest.raises(IptablesError, match="loop"):
        fake.restore("*filter\n-A INPUT -j NETAGENT-L1\nCOMMIT\n")


# ---- the fake: rejections, atomicity -------------------------------------------------------

SETUP = "*nat\n:NETAGENT-USED - [0:0]\n:NETAGENT-FULL - [0:0]\n-A POSTROUTING -j NETAGENT-USED\n" \
        "-A NETAGENT-FULL -j RETURN\nCOMMIT\n"

BAD = {
    "jump to a missing chain": ("*nat\n:NETAGENT-X - [0:0]\n-A NETAGENT-X -j RETURN\n-A NETAGENT-X -j NOSUCH\nCOMMIT\n", 4),
    "jump to a chain declared later": ("*nat\n:NETAGENT-A - [0:0]\n-A NETAGENT-A -j NETAGENT-B\n:NETAGENT-B - [0:0]\nCOMMIT\n", 3),
    "jump to a chain made later with -N": ("*nat\n:NETAGENT-A - [0:0]\n-A NETAGENT-A -j NETAGENT-B\n-N NETAGENT-B\nCOMMIT\n", 3),
    "jump to a builtin chain": ("*nat\n-A OUTPUT -j POSTROUTING\nCOMMIT\n", 2),
    "goto a standard target": ("*nat\n-A OUTPUT -g ACCEPT\nCOMMIT\n", 2),
    "two targets": ("*nat\n-A OUTPUT -j ACCEPT -j DROP\nCOMMIT\n", 2),
    "target without name": ("*nat\n-A OUTPUT -j\nCOMMIT\n", 2),
    "rule in a missing chain": ("*nat\n-A NOPE -j ACCEPT\nCOMMIT\n", 2),
    "delete a referenced chain": ("*nat\n-X NETAGENT-USED\nCOMMIT\n", 2),
    "delete a non-empty chain": ("*nat\n-X NETAGENT-FULL\nCOMMIT\n", 2),
    "delete a builtin chain": ("*nat\n-X OUTPUT\nCOMMIT\n", 2),
    "delete every chain while one is referenced": ("*nat\n-F NETAGENT-FULL\n-X\nCOMMIT\n", 3),
    "new chain that exists": ("*nat\n-N NETAGENT-USED\nCOMMIT\n", 2),
    "delete a rule that is not there": ("*nat\n-D POSTROUTING -j ACCEPT\nCOMMIT\n", 2),
    "delete rule number out of range": ("*nat\n-D OUTPUT 1\nCOMMIT\n", 2),
    "insert past the end": ("*nat\n-I OUTPUT 2 -j ACCEPT\nCOMMIT\n", 2),
    "replace in an empty chain": ("*nat\n-R OUTPUT 1 -j ACCEPT\nCOMMIT\n", 2),
    "flush a missing chain": ("*nat\n-F NOPE\nCOMMIT\n", 2),
    "unknown table": ("*nosuch\n:NETAGENT-X - [0:0]\nCOMMIT\n", 1),
    "MASQUERADE outside nat": ("*filter\n-A FORWARD -j MASQUERADE\nCOMMIT\n", 2),
    "REJECT outside filter": ("*nat\n-A OUTPUT -p tcp -j REJECT\nCOMMIT\n", 2),
    "MASQUERADE reachable from PREROUTING": (
        "*nat\n:NETAGENT-M - [0:0]\n-A NETAGENT-M -j MASQUERADE\n-A PREROUTING -j NETAGENT-M\nCOMMIT\n", 5),
    "DNAT to a port without protocol": ("*nat\n-A OUTPUT -j DNAT --to-destination 10.244.1.5:53\nCOMMIT\n", 2),
    "MASQUERADE to ports without protocol": ("*nat\n-A POSTROUTING -j MASQUERADE --to-ports 1000-2000\nCOMMIT\n", 2),
    "DNAT in POSTROUTING": ("*nat\n-A POSTROUTING -j DNAT --to-destination 1.2.3.4\nCOMMIT\n", 3),
    "chain name of 29 characters": ("*nat\n:NETAGENT-" + "X" * 20 + " - [0:0]\nCOMMIT\n", 2),
    "chain named like a target": ("*nat\n:ACCEPT - [0:0]\nCOMMIT\n", 2),
    "policy on a user chain": ("*nat\n:NETAGENT-P ACCEPT [0:0]\nCOMMIT\n", 2),
    "RETURN as a policy": ("*nat\n-P OUTPUT RETURN\nCOMMIT\n", 2),
    "declaration without policy": ("*nat\n:NETAGENT-P\nCOMMIT\n", 2),
    "missing COMMIT": ("*nat\n:NETAGENT-P - [0:0]\n", 1),
    "rule outside a table": ("-A OUTPUT -j ACCEPT\n", 1),
    "table inside a table": ("*nat\n*filter\nCOMMIT\n", 2),
    "unknown command": ("*nat\n-Q OUTPUT\nCOMMIT\n", 2),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_fails_names_its_line_and_changes_nothing(case):
    text, line_number = BAD[case]
    fake = FakeIptables()
    fake.restore(SETUP)
    before = fake.save()
    with pytest.raises(IptablesError) as caught:
        fake.restore(text)
    assert caught.value.line_number == line_number, caught.value
    assert caught.value.line == text.splitlines()[line_number - 1]
    assert fake.save() == before
    assert fake.restores[-1].error is caught.value


def test_a_failing_block_leaves_its_table_untouched_but_earlier_blocks_committed():
    # Measured on both backends: the real tools commit each table at its COMMIT line.
    fake = FakeIptables()
    with pytest.raises(IptablesError) as caught:
        fake.restore("*filter\n:NETAGENT-GOOD - [0:0]\nCOMMIT\n"
                     "*nat\n:NETAGENT-BAD - [0:0]\n-A POSTROUTING -j NETAGENT-BAD\n-A NETAGENT-BAD -j NOPE\nCOMMIT\n")
    assert caught.value.line_number == 7
    assert fake.list_chains("filter") == {"NETAGENT-GOOD"}
    assert fake.list_chains("nat") == set()
    assert chains_of(fake, "nat")["POSTROUTING"] == []


def test_save_of_an_unknown_table_fails():
    with pytest.raises(IptablesError):
        FakeIptables().save("nosuch")


# ---- owned-rule operations shared by fake and runner ---------------------------------------

FOREIGN = "*nat\n:DOCKER - [0:0]\n-A POSTROUTING -s 172.17.0.0/16 -j MASQUERADE\n-A POSTROUTING -j DOCKER\n" \
          ":NETAGENT-A - [0:0]\n:NETAGENT-B - [0:0]\nCOMMIT\n"


def jumps(fake, chain="POSTROUTING"):
    return [rule[-1] for rule in chains_of(fake, "nat")[chain]]


def test_ensure_jump_puts_one_commented_jump_on_top_and_then_writes_nothing():
    fake = FakeIptables()
    fake.restore(FOREIGN)
    assert fake.ensure_jump("nat", "POSTROUTING", "NETAGENT-A", comment="netagent: a")
    assert chains_of(fake, "nat")["POSTROUTING"][0] == ("-m", "comment", "--comment", "netagent: a", "-j", "NETAGENT-A")
    writes = len(fake.restores)
    assert not fake.ensure_jump("nat", "POSTROUTING", "NETAGENT-A", comment="netagent: a")
    assert len(fake.restores) == writes
    assert jumps(fake) == ["NETAGENT-A", "MASQUERADE", "DOCKER"]


def test_ensure_jump_collapses_duplicates_and_replaces_altered_jumps():
    fake = FakeIptables()
    fake.restore(FOREIGN)
    fake.restore("*nat\n-I POSTROUTING -j NETAGENT-A\n-A POSTROUTING -s 10.0.0.0/8 -j NETAGENT-A\nCOMMIT\n")
    assert fake.ensure_jump("nat", "POSTROUTING", "NETAGENT-A", comment="netagent: a")
    assert jumps(fake) == ["NETAGENT-A", "MASQUERADE", "DOCKER"]
    assert "netagent: a" in chains_of(fake, "nat")["POSTROUTING"][0]


def test_ensure_jump_moves_a_jump_that_a_foreign_rule_overtook():
    fake = FakeIptables()
    fake.restore(FOREIGN)
    fake.ensure_jump("nat", "POSTROUTING", "NETAGENT-A", comment="netagent: a")
    fake.restore("*nat\n-I POSTROUTING -j RETURN\nCOMMIT\n")
    assert fake.ensure_jump("nat", "POSTROUTING", "NETAGENT-A", comment="netagent: a")
    assert jumps(fake) == ["NETAGENT-A", "RETURN", "MASQUERADE", "DOCKER"]


def test_two_of_our_jumps_share_the_top_without_fighting():
    fake = FakeIptables()
    fake.restore(FOREIGN)
    for _ in range(2):
        fake.ensure_jump("nat", "POSTROUTING", "NETAGENT-A", comment="netagent: a")
        fake.ensure_jump("nat", "POSTROUTING", "NETAGENT-B", comment="netagent: b")
    writes = len(fake.restores)
    fake.ensure_jump("nat", "POSTROUTING", "NETAGENT-A", comment="netagent: a")
    fake.ensure_jump("nat", "POSTROUTING", "NETAGENT-B", comment="netagent: b")
    assert len(fake.restores) == writes
    assert jumps(fake) == ["NETAGENT-B", "NETAGENT-A", "MASQUERADE", "DOCKER"]


def test_ensure_jump_last_goes_after_foreign_rules():
    fake = FakeIptables()
    fake.restore(FOREIGN)
    fake.ensure_jump("nat", "POSTROUTING", "NETAGENT-A", comment="netagent: a", position=JumpPosition.LAST)
    assert jumps(fake) == ["MASQUERADE", "DOCKER", "NETAGENT-A"]


def test_ensure_jump_refuses_targets_that_are_not_ours():
    with pytest.raises(ValueError):
        FakeIptables().ensure_jump("nat", "POSTROUTING", "DOCKER", comment="x")


def test_delete_owned_removes_our_chains_and_jumps_in_every_table_and_nothing_else():
    fake = FakeIptables()
    fake.restore(FOREIGN)
    fake.restore("*nat\n-A NETAGENT-A -j NETAGENT-B\n-A DOCKER -j NETAGENT-A\nCOMMIT\n"
                 "*raw\n:NETAGENT-RAW - [0:0]\n-A PREROUTING -j NETAGENT-RAW\n-A NETAGENT-RAW -j CT --notrack\nCOMMIT\n"
                 "*filter\n:KEEP-ME - [0:0]\n-A FORWARD -j KEEP-ME\nCOMMIT\n")
    fake.ensure_jump("nat", "POSTROUTING", "NETAGENT-A", comment="netagent: a")
    removed = fake.delete_owned()
    assert removed == ["nat/NETAGENT-A", "nat/NETAGENT-B", "raw/NETAGENT-RAW"]
    assert "NETAGENT" not in fake.save()
    assert jumps(fake) == ["MASQUERADE", "DOCKER"]
    assert chains_of(fake, "filter")["FORWARD"] == [("-j", "KEEP-ME")]
    writes = len(fake.restores)
    assert fake.delete_owned() == [] and len(fake.restores) == writes


def test_delete_chains_is_quiet_when_already_gone():
    fake = FakeIptables()
    assert fake.delete_chains("nat", ["NETAGENT-NONE"]) is False
    assert fake.restores == []


# ---- what the runner makes of real tools' complaints (captured from iptables 1.8.9) --------

FAILED_INPUT = "*nat\n:NETAGENT-X - [0:0]\n-A NETAGENT-X -s 10.0.0.0/8 -j RETURN\n-A NETAGENT-X -j NOSUCH\nCOMMIT\n"


@pytest.mark.parametrize("stderr, line_number, message", [
    ("iptables-restore v1.8.9 (legacy): Couldn't load target `NOSUCH':No such file or directory\n\n"
     "Error occurred at line: 4\nTry `iptables-restore -h' or 'iptables-restore --help' for more information.\n",
     4, "Couldn't load target `NOSUCH':No such file or directory"),
    # nft names the COMMIT line; the runner points at the rule instead.
    ("iptables-nft-restore v1.8.9 (nf_tables): Chain 'NOSUCH' does not exist\nError occurred at line: 5\n"
     "Try `iptables-nft-restore -h' or 'iptables-nft-restore --help' for more information.\n",
     4, "Chain 'NOSUCH' does not exist"),
    ("iptables-restore: line 3 failed\n", 3, "line 3 failed"),
    ("iptables-nft-restore v1.8.9 (nf_tables): \nline 2: CHAIN_DEL failed (Device or resource busy): chain NETAGENT-X\n",
     2, "line 2: CHAIN_DEL failed (Device or resource busy): chain NETAGENT-X"),
    ("iptables-restore: COMMIT expected at line 5\n", 5, "COMMIT expected at line 5"),
])
def test_explain_restore_failure_names_the_line(stderr, line_number, message):
    found_number, line, found_message = explain_restore_failure(stderr, FAILED_INPUT)
    assert (found_number, found_message) == (line_number, message)
    assert line == FAILED_INPUT.splitlines()[line_number - 1]


def test_explain_restore_failure_without_a_line_number():
    assert explain_restore_failure("something odd\n", FAILED_INPUT) == (None, None, "something odd")


def test_runner_turns_a_hung_tool_into_a_timeout_error():
    if missing_binaries(IpFamily.V4, IptablesBackend.NFT):
        pytest.skip("iptables-nft is not installed")
    # The prefix stands in for `ip netns exec NS`: a program that hangs instead of running iptables.
    hang = [sys.executable, "-c", "import time; time.sleep(10)"]
    runner = IptablesRunner(backend=IptablesBackend.NFT, exec_prefix=hang, timeout=0.3)
    with pytest.raises(IptablesError, match="timed out"):
        runner.save("nat")


# ---- backend choice (pure) -----------------------------------------------------------------

def save_with(rules: int, *, chains=()) -> str:
    lines = ["*mangle", ":PREROUTING ACCEPT [0:0]", *(f":{c} - [0:0]" for c in chains)]
    lines += ["-A PREROUTING -j ACCEPT"] * rules
    return "\n".join(lines + ["COMMIT", ""])


@pytest.mark.parametrize("legacy, nft, expected", [
    (save_with(0), save_with(0), IptablesBackend.NFT),
    ("", "", IptablesBackend.NFT),
    (save_with(3), save_with(1), IptablesBackend.LEGACY),
    (save_with(2), save_with(2), IptablesBackend.NFT),
    (save_with(0, chains=["KUBE-IPTABLES-HINT"]), save_with(50), IptablesBackend.LEGACY),
    (save_with(50, chains=["KUBE-KUBELET-CANARY"]), save_with(0, chains=["KUBE-IPTABLES-HINT"]), IptablesBackend.NFT),
    (save_with(5), None, IptablesBackend.LEGACY),
    (None, save_with(0), IptablesBackend.NFT),
])
def test_choose_backend(legacy, nft, expected):
    backend, reason = choose_backend({IptablesBackend.LEGACY: legacy, IptablesBackend.NFT: nft})
    assert backend is expected and reason


def test_choose_backend_without_any_tool_says_so():
    with pytest.raises(IptablesNotInstalled):
        choose_backend({IptablesBackend.LEGACY: None, IptablesBackend.NFT: None})


def test_fake_runs_no_programs(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the fake must not run programs")
    monkeypatch.setattr(subprocess, "run", refuse)
    fake = FakeIptables()
    fake.restore(GOOD)
    fake.ensure_jump("nat", "OUTPUT", "NETAGENT-SVC", comment="netagent: services")
    fake.delete_owned()


# ---- lines as iptables-restore reads them (each case measured on both real backends) ----------

def _rules_after(text: str) -> list[tuple[str, ...]]:
    fake = FakeIptables()
    fake.restore(text)
    return fake.state()["filter"].chains["NETAGENT-X"].rules


@pytest.mark.parametrize("body, rules", [
    ('-A NETAGENT-X -m comment --comment "ab -j ACCEPT\n', [("-m", "comment", "--comment", "ab -j ACCEPT\n")]),
    ("-A NETAGENT-X -j ACCEPT\x00 garbage\n-A NETAGENT-X -j DROP\n", [("-j", "ACCEPT"), ("-j", "DROP")]),
    ("  -A NETAGENT-X -j ACCEPT\n#x\n\n", [("-j", "ACCEPT")]),
    (":NETAGENT-X - [0:0] extra words\n", []),
    (":NETAGENT-X\t-\n", []),
    ('-A NETAGENT-X -m comment --comment "a\\\n-A NETAGENT-X -j DROP\n',
     [("-m", "comment", "--comment", "a\n"), ("-j", "DROP")]),
])
def test_fake_accepts_what_iptables_restore_accepts(body, rules):
    assert _rules_after(f"*filter\n:NETAGENT-X - [0:0]\n{body}COMMIT\n") == rules


@pytest.mark.parametrize("body", [
    " #x\n", "   \n", "\t\n", "\r\n", "\x00-A NETAGENT-X -j ACCEPT\n", "-A NETAGENT-X -j ACCEPT\r\n",
    "-A NETAGENT-X -j ACCEPT # trailing\n", "COMMIT \n", "  COMMIT\n", ":\n", ":NETAGENT-Y\n",
    '-A NETAGENT-X -j ACCEPT ""\n', '-A NETAGENT-X -m comment --comment "a"b -j ACCEPT\n',
    '-A NETAGENT-X -m comment --comment "' + "a" * 1024 + '" -j ACCEPT\n',
    "-A NETAGENT-X" + " -m comment --comment a" * 62 + " -j ACCEPT\n",
    "-I NETAGENT-X \u00b2 -j ACCEPT\n", "-N \"\"\n",
])
def test_fake_refuses_what_iptables_restore_refuses(body):
    fake = FakeIptables()
    with pytest.raises(IptablesError):
        fake.restore(f"*filter\n:NETAGENT-X - [0:0]\n{body}COMMIT\n")
    assert "NETAGENT-X" not in fake.save()


def test_fake_token_limits_are_the_real_ones():
    assert _rules_after("*filter\n:NETAGENT-X - [0:0]\n-A NETAGENT-X -m comment --comment " + "a" * 1023
                        + " -j ACCEPT\nCOMMIT\n")[0][3] == "a" * 255
    many = "-A NETAGENT-X" + " -m comment --comment a" * 61 + " ! -p tcp -j ACCEPT\n"   # 251 tokens
    assert len(_rules_after(f"*filter\n:NETAGENT-X - [0:0]\n{many}COMMIT\n")) == 1
    with pytest.raises(IptablesError, match="more arguments"):
        _rules_after(f"*filter\n:NETAGENT-X - [0:0]\n{many.replace(' ! ', ' -s 1.2.3.4 ')}COMMIT\n")


def test_parse_save_splits_lines_at_newlines_only():
    saved = '*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -m comment --comment "a\rb\x85c\u2028d\x1ce" -j ACCEPT\nCOMMIT\n'
    assert parse_save(saved)["filter"].chains["INPUT"].rules == [
        ("-m", "comment", "--comment", "a\rb\x85c\u2028d\x1ce", "-j", "ACCEPT")]
    fake = FakeIptables()
    fake.restore(saved)
    assert parse_save(fake.save("filter"))["filter"].chains["INPUT"] == parse_save(saved)["filter"].chains["INPUT"]


def test_a_comment_that_looks_like_a_target_is_a_comment():
    spec = ("-m", "comment", "--comment", "-j", "-j", "NETAGENT-Y")
    assert jump_target(spec) == "NETAGENT-Y" and not is_goto(spec)
    assert jump_target(("-m", "comment", "--comment", "-g")) is None
    fake = FakeIptables()
    fake.restore("*filter\n:NETAGENT-Y - [0:0]\n:NETAGENT-X - [0:0]\n-A NETAGENT-X " + join_tokens(spec) + "\nCOMMIT\n")
    assert fake.state()["filter"].references_to("NETAGENT-Y") == [("NETAGENT-X", spec)]


def test_split_tokens_fast_paths_agree_with_the_general_reader():
    """Lines without backslashes take str.split paths (save output is large); they must read
    exactly as the general reader does."""
    from netagent.kernel.iptables.tokens import _split_escaped

    rng = random.Random(18)
    pieces = [" ", "\t", '"', "a", "é", "\r", "\x0b", "\u3000", "\n", "#", "-j", '""', "\\"]
    for _ in range(20000):
        line = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        assert split_tokens(line) == _split_escaped(line), repr(line)
