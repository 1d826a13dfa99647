/*
 * journal.c: the shim's half of the agent's DEL journal, so that a DEL is not lost while no
 * agent listens (netagent/cniserver/deferred_delete.py owns the other half and the format).
 *
 * The request, in wire format byte for byte, goes to <socket dir>/pending-del/shim-<realtime
 * ns>-<pid>.wire: written as .shim-*.tmp, then renamed, so the agent never adopts half a record,
 * and named so that records sort in the order the DELs came. The agent adopts these records
 * after binding its socket and before serving it. The directory is dirname(agentSocket)/
 * pending-del as the agent derives it, except that the agent normalises "..": give agentSocket
 * without "..". Both directories are created 0700 when missing; the journal directory is opened
 * without following a symlink and kept open (`*dirfd_out`), so that main can remove the record
 * if an agent that bound meanwhile takes the DEL live.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "journal.h"

#define JOURNAL_DIR "pending-del"

int journal_del(const char *socket_path, const struct buf *request, struct buf *dir,
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
