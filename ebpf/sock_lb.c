/* netagent socket-level service load balancing (cgroup v2 CGROUP_SOCK_ADDR programs).
 *
 * Compiled by bcc at agent start (ebpf/loader.py prepends NA_PIN_DIR, NA_HAVE_SET_RETVAL and each
 * map's capacity, NA_MAX_<MAP>, from --bpf-map-max; the defaults below are ebpf/sizes.py's).
 * A connect() or an unconnected UDP sendmsg() to a service address (cluster IP, NodePort on a
 * node address, external IP, load-balancer IP) is rewritten to one of its backends before the
 * kernel routes it, so east-west traffic needs no per-packet NAT and no conntrack entry.
 * The reverse translation is kept in the socket itself (`na_sock_revnat`, socket-local storage:
 * created with the socket's first translated connect or sendmsg, freed with the socket), so
 * recvmsg() (UDP replies) and getpeername() show the service address the application asked
 * for, and no other socket can evict it: a pod opening sockets without end fills nothing shared.
 *
 * Maps (the Python views in ebpf/maps.py are checked against these structs by a test):
 *   na_svc      service address/port/protocol -> backend set, its slot count, affinity, flags
 *   na_slots    (set id, slot) -> backend; one slot per unit of weight, so one endpoint
 *               change writes O(1) entries
 *   na_setname  set id -> the service port's name (for read-back and adoption; unused here)
 *   na_affinity (netns cookie, set id) -> backend and last use (ClientIP affinity, LRU)
 *   na_lbsrc    (set id, client address) LPM trie: loadBalancerSourceRanges, shared with the tc
 *               path (ebpf/nodeport.c), which checks them with the same key
 *   na_sock_revnat  per socket (socket storage): up to NA_REVNAT_WAYS backend address/port ->
 *               service address/port (an unconnected UDP socket may send to several services;
 *               beyond that many backends at once, the oldest way is reused)
 * Addresses and ports are kept in network byte order, as the socket context holds them.
 *
 * loadBalancerSourceRanges (NA_F_SOURCE_RANGES, set on load-balancer IP entries) are enforced here
 * as on the tc path: the client's address must be in `na_lbsrc` under the entry's external set
 * (`fenced()`). The client's address is the one the kernel will put on the packets, when the hook
 * can know it: for connect(), the socket's bound address (`sk->src_ip4`: bind(), or an earlier
 * connect of a UDP socket); for an unconnected sendmsg(), the IP_PKTINFO source (`msg_src_ip4`),
 * else the bound address. A socket whose source is not chosen yet (unbound: the kernel picks it by
 * the route *after* this hook, and a CGROUP_SOCK_ADDR program has no route lookup) is not
 * translated: its packets go to the load-balancer IP itself, and the packet path judges them by
 * their real source, as the tc path does for any packet (na_tc_from_pod on the pod's veth, or the
 * load balancer outside). So the socket LB never serves a fenced address it cannot vouch for.
 * A known source outside the ranges: the call is refused with EPERM, which is what a local socket
 * sees of a packet dropped on its way out (iptables DROP in OUTPUT; the tc path drops it too).
 *
 * Flow events (while `na_flow_on` holds 1: the agent's flow listener sets it, proxy/ebpf/flows.py): each translated
 * connect/sendmsg and each refused one (no endpoints, none usable, outside the source ranges)
 * puts one `na_flow_event` into `na_flow_events`, a BPF ring buffer of NA_FLOW_RING_BYTES; the
 * agent reads it (ebpf/ringbuf.py) into flow records (proxy/ebpf/flows.py), since conntrack never
 * sees a Service address this file rewrote. One reserve and one submit per call; a full ring
 * drops the event and counts it in `na_flow_lost` (per CPU), which the agent reads as its loss.
 * Off, an event costs one array lookup (inlined by the verifier); on or off, the programs' code
 * is the same, so turning flows on or off never replaces a program.
 *
 * IPv6 has maps and programs of its own beside these: ebpf/sock_lb6.c, compiled after this file.
 */
