/*
 * netagent-shim: the CNI plugin binary the container runtime executes, installed as
 * <bin dir>/netagent by `netagent cni install` (built by cni/shim/build.sh).
 *
 * It does no network work. It reads the CNI_* environment and the network config on stdin,
 * finds "agentSocket" in that config, relays the whole request to the netagent agent
 * listening there, writes the agent's answer to stdout and exits with the agent's code. The
 * agent runs the one dispatcher (cni/dispatch.py), so answers are the Python client's. A config
 * without "agentSocket" (absent, null or "") goes to DEFAULT_SOCKET, `netagent run`'s default.
 *
 * Installed a second time as <bin dir>/netagent-ipam, it is the IPAM plugin of other main
 * plugins (bridge, ptp, macvlan: "ipam": {"type": "netagent-ipam"}, as host-local is named). It
 * knows by argv[0]'s basename; the config's top level is then the main plugin's, so the socket
 * is the "ipam" object's "agentSocket" (else DEFAULT_SOCKET too), and the request header
 * carries the selector " netagent-ipam" for the agent to run its IPAM-only handlers.
 *
 * Wire format: cni/wire.py is the one definition (cni/client.py speaks it too), limits included:
 *   request  "NACNI1 <env bytes> <stdin bytes>[ netagent-ipam]\n", the CNI_* variables as "KEY=VALUE" joined
 *            by NUL (first occurrence of each key, environment order), then stdin verbatim;
 *            MAX_ENV 64 KiB of variables, MAX_STDIN 16 MiB of stdin.
 *   reply    "<exit code> <stdout bytes>\n" then stdout; the header within MAX_HEADER, the
 *            body within MAX_REPLY (16 MiB; wire.py sets no limit of its own for replies).
 *
 * Without the agent:
 *   - VERSION is always answered here, as cni/version.py's version_answer() does.
 *   - No agent listening (ENOENT, ECONNREFUSED): code 11 "try again later"; the runtime retries.
 *   - DEL is not lost: the request, in wire format, goes to the agent's DEL journal
 *     <socket dir>/pending-del/shim-<realtime ns>-<pid>.wire (written as .shim-*.tmp, then
 *     renamed) and the shim exits 0. The agent adopts these records after binding its socket
 *     and before serving it (netagent/cniserver/deferred_delete.py). An agent may bind between
 *     our failed connect and the rename, so the shim connects once more after the rename: if an
 *     agent answers now, the DEL goes to it live and the record is removed (if the agent had
 *     adopted it already, the DEL just runs twice; DEL is idempotent).
 *   - A socket we may not connect to (EACCES, EPERM: not root) is code 4, "permission denied".
 *   - Any other failure to talk to the agent (timeout, bad reply) is code 11 as well. An agent
 *     that answers before reading the whole request (it refused it) is read despite the EPIPE.
 *
 * Stdin must be one JSON object (RFC 8259 plus Python's NaN/Infinity, as json.loads reads it),
 * nested at most 512 levels deep (cni/config.py's MAX_JSON_DEPTH), UTF-8 without a byte-order
 * mark; a lone \uD800-\uDFFF escape counts as malformed. Anything else is code 6 "cannot
 * decode", decided here before the socket is looked at (VERSION of blank stdin excepted), never
 * relayed: the agent would answer 6 too. The scan takes only the top-level object's string
 * values of "agentSocket" (for netagent-ipam: the "ipam" object's) and "cniVersion" (escapes
 * decoded, the last duplicate wins); the agent validates the rest of the config. agentSocket
 * must be a string, an absolute path that fits a unix socket address (107 bytes). The
 * journal directory is dirname(agentSocket)/pending-del as the agent derives it, except that
 * the agent normalises "..": give agentSocket without "..".
 *
 * NETAGENT_SHIM_TIMEOUT (seconds, default 120 like cni/client.py), honoured only when set to a
 * number in (0, 86400]: the deadline for the whole exchange with the agent. For tests.
 *
 * No shell, no exec, no fixed-size buffer written past its size: every variable-length datum
 * lives in a `struct buf` grown with bounds checks up to the limits above; every read and write
 * loop retries EINTR and short counts. SIGPIPE is ignored, so a closed pipe is an error code,
 * not a signal.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define MAX_HEADER 64
#define MAX_ENV (64 * 1024)
#define MAX_STDIN (16 * 1024 * 1024)
#define MAX_REPLY (16 * 1024 * 1024)
#define DEFAULT_TIMEOUT 120.0
#define JOURNAL_DIR "pending-del"
#define RECORD_NAME 96 /* "shim-" 20+9 digits "-" pid ".wire": at most 76 bytes */
#define TRY_AGAIN_LATER 11
#define IPAM_PLUGIN "netagent-ipam" /* cni/wire.py's PLUGIN_IPAM */
/* The agent's socket when the config names none: `netagent run`'s --cni-socket default
 * (netagent/cniserver/install.py's DEFAULT_SOCKET). build.sh may set another (tests do). */
