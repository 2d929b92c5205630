/*
 * rerank.c — the GRATING reranker (see rerank.h).
 *
 * One concern in one file, longer than the house's 1,500 lines: a run is one state
 * machine (render, chunk, then layer by layer: weights, forward, prune) whose stages
 * share the run's chunks, buffers and I/O thread; split by stage, each file would need
 * the whole run struct and half of the others' helpers.
 *
 * A run renders and tokenizes every (query, document) pair, groups the candidates into
 * chunks of at most a memory-limit's worth of tokens, and then goes layer by layer: for
 * each layer its weights are made available (pointers into the mapping, or read into one
 * of two buffers by the I/O thread while the previous layer computes), every chunk with
 * active candidates runs through it, and the provisional score of each active candidate
 * is taken from its last token. Attention needs no KV cache: a candidate's K/V of the
 * current layer are computed for all its tokens at once and each token attends causally
 * within its own candidate only. K and V are rounded through f16 as the KV cache of
 * model.c stores them, so the scores equal those of model_forward.
 *
 * Pruning (cv_threshold > 0), after each layer but the last:
 *   - cv = std / mean of the active candidates' scores (population std); nothing happens
 *     while cv <= cv_threshold;
 *   - otherwise the active scores are clustered with 1-D k-means, k = ceil(sqrt(active))
 *     (kmeans1d_k), centres initialised at quantiles;
 *   - the boundary cluster is the one holding the `need`-th best active candidate, where
 *     need = top_k minus the candidates already selected;
 *   - clusters below it are dropped; in RERANK_SET clusters above it are selected (they
 *     stop, keeping their current score) and the boundary cluster continues; when the
 *     selected plus the still active candidates are exactly top_k, all of them are
 *     selected and the run ends. RERANK_ORDERED only drops, so the winners run every
 *     layer and their order and scores are those of the full forward.
 * The result is the non-dropped candidates sorted by score (ties by index), best first.
 * (So in RERANK_SET with top_k >= n_docs every candidate is selected after the first
 * layer: membership is all that mode promises.)
 *
 * Reranker prompt: the GGUF metadata key "tokenizer.chat_template.rerank" when present,
 * else RR_DEFAULT_PROMPT (the Qwen3-Reranker format). Placeholders "{query}",
 * "{document}" and "{instruction}" (RR_DEFAULT_INSTRUCTION) are replaced; template text
 * is tokenized with special tokens recognised, query and document text without (so a
 * document cannot inject "<|im_end|>"); BOS is prepended when the model adds one. Each
 * piece is tokenized on its own, so the document's tokens can be cut from its end to fit
 * the model's trained context without changing the others; the template's text after
 * {document} (the question the answer token answers) is never cut.
 *
 * Memory: the hidden states of all candidates (tokens x dim floats) live in their
 * chunks' buffers while their sum is within memory_limit or there are at most three
 * chunks; otherwise they live in an unlinked temporary file in the caller's scratch_dir
 * (in memory when it gave none) and pass through three rotating buffers: one computing,
 * one being read back for the next chunk, one being written out. With stream_weights,
 * token embedding rows come from an LRU cache of 10% of the vocabulary (rows kept in the
 * file's type), read with pread on a miss.
 *
 * Encoders (a bert file with a classification head) take their own path through the
 * same task and pruning: a pair is [CLS] query [SEP] document [SEP] (segment B from the
 * first [SEP] on), or <s> query </s></s> document </s> for RoBERTa's vocabularies, the
 * document cut so that the pair fits RR_ENC_MAX_LEN and the
 * model's positions; all candidates' rows live in one buffer, compacted to the active
 * ones after each pruning; each step computes one layer over groups of whole candidates
 * (engine/encoder/bert.h), and after each layer (only the last without pruning) the score of a
 * candidate is sigmoid of the head's first output on its [CLS] row — the intermediate
 * exits of the GRATING paper. Weights are mapped (stream_weights does not apply).
 */
#include "engine/encoder/rerank.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "engine/clock.h"
#include "engine/encoder/bert.h"
#include "engine/quant/blas.h"
#include "engine/gguf/gguf.h"
#include "engine/ioq.h"
#include "engine/encoder/kmeans1d.h"
#include "engine/model/model.h"
#include "engine/model/ops.h"
#include "engine/quant/quant.h"
#include "engine/threadpool.h"
#include "engine/tok/tokenizer.h"

#define RR_DEFAULT_CV 0.2f
#define RR_DEFAULT_MEMORY ((size_t)64 << 20)
/* Query rows per attention work item: bounds the per-thread score block. */
#define RR_QBLOCK 64
/* Embedding rows cached in streaming mode: a tenth of the vocabulary. */
#define RR_CACHE_FRACTION 10
/* Longest decoder pair whatever context length the file claims: a layer holds a pair's
 * K and V and rows of its attention scores all at once. */
#define RR_MAX_TOKENS (1 << 20)
/* Longest encoder pair, as cross-encoders are trained (max_length 512): also the rows of
 * the encoder's runner, so one step computes at most this many rows per group. */
#define RR_ENC_MAX_LEN 512
/* Candidates whose [CLS] rows go through the head in one product. */
#define RR_ENC_BATCH 64
#define RR_META_PROMPT "tokenizer.chat_template.rerank"
#define RR_DEFAULT_INSTRUCTION \
    "Given a web search query, retrieve relevant passages that answer the query"
#define RR_DEFAULT_PROMPT                                                                    \
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the "   \
    "Query and the Instruct provided. Note that the answer can only be \"yes\" or "        \
    "\"no\".<|im_end|>\n<|im_start|>user\n<Instruct>: {instruction}\n<Query>: {query}\n"  \
    "<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"

enum { RR_WQ, RR_WK, RR_WV, RR_WO, RR_GATE, RR_UP, RR_DOWN, RR_N_MAT };

static const char *const rr_mat_names[RR_N_MAT] = {
    "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
    "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight",
};

typedef struct rr_layer {
    const gguf_tensor *mat[RR_N_MAT];
    size_t buf_off[RR_N_MAT]; /* where each matrix goes in a streaming buffer */
    const float *attn_norm;   /* (dim) */
    const float *ffn_norm;    /* (dim) */
    model_qkv_extras extras;  /* q/k/v biases (qwen2), q/k norms (qwen3) */
} rr_layer;

/* LRU cache of token embedding rows in the file's type (streaming mode). */
typedef struct rr_cache {
    int cap, used;
    char *rows;      /* (cap, row_bytes) */
    int32_t *token;  /* (cap) token of each slot */
    int32_t *slot;   /* (n_vocab) slot of each token, -1 when not cached */
    int *prev, *next; /* (cap) recency list, most recent at head */
    int head, tail;
} rr_cache;

struct reranker {
    rerank_options opt;   /* its scratch_dir is scratch_dir */
    char *scratch_dir;    /* the offload file's directory (owned); NULL: no offload */
    gguf_file *g;
    int fd;               /* the model file, for pread */
    model_hparams hp;
    float *rope_freqs;    /* (head_dim/2) RoPE frequency divisors (owned), or NULL */
    int q_dim, kv_dim;
    tokenizer *tok;
    tp_pool *pool;
    ioq *io;
    rr_layer *layers;     /* (n_layer) */
    float *vecs;          /* every 1-D tensor as f32 */
    size_t vecs_bytes;
    const float *out_norm; /* (dim) */
    const gguf_tensor *embd, *output;
    size_t embd_row_bytes, out_row_bytes;
    size_t layer_bytes;   /* one streaming buffer: the largest layer's matrices */
    char *prompt;         /* reranker template, NUL-terminated */
    rr_cache cache;
    size_t cache_bytes;
    /* accounting of this reranker's allocations */
    size_t bytes_now, bytes_peak;
    /* an encoder reranker (NULL for decoders) */
    bert_model *enc;
    bert_runner *enc_r;
    /* Longest pair: a decoder's trained context (scores at later positions are noise),
     * at most RR_MAX_TOKENS; an encoder's min(n_pos, RR_ENC_MAX_LEN). */
    int max_len;
    /* An encoder's pair: enc_cls query enc_mid[0..n_enc_mid) document enc_end, as
     * [CLS] q [SEP] d [SEP] (BERT) or <s> q </s></s> d </s> (RoBERTa, XLM-RoBERTa). */
    int32_t enc_cls, enc_mid[2], enc_end;
    int n_enc_mid;
};

/* ---- accounted allocations ---- */

/* Buffers from this size up are mapped directly, so that freeing them always returns
 * the memory (malloc would keep freed blocks below its growing mmap threshold in the
 * heap, and the resident set would grow from run to run). */
#define RR_MMAP_MIN ((size_t)1 << 20)

static size_t rr_round(size_t n)
{
    return n ? (n + 63) & ~(size_t)63 : 64;
}

