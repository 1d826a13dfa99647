"""What iptables' option parser (getopt) refuses in a rule's arguments, before any table is
touched: the fake refuses the same lines at the same place as iptables-restore does.

Apart from `restore_format` because it models the parser, not the text format, and because a
comment's value is where escaping and parsing meet: getopt hands an option its required
argument whatever it looks like, so `--comment -j -j ACCEPT` is a comment `-j` and a target,
and `--comment -j ACCEPT` fails ("Bad argument `ACCEPT'"). Measured with iptables 1.8.9,
legacy and nft, in tests/netns/test_restore_parity.py.

Not modelled: which options each match or target takes (an unknown `--bogus` passes here);
a word after an option is taken as its value unless it starts with `-` or is `!`, and the few
options that take two words are listed.
"""
from __future__ import annotations

from collections.abc import Sequence

TARGET_OPTIONS = frozenset({"-j", "--jump", "-g", "--goto"})
_TWO_VALUES = frozenset({"--match-set", "--tcp-flags"})
_NEEDS_VALUE = TARGET_OPTIONS | {"-s", "--source", "--src", "-d", "--destination", "--dst", "-i", "--in-interface",
                                 "-o", "--out-interface", "-p", "--protocol", "--comment", "-m", "--match"}


def argument_problem(spec: Sequence[str]) -> str | None:
    """Why iptables would refuse the rule arguments `spec` (after `-A CHAIN`), or None: a word
    that is no option's value, an option left without its value, more than one target."""
    index, count = 0, len(spec)
    while index < count:
        token = spec[index]
        if token == "!":
            index += 1
        elif token in _TWO_VALUES:
            index += 3
        elif token == "--comment" or (token.startswith("-") and index + 1 < count
                                      and not spec[index + 1].startswith("-") and spec[index + 1] != "!"):
            index += 2      # an option and its value (a comment's value whatever it looks like)
        elif token.startswith("-"):
            index += 1      # a flag
        else:
            return f"Bad argument `{token}'"
    if spec and spec[-1] in _NEEDS_VALUE and not (count > 1 and spec[-2] == "--comment"):
        return f'option "{spec[-1]}" requires an argument'
    targets = sum(1 for index, token in enumerate(spec)
                  if token in TARGET_OPTIONS and not (index and spec[index - 1] == "--comment"))
    if targets > 1:
        return "more than one -j/-g"
    return None
