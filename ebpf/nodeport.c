/* netagent packet path for traffic from outside the node (tc clsact SCHED_CLS programs).
 *
 * Compiled by bcc with sock_lb.c's map declarations (ebpf/loader.py puts this after them),
 * so `na_svc`, `na_slots`, `na_affinity` and `na_lbsrc` are the very maps the socket load balancer
 * uses (`na_lbsrc` and its key are declared there, since both paths check source ranges).
 *
 * na_tc_ingress (underlay ingress): a packet to a NodePort, external IP or load-balancer IP
 *   (an `na_svc` entry whose kind is not ClusterIP) is DNATed to a backend of the entry's
 *   *external* set; a backend on another node is also SNATed to the node address when
 *   `na_config` asks for it (else the node's masquerade does it), so its replies come back here; `loadBalancerSourceRanges` are an LPM-trie check (`na_lbsrc`,
 *   keyed by set id and client address); ClientIP affinity uses `na_affinity` keyed by the
 *   client address (top bit set, so it never meets a socket's netns cookie). The flow's two
 *   directions are remembered, so every later packet of a connection meets the same backend
 *   and replies are reverse-translated. A reply from a remote backend (to the SNAT address
 *   and port) is translated back here too.
 * Connection tracking keeps live flows safe from churn (a SYN flood, a pod opening flows
 * without end): a new flow's two entries go into the small LRU `na_ct_new`, and only a
 * confirmed flow moves to `na_ct` (TCP: the client's first packet without SYN after a reply
 * was seen, i.e. the handshake's last ACK; UDP: the first reply), so unconfirmed flows can
 * only evict each other. A RST (either way) deletes both entries only when its sequence number
 * is the one the flow expects of its sender (see below); once a FIN has been seen
 * both ways the flow moves back to `na_ct_new` and the last ACK deletes it. Every lookup is
 * of `na_ct` first, then `na_ct_new`: O(1), two lookups at most.
 * RST and sequence numbers: each direction's entry keeps the next sequence number its sender
 * will use (`seq_end`: the highest seq + length, SYN and FIN counting one, of its segments) and
 * the last acknowledgement it sent (`ack`). A RST ends the flow only when its sequence number is
 * exactly the sender's next one, or exactly what the receiver last acknowledged (its rcv_nxt:
 * the answer to a challenge ACK), or, from a side that has sent nothing yet, when it
 * acknowledges everything the other side sent (a refused SYN) - the kernel's own acceptance rule
 * for a RST (RFC 5961's exact match, not the whole window), so an off-path RST must guess 32 bits.
 * Any other RST is passed on, translated, and changes nothing here: the endpoint's own TCP
 * checks it again (and answers a challenge ACK, whose reply RST then matches).
 * na_tc_egress (underlay egress, and pod host veths' egress): a reply from a local backend
 *   leaving the node, or any reply towards a pod served by na_tc_from_pod, gets the service
 *   address back as its source.
 * na_tc_from_pod (pod host veths' ingress, `--bpf-pod-veths`): connections of pods whose
 *   processes are outside the socket load balancer's cgroup, to any service address.
 * A TCP SYN to a service without endpoints is answered by a RST from the service address.
 * A packet that matches nothing is passed untouched. Checksums are fixed incrementally.
 *
 * Both families: this file holds IPv4's structs, maps and packet helpers (parse, rewrite,
 * reset_syn); ebpf/nodeport6.c IPv6's (`na_ct6`, `na_ct_new6`, `na_lbsrc6`, `na_config6` beside
 * sock_lb6.c's `na_svc6`...). The flow logic above (connection tracking, translate_new) is
 * written once, in ebpf/nodeport_flow.c, and the loader instantiates it per family;
 * ebpf/nodeport_progs.c's programs hand each packet to its family's. The loader's order:
 * sock_lb.c, sock_lb6.c, this file, the flow for IPv4, nodeport6.c, the flow for IPv6, the programs.
 */
#include <uapi/linux/if_ether.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/pkt_cls.h>
#include <uapi/linux/tcp.h>

