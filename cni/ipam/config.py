"""The `ipam` section of a network config, parsed and validated into `IpamConf`.

The accepted format is host-local's, so existing host-local configs work unchanged:
`ranges` is a list of range sets (one address is handed out per set, which is how dual
stack is expressed), each set a list of `{"subnet", "rangeStart", "rangeEnd", "gateway"}`;
the legacy top-level `subnet`/`rangeStart`/`rangeEnd`/`gateway` form one more set placed
first, and `runtimeConfig.ipRanges` (the `ipRanges` capability) sets placed before that.
Defaults, checks and error wording follow host-local's `Range.Canonicalize`: a subnet with
host bits set is refused, IPv4 /31 and /32 (IPv6 /127 and /128) are too small, ranges in
one set share a family and do not overlap, and neither do sets. Beyond host-local, the
gateway must lie inside its subnet, a subnet may not overlap a block no pod can use (loopback,
multicast, unspecified, link-local, reserved: `UNUSABLE_BLOCKS`), and every value must have
the right JSON type.

Everything invalid is `CniError` code 7 raised before any file is touched, with the
location (`ipam.ranges[1][0]`) in `details`. Parsing is cheap and stdlib-only so the
allocator can re-read the config on every call instead of caching it.
"""
from __future__ import annotations

import ipaddress
import os
import stat
from dataclasses import dataclass, field

from cni.errors import CniError, ErrorCode
from cni.request import valid_identifier
from cni.result_schema import validate_dns

DEFAULT_DATA_DIR = "/var/lib/cni/networks"
MAX_RESOLV_CONF = 64 * 1024  # glibc reads far less; a resolv.conf is a few hundred bytes
_RANGE_KEYS = ("subnet", "rangeStart", "rangeEnd", "gateway")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class IpRange:
    """One contiguous range `start..end` (inclusive) inside `subnet`, with its gateway."""

    subnet: Network
    start: Address
    end: Address
    gateway: Address

    @property
    def version(self) -> int:
        return self.subnet.version

    def contains(self, address: Address) -> bool:
        return address.version == self.version and int(self.start) <= int(address) <= int(self.end)

    def overlaps(self, other: IpRange) -> bool:
        return other.version == self.version and int(self.start) <= int(other.end) \
            and int(other.start) <= int(self.end)

    def __str__(self) -> str:
        return f"{self.start}-{self.end}"


@dataclass(frozen=True)
class RangeSet:
    """Ranges of one family that together yield one address per attachment."""

    ranges: tuple

    @property
    def version(self) -> int:
        return self.ranges[0].version

    @property
    def gateways(self) -> frozenset:
        return frozenset(r.gateway for r in self.ranges)

    def range_for(self, address: Address) -> IpRange | None:
        for candidate in self.ranges:
            if candidate.contains(address):
                return candidate
        return None

    def contains(self, address: Address) -> bool:
        return self.range_for(address) is not None

    def overlaps(self, other: RangeSet) -> bool:
        return any(a.overlaps(b) for a in self.ranges for b in other.ranges)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self.ranges)


@dataclass(frozen=True)
class IpamConf:
    network_name: str
    data_dir: str
    range_sets: tuple
    routes: tuple = ()
    dns: dict = field(default_factory=dict)
    resolv_conf: str = ""
    requested: tuple = ()

    @property
    def network_dir(self) -> str:
        return os.path.join(self.data_dir, self.network_name)


def invalid(msg: str, details: str = "") -> CniError:
    return CniError(ErrorCode.INVALID_CONFIG, msg, details)


def parse_address(text: object, *, what: str, where: str) -> Address:
    """A plain IP address; IPv4-mapped IPv6 becomes IPv4, as Go's `To4` does."""
    if not isinstance(text, str):
        raise invalid(f"{what} must be a string", f"{where}: got {type(text).__name__}")
    try:
        if "%" in text:
            raise ValueError("zone indices are not allowed")
        address = ipaddress.ip_address(text)
    except ValueError:
        raise invalid(f"{what} {text!r} is not an IP address", where) from None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


