/*
 * cuda_model.c — the CUDA backend's host side (cuda.h): the weights' upload, the device
 * KV of each sequence, one step's orchestration and the host tier.
 *
 * One step is: the token embeddings, RoPE angles and per-row attention descriptors are
 * written on the host into one pinned buffer and sent in a few transfers; then every
 * layer is a fixed sequence of kernel launches over all the step's rows on the model's
 * stream; the out rows' logits (or only their greedy ids) come back at the end. The
 * residual stream stays on the device: the output projection and the down projection add
 * straight into it.
 */
#include "engine/cuda/cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cuda/cuda_matmul.h"
#include "engine/cuda/cuda_ops.h"
#include "engine/quant/quant.h"

/* Steps of up to this many rows run their layers as a CUDA graph, captured at the first
 * step of each row count and replayed after: a TinyLlama-shaped decode step is ~370
 * kernel launches, whose launch costs alone outweigh reading the weights at batch 1. */
#define CUDA_GRAPH_MAX_ROWS 64
/* Graphs kept (the least recently used is destroyed for a new one). */
#define CUDA_GRAPHS_MAX 32
/* Device memory a new sequence leaves free. */
#define CUDA_SEQ_HEADROOM ((size_t)1 << 30)

/* cuBLAS's own workspace: set by us, so that captured products allocate nothing. */
#define CUDA_BLAS_WORKSPACE ((size_t)32 << 20)

/* The layers of a step of n_rows rows (with the step's K/V copied out or not). */
typedef struct cuda_graph {
    int n_rows;
    bool write_through;
    cudaGraphExec_t exec;
    uint64_t used;
} cuda_graph;

typedef struct cuda_layer {
    const float *attn_norm; /* (dim) */
    const float *ffn_norm;  /* (dim) */
    const float *bq;        /* (q_dim) qwen2, or NULL */
    const float *bk;        /* (kv_dim) */
    const float *bv;        /* (kv_dim) */
    const float *q_norm;    /* (head_dim) qwen3, or NULL */
    const float *k_norm;    /* (head_dim) */
    cuda_weight wq, wk, wv, wo, w_gate, w_up, w_down; /* shapes as model_layer_tensors */
} cuda_layer;

struct cuda_model {
    const model *m;
    model_hparams hp;
    int device;
    char device_name[256];
    int max_batch, max_kv;
    int q_dim, kv_dim;
    cudaStream_t stream;
    cublasHandle_t blas;

    void *weights;            /* device: every tensor below, one allocation */
    size_t weight_bytes;
    cuda_layer *layers;       /* (n_layer) */
    cuda_weight output;       /* (n_vocab, dim) */
    const float *output_norm; /* (dim) device */
    const ops_matrix *tok_embd; /* (n_vocab, dim) host: looked up there */
    const float *rope_freqs;  /* (rope_dims / 2) host, or NULL */

    void *scratch;            /* device: the buffers below, one allocation */
    float *x;                 /* (max_batch, dim) the residual stream */
    float *xn;                /* (max_batch, dim) a sublayer's normed input, the out rows' */
    float *xo;                /* (max_batch, dim) the out rows' residual stream */
    float *q;                 /* (max_batch, q_dim) */
    float *k, *v;             /* (max_batch, kv_dim) */
    float *att;               /* (max_batch, q_dim) */
    float *gate, *up;         /* (max_batch, n_ff) */
    float *logits;            /* (max_batch, n_vocab) */
    int32_t *argmax;          /* (max_batch) */
    uint16_t *act_half;       /* (max_batch, max(dim, q_dim, n_ff)) cuBLAS's activations */
    void *matvec_scratch;     /* cuda_matvec_scratch_bytes(max(dim, q_dim, n_ff), 8 rows):
                                 cuda_matvec's int8 activations */
    uint16_t *w_half;         /* (w_half_elems) a dequantized matrix for cuBLAS, or NULL */
    uint16_t *kv_out;         /* (max_batch, n_layer, 2, kv_dim) the step's new K/V */
    uint16_t *kv_out_host;    /* the same, pinned: written through to host sequences */

    /* A step's inputs: host (pinned) and device twins of the same layout. */
    void *in_host, *in_dev;
    size_t off_x, off_cs, off_rows, off_out; /* offsets of x (max_batch, dim), cs
                                                (max_batch, rope_dims), rows (max_batch)
                                                and out (max_batch) int32 */
    int32_t *argmax_host;     /* (max_batch) pinned */
    void *blas_workspace;     /* (CUDA_BLAS_WORKSPACE) device */
    bool graphs_on;           /* cuda_model_use_graphs */
    cuda_graph graphs[CUDA_GRAPHS_MAX];
    int n_graphs;
    uint64_t n_steps;
    float *recv_host;         /* (max_kv) pinned: a sequence's attention received */

    /* The host tier's staging, pinned: (n_layer, stage_entries, kv_dim) halves of K, then
     * of V. */
    uint16_t *stage;
    int stage_entries;
};

struct cuda_seq {
    cuda_model *cm;
    uint16_t *k;       /* (n_layer, max_kv, kv_dim) device */
    uint16_t *v;       /* (n_layer, max_kv, kv_dim) device */
    int32_t *pos;      /* (max_kv) device: each entry's position, for attention's mask */
    float *recv;       /* (max_kv) device: attention received in a step that wants it */
    int32_t *tokens_h; /* (max_kv) host: each entry's token, for the host tier */
    int32_t *pos_h;    /* (max_kv) host: each entry's position */
    int n;
};

static int cuda_fail(cudaError_t e, const char *what, char err[ERR_MAX])
{
    snprintf(err, ERR_MAX, "cuda: %s: %s", what, cudaGetErrorString(e));
    return -1;
}

static int cuda_blas_fail(cublasStatus_t st, const char *what, char err[ERR_MAX])
{
    snprintf(err, ERR_MAX, "cuda: %s: cuBLAS status %d", what, (int)st);
    return -1;
}

#define CUDA_TRY(call, what)                                                        \
    do {                                                                            \
        cudaError_t cuda_try_e = (call);                                            \
        if (cuda_try_e != cudaSuccess)                                              \
            return cuda_fail(cuda_try_e, what, err);                                \
    } while (0)

bool cuda_built(void)
{
    return true;
}

int cuda_device_count(char err[ERR_MAX])
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        cuda_fail(e, "no device", err);
        return 0;
    }
    if (n == 0)
        snprintf(err, ERR_MAX, "cuda: no device");
    return n;
}

