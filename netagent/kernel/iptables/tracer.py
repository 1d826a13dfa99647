"""A packet-flow tracer over iptables rules: where does one packet go, with what chance?

The kernel iptables library's one reader of rule semantics. Tests, the benchmark and a
person debugging a node ask the same question of a ruleset: "a TCP SYN from 10.244.1.7 to
10.96.0.10:80 arriving at this node: which endpoint gets it, is it masqueraded, is it
refused?". `trace_packet` answers from the rules alone (the rendered restore text, a
FakeIptables save, or a real node's iptables-save), without a kernel. Readers that walk
chains of their own (the policy read-back: a pod's egress chain, then the peer's ingress
chain) ask `PacketTracer.matches` whether one rule's matches hold for a packet, so there is
one matcher, not one per reader.

It follows the first packet of a new connection along netfilter's path:

    arriving (Hook.PREROUTING): nat PREROUTING -> routing -> filter INPUT (local destination)
                                                          -> filter FORWARD -> nat POSTROUTING
    local process (Hook.OUTPUT): nat OUTPUT -> filter OUTPUT -> nat POSTROUTING

and reports every way it can end as an `Outcome` (probability, verdict, destination after
DNAT, masqueraded or not). A `-m statistic --mode random` rule forks the walk: the branch
that matches carries p, the one that does not carries 1-p, so the outcomes of a service
with n endpoints are n branches of about 1/n each. Everything else is deterministic given
the inputs: the node's local addresses (for `addrtype LOCAL`), the members of ipsets, and
which `recent` lists already hold the source (ClientIP affinity's prior state).

It understands what the service proxy, the masquerade manager and the policy engine's
allow rules write: -s/-d/-p with `!`, matches tcp/udp/sctp (--dport, --sport), comment,
addrtype (LOCAL), mark, statistic (random), recent, set (members exact, or networks for a
one-part set: hash:net), conntrack (--ctstate; the packet is NEW), limit (the packet is within
the rate), and targets ACCEPT, DROP, REJECT, RETURN, MARK, DNAT, SNAT, MASQUERADE, NFLOG (a log
copy, not a verdict) and jumps/gotos to user chains. Anything else
raises `TraceError`: a tracer that guessed would make tests pass that should fail.
"""
from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from netagent.errors import NetagentError
from netagent.kernel.iptables.restore_format import Table, parse_save

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


class Hook(str, enum.Enum):
    PREROUTING = "PREROUTING"   # the packet arrives from an interface
    OUTPUT = "OUTPUT"           # a process on the node sends it


class Verdict(str, enum.Enum):
    ACCEPT = "ACCEPT"
    DROP = "DROP"
    REJECT = "REJECT"


class TraceError(NetagentError, ValueError):
    """A rule the tracer does not understand, or a question it cannot answer."""


@dataclass(frozen=True)
class Packet:
    source: str
    destination: str
    protocol: str                   # tcp | udp | sctp, any case
    port: int                       # destination port
    hook: Hook = Hook.PREROUTING
    source_port: int | None = None  # only needed by rules that match --sport


@dataclass(frozen=True)
class Outcome:
    probability: float
    verdict: Verdict
    destination: str                # "ip:port" after DNAT (as sent when not translated)
    masqueraded: bool
    recent_set: tuple[str, ...] = ()  # recent lists that recorded the source (affinity)


def tables_from_text(text: str) -> dict[str, Table]:
    """Tables from iptables-save output, or from restore text made of declarations and -A."""
    return parse_save(text)


def trace_packet(tables: Mapping[str, Table], packet: Packet, *, local_addresses: Iterable[str],
                 ipsets: Mapping[str, Iterable[str]] | None = None,
                 recent: Mapping[str, Iterable[str]] | None = None) -> list[Outcome]:
    return PacketTracer(tables, local_addresses=local_addresses, ipsets=ipsets, recent=recent).trace(packet)


def destinations(outcomes: Iterable[Outcome]) -> dict[str, float]:
    """Accepted destination -> probability, summed over outcomes."""
    found: dict[str, float] = {}
    for outcome in outcomes:
        if outcome.verdict is Verdict.ACCEPT:
            found[outcome.destination] = found.get(outcome.destination, 0.0) + outcome.probability
    return found


