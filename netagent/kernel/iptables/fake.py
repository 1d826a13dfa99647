"""`FakeIptables`: an in-memory iptables that executes restore input like the real tools.

It implements the `Iptables` primitives (restore, save) over tables -> chains -> rules, so
everything built on them (jump repair, chain removal, the masquerade manager, next the
service proxy) is unit-tested without root. What it checks is what the real tools reject,
each case measured on iptables 1.8.9 with both backends:

- a table block is applied to a copy and committed at `COMMIT`, so a failing block leaves
  its table untouched; blocks before it stay committed (the real tools commit per table too,
  so a restore spanning tables is not all-or-nothing, and neither is this);
- `--noflush`: a `:CHAIN` line creates a user chain or empties it, a built-in chain only gets
  its policy; chains not mentioned keep their rules. Without it, each table named is emptied
  (user chains deleted, built-in chains flushed) before its block runs; the nft backend
  also resets built-in policies to ACCEPT there (it recreates the table), legacy keeps them;
- `-j`/`-g` must name a known target or a user chain that exists at that line (a chain
  declared further down does not count); `-g` only to user chains; one target per rule;
- `-X` of a built-in, missing, non-empty or still-referenced chain fails; `-N` of an existing
  chain fails; `-D` of a rule not there fails; `-I`/`-R`/`-D` numbers must be in range;
- chain names: at most 28 characters, not a target's name, not starting with `-` or `!`;
- a NAT target naming a port (`--to-destination 10.0.0.1:53`, `--to-ports`) needs `-p`;
- targets restricted to tables and hooks (MASQUERADE only reachable from nat POSTROUTING,
  DNAT from PREROUTING/OUTPUT, REJECT only in filter, ...) and loops reachable from a
  built-in chain fail at COMMIT, as the kernel checks them when the table is replaced;
- unknown tables fail.

Restore input is read as the real tools read it (`restore_format.parse_restore`, tokens by
`tokens.split_tokens`: an unterminated quote is accepted and keeps the newline, a NUL ends a
line, only space/tab/newline separate), checked in tests/netns/test_restore_parity.py against
both real backends on the same inputs. Specs are stored in `stored_spec` form, so `save()`
prints `-s 10.0.0.1/32` for `-s 10.0.0.1` and a comment cut to 255 bytes, as the real tools
do; `save()` prints tokens as iptables-save does, control characters included.

Not modelled: match option validation (the fake accepts any `-m` options), implicit `-m tcp`
after `-p tcp --dport`, counters, legacy's silence about a final `COMMIT` without a newline
(nft commits it, and so does the fake), lines over the tools' 10 KiB read buffer.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from netagent.kernel.families import IpFamily
from netagent.kernel.iptables.backend import IptablesBackend
from netagent.kernel.iptables.restore_format import (
    BUILTIN_CHAINS,
    BUILTIN_POLICIES,
    MAX_CHAIN_NAME_LENGTH,
    USER_CHAIN_POLICY,
    Chain,
    Entry,
    Op,
    RestoreSyntaxError,
    Table,
    TableBlock,
    is_goto,
    jump_target,
    parse_restore,
    render_save,
    stored_spec,
)
from netagent.kernel.iptables.runner import CounterMode, FlushMode, Iptables, IptablesError

STANDARD_TARGETS = frozenset({"ACCEPT", "DROP", "RETURN", "QUEUE"})


@dataclass(frozen=True)
class TargetLimits:
    tables: frozenset[str] | None = None   # None: any table
    hooks: frozenset[str] | None = None    # None: any hook


_ANY = TargetLimits()
EXTENSION_TARGETS: dict[str, TargetLimits] = {
    "MASQUERADE": TargetLimits(frozenset({"nat"}), frozenset({"POSTROUTING"})),
    "SNAT": TargetLimits(frozenset({"nat"}), frozenset({"POSTROUTING", "INPUT"})),
    "DNAT": TargetLimits(frozenset({"nat"}), frozenset({"PREROUTING", "OUTPUT"})),
    "REDIRECT": TargetLimits(frozenset({"nat"}), frozenset({"PREROUTING", "OUTPUT"})),
    "NETMAP": TargetLimits(frozenset({"nat"})),
    "REJECT": TargetLimits(frozenset({"filter"}), frozenset({"INPUT", "FORWARD", "OUTPUT"})),
    "CT": TargetLimits(frozenset({"raw"})),
    "NOTRACK": TargetLimits(frozenset({"raw"})),
    "TTL": TargetLimits(frozenset({"mangle"})),
    "TOS": TargetLimits(frozenset({"mangle"})),
    "DSCP": TargetLimits(frozenset({"mangle"})),
    "CHECKSUM": TargetLimits(frozenset({"mangle"})),
    "TPROXY": TargetLimits(frozenset({"mangle"}), frozenset({"PREROUTING"})),
    **{name: _ANY for name in ("MARK", "CONNMARK", "LOG", "NFLOG", "NFQUEUE", "TCPMSS", "SET",
                               "AUDIT", "CLASSIFY", "SECMARK", "CONNSECMARK", "TRACE", "TEE",
                               "IDLETIMER", "LED", "HMARK", "RATEEST", "SYNPROXY")},
}


@dataclass(frozen=True)
class RestoreRecord:
    """One call to `restore`, kept for tests (did the manager write? what?)."""
    text: str
    flush: FlushMode
    error: IptablesError | None


class _BlockFailed(Exception):
    def __init__(self, message: str, entry_or_line: Entry | tuple[int, str]):
        super().__init__(message)
        self.message = message
        if isinstance(entry_or_line, Entry):
            self.line_number, self.line = entry_or_line.line_number, entry_or_line.text
        else:
            self.line_number, self.line = entry_or_line


class FakeIptables(Iptables):
    """In-memory iptables for one backend and family; `restores` records every call."""

    def __init__(self, *, backend: IptablesBackend = IptablesBackend.NFT,
                 family: IpFamily = IpFamily.V4, version: tuple[int, ...] = (1, 8, 9)):
        self.backend = backend
        self.family = family
        self._version = tuple(version)
        self._tables = {name: Table.pristine(name) for name in BUILTIN_CHAINS}
        self.restores: list[RestoreRecord] = []

    @property
    def version(self) -> tuple[int, ...]:
        return self._version

    def save(self, table: str | None = None, *, counters: bool = False) -> str:
        """The fake counts nothing: with `counters`, every rule is led by `[0:0]`, as an idle kernel's."""
        if table is not None and table not in self._tables:
            raise IptablesError(f"table '{table}' does not exist")
        text = render_save(self._tables.values() if table is None else [self._tables[table]])
        if not counters:
            return text
        return "".join(f"[0:0] {line}" if line.startswith("-A ") else line for line in text.splitlines(True))

    def state(self) -> dict[str, Table]:
        """A copy of every table as held (not through save text, which a comment holding a
        newline breaks for the real tools and the fake alike)."""
        return {name: table.clone() for name, table in self._tables.items()}

    def restore(self, text: str, *, flush: FlushMode = FlushMode.NO_FLUSH,
                counters: CounterMode = CounterMode.ZERO) -> None:
        try:
            for block in parse_restore(text):
                self._tables[block.name] = self._run_block(block, flush=flush)
        except RestoreSyntaxError as error:
            self._fail(text, flush, IptablesError(error.message, line_number=error.line_number,
                                                  line=error.line))
        except _BlockFailed as failure:
            self._fail(text, flush, IptablesError(failure.message, line_number=failure.line_number,
                                                  line=failure.line))
        self.restores.append(RestoreRecord(text, flush, None))

    def _fail(self, text: str, flush: FlushMode, error: IptablesError) -> None:
        self.restores.append(RestoreRecord(text, flush, error))
        raise error

    # ---- one table block ----------------------------------------------------------------

    def _run_block(self, block: TableBlock, *, flush: FlushMode) -> Table:
        if block.name not in self._tables:
            raise _BlockFailed(f"table '{block.name}' does not exist", (block.line_number, f"*{block.name}"))
        table = self._tables[block.name].clone()
        if flush is FlushMode.FLUSH_TABLES and self.backend is IptablesBackend.NFT:
            table = Table.pristine(block.name)
        elif flush is FlushMode.FLUSH_TABLES:
            for name in table.user_chains():
                del table.chains[name]
            for chain in table.chains.values():
                chain.rules.clear()
        for entry in block.entries:
            _apply(table, entry)
        problem = _commit_problem(table)
        if problem:
            raise _BlockFailed(problem, (block.commit_line_number, "COMMIT"))
        return table


