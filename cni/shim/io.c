/*
 * io.c: bytes in and out, owned in one place so that no other file of the shim does raw I/O
 * or grows memory by hand.
 *
 * A `struct buf` is grown with bounds checks (doubling, never wrapping) and records running out
 * of memory in its `oom` flag instead of failing at once: callers append freely and check the
 * flag once, where they can still print an error object. read_all and write_all retry EINTR and
 * short counts; given a deadline (the agent's socket), each read or write is armed with what is
 * left of it (SO_RCVTIMEO, SO_SNDTIMEO), so the whole exchange, not each call, is bounded.
 * Stdin, stdout and the journal's files are used without a deadline.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "io.h"

void buf_add(struct buf *b, const void *p, size_t n)
{
    if (b->oom)
        return;
    if (n >= SIZE_MAX / 4 - b->len) { /* far beyond every limit: never reached, never wraps */
        b->oom = 1;
        return;
    }
    size_t need = b->len + n + 1;
    if (need > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < need)
            cap *= 2;
        char *data = realloc(b->data, cap);
        if (data == NULL) {
            b->oom = 1;
            return;
        }
        b->data = data;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void buf_str(struct buf *b, const char *s) { buf_add(b, s, strlen(s)); }

/* Arm SO_RCVTIMEO or SO_SNDTIMEO with what is left until `deadline`; ETIMEDOUT once it passed. */
int arm_timeout(int fd, int which, const struct timespec *deadline)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long left_us = (long long)(deadline->tv_sec - now.tv_sec) * 1000000LL
                        + (deadline->tv_nsec - now.tv_nsec) / 1000;
    if (left_us <= 0) { /* a zero timeval would mean "wait forever" */
        errno = ETIMEDOUT;
        return -1;
    }
    struct timeval tv = {.tv_sec = left_us / 1000000, .tv_usec = left_us % 1000000};
    return setsockopt(fd, SOL_SOCKET, which, &tv, sizeof tv);
}

/* Read `fd` to EOF into `b`. 0 on EOF, 1 when more than `limit` bytes came, -1 with errno.
 * With a deadline (sockets), a read that times out fails with ETIMEDOUT. */
int read_all(int fd, struct buf *b, size_t limit, const struct timespec *deadline)
{
    char chunk[65536];
    for (;;) {
        if (deadline != NULL && arm_timeout(fd, SO_RCVTIMEO, deadline) < 0)
            return -1;
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            errno = ETIMEDOUT;
        if (n < 0)
            return -1;
        if (n == 0)
            return 0;
        if ((size_t)n > limit - b->len)
            return 1;
        buf_add(b, chunk, (size_t)n);
        if (b->oom) {
            errno = ENOMEM;
            return -1;
        }
    }
}

int write_all(int fd, const char *p, size_t n, const struct timespec *deadline)
{
    while (n > 0) {
        if (deadline != NULL && arm_timeout(fd, SO_SNDTIMEO, deadline) < 0)
            return -1;
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            errno = ETIMEDOUT;
        if (w < 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

struct timespec deadline_after(double seconds)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    t.tv_sec += (time_t)seconds;
    t.tv_nsec += (long)((seconds - (double)(time_t)seconds) * 1e9);
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}
