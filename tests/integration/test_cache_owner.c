/*
 * Every RAG cache belongs to its owner (issue 35), against a real llmsd on
 * stories260K (whose vocabulary tells texts apart). Other uids are forked children that
 * drop root (setresuid), so the test needs root, as CI runs it; without root those
 * parts are skipped with a message.
 *
 * - The reproduction: app alice asks over her knowledge base; another uid adds the same
 *   text to his own and asks: a miss, with no count of alice's tokens, and none of her
 *   caches in his statistics, nor his to clear.
 * - Two apps of one uid share QKV nodes only when both knowledge bases are shared, or,
 *   for the system prompt's node alone, when both queries mark it shared.
 * - A forged node (another prefix's row under a query's key) is never used: the query
 *   is a miss answered as a cache-less query is, and status counts it.
 * - One owner's flood is held to cache_owner_max_entries and leaves another's nodes.
 */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "client/llms.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/support/test.h"

#define UID_MALLORY 61011 /* no account needed: root may take any uid */
#define UID_FLOOD 61012
#define OWNER_MAX_ENTRIES 6

static char llmsd_path[1024];
static const char *model;
static llmsd_proc daemon_;
static int up;

static int start(void)
{
    chmod(test_tmpdir(), 0755);
    int rc = proc_start(&daemon_, llmsd_path, "cache-owner", model,
                        "temperature = 0\nmax_tokens = 6\nrag_top_k = 1\nqkv_cache_mb = 64\n"
                        "kb_passage_tokens = 24\nkb_overlap_tokens = 4\nsocket_mode = 0666\n"
                        "cache_owner_max_entries = 6\n");
    chmod(daemon_.dir, 0755);
    return rc;
}

#define NEED()                                                                        \
    do {                                                                              \
        if (!llmsd_path[0] || !model)                                                 \
            SKIP("llmsd or ../shared/testdata/models/stories260K.gguf is missing");    \
        if (!up)                                                                      \
            up = start() == 0 ? 1 : -1;                                               \
        CHECK_MSG(up == 1, "llmsd did not start");                                    \
    } while (0)

#define NEED_ROOT()                                                                   \
    do {                                                                              \
        if (geteuid() != 0)                                                           \
            SKIP("needs root to act as a second uid");                                \
    } while (0)

static const char *const texts[] = {
    "Alice keeps bees behind the old mill and sells honey on Sundays.",
    "The lighthouse keeper painted the door blue before the storm came.",
    "A small fox found a red ball in the garden and played all day.",
};
#define N_TEXTS 3

static enum llms_status add_texts(llms_conn *c, const char *kb)
{
    llms_kb_doc docs[N_TEXTS];
    char ids[N_TEXTS][16];
    for (int i = 0; i < N_TEXTS; i++) {
        snprintf(ids[i], sizeof ids[i], "d%d", i);
        docs[i] = (llms_kb_doc){ids[i], texts[i], NULL};
    }
    return llms_kb_add(c, kb, docs, N_TEXTS, NULL);
}

/* What a query as another uid saw, sent back through a pipe. */
typedef struct seen {
    int failures;
    char msg[256];
    int outcome;
    uint32_t reused_tokens, reused_passages;
    uint64_t own_qkv_nodes, rag_queries;
    char text[256];
} seen;

static void fail_note(seen *s, const char *what, llms_conn *c, enum llms_status st)
{
    s->failures++;
    if (!s->msg[0])
        snprintf(s->msg, sizeof s->msg, "%s: %s (%s)", what, c ? llms_last_error(c) : "",
                 llms_status_name(st));
}

typedef void (*as_fn)(const char *app, seen *out);

/* Runs fn(app) in a child that has become uid; false when it could not (out->msg). */
static bool as_uid(uid_t uid, const char *app, as_fn fn, seen *out)
{
    int fds[2];
    memset(out, 0, sizeof *out);
    if (pipe(fds))
        return false;
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        seen s = {0};
        if (setgroups(0, NULL) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid))
            snprintf(s.msg, sizeof s.msg, "could not become uid %u: %s", (unsigned)uid,
                     strerror(errno)), s.failures = 1;
        else
            fn(app, &s);
        ssize_t w = write(fds[1], &s, sizeof s);
        _exit(w == (ssize_t)sizeof s ? 0 : 1);
    }
    close(fds[1]);
    bool ok = pid > 0 && read(fds[0], out, sizeof *out) == (ssize_t)sizeof *out;
    close(fds[0]);
    if (pid > 0)
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
    return ok;
}

