/*
 * test_ctxwindow.c — the sliding window of daemon/ctx/ctxwindow.c: after a slide the KV is
 * what a prefill of the kept tokens gives, the commit stores the whole turn and the new
 * window and deletes the dropped chunks' blobs (no orphan rows or files), the window
 * comes back after a restart, and a call that slid but did not commit leaves the
 * context as it was.
 *
 * References (kv_compress none, f16 chunks): the same batches on a plain sequence
 * (the sink's batch, cut to the sink, then the kept tokens' batch) must give bitwise
 * equal KV and logits; a fresh prefill of all kept tokens in one batch rounds its sums
 * differently before the f16 store, so there the tolerance is the one test_ctxmem
 * states for recomputed chunks (1e-3 on logits and on K/V values).
 */
#include <dirent.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/ctx/ctxmem.h"
#include "engine/model/model.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "storage/chunks.h"
#include "storage/store_internal.h"
#include "tests/daemon/ctxenv.h"
#include "tests/support/test.h"

#define N_CTX 256
#define LIMIT 64  /* the window of these tests */
#define TOL 1e-3

static ctxenv_model g;

static int setup(void)
{
    modelgen_params p = {
        .arch = "llama", .dim = 64, .n_layer = 3, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = N_CTX, .type = QTYPE_F32, .seed = 5, .n_vocab = 300, .n_threads = 1,
    };
    return ctxenv_model_make(&g, "win.gguf", &p, 1, 128, N_CTX);
}

typedef ctxenv env;

static int env_open(env *e, bool reuse)
{
    ctx_policy pol = ctxenv_policy_none();
    return ctxenv_open(e, reuse, &pol, &g);
}

/* Evaluates tok (n) at positions from.. on seq, last row's logits into logits. */
static int forward(kv_seq *seq, const int32_t *tok, int n, int from, float *logits)
{
    char err[ERR_MAX];
    int32_t pos[N_CTX], last = n - 1;
    for (int i = 0; i < n; i++)
        pos[i] = from + i;
    model_batch b = {.n_tokens = n, .tokens = tok, .positions = pos, .n_out = 1,
                     .out_rows = &last, .logits = logits};
    if (model_forward(g.r, seq, &b, err)) {
        fprintf(stderr, "forward: %s\n", err);
        return -1;
    }
    return 0;
}

/* A Call that evaluates a raw turn of n tokens (no reply) and commits it. */
static int plain_turn(ctxmgr *cm, ctx_entry *c, const int32_t *tok, int n, float *logits)
{
    char err[ERR_MAX];
    if (ctx_call_begin(cm, c, LIMIT, NULL, err))
        return -1;
    int32_t pos[N_CTX], last = n - 1;
    for (int i = 0; i < n; i++)
        pos[i] = c->n_tokens + i;
    model_batch b = {.n_tokens = n, .tokens = tok, .positions = pos, .n_out = 1,
                     .out_rows = &last, .logits = logits};
    int rc = ctx_forward(cm, c, &b, err);
    if (rc == 0 && ctx_commit_turn(cm, c, "raw", "t", tok, n, "", NULL, 0, 1000, err))
        rc = -1;
    if (rc)
        fprintf(stderr, "turn: %s\n", err);
    ctx_call_end(cm, c, rc == 0);
    return rc;
}

static double max_diff(const float *a, const float *b, int n)
{
    double m = 0;
    for (int i = 0; i < n; i++) {
        double d = a[i] > b[i] ? a[i] - b[i] : b[i] - a[i];
        m = d > m ? d : m;
    }
    return m;
}

