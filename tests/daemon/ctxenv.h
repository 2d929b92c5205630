/*
 * ctxenv.h — a context manager over a generated model and a store of its own, for the
 * daemon's context-memory tests (header-only, as the Makefile links tests only with
 * tests/support).
 */
#ifndef LLMS_TESTS_CTXENV_H
#define LLMS_TESTS_CTXENV_H

#include <stdbool.h>
#include <stdio.h>

#include "daemon/ctx/ctxmgr.h"
#include "engine/model/model.h"
#include "engine/gguf/modelgen.h"
#include "storage/store.h"
#include "tests/support/test.h"

/* The generated model every context of a test file runs on. */
typedef struct ctxenv_model {
    model *m;
    model_runner *r;
    int vocab;
} ctxenv_model;

/* Writes p to test_tmpdir()/file, loads it and makes a runner of threads threads and
 * max_batch rows over n_ctx entries. 0, or -1 after a message. */
static inline int ctxenv_model_make(ctxenv_model *out, const char *file,
                                    const modelgen_params *p, int threads, int max_batch,
                                    int n_ctx)
{
    char path[1024], err[ERR_MAX];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), file);
    if (modelgen_write(p, path, err) || !(out->m = model_load(path, err)) ||
        !(out->r = model_runner_new(out->m, threads, max_batch, n_ctx, err))) {
        fprintf(stderr, "setup: %s\n", err);
        return -1;
    }
    out->vocab = model_hparams_of(out->m)->n_vocab;
    return 0;
}

typedef struct ctxenv {
    store *st;
    kv_pool *pool;
    ctxmgr *cm;
    char dir[1024];
} ctxenv;

/* Lossless chunks, ahead-of-time swap-out, planned switch-ins. */
static inline ctx_policy ctxenv_policy_none(void)
{
    return (ctx_policy){.compress = CTX_COMPRESS_NONE, .compress_ratio = 0.5,
                        .swap = CTX_SWAP_AHEAD, .switch_mode = CTX_SWITCH_PLAN};
}

/* Opens a context manager on md under pol: on a new store, or (reuse) on e's last one,
 * as after a restart. 0, or -1 after a message. */
static inline int ctxenv_open(ctxenv *e, bool reuse, const ctx_policy *pol,
                              const ctxenv_model *md)
{
    static int n_stores;
    char err[ERR_MAX];
    if (!reuse)
        snprintf(e->dir, sizeof e->dir, "%s/store%d", test_tmpdir(), n_stores++);
    e->st = store_open(e->dir, err);
    e->pool = e->st ? kv_pool_new(model_kv_shape(md->m), 0, err) : NULL;
    e->cm = e->pool ? ctx_open(e->st, e->pool, md->r, md->m, pol, err) : NULL;
    if (!e->cm)
        fprintf(stderr, "env_open: %s\n", err);
    return e->cm ? 0 : -1;
}

static inline void ctxenv_close(ctxenv *e)
{
    ctx_close(e->cm);
    kv_pool_free(e->pool);
    store_close(e->st);
    e->cm = NULL;
    e->pool = NULL;
    e->st = NULL;
}

/* n deterministic token ids of seed, below vocab and above the special ones. */
static inline void ctxenv_tokens(int32_t *t, int n, int seed, int vocab)
{
    for (int i = 0; i < n; i++)
        t[i] = 3 + (int32_t)((seed * 131 + i * 17 + (i * i) % 7) % (vocab - 3));
}

#endif
