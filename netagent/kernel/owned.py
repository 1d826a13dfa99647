"""Every name, prefix, mark and number by which netagent recognises its own kernel state.

netagent shares the node with kubelet, the runtime, other CNI plugins and the administrator,
so it touches only what it can prove is its own (ARCHITECTURE.md, "only touch what you own").
This module is that proof's one home: the code that creates an object names it from here, and
`netagent cleanup` finds what to remove from here, so the two can never drift apart.
"""
from __future__ import annotations

# ---- iptables and ipset
CHAIN_PREFIX = "NETAGENT-"      # every chain and every ipset of ours starts with it
IPVS_SET_PREFIX = CHAIN_PREFIX + "IPVS-"  # the IPVS backend's sets and chains
IPVS6_SET_PREFIX = CHAIN_PREFIX + "IPVS6-"  # its IPv6 sets (`family inet6`; ipsets are per namespace, not
                                            # per family; the chains keep their names in ip6tables)
MASQUERADE_MARK = 0x4000        # one bit marks packets to masquerade (kube-proxy's bit 14)

# ---- nftables (--proxy-mode nftables): one table per component and family, never another's
NFT_TABLE_PREFIX = "netagent"       # every nft table of ours starts with it
NFT_PROXY_TABLE = "netagent"        # Services: `ip netagent` (and `ip6 netagent`), as kube-proxy's `kube-proxy`
NFT_MASQUERADE_TABLE = "netagent-masq"    # the node's pod egress masquerade and forward accept
NFT_POLICY_TABLE = "netagent-policy"      # NetworkPolicy
NFT_TUNNEL_TABLE = "netagent-tunnel"      # tunnel packets only from admitted peers (noderoutes)

# ---- pod interfaces (the CNI plugin)
DEFAULT_BRIDGE = "na0"          # the pods' bridge in bridge mode
HOST_VETH_PREFIX = "na"         # host ends of pod veths: "na" + 12 hex digits
VETH_ALIAS_PREFIX = "netagent:"  # host veth alias: "netagent:<network name>" (ownership proof)
BRIDGE_ALIAS = "netagent-bridge"  # alias of a bridge we created

# ---- node routing
DEVICE_PREFIX = "na-"           # our routing and proxy devices; the bridge `na0` and veths `na<hex>` never match
VXLAN_DEVICE = "na-vxlan"
IPIP_DEVICE = "na-ipip"
VXLAN6_DEVICE = "na-vxlan6"      # the IPv6 overlay over the IPv6 underlay (dual-stack, IPv6-only)
IPIP6_DEVICE = "na-ipip6"        # IPIP's IPv6 form: ip6tnl (ip6ip6) over the IPv6 underlay
ROUTE_PROTOCOL = 78             # 'N': unused by iproute2's rt_protos and linux/rtnetlink.h
BGP_ROUTE_TABLE = 7878          # --backend bgp: BIRD exports learnt routes here; the agent admits them into main
BGP_BLACKHOLE_METRIC = 0xFF000000  # --backend bgp: our pod CIDRs' blackholes in main, behind any other route to them
BIRD_STATE_DIR = "/run/netagent/bird"  # --backend bgp: our BIRD's config file and control socket

# ---- service proxy
IPVS_DEVICE = "na-ipvs0"        # holds IPVS service addresses; never brought up

# ---- eBPF service proxy (ebpf/, proxy/ebpf/)
BPF_NAME_PREFIX = "na_"         # every program and map of ours (ebpf/sock_lb.c)
BPF_PIN_SUBDIR = "netagent-v1"  # our maps' pins under --bpf-root; the suffix changes with the map layouts

# ---- network policy (netagent/policy/): everything starts with POLICY_PREFIX
POLICY_PREFIX = CHAIN_PREFIX + "NP"              # "NETAGENT-NP": chains and sets of the policy engine
POLICY_CHAIN = POLICY_PREFIX + "-FORWARD"        # filter FORWARD jumps here first
POLICY_INGRESS_PREFIX = POLICY_PREFIX + "I-"     # per-pod ingress chains: + 15 hex digits
POLICY_EGRESS_PREFIX = POLICY_PREFIX + "E-"      # per-pod egress chains: + 15 hex digits
POLICY_SET_PREFIX = POLICY_PREFIX + "S-"         # selector, except and named-port sets: + 16 hex digits
POLICY_KNOWN_SET = POLICY_PREFIX + "-KNOWN"      # addresses of the local pods already programmed
POLICY_LOG_GROUP = 7878                          # the nflog group pod chains log their drops to (flow records)
NO_ENDPOINTS_LOG_PREFIX = "NETAGENT-NO-ENDPOINTS"   # the proxy's refusals (no endpoints) logged to that group
POLICY_SET6_PREFIX = POLICY_PREFIX + "S6-"       # the same sets' IPv6 (`family inet6`) halves: + 16 hex digits
POLICY_KNOWN_SET6 = POLICY_KNOWN_SET + "6"       # KNOWN's IPv6 half
TUNNEL_FILTER_CHAIN = CHAIN_PREFIX + "TUNNEL-IN"  # filter INPUT: tunnel packets only from admitted peers
TUNNEL_FILTER_SET = CHAIN_PREFIX + "TUNNEL-PEERS"  # its ipset (hash:ip, family inet): admitted underlay addresses
TUNNEL_FILTER_SET6 = TUNNEL_FILTER_SET + "6"       # the IPv6 underlay's (family inet6); both names (and a
                                                   # refill's scratch sets, + "-NEW") start with TUNNEL_FILTER_SET
