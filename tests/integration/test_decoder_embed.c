/*
 * Decoder embedding models as registry members in a running llmsd: a generated llama
 * decoder that generates, beside a decoder embedding model (its file's pooling_type
 * mean) with the embed role and a second generator that also embeds. Embed pools as the
 * file says unless the request names a pooling, with the same vectors as the engine's
 * embedder on that file; a file whose pooling is rank cannot have the embed role (llmsd
 * does not start, and says why). A knowledge base records the model that embeds it
 * (llms_kb_create_opts' embed_model, else the default) and refuses a later change of
 * that model's file, or its absence, with FAILED_PRECONDITION, BM25 still answering. On
 * the shared test data, docs-embed-5M beside docs-lm-21M answers Embed with llama.cpp's
 * vectors (tests/engine/data).
 */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/llms.h"
#include "engine/gguf/modelgen.h"
#include "engine/model/embed.h"
#include "engine/quant/quant.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

static char llmsd_path[1024], generator[1024], embedder_mean[1024], embedder_mean2[1024],
    ranker[1024], generator2[1024];

#define EMB_DIM 48

static const char *const TEXTS[] = {"tok5 tok9 tok12 tok40", "tok77 tok3 tok3 tok61 tok8"};

static modelgen_params decoder(int dim, uint64_t seed, int pooling_type)
{
    return (modelgen_params){.arch = "llama", .dim = dim, .n_layer = 1, .n_head = 2,
                             .n_head_kv = 2, .n_ff = 64, .n_ctx = 512, .type = QTYPE_F32,
                             .seed = seed, .n_vocab = 100, .n_threads = 1,
                             .pooling_type = pooling_type};
}

/* The engine's vector of text on the model at path, pooled as pooling. */
static int engine_embed(const char *path, const char *text, enum embed_pooling pooling,
                        float *out, int dim)
{
    char err[ERR_MAX];
    int rc = -1;
    tokenizer *tok = NULL;
    model *m = model_load(path, err);
    model_runner *r = m ? model_runner_new(m, 1, 0, 512, err) : NULL;
    kv_pool *pool = r ? kv_pool_new(model_kv_shape(m), 0, err) : NULL;
    embedder *e = pool ? embed_new(m, r, pool, err) : NULL;
    if (e && model_hparams_of(m)->dim == dim && tok_load(model_gguf(m), &tok, err) == 0 &&
        embed_text(e, tok, text, pooling, out, NULL, err) == 0)
        rc = 0;
    if (rc)
        fprintf(stderr, "engine_embed: %s\n", err);
    tok_free(tok);
    embed_free(e);
    kv_pool_free(pool);
    model_runner_free(r);
    model_free(m);
    return rc;
}

static double max_diff(const float *a, const float *b, int n)
{
    double d = 0;
    for (int i = 0; i < n; i++)
        d = fabs(a[i] - b[i]) > d ? fabs(a[i] - b[i]) : d;
    return d;
}

/* llmsd with the generator, 'emb' (emb_path, or none), 'ranked' when asked and 'other'. */
static int start(llmsd_proc *d, const char *emb_path, bool with_ranker)
{
    char emb[1100] = "", ranked[1100] = "", extra[3500];
    if (emb_path)
        proc_fmt(emb, sizeof emb, "model.emb = %s embed\n", emb_path);
    if (with_ranker)
        proc_fmt(ranked, sizeof ranked, "model.ranked = %s embed\n", ranker);
    proc_fmt(extra, sizeof extra, "%s%smodel.other = %s generate,embed\n", emb, ranked,
             generator2);
    return proc_start(d, llmsd_path, "decemb", generator, extra);
}

/* Embed on a decoder member: the file's pooling by default, the request's when named,
 * each equal to the engine's on that file; a second generator embeds too. */
