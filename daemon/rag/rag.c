/*
 * rag.c — RagQuery: QA bank, retrieval, segmented prompt, QKV prefix tree.
 */
#include "daemon/rag/rag.h"

#include <math.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/prompt.h"
#include "daemon/net/reply.h"
#include "daemon/reqlog.h"
#include "engine/clock.h"
#include "engine/vdist.h"
#include "storage/kb.h"

#define RAG_MAX_K 16            /* passages in a prompt at most */
#define RAG_MARK "\x1e"         /* stands for the user message while the template renders */

struct rag {
    rag_env env;
    reply_to to;
    size_t chunk_bytes;         /* one f16 chunk's KV */
    uint8_t *node_buf;          /* a node's raw bytes while loading */
    size_t node_cap;
    uint64_t queries, qa_hits, qkv_hits, qkv_tokens, qkv_evictions, qa_evictions;
    uint64_t kb_changes;        /* committed knowledge base changes so far */
    uint64_t verify_misses;     /* nodes under a query's key that were not its */
    float tau;                  /* tau_query now */
    /* The QKV tree's stored bytes as of the last count: summing them is a scan of the
     * whole table, and the worker asks for room before every idle-time step. Every write
     * to the tree goes through this file, which sets the count stale. */
    int64_t qkv_bytes;
    bool qkv_bytes_stale;
};

/* Who asks: a client, or the predictor (predict.h) for the QKV tree alone or for both
 * levels. */
enum asker { ASK_REAL, ASK_PREFILL, ASK_DECODE };

struct rag_query {
    rag *r;
    int64_t t0_ns;
    double retrieve_ms;
    kb_ref kb;
    const Llms__RagQueryRequest *rq;
    int max_tokens;             /* the reply length the generation asks for */
    float *qvec;
    int n_hits;
    kb_hit hits[RAG_MAX_K];
    int32_t *tokens;
    int n_tokens;
    int seg_end[RAG_MAX_K + 1]; /* end of the system segment, then of each passage */
    uint8_t keys[RAG_MAX_K + 1][STORE_QKV_KEY_BYTES];
    /* Whose the query's QKV nodes are: its app, or its uid's apps together when the
     * knowledge base is shared (kb_ref.share_uid); part of every key. */
    char scope[KB_NAME_MAX + 1], app[KB_NAME_MAX + 1];
    store_owner owner;
    store_owner system_owner;   /* of node 0: the uid's when the query shares its system
                                   prompt (share_system_uid), else owner */
    int n_nodes;                /* 1 + n_hits */
    int nodes_found;            /* nodes of the path loaded from the tree */
    int reused_tokens;
    uint64_t kb_changes;        /* r->kb_changes when the passages were retrieved */
    bool use_qa, use_qkv;
    enum asker asker;
    bool cached;                /* predicted: nothing to compute */
    bool pred_node;             /* a passage node loaded was a predicted one */
    bool warm;                  /* a warm-up: the prompt ends after its one passage */
    /* the reply's passages */
    Llms__KbHit h[RAG_MAX_K];
    Llms__KbHit *hp[RAG_MAX_K];
    char *doc[RAG_MAX_K], *meta[RAG_MAX_K];
};

static void warn(const char *what, const char *err)
{
    if (reqlog_enabled(REQLOG_WARN))
        fprintf(stderr, "llmsd: rag: %s: %s\n", what, err);
}

/* ---- QA invalidation ---- */

typedef struct stale {
    rag *r;
    const kb_ref *kb;
    int64_t first_new;
    int64_t ids[256];
    char *questions[256]; /* each entry's, for its regeneration (NULL: out of memory) */
    int n;
    bool more;
} stale;

static int mark_stale(stale *s, const store_qa *q)
{
    if (s->n == (int)(sizeof s->ids / sizeof s->ids[0])) {
        s->more = true;
        return 1;
    }
    s->questions[s->n] = strdup(q->question);
    s->ids[s->n++] = q->id;
    return 0;
}

/* After an add: the entry is stale when a new passage ranks in its question's top
 * k_refresh. After a removal: when one of its passages is gone. */
static int find_stale(void *arg, const store_qa *q)
{
    stale *s = arg;
    char err[ERR_MAX];
    if (s->first_new < 0) {
        for (int i = 0; i < q->n_passages; i++) {
            bool found;
            if (store_kb_passage(s->r->env.st, s->kb->id, q->passages[i], NULL, NULL, &found,
                                 err))
                return -1;
            if (!found)
                return mark_stale(s, q);
        }
        return 0;
    }
    kb_hit hits[64];
    int n, k = s->r->env.cfg->k_refresh;
    if (kb_retrieve(s->r->env.kb, s->kb, q->question, q->vec, k, LLMS__RETRIEVAL__RETRIEVAL_RRF,
                    hits, &n, err))
        return -1;
    for (int i = 0; i < n; i++)
        if (hits[i].id >= s->first_new)
            return mark_stale(s, q);
    return 0;
}

static int on_changed(void *arg, const kb_ref *kb, int64_t first_new)
{
    rag *r = arg;
    char err[ERR_MAX];
    int total = 0;
    /* a query in flight retrieved before this change: its answer must not enter the bank,
     * as no check here can see an entry that does not exist yet */
    r->kb_changes++;
    predict_note_change(r->env.pred, kb, first_new);
    stale s = {.r = r, .kb = kb, .first_new = first_new};
    do {
        s.n = 0;
        s.more = false;
        int rc = store_qa_list(r->env.st, kb->id, kb->dim, find_stale, &s, err);
        if (rc < 0) {
            warn("QA refresh", err);
            for (int i = 0; i < s.n; i++)
                free(s.questions[i]);
            return total;
        }
        for (int i = 0; i < s.n; i++) {
            if (store_qa_delete(r->env.st, s.ids[i], err) == 0) {
                total++;
                if (s.questions[i])
                    predict_note_stale(r->env.pred, kb, s.questions[i]);
            }
            free(s.questions[i]);
        }
    } while (s.more);
    return total;
}

