/*
 * json.h: the shim's JSON (json.c): the checker that reads stdin as json.loads would, taking the
 * config's few fields as it goes, and the one string writer of every JSON text the shim prints.
 */
#ifndef NETAGENT_SHIM_JSON_H
#define NETAGENT_SHIM_JSON_H

#include <stddef.h>

#include "config.h"
#include "io.h"

struct scan {
    const char *start, *p, *end;
    size_t depth;
    const char *why, *at; /* the first reason it is not JSON, and where (for the details) */
    int oom;
};

/* A JSON string as Python's json.dumps writes it (ASCII only); invalid UTF-8 becomes U+FFFD. */
void put_json_string(struct buf *b, const char *text);

/* Check that stdin is one JSON object (RFC 8259 as Python's json.loads reads it, UTF-8, nested at
 * most MAX_JSON_DEPTH deep) and take what the shim needs from it. 0, or -1 with s->why set. */
int scan_config(struct scan *s, struct config *cfg, int ipam_plugin);

#endif
