"""One token of rule text: how the restore tools read it, and the one way netagent writes it.

Why a module of its own. Every string that reaches `iptables-restore` (and, through
`ipset_token`, `ipset restore`) passes through here, so text built from API objects (Service,
port, Pod and NetworkPolicy names in `-m comment`) can never write a line of its own, and the
fake iptables reads tokens exactly as the real tool does (`split_tokens`), so a test against
the fake sees what the kernel would get. Before this, a name holding `\\n-I INPUT -j ACCEPT\\n#`
wrote its own rule: newlines were quoted, not refused, and the fake refused the unterminated
quote the real tool accepts.

How iptables-restore 1.8.9 reads a line (measured in a namespace, legacy and nft alike; the
tokenizer is `add_param_to_argv` in iptables' xshared.c):
- the input is read line by line up to `\\n` only (`\\r`, `\\v`, `\\f`, U+0085, U+2028 are
  ordinary characters); a NUL ends the line's text (the rest of that line is ignored);
- tokens are separated by space, tab and newline, nothing else;
- outside quotes a backslash is an ordinary character; `"` opens a quote, glued onto the
  text before it (`ab"c d"` is `abc d`); the closing `"` ENDS the token (`"a"b` is two);
  inside quotes a backslash takes the next character literally (`\\"`, `\\\\`, `\\x` is `x`);
  `""` is an empty token; a quote left open runs to the end of the line, newline included;
- a token of 1024 bytes or more fails ("Parameter too long!"), and so does a rule line of
  more than 251 tokens ("Parser cannot handle more arguments");
- `-m comment --comment` keeps at most 255 bytes: longer text is cut there silently, even
  inside a UTF-8 character (which then makes `iptables-save` print invalid UTF-8);
- `iptables-save` prints a comment bare when it is only `[A-Za-z0-9_-]`, else in double
  quotes with `"`, `\\` and `'` escaped by a backslash; other bytes (control characters
  included) are printed as they are.

What netagent writes: `quote_token` refuses (UnsafeText) a token holding a control character
(C0, DEL, C1), a lone surrogate, U+2028/U+2029, or 1024 bytes or more; comments go through
`comment_text`, which REPLACES those characters with U+FFFD and cuts the text to 255 bytes on
a character boundary, so an adversarial name costs its own comment, never the sync. Specs
built with `canonical_spec` carry comments in that same form, so what the kernel keeps equals
what the renderer meant and nothing looks like drift.

`ipset restore` reads differently (ipset 7.17): `"` only toggles quoting (no escapes: `\\"`
cannot be written), `\\r` is whitespace, `#` starts a comment line even after spaces, a NUL
ends the line, and an element comment over 255 characters fails. netagent writes no ipset
comments; `ipset_token` admits only the characters a set name or member can hold.

netagent writes no `nft` input of its own (the nft backend is driven through
iptables-nft-restore, which tokenizes as above); a writer of nft text must go through here.
"""
from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable, Sequence
from netagent.errors import NetagentError

COMMENT_MAX_BYTES = 255          # xt_comment: XT_MAX_COMMENT_LEN (256) including the NUL
TOKEN_MAX_BYTES = 1023           # add_param_to_argv's buffer is 1024 bytes with its NUL
RULE_MAX_TOKENS = 251            # MAX_ARGC 255, less argv[0], "-t", the table name, the end
REPLACEMENT = "\ufffd"

