"""The contract between the service proxy's core and its backends (iptables, nftables, IPVS,
eBPF), and the proxy-mode names the daemon, the factory and the lab share.

`ServiceProxy` (service_proxy.py) owns the watches, the catalog and the sync runner; a backend
(`ProxyBackend`, one per mode, built by factory.py) only turns a `ProxyState` snapshot into
kernel state. Each sync hands it the whole desired state plus `changed`: the service ports that
differ from the last state the backend programmed successfully (`None` asks for a full sync:
the first one, the periodic one, and every one after a failure). A backend may use `changed` to
write less (a partial sync) but must reach the same kernel state either way; when it cannot
apply a partial sync it raises, and the core's next sync is a full one. Its
`BackendSyncReport` says what it wrote and names the service ports the kernel refused
(`unprogrammed`: the core rejects those while the rest stays programmed).

`programmed()` reads back what is in the kernel (not what was meant), for `netagent status
services`; `cleanup()` removes everything the backend owns; `next_sync_due()` asks for a timed
sync (IPVS: a draining real server) and `table_fill()` reports fixed-size tables (eBPF's maps)
for the metrics. `ProxyMode` lives here because this module imports no backend and no daemon
code, so every one of them can name the modes from it.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from enum import Enum

from netagent.infra.sync_runner import SyncKind
from proxy.model import ProxyState, ServicePortName


class ProxyMode(str, Enum):
    IPTABLES = "iptables"
    IPVS = "ipvs"
    EBPF = "ebpf"
    NFTABLES = "nftables"


NO_PROXY = "none"  # --proxy-mode none: Services are left to another proxy
PROXY_MODE_CHOICES = (*(mode.value for mode in ProxyMode), NO_PROXY)  # what --proxy-mode accepts


@dataclass(frozen=True)
class BackendSyncReport:
    scope: SyncKind
    services_written: int  # service ports whose kernel objects were (re)written
    rules: int             # the size of what is programmed: iptables rules, or IPVS real servers
    detail: str = ""       # one line for the log
    # service ports left out of this sync because the kernel refused their rules (-> why); the
    # rest is programmed. A backend that cannot tell one service port from another raises instead.
    unprogrammed: Mapping[ServicePortName, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class ProgrammedService:
    """One service address as the kernel has it, for `netagent status services`."""

    name: str                  # "namespace/name:port", as the backend labelled it
    address: str               # "10.96.0.10:53/UDP"
    kind: str                  # an EntryKind's word; IPVS: "ServiceAddress" for a server no plan names
    backends: tuple[str, ...]  # "10.244.1.5:53" each; weight or condition in parentheses if not plain


class ProxyBackend(ABC):
    mode: ProxyMode

    @abstractmethod
    def sync(self, state: ProxyState, *, changed: frozenset[ServicePortName] | None) -> BackendSyncReport:
        """Program `state`; `changed` None means a full sync (adopt, repair, remove stale)."""

    @abstractmethod
    def programmed(self) -> list[ProgrammedService]:
        """What the kernel holds now, read back."""

    def next_sync_due(self) -> float | None:
        """A `time.monotonic()` time by which the backend needs a sync even if nothing changes
        (IPVS: a draining real server's timeout); None when it needs none."""
        return None

    def table_fill(self) -> Mapping[str, tuple[int, int]]:
        """Each fixed-size kernel table this backend owns -> (entries now, capacity), read from
        the kernel when asked (eBPF: every pinned map, for the metrics' scrapes); empty for
        backends without such tables."""
        return {}

    @abstractmethod
    def cleanup(self) -> None:
        """Remove every rule, set, virtual server and device this backend owns; idempotent."""
