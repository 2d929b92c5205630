/*
 * bench/kvquant — how much compressing a context's KV chunks changes the next-token
 * distributions, for uniform int8 / int4 / int2 and for tolerance-aware precisions.
 *
 *   build/bench/kvquant [-t THREADS] [-s SEQS] [--len N] [--prefix N] [--ratio R]
 *                       [--window N] [--testdata DIR] [--text FILE] [--docs]
 *                       [MODEL.gguf ...]
 *
 * With no model given it uses DIR/models/stories260K.gguf (a trained tiny llama; DIR is
 * ../shared/testdata by default) and a random-weight llama (dim 256, 8 layers, 4 heads,
 * 2 KV heads, head_dim 64 as most real models have, FFN 768, F16, a synthetic vocabulary
 * of 4096 tokens to keep the run short) generated into build/bench-models/.
 * --docs runs the documentation generator instead, DIR/models/docs-lm-21M-F16.gguf and
 * docs-lm-21M-Q8_0.gguf (context 2048), on --text DIR/docs/heldout.txt (text it was not
 * trained on) with SEQS 6, --len 1536 and --prefix 1280 unless given: 1280 tokens of a
 * long document compressed and the next 256 scored, in three quarters of the model's
 * window (both files: about 9 minutes of CPU at -t 2, 10-14 minutes on 2 cores shared
 * with other work). When those files are absent it says so and exits 0.
 *
 * For each of SEQS sequences: --len tokens are sampled from the model itself (BOS first,
 * temperature 1, seeded: for the trained models, stories), or with --text cut from FILE
 * tokenized by the model's own tokenizer: BOS, then --len - 1 tokens of the text from
 * offset i n / (SEQS + 1) for sequence i = 0..SEQS - 1 and n tokens of text, so that the
 * windows spread evenly over it and never overlap (FILE must hold that many). The first
 * --prefix tokens are prefilled with f16 KV, the last --window of them (default 32) with
 * attention received per entry (each column's sum normalised by n_layer * n_head * the
 * rows that can attend to it; a chunk's density is the mean over its columns). Then for
 * each scheme a copy of the prefix's chunks is compressed and the remaining tokens are
 * teacher-forced one by one (their own K/V stay f16); the scores are the mean over those
 * positions of KL(p_f16 || p_scheme) and the share of positions whose most likely token
 * is the f16 one's (top-1 agreement).
 *
 * Schemes: uniform int8, int4, int2 (equal K and V widths, V per token: "int4" is the
 * baseline every kl_vs_int4 divides by); uniform "k4v5b" (K 4 bits, V 5 bits on one
 * range per (layer, head) block: the V block layout, about int4's bytes at head_dim 16)
 * and "k5v5b" (10% over int4's bytes); "tolerance" = kv_assign_precisions with V per
 * token only (per chunk K and V widths of 2-8 bits), "tolerance_vblock" = the same free
 * to choose the V block layout per chunk (what the daemon runs before its model's layers
 * are calibrated), each under a byte budget: the
 * bytes of uniform int4 ("int4"), of the layout before 8-bit scales, which kept an f16
 * (scale, min) per group ("old_int4": 2 * 16 * head_dim * 4 / 8 + 4 * (head_dim + 16 *
 * groups) bytes per block), of half int8 and half int2 ("int8+int2"), and --ratio times
 * int8's (the daemon's kv_compress_ratio, default 0.6). Controls at the int4 budget, for
 * both: "_shuffled" (the same precisions placed at random: what the per-chunk choice
 * adds) and "_flat" (every density equal: what density adds over value spread).
 * Per layer: "section_vblock" = kv_assign_layer_precisions, a precision per (chunk,
 * layer) from each layer's own spreads; "section_cal_vblock" the same on spreads scaled
 * by the layer factors kv_calib_measure finds on a calibration sequence (a story of seed
 * 999, or with --text the window at i = SEQS: never one of the measured ones; what the
 * daemon runs once calibrated), with its controls;
 * "layer_cal_vblock" one precision per layer for every chunk (the same greedy on each
 * layer's mean calibrated statistics, under a chunk's share of the budget).
 * Prints one JSON object per model and scheme: median, min and max KL over the sequences,
 * KL relative to uniform int4's (median of the per-sequence ratios), top-1 agreement over
 * all positions, the prefix's KV bytes relative to int8 (real bytes, scales included),
 * mean K and V widths over (chunk, layer) sections, the calibrated layer factors (K, V,
 * V block for each layer), and the median time of a teacher-forced decode step (attention
 * decodes compressed chunks as it reads them).
 */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/bench.h"
#include "engine/kv/kv.h"
#include "engine/kv/kv_calib.h"
#include "engine/kv/kv_quant.h"
#include "engine/model/model.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "engine/model/sampler.h"
#include "engine/readall.h"
#include "engine/tok/tokenizer.h"