rag *rag_new(const rag_env *env, char err[ERR_MAX])
{
    rag *r = calloc(1, sizeof *r);
    if (!r) {
        err_set(err, "out of memory");
        return NULL;
    }
    r->env = *env;
    r->to = (reply_to){env->out, env->cfg->max_frame_bytes};
    r->chunk_bytes = kv_chunk_data_bytes(env->shape, KV_F16);
    r->tau = env->cfg->tau_query;
    r->qkv_bytes_stale = true;
    if (sodium_init() < 0) {
        free(r);
        err_set(err, "libsodium does not initialise");
        return NULL;
    }
    kb_on_changed(env->kb, on_changed, r);
    return r;
}

void rag_free(rag *r)
{
    if (!r)
        return;
    free(r->node_buf);
    free(r);
}

void rag_query_free(rag_query *q)
{
    if (!q)
        return;
    free(q->qvec);
    free(q->tokens);
    for (int i = 0; i < RAG_MAX_K; i++) {
        free(q->doc[i]);
        free(q->meta[i]);
    }
    free(q);
}

const int32_t *rag_prompt(const rag_query *q, int *n)
{
    *n = q->n_tokens;
    return q->tokens;
}

/* ---- passages of the reply ---- */

typedef struct fill {
    rag_query *q;
    int i;
    char *text;     /* wanted: the passage text (fresh) */
} fill;

static int fill_passage(void *arg, const store_passage *p)
{
    fill *f = arg;
    rag_query *q = f->q;
    q->doc[f->i] = strdup(p->doc);
    q->meta[f->i] = p->metadata ? strdup(p->metadata) : NULL;
    f->text = strdup(p->text);
    if (!q->doc[f->i] || !f->text || (p->metadata && !q->meta[f->i]))
        return 1;
    Llms__KbHit *h = &q->h[f->i];
    h->document = q->doc[f->i];
    h->seq = (uint32_t)p->seq;
    h->metadata = q->meta[f->i];
    return 0;
}

/* Loads passage i's record into the reply; *text (may be NULL) gets its text. 1: found,
 * 0: gone, -1: failure. */
static int load_passage(rag_query *q, int i, int64_t id, float score, char **text,
                        char err[ERR_MAX])
{
    llms__kb_hit__init(&q->h[i]);
    q->h[i].passage = (uint64_t)id;
    q->h[i].score = score;
    q->hp[i] = &q->h[i];
    free(q->doc[i]);
    free(q->meta[i]);
    q->doc[i] = q->meta[i] = NULL;
    fill f = {q, i, NULL};
    bool found;
    int rc = store_kb_passage(q->r->env.st, q->kb.id, id, fill_passage, &f, &found, err);
    if (rc > 0)
        err_set(err, "out of memory");
    if (rc || !found || !text)
        free(f.text);
    else
        *text = f.text;
    return rc ? -1 : found ? 1 : 0;
}

/* ---- QA bank ---- */

typedef struct qa_best {
    const float *qvec;
    int dim;
    int max_tokens;             /* the query's */
    float sim;
    int64_t id;
    char *answer;
    int stop, n_tokens;         /* the stored answer's (store_qa) */
    int64_t passages[RAG_MAX_K];
    int n_passages;
    bool predicted;
    bool oom;
} qa_best;

/* Whether a stored answer is as long as the query's own would be: no longer than its
 * max_tokens, and one cut at max_tokens only for a query cut at the same length (a
 * query allowed more would go on where the stored one stopped). Entries from before
 * schema 14 say 0 tokens and STOP_EOS, and fit every query, as they always did. */
static bool qa_fits(const store_qa *e, int max_tokens)
{
    if (e->stop == LLMS__STOP_REASON__STOP_MAX_TOKENS)
        return e->n_tokens == max_tokens;
    return e->n_tokens <= max_tokens;
}

static int qa_scan(void *arg, const store_qa *e)
{
    qa_best *b = arg;
    if (!qa_fits(e, b->max_tokens))
        return 0;
    float s = 0;
    for (int i = 0; i < b->dim; i++)
        s += b->qvec[i] * e->vec[i];
    if (s <= b->sim)
        return 0;
    char *a = strdup(e->answer);
    if (!a) {
        b->oom = true;
        return 1;
    }
    free(b->answer);
    b->answer = a;
    b->sim = s;
    b->id = e->id;
    b->stop = e->stop;
    b->n_tokens = e->n_tokens;
    b->predicted = e->predicted;
    b->n_passages = e->n_passages < RAG_MAX_K ? e->n_passages : RAG_MAX_K;
    memcpy(b->passages, e->passages, sizeof *b->passages * (size_t)b->n_passages);
    return 0;
}

/* Answers q from the QA bank when a stored question is close enough: 1 answered, 0 not
 * (a stale entry, one whose passages are gone, is deleted), -1 failure. */
