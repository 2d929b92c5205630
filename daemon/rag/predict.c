/*
 * predict.c — idle-time query prediction and the cache scheduler's choices.
 */
#include "daemon/rag/predict.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/textbuf.h"
#include "storage/kb.h"

#define PRED_KBS 64            /* knowledge bases followed (least recently changed go) */
#define PRED_IDS 64            /* new passage ids remembered per list and knowledge base */
#define PRED_QUEUE 256         /* questions per list (waiting, prefilled, decoded) */
#define PRED_HIST 32           /* real questions waiting for paraphrase and follow-up */
#define PRED_Q_MAX 256         /* bytes of a predicted question */
#define PRED_PASSAGE_CHARS 600 /* bytes of a passage in a prompt */
#define PRED_ABSTRACT_CHARS 1200
#define PRED_ABSTRACT_PASSAGES 4 /* newest passages an abstract update reads */
#define PRED_PROBE_MAX 4096    /* new passage ids looked for after one change */
#define PRED_WARM_MAX 4096     /* new passages waiting for a warm-up per knowledge base */

enum purpose { P_ABSTRACT, P_QUESTION, P_PARAPHRASE, P_FOLLOWUP, P_ASK, P_CONVERT };

/* A knowledge base's identity: its app and name. */
typedef struct pkb_id {
    int64_t kb_id;
    uint32_t uid;
    char app[KB_NAME_MAX + 1];
    char kb[KB_NAME_MAX + 1];
} pkb_id;

typedef struct pkb {
    pkb_id id;
    char *abstract;
    int64_t abs_ids[PRED_IDS];  /* new passages the abstract has not read */
    int n_abs;
    int64_t ask_ids[PRED_IDS];  /* passages to propose a question about */
    int n_ask;
    int64_t *warm_ids;          /* (cap_warm) passages to warm up, newest last */
    int n_warm, cap_warm;
    long n_new;                 /* new passages seen (the stride counts them) */
    uint64_t changed;           /* order of its last change */
} pkb;

typedef struct pq {
    pkb_id id;
    char *question;
    int stage;                  /* history: 0 paraphrase next, 1 follow-up next */
} pq;

typedef struct qlist {
    pq items[PRED_QUEUE];
    int n, cap;
} qlist;

struct predict {
    const config *cfg;
    store *st;
    pkb kbs[PRED_KBS];
    int n_kbs;
    uint64_t changes;
    qlist queue, prefilled, decoded, hist;
    int used;                   /* tasks given in this idle period */
    int warmed;                 /* warm-ups given in this idle period */
    predict_stats stats;
};

predict *predict_new(const config *cfg, store *st, char err[ERR_MAX])
{
    predict *p = calloc(1, sizeof *p);
    if (!p) {
        err_set(err, "out of memory");
        return NULL;
    }
    p->cfg = cfg;
    p->st = st;
    p->queue.cap = p->prefilled.cap = p->decoded.cap = PRED_QUEUE;
    p->hist.cap = PRED_HIST;
    return p;
}

static void list_clear(qlist *l)
{
    for (int i = 0; i < l->n; i++)
        free(l->items[i].question);
    l->n = 0;
}

void predict_free(predict *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n_kbs; i++) {
        free(p->kbs[i].abstract);
        free(p->kbs[i].warm_ids);
    }
    list_clear(&p->queue);
    list_clear(&p->prefilled);
    list_clear(&p->decoded);
    list_clear(&p->hist);
    free(p);
}

bool predict_enabled(const predict *p)
{
    return p->cfg->predict_budget > 0;
}

static void id_of(pkb_id *id, const kb_ref *kb)
{
    id->kb_id = kb->id;
    id->uid = kb->uid;
    snprintf(id->app, sizeof id->app, "%s", kb->app ? kb->app : "");
    snprintf(id->kb, sizeof id->kb, "%s", kb->name ? kb->name : "");
}