#ifndef DEFAULT_SOCKET
#define DEFAULT_SOCKET "/run/netagent/cni.sock"
#endif
_Static_assert(sizeof DEFAULT_SOCKET > 1 && sizeof DEFAULT_SOCKET <= 108,
               "DEFAULT_SOCKET must fit a unix socket address (build.sh checks that it is absolute)");

/* cni/version.py's SUPPORTED_VERSIONS and LATEST (tests/unit/test_shim_fuzz.py keeps them equal). */
static const char *const SUPPORTED[] = {"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"};
#define LATEST "1.1.0"

extern char **environ;

/* ------------------------------------------------------------------ growable buffers */

/* Always NUL-terminated; `oom` is set (and further appends ignored) when growing fails. */
struct buf {
    char *data;
    size_t len, cap;
    int oom;
};

static void buf_add(struct buf *b, const void *p, size_t n)
{
    if (b->oom)
        return;
    if (n >= SIZE_MAX / 4 - b->len) { /* far beyond every limit: never reached, never wraps */
        b->oom = 1;
        return;
    }
    size_t need = b->len + n + 1;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need)
            cap *= 2;
        char *data = realloc(b->data, cap);
        if (data == NULL) {
            b->oom = 1;
            return;
        }
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void buf_str(struct buf *b, const char *s) { buf_add(b, s, strlen(s)); }

/* ------------------------------------------------------------------ I/O with a deadline */

/* Arm SO_RCVTIMEO or SO_SNDTIMEO with what is left until `deadline`; ETIMEDOUT once it passed. */
static int arm_timeout(int fd, int which, const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long left_us = (long long)(deadline->tv_sec - now.tv_sec) * 1000000LL
                        + (deadline->tv_nsec - now.tv_nsec) / 1000;
    if (left_us <= 0) { /* a zero timeval would mean "wait forever" */
        errno = ETIMEDOUT;
        return -1;
    }
    struct timeval tv = {.tv_sec = left_us / 1000000, .tv_usec = left_us % 1000000};
    return setsockopt(fd, SOL_SOCKET, which, &tv, sizeof tv);
}

/* Read `fd` to EOF into `b`. 0 on EOF, 1 when more than `limit` bytes came, -1 with errno.
 * With a deadline (sockets), a read that times out fails with ETIMEDOUT. */
static int read_all(int fd, struct buf *b, size_t limit, const struct timespec *deadline)
{
    char chunk[65536];
    for (;;) {
        if (deadline != NULL && arm_timeout(fd, SO_RCVTIMEO, deadline) < 0)
            return -1;
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            errno = ETIMEDOUT;
        if (n < 0)
            return -1;
        if (n == 0)
            return 0;
        if ((size_t)n > limit - b->len)
            return 1;
        buf_add(b, chunk, (size_t)n);
        if (b->oom) {
            errno = ENOMEM;
            return -1;
        }
    }
}

static int write_all(int fd, const char *p, size_t n, const struct timespec *deadline)
{
    while (n > 0) {
        if (deadline != NULL && arm_timeout(fd, SO_SNDTIMEO, deadline) < 0)
            return -1;
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            errno = ETIMEDOUT;
        if (w < 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* ------------------------------------------------------------------ JSON in and out */

/* One well-formed UTF-8 sequence at s (Unicode table 3-7): its length, or 0 if there is none. */
static size_t utf8_decode(const unsigned char *s, size_t n, unsigned *cp)
{
    size_t len;
    unsigned min;
    if (s[0] >= 0xC2 && s[0] <= 0xDF) {
        len = 2, min = 0x80, *cp = s[0] & 0x1Fu;
    } else if (s[0] >= 0xE0 && s[0] <= 0xEF) {
        len = 3, min = 0x800, *cp = s[0] & 0x0Fu;
    } else if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        len = 4, min = 0x10000, *cp = s[0] & 0x07u;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        *cp = (*cp << 6) | (s[i] & 0x3Fu);
    }
    return (*cp < min || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) ? 0 : len;
}

static void put_utf8(struct buf *b, unsigned cp)
{
    unsigned char out[4];
    size_t n;
    if (cp < 0x80) {
        out[0] = (unsigned char)cp, n = 1;
    } else if (cp < 0x800) {
        out[0] = (unsigned char)(0xC0 | cp >> 6), out[1] = (unsigned char)(0x80 | (cp & 0x3F)), n = 2;
    } else if (cp < 0x10000) {
        out[0] = (unsigned char)(0xE0 | cp >> 12), out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp & 0x3F)), n = 3;
    } else {
        out[0] = (unsigned char)(0xF0 | cp >> 18), out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
        out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F)), out[3] = (unsigned char)(0x80 | (cp & 0x3F)), n = 4;
    }
    buf_add(b, out, n);
}

