/*
 * The libFuzzer harness of the CNI shim (the .c files of cni/shim/): its request parsing and its
 * framing, in process, built with AddressSanitizer and UndefinedBehaviorSanitizer by build.sh
 * beside this file (run.sh runs it; tests/unit/test_shim_libfuzzer.py runs it in CI).
 *
 * build.sh links this file with every .c file of the shim, compiled with main renamed
 * (-Dmain=netagent_shim_main), so the harness calls the very functions the shipped binary runs,
 * with no copy to drift. Each input is:
 *   - stdin: decide() for both plugin names (netagent, netagent-ipam) and every command
 *     (ADD, DEL, CHECK, VERSION, none), which scans the config, picks the socket or renders the
 *     answer (VERSION's, an error object); then frame_request() when it goes to the agent;
 *   - an agent's reply: parse_reply();
 *   - an error's details: render_error() with the input as a C string (put_json_string's
 *     escaping of any bytes, invalid UTF-8 included).
 * Beyond the sanitizers it checks what must hold whatever the input: a taken string value has
 * data (the NULL-with-flag crash of issue 18), every answer the shim prints is one JSON object
 * its own scanner reads back in a version it speaks, a socket is absolute and fits sun_path,
 * and a request's header announces exactly the lengths that follow. A broken rule aborts.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "../config.h"
#include "../io.h"
#include "../json.h"
#include "../reply.h"
#include "../wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond) do { if (!(cond)) { fprintf(stderr, "fuzz_shim: broken: %s\n", #cond); abort(); } } while (0)

static void free_config(struct config *cfg)
{
    free(cfg->version.data);
    free(cfg->socket.data);
}

static void check_taken(const struct config *cfg)
{
    CHECK(cfg->has_version >= -1 && cfg->has_version <= 1 && cfg->has_socket >= -1 && cfg->has_socket <= 1);
    if (cfg->has_version == 1)
        CHECK(cfg->version.data != NULL && cfg->version.data[cfg->version.len] == '\0');
    if (cfg->has_socket == 1)
        CHECK(cfg->socket.data != NULL && cfg->socket.data[cfg->socket.len] == '\0');
}

/* What the shim prints must be one JSON object in a version it speaks. */
static void check_answer(const struct buf *out)
{
    if (out->oom)
        return;
    struct config cfg = {{0}, {0}, 0, 0};
    struct scan s = {out->data, out->data, out->data + out->len, 0, NULL, NULL, 0};
    CHECK(out->data != NULL && scan_config(&s, &cfg, 0) == 0);
    CHECK(cfg.has_version == 1 && strcmp(reply_version(&cfg), cfg.version.data) == 0);
    free_config(&cfg);
}

static void check_frame(const char *data, size_t size, int ipam)
{
    static const char env_text[] = "CNI_COMMAND=ADD\0CNI_IFNAME=eth0";
    struct buf env = {0}, in = {0}, request = {0};
    buf_add(&env, env_text, sizeof env_text - 1);
    buf_add(&in, data, size);
    frame_request(&request, &env, &in, ipam);
    if (!request.oom && !env.oom && !in.oom) {
        const char *newline = memchr(request.data, '\n', request.len);
        CHECK(newline != NULL && newline - request.data < MAX_HEADER);
        size_t header = (size_t)(newline - request.data) + 1;
        char expected[MAX_HEADER];
        snprintf(expected, sizeof expected, "NACNI1 %zu %zu%s\n", env.len, size, ipam ? " " IPAM_PLUGIN : "");
        CHECK(header == strlen(expected) && memcmp(request.data, expected, header) == 0);
        CHECK(request.len == header + env.len + size);
        CHECK(size == 0 || memcmp(request.data + header + env.len, data, size) == 0);
    }
    free(env.data);
    free(in.data);
    free(request.data);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const commands[] = {"ADD", "DEL", "CHECK", "VERSION", NULL};
    const char *text = (const char *)data;
    if (size > MAX_STDIN)
        return 0;
    for (int ipam = 0; ipam <= 1; ipam++) {
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
            struct config cfg = {{0}, {0}, 0, 0};
            struct buf out = {0};
            const char *path = "unset";
            int code = decide(text, size, ipam, commands[i], &cfg, &path, &out);
            check_taken(&cfg);
            if (path != NULL) {
                CHECK(code == 0 && out.len == 0 && path[0] == '/');
                CHECK(strlen(path) < sizeof(((struct sockaddr_un *)0)->sun_path));
                check_frame(text, size, ipam);
            } else {
                CHECK(out.len > 0 || out.oom);
                int version = commands[i] != NULL && strcmp(commands[i], "VERSION") == 0;
                CHECK(code == 1 || (code == 0 && version)); /* only VERSION is answered with success */
                check_answer(&out);
            }
            free(out.data);
            free_config(&cfg);
        }
    }

    int code = -1;
    size_t body_at = 0;
    if (parse_reply(text, size, &code, &body_at) == 0)
        CHECK(code >= 0 && code <= 255 && body_at > 0 && body_at <= size && text[body_at - 1] == '\n');

    char *details = malloc(size + 1);
    if (details != NULL) {
        memcpy(details, data, size);
        details[size] = '\0';
        struct config cfg = {{0}, {0}, 0, 0};
        struct buf out = {0};
        render_error(&out, &cfg, 7, details, details);
        check_answer(&out);
        free(out.data);
        free(details);
    }
    return 0;
}
