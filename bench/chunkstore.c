/*
 * bench/chunkstore — speed of the chunk blob store (storage/chunks.h) on this disk.
 *
 *   build/bench/chunkstore [--dir DIR] [--chunks N] [--sections N] [--section-kib N]
 *                          [--batch N] [--runs N]
 *
 * Chunk-sized blobs (by default 30 sections of 40 KiB, one per layer) of int8-like data
 * (per-32 groups of a 2-byte scale and 32 roughly Gaussian int8 values, like quantized
 * KV) are:
 *   - compressed in memory with zstd at levels 1 and 3 (and -1): MB/s and ratio, to
 *     choose the store's level;
 *   - written through store_chunk_write (compress, write, fsync, rename, fsync dir,
 *     commit), one chunk a call, then through store_chunk_write_batch, --batch chunks
 *     (default 64) a call: MB/s of raw bytes and ms per chunk;
 *   - read back through store_chunk_open / read_section, cold (page cache dropped with
 *     store_chunk_drop_cache, and checked with mincore) and warm;
 *   - and, apart from chunks: a RagQuery's cache transaction of one 6 MiB QKV node (512
 *     tokens of the documentation model's KV), ms on the committing thread with the
 *     store's checkpoint thread and with SQLite's checkpoint in the commit
 *     (bench_cache_commit).
 * Prints one JSON object per measurement (the median of --runs). The state directory
 * (default build/bench-chunkstore, on the same disk as the build) is removed at the end.
 */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include "bench/bench.h"
#include "storage/chunks.h"
#include "storage/kb.h"
#include "storage/store.h"
/* store_exec_sql, to put SQLite's own checkpoint back for the baseline */
#include "storage/store_internal.h"

#define MAX_RUNS 15

typedef struct options {
    const char *dir;
    int n_chunks;
    int n_sections;
    size_t section_bytes;
    int batch;
    int n_runs;
} options;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double uniform(void)
{
    return bench_uniform(&rng_state);
}

/* Groups of a 2-byte scale (an f16 of similar magnitude each time) and 32 int8 values,
 * Gaussian with a per-group spread, as a quantizer leaves them. */
static void fill_int8_like(uint8_t *p, size_t n)
{
    size_t i = 0;
    while (i < n) {
        double sigma = 25.0 + 20.0 * uniform();
        if (i + 2 <= n) {
            p[i++] = (uint8_t)(uniform() * 256);
            p[i++] = (uint8_t)(0x20 + (int)(uniform() * 4));
        }
        for (int k = 0; k < 32 && i < n; k++) {
            double g = bench_gauss(&rng_state);
            long v = lround(g * sigma);
            p[i++] = (uint8_t)(int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
        }
    }
}

static int parse_options(int argc, char **argv, options *o)
{
    *o = (options){.dir = "build/bench-chunkstore", .n_chunks = 64, .n_sections = 30,
                   .section_bytes = 40 * 1024, .batch = 64, .n_runs = 3};
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            return -1;
        if (strcmp(argv[i], "--dir") == 0)
            o->dir = v;
        else if (strcmp(argv[i], "--chunks") == 0)
            o->n_chunks = atoi(v);
        else if (strcmp(argv[i], "--sections") == 0)
            o->n_sections = atoi(v);
        else if (strcmp(argv[i], "--section-kib") == 0)
            o->section_bytes = (size_t)atoi(v) * 1024;
        else if (strcmp(argv[i], "--batch") == 0)
            o->batch = atoi(v);
        else if (strcmp(argv[i], "--runs") == 0)
            o->n_runs = atoi(v);
        else
            return -1;
        i++;
    }
    if (o->n_chunks < 1 || o->n_sections < 1 || o->n_sections > STORE_CHUNK_MAX_SECTIONS ||
        o->section_bytes < 1 || o->batch < 1 || o->n_runs < 1 || o->n_runs > MAX_RUNS)
        return -1;
    return 0;
}