static int qa_answer(rag *r, rag_query *q, uint64_t conn_id, const Llms__Request *req,
                     char err[ERR_MAX])
{
    qa_best b = {.qvec = q->qvec, .dim = q->kb.dim, .sim = -2, .max_tokens = q->max_tokens};
    int rc = store_qa_list(r->env.st, q->kb.id, q->kb.dim, qa_scan, &b, err);
    if (rc || b.oom) {
        if (b.oom)
            err_set(err, "out of memory");
        free(b.answer);
        return -1;
    }
    if (!b.answer || b.sim < r->tau) {
        free(b.answer);
        return 0;
    }
    if (q->asker != ASK_REAL) {
        free(b.answer);
        q->cached = true;
        return 1;
    }
    /* the reply must be a StopReason a client knows, whatever the row holds */
    if (!protobuf_c_enum_descriptor_get_value(&llms__stop_reason__descriptor, b.stop)) {
        err_set(err, "QA entry %lld: unknown stop reason %d", (long long)b.id, b.stop);
        free(b.answer);
        return -1;
    }
    for (int i = 0; i < b.n_passages; i++) {
        int got = load_passage(q, i, b.passages[i], 0, NULL, err);
        if (got < 0) {
            free(b.answer);
            return -1;
        }
        if (got == 0) {
            free(b.answer);
            return store_qa_delete(r->env.st, b.id, err) ? -1 : 0;
        }
    }
    q->retrieve_ms = (double)(clock_mono_ns() - q->t0_ns) / 1e6;
    Llms__CallChunk ch = LLMS__CALL_CHUNK__INIT;
    ch.text = b.answer;
    Llms__Response resp = LLMS__RESPONSE__INIT;
    resp.id = req->id;
    resp.body_case = LLMS__RESPONSE__BODY_CHUNK;
    resp.chunk = &ch;
    reply_send(&r->to, conn_id, &resp, false);
    Llms__RagResult res = LLMS__RAG_RESULT__INIT;
    res.outcome = LLMS__RAG_OUTCOME__RAG_QA_HIT;
    res.n_passages = (size_t)b.n_passages;
    res.passages = q->hp;
    res.retrieve_ms = q->retrieve_ms;
    /* as the answer first stopped: one cut at max_tokens is still cut */
    res.stop_reason = (Llms__StopReason)b.stop;
    res.generated_tokens = (uint32_t)b.n_tokens;
    res.text = b.answer;
    res.has_qa_similarity = 1;
    res.qa_similarity = b.sim;
    Llms__Response fin = LLMS__RESPONSE__INIT;
    fin.id = req->id;
    fin.final = 1;
    fin.body_case = LLMS__RESPONSE__BODY_RAG_RESULT;
    fin.rag_result = &res;
    reply_send(&r->to, conn_id, &fin, false);
    free(b.answer);
    r->qa_hits++;
    if (b.predicted) {
        predict_count_hits(r->env.pred, true, false);
        if (store_cache_begin(r->env.st, err)) {
            warn("QA bank", err);
        } else if (store_qa_asked(r->env.st, b.id, err)) {
            store_kb_rollback(r->env.st);
            store_cache_end(r->env.st);
            warn("QA bank", err);
        } else if (store_cache_commit(r->env.st, err)) {
            warn("QA bank", err);
        }
    }
    return 1;
}

/* ---- prompt ---- */

/* Appends the tokens of text to q's prompt. */
static int add_tokens(rag *r, rag_query *q, const char *text, bool add_special,
                      bool parse_special, char err[ERR_MAX])
{
    int32_t *ids;
    int n;
    if (prompt_tokenize(r->env.tok, text, strlen(text), add_special, parse_special, &ids, &n, err))
        return -1;
    int32_t *all = realloc(q->tokens, sizeof *all * (size_t)(q->n_tokens + n + 1));
    if (!all) {
        free(ids);
        return err_set(err, "out of memory");
    }
    q->tokens = all;
    memcpy(q->tokens + q->n_tokens, ids, sizeof *ids * (size_t)n);
    q->n_tokens += n;
    free(ids);
    return 0;
}

/* The owner of node i of q: the system prompt's may be the uid's (share_system_uid). */
static const store_owner *node_owner(const rag_query *q, int i)
{
    return i == 0 ? &q->system_owner : &q->owner;
}

/* Starts a node key's hash with (model path, owner uid, owner scope). */
static int key_start(const rag *r, const store_owner *o, crypto_generichash_state *h)
{
    uint8_t uid[4] = {(uint8_t)o->uid, (uint8_t)(o->uid >> 8), (uint8_t)(o->uid >> 16),
                      (uint8_t)(o->uid >> 24)};
    return crypto_generichash_init(h, NULL, 0, STORE_QKV_KEY_BYTES) ||
           crypto_generichash_update(h, (const uint8_t *)r->env.model_path,
                                     strlen(r->env.model_path) + 1) ||
           crypto_generichash_update(h, uid, sizeof uid) ||
           crypto_generichash_update(h, (const uint8_t *)o->scope, strlen(o->scope) + 1);
}

/* Node i's key: BLAKE2b-256 of (model path, its owner's uid and scope, the prompt's tokens
 * up to the end of segment i). A 64-bit hash would let a collision, or a crafted row,
 * put another text's KV under a query; the store also compares each node's owner and
 * prefix before its KV is used, so even a collision is a miss. */
static int node_keys(rag *r, rag_query *q, char err[ERR_MAX])
{
    crypto_generichash_state h, system, at;
    if (key_start(r, &q->owner, &h) || key_start(r, &q->system_owner, &system))
        return err_set(err, "BLAKE2b failed");
    int from = 0;
    for (int i = 0; i < q->n_nodes; i++) {
        const uint8_t *seg = (const uint8_t *)(q->tokens + from);
        size_t len = sizeof *q->tokens * (size_t)(q->seg_end[i] - from);
        if (crypto_generichash_update(&h, seg, len) ||
            (i == 0 && crypto_generichash_update(&system, seg, len)))
            return err_set(err, "BLAKE2b failed");
        from = q->seg_end[i];
        at = i == 0 ? system : h;
        if (crypto_generichash_final(&at, q->keys[i], STORE_QKV_KEY_BYTES))
            return err_set(err, "BLAKE2b failed");
    }
    return 0;
}

