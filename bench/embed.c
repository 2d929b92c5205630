/*
 * bench/embed — embedding throughput of bert and nomic-bert encoders against llama
 * decoders of the same shape: texts/s, ms per text and peak RSS.
 *
 *   build/bench/embed [--threads N] [-n TEXTS] [-t TOKENS] [--model NAME] [--batch B]
 *
 * Models (random weights, F16, the bge WordPiece vocabulary from the shared test data,
 * generated into build/bench-models/ on first use):
 *   bge-small  bert dim 384, 12 layers, 12 heads, FFN 1536 (33M parameters)
 *   bge-base   bert dim 768, 12 layers, 12 heads, FFN 3072 (110M)
 *   nomic-embed-text-v1  nomic-bert dim 768, 12 layers, 12 heads, SwiGLU FFN 3072 (137M)
 *   and as decoders: llama of the same dim, layers and heads, for bert with FFN 2/3 as
 *   wide (three FFN matrices instead of two: about the same parameters), tied output.
 * Texts are TOKENS token ids each ([CLS] ... [SEP] for the encoder), deterministic; the
 * encoder pools as its file says (bge CLS, nomic mean). For
 * batch B, B texts are evaluated together: the encoder stacks them in one bert_embed; a
 * decoder runs them as B sequences of one model_forward_batch, each from position 0 in
 * a fresh KV sequence, last-token pooling through the final norm (as Embed does). Each
 * (model, route, batch) runs in a child process, so peak RSS is its own (weights
 * mapped and touched included). --model and --batch run one shape or batch only, so that
 * a script can alternate runs of two shapes on a busy machine. One JSON object per line.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "engine/encoder/bert.h"
#include "engine/gguf/gguf.h"
#include "engine/kv/kv.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"

typedef struct shape {
    const char *name;
    const char *arch; /* of the encoder */
    int dim, n_layer, n_head, n_ff;
} shape;

static const shape SHAPES[] = {
    {"bge-small", "bert", 384, 12, 12, 1536},
    {"bge-base", "bert", 768, 12, 12, 3072},
    {"nomic-embed-text-v1", "nomic-bert", 768, 12, 12, 3072},
};
static const int BATCHES[] = {1, 16, 64};

static void make_tokens(int32_t *tok, int n_texts, int len, int n_vocab, int cls, int sep)
{
    uint64_t s = 12345;
    for (int i = 0; i < n_texts; i++)
        for (int j = 0; j < len; j++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int32_t id = 1000 + (int32_t)((s >> 33) % (uint64_t)(n_vocab - 1000));
            tok[(size_t)i * len + j] = j == 0 ? cls : j == len - 1 ? sep : id;
        }
}

/* Seconds for all texts through the encoder, batch texts at a time. */
static double run_encoder(const char *path, int threads, int n_texts, int len, int batch)
{
    char err[ERR_MAX];
    bert_model *m = bert_load(path, err);
    bert_runner *r = m ? bert_runner_new(m, threads, batch * len, err) : NULL;
    if (!r) {
        fprintf(stderr, "embed: %s\n", err);
        exit(1);
    }
    const bert_hparams *hp = bert_hparams_of(m);
    int32_t *tok = malloc(sizeof *tok * (size_t)n_texts * len);
    float *out = malloc(sizeof *out * (size_t)batch * hp->dim);
    int *lens = malloc(sizeof *lens * (size_t)batch);
    make_tokens(tok, n_texts, len, hp->n_vocab, 101, 102);
    for (int i = 0; i < batch; i++)
        lens[i] = len;
    double t0 = bench_now_s();
    for (int i = 0; i < n_texts; i += batch)
        if (bert_embed(r, batch, lens, tok + (size_t)i * len, NULL, hp->pooling, out, err) < 0) {
            fprintf(stderr, "embed: %s\n", err);
            exit(1);
        }
    double s = bench_now_s() - t0;
    free(lens);
    free(out);
    free(tok);
    bert_runner_free(r);
    bert_free(m);
    return s;
}

static double run_decoder(const char *path, int threads, int n_texts, int len, int batch)
{
    char err[ERR_MAX];
    model *m = model_load(path, err);
    model_runner *r = m ? model_runner_new(m, threads, batch * len, len, err) : NULL;
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    if (!pool) {
        fprintf(stderr, "embed: %s\n", err);
        exit(1);
    }
    const model_hparams *hp = model_hparams_of(m);
    int32_t *tok = malloc(sizeof *tok * (size_t)n_texts * len);
    int32_t *pos = malloc(sizeof *pos * (size_t)len);
    float *hidden = malloc(sizeof *hidden * (size_t)batch * hp->dim);
    kv_seq *seqs = malloc(sizeof *seqs * (size_t)batch);
    kv_seq **sp = malloc(sizeof *sp * (size_t)batch);
    model_batch *b = calloc((size_t)batch, sizeof *b);
    make_tokens(tok, n_texts, len, hp->n_vocab, 101, 102);
    for (int i = 0; i < len; i++)
        pos[i] = i;
    int32_t last = len - 1;
    double t0 = bench_now_s();
    for (int i = 0; i < n_texts; i += batch) {
        for (int j = 0; j < batch; j++) {
            kv_seq_init(&seqs[j], pool);
            sp[j] = &seqs[j];
            b[j] = (model_batch){.n_tokens = len, .tokens = tok + (size_t)(i + j) * len,
                                 .positions = pos, .n_out = 1, .out_rows = &last,
                                 .hidden_last = hidden + (size_t)j * hp->dim};
        }
        if (model_forward_batch(r, batch, sp, b, err) < 0) {
            fprintf(stderr, "embed: %s\n", err);
            exit(1);
        }
        for (int j = 0; j < batch; j++) {
            float *h = hidden + (size_t)j * hp->dim;
            model_output_norm(m, h, h);
            kv_seq_free(&seqs[j]);
        }
    }
    double s = bench_now_s() - t0;
    free(b);
    free(sp);
    free(seqs);
    free(hidden);
    free(pos);
    free(tok);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
    return s;
}

