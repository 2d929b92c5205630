/* Tests of the knowledge-base catalog (storage/kb.c): knowledge bases, documents and
 * passages, BM25, the QA bank and the QKV tree: add, remove, search, limits (evictions
 * under a budget), corrupt rows and isolation between apps and knowledge bases. */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "storage/kb.h"
#include "storage/store.h"
#include "tests/support/test.h"

#define DIM 4

static char dir_path[512];

static store *open_fresh(const char *name)
{
    char err[ERR_MAX];
    snprintf(dir_path, sizeof dir_path, "%s/%s/state", test_tmpdir(), name);
    store *s = store_open(dir_path, err);
    if (!s)
        fprintf(stderr, "store_open: %s\n", err);
    return s;
}

/* Runs sql on the closed store's database file. */
static int tamper(const char *sql)
{
    char path[600];
    snprintf(path, sizeof path, "%s/llmsd.db", dir_path);
    sqlite3 *db;
    if (sqlite3_open(path, &db) != SQLITE_OK)
        return -1;
    int rc = sqlite3_exec(db, sql, NULL, NULL, NULL);
    sqlite3_close(db);
    return rc == SQLITE_OK ? 0 : -1;
}

static int64_t make_kb(store *s, uint32_t uid, const char *app, const char *name)
{
    char err[ERR_MAX];
    int64_t app_id, kb_id;
    bool exists;
    if (store_app_id(s, uid, app, &app_id, err) ||
        store_kb_create(s, app_id, name, 32, 4, "emb", "test-embedder", DIM, false, 1000, &kb_id,
                        &exists, err) || exists)
        return -1;
    return kb_id;
}

/* Stores texts[0..n) as the passages of one document, the texts joined by spaces
 * (no overlap). */
static int put_doc(store *s, int64_t kb, const char *doc, const char *const *texts, int n,
                   int64_t *first)
{
    char err[ERR_MAX], text[1024];
    float vecs[8 * DIM];
    store_span spans[8];
    for (int i = 0; i < n * DIM; i++)
        vecs[i] = (float)(i % DIM == i / DIM % DIM);
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        spans[i] = (store_span){len + (i > 0), strlen(texts[i])};
        len += (size_t)snprintf(text + len, sizeof text - len, "%s%s", i ? " " : "", texts[i]);
    }
    return store_kb_put_doc(s, kb, doc, "meta", text, spans, n, vecs, DIM, 2000, first, err);
}

/* Deletes every retired document's rows, a few at a time. */
static int clean_all(store *s)
{
    char err[ERR_MAX];
    bool done = false;
    for (int i = 0; i < 1000 && !done; i++)
        if (store_kb_clean_step(s, 2, &done, err))
            return -1;
    return done ? 0 : -1;
}

typedef struct kb_seen {
    int n;
    char names[8][32];
    char embed_models[8][32], embedders[8][32];
    int64_t docs[8], passages[8], qa[8];
} kb_seen;

static int see_kb(void *arg, const store_kb *kb)
{
    kb_seen *k = arg;
    if (k->n < 8) {
        snprintf(k->names[k->n], sizeof k->names[k->n], "%s", kb->name);
        snprintf(k->embed_models[k->n], sizeof k->embed_models[k->n], "%s", kb->embed_model);
        snprintf(k->embedders[k->n], sizeof k->embedders[k->n], "%s", kb->embedder);
        k->docs[k->n] = kb->n_docs;
        k->passages[k->n] = kb->n_passages;
        k->qa[k->n] = kb->qa_entries;
    }
    k->n++;
    return 0;
}

static void create_list_isolation(void)
{
    store *s = open_fresh("kb-create");
    CHECK(s);
    char err[ERR_MAX];
    int64_t a = make_kb(s, 1000, "app-a", "notes"), b = make_kb(s, 1000, "app-b", "notes");
    CHECK(a > 0 && b > 0 && a != b);
    /* the same name again in one app: exists, nothing written */
    int64_t app_a, again;
    bool exists;
    CHECK_EQ(store_app_id(s, 1000, "app-a", &app_a, err), 0);
    CHECK_EQ(store_kb_create(s, app_a, "notes", 32, 4, "", "e", DIM, false, 1, &again, &exists,
                             err), 0);
    CHECK(exists);
    kb_seen k = {0};
    CHECK_EQ(store_kb_list(s, app_a, see_kb, &k, err), 0);
    CHECK_EQ(k.n, 1);
    /* the model that embeds it, by name and file, as created */
    CHECK(!strcmp(k.embed_models[0], "emb"));
    CHECK(!strcmp(k.embedders[0], "test-embedder"));
    k.n = 0;
    CHECK_EQ(store_kb_list(s, -1, see_kb, &k, err), 0);
    CHECK_EQ(k.n, 2);
    bool found;
    k.n = 0;
    CHECK_EQ(store_kb_get(s, app_a, "other", see_kb, &k, &found, err), 0);
    CHECK(!found && k.n == 0);
    /* BM25 never crosses knowledge bases */
    const char *ta[] = {"the apple orchard harvest"}, *tb[] = {"rocket launch orbit"};
    int64_t first;
    CHECK_EQ(put_doc(s, a, "d", ta, 1, &first), 0);
    CHECK_EQ(put_doc(s, b, "d", tb, 1, &first), 0);
    int64_t ids[4];
    float sc[4];
    int n;
    CHECK_EQ(store_kb_bm25(s, b, "apple orchard", 4, ids, sc, &n, err), 0);
    CHECK_EQ(n, 0);
    CHECK_EQ(store_kb_bm25(s, a, "apple orchard", 4, ids, sc, &n, err), 0);
    CHECK_EQ(n, 1);
    /* a passage id of another knowledge base is not found through this one */
    CHECK_EQ(store_kb_passage(s, a, first, NULL, NULL, &found, err), 0);
    CHECK(!found);
    store_close(s);
}

typedef struct pass_seen {
    char doc[32], text[128];
    int seq;
    bool meta;
} pass_seen;

static int see_passage(void *arg, const store_passage *p)
{
    pass_seen *ps = arg;
    snprintf(ps->doc, sizeof ps->doc, "%s", p->doc);
    snprintf(ps->text, sizeof ps->text, "%s", p->text);
    ps->seq = p->seq;
    ps->meta = p->metadata != NULL;
    return 0;
}

static int count_vec(void *arg, int64_t id, const int8_t *q, float scale)
{
    (void)id;
    (void)q;
    (void)scale;
    (*(int *)arg)++;
    return 0;
}

