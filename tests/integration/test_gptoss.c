/*
 * llmsd serves a gpt-oss file: a random-weight gpt-oss model (modelgen, 4 layers, sliding
 * window 16 on layers 0 and 2, attention sinks, 8 experts of which 2 are used, in MXFP4
 * with the other matrices in Q8_0, as the published gpt-oss GGUF files are laid out) on
 * the shared test data's GPT-2 vocabulary (skips without it). The daemon reports the
 * architecture, and llama.cpp's /completion on token ids answers with the ids, the
 * log-probabilities and the runners-up of the engine's own greedy decode in this process
 * (a prompt of 40 and 24 decoded tokens: the window slides over both the prompt's prefill
 * and the decode steps); the same model without its window answers otherwise.
 */
#include <grp.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client/llms.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/model.h"
#include "engine/quant/quant.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/model_check.h"
#include "tests/support/test.h"

#define N_PROMPT 40
#define N_GEN 24

static char llmsd_path[1024], model_path[1024], wide_path[1024], http_sock[1100];
static llmsd_proc d;
static int up; /* 1: running; -1: did not start */

#define NEED()                                                                          \
    do {                                                                                \
        if (!llmsd_path[0])                                                             \
            SKIP("llmsd is not built in this tree");                                    \
        if (!model_path[0])                                                             \
            SKIP("no vocab/ggml-vocab-gpt-2.gguf in the test data (LLMS_TESTDATA)");    \
        if (!up) {                                                                      \
            char extra_[2000];                                                          \
            struct group *g_ = getgrgid(getgid());                                      \
            proc_fmt(extra_, sizeof extra_,                                             \
                     "kv_compress = none\nadmin_group = %s\nhttp_socket = %s\n",        \
                     g_ ? g_->gr_name : "root", http_sock);                             \
            up = proc_start(&d, llmsd_path, "gptoss", model_path, extra_) == 0 ? 1 : -1; \
        }                                                                               \
        CHECK_MSG(up == 1, "llmsd did not start");                                      \
    } while (0)

static int32_t prompt_id(int i)
{
    return (int32_t)(100 + (i * 7919) % 50000);
}

static void status_names_gptoss(void)
{
    NEED();
    llms_conn *c = proc_connect(&d, NULL);
    CHECK(c);
    llms_daemon_status st;
    CHECK(proc_status(c, &st) == 0);
    CHECK_MSG(st.model_arch && !strcmp(st.model_arch, "gpt-oss"), "%s",
              st.model_arch ? st.model_arch : "(none)");
    llms_daemon_status_free(&st);
    llms_close(c);
}

/* llama.cpp's /completion on 40 prompt ids, greedy, its tokens and their probabilities
 * returned: the ids, log-probabilities and runners-up this process's engine gives; the
 * same model without the window answers otherwise. */
static void completion_is_the_engine_greedy(void)
{
    NEED();
    int32_t prompt[N_PROMPT], want[N_GEN], second[N_GEN], wide[N_GEN], wide_second[N_GEN];
    float lp[N_GEN], wide_lp[N_GEN];
    for (int i = 0; i < N_PROMPT; i++)
        prompt[i] = prompt_id(i);
    CHECK(model_check_greedy(model_path, prompt, N_PROMPT, want, lp, second, N_GEN) == 0);
    CHECK(model_check_greedy(wide_path, prompt, N_PROMPT, wide, wide_lp, wide_second, N_GEN) == 0);
    char body[4096];
    size_t len = (size_t)snprintf(body, sizeof body, "{\"prompt\":[");
    for (int i = 0; i < N_PROMPT; i++)
        len += (size_t)snprintf(body + len, sizeof body - len, "%s%d", i ? "," : "", prompt[i]);
    snprintf(body + len, sizeof body - len,
             "],\"n_predict\":%d,\"temperature\":0,\"return_tokens\":true,\"n_probs\":2}",
             N_GEN);
    int status;
    json_object *o = httpc_post_json(http_sock, "/completion", body, &status);
    json_object *toks = httpc_jget(o, "tokens");
    CHECK_MSG(status == 200 && toks && json_object_is_type(toks, json_type_array),
              "%d %s", status, o ? json_object_to_json_string(o) : "(none)");
    size_t n = json_object_array_length(toks);
    bool same = n == N_GEN;
    for (size_t i = 0; same && i < n; i++)
        same = json_object_get_int(json_object_array_get_idx(toks, i)) == want[i];
    CHECK_MSG(same, "llmsd %s; the engine's first %d", json_object_to_json_string(toks), want[0]);
    double dl = 0, d_wide = 0;
    for (int k = 0; k < N_GEN; k++) {
        char path[64];
        snprintf(path, sizeof path, "completion_probabilities.%d.logprob", k);
        json_object *l = httpc_jget(o, path);
        snprintf(path, sizeof path, "completion_probabilities.%d.top_logprobs.1.id", k);
        json_object *s2 = httpc_jget(o, path);
        CHECK_MSG(l && s2 && json_object_get_int(s2) == second[k], "token %d: runner-up %d, the "
                  "engine's %d", k, s2 ? json_object_get_int(s2) : -1, second[k]);
        dl = fmax(dl, fabs(json_object_get_double(l) - lp[k]));
        d_wide = fmax(d_wide, fabs(json_object_get_double(l) - wide_lp[k]));
    }
    printf("  max |log-probability diff|: %.2g (the model), %.2g (without its window)\n", dl,
           d_wide);
    CHECK(dl < 1e-3 && d_wide > 1e-2);
    json_object_put(o);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    const char *src = test_data_path("vocab/ggml-vocab-gpt-2.gguf");
    char err[ERR_MAX];
    proc_fmt(http_sock, sizeof http_sock, "%s/gptoss-h.sock", test_tmpdir());
    gguf_file *v = src ? gguf_open(src, err) : NULL;
    if (v) {
        modelgen_params mp = {.arch = "gpt-oss", .dim = 128, .n_layer = 4, .n_head = 4,
                              .n_head_kv = 2, .head_dim = 64, .n_ff = 64, .n_ctx = 512,
                              .n_expert = 8, .n_expert_used = 2, .type = QTYPE_Q8_0,
                              .mxfp4_experts = true, .seed = 3, .vocab = v, .n_threads = 2,
                              .sliding_window = 16};
        proc_generate_model(model_path, sizeof model_path, "gptoss.gguf", &mp);
        mp.sliding_window = 4096;
        proc_generate_model(wide_path, sizeof wide_path, "gptoss-wide.gguf", &mp);
        if (!wide_path[0])
            model_path[0] = '\0';
        gguf_close(v);
    } else if (src) {
        fprintf(stderr, "gpt-2 vocabulary: %s\n", err);
    }
    RUN(status_names_gptoss);
    RUN(completion_is_the_engine_greedy);
    if (up == 1 && proc_stop(&d, SIGTERM) != 0)
        fprintf(stderr, "llmsd did not exit cleanly\n");
    return test_finish();
}
