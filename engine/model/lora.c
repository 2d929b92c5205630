/*
 * lora.c — loading a LoRA adapter and checking every tensor of it against its base model.
 *
 * The file stays mapped: its pairs are used in place, as the base's weights are.
 */
#include "engine/model/lora.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/quant/quant.h"

struct lora {
    const model *base;
    gguf_file *g;
    float alpha;
    int n_slots;
    lora_pair *pairs;   /* (n_slots); a.data NULL: the slot is not adapted */
    int n_pairs;
    int max_rank;
    size_t bytes;
};

static const char *const lora_kind_names[LORA_PER_LAYER] = {
    [LORA_Q] = "attn_q.weight",      [LORA_K] = "attn_k.weight",
    [LORA_V] = "attn_v.weight",      [LORA_O] = "attn_output.weight",
    [LORA_GATE] = "ffn_gate.weight", [LORA_UP] = "ffn_up.weight",
    [LORA_DOWN] = "ffn_down.weight",
};

/* Whether name is a pair's half of an expert tensor (ffn_gate_inp, ffn_*_exps, the
 * shared expert's ffn_*_shexp). */
static bool lora_names_experts(gguf_str name)
{
    static const char *const parts[] = {".ffn_gate_inp", "_exps.weight", "_shexp.weight"};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        size_t n = strlen(parts[i]);
        for (size_t j = 0; j + n <= name.len; j++)
            if (memcmp(name.ptr + j, parts[i], n) == 0)
                return true;
    }
    return false;
}

/* The slot of a base matrix's name (n bytes), or -1 when it is none the forward computes. */
static int lora_slot_of(const char *name, size_t n, int n_layer)
{
    if (n == 17 && memcmp(name, "token_embd.weight", 17) == 0)
        return LORA_SLOT_TOKEN_EMBD;
    if (n == 13 && memcmp(name, "output.weight", 13) == 0)
        return LORA_SLOT_OUTPUT;
    if (n < 6 || memcmp(name, "blk.", 4) != 0)
        return -1;
    size_t i = 4;
    long layer = 0;
    while (i < n && name[i] >= '0' && name[i] <= '9' && layer <= n_layer)
        layer = layer * 10 + (name[i++] - '0');
    if (i == 4 || i >= n || name[i] != '.' || layer >= n_layer || (name[4] == '0' && i > 5))
        return -1;
    i++;
    for (int k = 0; k < LORA_PER_LAYER; k++)
        if (strlen(lora_kind_names[k]) == n - i && memcmp(name + i, lora_kind_names[k], n - i) == 0)
            return LORA_SLOT((int)layer, k);
    return -1;
}

/* The name of a slot's base matrix into buf. */
static const char *lora_slot_name(int slot, char *buf, size_t cap)
{
    if (slot == LORA_SLOT_TOKEN_EMBD)
        snprintf(buf, cap, "token_embd.weight");
    else if (slot == LORA_SLOT_OUTPUT)
        snprintf(buf, cap, "output.weight");
    else
        snprintf(buf, cap, "blk.%d.%s", (slot - 2) / LORA_PER_LAYER,
                 lora_kind_names[(slot - 2) % LORA_PER_LAYER]);
    return buf;
}

static bool lora_ends_with(gguf_str s, const char *suffix)
{
    size_t n = strlen(suffix);
    return s.len >= n && memcmp(s.ptr + s.len - n, suffix, n) == 0;
}

/* A half of a pair as an ops_matrix of rows x cols, its tensor of exactly ne [cols, rows]
 * (checked by the caller) of a type the kernels compute with bytes enough. */
static int lora_matrix(const lora *l, const gguf_tensor *t, int64_t rows, int64_t cols,
                       ops_matrix *out, char err[ERR_MAX])
{
    char name[160];
    snprintf(name, sizeof name, "%.*s", (int)(t->name.len > 150 ? 150 : t->name.len), t->name.ptr);
    if (!model_gguf_tensor(l->g, name, 2, cols, rows, err))
        return -1;
    *out = (ops_matrix){.type = t->type, .data = t->data, .rows = (int)rows, .cols = (int)cols,
                        .row_bytes = quant_row_bytes(t->type, cols)};
    return 0;
}

/* Checks the pair of a slot (its halves' tensors in a and b, either NULL) against the
 * base's matrix and fills pairs[slot]. */