# Control characters (C0, DEL, C1), lone surrogates (what a JSON "\ud800" decodes to) and the
# Unicode line and paragraph separators: none belongs in rule text.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_SAVE_BARE = re.compile(r"[A-Za-z0-9_-]+")
_NEEDS_QUOTES = re.compile(r"[\s\"'\\]")
_SAVE_ESCAPE = re.compile(r"([\"'\\])")
# Characters Python's str.split() treats as whitespace and iptables-restore does not.
_NOT_RESTORE_SPACE = re.compile("[\x0b\x0c\r\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")
# One token when the line has a quote: a plain run, then optionally a quoted part (which ends
# the token). The quoted part stops at an unescaped `"` or at the end of the line.
_TOKEN = re.compile(r'[ \t\n]*([^ \t\n"]*)(?:"((?:[^"\\]|\\.)*)\\?("?))?', re.S)
_UNESCAPE = re.compile(r"\\(.)", re.S)
_IPSET_TOKEN = re.compile(r"[A-Za-z0-9_.:,/][A-Za-z0-9_.:,/-]*")


def run_tool(command: Sequence[str], *, stdin: str | None = None,
             timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run a restore/save tool with text in and out as UTF-8 with surrogateescape and NO
    newline translation (text=True would turn a comment's `\\r` into `\\n` and a foreign
    comment's invalid UTF-8 into an exception): what is read back is byte for byte what the
    kernel holds, and writing it back (`-D`) gives the same bytes."""
    done = subprocess.run(list(command), capture_output=True, timeout=timeout,
                          input=None if stdin is None else stdin.encode("utf-8", "surrogateescape"))
    return subprocess.CompletedProcess(done.args, done.returncode,
                                       done.stdout.decode("utf-8", "surrogateescape"),
                                       done.stderr.decode("utf-8", "surrogateescape"))


class UnsafeText(NetagentError, ValueError):
    """A token that cannot be written into restore input as it is."""


def utf8_length(text: str) -> int:
    """Bytes the tools see (the runner encodes with surrogateescape, so raw bytes read back
    from the kernel keep their length)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogateescape"))


def comment_text(text: str, *, max_bytes: int = COMMENT_MAX_BYTES) -> str:
    """The safe form of a comment: every unsafe character replaced with U+FFFD, then cut to
    `max_bytes` of UTF-8 on a character boundary. Idempotent; the identity on ordinary text."""
    if _UNSAFE.search(text):
        text = _UNSAFE.sub(REPLACEMENT, text)
    if len(text) * 4 <= max_bytes or utf8_length(text) <= max_bytes:
        return text
    return text.encode("utf-8")[:max_bytes].decode("utf-8", "ignore")


def require_safe(token: str) -> str:
    """`token`, or UnsafeText when it holds an unsafe character or is too long for the tools."""
    found = _UNSAFE.search(token)
    if found:
        raise UnsafeText(f"token {token[:80]!r} holds control character {found.group()!r}")
    if len(token) > TOKEN_MAX_BYTES // 4 and utf8_length(token) > TOKEN_MAX_BYTES:
        raise UnsafeText(f"token {token[:80]!r}... is {utf8_length(token)} bytes, "
                         f"more than the {TOKEN_MAX_BYTES} iptables-restore takes")
    return token


def quote_token(token: str) -> str:
    """`token` as restore input: bare when it needs no quotes, else in double quotes with
    `"`, `\\` and `'` escaped (as iptables-save writes it). UnsafeText for an unsafe token."""
    require_safe(token)
    if token and not _NEEDS_QUOTES.search(token):
        return token
    return '"' + _SAVE_ESCAPE.sub(r"\\\1", token) + '"'


def quote_comment(text: str) -> str:
    """A comment value as restore input: `quote_token(comment_text(text))`."""
    return quote_token(comment_text(text))


def spec_text(tokens: Iterable[str], *, plain: Callable[[str], str], comment: Callable[[str], str]) -> str:
    """A rule spec as one line: the value after each `--comment` written by `comment`, every
    other token by `plain`."""
    out: list[str] = []
    comment_next = False
    for token in tokens:
        out.append(comment(token) if comment_next else plain(token))
        comment_next = not comment_next and token == "--comment"
    return " ".join(out)


def join_tokens(tokens: Iterable[str]) -> str:
    """A rule spec as restore text; the value after each `--comment` goes through
    `comment_text`, every other token must be safe (UnsafeText otherwise)."""
    return spec_text(tokens, plain=quote_token, comment=quote_comment)


def save_token(token: str) -> str:
    """`token` as iptables-save prints it (the fake's save): never refuses, prints control
    characters as they are, exactly like the real tool."""
    if token and not _NEEDS_QUOTES.search(token):
        return token
    return '"' + _SAVE_ESCAPE.sub(r"\\\1", token) + '"'


def save_comment(token: str) -> str:
    """A comment as iptables-save prints it: bare only when it is `[A-Za-z0-9_-]+`."""
    if _SAVE_BARE.fullmatch(token):
        return token
    return '"' + _SAVE_ESCAPE.sub(r"\\\1", token) + '"'


def split_tokens(line: str) -> list[str]:
    """Split one line of restore or save text as iptables-restore does (see the module
    docstring). `line` may end with the `\\n` it was read with: an open quote keeps it.
    Accepts everything the real tool accepts; limits are checked by the caller."""
    words = _restore_words if _NOT_RESTORE_SPACE.search(line) else str.split
    if '"' not in line:
        return words(line)
    if "\\" not in line:
        return _split_quoted(line, words)
    return _split_escaped(line)


def _restore_words(text: str) -> list[str]:
    return [token for token in re.split("[ \t\n]+", text) if token]


def _split_quoted(line: str, words: Callable[[str], list[str]]) -> list[str]:
    """Quotes without backslashes (every saved comment): str.split, ten times faster than the
    regex on the hundreds of thousands of lines a save can hold. Even parts are outside quotes."""
    parts = line.split('"')
    last = len(parts) - 1
    tokens: list[str] = []
    pending = ""        # the word a quote opens onto (`ab"c d"` is one token)
    for index, part in enumerate(parts):
        if index % 2:
            token, pending = pending + part, ""
            if index < last or token:      # closed, or an open quote holding something
                tokens.append(token)
            continue
        found = words(part)
        if index < last and found and part[-1] not in " \t\n":
            pending = found.pop()
        tokens.extend(found)
    return tokens


def _split_escaped(line: str) -> list[str]:
    tokens: list[str] = []
    position, end = 0, len(line)
    while position < end:
        found = _TOKEN.match(line, position)
        assert found is not None, "every group of _TOKEN may be empty"
        plain, quoted, closed = found.group(1), found.group(2), found.group(3)
        token = plain + (_UNESCAPE.sub(r"\1", quoted) if quoted else "")
        if not token and not closed:
            break       # only whitespace was left, or a quote opened on nothing (no token)
        tokens.append(token)
        position = found.end()
    return tokens


def ipset_token(token: str) -> str:
    """`token` for `ipset restore` input, or UnsafeText: ipset has no escapes, so only the
    characters of a set name or member (`[A-Za-z0-9_.:,/-]`, not leading `-`) are written."""
    if not _IPSET_TOKEN.fullmatch(token):
        raise UnsafeText(f"{token[:80]!r} cannot be written into ipset restore input")
    return token


def split_ipset_line(line: str) -> list[str] | None:
    """One `ipset restore` line as ipset 7.17 reads it (`build_argv`): None for a blank or
    `#` line; `"` toggles quoting; space, tab, CR and LF separate tokens outside quotes.
    ValueError for a quote left open."""
    line = line.split("\0", 1)[0]
    stripped = line.lstrip(" \t\r\n")
    if not stripped or stripped.startswith("#"):
        return None
    tokens: list[str] = []
    current: list[str] = []
    quoted = False
    for char in line:
        if char == '"':
            quoted = not quoted
        elif char in " \t\r\n" and not quoted:
            if current:
                tokens.append("".join(current))
                current = []
        else:
            current.append(char)
    if quoted:
        raise ValueError("Missing close quote!")
    if current:
        tokens.append("".join(current))
    return tokens