#define MAX_SEQS 32

/* The byte budget a tolerance scheme gets. */
enum budget { UNIFORM, AT_INT4, AT_OLD_INT4, AT_INT8_INT2, AT_RATIO };

/* What a scheme assigns precisions to: whole chunks (kv_assign_precisions), every
 * (chunk, layer) section (kv_assign_layer_precisions) with every layer weighing 1 or
 * with the calibrated layer weights, or one precision per layer for every chunk (the
 * same greedy on each layer's mean statistics). */
enum granularity { PER_CHUNK, PER_SECTION, PER_SECTION_CAL, PER_LAYER_CAL };

/* How a scheme picks each prefix chunk's precision. */
typedef struct scheme {
    const char *name;
    enum kv_precision uniform; /* budget UNIFORM */
    enum budget budget;
    bool shuffled;             /* the same precisions placed at random */
    bool flat;                 /* every chunk's density the same */
    bool v_block;              /* kv_assign_precisions may choose the V block layout */
    enum granularity by;
} scheme;

static const scheme schemes[] = {
    {"int8", KV_INT8, UNIFORM, false, false, false, PER_CHUNK},
    {"int4", KV_INT4, UNIFORM, false, false, false, PER_CHUNK},
    {"int2", KV_INT2, UNIFORM, false, false, false, PER_CHUNK},
    {"k4v5b", KV_VBLOCK_FIRST + 2 * KV_N_WIDTHS + 3, UNIFORM, false, false, false, PER_CHUNK},
    {"k5v5b", KV_VBLOCK_FIRST + 3 * KV_N_WIDTHS + 3, UNIFORM, false, false, false, PER_CHUNK},
    {"tolerance", 0, AT_INT4, false, false, false, PER_CHUNK},
    {"tolerance_shuffled", 0, AT_INT4, true, false, false, PER_CHUNK},
    {"tolerance_flat", 0, AT_INT4, false, true, false, PER_CHUNK},
    {"tolerance", 0, AT_OLD_INT4, false, false, false, PER_CHUNK},
    {"tolerance", 0, AT_INT8_INT2, false, false, false, PER_CHUNK},
    {"tolerance", 0, AT_RATIO, false, false, false, PER_CHUNK},
    {"tolerance_vblock", 0, AT_INT4, false, false, true, PER_CHUNK},
    {"tolerance_vblock_shuffled", 0, AT_INT4, true, false, true, PER_CHUNK},
    {"tolerance_vblock_flat", 0, AT_INT4, false, true, true, PER_CHUNK},
    {"tolerance_vblock", 0, AT_INT8_INT2, false, false, true, PER_CHUNK},
    {"tolerance_vblock", 0, AT_RATIO, false, false, true, PER_CHUNK},
    {"section_vblock", 0, AT_INT4, false, false, true, PER_SECTION},
    {"section_cal_vblock", 0, AT_INT4, false, false, true, PER_SECTION_CAL},
    {"section_cal_vblock_shuffled", 0, AT_INT4, true, false, true, PER_SECTION_CAL},
    {"section_cal_vblock_flat", 0, AT_INT4, false, true, true, PER_SECTION_CAL},
    {"layer_cal_vblock", 0, AT_INT4, false, false, true, PER_LAYER_CAL},
    {"section_cal_vblock", 0, AT_INT8_INT2, false, false, true, PER_SECTION_CAL},
    {"section_cal_vblock", 0, AT_RATIO, false, false, true, PER_SECTION_CAL},
};
#define N_SCHEMES (int)(sizeof schemes / sizeof schemes[0])
#define SCHEME_INT4 1 /* the reference of kl_vs_int4 */

static const char *budget_names[] = {"none", "int4", "old_int4", "int8+int2", "ratio"};

typedef struct bench_options {
    int n_threads;
    int n_seqs;
    int len;
    int prefix;
    const char *testdata;
    int window; /* density from the attention of the prefix's last `window` tokens */
    double ratio; /* budget AT_RATIO: bytes over int8's */
    const char *text; /* sequences cut from this file, or NULL: sampled */
} bench_options;

/* What one model's run keeps between sequences. */
typedef struct bench_ctx {
    const bench_options *o;
    model *m;
    model_runner *r;
    kv_pool *pool;
    int n_vocab;
    int32_t bos;
    int32_t *text;     /* (n_text) o->text's tokens, or NULL */
    int n_text;
    int32_t *tokens;   /* (len) */
    int32_t *positions; /* (len) */
    float *received;   /* (prefix) */
    kv_chunk_stats *stats; /* (2, n_chunks of the prefix): real, then a flat copy */
    kv_chunk_stats *section_stats; /* (2, n_chunks, n_layer): each layer's, then flat */
    float *ref_logits; /* (len - prefix, n_vocab) with f16 KV */
    float *logits;     /* (n_vocab) */
    enum kv_precision *chunk_prec; /* (n_chunks) */
    uint8_t *prec;     /* (n_chunks, n_layer) */
    float *layer_weight; /* (n_layer, KV_CALIB_PARTS) calibrated factors (kv_calib.h) */
    kv_chunk_stats *cal_stats; /* (n_chunks, n_layer) section_stats times layer_weight */
} bench_ctx;

