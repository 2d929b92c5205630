/*
 * test_ctxswap.c — a real llmsd's context memory: after each call the context's chunks
 * are on disk (llmsctl show prints the chunk map), after kill -9 and a restart the
 * context comes back from its chunks and answers as an uninterrupted run does, and
 * llmsctl status / profile report the swap statistics and cost models (on the
 * TinyStories model and on a deepseek2 one, whose chunks hold its latents); a stored
 * history with ids outside the vocabulary is refused, saying why.
 */
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <string.h>

#include "engine/gguf/gguf.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "storage/store_internal.h"
#include "tests/integration/llmsd_proc.h"

static char llmsd_path[1024], llmsctl_path[1100];

/* Lossless chunks: the restored context must give the same greedy tokens. */
#define CONF "kv_compress = none\n"

static const char *const prompts[3] = {
    "Once upon a time, there was a little girl named Lily. She liked to play outside.",
    "One day she found a big red ball in the park.",
    "She ran home to show her mom",
};

static int run_turns(llms_conn *c, const char *id, int first, int last, char text[][2048])
{
    llms_params p;
    llms_params_init(&p);
    p.temperature = 0;
    p.max_tokens = 24;
    p.raw = 1;
    for (int i = first; i < last; i++) {
        llms_result r;
        if (llms_call(c, id, prompts[i], &p, NULL, NULL, &r) != LLMS_OK) {
            fprintf(stderr, "turn %d: %s\n", i, llms_last_error(c));
            return -1;
        }
        snprintf(text[i], 2048, "%s", r.text);
        llms_result_free(&r);
    }
    return 0;
}

static int ctl(const llmsd_proc *d, const char *args, char *out, size_t cap)
{
    char cmd[2048];
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' %s", llmsctl_path, d->sock, args);
    return test_run_capture(cmd, out, cap);
}

/* The three turns of a context on the model at `model`, with a restart by kill -9 before
 * the third, against an uninterrupted run; then the swap statistics and cost models. */
static void restores_context(const char *model)
{
    char ref[3][2048] = {{0}}, got[3][2048] = {{0}}, id[LLMS_ID_MAX];

    llmsd_proc d;
    CHECK_MSG(proc_start(&d, llmsd_path, "swap-ref", model, CONF) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "swap");
    int ok = c && llms_context_create(c, NULL, NULL, id) == LLMS_OK &&
             run_turns(c, id, 0, 3, ref) == 0;
    llms_close(c);
    proc_stop(&d, SIGTERM);
    CHECK_MSG(ok, "the reference run failed");

    CHECK_MSG(proc_start(&d, llmsd_path, "swap", model, CONF) == 0, "llmsd did not start");
    c = proc_connect(&d, "swap");
    ok = c && llms_context_create(c, NULL, NULL, id) == LLMS_OK && run_turns(c, id, 0, 2, got) == 0;
    /* The worker answers this after the call's swap-out, so the chunks are written. */
    llms_context_info info;
    CHECK(ok && llms_context_get(c, id, 0, &info) == LLMS_OK);
    CHECK(info.n_chunks >= 3 && info.chunks[0].resident && info.chunks[0].on_disk &&
          info.chunks[0].bits == 16);
    size_t n_chunks = info.n_chunks;
    llms_context_info_free(&info);
    llms_close(c);
    char out[16384], args[256];
    proc_fmt(args, sizeof args, "show %s", id);
    CHECK_EQ(ctl(&d, args, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "chunks (R resident, D on disk") && strstr(out, "RD 16 bits"),
              "show: %s", out);
    proc_stop(&d, SIGKILL);

    CHECK_MSG(proc_start(&d, llmsd_path, "swap", model, CONF) == 0,
              "llmsd did not restart after kill -9");
    CHECK_EQ(ctl(&d, args, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "on_disk") && strstr(out, "-D 16 bits") && !strstr(out, "RD"),
              "show after restart: %s", out);
    c = proc_connect(&d, "swap");
    CHECK(c);
    ok = run_turns(c, id, 2, 3, got) == 0;
    CHECK(ok && llms_context_get(c, id, 0, &info) == LLMS_OK);
    CHECK(info.n_chunks >= n_chunks);
    llms_context_info_free(&info);
    llms_close(c);
    CHECK_MSG(strcmp(got[2], ref[2]) == 0, "restored: '%s' vs '%s'", got[2], ref[2]);
    printf("  %zu chunks on disk, restored after kill -9; the third reply as uninterrupted: "
           "%zu bytes\n", n_chunks, strlen(got[2]));

    CHECK_EQ(ctl(&d, "--json status", out, sizeof out), 0);
    CHECK_MSG(strstr(out, "\"kv_budget_bytes\":67108864") && strstr(out, "\"switch_ins\":1,") &&
                  strstr(out, "\"swap_faults\":0,"),
              "status: %s", out);
    unsigned long long rd = 0, rc = 0;
    const char *p = strstr(out, "\"swap_chunks_read\":");
    const char *q = strstr(out, "\"swap_chunks_recomputed\":");
    CHECK(p && q && sscanf(p, "\"swap_chunks_read\":%llu", &rd) == 1 &&
          sscanf(q, "\"swap_chunks_recomputed\":%llu", &rc) == 1);
    CHECK_MSG(rd + rc >= n_chunks, "%llu read + %llu recomputed of %zu", rd, rc, n_chunks);
    /* the cost models in use, and the restored context's switch-in measured against them */
    unsigned long long observed = 0;
    const char *cost = strstr(out, "\"cost\":{\"rec_a_ms\":");
    const char *obs = cost ? strstr(cost, "\"observed\":") : NULL;
    CHECK_MSG(obs && sscanf(obs, "\"observed\":%llu", &observed) == 1 && observed >= 1,
              "status: %s", out);
    CHECK_EQ(ctl(&d, "status", out, sizeof out), 0);
    CHECK_MSG(strstr(out, "cost models") && strstr(out, "observed / predicted"), "status: %s",
              out);
    /* A profile too noisy to fit (a loaded machine) is refused with its reason, and the
     * models stay: both are answers of a working daemon. */
    int prc = ctl(&d, "profile 2>&1", out, sizeof out);
    CHECK_MSG(prc == 0 ? strstr(out, "recompute") && strstr(out, "read") != NULL
                       : strstr(out, "profile refused") != NULL,
              "profile (exit %d): %s", prc, out);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

static void restored_context_answers_the_same(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!stories)
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char model[1024];
    snprintf(model, sizeof model, "%s", stories);
    restores_context(model);
}

