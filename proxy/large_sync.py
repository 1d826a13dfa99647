"""What keeps a full sync of tens of thousands of service ports fast, shared by the backends.

Two measured shortcuts, each with one home here so the iptables, nftables and eBPF backends
take the same one instead of importing each other's private names:

- `CANONICAL_IPV4`: an address already in canonical dotted-decimal form is spelled as is
  (checking 200,000 addresses through `ipaddress` cost seconds of a 10k-service sync); anything
  else still goes through the backend's own canonicalising function, which refuses bad text.
- `collector_paused()`: the cyclic garbage collector off for one sync (see its docstring).
"""
from __future__ import annotations

import contextlib
import gc
import re
from collections.abc import Iterator

CANONICAL_IPV4 = re.compile(r"(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)")


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """A full sync allocates a few hundred thousand short-lived, acyclic objects next to the
    agent's large long-lived state; the cyclic collector would rescan that state many times
    (measured: half the time of a 10k-service sync). Paused for the sync, collected after."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
