"""Cross-node pod routing: the node agent (lease, underlay choice, announcement), masquerade,
and the routing backends (`routing/`: vxlan, host-gw, ipip, auto)."""
