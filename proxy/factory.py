"""Building a proxy backend on the real kernel, for the agent, `status services` and `cleanup`.

The one place that knows each backend's constructor and its kernel parts (iptables
runner, ipset, IPVS netlink table, dummy device, sysctls), so callers only name a mode.
Everything runs in the caller's network namespace unless `netns` names another (tests and
benchmarks program a namespace they created, from the root namespace).
"""
from __future__ import annotations

from netagent.kernel.ipset import IpsetRunner
from netagent.kernel.iptables.backend import IpFamily, IptablesBackend
from netagent.kernel.iptables.runner import IptablesRunner
from netagent.kernel.namespaces import exec_prefix
from proxy.backend import ProxyBackend, ProxyMode


def build_backend(mode: str | ProxyMode, *, iptables_backend: IptablesBackend, scheduler: str = "rr",
                  netns: str | None = None) -> ProxyBackend:
    if ProxyMode(mode) is ProxyMode.IPTABLES:
        from proxy.iptables.backend import IptablesProxy
        return IptablesProxy(iptables=IptablesRunner(backend=iptables_backend, family=IpFamily.V4,
                                                     exec_prefix=exec_prefix(netns)),
                             ipset=IpsetRunner(exec_prefix=exec_prefix(netns)))
    from proxy.ipvs.proxy import IpvsProxy
    from proxy.ipvs.render import IpvsSettings
    from proxy.ipvs.table import Scheduler
    return IpvsProxy.in_namespace(netns=netns, iptables_backend=iptables_backend,
                                  settings=IpvsSettings(scheduler=Scheduler(scheduler)))


def programmed_mode(*, iptables_backend: IptablesBackend, netns: str | None = None) -> ProxyMode | None:
    """Which backend has programmed this namespace: IPVS when its device exists, iptables
    when our service chain does, None when neither."""
    from proxy.ipvs.netlink import NetlinkAddressDevice
    if NetlinkAddressDevice(netns=netns).exists():
        return ProxyMode.IPVS
    from proxy.iptables.names import FIXED_CHAINS
    runner = IptablesRunner(backend=iptables_backend, family=IpFamily.V4, exec_prefix=exec_prefix(netns))
    return ProxyMode.IPTABLES if set(runner.list_chains("nat")) & set(FIXED_CHAINS["nat"]) else None