/* Largest difference between the K/V values of two sequences of the same tokens. */
static double kv_diff(const kv_seq *a, const kv_seq *b)
{
    kv_shape sh = model_kv_shape(g.m);
    if (kv_seq_n_tokens(a) != kv_seq_n_tokens(b) || a->n_chunks != b->n_chunks)
        return 1e9;
    double m = 0;
    float ka[KV_CHUNK_TOKENS * 64], va[KV_CHUNK_TOKENS * 64];
    float kb[KV_CHUNK_TOKENS * 64], vb[KV_CHUNK_TOKENS * 64];
    for (int i = 0; i < a->n_chunks; i++) {
        const kv_chunk *x = a->chunks[i], *y = b->chunks[i];
        if (!x || !y || x->n_tokens != y->n_tokens)
            return 1e9;
        for (int e = 0; e < x->n_tokens; e++)
            if (x->tokens[e] != y->tokens[e] || x->positions[e] != y->positions[e])
                return 1e9;
        for (int l = 0; l < sh.n_layer; l++)
            for (int h = 0; h < sh.n_head_kv; h++) {
                kv_chunk_read_f32(x, sh, l, h, ka, va);
                kv_chunk_read_f32(y, sh, l, h, kb, vb);
                int n = x->n_tokens * sh.head_dim;
                double dk = max_diff(ka, kb, n), dv = max_diff(va, vb, n);
                m = dk > m ? dk : m;
                m = dv > m ? dv : m;
            }
    }
    return m;
}

typedef struct chunk_rows {
    int n, max_index;
} chunk_rows;

static int count_row(void *arg, const store_chunk *r)
{
    chunk_rows *k = arg;
    k->n++;
    k->max_index = r->index > k->max_index ? r->index : k->max_index;
    return 0;
}

/* Chunk files of the context in its directory. */
static int count_files(const env *e, const char *id)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/chunks/%s", e->dir, id);
    DIR *d = opendir(path);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *x;
    while ((x = readdir(d)))
        n += strstr(x->d_name, ".chunk") != NULL;
    closedir(d);
    return n;
}

/* The store holds exactly one blob per chunk of the window, each with its row. */
static void check_store_matches(env *e, ctx_entry *c)
{
    char err[ERR_MAX];
    ctx_flush_writes(e->cm);
    chunk_rows k = {0, -1};
    CHECK(store_chunk_list(e->st, c->id, count_row, &k, err) == 0);
    CHECK_EQ(k.n, c->n_map);
    CHECK_EQ(k.max_index, c->n_map - 1);
    CHECK_EQ(count_files(e, c->id), k.n);
}

/* A turn that does not fit slides the window; the KV then equals a prefill of the kept
 * tokens; the commit and a restart keep the window and leave no orphan blobs. */