def parse_subnet(text: object, *, where: str) -> Network:
    """A CIDR whose host bits are clear (host-local refuses anything else)."""
    if not isinstance(text, str):
        raise invalid("'subnet' must be a CIDR string",
                      f"{where}: got {type(text).__name__}")
    address_text, slash, prefix = text.partition("/")
    if not slash or not (prefix.isascii() and prefix.isdigit()) or "%" in address_text:
        raise invalid(f"invalid CIDR address: {text}", where)
    try:
        interface = ipaddress.ip_interface(f"{address_text}/{int(prefix)}")
    except ValueError:
        raise invalid(f"invalid CIDR address: {text}", where) from None
    network = interface.network
    if getattr(interface.ip, "ipv4_mapped", None) is not None:
        raise invalid(f"subnet {text} is an IPv4-mapped IPv6 network", where)
    if network.prefixlen > network.max_prefixlen - 2:
        raise invalid(f"Network {text} too small to allocate from", where)
    if network.prefixlen == 0:
        raise invalid(f"subnet {text} is every address",
                      f"{where}: a /0 pod subnet would take the place of the pods' default route")
    if interface.ip != network.network_address:
        raise invalid(f"Network has host bits set. For a subnet mask of length "
                      f"{network.prefixlen} the network address is {network.network_address}",
                      where)
    unusable = unusable_block(network)
    if unusable is not None:
        raise invalid(f"subnet {text} overlaps {unusable[0]}, which is {unusable[1]}",
                      f"{where}: pod addresses must be unicast addresses a pod can use and be reached at")
    return network


# Address blocks no pod may be given an address from (IANA's special-purpose registries): what
# the kernel treats as local, multicast or unspecified, or will not route. host-local takes them;
# a pod with 127.0.0.5 is unreachable, one with 224.0.0.5 breaks multicast, 0.0.0.0/8 is "this host".
UNUSABLE_BLOCKS = tuple((ipaddress.ip_network(cidr), why) for cidr, why in (
    ("0.0.0.0/8", "'this network' (unspecified)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved (and the limited broadcast address)"),
    ("::/128", "the unspecified address"),
    ("::1/128", "loopback"),
    ("fe80::/10", "link-local"),
    ("ff00::/8", "multicast"),
))


def unusable_block(network: Network) -> tuple[Network, str] | None:
    """The first special-purpose block `network` overlaps, with what it is, or None."""
    for block, why in UNUSABLE_BLOCKS:
        if block.version == network.version and network.overlaps(block):
            return block, why
    return None


def _last_usable(subnet: Network) -> Address:
    """host-local's default rangeEnd: the broadcast is skipped for IPv4 only."""
    last = subnet.broadcast_address
    return last - 1 if subnet.version == 4 else last


def _optional_address(raw: dict, key: str, *, subnet: Network, where: str) -> Address | None:
    value = raw.get(key)
    if value is None or value == "":
        return None
    address = parse_address(value, what=f"'{key}'", where=where)
    if address not in subnet:
        raise invalid(f"{key[0].upper()}{key[1:]} {address} not in network {subnet}", where)
    return address


def parse_range(raw: object, *, where: str) -> IpRange:
    if not isinstance(raw, dict):
        raise invalid("a range must be an object with a 'subnet'",
                      f"{where}: got {type(raw).__name__}")
    if raw.get("subnet") in (None, ""):
        raise invalid("a range needs a 'subnet'", where)
    subnet = parse_subnet(raw["subnet"], where=where)
    first = subnet.network_address + 1
    start = _optional_address(raw, "rangeStart", subnet=subnet, where=where)
    end = _optional_address(raw, "rangeEnd", subnet=subnet, where=where)
    gateway = _optional_address(raw, "gateway", subnet=subnet, where=where)
    start = first if start is None else start
    end = _last_usable(subnet) if end is None else end
    gateway = first if gateway is None else gateway
    if subnet.version == 4 and gateway in (subnet.network_address, subnet.broadcast_address):
        raise invalid(f"Gateway {gateway} is the network or broadcast address of {subnet}", where)
    if int(start) > int(end):
        raise invalid(f"RangeEnd {end} is before RangeStart {start}", where)
    return IpRange(subnet=subnet, start=start, end=end, gateway=gateway)


def parse_range_set(raw: object, *, where: str) -> RangeSet:
    if not isinstance(raw, list):
        raise invalid("a range set must be a list of ranges",
                      f"{where}: got {type(raw).__name__}")
    if not raw:
        raise invalid("empty range set", where)
    ranges = tuple(parse_range(item, where=f"{where}[{i}]") for i, item in enumerate(raw))
    if len({r.version for r in ranges}) > 1:
        raise invalid("mixed address families", where)
    clash = first_overlap([(r, 0) for r in ranges])
    if clash is not None:
        raise invalid(f"subnets {clash[0][0]} and {clash[1][0]} overlap", where)
    return RangeSet(ranges=ranges)


