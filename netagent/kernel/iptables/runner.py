"""The iptables interface and its real implementation, `IptablesRunner`.

`Iptables` has two primitives, `restore` (iptables-restore, atomic per table) and `save`
(iptables-save), and builds every other operation on them, so `FakeIptables` and the runner
share one implementation of `ensure_jump`, `delete_chains` and `delete_owned`, and the
unit tests that run against the fake exercise the exact code the agent runs.

Jump rules in built-in chains are repaired with restore too, not with `iptables -C`/`-I`:
the current chain is read with save, and when the jump is missing, duplicated, altered or
no longer on top, one restore deletes every jump to our chain (by its saved spec) and
inserts the wanted one. That is a single transaction, so the chain never goes through a
moment without the jump (as `-D` then `-I` would) nor with two; `-C` answers only "present
or not", while "exactly once, on top" needs the chain's content, which save gives in one
call; and it needs only the two primitives the fake implements. Deleting by spec rather than
by rule number means a rule someone else inserted meanwhile can make our restore fail, never
make it delete their rule.

Restore input is atomic per table, not per call: the real tools commit each `*table` block
at its COMMIT, so when a later block fails the earlier ones stay applied (measured on both
backends). Callers that span tables re-run the whole input after a failure; it is idempotent.
Avoid `-R` of a rule added earlier in the same input: iptables-nft-restore 1.8.9 crashes on it.

"At the top" means no rule that is not ours comes before the jump: two of our jumps that both
want the top of a chain (masquerade and, later, the service proxy) then do not fight over
position 1 on every sync.

`IptablesRunner` runs the `<family>-<backend>-restore/-save` binaries with an optional argv
prefix (`ip netns exec NAME`), waits for the xtables lock (`-w`), bounds every call with a
timeout, and turns a failed restore into an `IptablesError` naming the line that failed.
"""
from __future__ import annotations

import abc
import enum
import re
import subprocess
from collections.abc import Iterable, Sequence

from netagent.kernel import owned
from netagent.kernel.iptables.backend import (
    IpFamily,
    IptablesBackend,
    IptablesTool,
    binary_name,
    require_binaries,
)
from netagent.kernel.iptables.restore_format import (
    RestoreBuilder,
    RestoreSyntaxError,
    Table,
    canonical_spec,
    jump_target,
    parse_save,
    split_tokens,
)
from netagent.kernel.iptables.tokens import run_tool
from netagent.errors import NetagentError

OWNED_PREFIX = owned.CHAIN_PREFIX
RANDOM_FULLY_SINCE = (1, 6, 2)


class FlushMode(enum.Enum):
    NO_FLUSH = "noflush"          # tables named in the input keep everything not mentioned
    FLUSH_TABLES = "flush"        # tables named in the input are emptied first


class CounterMode(enum.Enum):
    ZERO = "zero"                 # new rules start at [0:0]
    FROM_INPUT = "from-input"     # `--counters`: take [packets:bytes] from the input


class JumpPosition(enum.Enum):
    FIRST = "first"               # before every rule that is not ours
    LAST = "last"                 # after every rule that is not ours


class PortRandomization(enum.Enum):
    """How a MASQUERADE rule picks source ports; `Iptables.supports_random_fully` says which
    one this iptables can write. Shared by every writer of MASQUERADE rules (the pod egress
    masquerade, the service proxy)."""
    FULLY = "fully"                 # MASQUERADE --random-fully
    KERNEL_DEFAULT = "default"      # keep the source port when free (old iptables)

    @property
    def target(self) -> tuple[str, ...]:
        """The MASQUERADE target with this choice, as the arguments after `-j`."""
        return ("MASQUERADE", "--random-fully") if self is PortRandomization.FULLY else ("MASQUERADE",)


class IptablesError(NetagentError, RuntimeError):
    """A restore or save that failed; names the input line when the tool said which."""

    def __init__(self, message: str, *, line_number: int | None = None, line: str | None = None,
                 command: Sequence[str] = (), returncode: int | None = None):
        self.message = message
        self.line_number = line_number
        self.line = line
        self.command = list(command)
        self.returncode = returncode
        where = f" at line {line_number}" if line_number is not None else ""
        shown = f" ({line.strip()})" if line else ""
        tool = f"{_tool_name(command)}: " if command else ""
        super().__init__(f"{tool}restore failed{where}{shown}: {message}" if line_number is not None
                         else f"{tool}{message}")


