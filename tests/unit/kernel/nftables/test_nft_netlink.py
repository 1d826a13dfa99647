"""`netlink.py`, the element writer, without a kernel: the bytes of an element as nft lays
them out (padded concatenations, a numgen slot in host order, verdicts, the comment's TLV),
one batch framed by BEGIN/END with every element message acknowledged and under 64 KiB,
what it does not encode refused with a reason (and written as text by the runner), the
kernel's answers read; and `Changes.apply`: an element-only change is one `apply_elements`,
a missing table on a runner that writes elements natively is its skeleton then its elements
(the skeleton deleted again when the elements are refused). tests/netns/test_nft_netlink.py
runs the same writes on the real kernel."""
from __future__ import annotations

import socket
import struct
import sys

import pytest

from netagent.kernel.nftables import netlink, tables
from netagent.kernel.nftables.changes import table_changes
from netagent.kernel.nftables.fake import FakeNft
from netagent.kernel.nftables.model import Chain, Element, ElementWrite, Map, Set, Table
from netagent.kernel.nftables.runner import NftError

SLOTS = Map("SLOTS", ("ipv4_addr", "inet_service", "integer"), "ipv4_addr . inet_service",
            typeof="ip daddr . th dport . numgen random mod 1 : ip daddr . tcp dport")
VERDICTS = Map("VERDICTS", ("ipv4_addr", "inet_proto", "inet_service"), "verdict")
NAMES = Set("NAMES", ("inet_proto", "inet_service"))
PORTS = Set("PORTS", ("inet_service",))


def messages(batch: bytes) -> list[tuple[int, int, bytes]]:
    """(type, flags, payload after the nfgenmsg) of every netlink message of a batch."""
    out, offset = [], 0
    while offset < len(batch):
        length, kind, flags, _seq, _pid = struct.unpack_from("=IHHII", batch, offset)
        out.append((kind, flags, batch[offset + 20:offset + length]))
        offset += length
    assert offset == len(batch)
    return out


def attr(kind: int, payload: bytes, nested: bool = False) -> bytes:
    return struct.pack("=HH", 4 + len(payload), kind | (0x8000 if nested else 0)) + payload + b"\0" * (-len(payload) % 4)


def write(holder, *elements, delete=()) -> ElementWrite:
    return ElementWrite("ip", "netagent-test", {holder.name: holder}, {holder.name: tuple(delete)} if delete else {},
                        {holder.name: tuple(elements)} if elements else {})


def test_an_endpoint_slot_is_laid_out_as_nft_writes_it():
    batch, acked = netlink.encode(write(SLOTS, Element(("10.96.0.1", "80", "3"), "10.244.1.5 . 8080")))
    (begin, _, _), (kind, flags, payload), (end, _, _) = messages(batch)
    assert (begin, end, kind, acked) == (0x10, 0x11, (10 << 8) | 12, [2])
    assert flags == 0x1 | 0x4 | 0x400   # request, ack, create (nft's `add`)
    key = socket.inet_aton("10.96.0.1") + b"\0\x50\0\0" + (3).to_bytes(4, sys.byteorder)
    data = socket.inet_aton("10.244.1.5") + b"\x1f\x90\0\0"
    element = attr(1, attr(1, attr(1, key), nested=True) + attr(2, attr(1, data), nested=True), nested=True)
    assert payload == attr(1, b"netagent-test\0") + attr(2, b"SLOTS\0") + attr(3, element, nested=True)


def test_verdicts_comments_and_a_single_port_key():
    batch, _ = netlink.encode(write(VERDICTS, Element(("10.0.0.1", "udp", "53"), "goto IP-C-3"),
                                    Element(("10.0.0.2", "tcp", "80"), "drop")))
    payload = messages(batch)[1][2]
    assert attr(1, struct.pack(">i", -4)) + attr(2, b"IP-C-3\0") in payload           # NFT_GOTO, the chain
    assert attr(1, struct.pack(">i", 0)) in payload                                    # NF_DROP
    assert socket.inet_aton("10.0.0.1") + b"\x11\0\0\0" + b"\0\x35\0\0" in payload     # udp, 53, padded
    batch, _ = netlink.encode(write(NAMES, Element(("tcp", "80"), None, 'ns/a:http "ClusterIP"')))
    assert attr(6, bytes((0, len('ns/a:http \ufffdClusterIP\ufffd'.encode()) + 1))
                + 'ns/a:http \ufffdClusterIP\ufffd'.encode() + b"\0") in messages(batch)[1][2]
    batch, _ = netlink.encode(write(PORTS, Element(("8080",))))
    assert attr(1, attr(1, b"\x1f\x90"), nested=True) in messages(batch)[1][2]   # one part: its own size