static void add_replace_remove_search(void)
{
    store *s = open_fresh("kb-add");
    CHECK(s);
    char err[ERR_MAX];
    int64_t kb = make_kb(s, 1000, "app", "kb");
    CHECK(kb > 0);
    const char *t1[] = {"garden tomato soil", "river boat fishing", "violin concert music"};
    int64_t first;
    CHECK_EQ(put_doc(s, kb, "doc1", t1, 3, &first), 0);
    pass_seen ps;
    bool found;
    CHECK_EQ(store_kb_passage(s, kb, first + 1, see_passage, &ps, &found, err), 0);
    CHECK(found && !strcmp(ps.doc, "doc1") && !strcmp(ps.text, "river boat fishing") &&
          ps.seq == 1 && ps.meta);
    int64_t ids[4];
    float sc[4];
    int n;
    CHECK_EQ(store_kb_bm25(s, kb, "boat", 4, ids, sc, &n, err), 0);
    CHECK(n == 1 && ids[0] == first + 1);
    /* FTS5 syntax in a question is words, never a query error */
    CHECK_EQ(store_kb_bm25(s, kb, "\"boat\" AND (NEAR* OR -) ^:", 4, ids, sc, &n, err), 0);
    CHECK(n == 1 && ids[0] == first + 1);
    CHECK_EQ(store_kb_bm25(s, kb, "?!. ,", 4, ids, sc, &n, err), 0);
    CHECK_EQ(n, 0);
    /* replacing a document replaces its passages */
    const char *t2[] = {"mountain snow climbing"};
    int64_t first2;
    CHECK_EQ(put_doc(s, kb, "doc1", t2, 1, &first2), 0);
    CHECK_EQ(store_kb_bm25(s, kb, "boat", 4, ids, sc, &n, err), 0);
    CHECK_EQ(n, 0);
    int nv = 0;
    CHECK_EQ(store_kb_vectors(s, kb, DIM, count_vec, &nv, err), 0);
    CHECK_EQ(nv, 1);
    /* the replaced document holds its space until its rows are deleted */
    int64_t bytes, passages;
    CHECK_EQ(store_kb_uid_usage(s, 1000, &bytes, &passages, err), 0);
    CHECK_EQ(passages, 4);
    CHECK_EQ(clean_all(s), 0);
    CHECK_EQ(store_kb_uid_usage(s, 1000, &bytes, &passages, err), 0);
    CHECK(bytes == (int64_t)strlen(t2[0]) && passages == 1);
    /* a failed transaction leaves nothing */
    CHECK_EQ(store_kb_begin(s, err), 0);
    CHECK_EQ(put_doc(s, kb, "doc2", t1, 3, &first), 0);
    store_kb_rollback(s);
    CHECK_EQ(store_kb_bm25(s, kb, "violin", 4, ids, sc, &n, err), 0);
    CHECK_EQ(n, 0);
    CHECK_EQ(store_kb_remove_doc(s, kb, "doc1", &found, err), 0);
    CHECK(found);
    CHECK_EQ(store_kb_remove_doc(s, kb, "doc1", &found, err), 0);
    CHECK(!found);
    CHECK_EQ(store_kb_bm25(s, kb, "mountain", 4, ids, sc, &n, err), 0);
    CHECK_EQ(n, 0);
    CHECK_EQ(clean_all(s), 0);
    CHECK_EQ(store_kb_uid_usage(s, 1000, &bytes, &passages, err), 0);
    CHECK(bytes == 0 && passages == 0);
    store_close(s);
}

/* Overlapping passages keep the document's text once, and each reads back exactly; a
 * staged document is seen by no read until published; the retired one's rows leave the
 * contentless FTS table exactly (a wrong 'delete' text would leave its words found). */
static void compact_staged_passages(void)
{
    store *s = open_fresh("kb-compact");
    CHECK(s);
    char err[ERR_MAX];
    int64_t kb = make_kb(s, 1000, "app", "kb");
    CHECK(kb > 0);
    const char *text = "  alpha beta gamma delta epsilon zeta eta theta iota kappa  ";
    /* words: alpha@2 beta@8 gamma@13 delta@19 epsilon@25 zeta@33 eta@38 theta@42
     * iota@48 kappa@53; three passages of four words overlapping by two, then the rest */
    store_span sp[4] = {{2, 22}, {13, 24}, {25, 22}, {42, 16}};
    float vecs[4 * DIM];
    for (int i = 0; i < 4 * DIM; i++)
        vecs[i] = (float)(i % 3) - 0.5f;
    int64_t doc_id, first;
    CHECK_EQ(store_kb_stage_doc(s, kb, "greek", NULL, (int64_t)strlen(text), 4, 1, &doc_id,
                                err), 0);
    CHECK_EQ(store_kb_put_passages(s, kb, doc_id, text, sp, 4, 0, 2, vecs, DIM, &first, err), 0);
    CHECK_EQ(store_kb_put_passages(s, kb, doc_id, text, sp, 4, 2, 2, vecs + 2 * DIM, DIM, NULL,
                                   err), 0);
    int64_t ids[4];
    float sc[4];
    int n, nv = 0;
    bool found;
    CHECK_EQ(store_kb_bm25(s, kb, "epsilon", 4, ids, sc, &n, err), 0);
    CHECK_EQ(n, 0);
    CHECK_EQ(store_kb_vectors(s, kb, DIM, count_vec, &nv, err), 0);
    CHECK_EQ(nv, 0);
    CHECK_EQ(store_kb_passage(s, kb, first, NULL, NULL, &found, err), 0);
    CHECK(!found);
    kb_seen k = {0};
    CHECK_EQ(store_kb_list(s, -1, see_kb, &k, err), 0);
    CHECK(k.n == 1 && k.docs[0] == 0 && k.passages[0] == 0);
    CHECK_EQ(store_kb_publish(s, kb, &doc_id, 1, err), 0);
    for (int i = 0; i < 4; i++) {
        pass_seen ps;
        CHECK_EQ(store_kb_passage(s, kb, first + i, see_passage, &ps, &found, err), 0);
        CHECK_MSG(found && strlen(ps.text) == sp[i].len &&
                      !strncmp(ps.text, text + sp[i].off, sp[i].len) && ps.seq == i,
                  "passage %d: '%s'", i, ps.text);
    }
    CHECK_EQ(store_kb_bm25(s, kb, "epsilon", 4, ids, sc, &n, err), 0);
    CHECK(n == 2 && (ids[0] == first + 1 || ids[0] == first + 2));
    CHECK_EQ(store_kb_vectors(s, kb, DIM, count_vec, &nv, err), 0);
    CHECK_EQ(nv, 4);
    /* replaced by a one-passage document: the old one is retired, then cleaned */
    const char *t[] = {"omega"};
    CHECK_EQ(put_doc(s, kb, "greek", t, 1, &first), 0);
    CHECK_EQ(clean_all(s), 0);
    const char *words[] = {"alpha", "beta", "delta", "epsilon", "theta", "kappa"};
    for (int w = 0; w < 6; w++) {
        CHECK_EQ(store_kb_bm25(s, kb, words[w], 4, ids, sc, &n, err), 0);
        CHECK_MSG(n == 0, "'%s' still found", words[w]);
    }
    CHECK_EQ(store_kb_bm25(s, kb, "omega", 4, ids, sc, &n, err), 0);
    CHECK(n == 1 && ids[0] == first);
    /* a staged document left by a writer that stopped goes at the next startup's
     * unstaging, and its rows with the cleaning */
    CHECK_EQ(store_kb_stage_doc(s, kb, "half", NULL, (int64_t)strlen(text), 4, 1, &doc_id, err),
             0);
    CHECK_EQ(store_kb_put_passages(s, kb, doc_id, text, sp, 4, 0, 3, vecs, DIM, NULL, err), 0);
    CHECK_EQ(store_kb_unstage_all(s, err), 0);
    CHECK_EQ(store_kb_publish(s, kb, &doc_id, 1, err), -1);
    CHECK_EQ(clean_all(s), 0);
    CHECK_EQ(store_kb_bm25(s, kb, "gamma", 4, ids, sc, &n, err), 0);
    CHECK_EQ(n, 0);
    int64_t bytes, passages;
    CHECK_EQ(store_kb_uid_usage(s, 1000, &bytes, &passages, err), 0);
    CHECK(bytes == 5 && passages == 1);
    store_close(s);
}

