/*
 * device.c — the `device` setting's syntax, the same with or without the CUDA backend
 * (a configuration that names a GPU is valid everywhere; loading the model says whether
 * this build and machine can have one).
 */
#include "engine/cuda/cuda.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cuda_parse_device(const char *text, int *out, char err[ERR_MAX])
{
    if (!strcmp(text, "cpu")) {
        *out = -1;
        return 0;
    }
    if (!strcmp(text, "cuda")) {
        *out = 0;
        return 0;
    }
    if (!strncmp(text, "cuda:", 5) && text[5] >= '0' && text[5] <= '9') {
        char *end;
        errno = 0;
        long n = strtol(text + 5, &end, 10);
        if (!*end && !errno && n < 1024) {
            *out = (int)n;
            return 0;
        }
    }
    snprintf(err, ERR_MAX, "device '%s': expected cpu, cuda or cuda:N", text);
    return -1;
}
