/* libFuzzer target for llmsd's settings: the input is lines of "key = value" (a key may
 * be any text, a value too), each set as config_load sets a line of llmsd.conf, after the
 * built-in defaults; then the whole is checked. A refused line must say why; nothing may
 * crash, and every string setting stays terminated. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    config *c = malloc(sizeof *c);
    if (!c) {
        free(text);
        return 0;
    }
    char err[ERR_MAX];
    if (config_defaults(c, err))
        abort();
    for (char *line = text, *next; line; line = next) {
        next = strchr(line, '\n');
        if (next)
            *next++ = '\0';
        char *eq = strchr(line, '=');
        if (!eq)
            continue;
        *eq = '\0';
        err[0] = '\0';
        if (config_set(c, line, eq + 1, err) < 0 && !err[0])
            abort();
        config_known(line);
    }
    err[0] = '\0';
    if (config_check(c, err) < 0 && !err[0])
        abort();
    if (strnlen(c->model, sizeof c->model) == sizeof c->model ||
        strnlen(c->socket, sizeof c->socket) == sizeof c->socket)
        abort();
    free(c);
    free(text);
    return 0;
}