static int cuda_compare_doubles(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int cuda_read_bandwidth(int device, double *gb_s, char err[ERR_MAX])
{
    const size_t bytes = (size_t)2 << 30;
    void *buf = NULL;
    unsigned long long *sink = NULL;
    cudaEvent_t t0 = NULL, t1 = NULL;
    double runs[5];
    int rc = 0;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaMalloc(&buf, bytes);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&sink, sizeof *sink);
    /* never measure zeros: a pattern the probe must really read */
    if (e == cudaSuccess)
        e = cudaMemset(buf, 0x5b, bytes);
    if (e == cudaSuccess)
        e = cudaEventCreate(&t0);
    if (e == cudaSuccess)
        e = cudaEventCreate(&t1);
    for (int i = -1; i < 5 && e == cudaSuccess; i++) {
        e = cudaEventRecord(t0, 0);
        if (e == cudaSuccess)
            e = cuda_read_all(buf, bytes / 16, sink, 0);
        if (e == cudaSuccess)
            e = cudaEventRecord(t1, 0);
        if (e == cudaSuccess)
            e = cudaEventSynchronize(t1);
        float ms = 0;
        if (e == cudaSuccess)
            e = cudaEventElapsedTime(&ms, t0, t1);
        if (e == cudaSuccess && i >= 0)
            runs[i] = bytes / (ms * 1e-3) / 1e9;
    }
    if (e != cudaSuccess) {
        rc = cuda_fail(e, "bandwidth probe", err);
    } else {
        qsort(runs, 5, sizeof *runs, cuda_compare_doubles);
        *gb_s = runs[2];
    }
    if (t0)
        cudaEventDestroy(t0);
    if (t1)
        cudaEventDestroy(t1);
    cudaFree(buf);
    cudaFree(sink);
    return rc;
}

/* ---- loading ---- */

/* What the forward here does not compute, or NULL when it computes m. */
static const char *cuda_unsupported(const model *m)
{
    const model_hparams *hp = model_hparams_of(m);
    if (hp->arch != MODEL_ARCH_LLAMA && hp->arch != MODEL_ARCH_QWEN2 &&
        hp->arch != MODEL_ARCH_QWEN3)
        return "its architecture (llama, qwen2 and qwen3 run on the GPU)";
    if (hp->n_expert)
        return "mixtures of experts";
    if (model_n_loras(m))
        return "LoRA adapters";
    if (hp->norm != MODEL_NORM_RMS || !hp->pre_norms || hp->post_norms)
        return "its norms";
    if (hp->swa_window || hp->sliding_window)
        return "sliding-window attention";
    if (hp->attn_softcap > 0 || hp->final_softcap > 0)
        return "soft-capping";
    if (hp->embd_scale != 1.0f || hp->residual_scale != 1.0f || hp->logit_scale != 1.0f)
        return "scaled embeddings, residuals or logits";
    if (hp->ffn_act != MODEL_FFN_SILU || hp->nope_step || hp->rope_swa)
        return "its feed-forward or RoPE variant";
    if (hp->head_dim % 8 || hp->head_dim > CUDA_ATTN_MAX_HEAD_DIM)
        return "a head_dim that is not a multiple of 8 up to 256";
    for (int l = 0; l < hp->n_layer; l++) {
        model_layer_tensors lt;
        model_layer_tensors_of(m, l, &lt);
        if (lt.bo)
            return "an attention output bias";
    }
    return NULL;
}

/* Device memory for one tensor of the arena: offsets are counted first (base NULL),
 * then the same walk copies. */
typedef struct cuda_arena {
    char *base; /* device, or NULL while sizing */
    size_t used;
} cuda_arena;