/* A JSON string as Python's json.dumps writes it (ASCII only); invalid UTF-8 becomes U+FFFD. */
static void put_json_string(struct buf *b, const char *text)
{
    const unsigned char *s = (const unsigned char *)text;
    size_t n = strlen(text);
    char esc[16];
    buf_add(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        unsigned cp = s[i];
        size_t used = 1;
        const char *shorthand = NULL;
        if (cp >= 0x80 && (used = utf8_decode(s + i, n - i, &cp)) == 0)
            cp = 0xFFFD, used = 1;
        switch (cp) {
        case '"': shorthand = "\\\""; break;
        case '\\': shorthand = "\\\\"; break;
        case '\n': shorthand = "\\n"; break;
        case '\r': shorthand = "\\r"; break;
        case '\t': shorthand = "\\t"; break;
        case '\b': shorthand = "\\b"; break;
        case '\f': shorthand = "\\f"; break;
        }
        if (shorthand != NULL) {
            buf_str(b, shorthand);
        } else if (cp >= 0x20 && cp < 0x7F) {
            buf_add(b, s + i, 1);
        } else if (cp < 0x10000) {
            snprintf(esc, sizeof esc, "\\u%04x", cp);
            buf_str(b, esc);
        } else { /* a surrogate pair, as json.dumps writes it */
            snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + ((cp - 0x10000) >> 10),
                     0xDC00 + ((cp - 0x10000) & 0x3FF));
            buf_str(b, esc);
        }
        i += used;
    }
    buf_add(b, "\"", 1);
}

/* What the shim needs from the config: two string values. `has_*` is 1 for a string (its
 * `data` is then never NULL, even for ""), 0 when absent or null, -1 for any other type. */
struct config {
    struct buf version, socket;
    int has_version, has_socket;
};

/* cni/config.py's MAX_JSON_DEPTH: the agent refuses deeper nesting with code 6 as well. */
#define MAX_JSON_DEPTH 512

struct scan {
    const char *start, *p, *end;
    size_t depth;
    const char *why, *at; /* the first reason it is not JSON, and where (for the details) */
    int oom;
};

/* Which object scan_object reads: the config itself, netagent-ipam's "ipam" section, or any
 * other (nested) object, whose keys mean nothing to the shim. */
enum section { TOP_LEVEL, IPAM_SECTION, NESTED };

static int bad(struct scan *s, const char *why)
{
    if (s->why == NULL)
        s->why = why, s->at = s->p;
    return -1;
}

static int peek(const struct scan *s, char c) { return s->p < s->end && *s->p == c; }

static void skip_ws(struct scan *s)
{
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
        s->p++;
}

static int hex4(const char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        *v = *v << 4 | (unsigned)d;
    }
    return 0;
}

/* The string at s->p (on its opening quote), decoded to UTF-8 into `out` (NULL: only check it).
 * `out` always ends up allocated (data != NULL) when the string is well-formed, "" included. */
static int scan_string(struct scan *s, struct buf *out)
{
    if (out != NULL)
        buf_add(out, "", 0);
    for (s->p++; s->p < s->end;) {
        unsigned char c = (unsigned char)*s->p;
        unsigned cp;
        if (c == '"') {
            s->p++;
            if (out != NULL && out->oom)
                s->oom = 1;
            return out != NULL && out->oom ? bad(s, "out of memory") : 0;
        }
        if (c < 0x20)
            return bad(s, "a control character in a string");
        if (c >= 0x80) { /* the bytes of one well-formed UTF-8 sequence, copied as they are */
            size_t used = utf8_decode((const unsigned char *)s->p, (size_t)(s->end - s->p), &cp);
            if (used == 0)
                return bad(s, "invalid UTF-8");
            if (out != NULL)
                buf_add(out, s->p, used);
            s->p += used;
            continue;
        }
        if (c != '\\') {
            if (out != NULL)
                buf_add(out, &c, 1);
            s->p++;
            continue;
        }
        if (s->end - s->p < 2)
            break;
        c = (unsigned char)s->p[1];
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *hit = c != '\0' ? strchr(from, c) : NULL;
        if (hit != NULL) {
            cp = (unsigned char)to[hit - from];
            s->p += 2;
        } else if (c == 'u' && s->end - s->p >= 6 && hex4(s->p + 2, &cp) == 0) {
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return bad(s, "a lone UTF-16 surrogate escape");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned low;
                const char *q = s->p + 6;
                if (s->end - q < 6 || q[0] != '\\' || q[1] != 'u' || hex4(q + 2, &low)
                    || low < 0xDC00 || low > 0xDFFF)
                    return bad(s, "a lone UTF-16 surrogate escape");
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
                s->p += 6;
            }
            s->p += 6;
        } else {
            return bad(s, "an invalid escape in a string");
        }
        if (out != NULL)
            put_utf8(out, cp);
    }
    return bad(s, "an unterminated string");
}