/* In-memory zstd speed at one level over all sections of one chunk. */
static void bench_level(const options *o, uint8_t *const *sections, int level)
{
    size_t bound = ZSTD_compressBound(o->section_bytes);
    uint8_t *z = malloc(bound * (size_t)o->n_sections);
    uint8_t *back = malloc(o->section_bytes);
    size_t *zbytes = malloc((size_t)o->n_sections * sizeof *zbytes);
    ZSTD_CCtx *cc = ZSTD_createCCtx();
    ZSTD_DCtx *dc = ZSTD_createDCtx();
    ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, level);
    ZSTD_CCtx_setParameter(cc, ZSTD_c_checksumFlag, 1);
    double ct[MAX_RUNS], dt[MAX_RUNS];
    size_t total_z = 0;
    int reps = 5;
    for (int run = 0; run < o->n_runs; run++) {
        double t0 = bench_now_s();
        for (int r = 0; r < reps; r++) {
            total_z = 0;
            for (int i = 0; i < o->n_sections; i++) {
                zbytes[i] = ZSTD_compress2(cc, z + bound * (size_t)i, bound, sections[i],
                                           o->section_bytes);
                total_z += zbytes[i];
            }
        }
        double t1 = bench_now_s();
        for (int r = 0; r < reps; r++)
            for (int i = 0; i < o->n_sections; i++)
                ZSTD_decompressDCtx(dc, back, o->section_bytes, z + bound * (size_t)i,
                                    zbytes[i]);
        double t2 = bench_now_s();
        ct[run] = t1 - t0;
        dt[run] = t2 - t1;
    }
    double mb = (double)o->section_bytes * o->n_sections * reps / 1e6;
    printf("{\"bench\":\"chunkstore_zstd\",\"level\":%d,\"data\":\"int8_like\","
           "\"compress_mb_s\":%.0f,\"decompress_mb_s\":%.0f,\"ratio\":%.3f}\n",
           level, mb / bench_median(ct, o->n_runs), mb / bench_median(dt, o->n_runs),
           (double)o->section_bytes * o->n_sections / (double)total_z);
    ZSTD_freeCCtx(cc);
    ZSTD_freeDCtx(dc);
    free(z);
    free(back);
    free(zbytes);
}