static void embeds_as_its_file_says(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    llmsd_proc d;
    CHECK_MSG(start(&d, embedder_mean, false) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "app");
    CHECK(c);
    llms_embeddings got;
    float want[EMB_DIM];
    static const struct {
        enum llms_pooling asked;
        enum embed_pooling engine;
    } cases[] = {{LLMS_POOLING_MODEL, EMBED_MEAN},
                 {LLMS_POOLING_LAST, EMBED_LAST},
                 {LLMS_POOLING_CLS, EMBED_CLS}};
    for (size_t k = 0; c && k < sizeof cases / sizeof cases[0]; k++) {
        CHECK_MSG(llms_embed_model(c, "emb", TEXTS, 2, cases[k].asked, &got) == LLMS_OK, "%s",
                  llms_last_error(c));
        CHECK_EQ(got.dim, EMB_DIM);
        for (int i = 0; i < 2 && got.dim == EMB_DIM; i++) {
            CHECK(engine_embed(embedder_mean, TEXTS[i], cases[k].engine, want, EMB_DIM) == 0);
            CHECK_MSG(max_diff(got.values + i * EMB_DIM, want, EMB_DIM) < 1e-5,
                      "pooling %d text %d", (int)cases[k].asked, i);
        }
        llms_embeddings_free(&got);
    }
    /* the default embed model is the first given the role */
    CHECK(c && llms_embed(c, TEXTS, 1, LLMS_POOLING_MODEL, &got) == LLMS_OK);
    CHECK_EQ(got.dim, EMB_DIM);
    llms_embeddings_free(&got);
    CHECK_MSG(c && llms_embed_model(c, "other", TEXTS, 2, LLMS_POOLING_MODEL, &got) == LLMS_OK,
              "%s", llms_last_error(c));
    CHECK_EQ(got.dim, 32);
    llms_embeddings_free(&got);
    llms_kb_options o = {.embed_model = "generator"};
    CHECK(c && llms_kb_create_opts(c, "k", &o) == LLMS_ERR_INVALID_ARGUMENT);
    o.embed_model = "nope";
    CHECK(c && llms_kb_create_opts(c, "k", &o) == LLMS_ERR_NOT_FOUND);
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
    /* rank pooling gives no vector per text */
    fprintf(stderr, "(a failing start is expected; its log follows)\n");
    CHECK(start(&d, embedder_mean, true) != 0);
    char cmd[1200], out[4096];
    proc_fmt(cmd, sizeof cmd, "cat '%s'", d.log);
    CHECK_EQ(test_run_capture(cmd, out, sizeof out), 0);
    CHECK_MSG(strstr(out, "'ranked'") && strstr(out, "embed role") && strstr(out, "rank"), "%s",
              out);
}

static const llms_kb_doc DOCS[] = {
    {"a", "tok5 tok9 tok12 tok40 tok41 tok42", NULL},
    {"b", "tok77 tok3 tok61 tok8 tok90 tok91", NULL},
    {"c", "tok20 tok21 tok22 tok23 tok24 tok25", NULL},
};

static enum llms_status search(llms_conn *c, const char *kb, enum llms_retrieval how,
                               const char **top)
{
    llms_kb_hit *hits = NULL;
    size_t n = 0;
    enum llms_status s = llms_kb_search(c, kb, "tok77 tok3 tok61", 2, how, &hits, &n);
    static char doc[64];
    snprintf(doc, sizeof doc, "%s", s == LLMS_OK && n ? hits[0].document : "");
    *top = doc;
    llms_kb_hits_free(hits, n);
    return s;
}

/* A knowledge base keeps the model it was made with: another file under that name, or
 * no such model, is refused until the file is served again. */
static void kb_keeps_its_embed_model(void)
{
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    llmsd_proc d;
    CHECK_MSG(start(&d, embedder_mean, false) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "app");
    CHECK(c);
    const char *top;
    char vector_top[64];
    llms_kb_options o = {.embed_model = "other"};
    CHECK_MSG(c && llms_kb_create_opts(c, "pinned", &o) == LLMS_OK, "%s", llms_last_error(c));
    CHECK(c && llms_kb_create_opts(c, "dflt", NULL) == LLMS_OK);
    uint32_t passages = 0;
    CHECK_MSG(c && llms_kb_add(c, "pinned", DOCS, 3, &passages) == LLMS_OK, "%s",
              llms_last_error(c));
    CHECK(c && llms_kb_add(c, "dflt", DOCS, 3, &passages) == LLMS_OK);
    CHECK(c && search(c, "dflt", LLMS_RETRIEVAL_VECTOR, &top) == LLMS_OK);
    snprintf(vector_top, sizeof vector_top, "%s", top);
    CHECK(top[0]);
    CHECK(c && search(c, "pinned", LLMS_RETRIEVAL_RRF, &top) == LLMS_OK);
    llms_kb_info *kbs = NULL;
    size_t n = 0;
    CHECK(c && llms_kb_list(c, &kbs, &n) == LLMS_OK);
    CHECK_EQ(n, 2);
    for (size_t i = 0; i < n; i++)
        CHECK_MSG(!strcmp(kbs[i].embed_model, !strcmp(kbs[i].name, "pinned") ? "other" : "emb"),
                  "%s: %s", kbs[i].name, kbs[i].embed_model);
    llms_kb_list_free(kbs, n);
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);

    /* 'emb' is now another file: its knowledge base refuses, BM25 still answers, the
     * pinned one is unaffected */
    CHECK(start(&d, embedder_mean2, false) == 0);
    c = proc_connect(&d, "app");
    CHECK(c);
    CHECK(c && search(c, "dflt", LLMS_RETRIEVAL_VECTOR, &top) == LLMS_ERR_FAILED_PRECONDITION);
    CHECK_MSG(c && strstr(llms_last_error(c), "'dflt'") && strstr(llms_last_error(c), "'emb'"),
              "%s", llms_last_error(c));
    CHECK(c && llms_kb_add(c, "dflt", DOCS, 1, &passages) == LLMS_ERR_FAILED_PRECONDITION);
    CHECK(c && search(c, "dflt", LLMS_RETRIEVAL_BM25, &top) == LLMS_OK);
    CHECK_MSG(!strcmp(top, "b"), "top '%s'", top);
    CHECK(c && search(c, "pinned", LLMS_RETRIEVAL_VECTOR, &top) == LLMS_OK);
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);

    /* no 'emb' at all */
    CHECK(start(&d, NULL, false) == 0);
    c = proc_connect(&d, "app");
    CHECK(c);
    CHECK(c && search(c, "dflt", LLMS_RETRIEVAL_RRF, &top) == LLMS_ERR_FAILED_PRECONDITION);
    CHECK_MSG(c && strstr(llms_last_error(c), "not served"), "%s", llms_last_error(c));
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);

    /* the file is back: the knowledge base answers again, as before */
    CHECK(start(&d, embedder_mean, false) == 0);
    c = proc_connect(&d, "app");
    CHECK(c);
    CHECK(c && search(c, "dflt", LLMS_RETRIEVAL_VECTOR, &top) == LLMS_OK);
    CHECK_MSG(!strcmp(top, vector_top), "top '%s', was '%s'", top, vector_top);
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