static void *rr_alloc(reranker *rr, size_t n)
{
    size_t a = rr_round(n);
    void *p;
    if (a >= RR_MMAP_MIN) {
        p = mmap(NULL, a, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
    } else if (!(p = aligned_alloc(64, a))) {
        return NULL;
    }
    rr->bytes_now += a;
    if (rr->bytes_now > rr->bytes_peak)
        rr->bytes_peak = rr->bytes_now;
    return p;
}

/* Frees what rr_alloc(rr, n) returned (the same n). NULL is allowed. */
static void rr_free(reranker *rr, void *p, size_t n)
{
    if (!p)
        return;
    size_t a = rr_round(n);
    rr->bytes_now -= a;
    if (a >= RR_MMAP_MIN)
        munmap(p, a);
    else
        free(p);
}

/* ---- file access ---- */

static off_t rr_file_off(const reranker *rr, const gguf_tensor *t)
{
    return (off_t)(gguf_data_offset(rr->g) + t->offset);
}

static int rr_pread(int fd, void *buf, size_t len, off_t off, char err[ERR_MAX])
{
    size_t pos = 0;
    while (pos < len) {
        ssize_t r = pread(fd, (char *)buf + pos, len - pos, off + (off_t)pos);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return err_set(err, "reading the model: %s", r < 0 ? strerror(errno) : "short read");
        pos += (size_t)r;
    }
    return 0;
}

/* Row `row` of a 2-D tensor as f32, read from the file (the mapping is not touched). */
static int rr_read_row(reranker *rr, const gguf_tensor *t, int64_t row, float *dst,
                       char err[ERR_MAX])
{
    size_t rb = quant_row_bytes(t->type, t->ne[0]);
    char *tmp = malloc(rb);
    if (!tmp)
        return err_set(err, "out of memory");
    int rc = rr_pread(rr->fd, tmp, rb, rr_file_off(rr, t) + (off_t)(row * (int64_t)rb), err);
    if (rc == 0)
        quant_dequantize_row(t->type, tmp, dst, t->ne[0]);
    free(tmp);
    return rc;
}

/* ---- opening ---- */

rerank_options rerank_default_options(void)
{
    return (rerank_options){.top_k = 5, .mode = RERANK_SET, .cv_threshold = RR_DEFAULT_CV,
                            .memory_limit = 0, .scratch_dir = NULL, .max_chunk_tokens = 0,
                            .stream_weights = true, .yes_token = -1,
                            .no_token = -1, .n_threads = 0};
}

/* Reads the 1-D tensors into rr->vecs. */
static int rr_load_vectors(reranker *rr, char err[ERR_MAX])
{
    const model_hparams *hp = &rr->hp;
    bool qwen2 = hp->arch == MODEL_ARCH_QWEN2, qwen3 = hp->arch == MODEL_ARCH_QWEN3;
    size_t per_layer = 2 * (size_t)hp->dim + (qwen2 ? (size_t)rr->q_dim + 2 * rr->kv_dim : 0) +
                       (qwen3 ? 2 * (size_t)hp->head_dim : 0);
    size_t n = (size_t)hp->dim + (size_t)hp->n_layer * per_layer;
    rr->vecs_bytes = n * sizeof(float);
    rr->vecs = rr_alloc(rr, rr->vecs_bytes);
    if (!rr->vecs)
        return err_set(err, "out of memory");
    float *p = rr->vecs;
    /* model_from_gguf validated presence, types and shapes of all of these */
#define VEC(name, len, dst)                                                      \
    do {                                                                         \
        const gguf_tensor *t_ = gguf_find_tensor(rr->g, name);                   \
        if (!t_ || rr_read_row(rr, t_, 0, p, err) < 0)                           \
            return err_set(err, "tensor '%s': cannot be read", name);            \
        (dst) = p;                                                               \
        p += (len);                                                              \
    } while (0)
    VEC("output_norm.weight", hp->dim, rr->out_norm);
    for (int l = 0; l < hp->n_layer; l++) {
        rr_layer *L = &rr->layers[l];
        char name[96];
#define NAME(s) (snprintf(name, sizeof name, "blk.%d." s, l), name)
        VEC(NAME("attn_norm.weight"), hp->dim, L->attn_norm);
        VEC(NAME("ffn_norm.weight"), hp->dim, L->ffn_norm);
        if (qwen2) {
            VEC(NAME("attn_q.bias"), rr->q_dim, L->extras.bq);
            VEC(NAME("attn_k.bias"), rr->kv_dim, L->extras.bk);
            VEC(NAME("attn_v.bias"), rr->kv_dim, L->extras.bv);
        }
        if (qwen3) {
            VEC(NAME("attn_q_norm.weight"), hp->head_dim, L->extras.q_norm);
            VEC(NAME("attn_k_norm.weight"), hp->head_dim, L->extras.k_norm);
        }
        size_t off = 0;
        for (int i = 0; i < RR_N_MAT; i++) {
            snprintf(name, sizeof name, "blk.%d.%s", l, rr_mat_names[i]);
            L->mat[i] = gguf_find_tensor(rr->g, name);
            if (!L->mat[i])
                return err_set(err, "tensor '%s' is missing", name);
            L->buf_off[i] = off;
            off += (L->mat[i]->bytes + 63) & ~(size_t)63;
        }
        if (off > rr->layer_bytes)
            rr->layer_bytes = off;
#undef NAME
    }
#undef VEC
    return 0;
}

static int rr_load_prompt(reranker *rr, char err[ERR_MAX])
{
    gguf_str s;
    const char *src = RR_DEFAULT_PROMPT;
    size_t len = strlen(src);
    if (gguf_get_str(rr->g, RR_META_PROMPT, &s)) {
        src = s.ptr;
        len = (size_t)s.len;
    }
    rr->prompt = malloc(len + 1);
    if (!rr->prompt)
        return err_set(err, "out of memory");
    memcpy(rr->prompt, src, len);
    rr->prompt[len] = 0;
    /* {document} once: its tokens are what rr_render cuts to fit the window */
    const char *doc = strstr(rr->prompt, "{document}");
    if (strlen(rr->prompt) != len || !strstr(rr->prompt, "{query}") || !doc ||
        strstr(doc + 1, "{document}"))
        return err_set(err, "%s: the template must contain {query}, and {document} once",
                       RR_META_PROMPT);
    return 0;
}

void rerank_close(reranker *rr)
{
    if (!rr)
        return;
    ioq_free(rr->io);
    tp_free(rr->pool);
    bert_runner_free(rr->enc_r);
    bert_free(rr->enc);
    tok_free(rr->tok);
    rr_cache *c = &rr->cache;
    free(c->rows);
    free(c->token);
    free(c->slot);
    free(c->prev);
    free(c->next);
    rr_free(rr, rr->vecs, rr->vecs_bytes);
    free(rr->layers);
    free(rr->prompt);
    free(rr->rope_freqs);
    free(rr->scratch_dir);
    if (rr->fd >= 0)
        close(rr->fd);
    gguf_close(rr->g);
    free(rr);
}

/* The page-aligned span of the mapping holding the tensor data (gguf_open maps the file
 * read-only and private, so advice on it never changes what is read there). */
static size_t rr_data_span(const gguf_file *g, void **from)
{
    if (gguf_n_tensors(g) == 0)
        return 0;
    const gguf_tensor *t0 = gguf_tensor_at(g, 0);
    const char *base = (const char *)t0->data - t0->offset;
    uint64_t end = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (t->offset + t->bytes > end)
            end = t->offset + t->bytes;
    }
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)base & ~(page - 1);
    *from = (void *)start;
    return (size_t)((uintptr_t)base + end - start);
}

/* The rest of rerank_open for a bert file: the model with its head, tokenizer, runner. */
static int rr_open_encoder(reranker *rr, char err[ERR_MAX])
{
    if (!(rr->enc = bert_from_gguf(rr->g, err)))
        return -1;
    const bert_hparams *hp = bert_hparams_of(rr->enc);
    if (hp->n_cls_out < 1)
        return err_set(err, "the bert model has no classification head (cls.output): an "
                            "embedding model, not a reranker");
    rr->hp = (model_hparams){.n_vocab = hp->n_vocab, .dim = hp->dim, .n_layer = hp->n_layer,
                             .n_head = hp->n_head, .n_head_kv = hp->n_head,
                             .head_dim = hp->head_dim, .n_ff = hp->n_ff, .n_ctx = hp->n_pos,
                             .rope_scaling = OPS_ROPE_UNSCALED};
    rr->max_len = hp->n_pos < RR_ENC_MAX_LEN ? hp->n_pos : RR_ENC_MAX_LEN;
    if (tok_load(rr->g, &rr->tok, err) < 0)
        return -1;
    rr->enc_cls = tok_special(rr->tok, TOK_SPECIAL_CLS);
    int32_t sep = tok_special(rr->tok, TOK_SPECIAL_SEP), eos = tok_eos(rr->tok);
    if (rr->enc_cls < 0 || sep < 0)
        return err_set(err, "the bert vocabulary has no [CLS] or [SEP] token");
    /* A vocabulary that ends a text with EOS (RoBERTa's) ends the query with it too and
     * then separates, as Hugging Face's pairs and llama.cpp's rerank do. */
    bool roberta = tok_add_eos(rr->tok) && eos >= 0;
    rr->n_enc_mid = 0;
    if (roberta)
        rr->enc_mid[rr->n_enc_mid++] = eos;
    rr->enc_mid[rr->n_enc_mid++] = sep;
    rr->enc_end = roberta ? eos : sep;
    rr->enc_r = bert_runner_new(rr->enc, rr->opt.n_threads, RR_ENC_MAX_LEN, err);
    return rr->enc_r ? 0 : -1;
}

