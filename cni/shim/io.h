/*
 * io.h: the shim's growable buffer and its read and write loops (io.c). Every variable-length
 * datum the shim holds lives in a `struct buf`; every byte it moves goes through read_all or
 * write_all, with or without a deadline.
 */
#ifndef NETAGENT_SHIM_IO_H
#define NETAGENT_SHIM_IO_H

#include <stddef.h>
#include <time.h>

/* Always NUL-terminated; `oom` is set (and further appends ignored) when growing fails. */
struct buf {
    char *data;
    size_t len, cap;
    int oom;
};

void buf_add(struct buf *b, const void *p, size_t n);
void buf_str(struct buf *b, const char *s);

/* Arm SO_RCVTIMEO or SO_SNDTIMEO with what is left until `deadline`; ETIMEDOUT once it passed. */
int arm_timeout(int fd, int which, const struct timespec *deadline);
/* Read `fd` to EOF into `b`. 0 on EOF, 1 when more than `limit` bytes came, -1 with errno.
 * With a deadline (sockets), a read that times out fails with ETIMEDOUT. */
int read_all(int fd, struct buf *b, size_t limit, const struct timespec *deadline);
/* Write all `n` bytes (short counts and EINTR retried); 0, or -1 with errno. */
int write_all(int fd, const char *p, size_t n, const struct timespec *deadline);
/* CLOCK_MONOTONIC now plus `seconds`. */
struct timespec deadline_after(double seconds);

#endif
