/*
 * config.c: what the shim concludes from stdin alone, before any socket is looked at: whether it
 * answers by itself (VERSION; code 6 for stdin that is not one JSON object, never relayed since
 * the agent would answer 6 too; code 7 for an unusable agentSocket), or which socket the request
 * goes to.
 *
 * The socket is the config's "agentSocket" (for netagent-ipam, the "ipam" object's, since the top
 * level is then the main plugin's config); absent, null or "" it is DEFAULT_SOCKET, `netagent
 * run`'s default, as the agent reads those as unset too. It must be a string, an absolute path
 * that fits a unix socket address (107 bytes). VERSION is answered for blank stdin as well. One
 * function, decide(), so that the fuzz harness (cni/shim/fuzz/) runs exactly the shim's decision.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>
#include <sys/un.h>

#include "config.h"
#include "json.h"
#include "reply.h"

/* The agent's socket when the config names none: `netagent run`'s --cni-socket default
 * (netagent/cniserver/install.py's DEFAULT_SOCKET). build.sh may set another (tests do). */
#ifndef DEFAULT_SOCKET
#define DEFAULT_SOCKET "/run/netagent/cni.sock"
#endif
_Static_assert(sizeof DEFAULT_SOCKET > 1 && sizeof DEFAULT_SOCKET <= 108,
               "DEFAULT_SOCKET must fit a unix socket address (build.sh checks that it is absolute)");

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

int decide(const char *data, size_t len, int ipam, const char *command, struct config *cfg,
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