static const void *cuda_arena_put(cuda_arena *a, const void *src, size_t bytes, int *failed)
{
    size_t at = a->used;
    a->used = (a->used + bytes + 255) & ~(size_t)255;
    if (!a->base || !src)
        return NULL;
    if (cudaMemcpy(a->base + at, src, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
        *failed = 1;
    return a->base + at;
}

static cuda_weight cuda_put_matrix(cuda_arena *a, const ops_matrix *w, int *failed)
{
    cuda_weight d = {
        .type = w->type,
        .n_in = w->cols,
        .n_out = w->rows,
        .row_bytes = w->row_bytes,
    };
    d.data = cuda_arena_put(a, w->data, (size_t)w->rows * w->row_bytes, failed);
    return d;
}

static const float *cuda_put_vector(cuda_arena *a, const float *v, int n, int *failed)
{
    return v ? (const float *)cuda_arena_put(a, v, (size_t)n * sizeof(float), failed) : NULL;
}

/* Walks every tensor the forward reads into the arena (sizing it when a->base is NULL). */
static void cuda_put_weights(cuda_model *cm, cuda_arena *a, int *failed)
{
    const model_hparams *hp = &cm->hp;
    for (int l = 0; l < hp->n_layer; l++) {
        model_layer_tensors t;
        model_layer_tensors_of(cm->m, l, &t);
        cuda_layer *L = &cm->layers[l];
        L->attn_norm = cuda_put_vector(a, t.attn_norm, hp->dim, failed);
        L->ffn_norm = cuda_put_vector(a, t.ffn_norm, hp->dim, failed);
        L->bq = cuda_put_vector(a, t.extras.bq, cm->q_dim, failed);
        L->bk = cuda_put_vector(a, t.extras.bk, cm->kv_dim, failed);
        L->bv = cuda_put_vector(a, t.extras.bv, cm->kv_dim, failed);
        L->q_norm = cuda_put_vector(a, t.extras.q_norm, hp->head_dim, failed);
        L->k_norm = cuda_put_vector(a, t.extras.k_norm, hp->head_dim, failed);
        L->wq = cuda_put_matrix(a, &t.wq, failed);
        L->wk = cuda_put_matrix(a, &t.wk, failed);
        L->wv = cuda_put_matrix(a, &t.wv, failed);
        L->wo = cuda_put_matrix(a, &t.wo, failed);
        L->w_gate = cuda_put_matrix(a, &t.w_gate, failed);
        L->w_up = cuda_put_matrix(a, &t.w_up, failed);
        L->w_down = cuda_put_matrix(a, &t.w_down, failed);
    }
    cm->output = cuda_put_matrix(a, model_output_matrix(cm->m), failed);
    cm->output_norm = cuda_put_vector(a, model_output_norm_weight(cm->m), hp->dim, failed);
}

/* Every matrix's type is computed here and none is repacked; the largest quantized one's
 * elements (what cuBLAS's f16 copy needs). -1 + err. */
static int cuda_check_matrices(const model *m, size_t *largest_quant, char err[ERR_MAX])
{
    const model_hparams *hp = model_hparams_of(m);
    *largest_quant = 0;
    for (int l = -1; l < hp->n_layer; l++) {
        const ops_matrix *w[7];
        int n = 0;
        model_layer_tensors t;
        if (l < 0) {
            w[n++] = model_output_matrix(m);
        } else {
            model_layer_tensors_of(m, l, &t);
            if (!t.attn_norm || !t.ffn_norm || t.extras.q_norm_all) {
                snprintf(err, ERR_MAX, "cuda: layer %d's norms are not llama's", l);
                return -1;
            }
            const ops_matrix *lw[] = {&t.wq, &t.wk, &t.wv, &t.wo, &t.w_gate, &t.w_up, &t.w_down};
            for (int i = 0; i < 7; i++)
                w[n++] = lw[i];
        }
        for (int i = 0; i < n; i++) {
            const quant_traits *qt = quant_traits_of(w[i]->type);
            if (w[i]->data && w[i]->cols % 8) {
                snprintf(err, ERR_MAX, "cuda: a matrix of layer %d has rows of %d elements, "
                         "not a multiple of 8 (the GPU kernels' unit)", l, w[i]->cols);
                return -1;
            }
            if (!w[i]->data || w[i]->repacked || !cuda_matmul_type_supported(w[i]->type)) {
                snprintf(err, ERR_MAX,
                         "cuda: a matrix of layer %d is %s, which the GPU kernels do not "
                         "compute (F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K; not repacked)",
                         l, !w[i]->data ? "missing" : w[i]->repacked ? "repacked"
                                        : qt                          ? qt->name
                                                                      : "of an unknown type");
                return -1;
            }
            if (w[i]->type != QTYPE_F32 && w[i]->type != QTYPE_F16 &&
                w[i]->type != QTYPE_BF16 &&
                (size_t)w[i]->rows * w[i]->cols > *largest_quant)
                *largest_quant = (size_t)w[i]->rows * w[i]->cols;
        }
    }
    return 0;
}

static size_t cuda_align(size_t n)
{
    return (n + 255) & ~(size_t)255;
}

static int cuda_alloc_scratch(cuda_model *cm, size_t w_half_elems, char err[ERR_MAX])
{
    const model_hparams *hp = &cm->hp;
    size_t B = (size_t)cm->max_batch;
    size_t widest = (size_t)hp->dim;
    if ((size_t)cm->q_dim > widest)
        widest = cm->q_dim;
    if ((size_t)hp->n_ff > widest)
        widest = hp->n_ff;
    float **f32[] = {&cm->x, &cm->xn, &cm->xo, &cm->q, &cm->k, &cm->v, &cm->att, &cm->gate,
                     &cm->up, &cm->logits};
    size_t f32_n[] = {B * hp->dim, B * hp->dim, B * hp->dim, B * cm->q_dim, B * cm->kv_dim,
                      B * cm->kv_dim, B * cm->q_dim, B * hp->n_ff, B * hp->n_ff,
                      B * hp->n_vocab};
    size_t total = 0;
    for (size_t i = 0; i < sizeof f32_n / sizeof *f32_n; i++)
        total += cuda_align(f32_n[i] * sizeof(float));
    size_t kv_out_bytes = B * hp->n_layer * 2 * cm->kv_dim * 2;
    size_t matvec_bytes = cuda_matvec_scratch_bytes((int64_t)widest, CUDA_MATVEC_MAX_COLS);
    total += cuda_align(B * sizeof(int32_t)) + cuda_align(B * widest * 2) +
             cuda_align(matvec_bytes) + cuda_align(kv_out_bytes) + cuda_align(w_half_elems * 2);
    CUDA_TRY(cudaMalloc(&cm->scratch, total), "scratch memory");
    char *p = cm->scratch;
    for (size_t i = 0; i < sizeof f32_n / sizeof *f32_n; i++) {
        *f32[i] = (float *)p;
        p += cuda_align(f32_n[i] * sizeof(float));
    }
    cm->argmax = (int32_t *)p;
    p += cuda_align(B * sizeof(int32_t));
    cm->act_half = (uint16_t *)p;
    p += cuda_align(B * widest * 2);
    cm->matvec_scratch = p;
    p += cuda_align(matvec_bytes);
    cm->kv_out = (uint16_t *)p;
    p += cuda_align(kv_out_bytes);
    cm->w_half = w_half_elems ? (uint16_t *)p : NULL;

    cm->off_x = 0;
    cm->off_cs = cuda_align(B * hp->dim * sizeof(float));
    cm->off_rows = cm->off_cs + cuda_align(B * (hp->rope_dims + 2) * sizeof(float));
    cm->off_out = cm->off_rows + cuda_align(B * sizeof(cuda_row));
    size_t in_bytes = cm->off_out + cuda_align(B * sizeof(int32_t));
    CUDA_TRY(cudaMalloc(&cm->in_dev, in_bytes), "step input memory");
    CUDA_TRY(cudaHostAlloc(&cm->in_host, in_bytes, cudaHostAllocDefault), "pinned host memory");
    CUDA_TRY(cudaHostAlloc((void **)&cm->argmax_host, B * sizeof(int32_t), cudaHostAllocDefault),
             "pinned host memory");
    CUDA_TRY(cudaHostAlloc((void **)&cm->kv_out_host, kv_out_bytes, cudaHostAllocDefault),
             "pinned host memory");
    CUDA_TRY(cudaHostAlloc((void **)&cm->recv_host, (size_t)cm->max_kv * sizeof(float),
                           cudaHostAllocDefault),
             "pinned host memory");
    cm->stage_entries = cm->max_batch < KV_CHUNK_TOKENS ? KV_CHUNK_TOKENS : cm->max_batch;
    CUDA_TRY(cudaHostAlloc((void **)&cm->stage,
                           (size_t)2 * hp->n_layer * cm->stage_entries * cm->kv_dim * 2,
                           cudaHostAllocDefault),
             "pinned host memory");
    return 0;
}

static int cuda_model_init(cuda_model *cm, char err[ERR_MAX])
{
    const model_hparams *hp = &cm->hp;
    CUDA_TRY(cudaSetDevice(cm->device), "device");
    struct cudaDeviceProp prop;
    CUDA_TRY(cudaGetDeviceProperties(&prop, cm->device), "device properties");
    snprintf(cm->device_name, sizeof cm->device_name, "%s", prop.name);
    CUDA_TRY(cudaStreamCreateWithFlags(&cm->stream, cudaStreamNonBlocking), "stream");
    cublasStatus_t st = cublasCreate(&cm->blas);
    if (st != CUBLAS_STATUS_SUCCESS) {
        cm->blas = NULL;
        return cuda_blas_fail(st, "cuBLAS handle", err);
    }
    if ((st = cublasSetStream(cm->blas, cm->stream)) != CUBLAS_STATUS_SUCCESS)
        return cuda_blas_fail(st, "cuBLAS stream", err);
    CUDA_TRY(cudaMalloc(&cm->blas_workspace, CUDA_BLAS_WORKSPACE), "cuBLAS workspace");
    if ((st = cublasSetWorkspace(cm->blas, cm->blas_workspace, CUDA_BLAS_WORKSPACE)) !=
        CUBLAS_STATUS_SUCCESS)
        return cuda_blas_fail(st, "cuBLAS workspace", err);

    size_t w_half_elems;
    if (cuda_check_matrices(cm->m, &w_half_elems, err) < 0)
        return -1;
    if (!(cm->layers = calloc((size_t)hp->n_layer, sizeof *cm->layers))) {
        snprintf(err, ERR_MAX, "cuda: out of host memory");
        return -1;
    }
    cuda_arena a = {0};
    int failed = 0;
    cuda_put_weights(cm, &a, &failed);
    CUDA_TRY(cudaMalloc(&cm->weights, a.used), "weights' device memory");
    cm->weight_bytes = a.used;
    a = (cuda_arena){.base = cm->weights};
    cuda_put_weights(cm, &a, &failed);
    if (failed) {
        snprintf(err, ERR_MAX, "cuda: copying the weights to the device failed");
        return -1;
    }
    return cuda_alloc_scratch(cm, w_half_elems, err);
}

cuda_model *cuda_model_new(const model *m, int device, int max_batch, int max_kv,
                           char err[ERR_MAX])
{
    const char *why = cuda_unsupported(m);
    if (why) {
        snprintf(err, ERR_MAX, "cuda: %s model: the GPU backend does not run %s",
                 model_arch_name(model_hparams_of(m)->arch), why);
        return NULL;
    }
    int n_dev = cuda_device_count(err);
    if (n_dev == 0)
        return NULL;
    if (device < 0 || device >= n_dev) {
        snprintf(err, ERR_MAX, "cuda: device %d: this machine has %d", device, n_dev);
        return NULL;
    }
    cuda_model *cm = calloc(1, sizeof *cm);
    if (!cm) {
        snprintf(err, ERR_MAX, "cuda: out of host memory");
        return NULL;
    }
    cm->m = m;
    cm->hp = *model_hparams_of(m);
    cm->device = device;
    cm->max_batch = max_batch > 0 ? max_batch : 512;
    cm->max_kv = max_kv > 0 ? max_kv : cm->hp.n_ctx;
    cm->q_dim = cm->hp.n_head * cm->hp.head_dim;
    cm->kv_dim = cm->hp.n_head_kv * cm->hp.head_dim;
    cm->tok_embd = model_token_embedding(m);
    cm->graphs_on = true;
    cm->rope_freqs = model_rope_freqs(m);
    if (cuda_model_init(cm, err) < 0) {
        cuda_model_free(cm);
        return NULL;
    }
    return cm;
}

void cuda_model_free(cuda_model *cm)
{
    if (!cm)
        return;
    cudaSetDevice(cm->device);
    for (int i = 0; i < cm->n_graphs; i++)
        cudaGraphExecDestroy(cm->graphs[i].exec);
    if (cm->blas)
        cublasDestroy(cm->blas);
    cudaFree(cm->blas_workspace);
    if (cm->stream)
        cudaStreamDestroy(cm->stream);
    cudaFree(cm->weights);
    cudaFree(cm->scratch);
    cudaFree(cm->in_dev);
    cudaFreeHost(cm->in_host);
    cudaFreeHost(cm->argmax_host);
    cudaFreeHost(cm->recv_host);
    cudaFreeHost(cm->kv_out_host);
    cudaFreeHost(cm->stage);
    free(cm->layers);
    free(cm);
}

const char *cuda_model_device_name(const cuda_model *cm)
{
    return cm->device_name;
}

size_t cuda_model_weight_bytes(const cuda_model *cm)
{
    return cm->weight_bytes;
}

int cuda_model_max_kv(const cuda_model *cm)
{
    return cm->max_kv;
}

int cuda_model_max_batch(const cuda_model *cm)
{
    return cm->max_batch;
}

void cuda_model_use_graphs(cuda_model *cm, bool on)
{
    cm->graphs_on = on;
}

/* ---- sequences ---- */

cuda_seq *cuda_seq_new(cuda_model *cm, char err[ERR_MAX])
{
    cuda_seq *s = calloc(1, sizeof *s);
    size_t entries = (size_t)cm->max_kv;
    if (!s || !(s->tokens_h = malloc(entries * sizeof(int32_t))) ||
        !(s->pos_h = malloc(entries * sizeof(int32_t)))) {
        snprintf(err, ERR_MAX, "cuda: out of host memory");
        cuda_seq_free(s);
        return NULL;
    }
    s->cm = cm;
    size_t halves = (size_t)cm->hp.n_layer * entries * cm->kv_dim;
    size_t free_bytes = 0, total_bytes = 0;
    cudaError_t e = cudaSetDevice(cm->device);
    if (e == cudaSuccess)
        e = cudaMemGetInfo(&free_bytes, &total_bytes);
    /* what the graphs and cuBLAS may still need stays free */
    if (e == cudaSuccess && free_bytes < halves * 4 + CUDA_SEQ_HEADROOM) {
        snprintf(err, ERR_MAX, "cuda: a sequence's %zu MiB of K/V would leave less than %zu MiB "
                 "of the device's %zu MiB free", halves * 4 >> 20, CUDA_SEQ_HEADROOM >> 20,
                 free_bytes >> 20);
        cuda_seq_free(s);
        return NULL;
    }
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&s->k, halves * 2);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&s->v, halves * 2);
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&s->pos, entries * sizeof(int32_t));
    if (e == cudaSuccess)
        e = cudaMalloc((void **)&s->recv, entries * sizeof(float));
    if (e != cudaSuccess) {
        cuda_fail(e, "a sequence's KV memory", err);
        cuda_seq_free(s);
        return NULL;
    }
    return s;
}

