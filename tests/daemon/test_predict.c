/*
 * Tests of the predictor's choices (daemon/rag/predict.c) on a real store: knowledge-based
 * prediction (an abstract first, then a question per stride-th new passage), history-based
 * paraphrases and follow-ups, the cache scheduler (prefill only at or above
 * tau_scheduler, decoded below, QKV->QA and QA->QKV conversions), the budget of an idle
 * period, duplicates, warm-ups of new passages (the other tests turn them off), the
 * questions of stale QA entries queued again, and a dropped knowledge base's id taken by
 * another app's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/rag/predict.h"
#include "storage/kb.h"
#include "tests/support/test.h"

#define DIM 2

typedef struct env {
    config cfg;
    store *st;
    predict *p;
    kb_ref kb;
    int64_t first;
} env;

/* A store with one knowledge base of n passages "passage I about topic I" and a predictor. */
static int env_open(env *e, const char *name, int budget, int stride, int n)
{
    char err[ERR_MAX], dir[512];
    memset(e, 0, sizeof *e);
    if (config_defaults(&e->cfg, err))
        return -1;
    e->cfg.predict_budget = budget;
    e->cfg.predict_stride = stride;
    e->cfg.predict_warm = 0;
    snprintf(dir, sizeof dir, "%s/%s/state", test_tmpdir(), name);
    int64_t app_id;
    bool exists;
    if (!(e->st = store_open(dir, err)) || store_app_id(e->st, 1000, "app", &app_id, err) ||
        store_kb_create(e->st, app_id, "kb", 32, 0, "", "e", DIM, false, 1, &e->kb.id, &exists,
                        err))
        return -1;
    char texts[16][64];
    const char *tp[16];
    float vecs[16 * DIM] = {0};
    for (int i = 0; i < n; i++) {
        snprintf(texts[i], sizeof texts[i], "passage %d about topic%d", i, i);
        tp[i] = texts[i];
    }
    char text[16 * 64];
    store_span spans[16];
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        spans[i] = (store_span){len + (i > 0), strlen(tp[i])};
        len += (size_t)snprintf(text + len, sizeof text - len, "%s%s", i ? " " : "", tp[i]);
    }
    if (store_kb_put_doc(e->st, e->kb.id, "doc", NULL, text, spans, n, vecs, DIM, 1, &e->first,
                         err))
        return -1;
    e->kb.dim = DIM;
    e->kb.uid = 1000;
    e->kb.app = "app";
    e->kb.name = "kb";
    if (!(e->p = predict_new(&e->cfg, e->st, err)))
        return -1;
    return 0;
}

static void env_close(env *e)
{
    predict_free(e->p);
    store_close(e->st);
}

static void off_when_no_budget(void)
{
    env e;
    CHECK(env_open(&e, "pred-off", 0, 1, 3) == 0);
    predict_note_change(e.p, &e.kb, e.first);
    predict_note_query(e.p, &e.kb, "what about topic1?");
    predict_task t;
    CHECK(!predict_enabled(e.p));
    CHECK(!predict_has_work(e.p, 0.5f, true));
    CHECK(!predict_next(e.p, 0.5f, true, &t));
    env_close(&e);
}

