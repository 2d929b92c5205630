/*
 * llmsd serves a gemma2 file: a random-weight gemma2 model (modelgen, 4 layers, sliding
 * window 16 on layers 0 and 2, Gemma 2's soft-caps) on a vocabulary with Gemma's tokenizer
 * conventions and Gemma 2's chat template (tests/support/gemma_vocab.h, made from the
 * shared test data's SPM vocabulary; skips without it). The daemon reports the
 * architecture; llama.cpp's /completion on token ids answers with the ids the engine's
 * own greedy decode gives in this process (a prompt of 40 and 24 decoded tokens: the
 * window slides over both the prompt's prefill and the decode steps); the chat routes
 * render Gemma's turns (/apply-template, the prompt's token count) and a reply ends at
 * "<end_of_turn>".
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
#include "engine/tok/chat.h"
#include "engine/tok/tokenizer.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/gemma_vocab.h"
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
            SKIP("no vocab/ggml-vocab-llama-spm.gguf in the test data (LLMS_TESTDATA)"); \
        if (!up) {                                                                      \
            char extra_[2000];                                                          \
            struct group *g_ = getgrgid(getgid());                                      \
            proc_fmt(extra_, sizeof extra_,                                             \
                     "kv_compress = none\nadmin_group = %s\nhttp_socket = %s\n",        \
                     g_ ? g_->gr_name : "root", http_sock);                             \
            up = proc_start(&d, llmsd_path, "gemma", model_path, extra_) == 0 ? 1 : -1; \
        }                                                                               \
        CHECK_MSG(up == 1, "llmsd did not start");                                      \
    } while (0)

static int32_t prompt_id(int i)
{
    return (int32_t)(100 + (i * 7919) % 31000);
}

static void status_names_gemma2(void)
{
    NEED();
    llms_conn *c = proc_connect(&d, NULL);
    CHECK(c);
    llms_daemon_status st;
    CHECK(proc_status(c, &st) == 0);
    CHECK_MSG(st.model_arch && !strcmp(st.model_arch, "gemma2"), "%s", st.model_arch ? st.model_arch : "(none)");
    llms_daemon_status_free(&st);
    llms_close(c);
}

/* llama.cpp's /completion on BOS and 39 prompt ids, greedy, its tokens and their
 * probabilities returned: the ids, log-probabilities and runners-up this process's engine
 * gives (random tied-embedding models mostly copy their input, so the probabilities carry
 * the comparison); the same model without the window answers otherwise. */
static void completion_is_the_engine_greedy(void)
{
    NEED();
    int32_t prompt[N_PROMPT], want[N_GEN], second[N_GEN], wide[N_GEN], wide_second[N_GEN];
    float lp[N_GEN], wide_lp[N_GEN];
    prompt[0] = 1; /* the SPM vocabulary's BOS */
    for (int i = 1; i < N_PROMPT; i++)
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
    double d = 0, d_wide = 0;
    for (int k = 0; k < N_GEN; k++) {
        char path[64];
        snprintf(path, sizeof path, "completion_probabilities.%d.logprob", k);
        json_object *l = httpc_jget(o, path);
        snprintf(path, sizeof path, "completion_probabilities.%d.top_logprobs.1.id", k);
        json_object *s2 = httpc_jget(o, path);
        CHECK_MSG(l && s2 && json_object_get_int(s2) == second[k], "token %d: runner-up %d, the "
                  "engine's %d", k, s2 ? json_object_get_int(s2) : -1, second[k]);
        d = fmax(d, fabs(json_object_get_double(l) - lp[k]));
        d_wide = fmax(d_wide, fabs(json_object_get_double(l) - wide_lp[k]));
    }
    printf("  max |log-probability diff|: %.2g (the model), %.2g (without its window)\n", d,
           d_wide);
    CHECK(d < 1e-3 && d_wide > 1e-2);
    json_object *ev = httpc_jget(o, "tokens_evaluated");
    CHECK(!ev || json_object_get_int(ev) == N_PROMPT);
    json_object_put(o);
}

static const struct chat_message CHAT[] = {{"system", "Answer briefly."},
                                           {"user", "What is a sliding window?"}};