static const char *const QUESTION = "Who sells honey on Sundays?";

/* Asks QUESTION over kb with o into s: the outcome, reuse counts and answer. */
static void ask_into(llms_conn *c, const char *kb, const llms_rag_options *o, seen *s)
{
    llms_rag_result r;
    enum llms_status st = llms_rag_query(c, kb, QUESTION, o, NULL, NULL, &r);
    if (st != LLMS_OK) {
        fail_note(s, "rag", c, st);
        return;
    }
    s->outcome = r.outcome;
    s->reused_tokens = r.reused_tokens;
    s->reused_passages = r.reused_passages;
    snprintf(s->text, sizeof s->text, "%s", r.text);
    llms_rag_result_free(&r);
}

/* Makes kb (shared or not) with the texts and asks QUESTION over it, QA bank off. */
static void ask_over(const char *app, const char *kb, int share, seen *s)
{
    memset(s, 0, sizeof *s);
    llms_conn *c = proc_connect(&daemon_, app);
    if (!c) {
        fail_note(s, "connect", NULL, LLMS_ERR_INTERNAL);
        return;
    }
    enum llms_status st = llms_kb_create_shared(c, kb, 0, 0, share);
    if (st != LLMS_OK && st != LLMS_ERR_FAILED_PRECONDITION)
        fail_note(s, "kb create", c, st);
    if ((st = add_texts(c, kb)) != LLMS_OK)
        fail_note(s, "kb add", c, st);
    llms_rag_options o = {.no_qa = 1};
    ask_into(c, kb, &o, s);
    llms_cache_stats cs;
    if ((st = llms_cache_stats_get(c, &cs)) != LLMS_OK)
        fail_note(s, "cache stats", c, st);
    s->own_qkv_nodes = cs.qkv_nodes;
    s->rag_queries = cs.rag_queries;
    llms_close(c);
}

static void mallory(const char *app, seen *s)
{
    ask_over(app, "kb", 0, s);
    llms_conn *c = proc_connect(&daemon_, app);
    if (!c) {
        fail_note(s, "connect", NULL, LLMS_ERR_INTERNAL);
        return;
    }
    /* nobody else's caches: not all of them, not alice's, not to read nor to clear */
    llms_cache_stats cs;
    llms_cache_owner all = {.all = 1}, alice = {.uid = 0, .app = "alice"};
    enum llms_status st;
    if ((st = llms_cache_stats_of(c, &all, &cs)) != LLMS_ERR_PERMISSION_DENIED)
        fail_note(s, "cache stats of all", c, st);
    if ((st = llms_cache_stats_of(c, &alice, &cs)) != LLMS_ERR_PERMISSION_DENIED)
        fail_note(s, "cache stats of alice", c, st);
    if ((st = llms_cache_clear_of(c, &all)) != LLMS_ERR_PERMISSION_DENIED)
        fail_note(s, "cache clear of all", c, st);
    if ((st = llms_cache_clear(c)) != LLMS_OK)
        fail_note(s, "cache clear of his own", c, st);
    if ((st = llms_cache_stats_get(c, &cs)) != LLMS_OK || cs.qkv_nodes || cs.qa_entries)
        fail_note(s, "his own caches after his clear", c, st);
    llms_close(c);
}

static uint32_t nodes_of(llms_conn *admin, uint32_t uid, const char *app)
{
    llms_cache_owner o = {.uid = uid, .app = app};
    llms_cache_stats cs;
    return llms_cache_stats_of(admin, &o, &cs) == LLMS_OK ? cs.qkv_nodes : UINT32_MAX;
}

static void ask_shared(const char *app, seen *s)
{
    ask_over(app, "skb", 1, s);
}