void cuda_seq_free(cuda_seq *s)
{
    if (!s)
        return;
    if (s->cm)
        cudaSetDevice(s->cm->device);
    cudaFree(s->k);
    cudaFree(s->v);
    cudaFree(s->pos);
    cudaFree(s->recv);
    free(s->tokens_h);
    free(s->pos_h);
    free(s);
}

int cuda_seq_n_tokens(const cuda_seq *s)
{
    return s->n;
}

void cuda_seq_truncate(cuda_seq *s, int n)
{
    if (n >= 0 && n < s->n)
        s->n = n;
}

void cuda_seq_entries(const cuda_seq *s, const int32_t **tokens, const int32_t **positions)
{
    *tokens = s->tokens_h;
    *positions = s->pos_h;
}

/* ---- the forward ---- */

/* y (n, n_out) = x (n, n_in) . W^T (+= when accumulate). x_in_scratch: as
 * cuda_matvec_shared's, for products of one input (NULL: x is new). */
static int cuda_matmul(cuda_model *cm, const cuda_weight *w, const float *x, int n, float *y,
                       bool accumulate, bool *x_in_scratch, char err[ERR_MAX])
{
    if (n <= CUDA_MATVEC_MAX_COLS) {
        bool fresh = false;
        CUDA_TRY(cuda_matvec_shared(w, x, n, y, accumulate, cm->matvec_scratch,
                                    x_in_scratch ? x_in_scratch : &fresh, cm->stream),
                 "matrix-vector product");
        return 0;
    }
    bool float_weights =
        w->type == QTYPE_F32 || w->type == QTYPE_F16 || w->type == QTYPE_BF16;
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    int m_ = (int)w->n_out, k_ = (int)w->n_in;
    cublasStatus_t st;
    if (w->type == QTYPE_F32) {
        st = cublasSgemm(cm->blas, CUBLAS_OP_T, CUBLAS_OP_N, m_, n, k_, &alpha, w->data, k_, x,
                         k_, &beta, y, m_);
        return st == CUBLAS_STATUS_SUCCESS ? 0 : cuda_blas_fail(st, "sgemm", err);
    }
    bool bf16 = w->type == QTYPE_BF16;
    CUDA_TRY(cuda_f32_to_half(x, cm->act_half, (size_t)n * k_, bf16, cm->stream),
             "activation conversion");
    const void *a = w->data;
    if (!float_weights) {
        CUDA_TRY(cuda_dequantize_f16(w, cm->w_half, cm->stream), "dequantization");
        a = cm->w_half;
    }
    cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
    st = cublasGemmEx(cm->blas, CUBLAS_OP_T, CUBLAS_OP_N, m_, n, k_, &alpha, a, t, k_,
                      cm->act_half, t, k_, &beta, y, CUDA_R_32F, m_, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : cuda_blas_fail(st, "gemm", err);
}

static int cuda_check_batches(const cuda_model *cm, int n_seq, cuda_seq *const *seqs,
                              const model_batch *batches, kv_seq *const *hosts, int *n_rows,
                              int *n_out, char err[ERR_MAX])
{
    const model_hparams *hp = &cm->hp;
    *n_rows = *n_out = 0;
    if (n_seq < 1) {
        snprintf(err, ERR_MAX, "cuda: no batches");
        return -1;
    }
    for (int i = 0; i < n_seq; i++) {
        const model_batch *b = &batches[i];
        const cuda_seq *s = seqs[i];
        if (!s || s->cm != cm) {
            snprintf(err, ERR_MAX, "cuda: batch %d: its sequence is not this model's", i);
            return -1;
        }
        for (int j = 0; j < i; j++)
            if (seqs[j] == s) {
                snprintf(err, ERR_MAX, "cuda: batches %d and %d share a sequence", j, i);
                return -1;
            }
        if (b->hidden || b->attn || b->layer_ready ||
            (b->model && b->model != cm->m)) {
            snprintf(err, ERR_MAX,
                     "cuda: batch %d asks for what the GPU backend does not give (per-layer "
                     "hidden states, attention probabilities, layer callbacks, another model)",
                     i);
            return -1;
        }
        if (b->n_tokens < 0 || b->n_out < 0 || b->n_out > b->n_tokens ||
            (b->n_tokens && (!b->tokens || !b->positions))) {
            snprintf(err, ERR_MAX, "cuda: batch %d: bad sizes", i);
            return -1;
        }
        for (int t = 0; t < b->n_tokens; t++)
            if (b->tokens[t] < 0 || b->tokens[t] >= hp->n_vocab || b->positions[t] < 0) {
                snprintf(err, ERR_MAX, "cuda: batch %d token %d: id %d or position %d out of "
                         "range", i, t, b->tokens[t], b->positions[t]);
                return -1;
            }
        for (int o = 0; o < b->n_out; o++)
            if (b->out_rows[o] < 0 || b->out_rows[o] >= b->n_tokens ||
                (o && b->out_rows[o] <= b->out_rows[o - 1])) {
                snprintf(err, ERR_MAX, "cuda: batch %d: out rows must increase within the "
                         "batch", i);
                return -1;
            }
        if (hosts && kv_seq_n_tokens(hosts[i]) != s->n) {
            snprintf(err, ERR_MAX, "cuda: batch %d: the host sequence has %d entries, the "
                     "device's %d", i, kv_seq_n_tokens(hosts[i]), s->n);
            return -1;
        }
        if (s->n + b->n_tokens > cm->max_kv) {
            snprintf(err, ERR_MAX, "cuda: batch %d: %d entries would exceed the %d the "
                     "sequence holds", i, s->n + b->n_tokens, cm->max_kv);
            return -1;
        }
        *n_rows += b->n_tokens;
        *n_out += b->n_out;
    }
    if (*n_rows > cm->max_batch) {
        snprintf(err, ERR_MAX, "cuda: %d rows in one step, more than the %d it was sized for",
                 *n_rows, cm->max_batch);
        return -1;
    }
    return 0;
}

/* The step's inputs on the host, then on the device. */
static int cuda_send_inputs(cuda_model *cm, int n_seq, cuda_seq *const *seqs,
                            const model_batch *batches, int n_rows, int n_out,
                            char err[ERR_MAX])
{
    const model_hparams *hp = &cm->hp;
    char *in = cm->in_host;
    float *x = (float *)(in + cm->off_x);
    float *cs = (float *)(in + cm->off_cs);
    cuda_row *rows = (cuda_row *)(in + cm->off_rows);
    int32_t *out = (int32_t *)(in + cm->off_out);
    const ops_matrix *emb = cm->tok_embd;
    int r = 0, o_all = 0;
    for (int i = 0; i < n_seq; i++) {
        const model_batch *b = &batches[i];
        cuda_seq *s = seqs[i];
        for (int o = 0; o < b->n_out; o++)
            out[o_all++] = r + b->out_rows[o];
        for (int t = 0; t < b->n_tokens; t++, r++) {
            quant_dequantize_row(emb->type,
                                 (const char *)emb->data + (size_t)b->tokens[t] * emb->row_bytes,
                                 x + (size_t)r * hp->dim, hp->dim);
            if (hp->rope_dims > 0)
                ops_rope_angles(cs + (size_t)r * hp->rope_dims, b->positions[t], hp->rope_dims,
                                hp->rope_base, &hp->rope_scaling, cm->rope_freqs);
            rows[r] = (cuda_row){
                .k = s->k,
                .v = s->v,
                .pos = s->pos,
                .slot = s->n + t,
                .n_kv = s->n + b->n_tokens,
                .q_pos = b->positions[t],
                .recv = b->attn_received ? s->recv : NULL,
            };
        }
        if (b->attn_received)
            CUDA_TRY(cudaMemsetAsync(s->recv, 0, (size_t)(s->n + b->n_tokens) * sizeof(float),
                                     cm->stream),
                     "attention received");
    }
    char *dev = cm->in_dev;
    CUDA_TRY(cudaMemcpyAsync(dev + cm->off_x, x, (size_t)n_rows * hp->dim * sizeof(float),
                             cudaMemcpyHostToDevice, cm->stream),
             "sending the embeddings");
    if (hp->rope_dims > 0)
        CUDA_TRY(cudaMemcpyAsync(dev + cm->off_cs, cs,
                                 (size_t)n_rows * hp->rope_dims * sizeof(float),
                                 cudaMemcpyHostToDevice, cm->stream),
                 "sending the RoPE angles");
    CUDA_TRY(cudaMemcpyAsync(dev + cm->off_rows, rows, (size_t)n_rows * sizeof(cuda_row),
                             cudaMemcpyHostToDevice, cm->stream),
             "sending the rows");
    if (n_out)
        CUDA_TRY(cudaMemcpyAsync(dev + cm->off_out, out, (size_t)n_out * sizeof(int32_t),
                                 cudaMemcpyHostToDevice, cm->stream),
                 "sending the out rows");
    CUDA_TRY(cudaMemcpyAsync(cm->x, dev + cm->off_x, (size_t)n_rows * hp->dim * sizeof(float),
                             cudaMemcpyDeviceToDevice, cm->stream),
             "the residual stream");
    return 0;
}

static int cuda_layer_forward(cuda_model *cm, int l, int n, bool write_through,
                              char err[ERR_MAX])
{
    const model_hparams *hp = &cm->hp;
    const cuda_layer *L = &cm->layers[l];
    cudaStream_t st = cm->stream;
    const cuda_row *rows = (const cuda_row *)((char *)cm->in_dev + cm->off_rows);
    const float *cs = (const float *)((char *)cm->in_dev + cm->off_cs);
    size_t layer_off = (size_t)l * cm->max_kv * cm->kv_dim;

    CUDA_TRY(cuda_rmsnorm(cm->x, L->attn_norm, cm->xn, n, hp->dim, hp->norm_eps, st),
             "attention norm");
    bool xn_in_scratch = false;
    if (cuda_matmul(cm, &L->wq, cm->xn, n, cm->q, false, &xn_in_scratch, err) < 0 ||
        cuda_matmul(cm, &L->wk, cm->xn, n, cm->k, false, &xn_in_scratch, err) < 0 ||
        cuda_matmul(cm, &L->wv, cm->xn, n, cm->v, false, &xn_in_scratch, err) < 0)
        return -1;
    if (L->bq) {
        CUDA_TRY(cuda_add_bias(cm->q, L->bq, n, cm->q_dim, st), "q bias");
        CUDA_TRY(cuda_add_bias(cm->k, L->bk, n, cm->kv_dim, st), "k bias");
        CUDA_TRY(cuda_add_bias(cm->v, L->bv, n, cm->kv_dim, st), "v bias");
    }
    if (L->q_norm) {
        CUDA_TRY(cuda_head_rmsnorm(cm->q, L->q_norm, n * hp->n_head, hp->head_dim,
                                   hp->norm_eps, st),
                 "q norm");
        CUDA_TRY(cuda_head_rmsnorm(cm->k, L->k_norm, n * hp->n_head_kv, hp->head_dim,
                                   hp->norm_eps, st),
                 "k norm");
    }
    if (hp->rope_dims > 0) {
        bool interleaved = hp->rope_style == MODEL_ROPE_INTERLEAVED;
        CUDA_TRY(cuda_rope(cm->q, cm->k, cs, n, hp->n_head, hp->n_head_kv, hp->head_dim,
                           hp->rope_dims, interleaved, st),
                 "RoPE");
    }
    CUDA_TRY(cuda_kv_append(cm->k, cm->v, rows, n, cm->kv_dim, l, hp->n_layer, cm->max_kv,
                            write_through ? cm->kv_out : NULL, st),
             "KV append");
    CUDA_TRY(cuda_attention(cm->q, rows, n, hp->n_head, hp->n_head_kv, hp->head_dim, layer_off,
                            hp->attn_scale, cm->att, st),
             "attention");
    if (cuda_matmul(cm, &L->wo, cm->att, n, cm->x, true, NULL, err) < 0)
        return -1;

    CUDA_TRY(cuda_rmsnorm(cm->x, L->ffn_norm, cm->xn, n, hp->dim, hp->norm_eps, st),
             "feed-forward norm");
    xn_in_scratch = false;
    if (cuda_matmul(cm, &L->w_gate, cm->xn, n, cm->gate, false, &xn_in_scratch, err) < 0 ||
        cuda_matmul(cm, &L->w_up, cm->xn, n, cm->up, false, &xn_in_scratch, err) < 0)
        return -1;
    CUDA_TRY(cuda_swiglu(cm->gate, cm->up, (size_t)n * hp->n_ff, st), "SwiGLU");
    return cuda_matmul(cm, &L->w_down, cm->gate, n, cm->x, true, NULL, err);
}

static int cuda_layers_launched(cuda_model *cm, int n, bool write_through, char err[ERR_MAX])
{
    for (int l = 0; l < cm->hp.n_layer; l++)
        if (cuda_layer_forward(cm, l, n, write_through, err) < 0)
            return -1;
    return 0;
}

/* A new graph of the layers for n rows, in place of the least recently used when all
 * slots are taken. */
static cuda_graph *cuda_capture(cuda_model *cm, int n, bool write_through, char err[ERR_MAX])
{
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaError_t e = cudaStreamBeginCapture(cm->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cuda_fail(e, "graph capture", err);
        return NULL;
    }
    int rc = cuda_layers_launched(cm, n, write_through, err);
    e = cudaStreamEndCapture(cm->stream, &graph);
    if (rc < 0) {
        if (graph)
            cudaGraphDestroy(graph);
        return NULL;
    }
    if (e == cudaSuccess)
        e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph)
        cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        cuda_fail(e, "graph capture", err);
        return NULL;
    }
    cuda_graph *g = &cm->graphs[cm->n_graphs < CUDA_GRAPHS_MAX ? cm->n_graphs++ : 0];
    for (int i = 0; i < cm->n_graphs; i++)
        if (cm->graphs[i].used < g->used)
            g = &cm->graphs[i];
    if (g->exec)
        cudaGraphExecDestroy(g->exec);
    *g = (cuda_graph){.n_rows = n, .write_through = write_through, .exec = exec};
    return g;
}