/* Fraction of the pages of chunk index that are in the page cache. */
static double resident_fraction(store *s, const char *ctx, int index)
{
    char path[4096];
    bool found;
    char err[ERR_MAX];
    store_chunk_reader *r = store_chunk_open(s, ctx, index, &found, err);
    if (!r)
        return -1;
    int64_t file_bytes = store_chunk_reader_meta(r)->file_bytes;
    store_chunk_close(r);
    snprintf(path, sizeof path, "%s/chunks/%s/%d.1.chunk", store_dir(s), ctx, index);
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return -1;
    void *m = mmap(NULL, (size_t)file_bytes, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return -1;
    long page = sysconf(_SC_PAGESIZE);
    size_t pages = ((size_t)file_bytes + (size_t)page - 1) / (size_t)page;
    unsigned char *vec = malloc(pages);
    double frac = -1;
    if (vec && mincore(m, (size_t)file_bytes, vec) == 0) {
        size_t in = 0;
        for (size_t i = 0; i < pages; i++)
            in += vec[i] & 1;
        frac = (double)in / (double)pages;
    }
    free(vec);
    munmap(m, (size_t)file_bytes);
    return frac;
}

/* Opens and reads every section of every chunk; returns seconds or -1. */
static double read_all(store *s, const char *ctx, const options *o, uint8_t *dst,
                       int64_t *file_bytes)
{
    char err[ERR_MAX];
    *file_bytes = 0;
    double t0 = bench_now_s();
    for (int c = 0; c < o->n_chunks; c++) {
        bool found;
        store_chunk_reader *r = store_chunk_open(s, ctx, c, &found, err);
        if (!r) {
            fprintf(stderr, "chunkstore: %s\n", found ? err : "chunk missing");
            return -1;
        }
        for (int i = 0; i < o->n_sections; i++) {
            if (store_chunk_read_section(r, i, dst, o->section_bytes, err) != 0) {
                fprintf(stderr, "chunkstore: %s\n", err);
                store_chunk_close(r);
                return -1;
            }
        }
        *file_bytes += store_chunk_reader_bytes_read(r);
        store_chunk_close(r);
    }
    return bench_now_s() - t0;
}

/* Writes chunks 0 .. n_chunks - 1 of ctx, one a call (batch 1) or batch a call, into
 * an empty context; returns seconds (-1 on failure) and the files' total size. */
static double write_chunks(store *s, const char *ctx, const options *o, int batch,
                        uint8_t *const *sections, const size_t *sizes, int64_t *file_total)
{
    char err[ERR_MAX];
    /* Each run starts empty so every write has the same work (generation 1). */
    if (store_chunk_delete_from(s, ctx, 0, err) != 0) {
        fprintf(stderr, "chunkstore: %s\n", err);
        return -1;
    }
    store_chunk_blob *chunks = malloc((size_t)batch * sizeof *chunks);
    *file_total = 0;
    double t0 = bench_now_s();
    for (int first = 0; first < o->n_chunks; first += batch) {
        int n = o->n_chunks - first < batch ? o->n_chunks - first : batch;
        for (int k = 0; k < n; k++)
            chunks[k] = (store_chunk_blob){.meta = {.index = first + k, .n_tokens = 16},
                                           .sections = (const void *const *)sections,
                                           .section_bytes = sizes,
                                           .n_sections = o->n_sections};
        int rc = batch == 1 ? store_chunk_write(s, ctx, &chunks[0].meta, chunks[0].sections,
                                                sizes, o->n_sections, err)
                            : store_chunk_write_batch(s, ctx, chunks, n, err);
        if (rc != 0) {
            fprintf(stderr, "chunkstore: %s\n", err);
            free(chunks);
            return -1;
        }
        for (int k = 0; k < n; k++)
            *file_total += chunks[k].meta.file_bytes;
    }
    double t = bench_now_s() - t0;
    free(chunks);
    return t;
}

static int bench_store(const options *o, uint8_t *const *sections)
{
    char err[ERR_MAX];
    store *s = store_open(o->dir, err);
    int64_t app;
    const char *ctx = "bench";
    bool found;
    if (!s || store_app_id(s, 0, "bench", &app, err) != 0 ||
        store_context_delete(s, ctx, &found, err) != 0 ||
        store_context_create(s, ctx, app, NULL, NULL, 0, 0, err) != 0) {
        fprintf(stderr, "chunkstore: %s\n", err);
        store_close(s);
        return -1;
    }
    size_t *sizes = malloc((size_t)o->n_sections * sizeof *sizes);
    uint8_t *dst = malloc(o->section_bytes);
    for (int i = 0; i < o->n_sections; i++)
        sizes[i] = o->section_bytes;
    double wt[MAX_RUNS], bt[MAX_RUNS], cold[MAX_RUNS], warm[MAX_RUNS], resident = -1;
    int64_t file_total = 0, read_bytes = 0;
    int rc = 0;
    for (int run = 0; run < o->n_runs && rc == 0; run++) {
        wt[run] = write_chunks(s, ctx, o, 1, sections, sizes, &file_total);
        bt[run] = write_chunks(s, ctx, o, o->batch, sections, sizes, &file_total);
        if (wt[run] < 0 || bt[run] < 0)
            rc = -1;
        if (rc != 0 || store_chunk_drop_cache(s, ctx, err) != 0) {
            if (rc == 0)
                fprintf(stderr, "chunkstore: %s\n", err);
            rc = -1;
            break;
        }
        resident = resident_fraction(s, ctx, 0);
        cold[run] = read_all(s, ctx, o, dst, &read_bytes);
        warm[run] = read_all(s, ctx, o, dst, &read_bytes);
        if (cold[run] < 0 || warm[run] < 0)
            rc = -1;
    }
    if (rc == 0) {
        double raw_mb = (double)o->section_bytes * o->n_sections * o->n_chunks / 1e6;
        double file_mb = (double)file_total / 1e6;
        double w = bench_median(wt, o->n_runs), b = bench_median(bt, o->n_runs),
               c = bench_median(cold, o->n_runs), h = bench_median(warm, o->n_runs);
        printf("{\"bench\":\"chunkstore_write\",\"chunks\":%d,\"sections\":%d,"
               "\"section_bytes\":%zu,\"raw_mb_s\":%.0f,\"file_mb_s\":%.0f,"
               "\"ms_per_chunk\":%.2f,\"ratio\":%.3f}\n",
               o->n_chunks, o->n_sections, o->section_bytes, raw_mb / w, file_mb / w,
               1e3 * w / o->n_chunks, raw_mb / file_mb);
        printf("{\"bench\":\"chunkstore_write_batch\",\"chunks\":%d,\"batch\":%d,"
               "\"raw_mb_s\":%.0f,\"file_mb_s\":%.0f,\"ms_per_chunk\":%.2f}\n",
               o->n_chunks, o->batch, raw_mb / b, file_mb / b, 1e3 * b / o->n_chunks);
        printf("{\"bench\":\"chunkstore_read_cold\",\"chunks\":%d,\"raw_mb_s\":%.0f,"
               "\"file_mb_s\":%.0f,\"ms_per_chunk\":%.2f,\"resident_after_drop\":%.2f}\n",
               o->n_chunks, raw_mb / c, (double)read_bytes / 1e6 / c, 1e3 * c / o->n_chunks,
               resident);
        printf("{\"bench\":\"chunkstore_read_warm\",\"chunks\":%d,\"raw_mb_s\":%.0f,"
               "\"file_mb_s\":%.0f,\"ms_per_chunk\":%.2f}\n",
               o->n_chunks, raw_mb / h, (double)read_bytes / 1e6 / h, 1e3 * h / o->n_chunks);
    }
    if (store_context_delete(s, ctx, &found, err) != 0)
        fprintf(stderr, "chunkstore: %s\n", err);
    store_close(s);
    free(sizes);
    free(dst);
    return rc;
}

static void remove_state(const char *dir);

/* Cache transactions of one QKV node each (store_cache_begin, store_qkv_put,
 * store_cache_commit), as a RagQuery's rag_populate makes them on the scheduler thread:
 * ms on the committing thread with the store's checkpoint thread, and with SQLite's own
 * checkpoint in the commit that passes 1000 pages of log (its default, put back with
 * PRAGMA wal_autocheckpoint), 200 ms apart. A fresh store each time, the two
 * alternating. */
static int bench_cache_commit(const options *o, size_t node_bytes)
{
    /* a generation's time between two answers' transactions */
    enum { TRANSACTIONS = 8, GAP_MS = 200 };
    uint8_t *node = malloc(node_bytes);
    double own[MAX_RUNS * TRANSACTIONS], inline_ms[MAX_RUNS * TRANSACTIONS];
    int32_t prefix[512];
    char err[ERR_MAX];
    int rc = -1, n = 0;
    if (!node)
        return -1;
    fill_int8_like(node, node_bytes);
    for (int i = 0; i < 512; i++)
        prefix[i] = i;
    for (int run = 0; run < o->n_runs; run++)
        for (int variant = 0; variant < 2; variant++) {
            remove_state(o->dir);
            store *s = store_open(o->dir, err);
            if (!s || (variant == 1 && store_exec_sql(s, "PRAGMA wal_autocheckpoint = 1000",
                                                      err))) {
                fprintf(stderr, "chunkstore: %s\n", err);
                store_close(s);
                goto out;
            }
            for (int t = 0; t < TRANSACTIONS; t++) {
                uint8_t key[STORE_QKV_KEY_BYTES] = {(uint8_t)t, (uint8_t)run};
                store_owner owner = {1000, "bench"};
                double t0 = bench_now_s();
                if (store_cache_begin(s, err) ||
                    store_qkv_put(s, key, NULL, &owner, prefix, 512, 512, node, node_bytes,
                                  false, 1, err) ||
                    store_cache_commit(s, err)) {
                    fprintf(stderr, "chunkstore: %s\n", err);
                    store_close(s);
                    goto out;
                }
                (variant == 0 ? own : inline_ms)[n + t] = 1e3 * (bench_now_s() - t0);
                usleep(GAP_MS * 1000);
            }
            store_close(s);
            if (variant == 1)
                n += TRANSACTIONS;
        }
    double own_med = bench_median(own, n), inline_med = bench_median(inline_ms, n);
    printf("{\"bench\":\"cache_commit\",\"node_bytes\":%zu,\"transactions\":%d,\"gap_ms\":%d,"
           "\"ms_checkpoint_thread\":%.2f,\"ms_checkpoint_in_commit\":%.2f,"
           "\"p90_ms_checkpoint_thread\":%.2f,\"p90_ms_checkpoint_in_commit\":%.2f,"
           "\"speedup\":%.2f}\n",
           node_bytes, n, GAP_MS, own_med, inline_med, bench_percentile(own, n, 0.9),
           bench_percentile(inline_ms, n, 0.9), inline_med / own_med);
    rc = 0;
out:
    free(node);
    return rc;
}

/* Removes the state directory the benchmark made (its database files and chunks/). */
static void remove_state(const char *dir)
{
    const char *files[] = {"llmsd.db", "llmsd.db-wal", "llmsd.db-shm"};
    char path[4096];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/chunks", dir);
    rmdir(path);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    options o;
    if (parse_options(argc, argv, &o) != 0) {
        fprintf(stderr, "usage: chunkstore [--dir DIR] [--chunks N] [--sections N] "
                        "[--section-kib N] [--batch N] [--runs N (<= %d)]\n", MAX_RUNS);
        return 2;
    }
    uint8_t **sections = malloc((size_t)o.n_sections * sizeof *sections);
    for (int i = 0; i < o.n_sections; i++) {
        sections[i] = malloc(o.section_bytes);
        fill_int8_like(sections[i], o.section_bytes);
    }
    const int levels[] = {-1, 1, 3};
    for (int i = 0; i < 3; i++)
        bench_level(&o, sections, levels[i]);
    int rc = bench_store(&o, sections);
    remove_state(o.dir);
    /* 512 tokens of the documentation model's KV (12 KiB a token) */
    if (rc == 0)
        rc = bench_cache_commit(&o, (size_t)512 * 12 * 1024);
    remove_state(o.dir);
    for (int i = 0; i < o.n_sections; i++)
        free(sections[i]);
    free(sections);
    return rc == 0 ? 0 : 1;
}
