/*
 * gguf_copy.c — a GGUF file copied with one string of metadata set (gguf_copy.h).
 */
#include "tests/support/gguf_copy.h"

#include <stdio.h>
#include <string.h>

#include "engine/gguf/gguf.h"

int gguf_copy_with_str(const char *src, const char *dst, const char *key, const char *value,
                       char err[ERR_MAX])
{
    gguf_file *g = gguf_open(src, err);
    if (!g)
        return -1;
    gguf_writer *w = gguf_writer_new();
    int rc = w ? 0 : err_set(err, "out of memory");
    for (int64_t i = 0; rc == 0 && i < gguf_n_kv(g); i++)
        if (gguf_writer_copy_kv(w, g, i) != 0)
            rc = err_set(err, "%s: metadata %lld cannot be copied", src, (long long)i);
    /* set after the copy: it replaces the file's value */
    if (rc == 0 && gguf_writer_set_str(w, key, value) != 0)
        rc = err_set(err, "%s cannot be set", key);
    for (int64_t i = 0; rc == 0 && i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data) != 0)
            rc = err_set(err, "%s: tensor %s cannot be copied", src, name);
    }
    if (rc == 0)
        rc = gguf_writer_write(w, dst, err) == 0 ? 0 : -1;
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}