# ---- the walk ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class _State:
    source: str
    destination: str
    protocol: str
    port: int
    source_port: int | None
    mark: int = 0
    masqueraded: bool = False
    recent_set: tuple[str, ...] = ()


def _state_of(packet: Packet) -> _State:
    return _State(packet.source, packet.destination, packet.protocol.lower(), packet.port, packet.source_port)


class _Flow(enum.Enum):
    FELL_OFF = "fell off"   # end of chain reached
    RETURN = "return"
    ACCEPT = "accept"
    DROP = "drop"
    REJECT = "reject"
    NAT = "nat"             # DNAT/SNAT/MASQUERADE: the nat table is done for this hook


_TERMINAL_VERDICT = {_Flow.DROP: Verdict.DROP, _Flow.REJECT: Verdict.REJECT}

Match = Callable[[_State], float]


@dataclass(frozen=True)
class _Rule:
    matches: tuple[Match, ...]
    target: str | None
    target_args: tuple[str, ...]
    goto: bool
    text: str
    records: tuple[str, ...] = ()   # recent lists this rule adds the source to when it matches

    def probability(self, state: _State) -> float:
        chance = 1.0
        for match in self.matches:
            chance *= match(state)
            if chance == 0.0:
                return 0.0
        return chance


@dataclass
class PacketTracer:
    tables: Mapping[str, Table]
    local_addresses: Iterable[str]
    ipsets: Mapping[str, Iterable[str]] | None = None
    recent: Mapping[str, Iterable[str]] | None = None
    _parsed: dict[tuple[str, str], list[_Rule]] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        self._local = frozenset(str(ipaddress.ip_address(a.split("/")[0])) for a in self.local_addresses)
        self._sets = {name: frozenset(members) for name, members in (self.ipsets or {}).items()}
        self._recent = {name: frozenset(sources) for name, sources in (self.recent or {}).items()}

    def is_local(self, address: str) -> bool:
        return address in self._local or ipaddress.ip_address(address) in LOOPBACK

    def matches(self, spec: Sequence[str], packet: Packet) -> bool:
        """Whether every match of one rule (`spec`, its target ignored) holds for `packet`, as
        the first packet of a new connection. Raises TraceError on what the tracer does not read,
        and on a random match (a chance is not a yes or no)."""
        chance = self._parse(tuple(spec)).probability(_state_of(packet))
        if chance not in (0.0, 1.0):
            raise TraceError(f"{' '.join(spec)!r} matches with probability {chance}, not a yes or no")
        return chance == 1.0

    def trace(self, packet: Packet) -> list[Outcome]:
        state = _state_of(packet)
        finished: list[tuple[float, _State, Verdict]] = []
        for probability, after_nat, verdict in self._pass("nat", packet.hook.value, state, 1.0):
            if verdict is not Verdict.ACCEPT:
                finished.append((probability, after_nat, verdict))
                continue
            if packet.hook is Hook.OUTPUT:
                filter_chain, postrouting = "OUTPUT", True
            elif self.is_local(after_nat.destination):
                filter_chain, postrouting = "INPUT", False
            else:
                filter_chain, postrouting = "FORWARD", True
            for p_filter, filtered, filter_verdict in self._pass("filter", filter_chain, after_nat, probability):
                if filter_verdict is not Verdict.ACCEPT or not postrouting:
                    finished.append((p_filter, filtered, filter_verdict))
                    continue
                finished.extend(self._pass("nat", "POSTROUTING", filtered, p_filter))
        merged: dict[tuple, float] = {}
        for probability, final, verdict in finished:
            key = (verdict, f"{final.destination}:{final.port}", final.masqueraded, final.recent_set)
            merged[key] = merged.get(key, 0.0) + probability
        return sorted((Outcome(probability, *key) for key, probability in merged.items() if probability > 0),
                      key=lambda outcome: (outcome.destination, outcome.verdict.value, outcome.masqueraded,
                                           outcome.recent_set))

    def _pass(self, table_name: str, chain: str, state: _State,
              probability: float) -> list[tuple[float, _State, Verdict]]:
        """One built-in chain of one table: (probability, state, verdict) per way out."""
        table = self.tables.get(table_name)
        if table is None or chain not in table.chains:
            return [(probability, state, Verdict.ACCEPT)]
        policy = Verdict(table.chains[chain].policy)
        out = []
        for branch_probability, final, flow in self._run(table, chain, 0, state, probability, depth=0):
            if flow in _TERMINAL_VERDICT:
                out.append((branch_probability, final, _TERMINAL_VERDICT[flow]))
            elif flow in (_Flow.ACCEPT, _Flow.NAT):
                out.append((branch_probability, final, Verdict.ACCEPT))
            else:
                out.append((branch_probability, final, policy))
        return out

    def _run(self, table: Table, chain: str, start: int, state: _State, probability: float, *,
             depth: int) -> list[tuple[float, _State, _Flow]]:
        if depth > 64:
            raise TraceError(f"chains nest deeper than 64 at {chain}: a loop?")
        rules = self._rules(table, chain)
        for index in range(start, len(rules)):
            rule = rules[index]
            chance = rule.probability(state)
            if chance == 0.0:
                continue
            results = []
            if chance < 1.0:
                results.extend(self._run(table, chain, index + 1, state, probability * (1.0 - chance), depth=depth))
                probability *= chance
            if rule.records:
                state = replace(state, recent_set=state.recent_set + rule.records)
            for branch_probability, after, flow in self._apply(table, rule, state, probability, depth=depth):
                if flow is _Flow.FELL_OFF:
                    results.extend(self._run(table, chain, index + 1, after, branch_probability, depth=depth))
                else:
                    results.append((branch_probability, after, flow))
            return results
        return [(probability, state, _Flow.FELL_OFF)]

    def _apply(self, table: Table, rule: _Rule, state: _State, probability: float, *,
               depth: int) -> list[tuple[float, _State, _Flow]]:
        """The rule's target; FELL_OFF in the result means "go on with the next rule"."""
        target, args = rule.target, rule.target_args
        if target is None:
            return [(probability, state, _Flow.FELL_OFF)]
        if target == "ACCEPT":
            return [(probability, state, _Flow.ACCEPT)]
        if target == "DROP":
            return [(probability, state, _Flow.DROP)]
        if target == "REJECT":
            return [(probability, state, _Flow.REJECT)]
        if target == "RETURN":
            return [(probability, state, _Flow.RETURN)]
        if target == "MARK":
            return [(probability, replace(state, mark=_mark_after(state.mark, args, rule.text)), _Flow.FELL_OFF)]
        if target == "DNAT":
            address = _option(args, "--to-destination", rule.text)
            ip, _, port = address.partition(":")
            return [(probability, replace(state, destination=ip, port=int(port) if port else state.port), _Flow.NAT)]
        if target == "NFLOG":                   # a copy to the log: not a verdict
            return [(probability, state, _Flow.FELL_OFF)]
        if target in ("MASQUERADE", "SNAT"):
            return [(probability, replace(state, masqueraded=True), _Flow.NAT)]
        if target in table.chains and not table.chains[target].builtin:
            out = []
            for branch_probability, after, flow in self._run(table, target, 0, state, probability, depth=depth + 1):
                if flow in (_Flow.FELL_OFF, _Flow.RETURN):
                    flow = _Flow.RETURN if rule.goto else _Flow.FELL_OFF
                out.append((branch_probability, after, flow))
            return out
        raise TraceError(f"unsupported target {target!r} in {rule.text!r}")

    def _rules(self, table: Table, chain: str) -> list[_Rule]:
        key = (table.name, chain)
        if key not in self._parsed:
            self._parsed[key] = [self._parse(spec) for spec in table.chains[chain].rules]
        return self._parsed[key]

    # ---- rule parsing -------------------------------------------------------------------------

    def _parse(self, spec: tuple[str, ...]) -> _Rule:
        text = " ".join(spec)
        matches: list[Match] = []
        records: list[str] = []
        target: str | None = None
        target_args: tuple[str, ...] = ()
        goto = False
        index, negate, module = 0, False, None
        while index < len(spec):
            token = spec[index]
            if token == "!":
                negate = True
                index += 1
                continue
            if token in ("-j", "-g"):
                target, target_args, goto = spec[index + 1], tuple(spec[index + 2:]), token == "-g"
                break
            if token == "-m":
                module = spec[index + 1]
                if module not in _MODULES:
                    raise TraceError(f"unsupported match -m {module} in {text!r}")
                index += 2
                continue
            value = spec[index + 1] if index + 1 < len(spec) else None
            consumed, match = self._option(module, token, value, spec[index + 2:], text)
            if isinstance(match, _RecentSet):
                if negate:
                    raise TraceError(f"! recent --set makes no sense in {text!r}")
                records.append(match.name)
            elif match is not None:
                matches.append(_negated(match) if negate else match)
            negate = False
            index += consumed
        return _Rule(tuple(matches), target, target_args, goto, text, tuple(records))

    def _option(self, module: str | None, option: str, value: str | None, rest: tuple[str, ...],
                text: str) -> tuple[int, Match | _RecentSet | None]:
        """(tokens consumed, match) for one option; None for options that only qualify."""
        def need(what: str | None) -> str:
            if what is None:
                raise TraceError(f"{option} needs a value in {text!r}")
            return what

        if option in ("-s", "-d"):
            network = ipaddress.ip_network(need(value), strict=False)
            field_name = "source" if option == "-s" else "destination"
            return 2, lambda state: 1.0 if ipaddress.ip_address(getattr(state, field_name)) in network else 0.0
        if option == "-p":
            protocol = need(value).lower()
            return 2, lambda state: 1.0 if state.protocol == protocol else 0.0
        if module in ("tcp", "udp", "sctp") and option in ("--dport", "--sport", "--destination-port",
                                                             "--source-port"):
            low, _, high = need(value).partition(":")
            low_port, high_port = int(low), int(high or low)
            destination = option in ("--dport", "--destination-port")

            def port_match(state: _State) -> float:
                port = state.port if destination else state.source_port
                if port is None:
                    raise TraceError(f"{text!r} matches the source port; give Packet.source_port")
                return 1.0 if state.protocol == module and low_port <= port <= high_port else 0.0
            return 2, port_match
        if module == "comment" and option == "--comment":
            return 2, None
        if module == "addrtype" and option in ("--dst-type", "--src-type"):
            if need(value) != "LOCAL":
                raise TraceError(f"addrtype {value} is not supported (only LOCAL) in {text!r}")
            field_name = "destination" if option == "--dst-type" else "source"
            return 2, lambda state: 1.0 if self.is_local(getattr(state, field_name)) else 0.0
        if module == "mark" and option == "--mark":
            wanted, _, mask = need(value).partition("/")
            wanted_value, mask_value = int(wanted, 0), int(mask, 0) if mask else 0xFFFFFFFF
            return 2, lambda state: 1.0 if state.mark & mask_value == wanted_value else 0.0
        if module == "statistic":
            if option == "--mode":
                if value != "random":
                    raise TraceError(f"statistic --mode {value} is not supported in {text!r}")
                return 2, None
            if option == "--probability":
                chance = float(need(value))
                return 2, lambda state: chance
        if module == "limit" and option in ("--limit", "--limit-burst"):
            return 2, None                      # the traced packet is within the rate
        if module == "recent":
            return self._recent_option(option, value, rest, text)
        if module == "set" and option == "--match-set":
            if not rest:
                raise TraceError(f"--match-set needs a name and flags in {text!r}")
            return 3, self._set_match(need(value), rest[0], text)
        if module == "conntrack" and option == "--ctstate":
            states = set(need(value).split(","))
            return 2, lambda state: 1.0 if "NEW" in states else 0.0
        raise TraceError(f"unsupported option {option} (module {module}) in {text!r}")

    def _recent_option(self, option: str, value: str | None, rest: tuple[str, ...],
                       text: str) -> tuple[int, Match | _RecentSet | None]:
        flags_without_value = {"--rcheck", "--update", "--set", "--reap", "--rsource", "--rdest", "--remove"}
        if option in ("--seconds", "--hitcount", "--mask"):
            return 2, None
        if option == "--name":
            return 2, None
        if option not in flags_without_value:
            raise TraceError(f"unsupported recent option {option} in {text!r}")
        if option in ("--reap", "--rsource", "--rdest"):
            return 1, None
        spec_tokens = text.split()
        name = spec_tokens[spec_tokens.index("--name") + 1] if "--name" in spec_tokens else "DEFAULT"
        by_destination = "--rdest" in spec_tokens
        if option == "--set":
            return 1, _RecentSet(name)
        if option == "--remove":
            raise TraceError(f"recent --remove is not supported in {text!r}")
        known = self._recent.get(name, frozenset())
        return 1, lambda state: 1.0 if (state.destination if by_destination else state.source) in known else 0.0

    def _set_match(self, name: str, flags: str, text: str) -> Match:
        if name not in self._sets:
            raise TraceError(f"ipset {name} is not known to the tracer (rule {text!r})")
        members = self._sets[name]
        directions = flags.split(",")
        sample = next(iter(members), None)
        if sample is None:
            return lambda state: 0.0
        shape = ["port" if _PORT_PART.fullmatch(part) else "ip" for part in sample.split(",")]   # IPv6 has colons too
        if len(shape) != len(directions):
            raise TraceError(f"set {name} members have {len(shape)} parts, the rule gives {flags}")
        if shape == ["ip"] and any("/" in member for member in members):   # hash:net
            return self._network_match(members, directions[0], text)

        def key(state: _State) -> str:
            parts = []
            for kind, direction in zip(shape, directions):
                if kind == "ip":
                    parts.append(state.source if direction == "src" else state.destination)
                else:
                    port = state.source_port if direction == "src" else state.port
                    if port is None:
                        raise TraceError(f"{text!r} matches the source port; give Packet.source_port")
                    parts.append(f"{state.protocol}:{port}")
            return ",".join(parts)
        return lambda state: 1.0 if key(state) in members else 0.0


    @staticmethod
    def _network_match(members: frozenset[str], direction: str, text: str) -> Match:
        try:
            networks = [ipaddress.ip_network(member, strict=False) for member in members]
        except ValueError as error:
            raise TraceError(f"a set member is not a network ({error}) for {text!r}") from None

        def match(state: _State) -> float:
            address = ipaddress.ip_address(state.source if direction == "src" else state.destination)
            return 1.0 if any(address in network for network in networks) else 0.0
        return match


