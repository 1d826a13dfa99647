"""The one reader of a BPF ring buffer (BPF_MAP_TYPE_RINGBUF), by mmap and epoll, without libbpf.

The kernel lays a ring buffer map out in pages: the consumer page (the position we have read
up to, the only page we may write), the producer page (the position written up to) and the
data, `size` bytes (a power of two) mapped twice in a row so a record that wraps round the end
reads as one slice. Each record starts at an 8-aligned position with an 8-byte header: its
length in the low 30 bits of the first word, BUSY (bit 31: reserved, not yet submitted) and
DISCARD (bit 30: skip it); the next record is at the length plus the header, rounded up to 8.

Nothing in the ring is trusted: `parse` (pure, over bytes, so tests feed it crafted rings)
never reads past the producer position, stops at a busy record (the producer will submit it;
records after it wait, as the kernel orders them), skips discarded ones, and treats a length
that would run past the producer, or positions that do not make sense, as garbage: the rest up
to the producer is skipped and counted, so one bad header cannot wedge or crash the reader.

`RingBuffer` opens a pinned map (BPF_OBJ_GET), maps it, waits for data with epoll on the map's
descriptor and hands out `RingBatch`es (the records, the events the full ring dropped since the
last batch as counted by the programs in a per-CPU array beside it, the garbage skipped): an
`EventSocket` for infra/flows.py's `FlowListener`.
"""
from __future__ import annotations

import mmap
import os
import select
import struct
from dataclasses import dataclass, field

from ebpf import syscall

MAP_TYPE_RINGBUF = 27
MAP_TYPE_PERCPU_ARRAY = 6
BUSY = 1 << 31
DISCARD = 1 << 30
HEADER = 8
MAX_RECORDS = 4096          # per batch: a full ring is read in several, the listener's stop flag between
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")


class RingBufferError(syscall.BpfError):
    pass


@dataclass
class RingBatch:
    records: list[bytes] = field(default_factory=list)
    lost: int = 0               # dropped by the programs, the ring being full
    garbage: int = 0            # unreadable stretches skipped (each up to the producer position)


@dataclass(frozen=True)
class Parsed:
    records: list[bytes]
    consumer: int               # the position to write back
    garbage: int                # 1 when an unreadable stretch was skipped


def parse(data: bytes | memoryview | mmap.mmap, size: int, consumer: int, producer: int, *,
          base: int = 0, limit: int = MAX_RECORDS) -> Parsed:
    """The records between `consumer` and `producer` in a ring of `size` data bytes laid out at
    `data[base:]` twice (2 * size bytes), at most `limit` of them."""
    if size <= 0 or size & (size - 1):
        raise ValueError(f"a ring buffer's size is a power of two, not {size}")
    if len(data) < base + 2 * size:
        raise ValueError(f"{len(data) - base} bytes cannot hold a ring of {size} mapped twice")
    if not 0 <= producer - consumer <= size or consumer % 8:
        return Parsed([], producer, 1)   # nonsense positions: skip to the producer
    records: list[bytes] = []
    while consumer < producer and len(records) < limit:
        offset = base + (consumer & (size - 1))
        header, = _U32.unpack_from(data, offset)
        if header & BUSY:
            break
        length = header & ~(BUSY | DISCARD)
        total = (length + HEADER + 7) & ~7
        if total > producer - consumer:
            return Parsed(records, producer, 1)
        if not header & DISCARD:
            start = offset + HEADER
            records.append(bytes(data[start:start + length]))
        consumer += total
    return Parsed(records, consumer, 0)


def possible_cpus(text: str | None = None) -> int:
    """How many CPUs a per-CPU map has values for (/sys/devices/system/cpu/possible: `0-3,5`)."""
    if text is None:
        with open("/sys/devices/system/cpu/possible") as possible:
            text = possible.read()
    highest = -1
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        highest = max(highest, int(last or first))
    return highest + 1


def sum_per_cpu(raw: bytes, cpus: int) -> int:
    """A per-CPU u64's values (8 bytes each) summed."""
    return sum(_U64.unpack_from(raw, 8 * cpu)[0] for cpu in range(cpus))


class RingBuffer:
    """A pinned ring buffer map (`path`) mapped for reading, with its drop counter (`lost_path`,
    a per-CPU array of one u64) when given."""

    def __init__(self, path: str, lost_path: str | None = None) -> None:
        self._fd = syscall.obj_get(path)
        self._maps: list[mmap.mmap] = []
        self._lost_fd = -1
        try:
            info = syscall.map_info(self._fd)
            page = mmap.PAGESIZE
            if info.type != MAP_TYPE_RINGBUF:
                raise RingBufferError(0, f"{path}: map type {info.type}, not a ring buffer")
            self.size = info.max_entries
            if self.size <= 0 or self.size & (self.size - 1) or self.size % page:
                raise RingBufferError(0, f"{path}: a ring of {self.size} bytes")
            self._consumer = mmap.mmap(self._fd, page, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            self._maps.append(self._consumer)
            self._producer = mmap.mmap(self._fd, page + 2 * self.size, mmap.MAP_SHARED, mmap.PROT_READ,
                                       offset=page)
            self._maps.append(self._producer)
            self._page = page
            self._poll = select.epoll()
            self._poll.register(self._fd, select.EPOLLIN)
            self._cpus = possible_cpus()
            self._lost_seen = 0
            if lost_path is not None:
                self._lost_fd = syscall.obj_get(lost_path)
                self._lost_seen = self.lost_total()   # drops before we read are not ours to report
        except BaseException:
            self.close()
            raise

    def lost_total(self) -> int:
        if self._lost_fd < 0:
            return 0
        raw = syscall.map_lookup(self._lost_fd, b"\0\0\0\0", 8 * self._cpus)
        return sum_per_cpu(raw, self._cpus) if raw is not None else 0

    def pending(self) -> bool:
        return _U64.unpack_from(self._producer, 0)[0] != _U64.unpack_from(self._consumer, 0)[0]

    def read(self, limit: int = MAX_RECORDS) -> RingBatch:
        """What is there now, without waiting; the consumer position moves past it."""
        consumer = _U64.unpack_from(self._consumer, 0)[0]
        producer = _U64.unpack_from(self._producer, 0)[0]
        parsed = parse(self._producer, self.size, consumer, producer, base=self._page, limit=limit)
        if parsed.consumer != consumer:
            _U64.pack_into(self._consumer, 0, parsed.consumer)
        lost = self.lost_total()
        batch = RingBatch(parsed.records, max(lost - self._lost_seen, 0), parsed.garbage)
        self._lost_seen = lost
        return batch

    def receive(self, timeout: float) -> RingBatch:
        """A batch of what arrived within `timeout` seconds (maybe empty)."""
        if not self.pending():
            self._poll.poll(timeout)
        return self.read()

    def close(self) -> None:
        for mapping in self._maps:
            mapping.close()
        self._maps = []
        if hasattr(self, "_poll"):
            self._poll.close()
        for fd in (self._fd, self._lost_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._lost_fd = -1