def _tool_name(command: Sequence[str]) -> str:
    return next((part for part in command if "tables" in part), command[0])


class Iptables(abc.ABC):
    """One backend and family of iptables: the two primitives and what is built on them."""

    backend: IptablesBackend
    family: IpFamily

    @abc.abstractmethod
    def restore(self, text: str, *, flush: FlushMode = FlushMode.NO_FLUSH,
                counters: CounterMode = CounterMode.ZERO) -> None:
        """Apply restore input; raise IptablesError. Each table block is atomic."""

    @abc.abstractmethod
    def save(self, table: str | None = None, *, counters: bool = False) -> str:
        """Save text of one table, or of every table present; with `counters`, each rule
        led by its `[packets:bytes]` (`iptables-save -c`)."""

    @property
    @abc.abstractmethod
    def version(self) -> tuple[int, ...]:
        """The iptables userspace version, e.g. (1, 8, 9)."""

    @property
    def supports_random_fully(self) -> bool:
        """MASQUERADE --random-fully: iptables 1.6.2 and any kernel we run on (3.13+)."""
        return self.version >= RANDOM_FULLY_SINCE

    @property
    def port_randomization(self) -> PortRandomization:
        """The best MASQUERADE port choice this iptables can write."""
        return PortRandomization.FULLY if self.supports_random_fully else PortRandomization.KERNEL_DEFAULT

    def tables(self, table: str | None = None) -> dict[str, Table]:
        try:
            return parse_save(self.save(table))
        except RestoreSyntaxError as error:
            raise IptablesError(f"cannot parse save output: {error}") from None

    def table(self, name: str) -> Table:
        return self.tables(name).get(name) or Table(name)

    def list_chains(self, table: str, *, prefix: str = OWNED_PREFIX) -> set[str]:
        return {name for name in self.table(table).chains if name.startswith(prefix)}

    def ensure_jump(self, table: str, chain: str, target: str, *, comment: str,
                    position: JumpPosition = JumpPosition.FIRST, match: Sequence[str] = ()) -> bool:
        """Make `chain` (usually built-in) jump to our `target` exactly once, at `position`,
        with `comment`. Returns whether anything was written."""
        spec = jump_spec(target, comment=comment, match=match)
        current = self.table(table)
        if not jump_drift(current, chain, spec, position=position):
            return False
        builder = RestoreBuilder()
        add_jump_repair(builder, current, chain, spec, position=position)
        self.restore(builder.text())
        return True

    def delete_chains(self, table: str, chains: Iterable[str]) -> bool:
        """Remove the chains and every rule that jumps to them; quiet when already gone.
        Returns whether anything was written."""
        builder = RestoreBuilder()
        add_chain_removal(builder, self.table(table), set(chains))
        if not builder:
            return False
        self.restore(builder.text())
        return True

    def delete_owned(self, *, prefix: str = OWNED_PREFIX, table: str | None = None) -> list[str]:
        """Remove every chain named with `prefix` and every jump to one, in every table
        present (or only in `table`), reading the kernel once. Returns `table/chain` for each
        chain removed."""
        if not prefix:
            raise ValueError("refusing to delete chains without a name prefix")
        builder = RestoreBuilder()
        removed: list[str] = []
        for name, held in self.tables(table).items():
            owned = {chain for chain in held.chains if chain.startswith(prefix)}
            add_chain_removal(builder, held, owned)
            removed.extend(f"{name}/{chain}" for chain in sorted(owned))
        if builder:
            self.restore(builder.text())
        return removed


# ---- pure helpers shared by every implementation -------------------------------------------

def jump_spec(target: str, *, comment: str, match: Sequence[str] = ()) -> tuple[str, ...]:
    if not target.startswith(OWNED_PREFIX):
        raise ValueError(f"jump target {target!r} is not ours (prefix {OWNED_PREFIX})")
    return canonical_spec((*match, "-m", "comment", "--comment", comment, "-j", target))


