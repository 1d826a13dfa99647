"""The plugin's operations: ADD, DEL, CHECK, GC and STATUS over IPAM and pod wiring.

ADD is linear, in the reference bridge plugin's style: each step that changes something
pushes its undo onto a stack, and any failure unwinds the stack before the error goes
out, so a failed ADD leaves no veth and no reservation. One overlap breaks the line on
purpose: the IPAM reservation (file I/O) runs on a helper thread while this thread has
the kernel create the veth pair, since neither needs the other (about 1.3 ms saved). DEL is forgiving by design: the
netns, the veth or the reservation may already be gone, and DEL may come twice.

Every kernel step goes through the seam of `cni.kernel` (`self.kernel`): the netlink one in
production, `cni.fake_kernel.FakeCniKernel` in unit tests, which can fail any step. What the
pod side and the node side look like is computed in `cni.wiring`; CHECK's verdict in
`cni.check`. This module owns only the order of the steps and their undoing, and holds
the attachment's lock (`cni.attachment_lock`) around ADD, DEL and CHECK, so a DEL racing
an ADD of the same container waits for it instead of tearing it down half-way.
"""
from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Protocol

from cni import attachment_lock
from cni import check as cni_check
from cni import wiring
from cni.attachment_lock import AttachmentLock
from cni.config import NetConf
from cni.errors import CniError, ErrorCode
from cni.ipam import ipam_for
from cni.kernel import Address, BridgeSpec, CniKernel, LinkExists, VethPair
from cni.request import CniRequest
from netagent.kernel.errors import KernelError
from netagent.kernel.families import IpFamily
from netagent.kernel.pod_attachment import PodAttachment

if TYPE_CHECKING:
    from cni.ipam import Ipam
    from cni.ipam.allocation import Allocation

log = logging.getLogger("netagent.cni")
_ipam_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ipam")


class PendingDeletes(Protocol):
    """The agent's `DeferredDeleter`, as the handlers use it."""

    def submit(self, key: str, conf: NetConf, req: CniRequest) -> None: ...
    def wait_for(self, key: str, timeout: float = ...) -> bool: ...
    def wait_idle(self, timeout: float = ...) -> bool: ...


def _release_if_reserved(allocation: Future, ipam: Ipam, conf: NetConf, req: CniRequest) -> None:
    """Undo for the background reservation: release only what this call reserved."""
    try:
        allocation.result()
    except BaseException:
        return  # nothing was reserved (or a duplicate: the addresses are not ours to free)
    ipam.delete(conf, req)


def _node_route_refused(exc: KernelError) -> Exception:
    """The node's route to a routed pod is already there: another attachment (of another
    network sharing this subnet on this node) routes the address."""
    if exc.code == errno.EEXIST:
        return CniError(ErrorCode.ADDRESS_CONFLICT, "the node already routes this pod address to another "
                        "attachment (another network with an overlapping subnet?)", str(exc))
    return exc


def _interface_exists(exc: LinkExists, *, host_name: str, pod_ifname: str) -> CniError:
    if exc.name == host_name:
        return CniError(ErrorCode.INTERFACE_EXISTS, f"host interface {host_name} already exists",
                        "an earlier ADD for this container and interface was not cleaned up with DEL")
    return CniError(ErrorCode.INTERFACE_EXISTS, f"interface {pod_ifname} already exists in the container")


def _pod_setup_refused(exc: KernelError) -> Exception:
    """The pod side's refusals that say something about the request, with their own codes."""
    if exc.code == errno.EEXIST:  # e.g. a second attachment of this network wants the default route too
        return CniError(ErrorCode.ADDRESS_CONFLICT, "the pod already holds an address or route this "
                        "attachment needs", str(exc))
    if exc.code == errno.ENETUNREACH:
        return CniError(ErrorCode.INVALID_CONFIG, "a route's gateway is not reachable from the pod's addresses",
                        str(exc))
    return exc