/* Builds the segmented prompt of q from its passages and the keys of its nodes. */
static int build_prompt(rag *r, rag_query *q, char *const *texts, char err[ERR_MAX])
{
    const char *sys = q->rq->system_prompt ? q->rq->system_prompt : r->env.cfg->rag_system_prompt;
    char *rendered = prompt_complete_text(r->env.family, RAG_MARK, true, sys[0] ? sys : NULL, true,
                                          err);
    if (!rendered)
        return -1;
    char *mark = strstr(rendered, RAG_MARK);
    int rc = -1;
    if (!mark) {
        err_set(err, "the chat template lost the question's place");
        goto done;
    }
    *mark = '\0';
    const char *tail = mark + strlen(RAG_MARK);
    size_t hl = strlen(rendered);
    char *head = malloc(hl + 16);
    if (!head) {
        err_set(err, "out of memory");
        goto done;
    }
    snprintf(head, hl + 16, "%sPassages:\n", rendered);
    rc = add_tokens(r, q, head, true, true, err);
    free(head);
    if (rc)
        goto done;
    q->seg_end[0] = q->n_tokens;
    for (int i = 0; i < q->n_hits; i++) {
        size_t n = strlen(texts[i]) + 32;
        char *seg = malloc(n);
        if (!seg) {
            rc = err_set(err, "out of memory");
            goto done;
        }
        snprintf(seg, n, "[%d] %s\n", i + 1, texts[i]);
        rc = add_tokens(r, q, seg, false, false, err);
        free(seg);
        if (rc)
            goto done;
        q->seg_end[i + 1] = q->n_tokens;
    }
    if (q->warm)
        goto keys;
    size_t n = strlen(q->rq->question) + 16;
    char *qs = malloc(n);
    if (!qs) {
        rc = err_set(err, "out of memory");
        goto done;
    }
    snprintf(qs, n, "Question: %s", q->rq->question);
    rc = add_tokens(r, q, qs, false, false, err);
    free(qs);
    if (rc == 0 && tail[0])
        rc = add_tokens(r, q, tail, false, true, err);
    if (rc)
        goto done;
keys:
    q->n_nodes = 1 + q->n_hits;
    rc = node_keys(r, q, err);
done:
    free(rendered);
    return rc;
}

/* ---- QKV tree ---- */

/* Chunks complete once the prefix up to the end of node i is known. */
static int node_chunks(const rag_query *q, int i)
{
    return i < 0 ? 0 : q->seg_end[i] / KV_CHUNK_TOKENS;
}

/* Loads the longest stored path of q's nodes into seq. */
static int qkv_load(rag *r, rag_query *q, kv_seq *seq, char err[ERR_MAX])
{
    for (int i = 0; i < q->n_nodes; i++) {
        int first = node_chunks(q, i - 1), n = node_chunks(q, i) - first;
        size_t need = (size_t)n * r->chunk_bytes;
        if (need > r->node_cap) {
            uint8_t *b = realloc(r->node_buf, need);
            if (!b)
                return err_set(err, "out of memory");
            r->node_buf = b;
            r->node_cap = need;
        }
        size_t got;
        int n_tok;
        bool found, predicted, mismatch;
        if (store_qkv_get(r->env.st, q->keys[i], node_owner(q, i), q->tokens, q->seg_end[i],
                          r->node_buf, r->node_cap, &got, &n_tok, &predicted, &found,
                          &mismatch, err))
            return -1;
        r->verify_misses += mismatch;
        if (!found)
            break;
        if (got != need || n_tok != n * KV_CHUNK_TOKENS)
            return err_set(err, "QKV node %d of the prompt holds %zu bytes, the prefix needs %zu",
                           i, got, need);
        for (int c = 0; c < n; c++) {
            kv_chunk *k = kv_chunk_new(seq->pool, err);
            if (!k)
                return -1;
            memcpy(k->data, r->node_buf + (size_t)c * r->chunk_bytes, r->chunk_bytes);
            k->n_tokens = KV_CHUNK_TOKENS;
            for (int t = 0; t < KV_CHUNK_TOKENS; t++) {
                int pos = (first + c) * KV_CHUNK_TOKENS + t;
                k->tokens[t] = q->tokens[pos];
                k->positions[t] = pos;
            }
            if (kv_seq_push_chunk(seq, k, err)) {
                kv_chunk_free(seq->pool, k);
                return -1;
            }
        }
        q->nodes_found = i + 1;
        q->reused_tokens = node_chunks(q, i) * KV_CHUNK_TOKENS;
        /* the system prompt's node is every query's of the owner: a passage's counts */
        q->pred_node |= predicted && i > 0;
    }
    return 0;
}

/* Whether every node of q's path is stored. */
static int qkv_whole(rag *r, const rag_query *q, bool *whole, char err[ERR_MAX])
{
    *whole = true;
    for (int i = q->n_nodes - 1; i >= 0 && *whole; i--) {
        bool mismatch;
        if (store_qkv_has(r->env.st, q->keys[i], node_owner(q, i), q->tokens, q->seg_end[i], whole,
                          &mismatch, err))
            return -1;
        r->verify_misses += mismatch;
    }
    return 0;
}

