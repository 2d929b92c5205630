/*
 * ref_tensor.c — a GGUF tensor as doubles (ref_tensor.h).
 */
#include "tests/support/ref_tensor.h"

#include <stdlib.h>

#include "engine/quant/quant.h"

double *ref_tensor(const gguf_file *g, const char *name, int64_t want)
{
    const gguf_tensor *t = gguf_find_tensor(g, name);
    if (!t)
        return NULL;
    int64_t n = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    if (want >= 0 && n != want)
        return NULL;
    double *d = malloc((size_t)n * sizeof(double));
    float *row = malloc((size_t)t->ne[0] * sizeof(float));
    size_t rb = quant_row_bytes(t->type, t->ne[0]);
    for (int64_t r = 0; r < n / t->ne[0]; r++) {
        quant_dequantize_row(t->type, (const char *)t->data + r * rb, row, t->ne[0]);
        for (int64_t c = 0; c < t->ne[0]; c++)
            d[r * t->ne[0] + c] = row[c];
    }
    free(row);
    return d;
}