reranker *rerank_open(const char *model_path, const rerank_options *options, char err[ERR_MAX])
{
    if (!model_path) {
        err_set(err, "no model path");
        return NULL;
    }
    reranker *rr = calloc(1, sizeof *rr);
    if (!rr) {
        err_set(err, "out of memory");
        return NULL;
    }
    rr->fd = -1;
    rr->opt = options ? *options : rerank_default_options();
    if (rr->opt.scratch_dir && *rr->opt.scratch_dir &&
        !(rr->scratch_dir = strdup(rr->opt.scratch_dir))) {
        err_set(err, "out of memory");
        goto fail;
    }
    rr->opt.scratch_dir = rr->scratch_dir;
    /* The file is mapped (gguf reads its header there) but, apart from the metadata,
     * never touched: every tensor byte is read with pread. */
    rr->g = gguf_open(model_path, err);
    if (!rr->g)
        goto fail;
    if (bert_is_encoder(rr->g))
        return rr_open_encoder(rr, err) < 0 ? (rerank_close(rr), NULL) : rr;
    rr->fd = open(model_path, O_RDONLY | O_CLOEXEC);
    if (rr->fd < 0) {
        err_set(err, "%s: %s", model_path, strerror(errno));
        goto fail;
    }
    /* model_from_gguf validates the file and reads the 1-D tensors through the mapping:
     * without streaming that is how the weights are used anyway; with it, small pages keep
     * those touches small, and afterwards the pages go back so that the resident set holds
     * only what the reranker allocates (clean file pages: reading them again is exact) */
    void *span_from = NULL;
    size_t span = rr_data_span(rr->g, &span_from);
    if (span && rr->opt.stream_weights)
        madvise(span_from, span, MADV_NOHUGEPAGE);
    model *m = model_from_gguf(rr->g, err);
    if (!m)
        goto fail;
    rr->hp = *model_hparams_of(m);
    if ((rr->hp.arch != MODEL_ARCH_LLAMA && rr->hp.arch != MODEL_ARCH_QWEN2 &&
         rr->hp.arch != MODEL_ARCH_QWEN3) || rr->hp.n_expert) {
        /* the reranker's own forward has no embedding scale, GeGLU, post norms, soft-caps,
         * windows, fused matrices, Granite's scales nor experts */
        err_set(err, "%s: reranking with a %s model is not supported (llama, qwen2 and qwen3 "
                     "decoders rerank)", model_path, model_arch_name(rr->hp.arch));
        model_free(m);
        goto fail;
    }
    rr->max_len = rr->hp.n_ctx < RR_MAX_TOKENS ? rr->hp.n_ctx : RR_MAX_TOKENS;
    const float *rope_freqs = model_rope_freqs(m);
    size_t freqs_bytes = sizeof *rr->rope_freqs * (size_t)(rr->hp.rope_dims / 2);
    if (rope_freqs && (rr->rope_freqs = malloc(freqs_bytes)))
        memcpy(rr->rope_freqs, rope_freqs, freqs_bytes);
    model_free(m);
    if (rope_freqs && !rr->rope_freqs) {
        err_set(err, "out of memory");
        goto fail;
    }
    if (span)
        madvise(span_from, span, MADV_DONTNEED);
    rr->q_dim = rr->hp.n_head * rr->hp.head_dim;
    rr->kv_dim = rr->hp.n_head_kv * rr->hp.head_dim;
    rr->embd = gguf_find_tensor(rr->g, "token_embd.weight");
    rr->output = gguf_find_tensor(rr->g, "output.weight");
    if (!rr->output)
        rr->output = rr->embd;
    rr->embd_row_bytes = quant_row_bytes(rr->embd->type, rr->hp.dim);
    rr->out_row_bytes = quant_row_bytes(rr->output->type, rr->hp.dim);
    rr->layers = calloc((size_t)rr->hp.n_layer, sizeof *rr->layers);
    if (!rr->layers) {
        err_set(err, "out of memory");
        goto fail;
    }
    if (rr_load_vectors(rr, err) < 0 || rr_load_prompt(rr, err) < 0)
        goto fail;
    if (tok_load(rr->g, &rr->tok, err) < 0)
        goto fail;
    if (ops_init(err) < 0)
        goto fail;
    rr->pool = tp_new(rr->opt.n_threads, err);
    if (!rr->pool)
        goto fail;
    rr->io = ioq_new(err);
    if (!rr->io)
        goto fail;
    return rr;
fail:
    rerank_close(rr);
    return NULL;
}

/* ---- embedding rows ---- */

static int rr_cache_init(reranker *rr, char err[ERR_MAX])
{
    rr_cache *c = &rr->cache;
    if (c->rows)
        return 0;
    int n_vocab = rr->hp.n_vocab;
    c->cap = n_vocab / RR_CACHE_FRACTION > 1 ? n_vocab / RR_CACHE_FRACTION : 1;
    c->rows = malloc((size_t)c->cap * rr->embd_row_bytes);
    c->token = malloc((size_t)c->cap * sizeof *c->token);
    c->slot = malloc((size_t)n_vocab * sizeof *c->slot);
    c->prev = malloc((size_t)c->cap * sizeof *c->prev);
    c->next = malloc((size_t)c->cap * sizeof *c->next);
    if (!c->rows || !c->token || !c->slot || !c->prev || !c->next) {
        free(c->rows);
        free(c->token);
        free(c->slot);
        free(c->prev);
        free(c->next);
        memset(c, 0, sizeof *c);
        return err_set(err, "out of memory for the embedding cache");
    }
    for (int i = 0; i < n_vocab; i++)
        c->slot[i] = -1;
    c->used = 0;
    c->head = c->tail = -1;
    rr->cache_bytes = (size_t)c->cap * (rr->embd_row_bytes + 3 * sizeof(int)) +
                      (size_t)n_vocab * sizeof(int32_t);
    rr->bytes_now += rr->cache_bytes;
    if (rr->bytes_now > rr->bytes_peak)
        rr->bytes_peak = rr->bytes_now;
    return 0;
}

static void rr_cache_unlink(rr_cache *c, int s)
{
    if (c->prev[s] >= 0)
        c->next[c->prev[s]] = c->next[s];
    else
        c->head = c->next[s];
    if (c->next[s] >= 0)
        c->prev[c->next[s]] = c->prev[s];
    else
        c->tail = c->prev[s];
}

static void rr_cache_push_front(rr_cache *c, int s)
{
    c->prev[s] = -1;
    c->next[s] = c->head;
    if (c->head >= 0)
        c->prev[c->head] = s;
    c->head = s;
    if (c->tail < 0)
        c->tail = s;
}

/* The embedding of token tok as f32 into dst. */
static int rr_embed(reranker *rr, bool stream, int32_t tok, float *dst, char err[ERR_MAX])
{
    const gguf_tensor *t = rr->embd;
    if (!stream) {
        quant_dequantize_row(t->type, (const char *)t->data + (size_t)tok * rr->embd_row_bytes,
                             dst, rr->hp.dim);
        return 0;
    }
    rr_cache *c = &rr->cache;
    int s = c->slot[tok];
    if (s >= 0) {
        rr_cache_unlink(c, s);
    } else {
        bool fresh = c->used < c->cap;
        if (fresh) {
            s = c->used++;
        } else {
            s = c->tail;
            rr_cache_unlink(c, s);
            if (c->token[s] >= 0)
                c->slot[c->token[s]] = -1;
        }
        char *row = c->rows + (size_t)s * rr->embd_row_bytes;
        if (rr_pread(rr->fd, row, rr->embd_row_bytes,
                     rr_file_off(rr, t) + (off_t)((size_t)tok * rr->embd_row_bytes), err) < 0) {
            /* the slot holds nothing now: unused, or first in line for eviction */
            if (fresh) {
                c->used--;
            } else {
                c->token[s] = -1;
                c->next[s] = -1;
                c->prev[s] = c->tail;
                if (c->tail >= 0)
                    c->next[c->tail] = s;
                else
                    c->head = s;
                c->tail = s;
            }
            return -1;
        }
        c->token[s] = tok;
        c->slot[tok] = s;
    }
    rr_cache_push_front(c, s);
    quant_dequantize_row(t->type, c->rows + (size_t)s * rr->embd_row_bytes, dst, rr->hp.dim);
    return 0;
}

/* ---- one run ---- */

enum rr_state { RR_ACTIVE, RR_SELECTED, RR_DROPPED };

typedef struct rr_cand {
    const int32_t *tok;
    int len;
    enum rr_state state;
    int layers;
    float score;
} rr_cand;

typedef struct rr_chunk {
    int n_cand;
    int *cand;     /* (n_cand) candidates in the order their rows are stored */
    int n_tok;     /* rows stored */
    int cap_tok;   /* rows at the start (the file region's size) */
    float *mem;    /* (cap_tok, dim) when the hidden states stay in memory */
    off_t file_off;
} rr_chunk;

typedef struct rr_run {
    reranker *rr;
    const rerank_options *o;
    bool stream;
    int n;
    rr_cand *cand;
    int max_len;
    float *rope;    /* (max_len, head_dim) cos/sin of every position */
    float *yes_no;  /* (2, dim) output rows of the yes and no tokens */

    /* chunks */
    int n_chunks;
    rr_chunk *chunks;
    int cap_tok;    /* largest chunk */
    bool offload;
    int tmp_fd;
    float *slot[3];  /* (cap_tok, dim) rotating buffers when offloaded */
    uint64_t slot_ticket[3];

    /* weights of the layer being computed */
    char *wbuf[2];   /* streaming buffers (layer_bytes each) */
    uint64_t wticket[2];
    ops_matrix W[RR_N_MAT];
    const rr_layer *L;

    /* scratch for one chunk of cap_tok rows */
    float *xn, *q, *k, *v, *att, *proj, *gate, *up; /* (cap_tok, dim/q_dim/kv_dim/n_ff) */
    float *sc;      /* (n_threads, RR_QBLOCK, max_len) attention scores */
    uint16_t *h16;  /* (n_threads, kv_dim) f16 rounding of K/V */
    void *mm;       /* ops_matmul scratch */
    int32_t *pos;   /* (cap_tok) position of each row */
    int *row0;      /* (n + 1) first row of each candidate of the chunk being computed */
    int *blk0;      /* (n + 1) first attention block of each candidate of the chunk */
    size_t scratch_bytes;

    /* the chunk being computed */
    float *x;       /* (n_tok, dim) its hidden states */
    int n_tok;
    int nc;
    const float *norm_w;
    _Atomic long next_item;
} rr_run;

