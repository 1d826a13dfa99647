"""The one place a string becomes nft text: names, interface names, comments, addresses,
ports, element lists. Every renderer of nft batches builds its text from these functions, so
text built from API objects (Service, Pod, NetworkPolicy names in comments) can never write a
command of its own, and `FakeNft` can read the spacing it writes (` . `, ` : `, `, `).

How nft 1.0.6 reads what we write (measured in a namespace):
- a quoted string is `"` ... `"` with NO escapes: `\\"` ends the string early and the rest is
  a syntax error; a backslash, `#`, `;`, `{`, `$` and control characters inside quotes are
  kept literally (a newline too). We refuse or replace all of these anyway (below).
- a rule or element comment holds at most 128 bytes of UTF-8 ("comment too long, 128
  characters maximum allowed" at 129 bytes, 65 x U+00E9 included).
- names of tables, chains, sets and maps are BARE words (a quoted name is a syntax error) of
  at most 255 bytes (256: "Numerical result out of range"); a bare word that is one of nft's
  keywords in that position is a syntax error (`ip6`, `counter`, `accept` as a chain name),
  and the scanner is case-sensitive (`COUNTER` is a fine name) with every keyword lowercase.
- interface names in rules (`iifname "na0"`) are quoted strings; a trailing `*` makes a
  prefix match (`"na*"`).

What we write:
- `name()`: `[A-Za-z][A-Za-z0-9_-]*`, at most 255 bytes, and keyword-proof: it holds an
  uppercase ASCII letter (no keyword does), or starts with `owned.NFT_TABLE_PREFIX`
  ("netagent", which no keyword does either: our lowercase table names). Anything else is
  refused (`UnsafeNftText`), never rewritten: a name is an identity.
- `comment()`: `"` and `\\` and unsafe characters (control characters C0, DEL, C1, lone
  surrogates, U+2028/U+2029: iptables tokens' set) REPLACED with U+FFFD, then cut to 128
  bytes on a character boundary, then quoted: an adversarial API name costs its comment,
  never the sync.
- `interface()`: a Linux interface name (1-15 bytes, no `/`, `:`, whitespace) without `"`,
  `\\`, `*` or unsafe characters, quoted; `interface_prefix()` the same plus `*`.
- addresses, networks, ports, protocols validated and printed canonically (`address()`,
  `network()`: the one gate every address and network of every element passes; an IPv6 zone,
  `%` and anything after it, refused); `concat()`,
  `element()` and `element_block()` join with the spacing the fake reads.
"""
from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from netagent.kernel import owned
from netagent.kernel.iptables.tokens import REPLACEMENT, UnsafeText, comment_text

NAME_MAX_BYTES = 255
COMMENT_MAX_BYTES = 128
IFNAME_MAX_BYTES = 15          # IFNAMSIZ (16) with its NUL
PROTOCOLS = ("tcp", "udp", "sctp")

_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_UPPER = re.compile(r"[A-Z]")
_IFNAME = re.compile(r"[!#-)+-.0-9;-[\]-~]+")   # printable ASCII but space " * / : \
_QUOTE_OR_BACKSLASH = re.compile(r'["\\]')
_ADDRESS_TEXT = re.compile(r"[0-9a-f.:]+(/[0-9]{1,3})?")


class UnsafeNftText(UnsafeText):
    """A string that cannot be written into nft text as it is."""


def name(text: str) -> str:
    """A table, chain, set or map name as nft text (bare), or UnsafeNftText."""
    if not isinstance(text, str) or not _NAME.fullmatch(text):
        raise UnsafeNftText(f"nft name {str(text)[:80]!r} is not [A-Za-z][A-Za-z0-9_-]*")
    if len(text) > NAME_MAX_BYTES:
        raise UnsafeNftText(f"nft name {text[:80]!r}... is {len(text)} bytes, more than {NAME_MAX_BYTES}")
    if not _UPPER.search(text) and not text.startswith(owned.NFT_TABLE_PREFIX):
        raise UnsafeNftText(f"nft name {text!r} could be an nft keyword: give it an uppercase "
                            f"letter (or the {owned.NFT_TABLE_PREFIX!r} prefix)")
    return text


def name_for_listing(text: str) -> str:
    """A table name to list or delete: the same rules as `name()`."""
    return name(text)


