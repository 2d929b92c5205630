/*
 * test_logprobs_limits.c — what a reply's logprobs may take is checked before any
 * compute: their memory counts in kv_budget_mb beside the KV (a logprobs request whose
 * records do not fit is refused where the same request without them runs), and a
 * reply whose logprobs may not fit max_frame_bytes is refused up front naming how many
 * tokens do, instead of failing after its whole generation. A real llmsd on
 * stories260K.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/integration/llmsd_proc.h"

static char llmsd_path[1024];

/* llama2.c's vocabulary (stories260K): </s> is id 2. Banned, a reply runs to max_tokens. */
#define STORIES_EOS 2

static const char *stories_or_skip_reason(char model[1024])
{
    if (!llmsd_path[0])
        return "llmsd is not built in this tree";
    const char *stories = test_data_path("models/stories260K.gguf");
    if (!stories)
        return "../shared/testdata/models/stories260K.gguf is absent";
    snprintf(model, 1024, "%s", stories);
    return NULL;
}

static llms_params greedy_logprobs(int max_tokens, int top)
{
    llms_params p = proc_greedy(max_tokens, NULL);
    p.raw = 1;
    p.logprobs = top >= 0;
    p.top_logprobs = top >= 0 ? top : 0;
    return p;
}

/* Under kv_budget_mb = 1, a window context's Call asking 20 alternatives over 2000 tokens
 * (the window of 512 slides on, keeping every token's logprobs: megabytes of them) is
 * refused as more than the budget, saying the logprobs' part; without logprobs the same
 * call's KV (one window) fits and runs, and with a short reply the logprobs fit too.
 * Before: admission counted only the KV, so any number of such calls ran at once over
 * the budget. */
static void logprobs_count_in_the_kv_budget(void)
{
    char model[1024];
    const char *skip = stories_or_skip_reason(model);
    if (skip)
        SKIP("%s", skip);
    llmsd_proc d;
    /* a frame the default's size: only the budget limits the logprobs here */
    CHECK_MSG(proc_start(&d, llmsd_path, "lp-budget", model,
                         "kv_budget_mb = 1\nkv_wait_ms = 0\nmax_frame_bytes = 16777216\n") == 0,
              "llmsd did not start");
    llms_conn *c = proc_connect(&d, "app");
    char id[LLMS_ID_MAX];
    CHECK(c && llms_context_create(c, NULL, NULL, id) == LLMS_OK);

    llms_params p = greedy_logprobs(2000, 20);
    llms_result r;
    int rc = llms_call(c, id, "Once upon a time", &p, NULL, NULL, &r);
    if (rc == LLMS_OK)
        llms_result_free(&r);
    CHECK_MSG(rc == LLMS_ERR_INVALID_ARGUMENT, "rc %d: %s", rc, llms_last_error(c));
    const char *why = llms_last_error(c);
    CHECK_MSG(strstr(why, "kv_budget_mb") && strstr(why, "logprobs"), "%s", why);

    /* the same call without logprobs: a stop string ends it soon */
    static const char *const stop[] = {"."};
    p = greedy_logprobs(2000, -1);
    p.stop = stop;
    p.n_stop = 1;
    CHECK_MSG(llms_call(c, id, "Once upon a time", &p, NULL, NULL, &r) == LLMS_OK, "%s",
              llms_last_error(c));
    llms_result_free(&r);

    p = greedy_logprobs(16, 20);
    CHECK_MSG(llms_call(c, id, " Then", &p, NULL, NULL, &r) == LLMS_OK, "%s",
              llms_last_error(c));
    CHECK_EQ(r.n_logprobs, r.generated_tokens);
    llms_result_free(&r);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* The number after "at most " in msg, -1 when there is none. */
static long tokens_that_fit(const char *msg)
{
    const char *at = strstr(msg, "at most ");
    return at ? strtol(at + strlen("at most "), NULL, 10) : -1;
}

/* Under max_frame_bytes = 65536, a Complete asking 20 alternatives over 400 tokens (its
 * end of text banned, so the reply runs to max_tokens) is refused INVALID_ARGUMENT
 * before any compute, the message naming max_frame_bytes and how many tokens fit; a
 * reply of that many tokens with 20 alternatives comes back whole. Before: the reply
 * was generated and then answered "reply of N bytes is larger than max_frame_bytes". */
static void logprobs_beyond_the_frame_are_refused_up_front(void)
{
    char model[1024];
    const char *skip = stories_or_skip_reason(model);
    if (skip)
        SKIP("%s", skip);
    llmsd_proc d;
    CHECK_MSG(proc_start(&d, llmsd_path, "lp-frame", model, "max_frame_bytes = 65536\n") == 0,
              "llmsd did not start");
    llms_conn *c = proc_connect(&d, "app");
    CHECK(c);
    const llms_logit_bias no_eos = {STORIES_EOS, -100};
    llms_params p = greedy_logprobs(400, 20);
    p.logit_bias = &no_eos;
    p.n_logit_bias = 1;
    llms_result r;
    int rc = llms_complete(c, "Once upon a time", NULL, 0, &p, NULL, NULL, &r);
    if (rc == LLMS_OK)
        llms_result_free(&r);
    CHECK_MSG(rc == LLMS_ERR_INVALID_ARGUMENT, "rc %d: %s", rc, llms_last_error(c));
    const char *why = llms_last_error(c);
    CHECK_MSG(strstr(why, "max_frame_bytes (65536)") && strstr(why, "logprobs") &&
                  strstr(why, "max_tokens"),
              "%s", why);
    long fit = tokens_that_fit(why);
    CHECK_MSG(fit > 0 && fit < 400, "%s", why);

    p.max_tokens = (int32_t)fit;
    CHECK_MSG(llms_complete(c, "Once upon a time", NULL, 0, &p, NULL, NULL, &r) == LLMS_OK,
              "%s", llms_last_error(c));
    CHECK_EQ(r.stop_reason, LLMS_STOP_MAX_TOKENS);
    CHECK_EQ((long)r.n_logprobs, fit);
    CHECK_EQ(r.logprobs[0].n_top, 20);
    llms_result_free(&r);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    RUN(logprobs_count_in_the_kv_budget);
    RUN(logprobs_beyond_the_frame_are_refused_up_front);
    return test_finish();
}
