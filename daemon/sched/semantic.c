/*
 * semantic.c — Embed, Rerank and RerankCalibrate: request checks, the engine calls and
 * the replies.
 */
#include "daemon/sched/semantic.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/net/reply.h"
#include "engine/clock.h"
#include "engine/model/embed.h"
#include "engine/encoder/rerank.h"

#define SEM_DEFAULT_TOP_K 5
#define SEM_KEY_MAX (CONFIG_PATH_MAX + 64)

/* Thresholds RerankCalibrate tries, ascending: the lowest prunes the most. */
static const float calib_grid[] = {0.02f, 0.05f, 0.1f, 0.15f, 0.2f, 0.3f, 0.4f, 0.5f,
                                   0.75f, 1.0f, 1.5f, 2.0f, 3.0f};
#define CALIB_N (int)(sizeof calib_grid / sizeof calib_grid[0])

struct semantic {
    semantic_env env;
    reply_to to;
    int dim;
    int max_kv;
    int32_t *positions;    /* (max_kv) 0, 1, 2, ... */
    int32_t *rows;         /* (max_slice) 0, 1, 2, ...: every row of a slice */
    float *norm_row;       /* (dim) */
    embedder *emb;         /* semantic_embed_now on the generate model, made on first use */
    char *scratch_dir;     /* where rerankers offload hidden states: $TMPDIR, else /tmp */
};

enum sem_kind { SEM_EMBED, SEM_RERANK, SEM_CALIBRATE };

struct sem_task {
    semantic *sm;
    enum sem_kind kind;
    uint64_t conn_id;
    const Llms__Request *req;    /* borrowed: the scheduler's job outlives the task */
    models_entry *me;            /* the model it runs on (counted in me->running) */
    /* Embed */
    enum embed_pooling pooling;
    enum bert_pooling enc_pool;  /* on an encoder */
    int dim;                     /* of the vectors */
    int n_texts;
    int32_t *tokens;             /* every text's ids, back to back */
    int *text_start;             /* (n_texts + 1) offset of each text in tokens */
    float *values;               /* (n_texts, dim) the answer */
    int text, pos;               /* the text in progress and its tokens evaluated */
    int slice_len;               /* tokens of the slice handed out */
    int32_t last_row;
    kv_seq seq;                  /* the text in progress */
    double *acc;                 /* (dim) pooled rows of the text so far */
    float *hidden;               /* (max_slice, dim) the slice's last-layer rows */
    /* an embedding of the worker's own (semantic_embed_texts): no request, no reply;
     * each text is tokenized when the task reaches it */
    bool internal;
    const char *const *texts;    /* borrowed from the caller */
    int n_tok;                   /* texts tokenized so far */
    int tok_cap;                 /* entries of tokens */
    int max_len;                 /* tokens a text is cut to */
    long bytes_left;             /* of the texts not yet tokenized */
    bool failed;
    char err[ERR_MAX];
    /* Rerank */
    rerank_options opt;
    rerank_task *rt;
};

/* Fails an Embed task: answers its request, or keeps the error for the worker's own. */
static void embed_fail(sem_task *t, Llms__ErrorCode code, const char *msg)
{
    if (t->internal) {
        t->failed = true;
        snprintf(t->err, sizeof t->err, "%s", msg);
    } else {
        reply_error(&t->sm->to, t->conn_id, t->req, code, "%s", msg);
    }
}

semantic *semantic_new(const semantic_env *env, char err[ERR_MAX])
{
    semantic *sm = calloc(1, sizeof *sm);
    if (!sm) {
        err_set(err, "out of memory");
        return NULL;
    }
    sm->env = *env;
    sm->to = (reply_to){env->out, env->cfg->max_frame_bytes};
    sm->dim = model_hparams_of(env->m)->dim;
    sm->max_kv = model_runner_max_kv(env->runner);
    sm->positions = malloc(sizeof *sm->positions * (size_t)sm->max_kv);
    sm->rows = malloc(sizeof *sm->rows * (size_t)env->max_slice);
    sm->norm_row = malloc(sizeof *sm->norm_row * (size_t)sm->dim);
    const char *tmp = getenv("TMPDIR");
    sm->scratch_dir = strdup(tmp && *tmp ? tmp : "/tmp");
    if (!sm->positions || !sm->rows || !sm->norm_row || !sm->scratch_dir) {
        err_set(err, "out of memory");
        semantic_free(sm);
        return NULL;
    }
    for (int i = 0; i < sm->max_kv; i++)
        sm->positions[i] = i;
    for (int i = 0; i < env->max_slice; i++)
        sm->rows[i] = i;
    return sm;
}

void semantic_free(semantic *sm)
{
    if (!sm)
        return;
    embed_free(sm->emb);
    free(sm->positions);
    free(sm->rows);
    free(sm->norm_row);
    free(sm->scratch_dir);
    free(sm);
}

/* ---- tasks ---- */

static sem_task *task_new(semantic *sm, enum sem_kind kind, models_entry *me,
                          uint64_t conn_id, const Llms__Request *req)
{
    sem_task *t = calloc(1, sizeof *t);
    if (!t) {
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        return NULL;
    }
    t->sm = sm;
    t->kind = kind;
    t->conn_id = conn_id;
    t->req = req;
    t->me = me;
    me->running++;
    kv_seq_init(&t->seq, sm->env.pool);
    return t;
}

void semantic_task_free(sem_task *t)
{
    if (!t)
        return;
    kv_seq_free(&t->seq);
    free(t->tokens);
    free(t->text_start);
    free(t->values);
    free(t->acc);
    free(t->hidden);
    if (t->rt)
        rerank_task_free(t->rt);
    if (t->kind != SEM_EMBED)
        t->me->rr_busy = false;
    t->me->running--;
    free(t);
}