static void knowledge_based(void)
{
    env e;
    CHECK(env_open(&e, "pred-kb", 100, 2, 5) == 0);
    predict_note_change(e.p, &e.kb, e.first);
    predict_task t;
    /* the abstract comes first, from the newest passages */
    CHECK(predict_next(e.p, 0.85f, true, &t));
    CHECK(t.kind == PREDICT_GENERATE && t.uid == 1000 && !strcmp(t.app, "app") &&
          !strcmp(t.kb, "kb") && t.max_tokens == e.cfg.predict_max_tokens);
    CHECK_MSG(strstr(t.text, "passage 4 about topic4") && strstr(t.text, "summary"), "%s", t.text);
    predict_done(e.p, &t, PREDICT_RAN, "  A collection of notes on topics.\nmore text");
    predict_task_clear(&t);
    /* then a question for the first new passage and every stride-th one: 0, 1, 3 */
    const char *want[] = {"passage 0 about", "passage 1 about", "passage 3 about"};
    for (int i = 0; i < 3; i++) {
        CHECK(predict_next(e.p, 0.85f, true, &t));
        CHECK(t.kind == PREDICT_GENERATE);
        CHECK_MSG(strstr(t.text, want[i]) && strstr(t.text, "A collection of notes on topics."),
                  "%s", t.text);
        char q[64];
        snprintf(q, sizeof q, "What is topic %d?\nThe end.", i);
        predict_done(e.p, &t, PREDICT_RAN, q);
        predict_task_clear(&t);
        /* each proposal is asked (decoded: tau_query 0.85 < tau_scheduler 0.9) before the
         * next proposal is made */
        CHECK(predict_next(e.p, 0.85f, true, &t));
        CHECK(t.kind == PREDICT_QUERY && t.decode);
        snprintf(q, sizeof q, "What is topic %d?", i);
        CHECK_MSG(!strcmp(t.text, q), "%s", t.text);
        predict_done(e.p, &t, PREDICT_RAN, NULL);
        predict_task_clear(&t);
    }
    CHECK(!predict_next(e.p, 0.85f, true, &t));
    predict_stats st;
    predict_get_stats(e.p, &st);
    CHECK(st.generations == 4 && st.predicted == 3 && st.decoded == 3 && st.prefilled == 0);
    env_close(&e);
}

static void history_and_duplicates(void)
{
    env e;
    CHECK(env_open(&e, "pred-hist", 100, 100, 1) == 0);
    predict_note_query(e.p, &e.kb, "where is the boat?");
    predict_note_query(e.p, &e.kb, "where is the boat?");
    predict_task t;
    CHECK(predict_next(e.p, 0.95f, true, &t));
    CHECK_MSG(t.kind == PREDICT_GENERATE && strstr(t.text, "other words") &&
              strstr(t.text, "where is the boat?"), "%s", t.text);
    predict_done(e.p, &t, PREDICT_RAN, "Where can the boat be found?");
    predict_task_clear(&t);
    /* tau_query 0.95 >= tau_scheduler: prefill only */
    CHECK(predict_next(e.p, 0.95f, true, &t));
    CHECK(t.kind == PREDICT_QUERY && !t.decode && !strcmp(t.text, "Where can the boat be found?"));
    predict_done(e.p, &t, PREDICT_RAN, NULL);
    predict_task_clear(&t);
    CHECK(predict_next(e.p, 0.95f, true, &t));
    CHECK(t.kind == PREDICT_GENERATE && strstr(t.text, "follow-up"));
    /* the same proposal again: nothing queued */
    predict_done(e.p, &t, PREDICT_RAN, "Where can the boat be found?");
    predict_task_clear(&t);
    CHECK(!predict_has_work(e.p, 0.95f, false));
    predict_stats st;
    predict_get_stats(e.p, &st);
    CHECK(st.prefilled == 1 && st.queued == 0);
    env_close(&e);
}

static void cache_scheduler_conversions(void)
{
    env e;
    CHECK(env_open(&e, "pred-conv", 100, 100, 1) == 0);
    predict_note_query(e.p, &e.kb, "q?");
    predict_task t;
    CHECK(predict_next(e.p, 0.95f, true, &t));
    predict_done(e.p, &t, PREDICT_RAN, "first question?");
    predict_task_clear(&t);
    CHECK(predict_next(e.p, 0.95f, true, &t));
    CHECK(t.kind == PREDICT_QUERY && !t.decode);
    predict_done(e.p, &t, PREDICT_RAN, NULL);
    predict_task_clear(&t);
    /* tau drops: the prefilled question is decoded before the history's follow-up */
    CHECK(predict_next(e.p, 0.5f, true, &t));
    CHECK(t.kind == PREDICT_QUERY && t.decode && !strcmp(t.text, "first question?"));
    predict_done(e.p, &t, PREDICT_RAN, NULL);
    predict_task_clear(&t);
    predict_stats st;
    predict_get_stats(e.p, &st);
    CHECK(st.converted == 1 && st.decoded == 1 && st.prefilled == 1);
    /* tau rises again: decoded questions go back to the QKV tree only while it has room */
    CHECK(predict_next(e.p, 0.95f, false, &t));
    CHECK(t.kind == PREDICT_GENERATE);
    predict_done(e.p, &t, PREDICT_DROPPED, NULL);
    predict_task_clear(&t);
    CHECK(!predict_has_work(e.p, 0.95f, false));
    CHECK(predict_next(e.p, 0.95f, true, &t));
    CHECK(t.kind == PREDICT_QUERY && !t.decode && !strcmp(t.text, "first question?"));
    /* its path was whole: nothing computed, not counted, but it is prefilled now */
    predict_done(e.p, &t, PREDICT_CACHED, NULL);
    predict_task_clear(&t);
    predict_get_stats(e.p, &st);
    CHECK(st.converted == 1 && st.prefilled == 1);
    CHECK(!predict_has_work(e.p, 0.95f, true));
    CHECK(predict_has_work(e.p, 0.5f, true));
    env_close(&e);
}