/* The same for a deepseek2 model (modelgen's, 2 layers, one dense, on the test data's
 * llama vocabulary), whose chunks hold one latent per token, V stored as K: written,
 * read back after the restart, the same greedy text. */
static void restored_latent_context_answers_the_same(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    const char *vocab_file = test_data_path("vocab/ggml-vocab-llama-spm.gguf");
    if (!vocab_file)
        SKIP("../shared/testdata/vocab/ggml-vocab-llama-spm.gguf is absent");
    char err[ERR_MAX], model[1024];
    gguf_file *vocab = gguf_open(vocab_file, err);
    CHECK_MSG(vocab, "%s", err);
    modelgen_params p = {.arch = "deepseek2", .dim = 128, .n_layer = 2, .n_head = 4,
                         .n_head_kv = 1, .n_ff = 256, .n_ctx = 512, .type = QTYPE_F32,
                         .seed = 5, .n_threads = 2, .vocab = vocab, .n_expert = 4,
                         .n_expert_used = 2, .n_ff_exp = 64, .n_expert_shared = 1,
                         .n_dense_lead = 1, .kv_lora_rank = 64, .qk_nope_dim = 32,
                         .qk_rope_dim = 16, .v_head_dim = 32, .expert_gating = 1};
    proc_generate_model(model, sizeof model, "deepseek2.gguf", &p);
    gguf_close(vocab);
    CHECK(model[0]);
    restores_context(model);
}

/* A context whose stored history holds an id outside the model's vocabulary (its file
 * replaced by another model's, a damaged store) is refused as FAILED_PRECONDITION,
 * saying why; its forwards failed every call as INTERNAL, or ran on the stale KV. */
static void foreign_token_ids_refused(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!stories)
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char model[1024], id[LLMS_ID_MAX], text[3][2048];
    snprintf(model, sizeof model, "%s", stories);
    llmsd_proc d;
    CHECK_MSG(proc_start(&d, llmsd_path, "foreign", model, CONF) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "foreign");
    CHECK(c && llms_context_create(c, NULL, NULL, id) == LLMS_OK && run_turns(c, id, 0, 1, text) == 0);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
    char path[700];
    proc_fmt(path, sizeof path, "%s/state/llmsd.db", d.dir);
    sqlite3 *db;
    CHECK_EQ(sqlite3_open_v2(path, &db, SQLITE_OPEN_READWRITE, NULL), SQLITE_OK);
    /* the first id of the first turn becomes 1023 (little-endian int32; 512 tokens), its
     * checksum with it: the turn as another model's tokenizer would have written it */
    CHECK_EQ(sqlite3_exec(db, "UPDATE turns SET tokens = x'ff030000' || substr(tokens, 5) "
                              "WHERE seq = (SELECT min(seq) FROM turns)", NULL, NULL, NULL),
             SQLITE_OK);
    CHECK_EQ(sqlite3_changes(db), 1);
    CHECK_EQ(store_sql_functions(db), SQLITE_OK);
    CHECK_EQ(sqlite3_exec(db, STORE_SEAL_TURNS, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
    CHECK_MSG(proc_start(&d, llmsd_path, "foreign", model, CONF) == 0, "llmsd did not restart");
    c = proc_connect(&d, "foreign");
    CHECK(c);
    llms_params p;
    llms_params_init(&p);
    p.max_tokens = 4;
    CHECK_EQ(llms_call(c, id, "more", &p, NULL, NULL, NULL), LLMS_ERR_FAILED_PRECONDITION);
    CHECK_MSG(strstr(llms_last_error(c), "vocabulary"), "%s", llms_last_error(c));
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    if (llmsd_path[0]) {
        int dir_len = (int)strlen(llmsd_path) - (int)strlen("llmsd");
        proc_fmt(llmsctl_path, sizeof llmsctl_path, "%.*sllmsctl", dir_len, llmsd_path);
    }
    RUN(restored_context_answers_the_same);
    RUN(restored_latent_context_answers_the_same);
    RUN(foreign_token_ids_refused);
    return test_finish();
}