static void rr_norm_job(void *p, int ith, int nth)
{
    rr_run *s = p;
    const model_hparams *hp = &s->rr->hp;
    long b, e;
    tp_split(s->n_tok, ith, nth, &b, &e);
    for (long t = b; t < e; t++)
        ops_rmsnorm(s->xn + t * hp->dim, s->x + t * hp->dim, s->norm_w, hp->dim, hp->norm_eps);
}

/* Biases, q/k norms and RoPE; K and V rounded through f16 as the KV cache stores them. */
static void rr_qkv_job(void *p, int ith, int nth)
{
    rr_run *s = p;
    const reranker *rr = s->rr;
    const model_hparams *hp = &rr->hp;
    const rr_layer *L = s->L;
    int hd = hp->head_dim, q_dim = rr->q_dim, kv_dim = rr->kv_dim;
    uint16_t *h16 = s->h16 + (size_t)ith * kv_dim;
    long b, e;
    tp_split(s->n_tok, ith, nth, &b, &e);
    for (long t = b; t < e; t++) {
        float *q = s->q + t * q_dim, *k = s->k + t * kv_dim, *v = s->v + t * kv_dim;
        model_qkv_finish(hp, &L->extras, s->rope + (size_t)s->pos[t] * hd, s->pos[t], q, k, v);
        ops_f32_to_f16(h16, k, kv_dim);
        quant_dequantize_row(QTYPE_F16, h16, k, kv_dim);
        ops_f32_to_f16(h16, v, kv_dim);
        quant_dequantize_row(QTYPE_F16, h16, v, kv_dim);
    }
}

/* One item: (block of RR_QBLOCK query rows of one candidate, head). Causal attention
 * within the candidate with two sgemms. */
static void rr_attn_job(void *p, int ith, int nth)
{
    rr_run *s = p;
    const reranker *rr = s->rr;
    const model_hparams *hp = &rr->hp;
    int hd = hp->head_dim, group = hp->n_head / hp->n_head_kv;
    int ld_q = rr->q_dim, ld_kv = rr->kv_dim;
    float scale = 1.0f / sqrtf((float)hd);
    float *sc = s->sc + (size_t)ith * RR_QBLOCK * s->max_len;
    long n_items = (long)s->blk0[s->nc] * hp->n_head, item;
    int c = 0;
    (void)nth;
    while ((item = atomic_fetch_add_explicit(&s->next_item, 1, memory_order_relaxed)) < n_items) {
        int h = (int)(item % hp->n_head), blk = (int)(item / hp->n_head);
        if (blk < s->blk0[c])
            c = 0;
        while (s->blk0[c + 1] <= blk)
            c++;
        int len = s->row0[c + 1] - s->row0[c];
        int t0 = (blk - s->blk0[c]) * RR_QBLOCK;
        int nt = len - t0 < RR_QBLOCK ? len - t0 : RR_QBLOCK;
        int nv = t0 + nt;
        size_t r0 = (size_t)s->row0[c];
        const float *q = s->q + (r0 + t0) * ld_q + (size_t)h * hd;
        const float *k = s->k + r0 * ld_kv + (size_t)(h / group) * hd;
        const float *v = s->v + r0 * ld_kv + (size_t)(h / group) * hd;
        blas_sgemm(true, nt, nv, hd, scale, q, ld_q, k, ld_kv, 0.0f, sc, s->max_len);
        for (int t = 0; t < nt; t++) {
            float *row = sc + (size_t)t * s->max_len;
            for (int j = t0 + t + 1; j < nv; j++)
                row[j] = -INFINITY;
            ops_softmax(row, nv);
        }
        blas_sgemm(false, nt, hd, nv, 1.0f, sc, s->max_len, v, ld_kv, 0.0f,
                   s->att + (r0 + t0) * ld_q + (size_t)h * hd, ld_q);
    }
}

static void rr_act_job(void *p, int ith, int nth)
{
    rr_run *s = p;
    int n_ff = s->rr->hp.n_ff;
    long b, e;
    tp_split(s->n_tok, ith, nth, &b, &e);
    for (long t = b; t < e; t++)
        ops_silu_mul(s->gate + t * n_ff, s->up + t * n_ff, n_ff);
}

/* Runs the current layer over the chunk set up in s (x, n_tok, nc, row0). */
static void rr_layer_forward(rr_run *s)
{
    reranker *rr = s->rr;
    int dim = rr->hp.dim, n = s->n_tok;
    for (int c = 0; c < s->nc; c++) {
        int len = s->row0[c + 1] - s->row0[c];
        s->blk0[c + 1] = s->blk0[c] + (len + RR_QBLOCK - 1) / RR_QBLOCK;
        for (int t = 0; t < len; t++)
            s->pos[s->row0[c] + t] = t;
    }
    s->norm_w = s->L->attn_norm;
    tp_run(rr->pool, rr_norm_job, s);
    const ops_matrix *qkv[] = {&s->W[RR_WQ], &s->W[RR_WK], &s->W[RR_WV]};
    float *qkv_out[] = {s->q, s->k, s->v};
    ops_matmul_n(rr->pool, 3, qkv, s->xn, n, qkv_out, s->mm);
    tp_run(rr->pool, rr_qkv_job, s);
    atomic_store_explicit(&s->next_item, 0, memory_order_relaxed);
    tp_run(rr->pool, rr_attn_job, s);
    ops_matmul(rr->pool, &s->W[RR_WO], s->att, n, s->proj, s->mm);
    ops_add(s->x, s->proj, n * dim);

    s->norm_w = s->L->ffn_norm;
    tp_run(rr->pool, rr_norm_job, s);
    const ops_matrix *gu[] = {&s->W[RR_GATE], &s->W[RR_UP]};
    float *gu_out[] = {s->gate, s->up};
    ops_matmul_n(rr->pool, 2, gu, s->xn, n, gu_out, s->mm);
    tp_run(rr->pool, rr_act_job, s);
    ops_matmul(rr->pool, &s->W[RR_DOWN], s->gate, n, s->proj, s->mm);
    ops_add(s->x, s->proj, n * dim);
}

/* sigmoid(yes - no) of the final-norm'd row h. */
static float rr_score(const rr_run *s, const float *h, float *tmp)
{
    const reranker *rr = s->rr;
    int dim = rr->hp.dim;
    ops_rmsnorm(tmp, h, rr->out_norm, dim, rr->hp.norm_eps);
    double y = 0, no = 0;
    for (int i = 0; i < dim; i++) {
        y += (double)tmp[i] * s->yes_no[i];
        no += (double)tmp[i] * s->yes_no[dim + i];
    }
    return (float)(1.0 / (1.0 + exp(-(y - no))));
}

/* ---- chunks and their hidden states ---- */

static int rr_make_chunks(rr_run *s, size_t limit, char err[ERR_MAX])
{
    reranker *rr = s->rr;
    const model_hparams *hp = &rr->hp;
    int nt = tp_n_threads(rr->pool);
    int max_cols = hp->dim > hp->n_ff ? hp->dim : hp->n_ff;
    if (rr->q_dim > max_cols)
        max_cols = rr->q_dim;
    /* activations per row: xn, q, k, v, att, proj, gate, up, plus the row's own hidden
     * state, plus matmul scratch */
    size_t per_tok = 4 * (3 * (size_t)hp->dim + 2 * (size_t)rr->q_dim + 2 * (size_t)rr->kv_dim +
                          2 * (size_t)hp->n_ff) +
                     ops_matmul_scratch_bytes(1, max_cols, nt);
    long cap = (long)(limit / per_tok);
    if (s->o->max_chunk_tokens > 0 && cap > s->o->max_chunk_tokens)
        cap = s->o->max_chunk_tokens;
    if (cap < s->max_len)
        cap = s->max_len;
    s->chunks = calloc((size_t)s->n, sizeof *s->chunks);
    int *cands = malloc((size_t)s->n * sizeof *cands);
    if (!s->chunks || !cands) {
        free(cands);
        return err_set(err, "out of memory");
    }
    s->n_chunks = 0;
    s->cap_tok = 0;
    int cur_tok = 0;
    for (int i = 0; i < s->n; i++) {
        rr_chunk *ch = s->n_chunks ? &s->chunks[s->n_chunks - 1] : NULL;
        if (!ch || cur_tok + s->cand[i].len > cap) {
            ch = &s->chunks[s->n_chunks++];
            ch->cand = cands + i;
            cur_tok = 0;
        }
        ch->cand[ch->n_cand++] = i;
        cur_tok += s->cand[i].len;
        ch->n_tok = ch->cap_tok = cur_tok;
        if (cur_tok > s->cap_tok)
            s->cap_tok = cur_tok;
    }
    size_t total = 0;
    for (int i = 0; i < s->n; i++)
        total += (size_t)s->cand[i].len * hp->dim * sizeof(float);
    s->offload = rr->scratch_dir && s->n_chunks > 3 && total > limit;
    size_t rowb = (size_t)hp->dim * sizeof(float);
    if (s->offload) {
        const char *dir = rr->scratch_dir;
        s->tmp_fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (s->tmp_fd < 0) {
            char path[512];
            snprintf(path, sizeof path, "%s/llms-rerank-XXXXXX", dir);
            s->tmp_fd = mkstemp(path);
            if (s->tmp_fd >= 0)
                unlink(path);
        }
        if (s->tmp_fd < 0)
            return err_set(err, "temporary file in %s: %s", dir, strerror(errno));
        off_t off = 0;
        for (int c = 0; c < s->n_chunks; c++) {
            s->chunks[c].file_off = off;
            off += (off_t)((size_t)s->chunks[c].cap_tok * rowb);
        }
        for (int i = 0; i < 3; i++)
            if (!(s->slot[i] = rr_alloc(rr, (size_t)s->cap_tok * rowb)))
                return err_set(err, "out of memory");
    } else {
        for (int c = 0; c < s->n_chunks; c++)
            if (!(s->chunks[c].mem = rr_alloc(rr, (size_t)s->chunks[c].cap_tok * rowb)))
                return err_set(err, "out of memory for %zu bytes of hidden states", total);
    }
    return 0;
}

