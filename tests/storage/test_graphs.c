/* Tests of the workflow graph catalog: put, get, list, count, delete, apps kept apart,
 * and definitions surviving a reopen. */
#include <stdio.h>
#include <string.h>

#include "storage/graphs.h"
#include "storage/store.h"
#include "tests/support/test.h"

typedef struct seen {
    int n;
    char names[8][32];
    char defs[8][32];
} seen;

static int see(void *arg, const char *name, const void *def, size_t len)
{
    seen *s = arg;
    if (s->n < 8) {
        snprintf(s->names[s->n], sizeof s->names[s->n], "%s", name);
        snprintf(s->defs[s->n], sizeof s->defs[s->n], "%.*s", (int)len, (const char *)def);
    }
    s->n++;
    return 0;
}

static int stop_at_first(void *arg, const char *name, const void *def, size_t len)
{
    (void)name, (void)def, (void)len;
    (*(int *)arg)++;
    return 9;
}

static void test_graph_catalog(void)
{
    char err[ERR_MAX], dir[512];
    snprintf(dir, sizeof dir, "%s/graphs/state", test_tmpdir());
    store *st = store_open(dir, err);
    CHECK_MSG(st, "%s", err);
    int64_t a, b;
    CHECK_EQ(store_app_id(st, 1000, "a", &a, err), 0);
    CHECK_EQ(store_app_id(st, 1000, "b", &b, err), 0);
    bool exists, found;
    CHECK_EQ(store_graph_put(st, a, "g2", "two", 3, 1, &exists, err), 0);
    CHECK(!exists);
    CHECK_EQ(store_graph_put(st, a, "g1", "one", 3, 2, &exists, err), 0);
    CHECK_EQ(store_graph_put(st, a, "g1", "other", 5, 3, &exists, err), 0);
    CHECK(exists); /* and nothing replaced */
    CHECK_EQ(store_graph_put(st, b, "g1", "bee", 3, 4, &exists, err), 0);
    CHECK(!exists);
    int n;
    CHECK_EQ(store_graph_count(st, a, &n, err), 0);
    CHECK_EQ(n, 2);
    seen s = {0};
    CHECK_EQ(store_graph_list(st, a, see, &s, err), 0);
    CHECK_EQ(s.n, 2);
    CHECK(!strcmp(s.names[0], "g1") && !strcmp(s.defs[0], "one"));
    CHECK(!strcmp(s.names[1], "g2") && !strcmp(s.defs[1], "two"));
    int calls = 0;
    CHECK_EQ(store_graph_list(st, a, stop_at_first, &calls, err), 9);
    CHECK_EQ(calls, 1);
    store_close(st);
    /* reopened: still there, each app its own */
    st = store_open(dir, err);
    CHECK_MSG(st, "%s", err);
    memset(&s, 0, sizeof s);
    CHECK_EQ(store_graph_get(st, b, "g1", see, &s, &found, err), 0);
    CHECK(found);
    CHECK(!strcmp(s.defs[0], "bee"));
    CHECK_EQ(store_graph_get(st, b, "g2", see, &s, &found, err), 0);
    CHECK(!found);
    CHECK_EQ(store_graph_delete(st, b, "g2", &found, err), 0);
    CHECK(!found);
    CHECK_EQ(store_graph_delete(st, a, "g2", &found, err), 0);
    CHECK(found);
    CHECK_EQ(store_graph_count(st, a, &n, err), 0);
    CHECK_EQ(n, 1);
    CHECK_EQ(store_graph_count(st, b, &n, err), 0);
    CHECK_EQ(n, 1);
    store_close(st);
}

int main(void)
{
    RUN(test_graph_catalog);
    return test_finish();
}
