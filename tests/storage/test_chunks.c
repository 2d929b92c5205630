/* Tests of the chunk blob store: round trips, replacement, corruption, gc, batches,
 * threads, settings and the migration from schema version 1. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "storage/chunks.h"
#include "storage/store.h"
#include "tests/support/test.h"

#define MAX_SECTIONS 8

/* Sections of one chunk, owned by the test. */
typedef struct blob {
    int n;
    uint8_t *data[MAX_SECTIONS];
    size_t bytes[MAX_SECTIONS];
} blob;

static uint32_t rng_state = 12345;

static uint32_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

/* Bytes like int8 quantized KV: small values around zero, some runs. */
static void fill_int8_like(uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int v = (int)(rng() % 9) + (int)(rng() % 9) - 8;
        p[i] = (uint8_t)(int8_t)(i % 64 < 4 ? 0 : v * 3);
    }
}

static void blob_add(blob *b, size_t bytes, char kind)
{
    uint8_t *p = malloc(bytes ? bytes : 1);
    if (kind == 'i')
        fill_int8_like(p, bytes);
    else if (kind == 'r')
        for (size_t i = 0; i < bytes; i++)
            p[i] = (uint8_t)rng();
    else
        memset(p, kind, bytes);
    b->data[b->n] = p;
    b->bytes[b->n++] = bytes;
}

static void blob_free(blob *b)
{
    for (int i = 0; i < b->n; i++)
        free(b->data[i]);
    b->n = 0;
}

/* A mix: structured, empty, incompressible, constant, one byte. */
static void make_blob(blob *b, size_t scale)
{
    *b = (blob){0};
    blob_add(b, 3 * scale, 'i');
    blob_add(b, 0, 'i');
    blob_add(b, scale / 2, 'r');
    blob_add(b, scale, 0);
    blob_add(b, 1, 'r');
}

static int write_blob(store *s, const char *ctx, int index, const blob *b, int precision,
                      char *err)
{
    store_chunk meta = {.index = index, .precision = precision, .n_tokens = 16,
                        .density = 0.25f * (float)index, .last_used_ms = 1000 + index};
    return store_chunk_write(s, ctx, &meta, (const void *const *)b->data, b->bytes, b->n,
                             err);
}

/* Reads every section of chunk index and compares with b: 1 equal, 0 a read failed
 * (message in err), -1 wrong bytes came back or the chunk is missing. */
static int read_compare(store *s, const char *ctx, int index, const blob *b, char *err)
{
    bool found;
    store_chunk_reader *r = store_chunk_open(s, ctx, index, &found, err);
    if (!r)
        return found ? 0 : -1;
    int result = 1;
    if (store_chunk_reader_meta(r)->n_sections != b->n)
        result = -1;
    for (int i = b->n - 1; i >= 0 && result == 1; i--) {
        if (store_chunk_section_bytes(r, i) != b->bytes[i]) {
            result = -1;
            break;
        }
        uint8_t *dst = malloc(b->bytes[i] + 1);
        if (store_chunk_read_section(r, i, dst, b->bytes[i], err) != 0)
            result = 0;
        else if (memcmp(dst, b->data[i], b->bytes[i]) != 0)
            result = -1;
        free(dst);
    }
    store_chunk_close(r);
    return result;
}

static const char *fresh_dir(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s/state", test_tmpdir(), name);
    return path;
}

/* Opens a store in a fresh directory with contexts "c1" and "c2". */
static store *open_with_contexts(const char *name, char *err)
{
    store *s = store_open(fresh_dir(name), err);
    int64_t app;
    if (!s || store_app_id(s, 1000, "app", &app, err) != 0 ||
        store_context_create(s, "c1", app, NULL, NULL, 0, 1, err) != 0 ||
        store_context_create(s, "c2", app, NULL, NULL, 0, 2, err) != 0) {
        store_close(s);
        return NULL;
    }
    return s;
}

/* Names of the files in a context's chunk directory, sorted, joined with ' '. */
static int list_files(store *s, const char *ctx, char *out, size_t cap)
{
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/chunks/%s", store_dir(s), ctx);
    out[0] = '\0';
    struct dirent **names;
    int n = scandir(dir, &names, NULL, alphasort);
    if (n < 0)
        return errno == ENOENT ? 0 : -1;
    int files = 0;
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.') {
            size_t len = strlen(out);
            snprintf(out + len, cap - len, "%s%s", files ? " " : "", names[i]->d_name);
            files++;
        }
        free(names[i]);
    }
    free(names);
    return files;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static void round_trip(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("round", err);
    CHECK_MSG(s, "%s", err);
    blob b;
    make_blob(&b, 40000);
    store_chunk meta = {.index = 2, .precision = 3, .n_tokens = 16, .density = 0.5f,
                        .last_used_ms = 77};
    CHECK_MSG(store_chunk_write(s, "c1", &meta, (const void *const *)b.data, b.bytes, b.n,
                                err) == 0, "%s", err);
    CHECK_EQ(meta.n_sections, 5);
    CHECK_EQ(meta.raw_bytes, 3 * 40000 + 20000 + 40000 + 1);
    char names[256], path[1024];
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 1);
    CHECK_MSG(strcmp(names, "2.1.chunk") == 0, "%s", names);
    snprintf(path, sizeof path, "%s/chunks/c1/%s", store_dir(s), names);
    struct stat st;
    CHECK(stat(path, &st) == 0);
    CHECK_EQ(st.st_size, meta.file_bytes);
    /* The structured and constant sections compress; the random one costs little more. */
    CHECK(meta.file_bytes < meta.raw_bytes);

    CHECK_EQ(read_compare(s, "c1", 2, &b, err), 1);
    bool found;
    store_chunk_reader *r = store_chunk_open(s, "c1", 2, &found, err);
    CHECK_MSG(r && found, "%s", err);
    const store_chunk *m = store_chunk_reader_meta(r);
    CHECK(m->index == 2 && m->precision == 3 && m->n_tokens == 16 && m->density == 0.5f &&
          m->last_used_ms == 77 && m->n_sections == 5 && m->raw_bytes == meta.raw_bytes &&
          m->file_bytes == meta.file_bytes);
    uint8_t *dst = malloc(120000);
    CHECK_EQ(store_chunk_read_section(r, 1, dst, 0, err), 0);
    CHECK_EQ(store_chunk_read_section(r, 0, dst, 120000, err), 0);
    CHECK_EQ(store_chunk_read_section(r, 0, dst, 120000, err), 0);
    CHECK(memcmp(dst, b.data[0], 120000) == 0);
    /* Everything, header included, was read from the file. */
    CHECK(store_chunk_reader_bytes_read(r) > 0 &&
          store_chunk_reader_bytes_read(r) <= meta.file_bytes + 2 * 120000);
    /* Wrong sizes and sections are errors, and leave dst alone. */
    memset(dst, 0xab, 16);
    CHECK(store_chunk_read_section(r, 0, dst, 119999, err) == -1);
    CHECK_MSG(strstr(err, "'c1'") && strstr(err, "chunk 2") && strstr(err, "section 0"), "%s",
              err);
    CHECK(store_chunk_read_section(r, 0, dst, 120001, err) == -1);
    CHECK(store_chunk_read_section(r, 1, dst, 1, err) == -1);
    CHECK(store_chunk_read_section(r, 5, dst, 0, err) == -1);
    CHECK(store_chunk_read_section(r, -1, dst, 0, err) == -1);
    CHECK_EQ(dst[0], 0xab);
    store_chunk_close(r);
    free(dst);

    r = store_chunk_open(s, "c1", 3, &found, err);
    CHECK(!r && !found);
    r = store_chunk_open(s, "nope", 0, &found, err);
    CHECK(!r && !found);

    /* A chunk with no sections is allowed too. */
    store_chunk empty = {.index = 9};
    CHECK_MSG(store_chunk_write(s, "c1", &empty, NULL, NULL, 0, err) == 0, "%s", err);
    blob none = {0};
    CHECK_EQ(read_compare(s, "c1", 9, &none, err), 1);
    blob_free(&b);
    store_close(s);
}