/* Stores the nodes of q's path the tree lacks, from seq. */
static int qkv_store(rag *r, rag_query *q, const kv_seq *seq, char err[ERR_MAX])
{
    for (int i = q->nodes_found; i < q->n_nodes; i++) {
        int first = node_chunks(q, i - 1), n = node_chunks(q, i) - first;
        if (first + n > seq->n_chunks)
            return err_set(err, "the prompt's KV is shorter than its prefix");
        size_t need = (size_t)n * r->chunk_bytes;
        if (need > r->node_cap) {
            uint8_t *b = realloc(r->node_buf, need);
            if (!b)
                return err_set(err, "out of memory");
            r->node_buf = b;
            r->node_cap = need;
        }
        for (int c = 0; c < n; c++) {
            const kv_chunk *k = seq->chunks[first + c];
            if (!k || k->precision != KV_F16 || k->n_tokens != KV_CHUNK_TOKENS)
                return err_set(err, "chunk %d of the prompt is not a full f16 chunk", first + c);
            memcpy(r->node_buf + (size_t)c * r->chunk_bytes, k->data, r->chunk_bytes);
        }
        if (store_qkv_put(r->env.st, q->keys[i], i ? q->keys[i - 1] : NULL, node_owner(q, i),
                          q->tokens, q->seg_end[i], n * KV_CHUNK_TOKENS, r->node_buf, need,
                          q->asker != ASK_REAL, clock_wall_ms(), err))
            return -1;
    }
    const config *cfg = r->env.cfg;
    int own, shared = 0, evicted;
    bool system_shared = q->system_owner.scope != q->owner.scope;
    if (store_qkv_evict_owner(r->env.st, &q->owner, (int64_t)cfg->cache_owner_max_mb << 20,
                              cfg->cache_owner_max_entries, &own, err) ||
        (system_shared &&
         store_qkv_evict_owner(r->env.st, &q->system_owner,
                               (int64_t)cfg->cache_owner_max_mb << 20,
                               cfg->cache_owner_max_entries, &shared, err)) ||
        store_qkv_evict(r->env.st, (int64_t)cfg->qkv_cache_mb << 20, &evicted, err))
        return -1;
    r->qkv_evictions += (uint64_t)own + (uint64_t)shared + (uint64_t)evicted;
    return 0;
}

/* ---- the query ---- */

/* Finds q's passages: the question embedded, a QA answer tried, then the knowledge base
 * searched (a warm-up's passage is given). 0, 1 answered from the QA bank, or -1 with
 * *code and err. */
static int find_passages(rag *r, rag_query *q, uint64_t conn_id, const Llms__Request *req,
                         int64_t warm, Llms__ErrorCode *code, char err[ERR_MAX])
{
    const Llms__RagQueryRequest *rq = q->rq;
    int top_k = rq->has_top_k ? (int)rq->top_k : r->env.cfg->rag_top_k;
    Llms__Retrieval mode = rq->has_retrieval ? rq->retrieval : LLMS__RETRIEVAL__RETRIEVAL_RRF;
    *code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
    if (top_k < 1 || top_k > RAG_MAX_K)
        return err_set(err, "top_k must be 1..%d", RAG_MAX_K);
    if (mode < LLMS__RETRIEVAL__RETRIEVAL_RRF || mode > LLMS__RETRIEVAL__RETRIEVAL_VECTOR)
        return err_set(err, "unknown retrieval %d", (int)mode);
    models_entry *embedder = kb_embedder(r->env.kb, &q->kb, err);
    if (!embedder) {
        *code = LLMS__ERROR_CODE__FAILED_PRECONDITION;
        return -1;
    }
    *code = LLMS__ERROR_CODE__INTERNAL;
    if (q->warm) {
        q->n_hits = 1;
        q->hits[0] = (kb_hit){.id = warm};
        return 0;
    }
    if (!(q->qvec = malloc(sizeof *q->qvec * (size_t)q->kb.dim)))
        return err_set(err, "out of memory");
    if (semantic_embed_now(r->env.sem, embedder, rq->question, q->qvec, err)) {
        *code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
        return -1;
    }
    vdist_normalize(q->qvec, q->kb.dim);
    if (q->asker == ASK_REAL)
        predict_note_query(r->env.pred, &q->kb, rq->question);
    if (q->use_qa) {
        int rc = qa_answer(r, q, conn_id, req, err);
        if (rc != 0)
            return rc;
    }
    return kb_retrieve(r->env.kb, &q->kb, rq->question, q->qvec, top_k, mode, q->hits,
                       &q->n_hits, err);
}

/* Builds q's prompt from its passages' texts, which must fit the window with room to
 * answer; -1 with *code and err. */
static int prompt_from_passages(rag *r, rag_query *q, Llms__ErrorCode *code, char err[ERR_MAX])
{
    char *texts[RAG_MAX_K] = {0};
    int rc = -1, n_ctx = r->env.cfg->n_ctx;
    *code = LLMS__ERROR_CODE__INTERNAL;
    for (int i = 0; i < q->n_hits; i++) {
        int got = load_passage(q, i, q->hits[i].id, q->hits[i].score, &texts[i], err);
        if (got <= 0) {
            if (got == 0)
                err_set(err, "passage %lld vanished", (long long)q->hits[i].id);
            goto out;
        }
    }
    q->retrieve_ms = (double)(clock_mono_ns() - q->t0_ns) / 1e6;
    if (build_prompt(r, q, texts, err))
        goto out;
    if (q->n_tokens >= n_ctx) {
        *code = LLMS__ERROR_CODE__INVALID_ARGUMENT;
        err_set(err, "the prompt (system prompt, %d passages, question) is %d tokens, the "
                     "window is %d: ask for fewer passages (top_k)", q->n_hits, q->n_tokens,
                n_ctx);
        goto out;
    }
    rc = 0;
out:
    for (int i = 0; i < RAG_MAX_K; i++)
        free(texts[i]);
    return rc;
}