def jump_drift(table: Table, chain: str, spec: tuple[str, ...], *,
               position: JumpPosition) -> list[str]:
    """What is wrong with the jump `spec` in `chain`, as sentences (empty: nothing)."""
    target = jump_target(spec)
    where = f"{table.name} {chain}"
    if chain not in table.chains:
        return [f"{where}: chain does not exist"]
    rules = table.chains[chain].rules
    jumps = [index for index, rule in enumerate(rules) if jump_target(rule) == target]
    if not jumps:
        return [f"{where}: no jump to {target}"]
    problems = []
    if len(jumps) > 1:
        problems.append(f"{where}: {len(jumps)} jumps to {target}")
    if any(rules[index] != spec for index in jumps):
        problems.append(f"{where}: jump to {target} differs from the wanted rule")
    index = jumps[0]
    others = rules[:index] if position is JumpPosition.FIRST else rules[index + 1:]
    foreign = [rule for rule in others if not (jump_target(rule) or "").startswith(OWNED_PREFIX)]
    if foreign:
        side = "after" if position is JumpPosition.FIRST else "before"
        problems.append(f"{where}: jump to {target} comes {side} {len(foreign)} rule(s) not ours")
    return problems


def add_jump_repair(builder: RestoreBuilder, table: Table, chain: str, spec: tuple[str, ...], *,
                    position: JumpPosition) -> None:
    """Delete every jump to the spec's target in `chain` and add `spec` at `position`."""
    target = jump_target(spec)
    for rule in table.chains[chain].rules if chain in table.chains else ():
        if jump_target(rule) == target:
            builder.delete(table.name, chain, rule)
    if position is JumpPosition.FIRST:
        builder.insert(table.name, chain, spec, position=1)
    else:
        builder.append(table.name, chain, spec)


def add_chain_removal(builder: RestoreBuilder, table: Table, chains: set[str]) -> None:
    """Delete the rules (in chains not being removed) that jump to `chains`, then flush and
    delete `chains`. Chains absent from `table` are skipped."""
    present = sorted(chain for chain in chains if chain in table.chains and not table.chains[chain].builtin)
    if not present:
        return
    doomed = set(present)
    for name, holder in table.chains.items():
        if name in doomed:
            continue
        for rule in holder.rules:
            if jump_target(rule) in doomed:
                builder.delete(table.name, name, rule)
    for chain in present:
        builder.flush_chain(table.name, chain)
    for chain in present:
        builder.delete_chain(table.name, chain)


# ---- the real thing ------------------------------------------------------------------------

DEFAULT_TIMEOUT_SECONDS = 120.0
DEFAULT_LOCK_WAIT_SECONDS = 10


