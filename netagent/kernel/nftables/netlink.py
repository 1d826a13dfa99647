"""Set and map elements written to nf_tables as netlink messages, without libnftables' parser.

Why: libnftables parses text (or JSON) into expression trees before it builds the netlink
batch; at 130,000 elements that was 1.2-1.5 s of CPU and 260 MiB of heap (measured with nft
1.0.6, 10,000 Services), while the kernel's own share was 0.3 s. An element is a few fixed
bytes per datatype, so `encode` writes the `NFT_MSG_NEWSETELEM` / `NFT_MSG_DELSETELEM`
messages of a `model.ElementWrite` itself, inside one `NFNL_MSG_BATCH_BEGIN`/`END`: one
transaction, all or nothing, exactly as the text batch was. The bytes are the ones nft
writes (padded concatenations, the comment as libnftnl's user-data TLV), so the table lists
the same and a text-written table and this one compare equal (tests/netns proves it).

Only what the proxy's and policy's tables hold is encoded: keys and map data made of
`ipv4_addr`, `ipv6_addr`, `inet_proto`, `inet_service`, a `numgen` slot (`integer` of a
`typeof ... numgen` map: 32 bits in host order), verdicts (`goto`/`jump` CHAIN, `drop`,
`accept`, `return`), and comments. Anything else (an interval set, an `ifname` key, a set
without its declaration) raises `Unencodable`, and the caller writes the text instead.
Every string still passes `text.py`'s gates (names, comments); addresses through inet_pton.

`NetlinkWriter` owns the socket (opened by the thread that is in the runner's namespace:
a netlink socket belongs to the namespace it was opened in) and reads the kernel's answer:
every message asks for an acknowledgement, and nfnetlink answers within the `sendmsg`.
"""
from __future__ import annotations

import errno
import os
import socket
import struct
import sys
from collections.abc import Callable, Iterator

from netagent.kernel.nftables import text
from netagent.kernel.nftables.model import Element, ElementWrite, Map, Set

NETLINK_NETFILTER = 12
NFNL_SUBSYS_NFTABLES = 10
NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END = 0x10, 0x11
NFT_MSG_NEWSETELEM, NFT_MSG_DELSETELEM = 12, 14
NLM_F_REQUEST, NLM_F_ACK, NLM_F_CREATE = 0x1, 0x4, 0x400
NLMSG_ERROR = 2
NLA_F_NESTED = 0x8000
NFTA_SET_ELEM_LIST_TABLE, NFTA_SET_ELEM_LIST_SET, NFTA_SET_ELEM_LIST_ELEMENTS = 1, 2, 3
NFTA_LIST_ELEM = 1
NFTA_SET_ELEM_KEY, NFTA_SET_ELEM_DATA, NFTA_SET_ELEM_USERDATA = 1, 2, 6
NFTA_DATA_VALUE, NFTA_DATA_VERDICT = 1, 2
NFTA_VERDICT_CODE, NFTA_VERDICT_CHAIN = 1, 2
NFTNL_UDATA_SET_ELEM_COMMENT = 0
VERDICTS = {"drop": 0, "accept": 1, "return": -5}
JUMPS = {"jump": -3, "goto": -4}
NFPROTO = {"ip": 2, "ip6": 10, "inet": 1}
PROTOCOL_NUMBERS = {"tcp": 6, "udp": 17, "sctp": 132}
MESSAGE_ROOM = 60_000        # bytes of elements per message: an attribute's length is 16 bits
SOCKET_SLACK = 1 << 20

_HEADER = struct.Struct("=IHHII")
_NLA = struct.Struct("=HH")


class Unencodable(text.UnsafeNftText):
    """An element write this module does not encode (the caller writes it as text)."""


def _attr(kind: int, payload: bytes) -> bytes:
    return _NLA.pack(4 + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)


def _nest(kind: int, payload: bytes) -> bytes:
    return _NLA.pack(4 + len(payload), kind | NLA_F_NESTED) + payload   # nested payloads are 4-aligned