/* docs-embed-5M beside docs-lm-21M: Embed gives llama.cpp's vectors. */
static void docs_embed_through_llmsd(void)
{
    const char *lm = test_data_path("models/docs-lm-21M-Q8_0.gguf");
    char lm_path[1024];
    snprintf(lm_path, sizeof lm_path, "%s", lm ? lm : "");
    const char *emb = test_data_path("models/docs-embed-5M-F16.gguf");
    if (!lm || !emb)
        SKIP("../shared/testdata/models/docs-lm-21M-Q8_0.gguf or docs-embed-5M-F16.gguf is "
             "absent");
    if (!llmsd_path[0])
        SKIP("llmsd is not built in this tree");
    char extra[1200];
    proc_fmt(extra, sizeof extra, "model.docs = %s embed\n", emb);
    llmsd_proc d;
    CHECK_MSG(proc_start(&d, llmsd_path, "docs", lm_path, extra) == 0, "llmsd did not start");
    llms_conn *c = proc_connect(&d, "app");
    FILE *f = fopen("tests/engine/data/docs-embed-5M.llamacpp.tsv", "r");
    CHECK_MSG(f != NULL, "tests/engine/data/docs-embed-5M.llamacpp.tsv: run from the repository");
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (c && f && getline(&line, &cap, f) > 0) {
        char *tab = strchr(line, '\t');
        if (line[0] == '#' || !tab)
            continue;
        *tab = 0;
        const char *text = line;
        llms_embeddings got;
        CHECK_MSG(llms_embed(c, &text, 1, LLMS_POOLING_MODEL, &got) == LLMS_OK, "%s",
                  llms_last_error(c));
        double dot = 0, ww = 0, gg = 0;
        char *p = tab + 1;
        for (uint32_t i = 0; i < got.dim; i++) {
            double w = strtod(p, &p);
            dot += w * got.values[i];
            ww += w * w;
            gg += (double)got.values[i] * got.values[i];
        }
        CHECK_EQ(got.dim, 256);
        CHECK_MSG(dot / sqrt(ww * gg) >= 0.9999, "'%.40s': cosine %.6f", text,
                  dot / sqrt(ww * gg));
        llms_embeddings_free(&got);
        n++;
    }
    CHECK_EQ(n, 8);
    free(line);
    if (f)
        fclose(f);
    if (c)
        llms_close(c);
    CHECK_EQ(proc_stop(&d, SIGTERM), 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    modelgen_params p = decoder(32, 1, 0);
    proc_generate_model(generator, sizeof generator, "generator.gguf", &p);
    p = decoder(32, 5, 0);
    proc_generate_model(generator2, sizeof generator2, "generator2.gguf", &p);
    p = decoder(EMB_DIM, 7, 1);
    proc_generate_model(embedder_mean, sizeof embedder_mean, "emb.gguf", &p);
    p = decoder(EMB_DIM, 8, 1);
    proc_generate_model(embedder_mean2, sizeof embedder_mean2, "emb2.gguf", &p);
    p = decoder(EMB_DIM, 9, 4);
    proc_generate_model(ranker, sizeof ranker, "ranked.gguf", &p);
    RUN(embeds_as_its_file_says);
    RUN(kb_keeps_its_embed_model);
    RUN(docs_embed_through_llmsd);
    return test_finish();
}
