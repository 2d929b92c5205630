/*
 * Speculative decoding (daemon/sched/speculate.h) in a running llmsd, against the same
 * daemon with it off (per request, llms_params.speculation):
 * Drafts come from prompt lookup and from a draft model (a generated one on the
 * generated target's vocabulary; docs-draft-5M for docs-lm-21M).
 * - a draft model of another vocabulary, or without the draft role, and speculate =
 *   draft without a draft_model, stop llmsd at start with a message;
 * - greedy text is token for token the same, on a generated model (no shared data) and
 *   on the trained test models, for prompts whose continuations repeat them (drafts are
 *   accepted) and prompts that do not (drafts are rejected), and for RAG answers over
 *   documentation passages (docs-lm-21M with docs-embed-5M);
 * - the KV a context keeps after speculative calls is what plain calls leave: later
 *   greedy calls on both agree, also after the context was evicted between calls and
 *   rebuilt from the store;
 * - sampled tokens keep their distribution: seeded samples with and without speculation
 *   on stories260K pass a chi-square test of homogeneity; a seeded sample is the same
 *   text with speculation as without, however often it is asked for;
 * - the daemon's counters show the drafts proposed and accepted;
 * - ListModels (llmsctl models) and the gateway's /v1/models list the draft model with
 *   its draft role, and no request running on it while none drafts.
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/llms.h"
#include "engine/gguf/modelgen.h"
#include "engine/quant/quant.h"
#include "tests/integration/httpc.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

static char llmsd_path[1024], generated[1024], generated_draft[1024], other_vocab[1024],
    short_draft[1024];

/* The modes compared with plain decoding, and their names. */
static const int MODES[] = {LLMS_SPECULATION_LOOKUP, LLMS_SPECULATION_DRAFT,
                            LLMS_SPECULATION_BOTH};
static const char *const MODE_NAMES[] = {"lookup", "draft", "both"};

/* Prompts whose continuation repeats them, and ones that do not. */
static const char *const PROMPTS[] = {
    "The open() system call opens the file specified by pathname. If the file does not "
    "exist, it may be created by open(). The open() system call opens the file",
    "Once upon a time there was a little girl named Lily. She liked to play. Once upon a "
    "time there was a little",
    "tok5 tok9 tok12 tok40 tok41 tok5 tok9 tok12 tok40 tok41 tok5 tok9",
    "A short note about nothing in particular.",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n    return",
};
#define N_PROMPTS (int)(sizeof PROMPTS / sizeof PROMPTS[0])

static llms_params greedy(int max_tokens, int speculation)
{
    llms_params p = proc_greedy(max_tokens, NULL);
    p.speculation = speculation;
    return p;
}

/* The greedy completion of prompt (a fresh string), or NULL. */
static char *complete(llms_conn *c, const char *prompt, int max_tokens, int speculation)
{
    llms_params p = greedy(max_tokens, speculation);
    llms_result r;
    if (llms_complete(c, prompt, NULL, 0, &p, NULL, NULL, &r) != LLMS_OK) {
        fprintf(stderr, "complete: %s\n", llms_last_error(c));
        return NULL;
    }
    char *text = strdup(r.text ? r.text : "");
    llms_result_free(&r);
    return text;
}

static int start(llmsd_proc *d, const char *name, const char *model, const char *extra)
{
    char conf[2048];
    proc_fmt(conf, sizeof conf, "speculate = off\nspeculate_max = 8\n%s", extra ? extra : "");
    return proc_start(d, llmsd_path, name, model, conf);
}

/* The config lines of a draft model at path (none when path is NULL). */
static void draft_lines(char *buf, size_t cap, const char *path)
{
    buf[0] = '\0';
    if (path)
        proc_fmt(buf, cap, "model.small = %s draft\ndraft_model = small\n", path);
}

/* Every prompt's greedy completion with lookup drafts (and with a draft model's, when
 * draft names one) equals the plain one. */