bool semantic_uses_slices(const sem_task *t)
{
    return t->kind == SEM_EMBED && !t->me->enc && !t->me->dec_emb;
}

/* An embed model's tokenizer: its own, or (the default generate model) the worker's. */
static const tokenizer *embed_tok_of(const semantic *sm, const models_entry *me)
{
    return me->embed_tok ? me->embed_tok : sm->env.tok;
}

/* The most tokens a text may have on me. */
static int embed_max_len(const semantic *sm, const models_entry *me)
{
    if (me->enc)
        return bert_runner_max_rows(me->enc_r);
    return me->dec_r ? model_runner_max_kv(me->dec_r) : sm->max_kv;
}

/* Length of me's vectors. */
static int embed_dim_of(const semantic *sm, const models_entry *me)
{
    if (me->enc)
        return bert_hparams_of(me->enc)->dim;
    return me->m ? model_hparams_of(me->m)->dim : sm->dim;
}

/*
 * How an embedding on me pools: as named (has), else as the file's {arch}.pooling_type
 * says, else, on a decoder whose file names none, dflt (the last token for an Embed,
 * the mean for the worker's own, as the vectors it stored were made) and on an encoder
 * CLS. Into *dec on a decoder, *enc on an encoder. -1 + err when the file's pooling
 * gives no vector per text (none, rank) and none was named.
 */
static int embed_pooling_for(const semantic *sm, const models_entry *me, bool has,
                             enum embed_pooling named, enum embed_pooling dflt,
                             enum embed_pooling *dec, enum bert_pooling *enc, char err[ERR_MAX])
{
    static const enum bert_pooling as_bert[] = {[EMBED_LAST] = BERT_POOL_LAST,
                                                [EMBED_MEAN] = BERT_POOL_MEAN,
                                                [EMBED_CLS] = BERT_POOL_CLS};
    *dec = has ? named : dflt;
    *enc = has ? as_bert[named] : BERT_POOL_CLS;
    if (has)
        return 0;
    if (me->enc) {
        /* as on a decoder: a cross-encoder's CLS state is no embedding its file stands for */
        enum bert_pooling p = bert_hparams_of(me->enc)->pooling;
        if (p == BERT_POOL_RANK)
            return err_set(err, "model '%s': the file's pooling_type is rank (a reranker's "
                                "scores, not an embedding): rerank with it, or name a pooling",
                           me->name);
        if (p == BERT_POOL_NONE)
            return err_set(err, "model '%s': the file's pooling_type is none (a vector per "
                                "token): name a pooling (last, mean or cls)", me->name);
        *enc = p;
        return 0;
    }
    char why[ERR_MAX];
    if (embed_pooling_of_model(me->m ? me->m : sm->env.m, dec, why) < 0)
        return err_set(err, "model '%s': %s", me->name, why);
    return 0;
}

/* ---- Embed ---- */

/* Tokenizes every text of the request into t (sizes checked). LLMS__ERROR_CODE__OK or
 * the code of the error written to err. */
static Llms__ErrorCode embed_tokenize(sem_task *t, const Llms__EmbedRequest *er,
                                     char err[ERR_MAX])
{
    semantic *sm = t->sm;
    const models_entry *me = t->me;
    const tokenizer *tok = embed_tok_of(sm, me);
    int max_len = embed_max_len(sm, me);
    int cap = 0;
    for (int i = 0; i < t->n_texts; i++) {
        const char *text = er->texts[i];
        int room = cap - t->text_start[i];
        int nt = tok_encode(tok, text, strlen(text), true, false,
                            t->tokens ? t->tokens + t->text_start[i] : NULL, room);
        if (nt > room && nt <= max_len) {
            int want = cap * 2 > t->text_start[i] + nt ? cap * 2 : t->text_start[i] + nt;
            int32_t *grown = realloc(t->tokens, sizeof *grown * (size_t)want);
            if (!grown) {
                err_set(err, "out of memory");
                return LLMS__ERROR_CODE__INTERNAL;
            }
            t->tokens = grown;
            cap = want;
            nt = tok_encode(tok, text, strlen(text), true, false,
                            t->tokens + t->text_start[i], cap - t->text_start[i]);
        }
        if (nt < 0) {
            err_set(err, "text %d: tokenization failed", i);
            return LLMS__ERROR_CODE__INTERNAL;
        }
        if (nt == 0 || nt > max_len) {
            err_set(err, "text %d has %d tokens; a text needs 1 to %d (%s)", i, nt, max_len,
                    me->enc     ? "the encoder's positions, at most 512"
                    : me->dec_r ? "the model's context window"
                                : "n_ctx");
            return LLMS__ERROR_CODE__INVALID_ARGUMENT;
        }
        t->text_start[i + 1] = t->text_start[i] + nt;
    }
    return LLMS__ERROR_CODE__OK;
}

/* The model a request names for role (else the role's default); NULL when the request
 * was answered with the error. */
static models_entry *resolve(semantic *sm, uint64_t conn_id, const Llms__Request *req,
                             const char *name, enum models_role role)
{
    char err[ERR_MAX];
    models_entry *me;
    Llms__ErrorCode code = models_resolve(sm->env.reg, name, role, &me, err);
    if (code != LLMS__ERROR_CODE__OK)
        reply_error(&sm->to, conn_id, req, code, "%s", err);
    return me;
}