static int scan_literal(struct scan *s, const char *word)
{
    size_t n = strlen(word);
    if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n) != 0)
        return bad(s, "not a JSON value");
    s->p += n;
    return 0;
}

static int digits(struct scan *s)
{
    const char *first = s->p;
    while (s->p < s->end && *s->p >= '0' && *s->p <= '9')
        s->p++;
    return s->p > first ? 0 : bad(s, "a malformed number");
}

/* A JSON number, or Python's NaN, Infinity and -Infinity (json.loads, and so the agent, takes them). */
static int scan_number(struct scan *s)
{
    if (peek(s, 'N'))
        return scan_literal(s, "NaN");
    if (peek(s, '-'))
        s->p++;
    if (peek(s, 'I'))
        return scan_literal(s, "Infinity");
    if (!(s->p < s->end && *s->p >= '0' && *s->p <= '9'))
        return bad(s, "not a JSON value");
    if (peek(s, '0'))
        s->p++;
    else
        digits(s);
    if (peek(s, '.')) {
        s->p++;
        if (digits(s) < 0)
            return -1;
    }
    if (peek(s, 'e') || peek(s, 'E')) {
        s->p++;
        if (peek(s, '+') || peek(s, '-'))
            s->p++;
        if (digits(s) < 0)
            return -1;
    }
    return 0;
}

static int scan_value(struct scan *s, struct config *cfg);

/* The array at s->p (on its '['): values nested anywhere mean nothing to the shim. */
static int scan_array(struct scan *s, struct config *cfg)
{
    s->p++;
    skip_ws(s);
    if (peek(s, ']')) {
        s->p++;
        return 0;
    }
    for (;;) {
        if (scan_value(s, cfg) < 0)
            return -1;
        skip_ws(s);
        if (peek(s, ']')) {
            s->p++;
            return 0;
        }
        if (!peek(s, ','))
            return bad(s, s->p < s->end ? "expected ',' or ']'" : "it ends too early");
        s->p++;
        skip_ws(s);
    }
}

static int key_is(const struct buf *key, const char *name)
{
    return key->len == strlen(name) && memcmp(key->data, name, key->len) == 0;
}

/* The object at s->p (on its '{'). At the top level it takes "cniVersion", and "agentSocket"
 * for the main plugin; for netagent-ipam it takes "agentSocket" from the last "ipam" object
 * only (the rest of the config is the main plugin's). The last duplicate wins. */
static int scan_object(struct scan *s, struct config *cfg, enum section where, int ipam_plugin)
{
    struct buf key = {0};
    int rc = -1;
    s->p++;
    skip_ws(s);
    if (peek(s, '}')) {
        s->p++;
        rc = 0;
        goto out;
    }
    for (;;) {
        key.len = 0;
        if (!peek(s, '"')) {
            bad(s, s->p < s->end ? "expected a string key" : "it ends too early");
            goto out;
        }
        if (scan_string(s, &key) < 0)
            goto out;
        skip_ws(s);
        if (!peek(s, ':')) {
            bad(s, s->p < s->end ? "expected ':'" : "it ends too early");
            goto out;
        }
        s->p++;
        skip_ws(s);
        struct buf *want = NULL;
        int *has = NULL;
        if (key_is(&key, "agentSocket") && where != NESTED && (where == IPAM_SECTION) == ipam_plugin)
            want = &cfg->socket, has = &cfg->has_socket;
        else if (where == TOP_LEVEL && key_is(&key, "cniVersion"))
            want = &cfg->version, has = &cfg->has_version;
        if (where == TOP_LEVEL && ipam_plugin && key_is(&key, "ipam")) {
            cfg->has_socket = 0; /* the last "ipam" is the one the agent reads */
            if (peek(s, '{') && s->depth + 1 <= MAX_JSON_DEPTH) {
                s->depth++;
                int got = scan_object(s, cfg, IPAM_SECTION, ipam_plugin);
                s->depth--;
                if (got < 0)
                    goto out;
            } else if (scan_value(s, cfg) < 0) {
                goto out;
            }
        } else if (want != NULL && peek(s, '"')) {
            want->len = 0;
            if (scan_string(s, want) < 0)
                goto out;
            *has = 1;
        } else {
            int null = peek(s, 'n');
            if (scan_value(s, cfg) < 0)
                goto out;
            if (has != NULL)
                *has = null ? 0 : -1; /* null is absent, as the agent reads it; else the wrong type */
        }
        skip_ws(s);
        if (peek(s, ',')) {
            s->p++;
            skip_ws(s);
            continue;
        }
        if (peek(s, '}')) {
            s->p++;
            rc = 0;
            goto out;
        }
        bad(s, s->p < s->end ? "expected ',' or '}'" : "it ends too early");
        goto out;
    }
out:
    free(key.data);
    return rc;
}