static int rr_alloc_scratch(rr_run *s, char err[ERR_MAX])
{
    reranker *rr = s->rr;
    const model_hparams *hp = &rr->hp;
    int nt = tp_n_threads(rr->pool);
    int max_cols = hp->dim > hp->n_ff ? hp->dim : hp->n_ff;
    if (rr->q_dim > max_cols)
        max_cols = rr->q_dim;
    size_t T = (size_t)s->cap_tok;
    size_t sizes[] = {
        T * hp->dim * 4, T * rr->q_dim * 4, T * rr->kv_dim * 4, T * rr->kv_dim * 4,
        T * rr->q_dim * 4, T * hp->dim * 4, T * hp->n_ff * 4, T * hp->n_ff * 4,
        (size_t)nt * RR_QBLOCK * s->max_len * 4, (size_t)nt * rr->kv_dim * 2,
        ops_matmul_scratch_bytes(s->cap_tok, max_cols, nt), T * sizeof(int32_t),
        ((size_t)s->n + 1) * sizeof(int), ((size_t)s->n + 1) * sizeof(int),
        (size_t)s->max_len * hp->head_dim * 4, 2 * (size_t)hp->dim * 4,
    };
    void **ptrs[] = {
        (void **)&s->xn, (void **)&s->q, (void **)&s->k, (void **)&s->v, (void **)&s->att,
        (void **)&s->proj, (void **)&s->gate, (void **)&s->up, (void **)&s->sc,
        (void **)&s->h16, &s->mm, (void **)&s->pos, (void **)&s->row0, (void **)&s->blk0,
        (void **)&s->rope, (void **)&s->yes_no,
    };
    size_t total = 0, n = sizeof sizes / sizeof sizes[0];
    for (size_t i = 0; i < n; i++)
        total += (sizes[i] + 63) & ~(size_t)63;
    char *mem = rr_alloc(rr, total);
    if (!mem)
        return err_set(err, "out of memory for %zu bytes of activations", total);
    s->scratch_bytes = total;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        *ptrs[i] = mem + off;
        off += (sizes[i] + 63) & ~(size_t)63;
    }
    for (int p = 0; p < s->max_len; p++)
        ops_rope_angles(s->rope + (size_t)p * hp->head_dim, p, hp->rope_dims, hp->rope_base,
                        &hp->rope_scaling, rr->rope_freqs);
    return 0;
}

/* Queues the reads of layer l's matrices into streaming buffer l % 2. */
static void rr_submit_layer(rr_run *s, int l)
{
    reranker *rr = s->rr;
    const rr_layer *L = &rr->layers[l];
    uint64_t t = 0;
    for (int i = 0; i < RR_N_MAT; i++)
        t = ioq_submit(rr->io, rr->fd, s->wbuf[l % 2] + L->buf_off[i], L->mat[i]->bytes,
                       rr_file_off(rr, L->mat[i]), false);
    s->wticket[l % 2] = t;
}

static int rr_layer_weights(rr_run *s, int l, char err[ERR_MAX])
{
    reranker *rr = s->rr;
    const rr_layer *L = &rr->layers[l];
    s->L = L;
    if (s->stream) {
        if (ioq_wait(rr->io, s->wticket[l % 2], err) < 0)
            return -1;
        /* the other buffer held layer l - 1, which is done */
        if (l + 1 < rr->hp.n_layer)
            rr_submit_layer(s, l + 1);
    }
    for (int i = 0; i < RR_N_MAT; i++) {
        const gguf_tensor *t = L->mat[i];
        s->W[i] = (ops_matrix){.type = t->type,
                               .data = s->stream ? (const void *)(s->wbuf[l % 2] + L->buf_off[i])
                                                 : t->data,
                               .rows = (int)t->ne[1], .cols = (int)t->ne[0],
                               .row_bytes = quant_row_bytes(t->type, t->ne[0])};
    }
    return 0;
}

/* Keeps only the active candidates' rows of chunk ch (stored in buf), moving them to the
 * front, and fills s->row0 for them. */
static void rr_compact(rr_run *s, rr_chunk *ch, float *buf)
{
    int dim = s->rr->hp.dim, row = 0, src = 0, w = 0;
    for (int i = 0; i < ch->n_cand; i++) {
        rr_cand *c = &s->cand[ch->cand[i]];
        if (c->state == RR_ACTIVE) {
            if (row != src)
                memmove(buf + (size_t)row * dim, buf + (size_t)src * dim,
                        (size_t)c->len * dim * sizeof(float));
            s->row0[w] = row;
            ch->cand[w++] = ch->cand[i];
            row += c->len;
        }
        src += c->len;
    }
    s->row0[w] = row;
    ch->n_cand = w;
    ch->n_tok = row;
}

static int rr_chunk_active(const rr_run *s, const rr_chunk *ch)
{
    for (int i = 0; i < ch->n_cand; i++)
        if (s->cand[ch->cand[i]].state == RR_ACTIVE)
            return 1;
    return 0;
}

/* Next chunk with active candidates after chunk c, wrapping to the next layer. */
static int rr_next_chunk(const rr_run *s, int c, int *layer_step)
{
    *layer_step = 0;
    for (int i = 1; i <= s->n_chunks; i++) {
        int j = (c + i) % s->n_chunks;
        if (j <= c)
            *layer_step = 1;
        if (rr_chunk_active(s, &s->chunks[j]))
            return j;
    }
    return -1;
}

static int rr_fill_embeddings(rr_run *s, rr_chunk *ch, float *buf, char err[ERR_MAX])
{
    int dim = s->rr->hp.dim, row = 0;
    for (int i = 0; i < ch->n_cand; i++) {
        const rr_cand *c = &s->cand[ch->cand[i]];
        for (int t = 0; t < c->len; t++, row++)
            if (rr_embed(s->rr, s->stream, c->tok[t], buf + (size_t)row * dim, err) < 0)
                return -1;
    }
    return 0;
}

/* ---- pruning ---- */

static int rr_cmp_score_desc(const void *a, const void *b, void *arg)
{
    const rr_cand *c = arg;
    int i = *(const int *)a, j = *(const int *)b;
    if (c[i].score != c[j].score)
        return c[i].score > c[j].score ? -1 : 1;
    return (i > j) - (i < j);
}

static int rr_active_sorted(const rr_run *s, int *idx)
{
    int na = 0;
    for (int i = 0; i < s->n; i++)
        if (s->cand[i].state == RR_ACTIVE)
            idx[na++] = i;
    qsort_r(idx, (size_t)na, sizeof *idx, rr_cmp_score_desc, s->cand);
    return na;
}

/* One pruning step after layer l; returns true when the run is complete. */
static bool rr_prune(rr_run *s, int l, int top_k, int *n_selected, int *pruned_at, int *idx,
                     float *vals, int *bounds)
{
    int na = rr_active_sorted(s, idx);
    int need = top_k - *n_selected;
    if (s->o->mode == RERANK_SET && na <= need) {
        for (int i = 0; i < na; i++)
            s->cand[idx[i]].state = RR_SELECTED;
        pruned_at[l] += na;
        *n_selected += na;
        return true;
    }
    if (na <= need || na < 2)
        return false;
    double mean = 0, var = 0;
    for (int i = 0; i < na; i++)
        mean += s->cand[idx[i]].score;
    mean /= na;
    for (int i = 0; i < na; i++) {
        double d = s->cand[idx[i]].score - mean;
        var += d * d;
    }
    double cv = mean > 0 ? sqrt(var / na) / mean : 0;
    if (!(cv > s->o->cv_threshold))
        return false;
    for (int i = 0; i < na; i++)
        vals[i] = s->cand[idx[i]].score;
    kmeans1d(vals, na, kmeans1d_k(na), bounds);
    int b = 0;
    while (bounds[b + 1] <= need - 1)
        b++;
    for (int i = bounds[b + 1]; i < na; i++) {
        s->cand[idx[i]].state = RR_DROPPED;
        pruned_at[l]++;
    }
    if (s->o->mode == RERANK_SET) {
        for (int i = 0; i < bounds[b]; i++) {
            s->cand[idx[i]].state = RR_SELECTED;
            pruned_at[l]++;
        }
        *n_selected += bounds[b];
        if (*n_selected + (bounds[b + 1] - bounds[b]) == top_k) {
            for (int i = bounds[b]; i < bounds[b + 1]; i++)
                s->cand[idx[i]].state = RR_SELECTED;
            pruned_at[l] += bounds[b + 1] - bounds[b];
            *n_selected = top_k;
            return true;
        }
    }
    return false;
}