/* An Embed task's buffers for n texts of t->dim floats each. */
static int embed_buffers(sem_task *t, size_t n, char err[ERR_MAX])
{
    /* with an encoder, n more entries hold the lengths of a group of texts */
    t->text_start = calloc(2 * n + 1, sizeof *t->text_start);
    t->values = malloc(sizeof *t->values * n * (size_t)t->dim);
    t->acc = calloc((size_t)t->dim, sizeof *t->acc);
    t->hidden = malloc(sizeof *t->hidden * (size_t)t->sm->env.max_slice * t->dim);
    if (!t->text_start || !t->values || !t->acc || !t->hidden)
        return err_set(err, "out of memory");
    return 0;
}

static sem_task *embed_begin(semantic *sm, uint64_t conn_id, const Llms__Request *req)
{
    const Llms__EmbedRequest *er = req->embed;
    const config *cfg = sm->env.cfg;
    size_t n = er->n_texts;
    models_entry *me = resolve(sm, conn_id, req, er->model, MODELS_EMBED);
    if (!me)
        return NULL;
    if (n == 0) {
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT, "no texts to embed");
        return NULL;
    }
    if (n > (size_t)cfg->embed_max_texts) {
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                    "%zu texts, more than the limit (embed_max_texts = %d)", n,
                    cfg->embed_max_texts);
        return NULL;
    }
    if (er->has_pooling && er->pooling != LLMS__POOLING__POOLING_LAST &&
        er->pooling != LLMS__POOLING__POOLING_MEAN && er->pooling != LLMS__POOLING__POOLING_CLS) {
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                    "unknown pooling %d", (int)er->pooling);
        return NULL;
    }
    enum embed_pooling pooling;
    enum bert_pooling enc_pool;
    char err[ERR_MAX];
    if (embed_pooling_for(sm, me, er->has_pooling, (enum embed_pooling)er->pooling, EMBED_LAST,
                          &pooling, &enc_pool, err) < 0) {
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT, "%s", err);
        return NULL;
    }
    int dim = embed_dim_of(sm, me);
    /* values, tags and lengths: a reply the client would refuse is refused up front */
    if ((double)n * (dim * 4.0 + 16) + 64 > cfg->max_frame_bytes) {
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                    "%zu vectors of %d floats exceed max_frame_bytes (%u)", n, dim,
                    cfg->max_frame_bytes);
        return NULL;
    }
    sem_task *t = task_new(sm, SEM_EMBED, me, conn_id, req);
    if (!t)
        return NULL;
    t->dim = dim;
    t->pooling = pooling;
    t->enc_pool = enc_pool;
    t->n_texts = (int)n;
    Llms__ErrorCode code =
        embed_buffers(t, n, err) ? LLMS__ERROR_CODE__INTERNAL : embed_tokenize(t, er, err);
    if (code != LLMS__ERROR_CODE__OK) {
        reply_error(&sm->to, conn_id, req, code, "%s", err);
        semantic_task_free(t);
        return NULL;
    }
    return t;
}

/* Tokenizes the worker's own texts up to text i (cut to max_len tokens, as
 * semantic_embed_now does). */
static int tokenize_upto(sem_task *t, int i, char err[ERR_MAX])
{
    const tokenizer *tok = embed_tok_of(t->sm, t->me);
    for (; t->n_tok <= i; t->n_tok++) {
        const char *text = t->texts[t->n_tok];
        size_t len = strlen(text);
        int at = t->text_start[t->n_tok], room = t->tok_cap - at;
        int nt = tok_encode(tok, text, len, true, false, t->tokens ? t->tokens + at : NULL, room);
        if (nt > room) {
            int want = 2 * t->tok_cap > at + nt ? 2 * t->tok_cap : at + nt;
            int32_t *grown = realloc(t->tokens, sizeof *grown * (size_t)want);
            if (!grown)
                return err_set(err, "out of memory");
            t->tokens = grown;
            t->tok_cap = want;
            nt = tok_encode(tok, text, len, true, false, t->tokens + at, t->tok_cap - at);
        }
        if (nt <= 0)
            return err_set(err, "text %d has no tokens to embed", t->n_tok);
        t->text_start[t->n_tok + 1] = at + (nt < t->max_len ? nt : t->max_len);
        t->bytes_left -= (long)len;
    }
    return 0;
}

void semantic_slice(sem_task *t, int max_rows, kv_seq **seq, model_batch *b)
{
    semantic *sm = t->sm;
    int n = t->text_start[t->text + 1] - t->text_start[t->text];
    int len = n - t->pos < max_rows ? n - t->pos : max_rows;
    t->slice_len = len;
    *b = (model_batch){.n_tokens = len,
                       .tokens = t->tokens + t->text_start[t->text] + t->pos,
                       .positions = sm->positions + t->pos,
                       .hidden_last = t->hidden};
    if (t->pooling == EMBED_MEAN) {
        b->n_out = len;
        b->out_rows = sm->rows;
    } else if (t->pooling == EMBED_CLS && t->pos == 0) {
        b->n_out = 1;
        b->out_rows = sm->rows; /* row 0 */
    } else if (t->pooling == EMBED_LAST && t->pos + len == n) {
        t->last_row = len - 1;
        b->n_out = 1;
        b->out_rows = &t->last_row;
    }
    *seq = &t->seq;
}

