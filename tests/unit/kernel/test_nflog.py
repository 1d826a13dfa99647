"""kernel/nflog.py's parser on bytes the kernel really sent (captured from an nft `log group`
rule in a network namespace: an IPv4 TCP SYN and an IPv6 UDP datagram), on messages cut
anywhere, lying about their lengths, or random, and its config messages' layout."""
from __future__ import annotations

import random
import socket
import struct

import pytest

from netagent.kernel import nflog

# nft `log prefix "NETAGENT-NPI-0123456789abcde" group 7878 snaplen 128` on a SYN 10.9.9.1:40000 -> 10.9.9.2:80
SYN = bytes.fromhex(
    "9800000000040000000000000000000002001ec6080001000800030021000a004e45544147454e542d4e50492d3031323334"
    "3536373839616263646500000000080005000000000308000b000000000008000e0000000000400009004500003c273d4000"
    "4006ed6a0a0909010a0909029c4000509f60002100000000a002faf026430000020405b40402080a889e6953000000000103030a")
# ... `NETAGENT-NPE-...` on UDP [fd00:9::1]:40001 -> [fd00:9::2]:53, payload "hello"
UDP6 = bytes.fromhex(
    "940000000004000000000000000000000a001ec60800010086dd030021000a004e45544147454e542d4e50452d3031323334"
    "3536373839616263646500000000080005000000000308000b000000000008000e0000000000390009006002df48000d1140"
    "fd000009000000000000000000000001fd0000090000000000000000000000029c410035000dfa3468656c6c6f000000")


def test_captured_ipv4_syn():
    batch = nflog.parse_datagram(SYN, now=5.0)
    assert (batch.unreadable, batch.errors) == (0, [])
    (packet,) = batch.packets
    assert (packet.family, packet.group, packet.prefix, packet.outdev) == (
        socket.AF_INET, nflog.POLICY_LOG_GROUP, "NETAGENT-NPI-0123456789abcde", 3)
    assert packet.time == 5.0            # no timestamp attribute on a locally sent packet: when it was read
    assert nflog.parse_headers(packet.payload) == nflog.Headers("10.9.9.1", "10.9.9.2", "tcp", 40000, 80)


def test_captured_ipv6_udp():
    (packet,) = nflog.parse_datagram(UDP6).packets
    assert (packet.family, packet.prefix) == (socket.AF_INET6, "NETAGENT-NPE-0123456789abcde")
    assert nflog.parse_headers(packet.payload) == nflog.Headers("fd00:9::1", "fd00:9::2", "udp", 40001, 53)


def test_two_messages_in_one_datagram():
    batch = nflog.parse_datagram(SYN + UDP6)
    assert [p.prefix.split("-")[1] for p in batch.packets] == ["NPI", "NPE"] and batch.unreadable == 0


@pytest.mark.parametrize("cut", range(1, len(SYN)))
def test_a_cut_message_is_unreadable_never_an_exception(cut):
    batch = nflog.parse_datagram(SYN[:cut])
    assert batch.packets == [] and batch.unreadable == (1 if cut >= 4 else 0)


def test_lying_lengths():
    too_long = struct.pack("=I", len(SYN) + 100) + SYN[4:]
    assert nflog.parse_datagram(too_long).unreadable == 1
    too_short = struct.pack("=I", 8) + SYN[4:]
    assert nflog.parse_datagram(too_short).unreadable == 1
    # an attribute claiming more than its message holds: the message is unreadable, the next one read
    broken = bytearray(SYN)
    struct.pack_into("=H", broken, 20, 0xFFF0)
    batch = nflog.parse_datagram(bytes(broken) + UDP6)
    assert batch.unreadable == 1 and [p.family for p in batch.packets] == [socket.AF_INET6]


def test_random_bytes_never_raise():
    chance = random.Random(33)
    for _ in range(3000):
        data = bytearray(SYN if chance.random() < 0.5 else UDP6)
        for _ in range(chance.randint(1, 8)):
            data[chance.randrange(len(data))] = chance.randrange(256)
        batch = nflog.parse_datagram(bytes(data))
        for packet in batch.packets:
            nflog.parse_headers(packet.payload)
            assert len(packet.payload) <= nflog.COPY_RANGE


def test_headers_refuse_what_is_not_ip_and_read_what_is_short():
    assert nflog.parse_headers(b"") is None
    assert nflog.parse_headers(b"\x45" + b"\0" * 10) is None
    assert nflog.parse_headers(b"\x75" + b"\0" * 40) is None               # version 7
    assert nflog.parse_headers(b"\x4f" + b"\0" * 30) is None               # header of 60 bytes, 31 given
    syn = nflog.parse_datagram(SYN).packets[0].payload
    assert nflog.parse_headers(syn[:22]) == nflog.Headers("10.9.9.1", "10.9.9.2", "tcp")   # no room for ports
    fragment = bytearray(syn)
    struct.pack_into(">H", fragment, 6, 0x0010)                            # a later fragment: no ports
    assert nflog.parse_headers(bytes(fragment)).source_port is None
    icmp = bytearray(syn[:28])
    icmp[9], icmp[20], icmp[21] = 1, 8, 0
    assert nflog.parse_headers(bytes(icmp)).icmp == (8, 0)


def test_an_error_reply_is_reported():
    error = struct.pack("=IHHII", 36, nflog.NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", -16) + b"\0" * 16
    assert nflog.parse_datagram(error).errors == [16]
    ack = struct.pack("=IHHII", 36, nflog.NLMSG_ERROR, 0, 1, 0) + struct.pack("=i", 0) + b"\0" * 16
    assert nflog.parse_datagram(ack).errors == []


def test_config_message_layout():
    message = nflog.config_message(7878, [(nflog.CFG_CMD, bytes([nflog.CMD_BIND]))], sequence=9)
    length, kind, flags, sequence, _ = struct.unpack_from("=IHHII", message)
    assert (length, kind, flags, sequence) == (len(message), nflog.MSG_CONFIG, 0x5, 9)
    assert struct.unpack_from("=BBH", message, 16) == (socket.AF_UNSPEC, 0, socket.htons(7878))
    assert message[20:25] == struct.pack("=HH", 5, nflog.CFG_CMD) + b"\x01" and len(message) % 4 == 0


def test_a_group_out_of_range_is_refused():
    with pytest.raises(nflog.NflogError, match="65536"):
        nflog.NflogSocket(65536)