/* Puts the stored KV of the longest prefix of q's prompt the QKV tree holds in seq. A bad
 * node costs its reuse, not the query. */
static void reuse_stored_prefix(rag *r, rag_query *q, kv_seq *seq)
{
    char err[ERR_MAX];
    if (qkv_load(r, q, seq, err)) {
        warn("QKV load", err);
        kv_seq_truncate(seq, 0);
        q->nodes_found = 0;
        q->reused_tokens = 0;
    }
    if (q->nodes_found > 1 && q->asker == ASK_REAL) {
        r->qkv_hits++;
        r->qkv_tokens += (uint64_t)q->reused_tokens;
        if (q->pred_node)
            predict_count_hits(r->env.pred, false, true);
    }
}

/* Starts a query of asker; a real one's errors and QA answer go to conn_id, a predicted
 * one's errors to the log. NULL: answered, failed, or (*cached) nothing to compute.
 * warm >= 0: a warm-up of that passage (asker ASK_PREFILL). constrained: the reply must
 * be JSON or a grammar's sentence, which no QA entry's free text stands for. */
static rag_query *start(rag *r, uint64_t conn_id, uint32_t uid, const char *app,
                        const Llms__Request *req, int max_tokens, bool constrained, kv_seq *seq,
                        enum asker asker, int64_t warm, bool *cached)
{
    const config *cfg = r->env.cfg;
    const Llms__RagQueryRequest *rq = req->rag_query;
    char err[ERR_MAX];
    Llms__ErrorCode code = LLMS__ERROR_CODE__INTERNAL;
    rag_query *q = calloc(1, sizeof *q);
    if (!q) {
        err_set(err, "out of memory");
        goto fail;
    }
    r->queries += asker == ASK_REAL;
    q->r = r;
    q->rq = rq;
    q->max_tokens = max_tokens;
    q->asker = asker;
    q->t0_ns = clock_mono_ns();
    q->kb_changes = r->kb_changes;
    q->warm = warm >= 0;
    q->use_qa = !(rq->has_no_qa && rq->no_qa) && r->tau <= 1.0f && asker != ASK_PREFILL &&
                !constrained;
    q->use_qkv = !(rq->has_no_qkv && rq->no_qkv) && cfg->qkv_cache_mb > 0;
    int found = kb_lookup(r->env.kb, uid, app, rq->kb, &q->kb, err);
    if (found <= 0) {
        code = found == 0 ? LLMS__ERROR_CODE__NOT_FOUND : code;
        goto fail;
    }
    if ((size_t)snprintf(q->app, sizeof q->app, "%s", app) >= sizeof q->app) {
        err_set(err, "app name too long");
        goto fail;
    }
    /* the caller's app string need not outlive the query, which populates after it */
    q->kb.app = q->app;
    snprintf(q->scope, sizeof q->scope, "%s", q->kb.share_uid ? STORE_SCOPE_UID : q->app);
    q->owner = (store_owner){uid, q->scope};
    q->system_owner = rq->has_share_system_uid && rq->share_system_uid
                          ? (store_owner){uid, STORE_SCOPE_UID}
                          : q->owner;
    int rc = find_passages(r, q, conn_id, req, warm, &code, err);
    if (rc == 1)
        goto answered;
    if (rc < 0 || prompt_from_passages(r, q, &code, err))
        goto fail;
    if (asker == ASK_PREFILL) {
        bool whole = !q->use_qkv;
        if (q->use_qkv && qkv_whole(r, q, &whole, err))
            goto fail;
        if (whole) {
            q->cached = true;
            goto answered;
        }
    }
    if (q->use_qkv)
        reuse_stored_prefix(r, q, seq);
    return q;
fail:
    if (asker == ASK_REAL)
        reply_error(&r->to, conn_id, req, code, "%s", err);
    else
        warn("predicted query", err);
answered:
    *cached = q && q->cached;
    rag_query_free(q);
    return NULL;
}

rag_query *rag_begin(rag *r, uint64_t conn_id, uint32_t uid, const char *app,
                     const Llms__Request *req, int max_tokens, bool constrained, kv_seq *seq,
                     int64_t queued_ns)
{
    bool cached;
    (void)queued_ns;
    return start(r, conn_id, uid, app, req, max_tokens, constrained, seq, ASK_REAL, -1,
                 &cached);
}

rag_query *rag_begin_predicted(rag *r, uint32_t uid, const char *app, const Llms__Request *req,
                               int max_tokens, const predict_task *t, kv_seq *seq,
                               bool *cached)
{
    /* predicted queries ask for free text */
    if (t->kind == PREDICT_WARM)
        return start(r, 0, uid, app, req, max_tokens, false, seq, ASK_PREFILL, t->passage,
                     cached);
    return start(r, 0, uid, app, req, max_tokens, false, seq,
                 t->decode ? ASK_DECODE : ASK_PREFILL, -1, cached);
}

float rag_tau(const rag *r)
{
    return r->tau;
}

bool rag_qkv_room(rag *r)
{
    char err[ERR_MAX];
    int64_t n;
    if (r->qkv_bytes_stale) {
        if (store_qkv_stats(r->env.st, NULL, &n, &r->qkv_bytes, err))
            return false;
        r->qkv_bytes_stale = false;
    }
    return r->qkv_bytes < ((int64_t)r->env.cfg->qkv_cache_mb << 20) / 10 * 9;
}

