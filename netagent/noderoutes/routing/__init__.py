"""Cross-node pod routing: make every remote node's pod CIDR reachable from this node.

The package is shaped like flannel's backends (one small module per mode) around the
seams of ARCHITECTURE.md:

    model.py        the vocabulary: settings, local node, peers, desired kernel objects
                    (routes and neighbours in `netagent/kernel/routes.py`'s words), the
                    report, and the kernel seam (`RoutingKernel`)
    vxlan.py        VXLAN: one device, per peer a permanent neighbour, an FDB entry, a route
    hostgw.py       host-gw: per peer a route via the peer's underlay address
    ipip.py         IPIP: one NBMA tunnel device, per peer an onlink route via the peer; IPv6:
                    an external ip6tnl, per peer an `encap ip6 dst <peer>` route
    bgp.py          BGP: per admitted peer a copy of the routes BIRD learnt to its own CIDRs
                    (through the peer or a trusted next hop); `noderoutes/bgp/` runs BIRD
    auto.py         per peer: host-gw on the same underlay subnet, BGP-learnt routes or
                    encapsulation otherwise
    admission.py    which peers may be routed: pod CIDRs inside the cluster CIDR and clear of
                    reserved ranges, claims (CIDR, public IP, VTEP MAC) kept by the older Node
    plan.py         `render_plan` (pure: local node + peers + settings + bounds -> Plan), the
                    object diff and the device drift check shared by both kernels
    incremental.py  `IncrementalPlanner`: a Node change planned alone, equal to the full render
                    (which it falls back to where only that can tell)
    kernel.py       `NetlinkKernel`: the real kernel over one pyroute2 IPRoute socket (the
                    agent's underlay snapshot is read through it too)
    rtnl.py         the per-peer writes packed by hand on a plain netlink socket (the Node
                    change's hot path), and the link and address change listener
    fake_kernel.py  `FakeKernel`: keeps state and validates like the kernel, for unit tests
    routes.py       `RouteManager`: ensure the devices, then diff the plan against what is
                    programmed (a kernel dump for `sync_all`, memory and the changed peers
                    for `apply_changes`) and change only the difference

Ownership: our devices are named `na-*` (kinds vxlan, ipip and ip6tnl) and everything on them is
ours; our routes carry route protocol 78 (`ROUTE_PROTOCOL`), so routes we add on the
shared underlay device are found and removed without touching anyone else's.

One planner and one `RouteManager` per IP family (the node agent builds one for each family
with a cluster CIDR): each plans its family's CIDRs over its family's underlay address, IPv6
VXLAN in its own device `na-vxlan6`. An IPv4 plan lists IPv6 CIDRs it skipped, logged once when
no IPv6 manager routes them. IPv6 ipip rides `na-ipip6` (ip6tnl external, `encap ip6` routes).
"""
