"""How `FakeNft` reads nft text: commands, tokens, set types and element values.

Only the subset `text.py` renders is read (see `fake.py` for the commands): tokens are
separated by whitespace and by `{ } ; ,`; a quoted string (no escapes, as nft reads it) is one
token with its quotes; a command ends at a newline or `;` outside braces and quotes; a
concatenation is written ` . ` and a map element's key and value are separated by ` : `
(`text.concat`, `text.element`). Values come out in the form libnftables' JSON gives them
(measured in a namespace with nft 1.0.6): addresses and interface names as strings, ports,
marks and integers as numbers, protocols by name, a prefix as `{"prefix": {"addr", "len"}}`
(a full-length prefix as the bare address), a range as `{"range": [a, b]}`, a concatenation
as `{"concat": [...]}`, a verdict as `{"accept": null}` or `{"jump": {"target": name}}`.
"""
from __future__ import annotations

import ipaddress
import re
from typing import Any

from netagent.kernel.nftables.runner import NftError


class NftSyntax(NftError):
    """Text the fake cannot read (nft would refuse it, or it is outside the subset)."""


_TOKEN = re.compile(r'"[^"]*"|[{};,]|[^\s{};,"]+|"')

PRIORITY_NAMES = {"raw": -300, "mangle": -150, "dstnat": -100, "filter": 0, "security": 50,
                  "srcnat": 100}
VERDICTS = ("accept", "drop", "return", "continue")
PROTOCOL_NAMES = {1: "icmp", 6: "tcp", 17: "udp", 58: "ipv6-icmp", 132: "sctp"}
PROTOCOL_NUMBERS = {value: key for key, value in PROTOCOL_NAMES.items()}
DATATYPES = ("ipv4_addr", "ipv6_addr", "inet_proto", "inet_service", "ifname", "mark",
             "integer", "ether_addr", "verdict")
# typeof expressions -> the datatype libnftables reports for them
_TYPEOF = {("ip", "saddr"): "ipv4_addr", ("ip", "daddr"): "ipv4_addr",
           ("ip6", "saddr"): "ipv6_addr", ("ip6", "daddr"): "ipv6_addr",
           ("meta", "l4proto"): "inet_proto", ("ip", "protocol"): "inet_proto",
           ("iifname",): "ifname", ("oifname",): "ifname", ("meta", "iifname"): "ifname",
           ("meta", "oifname"): "ifname", ("meta", "mark"): "mark", ("ct", "mark"): "mark",
           ("ether", "saddr"): "ether_addr", ("ether", "daddr"): "ether_addr"}
_PORT_HEADERS = ("th", "tcp", "udp", "sctp")


def commands(batch: str) -> list[list[str]]:
    """The batch's commands, each a list of tokens (quoted strings keep their quotes)."""
    found: list[list[str]] = []
    current: list[str] = []
    depth = 0
    for line in batch.split("\n"):
        for token in _TOKEN.findall(line):
            if token == '"':
                raise NftSyntax(f"unterminated quoted string in: {line[:120]}")
            if token.startswith("#") and depth == 0 and not current:
                break
            if token == "{":
                depth += 1
            elif token == "}":
                depth -= 1
                if depth < 0:
                    raise NftSyntax(f"unexpected '}}' in: {line[:120]}")
            if token == ";" and depth == 0:
                if current:
                    found.append(current)
                current = []
                continue
            current.append(token)
        if depth == 0 and current:
            found.append(current)
            current = []
    if depth or current:
        raise NftSyntax("unbalanced braces at the end of the batch")
    return found


def block(tokens: list[str], start: int) -> tuple[list[str], int]:
    """The tokens inside the `{ ... }` opening at `start`, and the index after its `}`."""
    if start >= len(tokens) or tokens[start] != "{":
        raise NftSyntax(f"expected '{{' in: {' '.join(tokens)[:120]}")
    depth = 0
    for index in range(start, len(tokens)):
        depth += {"{": 1, "}": -1}.get(tokens[index], 0)
        if depth == 0:
            return tokens[start + 1:index], index + 1
    raise NftSyntax("unbalanced braces")


def split_on(tokens: list[str], separator: str) -> list[list[str]]:
    """Split at `separator` tokens outside nested braces."""
    parts: list[list[str]] = [[]]
    depth = 0
    for token in tokens:
        depth += {"{": 1, "}": -1}.get(token, 0)
        if token == separator and depth == 0:
            parts.append([])
        else:
            parts[-1].append(token)
    return parts


def priority(tokens: list[str]) -> int:
    """`filter`, `srcnat + 1`, `-150`, `dstnat - 10` as a number."""
    text = " ".join(tokens).replace("+ ", "+").replace("- ", "-")
    match = re.fullmatch(r"([a-z]+)?\s*([+-]?\d+)?", text)
    if not match or not (match.group(1) or match.group(2)):
        raise NftSyntax(f"unreadable priority {text!r}")
    base = 0
    if match.group(1):
        if match.group(1) not in PRIORITY_NAMES:
            raise NftSyntax(f"unknown priority name {match.group(1)!r}")
        base = PRIORITY_NAMES[match.group(1)]
    return base + int(match.group(2) or 0)


