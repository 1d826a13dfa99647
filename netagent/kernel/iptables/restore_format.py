"""The iptables-restore / iptables-save text format: tokens, parsed tables, a builder.

Shared by everything that reads or writes rules: the renderers build restore text with
`RestoreBuilder`, the runner and the agent read the kernel's state with `parse_save`, and
`FakeIptables` executes `parse_restore`'s blocks, so the fake is judged on exactly the text
the real tools would be given.

Facts about the format this module encodes (measured with iptables 1.8.9, both backends):
- a table block is `*table`, then `:CHAIN POLICY [packets:bytes]` lines and commands
  (`-A -I -D -R -N -X -F -P -Z`), then `COMMIT`; lines end at `\\n` only, and a NUL ends a
  line's text; a line that is empty, or whose FIRST character is `#`, is skipped (` #x` is
  a command, and fails); `*`, `:` and `COMMIT` count only in the first column, `COMMIT`
  only with nothing after it (`COMMIT ` and `COMMIT\\r` are commands, and fail); a line of
  blanks inside a table fails ("no command specified"); `*` and `:` lines are split on
  space/tab without quotes (`:"X" -` declares a chain named `"X"`), and a `:` line ignores
  what follows its policy;
- rule lines are tokenized as `tokens.split_tokens` says (double quotes, backslash escapes
  only inside them, no other whitespace than space/tab/newline); single quotes are not quotes;
- iptables-save prints a rule's address and interface options first, in the order
  `-s -d -i -o -p -f`, writes bare host addresses as `/32` (`/128`) and sorts user chains
  by name. `canonical_spec` reproduces the first two so specs compare equal to saved ones.

Rules are kept as tuples of tokens (the spec after `-A CHAIN`) and compared as tuples,
never as text, so quoting differences (`x` vs `"x"`) do not look like drift.
"""
from __future__ import annotations

import enum
import functools
import ipaddress
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from netagent.kernel.iptables.arguments import TARGET_OPTIONS, argument_problem
from netagent.kernel.iptables.tokens import (
    COMMENT_MAX_BYTES,
    RULE_MAX_TOKENS,
    TOKEN_MAX_BYTES,
    comment_text,
    join_tokens,
    quote_comment,
    quote_token,
    save_comment,
    save_token,
    spec_text,
    split_tokens,
    utf8_length,
)
from netagent.errors import NetagentError

__all__ = ["join_tokens", "quote_comment", "quote_token", "split_tokens"]  # re-exported

MAX_CHAIN_NAME_LENGTH = 28

BUILTIN_CHAINS: dict[str, tuple[str, ...]] = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "raw": ("PREROUTING", "OUTPUT"),
    "security": ("INPUT", "FORWARD", "OUTPUT"),
}
BUILTIN_POLICIES = ("ACCEPT", "DROP")
USER_CHAIN_POLICY = "-"

_COUNTERS = re.compile(r"\[\d+:\d+\]")
_HEADER_OPTIONS = {"-s": "-s", "--source": "-s", "--src": "-s",
                   "-d": "-d", "--destination": "-d", "--dst": "-d",
                   "-i": "-i", "--in-interface": "-i",
                   "-o": "-o", "--out-interface": "-o",
                   "-p": "-p", "--protocol": "-p"}
_HEADER_ORDER = ("-s", "-d", "-i", "-o", "-p", "-f")
_TARGET_OPTIONS = TARGET_OPTIONS


class RestoreSyntaxError(NetagentError, ValueError):
    """Text the restore tools would reject before touching any table."""

    def __init__(self, message: str, *, line_number: int, line: str):
        super().__init__(f"line {line_number}: {message}: {line!r}")
        self.message = message
        self.line_number = line_number
        self.line = line


class Op(enum.Enum):
    DECLARE = ":"
    APPEND = "-A"
    INSERT = "-I"
    DELETE = "-D"
    REPLACE = "-R"
    NEW_CHAIN = "-N"
    DELETE_CHAIN = "-X"
    FLUSH = "-F"
    POLICY = "-P"
    ZERO = "-Z"


