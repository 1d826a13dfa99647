"""`netagent cleanup`: remove what netagent created on this node, and nothing else.

Ownership is read from the interface alias the plugin sets at creation (`netagent:<network>`
on host veths, `netagent-bridge` on bridges), never guessed from a name alone, so an
administrator's own `na...` interface survives. Deleting a host veth removes its pod end
and the node routes through it.
"""
from __future__ import annotations

from cni import wiring
from cni.netns import host_netlink


def owned_links(ipr) -> list[str]:
    names = []
    for link in ipr.get_links():
        alias = link.get_attr("IFLA_IFALIAS") or ""
        if alias.startswith(wiring.ALIAS_PREFIX) or alias == wiring.BRIDGE_ALIAS:
            names.append(link.get_attr("IFLA_IFNAME"))
    return names


def remove_owned_links() -> list[str]:
    ipr = host_netlink()
    removed = [name for name in owned_links(ipr) if wiring.delete_link(ipr, name)]
    return removed