static void greedy_same_text(const char *name, const char *model, const char *draft)
{
    char extra[1200];
    draft_lines(extra, sizeof extra, draft);
    llmsd_proc d;
    CHECK_MSG(start(&d, name, model, extra) == 0, "llmsd did not start on %s", model);
    llms_conn *c = proc_connect(&d, "spec");
    CHECK(c);
    int n_modes = draft ? 3 : 1;
    for (int i = 0; c && i < N_PROMPTS; i++) {
        char *plain = complete(c, PROMPTS[i], 96, LLMS_SPECULATION_OFF);
        for (int m = 0; m < n_modes; m++) {
            char *spec = complete(c, PROMPTS[i], 96, MODES[m]);
            CHECK(plain && spec);
            CHECK_MSG(plain && spec && !strcmp(plain, spec),
                      "%s, %s, prompt %d:\n plain '%s'\n spec  '%s'", name, MODE_NAMES[m], i,
                      plain ? plain : "", spec ? spec : "");
            free(spec);
        }
        free(plain);
    }
    llms_daemon_status st;
    CHECK(c && proc_status(c, &st) == 0);
    CHECK_MSG(st.spec_lookup_proposed > 0 && st.spec_lookup_accepted > 0 &&
                  st.spec_lookup_accepted <= st.spec_lookup_proposed,
              "%s: %llu drafts, %llu accepted", name,
              (unsigned long long)st.spec_lookup_proposed,
              (unsigned long long)st.spec_lookup_accepted);
    if (draft)
        CHECK_MSG(st.spec_draft_proposed > 0 && st.spec_draft_accepted <= st.spec_draft_proposed,
                  "%s: %llu draft model drafts, %llu accepted", name,
                  (unsigned long long)st.spec_draft_proposed,
                  (unsigned long long)st.spec_draft_accepted);
    printf("   %s: lookup %llu verifications, %llu drafts, %llu accepted; draft model %llu, "
           "%llu, %llu\n", name,
           (unsigned long long)st.spec_lookup_steps, (unsigned long long)st.spec_lookup_proposed,
           (unsigned long long)st.spec_lookup_accepted, (unsigned long long)st.spec_draft_steps,
           (unsigned long long)st.spec_draft_proposed,
           (unsigned long long)st.spec_draft_accepted);
    llms_daemon_status_free(&st);
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

static void greedy_same_text_generated(void)
{
    if (!llmsd_path[0] || !generated[0])
        SKIP("llmsd is not built in this tree");
    greedy_same_text("generated", generated, generated_draft);
}

/* A draft model on another vocabulary, one without the draft role, one whose context
 * holds too few tokens to draft, and draft speculation without a draft model are refused
 * at start. */
static void draft_model_refused(void)
{
    if (!llmsd_path[0] || !generated[0])
        SKIP("llmsd is not built in this tree");
    char extra[1200], cmd[1200], out[4096];
    llmsd_proc d;
    draft_lines(extra, sizeof extra, other_vocab);
    fprintf(stderr, "(four failing starts are expected; their logs follow)\n");
    CHECK(start(&d, "bad-draft", generated, extra) != 0);
    proc_fmt(cmd, sizeof cmd, "cat '%s'", d.log);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "draft_model 'small'") && strstr(out, "vocabulary"), "%s", out);
    proc_fmt(extra, sizeof extra, "model.small = %s embed\ndraft_model = small\n",
             generated_draft);
    CHECK(start(&d, "no-role", generated, extra) != 0);
    proc_fmt(cmd, sizeof cmd, "cat '%s'", d.log);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "no draft role"), "%s", out);
    draft_lines(extra, sizeof extra, short_draft);
    CHECK(start(&d, "short-draft", generated, extra) != 0);
    proc_fmt(cmd, sizeof cmd, "cat '%s'", d.log);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "holds 16 tokens: too few to draft"), "%s", out);
    CHECK(start(&d, "no-draft", generated, "speculate = draft\n") != 0);
    proc_fmt(cmd, sizeof cmd, "cat '%s'", d.log);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "draft_model"), "%s", out);
}