/* As another uid (root only; else nothing is checked), fn(app) is a miss reusing nothing. */
static void other_uid_reuses_nothing(const char *app, as_fn fn)
{
    if (geteuid() != 0)
        return;
    seen m;
    CHECK_MSG(as_uid(UID_MALLORY, app, fn, &m), "%s", m.msg);
    CHECK_MSG(m.failures == 0, "%s", m.msg);
    CHECK_EQ(m.outcome, LLMS_RAG_MISS);
    CHECK_EQ(m.reused_tokens, 0);
}

static void other_uid_is_a_miss(void)
{
    NEED();
    NEED_ROOT();
    seen a;
    ask_over("alice", "kb", 0, &a);
    CHECK_MSG(a.failures == 0, "%s", a.msg);
    llms_conn *admin;
    CHECK(admin = proc_connect(&daemon_, "auditor"));
    uint32_t alice_nodes = nodes_of(admin, 0, "alice");
    CHECK(alice_nodes >= 2 && alice_nodes != UINT32_MAX);
    /* alice's own repeat reuses her prefix: the cache works */
    llms_conn *c = proc_connect(&daemon_, "alice");
    CHECK(c);
    llms_rag_options o = {.no_qa = 1};
    llms_rag_result r;
    CHECK_EQ(llms_rag_query(c, "kb", QUESTION, &o, NULL, NULL, &r), LLMS_OK);
    CHECK_EQ(r.outcome, LLMS_RAG_QKV_HIT);
    llms_rag_result_free(&r);

    seen m;
    CHECK_MSG(as_uid(UID_MALLORY, "mallory", mallory, &m), "%s", m.msg);
    CHECK_MSG(m.failures == 0, "%s", m.msg);
    CHECK_EQ(m.outcome, LLMS_RAG_MISS);
    CHECK_EQ(m.reused_tokens, 0);
    CHECK_EQ(m.reused_passages, 0);
    CHECK_MSG(!strcmp(m.text, a.text), "same text, same model: '%s' vs '%s'", m.text, a.text);
    /* his statistics count his own nodes only, and none of the daemon's counters */
    CHECK_EQ(m.own_qkv_nodes, alice_nodes);
    CHECK_EQ(m.rag_queries, 0);
    /* his clear left alice's nodes */
    CHECK_EQ(nodes_of(admin, 0, "alice"), alice_nodes);
    CHECK_EQ(nodes_of(admin, UID_MALLORY, "mallory"), 0);
    CHECK_EQ(llms_rag_query(c, "kb", QUESTION, &o, NULL, NULL, &r), LLMS_OK);
    CHECK_EQ(r.outcome, LLMS_RAG_QKV_HIT);
    llms_rag_result_free(&r);
    /* an unbound admin names the caches explicitly */
    llms_conn *raw;
    char err[LLMS_ERROR_MAX];
    CHECK_EQ(llms_connect(daemon_.sock, &raw, err), LLMS_OK);
    llms_cache_stats cs;
    CHECK_EQ(llms_cache_stats_get(raw, &cs), LLMS_ERR_INVALID_ARGUMENT);
    llms_cache_owner all = {.all = 1};
    CHECK_EQ(llms_cache_stats_of(raw, &all, &cs), LLMS_OK);
    CHECK(cs.qkv_nodes >= alice_nodes && cs.rag_queries >= 3);
    llms_close(raw);
    llms_close(c);
    llms_close(admin);
}

