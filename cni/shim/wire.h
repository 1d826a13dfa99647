/*
 * wire.h: the request and reply of cni/wire.py's framing, and the exchange with the agent over
 * its unix socket (wire.c). The limits are wire.py's.
 */
#ifndef NETAGENT_SHIM_WIRE_H
#define NETAGENT_SHIM_WIRE_H

#include <stddef.h>
#include <time.h>

#include "io.h"

#define MAX_HEADER 64
#define MAX_ENV (64 * 1024)
#define MAX_STDIN (16 * 1024 * 1024)
#define MAX_REPLY (16 * 1024 * 1024)
#define IPAM_PLUGIN "netagent-ipam" /* cni/wire.py's PLUGIN_IPAM */

/* The CNI_* variables, the first occurrence of each, joined by NUL; 1 past MAX_ENV. */
int collect_env(struct buf *env);
/* The request in cni/wire.py's framing: the header, the CNI_* variables, stdin. */
void frame_request(struct buf *request, const struct buf *env, const struct buf *in, int ipam);
/* Seconds from NETAGENT_SHIM_TIMEOUT when it is a sane number, else the default. */
double agent_timeout(void);
/* A connected socket to the agent at `path` (which fits sun_path), or -1 with errno. */
int connect_agent(const char *path, const struct timespec *deadline);
/* Send the request, half-close, read and check the reply. 0, or -1 with errno and `*step`. */
int exchange(int fd, const struct buf *request, const struct timespec *deadline,
             struct buf *reply, int *code, size_t *body_at, const char **step);
/* The reply's header, "<code> <length>\n" within MAX_HEADER, where the length is exactly what
 * follows: 0 with the exit code and where the body starts, or -1 when it is malformed. */
int parse_reply(const char *data, size_t len, int *code, size_t *body_at);

#endif