static void bad_writes_are_refused(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("badwrite", err);
    CHECK_MSG(s, "%s", err);
    blob b;
    make_blob(&b, 100);
    CHECK(write_blob(s, "ghost", 0, &b, 0, err) == -1);
    CHECK_MSG(strstr(err, "no context 'ghost'"), "%s", err);
    CHECK(write_blob(s, "c1", -1, &b, 0, err) == -1);
    store_chunk meta = {.index = 0};
    const void *ptrs[1] = {NULL};
    size_t sizes[1] = {10};
    CHECK(store_chunk_write(s, "c1", &meta, ptrs, sizes, 1, err) == -1);
    CHECK(store_chunk_write(s, "c1", &meta, ptrs, sizes, STORE_CHUNK_MAX_SECTIONS + 1,
                            err) == -1);
    CHECK(store_chunk_write(s, "", &meta, ptrs, sizes, 1, err) == -1);
    char names[256];
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 0);
    CHECK(store_chunk_touch(s, "c1", 0, 1.0f, 5, err) == -1);
    CHECK_MSG(strstr(err, "no such chunk"), "%s", err);
    CHECK(store_chunk_list(s, "ghost", NULL, NULL, err) == -1);
    CHECK(store_chunk_delete_from(s, "ghost", 0, err) == -1);
    CHECK(store_chunk_drop_cache(s, "ghost", err) == -1);
    blob_free(&b);
    store_close(s);
}

static void replace_makes_a_new_generation(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("replace", err);
    CHECK_MSG(s, "%s", err);
    blob a, b;
    make_blob(&a, 2000);
    make_blob(&b, 3000);
    CHECK_MSG(write_blob(s, "c1", 0, &a, 1, err) == 0, "%s", err);
    char names[256];
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 1);
    CHECK_MSG(strcmp(names, "0.1.chunk") == 0, "%s", names);
    CHECK_MSG(write_blob(s, "c1", 0, &b, 2, err) == 0, "%s", err);
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 1);
    CHECK_MSG(strcmp(names, "0.2.chunk") == 0, "%s", names);
    CHECK_EQ(read_compare(s, "c1", 0, &b, err), 1);
    bool found;
    store_chunk_reader *r = store_chunk_open(s, "c1", 0, &found, err);
    CHECK_MSG(r, "%s", err);
    CHECK_EQ(store_chunk_reader_meta(r)->precision, 2);
    /* A reader keeps reading the version it opened even after a replace. */
    CHECK_MSG(write_blob(s, "c1", 0, &a, 3, err) == 0, "%s", err);
    uint8_t *dst = malloc(b.bytes[0]);
    CHECK_MSG(store_chunk_read_section(r, 0, dst, b.bytes[0], err) == 0, "%s", err);
    CHECK(memcmp(dst, b.data[0], b.bytes[0]) == 0);
    free(dst);
    store_chunk_close(r);
    CHECK_EQ(read_compare(s, "c1", 0, &a, err), 1);
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 1);
    CHECK_MSG(strcmp(names, "0.3.chunk") == 0, "%s", names);

    /* Rows survive reopening. */
    store_close(s);
    s = store_open(fresh_dir("replace"), err);
    CHECK_MSG(s, "%s", err);
    CHECK_EQ(read_compare(s, "c1", 0, &a, err), 1);
    blob_free(&a);
    blob_free(&b);
    store_close(s);
}

#define MAX_SEEN 16

typedef struct seen {
    int n;
    store_chunk c[MAX_SEEN];
    int stop_after;
} seen;

static int see_chunk(void *arg, const store_chunk *c)
{
    seen *s = arg;
    if (s->n < MAX_SEEN)
        s->c[s->n] = *c;
    s->n++;
    return s->stop_after && s->n >= s->stop_after ? 42 : 0;
}

