"""ebpf/ringbuf.py's parser on crafted rings: wrap-around, busy and discarded records, lengths
and positions that lie; and the per-CPU counter's arithmetic."""
import struct

import pytest

from ebpf.ringbuf import BUSY, DISCARD, parse, possible_cpus, sum_per_cpu

SIZE = 64


class Ring:
    """A ring of SIZE data bytes the way the kernel maps it: twice in a row."""

    def __init__(self):
        self.data = bytearray(SIZE)
        self.producer = 0

    def put(self, payload: bytes, *, flags: int = 0, length: int | None = None) -> int:
        at = self.producer
        header = struct.pack("<II", (len(payload) if length is None else length) | flags, 0)
        for i, byte in enumerate(header + payload):
            self.data[(at + i) % SIZE] = byte
        self.producer += (len(payload) + 8 + 7) & ~7
        return at

    def mapped(self) -> bytes:
        return bytes(self.data) * 2

    def parse(self, consumer: int = 0, **kw):
        return parse(self.mapped(), SIZE, consumer, self.producer, **kw)


def test_records_in_order_and_the_consumer_moves_past_them():
    ring = Ring()
    ring.put(b"abc")
    ring.put(b"0123456789")
    parsed = ring.parse()
    assert parsed.records == [b"abc", b"0123456789"]
    assert parsed.consumer == ring.producer == 16 + 24 and parsed.garbage == 0


def test_a_record_wrapping_round_the_end_reads_whole():
    ring = Ring()
    ring.producer = start = 48            # as if 48 bytes were consumed already
    ring.put(b"wrapping-record!")         # 8 + 16 bytes from 48: its payload runs past 64
    parsed = ring.parse(consumer=start)
    assert parsed.records == [b"wrapping-record!"] and parsed.consumer == start + 24


def test_a_busy_record_stops_the_reader_and_later_records_wait():
    ring = Ring()
    ring.put(b"one")
    busy_at = ring.put(b"two", flags=BUSY)
    ring.put(b"three")
    parsed = ring.parse()
    assert parsed.records == [b"one"] and parsed.consumer == busy_at and parsed.garbage == 0


def test_a_discarded_record_is_skipped():
    ring = Ring()
    ring.put(b"gone", flags=DISCARD)
    ring.put(b"kept")
    parsed = ring.parse()
    assert parsed.records == [b"kept"] and parsed.consumer == ring.producer


@pytest.mark.parametrize("length", [17, 1000, 0x3FFFFFFF])
def test_a_length_past_the_producer_is_garbage_skipped_to_the_producer(length):
    ring = Ring()
    ring.put(b"fine")
    ring.put(b"x" * 8, length=length)     # says more than was written
    parsed = ring.parse()
    assert parsed.records == [b"fine"] and parsed.consumer == ring.producer and parsed.garbage == 1


@pytest.mark.parametrize("consumer, producer", [(8, 0), (0, SIZE + 8), (3, 16)])
def test_positions_that_make_no_sense_are_skipped_never_read(consumer, producer):
    parsed = parse(bytes(2 * SIZE), SIZE, consumer, producer)
    assert parsed.records == [] and parsed.consumer == producer and parsed.garbage == 1


def test_nothing_new_reads_nothing():
    assert parse(bytes(2 * SIZE), SIZE, 40, 40) == parse(bytes(2 * SIZE), SIZE, 40, 40)
    assert parse(bytes(2 * SIZE), SIZE, 40, 40).records == []


def test_at_most_limit_records_a_batch():
    ring = Ring()
    for word in (b"a", b"b", b"c"):
        ring.put(word)
    first = ring.parse(limit=2)
    assert first.records == [b"a", b"b"]
    assert ring.parse(consumer=first.consumer).records == [b"c"]


def test_a_ring_that_is_not_a_power_of_two_or_not_mapped_twice_is_refused():
    with pytest.raises(ValueError):
        parse(bytes(96), 48, 0, 0)
    with pytest.raises(ValueError):
        parse(bytes(SIZE), SIZE, 0, 0)


def test_per_cpu_values_and_possible_cpus():
    assert possible_cpus("0-3\n") == 4 and possible_cpus("0") == 1 and possible_cpus("0-1,3") == 4
    assert sum_per_cpu(struct.pack("<3Q", 1, 2, 39), 3) == 42
