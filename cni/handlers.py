"""The plugin's operations: ADD, DEL, CHECK, GC and STATUS over IPAM and pod wiring.

ADD is linear, in the reference bridge plugin's style: each step that changes something
pushes its undo onto a stack, and any failure unwinds the stack before the error goes
out, so a failed ADD leaves no veth and no reservation. One overlap breaks the line on
purpose: the IPAM reservation (file I/O) runs on a helper thread while this thread has
the kernel create the veth pair, since neither needs the other (about 1.3 ms saved). DEL is forgiving by design: the
netns, the veth or the reservation may already be gone, and DEL may come twice.
"""
from __future__ import annotations

import ipaddress
import logging
import os
from concurrent.futures import Future, ThreadPoolExecutor

from pyroute2 import NetlinkError

from cni import netns, wiring
from cni.config import Mode, NetConf
from cni.errors import CniError, ErrorCode
from cni.ipam import ipam_for
from cni.request import CniRequest

log = logging.getLogger("netagent.cni")
_ipam_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="ipam")


def _release_if_reserved(allocation: Future, ipam, conf: NetConf, req: CniRequest) -> None:
    """Undo for the background reservation: release only what this call reserved."""
    try:
        allocation.result()
    except BaseException:
        return  # nothing was reserved (or a duplicate: the addresses are not ours to free)
    ipam.delete(conf, req)


