/*
 * llmsd with `device = cuda`: a random-weight llama (Q8_0, the shared test data's
 * llama-spm vocabulary) runs on the GPU. llama.cpp's /completion on token ids answers with
 * the greedy ids and log-probabilities a GPU runner in this process gives (a prompt of 40
 * in one step, then one token a step, as the daemon schedules a lone request), and the
 * log says where the model runs. A gemma2 model, which the GPU backend does not run, stays on the
 * CPU with a warning and is served. A context on the GPU continued after a restart (its
 * K/V then come from the store, through host memory, back to the GPU) answers as the same
 * turns without the restart (TinyStories-656K: a real tokenizer and trained weights).
 * Skips without a GPU or in a build without CUDA.
 */
#include <grp.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/llms.h"
#include "engine/cuda/cuda.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define N_PROMPT 40
#define N_GEN 24

static char llmsd_path[1024], model_path[1024], gemma_path[1024], http_sock[1100];
static char gpu_why[ERR_MAX];
static llmsd_proc d;
static int up; /* 1: running; -1: did not start */

#define NEED()                                                                          \
    do {                                                                                \
        if (!llmsd_path[0])                                                             \
            SKIP("llmsd is not built in this tree");                                    \
        if (gpu_why[0])                                                                 \
            SKIP("%s", gpu_why);                                                        \
        if (!model_path[0])                                                             \
            SKIP("no vocab/ggml-vocab-llama-spm.gguf in the test data (LLMS_TESTDATA)"); \
        if (!up) {                                                                      \
            char extra_[2000];                                                          \
            struct group *g_ = getgrgid(getgid());                                      \
            proc_fmt(extra_, sizeof extra_,                                             \
                     "device = cuda\nkv_compress = none\nadmin_group = %s\n"            \
                     "http_socket = %s\nmodel.gemma = %s generate\n",                   \
                     g_ ? g_->gr_name : "root", http_sock, gemma_path);                 \
            up = proc_start(&d, llmsd_path, "device", model_path, extra_) == 0 ? 1 : -1; \
        }                                                                               \
        CHECK_MSG(up == 1, "llmsd did not start");                                      \
    } while (0)

static int32_t prompt_id(int i)
{
    return (int32_t)(100 + (i * 7919) % 30000);
}

/* The greedy continuation on a GPU runner in this process: the prompt in one forward,
 * then one token at a time; ids and their log-probabilities. */
static int gpu_greedy(const int32_t *prompt, int32_t *out, float *lp)
{
    char err[ERR_MAX];
    model *m = model_load(model_path, err);
    model_runner *r = m ? model_runner_new(m, 2, 64, 256, err) : NULL;
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    int n_vocab = m ? model_hparams_of(m)->n_vocab : 0, rc = -1;
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    kv_seq seq;
    if (pool && logits && model_runner_use_gpu(r, 0, err) == 0) {
        kv_seq_init(&seq, pool);
        int32_t tok[N_PROMPT], pos[N_PROMPT], row = N_PROMPT - 1;
        for (int i = 0; i < N_PROMPT; i++) {
            tok[i] = prompt[i];
            pos[i] = i;
        }
        model_batch b = {.n_tokens = N_PROMPT, .tokens = tok, .positions = pos, .n_out = 1,
                         .out_rows = &row, .logits = logits};
        rc = 0;
        for (int k = 0; k < N_GEN && rc == 0; k++) {
            if ((rc = model_forward(r, &seq, &b, err)) < 0)
                break;
            int best = 0;
            double mx = logits[0], z = 0;
            for (int v = 1; v < n_vocab; v++)
                if (logits[v] > logits[best])
                    best = v;
            mx = logits[best];
            for (int v = 0; v < n_vocab; v++)
                z += exp(logits[v] - mx);
            out[k] = best;
            lp[k] = (float)-log(z);
            tok[0] = best;
            pos[0] = N_PROMPT + k;
            row = 0;
            b.n_tokens = 1;
        }
        kv_seq_free(&seq);
    }
    if (rc < 0)
        fprintf(stderr, "gpu greedy: %s\n", err);
    free(logits);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
    return rc;
}