/* Removes item i of l; its question is the caller's (returned). */
static char *list_take(qlist *l, int i, pq *out)
{
    *out = l->items[i];
    memmove(&l->items[i], &l->items[i + 1], sizeof *l->items * (size_t)(l->n - i - 1));
    l->n--;
    return out->question;
}

static int list_find(const qlist *l, int64_t kb_id, const char *q)
{
    for (int i = 0; i < l->n; i++)
        if (l->items[i].id.kb_id == kb_id && !strcmp(l->items[i].question, q))
            return i;
    return -1;
}

/* Appends (id, question) to l (the oldest goes when full); question becomes l's. */
static void list_push(qlist *l, const pkb_id *id, char *question)
{
    if (l->n == l->cap) {
        pq old;
        free(list_take(l, 0, &old));
    }
    l->items[l->n++] = (pq){*id, question, 0};
}

/* Whether question of kb_id is known already: waiting, prefilled or decoded. */
static bool known(const predict *p, int64_t kb_id, const char *q)
{
    return list_find(&p->queue, kb_id, q) >= 0 || list_find(&p->prefilled, kb_id, q) >= 0 ||
           list_find(&p->decoded, kb_id, q) >= 0;
}

void predict_note_query(predict *p, const kb_ref *kb, const char *question)
{
    if (!predict_enabled(p) || strlen(question) >= PRED_Q_MAX ||
        list_find(&p->hist, kb->id, question) >= 0)
        return;
    char *q = strdup(question);
    if (!q)
        return;
    pkb_id id;
    id_of(&id, kb);
    list_push(&p->hist, &id, q);
}

void predict_note_stale(predict *p, const kb_ref *kb, const char *question)
{
    if (!predict_enabled(p) || strlen(question) >= PRED_Q_MAX ||
        list_find(&p->queue, kb->id, question) >= 0)
        return;
    /* a predicted question whose entry went stale: out of the converted lists, whose
     * entries the change invalidated too */
    qlist *lists[2] = {&p->prefilled, &p->decoded};
    for (int l = 0; l < 2; l++) {
        int at = list_find(lists[l], kb->id, question);
        if (at >= 0) {
            pq gone;
            free(list_take(lists[l], at, &gone));
        }
    }
    char *q = strdup(question);
    if (!q)
        return;
    pkb_id id;
    id_of(&id, kb);
    list_push(&p->queue, &id, q);
}

/* Whether a and b are one knowledge base: the same row id, app and name, as SQLite hands
 * the row id of a dropped knowledge base out again (to any app's next one). */
static bool same_kb(const pkb_id *a, const pkb_id *b)
{
    return a->kb_id == b->kb_id && a->uid == b->uid && !strcmp(a->app, b->app) &&
           !strcmp(a->kb, b->kb);
}

static pkb *kb_state(predict *p, const kb_ref *kb)
{
    pkb_id id;
    id_of(&id, kb);
    int at = p->n_kbs;
    for (int i = 0; i < p->n_kbs; i++)
        if (p->kbs[i].id.kb_id == kb->id) {
            if (same_kb(&p->kbs[i].id, &id))
                return &p->kbs[i];
            /* a dropped knowledge base's state: none of it is the new one's */
            at = i;
            break;
        }
    if (at < p->n_kbs) {
        free(p->kbs[at].abstract);
        free(p->kbs[at].warm_ids);
    } else if (at == PRED_KBS) {
        at = 0;
        for (int i = 1; i < PRED_KBS; i++)
            if (p->kbs[i].changed < p->kbs[at].changed)
                at = i;
        free(p->kbs[at].abstract);
        free(p->kbs[at].warm_ids);
    } else {
        p->n_kbs++;
    }
    pkb *k = &p->kbs[at];
    memset(k, 0, sizeof *k);
    k->id = id;
    return k;
}

static void ids_push(int64_t *ids, int *n, int64_t id)
{
    if (*n == PRED_IDS) {
        memmove(ids, ids + 1, sizeof *ids * (PRED_IDS - 1));
        (*n)--;
    }
    ids[(*n)++] = id;
}