static void budget_per_idle_period(void)
{
    env e;
    CHECK(env_open(&e, "pred-budget", 2, 100, 1) == 0);
    predict_note_query(e.p, &e.kb, "one?");
    predict_note_query(e.p, &e.kb, "two?");
    predict_task t;
    for (int i = 0; i < 2; i++) {
        CHECK(predict_next(e.p, 0.5f, true, &t));
        predict_done(e.p, &t, PREDICT_DROPPED, NULL);
        predict_task_clear(&t);
    }
    CHECK(!predict_has_work(e.p, 0.5f, true));
    CHECK(!predict_next(e.p, 0.5f, true, &t));
    predict_idle_end(e.p);
    CHECK(predict_next(e.p, 0.5f, true, &t));
    predict_task_clear(&t);
    env_close(&e);
}

/* New passages are warmed up newest first, before the generations that propose
 * questions, predict_warm per idle period and only while the QKV tree has room; a
 * warm-up does not spend predict_budget. */
static void warm_ups(void)
{
    env e;
    CHECK(env_open(&e, "pred-warm", 1, 1, 5) == 0);
    e.cfg.predict_warm = 3;
    predict_note_change(e.p, &e.kb, e.first);
    predict_task t;
    CHECK(predict_has_work(e.p, 0.95f, true));
    for (int i = 0; i < 3; i++) {
        CHECK(predict_next(e.p, 0.95f, true, &t));
        CHECK(t.kind == PREDICT_WARM && t.passage == e.first + 4 - i && t.text &&
              !t.text[0] && !t.decode && !strcmp(t.kb, "kb") && t.kb_id == e.kb.id);
        predict_done(e.p, &t, i == 2 ? PREDICT_DROPPED : PREDICT_RAN, NULL);
        predict_task_clear(&t);
    }
    predict_stats st;
    predict_get_stats(e.p, &st);
    CHECK_EQ(st.warmed, 2);
    CHECK_EQ(st.predicted, 0);
    /* the warm-ups spent predict_warm; predict_budget (1) still gives the abstract */
    CHECK(predict_next(e.p, 0.95f, true, &t));
    CHECK(t.kind == PREDICT_GENERATE);
    predict_task_clear(&t);
    CHECK(!predict_next(e.p, 0.95f, true, &t));
    /* a new idle period: the two passages left, but not while the tree is full */
    predict_idle_end(e.p);
    CHECK(!predict_has_work(e.p, 0.95f, false) || (predict_next(e.p, 0.95f, false, &t) &&
                                                  t.kind != PREDICT_WARM));
    predict_task_clear(&t);
    predict_idle_end(e.p);
    for (int i = 0; i < 2; i++) {
        CHECK(predict_next(e.p, 0.95f, true, &t));
        CHECK(t.kind == PREDICT_WARM && t.passage == e.first + 1 - i);
        predict_task_clear(&t);
    }
    env_close(&e);
}

/* A stale QA entry's question is queued again as a predicted query, decoded or only
 * prefilled as the cache scheduler says, once (a second note of it changes nothing),
 * and taken out of the lists of converted questions; with prediction off nothing. */
