/* netagent socket-level service load balancing (cgroup v2 CGROUP_SOCK_ADDR programs).
 *
 * Compiled by bcc at agent start (ebpf/loader.py prepends NA_PIN_DIR, NA_HAVE_SET_RETVAL and each
 * map's capacity, NA_MAX_<MAP>, from --bpf-map-max; the defaults below are ebpf/sizes.py's).
 * A connect() or an unconnected UDP sendmsg() to a service address (cluster IP, NodePort on a
 * node address, external IP, load-balancer IP) is rewritten to one of its backends before the
 * kernel routes it, so east-west traffic needs no per-packet NAT and no conntrack entry.
 * The reverse-NAT map remembers, per socket, which service address a backend stands for, so
 * recvmsg() (UDP replies) and getpeername() show the service address the application asked for.
 *
 * Maps (the Python views in ebpf/maps.py are checked against these structs by a test):
 *   na_svc      service address/port/protocol -> backend set, its slot count, affinity, flags
 *   na_slots    (set id, slot) -> backend; one slot per unit of weight, so one endpoint
 *               change writes O(1) entries
 *   na_setname  set id -> the service port's name (for read-back and adoption; unused here)
 *   na_affinity (netns cookie, set id) -> backend and last use (ClientIP affinity, LRU)
 *   na_revnat   (socket cookie, backend address/port) -> service address/port (LRU)
 * Addresses and ports are kept in network byte order, as the socket context holds them.
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

struct na_revnat_key {
    __u64 socket_cookie;
    __be32 addr;
    __be16 port;
    __u16 pad;
};

struct na_revnat_value {
    __be32 addr;
    __be16 port;
    __u16 pad;
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
#ifndef NA_MAX_REVNAT
#define NA_MAX_REVNAT 131072
#endif

BPF_TABLE_PINNED7("hash", struct na_svc_key, struct na_svc_value, na_svc, NA_MAX_SVC,
                  NA_PIN_DIR "/na_svc", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED7("hash", struct na_slot_key, struct na_backend, na_slots, NA_MAX_SLOTS,
                  NA_PIN_DIR "/na_slots", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED7("hash", __u32, struct na_set_name, na_setname, NA_MAX_SETNAME,
                  NA_PIN_DIR "/na_setname", BPF_F_NO_PREALLOC);
BPF_TABLE_PINNED("lru_hash", struct na_affinity_key, struct na_affinity_value, na_affinity, NA_MAX_AFFINITY,
                 NA_PIN_DIR "/na_affinity");
BPF_TABLE_PINNED("lru_hash", struct na_revnat_key, struct na_revnat_value, na_revnat, NA_MAX_REVNAT,
                 NA_PIN_DIR "/na_revnat");

static __u64 (*na_socket_cookie)(void *ctx) = (void *)BPF_FUNC_get_socket_cookie;
static __u64 (*na_netns_cookie)(void *ctx) = (void *)BPF_FUNC_get_netns_cookie;

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

/* 1: rewritten (or not a service: untouched); 0: refuse the call */
static __always_inline int translate(struct bpf_sock_addr *ctx, __u8 proto, int remember)
{
    struct na_svc_key key = {.addr = ctx->user_ip4, .port = (__be16)ctx->user_port, .proto = proto};
    struct na_svc_value *svc = na_svc.lookup(&key);
    struct na_backend backend = {};

    if (!svc)
        return 1;
    if (svc->count == 0)
        return refuse(svc->flags & NA_F_NO_ENDPOINTS ? NA_ECONNREFUSED : NA_EHOSTUNREACH);
    __u64 who = svc->affinity_timeout ? na_netns_cookie(ctx) : 0;
    if (!pick_backend(who, svc->set_id, svc->count, svc->affinity_timeout, &backend))
        return refuse(NA_ECONNREFUSED);
    if (remember) {
        struct na_revnat_key rkey = {.socket_cookie = na_socket_cookie(ctx), .addr = backend.addr,
                                     .port = backend.port};
        struct na_revnat_value rvalue = {.addr = key.addr, .port = key.port};
        na_revnat.update(&rkey, &rvalue);
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
    return translate(ctx, proto, 1);
}

int na_sendmsg4(struct bpf_sock_addr *ctx)   /* unconnected UDP: every datagram */
{
    if (ctx->protocol != IPPROTO_UDP)
        return 1;
    return translate(ctx, IPPROTO_UDP, 1);
}

static __always_inline void untranslate(struct bpf_sock_addr *ctx)
{
    struct na_revnat_key rkey = {.socket_cookie = na_socket_cookie(ctx), .addr = ctx->user_ip4,
                                 .port = (__be16)ctx->user_port};
    struct na_revnat_value *service = na_revnat.lookup(&rkey);

    if (service) {
        ctx->user_ip4 = service->addr;
        ctx->user_port = service->port;
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