/* The layers of a step of n rows: replayed from its graph (captured at its first step)
 * up to CUDA_GRAPH_MAX_ROWS rows, launched one by one beyond. */
static int cuda_layers(cuda_model *cm, int n, bool write_through, char err[ERR_MAX])
{
    if (!cm->graphs_on || n > CUDA_GRAPH_MAX_ROWS)
        return cuda_layers_launched(cm, n, write_through, err);
    cuda_graph *g = NULL;
    for (int i = 0; i < cm->n_graphs && !g; i++)
        if (cm->graphs[i].n_rows == n && cm->graphs[i].write_through == write_through)
            g = &cm->graphs[i];
    if (!g && !(g = cuda_capture(cm, n, write_through, err)))
        return -1;
    g->used = ++cm->n_steps;
    CUDA_TRY(cudaGraphLaunch(g->exec, cm->stream), "graph launch");
    return 0;
}

/* The out rows' hidden states, logits and greedy ids, back to the host. */
static int cuda_outputs(cuda_model *cm, int n_seq, const model_batch *batches, int n_out,
                        int32_t *argmax, char err[ERR_MAX])
{
    const model_hparams *hp = &cm->hp;
    cudaStream_t st = cm->stream;
    bool want_logits = argmax != NULL;
    for (int i = 0; i < n_seq; i++)
        want_logits |= batches[i].logits && batches[i].n_out;
    const int32_t *out = (const int32_t *)((char *)cm->in_dev + cm->off_out);
    CUDA_TRY(cuda_gather_rows(cm->x, out, n_out, hp->dim, cm->xo, st), "gathering out rows");
    if (want_logits) {
        CUDA_TRY(cuda_rmsnorm(cm->xo, cm->output_norm, cm->xn, n_out, hp->dim, hp->norm_eps, st),
                 "output norm");
        if (cuda_matmul(cm, &cm->output, cm->xn, n_out, cm->logits, false, NULL, err) < 0)
            return -1;
    }
    if (argmax) {
        CUDA_TRY(cuda_argmax(cm->logits, n_out, hp->n_vocab, cm->argmax, st), "greedy pick");
        CUDA_TRY(cudaMemcpyAsync(cm->argmax_host, cm->argmax, (size_t)n_out * sizeof(int32_t),
                                 cudaMemcpyDeviceToHost, st),
                 "greedy ids");
    }
    int o = 0;
    for (int i = 0; i < n_seq; i++) {
        const model_batch *b = &batches[i];
        if (b->logits && b->n_out)
            CUDA_TRY(cudaMemcpyAsync(b->logits, cm->logits + (size_t)o * hp->n_vocab,
                                     (size_t)b->n_out * hp->n_vocab * sizeof(float),
                                     cudaMemcpyDeviceToHost, st),
                     "logits");
        if (b->hidden_last && b->n_out)
            CUDA_TRY(cudaMemcpyAsync(b->hidden_last, cm->xo + (size_t)o * hp->dim,
                                     (size_t)b->n_out * hp->dim * sizeof(float),
                                     cudaMemcpyDeviceToHost, st),
                     "hidden states");
        o += b->n_out;
    }
    CUDA_TRY(cudaStreamSynchronize(st), "the step");
    if (argmax)
        memcpy(argmax, cm->argmax_host, (size_t)n_out * sizeof(int32_t));
    return 0;
}

