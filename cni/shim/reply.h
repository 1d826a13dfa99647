/*
 * reply.h: the answers the shim renders itself (reply.c): VERSION's, and the CNI error object
 * of every failure it reports, as the agent's Python would render them.
 */
#ifndef NETAGENT_SHIM_REPLY_H
#define NETAGENT_SHIM_REPLY_H

#include "config.h"
#include "io.h"

/* The version for our own output: the config's cniVersion if we speak it, else the latest. */
const char *reply_version(const struct config *cfg);
/* VERSION's answer, as cni/version.py's version_answer() and json.dumps() render it. */
void render_version(struct buf *out, const struct config *cfg);
/* The spec's error object, as cni/errors.py's to_dict() and json.dumps() render it. */
void render_error(struct buf *out, const struct config *cfg, int code, const char *msg, const char *details);
/* Write `out` to stdout (a fixed error object if it ran out of memory) and free it. */
void print_buf(struct buf *out);
/* Print the error object; the exit status 1. */
int fail(const struct config *cfg, int code, const char *msg, const char *details);
/* "<a>: <b>: <strerror(err)>" for an error's details (NULL without memory; never freed: we exit). */
char *describe(const char *a, const char *b, int err);

#endif
