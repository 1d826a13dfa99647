"""The policy's iptables dataplane: per-pod chains in filter FORWARD (and OUTPUT under IPVS) and
selector ipsets. `render.py` (pure: a plan -> chains as iptables-save prints them, and ipsets),
`dataplane.py` (`IptablesDataplane`: writes the difference through the kernel layer's
`Iptables` and `Ipset`), `readback.py` (pure: `iptables-save -c` back into policy/readback.py's
values)."""