/* Adds each batch's sequence's attention received into its attn_received. */
static int cuda_received(cuda_model *cm, int n_seq, cuda_seq *const *seqs,
                         const model_batch *batches, char err[ERR_MAX])
{
    for (int i = 0; i < n_seq; i++) {
        const model_batch *b = &batches[i];
        int n_kv = seqs[i]->n + b->n_tokens;
        if (!b->attn_received || !b->n_tokens)
            continue;
        CUDA_TRY(cudaMemcpy(cm->recv_host, seqs[i]->recv, (size_t)n_kv * sizeof(float),
                            cudaMemcpyDeviceToHost),
                 "attention received");
        for (int j = 0; j < n_kv; j++)
            b->attn_received[j] += cm->recv_host[j];
    }
    return 0;
}

/* Appends one entry to host, in space reserved there: its token and position, and layer
 * l's K from k + l * layer_stride, its V from v + l * layer_stride (kv_dim halves each).
 * -1 when no room was reserved. */
static int cuda_host_append(kv_seq *host, kv_shape shape, int32_t token, int32_t pos,
                            const uint16_t *k, const uint16_t *v, size_t layer_stride)
{
    kv_chunk *c;
    int idx, hd = shape.head_dim;
    if (kv_seq_append(host, token, pos, &c, &idx) < 0)
        return -1;
    for (int l = 0; l < shape.n_layer; l++)
        for (int h = 0; h < shape.n_head_kv; h++) {
            size_t src = l * layer_stride + (size_t)h * hd;
            memcpy(kv_chunk_k_f16(c, shape, l, h) + (size_t)idx * hd, k + src, (size_t)hd * 2);
            memcpy(kv_chunk_v_f16(c, shape, l, h) + (size_t)idx * hd, v + src, (size_t)hd * 2);
        }
    return 0;
}

