/*
 * wire.c: the shim's side of cni/wire.py, the one definition of the framing (cni/client.py
 * speaks it too), limits included, and the exchange with the agent on its unix socket.
 *
 *   request  "NACNI1 <env bytes> <stdin bytes>[ netagent-ipam]\n", the CNI_* variables as "KEY=VALUE" joined
 *            by NUL (first occurrence of each key, environment order), then stdin verbatim;
 *            MAX_ENV 64 KiB of variables, MAX_STDIN 16 MiB of stdin.
 *   reply    "<exit code> <stdout bytes>\n" then stdout; the header within MAX_HEADER, the
 *            body within MAX_REPLY (16 MiB; wire.py sets no limit of its own for replies).
 *
 * The whole exchange (connect, send, receive) has one deadline: NETAGENT_SHIM_TIMEOUT (seconds,
 * default 120 like cni/client.py), honoured only when set to a number in (0, 86400]; for tests.
 * A connect waiting for room in a full listen backlog is bounded by it too. An agent that
 * answers before reading the whole request (it refused it) is read despite the EPIPE. Reading a
 * reply is exact: a header that is not two counts, or a length other than what follows, fails.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "wire.h"

#define DEFAULT_TIMEOUT 120.0

extern char **environ;

/* The CNI_* variables, the first occurrence of each, joined by NUL; 1 past MAX_ENV. */
int collect_env(struct buf *env)
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

/* The request in cni/wire.py's framing: the header, the CNI_* variables, stdin. */
void frame_request(struct buf *request, const struct buf *env, const struct buf *in, int ipam)
{
    char header[MAX_HEADER];
    snprintf(header, sizeof header, "NACNI1 %zu %zu%s\n", env->len, in->len, ipam ? " " IPAM_PLUGIN : "");
    buf_str(request, header);
    buf_add(request, env->data != NULL ? env->data : "", env->len);
    buf_add(request, in->data != NULL ? in->data : "", in->len);
}

/* Seconds from NETAGENT_SHIM_TIMEOUT when it is a sane number, else the default. */
double agent_timeout(void)
{
    const char *text = getenv("NETAGENT_SHIM_TIMEOUT");
    char *end;
    double t = text != NULL && text[0] != '\0' ? strtod(text, &end) : 0.0;
    return text != NULL && text[0] != '\0' && *end == '\0' && t > 0.0 && t <= 86400.0 ? t : DEFAULT_TIMEOUT;
}

int connect_agent(const char *path, const struct timespec *deadline)
{
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, path, strlen(path) + 1); /* decide() checked that it fits */
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
int parse_reply(const char *data, size_t len, int *code, size_t *body_at)
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
int exchange(int fd, const struct buf *request, const struct timespec *deadline,
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
