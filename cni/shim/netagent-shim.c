/*
 * netagent-shim: the CNI plugin binary the container runtime executes, installed as
 * <bin dir>/netagent by `netagent cni install` (built by cni/shim/build.sh from every .c file
 * beside it). This file owns main: the order of the steps and the exit status of each outcome;
 * each step is a file of its own:
 *   io.c       the growable buffer and the read/write loops with a deadline
 *   json.c     checking stdin is one JSON object, taking the config's fields; JSON strings out
 *   config.c   decide(): what stdin alone settles (VERSION, code 6 or 7) or which socket to use
 *   reply.c    the answers the shim renders itself: VERSION's and the CNI error object
 *   wire.c     cni/wire.py's framing and the exchange with the agent over its socket
 *   journal.c  a DEL saved in the agent's journal while no agent listens
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
 * Without the agent:
 *   - VERSION is always answered here, as cni/version.py's version_answer() does.
 *   - No agent listening (ENOENT, ECONNREFUSED): code 11 "try again later"; the runtime retries.
 *   - DEL is not lost: the request goes to the agent's DEL journal (journal.c) and the shim
 *     exits 0. An agent may bind between our failed connect and the rename, so the shim connects
 *     once more after it: if an agent answers now, the DEL goes to it live and the record is
 *     removed (if the agent had adopted it already, the DEL just runs twice; DEL is idempotent).
 *   - A socket we may not connect to (EACCES, EPERM: not root) is code 4, "permission denied".
 *   - Any other failure to talk to the agent (timeout, bad reply) is code 11 as well.
 * Stdin over MAX_STDIN is code 7, a CNI_* environment over MAX_ENV code 4, out of memory 100.
 *
 * No shell, no exec, no fixed-size buffer written past its size: every variable-length datum
 * lives in a `struct buf` grown with bounds checks up to wire.h's limits; every read and write
 * loop retries EINTR and short counts. SIGPIPE is ignored, so a closed pipe is an error code,
 * not a signal. The fuzz harness (cni/shim/fuzz/) links all of these files with main renamed.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "io.h"
#include "journal.h"
#include "reply.h"
#include "wire.h"

#define TRY_AGAIN_LATER 11

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