/* Samples o->len tokens from the model: BOS, then temperature 1. */
static int sample_text(bench_ctx *b, uint64_t seed, char err[ERR_MAX])
{
    sampler_params sp = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                         .repeat_penalty = 1.0f, .repeat_last_n = 0, .typical_p = 1.0f,
                         .seed = seed};
    sampler *s = sampler_new(b->n_vocab, &sp, err);
    if (!s)
        return -1;
    kv_seq seq;
    kv_seq_init(&seq, b->pool);
    b->tokens[0] = b->bos;
    int rc = 0, row = 0;
    for (int i = 0; i + 1 < b->o->len && rc == 0; i++) {
        model_batch mb = {.n_tokens = 1, .tokens = b->tokens + i, .positions = b->positions + i,
                          .n_out = 1, .out_rows = &row, .logits = b->logits};
        rc = model_forward(b->r, &seq, &mb, err);
        if (rc == 0)
            b->tokens[i + 1] = sampler_sample(s, b->logits, b->tokens, i + 1);
    }
    kv_seq_free(&seq);
    sampler_free(s);
    return rc;
}

/* Sequence q's tokens into b->tokens: measured ones are q < n_seqs, the calibration's
 * q == n_seqs (see the top). */
static int sequence_tokens(bench_ctx *b, int q, char err[ERR_MAX])
{
    const bench_options *o = b->o;
    if (!b->text)
        return sample_text(b, q < o->n_seqs ? 1000 + (uint64_t)q : 999, err);
    b->tokens[0] = b->bos;
    memcpy(b->tokens + 1, b->text + (size_t)q * b->n_text / (o->n_seqs + 1),
           (size_t)(o->len - 1) * sizeof *b->tokens);
    return 0;
}

/* b->text from o->text, tokenized as plain text by the model's tokenizer; fails when it
 * holds too few tokens for SEQS + 1 windows that do not overlap. */
static int load_text(bench_ctx *b, char err[ERR_MAX])
{
    const bench_options *o = b->o;
    size_t len;
    char *text = readall_file(o->text, &len, err);
    if (!text)
        return -1;
    tokenizer *tk = NULL;
    int rc = tok_load(model_gguf(b->m), &tk, err);
    int n = rc == 0 ? tok_encode(tk, text, len, false, false, NULL, 0) : 0;
    /* window q starts at q n / (SEQS + 1) and needs len - 1 tokens before the next's */
    int64_t need = (int64_t)(o->n_seqs + 1) * (o->len - 1);
    if (rc == 0 && n < 0)
        rc = err_set(err, "cannot tokenize it");
    else if (rc == 0 && n < need)
        rc = err_set(err, "%d tokens, %d windows of %d need %lld", n, o->n_seqs + 1,
                     o->len - 1, (long long)need);
    b->text = rc == 0 ? malloc((size_t)n * sizeof *b->text) : NULL;
    b->n_text = n;
    if (rc == 0 && (!b->text || tok_encode(tk, text, len, false, false, b->text, n) != n))
        rc = err_set(err, "out of memory");
    tok_free(tk);
    free(text);
    return rc;
}

/* Teacher-forces tokens [prefix, len) one by one on seq; with r NULL stores the logits
 * as the reference, else r gets the mean KL(reference || these) and the positions whose
 * most likely token is the reference's. */
typedef struct score {
    double kl;
    int agree;
} score;

static int teacher_force(bench_ctx *b, kv_seq *seq, score *r, char err[ERR_MAX])
{
    const bench_options *o = b->o;
    int row = 0;
    double sum = 0;
    int agree = 0;
    for (int t = o->prefix; t < o->len; t++) {
        float *ref = b->ref_logits + (size_t)(t - o->prefix) * b->n_vocab;
        model_batch mb = {.n_tokens = 1, .tokens = b->tokens + t, .positions = b->positions + t,
                          .n_out = 1, .out_rows = &row, .logits = r ? b->logits : ref};
        if (model_forward(b->r, seq, &mb, err) < 0)
            return -1;
        if (r) {
            sum += kv_calib_logits_kl(ref, b->logits, b->n_vocab);
            agree += bench_argmax(ref, b->n_vocab) == bench_argmax(b->logits, b->n_vocab);
        }
    }
    if (r)
        *r = (score){sum / (o->len - o->prefix), agree};
    return 0;
}

