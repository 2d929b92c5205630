/*
 * test_longprompt.c — long prompts under the daemon's memory budgets (issue 18), against
 * a real llmsd:
 * - a prompt whose f16 KV is more than kv_budget_mb completes when the context memory
 *   compresses (the call keeps its own full chunks in int8 as its prefill goes on), and
 *   the same call is refused RESOURCE_EXHAUSTED when it keeps f16 (kv_compress = none),
 *   so the prompt really exceeds the resident KV budget;
 * - prefill_budget_mb: the Plan request and `llmsctl plan` for a length, a length beyond
 *   n_ctx refused INVALID_ARGUMENT, a budget that cannot hold the scheduler's rows
 *   refused at startup naming the MiB needed, and a long prompt prefilled in partitioned
 *   steps gives the same greedy answer as the unpartitioned daemon.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/quant/quant.h"
#include "tests/integration/llmsd_proc.h"

static char llmsd_path[1024], llmsctl_path[1100], model_path[1024];

/* The model's f16 KV per token: 2 (K, V) x 8 layers x 256 x 2 bytes. */
#define KV_TOKEN_BYTES 8192
#define KV_BUDGET_MB 3

/* About 450 tokens of the generated vocabulary's text (about six per word). */
static char *long_prompt(int words)
{
    size_t cap = 16384, n = 0;
    char *s = malloc(cap);
    if (!s)
        return NULL;
    s[0] = '\0';
    for (int i = 0; i < words && n + 16 < cap; i++)
        n += (size_t)snprintf(s + n, cap - n, "w%d ", (i * 37 + 11) % 97);
    return s;
}

/* One raw greedy call of prompt on a new context of a daemon started with extra; the
 * status of the call, its result in *r (free it) and the error. The daemon's plan for
 * the prompt's length goes into *plan when plan is not NULL (free its text). */
static enum llms_status call_once(const char *name, const char *extra, const char *prompt,
                                  llms_result *r, llms_plan_result *plan, char *err,
                                  size_t err_cap)
{
    llmsd_proc d;
    memset(r, 0, sizeof *r);
    snprintf(err, err_cap, "llmsd did not start");
    if (proc_start(&d, llmsd_path, name, model_path, extra) != 0)
        return LLMS_ERR_IO;
    llms_conn *c = proc_connect(&d, "long");
    enum llms_status st = LLMS_ERR_IO;
    if (c) {
        llms_params p;
        llms_params_init(&p);
        p.temperature = 0;
        p.max_tokens = 6;
        p.raw = 1;
        char id[LLMS_ID_MAX];
        st = llms_context_create(c, NULL, NULL, id);
        if (st == LLMS_OK)
            st = llms_call(c, id, prompt, &p, NULL, NULL, r);
        if (st == LLMS_OK && plan)
            st = llms_plan(c, r->prompt_tokens, NULL, plan);
        snprintf(err, err_cap, "%s", st == LLMS_OK ? "" : llms_last_error(c));
        llms_close(c);
    }
    proc_stop(&d, SIGTERM);
    return st;
}

#define NEED_DAEMON()                                                                  \
    do {                                                                               \
        if (!llmsd_path[0])                                                            \
            SKIP("llmsd is not built in this tree");                                   \
        if (!model_path[0])                                                            \
            SKIP("the test model could not be generated");                             \
    } while (0)

static void prompt_exceeds_the_kv_budget(void)
{
    NEED_DAEMON();
    char *prompt = long_prompt(80);
    CHECK(prompt != NULL);
    char extra[160], err[LLMS_ERROR_MAX];
    llms_result r;
    snprintf(extra, sizeof extra, "kv_compress = int8\nkv_budget_mb = %d\n", KV_BUDGET_MB);
    enum llms_status st = call_once("squeeze", extra, prompt, &r, NULL, err, sizeof err);
    CHECK_MSG(st == LLMS_OK, "under kv_budget_mb %d with int8: %s", KV_BUDGET_MB, err);
    long long f16 = (long long)r.context_tokens * KV_TOKEN_BYTES;
    printf("  %u prompt tokens, %u in the context: %.2f MiB of f16 KV under a %d MiB "
           "budget\n", r.prompt_tokens, r.context_tokens, f16 / 1048576.0, KV_BUDGET_MB);
    CHECK_MSG(f16 > (long long)KV_BUDGET_MB << 20, "the prompt's f16 KV (%lld bytes) fits "
              "the budget: it does not test exceeding it", f16);
    CHECK(r.generated_tokens > 0);
    llms_result_free(&r);

    snprintf(extra, sizeof extra, "kv_compress = none\nkv_budget_mb = %d\n", KV_BUDGET_MB);
    st = call_once("nosqueeze", extra, prompt, &r, NULL, err, sizeof err);
    CHECK_MSG(st == LLMS_ERR_RESOURCE_EXHAUSTED, "kept f16 under the budget: status %d (%s)",
              (int)st, err);
    llms_result_free(&r);
    free(prompt);
}

