/*
 * journal.h: a DEL written into the agent's DEL journal when no agent listens (journal.c).
 */
#ifndef NETAGENT_SHIM_JOURNAL_H
#define NETAGENT_SHIM_JOURNAL_H

#include "io.h"

#define RECORD_NAME 96 /* "shim-" 20+9 digits "-" pid ".wire": at most 76 bytes */

/* Write the DEL into the agent's journal; 0, or -1 with errno and `*where` set. On success the
 * record's name is in `name`, its directory in `dir` and open as `*dirfd_out`. */
int journal_del(const char *socket_path, const struct buf *request, struct buf *dir,
                char name[RECORD_NAME], int *dirfd_out, const char **where);

#endif
