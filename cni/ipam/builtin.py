"""`BuiltinIpam`: the in-process IPAM handlers (the `Handlers` protocol of cni.dispatch).

Serves `ipam.type` "netagent" / "netagent-ipam" for the agent, the in-process fallback
of the thin client and the standalone `netagent-ipam` binary. Each call re-parses
`conf.ipam` (cheap, and a changed config takes effect at once), picks the store for the
network and hands the work to `allocator`, which holds the data directory's lock for
the whole operation. No subprocesses, no logging: this runs on the per-pod hot path and
under `python -I -S`.

Requested addresses are gathered from every place host-local reads them, plus ours:
`CNI_ARGS` `IP=a[,b]`, the config's `args.cni.ips`, `runtimeConfig.ips` (the `ips`
capability) and `ipam.ips`. DNS is `ipam.dns` when given, else host-local's `resolvConf`
file, else empty.
"""
from __future__ import annotations

import copy
from collections.abc import Callable

from cni.config import NetConf
from cni.errors import CniError, ErrorCode
from cni.ipam import allocator
from cni.ipam.allocation import AllocatedIp, Allocation
from cni.ipam.config import IpamConf, assign_requested, parse_requested_ips, read_resolv_conf
from cni.ipam.store import DiskStore, ReservationStore
from cni.request import CniRequest


def parse_for(conf: NetConf) -> IpamConf:
    """`conf.ipam` parsed: once per config (`NetConf.builtin_ipam`), however many steps ask."""
    return conf.builtin_ipam()


def disk_store_for(ipam: IpamConf) -> DiskStore:
    return DiskStore(ipam.network_dir)


def requested_addresses(conf: NetConf, req: CniRequest, ipam: IpamConf) -> list:
    """Every requested address, in host-local's order (CNI_ARGS, args, runtimeConfig)."""
    ip_arg = req.args.get("IP", "")
    addresses = parse_requested_ips([p.strip() for p in ip_arg.split(",") if p.strip()],
                                    source="CNI_ARGS IP", code=ErrorCode.INVALID_ENVIRONMENT)
    args = conf.raw.get("args")
    if isinstance(args, dict) and isinstance(args.get("cni"), dict):
        addresses += parse_requested_ips(args["cni"].get("ips"), source="args.cni.ips")
    addresses += parse_requested_ips(conf.runtime_config.get("ips"), source="runtimeConfig.ips")
    addresses += ipam.requested
    return addresses


def dns_for(ipam: IpamConf) -> dict:
    if ipam.dns:
        return copy.deepcopy(ipam.dns)
    if ipam.resolv_conf:
        return read_resolv_conf(ipam.resolv_conf)
    return {}


class BuiltinIpam:
    """host-local compatible IPAM over a data directory (or any store, for tests)."""

    def __init__(self, *, store_for: Callable[[IpamConf], ReservationStore] | None = None) -> None:
        self._store_for = store_for or disk_store_for

    def add(self, conf: NetConf, req: CniRequest) -> dict:
        return self.allocate(conf, req).to_result()

    def allocate(self, conf: NetConf, req: CniRequest) -> Allocation:
        """ADD with typed values: the main plugin's handlers use these, never the strings."""
        ipam = parse_for(conf)
        requested = assign_requested(ipam, requested_addresses(conf, req, ipam))
        dns = dns_for(ipam)
        leases = allocator.allocate(self._store_for(ipam), ipam, container_id=req.container_id,
                                    ifname=req.ifname, requested=requested)
        return Allocation(ips=tuple(AllocatedIp(address=lease.interface, gateway=lease.gateway) for lease in leases),
                          routes=tuple(dict(route) for route in ipam.routes), dns=dns)

    def delete(self, conf: NetConf, req: CniRequest) -> None:
        ipam = parse_for(conf)
        allocator.release(self._store_for(ipam), container_id=req.container_id,
                          ifname=req.ifname)

    def check(self, conf: NetConf, req: CniRequest) -> None:
        ipam = parse_for(conf)
        missing = allocator.missing_sets(self._store_for(ipam), ipam,
                                         container_id=req.container_id, ifname=req.ifname)
        if missing:
            sets = ", ".join(f"{i} ({ipam.range_sets[i]})" for i in missing)
            raise CniError(ErrorCode.CHECK_FAILED,
                           f"no address reserved for container {req.container_id} "
                           f"interface {req.ifname} in range set {sets}",
                           f"data directory {ipam.network_dir}")

    def gc(self, conf: NetConf, req: CniRequest, valid: set) -> None:
        ipam = parse_for(conf)
        allocator.collect_garbage(self._store_for(ipam), valid=valid)

    def status(self, conf: NetConf, req: CniRequest) -> None:
        ipam = parse_for(conf)
        store = self._store_for(ipam)
        try:
            store.ensure_writable()
        except CniError as err:
            raise CniError(ErrorCode.NOT_AVAILABLE,
                           f"IPAM data directory {ipam.network_dir} is not usable",
                           f"{err.msg}: {err.details}" if err.details else err.msg) from None
        exhausted = allocator.exhausted_sets(store, ipam)
        if exhausted:
            first = allocator.exhausted_error(ipam, exhausted[0])
            raise CniError(ErrorCode.NOT_AVAILABLE, first.msg,
                           f"exhausted range set(s): {', '.join(map(str, exhausted))}")
