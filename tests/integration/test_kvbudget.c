/*
 * test_kvbudget.c — kv_budget_mb caps the daemon's memory, not just its bookkeeping: a
 * real llmsd fills many contexts whose KV together is several times the budget, and its
 * resident set (VmRSS, from the status) grows by at most the budget plus a fixed slack
 * over what it was after the first context. The same load without a budget grows by
 * more than that, so the check can fail.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant/quant.h"
#include "tests/integration/llmsd_proc.h"

static char llmsd_path[1024], model_path[1024];

#define N_CONTEXTS 12
#define BUDGET_MB 8
/* Scratch of the step scheduler and the switch-in, the store's caches and the
 * allocator's own keeping, measured at ~3 MiB on x86-64. */
#define SLACK_MB 6

/* About 350 tokens of the generated vocabulary's text (six per word). */
static char *long_prompt(int seed)
{
    size_t cap = 8192, n = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    for (int i = 0; i < 58 && n + 16 < cap; i++)
        n += (size_t)snprintf(s + n, cap - n, "w%d ", (seed * 131 + i * 17) % 97);
    return s;
}

/* RSS growth (bytes) from after the first context to the largest after any later one. */
static int fill_contexts(const char *extra, const char *name, long long *growth)
{
    llmsd_proc d;
    if (proc_start(&d, llmsd_path, name, model_path, extra) != 0)
        return -1;
    llms_conn *c = proc_connect(&d, "budget");
    int rc = c ? 0 : -1;
    llms_params p;
    llms_params_init(&p);
    p.temperature = 0;
    p.max_tokens = 8;
    p.raw = 1;
    long long first = 0, peak = 0;
    for (int k = 0; k < N_CONTEXTS && rc == 0; k++) {
        char id[LLMS_ID_MAX];
        char *prompt = long_prompt(k);
        llms_result r;
        if (!prompt || llms_context_create(c, NULL, NULL, id) != LLMS_OK ||
            llms_call(c, id, prompt, &p, NULL, NULL, &r) != LLMS_OK) {
            fprintf(stderr, "context %d: %s\n", k, c ? llms_last_error(c) : "no connection");
            rc = -1;
        } else {
            llms_result_free(&r);
        }
        free(prompt);
        llms_daemon_status st;
        if (rc == 0 && llms_status_get(c, &st) == LLMS_OK) {
            long long rss = (long long)st.rss_bytes;
            if (k == 0)
                first = rss;
            peak = rss > peak ? rss : peak;
            llms_daemon_status_free(&st);
        }
    }
    llms_close(c);
    proc_stop(&d, SIGTERM);
    *growth = peak - first;
    return rc;
}

static void rss_stays_within_the_budget(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    if (!model_path[0])
        SKIP("the test model could not be generated");
#ifdef TEST_SANITIZED
    SKIP("under a sanitizer the daemon's RSS holds freed memory (ASan's quarantine) or "
         "shadow memory (TSan)");
#endif
    char extra[128];
    snprintf(extra, sizeof extra, "kv_compress = none\nkv_budget_mb = %d\n", BUDGET_MB);
    long long capped, free_run;
    CHECK(fill_contexts(extra, "budget-capped", &capped) == 0);
    CHECK(fill_contexts("kv_compress = none\nkv_budget_mb = 0\n", "budget-none", &free_run) == 0);
    printf("  RSS growth over %d contexts: %.1f MiB with kv_budget_mb %d, %.1f MiB without\n",
           N_CONTEXTS, capped / 1048576.0, BUDGET_MB, free_run / 1048576.0);
    CHECK_MSG(capped <= (long long)(BUDGET_MB + SLACK_MB) << 20,
              "RSS grew %.1f MiB under a %d MiB budget", capped / 1048576.0, BUDGET_MB);
    CHECK_MSG(free_run > (long long)(BUDGET_MB + SLACK_MB) << 20,
              "the uncapped run grew only %.1f MiB: the load does not test the cap",
              free_run / 1048576.0);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    /* 8 KiB of f16 KV per token: 12 contexts of ~360 tokens hold ~34 MiB */
    modelgen_params mp = {
        .arch = "llama", .dim = 256, .n_layer = 8, .n_head = 4, .n_head_kv = 4, .n_ff = 512,
        .n_ctx = 512, .type = QTYPE_Q8_0, .seed = 9, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "kvbudget.gguf", &mp);
    RUN(rss_stays_within_the_budget);
    return test_finish();
}