static void list_touch_delete(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("list", err);
    CHECK_MSG(s, "%s", err);
    blob b;
    make_blob(&b, 500);
    int order[] = {5, 0, 3, 10};
    for (int i = 0; i < 4; i++)
        CHECK_MSG(write_blob(s, "c1", order[i], &b, order[i] % 4, err) == 0, "%s", err);
    CHECK_MSG(write_blob(s, "c2", 1, &b, 0, err) == 0, "%s", err);

    seen all = {0};
    CHECK_MSG(store_chunk_list(s, "c1", see_chunk, &all, err) == 0, "%s", err);
    CHECK_EQ(all.n, 4);
    int want[] = {0, 3, 5, 10};
    for (int i = 0; i < 4; i++) {
        CHECK_EQ(all.c[i].index, want[i]);
        CHECK_EQ(all.c[i].precision, want[i] % 4);
        CHECK_EQ(all.c[i].n_tokens, 16);
        CHECK_EQ(all.c[i].n_sections, 5);
        CHECK_EQ(all.c[i].last_used_ms, 1000 + want[i]);
        CHECK(all.c[i].density == 0.25f * (float)want[i]);
    }
    seen some = {.stop_after = 2};
    CHECK_EQ(store_chunk_list(s, "c1", see_chunk, &some, err), 42);
    CHECK_EQ(some.n, 2);

    CHECK_MSG(store_chunk_touch(s, "c1", 3, 0.75f, 99999, err) == 0, "%s", err);
    all = (seen){0};
    CHECK_MSG(store_chunk_list(s, "c1", see_chunk, &all, err) == 0, "%s", err);
    CHECK(all.c[1].density == 0.75f && all.c[1].last_used_ms == 99999);
    CHECK(all.c[0].last_used_ms == 1000 && all.c[2].last_used_ms == 1005);

    CHECK_MSG(store_chunk_delete_from(s, "c1", 4, err) == 0, "%s", err);
    all = (seen){0};
    CHECK_MSG(store_chunk_list(s, "c1", see_chunk, &all, err) == 0, "%s", err);
    CHECK_EQ(all.n, 2);
    CHECK(all.c[0].index == 0 && all.c[1].index == 3);
    char names[256];
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 2);
    CHECK_MSG(strcmp(names, "0.1.chunk 3.1.chunk") == 0, "%s", names);
    bool found;
    CHECK(!store_chunk_open(s, "c1", 5, &found, err) && !found);
    CHECK_EQ(read_compare(s, "c1", 3, &b, err), 1);

    CHECK_MSG(store_chunk_drop_cache(s, "c1", err) == 0, "%s", err);
    CHECK_EQ(read_compare(s, "c1", 0, &b, err), 1);

    CHECK_MSG(store_chunk_delete_from(s, "c1", 0, err) == 0, "%s", err);
    all = (seen){0};
    CHECK_MSG(store_chunk_list(s, "c1", see_chunk, &all, err) == 0, "%s", err);
    CHECK_EQ(all.n, 0);
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 0);
    /* The other context is untouched. */
    CHECK_EQ(read_compare(s, "c2", 1, &b, err), 1);
    blob_free(&b);
    store_close(s);
}

/* A chunk just written is in the page cache and one dropped from it is not, as the
 * reader tells before reading anything; the deferred open reads its header when asked,
 * and a section read before that is refused. */
static void cache_share_and_deferred_open(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("cached", err);
    CHECK_MSG(s, "%s", err);
    blob b;
    make_blob(&b, 60000);
    CHECK_MSG(write_blob(s, "c1", 0, &b, 1, err) == 0, "%s", err);
    bool found;
    store_chunk_reader *r = store_chunk_open_deferred(s, "c1", 0, &found, err);
    CHECK_MSG(r && found, "%s", err);
    CHECK_NEAR(store_chunk_reader_cached(r), 1, 1e-9);
    CHECK_EQ(store_chunk_section_bytes(r, 0), 0);
    uint8_t one;
    CHECK(store_chunk_read_section(r, 4, &one, 1, err) == -1);
    CHECK_MSG(store_chunk_read_header(r, err) == 0, "%s", err);
    CHECK_EQ(store_chunk_section_bytes(r, 0), b.bytes[0]);
    CHECK_EQ(store_chunk_read_section(r, 4, &one, 1, err), 0);
    store_chunk_close(r);
    /* tmpfs keeps no page cache apart from its files: nothing to drop there */
    struct statfs fs;
    bool droppable = statfs(store_dir(s), &fs) == 0 && fs.f_type != 0x01021994;
    CHECK_MSG(store_chunk_drop_cache(s, "c1", err) == 0, "%s", err);
    r = store_chunk_open(s, "c1", 0, &found, err);
    CHECK_MSG(r, "%s", err);
    double cold = store_chunk_reader_cached(r);
    store_chunk_close(r);
    if (droppable)
        CHECK_MSG(cold < 0.01, "%.3f of a dropped file still cached", cold);
    CHECK_EQ(read_compare(s, "c1", 0, &b, err), 1);
    blob_free(&b);
    store_close(s);
}

static void context_delete_removes_files(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("ctxdel", err);
    CHECK_MSG(s, "%s", err);
    blob b;
    make_blob(&b, 500);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(write_blob(s, "c1", i, &b, 0, err) == 0, "%s", err);
    CHECK_MSG(write_blob(s, "c2", 0, &b, 0, err) == 0, "%s", err);
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/chunks/c1", store_dir(s));
    CHECK(exists(dir));
    bool found;
    CHECK_MSG(store_context_delete(s, "c1", &found, err) == 0 && found, "%s", err);
    CHECK(!exists(dir));
    CHECK(!store_chunk_open(s, "c1", 0, &found, err) && !found);
    CHECK_EQ(read_compare(s, "c2", 0, &b, err), 1);
    int removed = -1;
    CHECK_MSG(store_chunks_gc(s, &removed, err) == 0, "%s", err);
    CHECK_EQ(removed, 0);
    blob_free(&b);
    store_close(s);
}

/* Flips bytes of the file one at a time (every byte when small) and checks each flip is
 * caught by open or by the read of the section it hits, never returning wrong bytes. */
