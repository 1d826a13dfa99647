"""The ipset interface: our sets in one network namespace, the real `IpsetRunner` and `FakeIpset`.

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

Members are compared as strings, so every member has ONE spelling, the one `ipset save` prints:
`10.0.0.1,tcp:80,10.0.0.1` (protocol lower case and always present), `10.1.0.0/16` (host bits
cleared), `10.0.0.1` rather than `10.0.0.1/32`. `canonical_member(type, text)` turns what a
caller writes into that spelling and rejects what the sets below cannot hold; `entry()` builds
the common ip,proto:port[,ip] member. Both implementations validate every member with it
BEFORE writing, so a bad member fails the whole `update` with nothing applied (the real
`ipset restore` applies the lines before a bad one and stops there; measured on ipset 7.17).
The kernel errors left mid-restore are a full set, which both stop at in the same place, and
a set that vanished since it was read: the fake then applies nothing, while the real tool may
have applied some lines of other sets (it batches consecutive lines per set and drops the
pending batch on the error). Either way the caller has a failed write and re-syncs.

What the validation accepts is a strict subset of what the real tool accepts, on purpose:
IPv4 dotted decimal only (the tool resolves host names and reads `010.0.0.9` as octal), no
ranges or CIDRs that the tool would expand into many members (hash:ip `10.0.0.0/30`, port
`8-9`), protocols tcp/udp/sctp only, no /0 (the hash:net types refuse it anyway).

Sets are created `family inet` with `maxelem` from the spec (default large enough for 10,000
services x 10 endpoints in the one-member-per-endpoint sets; a hash grows on demand, so the
cap costs nothing until used). `ensure_set` creates a missing set; a set of the wrong type or
family is recreated only when nothing references it (the kernel refuses to destroy a set an
iptables rule uses), otherwise it is an `IpsetError`: silently emptying a set that live rules
match would change traffic. A different `maxelem` alone is left alone (it needs a recreate).

Only our sets are written: names start with `NETAGENT-` and are at most 31 characters (the
kernel's limit); reads (`list_names`, `members`, `describe`) see every set. ipsets are per
network namespace: `IpsetRunner(exec_prefix=["ip", "netns", "exec", NAME])` works on another.

`FakeIpset` keeps sets in memory, validates as above, enforces `maxelem`, refuses to destroy
a set in use (marked with `reference`/`release`, or reported by a callable such as
`iptables_references(fake_iptables)`), and records each write in `writes` so tests can assert
"no writes". `tests/netns/test_ipset_runner.py` checks that it and the real tool agree.
"""
from __future__ import annotations

import abc
import functools
import ipaddress
import re
import subprocess
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from netagent.kernel import owned

OWNED_PREFIX = owned.CHAIN_PREFIX
MAX_NAME_LENGTH = 31
DEFAULT_MAX_ELEMENTS = 262144
PORT_RANGE = (0, 65535)
PROTOCOLS = frozenset({"tcp", "udp", "sctp"})
DEFAULT_PROTOCOL = "tcp"           # what ipset assumes for a bare port in hash:*,port types
DEFAULT_TIMEOUT_SECONDS = 60.0


class IpsetType(str, Enum):
    HASH_IP = "hash:ip"
    HASH_IP_PORT = "hash:ip,port"
    HASH_IP_PORT_IP = "hash:ip,port,ip"
    HASH_IP_PORT_NET = "hash:ip,port,net"
    HASH_NET = "hash:net"
    BITMAP_PORT = "bitmap:port"

    @property
    def is_hash(self) -> bool:
        return self.value.startswith("hash:")


class IpsetError(Exception):
    """A set operation that failed: bad member, wrong or busy set, or the tool's complaint."""


class IpsetNotInstalled(IpsetError):
    """The `ipset` tool is missing (so no set of ours can be listed, made or removed)."""