/* The step's new K/V (cm->kv_out_host: (row, layer, K then V, kv_dim)) appended to each
 * host sequence, in space reserved before the step. */
static void cuda_write_through(cuda_model *cm, int n_seq, const model_batch *batches,
                               kv_seq *const *hosts)
{
    kv_shape shape = model_kv_shape(cm->m);
    size_t layer_stride = (size_t)2 * cm->kv_dim;
    int r = 0;
    for (int i = 0; i < n_seq; i++)
        for (int t = 0; t < batches[i].n_tokens; t++, r++) {
            const uint16_t *k = cm->kv_out_host + (size_t)r * shape.n_layer * layer_stride;
            cuda_host_append(hosts[i], shape, batches[i].tokens[t], batches[i].positions[t], k,
                             k + cm->kv_dim, layer_stride);
        }
}

int cuda_forward_batch(cuda_model *cm, int n_seq, cuda_seq *const *seqs,
                       const model_batch *batches, int32_t *argmax, kv_seq *const *hosts,
                       char err[ERR_MAX])
{
    int n_rows, n_out;
    if (cuda_check_batches(cm, n_seq, seqs, batches, hosts, &n_rows, &n_out, err) < 0)
        return -1;
    if (n_rows == 0)
        return 0;
    for (int i = 0; hosts && i < n_seq; i++)
        if (kv_seq_reserve(hosts[i], batches[i].n_tokens, err) < 0) {
            for (int j = 0; j <= i; j++)
                kv_seq_truncate(hosts[j], seqs[j]->n);
            return -1;
        }
    CUDA_TRY(cudaSetDevice(cm->device), "device");
    if (cuda_send_inputs(cm, n_seq, seqs, batches, n_rows, n_out, err) < 0)
        return -1;
    if (cuda_layers(cm, n_rows, hosts != NULL, err) < 0)
        return -1;
    if (hosts)
        CUDA_TRY(cudaMemcpyAsync(cm->kv_out_host, cm->kv_out,
                                 (size_t)n_rows * cm->hp.n_layer * 2 * cm->kv_dim * 2,
                                 cudaMemcpyDeviceToHost, cm->stream),
                 "the step's K/V");
    if (n_out && cuda_outputs(cm, n_seq, batches, n_out, argmax, err) < 0)
        return -1;
    if (!n_out)
        CUDA_TRY(cudaStreamSynchronize(cm->stream), "the step");
    if (cuda_received(cm, n_seq, seqs, batches, err) < 0)
        return -1;
    if (hosts)
        cuda_write_through(cm, n_seq, batches, hosts);
    for (int i = 0; i < n_seq; i++) {
        cuda_seq *s = seqs[i];
        const model_batch *b = &batches[i];
        memcpy(s->tokens_h + s->n, b->tokens, (size_t)b->n_tokens * sizeof(int32_t));
        memcpy(s->pos_h + s->n, b->positions, (size_t)b->n_tokens * sizeof(int32_t));
        s->n += b->n_tokens;
    }
    return 0;
}

/* ---- the host tier ---- */

/* Entries [at, at + n) of every layer's K and V, device -> stage ((layer, entry, kv_dim)
 * halves, K then V) or back. */
