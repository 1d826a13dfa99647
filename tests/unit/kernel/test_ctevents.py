"""kernel/ctevents.py's parser on a new-connection event the kernel really sent (captured in a
network namespace: a TCP connect to 10.96.0.10:80 that an nft rule DNATs to 10.9.9.2:8080), on
messages cut anywhere or lying about lengths, and on random damage."""
from __future__ import annotations

import random
import struct

import pytest

from netagent.kernel import ctevents

DNAT = bytes.fromhex(
    "c4000000000100060000000000000000020000003400018014000180080001000a090901080002000a60000a1c0002800500"
    "010006000000060002009c42000006000300005000003400028014000180080001000a090902080002000a0909011c000280"
    "0500010006000000060002001f900000060003009c42000008000c00f9719bb908000300000001a808000700000000783000"
    "04802c0001800500010001000000050002000a000000050003000000000006000400030000000600050000000000")


def test_captured_dnat_event():
    batch = ctevents.parse_events(DNAT)
    assert batch.unreadable == 0
    (event,) = batch.connections
    assert event.original == ctevents.Tuple("10.9.9.1", "10.96.0.10", "tcp", 40002, 80)
    assert event.reply == ctevents.Tuple("10.9.9.2", "10.9.9.1", "tcp", 8080, 40002)
    assert event.translated


def test_an_untranslated_connection():
    original = ctevents.Tuple("10.0.0.1", "10.0.0.2", "udp", 5, 53)
    reply = ctevents.Tuple("10.0.0.2", "10.0.0.1", "udp", 53, 5)
    assert not ctevents.NewConnection(original, reply).translated


@pytest.mark.parametrize("cut", range(1, len(DNAT)))
def test_a_cut_event_is_unreadable_never_an_exception(cut):
    batch = ctevents.parse_events(DNAT[:cut])
    assert batch.connections == [] and batch.unreadable == (1 if cut >= 4 else 0)


def test_lying_lengths_and_two_events():
    assert len(ctevents.parse_events(DNAT + DNAT).connections) == 2
    assert ctevents.parse_events(struct.pack("=I", len(DNAT) + 8) + DNAT[4:]).unreadable == 1
    broken = bytearray(DNAT)
    struct.pack_into("=H", broken, 20, 0xFFF0)          # the original tuple claims more than the message
    batch = ctevents.parse_events(bytes(broken) + DNAT)
    assert batch.unreadable == 1 and len(batch.connections) == 1


def test_random_damage_never_raises():
    chance = random.Random(33)
    for _ in range(3000):
        data = bytearray(DNAT)
        for _ in range(chance.randint(1, 8)):
            data[chance.randrange(len(data))] = chance.randrange(256)
        for event in ctevents.parse_events(bytes(data)).connections:
            assert event.original.protocol and event.reply.source