@dataclass(frozen=True)
class IpsetSpec:
    """A set we own. `comment` says what it is for (shown by status/cleanup; ipset has no
    set-level comment, so it is not written to the kernel). Family is always inet."""
    name: str
    type: IpsetType
    comment: str = ""
    max_elements: int = DEFAULT_MAX_ELEMENTS

    def __post_init__(self):
        require_owned_name(self.name)
        object.__setattr__(self, "type", IpsetType(self.type))
        if self.max_elements < 1:
            raise ValueError(f"max_elements must be positive, not {self.max_elements}")


@dataclass(frozen=True)
class IpsetInfo:
    """A set's header as the kernel reports it."""
    name: str
    type: IpsetType | str          # a str when the type is one we do not model
    family: str | None             # None for bitmap types
    references: int
    entries: int
    max_elements: int | None = None


@dataclass(frozen=True)
class SetContents:
    """A set as one read of everything (`Ipset.snapshot`) reports it."""
    name: str
    type: IpsetType | str
    family: str | None
    members: frozenset[str]


@dataclass(frozen=True)
class IpsetWrite:
    """One write, as `FakeIpset.writes` records it."""
    kind: str                      # "create", "update", "destroy"
    name: str
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()


def require_owned_name(name: str) -> None:
    if not name.startswith(OWNED_PREFIX):
        raise ValueError(f"set name {name!r} is not ours (prefix {OWNED_PREFIX})")
    if len(name) > MAX_NAME_LENGTH or not re.fullmatch(r"[A-Za-z0-9_.:-]+", name):
        raise ValueError(f"set name {name!r}: at most {MAX_NAME_LENGTH} characters of [A-Za-z0-9_.:-]")


# ---- member spelling ---------------------------------------------------------------------------

_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_DECIMAL = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")


def _address(text: str) -> str:
    # A regex, not ipaddress: a backend spells ~10^5 members per sync, and this is 10x faster.
    # Same rules as IPv4Address: four decimal octets 0-255 without leading zeros.
    address = text.removesuffix("/32")
    if not _DOTTED_DECIMAL.fullmatch(address):
        raise IpsetError(f"{text!r} is not an IPv4 address")
    return address


def _network(text: str) -> str:
    if "/" not in text:
        return _address(text)
    return _cidr(text)


@functools.lru_cache(maxsize=4096)
def _cidr(text: str) -> str:
    try:
        network = ipaddress.IPv4Network(text, strict=False)
    except ValueError:
        raise IpsetError(f"{text!r} is not an IPv4 address or network") from None
    if network.prefixlen == 0:
        raise IpsetError(f"{text!r}: a /0 network cannot be a member")
    return str(network.network_address) if network.prefixlen == 32 else str(network)


def _port(text: str) -> int:
    if not re.fullmatch(r"\d{1,5}", text) or not PORT_RANGE[0] <= int(text) <= PORT_RANGE[1]:
        raise IpsetError(f"{text!r} is not a port number ({PORT_RANGE[0]}-{PORT_RANGE[1]})")
    return int(text)


def _protocol_port(text: str) -> str:
    protocol, sep, port = text.partition(":")
    if not sep:
        protocol, port = DEFAULT_PROTOCOL, text
    protocol = protocol.lower()
    if protocol not in PROTOCOLS:
        raise IpsetError(f"protocol {protocol!r} is not one of {sorted(PROTOCOLS)}")
    return f"{protocol}:{_port(port)}"


def _bare_port(text: str) -> str:
    """bitmap:port takes `80` or `tcp:80` and stores 80 either way."""
    return _protocol_port(text).partition(":")[2]


