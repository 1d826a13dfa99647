/* netagent tc path: the flow logic of ebpf/nodeport.c, written once for both IP families.
 *
 * Not compiled alone: ebpf/loader.py includes it twice, after each family's definitions, with
 * every `__F` suffix replaced by the family's ("" for IPv4, "6" for IPv6; see FLOW_SUFFIXES
 * there). So `na_ct__F` is `na_ct` or `na_ct6`, `struct na_flow__F` `struct na_flow` or
 * `struct na_flow6`, `parse__F` `parse` or `parse6`. Each family provides: its structs
 * (na_ct_key, na_ct_value, na_flow, na_svc_key, na_backend, na_lbsrc_key, na_config), its maps
 * (na_ct, na_ct_new, na_svc, na_lbsrc, na_config), `na_addr` (the address type, assignable),
 * NA_LBSRC_HOST (a client's LPM prefix length), and parse, rewrite, reset_syn, pick_backend,
 * na_addr_eq, na_addr_zero, na_who. The text is plain C; the suffixing is done on the source
 * text, not by the preprocessor, since bcc rewrites map calls (`na_ct6.lookup(...)`) as written.
 */

/* The other direction of a flow: its key and its translation follow from this entry's. */
static __always_inline void ct_peer__F(struct na_ct_key__F *key, struct na_ct_value__F *nat, struct na_ct_key__F *peer_key,
                                    struct na_ct_value__F *peer)
{
    peer_key->saddr = nat->daddr;
    peer_key->daddr = nat->saddr;
    peer_key->sport = nat->dport;
    peer_key->dport = nat->sport;
    peer_key->proto = key->proto;
    peer_key->dir = key->dir != NA_CT_FORWARD ? NA_CT_FORWARD
                    : (nat->flags & NA_CT_F_HAIRPIN) ? NA_CT_HAIRPIN : NA_CT_REPLY;
    peer_key->pad = 0;
    peer->saddr = key->daddr;
    peer->daddr = key->saddr;
    peer->sport = key->dport;
    peer->dport = key->sport;
    peer->flags = nat->flags & NA_CT_F_HAIRPIN;
    peer->created_ns = nat->created_ns;
}

static __always_inline void ct_forget__F(struct na_ct_key__F *key, struct na_ct_key__F *peer_key)
{
    na_ct__F.delete(key);
    na_ct__F.delete(peer_key);
    na_ct_new__F.delete(key);
    na_ct_new__F.delete(peer_key);
}

/* Both entries of a flow into `na_ct` (`to_main`) or `na_ct_new`, out of the other map; the
 * flags each had are kept, `set` added. Written before deleted: a lookup always finds one. */
static __always_inline void ct_move__F(struct na_ct_key__F *key, struct na_ct_value__F *nat, int to_main, __u32 set)
{
    struct na_ct_key__F peer_key = {};
    struct na_ct_value__F peer = {};
    struct na_ct_value__F self = *nat;
    struct na_ct_value__F *old_peer;

    ct_peer__F(key, &self, &peer_key, &peer);
    old_peer = to_main ? na_ct_new__F.lookup(&peer_key) : na_ct__F.lookup(&peer_key);
    if (old_peer) {
        peer.flags = old_peer->flags;
        peer.seq_end = old_peer->seq_end;
        peer.ack = old_peer->ack;
    }
    self.flags |= set;
    peer.flags |= set;
    if (to_main) {
        na_ct__F.update(key, &self);
        na_ct__F.update(&peer_key, &peer);
        na_ct_new__F.delete(key);
        na_ct_new__F.delete(&peer_key);
    } else {
        na_ct_new__F.update(key, &self);
        na_ct_new__F.update(&peer_key, &peer);
        na_ct__F.delete(key);
        na_ct__F.delete(&peer_key);
    }
}

/* A TCP segment of `nat`'s direction has passed: its sender's next sequence number and its
 * acknowledgement (the highest seen, in sequence-number order) */
static __always_inline void ct_seen__F(struct na_ct_value__F *nat, struct na_flow__F *flow)
{
    __u32 end = flow->seq + flow->seg_len;

    if (!(nat->flags & NA_CT_F_SEQ) || (__s32)(end - nat->seq_end) > 0) {
        nat->seq_end = end;
        nat->flags |= NA_CT_F_SEQ;
    }
    if ((flow->tcp_flags & NA_TCP_ACK) && (!(nat->flags & NA_CT_F_ACKED) || (__s32)(flow->ack_seq - nat->ack) > 0)) {
        nat->ack = flow->ack_seq;
        nat->flags |= NA_CT_F_ACKED;
    }
}

/* May this RST (of `nat`'s direction, the other's entry at `peer_key`) end the flow? Its sequence
 * number must be exactly its sender's next, or the receiver's last acknowledgement; a side that
 * has sent nothing yet may refuse (RST+ACK) by acknowledging all the other side sent. */