def _string(value: str) -> bytes:
    return value.encode() + b"\0"


# ---- one part of a key or value, by datatype -------------------------------------------------

def _ipv4(part: str) -> bytes:
    try:
        return socket.inet_pton(socket.AF_INET, part)
    except (OSError, TypeError) as error:
        raise Unencodable(f"not an IPv4 address: {part[:60]!r}") from error


def _ipv6(part: str) -> bytes:
    try:
        return socket.inet_pton(socket.AF_INET6, part)
    except (OSError, TypeError) as error:
        raise Unencodable(f"not an IPv6 address: {part[:60]!r}") from error


def _number(part: str, size: int, order: str) -> bytes:
    try:
        return int(part).to_bytes(size, order)   # type: ignore[arg-type]
    except (ValueError, OverflowError, TypeError) as error:
        raise Unencodable(f"not a {size * 8}-bit number: {part[:60]!r}") from error


def _proto(part: str) -> bytes:
    found = PROTOCOL_NUMBERS.get(part)
    return bytes((found,)) if found is not None else _number(part, 1, "big")


_PARTS: dict[str, tuple[Callable[[str], bytes], int]] = {   # coder, size in bytes
    "ipv4_addr": (_ipv4, 4),
    "ipv6_addr": (_ipv6, 16),
    "inet_proto": (_proto, 1),
    "inet_service": (lambda part: _number(part, 2, "big"), 2),
    "numgen": (lambda part: _number(part, 4, sys.byteorder), 4),
}


class _Parts(dict[str, bytes]):
    """One part's encodings by text, each made once on first use (a service address, `tcp`, a
    port, a slot repeat across elements)."""

    def __init__(self, coder: Callable[[str], bytes], *, padded: bool) -> None:
        super().__init__()
        self.coder, self.padded = coder, padded

    def __missing__(self, part: str) -> bytes:
        found = self.coder(part)
        if self.padded:
            found += b"\0" * (-len(found) % 4)
        self[part] = found
        return found


def _data(types: tuple[str, ...], outer: int) -> Callable[[tuple[str, ...]], bytes]:
    """Encodes a key or map data of fixed `types` into its `NFTA_DATA_VALUE` attribute nested
    in `outer` (`NFTA_SET_ELEM_KEY` or `_DATA`): a single part as its size, each part of a
    concatenation padded to 32 bits, as nft lays them out. Written out per arity: this runs
    once per element of a 130,000-element write."""
    try:
        found = [_PARTS[kind] for kind in types]
    except KeyError as error:
        raise Unencodable(f"no element encoding for {' . '.join(types)}") from error
    padded = len(types) > 1
    length = sum(size + (-size % 4) for _, size in found) if padded else found[0][1]
    head = (_NLA.pack(8 + length + (-length % 4), outer | NLA_F_NESTED)   # the nest counts the padding
            + _NLA.pack(4 + length, NFTA_DATA_VALUE))
    tail = b"\0" * (-length % 4)
    caches = [_Parts(coder, padded=padded) for coder, _ in found]
    if len(caches) == 1:
        (a,) = caches
        encode: Callable[[tuple[str, ...]], bytes] = lambda parts: head + a[parts[0]] + tail   # noqa: E731
    elif len(caches) == 2:
        a, b = caches
        encode = lambda parts: head + a[parts[0]] + b[parts[1]] + tail   # noqa: E731
    elif len(caches) == 3:
        a, b, c = caches
        encode = lambda parts: head + a[parts[0]] + b[parts[1]] + c[parts[2]] + tail   # noqa: E731
    else:
        encode = lambda parts: head + b"".join([cache[part] for cache, part in zip(caches, parts)]) + tail  # noqa: E731
    arity = len(caches)

    def checked(parts: tuple[str, ...]) -> bytes:
        if len(parts) != arity:
            raise Unencodable(f"{parts} does not fit {' . '.join(types)}")
        return encode(parts)
    return checked