_OP_SPELLINGS = {
    "-A": Op.APPEND, "--append": Op.APPEND, "-I": Op.INSERT, "--insert": Op.INSERT,
    "-D": Op.DELETE, "--delete": Op.DELETE, "-R": Op.REPLACE, "--replace": Op.REPLACE,
    "-N": Op.NEW_CHAIN, "--new-chain": Op.NEW_CHAIN, "--new": Op.NEW_CHAIN,
    "-X": Op.DELETE_CHAIN, "--delete-chain": Op.DELETE_CHAIN, "-F": Op.FLUSH, "--flush": Op.FLUSH,
    "-P": Op.POLICY, "--policy": Op.POLICY, "-Z": Op.ZERO, "--zero": Op.ZERO,
}
_CHAIN_OPTIONAL = {Op.DELETE_CHAIN, Op.FLUSH, Op.ZERO}


@dataclass(frozen=True)
class Entry:
    """One line of a table block. `spec` is the rule after the chain (and position)."""
    line_number: int
    text: str
    op: Op
    chain: str | None
    spec: tuple[str, ...] = ()
    position: int | None = None
    policy: str | None = None


@dataclass
class TableBlock:
    name: str
    line_number: int
    entries: list[Entry]
    commit_line_number: int


@dataclass
class Chain:
    name: str
    policy: str  # ACCEPT/DROP for built-in chains, "-" for user chains
    rules: list[tuple[str, ...]] = field(default_factory=list)

    @property
    def builtin(self) -> bool:
        return self.policy != USER_CHAIN_POLICY


@dataclass
class Table:
    name: str
    chains: dict[str, Chain] = field(default_factory=dict)

    @classmethod
    def pristine(cls, name: str) -> Table:
        """A table as the kernel creates it: built-in chains, policy ACCEPT, no rules."""
        return cls(name, {chain: Chain(chain, "ACCEPT") for chain in BUILTIN_CHAINS[name]})

    def clone(self) -> Table:
        """A copy whose chains can be changed freely (rules are immutable tuples)."""
        return Table(self.name, {name: Chain(name, chain.policy, list(chain.rules))
                                 for name, chain in self.chains.items()})

    def user_chains(self) -> list[str]:
        return [name for name, chain in self.chains.items() if not chain.builtin]

    def references_to(self, target: str) -> list[tuple[str, tuple[str, ...]]]:
        """Every (chain, spec) whose jump or goto names `target`."""
        return [(chain.name, spec) for chain in self.chains.values() for spec in chain.rules
                if jump_target(spec) == target]


# ---- tokens: netagent/kernel/iptables/tokens.py --------------------------------------------

def jump_target(spec: Sequence[str]) -> str | None:
    """The chain or target a rule jumps or goes to (None for a rule without target)."""
    index = _target_index(spec)
    return spec[index + 1] if index is not None and index + 1 < len(spec) else None


def is_goto(spec: Sequence[str]) -> bool:
    index = _target_index(spec)
    return index is not None and spec[index] in ("-g", "--goto")


def _target_index(spec: Sequence[str]) -> int | None:
    """Where `-j`/`-g` is, skipping a comment's value (`--comment -j` is a comment, as getopt
    hands an option's required argument over whatever it looks like)."""
    found: int | None = None
    for option in _TARGET_OPTIONS:
        if option not in spec:
            continue
        index: int | None = spec.index(option)
        while index and spec[index - 1] == "--comment":
            index = spec.index(option, index + 1) if option in spec[index + 1:] else None
        if index is not None:
            found = index if found is None else min(found, index)
    return found


def canonical_spec(spec: Sequence[str]) -> tuple[str, ...]:
    """The spec as iptables-save prints it once we wrote it: header options first in save's
    order, short option names, host addresses with a prefix length, each comment in
    `comment_text`'s safe form (what `join_tokens` writes). Other options keep their order,
    and everything after `-j TARGET` belongs to the target (e.g. SNAT's `--to-source`)."""
    return _canonical(spec, comment_text)