static __always_inline int ct_rst_ok__F(struct na_ct_key__F *peer_key, struct na_ct_value__F *nat,
                                        struct na_flow__F *flow)
{
    struct na_ct_value__F *other = na_ct__F.lookup(peer_key);

    if (!other)
        other = na_ct_new__F.lookup(peer_key);
    if (nat->flags & NA_CT_F_SEQ)
        return flow->seq == nat->seq_end || (other && (other->flags & NA_CT_F_ACKED) && flow->seq == other->ack);
    return other && (other->flags & NA_CT_F_SEQ) && (flow->tcp_flags & NA_TCP_ACK) && flow->ack_seq == other->seq_end;
}

/* The flow's state after this packet (`nat` is its entry, in na_ct_new when `fresh`):
 * sequence numbers, confirmation, FIN both ways, RST, the last ACK (see the top of this file). */
static __always_inline void ct_track__F(struct na_ct_key__F *key, struct na_ct_value__F *nat, int fresh,
                                        struct na_flow__F *flow)
{
    __u8 tcp_flags = flow->tcp_flags;
    struct na_ct_key__F peer_key = {};
    struct na_ct_value__F peer = {};
    struct na_ct_value__F *other;

    if (key->proto != IPPROTO_TCP) {   /* UDP: confirmed by its first reply */
        if (fresh && key->dir != NA_CT_FORWARD)
            ct_move__F(key, nat, 1, 0);
        return;
    }
    ct_peer__F(key, nat, &peer_key, &peer);
    if (tcp_flags & NA_TCP_RST) {
        if (ct_rst_ok__F(&peer_key, nat, flow))
            ct_forget__F(key, &peer_key);
        return;   /* else passed on, changing nothing: the endpoint judges it too */
    }
    ct_seen__F(nat, flow);
    if (tcp_flags & NA_TCP_FIN) {
        if (nat->flags & NA_CT_F_CLOSED)
            return;
        nat->flags |= NA_CT_F_FIN;
        other = fresh ? na_ct_new__F.lookup(&peer_key) : na_ct__F.lookup(&peer_key);
        if (!other || !(other->flags & NA_CT_F_FIN))
            return;
        if (fresh) {
            nat->flags |= NA_CT_F_CLOSED;
            other->flags |= NA_CT_F_CLOSED;
        } else {
            ct_move__F(key, nat, 0, NA_CT_F_CLOSED);   /* closing: no longer worth a place in na_ct */
        }
        return;
    }
    if (nat->flags & NA_CT_F_CLOSED) {
        if (tcp_flags & NA_TCP_ACK)
            ct_forget__F(key, &peer_key);   /* the last ACK */
        return;
    }
    if (!fresh)
        return;
    if (key->dir != NA_CT_FORWARD) {
        nat->flags |= NA_CT_F_REPLIED;
        return;
    }
    if (!(tcp_flags & NA_TCP_SYN)) {
        other = na_ct_new__F.lookup(&peer_key);
        if (other && (other->flags & NA_CT_F_REPLIED))
            ct_move__F(key, nat, 1, 0);   /* the handshake's last ACK: confirmed */
    }
}

/* a known flow (either direction): translate as remembered; 1 when it was one, 2 when it
 * is a hairpin (a pod reaching itself through a service) */
static __always_inline int known__F(struct __sk_buff *skb, struct na_flow__F *flow, __u8 dir)
{
    struct na_ct_key__F key = {.saddr = flow->saddr, .daddr = flow->daddr, .sport = flow->sport,
                            .dport = flow->dport, .proto = flow->proto, .dir = dir};
    struct na_ct_value__F *nat = na_ct__F.lookup(&key);
    int fresh = 0;

    if (!nat) {
        nat = na_ct_new__F.lookup(&key);
        fresh = 1;
    }
    if (!nat)
        return 0;
    struct na_ct_value__F entry = *nat;
    ct_track__F(&key, nat, fresh, flow);   /* may delete or move the entry: `nat` is dead after */
    rewrite__F(skb, flow, entry.saddr, entry.sport, entry.daddr, entry.dport);
    return (entry.flags & NA_CT_F_HAIRPIN) ? 2 : 1;
}

/* A new flow to a service address: DNAT (and SNAT when asked) and remember both directions.
 * From outside (`from_pod` 0): NodePorts, external and LB IPs, to the external set, replies
 * (to an SNAT address) translated here too. From a pod whose sockets the socket load balancer
 * does not see (`from_pod` 1, on its host veth): cluster IPs as well, to the cluster set as
 * for any connection made on this node, never SNATed; replies are translated where they leave
 * towards the pod (na_tc_egress on its veth), so a reply never gets a node address as its
 * source on a pod's veth (which would take accept_local there). Except a hairpin (the pod
 * picked as its own backend): SNATed to the service address (the pod must not see its own
 * address as the source) and sent back at once, both ways (back_to_sender). */