static void corruption_is_detected(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("corrupt", err);
    CHECK_MSG(s, "%s", err);
    blob b;
    make_blob(&b, 1200);
    CHECK_MSG(write_blob(s, "c1", 4, &b, 0, err) == 0, "%s", err);
    char path[1024];
    snprintf(path, sizeof path, "%s/chunks/c1/4.1.chunk", store_dir(s));
    FILE *f = fopen(path, "rb");
    CHECK(f);
    static uint8_t orig[65536];
    size_t size = fread(orig, 1, sizeof orig, f);
    fclose(f);
    CHECK(size > 200 && size < sizeof orig);
    CHECK_EQ(read_compare(s, "c1", 4, &b, err), 1);

    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0);
    size_t missed = size;
    for (size_t at = 0; at < size; at++) {
        uint8_t bad = orig[at] ^ (uint8_t)(1u << (at % 8));
        CHECK(pwrite(fd, &bad, 1, (off_t)at) == 1);
        int rc = read_compare(s, "c1", 4, &b, err);
        CHECK(pwrite(fd, &orig[at], 1, (off_t)at) == 1);
        if (rc != 0) {
            missed = at;
            break;
        }
        CHECK_MSG(strstr(err, "'c1'") && strstr(err, "chunk 4"), "%s", err);
    }
    close(fd);
    CHECK_MSG(missed == size, "flipping byte %zu of %zu was not detected", missed, size);
    CHECK_EQ(read_compare(s, "c1", 4, &b, err), 1);

    /* Truncated at any of several lengths. */
    size_t cuts[] = {0, 1, 8, 20, 100, size / 2, size - 1};
    for (size_t k = 0; k < sizeof cuts / sizeof cuts[0]; k++) {
        CHECK(truncate(path, (off_t)cuts[k]) == 0);
        CHECK_MSG(read_compare(s, "c1", 4, &b, err) == 0, "cut at %zu", cuts[k]);
        CHECK_MSG(strstr(err, "chunk 4"), "%s", err);
        f = fopen(path, "wb");
        CHECK(f && fwrite(orig, 1, size, f) == size);
        fclose(f);
        CHECK_EQ(read_compare(s, "c1", 4, &b, err), 1);
    }
    /* Longer than the catalog says. */
    f = fopen(path, "ab");
    CHECK(f && fputc(0, f) == 0);
    fclose(f);
    CHECK_EQ(read_compare(s, "c1", 4, &b, err), 0);

    CHECK(unlink(path) == 0);
    CHECK_EQ(read_compare(s, "c1", 4, &b, err), 0);
    CHECK_MSG(strstr(err, "chunk 4") && strstr(err, "No such file"), "%s", err);
    CHECK(store_chunk_drop_cache(s, "c1", err) == -1);
    blob_free(&b);
    store_close(s);
}

static void gc_removes_orphans_only(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("gc", err);
    CHECK_MSG(s, "%s", err);
    int64_t app;
    CHECK_MSG(store_app_id(s, 1000, "app", &app, err) == 0, "%s", err);
    const char *odd = "odd/id %..\xc3\xa9";
    CHECK_MSG(store_context_create(s, odd, app, NULL, NULL, 0, 3, err) == 0, "%s", err);
    blob b;
    make_blob(&b, 300);
    CHECK_MSG(write_blob(s, "c1", 0, &b, 0, err) == 0, "%s", err);
    CHECK_MSG(write_blob(s, "c1", 0, &b, 0, err) == 0, "%s", err); /* generation 2 */
    CHECK_MSG(write_blob(s, "c1", 1, &b, 0, err) == 0, "%s", err);
    CHECK_MSG(write_blob(s, odd, 0, &b, 0, err) == 0, "%s", err);
    int removed = -1;
    CHECK_MSG(store_chunks_gc(s, &removed, err) == 0, "%s", err);
    CHECK_EQ(removed, 0);

    /* What crashes leave: a renamed file whose row never committed (next generation),
     * a file of a deleted chunk, a temp file, a context directory with no context. */
    char dir[1024], p[1200], names[256];
    snprintf(dir, sizeof dir, "%s/chunks/c1", store_dir(s));
    const char *orphans[] = {"0.3.chunk", "0.1.chunk", "7.1.chunk", "1.2.chunk.tmp"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, orphans[i]);
        FILE *f = fopen(p, "wb");
        CHECK(f && fputs("partial", f) >= 0);
        fclose(f);
    }
    snprintf(p, sizeof p, "%s/chunks/ghost", store_dir(s));
    CHECK(mkdir(p, 0750) == 0);
    snprintf(p, sizeof p, "%s/chunks/ghost/0.1.chunk", store_dir(s));
    FILE *f = fopen(p, "wb");
    CHECK(f);
    fclose(f);
    /* Files the store did not name are not its to remove. */
    snprintf(p, sizeof p, "%s/notes.txt", dir);
    f = fopen(p, "wb");
    CHECK(f);
    fclose(f);

    CHECK_MSG(store_chunks_gc(s, &removed, err) == 0, "%s", err);
    CHECK_EQ(removed, 5);
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 3);
    CHECK_MSG(strcmp(names, "0.2.chunk 1.1.chunk notes.txt") == 0, "%s", names);
    snprintf(p, sizeof p, "%s/chunks/ghost", store_dir(s));
    CHECK(!exists(p));
    CHECK_EQ(read_compare(s, "c1", 0, &b, err), 1);
    CHECK_EQ(read_compare(s, "c1", 1, &b, err), 1);
    CHECK_EQ(read_compare(s, odd, 0, &b, err), 1);
    /* The odd id got a directory of its own, not a path through '/' or "..". */
    snprintf(p, sizeof p, "%s/chunks/odd%%2Fid%%20%%25%%2E%%2E%%C3%%A9/0.1.chunk",
             store_dir(s));
    CHECK_MSG(exists(p), "%s", p);

    /* After the next write of chunk 0, generation 3 is the live one. */
    CHECK_MSG(write_blob(s, "c1", 0, &b, 0, err) == 0, "%s", err);
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 3);
    CHECK_MSG(strcmp(names, "0.3.chunk 1.1.chunk notes.txt") == 0, "%s", names);
    CHECK_MSG(store_chunks_gc(s, NULL, err) == 0, "%s", err);
    CHECK_EQ(read_compare(s, "c1", 0, &b, err), 1);
    blob_free(&b);
    store_close(s);
}

/* A batch's entry for chunk index made of b's sections. */
static store_chunk_blob batch_entry(int index, const blob *b, int precision)
{
    return (store_chunk_blob){
        .meta = {.index = index, .precision = precision, .n_tokens = 16,
                 .density = 0.25f * (float)index, .last_used_ms = 1000 + index},
        .sections = (const void *const *)b->data,
        .section_bytes = b->bytes,
        .n_sections = b->n,
    };
}

/* Runs the gc and returns how many files it removed (-1 when it failed). */
static int gc_count(store *s)
{
    char err[ERR_MAX];
    int removed = -1;
    return store_chunks_gc(s, &removed, err) == 0 ? removed : -1;
}

#define BIG_BATCH 70 /* more than one window of files written before they are synced */

