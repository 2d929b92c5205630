/*
 * respstore.c — stored responses (respstore.h): a hash of ids over entries that are also
 * one list from the oldest to the newest, which eviction takes from the front.
 */
#include "daemon/net/respstore.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ID_PREFIX "resp_"
#define MIN_BUCKETS 64

typedef struct rs_entry {
    char id[RESPSTORE_ID_MAX + 1];
    uid_t uid;
    char *text;                /* owned: the response's JSON text, NUL, then the items'
                                  JSON text, NUL */
    size_t response_len, items_len;
    size_t bytes;              /* what it takes of the budget */
    struct rs_entry *older, *newer; /* the age list */
    struct rs_entry *next;     /* the next entry of its hash bucket */
} rs_entry;

struct respstore {
    size_t budget, bytes, count;
    rs_entry **buckets;        /* owned: n_buckets chains (a power of two) */
    size_t n_buckets;
    rs_entry *oldest, *newest;
};

/* FNV-1a of an id. */
static uint64_t id_hash(const char *id)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *id; id++)
        h = (h ^ (unsigned char)*id) * 0x100000001b3ull;
    return h;
}

static rs_entry **bucket_of(const respstore *s, const char *id)
{
    return &s->buckets[id_hash(id) & (s->n_buckets - 1)];
}

respstore *respstore_new(size_t budget)
{
    respstore *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->budget = budget;
    s->n_buckets = MIN_BUCKETS;
    if (!(s->buckets = calloc(s->n_buckets, sizeof *s->buckets))) {
        free(s);
        return NULL;
    }
    return s;
}

void respstore_free(respstore *s)
{
    if (!s)
        return;
    for (rs_entry *e = s->oldest, *next; e; e = next) {
        next = e->newer;
        free(e->text);
        free(e);
    }
    free(s->buckets);
    free(s);
}

bool respstore_on(const respstore *s)
{
    return s->budget > 0;
}

bool respstore_id_valid(const char *id, size_t n)
{
    size_t p = strlen(ID_PREFIX);
    if (n <= p || n > RESPSTORE_ID_MAX || strncmp(id, ID_PREFIX, p))
        return false;
    for (size_t i = p; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return false;
    }
    return true;
}

size_t respstore_bytes_of(size_t response_len, size_t items_len)
{
    return sizeof(rs_entry) + response_len + items_len + 2;
}

/* The entry of id, whoever's; NULL when none. */
static rs_entry *find(const respstore *s, const char *id)
{
    for (rs_entry *e = *bucket_of(s, id); e; e = e->next)
        if (!strcmp(e->id, id))
            return e;
    return NULL;
}

/* Takes e out of the hash and the age list and frees it. */
static void drop(respstore *s, rs_entry *e)
{
    rs_entry **p = bucket_of(s, e->id);
    while (*p != e)
        p = &(*p)->next;
    *p = e->next;
    if (e->older)
        e->older->newer = e->newer;
    else
        s->oldest = e->newer;
    if (e->newer)
        e->newer->older = e->older;
    else
        s->newest = e->older;
    s->bytes -= e->bytes;
    s->count--;
    free(e->text);
    free(e);
}

/* Twice the buckets once there are more entries than buckets; staying as it is when the
 * memory is not there only makes chains longer. */
static void grow(respstore *s)
{
    if (s->count < s->n_buckets)
        return;
    size_t n = s->n_buckets * 2;
    rs_entry **b = calloc(n, sizeof *b);
    if (!b)
        return;
    for (size_t i = 0; i < s->n_buckets; i++)
        for (rs_entry *e = s->buckets[i], *next; e; e = next) {
            next = e->next;
            rs_entry **to = &b[id_hash(e->id) & (n - 1)];
            e->next = *to;
            *to = e;
        }
    free(s->buckets);
    s->buckets = b;
    s->n_buckets = n;
}

int respstore_put(respstore *s, uid_t uid, const char *id, const char *response,
                  size_t response_len, const char *items, size_t items_len)
{
    size_t id_len = strlen(id);
    if (!respstore_id_valid(id, id_len))
        return -1;
    size_t bytes = respstore_bytes_of(response_len, items_len);
    if (!s->budget || bytes > s->budget / 2)
        return -1;
    rs_entry *e = calloc(1, sizeof *e);
    char *text = malloc(response_len + items_len + 2);
    if (!e || !text) {
        free(e);
        free(text);
        return -1;
    }
    rs_entry *old = find(s, id);
    if (old)
        drop(s, old);
    while (s->oldest && s->bytes + bytes > s->budget)
        drop(s, s->oldest);
    memcpy(text, response, response_len);
    text[response_len] = '\0';
    memcpy(text + response_len + 1, items, items_len);
    text[response_len + 1 + items_len] = '\0';
    memcpy(e->id, id, id_len + 1);
    e->uid = uid;
    e->text = text;
    e->response_len = response_len;
    e->items_len = items_len;
    e->bytes = bytes;
    rs_entry **b = bucket_of(s, id);
    e->next = *b;
    *b = e;
    e->older = s->newest;
    if (s->newest)
        s->newest->newer = e;
    else
        s->oldest = e;
    s->newest = e;
    s->bytes += bytes;
    s->count++;
    grow(s);
    return 0;
}

bool respstore_get(const respstore *s, uid_t uid, const char *id, respstore_entry *out)
{
    const rs_entry *e = find(s, id);
    if (!e || e->uid != uid)
        return false;
    out->response = e->text;
    out->response_len = e->response_len;
    out->items = e->text + e->response_len + 1;
    out->items_len = e->items_len;
    return true;
}

bool respstore_delete(respstore *s, uid_t uid, const char *id)
{
    rs_entry *e = find(s, id);
    if (!e || e->uid != uid)
        return false;
    drop(s, e);
    return true;
}

size_t respstore_count(const respstore *s)
{
    return s->count;
}

size_t respstore_bytes(const respstore *s)
{
    return s->bytes;
}