def first_overlap(ranges: list) -> tuple | None:
    """Two overlapping entries of (IpRange, tag), or None: one sort and one sweep, not a
    comparison of every pair (a config of 8,000 ranges is parsed on every ADD)."""
    ordered = sorted(ranges, key=lambda item: (item[0].version, int(item[0].start), int(item[0].end)))
    for previous, current in zip(ordered, ordered[1:]):
        if previous[0].overlaps(current[0]):
            return previous, current
    return None


def _raw_range_sets(ipam: dict, runtime_config: dict) -> list[tuple[str, object]]:
    """(location, raw set) in host-local's order: runtime ipRanges, legacy, `ranges`."""
    runtime = runtime_config.get("ipRanges")
    ranges = ipam.get("ranges")
    for location, value in (("runtimeConfig.ipRanges", runtime), ("ipam.ranges", ranges)):
        if value is not None and not isinstance(value, list):
            raise invalid(f"'{location.split('.')[-1]}' must be a list of range sets",
                          f"{location}: got {type(value).__name__}")
    found = [(f"runtimeConfig.ipRanges[{i}]", s) for i, s in enumerate(runtime or [])]
    if ipam.get("subnet") not in (None, ""):
        found.append(("ipam (top-level subnet)", [{k: ipam.get(k) for k in _RANGE_KEYS}]))
    found.extend((f"ipam.ranges[{i}]", s) for i, s in enumerate(ranges or []))
    return found


def parse_range_sets(ipam: dict, *, runtime_config: dict) -> tuple:
    raw_sets = _raw_range_sets(ipam, runtime_config)
    if not raw_sets:
        raise invalid("no IP ranges specified", "set ipam.ranges or ipam.subnet")
    sets = []
    for index, (where, raw) in enumerate(raw_sets):
        try:
            sets.append(parse_range_set(raw, where=where))
        except CniError as err:
            raise invalid(f"invalid range set {index}: {err.msg}", err.details) from None
    clash = _first_overlap_between_sets(sets)
    if clash is not None:
        i, j = clash
        raise invalid(f"range set {i} overlaps with {j}", f"{sets[i]} and {sets[j]}")
    return tuple(sets)


def _first_overlap_between_sets(sets: list) -> tuple | None:
    """(i, j), i < j, for range sets i and j that share an address, or None.

    One sweep by start address per family, keeping the two furthest-reaching earlier ranges
    of different sets: a range overlaps an earlier one of another set exactly when one of
    those two reaches it."""
    ordered = sorted(((r, index) for index, s in enumerate(sets) for r in s.ranges),
                     key=lambda item: (item[0].version, int(item[0].start)))
    best: list = []  # up to two (end, set index, version), from different sets, furthest first
    for ip_range, index in ordered:
        start = int(ip_range.start)
        for end, other, version in best:
            if version == ip_range.version and other != index and end >= start:
                return min(index, other), max(index, other)
        entry = (int(ip_range.end), index, ip_range.version)
        candidates = [e for e in best if e[2] == ip_range.version] + [entry]
        candidates.sort(key=lambda e: -e[0])
        best = []
        for candidate in candidates:
            if all(candidate[1] != kept[1] for kept in best):
                best.append(candidate)
            if len(best) == 2:
                break
    return None


def parse_routes(raw: object) -> tuple:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise invalid("'routes' must be a list", f"ipam.routes: got {type(raw).__name__}")
    routes = []
    for i, route in enumerate(raw):
        where = f"ipam.routes[{i}]"
        if not isinstance(route, dict):
            raise invalid("a route must be an object with a 'dst'",
                          f"{where}: got {type(route).__name__}")
        dst = route.get("dst")
        try:
            if not isinstance(dst, str) or "/" not in dst:
                raise ValueError
            ipaddress.ip_network(dst, strict=False)
        except ValueError:
            raise invalid(f"route 'dst' {dst!r} is not a CIDR", where) from None
        if route.get("gw") not in (None, ""):
            parse_address(route["gw"], what="route 'gw'", where=where)
        routes.append(dict(route))
    return tuple(routes)