static int lora_check_pair(lora *l, int slot, const gguf_tensor *a, const gguf_tensor *b,
                           char err[ERR_MAX])
{
    const gguf_file *bg = model_gguf(l->base);
    char name[64];
    lora_slot_name(slot, name, sizeof name);
    if (!a || !b)
        return err_set(err, "%s: %s is missing (a pair is lora_a and lora_b)", name,
                       a ? "lora_b" : "lora_a");
    const gguf_tensor *w = gguf_find_tensor(bg, name);
    if (!w)
        return err_set(err, "%s: the base has no such matrix (an adapter of another model?)",
                       name);
    if (slot == LORA_SLOT_TOKEN_EMBD && !gguf_find_tensor(bg, "output.weight"))
        return err_set(err, "%s: the base ties its output to the token embedding, which an "
                            "adapter of it would change too (llama.cpp does not apply that "
                            "either)", name);
    /* the base checked its matrices at load: ne [in, out], 2-D */
    int64_t in = w->ne[0], out = w->ne[1];
    bool embd = slot == LORA_SLOT_TOKEN_EMBD;
    /* A [in, rank] (the embedding's [rank, n_vocab]), then B [rank, out] ([rank, dim]) */
    int64_t rank = embd ? a->ne[0] : a->ne[1];
    bool a_fits = a->n_dims == 2 && (embd ? a->ne[1] == out : a->ne[0] == in) && rank >= 1 &&
                  rank <= LORA_MAX_RANK;
    if (!a_fits)
        return err_set(err, "%s: lora_a has shape [%lld, %lld]; the base's %s needs %s%lld%s "
                            "(a rank of 1.." LORA_MAX_RANK_TEXT ")", name, (long long)a->ne[0], (long long)a->ne[1],
                       embd ? "token embedding" : "matrix", embd ? "[rank, " : "[",
                       (long long)(embd ? out : in), embd ? "]" : ", rank]");
    /* a delta of rank above its matrix's smaller side is no more than that side: refused,
     * so that the runner's scratch, as wide as the widest matrix, holds every rank */
    int64_t side = in < out ? in : out;
    if (rank > side)
        return err_set(err, "%s: rank %lld is above the %s's smaller side %lld", name,
                       (long long)rank, embd ? "token embedding" : "matrix", (long long)side);
    int64_t b_out = embd ? in : out;
    if (b->n_dims != 2 || b->ne[0] != rank || b->ne[1] != b_out)
        return err_set(err, "%s: lora_b has shape [%lld, %lld]; the base's %s needs [%lld, %lld]",
                       name, (long long)b->ne[0], (long long)b->ne[1],
                       embd ? "token embedding" : "matrix", (long long)rank, (long long)b_out);
    lora_pair *p = &l->pairs[slot];
    if (lora_matrix(l, a, embd ? out : rank, embd ? rank : in, &p->a, err) < 0 ||
        lora_matrix(l, b, b_out, rank, &p->b, err) < 0)
        return -1;
    p->factor = l->alpha != 0.0f ? l->alpha / (float)rank : 1.0f;
    l->n_pairs++;
    l->max_rank = (int)rank > l->max_rank ? (int)rank : l->max_rank;
    l->bytes += a->bytes + b->bytes;
    return 0;
}

/* The metadata: an adapter of type lora for the base's architecture, alpha a number. */
static int lora_check_kind(lora *l, char err[ERR_MAX])
{
    gguf_str s, arch;
    if (gguf_find_key(l->g, "general.type") < 0)
        return err_set(err, "not an adapter (no general.type)");
    if (!gguf_get_str(l->g, "general.type", &s) || !gguf_str_eq(s, "adapter"))
        return err_set(err, "not an adapter (general.type is '%.*s')",
                       (int)(s.len > 32 ? 32 : s.len), s.ptr);
    if (!gguf_get_str(l->g, "general.architecture", &s))
        return err_set(err, "no general.architecture");
    if (!gguf_get_str(model_gguf(l->base), "general.architecture", &arch) || s.len != arch.len ||
        memcmp(s.ptr, arch.ptr, s.len) != 0)
        return err_set(err, "an adapter of a %.*s model; the base is %.*s",
                       (int)(s.len > 32 ? 32 : s.len), s.ptr, (int)(arch.len > 32 ? 32 : arch.len),
                       arch.ptr);
    /* its attention's matrices are not the q/k/v/o the forward adds deltas to */
    if (model_hparams_of(l->base)->arch == MODEL_ARCH_DEEPSEEK2)
        return err_set(err, "adapters of deepseek2 models (multi-head latent attention) are not "
                            "supported");
    if (!gguf_get_str(l->g, "adapter.type", &s))
        return err_set(err, "no adapter.type (a LoRA adapter's is 'lora')");
    if (!gguf_str_eq(s, "lora"))
        return err_set(err, "adapter.type is '%.*s', not 'lora'", (int)(s.len > 32 ? 32 : s.len),
                       s.ptr);
    l->alpha = 0.0f;
    if (gguf_find_key(l->g, "adapter.lora.alpha") >= 0 &&
        (!gguf_get_f32(l->g, "adapter.lora.alpha", &l->alpha) || !isfinite(l->alpha)))
        return err_set(err, "adapter.lora.alpha is not a number");
    return 0;
}