def stored_spec(spec: Sequence[str]) -> tuple[str, ...]:
    """The spec as the kernel keeps what the tool was given (the fake's view): like
    `canonical_spec`, but each comment only cut to 255 bytes, as xt_comment does, even
    inside a UTF-8 character (the cut bytes stay as surrogate escapes)."""
    return _canonical(spec, _kernel_comment)


def _kernel_comment(text: str) -> str:
    if utf8_length(text) <= COMMENT_MAX_BYTES:
        return text
    return text.encode("utf-8", "surrogateescape")[:COMMENT_MAX_BYTES].decode("utf-8", "surrogateescape")


def _canonical(spec: Sequence[str], comment) -> tuple[str, ...]:
    header: dict[str, tuple[str, ...]] = {}
    rest: list[str] = []
    index, count, in_target = 0, len(spec), False
    while index < count:
        token = spec[index]
        if in_target:
            rest.append(token)
            index += 1
            continue
        negated = token == "!" and index + 1 < count
        option_at = index + 1 if negated else index
        option = spec[option_at]
        name = _HEADER_OPTIONS.get(option)
        if name is not None and option_at + 1 < count:
            value = spec[option_at + 1]
            if name in ("-s", "-d"):
                value = _with_prefix_length(value)
            header[name] = (("!",) if negated else ()) + (name, value)
            index = option_at + 2
        elif option in ("-f", "--fragment"):
            header["-f"] = (("!",) if negated else ()) + ("-f",)
            index = option_at + 1
        elif token == "--comment" and index + 1 < count:
            rest += (token, comment(spec[index + 1]))
            index += 2
        else:
            in_target = token in _TARGET_OPTIONS
            rest.append(token)
            index += 1
    if not header:
        return tuple(rest)
    ordered = [token for name in _HEADER_ORDER if name in header for token in header[name]]
    return tuple(ordered + rest)


@functools.lru_cache(maxsize=65536)
def _with_prefix_length(value: str) -> str:
    try:
        return str(ipaddress.ip_network(value, strict=False))
    except ValueError:
        return value


# ---- restore text -> blocks --------------------------------------------------------------

def parse_restore(text: str) -> Iterator[TableBlock]:
    """Yield table blocks in order, lazily: like the real tool, a syntax error in a later
    block is only raised after the earlier blocks were handed out (and committed). Lines are
    read as iptables-restore reads them (see the module docstring)."""
    block: TableBlock | None = None
    for line_number, raw, line in _restore_lines(text):
        if not raw or line.startswith("#"):
            continue
        if line.startswith("*") and block is None:
            name = _first_words(line[1:], 1)
            if not name:
                raise RestoreSyntaxError("table name invalid", line_number=line_number, line=raw)
            block = TableBlock(name[0], line_number, [], 0)
            continue
        if block is None:
            raise RestoreSyntaxError("line outside a table block", line_number=line_number, line=raw)
        if line.rstrip("\n") == "COMMIT":
            block.commit_line_number = line_number
            yield block
            block = None
            continue
        block.entries.append(_parse_entry(line, line_number=line_number, raw=raw))
    if block is not None:
        raise RestoreSyntaxError("COMMIT expected", line_number=block.line_number, line=f"*{block.name}")


def _restore_lines(text: str) -> Iterator[tuple[int, str, str]]:
    """(number, line without its newline, what the tool sees: the text up to a NUL, with the
    newline the line was read with)."""
    lines = text.split("\n")
    last = len(lines) - 1
    for index, raw in enumerate(lines):
        if index == last and not raw:
            return
        line = raw + "\n" if index < last else raw
        if "\0" in line:
            line = line.split("\0", 1)[0]
        yield index + 1, raw, line