/* The draft model is listed with the role its model.NAME line gave it, natively and over
 * HTTP, and idle: its roles had read "" and its running 1 (the drafter's own hold). */
static void draft_model_listed(void)
{
    if (!llmsd_path[0] || !generated[0])
        SKIP("llmsd is not built in this tree");
    char extra[2400], hsock[700];
    draft_lines(extra, sizeof extra, generated_draft);
    proc_fmt(hsock, sizeof hsock, "%s/listed-h.sock", test_tmpdir());
    size_t len = strlen(extra);
    proc_fmt(extra + len, sizeof extra - len, "http_socket = %s\n", hsock);
    llmsd_proc d;
    CHECK_MSG(start(&d, "listed", generated, extra) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "spec");
    CHECK(c);
    llms_model_info *ms = NULL;
    size_t n = 0;
    CHECK_MSG(c && llms_list_models(c, &ms, &n) == LLMS_OK, "%s", c ? llms_last_error(c) : "");
    const llms_model_info *small = NULL;
    for (size_t i = 0; i < n; i++)
        if (!strcmp(ms[i].name, "small"))
            small = &ms[i];
    CHECK(small);
    CHECK_MSG(small && !strcmp(small->roles, "draft"), "roles '%s'", small ? small->roles : "");
    CHECK_MSG(small && small->running == 0, "running %u", small ? small->running : 0);
    llms_model_list_free(ms, n);
    httpc_reply r;
    CHECK(httpc_do(hsock, 0, "GET", "/v1/models/small", NULL, NULL, &r) == 0 && r.status == 200);
    json_object *o = r.body ? json_tokener_parse(r.body) : NULL, *roles = NULL;
    CHECK_MSG(o && json_object_object_get_ex(o, "llmsd", &roles) &&
                  json_object_object_get_ex(roles, "roles", &roles) &&
                  json_object_array_length(roles) == 1 &&
                  !strcmp(json_object_get_string(json_object_array_get_idx(roles, 0)), "draft"),
              "%s", r.body ? r.body : "");
    json_object_put(o);
    httpc_reply_free(&r);
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

static void greedy_same_text_trained(void)
{
    const char *m = test_data_path("models/TinyStories-656K-Q8_0.gguf");
    char path[1024];
    snprintf(path, sizeof path, "%s", m ? m : "");
    const char *docs = test_data_path("models/docs-lm-21M-Q8_0.gguf");
    const char *small = test_data_path("models/docs-draft-5M-F16.gguf");
    if (!m || !docs || !small)
        SKIP("../shared/testdata/models/TinyStories-656K-Q8_0.gguf, docs-lm-21M-Q8_0.gguf or "
             "docs-draft-5M-F16.gguf is absent");
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    greedy_same_text("tinystories", path, NULL);
    char draft[1024];
    snprintf(draft, sizeof draft, "%s", test_data_path("models/docs-draft-5M-F16.gguf"));
    snprintf(path, sizeof path, "%s", test_data_path("models/docs-lm-21M-Q8_0.gguf"));
    greedy_same_text("docs-lm", path, draft);
}

/* Why the tests under a KV budget cannot run (the documentation models or llmsd are
 * missing), or NULL. */
static const char *docs_draft_missing(void)
{
    const char *m = test_data_path("models/docs-lm-21M-Q8_0.gguf");
    const char *small = m ? test_data_path("models/docs-draft-5M-F16.gguf") : NULL;
    if (!m || !small)
        return "../shared/testdata/models/docs-lm-21M-Q8_0.gguf or docs-draft-5M-F16.gguf is "
               "absent";
    return llmsd_path[0] ? NULL : "llmsd is not built in this tree";
}

/* Starts llmsd on docs-lm-21M-Q8_0 with docs-draft-5M as its draft model, a KV budget of
 * 1 MiB that admission does not wait for, and max_tokens 256 (which does not fit it). */
static int start_under_a_kv_mib(llmsd_proc *d, const char *name)
{
    char path[1024], extra[2400];
    draft_lines(extra, sizeof extra, test_data_path("models/docs-draft-5M-F16.gguf"));
    snprintf(path, sizeof path, "%s", test_data_path("models/docs-lm-21M-Q8_0.gguf"));
    proc_fmt(extra + strlen(extra), sizeof extra - strlen(extra),
             "kv_budget_mb = 1\nkv_wait_ms = 0\nmax_tokens = 256\n");
    return start(d, name, path, extra);
}

/* The draft model's KV counts in kv_budget_mb: under a budget of 1 MiB (about 10 chunks
 * of docs-lm's KV, 6 KiB a token), a call whose own KV fits (139 tokens at most: 9
 * chunks) is refused when it would draft, its draft KV (2 KiB a token) adding 12
 * chunks of the draft model's; a shorter one drafts. */
static void draft_kv_counts_in_the_budget(void)
{
    const char *missing = docs_draft_missing();
    if (missing)
        SKIP("%s", missing);
    llmsd_proc d;
    CHECK_MSG(start_under_a_kv_mib(&d, "draft-budget") == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "spec");
    CHECK(c);
    /* 19 bytes of prompt + 64 of template + 56 of reply: 139 tokens at most */
    const char *prompt = "The cache keeps the";
    char *plain = complete(c, prompt, 56, LLMS_SPECULATION_OFF);
    CHECK(plain);
    free(plain);
    llms_params p = greedy(56, LLMS_SPECULATION_DRAFT);
    llms_result r;
    int rc = llms_complete(c, prompt, NULL, 0, &p, NULL, NULL, &r);
    if (rc == LLMS_OK)
        llms_result_free(&r);
    CHECK(rc == LLMS_ERR_INVALID_ARGUMENT);
    CHECK_MSG(strstr(llms_last_error(c), "kv_budget_mb"), "%s", llms_last_error(c));
    char *short_plain = complete(c, prompt, 8, LLMS_SPECULATION_OFF);
    char *short_draft = complete(c, prompt, 8, LLMS_SPECULATION_DRAFT);
    CHECK(short_plain && short_draft && !strcmp(short_plain, short_draft));
    free(short_plain);
    free(short_draft);
    llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* A context whose defaults ask for the draft model drafts on a Call that names no
 * speculation of its own, so admission counts the draft model's KV for it too, as for a
 * Complete that asks; the Call's own speculation overrides the defaults', and its own
 * max_tokens the defaults' (a Call's params that set only the temperature keep the
 * defaults' reply length). */
static void context_defaults_draft_counts_in_the_budget(void)
{
    const char *missing = docs_draft_missing();
    if (missing)
        SKIP("%s", missing);
    /* the config's max_tokens (256) does not fit the budget, the defaults' 56 does
     * without the draft model's KV and not with it (draft_kv_counts_in_the_budget) */
    llmsd_proc d;
    CHECK_MSG(start_under_a_kv_mib(&d, "ctx-draft-budget") == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "spec");
    CHECK(c);
    const char *prompt = "The cache keeps the";
    char drafting[LLMS_ID_MAX], plain[LLMS_ID_MAX];
    llms_params dp = greedy(56, LLMS_SPECULATION_DRAFT), pp = greedy(56, LLMS_SPECULATION_OFF);
    CHECK(c && llms_context_create(c, NULL, &dp, drafting) == LLMS_OK);
    CHECK(c && llms_context_create(c, NULL, &pp, plain) == LLMS_OK);
    /* no params of the Call's own, and params that name no speculation */
    llms_params same = greedy(56, LLMS_SPECULATION_DEFAULT);
    const llms_params *call_params[2] = {NULL, &same};
    char *text = NULL;
    int rc;
    for (int i = 0; i < 2; i++) {
        rc = c ? llms_call_text(c, drafting, prompt, call_params[i], &text) : LLMS_ERR_INTERNAL;
        free(text);
        text = NULL;
        CHECK_MSG(rc == LLMS_ERR_INVALID_ARGUMENT, "params %d: rc %d: %s", i, rc,
                  c ? llms_last_error(c) : "");
        CHECK_MSG(c && strstr(llms_last_error(c), "kv_budget_mb"), "params %d: %s", i,
                  c ? llms_last_error(c) : "");
    }
    /* the Call's own speculation wins over the defaults' */
    llms_params off;
    llms_params_init(&off);
    off.speculation = LLMS_SPECULATION_OFF;
    rc = c ? llms_call_text(c, drafting, prompt, &off, &text) : LLMS_ERR_INTERNAL;
    CHECK_MSG(rc == LLMS_OK, "rc %d: %s", rc, c ? llms_last_error(c) : "");
    free(text);
    text = NULL;
    /* params that set only the temperature keep the defaults' 56 tokens, not the config's
     * 256 */
    llms_params warm;
    llms_params_init(&warm);
    warm.temperature = 0;
    rc = c ? llms_call_text(c, plain, prompt, &warm, &text) : LLMS_ERR_INTERNAL;
    CHECK_MSG(rc == LLMS_OK, "rc %d: %s", rc, c ? llms_last_error(c) : "");
    free(text);
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* Two contexts get the same turns, one with speculation (lookup, else a draft model's
 * drafts): their replies agree turn after turn (so the kept KV agrees), also when both
 * were evicted between turns. */
static void contexts_keep_the_same_kv(void)
{
    const char *m = test_data_path("models/docs-lm-21M-Q8_0.gguf");
    const char *small = m ? test_data_path("models/docs-draft-5M-F16.gguf") : NULL;
    char path[1024], draft[1024], extra[2400];
    snprintf(draft, sizeof draft, "%s", m && small ? small : generated_draft);
    snprintf(path, sizeof path, "%s",
             m && small ? test_data_path("models/docs-lm-21M-Q8_0.gguf") : generated);
    if (!llmsd_path[0] || !path[0])
        SKIP("llmsd is not built in this tree");
    draft_lines(extra, sizeof extra, draft);
    proc_fmt(extra + strlen(extra), sizeof extra - strlen(extra), "kv_budget_mb = 64\n");
    llmsd_proc d;
    CHECK_MSG(start(&d, "ctx", path, extra) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "spec");
    CHECK(c);
    char plain[LLMS_ID_MAX], spec[LLMS_ID_MAX];
    llms_params p = greedy(64, LLMS_SPECULATION_DEFAULT);
    CHECK(c && llms_context_create(c, NULL, &p, plain) == LLMS_OK);
    CHECK(c && llms_context_create(c, NULL, &p, spec) == LLMS_OK);
    for (int turn = 0; c && turn < 4; turn++) {
        char *a = NULL, *b = NULL;
        llms_params po = greedy(64, LLMS_SPECULATION_OFF), ps = greedy(64, LLMS_SPECULATION_BOTH);
        CHECK_MSG(llms_call_text(c, plain, PROMPTS[turn], &po, &a) == LLMS_OK, "%s",
                  llms_last_error(c));
        CHECK_MSG(llms_call_text(c, spec, PROMPTS[turn], &ps, &b) == LLMS_OK, "%s",
                  llms_last_error(c));
        CHECK_MSG(a && b && !strcmp(a, b), "turn %d:\n plain '%s'\n spec  '%s'", turn,
                  a ? a : "", b ? b : "");
        free(a);
        free(b);
        if (turn == 1) {
            /* rebuilt from the store on the next call */
            CHECK_MSG(llms_evict(c, plain) == LLMS_OK, "%s", llms_last_error(c));
            CHECK_MSG(llms_evict(c, spec) == LLMS_OK, "%s", llms_last_error(c));
        }
    }
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* RAG answers that quote their passages: the same with and without drafts. */
static void rag_answers_same(void)
{
    const char *lm = test_data_path("models/docs-lm-21M-Q8_0.gguf");
    char lm_path[1024];
    snprintf(lm_path, sizeof lm_path, "%s", lm ? lm : "");
    const char *emb = test_data_path("models/docs-embed-5M-F16.gguf");
    char emb_path[1024];
    snprintf(emb_path, sizeof emb_path, "%s", emb ? emb : "");
    const char *pairs = test_data_path("docs/pairs-dev.tsv");
    if (!lm || !emb || !pairs)
        SKIP("../shared/testdata docs-lm-21M, docs-embed-5M or docs/pairs-dev.tsv is absent");
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    FILE *f = fopen(pairs, "r");
    CHECK(f);
    enum { N = 40 };
    static char queries[N][300], passages[N][1200], ids[N][16];
    llms_kb_doc docs[N];
    char line[4096];
    int n = 0;
    while (f && n < N && fgets(line, sizeof line, f)) {
        char *tab = strchr(line, '\t');
        if (!tab || !strncmp(line, "query\t", 6))
            continue;
        *tab = 0;
        tab[strcspn(tab + 1, "\n") + 1] = 0;
        snprintf(queries[n], sizeof queries[n], "%.299s", line);
        snprintf(passages[n], sizeof passages[n], "%.1199s", tab + 1);
        snprintf(ids[n], sizeof ids[n], "p%d", n);
        docs[n] = (llms_kb_doc){ids[n], passages[n], NULL};
        n++;
    }
    if (f)
        fclose(f);
    char extra[1200];
    proc_fmt(extra, sizeof extra, "model.docs = %s embed\nqa_cache_mb = 0\nqkv_cache_mb = 0\n",
             emb_path);
    llmsd_proc d;
    CHECK_MSG(start(&d, "rag", lm_path, extra) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "spec");
    CHECK(c && llms_kb_create(c, "docs", 0, 0) == LLMS_OK);
    CHECK_MSG(c && llms_kb_add(c, "docs", docs, (size_t)n, NULL) == LLMS_OK, "%s",
              c ? llms_last_error(c) : "");
    int same = 0;
    for (int i = 0; c && i < 8; i++) {
        char *answer[2] = {NULL, NULL};
        for (int s = 0; s < 2; s++) {
            llms_params p = greedy(48, s ? LLMS_SPECULATION_LOOKUP : LLMS_SPECULATION_OFF);
            llms_rag_options o = {.top_k = 2, .params = &p, .no_qa = 1, .no_qkv = 1};
            llms_rag_result r;
            CHECK_MSG(llms_rag_query(c, "docs", queries[i * 5], &o, NULL, NULL, &r) == LLMS_OK,
                      "%s", llms_last_error(c));
            answer[s] = strdup(r.text ? r.text : "");
            llms_rag_result_free(&r);
        }
        CHECK_MSG(answer[0] && answer[1] && !strcmp(answer[0], answer[1]),
                  "'%s':\n plain '%s'\n spec  '%s'", queries[i * 5], answer[0], answer[1]);
        same += answer[0] && answer[1] && !strcmp(answer[0], answer[1]);
        free(answer[0]);
        free(answer[1]);
    }
    CHECK_EQ(same, 8);
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* The token at position POS of many seeded samples of prompt at temperature, with and
 * without drafts (mode): one distribution (chi-square homogeneity over the tokens seen at least 10
 * times in all, the rest pooled, below the p = 0.001 critical value). */
static void sampled_alike(const char *name, const char *model, const char *extra, int mode,
                          float temperature, const char *prompt)
{
    llmsd_proc d;
    CHECK_MSG(start(&d, name, model, extra) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "spec");
    CHECK(c);
    enum { SAMPLES = 300, POS = 5, VOCAB = 512 };
    static int count[2][VOCAB];
    memset(count, 0, sizeof count);
    for (int s = 0; c && s < 2; s++)
        for (int i = 0; i < SAMPLES; i++) {
            llms_params p = proc_greedy(POS + 1, NULL);
            p.temperature = temperature;
            p.top_k = 0;
            p.top_p = 1.0f;
            p.min_p = 0.0f;
            p.has_seed = 1;
            p.seed = 1000 + (uint64_t)i + (uint64_t)s * 100000;
            p.speculation = s ? mode : LLMS_SPECULATION_OFF;
            int32_t *ids;
            size_t n;
            llms_result r;
            CHECK(llms_complete(c, prompt, NULL, 0, &p, NULL, NULL, &r) == LLMS_OK);
            /* the reply's tokens: the synthetic vocabulary's pieces are "tok<id>", else the
             * text tokenized again (no special tokens) */
            const char *text = r.text ? r.text : "";
            int id = -1;
            if (!strncmp(text, "tok", 3)) {
                for (int k = 0; k <= POS && (text = strstr(text, "tok")); k++)
                    id = k == POS ? atoi(text += 3) : (text += 3, -1);
            } else if (llms_tokenize(c, text, 0, 0, &ids, &n) == LLMS_OK) {
                id = n > POS ? ids[POS] : -1;
                free(ids);
            }
            if (id >= 0 && id < VOCAB)
                count[s][id]++;
            llms_result_free(&r);
        }
    /* categories with at least 10 in all; the rest pooled */
    double x2 = 0;
    int df = -1, pooled[2] = {0, 0};
    int total[2] = {0, 0};
    for (int t = 0; t < VOCAB; t++)
        for (int s = 0; s < 2; s++)
            total[s] += count[s][t];
    for (int t = 0; t <= VOCAB; t++) {
        int a, b;
        if (t < VOCAB) {
            a = count[0][t];
            b = count[1][t];
            if (a + b < 10) {
                pooled[0] += a;
                pooled[1] += b;
                continue;
            }
        } else {
            a = pooled[0];
            b = pooled[1];
            if (a + b == 0)
                continue;
        }
        double n = total[0] + total[1], ea = (double)(a + b) * total[0] / n,
               eb = (double)(a + b) * total[1] / n;
        x2 += (a - ea) * (a - ea) / ea + (b - eb) * (b - eb) / eb;
        df++;
    }
    /* critical values of chi-square at p = 0.001 for df 1..30; beyond, a normal
     * approximation */
    static const double crit[] = {10.83, 13.82, 16.27, 18.47, 20.52, 22.46, 24.32, 26.12,
                                  27.88, 29.59, 31.26, 32.91, 34.53, 36.12, 37.70, 39.25,
                                  40.79, 42.31, 43.82, 45.31, 46.80, 48.27, 49.73, 51.18,
                                  52.62, 54.05, 55.48, 56.89, 58.30, 59.70};
    double limit = df >= 1 && df <= 30 ? crit[df - 1] : df + 3.09 * sqrt(2.0 * df);
    CHECK(total[0] > SAMPLES / 2 && total[1] > SAMPLES / 2);
    CHECK_MSG(df >= 1 && x2 < limit, "chi-square %.2f with %d degrees of freedom (limit %.2f)",
              x2, df, limit);
    printf("   %s: position %d over %d + %d samples: chi-square %.2f, %d degrees of freedom "
           "(limit %.2f)\n", name, POS, total[0], total[1], x2, df, limit);
    llms_daemon_status st;
    CHECK(c && proc_status(c, &st) == 0);
    CHECK_MSG(st.spec_lookup_proposed + st.spec_draft_proposed > 0, "%s: nothing drafted", name);
    llms_daemon_status_free(&st);
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* A seeded sampled completion is the same text however often it is asked for, with
 * speculation on as with it off: the drafts (and whether the measured gate lets a step
 * have them) change only how many tokens a step takes, not which. So too with the
 * samplers that keep state or look at the history (Mirostat's mu, XTC's random numbers,
 * DRY, locally typical): each token is sampled as plain decoding samples it. */
static void seeded_sample_same_text(void)
{
    const char *m = test_data_path("models/stories260K.gguf");
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    if (!m)
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    llmsd_proc d;
    CHECK_MSG(start(&d, "seeded", m, NULL) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "spec");
    CHECK(c);
    for (int sampler = 0; sampler < 5; sampler++) {
        char *plain = NULL;
        for (int run = 0; c && run < 4; run++) {
            llms_params p = greedy(200, run ? LLMS_SPECULATION_LOOKUP : LLMS_SPECULATION_OFF);
            p.temperature = 0.7f;
            p.has_seed = 1;
            p.seed = 42;
            if (sampler == 1)
                p.mirostat = 2, p.mirostat_tau = 3.0f;
            else if (sampler == 2)
                p.xtc_probability = 0.5f, p.xtc_threshold = 0.1f;
            else if (sampler == 3)
                p.dry_multiplier = 0.8f;
            else if (sampler == 4)
                p.typical_p = 0.9f;
            llms_result r;
            CHECK_EQ(llms_complete(c, PROMPTS[1], NULL, 0, &p, NULL, NULL, &r), LLMS_OK);
            if (run == 0)
                plain = strdup(r.text);
            else
                CHECK_MSG(plain && !strcmp(plain, r.text),
                          "sampler %d, run %d:\n plain '%s'\n spec  '%s'", sampler, run,
                          plain ? plain : "", r.text);
            llms_result_free(&r);
        }
        free(plain);
    }
    llms_daemon_status st;
    CHECK(c && proc_status(c, &st) == 0);
    CHECK_MSG(st.spec_lookup_accepted > 0, "no draft was accepted");
    llms_daemon_status_free(&st);
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

static void sampling_keeps_its_distribution(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    char extra[1200];
    draft_lines(extra, sizeof extra, generated_draft);
    /* the random model's logits are peaked: a higher temperature spreads them */
    sampled_alike("generated, draft model", generated, extra, LLMS_SPECULATION_DRAFT, 2.0f,
                  "tok5 tok9 tok12 tok40 tok41 tok5 tok9 tok12");
    const char *m = test_data_path("models/stories260K.gguf");
    if (!m)
        SKIP("../shared/testdata/models/stories260K.gguf is absent");
    char path[1024];
    snprintf(path, sizeof path, "%s", m);
    sampled_alike("stories260K, lookup", path, NULL, LLMS_SPECULATION_LOOKUP, 1.0f,
                  "Lily went to the park. Lily went to the park. Lily went to the");
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params mp = {.arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4,
                          .n_head_kv = 2, .n_ff = 128, .n_ctx = 512, .type = QTYPE_F32,
                          .seed = 3, .n_vocab = 100, .n_threads = 1};
    proc_generate_model(generated, sizeof generated, "generated.gguf", &mp);
    /* a draft model: smaller, other weights, the same synthetic vocabulary */
    modelgen_params dp = mp;
    dp.dim = 32;
    dp.n_layer = 1;
    dp.n_head = 2;
    dp.n_head_kv = 1;
    dp.n_ff = 64;
    dp.seed = 4;
    proc_generate_model(generated_draft, sizeof generated_draft, "draft.gguf", &dp);
    dp.n_ctx = 16;
    proc_generate_model(short_draft, sizeof short_draft, "short-draft.gguf", &dp);
    dp.n_ctx = 512;
    dp.n_vocab = 120;
    proc_generate_model(other_vocab, sizeof other_vocab, "other-vocab.gguf", &dp);
    RUN(greedy_same_text_generated);
    RUN(draft_model_refused);
    RUN(draft_model_listed);
    RUN(greedy_same_text_trained);
    RUN(contexts_keep_the_same_kv);
    RUN(draft_kv_counts_in_the_budget);
    RUN(context_defaults_draft_counts_in_the_budget);
    RUN(rag_answers_same);
    RUN(sampling_keeps_its_distribution);
    RUN(seeded_sample_same_text);
    return test_finish();
}