/* Whether s contains needle. */
static bool lora_has(gguf_str s, const char *needle)
{
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= s.len; i++)
        if (memcmp(s.ptr + i, needle, n) == 0)
            return true;
    return false;
}

/* Every tensor: a half of a pair of a base matrix; then every pair whole and fitting. */
static int lora_check_tensors(lora *l, char err[ERR_MAX])
{
    int n_layer = model_hparams_of(l->base)->n_layer;
    l->n_slots = LORA_SLOT(n_layer, 0);
    l->pairs = calloc((size_t)l->n_slots, sizeof *l->pairs);
    const gguf_tensor **halves = calloc(2 * (size_t)l->n_slots, sizeof *halves);
    int rc = -1;
    if (!l->pairs || !halves) {
        err_set(err, "out of memory");
        goto out;
    }
    for (int64_t i = 0; i < gguf_n_tensors(l->g); i++) {
        const gguf_tensor *t = gguf_tensor_at(l->g, i);
        int shown = (int)(t->name.len > 96 ? 96 : t->name.len);
        bool a = lora_ends_with(t->name, ".lora_a"), b = lora_ends_with(t->name, ".lora_b");
        if (!a && !b && lora_ends_with(t->name, "_norm.weight")) {
            err_set(err, "tensor '%.*s': the adapter adapts norm weights, which llmsd does not "
                         "apply (llama.cpp reads past them: the model would not be the one "
                         "trained)", shown, t->name.ptr);
            goto out;
        }
        if (!a && !b) {
            err_set(err, "tensor '%.*s' is no .lora_a or .lora_b of a base matrix", shown,
                    t->name.ptr);
            goto out;
        }
        /* phi3's attn_qkv and ffn_up hold q, k, v and gate, up in one matrix each (glm4's
         * ffn_up too), which the forward reads as views: a delta of the whole would need
         * splitting too */
        enum model_arch arch = model_hparams_of(l->base)->arch;
        bool fused_up = arch == MODEL_ARCH_PHI3 || arch == MODEL_ARCH_GLM4 ||
                        arch == MODEL_ARCH_CHATGLM;
        if (lora_has(t->name, ".attn_qkv.weight.") ||
            (fused_up && lora_has(t->name, ".ffn_up.weight."))) {
            err_set(err, "%.*s: an adapter of a fused matrix (q, k, v or gate, up in one) is "
                         "not supported", (int)(t->name.len - 7 > 96 ? 96 : t->name.len - 7),
                    t->name.ptr);
            goto out;
        }
        if (lora_names_experts(t->name)) {
            err_set(err, "tensor '%.*s': the adapter adapts a mixture of experts' router or "
                         "experts, which llmsd does not apply (adapters of attention and "
                         "dense matrices are)", shown, t->name.ptr);
            goto out;
        }
        int slot = lora_slot_of(t->name.ptr, t->name.len - 7, n_layer);
        if (slot < 0) {
            err_set(err, "%.*s: the base has no such matrix (an adapter of another model?)",
                    (int)(t->name.len - 7 > 96 ? 96 : t->name.len - 7), t->name.ptr);
            goto out;
        }
        halves[2 * slot + (b ? 1 : 0)] = t;
    }
    for (int slot = 0; slot < l->n_slots; slot++)
        if ((halves[2 * slot] || halves[2 * slot + 1]) &&
            lora_check_pair(l, slot, halves[2 * slot], halves[2 * slot + 1], err) < 0)
            goto out;
    if (l->n_pairs == 0) {
        err_set(err, "the adapter adapts no matrix");
        goto out;
    }
    rc = 0;
out:
    free(halves);
    return rc;
}

lora *lora_load(const model *base, const char *path, char err[ERR_MAX])
{
    char why[ERR_MAX];
    lora *l = calloc(1, sizeof *l);
    if (!l) {
        err_set(err, "out of memory");
        return NULL;
    }
    l->base = base;
    if (!(l->g = gguf_open(path, why)) || lora_check_kind(l, why) < 0 ||
        lora_check_tensors(l, why) < 0) {
        err_set(err, "%s: %s", path, why);
        lora_free(l);
        return NULL;
    }
    return l;
}

void lora_free(lora *l)
{
    if (!l)
        return;
    gguf_close(l->g);
    free(l->pairs);
    free(l);
}

const model *lora_base(const lora *l)
{
    return l->base;
}

const lora_pair *lora_pair_at(const lora *l, int slot)
{
    return slot >= 0 && slot < l->n_slots && l->pairs[slot].a.data ? &l->pairs[slot] : NULL;
}

float lora_alpha(const lora *l)
{
    return l->alpha;
}

int lora_n_pairs(const lora *l)
{
    return l->n_pairs;
}

int lora_max_rank(const lora *l)
{
    return l->max_rank;
}

size_t lora_bytes(const lora *l)
{
    return l->bytes;
}