def _types(entry: Set | Map) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
    """The key's and value's part types (`numgen` for the slot of a `typeof ... numgen` key);
    value None for a set, ("verdict",) for a verdict map."""
    if entry.flags and set(entry.flags) - {"timeout", "dynamic"}:
        raise Unencodable(f"{entry.name}: flags {entry.flags} are written as text")
    key = entry.key_type
    if "integer" in key:
        if not (isinstance(entry, Map) and entry.typeof and "numgen" in entry.typeof.split(":")[0]
                and key.count("integer") == 1 and key[-1] == "integer"):
            raise Unencodable(f"{entry.name}: an integer key that is not a numgen slot")
        key = (*key[:-1], "numgen")
    if not isinstance(entry, Map):
        return key, None
    return key, tuple(part.strip() for part in entry.value_type.split("."))


def _verdict(value: str) -> bytes:
    word, _, chain = value.partition(" ")
    if not chain and word in VERDICTS:
        payload = _attr(NFTA_VERDICT_CODE, struct.pack(">i", VERDICTS[word]))
    elif word in JUMPS and chain:
        payload = (_attr(NFTA_VERDICT_CODE, struct.pack(">i", JUMPS[word]))
                   + _attr(NFTA_VERDICT_CHAIN, _string(text.name(chain))))
    else:
        raise Unencodable(f"not a verdict this writer encodes: {value[:60]!r}")
    return _nest(NFTA_SET_ELEM_DATA, _nest(NFTA_DATA_VERDICT, payload))


def _element_encoder(entry: Set | Map) -> Callable[[Element], bytes]:
    key_types, value_types = _types(entry)
    key = _data(key_types, NFTA_SET_ELEM_KEY)
    value = None if value_types in (None, ("verdict",)) else _data(value_types, NFTA_SET_ELEM_DATA)
    verdicts: dict[str, bytes] = {}
    heads: dict[int, bytes] = {}

    def encode(element: Element) -> bytes:
        body = key(element.key)
        found = element.value
        if value_types is None:
            if found is not None:
                raise Unencodable(f"set {entry.name}: an element with a value")
        elif found is None:
            raise Unencodable(f"map {entry.name}: an element without a value")
        elif value is None:
            verdict = verdicts.get(found)
            if verdict is None:
                verdict = verdicts[found] = _verdict(found)
            body += verdict
        else:
            body += value(tuple(found.split(" . ")))
        if element.comment is not None:
            comment = _string(text.safe_comment_text(element.comment))
            body += _attr(NFTA_SET_ELEM_USERDATA, bytes((NFTNL_UDATA_SET_ELEM_COMMENT, len(comment))) + comment)
        head = heads.get(len(body))
        if head is None:
            head = heads[len(body)] = _NLA.pack(4 + len(body), NFTA_LIST_ELEM | NLA_F_NESTED)
        return head + body
    return encode


# ---- messages --------------------------------------------------------------------------------

def _message(kind: int, flags: int, seq: int, family: int, payload: bytes, res_id: int = 0) -> bytes:
    body = struct.pack("=BBH", family, 0, socket.htons(res_id)) + payload
    return _HEADER.pack(16 + len(body), kind, flags, seq, 0) + body


def encode(write: ElementWrite, first_seq: int = 1) -> tuple[bytes, list[int]]:
    """The whole batch (begin, element messages, end) and the sequence numbers of the element
    messages (each asks for an acknowledgement). Unencodable: write `write.text()` instead."""
    family = NFPROTO.get(write.family)
    if family is None:
        raise Unencodable(f"family {write.family!r}")
    head_of = {holder: _attr(NFTA_SET_ELEM_LIST_TABLE, _string(text.name(write.table)))
               + _attr(NFTA_SET_ELEM_LIST_SET, _string(text.name(holder)))
               for holder in {*write.delete, *write.add}}
    messages: list[tuple[int, str, list[bytes]]] = []
    for verb, holder, items in _items(write):
        messages.extend((verb, holder, chunk) for chunk in _fill(items))
    seq = first_seq
    parts = [_message(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq, 0, b"", NFNL_SUBSYS_NFTABLES)]
    acked = []
    for verb, holder, chunk in messages:
        seq += 1
        flags = NLM_F_REQUEST | NLM_F_ACK | (NLM_F_CREATE if verb == NFT_MSG_NEWSETELEM else 0)
        payload = head_of[holder] + _nest(NFTA_SET_ELEM_LIST_ELEMENTS, b"".join(chunk))
        parts.append(_message((NFNL_SUBSYS_NFTABLES << 8) | verb, flags, seq, family, payload))
        acked.append(seq)
    parts.append(_message(NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq + 1, 0, b"", NFNL_SUBSYS_NFTABLES))
    return b"".join(parts), acked