/* ---- the run ---- */

static void rr_run_free(rr_run *s)
{
    reranker *rr = s->rr;
    size_t rowb = (size_t)rr->hp.dim * sizeof(float);
    if (s->chunks) {
        for (int c = 0; c < s->n_chunks; c++)
            rr_free(rr, s->chunks[c].mem, (size_t)s->chunks[c].cap_tok * rowb);
        free(s->chunks[0].cand);
        free(s->chunks);
    }
    for (int i = 0; i < 3; i++)
        rr_free(rr, s->slot[i], (size_t)s->cap_tok * rowb);
    for (int i = 0; i < 2; i++)
        rr_free(rr, s->wbuf[i], rr->layer_bytes);
    if (s->xn)
        rr_free(rr, s->xn, s->scratch_bytes);
    if (s->tmp_fd >= 0)
        close(s->tmp_fd);
}

/* ---- a run in steps ---- */

struct rerank_task {
    reranker *rr;
    rerank_options o;
    rr_run s;
    int32_t **owned;      /* (n) token sequences rendered by rerank_begin (NULL: borrowed) */
    int *pruned_at;       /* (n_layer) candidates that stopped after each layer */
    int *idx;             /* (n) pruning scratch: candidate indices */
    float *vals;          /* (n) pruning scratch: their scores */
    int *bounds;          /* (n + 1) pruning scratch: cluster bounds */
    float *tmp;           /* (dim) scoring scratch */
    int top_k;
    bool prune;
    int layer, chunk;     /* the next chunk to compute, and its layer */
    bool layer_ready;     /* the weights of layer are in place */
    int n_selected;
    int slot_next, pref_chunk, pref_slot; /* offload slots: rotation and the prefetched chunk */
    bool done, failed;
    double t0;
    /* encoder runs */
    float *ex;            /* (rows of the active candidates, dim) their hidden rows */
    size_t ex_bytes;
    int *eorder;          /* (n) active candidates in the order of their rows in ex */
    int *elens;           /* (n) their lengths, in that order */
    int n_eorder;
    int erow;             /* first row of candidate eorder[chunk] */
    float *ecls;          /* (RR_ENC_BATCH, dim) [CLS] rows, then (RR_ENC_BATCH, n_cls_out)
                             the head's outputs */
};

/* Layer t->layer over chunk c: its rows read back (offloaded), compacted to the active
 * candidates, computed, scored and written out again. */
static int rr_compute_chunk(rerank_task *t, int c, char err[ERR_MAX])
{
    rr_run *s = &t->s;
    reranker *rr = s->rr;
    const model_hparams *hp = &rr->hp;
    int l = t->layer;
    rr_chunk *ch = &s->chunks[c];
    float *buf = ch->mem;
    int slot = -1;
    if (s->offload) {
        if (t->pref_chunk == c) {
            slot = t->pref_slot;
            if (ioq_wait(rr->io, s->slot_ticket[slot], err) < 0)
                return -1;
        } else {
            slot = t->slot_next++ % 3;
            /* the embeddings are written here directly: the slot's write-out must be done */
            if (l == 0 && ioq_wait(rr->io, s->slot_ticket[slot], err) < 0)
                return -1;
            if (l > 0) {
                s->slot_ticket[slot] =
                    ioq_submit(rr->io, s->tmp_fd, s->slot[slot],
                               (size_t)ch->n_tok * hp->dim * sizeof(float), ch->file_off, false);
                if (ioq_wait(rr->io, s->slot_ticket[slot], err) < 0)
                    return -1;
            }
        }
        t->pref_chunk = -1;
        buf = s->slot[slot];
    }
    if (l == 0 && rr_fill_embeddings(s, ch, buf, err) < 0)
        return -1;
    rr_compact(s, ch, buf);
    if (s->offload) {
        int step, nc = rr_next_chunk(s, c, &step);
        if (nc >= 0 && nc != c && (l > 0 || step) && l + step < hp->n_layer) {
            rr_chunk *nx = &s->chunks[nc];
            t->pref_chunk = nc;
            t->pref_slot = t->slot_next++ % 3;
            s->slot_ticket[t->pref_slot] =
                ioq_submit(rr->io, s->tmp_fd, s->slot[t->pref_slot],
                           (size_t)nx->n_tok * hp->dim * sizeof(float), nx->file_off, false);
        }
    }
    s->x = buf;
    s->n_tok = ch->n_tok;
    s->nc = ch->n_cand;
    s->blk0[0] = 0;
    rr_layer_forward(s);
    for (int i = 0; i < ch->n_cand; i++) {
        rr_cand *cd = &s->cand[ch->cand[i]];
        cd->layers = l + 1;
        cd->score = rr_score(s, buf + (size_t)(s->row0[i + 1] - 1) * hp->dim, t->tmp);
    }
    if (s->offload && l + 1 < hp->n_layer)
        s->slot_ticket[slot] =
            ioq_submit(rr->io, s->tmp_fd, s->slot[slot],
                       (size_t)ch->n_tok * hp->dim * sizeof(float), ch->file_off, true);
    return 0;
}

/* After the last chunk of t->layer: prunes, and moves on to the next layer or ends. */
static void rr_end_layer(rerank_task *t)
{
    rr_run *s = &t->s;
    int l = t->layer, n_layer = s->rr->hp.n_layer;
    if (l + 1 == n_layer) {
        for (int i = 0; i < s->n; i++)
            if (s->cand[i].state == RR_ACTIVE)
                t->pruned_at[l]++;
        t->done = true;
    } else if (t->prune && rr_prune(s, l, t->top_k, &t->n_selected, t->pruned_at, t->idx,
                                    t->vals, t->bounds)) {
        t->done = true;
    }
    t->layer++;
    t->chunk = 0;
    t->layer_ready = false;
}

/* ---- encoder runs ---- */

/* The input rows of every candidate into t->ex; segment B starts after the query's
 * separator. */
static int rr_enc_begin(rerank_task *t, char err[ERR_MAX])
{
    reranker *rr = t->rr;
    rr_run *s = &t->s;
    const bert_hparams *hp = bert_hparams_of(rr->enc);
    size_t rows = 0;
    for (int i = 0; i < s->n; i++)
        rows += (size_t)s->cand[i].len;
    t->ex_bytes = rows * hp->dim * sizeof(float);
    t->ex = rr_alloc(rr, t->ex_bytes);
    t->eorder = malloc((size_t)s->n * 2 * sizeof *t->eorder);
    t->ecls = malloc((size_t)RR_ENC_BATCH * (hp->dim + hp->n_cls_out) * sizeof *t->ecls);
    int32_t *tok = malloc(rows * 2 * sizeof *tok);
    if (!t->ex || !t->eorder || !t->ecls || !tok) {
        free(tok);
        return err_set(err, "out of memory for %zu rows of hidden states", rows);
    }
    t->elens = t->eorder + s->n;
    int32_t *types = tok + rows;
    size_t row = 0;
    for (int i = 0; i < s->n; i++) {
        bool b = false;
        for (int j = 0; j < s->cand[i].len; j++, row++) {
            tok[row] = s->cand[i].tok[j];
            types[row] = b && hp->n_types > 1;
            b = b || tok[row] == rr->enc_mid[rr->n_enc_mid - 1];
        }
        t->eorder[i] = i;
        t->elens[i] = s->cand[i].len;
    }
    t->n_eorder = s->n;
    int rc = bert_input(rr->enc, s->n, t->elens, tok, types, t->ex, err);
    free(tok);
    return rc;
}

/* Scores of every active candidate: the head on their [CLS] rows, RR_ENC_BATCH at once. */
static int rr_enc_score(rerank_task *t, char err[ERR_MAX])
{
    reranker *rr = t->rr;
    int dim = rr->hp.dim, n_out = bert_hparams_of(rr->enc)->n_cls_out;
    float *logits = t->ecls + (size_t)RR_ENC_BATCH * dim;
    size_t row = 0;
    for (int i0 = 0; i0 < t->n_eorder; i0 += RR_ENC_BATCH) {
        int n = t->n_eorder - i0 < RR_ENC_BATCH ? t->n_eorder - i0 : RR_ENC_BATCH;
        for (int i = 0; i < n; i++) {
            memcpy(t->ecls + (size_t)i * dim, t->ex + row * dim, (size_t)dim * sizeof(float));
            row += (size_t)t->elens[i0 + i];
        }
        if (bert_head(rr->enc_r, n, t->ecls, logits, err) < 0)
            return -1;
        for (int i = 0; i < n; i++)
            t->s.cand[t->eorder[i0 + i]].score =
                (float)(1.0 / (1.0 + exp(-(double)logits[(size_t)i * n_out])));
    }
    return 0;
}

/* Keeps the active candidates' rows, in order, at the front of t->ex. */
static void rr_enc_compact(rerank_task *t)
{
    int dim = t->rr->hp.dim, w = 0;
    size_t src = 0, dst = 0;
    for (int i = 0; i < t->n_eorder; i++) {
        int c = t->eorder[i], len = t->elens[i];
        if (t->s.cand[c].state == RR_ACTIVE) {
            if (dst != src)
                memmove(t->ex + dst * dim, t->ex + src * dim, (size_t)len * dim * sizeof(float));
            t->eorder[w] = c;
            t->elens[w++] = len;
            dst += (size_t)len;
        }
        src += (size_t)len;
    }
    t->n_eorder = w;
}

/* rerank_step for an encoder: groups of whole candidates through the current layer;
 * after the last group, scores, pruning (rr_end_layer) and compaction. */
