"""The ipset interface, `Ipset`, what is built on it, and its real implementation, `IpsetRunner`.

Why this shape. The service proxy's IPVS backend (and anything else that wants iptables rules
that stay constant while the things they match change) keeps the changing part in ipsets: the
rules say `-m set --match-set NETAGENT-IPVS-... dst,dst` and only set members move. So the
interface is about members: `members` reads a set, `update` adds and removes many members with
ONE `ipset restore -exist` exec (thousands of members in milliseconds, where one `ipset add`
per member costs an exec each), and `sync_set` reconciles a set with a desired member list,
writing nothing when they already agree (an agent restart adopts its sets with zero writes).
For many sets at once, `sync_sets` reads everything with one `ipset save` (`snapshot`) and
writes every difference, creates included, with one restore; `update_many` is `update` for
several sets in one exec. That is two execs per full sync of a backend's sets instead of a few
per set (each exec costs milliseconds on a host, a fifth of a second under the VM tier's TCG).
`replace_set` refills a set whose `maxelem` must change while rules match it: a scratch set
filled, then `swap`ped in (the rules keep the name and see the new contents at once).

`Ipset` is an ABC with a few primitives (list, describe, members, destroy, snapshot, swap, and
`_apply`: creates and member changes in one call; `read`, header and members at once, is one
exec in the runner); `ensure_set`, `update`, `update_many` and the functions below it are
written once on those, so `FakeIpset` (fake.py) runs the same decisions as the runner. Both validate every member with `model.canonical_member` BEFORE
writing, so a bad member fails the whole `update` with nothing applied (the real
`ipset restore` applies the lines before a bad one and stops there; measured on ipset 7.17).
The kernel errors left mid-restore are a full set, which both stop at in the same place, and
a set that vanished since it was read: the fake then applies nothing, while the real tool may
have applied some lines of other sets (it batches consecutive lines per set and drops the
pending batch on the error). Either way the caller has a failed write and re-syncs.

`ensure_set` creates a missing set; a set of the wrong type or family is recreated only when
nothing references it (the kernel refuses to destroy a set an iptables rule uses), otherwise
it is an `IpsetError`: silently emptying a set that live rules match would change traffic. A
different `maxelem` alone is left alone (it needs a recreate). Only our sets are written;
reads (`list_names`, `members`, `describe`) see every set.

`IpsetRunner` runs the `ipset` binary with a timeout, writing with the text of restore.py.
ipsets are per network namespace: `IpsetRunner(exec_prefix=["ip", "netns", "exec", NAME])`
works on another.
"""
from __future__ import annotations

import abc
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from netagent.kernel.ipset.model import (
    OWNED_PREFIX,
    IpsetError,
    IpsetInfo,
    IpsetNotInstalled,
    IpsetSpec,
    IpsetType,
    SetContents,
    canonical_change,
    canonical_member,
    spec_family,
    require_owned_name,
)
from netagent.kernel.ipset.restore import (
    parse_header,
    parse_list,
    parse_members,
    parse_save,
    restore_lines,
)
from netagent.kernel.iptables.tokens import run_tool

DEFAULT_TIMEOUT_SECONDS = 60.0


# ---- the interface -----------------------------------------------------------------------------