static void test_slide_in_prefill(void)
{
    env e;
    CHECK(env_open(&e, false) == 0);
    char err[ERR_MAX];
    ctx_entry *c;
    CHECK(ctx_create(e.cm, 1000, "app", NULL, NULL, 1, &c, err) == 0);
    float got[300], want[300], fresh[300];
    int32_t first[48], turn[30], hist[LIMIT + 30];
    ctxenv_tokens(first, 48, 1, g.vocab);
    ctxenv_tokens(turn, 30, 2, g.vocab);
    CHECK(plain_turn(e.cm, c, first, 48, got) == 0);
    check_store_matches(&e, c);
    CHECK_EQ(count_files(&e, c->id), 3);

    /* The turn takes the context to 78 > 64 tokens: keep the sink (16) and 30. */
    CHECK(ctx_call_begin(e.cm, c, LIMIT, NULL, err) == 0);
    memcpy(hist, c->tokens, sizeof *hist * 48);
    memcpy(hist + 48, turn, sizeof turn);
    int n_hist = 78;
    CHECK_EQ(ctx_window_slide(e.cm, c, hist, &n_hist, LIMIT, 30, 4), 32);
    CHECK_EQ(n_hist, 46);
    CHECK_EQ(kv_seq_n_tokens(&c->seq), 16);
    CHECK(memcmp(hist, first, sizeof *hist * 16) == 0);
    CHECK(memcmp(hist + 16, turn, sizeof turn) == 0);
    int32_t pos[30], last = 29;
    for (int i = 0; i < 30; i++)
        pos[i] = 16 + i;
    model_batch b = {.n_tokens = 30, .tokens = hist + 16, .positions = pos, .n_out = 1,
                     .out_rows = &last, .logits = got};
    CHECK(ctx_forward(e.cm, c, &b, err) == 0);
    CHECK(ctx_commit_turn(e.cm, c, "raw", "t", turn, 30, "", NULL, 0, 2000, err) == 0);
    CHECK_EQ(c->n_tokens, 46);
    CHECK(memcmp(c->tokens, hist, sizeof *hist * 46) == 0);
    CHECK_EQ(c->window_sink, 16);
    CHECK_EQ(c->window_dropped, 32);
    CHECK_EQ(c->window_slides, 1);

    /* The same batches on a plain sequence: bitwise equal. */
    kv_seq same, one;
    kv_seq_init(&same, e.pool);
    kv_seq_init(&one, e.pool);
    CHECK(forward(&same, first, 48, 0, want) == 0);
    kv_seq_truncate(&same, 16);
    CHECK(forward(&same, hist + 16, 30, 16, want) == 0);
    CHECK_MSG(max_diff(got, want, g.vocab) == 0, "logits differ by %g", max_diff(got, want, g.vocab));
    CHECK_MSG(kv_diff(&c->seq, &same) == 0, "KV differs by %g", kv_diff(&c->seq, &same));
    /* A fresh prefill of the kept tokens in one batch: within rounding. */
    CHECK(forward(&one, hist, 46, 0, fresh) == 0);
    CHECK_MSG(max_diff(got, fresh, g.vocab) < TOL, "logits differ from a fresh prefill by %g",
              max_diff(got, fresh, g.vocab));
    CHECK_MSG(kv_diff(&c->seq, &one) < TOL, "KV differs from a fresh prefill by %g",
              kv_diff(&c->seq, &one));
    ctx_call_end(e.cm, c, true);
    check_store_matches(&e, c);
    CHECK_EQ(ctx_get_stats(e.cm)->window_slides, 1);

    /* After a restart the window comes back and the context goes on from it. */
    char id[CTX_ID_LEN + 1];
    snprintf(id, sizeof id, "%s", c->id);
    kv_seq_free(&same);
    kv_seq_free(&one);
    ctxenv_close(&e);
    CHECK(env_open(&e, true) == 0);
    c = ctx_find(e.cm, id, 1000, "app");
    CHECK(c != NULL);
    if (!c) {
        ctxenv_close(&e);
        return;
    }
    CHECK_EQ(c->n_tokens, 46);
    CHECK(memcmp(c->tokens, hist, sizeof *hist * 46) == 0);
    CHECK_EQ(c->window_slides, 1);
    CHECK_EQ(c->n_msgs, 4);
    check_store_matches(&e, c);
    int32_t more[8];
    ctxenv_tokens(more, 8, 3, g.vocab);
    kv_seq_init(&same, e.pool);
    CHECK(forward(&same, hist, 46, 0, want) == 0);
    CHECK(forward(&same, more, 8, 46, want) == 0);
    CHECK(plain_turn(e.cm, c, more, 8, got) == 0);
    CHECK_MSG(max_diff(got, want, g.vocab) < TOL, "after restart logits differ by %g",
              max_diff(got, want, g.vocab));
    CHECK_EQ(ctx_get_stats(e.cm)->faults, 0);
    kv_seq_free(&same);
    ctxenv_close(&e);
}

/* A call that slid and then failed leaves the context, its KV and its store as they
 * were: the next call answers as if the slide never happened. */