static int rr_enc_step(rerank_task *t, long max_rows, char err[ERR_MAX])
{
    reranker *rr = t->rr;
    int n_layer = rr->hp.n_layer, dim = rr->hp.dim;
    long rows = 0;
    while (!t->done && (rows == 0 || rows < max_rows)) {
        if (t->chunk == t->n_eorder) {
            bool last = t->layer + 1 == n_layer;
            if ((t->prune || last) && rr_enc_score(t, err) < 0)
                return -1;
            for (int i = 0; i < t->n_eorder; i++)
                t->s.cand[t->eorder[i]].layers = t->layer + 1;
            rr_end_layer(t);
            rr_enc_compact(t);
            t->erow = 0;
            continue;
        }
        /* whole candidates up to the step's rows left (at least one) */
        long cap = max_rows - rows < RR_ENC_MAX_LEN ? max_rows - rows : RR_ENC_MAX_LEN;
        int g = 0, n = 0;
        while (t->chunk + g < t->n_eorder &&
               (g == 0 || n + t->elens[t->chunk + g] <= cap) &&
               n + t->elens[t->chunk + g] <= RR_ENC_MAX_LEN)
            n += t->elens[t->chunk + g++];
        if (bert_layer(rr->enc_r, t->layer, g, t->elens + t->chunk, t->ex + (size_t)t->erow * dim,
                       err) < 0)
            return -1;
        t->chunk += g;
        t->erow += n;
        rows += n;
    }
    return t->done ? 1 : 0;
}

int rerank_step(rerank_task *t, long max_rows, char err[ERR_MAX])
{
    if (t->failed)
        return err_set(err, "the run failed before");
    if (t->rr->enc) {
        int rc = rr_enc_step(t, max_rows, err);
        t->failed = rc < 0;
        return rc;
    }
    rr_run *s = &t->s;
    long rows = 0;
    while (!t->done && (rows == 0 || rows < max_rows)) {
        if (!t->layer_ready) {
            if (rr_layer_weights(s, t->layer, err) < 0)
                goto fail;
            t->layer_ready = true;
        }
        while (t->chunk < s->n_chunks && !rr_chunk_active(s, &s->chunks[t->chunk]))
            t->chunk++;
        if (t->chunk == s->n_chunks) {
            rr_end_layer(t);
            continue;
        }
        if (rr_compute_chunk(t, t->chunk++, err) < 0)
            goto fail;
        rows += s->n_tok;
    }
    if (!t->done)
        return 0;
    /* nothing may still be reading into or writing from our buffers */
    if (ioq_drain(s->rr->io, err) < 0)
        goto fail;
    return 1;
fail:
    t->failed = true;
    ioq_drain(s->rr->io, NULL);
    return -1;
}

long rerank_task_rows_left(const rerank_task *t)
{
    if (t->done || t->failed)
        return 0;
    const rr_run *s = &t->s;
    long left = 0;
    for (int i = 0; i < s->n; i++)
        if (s->cand[i].state == RR_ACTIVE)
            left += (long)s->cand[i].len * (s->rr->hp.n_layer - s->cand[i].layers);
    return left > 0 ? left : 1;
}

void rerank_result_free(rerank_result *r)
{
    if (!r)
        return;
    free(r->index);
    free(r->score);
    free(r->layers_computed);
    free(r->pruned_at_layer);
    memset(r, 0, sizeof *r);
}

/* The yes / no token of the options, or found in the vocabulary. */
static int rr_answer_token(const reranker *rr, int32_t given, const char *word, int32_t *out,
                           char err[ERR_MAX])
{
    if (given >= 0) {
        if (given >= rr->hp.n_vocab)
            return err_set(err, "%s token %d out of range [0, %d)", word, given,
                           rr->hp.n_vocab);
        *out = given;
        return 0;
    }
    char spm[16], bpe[16];
    snprintf(spm, sizeof spm, "\xe2\x96\x81%s", word);
    snprintf(bpe, sizeof bpe, "\xc4\xa0%s", word);
    const char *forms[] = {word, spm, bpe};
    for (int i = 0; i < 3; i++) {
        int32_t id = tok_find(rr->tok, forms[i], strlen(forms[i]));
        if (id >= 0 && id < rr->hp.n_vocab) {
            *out = id;
            return 0;
        }
    }
    return err_set(err, "the vocabulary has no \"%s\" token", word);
}

int rerank_answer_tokens(const reranker *rr, const rerank_options *o, int32_t *yes,
                         int32_t *no, char err[ERR_MAX])
{
    if (rr->enc) {
        *yes = *no = -1;
        return 0;
    }
    if (rr_answer_token(rr, o->yes_token, "yes", yes, err) < 0 ||
        rr_answer_token(rr, o->no_token, "no", no, err) < 0)
        return -1;
    return 0;
}

void rerank_task_free(rerank_task *t)
{
    if (!t)
        return;
    if (!t->done && !t->failed && t->rr->io)
        ioq_drain(t->rr->io, NULL);
    rr_free(t->rr, t->ex, t->ex_bytes);
    free(t->eorder);
    free(t->ecls);
    rr_run_free(&t->s);
    free(t->s.cand);
    free(t->pruned_at);
    free(t->idx);
    free(t->tmp);
    if (t->owned)
        for (int i = 0; i < t->s.n; i++)
            free(t->owned[i]);
    free(t->owned);
    free(t);
}

rerank_task *rerank_begin_tokens(reranker *rr, const int32_t *const *pairs, const int *lens,
                                 int n_docs, const rerank_options *options, char err[ERR_MAX])
{
    double t0 = clock_mono_ms();
    const rerank_options *o = options ? options : &rr->opt;
    if (n_docs <= 0)
        return err_set(err, "no documents"), NULL;
    if (o->top_k < 1)
        return err_set(err, "top_k %d must be at least 1", o->top_k), NULL;
    if (o->mode != RERANK_SET && o->mode != RERANK_ORDERED)
        return err_set(err, "unknown mode %d", (int)o->mode), NULL;
    if (!pairs || !lens)
        return err_set(err, "no token sequences"), NULL;
    const model_hparams *hp = &rr->hp;
    int max_len = 0;
    for (int i = 0; i < n_docs; i++) {
        if (!pairs[i] || lens[i] <= 0)
            return err_set(err, "document %d has no tokens", i), NULL;
        if (lens[i] > rr->max_len)
            return err_set(err, "document %d has %d tokens, more than the %s's %d positions",
                           i, lens[i], rr->enc ? "encoder" : "model", rr->max_len), NULL;
        for (int t = 0; t < lens[i]; t++)
            if (pairs[i][t] < 0 || pairs[i][t] >= hp->n_vocab)
                return err_set(err, "document %d token %d id %d out of range [0, %d)",
                               i, t, pairs[i][t], hp->n_vocab), NULL;
        if (lens[i] > max_len)
            max_len = lens[i];
    }
    int32_t yes, no;
    if (rerank_answer_tokens(rr, o, &yes, &no, err) < 0)
        return NULL;

    rerank_task *t = calloc(1, sizeof *t);
    if (!t)
        return err_set(err, "out of memory"), NULL;
    rr->bytes_peak = rr->bytes_now;
    t->rr = rr;
    t->o = *o;
    t->t0 = t0;
    t->top_k = o->top_k < n_docs ? o->top_k : n_docs;
    t->prune = o->cv_threshold > 0;
    t->pref_chunk = t->pref_slot = -1;
    rr_run *s = &t->s;
    *s = (rr_run){.rr = rr, .o = &t->o, .stream = o->stream_weights, .n = n_docs,
                  .max_len = max_len, .tmp_fd = -1};
    t->pruned_at = calloc((size_t)hp->n_layer, sizeof *t->pruned_at);
    s->cand = calloc((size_t)n_docs, sizeof *s->cand);
    t->idx = malloc((size_t)n_docs * (sizeof(int) * 2 + sizeof(float)) + sizeof(int));
    t->tmp = malloc((size_t)hp->dim * sizeof(float));
    if (!t->pruned_at || !s->cand || !t->idx || !t->tmp) {
        err_set(err, "out of memory");
        goto fail;
    }
    t->vals = (float *)(t->idx + n_docs);
    t->bounds = (int *)(t->vals + n_docs);
    for (int i = 0; i < n_docs; i++)
        s->cand[i] = (rr_cand){.tok = pairs[i], .len = lens[i], .state = RR_ACTIVE};
    if (rr->enc) {
        if (rr_enc_begin(t, err) < 0)
            goto fail;
        return t;
    }
    if (s->stream && rr_cache_init(rr, err) < 0)
        goto fail;
    size_t limit = o->memory_limit ? o->memory_limit : RR_DEFAULT_MEMORY;
    if (rr_make_chunks(s, limit, err) < 0 || rr_alloc_scratch(s, err) < 0)
        goto fail;
    if (s->stream) {
        for (int i = 0; i < 2; i++)
            if (!(s->wbuf[i] = rr_alloc(rr, rr->layer_bytes))) {
                err_set(err, "out of memory for %zu bytes of layer weights", rr->layer_bytes);
                goto fail;
            }
    }
    if (rr_read_row(rr, rr->output, yes, s->yes_no, err) < 0 ||
        rr_read_row(rr, rr->output, no, s->yes_no + hp->dim, err) < 0)
        goto fail;
    if (s->stream)
        rr_submit_layer(s, 0);
    return t;
fail:
    t->failed = true;
    rerank_task_free(t);
    return NULL;
}