/* A passage length the catalog cannot hold for its document (negative, or past the
 * text) reads as a passage without text, and removing its document still deletes its
 * rows: a negative length wrapped the check that a passage lies in its document's text,
 * and its FTS 'delete' then read the text up to a NUL past the end of the buffer. */
static void passage_length_out_of_range(void)
{
    static const char *const bad[] = {"-5", "9223372036854775807"};
    for (int b = 0; b < 2; b++) {
        char name[32], sql[128], err[ERR_MAX];
        snprintf(name, sizeof name, "kb-badlen%d", b);
        store *s = open_fresh(name);
        CHECK(s);
        int64_t kb = make_kb(s, 1000, "app", "kb");
        CHECK(kb > 0);
        const char *t[] = {"garden tomato soil", "river boat fishing", "violin concert music"};
        int64_t first;
        CHECK_EQ(put_doc(s, kb, "doc", t, 3, &first), 0);
        store_close(s);
        snprintf(sql, sizeof sql, "UPDATE kb_passages SET len = %s WHERE seq = 1", bad[b]);
        CHECK_EQ(tamper(sql), 0);
        s = open_fresh(name);
        CHECK(s);
        pass_seen ps;
        bool found;
        CHECK_EQ(store_kb_passage(s, kb, first + 1, see_passage, &ps, &found, err), -1);
        CHECK_MSG(strstr(err, "no text"), "%s", err);
        CHECK_EQ(store_kb_remove_doc(s, kb, "doc", &found, err), 0);
        CHECK(found);
        CHECK_EQ(clean_all(s), 0);
        int64_t ids[4], bytes, passages;
        float sc[4];
        int n;
        CHECK_EQ(store_kb_bm25(s, kb, "garden", 4, ids, sc, &n, err), 0);
        CHECK_EQ(n, 0);
        CHECK_EQ(store_kb_uid_usage(s, 1000, &bytes, &passages, err), 0);
        CHECK(bytes == 0 && passages == 0);
        store_close(s);
    }
}

typedef struct qa_seen {
    int n;
    int64_t id[8];
    bool predicted[8];
    int n_passages[8];
    int stop[8], n_tokens[8];
    char answer[8][32];
    float vec[8][DIM];
} qa_seen;

static int see_qa(void *arg, const store_qa *q)
{
    qa_seen *s = arg;
    if (s->n < 8) {
        s->id[s->n] = q->id;
        s->predicted[s->n] = q->predicted;
        s->n_passages[s->n] = q->n_passages;
        s->stop[s->n] = q->stop;
        s->n_tokens[s->n] = q->n_tokens;
        snprintf(s->answer[s->n], sizeof s->answer[s->n], "%s", q->answer);
        memcpy(s->vec[s->n], q->vec, sizeof s->vec[s->n]);
    }
    s->n++;
    return 0;
}

/* A drop in slices: the knowledge base leaves lists and lookups at once, keeps counting
 * in its uid's usage while its rows go a few at a time, a transaction each, and a new
 * one of the same name can be made meanwhile. */
static void drop_in_slices(void)
{
    char err[ERR_MAX];
    store *s = open_fresh("drop_in_slices");
    CHECK(s);
    int64_t kb = make_kb(s, 1000, "app-a", "big");
    CHECK(kb >= 0);
    const char *texts[4] = {"alpha one", "beta two", "gamma three", "delta four"};
    int64_t first;
    char doc[16];
    for (int d = 0; d < 5; d++) {
        snprintf(doc, sizeof doc, "d%d", d);
        CHECK_EQ(put_doc(s, kb, doc, texts, 4, &first), 0);
    }
    CHECK_EQ(store_kb_hide(s, kb, err), 0);
    kb_seen k = {0};
    CHECK_EQ(store_kb_list(s, -1, see_kb, &k, err), 0);
    CHECK_EQ(k.n, 0);
    int64_t found_id;
    CHECK_EQ(store_kb_hidden(s, &found_id, err), 0);
    CHECK_EQ(found_id, kb);
    int64_t bytes, passages;
    CHECK_EQ(store_kb_uid_usage(s, 1000, &bytes, &passages, err), 0);
    CHECK_EQ(passages, 20);
    CHECK(make_kb(s, 1000, "app-a", "big") >= 0);
    bool done = false;
    int slices = 0;
    while (!done && slices < 100) {
        CHECK_EQ(store_kb_drop_step(s, kb, 3, &done, err), 0);
        slices++;
    }
    /* 20 passages, 5 documents by 3, then the row */
    CHECK_EQ(slices, 7 + 2 + 1);
    CHECK_EQ(store_kb_uid_usage(s, 1000, &bytes, &passages, err), 0);
    CHECK_EQ(passages, 0);
    CHECK_EQ(store_kb_hidden(s, &found_id, err), 0);
    CHECK_EQ(found_id, -1);
    kb_seen k2 = {0};
    CHECK_EQ(store_kb_list(s, -1, see_kb, &k2, err), 0);
    CHECK(k2.n == 1 && !strcmp(k2.names[0], "big"));
    store_close(s);
}