def _first_words(text: str, count: int) -> list[str]:
    """strtok(" \\t\\n"): the first `count` words, no quoting."""
    return [word for word in re.split("[ \t\n]+", text, maxsplit=count) if word][:count]


def _parse_entry(line: str, *, line_number: int, raw: str) -> Entry:
    def fail(message: str) -> RestoreSyntaxError:
        return RestoreSyntaxError(message, line_number=line_number, line=raw)

    if line.startswith(":"):
        parts = _first_words(line[1:], 2)
        if not parts:
            raise fail("chain name invalid")
        if len(parts) < 2:
            raise fail("policy invalid")
        return Entry(line_number, raw, Op.DECLARE, parts[0], policy=parts[1])
    tokens = split_tokens(line)
    if not tokens:
        raise fail("no command specified")
    if len(tokens) > RULE_MAX_TOKENS:
        raise fail("Parser cannot handle more arguments")
    if any(len(token) > TOKEN_MAX_BYTES // 4 and utf8_length(token) > TOKEN_MAX_BYTES for token in tokens):
        raise fail("Parameter too long!")
    if tokens and _COUNTERS.fullmatch(tokens[0]):
        tokens = tokens[1:]
    if not tokens or tokens[0] not in _OP_SPELLINGS:
        raise fail("unknown command")
    op = _OP_SPELLINGS[tokens[0]]
    args = tokens[1:]
    if not args:
        if op in _CHAIN_OPTIONAL:
            return Entry(line_number, raw, op, None)
        raise fail("chain name missing")
    chain, args = args[0], args[1:]
    if op in (Op.NEW_CHAIN, Op.DELETE_CHAIN, Op.FLUSH, Op.ZERO):
        if args:
            raise fail(f"unexpected arguments after {tokens[0]} {chain}")
        return Entry(line_number, raw, op, chain)
    if op is Op.POLICY:
        if len(args) != 1:
            raise fail("-P needs exactly one policy")
        return Entry(line_number, raw, op, chain, policy=args[0])
    position = None
    if op in (Op.INSERT, Op.REPLACE) and args and _is_number(args[0]):
        position, args = int(args[0]), args[1:]
    elif op is Op.REPLACE:
        raise fail("-R needs a rule number")
    elif op is Op.DELETE and len(args) == 1 and _is_number(args[0]):
        return Entry(line_number, raw, op, chain, position=int(args[0]))
    if op is Op.INSERT and position is None:
        position = 1
    if position is not None and position < 1:
        raise fail("rule numbers start at 1")
    problem = argument_problem(args)
    if problem:
        raise fail(problem)
    return Entry(line_number, raw, op, chain, spec=tuple(args), position=position)


def _is_number(token: str) -> bool:
    return token.isascii() and token.isdigit()


# ---- save text <-> tables ------------------------------------------------------------------

def parse_save(text: str, *, skip_rules_of: str | None = None) -> dict[str, Table]:
    """Tables from `iptables-save` output (or restore text made only of declarations, rules
    appended with -A and COMMIT). Specs are kept as saved. Chains whose names start with
    `skip_rules_of` keep their names but not their rules (the cheap view a full sync needs).

    A loop of its own rather than `parse_restore`: save output is trusted and can be hundreds of
    thousands of lines, so this does the least per line. Lines end at `\\n` only: a
    comment may hold `\\r`, U+0085 or U+2028, which str.splitlines() would break."""
    tables: dict[str, Table] = {}
    table: Table | None = None
    skipped = f"-A {skip_rules_of}" if skip_rules_of else None
    lines = text.split("\n")
    for line_number, raw in enumerate(lines, start=1):
        line = raw.strip(" \t")
        if not line or line[0] == "#":
            continue
        if line[0] == "[":  # `iptables-save -c` puts [packets:bytes] before each rule
            line = line.partition("]")[2].strip(" \t")
        if line.startswith("-A "):
            if skipped is not None and line.startswith(skipped):
                continue
            try:
                _, chain, *spec = split_tokens(line)
                if table is None:
                    raise KeyError(chain)  # a rule outside a table: refused like one for an undeclared chain
                table.chains[chain].rules.append(tuple(spec))
            except (ValueError, KeyError):
                raise RestoreSyntaxError("rule for an undeclared chain or outside a table",
                                         line_number=line_number, line=raw) from None
        elif line[0] == ":" and table is not None:
            parts = _first_words(line[1:], 2)
            if len(parts) < 2:
                raise RestoreSyntaxError("chain declaration needs a name and a policy",
                                         line_number=line_number, line=raw)
            table.chains.setdefault(parts[0], Chain(parts[0], parts[1]))
        elif line[0] == "*" and table is None:
            name = line[1:]
            table = tables.setdefault(name, Table(name))
        elif line == "COMMIT" and table is not None:
            table = None
        else:
            raise RestoreSyntaxError("not save output", line_number=line_number, line=raw)
    if table is not None:
        raise RestoreSyntaxError("COMMIT expected", line_number=len(lines), line=f"*{table.name}")
    return tables


def render_save(tables: Iterable[Table]) -> str:
    """Save text: built-in chains first in kernel order, then user chains by name."""
    lines: list[str] = []
    for table in tables:
        lines.append(f"*{table.name}")
        builtin = [c for c in table.chains.values() if c.builtin]
        user = sorted((c for c in table.chains.values() if not c.builtin), key=lambda c: c.name)
        for chain in builtin + user:
            lines.append(f":{chain.name} {chain.policy} [0:0]")
        for chain in builtin + user:
            lines.extend(f"-A {chain.name} {_save_spec(spec)}".rstrip() for spec in chain.rules)
        lines.append("COMMIT")
    return "\n".join(lines) + "\n" if lines else ""



def _save_spec(spec: Sequence[str]) -> str:
    """A spec as iptables-save prints it: never refused, control characters as they are."""
    return spec_text(spec, plain=save_token, comment=save_comment)


# ---- building restore input ----------------------------------------------------------------

class RestoreBuilder:
    """Accumulates restore lines per table, in call order, and renders them with one
    `*table ... COMMIT` block per table (first use decides the order of tables).

    Built for size: the service proxy writes tens of thousands of lines per sync, so lines are
    collected in lists and joined once."""

    def __init__(self) -> None:
        self._tables: dict[str, list[str]] = {}

    def _lines(self, table: str) -> list[str]:
        return self._tables.setdefault(table, [])

    def declare_chain(self, table: str, chain: str) -> RestoreBuilder:
        """Create the user chain, or (with --noflush) empty it if it exists."""
        self._lines(table).append(f":{chain} {USER_CHAIN_POLICY} [0:0]")
        return self

    def append(self, table: str, chain: str, spec: Sequence[str]) -> RestoreBuilder:
        self._lines(table).append(f"-A {chain} {join_tokens(spec)}")
        return self

    def insert(self, table: str, chain: str, spec: Sequence[str], *, position: int = 1) -> RestoreBuilder:
        self._lines(table).append(f"-I {chain} {position} {join_tokens(spec)}")
        return self

    def delete(self, table: str, chain: str, spec: Sequence[str]) -> RestoreBuilder:
        self._lines(table).append(f"-D {chain} {join_tokens(spec)}")
        return self

    def flush_chain(self, table: str, chain: str) -> RestoreBuilder:
        self._lines(table).append(f"-F {chain}")
        return self

    def delete_chain(self, table: str, chain: str) -> RestoreBuilder:
        self._lines(table).append(f"-X {chain}")
        return self

    def __bool__(self) -> bool:
        return any(self._tables.values())

    def text(self) -> str:
        out: list[str] = []
        for table, lines in self._tables.items():
            if lines:
                out.append(f"*{table}")
                out.extend(lines)
                out.append("COMMIT")
        return "\n".join(out) + "\n" if out else ""
