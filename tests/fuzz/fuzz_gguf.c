/* libFuzzer target: any byte string either opens as GGUF or fails with a message, and
 * everything an opened file exposes can be read without touching memory outside it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"

/* Reads every byte of s so ASan checks that it lies inside the input. */
static unsigned touch(gguf_str s)
{
    unsigned h = 0;
    for (uint64_t i = 0; i < s.len; i++)
        h = h * 31 + (unsigned char)s.ptr[i];
    return h;
}

static unsigned walk(const gguf_file *g)
{
    unsigned h = gguf_version(g) + (unsigned)gguf_alignment(g);
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_key(g, i);
        char key[256];
        if (k.len >= sizeof key || memchr(k.ptr, '\0', k.len))
            continue;
        memcpy(key, k.ptr, k.len);
        key[k.len] = '\0';
        if (gguf_find_key(g, key) != i)
            abort();
        h += gguf_kv_type(g, i);

        uint32_t u;
        int64_t i64;
        float f;
        bool b;
        gguf_str s;
        if (gguf_get_u32(g, key, &u))
            h += u;
        if (gguf_get_i64(g, key, &i64))
            h += (unsigned)i64;
        if (gguf_get_f32(g, key, &f))
            h += f > 0;
        if (gguf_get_bool(g, key, &b))
            h += b;
        if (gguf_get_str(g, key, &s))
            h += touch(s);

        enum gguf_value_type et;
        uint64_t n;
        if (!gguf_get_arr(g, key, &et, &n))
            continue;
        for (uint64_t j = 0; j <= n && j < 100000; j++)
            if (gguf_arr_str(g, key, j, &s))
                h += touch(s);
        if (n <= 100000) {
            float *fv = malloc((n ? n : 1) * sizeof *fv);
            int32_t *iv = malloc((n ? n : 1) * sizeof *iv);
            if (fv && gguf_arr_f32(g, key, fv, n))
                for (uint64_t j = 0; j < n; j++)
                    h += fv[j] > 0;
            if (iv && gguf_arr_i32(g, key, iv, n))
                for (uint64_t j = 0; j < n; j++)
                    h += (unsigned)iv[j];
            free(fv);
            free(iv);
        }
    }
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[256];
        h += touch(t->name);
        if (t->name.len < sizeof name && !memchr(t->name.ptr, '\0', t->name.len)) {
            memcpy(name, t->name.ptr, t->name.len);
            name[t->name.len] = '\0';
            if (gguf_find_tensor(g, name) != t)
                abort();
        }
        h += touch((gguf_str){t->data, t->bytes});
    }
    return h;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[ERR_MAX] = "";
    gguf_file *g = gguf_open_memory(data, size, err);
    if (!g) {
        if (err[0] == '\0' || strnlen(err, ERR_MAX) == ERR_MAX)
            abort();
        return 0;
    }
    volatile unsigned sink = walk(g);
    (void)sink;
    gguf_close(g);
    return 0;
}