static void qa_bank_limits_and_corruption(void)
{
    store *s = open_fresh("kb-qa");
    CHECK(s);
    char err[ERR_MAX];
    int64_t kb = make_kb(s, 1000, "app", "kb"), other = make_kb(s, 1000, "app", "other");
    CHECK(kb > 0 && other > 0);
    float v[DIM] = {1, 0, 0, 0};
    int64_t pass[2] = {7, 9};
    char answer[64];
    for (int i = 0; i < 6; i++) {
        snprintf(answer, sizeof answer, "answer %d", i);
        CHECK_EQ(store_qa_put(s, i < 5 ? kb : other, "q?", v, DIM, answer, 0, 4, pass, 2,
                              i % 2 == 0, 3000 + i, err), 0);
    }
    qa_seen q = {0};
    CHECK_EQ(store_qa_list(s, kb, DIM, see_qa, &q, err), 0);
    CHECK_EQ(q.n, 5);
    CHECK(q.predicted[0] && !q.predicted[1] && q.n_passages[0] == 2);
    CHECK(!strcmp(q.answer[4], "answer 4"));
    CHECK_EQ(store_qa_asked(s, q.id[0], err), 0);
    qa_seen q2 = {0};
    CHECK_EQ(store_qa_list(s, kb, DIM, see_qa, &q2, err), 0);
    CHECK(!q2.predicted[0] && q2.predicted[2]);
    int64_t n, bytes;
    CHECK_EQ(store_qa_stats(s, NULL, &n, &bytes, err), 0);
    CHECK_EQ(n, 6);
    /* the budget of three entries' bytes: the oldest three go, whichever knowledge base */
    int evicted;
    CHECK_EQ(store_qa_evict(s, bytes / 2, &evicted, err), 0);
    CHECK_EQ(evicted, 3);
    int64_t n2, bytes2;
    CHECK_EQ(store_qa_stats(s, NULL, &n2, &bytes2, err), 0);
    CHECK(n2 == 3 && bytes2 <= bytes / 2);
    qa_seen q3 = {0};
    CHECK_EQ(store_qa_list(s, kb, DIM, see_qa, &q3, err), 0);
    CHECK(q3.n == 2 && !strcmp(q3.answer[0], "answer 3"));
    CHECK_EQ(store_qa_delete(s, q3.id[0], err), 0);
    /* dropping a knowledge base drops its entries */
    CHECK_EQ(store_kb_drop(s, other, err), 0);
    CHECK_EQ(store_qa_stats(s, NULL, &n2, &bytes2, err), 0);
    CHECK_EQ(n2, 1);
    store_close(s);
    /* a vector of the wrong size is an error naming the entry, not a short read */
    CHECK_EQ(tamper("UPDATE qa_bank SET vec = x'0000'"), 0);
    s = store_open(dir_path, err);
    CHECK(s);
    qa_seen q4 = {0};
    CHECK_EQ(store_qa_list(s, kb, DIM, see_qa, &q4, err), -1);
    CHECK_MSG(strstr(err, "malformed"), "%s", err);
    store_close(s);
}

/* An entry keeps why its answer stopped and its length: a hit reports them as the answer
 * first did. A negative length is a malformed entry. */
static void qa_bank_keeps_stop(void)
{
    store *s = open_fresh("kb-qa-stop");
    CHECK(s);
    char err[ERR_MAX];
    int64_t kb = make_kb(s, 1000, "app", "kb");
    CHECK(kb > 0);
    float v[DIM] = {0, 1, 0, 0};
    int64_t pass[1] = {3};
    const int stops[3] = {1, 2, 0}, lengths[3] = {3, 5, 7};
    for (int i = 0; i < 3; i++)
        CHECK_EQ(store_qa_put(s, kb, "q?", v, DIM, "a", stops[i], lengths[i], pass, 1, false,
                              10 + i, err), 0);
    qa_seen q = {0};
    CHECK_EQ(store_qa_list(s, kb, DIM, see_qa, &q, err), 0);
    CHECK_EQ(q.n, 3);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(q.stop[i] == stops[i] && q.n_tokens[i] == lengths[i],
                  "entry %d: stop %d, %d tokens", i, q.stop[i], q.n_tokens[i]);
    store_close(s);
    CHECK_EQ(tamper("UPDATE qa_bank SET generated_tokens = -1 WHERE created_ms = 11"), 0);
    s = store_open(dir_path, err);
    CHECK(s);
    q = (qa_seen){0};
    CHECK_EQ(store_qa_list(s, kb, DIM, see_qa, &q, err), -1);
    CHECK_MSG(strstr(err, "malformed"), "%s", err);
    store_close(s);
}

/* Node key k (a 32-byte key whose first byte is k) */
static const uint8_t *K(int k)
{
    static uint8_t keys[16][STORE_QKV_KEY_BYTES];
    memset(keys[k], 0, STORE_QKV_KEY_BYTES);
    keys[k][0] = (uint8_t)k;
    return keys[k];
}

static const int32_t PREFIX[4] = {11, 12, 13, 14};
static const store_owner OWNER_A = {1000, "app-a"}, OWNER_B = {1001, "app-a"};

static int put(store *s, int key, int parent, const store_owner *o, const void *raw, size_t n,
               bool predicted)
{
    char err[ERR_MAX];
    return store_qkv_put(s, K(key), parent ? K(parent) : NULL, o, PREFIX, key % 4 + 1, 16, raw,
                         n, predicted, 100, err);
}

static int get(store *s, int key, const store_owner *o, void *dst, size_t cap, bool *found,
               bool *mismatch, bool *predicted, char err[ERR_MAX])
{
    size_t got;
    int n_tok;
    return store_qkv_get(s, K(key), o, PREFIX, key % 4 + 1, dst, cap, &got, &n_tok, predicted,
                         found, mismatch, err);
}

