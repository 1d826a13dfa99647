/*
 * reply.c: what the shim prints when it answers by itself, not relaying the agent: VERSION's
 * answer and the CNI error object (code, msg, details) of each failure, with the exit status 1.
 *
 * Both are rendered exactly as the agent's Python renders them (cni/version.py's
 * version_answer(), cni/errors.py's to_dict(), then json.dumps()), in the config's cniVersion
 * when the shim speaks it, else the latest: a runtime cannot tell which side answered. Strings go
 * through json.c's put_json_string, so any bytes (a path, strerror, invalid UTF-8) stay valid
 * JSON. Out of memory, a fixed error object is printed instead.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json.h"
#include "reply.h"

/* cni/version.py's SUPPORTED_VERSIONS and LATEST (tests/unit/test_shim_fuzz.py keeps them equal). */
static const char *const SUPPORTED[] = {"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"};
#define LATEST "1.1.0"

/* The version for our own output: the config's cniVersion if we speak it, else the latest. */
const char *reply_version(const struct config *cfg)
{
    for (size_t i = 0; cfg->has_version == 1 && i < sizeof SUPPORTED / sizeof SUPPORTED[0]; i++)
        if (strlen(SUPPORTED[i]) == cfg->version.len && memcmp(cfg->version.data, SUPPORTED[i], cfg->version.len) == 0)
            return SUPPORTED[i];
    return LATEST;
}

void print_buf(struct buf *out)
{
    static const char fallback[] = "{\"code\": 100, \"msg\": \"netagent shim: out of memory\"}";
    if (out->oom)
        write_all(STDOUT_FILENO, fallback, sizeof fallback - 1, NULL);
    else if (out->len > 0)
        write_all(STDOUT_FILENO, out->data, out->len, NULL);
    free(out->data);
}

/* The spec's error object, as cni/errors.py's to_dict() and json.dumps() render it. */
void render_error(struct buf *out, const struct config *cfg, int code, const char *msg, const char *details)
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
int fail(const struct config *cfg, int code, const char *msg, const char *details)
{
    struct buf out = {0};
    render_error(&out, cfg, code, msg, details);
    print_buf(&out);
    return 1;
}

/* "<a>: <b>: <strerror(err)>" for an error's details (NULL without memory; never freed: we exit). */
char *describe(const char *a, const char *b, int err)
{
    struct buf d = {0};
    buf_str(&d, a);
    buf_str(&d, ": ");
    buf_str(&d, b);
    buf_str(&d, ": ");
    buf_str(&d, strerror(err));
    return d.oom ? NULL : d.data;
}

/* VERSION's answer, as cni/version.py's version_answer() and json.dumps() render it. */
void render_version(struct buf *out, const struct config *cfg)
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
