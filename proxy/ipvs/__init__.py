"""The IPVS service-proxy backend: virtual servers in the kernel's IP Virtual Server table,
service addresses on a dummy device, and a constant iptables ruleset keyed by ipsets.

Modules, each with one job:
  table.py    virtual/real server values and the `IpvsTable` interface (fake: fake_table.py)
  device.py   the service-address dummy device interface (fake: fake_device.py)
  netlink.py  the real table and device over pyroute2 (generic netlink IPVS, rtnetlink)
  sysctls.py  the kernel settings IPVS needs, each with its reason
  rules.py    the ipsets and the constant iptables chains that match them
  render.py   pure: ProxyState -> IpvsPlan (per service port), and the plan's reverse index
  graceful.py real servers drain at weight 0 before they are deleted
  proxy.py    `IpvsProxy(ProxyBackend)`: full and partial sync, read-back, cleanup
"""
from proxy.ipvs.proxy import IpvsProxy
from proxy.ipvs.render import IpvsPlan, IpvsSettings, render_ipvs
from proxy.ipvs.table import Scheduler

__all__ = ["IpvsPlan", "IpvsProxy", "IpvsSettings", "Scheduler", "render_ipvs"]