static void qkv_roundtrip_evict_corrupt(void)
{
    store *s = open_fresh("kb-qkv");
    CHECK(s);
    char err[ERR_MAX];
    enum { RAW = 8192 };
    uint8_t *raw = malloc(RAW), *back = malloc(RAW);
    CHECK(raw && back);
    for (int i = 0; i < RAW; i++)
        raw[i] = (uint8_t)(i * 7 + i / 100);
    /* a chain root -> a -> b and a second leaf c under root */
    CHECK_EQ(put(s, 1, 0, &OWNER_A, raw, RAW, false), 0);
    CHECK_EQ(put(s, 2, 1, &OWNER_A, raw, RAW, true), 0);
    CHECK_EQ(put(s, 3, 2, &OWNER_A, raw, RAW, true), 0);
    CHECK_EQ(put(s, 4, 1, &OWNER_A, raw, RAW, false), 0);
    bool found, mismatch, predicted;
    CHECK_EQ(get(s, 2, &OWNER_A, back, RAW, &found, &mismatch, &predicted, err), 0);
    CHECK(found && !mismatch && predicted && !memcmp(raw, back, RAW));
    /* a predicted use keeps the predicted mark, a real one clears it */
    CHECK_EQ(store_qkv_touch(s, K(2), false, 200, err), 0);
    CHECK_EQ(get(s, 2, &OWNER_A, back, RAW, &found, &mismatch, &predicted, err), 0);
    CHECK(predicted);
    CHECK_EQ(store_qkv_touch(s, K(2), true, 200, err), 0);
    CHECK_EQ(get(s, 2, &OWNER_A, back, RAW, &found, &mismatch, &predicted, err), 0);
    CHECK(!predicted);
    CHECK_EQ(store_qkv_touch(s, K(9), true, 200, err), 0);
    CHECK_EQ(get(s, 9, &OWNER_A, back, RAW, &found, &mismatch, NULL, err), 0);
    CHECK(!found && !mismatch);
    /* a buffer too small is an error, never a partial node */
    CHECK_EQ(get(s, 2, &OWNER_A, back, RAW / 2, &found, &mismatch, NULL, err), -1);
    CHECK(!found);
    CHECK_EQ(store_qkv_has(s, K(3), &OWNER_A, PREFIX, 4, &found, &mismatch, err), 0);
    CHECK(found && !mismatch);
    /* the leaves are 3 (used twice after this) and 4 (once): 4 goes first; an inner node
     * stays while it has children */
    CHECK_EQ(store_qkv_touch(s, K(3), true, 300, err), 0);
    int64_t n, bytes;
    CHECK_EQ(store_qkv_stats(s, NULL, &n, &bytes, err), 0);
    CHECK_EQ(n, 4);
    int evicted;
    CHECK_EQ(store_qkv_evict(s, bytes - 1, &evicted, err), 0);
    CHECK_EQ(evicted, 1);
    CHECK_EQ(store_qkv_has(s, K(4), &OWNER_A, PREFIX, 1, &found, &mismatch, err), 0);
    CHECK(!found);
    CHECK_EQ(store_qkv_has(s, K(2), &OWNER_A, PREFIX, 3, &found, &mismatch, err), 0);
    CHECK(found);
    CHECK_EQ(store_qkv_evict(s, 0, &evicted, err), 0);
    CHECK_EQ(store_qkv_stats(s, NULL, &n, &bytes, err), 0);
    CHECK(n == 0 && bytes == 0);
    /* a cache transaction: committed, it is there after a reopen; rolled back, not */
    CHECK_EQ(store_cache_begin(s, err), 0);
    CHECK_EQ(put(s, 5, 0, &OWNER_A, raw, RAW, false), 0);
    CHECK_EQ(store_cache_commit(s, err), 0);
    CHECK_EQ(store_cache_begin(s, err), 0);
    CHECK_EQ(put(s, 6, 0, &OWNER_A, raw, RAW, false), 0);
    store_kb_rollback(s);
    store_cache_end(s);
    store_close(s);
    s = store_open(dir_path, err);
    CHECK(s);
    CHECK_EQ(store_qkv_has(s, K(6), &OWNER_A, PREFIX, 3, &found, &mismatch, err), 0);
    CHECK(!found);
    CHECK_EQ(get(s, 5, &OWNER_A, back, RAW, &found, &mismatch, NULL, err), 0);
    CHECK(found && !memcmp(raw, back, RAW));
    store_close(s);
    /* a flipped byte in a stored blob: an error naming the node */
    CHECK_EQ(tamper("UPDATE qkv_nodes SET crc = crc + 1 WHERE key = x'05" "00000000000000"
                    "000000000000000000000000000000000000000000000000'"), 0);
    s = store_open(dir_path, err);
    CHECK(s);
    CHECK_EQ(get(s, 5, &OWNER_A, back, RAW, &found, &mismatch, NULL, err), -1);
    CHECK_MSG(strstr(err, "0500000000000000") && strstr(err, "corrupt"), "%s", err);
    CHECK_EQ(store_rag_clear(s, NULL, err), 0);
    CHECK_EQ(store_qkv_stats(s, NULL, &n, &bytes, err), 0);
    CHECK_EQ(n, 0);
    store_close(s);
    free(raw);
    free(back);
}

/* A node is only ever read by its owner with its prefix: another owner, another prefix
 * or a forged row under the key is a mismatch, never its bytes. */
static void qkv_owner_and_content(void)
{
    store *s = open_fresh("kb-qkv-owner");
    CHECK(s);
    char err[ERR_MAX];
    uint8_t raw[256] = {1, 2, 3}, back[256];
    CHECK_EQ(put(s, 1, 0, &OWNER_A, raw, sizeof raw, false), 0);
    bool found, mismatch;
    CHECK_EQ(get(s, 1, &OWNER_B, back, sizeof back, &found, &mismatch, NULL, err), 0);
    CHECK(!found && mismatch);
    store_owner shared = {1000, STORE_SCOPE_UID};
    CHECK_EQ(get(s, 1, &shared, back, sizeof back, &found, &mismatch, NULL, err), 0);
    CHECK(!found && mismatch);
    size_t got;
    int n_tok;
    int32_t other[2] = {11, 99};
    CHECK_EQ(store_qkv_get(s, K(1), &OWNER_A, other, 2, back, sizeof back, &got, &n_tok, NULL,
                           &found, &mismatch, err), 0);
    CHECK(!found && mismatch);
    CHECK_EQ(store_qkv_get(s, K(1), &OWNER_A, PREFIX, 1, back, sizeof back, &got, &n_tok, NULL,
                           &found, &mismatch, err), 0);
    CHECK(!found && mismatch); /* the prefix is 2 tokens long */
    CHECK_EQ(store_qkv_has(s, K(1), &OWNER_B, PREFIX, 2, &found, &mismatch, err), 0);
    CHECK(!found && mismatch);
    CHECK_EQ(get(s, 1, &OWNER_A, back, sizeof back, &found, &mismatch, NULL, err), 0);
    CHECK(found && !mismatch && !memcmp(raw, back, sizeof raw));
    store_close(s);
    CHECK_EQ(tamper("UPDATE qkv_nodes SET tokens = x'0b0000000c000001'"), 0);
    s = store_open(dir_path, err);
    CHECK(s);
    CHECK_EQ(get(s, 1, &OWNER_A, back, sizeof back, &found, &mismatch, NULL, err), 0);
    CHECK(!found && mismatch);
    /* statistics and clearing act on one owner */
    CHECK_EQ(put(s, 2, 0, &OWNER_B, raw, sizeof raw, false), 0);
    int64_t n, bytes;
    CHECK_EQ(store_qkv_stats(s, &OWNER_B, &n, &bytes, err), 0);
    CHECK_EQ(n, 1);
    CHECK_EQ(store_rag_clear(s, &OWNER_B, err), 0);
    CHECK_EQ(store_qkv_stats(s, &OWNER_B, &n, &bytes, err), 0);
    CHECK_EQ(n, 0);
    CHECK_EQ(store_qkv_stats(s, NULL, &n, &bytes, err), 0);
    CHECK_EQ(n, 1);
    store_close(s);
}

/* One owner's flood: its own quota evicts its own least used leaves, and the global
 * budget takes from the largest owner, so another's hot nodes stay. */
static void qkv_quota_and_fair_eviction(void)
{
    store *s = open_fresh("kb-qkv-quota");
    CHECK(s);
    char err[ERR_MAX];
    uint8_t raw[1024];
    for (size_t i = 0; i < sizeof raw; i++)
        raw[i] = (uint8_t)(i * 31);
    CHECK_EQ(put(s, 1, 0, &OWNER_A, raw, sizeof raw, false), 0);
    CHECK_EQ(put(s, 2, 0, &OWNER_A, raw, sizeof raw, false), 0);
    int64_t n_a, bytes_a, n, bytes;
    CHECK_EQ(store_qkv_stats(s, &OWNER_A, &n_a, &bytes_a, err), 0);
    for (int k = 3; k < 15; k++)
        CHECK_EQ(put(s, k, 0, &OWNER_B, raw, sizeof raw, false), 0);
    int evicted;
    CHECK_EQ(store_qkv_evict_owner(s, &OWNER_B, 0, 5, &evicted, err), 0);
    CHECK_EQ(evicted, 7);
    CHECK_EQ(store_qkv_stats(s, &OWNER_B, &n, &bytes, err), 0);
    CHECK_EQ(n, 5);
    /* a budget of four nodes' bytes (prefixes differ by a few bytes): B (5 nodes) loses
     * down to two, A keeps its two */
    CHECK_EQ(store_qkv_evict(s, bytes_a * 2 + 32, &evicted, err), 0);
    CHECK_EQ(store_qkv_stats(s, &OWNER_A, &n, &bytes, err), 0);
    CHECK_EQ(n, 2);
    CHECK_EQ(store_qkv_stats(s, &OWNER_B, &n, &bytes, err), 0);
    CHECK_EQ(n, 2);
    CHECK_EQ(store_qkv_evict_owner(s, &(store_owner){1000, NULL}, 0, 1, &evicted, err), -1);
    store_close(s);
}

