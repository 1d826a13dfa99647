"""The kernel settings the IPVS backend needs, each with the reason (set through
`netagent.kernel.sysctl`). The IPVS ones exist only once the ip_vs module is loaded (it
creates them per namespace). The `net.ipv4.vs` settings govern IPVS for both families (there is
no `net.ipv6.vs`); forwarding is per family (`ipvs_sysctls`).
"""
from __future__ import annotations

from netagent.kernel.families import IpFamily
from netagent.kernel.sysctl import IP_FORWARD, Sysctl, forwarding

IPVS_SYSCTLS: tuple[Sysctl, ...] = (
    Sysctl("net.ipv4.vs.conntrack", "1",
           "IPVS keeps netfilter conntrack entries for the connections it forwards; without it "
           "the MASQUERADE in nat POSTROUTING never sees them (off-cluster clients of a cluster "
           "IP, NodePort and external traffic under policy Cluster, hairpin), and replies of "
           "masqueraded connections find no way back"),
    Sysctl("net.ipv4.vs.expire_nodest_conn", "1",
           "a connection whose real server was deleted is expired on its next packet instead of "
           "being dropped until its timeout: a UDP client that keeps sending moves on to a live "
           "endpoint right away, a TCP client gets an error instead of a hang"),
    Sysctl("net.ipv4.vs.expire_quiescent_template", "1",
           "a persistence template (ClientIP affinity) that points at a real server of weight 0 "
           "(terminating) expires, so a pinned client is scheduled to a live endpoint instead of "
           "following its template to the terminating one"),
    IP_FORWARD,
)


def ipvs_sysctls(family: IpFamily) -> tuple[Sysctl, ...]:
    """What `family`'s backend sets: the IPVS settings and that family's forwarding."""
    return (*IPVS_SYSCTLS[:-1], forwarding(family))