int rag_slice_end(const rag_query *q, int from, int step_tokens)
{
    int cut = 0, next = q->n_tokens;
    for (int i = 0; i < q->n_nodes; i++) {
        int end = node_chunks(q, i) * KV_CHUNK_TOKENS;
        if (end > from) {
            next = end;
            break;
        }
        cut = end;
    }
    int end = cut + ((from - cut) / step_tokens + 1) * step_tokens;
    return end < next ? end : next;
}

void rag_result(const rag_query *q, Llms__RagResult *res)
{
    llms__rag_result__init(res);
    res->outcome = q->nodes_found > 1 ? LLMS__RAG_OUTCOME__RAG_QKV_HIT : LLMS__RAG_OUTCOME__RAG_MISS;
    res->n_passages = (size_t)q->n_hits;
    res->passages = (Llms__KbHit **)q->hp;
    res->reused_tokens = (uint32_t)q->reused_tokens;
    res->reused_passages = (uint32_t)(q->nodes_found > 1 ? q->nodes_found - 1 : 0);
    res->retrieve_ms = q->retrieve_ms;
}

/* The cache writes of a generation, in one transaction. */
static int populate(rag *r, rag_query *q, const kv_seq *seq, const char *answer,
                    Llms__StopReason stop, int n_generated, char err[ERR_MAX])
{
    int64_t now = clock_wall_ms();
    for (int i = 0; i < q->nodes_found; i++)
        if (store_qkv_touch(r->env.st, q->keys[i], q->asker == ASK_REAL, now, err))
            return -1;
    if (q->use_qkv && qkv_store(r, q, seq, err))
        return -1;
    /* an answer cut short (cancelled, deadline, shutdown, a full window) is no answer */
    bool whole = stop == LLMS__STOP_REASON__STOP_EOS ||
                 stop == LLMS__STOP_REASON__STOP_MAX_TOKENS ||
                 stop == LLMS__STOP_REASON__STOP_STRING;
    if (q->use_qa && whole && answer[0] && q->kb_changes == r->kb_changes) {
        int64_t ids[RAG_MAX_K];
        int evicted = 0;
        for (int i = 0; i < q->n_hits; i++)
            ids[i] = q->hits[i].id;
        const config *cfg = r->env.cfg;
        int own = 0;
        if (store_qa_put(r->env.st, q->kb.id, q->rq->question, q->qvec, q->kb.dim, answer,
                         (int)stop, n_generated, ids, q->n_hits, q->asker != ASK_REAL, now,
                         err) ||
            store_qa_evict_owner(r->env.st, q->kb.uid, q->kb.app,
                                 (int64_t)cfg->cache_owner_max_mb << 20,
                                 cfg->cache_owner_max_entries, &own, err) ||
            store_qa_evict(r->env.st, (int64_t)cfg->qa_cache_mb << 20, &evicted, err))
            return -1;
        r->qa_evictions += (uint64_t)own + (uint64_t)evicted;
    }
    return 0;
}

void rag_populate(rag *r, rag_query *q, const kv_seq *seq, const char *answer,
                  Llms__StopReason stop, int n_generated)
{
    char err[ERR_MAX];
    r->qkv_bytes_stale = true;
    if (store_cache_begin(r->env.st, err)) {
        warn("cache", err);
        return;
    }
    if (populate(r, q, seq, answer, stop, n_generated, err)) {
        store_kb_rollback(r->env.st);
        store_cache_end(r->env.st);
        warn("cache", err);
        return;
    }
    if (store_cache_commit(r->env.st, err))
        warn("cache", err);
}

uint64_t rag_verify_misses(const rag *r)
{
    return r->verify_misses;
}

/* The owners a Cache or CacheClear acts on (rag.h); 0 with the filters, else the error
 * code with err. */
typedef struct cache_scope {
    store_owner f[2];
    int n;                  /* 0: every owner */
    char app[KB_NAME_MAX + 1];
} cache_scope;