@functools.lru_cache(maxsize=1 << 18)
def canonical_member(set_type: IpsetType, text: str) -> str:
    """The spelling `ipset save` prints for `text` in a set of `set_type`; IpsetError when a
    set of that type cannot hold it (or only as several members)."""
    set_type = IpsetType(set_type)
    parts = text.split(",")
    shapes = {
        IpsetType.HASH_IP: (_address,),
        IpsetType.HASH_NET: (_network,),
        IpsetType.HASH_IP_PORT: (_address, _protocol_port),
        IpsetType.HASH_IP_PORT_IP: (_address, _protocol_port, _address),
        IpsetType.HASH_IP_PORT_NET: (_address, _protocol_port, _network),
        IpsetType.BITMAP_PORT: (_bare_port,),
    }[set_type]
    if len(parts) != len(shapes):
        raise IpsetError(f"{text!r} is not a {set_type.value} member")
    return ",".join(shape(part) for shape, part in zip(shapes, parts))


def entry(ip: str, protocol: str, port: int, *, extra_ip: str | None = None) -> str:
    """`ip,proto:port` or `ip,proto:port,extra` in canonical spelling. `protocol` may be a
    `proxy.model.Protocol` or any spelling of tcp/udp/sctp; `extra_ip` may be a network."""
    name = getattr(protocol, "value", protocol).lower()
    if name not in PROTOCOLS:
        raise IpsetError(f"protocol {name!r} is not one of {sorted(PROTOCOLS)}")
    if not isinstance(port, int) or not PORT_RANGE[0] <= port <= PORT_RANGE[1]:
        raise IpsetError(f"{port!r} is not a port number ({PORT_RANGE[0]}-{PORT_RANGE[1]})")
    member = f"{_address(ip)},{name}:{port}"
    return member if extra_ip is None else f"{member},{_network(extra_ip)}"


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
    def _apply(self, *, create: Sequence[IpsetSpec] = (),
               changes: Mapping[str, tuple[Sequence[str], Sequence[str]]] = MappingProxyType({})) -> None:
        """In one call: create the sets in `create` (absent ones), then for each set in
        `changes` (name -> (add, remove), canonical members) remove, then add."""

    def _create(self, spec: IpsetSpec) -> None:
        self._apply(create=[spec])

    def ensure_set(self, spec: IpsetSpec) -> None:
        info = self.describe(spec.name)
        if info is not None and info.type == spec.type and info.family == _family(spec.type):
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
        self._apply(changes={name: _canonical_change(name, info.type, add, remove)})

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
            set_type = types.get(name)
            if set_type is None:
                info = self.describe(name)
                if info is None:
                    raise IpsetError(f"set {name} does not exist")
                set_type = info.type
            if not isinstance(set_type, IpsetType):
                raise IpsetError(f"set {name} has type {set_type}, which netagent does not write")
            canonical[name] = _canonical_change(name, set_type, add, remove)
        if canonical:
            self._apply(changes=canonical)

    def owned_names(self, *, prefix: str = OWNED_PREFIX) -> list[str]:
        if not prefix.startswith(OWNED_PREFIX):
            raise ValueError(f"prefix {prefix!r} does not select only our sets")
        return sorted(name for name in self.list_names() if name.startswith(prefix))


def _family(set_type: IpsetType) -> str | None:
    return "inet" if set_type.is_hash else None


def _canonical_change(name: str, set_type: IpsetType, add: Iterable[str],
                      remove: Iterable[str]) -> tuple[list[str], list[str]]:
    adding = sorted({canonical_member(set_type, member) for member in add})
    removing = sorted({canonical_member(set_type, member) for member in remove})
    both = set(adding) & set(removing)
    if both:
        raise IpsetError(f"set {name}: {sorted(both)} both added and removed")
    return adding, removing


def restore_lines(*, create: Sequence[IpsetSpec],
                  changes: Mapping[str, tuple[Sequence[str], Sequence[str]]]) -> list[str]:
    """`ipset restore` input for `Ipset._apply`, in the order both implementations apply it."""
    lines = [" ".join(["create", *create_arguments(spec)]) for spec in create]
    for name, (add, remove) in changes.items():
        lines += [f"del {name} {member}" for member in remove]
        lines += [f"add {name} {member}" for member in add]
    return lines


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
        if held is not None and (held.type != spec.type or held.family != _family(spec.type)):
            ipset.ensure_set(spec)
            held = SetContents(spec.name, spec.type, _family(spec.type), frozenset())
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
_HEADER_FIELD = re.compile(r"^(Name|Type|Header|References|Number of entries):\s*(.*)$")