/* Queues passage id for a warm-up; the oldest waiting one goes when PRED_WARM_MAX wait
 * (newer passages are the likelier to be asked about). Out of memory skips it. */
static void warm_push(pkb *k, int64_t id)
{
    if (k->n_warm == k->cap_warm) {
        if (k->cap_warm == PRED_WARM_MAX) {
            memmove(k->warm_ids, k->warm_ids + 1, sizeof *k->warm_ids * (PRED_WARM_MAX - 1));
            k->n_warm--;
        } else {
            int cap = k->cap_warm ? 2 * k->cap_warm : 64;
            int64_t *ids = realloc(k->warm_ids, sizeof *ids * (size_t)cap);
            if (!ids)
                return;
            k->warm_ids = ids;
            k->cap_warm = cap;
        }
    }
    k->warm_ids[k->n_warm++] = id;
}

void predict_note_change(predict *p, const kb_ref *kb, int64_t first_new)
{
    if (!predict_enabled(p) || first_new < 0)
        return;
    pkb *k = kb_state(p, kb);
    k->changed = ++p->changes;
    char err[ERR_MAX];
    /* a KbAdd's passages have consecutive ids from first_new */
    for (int64_t id = first_new; id < first_new + PRED_PROBE_MAX; id++) {
        bool found;
        if (store_kb_passage(p->st, kb->id, id, NULL, NULL, &found, err) || !found)
            break;
        ids_push(k->abs_ids, &k->n_abs, id);
        if (p->cfg->predict_warm > 0)
            warm_push(k, id);
        if (++k->n_new % p->cfg->predict_stride == 0 || k->n_new == 1)
            ids_push(k->ask_ids, &k->n_ask, id);
    }
    /* new documents are new work: a fresh budget */
    p->used = p->warmed = 0;
}

void predict_idle_end(predict *p)
{
    p->used = p->warmed = 0;
}

static bool wants_abstract(const predict *p, const pkb *k)
{
    return k->n_abs >= p->cfg->predict_stride || (!k->abstract && k->n_abs > 0);
}

/* What predict_next would give: 1 queue, 2 decode a prefilled one, 3 prefill a decoded
 * one, 4 history, 7 warm up a passage of kbs[*kb], 5 an abstract of kbs[*kb], 6 a
 * question of kbs[*kb]; 0 nothing. Questions from real queries come first; warm-ups,
 * one short prefill each and counted against predict_warm, before the generations that
 * propose new questions. */
static int pick(const predict *p, float tau, bool qkv_room, int *kb)
{
    if (!predict_enabled(p))
        return 0;
    bool budget = p->used < p->cfg->predict_budget;
    bool qa_mode = tau < p->cfg->tau_scheduler;
    if (budget && p->queue.n)
        return 1;
    if (budget && qa_mode && p->prefilled.n)
        return 2;
    if (budget && !qa_mode && qkv_room && p->decoded.n)
        return 3;
    if (budget && p->hist.n)
        return 4;
    if (qkv_room && p->warmed < p->cfg->predict_warm)
        for (int i = 0; i < p->n_kbs; i++)
            if (p->kbs[i].n_warm) {
                *kb = i;
                return 7;
            }
    if (!budget)
        return 0;
    for (int i = 0; i < p->n_kbs; i++)
        if (wants_abstract(p, &p->kbs[i])) {
            *kb = i;
            return 5;
        }
    for (int i = 0; i < p->n_kbs; i++)
        if (p->kbs[i].abstract && p->kbs[i].n_ask) {
            *kb = i;
            return 6;
        }
    return 0;
}

bool predict_has_work(const predict *p, float tau, bool qkv_room)
{
    int kb;
    return pick(p, tau, qkv_room, &kb) != 0;
}

typedef struct text_buf {
    char *s;
    size_t len, cap;
    bool oom;
} text_buf;

static void buf_add(text_buf *b, const char *s, size_t n)
{
    if (!b->oom && textbuf_append(&b->s, &b->len, &b->cap, s, n))
        b->oom = true;
}

