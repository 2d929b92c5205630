/* err.c — formatting of error messages (see err.h). */
#include "engine/err.h"

#include <stdarg.h>
#include <stdio.h>

int err_set(char *err, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, ERR_MAX, fmt, ap);
        va_end(ap);
    }
    return -1;
}