class IpsetRunner(Ipset):
    """Runs the `ipset` binary (optionally inside a namespace via `exec_prefix`)."""

    def __init__(self, *, exec_prefix: Sequence[str] = (), binary: str = "ipset",
                 timeout: float = DEFAULT_TIMEOUT_SECONDS):
        self.exec_prefix = list(exec_prefix)
        self.binary = binary
        self.timeout = timeout

    def _run(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        command = [*self.exec_prefix, self.binary, *args]
        try:
            return subprocess.run(command, input=stdin, capture_output=True, text=True,
                                  timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise IpsetError(f"{' '.join(command[:6])}: timed out after {self.timeout:g} s") from None
        except FileNotFoundError:
            raise IpsetNotInstalled(f"{command[0]} is not installed") from None

    def _check(self, done: subprocess.CompletedProcess, what: str) -> None:
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

    def members(self, name: str) -> frozenset[str]:
        done = self._run("save", name)
        self._check(done, f"ipset save {name}")
        found = set()
        for line in done.stdout.splitlines():
            words = line.split()
            if len(words) >= 3 and words[0] == "add" and words[1] == name:
                found.add(words[2])
        return frozenset(found)

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


def create_arguments(spec: IpsetSpec) -> list[str]:
    """`ipset create` arguments for a spec (after the word `create`)."""
    if spec.type is IpsetType.BITMAP_PORT:
        return [spec.name, spec.type.value, "range", f"{PORT_RANGE[0]}-{PORT_RANGE[1]}"]
    return [spec.name, spec.type.value, "family", "inet", "maxelem", str(spec.max_elements)]


def parse_save(text: str) -> dict[str, SetContents]:
    """Every set in `ipset save` output, with its members."""
    headers: dict[str, tuple[IpsetType | str, str | None]] = {}
    members: dict[str, set[str]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[0] == "create":
            options = dict(zip(words[3::2], words[4::2]))
            try:
                set_type: IpsetType | str = IpsetType(words[2])
            except ValueError:
                set_type = words[2]
            headers[words[1]] = (set_type, options.get("family"))
            members.setdefault(words[1], set())
        elif len(words) >= 3 and words[0] == "add":
            members.setdefault(words[1], set()).add(words[2])
    return {name: SetContents(name, set_type, family, frozenset(members.get(name, ())))
            for name, (set_type, family) in headers.items()}


def parse_header(text: str) -> IpsetInfo:
    """IpsetInfo from `ipset list -t NAME` output."""
    fields = {}
    for line in text.splitlines():
        found = _HEADER_FIELD.match(line.strip())
        if found:
            fields[found.group(1)] = found.group(2).strip()
    try:
        raw_type = fields["Type"]
        header = fields.get("Header", "").split()
        options = dict(zip(header[::2], header[1::2]))
        try:
            set_type: IpsetType | str = IpsetType(raw_type)
        except ValueError:
            set_type = raw_type
        return IpsetInfo(name=fields["Name"], type=set_type, family=options.get("family"),
                         references=int(fields.get("References", "0")),
                         entries=int(fields.get("Number of entries", "0")),
                         max_elements=int(options["maxelem"]) if "maxelem" in options else None)
    except (KeyError, ValueError) as error:
        raise IpsetError(f"cannot parse ipset header ({error}): {text[:200]!r}") from None


def _message(stderr: str) -> str:
    kept = [re.sub(r"^ipset v[\d.]+:\s*", "", line.strip()) for line in stderr.splitlines()]
    return "; ".join(line for line in kept if line and not line.startswith("Try `ipset help'"))


# ---- the fake ----------------------------------------------------------------------------------

@dataclass
class _FakeSet:
    spec: IpsetSpec
    members: set[str] = field(default_factory=set)


class FakeIpset(Ipset):
    """In-memory sets with the real tool's rules (see the module docstring).

    A set is in use when `reference(name)` was called more often than `release(name)`, or
    when `in_use(name)` (optional callable, e.g. `iptables_references(fake_iptables)`) says so.
    """

    def __init__(self, *, in_use: Callable[[str], bool] | None = None):
        self.sets: dict[str, _FakeSet] = {}
        self.in_use = in_use
        self.writes: list[IpsetWrite] = []
        self._references: Counter[str] = Counter()

    def reference(self, name: str) -> None:
        self._references[name] += 1

    def release(self, name: str) -> None:
        if self._references[name] > 0:
            self._references[name] -= 1

    def _reference_count(self, name: str) -> int:
        return self._references[name] + (1 if self.in_use is not None and self.in_use(name) else 0)

    def list_names(self) -> list[str]:
        return list(self.sets)

    def describe(self, name: str) -> IpsetInfo | None:
        held = self.sets.get(name)
        if held is None:
            return None
        spec = held.spec
        return IpsetInfo(name=name, type=spec.type, family=_family(spec.type),
                         references=self._reference_count(name), entries=len(held.members),
                         max_elements=spec.max_elements if spec.type.is_hash else None)

    def members(self, name: str) -> frozenset[str]:
        if name not in self.sets:
            raise IpsetError(f"ipset save {name}: The set with the given name does not exist")
        return frozenset(self.sets[name].members)

    def destroy(self, name: str) -> None:
        require_owned_name(name)
        if name not in self.sets:
            return
        if self._reference_count(name):
            raise IpsetError(f"ipset destroy {name}: Set cannot be destroyed: it is in use by a kernel component")
        del self.sets[name]
        self.writes.append(IpsetWrite("destroy", name))

    def snapshot(self) -> dict[str, SetContents]:
        return {name: SetContents(name, held.spec.type, _family(held.spec.type), frozenset(held.members))
                for name, held in self.sets.items()}

    def _apply(self, *, create: Sequence[IpsetSpec] = (),
               changes: Mapping[str, tuple[Sequence[str], Sequence[str]]] = MappingProxyType({})) -> None:
        missing = [name for name in changes if name not in self.sets and name not in {c.name for c in create}]
        if missing:
            raise IpsetError(f"ipset restore -exist: {missing[0]}: The set with the given name does not exist")
        line = 0
        for spec in create:
            line += 1
            if spec.name in self.sets:
                raise IpsetError(f"ipset restore -exist: line {line}: Set cannot be created: set with the same "
                                 f"name already exists")
            self.sets[spec.name] = _FakeSet(spec)
            self.writes.append(IpsetWrite("create", spec.name))
        for name, (add, remove) in changes.items():
            held = self.sets[name]
            removed = [member for member in remove if member in held.members]
            held.members.difference_update(removed)
            line += len(remove)
            added = []
            for member in add:
                line += 1
                if member in held.members:
                    continue
                if held.spec.type.is_hash and len(held.members) >= held.spec.max_elements:
                    self.writes.append(IpsetWrite("update", name, tuple(added), tuple(removed)))
                    raise IpsetError(f"ipset restore -exist: line {line} (add {name} {member}): Hash is full, "
                                     f"cannot add more elements")
                held.members.add(member)
                added.append(member)
            self.writes.append(IpsetWrite("update", name, tuple(added), tuple(removed)))


def iptables_references(iptables) -> Callable[[str], bool]:
    """A FakeIpset `in_use` callable: does any rule of `iptables` (an `Iptables`, usually
    FakeIptables) match the set with `--match-set NAME`?"""
    def in_use(name: str) -> bool:
        words = iptables.save().split()
        return any(word == "--match-set" and following == name
                   for word, following in zip(words, words[1:]))
    return in_use
