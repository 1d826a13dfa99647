"""IPAM for the netagent CNI plugin: who hands out pod addresses, and where they are kept.

Two implementations of one set of handlers (add, delete, check, gc, status; see the
`Ipam`: `cni.dispatch.Handlers` plus `allocate`, ADD as an `allocation.Allocation`): `BuiltinIpam` (ipam.type "netagent" or "netagent-ipam") allocates in
process from a host-local compatible data directory, and `DelegatedIpam` runs any other
IPAM plugin binary found in CNI_PATH. `ipam_for` picks one per config.

Layout: `config` parses the `ipam` section, `store` owns the files, `allocator` the
allocation rules, `builtin`/`delegate` the handlers, `plugin` the standalone binary.
Both implementations are imported lazily so that loading this package costs nothing,
and the builtin path never imports `subprocess`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from cni.config import NetConf

if TYPE_CHECKING:  # IPAM answers the dispatcher's five operations; importing it costs `logging`
    from cni.dispatch import Handlers
    from cni.ipam.allocation import Allocation
    from cni.request import CniRequest

    class Ipam(Handlers, Protocol):
        """...and ADD as values (`allocate`), what the main plugin's handlers use."""
        def allocate(self, conf: NetConf, req: CniRequest) -> Allocation: ...


def ipam_for(conf: NetConf) -> "Ipam":
    """The handlers serving `conf.ipam.type`: builtin for ours, delegated otherwise."""
    if conf.ipam_is_builtin:
        from cni.ipam.builtin import BuiltinIpam

        return BuiltinIpam()
    from cni.ipam.delegate import DelegatedIpam

    return DelegatedIpam()