/* What one scheme gave on one sequence. */
typedef struct outcome {
    double kl, bytes, k_bits, v_bits, ms;
    int agree;
} outcome;

/* Bytes per chunk of uniform int4 in the layout before 8-bit scales (see the top). */
static double old_int4_chunk_bytes(kv_shape s)
{
    int groups = (s.head_dim + KV_QUANT_V_GROUP - 1) / KV_QUANT_V_GROUP;
    double block = 2.0 * KV_CHUNK_TOKENS * s.head_dim * 4 / 8 +
                   4.0 * (s.head_dim + KV_CHUNK_TOKENS * groups);
    return block * s.n_layer * s.n_head_kv;
}

static size_t scheme_budget(const scheme *sc, const bench_options *o, kv_shape shape, int n)
{
    double int8 = (double)kv_chunk_data_bytes(shape, KV_INT8);
    switch (sc->budget) {
    case AT_INT4:
        return (size_t)n * kv_chunk_data_bytes(shape, KV_INT4);
    case AT_OLD_INT4:
        return (size_t)(n * old_int4_chunk_bytes(shape));
    case AT_INT8_INT2:
        return (size_t)n * (kv_chunk_data_bytes(shape, KV_INT8) +
                            kv_chunk_data_bytes(shape, KV_INT2)) / 2;
    case AT_RATIO:
        return (size_t)(o->ratio * n * int8);
    default:
        return 0;
    }
}

/* Takes sequence q (sequence_tokens) and prefills its prefix into *prefix with f16 KV,
 * then fills b->stats and b->section_stats (real and flat copies); *density_cv (may be
 * NULL) gets the spread of the chunks' densities. */
static int make_prefix(bench_ctx *b, int q, kv_seq *prefix, double *density_cv,
                       char err[ERR_MAX])
{
    const bench_options *o = b->o;
    const model_hparams *hp = model_hparams_of(b->m);
    int n_layer = hp->n_layer;
    if (sequence_tokens(b, q, err) < 0)
        return -1;
    memset(b->received, 0, (size_t)o->prefix * sizeof(float));
    int win = o->window > 0 && o->window < o->prefix ? o->window : o->prefix;
    model_batch head = {.n_tokens = o->prefix - win, .tokens = b->tokens,
                        .positions = b->positions};
    model_batch pre = {.n_tokens = win, .tokens = b->tokens + o->prefix - win,
                       .positions = b->positions + o->prefix - win, .attn_received = b->received};
    if ((head.n_tokens > 0 && model_forward(b->r, prefix, &head, err) < 0) ||
        model_forward(b->r, prefix, &pre, err) < 0)
        return -1;
    int n_chunks = prefix->n_chunks;
    kv_chunk_stats *flat = b->stats + n_chunks;
    kv_chunk_stats *sec = b->section_stats, *sec_flat = sec + (size_t)n_chunks * n_layer;
    double mean = 0, var = 0;
    for (int c = 0; c < n_chunks; c++) {
        double d = 0;
        int n = prefix->chunks[c]->n_tokens;
        for (int i = 0; i < n; i++) {
            int j = c * KV_CHUNK_TOKENS + i;
            int rows = o->prefix - j < win ? o->prefix - j : win;
            d += b->received[j] / ((double)hp->n_layer * hp->n_head * rows);
        }
        kv_chunk_stats *st = &b->stats[c];
        st->density = (float)(d / n);
        kv_chunk_spread(b->pool, prefix->chunks[c], &st->k_spread, &st->v_spread,
                        &st->vb_spread);
        flat[c] = (kv_chunk_stats){1, st->k_spread, st->v_spread, st->vb_spread};
        for (int l = 0; l < n_layer; l++) {
            kv_chunk_stats *ls = &sec[(size_t)c * n_layer + l];
            ls->density = st->density;
            kv_chunk_layer_spread(b->pool, prefix->chunks[c], l, &ls->k_spread, &ls->v_spread,
                                  &ls->vb_spread);
            sec_flat[(size_t)c * n_layer + l] = (kv_chunk_stats){1, ls->k_spread, ls->v_spread,
                                                                 ls->vb_spread};
        }
        mean += st->density / n_chunks;
    }
    for (int c = 0; c < n_chunks; c++)
        var += (b->stats[c].density - mean) * (b->stats[c].density - mean) / n_chunks;
    if (density_cv)
        *density_cv = sqrt(var) / mean;
    return 0;
}

/* Compresses a copy of prefix with layer l of chunk c at b->prec[c * n_layer + l] and
 * teacher-forces the rest of the sequence on it into *r. */
