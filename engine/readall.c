/*
 * readall.c — whole streams and files read into memory (readall.h).
 */
#include "engine/readall.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

char *readall_stream(FILE *f, size_t *len, char err[ERR_MAX])
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (!buf) {
        err_set(err, "out of memory");
        return NULL;
    }
    for (;;) {
        if (n + 1 == cap) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                err_set(err, "out of memory");
                return NULL;
            }
            buf = bigger;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        free(buf);
        err_set(err, "read error");
        return NULL;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

char *readall_file(const char *path, size_t *len, char err[ERR_MAX])
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        err_set(err, "%s", strerror(errno));
        return NULL;
    }
    char *text = readall_stream(f, len, err);
    fclose(f);
    return text;
}