/* A uid's shared system prompt node (scope '*') is a parent of its apps' nodes, none of
 * its own a leaf: over the budget the largest owner that has a leaf loses one (the
 * shared node goes once its children have), and the shared owner's own quota stops at
 * the nodes others' paths hold, rather than failing the cache write. */
static void qkv_evict_shared_parents(void)
{
    store *s = open_fresh("kb-qkv-shared");
    CHECK(s);
    char err[ERR_MAX];
    enum { BIG = 8192, SMALL = 256 };
    uint8_t *raw = malloc(BIG);
    CHECK(raw);
    uint64_t r = 1;
    for (int i = 0; i < BIG; i++) /* incompressible: the stored bytes are the sizes */
        raw[i] = (uint8_t)((r = r * 6364136223846793005ull + 1442695040888963407ull) >> 56);
    const store_owner shared = {1000, STORE_SCOPE_UID}, app_b = {1000, "app-b"};
    CHECK_EQ(put(s, 1, 0, &shared, raw, BIG, false), 0);
    CHECK_EQ(put(s, 5, 0, &shared, raw, BIG, false), 0);
    CHECK_EQ(put(s, 2, 1, &OWNER_A, raw, SMALL, false), 0);
    CHECK_EQ(put(s, 3, 1, &app_b, raw, SMALL, false), 0);
    CHECK_EQ(put(s, 6, 5, &app_b, raw, SMALL, false), 0);
    int64_t n, bytes;
    CHECK_EQ(store_qkv_stats(s, NULL, &n, &bytes, err), 0);
    CHECK_EQ(n, 5);
    int evicted = -1;
    CHECK_MSG(store_qkv_evict_owner(s, &shared, 0, 1, &evicted, err) == 0, "%s", err);
    CHECK_EQ(evicted, 0);
    CHECK_MSG(store_qkv_evict(s, bytes - 1, &evicted, err) == 0, "%s", err);
    CHECK_EQ(evicted, 1);
    CHECK_EQ(store_qkv_stats(s, &shared, &n, &bytes, err), 0);
    CHECK_EQ(n, 2);
    /* with room for nothing, everything goes, leaves first */
    CHECK_MSG(store_qkv_evict(s, 0, &evicted, err) == 0, "%s", err);
    CHECK_EQ(evicted, 4);
    CHECK_EQ(store_qkv_stats(s, NULL, &n, &bytes, err), 0);
    CHECK_EQ(n, 0);
    free(raw);
    store_close(s);
}

/* Version 15's tables, without the stored responses. */
#define SCHEMA_15_RESPONSES "DROP TABLE responses;"

/* Version 14's turns and contexts, without checksums. */
#define SCHEMA_14_ROWS                                                                    \
    SCHEMA_15_RESPONSES                                                                   \
    "ALTER TABLE turns DROP COLUMN crc;"                                                  \
    "ALTER TABLE contexts DROP COLUMN crc;"

/* Version 13's QA bank, without an answer's stop reason and length. */
#define SCHEMA_13_QA                                                                      \
    SCHEMA_14_ROWS                                                                        \
    "ALTER TABLE qa_bank DROP COLUMN stop_reason;"                                        \
    "ALTER TABLE qa_bank DROP COLUMN generated_tokens;"

/* Version 12's kbs, without the embed model's name. */
#define SCHEMA_12_KBS SCHEMA_13_QA "ALTER TABLE kbs DROP COLUMN embed_model;"

/* Version 10's knowledge base tables (float32 vectors, a passage's text whole, FTS5
 * with its own copy), for knowledge base 1. */
#define SCHEMA_10_KB                                                                      \
    SCHEMA_12_KBS                                                                         \
    "DROP TABLE kb_passages; DROP TABLE kb_docs; DROP TABLE IF EXISTS kbfts_1;"          \
    "CREATE TABLE kb_docs (kb_id INTEGER NOT NULL REFERENCES kbs(id) ON DELETE CASCADE," \
    " doc TEXT NOT NULL, metadata TEXT, bytes INTEGER NOT NULL, n_passages INTEGER"      \
    " NOT NULL, created_ms INTEGER NOT NULL, PRIMARY KEY (kb_id, doc));"                  \
    "CREATE TABLE kb_passages (id INTEGER PRIMARY KEY, kb_id INTEGER NOT NULL, doc TEXT"  \
    " NOT NULL, seq INTEGER NOT NULL, text TEXT NOT NULL, vec BLOB NOT NULL, FOREIGN KEY" \
    " (kb_id, doc) REFERENCES kb_docs(kb_id, doc) ON DELETE CASCADE);"                     \
    "CREATE INDEX kb_passages_by_doc ON kb_passages (kb_id, doc);"                         \
    "CREATE VIRTUAL TABLE kbfts_1 USING fts5(text);"

/* Version 9's QKV table with one row keyed by a 64-bit hash, and no kbs.share_uid. */
#define SCHEMA_9_QKV                                                                      \
    "DROP TABLE qkv_nodes; CREATE TABLE qkv_nodes (key INTEGER PRIMARY KEY,"             \
    " parent INTEGER NOT NULL, n_tokens INTEGER NOT NULL, raw_bytes INTEGER NOT NULL,"   \
    " crc INTEGER NOT NULL, blob BLOB NOT NULL, uses INTEGER NOT NULL, last_used_ms"     \
    " INTEGER NOT NULL, predicted INTEGER NOT NULL DEFAULT 0);"                           \
    "CREATE INDEX qkv_by_parent ON qkv_nodes (parent);"                                   \
    "INSERT INTO qkv_nodes VALUES (5, 0, 16, 3, 0, x'010203', 1, 1, 0);"                  \
    "ALTER TABLE kbs DROP COLUMN share_uid;"

/* A store of version 10 with a knowledge base of app 1000/app and one QA entry, turned
 * back into version 9's tables with extra_sql run too. 0, or -1. */
static int store_of_version_9(const char *name, const char *extra_sql)
{
    store *s = open_fresh(name);
    if (!s)
        return -1;
    int64_t kb = make_kb(s, 1000, "app", "kb");
    char err[ERR_MAX], sql[2048];
    float v[DIM] = {1, 0, 0, 0};
    int64_t pass[1] = {1};
    int rc = kb > 0 ? store_qa_put(s, kb, "q?", v, DIM, "a", 0, 1, pass, 1, false, 1, err) : -1;
    store_close(s);
    snprintf(sql, sizeof sql, "%s %s %s PRAGMA user_version = 9", SCHEMA_10_KB, SCHEMA_9_QKV,
             extra_sql);
    return rc ? -1 : tamper(sql);
}