class PluginHandlers:
    """The `Handlers` of `cni.dispatch` for the netagent plugin.

    `deferred` (the agent's `DeferredDeleter`, or None in-process) lets DEL reply once the
    request is validated and journaled; the kernel teardown then finishes in the background.
    """

    def __init__(self, *, deferred=None) -> None:
        self.deferred = deferred

    def add(self, conf: NetConf, req: CniRequest) -> dict:
        undo: list = []
        try:
            return self._add(conf, req, undo)
        except BaseException as exc:
            for step in reversed(undo):
                try:
                    step()
                except Exception:  # keep unwinding; the original error is what matters
                    log.exception("rollback step failed after ADD error")
            if isinstance(exc, NetlinkError):
                netns.drop_host_netlink()
                raise CniError(ErrorCode.INTERNAL, "netlink request failed", str(exc)) from None
            raise

    def _add(self, conf: NetConf, req: CniRequest, undo: list) -> dict:
        host_name = wiring.host_veth_name(conf.name, req.container_id, req.ifname)
        if self.deferred is not None:
            self.deferred.wait_for(host_name)  # a DEL of this same attachment still finishing
        netns_fd = netns.open_netns(req.netns)
        undo.append(lambda: os.close(netns_fd))
        ipam = ipam_for(conf)
        allocation = _ipam_pool.submit(ipam.add, conf, req)
        undo.append(lambda: _release_if_reserved(allocation, ipam, conf, req))

        alias = wiring.network_alias(conf.name)
        host_mac = wiring.ROUTED_HOST_MAC if conf.mode is Mode.ROUTED else wiring.random_mac()
        pod_mac = wiring.random_mac()
        rtnl = netns.host_rtnl()
        known_bridge = wiring.known_bridge_index(conf.bridge) if conf.mode is Mode.BRIDGE else None
        enslaved = wiring.create_veth(rtnl, host_name=host_name, pod_ifname=req.ifname,
                                      netns_fd=netns_fd, mtu=conf.mtu, host_mac=host_mac,
                                      pod_mac=pod_mac, alias=alias, master=known_bridge)
        undo.append(lambda: wiring.delete_link(rtnl, host_name))

        allocated = allocation.result()
        addresses = [ipaddress.ip_interface(ip["address"]) for ip in allocated.get("ips", [])]
        if not addresses:
            raise CniError(ErrorCode.INVALID_CONFIG, "IPAM returned no addresses")
        gateways = {}
        for ip in allocated["ips"]:
            if ip.get("gateway"):
                gateways.setdefault(ipaddress.ip_interface(ip["address"]).version,
                                    ipaddress.ip_address(ip["gateway"]))

        interfaces = []
        bridge_index = None
        if conf.mode is Mode.BRIDGE:
            bridge_gateways = [ipaddress.ip_interface(f"{gateways[a.version]}/{a.network.prefixlen}")
                               for a in addresses if a.version in gateways]
            bridge_index, bridge_mac = wiring.ensure_bridge(netns.host_netlink(), name=conf.bridge,
                                                            mtu=conf.mtu, gateways=bridge_gateways)
            interfaces.append({"name": conf.bridge, "mac": bridge_mac})
        with netns.rtnl_in(netns_fd) as pod_rtnl:
            routes = wiring.configure_pod(pod_rtnl, ifname=req.ifname, mode=conf.mode,
                                          addresses=addresses, gateways=gateways,
                                          routes=allocated.get("routes", []), host_mac=host_mac)
        if conf.mode is Mode.BRIDGE:
            try:
                if not (enslaved and bridge_index == known_bridge):
                    wiring.attach_to_bridge(rtnl, host_name=host_name, bridge_index=bridge_index)
                if conf.hairpin_mode:
                    wiring.set_hairpin(host_name)
            except NetlinkError as exc:
                wiring.forget_bridge(conf.bridge)  # someone removed it under us: next ADD repairs
                raise CniError(ErrorCode.TRY_AGAIN_LATER, f"bridge {conf.bridge} changed during ADD",
                               str(exc)) from None
        else:
            wiring.route_to_pod(rtnl, host_name=host_name, addresses=addresses, pod_mac=pod_mac)

        os.close(netns_fd)
        undo.clear()
        pod_index = len(interfaces) + 1
        interfaces.append({"name": host_name, "mac": host_mac})
        interfaces.append({"name": req.ifname, "mac": pod_mac, "sandbox": req.netns, "mtu": conf.mtu})
        ips = []
        for ip in allocated["ips"]:
            entry = {"address": ip["address"], "interface": pod_index}
            addr = ipaddress.ip_interface(ip["address"])
            gateway = wiring.pod_gateway(conf.mode, addr.version, gateways.get(addr.version))
            if conf.mode is Mode.ROUTED:
                entry["address"] = f"{addr.ip}/{addr.max_prefixlen}"
            if gateway is not None:
                entry["gateway"] = str(gateway)
            ips.append(entry)
        return {"interfaces": interfaces, "ips": ips, "routes": routes,
                "dns": conf.dns or allocated.get("dns") or {}}

    def delete(self, conf: NetConf, req: CniRequest) -> None:
        if self.deferred is None:
            self.delete_now(conf, req)
            return
        validate_ipam(conf, req)  # a config error is still reported to the runtime
        self.deferred.submit(wiring.host_veth_name(conf.name, req.container_id, req.ifname), conf, req)

    def delete_now(self, conf: NetConf, req: CniRequest) -> None:
        """The veth first, then the addresses, so no address is reused while a veth holds it.

        Deleting the host end removes the pod end with it; the netns is not needed. When the
        host end is already gone, whatever the pod holds under ifname is not ours.
        """
        host_name = wiring.host_veth_name(conf.name, req.container_id, req.ifname)
        try:
            wiring.delete_link(netns.host_rtnl(), host_name)
        except NetlinkError as exc:
            netns.drop_host_netlink()
            raise CniError(ErrorCode.INTERNAL, f"cannot delete {host_name}", str(exc)) from None
        ipam_for(conf).delete(conf, req)

    def check(self, conf: NetConf, req: CniRequest) -> None:
        ipam_for(conf).check(conf, req)
        prev = conf.prev_result or {}
        problems = []
        interfaces = prev.get("interfaces") or []
        pod_iface = next((i for i, itf in enumerate(interfaces)
                          if itf.get("name") == req.ifname and itf.get("sandbox")), None)
        if pod_iface is None:
            raise CniError(ErrorCode.CHECK_FAILED, f"prevResult has no interface {req.ifname} in a sandbox")
        fd = netns.open_netns(req.netns)
        try:
            with netns.netlink_in(fd) as pod_ipr:
                state = wiring.pod_state(pod_ipr, req.ifname)
        finally:
            os.close(fd)
        if state is None:
            raise CniError(ErrorCode.CHECK_FAILED, f"interface {req.ifname} is missing in the container")
        expected_mac = (interfaces[pod_iface].get("mac") or "").lower()
        if expected_mac and state["mac"] != expected_mac:
            problems.append(f"{req.ifname} has MAC {state['mac']}, expected {expected_mac}")
        if not state["up"]:
            problems.append(f"{req.ifname} is down")
        for ip in prev.get("ips") or []:
            if ip.get("interface", pod_iface) == pod_iface and ip["address"] not in state["addresses"]:
                problems.append(f"address {ip['address']} is missing on {req.ifname}")
        for route in prev.get("routes") or []:
            dst = str(ipaddress.ip_network(route["dst"], strict=False))
            if not any(d == dst and (not route.get("gw") or g == route["gw"]) for d, g in state["routes"]):
                problems.append(f"route {dst}" + (f" via {route['gw']}" if route.get("gw") else "")
                                + " is missing")

        ipr = netns.host_netlink()
        host_name = wiring.host_veth_name(conf.name, req.container_id, req.ifname)
        host = wiring.host_state(ipr, host_name)
        if host is None:
            problems.append(f"host interface {host_name} is missing")
        else:
            if not host["up"]:
                problems.append(f"host interface {host_name} is down")
            if conf.mode is Mode.BRIDGE:
                bridge = ipr.link_lookup(ifname=conf.bridge)
                if not bridge or host["master"] != bridge[0]:
                    problems.append(f"{host_name} is not attached to bridge {conf.bridge}")
            else:
                for ip in prev.get("ips") or []:
                    addr = ipaddress.ip_interface(ip["address"])
                    if f"{addr.ip}/{addr.max_prefixlen}" not in host["routes"]:
                        problems.append(f"node route to {addr.ip} via {host_name} is missing")
        if problems:
            raise CniError(ErrorCode.CHECK_FAILED, "; ".join(problems))

    def gc(self, conf: NetConf, req: CniRequest, valid: set) -> None:
        if self.deferred is not None:
            self.deferred.wait_idle()
        errors = []
        try:
            ipam_for(conf).gc(conf, req, valid)
        except CniError as err:
            errors.append(str(err))
        keep = {wiring.host_veth_name(conf.name, cid, ifname) for cid, ifname in valid}
        ipr = netns.host_netlink()
        for name in wiring.network_host_veths(ipr, conf.name):
            if name in keep:
                continue
            try:
                wiring.delete_link(ipr, name)
                log.info("GC removed stale host veth %s", name)
            except NetlinkError as exc:
                errors.append(f"cannot delete {name}: {exc}")
        if errors:
            raise CniError(ErrorCode.INTERNAL, "GC finished with errors", "; ".join(errors))

    def status(self, conf: NetConf, req: CniRequest) -> None:
        ipam_for(conf).status(conf, req)


def validate_ipam(conf: NetConf, req: CniRequest) -> None:
    """Raise the error a DEL would meet in its IPAM config, without doing the DEL."""
    if conf.ipam_is_builtin:
        from cni.ipam.builtin import parse_for
        parse_for(conf)
    else:
        from cni.invoke import find_plugin
        find_plugin(conf.ipam_type, req.path)