static void stale_entries_regenerated(void)
{
    env e;
    CHECK(env_open(&e, "pred-stale", 100, 100, 1) == 0);
    predict_note_stale(e.p, &e.kb, "who said it?");
    predict_note_stale(e.p, &e.kb, "who said it?");
    predict_task t;
    CHECK(predict_next(e.p, 0.5f, true, &t));
    CHECK(t.kind == PREDICT_QUERY && t.decode && !strcmp(t.text, "who said it?"));
    CHECK(t.kb_id == e.kb.id && !strcmp(t.kb, "kb") && !strcmp(t.app, "app"));
    predict_done(e.p, &t, PREDICT_RAN, NULL);
    predict_task_clear(&t);
    CHECK(!predict_has_work(e.p, 0.5f, true));
    /* decoded, so at a high tau it would be prefilled again (QA->QKV); stale now, it is a
     * fresh question: one task, not a conversion and a question */
    predict_note_stale(e.p, &e.kb, "who said it?");
    CHECK(predict_next(e.p, 0.95f, true, &t));
    CHECK(t.kind == PREDICT_QUERY && !t.decode && !strcmp(t.text, "who said it?"));
    predict_done(e.p, &t, PREDICT_RAN, NULL);
    predict_task_clear(&t);
    predict_stats st;
    predict_get_stats(e.p, &st);
    CHECK(st.converted == 0 && st.decoded == 1 && st.prefilled == 1);
    env_close(&e);

    CHECK(env_open(&e, "pred-stale-off", 0, 100, 1) == 0);
    predict_note_stale(e.p, &e.kb, "who said it?");
    CHECK(!predict_has_work(e.p, 0.5f, true));
    env_close(&e);
}

/* A knowledge base's id is its row's, which SQLite hands out again once the largest is
 * dropped: another app's knowledge base that gets it is predicted for as itself (its
 * app, its name), with nothing of the dropped one's state (the abstract of a generation
 * that was under way for it). */
static void kb_id_reused_by_another_app(void)
{
    env e;
    char err[ERR_MAX];
    CHECK(env_open(&e, "pred-reuse", 100, 1, 2) == 0);
    predict_note_change(e.p, &e.kb, e.first);
    predict_task t, ran;
    CHECK(predict_next(e.p, 0.85f, true, &ran));
    CHECK(ran.kind == PREDICT_GENERATE && !strcmp(ran.app, "app"));
    int64_t app_b, kb_b, first_b;
    bool exists;
    float vecs[DIM] = {0};
    const char *text = "a note on sailing boats";
    store_span span = {0, strlen(text)};
    CHECK(store_kb_drop(e.st, e.kb.id, err) == 0);
    CHECK(store_app_id(e.st, 1000, "other", &app_b, err) == 0);
    CHECK(store_kb_create(e.st, app_b, "kb-b", 32, 0, "", "e", DIM, false, 1, &kb_b, &exists,
                          err) == 0);
    CHECK_MSG(kb_b == e.kb.id, "the dropped id %lld was not reused (%lld)",
              (long long)e.kb.id, (long long)kb_b);
    CHECK(store_kb_put_doc(e.st, kb_b, "doc", NULL, text, &span, 1, vecs, DIM, 1, &first_b,
                           err) == 0);
    kb_ref b = {.id = kb_b, .dim = DIM, .uid = 1000, .app = "other", .name = "kb-b"};
    predict_note_change(e.p, &b, first_b);
    predict_done(e.p, &ran, PREDICT_RAN, "The private notes of app.");
    predict_task_clear(&ran);
    CHECK(predict_next(e.p, 0.85f, true, &t));
    CHECK_MSG(t.kind == PREDICT_GENERATE && !strcmp(t.app, "other") && !strcmp(t.kb, "kb-b"),
              "a task of app '%s', knowledge base '%s'", t.app, t.kb);
    CHECK_MSG(strstr(t.text, "sailing boats") && !strstr(t.text, "private notes"), "%s", t.text);
    predict_task_clear(&t);
    env_close(&e);
}

int main(void)
{
    RUN(off_when_no_budget);
    RUN(knowledge_based);
    RUN(history_and_duplicates);
    RUN(cache_scheduler_conversions);
    RUN(budget_per_idle_period);
    RUN(warm_ups);
    RUN(stale_entries_regenerated);
    RUN(kb_id_reused_by_another_app);
    return test_finish();
}