@dataclass(frozen=True)
class _RecentSet:
    """`-m recent --set`: always matches; the walk records that the source was added."""
    name: str


_PORT_PART = re.compile(r"[a-z]+:\d+")      # an ipset member's `proto:port` part


_MODULES = frozenset({"tcp", "udp", "sctp", "comment", "addrtype", "mark", "statistic", "recent", "set", "limit",
                      "conntrack"})


def _negated(match: Match) -> Match:
    return lambda state: 1.0 - match(state)


def _option(args: tuple[str, ...], name: str, text: str) -> str:
    if name not in args or args.index(name) + 1 >= len(args):
        raise TraceError(f"{name} missing in {text!r}")
    return args[args.index(name) + 1]


def _mark_after(mark: int, args: tuple[str, ...], text: str) -> int:
    option, value = (args[0], args[1]) if len(args) >= 2 else (None, None)
    if value is None:
        raise TraceError(f"MARK needs an option in {text!r}")
    bits, _, mask_text = value.partition("/")
    bits_value = int(bits, 0)
    if option == "--set-xmark":
        mask = int(mask_text, 0) if mask_text else 0xFFFFFFFF
        return (mark & ~mask & 0xFFFFFFFF) ^ bits_value
    if option == "--set-mark":
        mask = int(mask_text, 0) if mask_text else 0xFFFFFFFF
        return (mark & ~mask & 0xFFFFFFFF) | bits_value
    if option == "--or-mark":
        return mark | bits_value
    if option == "--xor-mark":
        return mark ^ bits_value
    if option == "--and-mark":
        return mark & bits_value
    raise TraceError(f"unsupported MARK option {option} in {text!r}")