def safe_comment_text(text: str, room: int = COMMENT_MAX_BYTES) -> str:
    """What the kernel will hold for a comment `text`: `"`, `\\` and unsafe characters
    replaced with U+FFFD, cut to `room` bytes (128, nft's most) on a character boundary.
    Idempotent."""
    return comment_text(_QUOTE_OR_BACKSLASH.sub(REPLACEMENT, text), max_bytes=min(room, COMMENT_MAX_BYTES))


def comment(text: str) -> str:
    """`text` as an nft comment value: `"` + safe_comment_text(text) + `"`."""
    return '"' + safe_comment_text(text) + '"'


def interface(ifname: str) -> str:
    """An interface name matched exactly, quoted (`"na0"`); UnsafeNftText when it is not a
    name Linux allows or holds `"`, `\\`, `*` or a character outside printable ASCII."""
    if not isinstance(ifname, str) or not _IFNAME.fullmatch(ifname) or ifname in (".", ".."):
        raise UnsafeNftText(f"interface name {str(ifname)[:40]!r} is not one nft text can hold")
    if len(ifname) > IFNAME_MAX_BYTES:
        raise UnsafeNftText(f"interface name {ifname[:40]!r} is longer than {IFNAME_MAX_BYTES} bytes")
    return '"' + ifname + '"'


def interface_prefix(prefix: str) -> str:
    """Every interface whose name starts with `prefix` (`"na*"`)."""
    if not isinstance(prefix, str) or not _IFNAME.fullmatch(prefix) or len(prefix) >= IFNAME_MAX_BYTES:
        raise UnsafeNftText(f"interface prefix {str(prefix)[:40]!r} is not one nft text can hold")
    return '"' + prefix + '*"'


def address(text: str) -> str:
    """An IPv4 or IPv6 address, canonical. An IPv6 zone (`fe80::1%eth0`: `ipaddress` takes any
    text after the `%`, a newline included) is refused: nft holds none, and the zone would be
    written into the batch as it came."""
    try:
        parsed = ipaddress.ip_address(text)
    except ValueError as error:
        raise UnsafeNftText(f"not an IP address: {str(text)[:60]!r}") from error
    return _unscoped(str(parsed), getattr(parsed, "scope_id", None), text)


def network(text: str) -> str:
    """A network (`10.0.0.0/8`), canonical; host bits set are refused, and so is a zone."""
    try:
        parsed = ipaddress.ip_network(text, strict=True)
    except (ValueError, TypeError) as error:
        raise UnsafeNftText(f"not a network: {str(text)[:60]!r}") from error
    return _unscoped(str(parsed), getattr(parsed.network_address, "scope_id", None), text)


def _unscoped(canonical: str, scope: str | None, given: object) -> str:
    """`canonical` if it is an address or network with no zone and only the characters one
    can hold (hex digits, `.`, `:`, `/`): what reaches nft text, whatever `ipaddress` allows."""
    if scope is not None or not _ADDRESS_TEXT.fullmatch(canonical):
        raise UnsafeNftText(f"{str(given)[:60]!r} has an IPv6 zone (or characters no address has): "
                            f"nft text holds none")
    return canonical


def port(value: int) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise UnsafeNftText(f"not a port number: {value!r}")
    return str(value)


def number(value: int) -> str:
    """A non-negative integer (marks, numgen results, sizes)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2 ** 32:
        raise UnsafeNftText(f"not a 32-bit unsigned number: {value!r}")
    return str(value)


def protocol(value: str) -> str:
    lowered = str(value).lower()
    if lowered not in PROTOCOLS:
        raise UnsafeNftText(f"not a protocol of ours: {str(value)[:20]!r} (one of {', '.join(PROTOCOLS)})")
    return lowered


def jump(chain: str) -> str:
    return "jump " + name(chain)


def goto(chain: str) -> str:
    return "goto " + name(chain)


def concat(parts: Iterable[str]) -> str:
    """A concatenated key or value (`10.0.0.1 . tcp . 80`), parts already rendered."""
    joined = " . ".join(parts)
    if not joined:
        raise UnsafeNftText("an empty concatenation")
    return joined


def element(key: str, value: str | None = None) -> str:
    """One set element (`key`) or map element (`key : value`), both already rendered."""
    return key if value is None else f"{key} : {value}"


def element_block(elements: Iterable[str]) -> str:
    """`{ a, b, c }` from rendered elements; UnsafeNftText for none (nft refuses `{ }`)."""
    items = list(elements)
    if not items:
        raise UnsafeNftText("an empty element list (nft refuses `{ }`)")
    return "{ " + ", ".join(items) + " }"