#include <uapi/linux/bpf.h>
#include <uapi/linux/in.h>

#define NA_ECONNREFUSED 111
#define NA_EHOSTUNREACH 113

#define NA_F_NO_ENDPOINTS 1    /* the service has no usable endpoint anywhere: refuse */
#define NA_F_EXTERNAL_LOCAL 2  /* externalTrafficPolicy Local (tc path) */
#define NA_F_SOURCE_RANGES 4   /* loadBalancerSourceRanges apply (tc path) */

struct na_svc_key {
    __be32 addr;
    __be16 port;
    __u8 proto;
    __u8 pad;
};

struct na_svc_value {
    __u32 set_id;           /* backends for connections made on this node (the cluster set) */
    __u32 count;            /* its slots */
    __u32 ext_set_id;       /* backends for packets from outside the node (the external set) */
    __u32 ext_count;
    __u32 affinity_timeout; /* seconds of ClientIP affinity, 0 for none */
    __u16 flags;
    __u8 kind;              /* 1 ClusterIP, 2 NodePort, 3 ExternalIP, 4 LoadBalancer */
    __u8 pad;
};

struct na_slot_key {
    __u32 set_id;
    __u32 slot;
};

struct na_backend {
    __be32 addr;
    __be16 port;
    __u16 flags;            /* 1: the endpoint is on this node (the tc path SNATs only to others) */
};

struct na_set_name {
    char name[124];
    __u32 role;             /* 1 cluster set, 2 external set */
};

struct na_affinity_key {
    __u64 netns_cookie;
    __u32 set_id;
    __u32 pad;
};

struct na_affinity_value {
    __u64 last_used_ns;
    __u32 slot;
    __be32 addr;
    __be16 port;
    __u16 pad;
    __u32 pad2;
};

#define NA_REVNAT_WAYS 4   /* a power of two */

struct na_revnat_way {
    __be32 backend_addr;
    __be32 service_addr;
    __be16 backend_port;
    __be16 service_port;
};

struct na_sock_revnat {
    struct na_revnat_way way[NA_REVNAT_WAYS];
    __u32 next;   /* the way to reuse when all are taken by other backends */
    __u32 pad;
};

#ifndef NA_MAX_SVC
#define NA_MAX_SVC 262144
#endif
#ifndef NA_MAX_SLOTS
#define NA_MAX_SLOTS 2097152
#endif
#ifndef NA_MAX_SETNAME
#define NA_MAX_SETNAME 524288
#endif
#ifndef NA_MAX_AFFINITY
#define NA_MAX_AFFINITY 65536
#endif
#ifndef NA_MAX_LBSRC
#define NA_MAX_LBSRC 65536
#endif

struct na_lbsrc_key {
    __u32 prefixlen;   /* 32 (the set id) + the source range's prefix length */
    __u32 set_id;
    __be32 addr;
};

#define NA_LBSRC_HOST 64   /* an LPM key's prefix length for one client: 32 (set id) + 32 */
#define NA_EPERM 1