static int score_precisions(bench_ctx *b, const kv_seq *prefix, outcome *r, char err[ERR_MAX])
{
    kv_shape shape = model_kv_shape(b->m);
    int n_chunks = prefix->n_chunks, n_layer = shape.n_layer;
    kv_seq work;
    kv_seq_init(&work, b->pool);
    int rc = -1;
    if (kv_seq_copy(&work, prefix, err) < 0)
        goto out;
    size_t used = 0;
    double kb = 0, vb = 0, sections = (double)n_chunks * n_layer;
    for (int c = 0; c < n_chunks; c++) {
        const uint8_t *layers = b->prec + (size_t)c * n_layer;
        if (kv_chunk_convert_layers(b->pool, work.chunks[c], layers, err) < 0)
            goto out;
        used += kv_layers_data_bytes(shape, layers);
        for (int l = 0; l < n_layer; l++) {
            kb += kv_precision_k_bits(layers[l]) / sections;
            vb += kv_precision_v_bits(layers[l]) / sections;
        }
    }
    r->bytes = (double)used / ((double)n_chunks * kv_chunk_data_bytes(shape, KV_INT8));
    r->k_bits = kb;
    r->v_bits = vb;
    double t0 = bench_now_s();
    score sco;
    if (teacher_force(b, &work, &sco, err) < 0)
        goto out;
    r->ms = (bench_now_s() - t0) * 1e3 / (b->o->len - b->o->prefix);
    r->kl = sco.kl;
    r->agree = sco.agree;
    rc = 0;
out:
    kv_seq_free(&work);
    return rc;
}

/* The reference logits of the rest of the sequence, on an f16 copy of prefix; *ms the
 * time of a decode step. */
static int score_reference(bench_ctx *b, const kv_seq *prefix, double *ms, char err[ERR_MAX])
{
    kv_seq work;
    kv_seq_init(&work, b->pool);
    double t0 = bench_now_s();
    int rc = kv_seq_copy(&work, prefix, err) < 0 || teacher_force(b, &work, NULL, err) < 0
                 ? -1
                 : 0;
    *ms = (bench_now_s() - t0) * 1e3 / (b->o->len - b->o->prefix);
    kv_seq_free(&work);
    return rc;
}

/* b->layer_weight from the calibration sequence (kv_calib_measure on its prefix and the
 * tokens after it). */
static int calibrate_layers(bench_ctx *b, char err[ERR_MAX])
{
    const bench_options *o = b->o;
    kv_seq prefix;
    kv_seq_init(&prefix, b->pool);
    int rc = make_prefix(b, o->n_seqs, &prefix, NULL, err) < 0 ||
                     kv_calib_measure(b->m, b->r, &prefix, b->section_stats,
                                      b->tokens + o->prefix, b->positions + o->prefix,
                                      o->len - o->prefix, 0, b->layer_weight, err) != 0
                 ? -1
                 : 0;
    kv_seq_free(&prefix);
    return rc;
}

/* b->prec for scheme sc on a prefix of n_chunks whose statistics make_prefix filled. */
static void assign_scheme(bench_ctx *b, const scheme *sc, int n_chunks, uint64_t *shuffle)
{
    const bench_options *o = b->o;
    kv_shape shape = model_kv_shape(b->m);
    int n_layer = shape.n_layer;
    size_t budget = scheme_budget(sc, o, shape, n_chunks);
    const kv_chunk_stats *st = b->stats + (sc->flat ? n_chunks : 0);
    const kv_chunk_stats *sec = b->section_stats + (sc->flat ? (size_t)n_chunks * n_layer : 0);
    if (sc->by == PER_SECTION_CAL || sc->by == PER_LAYER_CAL) {
        kv_calib_apply(shape, b->layer_weight, n_chunks, sec, b->cal_stats);
        sec = b->cal_stats;
    }
    if (sc->budget == UNIFORM) {
        memset(b->prec, (int)sc->uniform, (size_t)n_chunks * n_layer);
    } else if (sc->by == PER_CHUNK) {
        kv_assign_precisions(shape, st, n_chunks, budget, sc->v_block, b->chunk_prec);
        for (int c = 0; c < n_chunks; c++)
            memset(b->prec + (size_t)c * n_layer, (int)b->chunk_prec[c], (size_t)n_layer);
    } else if (sc->by == PER_LAYER_CAL) {
        kv_chunk_stats *mean = b->section_stats + 2 * (size_t)n_chunks * n_layer;
        for (int l = 0; l < n_layer; l++) {
            mean[l] = (kv_chunk_stats){0};
            for (int c = 0; c < n_chunks; c++) {
                const kv_chunk_stats *x = &sec[(size_t)c * n_layer + l];
                mean[l].density += x->density / n_chunks;
                mean[l].k_spread += x->k_spread / n_chunks;
                mean[l].v_spread += x->v_spread / n_chunks;
                mean[l].vb_spread += x->vb_spread / n_chunks;
            }
        }
        kv_assign_layer_precisions(shape, mean, 1, budget / n_chunks, sc->v_block,
                                   b->prec);
        for (int c = 1; c < n_chunks; c++)
            memcpy(b->prec + (size_t)c * n_layer, b->prec, (size_t)n_layer);
    } else {
        kv_assign_layer_precisions(shape, sec, n_chunks, budget, sc->v_block, b->prec);
    }
    if (sc->shuffled) /* whole chunks change places: their layers' mix stays */
        for (int c = n_chunks - 1; c > 0; c--) {
            *shuffle = *shuffle * 6364136223846793005ULL + 1442695040888963407ULL;
            int j = (int)((*shuffle >> 33) % (uint64_t)(c + 1));
            uint8_t t[KV_MAX_LAYERS];
            memcpy(t, b->prec + (size_t)c * n_layer, (size_t)n_layer);
            memcpy(b->prec + (size_t)c * n_layer, b->prec + (size_t)j * n_layer, (size_t)n_layer);
            memcpy(b->prec + (size_t)j * n_layer, t, (size_t)n_layer);
        }
}