static int scan_value(struct scan *s, struct config *cfg)
{
    if (s->p >= s->end)
        return bad(s, "it ends too early");
    switch (*s->p) {
    case '{':
    case '[': {
        if (++s->depth > MAX_JSON_DEPTH) {
            s->depth--;
            return bad(s, "it nests arrays and objects more than 512 levels deep");
        }
        int rc = *s->p == '{' ? scan_object(s, cfg, NESTED, 0) : scan_array(s, cfg);
        s->depth--;
        return rc;
    }
    case '"':
        return scan_string(s, NULL);
    case 't':
        return scan_literal(s, "true");
    case 'f':
        return scan_literal(s, "false");
    case 'n':
        return scan_literal(s, "null");
    default:
        return scan_number(s);
    }
}

/* Check that stdin is one JSON object (RFC 8259 as Python's json.loads reads it, UTF-8, nested at
 * most MAX_JSON_DEPTH deep) and take what the shim needs from it. 0, or -1 with s->why set. */
static int scan_config(struct scan *s, struct config *cfg, int ipam_plugin)
{
    skip_ws(s);
    if (!peek(s, '{'))
        return bad(s, s->p < s->end ? "it is not a JSON object" : "it is empty");
    s->depth = 1;
    if (scan_object(s, cfg, TOP_LEVEL, ipam_plugin) < 0)
        return -1;
    skip_ws(s);
    return s->p == s->end ? 0 : bad(s, "extra data after the object");
}

/* The version for our own output: the config's cniVersion if we speak it, else the latest. */
static const char *reply_version(const struct config *cfg)
{
    for (size_t i = 0; cfg->has_version == 1 && i < sizeof SUPPORTED / sizeof SUPPORTED[0]; i++)
        if (strlen(SUPPORTED[i]) == cfg->version.len && memcmp(cfg->version.data, SUPPORTED[i], cfg->version.len) == 0)
            return SUPPORTED[i];
    return LATEST;
}

static void print_buf(struct buf *out)
{
    static const char fallback[] = "{\"code\": 100, \"msg\": \"netagent shim: out of memory\"}";
    if (out->oom)
        write_all(STDOUT_FILENO, fallback, sizeof fallback - 1, NULL);
    else if (out->len > 0)
        write_all(STDOUT_FILENO, out->data, out->len, NULL);
    free(out->data);
}

/* The spec's error object, as cni/errors.py's to_dict() and json.dumps() render it. */
static void render_error(struct buf *out, const struct config *cfg, int code, const char *msg, const char *details)
{
    char num[16];
    snprintf(num, sizeof num, "%d", code);
    buf_str(out, "{\"cniVersion\": \"");
    buf_str(out, reply_version(cfg));
    buf_str(out, "\", \"code\": ");
    buf_str(out, num);
    buf_str(out, ", \"msg\": ");
    put_json_string(out, msg);
    if (details != NULL && details[0] != '\0') {
        buf_str(out, ", \"details\": ");
        put_json_string(out, details);
    }
    buf_str(out, "}");
}

/* Print the error object; the exit status 1. */
static int fail(const struct config *cfg, int code, const char *msg, const char *details)
{
    struct buf out = {0};
    render_error(&out, cfg, code, msg, details);
    print_buf(&out);
    return 1;
}

/* "<a>: <b>: <strerror(err)>" for an error's details (NULL without memory; never freed: we exit). */
static char *describe(const char *a, const char *b, int err)
{
    struct buf d = {0};
    buf_str(&d, a);
    buf_str(&d, ": ");
    buf_str(&d, b);
    buf_str(&d, ": ");
    buf_str(&d, strerror(err));
    return d.oom ? NULL : d.data;
}

/* ------------------------------------------------------------------ the agent */

static int connect_agent(const char *path, const struct timespec *deadline)
{
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, path, strlen(path) + 1); /* main() checked that it fits */
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    for (;;) {
        /* SO_SNDTIMEO bounds a connect that waits for room in a full listen backlog. */
        if (arm_timeout(fd, SO_SNDTIMEO, deadline) == 0
            && (connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0 || errno == EISCONN))
            return fd;
        if (errno != EINTR)
            break;
    }
    int err = errno == EAGAIN ? ETIMEDOUT : errno;
    close(fd);
    errno = err;
    return -1;
}

