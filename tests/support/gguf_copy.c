/*
 * gguf_copy.c — GGUF files copied with their metadata or tensors changed (gguf_copy.h).
 */
#include "tests/support/gguf_copy.h"

#include <stdio.h>
#include <stdlib.h>
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

/* Whether name is pattern: a tensor's name, or "blk.*." and the name's part after its
 * layer's "blk.N.". */
static bool gguf_copy_matches(const char *pattern, const char *name)
{
    if (!pattern)
        return false;
    if (strncmp(pattern, "blk.*.", 6) != 0)
        return strcmp(pattern, name) == 0;
    const char *dot = strncmp(name, "blk.", 4) ? NULL : strchr(name + 4, '.');
    return dot && strcmp(dot + 1, pattern + 6) == 0;
}

static bool gguf_copy_listed(const char *const list[4], const char *name)
{
    for (int i = 0; i < 4 && list[i]; i++)
        if (gguf_copy_matches(list[i], name))
            return true;
    return false;
}

/* The metadata of g, changed by e, into w. 0, or -1 + err. */
static int gguf_copy_edited_kv(gguf_writer *w, const gguf_file *g, const gguf_edit *e,
                               char err[ERR_MAX])
{
    gguf_str arch;
    if (!gguf_get_str(g, "general.architecture", &arch))
        return err_set(err, "no general.architecture");
    bool num_set = false, bools_set = false, ints_set = false;
    for (int64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_key(g, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        enum gguf_value_type type = gguf_kv_type(g, i);
        uint32_t u;
        float f;
        int rc;
        if (e->drop_key && !strcmp(key, e->drop_key)) {
            continue;
        } else if (e->num_key && !strcmp(key, e->num_key)) {
            num_set = true;
            rc = type == GGUF_FLOAT32 ? gguf_writer_set_f32(w, key, (float)e->num_value)
                                      : gguf_writer_set_u32(w, key, (uint32_t)e->num_value);
        } else if (e->bools_key && !strcmp(key, e->bools_key)) {
            bools_set = true;
            rc = gguf_writer_set_arr(w, key, GGUF_BOOL, e->bools, (uint64_t)e->n_bools);
        } else if (e->ints_key && !strcmp(key, e->ints_key)) {
            ints_set = true;
            rc = gguf_writer_set_arr(w, key, GGUF_INT32, e->ints, (uint64_t)e->n_ints);
        } else if (e->rename && !strcmp(key, "general.architecture")) {
            rc = gguf_writer_set_str(w, key, e->rename);
        } else if (e->rename && k.len > arch.len && !memcmp(key, arch.ptr, arch.len) &&
                   key[arch.len] == '.') {
            char renamed[300];
            snprintf(renamed, sizeof renamed, "%s%s", e->rename, key + arch.len);
            if (type == GGUF_UINT32 && gguf_get_u32(g, key, &u))
                rc = gguf_writer_set_u32(w, renamed, u);
            else if (type == GGUF_FLOAT32 && gguf_get_f32(g, key, &f))
                rc = gguf_writer_set_f32(w, renamed, f);
            else
                rc = -1;
        } else {
            rc = gguf_writer_copy_kv(w, g, i);
        }
        if (rc != 0)
            return err_set(err, "metadata key %s cannot be written", key);
    }
    if ((e->num_key && !num_set && gguf_writer_set_u32(w, e->num_key, (uint32_t)e->num_value)) ||
        (e->bools_key && !bools_set &&
         gguf_writer_set_arr(w, e->bools_key, GGUF_BOOL, e->bools, (uint64_t)e->n_bools)) ||
        (e->ints_key && !ints_set &&
         gguf_writer_set_arr(w, e->ints_key, GGUF_INT32, e->ints, (uint64_t)e->n_ints)))
        return err_set(err, "a metadata key cannot be added");
    return 0;
}

/* Whether layer l has attn_q, attn_k and attn_v of kind ("weight" or "bias"), of one
 * type and shape rank. */
static bool gguf_copy_fusable(const gguf_file *g, int l, const char *kind)
{
    static const char *const parts[3] = {"q", "k", "v"};
    const gguf_tensor *t[3];
    for (int i = 0; i < 3; i++) {
        char name[96];
        snprintf(name, sizeof name, "blk.%d.attn_%s.%s", l, parts[i], kind);
        t[i] = gguf_find_tensor(g, name);
        if (!t[i] || t[i]->type != t[0]->type || t[i]->n_dims != t[0]->n_dims)
            return false;
    }
    return true;
}

/* Layer l's attn_q, attn_k and attn_v (kind "weight" or "bias"; gguf_copy_fusable) back
 * to back into a fresh *data, written as attn_qkv (the writer reads *data when it writes:
 * the caller frees it after). 0, or -1. */
static int gguf_copy_fused(gguf_writer *w, const gguf_file *g, int l, const char *kind,
                           void **data)
{
    static const char *const parts[3] = {"q", "k", "v"};
    const gguf_tensor *t[3];
    size_t bytes = 0;
    char name[96];
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "blk.%d.attn_%s.%s", l, parts[i], kind);
        t[i] = gguf_find_tensor(g, name);
        bytes += t[i]->bytes;
    }
    char *at = malloc(bytes);
    *data = at;
    if (!at)
        return -1;
    for (int i = 0; i < 3; i++)
        at = (char *)memcpy(at, t[i]->data, t[i]->bytes) + t[i]->bytes;
    int64_t ne[GGUF_MAX_DIMS] = {t[0]->ne[0], t[0]->ne[1], t[0]->ne[2], t[0]->ne[3]};
    int last = (int)t[0]->n_dims - 1;
    ne[last] = t[0]->ne[last] + t[1]->ne[last] + t[2]->ne[last];
    snprintf(name, sizeof name, "blk.%d.attn_qkv.%s", l, kind);
    return gguf_writer_add_tensor(w, name, t[0]->type, t[0]->n_dims, ne, *data) == 0 ? 0 : -1;
}