class PluginHandlers:
    """The `Handlers` of `cni.dispatch` for the netagent plugin.

    `deferred` (the agent's `DeferredDeleter`, or None in-process) lets DEL reply once the
    request is validated and journaled; the kernel teardown then finishes in the background.
    `kernel` is the kernel seam (`cni.kernel`): the real one unless a test hands in a fake;
    `ipam` picks the IPAM handlers per config (`cni.ipam.ipam_for`; a test's store behind them).
    """

    def __init__(self, *, deferred: PendingDeletes | None = None, kernel: CniKernel | None = None,
                 lock_timeout: float = attachment_lock.LOCK_TIMEOUT,
                 ipam: Callable[[NetConf], Ipam] = ipam_for) -> None:
        self.deferred = deferred
        self.lock_timeout = lock_timeout
        self.ipam_for = ipam
        if kernel is None:
            from cni.netlink_kernel import NetlinkCniKernel
            kernel = NetlinkCniKernel()
        self.kernel = kernel

    def _locked(self, conf: NetConf, host_name: str) -> AbstractContextManager[AttachmentLock]:
        """The attachment's lock (`cni.attachment_lock`), shared with every other path."""
        return attachment_lock.held(attachment_lock.lock_path(conf, host_name), timeout=self.lock_timeout)

    def add(self, conf: NetConf, req: CniRequest) -> dict:
        validate_ipam(conf, req)  # a config error is code 7 before anything is locked or built
        host_name = wiring.host_veth_name(conf.name, req.container_id, req.ifname)
        while True:
            if self.deferred is not None:
                self.deferred.wait_for(host_name)  # a DEL of this same attachment still finishing
            with self._locked(conf, host_name) as lock:
                if self.deferred is not None and not self.deferred.wait_for(host_name, 0):
                    continue  # a DEL was journaled before we got the lock: it goes first
                return self._add_locked(conf, req, host_name, lock)

    def _add_locked(self, conf: NetConf, req: CniRequest, host_name: str, lock: AttachmentLock) -> dict:
        undo: list[Callable[[], object]] = [lock.remove]
        try:
            return self._add(conf, req, host_name, undo)
        except BaseException as exc:
            for step in reversed(undo):
                try:
                    step()
                except Exception:  # keep unwinding; the original error is what matters
                    log.exception("rollback step failed after ADD error")
            if isinstance(exc, KernelError):
                raise CniError(ErrorCode.INTERNAL, "netlink request failed", str(exc)) from None
            raise

    def _add(self, conf: NetConf, req: CniRequest, host_name: str, undo: list[Callable[[], object]]) -> dict:
        kernel = self.kernel
        pod_netns = kernel.open_netns(req.netns)
        undo.append(lambda: kernel.close_netns(pod_netns))
        ipam = self.ipam_for(conf)
        allocation = _ipam_pool.submit(ipam.allocate, conf, req)
        undo.append(lambda: _release_if_reserved(allocation, ipam, conf, req))

        pair = VethPair(host_name=host_name, pod_ifname=req.ifname, mtu=conf.mtu,
                        host_mac=wiring.host_mac_for(conf.mode), pod_mac=wiring.random_mac(),
                        alias=wiring.network_alias(conf.name))
        known_bridge = kernel.known_bridge(conf.bridge) if conf.mode is PodAttachment.BRIDGE else None
        # pushed first: whatever the creation left under host_name is ours, unless the name was taken
        undo.append(lambda: kernel.delete_link(host_name))
        try:
            enslaved = kernel.create_veth(pair, pod_netns, master=known_bridge)
        except LinkExists as exc:
            undo.pop()
            raise _interface_exists(exc, host_name=host_name, pod_ifname=req.ifname) from None

        allocated: Allocation = allocation.result()
        addresses = [ip.address for ip in allocated.ips]
        if not addresses:
            raise CniError(ErrorCode.INVALID_CONFIG, "IPAM returned no addresses")
        gateways: dict[IpFamily, Address] = allocated.gateways()

        interfaces: list[dict[str, object]] = []
        bridge = None
        families = wiring.families_of(addresses)
        if conf.mode is PodAttachment.BRIDGE:
            bridge_gateways = wiring.bridge_gateways(addresses, gateways)
            bridge = kernel.ensure_bridge(BridgeSpec(name=conf.bridge, mtu=conf.mtu, gateways=bridge_gateways,
                                                     settings=wiring.bridge_settings(bridge_gateways)))
            for family in sorted(wiring.families_of(bridge_gateways), key=lambda f: f.value):
                kernel.enable_forwarding(family)
            interfaces.append({"name": conf.bridge, "mac": bridge.mac})
        host_settings = wiring.host_veth_settings(conf.mode, families)
        if host_settings:  # before the pod end is up: the host end has no carrier yet
            kernel.set_link_settings(host_name, host_settings)
        setup, routes = wiring.plan_pod(ifname=req.ifname, mode=conf.mode, addresses=addresses,
                                        gateways=gateways, routes=list(allocated.routes),
                                        host_mac=pair.host_mac)
        try:
            kernel.configure_pod(pod_netns, setup)
        except KernelError as exc:
            raise _pod_setup_refused(exc) from None
        if bridge is not None:
            try:
                if not (enslaved and known_bridge is not None and bridge.index == known_bridge.index):
                    kernel.attach_to_bridge(host_name, bridge)
                if conf.hairpin_mode:
                    kernel.set_hairpin(host_name)
            except KernelError as exc:
                kernel.forget_bridge(conf.bridge)  # someone removed it under us: next ADD repairs
                raise CniError(ErrorCode.TRY_AGAIN_LATER, f"bridge {conf.bridge} changed during ADD",
                               str(exc)) from None
        else:
            for family in sorted(families, key=lambda f: f.value):
                kernel.enable_forwarding(family)
            try:
                kernel.route_to_pod(wiring.plan_node_routes(host_name=host_name, addresses=addresses,
                                                            pod_mac=pair.pod_mac))
            except KernelError as exc:
                raise _node_route_refused(exc) from None

        kernel.close_netns(pod_netns)
        undo.clear()
        pod_index = len(interfaces) + 1
        interfaces.append({"name": host_name, "mac": pair.host_mac})
        interfaces.append({"name": req.ifname, "mac": pair.pod_mac, "sandbox": req.netns, "mtu": conf.mtu})
        ips = []
        for ip in allocated.ips:
            addr = ip.address
            routed = conf.mode is PodAttachment.ROUTED
            entry: dict[str, object] = {"address": f"{addr.ip}/{addr.max_prefixlen}" if routed else str(addr),
                                        "interface": pod_index}
            family = IpFamily.of(addr.ip)
            gateway = wiring.pod_gateway(conf.mode, family, gateways.get(family))
            if gateway is not None:
                entry["gateway"] = str(gateway)
            ips.append(entry)
        return {"interfaces": interfaces, "ips": ips, "routes": routes,
                "dns": conf.dns or allocated.dns or {}}

    def delete(self, conf: NetConf, req: CniRequest) -> None:
        if self.deferred is None:
            self.delete_now(conf, req)
            return
        validate_ipam(conf, req)  # a config error is still reported to the runtime
        host_name = wiring.host_veth_name(conf.name, req.container_id, req.ifname)
        with self._locked(conf, host_name):  # journaled after an ADD in progress, never during it
            self.deferred.submit(host_name, conf, req)

    def delete_now(self, conf: NetConf, req: CniRequest) -> None:
        """The veth first, then the addresses, so no address is reused while a veth holds it.

        Deleting the host end removes the pod end with it; the netns is not needed. When the
        host end is already gone, whatever the pod holds under ifname is not ours.
        """
        validate_ipam(conf, req)
        host_name = wiring.host_veth_name(conf.name, req.container_id, req.ifname)
        with self._locked(conf, host_name) as lock:
            try:
                self.kernel.delete_link(host_name)
            except KernelError as exc:
                raise CniError(ErrorCode.INTERNAL, f"cannot delete {host_name}", str(exc)) from None
            self.ipam_for(conf).delete(conf, req)
            lock.remove()

    def check(self, conf: NetConf, req: CniRequest) -> None:
        validate_ipam(conf, req)
        host_name = wiring.host_veth_name(conf.name, req.container_id, req.ifname)
        with self._locked(conf, host_name):
            self._check(conf, req, host_name)

    def _check(self, conf: NetConf, req: CniRequest, host_name: str) -> None:
        """Read both ends through the kernel seam; `cni.check` says what differs."""
        self.ipam_for(conf).check(conf, req)
        expected = cni_check.expected_from(conf.prev_result or {}, ifname=req.ifname, host_name=host_name,
                                           mode=conf.mode, bridge=conf.bridge)
        pod_netns = self.kernel.open_netns(req.netns)
        try:
            pod = self.kernel.read_pod_interface(pod_netns, req.ifname)
        finally:
            self.kernel.close_netns(pod_netns)
        host = self.kernel.read_host_veth(host_name) if pod is not None else None
        findings = cni_check.find_problems(expected, pod, host)
        if findings:
            raise CniError(ErrorCode.CHECK_FAILED, "; ".join(f.message for f in findings))

    def gc(self, conf: NetConf, req: CniRequest, valid: set) -> None:
        validate_ipam(conf, req)  # a config error is code 7, not one of GC's collected errors
        if self.deferred is not None:
            self.deferred.wait_idle()
        errors = []
        try:
            self.ipam_for(conf).gc(conf, req, valid)
        except CniError as err:
            errors.append(str(err))
        keep = {wiring.host_veth_name(conf.name, cid, ifname) for cid, ifname in valid}
        links = self.kernel.owned_links()
        for name in wiring.network_veths(links, conf.name):
            if name in keep:
                continue
            try:
                self.kernel.delete_link(name)
                log.info("GC removed stale host veth %s", name)
            except KernelError as exc:
                errors.append(f"cannot delete {name}: {exc}")
        _remove_stale_locks(conf, keep | {link.name for link in links})
        if errors:
            raise CniError(ErrorCode.INTERNAL, "GC finished with errors", "; ".join(errors))

    def status(self, conf: NetConf, req: CniRequest) -> None:
        self.ipam_for(conf).status(conf, req)


def _remove_stale_locks(conf: NetConf, keep: set) -> None:
    """Lock files of attachments left by a killed ADD or DEL: removed when nobody holds them."""
    directory = os.path.dirname(attachment_lock.lock_path(conf, "-"))
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.endswith(".lock") and name[:-5] not in keep:
            attachment_lock.try_remove_stale(os.path.join(directory, name))


def validate_ipam(conf: NetConf, req: CniRequest) -> None:
    """Raise the error a DEL would meet in its IPAM config, without doing the DEL."""
    if conf.ipam_is_builtin:
        from cni.ipam.builtin import parse_for
        parse_for(conf)
    else:
        from cni.invoke import find_plugin
        find_plugin(conf.ipam_type, req.path)