static void shared_within_a_uid_only(void)
{
    NEED();
    seen a, b;
    /* not shared: the second app of the uid misses */
    ask_over("app-one", "kb", 0, &a);
    ask_over("app-two", "kb", 0, &b);
    CHECK_MSG(a.failures == 0 && b.failures == 0, "%s%s", a.msg, b.msg);
    CHECK_EQ(b.outcome, LLMS_RAG_MISS);
    CHECK_EQ(b.reused_tokens, 0);
    /* both shared: it reuses the first's prefix, with the same answer */
    ask_over("app-one", "skb", 1, &a);
    ask_over("app-two", "skb", 1, &b);
    CHECK_MSG(a.failures == 0 && b.failures == 0, "%s%s", a.msg, b.msg);
    CHECK_EQ(b.outcome, LLMS_RAG_QKV_HIT);
    CHECK(b.reused_passages >= 1 && b.reused_tokens > 0);
    CHECK_MSG(!strcmp(a.text, b.text), "'%s' vs '%s'", a.text, b.text);
    /* a shared knowledge base of a third app, not shared itself, stays its own */
    ask_over("app-three", "skb", 0, &b);
    CHECK_EQ(b.outcome, LLMS_RAG_MISS);
    llms_conn *c = proc_connect(&daemon_, "app-two");
    CHECK(c);
    llms_kb_info *kbs;
    size_t n;
    CHECK_EQ(llms_kb_list(c, &kbs, &n), LLMS_OK);
    CHECK_EQ(n, 2);
    if (n == 2)
        CHECK(!kbs[0].share_uid && kbs[1].share_uid); /* by name: kb, skb */
    llms_kb_list_free(kbs, n);
    llms_close(c);
    /* sharing never crosses uids: another uid's shared knowledge base misses */
    other_uid_reuses_nothing("app-one", ask_shared);
}

/* A system prompt of several chunks, so that its node holds KV of its own. */
static const char *const LONG_SYSTEM =
    "You answer questions about a small town by the sea. Keep every answer short, kind and "
    "true to the passages you are given, and say so when they do not tell.";

/* Asks QUESTION over the app's own (unshared) kb with LONG_SYSTEM, sharing the system
 * prompt's node with the uid's apps when share_system. */
static void ask_system(const char *app, int share_system, seen *s)
{
    memset(s, 0, sizeof *s);
    llms_conn *c = proc_connect(&daemon_, app);
    if (!c) {
        fail_note(s, "connect", NULL, LLMS_ERR_INTERNAL);
        return;
    }
    enum llms_status st = llms_kb_create(c, "sys-kb", 0, 0);
    if (st != LLMS_OK && st != LLMS_ERR_FAILED_PRECONDITION)
        fail_note(s, "kb create", c, st);
    if ((st = add_texts(c, "sys-kb")) != LLMS_OK)
        fail_note(s, "kb add", c, st);
    llms_rag_options o = {.no_qa = 1, .system_prompt = LONG_SYSTEM,
                          .share_system_uid = share_system};
    ask_into(c, "sys-kb", &o, s);
    llms_close(c);
}

static void ask_system_shared(const char *app, seen *s)
{
    ask_system(app, 1, s);
}

/* A system prompt marked shared (share_system_uid) is reused by the uid's other apps that
 * mark it too, over their own knowledge bases (whose passages stay theirs); an app that
 * does not mark it, and another uid, miss. */
static void shared_system_prompt_within_a_uid(void)
{
    NEED();
    seen a, b, c;
    ask_system("sys-one", 1, &a);
    ask_system("sys-two", 1, &b);
    ask_system("sys-three", 0, &c);
    CHECK_MSG(a.failures == 0 && b.failures == 0 && c.failures == 0, "%s%s%s", a.msg, b.msg,
              c.msg);
    /* the outcome counts passages: a system prompt's node alone is still a miss, and
     * its tokens are the reused ones */
    CHECK_EQ(a.reused_tokens, 0);
    CHECK_EQ(b.outcome, LLMS_RAG_MISS);
    CHECK_EQ(b.reused_passages, 0);
    CHECK_MSG(b.reused_tokens >= 16, "%u tokens reused", b.reused_tokens);
    CHECK_MSG(!strcmp(a.text, b.text), "'%s' vs '%s'", a.text, b.text);
    CHECK_EQ(c.outcome, LLMS_RAG_MISS);
    CHECK_EQ(c.reused_tokens, 0);
    other_uid_reuses_nothing("sys-two", ask_system_shared);
}

/* ---- a forged node ---- */

static sqlite3 *open_db(void)
{
    char path[700];
    proc_fmt(path, sizeof path, "%s/state/llmsd.db", daemon_.dir);
    sqlite3 *db;
    if (sqlite3_open(path, &db) != SQLITE_OK)
        return NULL;
    sqlite3_busy_timeout(db, 5000);
    return db;
}