static void batch_round_trip(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("batch", err);
    CHECK_MSG(s, "%s", err);
    blob b[3], none = {0};
    make_blob(&b[0], 3000);
    make_blob(&b[1], 100);
    make_blob(&b[2], 7000);
    /* Out of index order, with a chunk of no sections. */
    store_chunk_blob chunks[4] = {batch_entry(6, &b[0], 1), batch_entry(2, &b[1], 2),
                                  batch_entry(0, &none, 0), batch_entry(4, &b[2], 3)};
    CHECK_MSG(store_chunk_write_batch(s, "c1", chunks, 4, err) == 0, "%s", err);
    CHECK(chunks[0].meta.n_sections == 5 && chunks[0].meta.raw_bytes == 3 * 3000 + 1500 +
                                                                           3000 + 1);
    CHECK(chunks[2].meta.n_sections == 0 && chunks[2].meta.raw_bytes == 0);
    char names[512];
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 4);
    CHECK_MSG(strcmp(names, "0.1.chunk 2.1.chunk 4.1.chunk 6.1.chunk") == 0, "%s", names);
    CHECK_EQ(read_compare(s, "c1", 6, &b[0], err), 1);
    CHECK_EQ(read_compare(s, "c1", 2, &b[1], err), 1);
    CHECK_EQ(read_compare(s, "c1", 0, &none, err), 1);
    CHECK_EQ(read_compare(s, "c1", 4, &b[2], err), 1);
    seen all = {0};
    CHECK_MSG(store_chunk_list(s, "c1", see_chunk, &all, err) == 0, "%s", err);
    CHECK_EQ(all.n, 4);
    for (int i = 0; i < 4 && i < all.n; i++) {
        const store_chunk *want = NULL;
        for (int k = 0; k < 4; k++)
            if (chunks[k].meta.index == all.c[i].index)
                want = &chunks[k].meta;
        const store_chunk *got = &all.c[i];
        CHECK(want && want->precision == got->precision && want->n_tokens == got->n_tokens &&
              want->n_sections == got->n_sections && want->raw_bytes == got->raw_bytes &&
              want->file_bytes == got->file_bytes && want->density == got->density &&
              want->last_used_ms == got->last_used_ms);
    }

    /* A batch larger than one window, in the other context. */
    static store_chunk_blob big[BIG_BATCH];
    for (int k = 0; k < BIG_BATCH; k++)
        big[k] = batch_entry(k, &b[k % 3], k % 4);
    CHECK_MSG(store_chunk_write_batch(s, "c2", big, BIG_BATCH, err) == 0, "%s", err);
    for (int k = 0; k < BIG_BATCH; k++)
        CHECK_MSG(read_compare(s, "c2", k, &b[k % 3], err) == 1, "chunk %d", k);
    CHECK_EQ(gc_count(s), 0);
    for (int i = 0; i < 3; i++)
        blob_free(&b[i]);
    store_close(s);
}

static void batch_replaces_some(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("batchrep", err);
    CHECK_MSG(s, "%s", err);
    blob a, b;
    make_blob(&a, 2000);
    make_blob(&b, 2500);
    for (int i = 0; i < 4; i++)
        CHECK_MSG(write_blob(s, "c1", i, &a, 0, err) == 0, "%s", err);
    /* A reader of a replaced chunk keeps its version. */
    bool found;
    store_chunk_reader *r = store_chunk_open(s, "c1", 3, &found, err);
    CHECK_MSG(r, "%s", err);
    store_chunk_blob chunks[3] = {batch_entry(3, &b, 5), batch_entry(5, &b, 5),
                                  batch_entry(1, &b, 5)};
    CHECK_MSG(store_chunk_write_batch(s, "c1", chunks, 3, err) == 0, "%s", err);
    char names[512];
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 5);
    CHECK_MSG(strcmp(names, "0.1.chunk 1.2.chunk 2.1.chunk 3.2.chunk 5.1.chunk") == 0, "%s",
              names);
    CHECK_EQ(read_compare(s, "c1", 0, &a, err), 1);
    CHECK_EQ(read_compare(s, "c1", 1, &b, err), 1);
    CHECK_EQ(read_compare(s, "c1", 2, &a, err), 1);
    CHECK_EQ(read_compare(s, "c1", 3, &b, err), 1);
    CHECK_EQ(read_compare(s, "c1", 5, &b, err), 1);
    uint8_t *dst = malloc(a.bytes[0]);
    CHECK_MSG(store_chunk_read_section(r, 0, dst, a.bytes[0], err) == 0, "%s", err);
    CHECK(memcmp(dst, a.data[0], a.bytes[0]) == 0);
    free(dst);
    store_chunk_close(r);
    CHECK_EQ(gc_count(s), 0);

    /* Rows survive reopening. */
    store_close(s);
    s = store_open(fresh_dir("batchrep"), err);
    CHECK_MSG(s, "%s", err);
    CHECK_EQ(read_compare(s, "c1", 3, &b, err), 1);
    CHECK_EQ(read_compare(s, "c1", 2, &a, err), 1);
    blob_free(&a);
    blob_free(&b);
    store_close(s);
}

/* Checks that chunks 0..n-1 of c1 still hold a, that no other chunk or file appeared
 * and that the gc finds nothing to remove. */
static void check_untouched(store *s, int n, const blob *a, const char *files)
{
    char err[ERR_MAX] = "", names[512];
    for (int i = 0; i < n; i++)
        CHECK_MSG(read_compare(s, "c1", i, a, err) == 1, "chunk %d: %s", i, err);
    seen all = {0};
    CHECK_MSG(store_chunk_list(s, "c1", see_chunk, &all, err) == 0, "%s", err);
    CHECK_EQ(all.n, n);
    list_files(s, "c1", names, sizeof names);
    CHECK_MSG(strcmp(names, files) == 0, "%s", names);
    CHECK_EQ(gc_count(s), 0);
}

