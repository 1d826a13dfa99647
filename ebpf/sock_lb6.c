/* netagent socket-level service load balancing for IPv6 (cgroup v2 CGROUP_SOCK_ADDR programs).
 *
 * Compiled by bcc after ebpf/sock_lb.c (ebpf/loader.py joins them), whose helpers, IPv4 maps and
 * shared structs (na_svc_value, na_slot_key, na_set_name, na_affinity_key) it uses.
 * connect6, sendmsg6, recvmsg6 and getpeername6 do for AF_INET6 sockets what the IPv4 programs do,
 * over maps of their own with 16-byte addresses: na_svc6, na_slots6, na_setname6, na_affinity6 and
 * the socket storage na_sock_revnat6. The agent's IPv6 backend (EbpfProxy family V6) writes them,
 * the IPv4 one the IPv4 maps; each family has its own set ids.
 * An AF_INET6 socket may name an IPv4 peer as a v4-mapped address (::ffff:a.b.c.d, as dual-stack
 * applications do): connect6 and sendmsg6 translate such an address through the IPv4 maps, as
 * connect4 would, and keep the mapped form of both addresses in na_sock_revnat6; recvmsg6 and
 * getpeername6 also look in the IPv4 socket storage for a mapped address, since the kernel hands
 * an AF_INET6 socket's unconnected v4-mapped datagram to the IPv4 hook (sendmsg4) but its replies
 * to recvmsg6.
 * loadBalancerSourceRanges are enforced as connect4 does (sock_lb.c says how the client's address
 * is known: the bound address, sendmsg's IP_PKTINFO source; unbound: not translated), against
 * `na_lbsrc6` (shared with the tc path, ebpf/nodeport6.c), or `na_lbsrc` for a v4-mapped service
 * (the client's mapped source address, its last word).
 * Flow events as sock_lb.c's (`flow6`, family 6; a v4-mapped service's are IPv4 ones, from choose()).
 */

struct na_in6 {   /* an IPv6 address, assignable as a whole */
    __be32 w[4];
};

struct na_svc_key6 {
    struct na_in6 addr;
    __be16 port;
    __u8 proto;
    __u8 pad;
};

struct na_backend6 {
    struct na_in6 addr;
    __be16 port;
    __u16 flags;
};

struct na_affinity_value6 {
    __u64 last_used_ns;
    __u32 slot;
    struct na_in6 addr;
    __be16 port;
    __u16 pad;
};

struct na_revnat_way6 {
    struct na_in6 backend_addr;
    struct na_in6 service_addr;
    __be16 backend_port;
    __be16 service_port;
};

struct na_sock_revnat6 {
    struct na_revnat_way6 way[NA_REVNAT_WAYS];
    __u32 next;
    __u32 pad;
};

#ifndef NA_MAX_SVC6
#define NA_MAX_SVC6 262144
#endif
#ifndef NA_MAX_SLOTS6
#define NA_MAX_SLOTS6 2097152
#endif
#ifndef NA_MAX_SETNAME6
#define NA_MAX_SETNAME6 524288
#endif
#ifndef NA_MAX_AFFINITY6
#define NA_MAX_AFFINITY6 65536
#endif
#ifndef NA_MAX_LBSRC6
#define NA_MAX_LBSRC6 65536
#endif

struct na_lbsrc_key6 {
    __u32 prefixlen;   /* 32 (the set id) + the source range's prefix length */
    __u32 set_id;
    struct na_in6 addr;
};

#define NA_LBSRC_HOST6 160   /* 32 (set id) + 128 */

