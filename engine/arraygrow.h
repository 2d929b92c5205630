/*
 * arraygrow.h — room for more items at the end of a heap array that doubles as it grows
 * (the tables that compilers of client input, JSON Schema and patterns, build up).
 */
#ifndef LLMS_ARRAYGROW_H
#define LLMS_ARRAYGROW_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Makes room for `more` items after the n in *items (capacity *cap, items of size bytes):
 * 0, or -1 when memory runs out or the capacity would pass 32 bits (*items is kept). */
static inline int arraygrow(void **items, uint32_t *cap, uint32_t n, size_t size, uint32_t more)
{
    if (n + more < n)
        return -1;
    if (n + more <= *cap)
        return 0;
    uint64_t c = *cap ? *cap : 16;
    while (c < (uint64_t)n + more)
        c *= 2;
    if (c > UINT32_MAX || c > SIZE_MAX / size)
        return -1;
    void *p = realloc(*items, size * (size_t)c);
    if (!p)
        return -1;
    *items = p;
    *cap = (uint32_t)c;
    return 0;
}

#endif