class IptablesRunner(Iptables):
    """Runs the host's iptables binaries for one backend and family.

    `exec_prefix` runs them elsewhere (`["ip", "netns", "exec", NAME]`); `timeout` bounds each
    call (an nft restore of thousands of services takes seconds, so the default is generous);
    `lock_wait_seconds` is passed to `-w` so a concurrent legacy writer makes us wait, not fail.
    """

    def __init__(self, *, backend: IptablesBackend, family: IpFamily = IpFamily.V4,
                 exec_prefix: Sequence[str] = (), timeout: float = DEFAULT_TIMEOUT_SECONDS,
                 lock_wait_seconds: int = DEFAULT_LOCK_WAIT_SECONDS):
        require_binaries(family, backend)
        self.backend = backend
        self.family = family
        self.exec_prefix = list(exec_prefix)
        self.timeout = timeout
        self.lock_wait_seconds = lock_wait_seconds
        self._version: tuple[int, ...] | None = None

    def _binary(self, tool: IptablesTool) -> str:
        return binary_name(self.family, self.backend, tool)

    def _run(self, argv: list[str], *, stdin: str | None = None) -> subprocess.CompletedProcess:
        command = [*self.exec_prefix, *argv]
        try:
            return run_tool(command, stdin=stdin, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise IptablesError(f"timed out after {self.timeout:g} s", command=command) from None

    def restore(self, text: str, *, flush: FlushMode = FlushMode.NO_FLUSH,
                counters: CounterMode = CounterMode.ZERO) -> None:
        argv = [self._binary(IptablesTool.RESTORE), "-w", str(self.lock_wait_seconds)]
        if flush is FlushMode.NO_FLUSH:
            argv.append("--noflush")
        if counters is CounterMode.FROM_INPUT:
            argv.append("--counters")
        done = self._run(argv, stdin=text)
        if done.returncode < 0:
            # Seen with iptables-nft-restore 1.8.9: `-R` of a rule added earlier in the same input.
            raise IptablesError(f"killed by signal {-done.returncode}; nothing was committed for the "
                                f"table being processed", command=[*self.exec_prefix, *argv],
                                returncode=done.returncode)
        if done.returncode != 0:
            line_number, line, message = explain_restore_failure(done.stderr, text)
            raise IptablesError(message, line_number=line_number, line=line,
                                command=[*self.exec_prefix, *argv], returncode=done.returncode)

    def save(self, table: str | None = None, *, counters: bool = False) -> str:
        argv = [self._binary(IptablesTool.SAVE)] + (["-c"] if counters else []) + (["-t", table] if table else [])
        done = self._run(argv)
        if done.returncode != 0:
            raise IptablesError(_first_message(done.stderr) or f"exit status {done.returncode}",
                                command=[*self.exec_prefix, *argv], returncode=done.returncode)
        return done.stdout

    @property
    def version(self) -> tuple[int, ...]:
        if self._version is None:
            done = self._run([self._binary(IptablesTool.MAIN), "--version"])
            found = re.search(r"v(\d+)\.(\d+)\.(\d+)", done.stdout + done.stderr)
            if not found:
                raise IptablesError(f"cannot read the iptables version from {done.stdout!r}")
            self._version = tuple(int(part) for part in found.groups())
        return self._version


# ---- reading the tools' complaints -----------------------------------------------------------

_LINE_NUMBER = re.compile(r"\bline:?\s*(\d+)")
_MISSING_CHAIN = re.compile(r"Chain '([^']+)' does not exist|Couldn't load target `([^']+)'")
_TOOL_PREFIX = re.compile(r"^\S*tables\S*(?: v[\d.]+(?: \([^)]*\))?)?:\s*")


def explain_restore_failure(stderr: str, text: str) -> tuple[int | None, str | None, str]:
    """(line number, that input line, message) from a failed restore's stderr.

    Both backends print the line (`Error occurred at line: N`, `line N failed`, `line N: ...`),
    but nft reports a jump to a missing chain at the block's COMMIT; that case is moved to the
    rule that names the chain, which is the line a person needs to see."""
    message = _first_message(stderr) or "iptables-restore failed"
    found = _LINE_NUMBER.search(stderr)
    if not found:
        return None, None, message
    line_number = int(found.group(1))
    lines = text.split("\n")
    line = lines[line_number - 1] if 0 < line_number <= len(lines) else None
    missing = _MISSING_CHAIN.search(stderr)
    if line is not None and line.strip() == "COMMIT" and missing:
        chain = missing.group(1) or missing.group(2)
        culprit = _rule_naming(lines, chain, before=line_number)
        if culprit is not None:
            line_number, line = culprit + 1, lines[culprit]
    return line_number, line, message


def _rule_naming(lines: list[str], chain: str, *, before: int) -> int | None:
    """Index of the last rule line before `before` (1-based) in the same block that jumps to `chain`."""
    for index in range(before - 2, -1, -1):
        stripped = lines[index].strip()
        if stripped.startswith("*"):
            return None
        if stripped.startswith("-"):
            try:
                tokens = split_tokens(stripped)
            except ValueError:
                continue
            if jump_target(tokens) == chain:
                return index
    return None


def _first_message(stderr: str) -> str:
    kept = []
    for raw in stderr.splitlines():
        line = _TOOL_PREFIX.sub("", raw.strip())
        if not line or line.startswith("Try `") or line.startswith("Error occurred at line"):
            continue
        kept.append(line)
    return "; ".join(kept)