def seconds(text: str) -> int:
    match = re.fullmatch(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", text)
    if not text or not match:
        raise NftSyntax(f"unreadable time {text!r}")
    days, hours, minutes, secs = (int(group or 0) for group in match.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + secs


def datatypes(tokens: list[str]) -> list[str]:
    """`type a . b` tokens (after `type`) as datatype names."""
    names = [part[0] if len(part) == 1 else "" for part in split_on(tokens, ".")]
    for found in names:
        if found not in DATATYPES or found == "verdict":
            raise NftSyntax(f"unknown or unsupported set datatype in {' '.join(tokens)!r}")
    return names


def typeof_types(tokens: list[str]) -> list[str]:
    """`typeof ip daddr . th dport` tokens (after `typeof`) as datatype names."""
    found = []
    for part in split_on(tokens, "."):
        key = tuple(part)
        if key in _TYPEOF:
            found.append(_TYPEOF[key])
        elif len(part) == 2 and part[0] in _PORT_HEADERS and part[1] in ("sport", "dport"):
            found.append("inet_service")
        elif part[:1] == ["numgen"] or part[:1] == ["jhash"]:
            found.append("integer")
        else:
            raise NftSyntax(f"typeof expression {' '.join(part)!r} is outside what the fake reads")
    return found


def verdict(tokens: list[str], known_chain: Any) -> dict[str, Any]:
    if len(tokens) == 1 and tokens[0] in VERDICTS:
        return {tokens[0]: None}
    if len(tokens) == 2 and tokens[0] in ("jump", "goto"):
        known_chain(tokens[1])
        return {tokens[0]: {"target": tokens[1]}}
    raise NftSyntax(f"not a verdict: {' '.join(tokens)!r}")


def _integer(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError as error:
        raise NftSyntax(f"not a number: {text!r}") from error


def scalar(datatype: str, token: str, *, interval: bool) -> Any:
    """One value of `datatype` as libnftables' JSON shows it."""
    if datatype in ("ipv4_addr", "ipv6_addr"):
        version = 4 if datatype == "ipv4_addr" else 6
        if "/" in token:
            if not interval:
                raise NftSyntax("You must add 'flags interval' to your set declaration if you "
                                "want to add prefix elements")
            net = _network(token, version)
            if net.prefixlen == net.max_prefixlen:
                return str(net.network_address)
            return {"prefix": {"addr": str(net.network_address), "len": net.prefixlen}}
        if "-" in token:
            low, high = token.split("-", 1)
            return _range(datatype, [scalar(datatype, low, interval=False),
                                     scalar(datatype, high, interval=False)], interval=interval)
        return str(_address(token, version))
    if datatype == "inet_service":
        if "-" in token:
            low, high = token.split("-", 1)
            return _range(datatype, [_port(low), _port(high)], interval=interval)
        return _port(token)
    if datatype == "inet_proto":
        number = PROTOCOL_NUMBERS.get(token)
        value = number if number is not None else _integer(token)
        if not 0 <= value <= 255:
            raise NftSyntax(f"protocol out of range: {token!r}")
        return PROTOCOL_NAMES.get(value, value)
    if datatype == "ifname":
        name = token[1:-1] if token.startswith('"') else token
        if not name or len(name.encode()) > 15:
            raise NftSyntax(f"bad interface name {token!r}")
        return name
    if datatype in ("mark", "integer"):
        value = _integer(token)
        if not 0 <= value < 2 ** 32:
            raise NftSyntax(f"value out of range: {token!r}")
        return value
    if datatype == "ether_addr":
        if not re.fullmatch(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}", token):
            raise NftSyntax(f"not an ethernet address: {token!r}")
        return token.lower()
    raise NftSyntax(f"datatype {datatype} is outside what the fake reads")


def _range(datatype: str, ends: list[Any], *, interval: bool) -> dict[str, Any]:
    if not interval:
        raise NftSyntax(f"a range of {datatype} needs 'flags interval'")
    if bounds(ends[0])[0] > bounds(ends[1])[0]:
        raise NftSyntax(f"range {ends[0]}-{ends[1]} has a negative size")
    return {"range": ends}


def _address(text: str, version: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        found = ipaddress.ip_address(text)
    except ValueError as error:
        raise NftSyntax(f"not an address: {text!r}") from error
    if found.version != version:
        raise NftSyntax(f"{text!r} is not an IPv{version} address")
    return found


def _network(text: str, version: int) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        found = ipaddress.ip_network(text, strict=False)
    except ValueError as error:
        raise NftSyntax(f"not a prefix: {text!r}") from error
    if found.version != version:
        raise NftSyntax(f"{text!r} is not an IPv{version} prefix")
    return found


def _port(text: str) -> int:
    value = _integer(text)
    if not 0 <= value <= 65535:
        raise NftSyntax(f"port out of range: {text!r}")
    return value


def bounds(value: Any) -> tuple[int, int]:
    """The closed integer interval one value covers (for interval overlap checks)."""
    if isinstance(value, dict) and "prefix" in value:
        net = ipaddress.ip_network(f"{value['prefix']['addr']}/{value['prefix']['len']}")
        return int(net.network_address), int(net.broadcast_address)
    if isinstance(value, dict) and "range" in value:
        return bounds(value["range"][0])[0], bounds(value["range"][1])[1]
    if isinstance(value, int):
        return value, value
    single = int(ipaddress.ip_address(value))
    return single, single


def compound(types: list[str], tokens: list[str], *, interval: bool) -> Any:
    """A key or value of `types` (concatenated when more than one) from its tokens."""
    parts = split_on(tokens, ".")
    if len(parts) != len(types) or any(len(part) != 1 for part in parts):
        raise NftSyntax(f"{' '.join(tokens)!r} does not match type {' . '.join(types)}")
    values = [scalar(kind, part[0], interval=interval) for kind, part in zip(types, parts)]
    return values[0] if len(values) == 1 else {"concat": values}
