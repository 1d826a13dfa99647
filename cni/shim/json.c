/*
 * json.c: the shim's JSON, in and out. One pass over stdin both checks it and takes from it
 * what the shim needs (struct config, config.h), so the bytes checked are the bytes read.
 *
 * Stdin must be one JSON object (RFC 8259 plus Python's NaN/Infinity, as json.loads reads it),
 * nested at most 512 levels deep (cni/config.py's MAX_JSON_DEPTH), UTF-8 without a byte-order
 * mark; a lone \uD800-\uDFFF escape counts as malformed. scan_config says why and where it is
 * not. The scan takes only the top-level object's string values of "agentSocket" (for
 * netagent-ipam: the last "ipam" object's) and "cniVersion", escapes decoded, the last duplicate
 * winning; the agent validates the rest of the config. The scanner is recursive descent bounded
 * by that depth, and never reads past `end`: stdin is not NUL-terminated for it.
 *
 * Out: put_json_string writes a string as Python's json.dumps does (ASCII only, surrogate pairs),
 * so the shim's own answers are the agent's byte for byte (reply.c).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"

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
void put_json_string(struct buf *b, const char *text)
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

/* cni/config.py's MAX_JSON_DEPTH: the agent refuses deeper nesting with code 6 as well. */
#define MAX_JSON_DEPTH 512

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
int scan_config(struct scan *s, struct config *cfg, int ipam_plugin)
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