class Ipset(abc.ABC):
    """The sets of one network namespace. Subclasses provide the primitives; `ensure_set` and
    the validation of members are shared, so the fake runs the same decisions as the runner."""

    @abc.abstractmethod
    def list_names(self) -> list[str]:
        """Every set in the namespace, ours or not."""

    @abc.abstractmethod
    def describe(self, name: str) -> IpsetInfo | None:
        """The set's header, or None when it does not exist."""

    @abc.abstractmethod
    def members(self, name: str) -> frozenset[str]:
        """Canonical members; IpsetError when the set does not exist."""

    @abc.abstractmethod
    def destroy(self, name: str) -> None:
        """Remove one of our sets; quiet when absent; IpsetError when in use."""

    @abc.abstractmethod
    def snapshot(self) -> dict[str, SetContents]:
        """Every set with its type and members, in one read."""

    @abc.abstractmethod
    def swap(self, first: str, second: str) -> None:
        """Exchange two of our sets (`ipset swap`): names and the rules' references stay, the
        contents, `maxelem` included, trade places. IpsetError when either is missing or their
        type or family differ."""

    @abc.abstractmethod
    def _apply(self, *, create: Sequence[IpsetSpec] = (),
               changes: Mapping[str, tuple[Sequence[str], Sequence[str]]] = MappingProxyType({})) -> None:
        """In one call: create the sets in `create` (absent ones), then for each set in
        `changes` (name -> (add, remove), canonical members) remove, then add."""

    def read(self, name: str) -> tuple[IpsetInfo, frozenset[str]] | None:
        """The set's header and canonical members (`describe` and `members` at once), or None
        when it does not exist."""
        info = self.describe(name)
        return None if info is None else (info, self.members(name))

    def _create(self, spec: IpsetSpec) -> None:
        self._apply(create=[spec])

    def ensure_set(self, spec: IpsetSpec) -> None:
        info = self.describe(spec.name)
        if info is not None and info.type == spec.type and info.family == spec_family(spec):
            return
        if info is not None:
            if info.references:
                raise IpsetError(f"set {spec.name} is {info.type} family {info.family}, wanted "
                                 f"{spec.type.value}, and is in use ({info.references} references); "
                                 f"not recreating it")
            self.destroy(spec.name)
        self._create(spec)

    def update(self, name: str, *, add: Iterable[str] = (), remove: Iterable[str] = ()) -> None:
        """Add and remove members with one call; already present / already absent is fine.
        Every member is validated first: a bad one fails the call with nothing written."""
        require_owned_name(name)
        add, remove = list(add), list(remove)
        if not add and not remove:
            return
        info = self.describe(name)
        if info is None:
            raise IpsetError(f"set {name} does not exist")
        if not isinstance(info.type, IpsetType):
            raise IpsetError(f"set {name} has type {info.type}, which netagent does not write")
        self._apply(changes={name: canonical_change(name, info.type, add, remove)})

    def update_many(self, changes: Mapping[str, tuple[Iterable[str], Iterable[str]]], *,
                    types: Mapping[str, IpsetType] = MappingProxyType({})) -> None:
        """`update` for several sets (name -> (add, remove)) in one call. Types not given in
        `types` are read from the kernel; every member is validated before anything is written."""
        canonical = {}
        for name, (add, remove) in changes.items():
            require_owned_name(name)
            add, remove = list(add), list(remove)
            if not add and not remove:
                continue
            set_type: IpsetType | str | None = types.get(name)
            if set_type is None:
                info = self.describe(name)
                if info is None:
                    raise IpsetError(f"set {name} does not exist")
                set_type = info.type
            if not isinstance(set_type, IpsetType):
                raise IpsetError(f"set {name} has type {set_type}, which netagent does not write")
            canonical[name] = canonical_change(name, set_type, add, remove)
        if canonical:
            self._apply(changes=canonical)

    def owned_names(self, *, prefix: str = OWNED_PREFIX) -> list[str]:
        if not prefix.startswith(OWNED_PREFIX):
            raise ValueError(f"prefix {prefix!r} does not select only our sets")
        return sorted(name for name in self.list_names() if name.startswith(prefix))


def sync_sets(ipset: Ipset, wanted: Mapping[IpsetSpec, Iterable[str]], *,
              current: Mapping[str, SetContents] | None = None) -> dict[str, tuple[int, int]]:
    """`sync_set` for many sets with two calls (one read of everything, one restore that creates
    the missing sets and writes every difference); returns name -> (added, removed). A set of
    the wrong type goes through `ensure_set` (recreated when unused, else IpsetError). Pass
    `current` (a fresh `snapshot()`) when the caller has already read it."""
    desired = {spec: {canonical_member(spec.type, member) for member in members}
               for spec, members in wanted.items()}
    if current is None:
        current = ipset.snapshot()
    create, changes, counts = [], {}, {}
    for spec, members in desired.items():
        held = current.get(spec.name)
        if held is not None and (held.type != spec.type or held.family != spec_family(spec)):
            ipset.ensure_set(spec)
            held = SetContents(spec.name, spec.type, spec_family(spec), frozenset())
        if held is None:
            create.append(spec)
        present = held.members if held is not None else frozenset()
        to_add, to_remove = members - present, present - members
        counts[spec.name] = (len(to_add), len(to_remove))
        if to_add or to_remove:
            changes[spec.name] = (sorted(to_add), sorted(to_remove))
    if create or changes:
        ipset._apply(create=create, changes=changes)
    return counts


def sync_set(ipset: Ipset, spec: IpsetSpec, desired: Iterable[str]) -> tuple[int, int]:
    """Make the set exist with exactly `desired` members; returns (added, removed). Writes
    nothing when the kernel already agrees."""
    wanted = {canonical_member(spec.type, member) for member in desired}
    ipset.ensure_set(spec)
    present = ipset.members(spec.name)
    to_add, to_remove = wanted - present, present - wanted
    ipset.update(spec.name, add=to_add, remove=to_remove)
    return len(to_add), len(to_remove)