static void embed_reply(sem_task *t)
{
    semantic *sm = t->sm;
    size_t n = (size_t)t->n_texts;
    Llms__Vector *vecs = calloc(n, sizeof *vecs);
    Llms__Vector **vptr = calloc(n, sizeof *vptr);
    uint32_t *ntok = calloc(n, sizeof *ntok);
    if (!vecs || !vptr || !ntok) {
        reply_error(&sm->to, t->conn_id, t->req, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) {
        llms__vector__init(&vecs[i]);
        vecs[i].n_values = (size_t)t->dim;
        vecs[i].values = t->values + i * (size_t)t->dim;
        vptr[i] = &vecs[i];
        ntok[i] = (uint32_t)(t->text_start[i + 1] - t->text_start[i]);
    }
    Llms__EmbedResponse eb = LLMS__EMBED_RESPONSE__INIT;
    eb.n_vectors = n;
    eb.vectors = vptr;
    eb.dim = (uint32_t)t->dim;
    eb.n_n_tokens = n;
    eb.n_tokens = ntok;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = t->req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_EMBED;
    r.embed = &eb;
    reply_send(&sm->to, t->conn_id, &r, false);
done:
    free(vecs);
    free(vptr);
    free(ntok);
}

int semantic_slice_done(sem_task *t)
{
    semantic *sm = t->sm;
    int dim = sm->dim;
    int n_out = t->pooling == EMBED_MEAN ? t->slice_len : 0;
    int n = t->text_start[t->text + 1] - t->text_start[t->text];
    if (t->pooling == EMBED_CLS && t->pos == 0)
        n_out = 1;
    t->pos += t->slice_len;
    if (t->pooling == EMBED_LAST && t->pos == n)
        n_out = 1;
    for (int o = 0; o < n_out; o++) {
        model_output_norm(sm->env.m, t->hidden + (size_t)o * dim, sm->norm_row);
        for (int i = 0; i < dim; i++)
            t->acc[i] += sm->norm_row[i];
    }
    if (t->pos < n)
        return 0;
    /* the text is done: its unit vector, and a fresh sequence for the next one */
    double ss = 0;
    for (int i = 0; i < dim; i++)
        ss += t->acc[i] * t->acc[i];
    double inv = ss > 0 ? 1.0 / sqrt(ss) : 0.0;
    float *out = t->values + (size_t)t->text * dim;
    for (int i = 0; i < dim; i++)
        out[i] = (float)(t->acc[i] * inv);
    memset(t->acc, 0, sizeof *t->acc * (size_t)dim);
    kv_seq_truncate(&t->seq, 0);
    t->pos = 0;
    if (++t->text < t->n_texts) {
        char err[ERR_MAX];
        if (!t->internal || tokenize_upto(t, t->text, err) == 0)
            return 0;
        embed_fail(t, LLMS__ERROR_CODE__INTERNAL, err);
        return 1;
    }
    if (!t->internal)
        embed_reply(t);
    return 1;
}

/* ---- Rerank ---- */

static void setting_key(const models_entry *me, float precision, char key[SEM_KEY_MAX])
{
    snprintf(key, SEM_KEY_MAX, "rerank.cv_threshold:%s:%.4f", me->path, precision);
}

/* Options of a call: the daemon's settings with the request's top_k and mode. */
static int call_options(semantic *sm, uint32_t has_k, uint32_t k, int has_mode,
                        Llms__RerankMode mode, rerank_options *o, char err[ERR_MAX])
{
    const config *cfg = sm->env.cfg;
    *o = rerank_default_options();
    o->memory_limit = (size_t)cfg->rerank_memory_mb << 20;
    o->scratch_dir = sm->scratch_dir;
    o->stream_weights = cfg->rerank_stream_weights != 0;
    o->yes_token = cfg->rerank_yes_token;
    o->no_token = cfg->rerank_no_token;
    o->n_threads = cfg->threads;
    o->top_k = SEM_DEFAULT_TOP_K;
    if (has_k) {
        if (k == 0 || k > (uint32_t)cfg->rerank_max_documents)
            return err_set(err, "top_k %u is outside [1, %d]", k, cfg->rerank_max_documents);
        o->top_k = (int)k;
    }
    o->mode = RERANK_SET;
    if (has_mode) {
        if (mode == LLMS__RERANK_MODE__RERANK_ORDERED)
            o->mode = RERANK_ORDERED;
        else if (mode != LLMS__RERANK_MODE__RERANK_SET)
            return err_set(err, "unknown mode %d", (int)mode);
    }
    return 0;
}

/* The model's reranker, opened on first use with the daemon's settings (a call's
 * options may then differ, stream_weights included). */
static reranker *get_reranker(semantic *sm, models_entry *me, char err[ERR_MAX])
{
    rerank_options o;
    call_options(sm, 0, 0, 0, LLMS__RERANK_MODE__RERANK_SET, &o, err);
    return models_reranker(me, &o, err);
}

/* Checks the size of one query and its documents against the limits: 0, or the code. */
static Llms__ErrorCode check_docs(const semantic *sm, const char *query, char **docs, size_t n,
                                  char err[ERR_MAX])
{
    const config *cfg = sm->env.cfg;
    if (!query[0]) {
        err_set(err, "empty query");
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (n == 0) {
        err_set(err, "no documents");
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (n > (size_t)cfg->rerank_max_documents) {
        err_set(err, "%zu documents, more than the limit (rerank_max_documents = %d)", n,
                cfg->rerank_max_documents);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    size_t bytes = strlen(query);
    for (size_t i = 0; i < n; i++) {
        if (!docs[i][0]) {
            err_set(err, "document %zu is empty", i);
            return LLMS__ERROR_CODE__INVALID_ARGUMENT;
        }
        bytes += strlen(docs[i]);
    }
    if (bytes > (size_t)cfg->rerank_max_bytes) {
        err_set(err, "%zu bytes of query and documents, more than the limit "
                     "(rerank_max_bytes = %d)", bytes, cfg->rerank_max_bytes);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    return LLMS__ERROR_CODE__OK;
}

/* Whether the reranker knows its "yes" and "no" tokens; otherwise answers
 * FAILED_PRECONDITION naming the settings that fix it. */
static bool answer_tokens_known(semantic *sm, const reranker *rr, const rerank_options *o,
                                uint64_t conn_id, const Llms__Request *req)
{
    char err[ERR_MAX];
    int32_t yes, no;
    if (rerank_answer_tokens(rr, o, &yes, &no, err) == 0)
        return true;
    reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                "%s: set rerank_yes_token and rerank_no_token to the reranker's answer token ids",
                err);
    return false;
}

static sem_task *rerank_begin_task(semantic *sm, uint64_t conn_id, const Llms__Request *req)
{
    const Llms__RerankRequest *rq = req->rerank;
    char err[ERR_MAX];
    models_entry *me = resolve(sm, conn_id, req, rq->model, MODELS_RERANK);
    if (!me)
        return NULL;
    Llms__ErrorCode code = check_docs(sm, rq->query, rq->documents, rq->n_documents, err);
    if (code != LLMS__ERROR_CODE__OK) {
        reply_error(&sm->to, conn_id, req, code, "%s", err);
        return NULL;
    }
    rerank_options o;
    if (call_options(sm, rq->has_top_k, rq->top_k, rq->has_mode, rq->mode, &o, err) < 0) {
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT, "%s", err);
        return NULL;
    }
    if (rq->has_stream_weights)
        o.stream_weights = rq->stream_weights;
    if (rq->has_cv_threshold && rq->has_target_precision) {
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                    "give cv_threshold or target_precision, not both");
        return NULL;
    }
    if (rq->has_cv_threshold) {
        if (!isfinite(rq->cv_threshold)) {
            reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                        "cv_threshold is not a number");
            return NULL;
        }
        o.cv_threshold = rq->cv_threshold;
    } else if (rq->has_target_precision) {
        float p = rq->target_precision;
        if (!(p > 0 && p <= 1)) {
            reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                        "target_precision %g is outside (0, 1]", p);
            return NULL;
        }
        char key[SEM_KEY_MAX];
        setting_key(me, p, key);
        double v[4];
        int nv = 0;
        bool found = false;
        if (store_setting_get(sm->env.st, key, v, 4, &nv, &found, err) < 0) {
            reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "settings: %s", err);
            return NULL;
        }
        if (!found || nv < 1) {
            reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__FAILED_PRECONDITION,
                        "no threshold calibrated for precision %.4f on %s "
                        "(llmsctl rerank-calibrate)", p, me->path);
            return NULL;
        }
        o.cv_threshold = (float)v[0];
    }
    reranker *rr = get_reranker(sm, me, err);
    if (!rr) {
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "reranker '%s': %s",
                    me->name, err);
        return NULL;
    }
    if (!answer_tokens_known(sm, rr, &o, conn_id, req))
        return NULL;
    if (rerank_query_fits(rr, rq->query, err) < 0) {
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT, "%s", err);
        return NULL;
    }
    /* Every document is in a top-K that large, so set mode would stop after the first
     * layer with provisional scores; the full forward gives the exact scores and order. */
    if (o.mode == RERANK_SET && o.top_k >= (int)rq->n_documents)
        o.mode = RERANK_ORDERED;
    sem_task *t = task_new(sm, SEM_RERANK, me, conn_id, req);
    if (!t)
        return NULL;
    /* a step computes whole chunks: keep them to a step's share of rows */
    o.max_chunk_tokens = sm->env.max_slice;
    t->opt = o;
    t->rt = rerank_begin(rr, rq->query, (const char *const *)rq->documents,
                         (int)rq->n_documents, &o, err);
    if (!t->rt) {
        semantic_task_free(t);
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
        return NULL;
    }
    me->rr_busy = true;
    return t;
}