/* Up to 9 digits at *p, then `stop`, all before `end`: the number (*p moves past `stop`), or -1. */
static long parse_count(const char **p, const char *end, char stop)
{
    const char *start = *p;
    long value = 0;
    while (*p < end && **p >= '0' && **p <= '9' && *p - start < 9)
        value = value * 10 + (*(*p)++ - '0');
    if (*p == start || *p >= end || **p != stop)
        return -1;
    (*p)++;
    return value;
}

/* The reply's header, "<code> <length>\n" within MAX_HEADER, where the length is exactly what
 * follows: 0 with the exit code and where the body starts, or -1 when it is malformed. */
static int parse_reply(const char *data, size_t len, int *code, size_t *body_at)
{
    const char *end = data + (len < MAX_HEADER ? len : MAX_HEADER);
    const char *p = data;
    long exit_code = parse_count(&p, end, ' ');
    long length = exit_code < 0 ? -1 : parse_count(&p, end, '\n');
    if (length < 0 || exit_code > 255 || (size_t)length != len - (size_t)(p - data))
        return -1;
    *body_at = (size_t)(p - data);
    *code = (int)exit_code;
    return 0;
}

/* Send the request, half-close, read and check the reply. 0, or -1 with errno and `*step`. */
static int exchange(int fd, const struct buf *request, const struct timespec *deadline,
                    struct buf *reply, int *code, size_t *body_at, const char **step)
{
    *step = "send";
    int send_err = 0;
    if (write_all(fd, request->data, request->len, deadline) < 0) {
        if (errno != EPIPE && errno != ECONNRESET)
            return -1;
        send_err = errno; /* an agent that refused the request early has still answered */
    } else {
        shutdown(fd, SHUT_WR); /* the agent reads to the announced length; this is a courtesy */
    }
    *step = "receive";
    int rc = read_all(fd, reply, MAX_HEADER + 1 + MAX_REPLY, deadline);
    if (rc < 0 && send_err != 0 && errno == ECONNRESET)
        rc = 0;
    if (rc > 0)
        errno = EMSGSIZE;
    if (rc != 0)
        return -1;
    if (reply->len == 0) {
        *step = send_err != 0 ? "send" : "closed without a reply";
        errno = send_err != 0 ? send_err : EPROTO;
        return -1;
    }
    *step = "malformed reply";
    errno = EPROTO;
    return parse_reply(reply->data, reply->len, code, body_at);
}

/* Seconds from NETAGENT_SHIM_TIMEOUT when it is a sane number, else the default. */
static double agent_timeout(void)
{
    const char *text = getenv("NETAGENT_SHIM_TIMEOUT");
    char *end;
    double t = text != NULL && text[0] != '\0' ? strtod(text, &end) : 0.0;
    return text != NULL && text[0] != '\0' && *end == '\0' && t > 0.0 && t <= 86400.0 ? t : DEFAULT_TIMEOUT;
}

/* Write the DEL into the agent's journal; 0, or -1 with errno and `*where` set. */
static int journal_del(const char *socket_path, const struct buf *request, struct buf *dir,
                       char name[RECORD_NAME], int *dirfd_out, const char **where)
{
    const char *slash = strrchr(socket_path, '/'); /* absolute: there is one */
    buf_add(dir, socket_path, slash == socket_path ? 1 : (size_t)(slash - socket_path));
    *where = dir->data != NULL ? dir->data : socket_path; /* NULL only when out of memory */
    if (dir->oom || (mkdir(dir->data, 0700) < 0 && errno != EEXIST))
        return -1;
    buf_str(dir, "/" JOURNAL_DIR);
    *where = dir->data != NULL ? dir->data : socket_path; /* NULL only when out of memory */
    if (dir->oom || (mkdir(dir->data, 0700) < 0 && errno != EEXIST))
        return -1;
    int dirfd = open(dir->data, O_RDONLY | O_DIRECTORY | O_NOFOLLOW);
    if (dirfd < 0)
        return -1;
    struct timespec now;
    char tmp[RECORD_NAME];
    clock_gettime(CLOCK_REALTIME, &now); /* names sort in the order the DELs came */
    snprintf(name, RECORD_NAME, "shim-%020lld%09ld-%ld.wire", (long long)now.tv_sec, now.tv_nsec, (long)getpid());
    snprintf(tmp, RECORD_NAME, ".shim-%020lld%09ld-%ld.tmp", (long long)now.tv_sec, now.tv_nsec, (long)getpid());
    int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
    int ok = fd >= 0 && write_all(fd, request->data, request->len, NULL) == 0;
    int err = errno;
    if (fd >= 0 && close(fd) < 0 && ok)
        ok = 0, err = errno;
    if (ok && renameat(dirfd, tmp, dirfd, name) < 0)
        ok = 0, err = errno;
    if (!ok) {
        if (fd >= 0)
            unlinkat(dirfd, tmp, 0);
        close(dirfd);
        errno = err;
        return -1;
    }
    *dirfd_out = dirfd;
    return 0;
}