/* Schema 9 -> 10: QKV nodes without an owner go, QA entries of a known app stay. */
static void migration_drops_ownerless(void)
{
    /* also a QA row of a knowledge base that is gone */
    CHECK_EQ(store_of_version_9("kb-migrate",
                                "INSERT INTO qa_bank (kb_id, question, vec, answer, passages,"
                                " created_ms) VALUES (999, 'q', x'00', 'a', x'', 1);"), 0);
    char err[ERR_MAX];
    store *s = store_open(dir_path, err);
    CHECK_MSG(s, "%s", err);
    int64_t n, bytes;
    CHECK_EQ(store_qkv_stats(s, NULL, &n, &bytes, err), 0);
    CHECK_EQ(n, 0);
    CHECK_EQ(store_qa_stats(s, NULL, &n, &bytes, err), 0);
    CHECK_EQ(n, 1);
    store_close(s);
    /* the row of the gone knowledge base went with the migration, not just from view */
    char path[600];
    snprintf(path, sizeof path, "%s/llmsd.db", dir_path);
    sqlite3 *db;
    CHECK_EQ(sqlite3_open(path, &db), SQLITE_OK);
    sqlite3_stmt *st;
    CHECK_EQ(sqlite3_prepare_v2(db, "SELECT count(*) FROM qa_bank", -1, &st, NULL), SQLITE_OK);
    CHECK_EQ(sqlite3_step(st), SQLITE_ROW);
    CHECK_EQ(sqlite3_column_int(st, 0), 1);
    sqlite3_finalize(st);
    sqlite3_close(db);
}