def parse_requested_ips(values: object, *, source: str,
                        code: int = ErrorCode.INVALID_CONFIG) -> list:
    """Requested addresses given as plain IPs or CIDRs (the prefix is ignored)."""
    if values is None:
        return []
    if not isinstance(values, list):
        raise CniError(code, f"{source} must be a list of IP addresses",
                       f"got {type(values).__name__}")
    addresses = []
    for value in values:
        text = value.split("/", 1)[0] if isinstance(value, str) else value
        try:
            addresses.append(parse_address(text, what="requested IP", where=source))
        except CniError as err:
            raise CniError(code, err.msg, err.details) from None
    return addresses


def assign_requested(ipam: IpamConf, addresses) -> dict:
    """Map each requested address to the index of the one range set that holds it."""
    assigned: dict = {}
    for address in dict.fromkeys(addresses):
        index = next((i for i, s in enumerate(ipam.range_sets) if s.contains(address)), None)
        if index is None:
            raise invalid(f"failed to allocate all requested IPs: {address}",
                          "the address is inside no range of ipam.ranges")
        if address in ipam.range_sets[index].gateways:
            raise invalid(f"requested ip {address} is subnet's gateway")
        if index in assigned:
            raise invalid(f"failed to allocate all requested IPs: {address}",
                          f"range set {index} already has the requested IP {assigned[index]}")
        assigned[index] = address
    return assigned


def _optional_string(ipam: dict, key: str) -> str:
    value = ipam.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise invalid(f"'{key}' must be a string", f"ipam.{key}: got {type(value).__name__}")
    return value


def _absolute_path(ipam: dict, key: str) -> str:
    """A path the agent and the in-process plugin resolve alike: relative ones are refused
    (each would resolve against its own working directory)."""
    value = _optional_string(ipam, key)
    if value and not os.path.isabs(value):
        raise invalid(f"'{key}' must be an absolute path", f"ipam.{key}: {value[:200]!r}")
    if "\0" in value:
        raise invalid(f"'{key}' must not contain NUL", f"ipam.{key}")
    return value


def parse_ipam_config(ipam: dict, *, network_name: str,
                      runtime_config: dict | None = None) -> IpamConf:
    if not isinstance(ipam, dict):
        raise invalid("'ipam' must be an object", f"got {type(ipam).__name__}")
    if not valid_identifier(network_name):
        raise invalid(f"network name {network_name!r} is not valid")
    runtime_config = runtime_config if isinstance(runtime_config, dict) else {}
    return IpamConf(
        network_name=network_name,
        data_dir=_absolute_path(ipam, "dataDir") or DEFAULT_DATA_DIR,
        range_sets=parse_range_sets(ipam, runtime_config=runtime_config),
        routes=parse_routes(ipam.get("routes")),
        dns=validate_dns(ipam.get("dns"), "ipam.dns"),
        resolv_conf=_absolute_path(ipam, "resolvConf"),
        requested=tuple(parse_requested_ips(ipam.get("ips"), source="ipam.ips")))


def _read_regular_file(path: str, *, limit: int) -> bytes:
    """At most `limit` bytes of the regular file at `path`. Anything else (a FIFO that would
    block a worker forever, /dev/zero that never ends, a directory) is refused with code 7."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise CniError(ErrorCode.IO_FAILURE, f"cannot read resolvConf {path}", exc.strerror or str(exc)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise invalid(f"resolvConf {path} is not a regular file", "ipam.resolvConf")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise CniError(ErrorCode.IO_FAILURE, f"cannot read resolvConf {path}", exc.strerror or str(exc)) from None
    finally:
        os.close(fd)
    if size > limit:
        raise invalid(f"resolvConf {path} is larger than {limit} bytes", "ipam.resolvConf")
    return b"".join(chunks)


def read_resolv_conf(path: str) -> dict:
    """host-local's `resolvConf`: nameserver, domain, search and options lines as CNI DNS."""
    lines = _read_regular_file(path, limit=MAX_RESOLV_CONF).decode("utf-8", errors="replace").splitlines()
    dns: dict = {}
    for line in lines:
        fields = line.split()
        if len(fields) < 2 or fields[0][0] in "#;":
            continue
        key, values = fields[0], fields[1:]
        if key == "nameserver":
            dns.setdefault("nameservers", []).append(values[0])
        elif key == "domain":
            dns["domain"] = values[0]
        elif key in ("search", "options"):
            dns.setdefault(key, []).extend(values)
    return dns