int gguf_copy_edited(const char *src, const char *dst, const gguf_edit *e, char err[ERR_MAX])
{
    gguf_file *g = gguf_open(src, err);
    if (!g)
        return -1;
    int64_t n_t = gguf_n_tensors(g);
    size_t largest = 0;
    for (int64_t i = 0; i < n_t; i++)
        if (gguf_tensor_at(g, i)->bytes > largest)
            largest = gguf_tensor_at(g, i)->bytes;
    /* the writer reads each tensor's data when it writes: the zeros and the fused tensors
     * live until then */
    gguf_writer *w = gguf_writer_new();
    void *zeros = calloc(1, largest ? largest : 1);
    void **fused = calloc((size_t)n_t + 1, sizeof *fused);
    int n_fused = 0;
    int rc = w && zeros && fused ? gguf_copy_edited_kv(w, g, e, err)
                                 : err_set(err, "out of memory");
    for (int64_t i = 0; rc == 0 && i < n_t; i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (gguf_copy_listed(e->drop, name))
            continue;
        int l;
        char part, kind[8];
        if (e->fuse_qkv && sscanf(name, "blk.%d.attn_%c.%7s", &l, &part, kind) == 3 &&
            (part == 'q' || part == 'k' || part == 'v') && gguf_copy_fusable(g, l, kind)) {
            /* written fused where attn_q was, unless e drops the fused tensor */
            char fname[96];
            snprintf(fname, sizeof fname, "blk.%d.attn_qkv.%s", l, kind);
            if (part == 'q' && !gguf_copy_listed(e->drop, fname) &&
                gguf_copy_fused(w, g, l, kind, &fused[n_fused++]) != 0)
                rc = err_set(err, "%s cannot be fused", name);
            continue;
        }
        int64_t ne[GGUF_MAX_DIMS] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        uint32_t n_dims = t->n_dims;
        if (e->cut && !strcmp(name, e->cut) && n_dims == 1 && e->cut_to < ne[0])
            ne[0] = e->cut_to;
        if (e->first_row && !strcmp(name, e->first_row))
            n_dims = 1, ne[1] = 1;
        const void *data = gguf_copy_listed(e->zero, name) ? zeros : t->data;
        if (rc == 0 && gguf_writer_add_tensor(w, name, t->type, n_dims, ne, data) != 0)
            rc = err_set(err, "tensor %s cannot be written", name);
        for (int c = 0; rc == 0 && c < 2; c++) {
            if (!gguf_copy_matches(e->copy_from[c], name))
                continue;
            char copy[300];
            if (!strncmp(e->copy_to[c], "blk.*.", 6))
                snprintf(copy, sizeof copy, "%.*s%s", (int)(strchr(name + 4, '.') + 1 - name),
                         name, e->copy_to[c] + 6);
            else
                snprintf(copy, sizeof copy, "%s", e->copy_to[c]);
            if (gguf_writer_add_tensor(w, copy, t->type, n_dims, ne, data) != 0)
                rc = err_set(err, "tensor %s cannot be written", copy);
        }
    }
    if (rc == 0)
        rc = gguf_writer_write(w, dst, err) == 0 ? 0 : -1;
    for (int i = 0; i < n_fused; i++)
        free(fused[i]);
    free(fused);
    free(zeros);
    gguf_writer_free(w);
    gguf_close(g);
    return rc;
}