static void failed_batch_changes_nothing(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("batchfail", err);
    CHECK_MSG(s, "%s", err);
    blob a, b;
    make_blob(&a, 1500);
    make_blob(&b, 1800);
    for (int i = 0; i < 3; i++)
        CHECK_MSG(write_blob(s, "c1", i, &a, 0, err) == 0, "%s", err);
    const char *files = "0.1.chunk 1.1.chunk 2.1.chunk";
    check_untouched(s, 3, &a, files);

    /* A section too large to compress, met after two chunks were written. */
    const void *huge_data[1] = {a.data[0]};
    size_t huge_bytes[1] = {SIZE_MAX / 2};
    store_chunk_blob chunks[4] = {batch_entry(1, &b, 1), batch_entry(7, &b, 1),
                                  batch_entry(2, &b, 1), batch_entry(8, &b, 1)};
    chunks[2].sections = huge_data;
    chunks[2].section_bytes = huge_bytes;
    chunks[2].n_sections = 1;
    CHECK(store_chunk_write_batch(s, "c1", chunks, 4, err) == -1);
    CHECK_MSG(strstr(err, "'c1'") && strstr(err, "chunk 2") && strstr(err, "too large"), "%s",
              err);
    CHECK(chunks[0].meta.n_sections == 0 && chunks[0].meta.file_bytes == 0);
    bool found;
    CHECK(!store_chunk_open(s, "c1", 7, &found, err) && !found);
    check_untouched(s, 3, &a, files);

    /* The same past the first window: the files of the first window were renamed. */
    static store_chunk_blob big[BIG_BATCH];
    for (int k = 0; k < BIG_BATCH; k++)
        big[k] = batch_entry(k, &b, 1);
    big[BIG_BATCH - 2].sections = huge_data;
    big[BIG_BATCH - 2].section_bytes = huge_bytes;
    big[BIG_BATCH - 2].n_sections = 1;
    CHECK(store_chunk_write_batch(s, "c1", big, BIG_BATCH, err) == -1);
    CHECK_MSG(strstr(err, "too large"), "%s", err);
    check_untouched(s, 3, &a, files);

    /* Refused before anything is written: too many sections in the middle, a section
     * with no data, an index twice, a negative index, an unknown context. */
    chunks[2] = batch_entry(2, &b, 1);
    chunks[2].n_sections = STORE_CHUNK_MAX_SECTIONS + 1;
    CHECK(store_chunk_write_batch(s, "c1", chunks, 4, err) == -1);
    CHECK_MSG(strstr(err, "chunk 2") && strstr(err, "section count"), "%s", err);
    chunks[2] = batch_entry(2, &b, 1);
    const void *no_data[1] = {NULL};
    chunks[2].sections = no_data;
    chunks[2].n_sections = 1;
    CHECK(store_chunk_write_batch(s, "c1", chunks, 4, err) == -1);
    chunks[2] = batch_entry(1, &b, 1);
    CHECK(store_chunk_write_batch(s, "c1", chunks, 4, err) == -1);
    CHECK_MSG(strstr(err, "chunk 1") && strstr(err, "twice"), "%s", err);
    chunks[2] = batch_entry(-3, &b, 1);
    CHECK(store_chunk_write_batch(s, "c1", chunks, 4, err) == -1);
    chunks[2] = batch_entry(2, &b, 1);
    CHECK(store_chunk_write_batch(s, "ghost", chunks, 4, err) == -1);
    CHECK_MSG(strstr(err, "no context 'ghost'"), "%s", err);
    CHECK(store_chunk_write_batch(s, "c1", chunks, -1, err) == -1);
    CHECK(store_chunk_write_batch(s, "c1", NULL, 2, err) == -1);
    check_untouched(s, 3, &a, files);

    /* The same batch, fixed, goes through. */
    CHECK_MSG(store_chunk_write_batch(s, "c1", chunks, 4, err) == 0, "%s", err);
    CHECK_EQ(read_compare(s, "c1", 2, &b, err), 1);
    CHECK_EQ(read_compare(s, "c1", 8, &b, err), 1);
    CHECK_EQ(read_compare(s, "c1", 0, &a, err), 1);
    CHECK_EQ(gc_count(s), 0);
    blob_free(&a);
    blob_free(&b);
    store_close(s);
}

static void empty_batch(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("batchzero", err);
    CHECK_MSG(s, "%s", err);
    CHECK_MSG(store_chunk_write_batch(s, "c1", NULL, 0, err) == 0, "%s", err);
    store_chunk_blob unused = {.meta = {.index = 0}};
    CHECK_MSG(store_chunk_write_batch(s, "c1", &unused, 0, err) == 0, "%s", err);
    CHECK(store_chunk_write_batch(s, "ghost", NULL, 0, err) == -1);
    CHECK(store_chunk_write_batch(s, "", NULL, 0, err) == -1);
    char names[256];
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 0);
    seen all = {0};
    CHECK_MSG(store_chunk_list(s, "c1", see_chunk, &all, err) == 0, "%s", err);
    CHECK_EQ(all.n, 0);
    store_close(s);
}

/* A context's stats: set, read back, cleared; with a batch they are committed with its
 * rows (also a batch of no chunks), and a batch whose write failed leaves the ones
 * before. */
static void context_stats(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("ctxstats", err);
    CHECK_MSG(s, "%s", err);
    void *got;
    size_t n;
    CHECK_MSG(store_context_get_stats(s, "c1", &got, &n, err) == 0, "%s", err);
    CHECK(!got && n == 0);
    const char first[] = "attention of every token", second[] = "the next call's";
    CHECK_MSG(store_context_set_stats(s, "c1", first, sizeof first, err) == 0, "%s", err);
    CHECK(store_context_get_stats(s, "c1", &got, &n, err) == 0);
    CHECK(got && n == sizeof first && memcmp(got, first, n) == 0);
    free(got);
    CHECK(store_context_set_stats(s, "ghost", first, sizeof first, err) == -1);
    CHECK(store_context_get_stats(s, "ghost", &got, &n, err) == -1);

    blob a;
    make_blob(&a, 900);
    store_chunk_blob chunks[1] = {batch_entry(0, &a, 1)};
    store_chunk_batch *bt = store_chunk_batch_begin(s, "c1", chunks, 1, err);
    CHECK_MSG(bt, "%s", err);
    CHECK(store_chunk_batch_set_context_stats(bt, second, sizeof second, err) == 0);
    CHECK(store_context_get_stats(s, "c1", &got, &n, err) == 0);
    CHECK(n == sizeof first && memcmp(got, first, n) == 0);
    free(got);
    CHECK(store_chunk_batch_end(s, bt, err) == -1); /* never written */
    CHECK(store_context_get_stats(s, "c1", &got, &n, err) == 0);
    CHECK(n == sizeof first && memcmp(got, first, n) == 0);
    free(got);
    bt = store_chunk_batch_begin(s, "c1", chunks, 1, err);
    store_chunk_encoder *enc = store_chunk_encoder_new(err);
    CHECK(bt && enc);
    CHECK(store_chunk_batch_set_context_stats(bt, second, sizeof second, err) == 0);
    CHECK_MSG(store_chunk_batch_write(bt, enc, err) == 0, "%s", err);
    CHECK_MSG(store_chunk_batch_end(s, bt, err) == 0, "%s", err);
    CHECK(store_context_get_stats(s, "c1", &got, &n, err) == 0);
    CHECK(n == sizeof second && memcmp(got, second, n) == 0);
    free(got);
    CHECK_EQ(read_compare(s, "c1", 0, &a, err), 1);

    bt = store_chunk_batch_begin(s, "c1", NULL, 0, err);
    CHECK(bt);
    CHECK(store_chunk_batch_set_context_stats(bt, first, sizeof first, err) == 0);
    CHECK(store_chunk_batch_write(bt, enc, err) == 0 && store_chunk_batch_end(s, bt, err) == 0);
    CHECK(store_context_get_stats(s, "c1", &got, &n, err) == 0);
    CHECK(n == sizeof first && memcmp(got, first, n) == 0);
    free(got);
    CHECK(store_context_set_stats(s, "c1", NULL, 0, err) == 0);
    CHECK(store_context_get_stats(s, "c1", &got, &n, err) == 0);
    CHECK(!got && n == 0);
    store_chunk_encoder_free(enc);
    blob_free(&a);
    store_close(s);
}