def _apply(table: Table, entry: Entry) -> None:
    def fail(message: str) -> _BlockFailed:
        return _BlockFailed(message, entry)

    op, name = entry.op, entry.chain
    chain = table.chains.get(name) if name else None
    if op is Op.DECLARE:
        assert name is not None, "a :CHAIN line always names its chain"
        if name in BUILTIN_CHAINS[table.name]:
            if entry.policy != USER_CHAIN_POLICY:
                policy = _check_policy(entry.policy, fail)
                assert chain is not None, "a table always holds its built-in chains"
                chain.policy = policy
            return
        if entry.policy != USER_CHAIN_POLICY:
            raise fail(f"cannot set policy {entry.policy} on user chain {name}")
        _check_chain_name(name, fail)
        if chain is None:
            table.chains[name] = Chain(name, USER_CHAIN_POLICY)
        else:
            chain.rules.clear()
        return
    if op is Op.NEW_CHAIN:
        assert name is not None, "the parser refuses -N without a chain"
        _check_chain_name(name, fail)
        if chain is not None:
            raise fail("Chain already exists")
        table.chains[name] = Chain(name, USER_CHAIN_POLICY)
        return
    if name is not None and chain is None:
        raise fail(f"chain {name} does not exist")
    if op is Op.FLUSH:
        for flushed in [chain] if chain else table.chains.values():
            flushed.rules.clear()
    elif op is Op.ZERO:
        return
    elif op is Op.DELETE_CHAIN:
        for doomed in [name] if name else table.user_chains():
            _delete_chain(table, doomed, fail)
    else:
        assert chain is not None, "only -F, -X and -Z may leave out the chain"
        _apply_to_chain(table, chain, entry, fail)