/* Sequence q: out[scheme], and the spread of its chunks' densities. */
static int bench_sequence(bench_ctx *b, int q, outcome *out, double *ms_f16,
                          double *density_cv, char err[ERR_MAX])
{
    int rc = -1;
    kv_seq prefix;
    kv_seq_init(&prefix, b->pool);
    if (make_prefix(b, q, &prefix, density_cv, err) < 0 ||
        score_reference(b, &prefix, ms_f16, err) < 0)
        goto out;
    uint64_t shuffle = (1000 + (uint64_t)q) * 2654435761u + 1;
    for (int s = 0; s < N_SCHEMES; s++) {
        assign_scheme(b, &schemes[s], prefix.n_chunks, &shuffle);
        if (score_precisions(b, &prefix, &out[s], err) < 0)
            goto out;
    }
    rc = 0;
out:
    kv_seq_free(&prefix);
    return rc;
}

static double field_median(const outcome *o, int n, size_t offset)
{
    double v[MAX_SEQS];
    for (int q = 0; q < n; q++)
        v[q] = *(const double *)((const char *)&o[q] + offset);
    return bench_median(v, n);
}

static int bench_model(const char *path, const bench_options *o)
{
    char err[ERR_MAX];
    bench_ctx b = {.o = o};
    int status = 1;
    double t_start = bench_now_s();
    b.m = model_load(path, err);
    if (!b.m) {
        fprintf(stderr, "kvquant: %s: %s\n", path, err);
        return 1;
    }
    const model_hparams *hp = model_hparams_of(b.m);
    b.n_vocab = hp->n_vocab;
    int64_t bos = 1;
    gguf_get_i64(model_gguf(b.m), "tokenizer.ggml.bos_token_id", &bos);
    b.bos = bos >= 0 && bos < b.n_vocab ? (int32_t)bos : 0;
    int n_chunks = (o->prefix + KV_CHUNK_TOKENS - 1) / KV_CHUNK_TOKENS;
    b.r = model_runner_new(b.m, o->n_threads, 0, o->len, err);
    b.pool = b.r ? kv_pool_new(model_kv_shape(b.m), 0, err) : NULL;
    b.tokens = malloc((size_t)o->len * sizeof *b.tokens);
    b.positions = malloc((size_t)o->len * sizeof *b.positions);
    b.received = malloc((size_t)o->prefix * sizeof *b.received);
    int n_layer = hp->n_layer;
    b.stats = malloc(2 * (size_t)n_chunks * sizeof *b.stats);
    b.section_stats = malloc((2 * (size_t)n_chunks + 1) * n_layer * sizeof *b.section_stats);
    b.chunk_prec = malloc((size_t)n_chunks * sizeof *b.chunk_prec);
    b.prec = malloc((size_t)n_chunks * n_layer * sizeof *b.prec);
    b.cal_stats = malloc((size_t)n_chunks * n_layer * sizeof *b.cal_stats);
    b.layer_weight = malloc(KV_CALIB_PARTS * (size_t)n_layer * sizeof *b.layer_weight);
    b.ref_logits = malloc((size_t)(o->len - o->prefix) * b.n_vocab * sizeof(float));
    b.logits = malloc((size_t)b.n_vocab * sizeof(float));
    outcome(*res)[MAX_SEQS] = malloc(sizeof(outcome[N_SCHEMES][MAX_SEQS]));
    if (!b.r || !b.pool || !b.tokens || !b.positions || !b.received || !b.stats || !b.prec ||
        !b.section_stats || !b.chunk_prec || !b.layer_weight || !b.cal_stats || !b.ref_logits || !b.logits ||
        !res) {
        fprintf(stderr, "kvquant: %s: %s\n", path, b.r && b.pool ? "out of memory" : err);
        goto out;
    }
    if (o->text && load_text(&b, err) < 0) {
        fprintf(stderr, "kvquant: %s: %s: %s\n", path, o->text, err);
        goto out;
    }
    for (int i = 0; i < o->len; i++)
        b.positions[i] = i;

    double cv[MAX_SEQS], ms_f16[MAX_SEQS];
    outcome one[N_SCHEMES];
    if (calibrate_layers(&b, err) < 0) {
        fprintf(stderr, "kvquant: %s: calibration: %s\n", path, err);
        goto out;
    }
    char weights[512];
    int at = 0;
    for (int l = 0; l < KV_CALIB_PARTS * n_layer && at < (int)sizeof weights - 16; l++)
        at += snprintf(weights + at, sizeof weights - (size_t)at, "%s%.3g", l ? "," : "",
                       b.layer_weight[l]);
    for (int q = 0; q < o->n_seqs; q++) {
        if (bench_sequence(&b, q, one, &ms_f16[q], &cv[q], err) < 0) {
            fprintf(stderr, "kvquant: %s: sequence %d: %s\n", path, q, err);
            goto out;
        }
        for (int s = 0; s < N_SCHEMES; s++)
            res[s][q] = one[s];
    }
    double ms_f16_med = bench_median(ms_f16, o->n_seqs);
    double cv_med = bench_median(cv, o->n_seqs), seconds = bench_now_s() - t_start;
    int positions = o->n_seqs * (o->len - o->prefix);
    for (int s = 0; s < N_SCHEMES; s++) {
        double lo = res[s][0].kl, hi = res[s][0].kl, rel[MAX_SEQS];
        int agree = 0;
        for (int q = 0; q < o->n_seqs; q++) {
            lo = res[s][q].kl < lo ? res[s][q].kl : lo;
            hi = res[s][q].kl > hi ? res[s][q].kl : hi;
            rel[q] = res[SCHEME_INT4][q].kl > 0 ? res[s][q].kl / res[SCHEME_INT4][q].kl : 0;
            agree += res[s][q].agree;
        }
        printf("{\"bench\":\"kvquant\",\"model\":\"%s\",\"dim\":%d,\"layers\":%d,\"heads\":%d,"
               "\"kv_heads\":%d,\"head_dim\":%d,\"seqs\":%d,\"len\":%d,\"prefix\":%d,"
               "\"density_window\":%d,\"scheme\":\"%s\",\"budget\":\"%s\",\"kl_median\":%.6g,"
               "\"kl_min\":%.6g,\"kl_max\":%.6g,\"kl_vs_int4\":%.3f,\"top1_agreement\":%.4f,"
               "\"bytes_vs_int8\":%.4f,\"k_bits\":%.2f,\"v_bits\":%.2f,\"decode_ms\":%.3f,"
               "\"decode_ms_f16\":%.3f,\"density_cv_median\":%.3f,\"layer_factors\":[%s],"
               "\"seconds\":%.1f}\n",
               path, hp->dim, hp->n_layer, hp->n_head, hp->n_head_kv, hp->head_dim, o->n_seqs,
               o->len, o->prefix, o->window < o->prefix ? o->window : o->prefix,
               schemes[s].name, budget_names[schemes[s].budget],
               field_median(res[s], o->n_seqs, offsetof(outcome, kl)), lo, hi,
               bench_median(rel, o->n_seqs), (double)agree / positions,
               field_median(res[s], o->n_seqs, offsetof(outcome, bytes)),
               field_median(res[s], o->n_seqs, offsetof(outcome, k_bits)),
               field_median(res[s], o->n_seqs, offsetof(outcome, v_bits)),
               field_median(res[s], o->n_seqs, offsetof(outcome, ms)), ms_f16_med, cv_med,
               weights, seconds);
    }
    fflush(stdout);
    status = 0;
out:
    free(res);
    free(b.text);
    free(b.tokens);
    free(b.positions);
    free(b.received);
    free(b.stats);
    free(b.section_stats);
    free(b.chunk_prec);
    free(b.prec);
    free(b.layer_weight);
    free(b.cal_stats);
    free(b.ref_logits);
    free(b.logits);
    kv_pool_free(b.pool);
    model_runner_free(b.r);
    model_free(b.m);
    return status;
}