static void buf_str(text_buf *b, const char *s, size_t max)
{
    size_t n = strlen(s);
    buf_add(b, s, n < max ? n : max);
}

static int add_passage(void *arg, const store_passage *sp)
{
    text_buf *b = arg;
    buf_str(b, "- ", 2);
    buf_str(b, sp->text, PRED_PASSAGE_CHARS);
    buf_str(b, "\n", 1);
    return 0;
}

/* Appends passage id's text to b; false when it is gone. */
static bool passage_text(predict *p, int64_t kb_id, int64_t id, text_buf *b)
{
    char err[ERR_MAX];
    bool found;
    return store_kb_passage(p->st, kb_id, id, add_passage, b, &found, err) == 0 && found;
}

/* The prompt of an abstract update from k's newest passages, or NULL (none left). */
static char *abstract_prompt(predict *p, pkb *k)
{
    text_buf b = {0};
    buf_str(&b, "Here are documents of a collection.\n", SIZE_MAX);
    if (k->abstract) {
        buf_str(&b, "Summary so far: ", SIZE_MAX);
        buf_str(&b, k->abstract, PRED_ABSTRACT_CHARS);
        buf_str(&b, "\n", 1);
    }
    buf_str(&b, "New passages:\n", SIZE_MAX);
    int used = 0;
    for (int i = k->n_abs - 1; i >= 0 && used < PRED_ABSTRACT_PASSAGES; i--)
        used += passage_text(p, k->id.kb_id, k->abs_ids[i], &b);
    buf_str(&b, "Write a short summary of what the whole collection is about.", SIZE_MAX);
    k->n_abs = 0;
    if (b.oom || used == 0) {
        free(b.s);
        return NULL;
    }
    return b.s;
}

/* The prompt proposing a question about k's next passage to ask about, or NULL. */
static char *question_prompt(predict *p, pkb *k)
{
    while (k->n_ask) {
        int64_t id = k->ask_ids[0];
        memmove(k->ask_ids, k->ask_ids + 1, sizeof *k->ask_ids * (size_t)(--k->n_ask));
        text_buf b = {0};
        buf_str(&b, "Summary of the documents: ", SIZE_MAX);
        buf_str(&b, k->abstract, PRED_ABSTRACT_CHARS);
        buf_str(&b, "\nPassage:\n", SIZE_MAX);
        bool found = passage_text(p, k->id.kb_id, id, &b);
        buf_str(&b, "Write one question a user could ask about this passage.", SIZE_MAX);
        if (found && !b.oom)
            return b.s;
        free(b.s);
    }
    return NULL;
}

static char *history_prompt(const pq *h)
{
    const char *ask = h->stage == 0 ? "Rewrite this question in other words: "
                                    : "Write a follow-up question to this question: ";
    size_t n = strlen(ask) + strlen(h->question) + 1;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s%s", ask, h->question);
    return s;
}

bool predict_next(predict *p, float tau, bool qkv_room, predict_task *t)
{
    memset(t, 0, sizeof *t);
    int kb = 0, what;
    while ((what = pick(p, tau, qkv_room, &kb)) != 0) {
        pq item;
        const pkb_id *id = NULL;
        t->kind = PREDICT_GENERATE;
        t->max_tokens = p->cfg->predict_max_tokens;
        switch (what) {
        case 1:
        case 2:
        case 3: {
            qlist *l = what == 1 ? &p->queue : what == 2 ? &p->prefilled : &p->decoded;
            t->text = list_take(l, 0, &item);
            id = &item.id;
            t->kind = PREDICT_QUERY;
            t->purpose = what == 1 ? P_ASK : P_CONVERT;
            t->decode = what == 1 ? tau < p->cfg->tau_scheduler : what == 2;
            break;
        }
        case 4:
            item = p->hist.items[0];
            id = &item.id;
            t->purpose = item.stage == 0 ? P_PARAPHRASE : P_FOLLOWUP;
            t->text = history_prompt(&item);
            if (item.stage == 0) {
                p->hist.items[0].stage = 1;
            } else {
                list_take(&p->hist, 0, &item);
                free(item.question);
            }
            break;
        case 7: {
            pkb *k = &p->kbs[kb];
            id = &k->id;
            t->kind = PREDICT_WARM;
            t->passage = k->warm_ids[--k->n_warm];
            t->text = strdup("");
            break;
        }
        case 5:
            id = &p->kbs[kb].id;
            t->purpose = P_ABSTRACT;
            t->text = abstract_prompt(p, &p->kbs[kb]);
            break;
        default:
            id = &p->kbs[kb].id;
            t->purpose = P_QUESTION;
            t->text = question_prompt(p, &p->kbs[kb]);
            break;
        }
        if (!t->text)
            continue; /* out of memory or its passages are gone: the next one */
        t->uid = id->uid;
        t->kb_id = id->kb_id;
        snprintf(t->app, sizeof t->app, "%s", id->app);
        snprintf(t->kb, sizeof t->kb, "%s", id->kb);
        if (t->kind == PREDICT_WARM)
            p->warmed++;
        else
            p->used++;
        return true;
    }
    return false;
}