def _apply_to_chain(table: Table, chain: Chain, entry: Entry, fail) -> None:
    """-P, -D and the rule writers (-A, -I, -R): commands on one existing chain."""
    op, name = entry.op, chain.name
    if op is Op.POLICY:
        if chain.builtin is False:
            raise fail(f"cannot set a policy on user chain {name}")
        chain.policy = _check_policy(entry.policy, fail)
    elif op is Op.DELETE:
        if entry.position is not None:
            if not 1 <= entry.position <= len(chain.rules):
                raise fail(f"no rule {entry.position} in {name}")
            del chain.rules[entry.position - 1]
        else:
            spec = stored_spec(entry.spec)
            if spec not in chain.rules:
                raise fail("Bad rule (does a matching rule exist in that chain?)")
            chain.rules.remove(spec)
    else:
        spec = stored_spec(entry.spec)
        _check_target(table, spec, fail)
        if op is Op.APPEND:
            chain.rules.append(spec)
            return
        position = entry.position
        assert position is not None, "the parser gives -I (1 by default) and -R a rule number"
        if op is Op.INSERT:
            if position > len(chain.rules) + 1:
                raise fail("Index of insertion too big")
            chain.rules.insert(position - 1, spec)
        elif op is Op.REPLACE:
            if not 1 <= position <= len(chain.rules):
                raise fail(f"no rule {position} in {name}")
            chain.rules[position - 1] = spec


def _check_policy(policy: str | None, fail) -> str:
    """The policy, if a built-in chain may take it."""
    if policy not in BUILTIN_POLICIES:
        raise fail(f"bad policy {policy}: built-in chains take ACCEPT or DROP")
    return policy


