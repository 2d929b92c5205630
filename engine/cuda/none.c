/*
 * none.c — the CUDA backend's interface in a build without CUDA (make without CUDA=1):
 * every model stays on the CPU, and asking for a GPU says why it cannot have one.
 */
#include "engine/cuda/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void cuda_not_built(char err[ERR_MAX])
{
    snprintf(err, ERR_MAX, "cuda: this build has no CUDA backend (build with make CUDA=1)");
}

bool cuda_built(void)
{
    return false;
}

int cuda_device_count(char err[ERR_MAX])
{
    cuda_not_built(err);
    return 0;
}

int cuda_read_bandwidth(int device, double *gb_s, char err[ERR_MAX])
{
    (void)device;
    *gb_s = 0;
    cuda_not_built(err);
    return -1;
}

cuda_model *cuda_model_new(const model *m, int device, int max_batch, int max_kv,
                           char err[ERR_MAX])
{
    (void)m, (void)device, (void)max_batch, (void)max_kv;
    cuda_not_built(err);
    return NULL;
}

void cuda_model_free(cuda_model *cm)
{
    (void)cm;
}

const char *cuda_model_device_name(const cuda_model *cm)
{
    (void)cm;
    return "";
}

size_t cuda_model_weight_bytes(const cuda_model *cm)
{
    (void)cm;
    return 0;
}

int cuda_model_max_kv(const cuda_model *cm)
{
    (void)cm;
    return 0;
}

int cuda_model_max_batch(const cuda_model *cm)
{
    (void)cm;
    return 0;
}

void cuda_model_use_graphs(cuda_model *cm, bool on)
{
    (void)cm, (void)on;
}

cuda_seq *cuda_seq_new(cuda_model *cm, char err[ERR_MAX])
{
    (void)cm;
    cuda_not_built(err);
    return NULL;
}

void cuda_seq_free(cuda_seq *s)
{
    (void)s;
}

int cuda_seq_n_tokens(const cuda_seq *s)
{
    (void)s;
    return 0;
}

void cuda_seq_truncate(cuda_seq *s, int n)
{
    (void)s, (void)n;
}

void cuda_seq_entries(const cuda_seq *s, const int32_t **tokens, const int32_t **positions)
{
    (void)s;
    *tokens = *positions = NULL;
}

int cuda_forward_batch(cuda_model *cm, int n_seq, cuda_seq *const *seqs,
                       const model_batch *batches, int32_t *argmax, kv_seq *const *hosts,
                       char err[ERR_MAX])
{
    (void)cm, (void)n_seq, (void)seqs, (void)batches, (void)argmax, (void)hosts;
    cuda_not_built(err);
    return -1;
}

int cuda_seq_to_host(const cuda_seq *s, int from, kv_seq *host, char err[ERR_MAX])
{
    (void)s, (void)from, (void)host;
    cuda_not_built(err);
    return -1;
}

int cuda_seq_from_host(cuda_seq *s, const kv_seq *host, int from, char err[ERR_MAX])
{
    (void)s, (void)host, (void)from;
    cuda_not_built(err);
    return -1;
}