/* Answers a finished rerank with its result. */
static void rerank_reply(sem_task *t, const rerank_result *res)
{
    semantic *sm = t->sm;
    uint64_t conn_id = t->conn_id;
    const Llms__Request *req = t->req;
    const Llms__RerankRequest *rq = req->rerank;
    size_t nd = rq->n_documents;
    Llms__RerankHit *hits = calloc((size_t)res->n + 1, sizeof *hits);
    Llms__RerankHit **hptr = calloc((size_t)res->n + 1, sizeof *hptr);
    uint32_t *layers = calloc(nd, sizeof *layers);
    uint32_t *pruned = calloc((size_t)res->n_layer + 1, sizeof *pruned);
    if (!hits || !hptr || !layers || !pruned) {
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "out of memory");
        goto done;
    }
    for (int i = 0; i < res->n; i++) {
        llms__rerank_hit__init(&hits[i]);
        hits[i].index = (uint32_t)res->index[i];
        /* A document selected before the last layer (set mode) has only a provisional
         * score: NaN says so rather than pass it off as the reranker's verdict. */
        bool final = res->layers_computed[res->index[i]] == res->n_layer;
        hits[i].score = final ? res->score[i] : NAN;
        hptr[i] = &hits[i];
    }
    for (size_t i = 0; i < nd; i++)
        layers[i] = (uint32_t)res->layers_computed[i];
    for (int l = 0; l < res->n_layer; l++)
        pruned[l] = (uint32_t)res->pruned_at_layer[l];
    Llms__RerankResponse rb = LLMS__RERANK_RESPONSE__INIT;
    rb.n_hits = (size_t)res->n;
    rb.hits = hptr;
    rb.n_layers_computed = nd;
    rb.layers_computed = layers;
    rb.n_pruned_at_layer = (size_t)res->n_layer;
    rb.pruned_at_layer = pruned;
    rb.peak_bytes = res->peak_bytes;
    t->me->rr_peak_bytes = res->peak_bytes;
    rb.time_ms = res->ms;
    rb.cv_threshold = t->opt.cv_threshold;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_RERANK;
    r.rerank = &rb;
    reply_send(&sm->to, conn_id, &r, false);
