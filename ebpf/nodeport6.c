/* netagent tc path for IPv6: the structs, maps and packet helpers ebpf/nodeport_flow.c needs.
 *
 * Compiled after ebpf/nodeport.c and its IPv4 flow code, and after ebpf/sock_lb6.c (whose
 * `na_svc6`, `na_slots6`, `na_affinity6`, `struct na_in6` and pick_backend6 it uses); the
 * loader then instantiates the flow for IPv6 (`translate_new6`, `known6`) and the programs
 * (ebpf/nodeport_progs.c) hand IPv6 packets to it. What the path does is ebpf/nodeport.c's
 * (NodePorts, external and load-balancer IPs from outside, pods outside the cgroup, two-map
 * connection tracking, SNAT to `na_config6`'s node address when asked, `na_lbsrc6` source
 * ranges (declared in sock_lb6.c, which checks them too), a RST for a SYN to a service without endpoints), over IPv6 headers:
 * - only a TCP or UDP header right after the fixed header is handled; extension headers
 *   (fragments among them) are left to the stack, untranslated;
 * - IPv6 has no header checksum: an address rewrite fixes the L4 checksum alone (its
 *   pseudo-header), by the difference of the two 16-byte addresses;
 * - ClientIP affinity keys a client by its address folded to 32 bits (`na_who6`): two
 *   clients may share a key, and so a backend, which affinity allows.
 */
#include <uapi/linux/ipv6.h>

struct na_ct_key6 {
    struct na_in6 saddr;
    struct na_in6 daddr;
    __be16 sport;
    __be16 dport;
    __u8 proto;
    __u8 dir;
    __u16 pad;
};

struct na_ct_value6 {
    struct na_in6 saddr;
    struct na_in6 daddr;
    __be16 sport;
    __be16 dport;
    __u32 flags;
    __u32 seq_end;   /* as na_ct_value's */
    __u32 ack;
    __u64 created_ns;
};

struct na_config6 {
    struct na_in6 node_addr;   /* the SNAT address for external and load-balancer IPs */
    __u32 flags;
};

#ifndef NA_MAX_CT6
#define NA_MAX_CT6 262144
#endif
#ifndef NA_MAX_CT_NEW6
#define NA_MAX_CT_NEW6 65536
#endif

BPF_TABLE_PINNED("lru_hash", struct na_ct_key6, struct na_ct_value6, na_ct6, NA_MAX_CT6, NA_PIN_DIR "/na_ct6");
BPF_TABLE_PINNED("lru_hash", struct na_ct_key6, struct na_ct_value6, na_ct_new6, NA_MAX_CT_NEW6,
                 NA_PIN_DIR "/na_ct_new6");
BPF_TABLE_PINNED("array", __u32, struct na_config6, na_config6, 1, NA_PIN_DIR "/na_config6");

#define IP6_SRC_OFF (ETH_HLEN_ + 8)
#define IP6_DST_OFF (ETH_HLEN_ + 24)
#define IP6_HLEN 40

typedef struct na_in6 na_addr6;

static __always_inline int na_addr_zero6(struct na_in6 a)
{
    return !(a.w[0] | a.w[1] | a.w[2] | a.w[3]);
}

static __always_inline __u64 na_who6(struct na_in6 client)
{
    return client.w[0] ^ client.w[1] ^ client.w[2] ^ client.w[3];
}

struct na_flow6 {
    struct na_in6 saddr, daddr;
    __be16 sport, dport;
    __u8 proto;
    __u8 tcp_flags;
    __u32 l4_off;
    __u32 csum_off;
    __u32 seq, ack_seq, seg_len;   /* as na_flow's */
};