/* Writes build/bench-models/kvquant-llama.gguf unless it exists. */
static int ensure_random_model(const bench_options *o, char *path, size_t cap)
{
    snprintf(path, cap, "build/bench-models/kvquant-llama-d256.gguf");
    if (access(path, R_OK) == 0)
        return 0;
    if (mkdir("build/bench-models", 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvquant: build/bench-models: %s\n", strerror(errno));
        return -1;
    }
    char err[ERR_MAX];
    modelgen_params p = {.arch = "llama", .dim = 256, .n_layer = 8, .n_head = 4, .n_head_kv = 2,
                         .n_ff = 768, .n_ctx = 1024, .type = QTYPE_F16, .seed = 1,
                         .n_vocab = 4096, .n_threads = o->n_threads};
    fprintf(stderr, "kvquant: generating %s\n", path);
    int rc = modelgen_write(&p, path, err);
    if (rc < 0) {
        fprintf(stderr, "kvquant: %s: %s\n", path, err);
        unlink(path);
    }
    return rc;
}

static int parse_int(const char *flag, const char *s, int min, int max, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end || v < min || v > max) {
        fprintf(stderr, "kvquant: %s wants an integer in [%d, %d]\n", flag, min, max);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* The docs models that exist under DIR/models into models[*n], and the held-out text as
 * o->text unless one was given; what is absent is said and skipped. */
static void add_docs(bench_options *o, const char **models, int *n)
{
    static char paths[2][1024], heldout[1024];
    static const char *names[2] = {"docs-lm-21M-F16.gguf", "docs-lm-21M-Q8_0.gguf"};
    if (!o->text) {
        snprintf(heldout, sizeof heldout, "%s/docs/heldout.txt", o->testdata);
        o->text = heldout;
    }
    if (access(o->text, R_OK) != 0) {
        fprintf(stderr, "kvquant: %s not found, the docs models skipped\n", o->text);
        return;
    }
    for (int i = 0; i < 2; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/models/%s", o->testdata, names[i]);
        if (access(paths[i], R_OK) == 0)
            models[(*n)++] = paths[i];
        else
            fprintf(stderr, "kvquant: %s not found, skipped\n", paths[i]);
    }
}

int main(int argc, char **argv)
{
    /* SEQS, len and prefix 0 until given: their defaults depend on --docs */
    bench_options o = {.n_threads = 2, .window = 32, .ratio = 0.6,
                       .testdata = "../shared/testdata"};
    bool docs = false;
    const char *models[16 + 2]; /* those named, then the docs models */
    int n_models = 0, failures = 0;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "";
        int rc = 0;
        if (!strcmp(argv[i], "-t"))
            rc = parse_int("-t", v, 1, 256, &o.n_threads), i++;
        else if (!strcmp(argv[i], "-s"))
            rc = parse_int("-s", v, 1, MAX_SEQS, &o.n_seqs), i++;
        else if (!strcmp(argv[i], "--len"))
            rc = parse_int("--len", v, 2 * KV_CHUNK_TOKENS, 1 << 16, &o.len), i++;
        else if (!strcmp(argv[i], "--prefix"))
            rc = parse_int("--prefix", v, KV_CHUNK_TOKENS, 1 << 16, &o.prefix), i++;
        else if (!strcmp(argv[i], "--ratio")) {
            char *end;
            double r = strtod(v, &end);
            rc = end == v || *end || !(r >= 0.25 && r <= 1) ? -1 : 0;
            if (rc < 0)
                fprintf(stderr, "kvquant: --ratio wants a number in [0.25, 1]\n");
            o.ratio = r;
            i++;
        } else if (!strcmp(argv[i], "--window"))
            rc = parse_int("--window", v, 1, 1 << 16, &o.window), i++;
        else if (!strcmp(argv[i], "--testdata"))
            o.testdata = v, i++;
        else if (!strcmp(argv[i], "--text"))
            o.text = v, i++;
        else if (!strcmp(argv[i], "--docs"))
            docs = true;
        else if (argv[i][0] == '-') {
            fprintf(stderr, "usage: %s [-t THREADS] [-s SEQS] [--len N] [--prefix N] "
                            "[--ratio R] [--window N] [--testdata DIR] [--text FILE] "
                            "[--docs] [MODEL.gguf ...]\n", argv[0]);
            return 2;
        } else if (n_models < 16)
            models[n_models++] = argv[i];
        if (rc < 0)
            return 2;
    }
    o.n_seqs = o.n_seqs ? o.n_seqs : docs ? 6 : 8;
    o.len = o.len ? o.len : docs ? 1536 : 512;
    o.prefix = o.prefix ? o.prefix : docs ? 1280 : 448;
    if (o.prefix >= o.len) {
        fprintf(stderr, "kvquant: --prefix must be below --len\n");
        return 2;
    }
    static char stories[1024], random_model[1024];
    if (docs) {
        add_docs(&o, models, &n_models);
        if (n_models == 0)
            return 0;
    } else if (n_models == 0) {
        snprintf(stories, sizeof stories, "%s/models/stories260K.gguf", o.testdata);
        if (access(stories, R_OK) == 0)
            models[n_models++] = stories;
        else
            fprintf(stderr, "kvquant: %s not found, skipped\n", stories);
        if (ensure_random_model(&o, random_model, sizeof random_model) == 0)
            models[n_models++] = random_model;
        else
            failures++;
    }
    for (int i = 0; i < n_models; i++)
        failures += bench_model(models[i], &o) != 0;
    return failures ? 1 : 0;
}