/* A query's single count as an integer, -1 on any error. */
static int count_rows(const char *sql)
{
    char path[600];
    snprintf(path, sizeof path, "%s/llmsd.db", dir_path);
    sqlite3 *db;
    sqlite3_stmt *st = NULL;
    int n = -1;
    if (sqlite3_open(path, &db) == SQLITE_OK &&
        sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
        n = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return n;
}

/* A migration that fails halfway (its last index's name taken, after it has dropped the
 * old QKV table) changes nothing: the store refuses to open, naming the step, and the
 * database is still version 9 with every row; once the obstacle is gone it migrates. A
 * crash halfway leaves the same, through SQLite's rollback of the open transaction. */
static void failed_migration_loses_nothing(void)
{
    CHECK_EQ(store_of_version_9("kb-migrate-fail", "CREATE INDEX qkv_by_owner ON qa_bank (kb_id);"),
             0);
    char err[ERR_MAX];
    store *s = store_open(dir_path, err);
    CHECK_MSG(!s && strstr(err, "qkv_by_owner"), "%s", s ? "opened" : err);
    store_close(s);
    CHECK_EQ(count_rows("PRAGMA user_version"), 9);
    CHECK_EQ(count_rows("SELECT count(*) FROM qkv_nodes WHERE key = 5"), 1);
    CHECK_EQ(count_rows("SELECT count(*) FROM qa_bank"), 1);
    CHECK_EQ(count_rows("SELECT count(*) FROM kbs"), 1);
    CHECK_EQ(tamper("DROP INDEX qkv_by_owner"), 0);
    s = store_open(dir_path, err);
    CHECK_MSG(s, "%s", err);
    store_close(s);
    CHECK_EQ(count_rows("PRAGMA user_version"), store_schema_version());
    CHECK_EQ(count_rows("SELECT count(*) FROM qkv_nodes"), 0);
    CHECK_EQ(count_rows("SELECT count(*) FROM qa_bank"), 1);
}

/* Schema 10 -> 11: overlapping passages become heads of one text and read back the
 * same, float vectors int8 ones, the FTS table contentless (BM25 as before, and a
 * removed document's words leave it), stored IVF indexes go (rebuilt from the new
 * vectors). */
static void migration_compacts_passages(void)
{
    store *s = open_fresh("kb-migrate-11");
    CHECK(s);
    char err[ERR_MAX];
    int64_t kb = make_kb(s, 1000, "app", "kb");
    CHECK_EQ(kb, 1);
    store_close(s);
    CHECK_EQ(tamper(SCHEMA_10_KB
                    "INSERT INTO kb_docs VALUES (1, 'greek', 'm', 40, 3, 1);"
                    "INSERT INTO kb_docs VALUES (1, 'solo', NULL, 5, 1, 1);"
                    "INSERT INTO kb_passages VALUES"
                    " (7, 1, 'greek', 0, 'alpha beta gamma delta', x'0000803F000000000000000000000000'),"
                    " (8, 1, 'greek', 1, 'gamma delta epsilon zeta', x'000000000000803F0000000000000000'),"
                    " (9, 1, 'greek', 2, 'epsilon zeta eta', x'00000000000000000000803F00000000'),"
                    " (11, 1, 'solo', 0, 'omega', x'000000000000000000000000000080BF');"
                    "INSERT INTO kbfts_1 (rowid, text) SELECT id, text FROM kb_passages;"
                    "INSERT INTO ivf_indexes (app_id, name, dim, nlist, centroids)"
                    " VALUES (1, 'kb:1', 4, 1, x'0000803F000000000000000000000000');"
                    "PRAGMA user_version = 10;"), 0);
    s = store_open(dir_path, err);
    CHECK_MSG(s, "%s", err);
    const char *want[] = {"alpha beta gamma delta", "gamma delta epsilon zeta",
                          "epsilon zeta eta"};
    for (int i = 0; i < 3; i++) {
        pass_seen ps;
        bool found;
        CHECK_EQ(store_kb_passage(s, kb, 7 + i, see_passage, &ps, &found, err), 0);
        CHECK_MSG(found && !strcmp(ps.text, want[i]) && ps.seq == i, "passage %d: '%s'", i,
                  ps.text);
    }
    int64_t ids[4];
    float sc[4];
    int n, nv = 0;
    CHECK_EQ(store_kb_bm25(s, kb, "epsilon", 4, ids, sc, &n, err), 0);
    CHECK_EQ(n, 2);
    CHECK_EQ(store_kb_vectors(s, kb, DIM, count_vec, &nv, err), 0);
    CHECK_EQ(nv, 4);
    kb_seen k = {0};
    CHECK_EQ(store_kb_list(s, -1, see_kb, &k, err), 0);
    CHECK(k.n == 1 && k.docs[0] == 2 && k.passages[0] == 4);
    bool found;
    CHECK_EQ(store_kb_remove_doc(s, kb, "greek", &found, err), 0);
    CHECK(found);
    CHECK_EQ(clean_all(s), 0);
    CHECK_EQ(store_kb_bm25(s, kb, "gamma OR zeta OR alpha", 4, ids, sc, &n, err), 0);
    CHECK_EQ(n, 0);
    CHECK_EQ(store_kb_bm25(s, kb, "omega", 4, ids, sc, &n, err), 0);
    CHECK(n == 1 && ids[0] == 11);
    store_close(s);
    CHECK_EQ(count_rows("PRAGMA user_version"), store_schema_version());
    CHECK_EQ(count_rows("SELECT count(*) FROM ivf_indexes"), 0);
    CHECK_EQ(count_rows("SELECT length(vec) FROM kb_passages WHERE id = 11"), DIM + 4);
}

/* Schema 11 -> 12: stored IVF indexes (float32 lists) go and their lists keep ids only;
 * QA vectors stay float32, read back exactly. */
static void migration_12_compact_qa_ivf(void)
{
    store *s = open_fresh("kb-migrate-12");
    CHECK(s);
    char err[ERR_MAX];
    int64_t kb = make_kb(s, 1000, "app", "kb");
    CHECK_EQ(kb, 1);
    store_close(s);
    /* version 11: a float32 QA vector, an IVF list of floats */
    CHECK_EQ(tamper(SCHEMA_12_KBS
                    "INSERT INTO qa_bank (kb_id, question, vec, answer, passages, created_ms)"
                    " VALUES (1, 'q?', x'0000803F0000003F0000000000000000', 'a', x'', 1);"
                    "INSERT INTO qa_bank (kb_id, question, vec, answer, passages, created_ms)"
                    " VALUES (1, 'bad', x'0000', 'a', x'', 2);"
                    "DROP TABLE ivf_lists;"
                    "CREATE TABLE ivf_lists (index_id INTEGER NOT NULL REFERENCES"
                    " ivf_indexes(id) ON DELETE CASCADE, list INTEGER NOT NULL, n INTEGER NOT"
                    " NULL, crc INTEGER NOT NULL, ids BLOB NOT NULL, vecs BLOB NOT NULL,"
                    " PRIMARY KEY (index_id, list));"
                    "INSERT INTO ivf_indexes (app_id, name, dim, nlist, centroids)"
                    " VALUES (1, 'kb:1', 4, 1, x'0000803F000000000000000000000000');"
                    "INSERT INTO ivf_lists VALUES (1, 0, 1, 0, x'0100000000000000',"
                    " x'0000803F000000000000000000000000');"
                    "PRAGMA user_version = 11;"), 0);
    s = store_open(dir_path, err);
    CHECK_MSG(s, "%s", err);
    /* the entry of the wrong size stays the error it was; without it the other reads back */
    qa_seen q = {0};
    CHECK_EQ(store_qa_list(s, kb, DIM, see_qa, &q, err), -1);
    CHECK_MSG(strstr(err, "malformed"), "%s", err);
    store_close(s);
    CHECK_EQ(count_rows("SELECT length(vec) FROM qa_bank WHERE question = 'q?'"),
             (int64_t)sizeof(float) * DIM);
    CHECK_EQ(tamper("DELETE FROM qa_bank WHERE question = 'bad'"), 0);
    s = store_open(dir_path, err);
    CHECK_MSG(s, "%s", err);
    q = (qa_seen){0};
    CHECK_EQ(store_qa_list(s, kb, DIM, see_qa, &q, err), 0);
    CHECK_EQ(q.n, 1);
    CHECK(q.vec[0][0] == 1.0f && q.vec[0][1] == 0.5f && q.vec[0][2] == 0.0f);
    store_close(s);
    CHECK_EQ(count_rows("PRAGMA user_version"), store_schema_version());
    CHECK_EQ(count_rows("SELECT count(*) FROM ivf_indexes"), 0);
    CHECK_EQ(count_rows("SELECT count(*) FROM pragma_table_info('ivf_lists') WHERE name = 'vecs'"),
             0);
}

/* Schema 12 -> 13: a knowledge base made before keeps its embedder's file and has no
 * model name ('': the default embed model while its file is that one). */
static void migration_13_kb_embed_model(void)
{
    store *s = open_fresh("kb-migrate-13");
    CHECK(s);
    char err[ERR_MAX];
    CHECK_EQ(make_kb(s, 1000, "app", "kb"), 1);
    store_close(s);
    CHECK_EQ(tamper(SCHEMA_12_KBS "PRAGMA user_version = 12;"), 0);
    s = store_open(dir_path, err);
    CHECK_MSG(s, "%s", err);
    kb_seen k = {0};
    CHECK_EQ(store_kb_list(s, -1, see_kb, &k, err), 0);
    CHECK_EQ(k.n, 1);
    CHECK(!strcmp(k.embed_models[0], "") && !strcmp(k.embedders[0], "test-embedder"));
    store_close(s);
    CHECK_EQ(count_rows("PRAGMA user_version"), store_schema_version());
}

/* Schema 13 -> 14: a QA entry stored before keeps its answer and reads as one that
 * stopped at its end of turn (stop 0) with 0 tokens, what its hits reported; entries
 * stored after keep their own. */
static void migration_14_qa_stop(void)
{
    store *s = open_fresh("kb-migrate-14");
    CHECK(s);
    char err[ERR_MAX];
    int64_t kb = make_kb(s, 1000, "app", "kb");
    CHECK_EQ(kb, 1);
    store_close(s);
    CHECK_EQ(tamper(SCHEMA_13_QA
                    "INSERT INTO qa_bank (kb_id, question, vec, answer, passages, created_ms)"
                    " VALUES (1, 'q?', x'0000803F000000000000000000000000', 'old', x'', 1);"
                    "PRAGMA user_version = 13;"), 0);
    s = store_open(dir_path, err);
    CHECK_MSG(s, "%s", err);
    float v[DIM] = {1, 0, 0, 0};
    CHECK_EQ(store_qa_put(s, kb, "q?", v, DIM, "new", 1, 3, NULL, 0, false, 2, err), 0);
    qa_seen q = {0};
    CHECK_EQ(store_qa_list(s, kb, DIM, see_qa, &q, err), 0);
    CHECK_EQ(q.n, 2);
    CHECK(!strcmp(q.answer[0], "old") && q.stop[0] == 0 && q.n_tokens[0] == 0);
    CHECK(!strcmp(q.answer[1], "new") && q.stop[1] == 1 && q.n_tokens[1] == 3);
    store_close(s);
    CHECK_EQ(count_rows("PRAGMA user_version"), store_schema_version());
}

int main(void)
{
    RUN(create_list_isolation);
    RUN(add_replace_remove_search);
    RUN(compact_staged_passages);
    RUN(passage_length_out_of_range);
    RUN(drop_in_slices);
    RUN(qa_bank_limits_and_corruption);
    RUN(qa_bank_keeps_stop);
    RUN(qkv_roundtrip_evict_corrupt);
    RUN(qkv_owner_and_content);
    RUN(qkv_quota_and_fair_eviction);
    RUN(qkv_evict_shared_parents);
    RUN(migration_drops_ownerless);
    RUN(failed_migration_loses_nothing);
    RUN(migration_compacts_passages);
    RUN(migration_12_compact_qa_ivf);
    RUN(migration_13_kb_embed_model);
    RUN(migration_14_qa_stop);
    return test_finish();
}