static Llms__ErrorCode cache_scope_of(const Llms__CacheRequest *cr, uint32_t uid,
                                      const char *app, bool admin, cache_scope *cs,
                                      char err[ERR_MAX])
{
    bool all = cr && cr->has_all && cr->all, has_app = cr && cr->app && cr->app[0];
    bool named = all || (cr && cr->has_uid) || has_app;
    if (named && !admin) {
        err_set(err, "another owner's caches: admin call (uid 0 or the admin group)");
        return LLMS__ERROR_CODE__PERMISSION_DENIED;
    }
    if (!named && !app[0]) {
        err_set(err, "name the caches: all, or a uid (and an app)");
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (all && (cr->has_uid || has_app)) {
        err_set(err, "all or an owner, not both");
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (has_app && !cr->has_uid) {
        err_set(err, "an app is named with its uid");
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (all) {
        cs->n = 0;
        return LLMS__ERROR_CODE__OK;
    }
    if (named) {
        uid = cr->uid;
        app = has_app ? cr->app : NULL;
    }
    if (app && (size_t)snprintf(cs->app, sizeof cs->app, "%s", app) >= sizeof cs->app) {
        err_set(err, "an app name is at most %d bytes", KB_NAME_MAX);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    /* an app's caches are its own and those its uid shares */
    cs->f[0] = (store_owner){uid, app ? cs->app : NULL};
    cs->f[1] = (store_owner){uid, STORE_SCOPE_UID};
    cs->n = app ? 2 : 1;
    return LLMS__ERROR_CODE__OK;
}

static int cache_clear(rag *r, const cache_scope *cs, char err[ERR_MAX])
{
    if (cs->n == 0)
        return store_rag_clear(r->env.st, NULL, err);
    if (store_kb_begin(r->env.st, err))
        return -1;
    for (int i = 0; i < cs->n; i++)
        if (store_rag_clear(r->env.st, &cs->f[i], err)) {
            store_kb_rollback(r->env.st);
            return -1;
        }
    return store_kb_commit(r->env.st, err);
}

static int cache_stats(rag *r, const cache_scope *cs, int64_t *qa_n, int64_t *qa_b,
                       int64_t *qkv_n, int64_t *qkv_b, char err[ERR_MAX])
{
    *qa_n = *qa_b = *qkv_n = *qkv_b = 0;
    for (int i = 0; i < (cs->n ? cs->n : 1); i++) {
        const store_owner *f = cs->n ? &cs->f[i] : NULL;
        int64_t a, b, c, d;
        if (store_qa_stats(r->env.st, f, &a, &b, err) ||
            store_qkv_stats(r->env.st, f, &c, &d, err))
            return -1;
        *qa_n += a;
        *qa_b += b;
        *qkv_n += c;
        *qkv_b += d;
    }
    return 0;
}

void rag_handle_cache(rag *r, uint64_t conn_id, uint32_t uid, const char *app, bool admin,
                      const Llms__Request *req)
{
    char err[ERR_MAX];
    cache_scope cs;
    if (req->body_case == LLMS__REQUEST__BODY_CACHE_TUNE) {
        float tau = req->cache_tune->tau_query;
        if (!(tau >= 0.0f && tau <= 2.0f)) {
            reply_error(&r->to, conn_id, req, LLMS__ERROR_CODE__INVALID_ARGUMENT,
                        "tau_query must be 0..2 (above 1: the QA bank is off)");
            return;
        }
        r->tau = tau;
    } else {
        const Llms__CacheRequest *cr = req->body_case == LLMS__REQUEST__BODY_CACHE
                                           ? req->cache : req->cache_clear;
        Llms__ErrorCode code = cache_scope_of(cr, uid, app, admin, &cs, err);
        if (code != LLMS__ERROR_CODE__OK) {
            reply_error(&r->to, conn_id, req, code, "%s", err);
            return;
        }
    }
    if (req->body_case == LLMS__REQUEST__BODY_CACHE_CLEAR) {
        r->qkv_bytes_stale = true;
        if (cache_clear(r, &cs, err)) {
            reply_error(&r->to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
            return;
        }
    }
    if (req->body_case != LLMS__REQUEST__BODY_CACHE) {
        Llms__Empty e = LLMS__EMPTY__INIT;
        Llms__Response resp = LLMS__RESPONSE__INIT;
        resp.id = req->id;
        resp.final = 1;
        resp.body_case = LLMS__RESPONSE__BODY_OK;
        resp.ok = &e;
        reply_send(&r->to, conn_id, &resp, false);
        return;
    }
    int64_t qa_n, qa_b, qkv_n, qkv_b;
    if (cache_stats(r, &cs, &qa_n, &qa_b, &qkv_n, &qkv_b, err)) {
        reply_error(&r->to, conn_id, req, LLMS__ERROR_CODE__INTERNAL, "%s", err);
        return;
    }
    Llms__CacheResponse c = LLMS__CACHE_RESPONSE__INIT;
    c.qa_entries = (uint32_t)qa_n;
    c.qa_bytes = (uint64_t)qa_b;
    c.qkv_nodes = (uint32_t)qkv_n;
    c.qkv_bytes = (uint64_t)qkv_b;
    c.qkv_budget_bytes = (uint64_t)r->env.cfg->qkv_cache_mb << 20;
    Llms__Response resp = LLMS__RESPONSE__INIT;
    resp.id = req->id;
    resp.final = 1;
    resp.body_case = LLMS__RESPONSE__BODY_CACHE;
    resp.cache = &c;
    /* the counters are every owner's together: how often others asked and hit is theirs */
    if (!admin) {
        reply_send(&r->to, conn_id, &resp, false);
        return;
    }
    c.rag_queries = r->queries;
    c.qa_hits = r->qa_hits;
    c.qkv_hits = r->qkv_hits;
    c.qkv_tokens_reused = r->qkv_tokens;
    c.qkv_evictions = r->qkv_evictions;
    predict_stats ps;
    predict_get_stats(r->env.pred, &ps);
    c.has_qa_budget_bytes = c.has_qa_evictions = c.has_tau_query = c.has_tau_scheduler = 1;
    c.qa_budget_bytes = (uint64_t)r->env.cfg->qa_cache_mb << 20;
    c.qa_evictions = r->qa_evictions;
    c.tau_query = r->tau;
    c.tau_scheduler = r->env.cfg->tau_scheduler;
    c.has_predicted = c.has_predict_prefilled = c.has_predict_decoded = 1;
    c.has_predict_preempted = c.has_predict_qa_hits = c.has_predict_qkv_hits = 1;
    c.has_predict_generations = c.has_predict_steps = c.has_predict_ms = 1;
    c.has_predict_queued = c.has_predict_converted = c.has_predict_warmed = 1;
    c.predicted = ps.predicted;
    c.predict_prefilled = ps.prefilled;
    c.predict_decoded = ps.decoded;
    c.predict_preempted = ps.preempted;
    c.has_predict_resumed = 1;
    c.predict_resumed = ps.resumed;
    c.predict_qa_hits = ps.qa_hits;
    c.predict_qkv_hits = ps.qkv_hits;
    c.predict_generations = ps.generations;
    c.predict_steps = ps.steps;
    c.predict_ms = ps.ms;
    c.predict_queued = ps.queued;
    c.predict_converted = ps.converted;
    c.predict_warmed = ps.warmed;
    c.has_qkv_verify_misses = 1;
    c.qkv_verify_misses = r->verify_misses;
    reply_send(&r->to, conn_id, &resp, false);
}
