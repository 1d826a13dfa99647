"""Restore text as iptables-restore reads it: tokens, quoting, the escaping of every string
that reaches restore input (`kernel/iptables/tokens.py`), comments cut as the kernel cuts them,
and the fake's reading of whole lines. Every expected reading was measured with the real
iptables-restore 1.8.9 (legacy and nft) in a namespace; tests/netns/test_restore_parity.py
compares the fake and the real tools on the same inputs.
"""
import random

import pytest

from netagent.kernel.iptables.fake import FakeIptables
from netagent.kernel.iptables.restore_format import (
    canonical_spec,
    is_goto,
    jump_target,
    parse_save,
    quote_token,
    split_tokens,
    stored_spec,
)
from netagent.kernel.iptables.runner import IptablesError
from netagent.kernel.iptables.tokens import UnsafeText, comment_text, join_tokens

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