static void test_slide_without_commit(void)
{
    env e;
    CHECK(env_open(&e, false) == 0);
    char err[ERR_MAX];
    ctx_entry *c;
    CHECK(ctx_create(e.cm, 1000, "app", NULL, NULL, 1, &c, err) == 0);
    float got[300], want[300];
    int32_t first[40], hist[LIMIT + 40], more[10];
    ctxenv_tokens(first, 40, 4, g.vocab);
    ctxenv_tokens(more, 10, 5, g.vocab);
    CHECK(plain_turn(e.cm, c, first, 40, got) == 0);
    CHECK(ctx_call_begin(e.cm, c, LIMIT, NULL, err) == 0);
    memcpy(hist, first, sizeof first);
    ctxenv_tokens(hist + 40, 30, 6, g.vocab);
    int n_hist = 70;
    CHECK(ctx_window_slide(e.cm, c, hist, &n_hist, LIMIT, 30, 4) > 0);
    ctx_call_end(e.cm, c, false);
    CHECK_EQ(c->n_tokens, 40);
    CHECK(memcmp(c->tokens, first, sizeof first) == 0);
    CHECK_EQ(c->window_slides, 0);
    check_store_matches(&e, c);
    kv_seq ref;
    kv_seq_init(&ref, e.pool);
    CHECK(forward(&ref, first, 40, 0, want) == 0);
    CHECK(forward(&ref, more, 10, 40, want) == 0);
    CHECK(plain_turn(e.cm, c, more, 10, got) == 0);
    CHECK_MSG(max_diff(got, want, g.vocab) < TOL, "logits differ by %g", max_diff(got, want, g.vocab));
    kv_seq_free(&ref);
    ctxenv_close(&e);
}

/* Decode-like growth one token at a time past the window many times: the window never
 * passes the limit, the sink stays, and the store always matches the window. */
static void test_many_slides(void)
{
    env e;
    CHECK(env_open(&e, false) == 0);
    char err[ERR_MAX];
    ctx_entry *c;
    CHECK(ctx_create(e.cm, 1000, "app", NULL, NULL, 1, &c, err) == 0);
    float logits[300];
    int32_t first[20], hist[LIMIT + 1];
    ctxenv_tokens(first, 20, 7, g.vocab);
    CHECK(plain_turn(e.cm, c, first, 20, logits) == 0);
    int total = 20, slides = 0;
    for (int call = 0; call < 6; call++) {
        CHECK(ctx_call_begin(e.cm, c, LIMIT, NULL, err) == 0);
        int n = c->n_tokens;
        memcpy(hist, c->tokens, sizeof *hist * (size_t)n);
        int32_t added[40];
        for (int t = 0; t < 40; t++) {
            added[t] = 3 + (call * 40 + t) % (g.vocab - 3);
            hist[n++] = added[t];
            if (n == LIMIT) {
                CHECK(ctx_window_slide(e.cm, c, hist, &n, LIMIT, 1, 4) > 0);
                slides++;
            }
            int from = kv_seq_n_tokens(&c->seq), m = n - from, last = m - 1;
            int32_t pos[LIMIT];
            for (int i = 0; i < m; i++)
                pos[i] = from + i;
            model_batch b = {.n_tokens = m, .tokens = hist + from, .positions = pos,
                             .n_out = 1, .out_rows = &last, .logits = logits};
            CHECK(ctx_forward(e.cm, c, &b, err) == 0);
        }
        CHECK(ctx_commit_turn(e.cm, c, "raw", "t", added, 40, "", NULL, 0, 3000, err) == 0);
        total += 40;
        CHECK(c->n_tokens <= LIMIT);
        CHECK(memcmp(c->tokens, first, sizeof *first * 16) == 0);
        CHECK(memcmp(c->tokens, hist, sizeof *hist * (size_t)c->n_tokens) == 0);
        CHECK_EQ(c->n_tokens + c->window_dropped, total);
        ctx_call_end(e.cm, c, true);
        check_store_matches(&e, c);
    }
    CHECK((int)c->window_slides == slides && slides >= 5);
    ctxenv_close(&e);
}

/* Opens a store whose context of 40 tokens had sql run on its catalog (its checksums
 * then recomputed when reseal, as a bug of the daemon would have written the row):
 * ctx_open loads it as damaged, saying why (want), and the other context as it was. */