/* The root nodes of app forger: up to 8 rowids and raw sizes. */
static int roots(sqlite3 *db, int64_t *rowid, int64_t *raw, int cap)
{
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db, "SELECT rowid, raw_bytes FROM qkv_nodes WHERE parent IS NULL"
                               " AND scope = 'forger' ORDER BY rowid", -1, &st, NULL))
        return -1;
    int n = 0;
    while (sqlite3_step(st) == SQLITE_ROW && n < cap) {
        rowid[n] = sqlite3_column_int64(st, 0);
        raw[n++] = sqlite3_column_int64(st, 1);
    }
    sqlite3_finalize(st);
    return n;
}

/* A query, then a Cache request: the worker stores a query's nodes after its reply and
 * before it takes the next request, so they are in the catalog when this returns. */
static enum llms_status ask_with(llms_conn *c, const char *system, int no_qkv,
                                 llms_rag_result *r)
{
    llms_rag_options o = {.no_qa = 1, .no_qkv = no_qkv, .system_prompt = system};
    llms_cache_stats cs;
    enum llms_status st = llms_rag_query(c, "kb", QUESTION, &o, NULL, NULL, r);
    return st == LLMS_OK ? llms_cache_stats_get(c, &cs) : st;
}

static void forged_node_is_never_used(void)
{
    NEED();
    static const char *const S1 = "Use the passages.";
    static const char *const others[] = {"See the passages.", "Read the passages.",
                                         "Mind the passages.", "Note the passages."};
    llms_conn *c = proc_connect(&daemon_, "forger");
    CHECK(c);
    CHECK_EQ(llms_kb_create(c, "kb", 0, 0), LLMS_OK);
    CHECK_EQ(add_texts(c, "kb"), LLMS_OK);
    llms_rag_result fresh, r;
    CHECK_EQ(ask_with(c, S1, 1, &fresh), LLMS_OK);
    CHECK_EQ(ask_with(c, S1, 0, &r), LLMS_OK);
    llms_rag_result_free(&r);
    sqlite3 *db = open_db();
    CHECK(db);
    int64_t rowid[8], raw[8];
    CHECK_EQ(roots(db, rowid, raw, 8), 1);
    /* another system prompt whose root node holds as many bytes: its KV is what a forger
     * puts under S1's key */
    int64_t donor = -1;
    for (size_t i = 0; i < sizeof others / sizeof others[0] && donor < 0; i++) {
        CHECK_EQ(ask_with(c, others[i], 0, &r), LLMS_OK);
        llms_rag_result_free(&r);
        int64_t rid[8], rw[8];
        int n = roots(db, rid, rw, 8);
        for (int k = 0; k < n; k++)
            if (rid[k] != rowid[0] && rw[k] == raw[0])
                donor = rid[k];
    }
    sqlite3_close(db);
    llms_close(c);
    CHECK_MSG(donor >= 0, "no other system prompt made a root node of %lld bytes",
              (long long)raw[0]);
    CHECK_EQ(proc_stop(&daemon_, SIGTERM), 0);
    up = 0;
    CHECK(db = open_db());
    char sql[400];
    snprintf(sql, sizeof sql,
             "UPDATE qkv_nodes SET (tokens, n_tokens, raw_bytes, crc, blob) = (SELECT tokens,"
             " n_tokens, raw_bytes, crc, blob FROM qkv_nodes WHERE rowid = %lld)"
             " WHERE rowid = %lld", (long long)donor, (long long)rowid[0]);
    CHECK_EQ(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    CHECK_EQ(sqlite3_changes(db), 1);
    sqlite3_close(db);
    NEED();
    CHECK(c = proc_connect(&daemon_, "forger"));
    CHECK_EQ(ask_with(c, S1, 0, &r), LLMS_OK);
    CHECK_EQ(r.outcome, LLMS_RAG_MISS);
    CHECK_EQ(r.reused_tokens, 0);
    CHECK_MSG(!strcmp(r.text, fresh.text), "forged '%s' vs cache-less '%s'", r.text, fresh.text);
    llms_rag_result_free(&r);
    llms_rag_result_free(&fresh);
    llms_daemon_status st;
    CHECK_EQ(proc_status(c, &st), 0);
    CHECK(st.qkv_verify_misses >= 1);
    llms_daemon_status_free(&st);
    llms_close(c);
}

/* ---- one owner's flood ---- */

static void flood(const char *app, seen *s)
{
    static const char *const who[] = {"cat", "dog", "bird", "frog"};
    static const char *const where[] = {"river", "hill", "barn", "forest"};
    memset(s, 0, sizeof *s);
    llms_conn *c = proc_connect(&daemon_, app);
    if (!c) {
        fail_note(s, "connect", NULL, LLMS_ERR_INTERNAL);
        return;
    }
    enum llms_status st = llms_kb_create(c, "kb", 0, 0);
    if (st != LLMS_OK)
        fail_note(s, "kb create", c, st);
    char text[16][96], id[16][16];
    llms_kb_doc docs[16];
    for (int i = 0; i < 16; i++) {
        snprintf(id[i], sizeof id[i], "f%d", i);
        snprintf(text[i], sizeof text[i], "The %s ran to the %s and sat there.", who[i % 4],
                 where[i / 4]);
        docs[i] = (llms_kb_doc){id[i], text[i], NULL};
    }
    if ((st = llms_kb_add(c, "kb", docs, 16, NULL)) != LLMS_OK)
        fail_note(s, "kb add", c, st);
    llms_rag_options o = {.no_qa = 1};
    for (int i = 0; i < 16; i++)
        if ((st = llms_rag_query(c, "kb", text[i], &o, NULL, NULL, NULL)) != LLMS_OK)
            fail_note(s, "rag", c, st);
    llms_cache_stats cs;
    if ((st = llms_cache_stats_get(c, &cs)) != LLMS_OK)
        fail_note(s, "cache stats", c, st);
    s->own_qkv_nodes = cs.qkv_nodes;
    llms_close(c);
}

static void flood_keeps_to_its_quota(void)
{
    NEED();
    seen a;
    ask_over("steady", "kb", 0, &a);
    CHECK_MSG(a.failures == 0, "%s", a.msg);
    llms_conn *admin = proc_connect(&daemon_, "auditor");
    CHECK(admin);
    uint32_t before = nodes_of(admin, 0, "steady");
    CHECK(before >= 2 && before != UINT32_MAX);
    seen f;
    uint32_t flood_uid = geteuid() == 0 ? UID_FLOOD : 0;
    if (flood_uid)
        CHECK_MSG(as_uid(flood_uid, "flood", flood, &f), "%s", f.msg);
    else
        flood("flood", &f);
    CHECK_MSG(f.failures == 0, "%s", f.msg);
    CHECK_MSG(f.own_qkv_nodes <= OWNER_MAX_ENTRIES && f.own_qkv_nodes >= 2,
              "the flood keeps %llu nodes", (unsigned long long)f.own_qkv_nodes);
    CHECK_EQ(nodes_of(admin, flood_uid, "flood"), f.own_qkv_nodes);
    CHECK_EQ(nodes_of(admin, 0, "steady"), before);
    llms_cache_stats cs;
    llms_cache_owner all = {.all = 1};
    CHECK_EQ(llms_cache_stats_of(admin, &all, &cs), LLMS_OK);
    CHECK(cs.qkv_evictions > 0);
    seen again;
    ask_over("steady", "kb", 0, &again);
    CHECK_EQ(again.outcome, LLMS_RAG_QKV_HIT);
    llms_close(admin);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    model = test_data_path("models/stories260K.gguf");
    RUN(other_uid_is_a_miss);
    RUN(shared_within_a_uid_only);
    RUN(shared_system_prompt_within_a_uid);
    RUN(forged_node_is_never_used);
    RUN(flood_keeps_to_its_quota);
    if (up == 1)
        proc_stop(&daemon_, SIGTERM);
    return test_finish();
}
