/*
 * config.h: what the shim takes from the network config on stdin, and decide(), everything it
 * concludes from stdin alone (config.c). json.c fills `struct config` as it checks stdin.
 */
#ifndef NETAGENT_SHIM_CONFIG_H
#define NETAGENT_SHIM_CONFIG_H

#include <stddef.h>

#include "io.h"

/* What the shim needs from the config: two string values. `has_*` is 1 for a string (its
 * `data` is then never NULL, even for ""), 0 when absent or null, -1 for any other type. */
struct config {
    struct buf version, socket;
    int has_version, has_socket;
};

/* Everything the shim decides from stdin alone: 0 with `*path` set when the request goes to the
 * agent there; else `*path` is NULL and `out` holds the answer (VERSION's, or an error object)
 * with the exit code returned. `cfg` starts zeroed. The fuzz harness (cni/shim/fuzz/) calls it. */
int decide(const char *data, size_t len, int ipam, const char *command, struct config *cfg,
           const char **path, struct buf *out);

#endif