static void hostile_window_case(const char *sql, bool reseal, const char *want)
{
    env e;
    CHECK(env_open(&e, false) == 0);
    char err[ERR_MAX];
    ctx_entry *c, *other;
    float logits[300];
    int32_t first[40];
    ctxenv_tokens(first, 40, 9, g.vocab);
    CHECK(ctx_create(e.cm, 1000, "app", NULL, NULL, 1, &c, err) == 0);
    CHECK(plain_turn(e.cm, c, first, 40, logits) == 0);
    CHECK(ctx_create(e.cm, 1000, "app", NULL, NULL, 2, &other, err) == 0);
    CHECK(plain_turn(e.cm, other, first, 40, logits) == 0);
    char id[CTX_ID_LEN + 1], other_id[CTX_ID_LEN + 1], where[256];
    strcpy(id, c->id);
    strcpy(other_id, other->id);
    ctx_flush_writes(e.cm);
    snprintf(where, sizeof where, "%s WHERE id = '%s'", sql, id);
    CHECK(sqlite3_exec(store_sqlite(e.st), where, NULL, NULL, NULL) == SQLITE_OK);
    if (reseal)
        CHECK(sqlite3_exec(store_sqlite(e.st), STORE_SEAL_CONTEXTS, NULL, NULL, NULL) ==
              SQLITE_OK);
    ctxenv_close(&e);

    CHECK(env_open(&e, true) == 0);
    c = ctx_find_any(e.cm, id);
    other = ctx_find_any(e.cm, other_id);
    CHECK(c && other);
    CHECK_MSG(c->damage && strstr(c->damage, want), "%s: %s", sql, c->damage ? c->damage : "");
    CHECK(c->n_tokens == 0 && c->n_msgs == 0 && c->n_map == 0);
    CHECK_EQ(ctx_count_damaged(e.cm), 1);
    /* no call runs on it */
    CHECK(ctx_call_begin(e.cm, c, LIMIT, NULL, err) == -1 && strstr(err, "damaged"));
    CHECK(!c->busy);
    CHECK(!other->damage && other->n_tokens == 40 && other->n_msgs == 2);
    CHECK(memcmp(other->tokens, first, sizeof first) == 0);
    /* its rows and chunk files stay until it is deleted */
    chunk_rows k = {0, -1};
    CHECK(store_chunk_list(e.st, id, count_row, &k, err) == 0);
    CHECK_EQ(k.n, 3);
    CHECK_EQ(count_files(&e, id), 3);
    CHECK(ctx_delete(e.cm, c, err) == 0);
    CHECK_EQ(ctx_count_damaged(e.cm), 0);
    CHECK_EQ(count_files(&e, id), 0);
    ctxenv_close(&e);
}

/* A state directory whose window columns no slide could have written (a negative drop,
 * a sink whose sum with the drop overflows, a drop past the history) makes that context
 * damaged at startup, named, the other contexts loading as they were: used as is, they
 * moved the history's tokens out of bounds (the overflowing sink freed corrupt memory,
 * the negative drop made 5 tokens up); refusing the whole store stopped every app's
 * service over one context. A column changed behind the store's back is found by the
 * row's checksum before its value is looked at. */
static void test_hostile_window_refused(void)
{
    hostile_window_case("UPDATE contexts SET window_sink = 16, window_dropped = -5", true,
                        "window");
    hostile_window_case("UPDATE contexts SET window_sink = 9223372036854775792,"
                        " window_dropped = 100", true, "window");
    hostile_window_case("UPDATE contexts SET window_sink = 16,"
                        " window_dropped = 9223372036854775800", true, "window");
    hostile_window_case("UPDATE contexts SET window_sink = -16, window_dropped = 8", true,
                        "window");
    hostile_window_case("UPDATE contexts SET window_sink = 16, window_dropped = 8", false,
                        "checksum");
    hostile_window_case("UPDATE contexts SET params = x'ff'", true, "params");
}

int main(void)
{
    if (setup())
        return 1;
    RUN(test_slide_in_prefill);
    RUN(test_slide_without_commit);
    RUN(test_many_slides);
    RUN(test_hostile_window_refused);
    model_runner_free(g.r);
    model_free(g.m);
    return test_finish();
}