/* The chat routes render Gemma's turns: /apply-template gives the gemma family's prompt,
 * and a chat's prompt is that many tokens (BOS, the markers as one token each). A reply
 * whose first token is "<end_of_turn>" (pushed by a logit bias) ends there, empty,
 * finish_reason "stop". */
static void chat_is_gemma(void)
{
    NEED();
    char want[1024], err[ERR_MAX];
    CHECK(chat_apply(CHAT_GEMMA, CHAT, 2, true, want, sizeof want) > 0);
    gguf_file *g = gguf_open(model_path, err);
    tokenizer *t = NULL;
    CHECK_MSG(g && tok_load(g, &t, err) == 0, "%s", err);
    gguf_close(g);
    int32_t ids[256];
    int n = tok_encode(t, want, strlen(want), true, true, ids, 256);
    int32_t eot = tok_n_vocab(t) - 1;
    tok_free(t);
    CHECK(n > 0 && n < 256);
    const char *msgs = "[{\"role\":\"system\",\"content\":\"Answer briefly.\"},"
                       "{\"role\":\"user\",\"content\":\"What is a sliding window?\"}]";
    char body[2048];
    snprintf(body, sizeof body, "{\"messages\":%s}", msgs);
    int status;
    json_object *o = httpc_post_json(http_sock, "/apply-template", body, &status);
    const char *prompt = httpc_jstr(o, "prompt");
    CHECK_MSG(status == 200 && prompt && !strcmp(prompt, want), "%d %s", status,
              o ? json_object_to_json_string(o) : "(none)");
    json_object_put(o);

    snprintf(body, sizeof body, "{\"messages\":%s,\"max_tokens\":4,\"temperature\":0}", msgs);
    o = httpc_post_json(http_sock, "/v1/chat/completions", body, &status);
    json_object *pt = httpc_jget(o, "usage.prompt_tokens");
    CHECK_MSG(status == 200 && pt && json_object_get_int(pt) == n, "%d tokens wanted: %s", n,
              o ? json_object_to_json_string(o) : "(none)");
    json_object_put(o);

    snprintf(body, sizeof body,
             "{\"messages\":%s,\"max_tokens\":8,\"temperature\":0,\"logit_bias\":{\"%d\":100}}",
             msgs, eot);
    o = httpc_post_json(http_sock, "/v1/chat/completions", body, &status);
    const char *fin = httpc_jstr(o, "choices.0.finish_reason");
    const char *content = httpc_jstr(o, "choices.0.message.content");
    CHECK_MSG(status == 200 && fin && !strcmp(fin, "stop") && (!content || !content[0]), "%d %s",
              status, o ? json_object_to_json_string(o) : "(none)");
    json_object_put(o);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    const char *src = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    char vocab[1024], err[ERR_MAX];
    proc_fmt(vocab, sizeof vocab, "%s/gemma-vocab.gguf", test_tmpdir());
    proc_fmt(http_sock, sizeof http_sock, "%s/gemma-h.sock", test_tmpdir());
    gguf_file *v = NULL;
    if (src && gemma_vocab_write(src, vocab, err) == 0 && (v = gguf_open(vocab, err))) {
        modelgen_params mp = {.arch = "gemma2", .dim = 128, .n_layer = 4, .n_head = 4,
                              .n_head_kv = 2, .n_ff = 256, .n_ctx = 512, .type = QTYPE_F32,
                              .seed = 3, .vocab = v, .n_threads = 2, .sliding_window = 16};
        proc_generate_model(model_path, sizeof model_path, "gemma2.gguf", &mp);
        mp.sliding_window = 4096;
        proc_generate_model(wide_path, sizeof wide_path, "gemma2-wide.gguf", &mp);
        if (!wide_path[0])
            model_path[0] = '\0';
        gguf_close(v);
    } else if (src) {
        fprintf(stderr, "gemma vocabulary: %s\n", err);
    }
    RUN(status_names_gemma2);
    RUN(completion_is_the_engine_greedy);
    RUN(chat_is_gemma);
    if (up == 1 && proc_stop(&d, SIGTERM) != 0)
        fprintf(stderr, "llmsd did not exit cleanly\n");
    return test_finish();
}