#define NA_HTONS(x) ((__be16)__builtin_bswap16(x))   /* x86-64 and arm64 are little-endian */
#define NA_CT_FORWARD 1
#define NA_CT_REPLY 2
#define NA_CT_HAIRPIN 3   /* a reply of a pod to itself through a service (na_tc_from_pod) */
#define NA_CT_F_HAIRPIN 1 /* na_ct_value.flags: sent back out of the veth it came in by */
#define NA_CT_F_REPLIED 2 /* (a reply-direction entry) a reply has passed: the flow may be confirmed */
#define NA_CT_F_FIN 4     /* a FIN has passed in this entry's direction */
#define NA_CT_F_CLOSED 8  /* FINs both ways: the next ACK ends the flow */
#define NA_CT_F_SEQ 16    /* seq_end is known: a TCP segment of this direction has passed */
#define NA_CT_F_ACKED 32  /* ack is known: an ACK of this direction has passed */
#define NA_TCP_FIN 0x01
#define NA_TCP_SYN 0x02
#define NA_TCP_RST 0x04
#define NA_TCP_ACK 0x10
#define NA_AFFINITY_CLIENT (1ULL << 63)
#define NA_BACKEND_LOCAL 1
#define NA_SNAT_PORT_MIN 32768
#define NA_SNAT_PORT_SPAN 28232   /* ports 32768..60999, Linux's default ephemeral range */

struct na_ct_key {
    __be32 saddr;
    __be32 daddr;
    __be16 sport;
    __be16 dport;
    __u8 proto;
    __u8 dir;       /* NA_CT_FORWARD: client -> service; NA_CT_REPLY: backend -> client or SNAT */
    __u16 pad;
};

struct na_ct_value {
    __be32 saddr;   /* the packet's new source */
    __be32 daddr;   /* the packet's new destination */
    __be16 sport;
    __be16 dport;
    __u32 flags;    /* NA_CT_F_* */
    __u32 seq_end;  /* TCP: the next sequence number of this direction's sender (host order) */
    __u32 ack;      /* TCP: the last acknowledgement number this direction's sender sent */
    __u64 created_ns;
};

#define NA_CONFIG_SNAT 1   /* SNAT for remote backends here; without it the node's masquerade
                              (NETAGENT-POSTRTG: outside -> remote pods) does it, and the reply
                              is reverse-translated at the underlay's egress */

struct na_config {
    __be32 node_addr;  /* the SNAT address for external and load-balancer IPs */
    __u32 flags;
};

#ifndef NA_MAX_CT
#define NA_MAX_CT 262144
#endif
#ifndef NA_MAX_CT_NEW
#define NA_MAX_CT_NEW 65536
#endif

BPF_TABLE_PINNED("lru_hash", struct na_ct_key, struct na_ct_value, na_ct, NA_MAX_CT, NA_PIN_DIR "/na_ct");
BPF_TABLE_PINNED("lru_hash", struct na_ct_key, struct na_ct_value, na_ct_new, NA_MAX_CT_NEW,
                 NA_PIN_DIR "/na_ct_new");
BPF_TABLE_PINNED("array", __u32, struct na_config, na_config, 1, NA_PIN_DIR "/na_config");

#define ETH_HLEN_ 14
#define IP_CSUM_OFF (ETH_HLEN_ + 10)
#define IP_SRC_OFF (ETH_HLEN_ + 12)
#define IP_DST_OFF (ETH_HLEN_ + 16)

struct na_flow {
    __be32 saddr, daddr;
    __be16 sport, dport;
    __u8 proto;
    __u8 tcp_flags;
    __u32 l4_off;
    __u32 csum_off;
    __u32 seq, ack_seq;   /* TCP, host order */
    __u32 seg_len;        /* TCP: the sequence space the segment takes (payload, SYN and FIN one each) */
};

/* Both families: a TCP segment's sequence and acknowledgement numbers and the sequence space it
 * takes (`l4_len`: its length, header included) */
static __always_inline int parse_seq(struct __sk_buff *skb, __u32 l4_off, __u32 l4_len, __u8 tcp_flags, __u32 *seq,
                                     __u32 *ack_seq, __u32 *seg_len)
{
    __be32 numbers[2];
    __u8 doff;

    if (bpf_skb_load_bytes(skb, l4_off + 4, numbers, sizeof(numbers)) < 0
        || bpf_skb_load_bytes(skb, l4_off + 12, &doff, 1) < 0)
        return 0;
    __u32 header = (doff >> 4) * 4;
    *seq = __builtin_bswap32(numbers[0]);
    *ack_seq = __builtin_bswap32(numbers[1]);
    *seg_len = (l4_len > header ? l4_len - header : 0) + !!(tcp_flags & NA_TCP_SYN) + !!(tcp_flags & NA_TCP_FIN);
    return 1;
}