def _check_chain_name(name: str, fail) -> None:
    if len(name) > MAX_CHAIN_NAME_LENGTH:
        raise fail(f"chain name {name} too long ({MAX_CHAIN_NAME_LENGTH} chars max)")
    if not name or name[0] in "-!" or name in STANDARD_TARGETS or name in EXTENSION_TARGETS:
        raise fail(f"invalid chain name {name}")


def _check_target(table: Table, spec: Sequence[str], fail) -> None:
    target = jump_target(spec)
    if target is None:
        return
    known = target in STANDARD_TARGETS or target in EXTENSION_TARGETS
    if is_goto(spec) and known:
        raise fail(f"-g needs a user chain, not {target}")
    if target in STANDARD_TARGETS:
        return
    limits = EXTENSION_TARGETS.get(target)
    if limits is not None:
        if limits.tables is not None and table.name not in limits.tables:
            raise fail(f"{target} is only valid in the {'/'.join(sorted(limits.tables))} table")
        if _names_a_port(spec) and "-p" not in spec:
            raise fail("Need TCP, UDP, SCTP or DCCP with port specification")
        return
    chain = table.chains.get(target)
    if chain is None:
        raise fail(f"Chain '{target}' does not exist")
    if chain.builtin:
        raise fail(f"cannot jump to built-in chain {target}")


def _names_a_port(spec: Sequence[str]) -> bool:
    """DNAT/SNAT `ADDR:PORT` or `[ADDR6]:PORT`, MASQUERADE/REDIRECT `--to-ports`: the tools
    refuse these unless the rule names a protocol (`-p`, canonical form)."""
    for option, value in zip(spec, spec[1:]):
        if option == "--to-ports":
            return True
        if option in ("--to-destination", "--to-source"):
            address = value.rsplit("]", 1)[-1] if value.startswith("[") else value
            if ":" in address and (value.startswith("[") or address.count(":") == 1):
                return True
    return False


def _delete_chain(table: Table, name: str, fail) -> None:
    chain = table.chains.get(name)
    if chain is None:
        raise fail(f"chain {name} does not exist")
    if chain.builtin:
        raise fail(f"cannot delete built-in chain {name}")
    if chain.rules:
        raise fail(f"chain {name} is not empty")
    holders = sorted({holder for holder, _ in table.references_to(name)})
    if holders:
        raise fail(f"chain {name} is busy: referenced from {', '.join(holders)}")
    del table.chains[name]


def _commit_problem(table: Table) -> str | None:
    """What the kernel refuses when the table is replaced: a loop reachable from a built-in
    chain, or a target reachable from a hook it does not allow."""
    hooks_reaching: dict[str, set[str]] = {}
    for hook in BUILTIN_CHAINS[table.name]:
        loop = _walk(table, hook, hook, path=[], reached=hooks_reaching)
        if loop:
            return f"loop between chains: {' -> '.join(loop)}"
    for chain in table.chains.values():
        for spec in chain.rules:
            limits = EXTENSION_TARGETS.get(jump_target(spec) or "")
            if limits is None or limits.hooks is None:
                continue
            bad = hooks_reaching.get(chain.name, set()) - limits.hooks
            if bad:
                return (f"{jump_target(spec)} in chain {chain.name} is reachable from "
                        f"{', '.join(sorted(bad))}; it is only valid from {', '.join(sorted(limits.hooks))}")
    return None


def _walk(table: Table, hook: str, chain: str, *, path: list[str],
          reached: dict[str, set[str]]) -> list[str] | None:
    if chain in path:
        return path[path.index(chain):] + [chain]
    seen = reached.setdefault(chain, set())
    if hook in seen:
        return None
    seen.add(hook)
    path.append(chain)
    for spec in table.chains[chain].rules:
        target = jump_target(spec)
        if target in table.chains and not table.chains[target].builtin:
            loop = _walk(table, hook, target, path=path, reached=reached)
            if loop:
                return loop
    path.pop()
    return None