/* The first line of a generation's output, trimmed, as a fresh string (NULL: none). */
static char *first_line(const char *out, size_t max)
{
    while (*out == ' ' || *out == '\n' || *out == '\t' || *out == '\r')
        out++;
    size_t n = strcspn(out, "\n\r");
    while (n && (out[n - 1] == ' ' || out[n - 1] == '\t'))
        n--;
    if (n < 3)
        return NULL;
    n = n < max ? n : max;
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, out, n);
        s[n] = '\0';
    }
    return s;
}

void predict_done(predict *p, const predict_task *t, enum predict_end how, const char *output)
{
    pkb_id id = {t->kb_id, t->uid, "", ""};
    snprintf(id.app, sizeof id.app, "%s", t->app);
    snprintf(id.kb, sizeof id.kb, "%s", t->kb);
    if (t->kind == PREDICT_WARM) {
        p->stats.warmed += how == PREDICT_RAN;
        return;
    }
    if (t->kind == PREDICT_QUERY) {
        if (how == PREDICT_DROPPED)
            return;
        if (how == PREDICT_RAN) {
            p->stats.predicted++;
            p->stats.converted += t->purpose == P_CONVERT;
            if (t->decode)
                p->stats.decoded++;
            else
                p->stats.prefilled++;
        }
        char *q = strdup(t->text);
        if (q && !known(p, t->kb_id, q))
            list_push(t->decode ? &p->decoded : &p->prefilled, &id, q);
        else
            free(q);
        return;
    }
    if (how != PREDICT_RAN || !output)
        return;
    p->stats.generations++;
    if (t->purpose == P_ABSTRACT) {
        char *a = first_line(output, PRED_ABSTRACT_CHARS);
        for (int i = 0; a && i < p->n_kbs; i++)
            if (same_kb(&p->kbs[i].id, &id)) {
                free(p->kbs[i].abstract);
                p->kbs[i].abstract = a;
                return;
            }
        free(a);
        return;
    }
    char *q = first_line(output, PRED_Q_MAX - 1);
    if (q && !known(p, t->kb_id, q))
        list_push(&p->queue, &id, q);
    else
        free(q);
}

void predict_task_clear(predict_task *t)
{
    free(t->text);
    t->text = NULL;
}

void predict_count_step(predict *p, double ms)
{
    p->stats.steps++;
    p->stats.ms += ms;
}

void predict_count_ms(predict *p, double ms)
{
    p->stats.ms += ms;
}

void predict_count_preempted(predict *p)
{
    p->stats.preempted++;
}

void predict_count_resumed(predict *p)
{
    p->stats.resumed++;
}

void predict_count_hits(predict *p, bool qa, bool qkv)
{
    p->stats.qa_hits += qa;
    p->stats.qkv_hits += qkv;
}

void predict_get_stats(const predict *p, predict_stats *out)
{
    *out = p->stats;
    out->queued = (unsigned)p->queue.n;
}