/* Both families: a TCP or UDP header at `l4_off`: its ports, TCP flags, where its checksum is */
static __always_inline int parse_l4(struct __sk_buff *skb, __u32 l4_off, __u8 proto, __be16 *sport, __be16 *dport,
                                    __u8 *tcp_flags, __u32 *csum_off)
{
    *csum_off = l4_off + (proto == IPPROTO_TCP ? 16 : 6);
    if (bpf_skb_load_bytes(skb, l4_off, sport, 2) < 0 || bpf_skb_load_bytes(skb, l4_off + 2, dport, 2) < 0)
        return 0;
    if (proto == IPPROTO_TCP && bpf_skb_load_bytes(skb, l4_off + 13, tcp_flags, 1) < 0)
        return 0;
    return 1;
}

/* Both families: the ports' part of a rewrite (`l4flags` BPF_F_MARK_MANGLED_0 for UDP) */
static __always_inline void rewrite_ports(struct __sk_buff *skb, __u32 l4_off, __u32 csum_off, __u64 l4flags,
                                          __be16 old_sport, __be16 sport, __be16 old_dport, __be16 dport)
{
    if (sport != old_sport) {
        bpf_l4_csum_replace(skb, csum_off, old_sport, sport, l4flags | 2);
        bpf_skb_store_bytes(skb, l4_off, &sport, 2, 0);
    }
    if (dport != old_dport) {
        bpf_l4_csum_replace(skb, csum_off, old_dport, dport, l4flags | 2);
        bpf_skb_store_bytes(skb, l4_off + 2, &dport, 2, 0);
    }
}

static __always_inline int parse(struct __sk_buff *skb, struct na_flow *flow)
{
    void *data = (void *)(long)skb->data;
    void *end = (void *)(long)skb->data_end;
    struct ethhdr *eth = data;
    struct iphdr *ip = data + ETH_HLEN_;

    if ((void *)(ip + 1) > end || eth->h_proto != NA_HTONS(ETH_P_IP))
        return 0;
    if (ip->ihl != 5 || (ip->frag_off & NA_HTONS(0x3fff)))
        return 0;   /* options or fragments: left to the stack */
    if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
        return 0;
    flow->saddr = ip->saddr;
    flow->daddr = ip->daddr;
    flow->proto = ip->protocol;
    flow->l4_off = ETH_HLEN_ + 20;
    __u32 l4_len = (__u32)NA_HTONS(ip->tot_len) - 20;
    if (!parse_l4(skb, flow->l4_off, flow->proto, &flow->sport, &flow->dport, &flow->tcp_flags, &flow->csum_off))
        return 0;
    return flow->proto != IPPROTO_TCP
           || parse_seq(skb, flow->l4_off, l4_len, flow->tcp_flags, &flow->seq, &flow->ack_seq, &flow->seg_len);
}

static __always_inline void rewrite(struct __sk_buff *skb, struct na_flow *flow, __be32 saddr, __be16 sport,
                                    __be32 daddr, __be16 dport)
{
    __u64 l4flags = flow->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

    if (saddr != flow->saddr) {
        bpf_l4_csum_replace(skb, flow->csum_off, flow->saddr, saddr, l4flags | BPF_F_PSEUDO_HDR | 4);
        bpf_l3_csum_replace(skb, IP_CSUM_OFF, flow->saddr, saddr, 4);
        bpf_skb_store_bytes(skb, IP_SRC_OFF, &saddr, 4, 0);
    }
    if (daddr != flow->daddr) {
        bpf_l4_csum_replace(skb, flow->csum_off, flow->daddr, daddr, l4flags | BPF_F_PSEUDO_HDR | 4);
        bpf_l3_csum_replace(skb, IP_CSUM_OFF, flow->daddr, daddr, 4);
        bpf_skb_store_bytes(skb, IP_DST_OFF, &daddr, 4, 0);
    }
    rewrite_ports(skb, flow->l4_off, flow->csum_off, l4flags, flow->sport, sport, flow->dport, dport);
}

/* A hairpin packet, translated, goes straight back out of the pod's veth (MACs swapped):
 * never routed, since its source may now be a node address, which the host would refuse
 * on a pod's veth. */