def _items(write: ElementWrite) -> Iterator[tuple[int, str, list[bytes]]]:
    """(message type, holder, encoded elements): every deletion before any addition."""
    for holder, keys in sorted(write.delete.items()):
        if keys:
            key = _data(_types(_declared(write, holder))[0], NFTA_SET_ELEM_KEY)
            yield NFT_MSG_DELSETELEM, holder, [_nest(NFTA_LIST_ELEM, key(parts)) for parts in keys]
    for holder, elements in sorted(write.add.items()):
        if elements:
            element = _element_encoder(_declared(write, holder))
            yield NFT_MSG_NEWSETELEM, holder, [element(item) for item in elements]


def _declared(write: ElementWrite, holder: str) -> Set | Map:
    found = write.declared.get(holder)
    if found is None:
        raise Unencodable(f"{holder}: no declaration to encode its elements by")
    return found


def _fill(items: list[bytes]) -> Iterator[list[bytes]]:
    chunk: list[bytes] = []
    room = 0
    for item in items:
        if chunk and room + len(item) > MESSAGE_ROOM:
            yield chunk
            chunk, room = [], 0
        chunk.append(item)
        room += len(item)
    if chunk:
        yield chunk


# ---- the socket ------------------------------------------------------------------------------

class NetlinkWriter:
    """One NETLINK_NETFILTER socket, opened in the calling thread's namespace."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_NETFILTER)
        self._socket.setsockopt(270, 10, 1)   # SOL_NETLINK, NETLINK_CAP_ACK: errors without our payload
        self._socket.bind((0, 0))

    def send(self, batch: bytes, acked: list[int]) -> None:
        """One batch of `encode` as one transaction; NftError (the kernel's errno) when it was
        refused, and then nothing changed."""
        from netagent.kernel.nftables.runner import NftError
        sock = self._socket
        sock.setsockopt(socket.SOL_SOCKET, 32, len(batch) + SOCKET_SLACK)        # SO_SNDBUFFORCE
        sock.setsockopt(socket.SOL_SOCKET, 33, 1024 * len(acked) + SOCKET_SLACK)  # SO_RCVBUFFORCE
        try:
            sock.sendall(batch)
        except OSError as error:
            raise NftError(f"nf_tables refused the element batch: {error.strerror}") from error
        pending, failures = set(acked), []
        while pending:
            try:
                answer = sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break   # nfnetlink answers within sendmsg: nothing more is coming
            for seq, code in _acks(answer):
                pending.discard(seq)
                if code:
                    failures.append(f"{os.strerror(code)} ({errno.errorcode.get(code, code)})")
        if failures:
            raise NftError(f"nf_tables refused the element batch: {'; '.join(sorted(set(failures)))}")
        if pending:
            raise NftError(f"nf_tables acknowledged {len(acked) - len(pending)} of {len(acked)} element messages")

    def close(self) -> None:
        self._socket.close()


def _acks(answer: bytes) -> Iterator[tuple[int, int]]:
    """(sequence number, errno) of every NLMSG_ERROR message (errno 0: an acknowledgement)."""
    offset = 0
    while offset + 16 <= len(answer):
        length, kind, _flags, seq, _pid = _HEADER.unpack_from(answer, offset)
        if length < 16:
            break
        if kind == NLMSG_ERROR and length >= 20:
            (code,) = struct.unpack_from("=i", answer, offset + 16)
            yield seq, -code
        offset += (length + 3) & ~3