static void plan_request_and_llmsctl_plan(void)
{
    NEED_DAEMON();
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "plan", model_path, "prefill_budget_mb = 4\n") == 0);
    llms_conn *c = proc_connect(&d, NULL);
    CHECK(c != NULL);
    llms_plan_result pr;
    memset(&pr, 0, sizeof pr);
    CHECK_MSG(llms_plan(c, 400, NULL, &pr) == LLMS_OK, "plan: %s", llms_last_error(c));
    CHECK(pr.text && strstr(pr.text, "attn_out") && strstr(pr.text, "partitioning"));
    CHECK(pr.budget_bytes == 4u << 20);
    CHECK(pr.rows > 0 && pr.attn_rows > 0 && pr.working_bytes <= pr.budget_bytes);
    free(pr.text);
    /* beyond n_ctx (512, llmsd_proc.h): no plan */
    CHECK(llms_plan(c, 513, NULL, &pr) == LLMS_ERR_INVALID_ARGUMENT);
    CHECK(strstr(llms_last_error(c), "512") != NULL);
    llms_close(c);

    char cmd[2400], out[8192];
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' plan --prompt-tokens 300", llmsctl_path,
             d.sock);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL);
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    CHECK(pclose(p) == 0);
    CHECK_MSG(strstr(out, "prompt 300 tokens") && strstr(out, "budget 4.00 MiB") &&
                  strstr(out, "scores"),
              "llmsctl plan printed: %s", out);
    proc_fmt(cmd, sizeof cmd, "'%s' --socket '%s' plan --prompt-tokens 100000 2>&1",
             llmsctl_path, d.sock);
    p = popen(cmd, "r");
    CHECK(p != NULL);
    while (fread(out, 1, sizeof out, p) > 0)
        ;
    CHECK(pclose(p) != 0);
    proc_stop(&d, SIGTERM);
}

static void budget_below_one_step_refuses_to_start(void)
{
    NEED_DAEMON();
    llmsd_proc d;
    printf("  (llmsd is expected to refuse to start; its log follows)\n");
    CHECK(proc_start(&d, llmsd_path, "tiny-budget", model_path, "prefill_budget_mb = 1\n") != 0);
    FILE *f = fopen(d.log, "r");
    CHECK(f != NULL);
    char log[8192];
    size_t n = fread(log, 1, sizeof log - 1, f);
    log[n] = '\0';
    fclose(f);
    CHECK_MSG(strstr(log, "prefill_budget_mb") && strstr(log, "MiB"), "log: %s", log);
}

static void partitioned_prefill_answers_the_same(void)
{
    NEED_DAEMON();
    char *prompt = long_prompt(70);
    CHECK(prompt != NULL);
    char err[LLMS_ERROR_MAX];
    llms_result whole, part;
    llms_plan_result plan = {0};
    /* steps of up to 512 rows: the unpartitioned daemon prefills the prompt in one */
    CHECK_MSG(call_once("whole", "kv_compress = none\nstep_tokens = 512\n", prompt, &whole,
                        NULL, err, sizeof err) == LLMS_OK,
              "unpartitioned: %s", err);
    CHECK_MSG(call_once("part", "kv_compress = none\nstep_tokens = 512\nprefill_budget_mb = 2\n",
                        prompt, &part, &plan, err, sizeof err) == LLMS_OK,
              "partitioned: %s", err);
    printf("  %u prompt tokens: \"%s\" whole, \"%s\" under prefill_budget_mb 2 (steps of "
           "%u rows, score blocks of %u)\n", whole.prompt_tokens, whole.text, part.text,
           plan.rows, plan.attn_rows);
    /* partitioned: smaller steps than the prompt, or smaller score blocks than 32 rows */
    CHECK(plan.rows < whole.prompt_tokens || plan.attn_rows < 32);
    free(plan.text);
    CHECK(whole.prompt_tokens == part.prompt_tokens);
    CHECK(strcmp(whole.text, part.text) == 0);
    llms_result_free(&whole);
    llms_result_free(&part);
    free(prompt);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    if (llmsd_path[0]) {
        proc_fmt(llmsctl_path, sizeof llmsctl_path, "%s", llmsd_path);
        char *slash = strrchr(llmsctl_path, '/');
        proc_fmt(slash + 1, sizeof llmsctl_path - (size_t)(slash + 1 - llmsctl_path),
                 "llmsctl");
    }
    modelgen_params mp = {
        .arch = "llama", .dim = 256, .n_layer = 8, .n_head = 4, .n_head_kv = 4, .n_ff = 512,
        .n_ctx = 512, .type = QTYPE_Q8_0, .seed = 9, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(model_path, sizeof model_path, "longprompt.gguf", &mp);
    RUN(prompt_exceeds_the_kv_budget);
    RUN(plan_request_and_llmsctl_plan);
    RUN(budget_below_one_step_refuses_to_start);
    RUN(partitioned_prefill_answers_the_same);
    return test_finish();
}