static __always_inline int parse6(struct __sk_buff *skb, struct na_flow6 *flow)
{
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    struct ipv6hdr *ip = data + ETH_HLEN_;

    if ((void *)(ip + 1) > end || eth->h_proto != NA_HTONS(ETH_P_IPV6))
        return 0;
    if (ip->nexthdr != IPPROTO_TCP && ip->nexthdr != IPPROTO_UDP)
        return 0;   /* extension headers (fragments among them): left to the stack */
    __builtin_memcpy(&flow->saddr, &ip->saddr, sizeof(flow->saddr));
    __builtin_memcpy(&flow->daddr, &ip->daddr, sizeof(flow->daddr));
    flow->proto = ip->nexthdr;
    flow->l4_off = ETH_HLEN_ + IP6_HLEN;
    __u32 l4_len = NA_HTONS(ip->payload_len);
    if (!parse_l4(skb, flow->l4_off, flow->proto, &flow->sport, &flow->dport, &flow->tcp_flags, &flow->csum_off))
        return 0;
    return flow->proto != IPPROTO_TCP
           || parse_seq(skb, flow->l4_off, l4_len, flow->tcp_flags, &flow->seq, &flow->ack_seq, &flow->seg_len);
}

/* the L4 checksum after an address of the pseudo-header changed from `from` to `to` */
static __always_inline void csum_addr6(struct __sk_buff *skb, struct na_flow6 *flow, struct na_in6 *from,
                                       struct na_in6 *to, __u64 l4flags)
{
    __s64 diff = bpf_csum_diff((__be32 *)from, sizeof(*from), (__be32 *)to, sizeof(*to), 0);

    bpf_l4_csum_replace(skb, flow->csum_off, 0, diff, l4flags | BPF_F_PSEUDO_HDR);
}

static __always_inline void rewrite6(struct __sk_buff *skb, struct na_flow6 *flow, struct na_in6 saddr,
                                     __be16 sport, struct na_in6 daddr, __be16 dport)
{
    __u64 l4flags = flow->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

    if (!na_addr_eq6(saddr, flow->saddr)) {
        csum_addr6(skb, flow, &flow->saddr, &saddr, l4flags);
        bpf_skb_store_bytes(skb, IP6_SRC_OFF, &saddr, sizeof(saddr), 0);
    }
    if (!na_addr_eq6(daddr, flow->daddr)) {
        csum_addr6(skb, flow, &flow->daddr, &daddr, l4flags);
        bpf_skb_store_bytes(skb, IP6_DST_OFF, &daddr, sizeof(daddr), 0);
    }
    rewrite_ports(skb, flow->l4_off, flow->csum_off, l4flags, flow->sport, sport, flow->dport, dport);
}

struct na_pseudo_hdr6 {
    struct na_in6 saddr, daddr;
    __be32 len;
    __u8 zero[3];
    __u8 proto;
};

/* reset_syn for IPv6: the SYN becomes a RST+ACK from the service address, sent back out */
static __always_inline int reset_syn6(struct __sk_buff *skb, struct na_flow6 *flow)
{
    struct tcphdr syn;
    struct ipv6hdr ip;

    if (flow->proto != IPPROTO_TCP || bpf_skb_load_bytes(skb, flow->l4_off, &syn, sizeof(syn)) < 0
        || bpf_skb_load_bytes(skb, ETH_HLEN_, &ip, sizeof(ip)) < 0 || !syn.syn || syn.ack || syn.rst)
        return TC_ACT_SHOT;
    struct tcphdr rst = rst_for(&syn, (__u32)NA_HTONS(ip.payload_len) - syn.doff * 4);
    struct ipv6hdr reply = {.version = 6, .payload_len = NA_HTONS(sizeof(rst)), .nexthdr = IPPROTO_TCP,
                            .hop_limit = 64};
    struct na_pseudo_hdr6 pseudo = {.saddr = flow->daddr, .daddr = flow->saddr, .len = __builtin_bswap32(sizeof(rst)),
                                    .proto = IPPROTO_TCP};
    __builtin_memcpy(&reply.saddr, &flow->daddr, sizeof(flow->daddr));
    __builtin_memcpy(&reply.daddr, &flow->saddr, sizeof(flow->saddr));
    rst.check = csum_fold(bpf_csum_diff(0, 0, (void *)&rst, sizeof(rst),
                                        bpf_csum_diff(0, 0, (void *)&pseudo, sizeof(pseudo), 0)));
    return send_back(skb, &reply, sizeof(reply), &rst);
}
