"""`FakeConntrack`: the `Conntrack` seam in memory, for unit tests of conntrack cleanup.

It holds UDP entries as the kernel would (original destination, destination port, reply
source), deletes what a `FlowFilter` selects exactly as `conntrack -D` does with the same
options, records every filter it was asked to delete (in order), and can be told to fail
on chosen filters, or on all, as a missing tool or table would.
"""
from __future__ import annotations

from dataclasses import dataclass

from proxy.conntrack import Conntrack, ConntrackError, FlowFilter


@dataclass(frozen=True)
class UdpEntry:
    """One tracked UDP flow: sent to `destination:port`, answered from `reply_source`."""
    destination: str
    port: int
    reply_source: str


def _selects(flow: FlowFilter, entry: UdpEntry) -> bool:
    return (entry.port == flow.port and flow.address in (None, entry.destination)
            and flow.reply_source in (None, entry.reply_source))


class FakeConntrack(Conntrack):
    def __init__(self, entries: tuple[UdpEntry, ...] = ()) -> None:
        self.entries: set[UdpEntry] = set(entries)
        self.deletions: list[FlowFilter] = []          # every filter asked, failed ones included
        self.fail_on: set[FlowFilter] = set()
        self.fail_all = False

    def add(self, *, destination: str, port: int, reply_source: str) -> None:
        self.entries.add(UdpEntry(destination, port, reply_source))

    def delete(self, flow: FlowFilter) -> int:
        self.deletions.append(flow)
        if self.fail_all or flow in self.fail_on:
            raise ConntrackError(f"conntrack {' '.join(flow.argv())}: injected failure")
        gone = {entry for entry in self.entries if _selects(flow, entry)}
        self.entries -= gone
        return len(gone)