int rerank_task_result(rerank_task *t, rerank_result *out, char err[ERR_MAX])
{
    memset(out, 0, sizeof *out);
    if (!t->done || t->failed || !t->pruned_at)
        return err_set(err, "the run has not finished");
    const rr_run *s = &t->s;
    int n_docs = s->n;
    int *idx = malloc((size_t)n_docs * sizeof *idx);
    int n_out = t->o.top_k < n_docs ? t->o.top_k : n_docs;
    out->index = malloc((size_t)n_out * sizeof *out->index);
    out->score = malloc((size_t)n_out * sizeof *out->score);
    out->layers_computed = malloc((size_t)n_docs * sizeof *out->layers_computed);
    if (!idx || !out->index || !out->score || !out->layers_computed) {
        free(idx);
        rerank_result_free(out);
        return err_set(err, "out of memory");
    }
    int nk = 0;
    for (int i = 0; i < n_docs; i++) {
        out->layers_computed[i] = s->cand[i].layers;
        if (s->cand[i].state != RR_DROPPED)
            idx[nk++] = i;
    }
    qsort_r(idx, (size_t)nk, sizeof *idx, rr_cmp_score_desc, s->cand);
    out->n = nk < n_out ? nk : n_out;
    for (int i = 0; i < out->n; i++) {
        out->index[i] = idx[i];
        out->score[i] = s->cand[idx[i]].score;
    }
    free(idx);
    out->n_layer = t->rr->hp.n_layer;
    out->pruned_at_layer = t->pruned_at;
    t->pruned_at = NULL;
    out->peak_bytes = t->rr->bytes_peak;
    out->ms = clock_mono_ms() - t->t0;
    return 0;
}

/* A task run to its end in one step. */
static int rr_run_task(rerank_task *t, rerank_result *out, char err[ERR_MAX])
{
    int rc = rerank_step(t, LONG_MAX, err) < 0 ? -1 : rerank_task_result(t, out, err);
    rerank_task_free(t);
    return rc;
}

int rerank_run_tokens(reranker *rr, const int32_t *const *pairs, const int *lens, int n_docs,
                      const rerank_options *options, rerank_result *out, char err[ERR_MAX])
{
    if (!out)
        return err_set(err, "no result");
    memset(out, 0, sizeof *out);
    rerank_task *t = rerank_begin_tokens(rr, pairs, lens, n_docs, options, err);
    return t ? rr_run_task(t, out, err) : -1;
}

/* ---- prompt rendering ---- */

typedef struct rr_toks {
    int32_t *ids;
    int n, cap;
} rr_toks;

static int rr_toks_add(const reranker *rr, rr_toks *t, const char *text, size_t len,
                       bool special, char err[ERR_MAX])
{
    if (len == 0)
        return 0;
    for (;;) {
        int n = tok_encode(rr->tok, text, len, false, special, t->ids + t->n, t->cap - t->n);
        if (n < 0)
            return err_set(err, "tokenizing failed");
        if (t->n + n <= t->cap) {
            t->n += n;
            return 0;
        }
        int cap = t->n + n + 256;
        int32_t *p = realloc(t->ids, (size_t)cap * sizeof *p);
        if (!p)
            return err_set(err, "out of memory");
        t->ids = p;
        t->cap = cap;
    }
}

static int rr_toks_push(rr_toks *t, int32_t id, char err[ERR_MAX])
{
    if (t->n == t->cap) {
        int32_t *p = realloc(t->ids, (size_t)(t->cap + 256) * sizeof *p);
        if (!p)
            return err_set(err, "out of memory");
        t->ids = p;
        t->cap += 256;
    }
    t->ids[t->n++] = id;
    return 0;
}

/* An encoder's pair up to its query: [CLS] query, -1 + err when that leaves no room for
 * a document. */
static int rr_enc_query(const reranker *rr, const char *query, rr_toks *t, char err[ERR_MAX])
{
    t->n = 0;
    if (rr_toks_push(t, rr->enc_cls, err) < 0 ||
        rr_toks_add(rr, t, query, strlen(query), false, err) < 0)
        return -1;
    if (t->n + rr->n_enc_mid + 1 >= rr->max_len)
        return err_set(err, "the query has %d tokens: no room for a document in the encoder's "
                            "%d", t->n - 1, rr->max_len);
    return 0;
}

/* An encoder's pair (see enc_mid), the document cut to fit. */
static int rr_enc_render(const reranker *rr, const char *query, const char *doc, rr_toks *t,
                         char err[ERR_MAX])
{
    if (rr_enc_query(rr, query, t, err) < 0)
        return -1;
    for (int i = 0; i < rr->n_enc_mid; i++)
        if (rr_toks_push(t, rr->enc_mid[i], err) < 0)
            return -1;
    if (rr_toks_add(rr, t, doc, strlen(doc), false, err) < 0)
        return -1;
    if (t->n + 1 > rr->max_len)
        t->n = rr->max_len - 1;
    return rr_toks_push(t, rr->enc_end, err);
}

/* The reranker prompt for (query, doc) as token ids, the document's tokens cut so that
 * the pair fits max_len: the text after {document} (the question the answer token
 * answers) stays whole. -1 + err when the prompt without a document leaves no room for
 * one of its tokens (doc "" checks just that). */
static int rr_render(const reranker *rr, const char *query, const char *doc, rr_toks *t,
                     char err[ERR_MAX])
{
    if (rr->enc)
        return rr_enc_render(rr, query, doc, t, err);
    t->n = 0;
    if (tok_add_bos(rr->tok) && tok_bos(rr->tok) >= 0 &&
        rr_toks_push(t, tok_bos(rr->tok), err) < 0)
        return -1;
    static const char *const names[] = {"{query}", "{document}", "{instruction}"};
    const char *values[] = {query, doc, RR_DEFAULT_INSTRUCTION};
    const char *p = rr->prompt;
    int doc_at = 0, doc_n = 0, query_n = 0; /* rr_load_prompt saw {document} once */
    while (*p) {
        const char *next = NULL;
        int which = -1;
        for (int i = 0; i < 3; i++) {
            const char *f = strstr(p, names[i]);
            if (f && (!next || f < next)) {
                next = f;
                which = i;
            }
        }
        size_t lit = next ? (size_t)(next - p) : strlen(p);
        if (rr_toks_add(rr, t, p, lit, true, err) < 0)
            return -1;
        if (!next)
            break;
        int at = t->n;
        if (rr_toks_add(rr, t, values[which], strlen(values[which]), which == 2, err) < 0)
            return -1;
        if (which == 0)
            query_n += t->n - at;
        if (which == 1)
            doc_at = at, doc_n = t->n - at;
        p = next + strlen(names[which]);
    }
    int rest = t->n - doc_n;
    if (rest >= rr->max_len)
        return err_set(err, "the query has %d tokens: no room for a document in the model's "
                            "%d positions (the rest of the prompt takes %d)",
                       query_n, rr->max_len, rest - query_n);
    if (t->n > rr->max_len) {
        int cut = t->n - rr->max_len, tail = t->n - doc_at - doc_n;
        memmove(t->ids + doc_at + doc_n - cut, t->ids + doc_at + doc_n,
                (size_t)tail * sizeof *t->ids);
        t->n = rr->max_len;
    }
    return 0;
}

int rerank_query_fits(const reranker *rr, const char *query, char err[ERR_MAX])
{
    rr_toks t = {0};
    int rc = rr->enc ? rr_enc_query(rr, query, &t, err) : rr_render(rr, query, "", &t, err);
    free(t.ids);
    return rc;
}

rerank_task *rerank_begin(reranker *rr, const char *query, const char *const *docs, int n_docs,
                          const rerank_options *options, char err[ERR_MAX])
{
    if (!query || !*query)
        return err_set(err, "empty query"), NULL;
    if (n_docs <= 0 || !docs)
        return err_set(err, "no documents"), NULL;
    for (int i = 0; i < n_docs; i++)
        if (!docs[i] || !*docs[i])
            return err_set(err, "document %d is empty", i), NULL;
    int32_t **pairs = calloc((size_t)n_docs, sizeof *pairs);
    int *lens = calloc((size_t)n_docs, sizeof *lens);
    rr_toks tk = {0};
    rerank_task *t = NULL;
    if (!pairs || !lens) {
        err_set(err, "out of memory");
        goto done;
    }
    for (int i = 0; i < n_docs; i++) {
        if (rr_render(rr, query, docs[i], &tk, err) < 0)
            goto done;
        pairs[i] = malloc((size_t)(tk.n ? tk.n : 1) * sizeof **pairs);
        if (!pairs[i]) {
            err_set(err, "out of memory");
            goto done;
        }
        memcpy(pairs[i], tk.ids, (size_t)tk.n * sizeof **pairs);
        lens[i] = tk.n;
    }
    t = rerank_begin_tokens(rr, (const int32_t *const *)pairs, lens, n_docs, options, err);
    if (t) {
        t->owned = pairs;
        pairs = NULL;
    }
done:
    if (pairs)
        for (int i = 0; i < n_docs; i++)
            free(pairs[i]);
    free(pairs);
    free(lens);
    free(tk.ids);
    return t;
}

int rerank_run(reranker *rr, const char *query, const char *const *docs, int n_docs,
               const rerank_options *options, rerank_result *out, char err[ERR_MAX])
{
    if (!out)
        return err_set(err, "no result");
    memset(out, 0, sizeof *out);
    rerank_task *t = rerank_begin(rr, query, docs, n_docs, options, err);
    return t ? rr_run_task(t, out, err) : -1;
}