BPF_TABLE_PINNED7("hash", struct na_svc_key6, struct na_svc_value, na_svc6, NA_MAX_SVC6,
                  NA_PIN_DIR "/na_svc6", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED7("hash", struct na_slot_key, struct na_backend6, na_slots6, NA_MAX_SLOTS6,
                  NA_PIN_DIR "/na_slots6", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED7("hash", __u32, struct na_set_name, na_setname6, NA_MAX_SETNAME6,
                  NA_PIN_DIR "/na_setname6", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("lru_hash", struct na_affinity_key, struct na_affinity_value6, na_affinity6, NA_MAX_AFFINITY6,
                 NA_PIN_DIR "/na_affinity6");
BPF_TABLE_PINNED7("lpm_trie", struct na_lbsrc_key6, __u8, na_lbsrc6, NA_MAX_LBSRC6, NA_PIN_DIR "/na_lbsrc6",
                  BPF_F_NO_PREALLOC);
struct na_sock_revnat6_table_t {
    int key;
    struct na_sock_revnat6 leaf;
    void *(*sk_storage_get)(void *, void *, int);
    int (*sk_storage_delete)(void *);
    u32 flags;
};
__attribute__((section("maps/sk_storage:" NA_PIN_DIR "/na_sock_revnat6")))
struct na_sock_revnat6_table_t na_sock_revnat6 = {.flags = BPF_F_NO_PREALLOC};
BPF_ANNOTATE_KV_PAIR(na_sock_revnat6, int, struct na_sock_revnat6);

/* ---- IPv6 programs ------------------------------------------------------------------------ */

#define NA_V4_MAPPED ((__be32)__builtin_bswap32(0xffff))   /* ::ffff:0:0/96, its third word */

static __always_inline int na_addr_eq6(struct na_in6 a, struct na_in6 b)
{
    return a.w[0] == b.w[0] && a.w[1] == b.w[1] && a.w[2] == b.w[2] && a.w[3] == b.w[3];
}

static __always_inline int na_v4_mapped(struct na_in6 a)
{
    return a.w[0] == 0 && a.w[1] == 0 && a.w[2] == NA_V4_MAPPED;
}

static __always_inline struct na_revnat_way6 *revnat6_find(struct na_sock_revnat6 *rev, struct na_in6 addr,
                                                           __be16 port)
{
#pragma unroll
    for (int i = 0; i < NA_REVNAT_WAYS; i++) {
        if (rev->way[i].backend_port == port && na_addr_eq6(rev->way[i].backend_addr, addr))
            return &rev->way[i];
    }
    return NULL;
}

/* remember in the socket that `backend`:`bport` is `service`:`sport` (revnat_slot's ways) */
static __always_inline void remember6(struct bpf_sock_addr *ctx, struct na_in6 backend, __be16 bport,
                                      struct na_in6 service, __be16 sport)
{
    struct na_in6 none = {};
    struct na_sock_revnat6 *rev;
    struct na_revnat_way6 *way;

    if (!ctx->sk)
        return;
    rev = na_sock_revnat6.sk_storage_get(ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
    if (!rev)
        return;
    way = revnat6_find(rev, backend, bport);
    if (!way)
        way = revnat6_find(rev, none, 0);
    if (!way) {
        way = &rev->way[rev->next & (NA_REVNAT_WAYS - 1)];
        rev->next++;
    }
    way->backend_addr = backend;
    way->service_addr = service;
    way->backend_port = bport;
    way->service_port = sport;
}

/* pick_backend over the IPv6 sets */
static __always_inline int pick_backend6(__u64 who, __u32 set_id, __u32 count, __u32 timeout,
                                         struct na_backend6 *out)
{
    struct na_slot_key slot = {.set_id = set_id};
    struct na_affinity_key akey = {.netns_cookie = who, .set_id = set_id};
    struct na_affinity_value6 *aff;
    struct na_backend6 *backend;
    __u64 now = 0;

    if (timeout) {
        now = bpf_ktime_get_ns();
        aff = na_affinity6.lookup(&akey);
        if (aff && now - aff->last_used_ns <= (__u64)timeout * 1000000000ULL && aff->slot < count) {
            slot.slot = aff->slot;
            backend = na_slots6.lookup(&slot);
            if (backend && backend->port == aff->port && na_addr_eq6(backend->addr, aff->addr)) {
                aff->last_used_ns = now;
                *out = *backend;
                return 1;
            }
        }
    }
    slot.slot = bpf_get_prandom_u32() % count;
    backend = na_slots6.lookup(&slot);
    if (!backend)
        return 0;
    *out = *backend;
    if (timeout) {
        struct na_affinity_value6 value = {.last_used_ns = now, .slot = slot.slot, .addr = backend->addr,
                                           .port = backend->port};
        na_affinity6.update(&akey, &value);
    }
    return 1;
}

/* fenced() for an IPv6 service: 0 allowed, 1 the source is not known yet, -NA_EPERM outside */
static __always_inline int fenced6(struct na_svc_value *svc, struct na_in6 src)
{
    if (!(svc->flags & NA_F_SOURCE_RANGES))
        return 0;
    if (!(src.w[0] | src.w[1] | src.w[2] | src.w[3]))
        return 1;
    struct na_lbsrc_key6 client = {.prefixlen = NA_LBSRC_HOST6, .set_id = svc->ext_set_id, .addr = src};
    return na_lbsrc6.lookup(&client) ? 0 : -NA_EPERM;
}

/* A v4-mapped destination (`key`, an IPv4 service's address in its last word): translated
 * through the IPv4 maps, as connect4 does, and written back mapped. `src`: the socket's
 * source (v4-mapped when chosen; anything else is no IPv4 source: not known). */
static __always_inline int translate_mapped(struct bpf_sock_addr *ctx, struct na_svc_key6 *key, struct na_in6 src)
{
    struct na_svc_key key4 = {.addr = key->addr.w[3], .port = key->port, .proto = key->proto};
    struct na_backend backend = {};
    int chosen = choose(ctx, &key4, na_v4_mapped(src) ? src.w[3] : 0, &backend);

    if (chosen <= 0)
        return chosen == 0 ? 1 : refuse(-chosen);
    struct na_in6 mapped = {.w = {0, 0, NA_V4_MAPPED, backend.addr}};
    remember6(ctx, mapped, backend.port, key->addr, key->port);
    ctx->user_ip6[3] = backend.addr;
    ctx->user_port = backend.port;
    return 1;
}

/* one IPv6 service's event (flow4's for na_svc6): `chosen` 1 translated to `backend`, -errno refused */
static __always_inline void flow6(void *ctx, int chosen, struct na_svc_key6 *key, struct na_backend6 *backend,
                                  struct na_in6 src)
{
    struct na_flow_event *ev = flow_reserve(ctx, chosen < 0 ? -chosen : 0, key->proto, 6);

    if (!ev)
        return;
    __builtin_memcpy(ev->service_addr, &key->addr, sizeof(ev->service_addr));
    __builtin_memcpy(ev->source_addr, &src, sizeof(ev->source_addr));
    ev->service_port = key->port;
    if (chosen > 0) {
        __builtin_memcpy(ev->backend_addr, &backend->addr, sizeof(ev->backend_addr));
        ev->backend_port = backend->port;
    }
    na_flow_events.ringbuf_submit(ev, 0);
}

/* choose() over na_svc6: 1 picked into `out`, 0 untouched, -errno refused (with its flow event) */
static __always_inline int choose6(void *ctx, struct na_svc_key6 *key, struct na_in6 src, struct na_backend6 *out)
{
    struct na_svc_value *svc = na_svc6.lookup(key);
    int chosen = 1;

    if (!svc)
        return 0;
    int fence = fenced6(svc, src);
    if (fence > 0)
        return 0;
    if (fence < 0)
        chosen = fence;
    else if (svc->count == 0)
        chosen = -(svc->flags & NA_F_NO_ENDPOINTS ? NA_ECONNREFUSED : NA_EHOSTUNREACH);
    else if (!pick_backend6(svc->affinity_timeout ? na_netns_cookie(ctx) : 0, svc->set_id, svc->count,
                            svc->affinity_timeout, out))
        chosen = -NA_ECONNREFUSED;
    flow6(ctx, chosen, key, out, src);
    return chosen;
}

/* translate() for an AF_INET6 socket: 1 rewritten (or untouched), 0 refuse the call; `src` the
 * client's address as far as it is chosen (zero when not) */
static __always_inline int translate6(struct bpf_sock_addr *ctx, __u8 proto, struct na_in6 src)
{
    struct na_svc_key6 key = {.port = (__be16)ctx->user_port, .proto = proto};
    struct na_backend6 backend = {};

    key.addr.w[0] = ctx->user_ip6[0];
    key.addr.w[1] = ctx->user_ip6[1];
    key.addr.w[2] = ctx->user_ip6[2];
    key.addr.w[3] = ctx->user_ip6[3];
    if (na_v4_mapped(key.addr))
        return translate_mapped(ctx, &key, src);
    int chosen = choose6(ctx, &key, src, &backend);
    if (chosen <= 0)
        return chosen == 0 ? 1 : refuse(-chosen);
    remember6(ctx, backend.addr, backend.port, key.addr, key.port);
    ctx->user_ip6[0] = backend.addr.w[0];
    ctx->user_ip6[1] = backend.addr.w[1];
    ctx->user_ip6[2] = backend.addr.w[2];
    ctx->user_ip6[3] = backend.addr.w[3];
    ctx->user_port = backend.port;
    return 1;
}

int na_connect6(struct bpf_sock_addr *ctx)
{
    __u8 proto = ctx->protocol;
    if (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_SCTP)
        return 1;
    struct na_in6 src = {};   /* the bound address */
    if (ctx->sk) {
        src.w[0] = ctx->sk->src_ip6[0];
        src.w[1] = ctx->sk->src_ip6[1];
        src.w[2] = ctx->sk->src_ip6[2];
        src.w[3] = ctx->sk->src_ip6[3];
    }
    return translate6(ctx, proto, src);
}

int na_sendmsg6(struct bpf_sock_addr *ctx)
{
    if (ctx->protocol != IPPROTO_UDP)
        return 1;
    struct na_in6 src = {.w = {ctx->msg_src_ip6[0], ctx->msg_src_ip6[1], ctx->msg_src_ip6[2],
                               ctx->msg_src_ip6[3]}};   /* IP_PKTINFO's source, else the bound address */
    if (!(src.w[0] | src.w[1] | src.w[2] | src.w[3]) && ctx->sk) {
        src.w[0] = ctx->sk->src_ip6[0];
        src.w[1] = ctx->sk->src_ip6[1];
        src.w[2] = ctx->sk->src_ip6[2];
        src.w[3] = ctx->sk->src_ip6[3];
    }
    return translate6(ctx, IPPROTO_UDP, src);
}

static __always_inline void untranslate6(struct bpf_sock_addr *ctx)
{
    struct na_in6 addr = {.w = {ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3]}};
    __be16 port = (__be16)ctx->user_port;
    struct na_sock_revnat6 *rev;
    struct na_revnat_way6 *way;

    if (!ctx->sk || !port)
        return;
    rev = na_sock_revnat6.sk_storage_get(ctx->sk, 0, 0);
    way = rev ? revnat6_find(rev, addr, port) : NULL;
    if (way) {
        ctx->user_ip6[0] = way->service_addr.w[0];
        ctx->user_ip6[1] = way->service_addr.w[1];
        ctx->user_ip6[2] = way->service_addr.w[2];
        ctx->user_ip6[3] = way->service_addr.w[3];
        ctx->user_port = way->service_port;
        return;
    }
    if (na_v4_mapped(addr) && addr.w[3]) {
        /* a reply to a datagram sendmsg4 translated for this AF_INET6 socket */
        struct na_sock_revnat *rev4 = na_sock_revnat.sk_storage_get(ctx->sk, 0, 0);
        struct na_revnat_way *way4 = rev4 ? revnat_find(rev4, addr.w[3], port) : NULL;
        if (way4) {
            ctx->user_ip6[3] = way4->service_addr;
            ctx->user_port = way4->service_port;
        }
    }
}

int na_recvmsg6(struct bpf_sock_addr *ctx)
{
    untranslate6(ctx);
    return 1;
}

int na_getpeername6(struct bpf_sock_addr *ctx)
{
    untranslate6(ctx);
    return 1;
}