static __always_inline int back_to_sender(struct __sk_buff *skb)
{
    unsigned char macs[12];

    if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)) < 0)
        return TC_ACT_SHOT;
    bpf_skb_store_bytes(skb, 0, macs + 6, 6, 0);
    bpf_skb_store_bytes(skb, 6, macs, 6, 0);
    return bpf_redirect(skb->ifindex, 0);
}

static __always_inline __u16 csum_fold(__s64 sum)
{
    __u32 folded = (__u32)sum;

    folded = (folded & 0xffff) + (folded >> 16);
    folded = (folded & 0xffff) + (folded >> 16);
    return (__u16)~folded;
}

struct na_pseudo_hdr {
    __be32 saddr, daddr;
    __u8 zero, proto;
    __be16 len;
};

/* A TCP SYN to a service without any endpoint is refused at once (ECONNREFUSED at the
 * client), as kube-proxy's REJECT and the socket load balancer do: the packet becomes a
 * RST+ACK from the service address (options and payload cut off, checksums computed afresh),
 * sent back out of the device it came in by. Anything else to such a service is dropped. */
/* Both families: the RST+ACK answering `syn` (whose segment carried `payload` bytes), its
 * checksum to be filled in */
static __always_inline struct tcphdr rst_for(struct tcphdr *syn, __u32 payload)
{
    struct tcphdr rst = {.source = syn->dest, .dest = syn->source, .doff = 5, .rst = 1, .ack = 1,
                         .ack_seq = __builtin_bswap32(__builtin_bswap32(syn->seq) + 1 + payload)};
    return rst;
}

/* Both families: the packet becomes `l3` (`l3_len` bytes) and `rst` behind the Ethernet header,
 * MACs swapped, sent back out of the device it came in by */
static __always_inline int send_back(struct __sk_buff *skb, void *l3, __u32 l3_len, struct tcphdr *rst)
{
    unsigned char macs[12];

    if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)) < 0
        || bpf_skb_change_tail(skb, ETH_HLEN_ + l3_len + sizeof(*rst), 0) < 0)
        return TC_ACT_SHOT;
    bpf_skb_store_bytes(skb, 0, macs + 6, 6, 0);
    bpf_skb_store_bytes(skb, 6, macs, 6, 0);
    bpf_skb_store_bytes(skb, ETH_HLEN_, l3, l3_len, 0);
    bpf_skb_store_bytes(skb, ETH_HLEN_ + l3_len, rst, sizeof(*rst), 0);
    return bpf_redirect(skb->ifindex, 0);
}

static __always_inline int reset_syn(struct __sk_buff *skb, struct na_flow *flow)
{
    struct tcphdr syn;
    struct iphdr ip;

    if (flow->proto != IPPROTO_TCP || bpf_skb_load_bytes(skb, flow->l4_off, &syn, sizeof(syn)) < 0
        || bpf_skb_load_bytes(skb, ETH_HLEN_, &ip, sizeof(ip)) < 0 || !syn.syn || syn.ack || syn.rst)
        return TC_ACT_SHOT;
    struct tcphdr rst = rst_for(&syn, (__u32)NA_HTONS(ip.tot_len) - sizeof(ip) - syn.doff * 4);
    struct iphdr reply = {.version = 4, .ihl = 5, .tot_len = NA_HTONS(sizeof(reply) + sizeof(rst)), .ttl = 64,
                          .protocol = IPPROTO_TCP, .saddr = ip.daddr, .daddr = ip.saddr};
    struct na_pseudo_hdr pseudo = {.saddr = ip.daddr, .daddr = ip.saddr, .proto = IPPROTO_TCP,
                                   .len = NA_HTONS(sizeof(rst))};
    reply.check = csum_fold(bpf_csum_diff(0, 0, (void *)&reply, sizeof(reply), 0));
    rst.check = csum_fold(bpf_csum_diff(0, 0, (void *)&rst, sizeof(rst),
                                        bpf_csum_diff(0, 0, (void *)&pseudo, sizeof(pseudo), 0)));
    return send_back(skb, &reply, sizeof(reply), &rst);
}

/* what ebpf/nodeport_flow.c needs of an IPv4 address */
typedef __be32 na_addr;

static __always_inline int na_addr_eq(__be32 a, __be32 b)
{
    return a == b;
}

static __always_inline int na_addr_zero(__be32 a)
{
    return !a;
}

static __always_inline __u64 na_who(__be32 client)   /* affinity: the client (NA_AFFINITY_CLIENT added) */
{
    return client;
}