static int cuda_stage_copy(cuda_model *cm, const cuda_seq *s, int at, int n, bool to_device,
                           char err[ERR_MAX])
{
    size_t row = (size_t)cm->kv_dim * 2, dev_pitch = (size_t)cm->max_kv * row;
    size_t stage_pitch = (size_t)cm->stage_entries * row;
    size_t dev_off = (size_t)at * cm->kv_dim;
    uint16_t *hk = cm->stage, *hv = cm->stage + (size_t)cm->hp.n_layer * cm->stage_entries * cm->kv_dim;
    int layers = cm->hp.n_layer;
    if (to_device) {
        CUDA_TRY(cudaMemcpy2D(s->k + dev_off, dev_pitch, hk, stage_pitch, n * row, layers,
                              cudaMemcpyHostToDevice),
                 "K upload");
        CUDA_TRY(cudaMemcpy2D(s->v + dev_off, dev_pitch, hv, stage_pitch, n * row, layers,
                              cudaMemcpyHostToDevice),
                 "V upload");
    } else {
        CUDA_TRY(cudaMemcpy2D(hk, stage_pitch, s->k + dev_off, dev_pitch, n * row, layers,
                              cudaMemcpyDeviceToHost),
                 "K download");
        CUDA_TRY(cudaMemcpy2D(hv, stage_pitch, s->v + dev_off, dev_pitch, n * row, layers,
                              cudaMemcpyDeviceToHost),
                 "V download");
    }
    return 0;
}

int cuda_seq_to_host(const cuda_seq *s, int from, kv_seq *host, char err[ERR_MAX])
{
    cuda_model *cm = s->cm;
    kv_shape shape = model_kv_shape(cm->m);
    if (from < 0 || from > s->n || kv_seq_n_tokens(host) != from) {
        snprintf(err, ERR_MAX, "cuda: the host sequence has %d entries, not %d",
                 kv_seq_n_tokens(host), from);
        return -1;
    }
    if (kv_seq_reserve(host, s->n - from, err) < 0)
        return -1;
    CUDA_TRY(cudaSetDevice(cm->device), "device");
    size_t layer_stage = (size_t)cm->stage_entries * cm->kv_dim;
    size_t v_off = (size_t)shape.n_layer * layer_stage;
    for (int at = from; at < s->n; at += cm->stage_entries) {
        int n = s->n - at < cm->stage_entries ? s->n - at : cm->stage_entries;
        if (cuda_stage_copy(cm, s, at, n, false, err) < 0)
            return -1;
        for (int e = 0; e < n; e++) {
            const uint16_t *k = cm->stage + (size_t)e * cm->kv_dim;
            if (cuda_host_append(host, shape, s->tokens_h[at + e], s->pos_h[at + e], k,
                                 k + v_off, layer_stage) < 0) {
                snprintf(err, ERR_MAX, "cuda: the host sequence has no room reserved");
                return -1;
            }
        }
    }
    return 0;
}

/* Chunk c's entries into the stage at entry `at`, as f16 whatever its precision. */
static void cuda_stage_chunk(cuda_model *cm, const kv_chunk *c, int at, float *kf, float *vf)
{
    kv_shape shape = model_kv_shape(cm->m);
    int hd = shape.head_dim;
    size_t layer_stage = (size_t)cm->stage_entries * cm->kv_dim;
    size_t v_off = (size_t)shape.n_layer * layer_stage;
    for (int l = 0; l < shape.n_layer; l++)
        for (int h = 0; h < shape.n_head_kv; h++) {
            bool f16 = c->layer_precision[l] == KV_F16;
            if (!f16)
                kv_chunk_read_f32(c, shape, l, h, kf, vf);
            for (int e = 0; e < c->n_tokens; e++) {
                uint16_t *dk = cm->stage + l * layer_stage + (size_t)(at + e) * cm->kv_dim +
                               (size_t)h * hd;
                uint16_t *dv = dk + v_off;
                if (f16) {
                    memcpy(dk, kv_chunk_k_f16(c, shape, l, h) + (size_t)e * hd, (size_t)hd * 2);
                    memcpy(dv, kv_chunk_v_f16(c, shape, l, h) + (size_t)e * hd, (size_t)hd * 2);
                } else {
                    for (int d = 0; d < hd; d++) {
                        dk[d] = quant_f32_to_f16(kf[(size_t)e * hd + d]);
                        dv[d] = quant_f32_to_f16(vf[(size_t)e * hd + d]);
                    }
                }
            }
        }
}

int cuda_seq_from_host(cuda_seq *s, const kv_seq *host, int from, char err[ERR_MAX])
{
    cuda_model *cm = s->cm;
    kv_shape shape = model_kv_shape(cm->m);
    int n = kv_seq_n_tokens(host);
    if (n > cm->max_kv || from < 0 || from > s->n || from > n) {
        snprintf(err, ERR_MAX, "cuda: entries %d.. of %d do not fit the %d a sequence holds, "
                 "after its %d", from, n, cm->max_kv, s->n);
        return -1;
    }
    for (int c = from / KV_CHUNK_TOKENS; c < host->n_chunks; c++)
        if (!host->chunks[c]) {
            snprintf(err, ERR_MAX, "cuda: chunk %d of the host sequence is not resident", c);
            return -1;
        }
    float *kf = malloc((size_t)KV_CHUNK_TOKENS * shape.head_dim * sizeof(float) * 2);
    if (!kf) {
        snprintf(err, ERR_MAX, "cuda: out of host memory");
        return -1;
    }
    float *vf = kf + (size_t)KV_CHUNK_TOKENS * shape.head_dim;
    /* whole chunks are staged, from the one holding entry `from`: entries before it are
     * uploaded again, the same bits */
    int first = from / KV_CHUNK_TOKENS, at = first * KV_CHUNK_TOKENS, rc = 0, staged = 0;
    cudaError_t e = cudaSetDevice(cm->device);
    if (e != cudaSuccess)
        rc = cuda_fail(e, "device", err);
    for (int c = first; rc == 0 && c <= host->n_chunks; c++) {
        const kv_chunk *ch = c < host->n_chunks ? host->chunks[c] : NULL;
        if (staged && (!ch || staged + ch->n_tokens > cm->stage_entries)) {
            rc = cuda_stage_copy(cm, s, at - staged, staged, true, err);
            staged = 0;
        }
        if (!ch || rc)
            continue;
        cuda_stage_chunk(cm, ch, staged, kf, vf);
        memcpy(s->tokens_h + at, ch->tokens, (size_t)ch->n_tokens * sizeof(int32_t));
        memcpy(s->pos_h + at, ch->positions, (size_t)ch->n_tokens * sizeof(int32_t));
        staged += ch->n_tokens;
        at += ch->n_tokens;
    }
    free(kf);
    if (rc == 0 && n > 0 &&
        (e = cudaMemcpy(s->pos, s->pos_h, (size_t)n * sizeof(int32_t),
                        cudaMemcpyHostToDevice)) != cudaSuccess)
        rc = cuda_fail(e, "positions upload", err);
    s->n = rc == 0 ? n : from;
    return rc;
}