/* ------------------------------------------------------------------ main */

/* VERSION's answer, as cni/version.py's version_answer() and json.dumps() render it. */
static void render_version(struct buf *out, const struct config *cfg)
{
    buf_str(out, "{\"cniVersion\": \"");
    buf_str(out, reply_version(cfg));
    buf_str(out, "\", \"supportedVersions\": [");
    for (size_t i = 0; i < sizeof SUPPORTED / sizeof SUPPORTED[0]; i++) {
        buf_str(out, i > 0 ? ", \"" : "\"");
        buf_str(out, SUPPORTED[i]);
        buf_str(out, "\"");
    }
    buf_str(out, "]}");
}

/* The agent's socket for this config: its agentSocket (netagent-ipam: ipam.agentSocket), or
 * DEFAULT_SOCKET when that is absent, null or "" (the agent reads those as unset too). NULL with
 * `*problem` set when it is unusable: not a string, not absolute, too long for a socket address. */
static const char *agent_socket(const struct config *cfg, int ipam, const char **problem)
{
    *problem = NULL;
    if (cfg->has_socket < 0)
        *problem = ipam ? "'ipam.agentSocket' must be a string" : "'agentSocket' must be a string";
    if (cfg->has_socket <= 0 || cfg->socket.len == 0)
        return *problem != NULL ? NULL : DEFAULT_SOCKET;
    const char *path = cfg->socket.data;
    if (path[0] != '/' || strlen(path) != cfg->socket.len
        || cfg->socket.len >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
        *problem = ipam ? "'ipam.agentSocket' must be an absolute path of at most 107 bytes"
                        : "'agentSocket' must be an absolute path of at most 107 bytes";
        return NULL;
    }
    return path;
}

/* Everything the shim decides from stdin alone: 0 with `*path` set when the request goes to the
 * agent there; else `*path` is NULL and `out` holds the answer (VERSION's, or an error object)
 * with the exit code returned. `cfg` starts zeroed. The fuzz harness (cni/shim/fuzz/) calls it. */
static int decide(const char *data, size_t len, int ipam, const char *command, struct config *cfg,
                  const char **path, struct buf *out)
{
    struct scan s = {data, data, data + len, 0, NULL, NULL, 0};
    int scanned = scan_config(&s, cfg, ipam);
    char why[96];
    *path = NULL;
    if (s.oom || cfg->socket.oom || cfg->version.oom) {
        render_error(out, cfg, 100, "netagent shim: out of memory", "");
        return 1;
    }
    if (scanned < 0) { /* the agent answers an undecodable config in the latest version too */
        snprintf(why, sizeof why, "%s (at byte %zu)", s.why, (size_t)(s.at - s.start));
        cfg->has_version = 0;
    }
    if (command != NULL && strcmp(command, "VERSION") == 0) {
        size_t blank = 0; /* Python's bytes.strip() whitespace: blank stdin is no config at all */
        while (blank < len && data[blank] != '\0' && strchr(" \t\n\r\v\f", data[blank]) != NULL)
            blank++;
        if (blank == len || scanned == 0) {
            render_version(out, cfg);
            return 0;
        }
    }
    if (scanned < 0) {
        render_error(out, cfg, 6, "cannot decode the network configuration", why);
        return 1;
    }
    const char *problem;
    *path = agent_socket(cfg, ipam, &problem);
    if (*path == NULL) {
        render_error(out, cfg, 7, problem, cfg->has_socket > 0 ? cfg->socket.data : "");
        return 1;
    }
    return 0;
}

/* The CNI_* variables, the first occurrence of each, joined by NUL; 1 past MAX_ENV. */
static int collect_env(struct buf *env)
{
    for (char **e = environ; *e != NULL; e++) {
        const char *eq = strchr(*e, '=');
        if (strncmp(*e, "CNI_", 4) != 0 || eq == NULL)
            continue;
        size_t key_len = (size_t)(eq - *e) + 1; /* "KEY=" */
        char **seen = environ;
        while (seen < e && strncmp(*seen, *e, key_len) != 0)
            seen++;
        if (seen < e)
            continue;
        if (env->len > 0)
            buf_add(env, "", 1); /* the NUL separator */
        buf_str(env, *e);
        if (env->len > MAX_ENV)
            return 1;
    }
    return 0;
}