def test_deletions_come_first_and_many_elements_fill_several_messages():
    many = [Element((f"10.0.{i // 256}.{i % 256}", "tcp", "80"), "goto IP-C-1") for i in range(5000)]
    batch, acked = netlink.encode(write(VERDICTS, *many, delete=[("10.1.0.1", "tcp", "80")]))
    found = messages(batch)
    assert [kind & 0xff for kind, _, _ in found[1:-1]] == [14] + [12] * (len(found) - 3)
    assert len(acked) == len(found) - 2 > 3
    assert all(len(payload) < 65536 for _, _, payload in found)


@pytest.mark.parametrize("holder, element, reason", [
    (Set("RANGES", ("ipv4_addr",), ("interval",)), Element(("10.0.0.0/8",)), "flags"),
    (Set("IFACES", ("ifname", "ipv4_addr")), Element(('"na0"', "10.0.0.1")), "ifname"),
    (Set("MARKS", ("integer",)), Element(("1",)), "numgen"),
    (VERDICTS, Element(("10.0.0.999", "tcp", "80"), "drop"), "IPv4"),
    (VERDICTS, Element(("10.0.0.1", "tcp", "80"), "queue"), "verdict"),
    (VERDICTS, Element(("10.0.0.1", "tcp", "80")), "without a value"),
    (SLOTS, Element(("10.0.0.1", "80"), "10.0.0.2 . 80"), "does not fit"),
])
def test_what_is_not_encoded_is_refused_with_a_reason(holder, element, reason):
    with pytest.raises(netlink.Unencodable, match=reason):
        netlink.encode(write(holder, element))
    with pytest.raises(netlink.Unencodable, match="declaration"):
        netlink.encode(ElementWrite("ip", "netagent-test", {}, {}, {holder.name: (element,)}))


def test_the_kernels_answers_are_read_by_sequence():
    def error(seq: int, code: int) -> bytes:
        return struct.pack("=IHHIIi", 36, 2, 0, seq, 0, -code) + b"\0" * 16
    assert list(netlink._acks(error(2, 0) + error(3, 17))) == [(2, 0), (3, 17)]


# ---- Changes.apply ---------------------------------------------------------------------------

class NativeFake(FakeNft):
    """A FakeNft that says it writes elements natively, recording how each write came."""
    native_elements = True

    def __init__(self, *, refuse_elements: bool = False) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.refuse_elements = refuse_elements

    def apply(self, batch: str) -> None:
        self.calls.append("text")
        super().apply(batch)

    def apply_elements(self, write: ElementWrite) -> None:
        self.calls.append("elements")
        if self.refuse_elements:
            raise NftError("refused")
        netlink.encode(write)   # what the real runner would send is encodable
        FakeNft.apply(self, write.text())


def table(*addresses: str) -> Table:
    return Table("ip", "netagent-test", (Chain("IP-C-1"),), (
        Map("VERDICTS", VERDICTS.key_type, "verdict", (), tuple(Element((a, "tcp", "80"), "goto IP-C-1") for a in addresses)),
        Set("NAMES", NAMES.key_type, (), (Element(("tcp", "80"), None, "svc"),))))


def held(nft: FakeNft) -> Table | None:
    return tables.read_table("ip", "netagent-test", nft.list_table("ip", "netagent-test"))


def test_a_missing_table_is_its_skeleton_then_its_elements_and_an_element_change_one_write():
    nft = NativeFake()
    assert table_changes(table("10.0.0.1", "10.0.0.2"), None).apply(nft) == 2
    assert nft.calls == ["text", "elements"] and not tables.drift(table("10.0.0.1", "10.0.0.2"), held(nft))
    nft.calls.clear()
    assert table_changes(table("10.0.0.1", "10.0.0.3"), held(nft)).apply(nft) == 1
    assert nft.calls == ["elements"] and not tables.drift(table("10.0.0.1", "10.0.0.3"), held(nft))
    assert table_changes(table("10.0.0.1", "10.0.0.3"), held(nft)).apply(nft) == 0


def test_refused_elements_leave_no_skeleton_behind():
    nft = NativeFake(refuse_elements=True)
    with pytest.raises(NftError):
        table_changes(table("10.0.0.1"), None).apply(nft)
    assert nft.list_table("ip", "netagent-test") is None


def test_a_runner_without_native_elements_gets_the_one_text_batch_as_before():
    nft = FakeNft()
    changes = table_changes(table("10.0.0.1"), None)
    assert changes.apply(nft) == 1 and nft.batches == [changes.text()]
    changes = table_changes(table("10.0.0.2"), held(nft))
    assert changes.apply(nft) == 1 and nft.batches[-1] == changes.text()