typedef struct reader_job {
    store_chunk_reader *r;
    const blob *b;
    int ok;
    char err[ERR_MAX];
} reader_job;

static void *read_in_thread(void *arg)
{
    reader_job *j = arg;
    j->ok = 1;
    for (int i = j->b->n - 1; i >= 0; i--) {
        uint8_t *dst = malloc(j->b->bytes[i] + 1);
        if (store_chunk_read_section(j->r, i, dst, j->b->bytes[i], j->err) != 0 ||
            memcmp(dst, j->b->data[i], j->b->bytes[i]) != 0)
            j->ok = 0;
        free(dst);
    }
    return NULL;
}

static void reader_on_another_thread(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("thread", err);
    CHECK_MSG(s, "%s", err);
    blob b;
    make_blob(&b, 20000);
    CHECK_MSG(write_blob(s, "c1", 0, &b, 0, err) == 0, "%s", err);
    bool found;
    reader_job job = {.b = &b};
    job.r = store_chunk_open(s, "c1", 0, &found, err);
    CHECK_MSG(job.r, "%s", err);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, read_in_thread, &job) == 0);
    /* The store thread keeps using the catalog meanwhile. */
    for (int i = 1; i < 4; i++)
        CHECK_MSG(write_blob(s, "c2", i, &b, 0, err) == 0, "%s", err);
    pthread_join(t, NULL);
    CHECK_MSG(job.ok, "%s", job.err);
    store_chunk_close(job.r);
    blob_free(&b);
    store_close(s);
}

static void settings(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("settings", err);
    CHECK_MSG(s, "%s", err);
    double v[8] = {0};
    int n = -1;
    bool found = true;
    CHECK_MSG(store_setting_get(s, "cost.decode", v, 8, &n, &found, err) == 0, "%s", err);
    CHECK(!found && n == 0);
    const double put[] = {1.5, -2.25e-7, 1e300, 0.0};
    CHECK_MSG(store_setting_put(s, "cost.decode", put, 4, err) == 0, "%s", err);
    CHECK_MSG(store_setting_get(s, "cost.decode", v, 8, &n, &found, err) == 0, "%s", err);
    CHECK(found && n == 4);
    CHECK(memcmp(v, put, sizeof put) == 0);
    /* A smaller buffer gets the first values and the stored count. */
    double one[1] = {0};
    CHECK_MSG(store_setting_get(s, "cost.decode", one, 1, &n, &found, err) == 0, "%s", err);
    CHECK(found && n == 4 && one[0] == 1.5);
    const double again[] = {42.0};
    CHECK_MSG(store_setting_put(s, "cost.decode", again, 1, err) == 0, "%s", err);
    CHECK_MSG(store_setting_put(s, "empty", NULL, 0, err) == 0, "%s", err);
    store_close(s);

    s = store_open(fresh_dir("settings"), err);
    CHECK_MSG(s, "%s", err);
    CHECK_MSG(store_setting_get(s, "cost.decode", v, 8, &n, &found, err) == 0, "%s", err);
    CHECK(found && n == 1 && v[0] == 42.0);
    CHECK_MSG(store_setting_get(s, "empty", NULL, 0, &n, &found, err) == 0, "%s", err);
    CHECK(found && n == 0);
    CHECK(store_setting_put(s, "", put, 1, err) == -1);
    CHECK(store_setting_put(s, "x", NULL, 1, err) == -1);
    CHECK(store_setting_get(s, "x", NULL, 1, &n, &found, err) == -1);
    store_close(s);
}

/* The schema store.c created before chunks existed (version 1), verbatim. */
static const char schema_v1[] =
    "CREATE TABLE apps ("
    "  id INTEGER PRIMARY KEY,"
    "  uid INTEGER NOT NULL,"
    "  name TEXT NOT NULL,"
    "  created_ms INTEGER NOT NULL,"
    "  UNIQUE (uid, name));"
    "CREATE TABLE contexts ("
    "  id TEXT PRIMARY KEY,"
    "  app_id INTEGER NOT NULL REFERENCES apps(id),"
    "  system_prompt TEXT,"
    "  params BLOB,"
    "  created_ms INTEGER NOT NULL,"
    "  last_used_ms INTEGER NOT NULL,"
    "  n_tokens INTEGER NOT NULL DEFAULT 0,"
    "  n_turns INTEGER NOT NULL DEFAULT 0);"
    "CREATE INDEX contexts_by_app ON contexts (app_id, created_ms);"
    "CREATE TABLE turns ("
    "  context_id TEXT NOT NULL REFERENCES contexts(id) ON DELETE CASCADE,"
    "  seq INTEGER NOT NULL,"
    "  role TEXT NOT NULL,"
    "  text TEXT NOT NULL,"
    "  tokens BLOB NOT NULL,"
    "  PRIMARY KEY (context_id, seq));"
    "PRAGMA user_version = 1;"
    "INSERT INTO apps VALUES (1, 1000, 'old', 5);"
    "INSERT INTO contexts VALUES ('old-ctx', 1, 'sys', NULL, 5, 6, 2, 1);"
    "INSERT INTO turns VALUES ('old-ctx', 0, 'user', 'hi', X'0100000002000000');";

