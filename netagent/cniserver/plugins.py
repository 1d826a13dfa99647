"""Which handlers serve a request: the plugin cni/wire.py's selector names.

The shim tells the agent which binary the runtime executed (argv[0]'s basename): the main
plugin `netagent` runs the agent's `PluginHandlers`; `netagent-ipam`, an IPAM-only request
from another main plugin (bridge, ptp, macvlan, ...), runs `cni.ipam.plugin.run_ipam`, the
standalone plugin's own dispatch. The socket server and the replay of the shim's DEL journal
both come here, so a DEL the shim journaled while no agent listened is carried out by the
plugin it was meant for (an IPAM DEL releases the reservation, nothing more).
"""
from __future__ import annotations

from cni import wire
from cni.dispatch import Handlers, execute
from cni.ipam.plugin import LockedIpam, run_ipam


def execute_for(plugin: str, env: dict, stdin: bytes, *, handlers: Handlers,
                ipam_handlers: LockedIpam | None = None) -> tuple[int, str]:
    """Run one request with the handlers of `plugin` (one of `wire.PLUGINS`); never raises."""
    if plugin == wire.PLUGIN_IPAM:
        return run_ipam(env, stdin, ipam_handlers)
    return execute(env, stdin, handlers)