BPF_TABLE_PINNED7("hash", struct na_svc_key, struct na_svc_value, na_svc, NA_MAX_SVC,
                  NA_PIN_DIR "/na_svc", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED7("hash", struct na_slot_key, struct na_backend, na_slots, NA_MAX_SLOTS,
                  NA_PIN_DIR "/na_slots", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED7("hash", __u32, struct na_set_name, na_setname, NA_MAX_SETNAME,
                  NA_PIN_DIR "/na_setname", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("lru_hash", struct na_affinity_key, struct na_affinity_value, na_affinity, NA_MAX_AFFINITY,
                 NA_PIN_DIR "/na_affinity");
BPF_TABLE_PINNED7("lpm_trie", struct na_lbsrc_key, __u8, na_lbsrc, NA_MAX_LBSRC, NA_PIN_DIR "/na_lbsrc",
                  BPF_F_NO_PREALLOC);
/* bcc's BPF_SK_STORAGE, pinned (bcc reads a pin path after the map type in the section name) */
struct na_sock_revnat_table_t {
    int key;
    struct na_sock_revnat leaf;
    void *(*sk_storage_get)(void *, void *, int);
    int (*sk_storage_delete)(void *);
    u32 flags;
};
__attribute__((section("maps/sk_storage:" NA_PIN_DIR "/na_sock_revnat")))
struct na_sock_revnat_table_t na_sock_revnat = {.flags = BPF_F_NO_PREALLOC};
BPF_ANNOTATE_KV_PAIR(na_sock_revnat, int, struct na_sock_revnat);

/* the way remembering `addr`:`port`, or NULL */
static __always_inline struct na_revnat_way *revnat_find(struct na_sock_revnat *rev, __be32 addr, __be16 port)
{
#pragma unroll
    for (int i = 0; i < NA_REVNAT_WAYS; i++) {
        if (rev->way[i].backend_addr == addr && rev->way[i].backend_port == port)
            return &rev->way[i];
    }
    return NULL;
}

/* where to remember `addr`:`port`: its own way, else an empty one, else the next in turn */
static __always_inline struct na_revnat_way *revnat_slot(struct na_sock_revnat *rev, __be32 addr, __be16 port)
{
    struct na_revnat_way *way = revnat_find(rev, addr, port);

    if (way)
        return way;
    way = revnat_find(rev, 0, 0);
    if (way)
        return way;
    way = &rev->way[rev->next & (NA_REVNAT_WAYS - 1)];
    rev->next++;
    return way;
}

static __u64 (*na_netns_cookie)(void *ctx) = (void *)BPF_FUNC_get_netns_cookie;

/* ---- flow events (see the top of this file; ebpf/maps.py's FLOW_EVENT is their Python view) ---- */
struct na_flow_event {
    __u64 netns_cookie;      /* the calling socket's network namespace */
    __be32 service_addr[4];  /* IPv4: the first word only */
    __be32 backend_addr[4];  /* translated: the backend chosen; refused: zero */
    __be32 source_addr[4];   /* the client's address when the hook knows it (bound, IP_PKTINFO), else zero */
    __be16 service_port;
    __be16 backend_port;
    __u8 family;             /* 4 or 6 */
    __u8 proto;
    __u8 error;              /* 0 translated, else the errno the call was refused with */
    __u8 pad;
};

#ifndef NA_FLOW_RING_BYTES
#define NA_FLOW_RING_BYTES 262144   /* a power of two, whole pages */
#endif

struct na_flow_events_table_t {   /* bcc's BPF_RINGBUF_OUTPUT, pinned (as na_sock_revnat below) */
    int key;
    u32 leaf;
    int (*ringbuf_output)(void *, u64, u64);
    void *(*ringbuf_reserve)(u64);
    void (*ringbuf_discard)(void *, u64);
    void (*ringbuf_submit)(void *, u64);
    u32 max_entries;
};
__attribute__((section("maps/ringbuf:" NA_PIN_DIR "/na_flow_events")))
struct na_flow_events_table_t na_flow_events = {.max_entries = NA_FLOW_RING_BYTES};
BPF_ANNOTATE_KV_PAIR(na_flow_events, int, u32);
BPF_TABLE_PINNED("percpu_array", __u32, __u64, na_flow_lost, 1, NA_PIN_DIR "/na_flow_lost");
BPF_TABLE_PINNED("array", __u32, __u32, na_flow_on, 1, NA_PIN_DIR "/na_flow_on");

/* a zeroed event with its common fields, reserved in the ring (submit it), or NULL: the ring is
 * full (counted) or events are off */
static __always_inline struct na_flow_event *flow_reserve(void *ctx, int error, __u8 proto, __u8 family)
{
    __u32 zero = 0;
    __u32 *on = na_flow_on.lookup(&zero);

    if (!on || !*on)
        return NULL;
    struct na_flow_event *ev = na_flow_events.ringbuf_reserve(sizeof(struct na_flow_event));
    if (!ev) {
        __u64 *lost = na_flow_lost.lookup(&zero);
        if (lost)
            (*lost)++;   /* per CPU: no other writer */
        return NULL;
    }
    __builtin_memset(ev, 0, sizeof(*ev));
    ev->netns_cookie = na_netns_cookie(ctx);
    ev->family = family;
    ev->proto = proto;
    ev->error = error;
    return ev;
}

/* one IPv4 service's event: `chosen` is choose()'s answer (1 translated to `backend`, -errno refused) */
static __always_inline void flow4(void *ctx, int chosen, struct na_svc_key *key, struct na_backend *backend,
                                  __be32 src)
{
    struct na_flow_event *ev = flow_reserve(ctx, chosen < 0 ? -chosen : 0, key->proto, 4);

    if (!ev)
        return;
    ev->service_addr[0] = key->addr;
    ev->service_port = key->port;
    ev->source_addr[0] = src;
    if (chosen > 0) {
        ev->backend_addr[0] = backend->addr;
        ev->backend_port = backend->port;
    }
    na_flow_events.ringbuf_submit(ev, 0);
}

static __always_inline int refuse(int error)
{
#ifdef NA_HAVE_SET_RETVAL
    bpf_set_retval(-error);
#endif
    return 0;   /* without bpf_set_retval (kernel < 5.18) the caller sees EPERM */
}

/* one of a set's `count` slots: the client's (`who`) affine backend while it is still in the
 * slot it had and the affinity is fresh, else a random slot (remembered when `timeout` is set) */
static __always_inline int pick_backend(__u64 who, __u32 set_id, __u32 count, __u32 timeout,
                                        struct na_backend *out)
{
    struct na_slot_key slot = {.set_id = set_id};
    struct na_affinity_key akey = {.netns_cookie = who, .set_id = set_id};
    struct na_affinity_value *aff;
    struct na_backend *backend;
    __u64 now = 0;

    if (timeout) {
        now = bpf_ktime_get_ns();
        aff = na_affinity.lookup(&akey);
        if (aff && now - aff->last_used_ns <= (__u64)timeout * 1000000000ULL && aff->slot < count) {
            slot.slot = aff->slot;
            backend = na_slots.lookup(&slot);
            /* the backend must still be in the slot it had: a moved or removed one is re-picked */
            if (backend && backend->addr == aff->addr && backend->port == aff->port) {
                aff->last_used_ns = now;
                *out = *backend;
                return 1;
            }
        }
    }
    slot.slot = bpf_get_prandom_u32() % count;
    backend = na_slots.lookup(&slot);
    if (!backend)
        return 0;
    *out = *backend;
    if (timeout) {
        struct na_affinity_value value = {.last_used_ns = now, .slot = slot.slot,
                                          .addr = backend->addr, .port = backend->port};
        na_affinity.update(&akey, &value);
    }
    return 1;
}

/* loadBalancerSourceRanges (see the top of this file): 0 the client `src` may use `svc`,
 * 1 its source is not known yet (leave the call untranslated), -NA_EPERM it is outside them */
static __always_inline int fenced(struct na_svc_value *svc, __be32 src)
{
    if (!(svc->flags & NA_F_SOURCE_RANGES))
        return 0;
    if (!src)
        return 1;
    struct na_lbsrc_key client = {.prefixlen = NA_LBSRC_HOST, .set_id = svc->ext_set_id, .addr = src};
    return na_lbsrc.lookup(&client) ? 0 : -NA_EPERM;
}

/* choose() before its flow event */
static __always_inline int choose_backend(void *ctx, struct na_svc_key *key, __be32 src, struct na_backend *out)
{
    struct na_svc_value *svc = na_svc.lookup(key);

    if (!svc)
        return 0;
    int fence = fenced(svc, src);
    if (fence)
        return fence > 0 ? 0 : fence;
    if (svc->count == 0)
        return -(svc->flags & NA_F_NO_ENDPOINTS ? NA_ECONNREFUSED : NA_EHOSTUNREACH);
    __u64 who = svc->affinity_timeout ? na_netns_cookie(ctx) : 0;
    if (!pick_backend(who, svc->set_id, svc->count, svc->affinity_timeout, out))
        return -NA_ECONNREFUSED;
    return 1;
}

/* The service at `key` (an IPv4 one: na_svc) picks one of its backends into `out` for a client
 * whose source address is `src` (0: not known yet): 1 picked, 0 not a service or not ours to
 * translate (untouched), -errno when the call must be refused with it; a flow event for 1 and -errno. */
static __always_inline int choose(void *ctx, struct na_svc_key *key, __be32 src, struct na_backend *out)
{
    int chosen = choose_backend(ctx, key, src, out);

    if (chosen)
        flow4(ctx, chosen, key, out, src);
    return chosen;
}

/* 1: rewritten (or not a service: untouched); 0: refuse the call. `src`: the client's address
 * as far as it is chosen (0 when not) */
static __always_inline int translate(struct bpf_sock_addr *ctx, __u8 proto, int remember, __be32 src)
{
    struct na_svc_key key = {.addr = ctx->user_ip4, .port = (__be16)ctx->user_port, .proto = proto};
    struct na_backend backend = {};
    int chosen = choose(ctx, &key, src, &backend);

    if (chosen <= 0)
        return chosen == 0 ? 1 : refuse(-chosen);
    if (remember && ctx->sk) {
        struct na_sock_revnat *rev = na_sock_revnat.sk_storage_get(ctx->sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
        if (rev) {
            struct na_revnat_way *way = revnat_slot(rev, backend.addr, backend.port);
            way->backend_addr = backend.addr;
            way->backend_port = backend.port;
            way->service_addr = key.addr;
            way->service_port = key.port;
        }
    }
    ctx->user_ip4 = backend.addr;
    ctx->user_port = backend.port;
    return 1;
}

int na_connect4(struct bpf_sock_addr *ctx)
{
    __u8 proto = ctx->protocol;   /* IPPROTO_TCP, IPPROTO_UDP or IPPROTO_SCTP */
    if (proto != IPPROTO_TCP && proto != IPPROTO_UDP && proto != IPPROTO_SCTP)
        return 1;
    return translate(ctx, proto, 1, ctx->sk ? ctx->sk->src_ip4 : 0);   /* the bound address */
}

int na_sendmsg4(struct bpf_sock_addr *ctx)   /* unconnected UDP: every datagram */
{
    if (ctx->protocol != IPPROTO_UDP)
        return 1;
    __be32 src = ctx->msg_src_ip4;   /* IP_PKTINFO's source, else the bound address */
    if (!src && ctx->sk)
        src = ctx->sk->src_ip4;
    return translate(ctx, IPPROTO_UDP, 1, src);
}

static __always_inline void untranslate(struct bpf_sock_addr *ctx)
{
    struct na_sock_revnat *rev;
    struct na_revnat_way *way;
    __be32 addr = ctx->user_ip4;
    __be16 port = (__be16)ctx->user_port;

    if (!ctx->sk)
        return;
    rev = na_sock_revnat.sk_storage_get(ctx->sk, 0, 0);
    if (!rev)
        return;
    way = revnat_find(rev, addr, port);
    if (way && addr) {
        ctx->user_ip4 = way->service_addr;
        ctx->user_port = way->service_port;
    }
}

int na_recvmsg4(struct bpf_sock_addr *ctx)
{
    untranslate(ctx);
    return 1;
}

int na_getpeername4(struct bpf_sock_addr *ctx)
{
    untranslate(ctx);
    return 1;
}