static struct timespec deadline_after(double seconds)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += (time_t)seconds;
    t.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

/* The request in cni/wire.py's framing: the header, the CNI_* variables, stdin. */
static void frame_request(struct buf *request, const struct buf *env, const struct buf *in, int ipam)
{
    char header[MAX_HEADER];
    snprintf(header, sizeof header, "NACNI1 %zu %zu%s\n", env->len, in->len, ipam ? " " IPAM_PLUGIN : "");
    buf_str(request, header);
    buf_add(request, env->data != NULL ? env->data : "", env->len);
    buf_add(request, in->data != NULL ? in->data : "", in->len);
}

/* Executed as netagent-ipam (argv[0]'s basename): the IPAM-only plugin of another main plugin. */
static int executed_as_ipam(int argc, char **argv)
{
    if (argc < 1 || argv[0] == NULL)
        return 0;
    const char *slash = strrchr(argv[0], '/');
    return strcmp(slash != NULL ? slash + 1 : argv[0], IPAM_PLUGIN) == 0;
}

int main(int argc, char **argv)
{
    struct config cfg = {{0}, {0}, 0, 0};
    struct buf in = {0}, env = {0}, request = {0}, reply = {0}, dir = {0};
    int ipam = executed_as_ipam(argc, argv);
    signal(SIGPIPE, SIG_IGN);

    int rc = read_all(STDIN_FILENO, &in, MAX_STDIN, NULL);
    if (rc < 0)
        return fail(&cfg, 5, "cannot read the network configuration from stdin", strerror(errno));
    if (rc > 0)
        return fail(&cfg, 7, "the network configuration is larger than 16 MiB", "");
    struct buf answer = {0};
    const char *command = getenv("CNI_COMMAND"), *path;
    rc = decide(in.data != NULL ? in.data : "", in.len, ipam, command, &cfg, &path, &answer);
    if (path == NULL) {
        print_buf(&answer);
        return rc;
    }
    if (collect_env(&env) > 0)
        return fail(&cfg, 4, "the CNI_* environment is larger than 64 KiB", "");

    frame_request(&request, &env, &in, ipam);
    if (request.oom || env.oom)
        return fail(&cfg, 100, "netagent shim: out of memory", "");

    struct timespec deadline = deadline_after(agent_timeout());
    int journal_fd = -1;
    char record[RECORD_NAME] = "";
    int fd = connect_agent(path, &deadline);
    if (fd < 0 && (errno == ENOENT || errno == ECONNREFUSED)) {
        int err = errno;
        if (command == NULL || strcmp(command, "DEL") != 0) {
            char *why = describe(path, "connect", err);
            return fail(&cfg, TRY_AGAIN_LATER, "the netagent agent is not running", why ? why : "");
        }
        const char *where = "";
        if (journal_del(path, &request, &dir, record, &journal_fd, &where) < 0) {
            char *why = describe(where, "cannot journal the DEL", errno);
            return fail(&cfg, TRY_AGAIN_LATER, "the netagent agent is not running", why ? why : "");
        }
        /* An agent that bound its socket since our connect may have scanned the journal
         * before the rename: if one answers now, it gets the DEL live instead. */
        fd = connect_agent(path, &deadline);
        if (fd < 0) {
            fprintf(stderr, "netagent: no agent at %s; DEL journaled as %s/%s for its next start\n",
                    path, dir.data, record);
            return 0;
        }
    }
    if (fd < 0 && (errno == EACCES || errno == EPERM)) { /* the socket is root's: retrying cannot help */
        char *why = describe(path, "connect", errno);
        return fail(&cfg, 4, "permission denied: cannot connect to the netagent agent (the CNI plugin "
                    "must run as root)", why ? why : "");
    }
    if (fd < 0) {
        char *why = describe(path, "connect", errno);
        return fail(&cfg, TRY_AGAIN_LATER, "the netagent agent did not answer", why ? why : "");
    }

    int code = 0;
    size_t body_at = 0;
    const char *step = "";
    rc = exchange(fd, &request, &deadline, &reply, &code, &body_at, &step);
    int err = errno;
    close(fd);
    if (journal_fd >= 0) {
        unlinkat(journal_fd, record, 0); /* the live DEL replaces the record (ENOENT: adopted) */
        close(journal_fd);
    }
    if (rc < 0) {
        char *why = describe(path, step, err);
        return fail(&cfg, TRY_AGAIN_LATER, "the netagent agent did not answer", why ? why : "");
    }
    if (write_all(STDOUT_FILENO, reply.data + body_at, reply.len - body_at, NULL) < 0)
        return code != 0 ? code : 5; /* the runtime cannot read a result: do not claim success */
    return code;
}
