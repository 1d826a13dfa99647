"""The plugin's operations: ADD, DEL, CHECK, GC and STATUS over IPAM and pod wiring.

ADD is linear, in the reference bridge plugin's style: each step that changes something
pushes its undo onto a stack, and any failure unwinds the stack before the error goes
out, so a failed ADD leaves no veth and no reservation. DEL is forgiving by design: the
netns, the veth or the reservation may already be gone, and DEL may come twice.
"""
from __future__ import annotations

import ipaddress
import logging
import os

from pyroute2 import NetlinkError

from cni import netns, wiring
from cni.config import Mode, NetConf
from cni.errors import CniError, ErrorCode
from cni.ipam import ipam_for
from cni.request import CniRequest

log = logging.getLogger("netagent.cni")


class PluginHandlers:
    """The `Handlers` of `cni.dispatch` for the netagent plugin."""

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
        netns_fd = netns.open_netns(req.netns)
        undo.append(lambda: os.close(netns_fd))
        ipam = ipam_for(conf)
        allocated = ipam.add(conf, req)
        undo.append(lambda: ipam.delete(conf, req))
        addresses = [ipaddress.ip_interface(ip["address"]) for ip in allocated.get("ips", [])]
        if not addresses:
            raise CniError(ErrorCode.INVALID_CONFIG, "IPAM returned no addresses")
        gateways = {}
        for ip in allocated["ips"]:
            if ip.get("gateway"):
                gateways.setdefault(ipaddress.ip_interface(ip["address"]).version,
                                    ipaddress.ip_address(ip["gateway"]))

        ipr = netns.host_netlink()
        interfaces = []
        bridge_index = None
        if conf.mode is Mode.BRIDGE:
            bridge_gateways = [ipaddress.ip_interface(f"{gateways[a.version]}/{a.network.prefixlen}")
                               for a in addresses if a.version in gateways]
            bridge_index, bridge_mac = wiring.ensure_bridge(ipr, name=conf.bridge, mtu=conf.mtu,
                                                            gateways=bridge_gateways)
            interfaces.append({"name": conf.bridge, "mac": bridge_mac})
            host_mac = wiring.random_mac()
        else:
            host_mac = wiring.ROUTED_HOST_MAC

        host_name = wiring.host_veth_name(conf.name, req.container_id, req.ifname)
        alias = wiring.network_alias(conf.name)
        pod_mac = wiring.random_mac()
        host_index = wiring.create_veth(ipr, host_name=host_name, pod_ifname=req.ifname,
                                        netns_fd=netns_fd, mtu=conf.mtu, host_mac=host_mac,
                                        pod_mac=pod_mac)
        undo.append(lambda: wiring.delete_link(ipr, host_name))
        with wiring.closing_netlink(netns.netlink_in(netns_fd)) as pod_ipr:
            routes = wiring.configure_pod(pod_ipr, ifname=req.ifname, mode=conf.mode,
                                          addresses=addresses, gateways=gateways,
                                          routes=allocated.get("routes", []), host_mac=host_mac)
        if conf.mode is Mode.BRIDGE:
            try:
                wiring.attach_to_bridge(ipr, host_index=host_index, bridge_index=bridge_index,
                                        hairpin=conf.hairpin_mode, alias=alias)
            except NetlinkError as exc:
                wiring.forget_bridge(conf.bridge)  # someone removed it under us: next ADD repairs
                raise CniError(ErrorCode.TRY_AGAIN_LATER, f"bridge {conf.bridge} changed during ADD",
                               str(exc)) from None
        else:
            wiring.route_to_pod(ipr, host_name=host_name, host_index=host_index, addresses=addresses,
                                pod_mac=pod_mac, alias=alias)

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
        ipam_for(conf).delete(conf, req)
        # Deleting the host end removes the pod end with it; the netns is not needed. When
        # the host end is already gone, whatever the pod holds under ifname is not ours.
        host_name = wiring.host_veth_name(conf.name, req.container_id, req.ifname)
        try:
            wiring.delete_link(netns.host_netlink(), host_name)
        except NetlinkError as exc:
            netns.drop_host_netlink()
            raise CniError(ErrorCode.INTERNAL, f"cannot delete {host_name}", str(exc)) from None

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
            with wiring.closing_netlink(netns.netlink_in(fd)) as pod_ipr:
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