static bool log_of_has(const llmsd_proc *p, const char *needle)
{
    FILE *f = fopen(p->log, "r");
    char line[1024];
    bool found = false;
    while (f && !found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    if (f)
        fclose(f);
    return found;
}

static bool log_has(const char *needle)
{
    return log_of_has(&d, needle);
}

static json_object *complete(const int32_t *prompt, int n, const char *model)
{
    char body[4096];
    size_t len = (size_t)snprintf(body, sizeof body, "{\"prompt\":[");
    for (int i = 0; i < n; i++)
        len += (size_t)snprintf(body + len, sizeof body - len, "%s%d", i ? "," : "", prompt[i]);
    snprintf(body + len, sizeof body - len,
             "],\"n_predict\":%d,\"temperature\":0,\"return_tokens\":true,\"n_probs\":1%s%s%s}",
             N_GEN, model ? ",\"model\":\"" : "", model ? model : "", model ? "\"" : "");
    int status;
    json_object *o = httpc_post_json(http_sock, "/completion", body, &status);
    if (status != 200) {
        fprintf(stderr, "/completion: %d %s\n", status, o ? json_object_to_json_string(o) : "");
        json_object_put(o);
        return NULL;
    }
    return o;
}

static void completion_is_the_gpu_greedy(void)
{
    NEED();
    CHECK_MSG(log_has("runs on"), "the log does not say the model runs on a GPU");
    int32_t prompt[N_PROMPT], want[N_GEN];
    float lp[N_GEN];
    for (int i = 0; i < N_PROMPT; i++)
        prompt[i] = prompt_id(i);
    CHECK(gpu_greedy(prompt, want, lp) == 0);
    json_object *o = complete(prompt, N_PROMPT, NULL);
    CHECK(o);
    json_object *toks = httpc_jget(o, "tokens");
    CHECK(toks && json_object_is_type(toks, json_type_array));
    size_t n = json_object_array_length(toks);
    bool same = n == N_GEN;
    for (size_t i = 0; same && i < n; i++)
        same = json_object_get_int(json_object_array_get_idx(toks, i)) == want[i];
    CHECK_MSG(same, "llmsd %s; the GPU runner's first %d", json_object_to_json_string(toks),
              want[0]);
    double dl = 0;
    for (int k = 0; k < N_GEN; k++) {
        char path[64];
        snprintf(path, sizeof path, "completion_probabilities.%d.logprob", k);
        json_object *l = httpc_jget(o, path);
        CHECK(l);
        dl = fmax(dl, fabs(json_object_get_double(l) - lp[k]));
    }
    printf("  max |log-probability diff| against the GPU runner: %.2g\n", dl);
    CHECK(dl < 1e-3);
    json_object_put(o);
}

/* The model the GPU does not run is served from the CPU, and the log says why. */
static void refused_model_stays_on_cpu(void)
{
    NEED();
    CHECK_MSG(log_has("model gemma stays on the CPU"), "no warning for the gemma2 model");
    int32_t prompt[8];
    for (int i = 0; i < 8; i++)
        prompt[i] = prompt_id(i);
    json_object *o = complete(prompt, 8, "gemma");
    CHECK(o);
    json_object *toks = httpc_jget(o, "tokens");
    CHECK(toks && json_object_array_length(toks) == N_GEN);
    json_object_put(o);
}

/* Three greedy turns on a fresh context of daemon dd, turns [from, to) of them; each
 * reply into text[i]. 0 or -1. */
static const char *const turn_prompts[] = {"Once upon a time", "The dog ran", "Then"};

static int turns(llmsd_proc *dd, const char *id, int from, int to, char text[][512])
{
    llms_conn *c = proc_connect(dd, "gpuctx");
    llms_params p = proc_greedy(16, NULL);
    int rc = c ? 0 : -1;
    for (int i = from; i < to && rc == 0; i++) {
        char *out = NULL;
        if (llms_call_text(c, id, turn_prompts[i], &p, &out) != LLMS_OK || !out) {
            fprintf(stderr, "turn %d: %s\n", i, llms_last_error(c));
            rc = -1;
        } else {
            snprintf(text[i], 512, "%s", out);
        }
        free(out);
    }
    llms_close(c);
    return rc;
}

static void context_survives_restart(void)
{
    NEED();
    /* a real tokenizer and trained weights the GPU runs (stories260K's FFN of 172 is not
     * a multiple of 8: it would stay on the CPU) */
    const char *stories = test_data_path("models/TinyStories-656K-Q8_0.gguf");
    if (!stories)
        SKIP("../shared/testdata/models/TinyStories-656K-Q8_0.gguf is absent");
    char model[1024];
    snprintf(model, sizeof model, "%s", stories);
    const char *conf = "device = cuda\nkv_compress = none\n";
    char ref[3][512] = {{0}}, got[3][512] = {{0}}, id[LLMS_ID_MAX];
    llmsd_proc dd;
    llms_params defaults = proc_greedy(16, NULL);

    CHECK_MSG(proc_start(&dd, llmsd_path, "gpu-ref", model, conf) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&dd, "gpuctx");
    int ok = c && llms_context_create(c, NULL, &defaults, id) == LLMS_OK;
    llms_close(c);
    ok = ok && turns(&dd, id, 0, 3, ref) == 0;
    proc_stop(&dd, SIGTERM);
    CHECK_MSG(ok, "the reference run failed");
    CHECK_MSG(log_of_has(&dd, "runs on"), "the model did not run on the GPU");

    CHECK_MSG(proc_start(&dd, llmsd_path, "gpu-restart", model, conf) == 0, "llmsd did not start");
    c = proc_connect(&dd, "gpuctx");
    ok = c && llms_context_create(c, NULL, &defaults, id) == LLMS_OK;
    llms_close(c);
    ok = ok && turns(&dd, id, 0, 1, got) == 0;
    CHECK_EQ(proc_stop(&dd, SIGTERM), 0);
    CHECK_MSG(ok, "the first turn failed");
    CHECK_MSG(proc_start(&dd, llmsd_path, "gpu-restart", model, conf) == 0,
              "llmsd did not restart");
    ok = turns(&dd, id, 1, 3, got) == 0;
    proc_stop(&dd, SIGTERM);
    CHECK(ok);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(!strcmp(got[i], ref[i]), "turn %d: '%s' after a restart, '%s' without", i,
                  got[i], ref[i]);
    printf("  three turns, the last two after a restart: the same replies\n");
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    if (!cuda_built())
        snprintf(gpu_why, sizeof gpu_why, "built without CUDA (make CUDA=1)");
    else if (cuda_device_count(gpu_why) > 0)
        gpu_why[0] = '\0';
    const char *src = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    char err[ERR_MAX];
    proc_fmt(http_sock, sizeof http_sock, "%s/device-h.sock", test_tmpdir());
    gguf_file *v = src && !gpu_why[0] ? gguf_open(src, err) : NULL;
    if (v) {
        modelgen_params mp = {.arch = "llama", .dim = 256, .n_layer = 2, .n_head = 4,
                              .n_head_kv = 2, .n_ff = 512, .n_ctx = 512, .type = QTYPE_Q8_0,
                              .seed = 5, .vocab = v, .n_threads = 2};
        proc_generate_model(model_path, sizeof model_path, "device.gguf", &mp);
        mp.arch = "gemma2";
        mp.type = QTYPE_F16;
        proc_generate_model(gemma_path, sizeof gemma_path, "gemma.gguf", &mp);
        if (!gemma_path[0])
            model_path[0] = '\0';
        gguf_close(v);
    } else if (src && !gpu_why[0]) {
        fprintf(stderr, "llama-spm vocabulary: %s\n", err);
    }
    RUN(completion_is_the_gpu_greedy);
    RUN(refused_model_stays_on_cpu);
    RUN(context_survives_restart);
    if (up == 1 && proc_stop(&d, SIGTERM) != 0)
        fprintf(stderr, "llmsd did not exit cleanly\n");
    return test_finish();
}