done:
    free(hits);
    free(hptr);
    free(layers);
    free(pruned);
}

/* ---- RerankCalibrate ---- */

/* |a ∩ b| / n for two index lists of n entries. */
static double overlap(const int *a, const int *b, int n)
{
    int hit = 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            if (a[i] == b[j]) {
                hit++;
                break;
            }
    return n > 0 ? (double)hit / n : 1.0;
}

/* The reranker for a RerankCalibrate whose queries and options are valid, with those
 * options; NULL when not, the error answered. */
static reranker *calibration_reranker(sem_task *t, rerank_options *o)
{
    semantic *sm = t->sm;
    const Llms__Request *req = t->req;
    const Llms__RerankCalibrateRequest *cq = req->rerank_calibrate;
    char err[ERR_MAX];
    float p = cq->precision;
    if (!(p > 0 && p <= 1)) {
        reply_error(&sm->to, t->conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                    "precision %g is outside (0, 1]", p);
        return NULL;
    }
    if (cq->n_queries == 0) {
        reply_error(&sm->to, t->conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT, "no queries");
        return NULL;
    }
    for (size_t q = 0; q < cq->n_queries; q++) {
        const Llms__RerankQuery *rq = cq->queries[q];
        Llms__ErrorCode code = check_docs(sm, rq->query, rq->documents, rq->n_documents, err);
        if (code != LLMS__ERROR_CODE__OK) {
            reply_error(&sm->to, t->conn_id, req, code, "query %zu: %s", q, err);
            return NULL;
        }
    }
    if (call_options(sm, cq->has_top_k, cq->top_k, cq->has_mode, cq->mode, o, err) < 0) {
        reply_error(&sm->to, t->conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT, "%s", err);
        return NULL;
    }
    reranker *rr = get_reranker(sm, t->me, err);
    if (!rr) {
        reply_error(&sm->to, t->conn_id, req, LLMS__ERROR_CODE__INTERNAL, "reranker '%s': %s",
                    t->me->name, err);
        return NULL;
    }
    if (!answer_tokens_known(sm, rr, o, t->conn_id, req))
        return NULL;
    for (size_t q = 0; q < cq->n_queries; q++)
        if (rerank_query_fits(rr, cq->queries[q]->query, err) < 0) {
            reply_error(&sm->to, t->conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                        "query %zu: %s", q, err);
            return NULL;
        }
    return rr;
}

/* Reranks every query of cq under o. With reference set, each query's top-K is kept in
 * ref (nq, k) and nref; else it is compared with them, and *precision is the mean share
 * of the reference's top-K it keeps. *ms: the mean time per query. */
static int rerank_queries(reranker *rr, const Llms__RerankCalibrateRequest *cq,
                          const rerank_options *o, bool reference, int *ref, int *nref,
                          double *ms, double *precision, char err[ERR_MAX])
{
    size_t nq = cq->n_queries, k = (size_t)o->top_k;
    double total_ms = 0, sum = 0;
    for (size_t q = 0; q < nq; q++) {
        const Llms__RerankQuery *rq = cq->queries[q];
        rerank_result res;
        memset(&res, 0, sizeof res);
        char e2[ERR_MAX];
        double t0 = clock_mono_ms();
        if (rerank_run(rr, rq->query, (const char *const *)rq->documents, (int)rq->n_documents,
                       o, &res, e2) < 0) {
            rerank_result_free(&res);
            return err_set(err, "query %zu: %s", q, e2);
        }
        total_ms += clock_mono_ms() - t0;
        if (reference) {
            nref[q] = res.n;
            memcpy(ref + q * k, res.index, sizeof *ref * (size_t)res.n);
        } else {
            sum += overlap(ref + q * k, res.index, res.n < nref[q] ? res.n : nref[q]);
        }
        rerank_result_free(&res);
    }
    *ms = total_ms / (double)nq;
    if (precision)
        *precision = sum / (double)nq;
    return 0;
}