def replace_set(ipset: Ipset, spec: IpsetSpec, members: Iterable[str], *, scratch: str) -> None:
    """Make set `spec.name` hold exactly `members`, as `spec` is (its `maxelem` included, which
    the kernel cannot change in place), atomically for the rules that match it: a missing set is
    created filled by one restore; a held one gets a `scratch` set created and filled, swapped
    in (`swap`: a packet sees the old members or the new, never an empty set), and destroyed
    (it then holds the old ones). The held set must have `spec`'s type and family (IpsetError)."""
    require_owned_name(scratch)
    wanted = sorted({canonical_member(spec.type, member) for member in members})
    if ipset.describe(spec.name) is None:
        ipset._apply(create=[spec], changes={spec.name: (wanted, [])})
        return
    ipset.destroy(scratch)     # a leftover of an interrupted replace
    fresh = IpsetSpec(scratch, spec.type, spec.comment, spec.max_elements, spec.family)
    ipset._apply(create=[fresh], changes={scratch: (wanted, [])})
    ipset.swap(spec.name, scratch)
    ipset.destroy(scratch)


def delete_owned_sets(ipset: Ipset, *, prefix: str = OWNED_PREFIX) -> list[str]:
    """Destroy every set named with `prefix`; returns their names. Remove the iptables rules
    that use them first: a set in use raises IpsetError (after the others are destroyed)."""
    destroyed, busy = [], []
    for name in ipset.owned_names(prefix=prefix):
        try:
            ipset.destroy(name)
            destroyed.append(name)
        except IpsetError as error:
            busy.append(str(error))
    if busy:
        raise IpsetError("; ".join(busy))
    return destroyed


# ---- the real thing ----------------------------------------------------------------------------

_ABSENT = "does not exist"


class IpsetRunner(Ipset):
    """Runs the `ipset` binary (optionally inside a namespace via `exec_prefix`)."""

    def __init__(self, *, exec_prefix: Sequence[str] = (), binary: str = "ipset",
                 timeout: float = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.exec_prefix = list(exec_prefix)
        self.binary = binary
        self.timeout = timeout

    def _run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        command = [*self.exec_prefix, self.binary, *args]
        try:
            return run_tool(command, stdin=stdin, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise IpsetError(f"{' '.join(command[:6])}: timed out after {self.timeout:g} s") from None
        except FileNotFoundError:
            raise IpsetNotInstalled(f"{command[0]} is not installed") from None

    def _check(self, done: subprocess.CompletedProcess[str], what: str) -> None:
        if done.returncode != 0:
            raise IpsetError(f"{what}: {_message(done.stderr) or f'exit status {done.returncode}'}")

    def list_names(self) -> list[str]:
        done = self._run("list", "-n")
        self._check(done, "ipset list -n")
        return [line.strip() for line in done.stdout.splitlines() if line.strip()]

    def describe(self, name: str) -> IpsetInfo | None:
        done = self._run("list", "-t", name)
        if done.returncode != 0 and _ABSENT in done.stderr:
            return None
        self._check(done, f"ipset list -t {name}")
        return parse_header(done.stdout)

    def read(self, name: str) -> tuple[IpsetInfo, frozenset[str]] | None:
        done = self._run("list", name)     # one exec for both
        if done.returncode != 0 and _ABSENT in done.stderr:
            return None
        self._check(done, f"ipset list {name}")
        return parse_list(done.stdout)

    def members(self, name: str) -> frozenset[str]:
        done = self._run("save", name)
        self._check(done, f"ipset save {name}")
        return parse_members(done.stdout, name)

    def destroy(self, name: str) -> None:
        require_owned_name(name)
        done = self._run("destroy", name)
        if done.returncode != 0 and _ABSENT in done.stderr:
            return
        self._check(done, f"ipset destroy {name}")

    def snapshot(self) -> dict[str, SetContents]:
        done = self._run("save")
        self._check(done, "ipset save")
        return parse_save(done.stdout)

    def swap(self, first: str, second: str) -> None:
        require_owned_name(first)
        require_owned_name(second)
        self._check(self._run("swap", first, second), f"ipset swap {first} {second}")

    def _apply(self, *, create: Sequence[IpsetSpec] = (),
               changes: Mapping[str, tuple[Sequence[str], Sequence[str]]] = MappingProxyType({})) -> None:
        lines = restore_lines(create=create, changes=changes)
        if not lines:
            return
        done = self._run("restore", "-exist", stdin="\n".join(lines) + "\n")
        if done.returncode != 0:
            message = _message(done.stderr)
            found = re.search(r"Error in line (\d+):\s*(.*)", message)
            if found and 0 < int(found.group(1)) <= len(lines):
                message = f"line {found.group(1)} ({lines[int(found.group(1)) - 1]}): {found.group(2)}"
            raise IpsetError(f"ipset restore -exist: {message}")


def _message(stderr: str) -> str:
    kept = [re.sub(r"^ipset v[\d.]+:\s*", "", line.strip()) for line in stderr.splitlines()]
    return "; ".join(line for line in kept if line and not line.startswith("Try `ipset help'"))