static __always_inline int translate_new__F(struct __sk_buff *skb, int from_pod)
{
    struct na_flow__F flow = {};
    struct na_svc_value *svc;
    struct na_backend__F backend = {};
    __u32 zero = 0;

    if (!parse__F(skb, &flow))
        return TC_ACT_OK;
    if (from_pod) {
        int hit = known__F(skb, &flow, NA_CT_FORWARD);
        if (!hit)
            hit = known__F(skb, &flow, NA_CT_HAIRPIN);
        if (hit)
            return hit == 2 ? back_to_sender(skb) : TC_ACT_OK;
    } else if (known__F(skb, &flow, NA_CT_FORWARD) || known__F(skb, &flow, NA_CT_REPLY)) {
        return TC_ACT_OK;
    }

    struct na_svc_key__F key = {.addr = flow.daddr, .port = flow.dport, .proto = flow.proto};
    svc = na_svc__F.lookup(&key);
    if (!svc || (!from_pod && svc->kind == 1 /* ClusterIP: served by the socket load balancer */))
        return TC_ACT_OK;
    if (flow.tcp_flags & NA_TCP_RST)
        return TC_ACT_OK;   /* a RST of no flow we know starts none (the host drops it) */
    if (svc->flags & NA_F_SOURCE_RANGES) {
        struct na_lbsrc_key__F src = {.prefixlen = NA_LBSRC_HOST__F, .set_id = svc->ext_set_id, .addr = flow.saddr};
        if (!na_lbsrc__F.lookup(&src))
            return TC_ACT_SHOT;
    }
    __u32 set_id = from_pod ? svc->set_id : svc->ext_set_id;
    __u32 count = from_pod ? svc->count : svc->ext_count;
    if (svc->flags & NA_F_NO_ENDPOINTS)
        return reset_syn__F(skb, &flow);
    if (count == 0 || !pick_backend__F(NA_AFFINITY_CLIENT | na_who__F(flow.saddr), set_id, count, svc->affinity_timeout,
                                    &backend))
        return TC_ACT_SHOT;   /* none on this node under Local policy: dropped, as kube-proxy does */

    na_addr__F saddr = flow.saddr;
    __be16 sport = flow.sport;
    struct na_config__F *config = na_config__F.lookup(&zero);
    if (!from_pod && !(backend.flags & NA_BACKEND_LOCAL) && !(svc->flags & NA_F_EXTERNAL_LOCAL) && config
        && (config->flags & NA_CONFIG_SNAT)) {
        saddr = svc->kind == 2 /* NodePort */ || na_addr_zero__F(config->node_addr) ? flow.daddr : config->node_addr;
        __u32 hash = bpf_get_prandom_u32();
        sport = NA_HTONS(NA_SNAT_PORT_MIN + hash % NA_SNAT_PORT_SPAN);
    }
    int hairpin = from_pod && na_addr_eq__F(backend.addr, flow.saddr);
    if (hairpin)
        saddr = flow.daddr;
    __u32 flags = hairpin ? NA_CT_F_HAIRPIN : 0;
    __u64 now = bpf_ktime_get_ns();
    struct na_ct_key__F fwd = {.saddr = flow.saddr, .daddr = flow.daddr, .sport = flow.sport, .dport = flow.dport,
                            .proto = flow.proto, .dir = NA_CT_FORWARD};
    struct na_ct_value__F to_backend = {.saddr = saddr, .daddr = backend.addr, .sport = sport, .dport = backend.port,
                                     .flags = flags, .created_ns = now};
    struct na_ct_key__F rev = {.saddr = backend.addr, .daddr = saddr, .sport = backend.port, .dport = sport,
                            .proto = flow.proto, .dir = hairpin ? NA_CT_HAIRPIN : NA_CT_REPLY};
    struct na_ct_value__F to_client = {.saddr = flow.daddr, .daddr = flow.saddr, .sport = flow.dport,
                                    .dport = flow.sport, .flags = flags, .created_ns = now};
    if (flow.proto == IPPROTO_TCP)
        ct_seen__F(&to_backend, &flow);   /* the client's first segment (its SYN) */
    /* a new flow goes into na_ct_new: until confirmed it can only evict other new flows */
    if (na_ct__F.lookup(&rev) || na_ct_new__F.insert(&rev, &to_client) != 0)
        return TC_ACT_SHOT;   /* that SNAT port is taken: the client's retransmission picks another */
    na_ct_new__F.update(&fwd, &to_backend);
    rewrite__F(skb, &flow, saddr, sport, backend.addr, backend.port);
    return hairpin ? back_to_sender(skb) : TC_ACT_OK;
}