static void handle_calibrate(sem_task *t)
{
    semantic *sm = t->sm;
    const Llms__Request *req = t->req;
    const Llms__RerankCalibrateRequest *cq = req->rerank_calibrate;
    char err[ERR_MAX];
    rerank_options o;
    reranker *rr = calibration_reranker(t, &o);
    if (!rr)
        return;
    float p = cq->precision;
    size_t nq = cq->n_queries;
    int k = o.top_k;
    int *ref = calloc(nq * (size_t)k, sizeof *ref); /* (nq, k) full-forward top-K */
    int *nref = calloc(nq, sizeof *nref);
    float grid_prec[CALIB_N];
    double full_ms, pruned_ms = 0;
    int n_tried = 0, chosen = -1;
    if (!ref || !nref) {
        err_set(err, "out of memory");
        goto fail;
    }
    o.cv_threshold = 0;
    if (rerank_queries(rr, cq, &o, true, ref, nref, &full_ms, NULL, err))
        goto fail;
    /* the grid's thresholds prune more and more: the first that keeps the precision */
    for (int g = 0; g < CALIB_N && chosen < 0; g++, n_tried++) {
        double ms, prec;
        o.cv_threshold = calib_grid[g];
        if (rerank_queries(rr, cq, &o, false, ref, nref, &ms, &prec, err))
            goto fail;
        grid_prec[g] = (float)prec;
        if (grid_prec[g] >= p) {
            chosen = g;
            pruned_ms = ms;
        }
    }
    /* No grid threshold reaches the precision: only the full forward does. */
    float thr = chosen >= 0 ? calib_grid[chosen] : 0.0f;
    char key[SEM_KEY_MAX];
    setting_key(t->me, p, key);
    double vals[4] = {thr, chosen >= 0 ? grid_prec[chosen] : 1.0, k, o.mode};
    char e2[ERR_MAX];
    if (store_setting_put(sm->env.st, key, vals, 4, e2) < 0) {
        err_set(err, "settings: %s", e2);
        goto fail;
    }
    Llms__RerankCalibrateResponse cr = LLMS__RERANK_CALIBRATE_RESPONSE__INIT;
    cr.found = chosen >= 0;
    cr.cv_threshold = thr;
    cr.precision = (float)vals[1];
    cr.n_grid = (size_t)n_tried;
    cr.grid = (float *)calib_grid;
    cr.n_grid_precision = (size_t)n_tried;
    cr.grid_precision = grid_prec;
    cr.full_ms = full_ms;
    cr.pruned_ms = chosen >= 0 ? pruned_ms : full_ms;
    Llms__Response r = LLMS__RESPONSE__INIT;
    r.id = req->id;
    r.final = 1;
    r.body_case = LLMS__RESPONSE__BODY_RERANK_CALIBRATE;
    r.rerank_calibrate = &cr;
    reply_send(&sm->to, t->conn_id, &r, false);
    goto done;
fail:
    reply_error(&sm->to, t->conn_id, req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
done:
    free(ref);
    free(nref);
}

sem_task *semantic_begin(semantic *sm, uint64_t conn_id, const Llms__Request *req)
{
    sem_task *t;
    models_entry *me;
    switch (req->body_case) {
    case LLMS__REQUEST__BODY_EMBED:
        return embed_begin(sm, conn_id, req);
    case LLMS__REQUEST__BODY_RERANK:
        return rerank_begin_task(sm, conn_id, req);
    case LLMS__REQUEST__BODY_RERANK_CALIBRATE:
        me = resolve(sm, conn_id, req, req->rerank_calibrate->model, MODELS_RERANK);
        t = me ? task_new(sm, SEM_CALIBRATE, me, conn_id, req) : NULL;
        if (t)
            me->rr_busy = true;
        return t;
    default:
        reply_error(&sm->to, conn_id, req, LLMS__ERROR_CODE__UNIMPLEMENTED,
                    "request body %d is not a semantic call", (int)req->body_case);
        return NULL;
    }
}

bool semantic_can_begin(const semantic *sm, const Llms__Request *req)
{
    const char *name = NULL;
    if (req->body_case == LLMS__REQUEST__BODY_RERANK)
        name = req->rerank->model;
    else if (req->body_case == LLMS__REQUEST__BODY_RERANK_CALIBRATE)
        name = req->rerank_calibrate->model;
    else
        return true;
    char err[ERR_MAX];
    models_entry *me;
    /* a request for no model may begin: semantic_begin answers it */
    if (models_resolve(sm->env.reg, name, MODELS_RERANK, &me, err) != LLMS__ERROR_CODE__OK)
        return true;
    return !me->rr_busy;
}

/* Embed on the encoder: whole texts, as many as max_rows (at least one) and the runner
 * take, through every layer. 1 when the request is answered. */
static int embed_advance_encoder(sem_task *t, int max_rows)
{
    char err[ERR_MAX];
    const models_entry *me = t->me;
    int cap = bert_runner_max_rows(me->enc_r), g = 0, rows = 0;
    if (max_rows > cap)
        max_rows = cap;
    int *lens = t->text_start + t->n_texts + 1; /* (n_texts) lengths, filled here */
    while (t->text + g < t->n_texts) {
        if (t->internal && tokenize_upto(t, t->text + g, err)) {
            embed_fail(t, LLMS__ERROR_CODE__INTERNAL, err);
            return 1;
        }
        int len = t->text_start[t->text + g + 1] - t->text_start[t->text + g];
        if (g > 0 && rows + len > max_rows)
            break;
        lens[g++] = len;
        rows += len;
    }
    if (bert_embed(me->enc_r, g, lens, t->tokens + t->text_start[t->text], NULL, t->enc_pool,
                   t->values + (size_t)t->text * t->dim, err) < 0) {
        embed_fail(t, LLMS__ERROR_CODE__INTERNAL, err);
        return 1;
    }
    t->text += g;
    if (t->text < t->n_texts)
        return 0;
    if (!t->internal)
        embed_reply(t);
    return 1;
}

/* Embed on a decoder with a runner of its own: whole texts, a forward each, as many as
 * max_rows rows take (at least one). 1 when the task is finished. */
static int embed_advance_decoder(sem_task *t, int max_rows)
{
    char err[ERR_MAX];
    for (int rows = 0; t->text < t->n_texts && (rows == 0 || rows < max_rows); t->text++) {
        if (t->internal && tokenize_upto(t, t->text, err)) {
            embed_fail(t, LLMS__ERROR_CODE__INTERNAL, err);
            return 1;
        }
        int len = t->text_start[t->text + 1] - t->text_start[t->text];
        if (embed_tokens(t->me->dec_emb, t->tokens + t->text_start[t->text], len, t->pooling,
                         t->values + (size_t)t->text * t->dim, err) < 0) {
            embed_fail(t, LLMS__ERROR_CODE__INTERNAL, err);
            return 1;
        }
        rows += len;
    }
    if (t->text < t->n_texts)
        return 0;
    if (!t->internal)
        embed_reply(t);
    return 1;
}

int semantic_advance(sem_task *t, int max_rows)
{
    char err[ERR_MAX];
    if (t->kind == SEM_EMBED)
        return t->me->enc ? embed_advance_encoder(t, max_rows) : embed_advance_decoder(t, max_rows);
    if (t->kind == SEM_CALIBRATE) {
        handle_calibrate(t);
        return 1;
    }
    int rc = rerank_step(t->rt, max_rows, err);
    if (rc < 0) {
        reply_error(&t->sm->to, t->conn_id, t->req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
        return 1;
    }
    if (rc == 0)
        return 0;
    rerank_result res;
    if (rerank_task_result(t->rt, &res, err) < 0) {
        reply_error(&t->sm->to, t->conn_id, t->req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
        return 1;
    }
    rerank_reply(t, &res);
    rerank_result_free(&res);
    return 1;
}

int semantic_texts_done(const sem_task *t)
{
    return t->kind == SEM_EMBED ? t->text : 0;
}

long semantic_rows_left(const sem_task *t)
{
    switch (t->kind) {
    case SEM_EMBED:
        if (t->internal)
            return t->failed ? 0
                             : t->text_start[t->n_tok] - t->text_start[t->text] - t->pos +
                                   t->bytes_left;
        return t->text_start[t->n_texts] - t->text_start[t->text] - t->pos;
    case SEM_RERANK:
        return rerank_task_rows_left(t->rt);
    case SEM_CALIBRATE:
        break;
    }
    return 1;
}

#define SEM_NOW_MAX_TOKENS 512

models_entry *semantic_default_embedder(semantic *sm, char err[ERR_MAX])
{
    models_entry *me;
    return models_resolve(sm->env.reg, NULL, MODELS_EMBED, &me, err) == LLMS__ERROR_CODE__OK
               ? me
               : NULL;
}

/* The pooling and the most tokens of the worker's own embeddings on me. */
static int own_embedding(const semantic *sm, const models_entry *me, enum embed_pooling *dec,
                         enum bert_pooling *enc, int *max_len, char err[ERR_MAX])
{
    *max_len = embed_max_len(sm, me);
    if (*max_len > SEM_NOW_MAX_TOKENS)
        *max_len = SEM_NOW_MAX_TOKENS;
    return embed_pooling_for(sm, me, false, EMBED_MEAN, EMBED_MEAN, dec, enc, err);
}

int semantic_embed_now(semantic *sm, models_entry *me, const char *text, float *out,
                       char err[ERR_MAX])
{
    const tokenizer *tok = embed_tok_of(sm, me);
    enum embed_pooling pooling;
    enum bert_pooling enc_pool;
    int max;
    if (own_embedding(sm, me, &pooling, &enc_pool, &max, err) < 0)
        return -1;
    embedder *emb = me->dec_emb;
    if (!me->enc && !emb) {
        if (!sm->emb && !(sm->emb = embed_new(sm->env.m, sm->env.runner, sm->env.pool, err)))
            return -1;
        emb = sm->emb;
    }
    size_t len = strlen(text);
    int cap = (int)(len < (size_t)max ? len : (size_t)max) + 8;
    int32_t *ids = malloc(sizeof *ids * (size_t)cap);
    if (!ids)
        return err_set(err, "out of memory");
    int n = tok_encode(tok, text, len, true, false, ids, cap);
    if (n > cap) {
        int32_t *all = realloc(ids, sizeof *ids * (size_t)n);
        if (!all) {
            free(ids);
            return err_set(err, "out of memory");
        }
        ids = all;
        n = tok_encode(tok, text, len, true, false, ids, n);
    }
    int rc = 0;
    if (n <= 0)
        rc = err_set(err, "the text has no tokens to embed");
    else if (n > max)
        n = max;
    if (n > 0 && me->enc)
        rc = bert_embed(me->enc_r, 1, &n, ids, NULL, enc_pool, out, err);
    else if (n > 0)
        rc = embed_tokens(emb, ids, n, pooling, out, err);
    free(ids);
    return rc < 0 ? -1 : 0;
}

int semantic_embed_check(const semantic *sm, const models_entry *me, char err[ERR_MAX])
{
    enum embed_pooling dec;
    enum bert_pooling enc;
    int max_len;
    return own_embedding(sm, me, &dec, &enc, &max_len, err);
}

int semantic_dim(const semantic *sm, const models_entry *me)
{
    return embed_dim_of(sm, me);
}

sem_task *semantic_embed_texts(semantic *sm, models_entry *me, const char *const *texts, int n,
                               char err[ERR_MAX])
{
    enum embed_pooling pooling;
    enum bert_pooling enc_pool;
    int max_len;
    if (own_embedding(sm, me, &pooling, &enc_pool, &max_len, err) < 0)
        return NULL;
    sem_task *t = calloc(1, sizeof *t);
    if (!t) {
        err_set(err, "out of memory");
        return NULL;
    }
    t->sm = sm;
    t->kind = SEM_EMBED;
    t->me = me;
    me->running++;
    kv_seq_init(&t->seq, sm->env.pool);
    t->internal = true;
    t->texts = texts;
    t->n_texts = n;
    t->pooling = pooling;
    t->enc_pool = enc_pool;
    t->dim = embed_dim_of(sm, me);
    t->max_len = max_len;
    for (int i = 0; i < n; i++)
        t->bytes_left += (long)strlen(texts[i]);
    if (embed_buffers(t, (size_t)n, err)) {
        semantic_task_free(t);
        return NULL;
    }
    if (n > 0 && tokenize_upto(t, 0, err)) {
        semantic_task_free(t);
        return NULL;
    }
    return t;
}

const float *semantic_task_values(const sem_task *t, char err[ERR_MAX])
{
    if (t->failed) {
        err_set(err, "%s", t->err);
        return NULL;
    }
    return t->values;
}