int main(int argc, char **argv)
{
    int threads = 2, n_texts = 64, len = 32, only_batch = 0;
    const char *only_model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-n") && i + 1 < argc)
            n_texts = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-t") && i + 1 < argc)
            len = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--model") && i + 1 < argc)
            only_model = argv[++i];
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc)
            only_batch = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: embed [--threads N] [-n TEXTS] [-t TOKENS] [--model NAME] "
                            "[--batch B]\n");
            return 2;
        }
    }
    if (threads < 1 || len < 2 || len > 512 || n_texts < 64 || n_texts % 64) {
        fprintf(stderr, "embed: threads >= 1, 2 <= TOKENS <= 512, TEXTS a multiple of 64\n");
        return 2;
    }
    bool model_ok = !only_model, batch_ok = !only_batch;
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++)
        model_ok = model_ok || !strcmp(only_model, SHAPES[si].name);
    for (size_t bi = 0; bi < sizeof BATCHES / sizeof BATCHES[0]; bi++)
        batch_ok = batch_ok || only_batch == BATCHES[bi];
    if (!model_ok || !batch_ok) {
        fprintf(stderr, "embed: --model is bge-small, bge-base or nomic-embed-text-v1; "
                        "--batch 1, 16 or 64\n");
        return 2;
    }
    const char *vocab_path = "../shared/testdata/vocab/ggml-vocab-bert-bge.gguf";
    char err[ERR_MAX];
    gguf_file *vocab = gguf_open(vocab_path, err);
    if (!vocab) {
        fprintf(stderr, "embed: %s: %s\n", vocab_path, err);
        return 1;
    }
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
        const shape *sh = &SHAPES[si];
        if (only_model && strcmp(only_model, sh->name) != 0)
            continue;
        char enc[256], dec[256];
        snprintf(enc, sizeof enc, "build/bench-models/%s-%s-f16.gguf", sh->name, sh->arch);
        snprintf(dec, sizeof dec, "build/bench-models/%s-llama-f16.gguf", sh->name);
        bool nomic = !strcmp(sh->arch, "nomic-bert");
        modelgen_params pe = {.arch = sh->arch, .dim = sh->dim, .n_layer = sh->n_layer,
                              .n_head = sh->n_head, .n_head_kv = sh->n_head, .n_ff = sh->n_ff,
                              .n_ctx = 512, .type = QTYPE_F16, .seed = 1, .vocab = vocab,
                              .n_threads = threads, .pooling_type = nomic ? 1 : 2};
        modelgen_params pd = pe;
        pd.arch = "llama";
        /* nomic's SwiGLU has the decoder's three FFN matrices already */
        pd.n_ff = nomic ? sh->n_ff : sh->n_ff * 2 / 3;
        pd.tie_output = true;
        if (bench_generate_model("embed", &pe, enc) < 0 || bench_generate_model("embed", &pd, dec) < 0)
            return 1;
        for (int route = 0; route < 2; route++)
            for (size_t bi = 0; bi < sizeof BATCHES / sizeof BATCHES[0]; bi++) {
                int batch = BATCHES[bi];
                if (only_batch && batch != only_batch)
                    continue;
                int fd[2];
                if (pipe(fd) < 0)
                    return 1;
                pid_t pid = fork();
                if (pid == 0) {
                    close(fd[0]);
                    double s = route == 0 ? run_encoder(enc, threads, n_texts, len, batch)
                                          : run_decoder(dec, threads, n_texts, len, batch);
                    if (write(fd[1], &s, sizeof s) != sizeof s)
                        _exit(1);
                    _exit(0);
                }
                close(fd[1]);
                double s = -1;
                if (read(fd[0], &s, sizeof s) != sizeof s)
                    s = -1;
                close(fd[0]);
                int status;
                struct rusage ru;
                if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) ||
                    WEXITSTATUS(status) != 0 || s < 0) {
                    fprintf(stderr, "embed: the %s run failed\n", route ? "decoder" : "encoder");
                    return 1;
                }
                printf("{\"bench\":\"embed\",\"model\":\"%s\",\"route\":\"%s\",\"type\":\"f16\","
                       "\"threads\":%d,\"batch\":%d,\"texts\":%d,\"tokens_per_text\":%d,"
                       "\"texts_per_s\":%.2f,\"ms_per_text\":%.3f,\"peak_rss_mb\":%.1f}\n",
                       sh->name, route ? "llama-decoder" : nomic ? "nomic-bert-encoder"
                                                                 : "bert-encoder",
                       threads, batch,
                       n_texts, len, n_texts / s, 1e3 * s / n_texts, ru.ru_maxrss / 1024.0);
                fflush(stdout);
            }
    }
    gguf_close(vocab);
    return 0;
}