static int count_turns(void *arg, const store_turn *t)
{
    int *n = arg;
    *n += t->n_tokens;
    return 0;
}

static int get_model(void *arg, const store_context *c)
{
    *(const char **)arg = c->model;
    return 0;
}

static int copy_model(void *arg, const store_context *c)
{
    snprintf(arg, 16, "%s", c->model ? c->model : "");
    return 0;
}

static void migrates_from_version_1(void)
{
    char err[ERR_MAX] = "";
    const char *dir = fresh_dir("migrate");
    char path[600];
    snprintf(path, sizeof path, "%s", dir);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    CHECK(mkdir(path, 0700) == 0 && mkdir(dir, 0750) == 0);
    snprintf(path, sizeof path, "%s/llmsd.db", dir);
    sqlite3 *db;
    CHECK(sqlite3_open(path, &db) == SQLITE_OK);
    CHECK(sqlite3_exec(db, "PRAGMA journal_mode = WAL", NULL, NULL, NULL) == SQLITE_OK);
    CHECK(sqlite3_exec(db, schema_v1, NULL, NULL, NULL) == SQLITE_OK);
    sqlite3_close(db);

    store *s = store_open(dir, err);
    CHECK_MSG(s, "%s", err);
    int tokens = 0;
    CHECK_MSG(store_context_turns(s, "old-ctx", count_turns, &tokens, err) == 0, "%s", err);
    CHECK_EQ(tokens, 2);
    blob b;
    make_blob(&b, 100);
    CHECK_MSG(write_blob(s, "old-ctx", 0, &b, 0, err) == 0, "%s", err);
    CHECK_EQ(read_compare(s, "old-ctx", 0, &b, err), 1);
    const double v = 3.0;
    CHECK_MSG(store_setting_put(s, "k", &v, 1, err) == 0, "%s", err);
    bool found;
    /* a context from before the registry has no model until one is recorded */
    const char *model = "unset";
    CHECK_MSG(store_context_get(s, "old-ctx", get_model, &model, &found, err) == 0 && found,
              "%s", err);
    CHECK(model == NULL);
    CHECK_MSG(store_context_set_model(s, "old-ctx", "qwen", err) == 0, "%s", err);
    char got[16] = "";
    CHECK(store_context_get(s, "old-ctx", copy_model, got, &found, err) == 0 && found);
    CHECK(strcmp(got, "qwen") == 0);
    CHECK(store_context_set_model(s, "no-ctx", "qwen", err) < 0);
    CHECK_MSG(store_context_delete(s, "old-ctx", &found, err) == 0 && found, "%s", err);
    CHECK(!store_chunk_open(s, "old-ctx", 0, &found, err) && !found);
    store_close(s);
    blob_free(&b);

    CHECK(sqlite3_open(path, &db) == SQLITE_OK);
    sqlite3_stmt *st;
    CHECK(sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, NULL) == SQLITE_OK);
    CHECK(sqlite3_step(st) == SQLITE_ROW);
    int version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    sqlite3_close(db);
    CHECK_EQ(version, store_schema_version()); /* every migration, from version 1 */
}

static int get_window(void *arg, const store_context *c)
{
    *(store_window *)arg = c->window;
    return 0;
}

/* A turn that moves the window commits with the window and the end of the chunks. */
static void append_window_drops_chunks(void)
{
    char err[ERR_MAX] = "";
    store *s = open_with_contexts("window", err);
    CHECK_MSG(s, "%s", err);
    blob b;
    make_blob(&b, 100);
    for (int i = 0; i < 4; i++)
        CHECK_MSG(write_blob(s, "c1", i, &b, 0, err) == 0, "%s", err);
    CHECK_MSG(write_blob(s, "c2", 3, &b, 0, err) == 0, "%s", err);
    store_window w = {.overflow = 1}, got = {0};
    bool found;
    CHECK_MSG(store_context_set_window(s, "c1", &w, err) == 0, "%s", err);
    CHECK(store_context_get(s, "c1", get_window, &got, &found, err) == 0 && found);
    CHECK(got.overflow == 1 && got.sink == 0 && got.dropped == 0 && got.slides == 0);
    CHECK(store_context_set_window(s, "nope", &w, err) == -1);
    store_window bad = {.sink = -1};
    CHECK(store_context_set_window(s, "c1", &bad, err) == -1);

    int32_t tok[3] = {5, 6, 7};
    store_turn t = {"user", "hi", tok, 3};
    w = (store_window){.overflow = 1, .sink = 16, .dropped = 40, .slides = 2};
    CHECK_MSG(store_context_append_window(s, "c1", &t, 1, &w, 1, 5, err) == 0, "%s", err);
    CHECK(store_context_get(s, "c1", get_window, &got, &found, err) == 0 && found);
    CHECK(got.overflow == 1 && got.sink == 16 && got.dropped == 40 && got.slides == 2);
    char names[1024];
    CHECK_EQ(list_files(s, "c1", names, sizeof names), 1);
    store_chunk_reader *r = store_chunk_open(s, "c1", 0, &found, err);
    CHECK(r && found);
    store_chunk_close(r);
    CHECK(!store_chunk_open(s, "c1", 1, &found, err) && !found);
    CHECK_EQ(list_files(s, "c2", names, sizeof names), 1);
    /* A failed append (bad window) changes nothing: no turn, no window, no chunk. */
    bad = (store_window){.dropped = -3};
    CHECK(store_context_append_window(s, "c2", &t, 1, &bad, 0, 6, err) == -1);
    CHECK_EQ(list_files(s, "c2", names, sizeof names), 1);
    store_close(s);
    blob_free(&b);
}

int main(void)
{
    RUN(round_trip);
    RUN(append_window_drops_chunks);
    RUN(bad_writes_are_refused);
    RUN(replace_makes_a_new_generation);
    RUN(list_touch_delete);
    RUN(cache_share_and_deferred_open);
    RUN(context_delete_removes_files);
    RUN(corruption_is_detected);
    RUN(gc_removes_orphans_only);
    RUN(batch_round_trip);
    RUN(batch_replaces_some);
    RUN(failed_batch_changes_nothing);
    RUN(empty_batch);
    RUN(context_stats);
    RUN(reader_on_another_thread);
    RUN(settings);
    RUN(migrates_from_version_1);
    return test_finish();
}
