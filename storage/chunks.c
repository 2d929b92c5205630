/*
 * chunks.c — chunk blob files and their catalog rows (see chunks.h).
 *
 * A chunk lives in <dir>/chunks/<context dir>/<index>.<generation>.chunk, where the
 * context dir is the context id with every byte outside [A-Za-z0-9_-] written as %XX,
 * and the generation grows by one with each rewrite so that a new version never
 * overwrites the file the committed row names. The file is (all integers little-endian):
 *
 *   "LLMSCHNK"  u32 version  u32 n_sections
 *   n_sections x { u64 raw_bytes  u64 stored_bytes  u32 crc32c of stored bytes  u32 codec }
 *   u32 crc32c of everything above
 *   the sections' stored bytes, back to back
 *
 * A section is stored as one zstd frame (codec 1), or as is (codec 0) when zstd saves
 * less than an eighth: quantized KV is close to random, and decompressing ~10% away
 * costs more time than reading those bytes (bench/chunkstore). A zstd frame also
 * carries zstd's checksum of the uncompressed bytes, so it is checked both as stored
 * (CRC-32C, before decompressing) and as decoded.
 */
#include "storage/chunks.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <zstd.h>

#include "storage/crc32c.h"
#include "storage/store_internal.h"

/* Level 3 compresses int8-like data no better than level 1 and more slowly
 * (bench/chunkstore measures both); chunks are written after every call. */
#define CHUNK_ZSTD_LEVEL 1

enum chunk_codec { CODEC_RAW = 0, CODEC_ZSTD = 1 };

#define CHUNK_MAGIC "LLMSCHNK"
#define CHUNK_VERSION 1u
#define CHUNK_HEAD_FIXED 16  /* magic, version, n_sections */
#define CHUNK_HEAD_ENTRY 24  /* raw, stored, crc, codec */
#define CHUNK_DIR "chunks"
#define CHUNK_SUFFIX ".chunk"
#define CHUNK_TMP_SUFFIX ".chunk.tmp"

enum chunk_stmt {
    CS_CTX_EXISTS,
    CS_GET,
    CS_PUT,
    CS_TOUCH,
    CS_LIST,
    CS_FILES,
    CS_DELETE_FROM,
    CS_BEGIN,
    CS_COMMIT,
    CS_ROLLBACK,
    CS_COUNT
};

#define CHUNK_COLUMNS                                                                      \
    "SELECT idx, precision, n_tokens, n_sections, raw_bytes, file_bytes, density,"       \
    " last_used_ms, generation FROM chunks "

static const char *const chunk_sql[CS_COUNT] = {
    [CS_CTX_EXISTS] = "SELECT 1 FROM contexts WHERE id = ?",
    [CS_GET] = CHUNK_COLUMNS "WHERE context_id = ? AND idx = ?",
    [CS_PUT] = "INSERT OR REPLACE INTO chunks (context_id, idx, precision, n_tokens,"
               " n_sections, raw_bytes, file_bytes, generation, density, last_used_ms)"
               " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
    [CS_TOUCH] = "UPDATE chunks SET density = ?, last_used_ms = ?"
                 " WHERE context_id = ? AND idx = ?",
    [CS_LIST] = CHUNK_COLUMNS "WHERE context_id = ? ORDER BY idx",
    /* A statement of its own so that a store_chunk_list callback may delete chunks. */
    [CS_FILES] = "SELECT idx, generation FROM chunks WHERE context_id = ? AND idx >= ?"
                 " ORDER BY idx",
    [CS_DELETE_FROM] = "DELETE FROM chunks WHERE context_id = ? AND idx >= ?",
    [CS_BEGIN] = "BEGIN IMMEDIATE",
    [CS_COMMIT] = "COMMIT",
    [CS_ROLLBACK] = "ROLLBACK",
};

struct store_chunk_encoder {
    ZSTD_CCtx *cctx;
    uint8_t *buf;       /* header and compressed sections of the chunk being written */
    size_t buf_cap;
};

struct store_chunks {
    sqlite3_stmt *st[CS_COUNT];
    store_chunk_encoder enc; /* for the batches written on the store's thread */
};

/* One chunk of a batch while it is written. */
typedef struct batch_item {
    int64_t gen;        /* the generation being written; gen - 1 is stored when had */
    bool had;
    int fd;             /* its temporary file while open, else -1 */
    enum { ITEM_NOTHING, ITEM_TMP, ITEM_RENAMED } stage; /* which of its files exists */
    int64_t raw_bytes;
    int64_t file_bytes;
} batch_item;

struct store_chunk_batch {
    char *ctx_id;
    char root[PATH_MAX];         /* the store's directory */
    char top[PATH_MAX];          /* <root>/chunks */
    char dir[PATH_MAX];          /* the context's chunk directory */
    store_chunk_blob *chunks;    /* (n_chunks) the caller's */
    batch_item *items;           /* (n_chunks) */
    int n_chunks;
    bool written;                /* store_chunk_batch_write succeeded */
    bool has_ctx_stats;          /* store_chunk_batch_set_context_stats was called */
    void *ctx_stats;             /* (ctx_stats_bytes) its copy */
    size_t ctx_stats_bytes;
};

struct store_chunk_reader {
    int fd;
    store_chunk meta;
    char ctx_id[48];    /* for error messages (truncated) */
    int n_sections;
    uint64_t *raw;      /* (n_sections) uncompressed bytes */
    uint64_t *comp;     /* (n_sections) stored bytes */
    uint32_t *codec;    /* (n_sections) enum chunk_codec */
    uint64_t *offset;   /* (n_sections) file offset of each frame */
    uint32_t *crc;      /* (n_sections) CRC-32C of the stored bytes */
    uint8_t *scratch;   /* (largest compressed section) one zstd frame */
    ZSTD_DCtx *dctx;
    int64_t bytes_read;
    double cached;      /* share of the file's pages in the page cache when opened, -1:
                           unknown */
    char *path;         /* for error messages once the header is read */
};

/* Formats "store: context 'id' chunk i: <what>" into err. */
__attribute__((format(printf, 4, 5))) static int chunk_fail(char *err, const char *ctx_id,
                                                            int index, const char *fmt, ...)
{
    char what[ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return err_set(err, "store: context '%.40s' chunk %d: %s", ctx_id, index, what);
}

static int db_fail(store *s, char *err, const char *ctx_id, const char *what)
{
    char msg[ERR_MAX];
    return err_set(err, "store: context '%.40s' chunks: %s: %s", ctx_id ? ctx_id : "",
                   what, store_db_message(store_sqlite(s), msg, sizeof msg));
}

void store_chunks_free(store_chunks *c)
{
    if (!c)
        return;
    for (int i = 0; i < CS_COUNT; i++)
        sqlite3_finalize(c->st[i]);
    ZSTD_freeCCtx(c->enc.cctx);
    free(c->enc.buf);
    free(c);
}

/* Sets up an encoder's compressor; -1 + err when zstd cannot make it. */
static int encoder_init(store_chunk_encoder *e, char *err)
{
    if (!(e->cctx = ZSTD_createCCtx()))
        return err_set(err, "store: out of memory for the chunk compressor");
    if (ZSTD_isError(ZSTD_CCtx_setParameter(e->cctx, ZSTD_c_compressionLevel,
                                            CHUNK_ZSTD_LEVEL)) ||
        ZSTD_isError(ZSTD_CCtx_setParameter(e->cctx, ZSTD_c_checksumFlag, 1)))
        return err_set(err, "store: zstd refuses the chunk compression parameters");
    return 0;
}

store_chunk_encoder *store_chunk_encoder_new(char err[ERR_MAX])
{
    store_chunk_encoder *e = calloc(1, sizeof *e);
    if (!e) {
        err_set(err, "store: out of memory for a chunk encoder");
        return NULL;
    }
    if (encoder_init(e, err) != 0) {
        store_chunk_encoder_free(e);
        return NULL;
    }
    return e;
}

void store_chunk_encoder_free(store_chunk_encoder *e)
{
    if (!e)
        return;
    ZSTD_freeCCtx(e->cctx);
    free(e->buf);
    free(e);
}

/* chunks.c's state of s, created on first use. */
static store_chunks *chunks_state(store *s, char *err)
{
    store_chunks **slot = store_chunks_slot(s);
    if (*slot)
        return *slot;
    store_chunks *c = calloc(1, sizeof *c);
    if (!c) {
        err_set(err, "store: out of memory for the chunk store");
        return NULL;
    }
    if (encoder_init(&c->enc, err) != 0) {
        store_chunks_free(c);
        return NULL;
    }
    for (int i = 0; i < CS_COUNT; i++) {
        if (sqlite3_prepare_v3(store_sqlite(s), chunk_sql[i], -1, SQLITE_PREPARE_PERSISTENT,
                               &c->st[i], NULL) != SQLITE_OK) {
            char msg[ERR_MAX];
            err_set(err, "store: preparing '%s': %s", chunk_sql[i],
                    store_db_message(store_sqlite(s), msg, sizeof msg));
            store_chunks_free(c);
            return NULL;
        }
    }
    *slot = c;
    return c;
}

/* A chunk statement, reset and unbound; NULL (err set) when the state cannot be made. */
static sqlite3_stmt *chunk_stmt(store *s, enum chunk_stmt which, char *err)
{
    store_chunks *c = chunks_state(s, err);
    if (!c)
        return NULL;
    sqlite3_reset(c->st[which]);
    sqlite3_clear_bindings(c->st[which]);
    return c->st[which];
}

/* ---- names ---- */

static bool plain_byte(unsigned char b)
{
    return (b >= 'a' && b <= 'z') || (b >= 'A' && b <= 'Z') || (b >= '0' && b <= '9') ||
           b == '_' || b == '-';
}

/* The directory name of a context: its id, bytes outside [A-Za-z0-9_-] as %XX. */
static int ctx_dir_name(const char *ctx_id, char *out, size_t cap)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)ctx_id; *p; p++) {
        if (n + 4 > cap || n + 4 > NAME_MAX)
            return -1;
        if (plain_byte(*p)) {
            out[n++] = (char)*p;
        } else {
            out[n++] = '%';
            out[n++] = hex[*p >> 4];
            out[n++] = hex[*p & 15];
        }
    }
    out[n] = '\0';
    return n > 0 ? 0 : -1;
}

static int hex_value(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* The context id a directory name stands for; -1 when it is not one ctx_dir_name makes. */
static int ctx_id_of_dir(const char *name, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = name; *p; n++) {
        if (n + 1 >= cap)
            return -1;
        if (plain_byte((unsigned char)*p)) {
            out[n] = *p++;
            continue;
        }
        int hi = *p == '%' ? hex_value(p[1]) : -1;
        int lo = hi >= 0 ? hex_value(p[2]) : -1;
        if (lo < 0 || plain_byte((unsigned char)(hi << 4 | lo)) || (hi << 4 | lo) == 0)
            return -1;
        out[n] = (char)(hi << 4 | lo);
        p += 3;
    }
    out[n] = '\0';
    return n > 0 ? 0 : -1;
}

static int ctx_dir_path(store *s, const char *ctx_id, char *out, size_t cap, char *err)
{
    char name[NAME_MAX + 1];
    if (ctx_dir_name(ctx_id, name, sizeof name) != 0)
        return err_set(err, "store: context id '%.40s' is empty or too long for a chunk "
                       "directory", ctx_id);
    if ((size_t)snprintf(out, cap, "%s/" CHUNK_DIR "/%s", store_dir(s), name) >= cap)
        return err_set(err, "store: chunk directory path of context '%.40s' too long", ctx_id);
    return 0;
}

/* The path of a chunk file in the context directory dir. */
static int chunk_file_path(const char *dir, const char *ctx_id, int index, int64_t generation,
                           const char *suffix, char *out, size_t cap, char *err)
{
    if ((size_t)snprintf(out, cap, "%s/%d.%" PRId64 "%s", dir, index, generation, suffix) >=
        cap)
        return err_set(err, "store: chunk path of context '%.40s' too long", ctx_id);
    return 0;
}

static int chunk_path(store *s, const char *ctx_id, int index, int64_t generation,
                      const char *suffix, char *out, size_t cap, char *err)
{
    char dir[PATH_MAX];
    if (ctx_dir_path(s, ctx_id, dir, sizeof dir, err) != 0)
        return -1;
    return chunk_file_path(dir, ctx_id, index, generation, suffix, out, cap, err);
}

/* Parses "<index>.<generation><suffix>" with canonical decimal numbers. */
static bool parse_chunk_name(const char *name, const char *suffix, int *index,
                             int64_t *generation)
{
    char *end;
    if (name[0] < '0' || name[0] > '9' || (name[0] == '0' && name[1] != '.'))
        return false;
    errno = 0;
    long i = strtol(name, &end, 10);
    if (errno || i > INT_MAX || *end != '.' || end[1] < '0' || end[1] > '9' ||
        (end[1] == '0' && end[2] >= '0' && end[2] <= '9'))
        return false;
    long long g = strtoll(end + 1, &end, 10);
    if (errno || strcmp(end, suffix) != 0)
        return false;
    *index = (int)i;
    *generation = g;
    return true;
}

/* ---- small file helpers ---- */

static int fsync_dir(const char *path, char *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return err_set(err, "store: opening directory %s: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0)
        return err_set(err, "store: fsync of directory %s: %s", path, strerror(e));
    return 0;
}

/* Creates dir (mode 0750) unless it exists; when it was created, makes its entry in
 * parent durable. */
static int make_dir(const char *dir, const char *parent, char *err)
{
    if (mkdir(dir, 0750) == 0)
        return fsync_dir(parent, err);
    if (errno != EEXIST)
        return err_set(err, "store: creating directory %s: %s", dir, strerror(errno));
    return 0;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads n bytes at off; returns the count read (short at end of file) or -1. */
static ssize_t pread_all(int fd, void *dst, size_t n, off_t off)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (uint8_t *)dst + got, n - got, off + (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | (uint64_t)get_u32(p + 4) << 32;
}

static size_t header_bytes(int n_sections)
{
    return CHUNK_HEAD_FIXED + (size_t)n_sections * CHUNK_HEAD_ENTRY + 4;
}

/* ---- catalog lookups ---- */

/* Fails with "no context" unless ctx_id exists. */
static int require_context(store *s, const char *ctx_id, char *err)
{
    sqlite3_stmt *st = chunk_stmt(s, CS_CTX_EXISTS, err);
    if (!st)
        return -1;
    if (sqlite3_bind_text(st, 1, ctx_id, -1, SQLITE_STATIC) != SQLITE_OK)
        return db_fail(s, err, ctx_id, "binding");
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    if (rc == SQLITE_DONE)
        return err_set(err, "store: chunks: no context '%.40s'", ctx_id);
    if (rc != SQLITE_ROW)
        return db_fail(s, err, ctx_id, "looking up context");
    return 0;
}

/* A chunk row (CHUNK_COLUMNS) as a store_chunk and its generation. */
static void read_row(sqlite3_stmt *st, store_chunk *c, int64_t *generation)
{
    *c = (store_chunk){
        .index = sqlite3_column_int(st, 0),
        .precision = sqlite3_column_int(st, 1),
        .n_tokens = sqlite3_column_int(st, 2),
        .n_sections = sqlite3_column_int(st, 3),
        .raw_bytes = sqlite3_column_int64(st, 4),
        .file_bytes = sqlite3_column_int64(st, 5),
        .density = (float)sqlite3_column_double(st, 6),
        .last_used_ms = sqlite3_column_int64(st, 7),
    };
    *generation = sqlite3_column_int64(st, 8);
}

/* Looks chunk index of ctx_id up; *found false when there is no row. */
static int get_row(store *s, const char *ctx_id, int index, store_chunk *c,
                   int64_t *generation, bool *found, char *err)
{
    *found = false;
    sqlite3_stmt *st = chunk_stmt(s, CS_GET, err);
    if (!st)
        return -1;
    if (sqlite3_bind_text(st, 1, ctx_id, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int(st, 2, index) != SQLITE_OK)
        return db_fail(s, err, ctx_id, "binding");
    int rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        read_row(st, c, generation);
        *found = true;
    }
    sqlite3_reset(st);
    if (rc != SQLITE_ROW && rc != SQLITE_DONE)
        return db_fail(s, err, ctx_id, "looking up chunk");
    return 0;
}

static bool valid_id(const char *ctx_id)
{
    return ctx_id && ctx_id[0];
}

/* ---- writing ---- */

/* Compresses the sections behind room for the header into the state's buffer, then
 * fills the header in; *total gets the file size. */
static int encode_chunk(store_chunk_encoder *c, const char *ctx_id, int index,
                        const void *const *sections, const size_t *section_bytes,
                        int n_sections, size_t *total, int64_t *raw_total, char *err)
{
    size_t head = header_bytes(n_sections);
    size_t cap = head;
    for (int i = 0; i < n_sections; i++) {
        size_t bound = ZSTD_compressBound(section_bytes[i]);
        if (ZSTD_isError(bound) || bound > SIZE_MAX / 2 - cap)
            return chunk_fail(err, ctx_id, index, "section %d too large (%zu bytes)", i,
                              section_bytes[i]);
        cap += bound;
    }
    if (cap > c->buf_cap) {
        uint8_t *b = realloc(c->buf, cap);
        if (!b)
            return chunk_fail(err, ctx_id, index, "out of memory for %zu bytes", cap);
        c->buf = b;
        c->buf_cap = cap;
    }
    uint8_t *h = c->buf;
    memcpy(h, CHUNK_MAGIC, 8);
    put_u32(h + 8, CHUNK_VERSION);
    put_u32(h + 12, (uint32_t)n_sections);
    size_t at = head;
    *raw_total = 0;
    for (int i = 0; i < n_sections; i++) {
        size_t raw = section_bytes[i], z = 0;
        enum chunk_codec codec = CODEC_RAW;
        if (raw > 0) {
            z = ZSTD_compress2(c->cctx, c->buf + at, cap - at, sections[i], raw);
            if (ZSTD_isError(z))
                return chunk_fail(err, ctx_id, index, "compressing section %d: %s", i,
                                  ZSTD_getErrorName(z));
            if (z < raw - raw / 8) {
                codec = CODEC_ZSTD;
            } else {
                memcpy(c->buf + at, sections[i], raw);
                z = raw;
            }
        }
        uint8_t *e = h + CHUNK_HEAD_FIXED + (size_t)i * CHUNK_HEAD_ENTRY;
        put_u64(e, raw);
        put_u64(e + 8, z);
        put_u32(e + 16, crc32c(0, c->buf + at, z));
        put_u32(e + 20, codec);
        at += z;
        *raw_total += (int64_t)section_bytes[i];
    }
    put_u32(h + head - 4, crc32c(0, h, head - 4));
    *total = at;
    return 0;
}

/* Files a batch writes before it waits for any of them: the disk works on many files
 * at once, and the open descriptors stay bounded. */
#define BATCH_WINDOW 64

static int compare_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Refuses a batch with bad arguments before anything is written. */
static int check_batch(const char *ctx_id, const store_chunk_blob *chunks, int n_chunks,
                       char *err)
{
    if (!valid_id(ctx_id))
        return err_set(err, "store: write chunks: empty context id");
    if (n_chunks < 0 || (n_chunks > 0 && !chunks))
        return err_set(err, "store: write chunks of context '%.40s': bad chunk count %d",
                       ctx_id, n_chunks);
    for (int k = 0; k < n_chunks; k++) {
        const store_chunk_blob *b = &chunks[k];
        int index = b->meta.index;
        if (index < 0)
            return err_set(err, "store: write chunks of context '%.40s': chunk %d of the "
                           "batch has index %d", ctx_id, k, index);
        if (b->n_sections < 0 || b->n_sections > STORE_CHUNK_MAX_SECTIONS ||
            (b->n_sections > 0 && (!b->sections || !b->section_bytes)))
            return chunk_fail(err, ctx_id, index, "bad section count %d", b->n_sections);
        for (int i = 0; i < b->n_sections; i++)
            if (b->section_bytes[i] > 0 && !b->sections[i])
                return chunk_fail(err, ctx_id, index, "section %d has %zu bytes and no data",
                                  i, b->section_bytes[i]);
    }
    if (n_chunks < 2)
        return 0;
    int *sorted = malloc((size_t)n_chunks * sizeof *sorted);
    if (!sorted)
        return err_set(err, "store: out of memory for a batch of %d chunks", n_chunks);
    for (int k = 0; k < n_chunks; k++)
        sorted[k] = chunks[k].meta.index;
    qsort(sorted, (size_t)n_chunks, sizeof *sorted, compare_int);
    int twice = -1;
    for (int k = 1; k < n_chunks && twice < 0; k++)
        if (sorted[k] == sorted[k - 1])
            twice = sorted[k];
    free(sorted);
    if (twice >= 0)
        return chunk_fail(err, ctx_id, twice, "written twice in one batch");
    return 0;
}

/* Encodes a chunk and writes it to its temporary file, which stays open with its
 * writeback started: the disk works on it while the next chunk is compressed. */
static int batch_write_file(store_chunk_batch *bt, store_chunk_encoder *e,
                            const store_chunk_blob *b, batch_item *it, char *err)
{
    int index = b->meta.index;
    char tmp[PATH_MAX];
    size_t total = 0;
    if (chunk_file_path(bt->dir, bt->ctx_id, index, it->gen, CHUNK_TMP_SUFFIX, tmp,
                        sizeof tmp, err) != 0 ||
        encode_chunk(e, bt->ctx_id, index, b->sections, b->section_bytes, b->n_sections,
                     &total, &it->raw_bytes, err) != 0)
        return -1;
    it->file_bytes = (int64_t)total;
    it->fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (it->fd < 0)
        return chunk_fail(err, bt->ctx_id, index, "creating %s: %s", tmp, strerror(errno));
    it->stage = ITEM_TMP;
    errno = 0;
    if (write_all(it->fd, e->buf, total) != 0)
        return chunk_fail(err, bt->ctx_id, index, "writing %s: %s", tmp,
                          errno ? strerror(errno) : "short write");
    /* Only a hint: fdatasync below waits for the data and reports any error. */
    sync_file_range(it->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    return 0;
}

/* Waits until a chunk's temporary file is durable, closes it and renames it to the
 * chunk's name (durable once its directory is synced). fdatasync is enough: it also
 * writes the size and block map that reading the data back needs. */
static int batch_finish_file(store_chunk_batch *bt, int index, batch_item *it, char *err)
{
    char tmp[PATH_MAX], path[PATH_MAX];
    if (chunk_file_path(bt->dir, bt->ctx_id, index, it->gen, CHUNK_TMP_SUFFIX, tmp,
                        sizeof tmp, err) != 0 ||
        chunk_file_path(bt->dir, bt->ctx_id, index, it->gen, CHUNK_SUFFIX, path, sizeof path,
                        err) != 0)
        return -1;
    int synced = fdatasync(it->fd), sync_errno = errno;
    int closed = close(it->fd), close_errno = errno;
    it->fd = -1;
    if (synced != 0)
        return chunk_fail(err, bt->ctx_id, index, "syncing %s: %s", tmp, strerror(sync_errno));
    if (closed != 0)
        return chunk_fail(err, bt->ctx_id, index, "closing %s: %s", tmp,
                          strerror(close_errno));
    if (rename(tmp, path) != 0)
        return chunk_fail(err, bt->ctx_id, index, "renaming %s: %s", tmp, strerror(errno));
    it->stage = ITEM_RENAMED;
    return 0;
}

/* Removes what a batch wrote; the stored versions were never touched. */
static void batch_undo(store_chunk_batch *bt)
{
    char path[PATH_MAX], ignored[ERR_MAX];
    for (int k = 0; k < bt->n_chunks; k++) {
        batch_item *it = &bt->items[k];
        if (it->fd >= 0)
            close(it->fd);
        it->fd = -1;
        if (it->stage != ITEM_NOTHING &&
            chunk_file_path(bt->dir, bt->ctx_id, bt->chunks[k].meta.index, it->gen,
                            it->stage == ITEM_TMP ? CHUNK_TMP_SUFFIX : CHUNK_SUFFIX, path,
                            sizeof path, ignored) == 0)
            unlink(path);
        it->stage = ITEM_NOTHING;
    }
}

static int put_row(store *s, const char *ctx_id, const store_chunk *row, int64_t gen,
                   char *err)
{
    sqlite3_stmt *st = chunk_stmt(s, CS_PUT, err);
    if (!st)
        return -1;
    if (sqlite3_bind_text(st, 1, ctx_id, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int(st, 2, row->index) != SQLITE_OK ||
        sqlite3_bind_int(st, 3, row->precision) != SQLITE_OK ||
        sqlite3_bind_int(st, 4, row->n_tokens) != SQLITE_OK ||
        sqlite3_bind_int(st, 5, row->n_sections) != SQLITE_OK ||
        sqlite3_bind_int64(st, 6, row->raw_bytes) != SQLITE_OK ||
        sqlite3_bind_int64(st, 7, row->file_bytes) != SQLITE_OK ||
        sqlite3_bind_int64(st, 8, gen) != SQLITE_OK ||
        sqlite3_bind_double(st, 9, row->density) != SQLITE_OK ||
        sqlite3_bind_int64(st, 10, row->last_used_ms) != SQLITE_OK)
        return db_fail(s, err, ctx_id, "binding chunk row");
    int rc = sqlite3_step(st);
    char msg[ERR_MAX];
    if (rc != SQLITE_DONE)
        chunk_fail(err, ctx_id, row->index, "storing catalog row: %s",
                   store_db_message(store_sqlite(s), msg, sizeof msg));
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* Runs BEGIN, COMMIT or ROLLBACK. */
static int run_chunk_stmt(store *s, enum chunk_stmt which, const char *ctx_id,
                          const char *what, char *err)
{
    sqlite3_stmt *st = chunk_stmt(s, which, err);
    if (!st)
        return -1;
    int rc = sqlite3_step(st);
    if (rc != SQLITE_DONE)
        db_fail(s, err, ctx_id, what);
    sqlite3_reset(st);
    return rc == SQLITE_DONE ? 0 : -1;
}

/* Stores the rows of a batch whose files are durable, in one transaction. */
static int batch_commit(store *s, const store_chunk_batch *bt, char *err)
{
    const char *ctx_id = bt->ctx_id;
    if (run_chunk_stmt(s, CS_BEGIN, ctx_id, "beginning the catalog transaction", err) != 0)
        return -1;
    int result = 0;
    for (int k = 0; k < bt->n_chunks && result == 0; k++) {
        store_chunk row = bt->chunks[k].meta;
        row.n_sections = bt->chunks[k].n_sections;
        row.raw_bytes = bt->items[k].raw_bytes;
        row.file_bytes = bt->items[k].file_bytes;
        result = put_row(s, ctx_id, &row, bt->items[k].gen, err);
    }
    if (result == 0 && bt->has_ctx_stats)
        result = store_context_set_stats(s, ctx_id, bt->ctx_stats, bt->ctx_stats_bytes, err);
    if (result == 0)
        result = run_chunk_stmt(s, CS_COMMIT, ctx_id, "committing chunk rows", err);
    if (result != 0) {
        /* ROLLBACK may find sqlite already rolled back; the first error is the one
         * worth reporting. */
        char ignored[ERR_MAX];
        run_chunk_stmt(s, CS_ROLLBACK, ctx_id, "rolling back", ignored);
    }
    return result;
}

static void batch_free(store_chunk_batch *bt)
{
    if (!bt)
        return;
    free(bt->ctx_id);
    free(bt->items);
    free(bt->ctx_stats);
    free(bt);
}

store_chunk_batch *store_chunk_batch_begin(store *s, const char *ctx_id,
                                           store_chunk_blob *chunks, int n_chunks,
                                           char err[ERR_MAX])
{
    if (check_batch(ctx_id, chunks, n_chunks, err) != 0)
        return NULL;
    if (!chunks_state(s, err) || require_context(s, ctx_id, err) != 0)
        return NULL;
    store_chunk_batch *bt = calloc(1, sizeof *bt);
    if (!bt || !(bt->ctx_id = strdup(ctx_id)) ||
        !(bt->items = calloc(n_chunks ? (size_t)n_chunks : 1, sizeof *bt->items))) {
        batch_free(bt);
        err_set(err, "store: out of memory for a batch of %d chunks", n_chunks);
        return NULL;
    }
    bt->chunks = chunks;
    bt->n_chunks = n_chunks;
    for (int k = 0; k < n_chunks; k++)
        bt->items[k].fd = -1;
    if ((size_t)snprintf(bt->root, sizeof bt->root, "%s", store_dir(s)) >= sizeof bt->root ||
        (size_t)snprintf(bt->top, sizeof bt->top, "%s/" CHUNK_DIR, store_dir(s)) >=
            sizeof bt->top) {
        err_set(err, "store: state directory path too long");
        goto fail;
    }
    if (ctx_dir_path(s, ctx_id, bt->dir, sizeof bt->dir, err) != 0)
        goto fail;
    for (int k = 0; k < n_chunks; k++) {
        store_chunk old;
        int64_t old_gen = 0;
        if (get_row(s, ctx_id, chunks[k].meta.index, &old, &old_gen, &bt->items[k].had,
                    err) != 0)
            goto fail;
        bt->items[k].gen = bt->items[k].had ? old_gen + 1 : 1;
    }
    return bt;
fail:
    batch_free(bt);
    return NULL;
}

int store_chunk_batch_write(store_chunk_batch *bt, store_chunk_encoder *e, char err[ERR_MAX])
{
    if (bt->n_chunks == 0) {
        bt->written = true;
        return 0;
    }
    int result = 0;
    if (make_dir(bt->top, bt->root, err) != 0 || make_dir(bt->dir, bt->top, err) != 0)
        result = -1;
    for (int start = 0; start < bt->n_chunks && result == 0; start += BATCH_WINDOW) {
        int end = bt->n_chunks - start > BATCH_WINDOW ? start + BATCH_WINDOW : bt->n_chunks;
        for (int k = start; k < end && result == 0; k++)
            result = batch_write_file(bt, e, &bt->chunks[k], &bt->items[k], err);
        for (int k = start; k < end && result == 0; k++)
            result = batch_finish_file(bt, bt->chunks[k].meta.index, &bt->items[k], err);
    }
    /* One directory sync makes every rename durable before any row refers to it. */
    if (result == 0)
        result = fsync_dir(bt->dir, err);
    if (result != 0)
        batch_undo(bt);
    bt->written = result == 0;
    return result;
}

int store_chunk_batch_set_context_stats(store_chunk_batch *bt, const void *bytes, size_t n,
                                        char err[ERR_MAX])
{
    void *copy = n ? malloc(n) : NULL;
    if (n && !copy)
        return err_set(err, "store: context '%.40s': out of memory for its stats",
                       bt->ctx_id);
    if (n)
        memcpy(copy, bytes, n);
    free(bt->ctx_stats);
    bt->ctx_stats = copy;
    bt->ctx_stats_bytes = n;
    bt->has_ctx_stats = true;
    return 0;
}

int store_chunk_batch_end(store *s, store_chunk_batch *bt, char err[ERR_MAX])
{
    if (!bt)
        return 0;
    int result = 0;
    if (!bt->written)
        result = err_set(err, "store: context '%.40s': the chunk batch was not written",
                         bt->ctx_id);
    else if ((bt->n_chunks > 0 || bt->has_ctx_stats) && batch_commit(s, bt, err) != 0)
        result = -1;
    if (result != 0) {
        batch_undo(bt);
        batch_free(bt);
        return -1;
    }
    for (int k = 0; k < bt->n_chunks; k++) {
        store_chunk *m = &bt->chunks[k].meta;
        batch_item *it = &bt->items[k];
        m->n_sections = bt->chunks[k].n_sections;
        m->raw_bytes = it->raw_bytes;
        m->file_bytes = it->file_bytes;
        /* A failure here only leaves an orphan for store_chunks_gc. */
        char old_path[PATH_MAX], ignored[ERR_MAX];
        if (it->had && chunk_file_path(bt->dir, bt->ctx_id, m->index, it->gen - 1,
                                       CHUNK_SUFFIX, old_path, sizeof old_path, ignored) == 0)
            unlink(old_path);
    }
    batch_free(bt);
    return 0;
}

int store_chunk_write_batch(store *s, const char *ctx_id, store_chunk_blob *chunks,
                            int n_chunks, char err[ERR_MAX])
{
    store_chunk_batch *bt = store_chunk_batch_begin(s, ctx_id, chunks, n_chunks, err);
    if (!bt)
        return -1;
    store_chunks *c = chunks_state(s, err);
    if (store_chunk_batch_write(bt, &c->enc, err) != 0) {
        batch_free(bt); /* the write removed its files */
        return -1;
    }
    return store_chunk_batch_end(s, bt, err);
}

int store_chunk_write(store *s, const char *ctx_id, store_chunk *meta,
                      const void *const *sections, const size_t *section_bytes,
                      int n_sections, char err[ERR_MAX])
{
    if (!meta)
        return err_set(err, "store: write chunk of context '%.40s': no record",
                       ctx_id ? ctx_id : "");
    store_chunk_blob b = {.meta = *meta, .sections = sections,
                          .section_bytes = section_bytes, .n_sections = n_sections};
    if (store_chunk_write_batch(s, ctx_id, &b, 1, err) != 0)
        return -1;
    *meta = b.meta;
    return 0;
}

int store_chunk_touch(store *s, const char *ctx_id, int index, float density,
                      int64_t last_used_ms, char err[ERR_MAX])
{
    if (!valid_id(ctx_id))
        return err_set(err, "store: touch chunk: empty context id");
    sqlite3_stmt *st = chunk_stmt(s, CS_TOUCH, err);
    if (!st)
        return -1;
    if (sqlite3_bind_double(st, 1, density) != SQLITE_OK ||
        sqlite3_bind_int64(st, 2, last_used_ms) != SQLITE_OK ||
        sqlite3_bind_text(st, 3, ctx_id, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int(st, 4, index) != SQLITE_OK)
        return db_fail(s, err, ctx_id, "binding");
    int rc = sqlite3_step(st);
    sqlite3_reset(st);
    char msg[ERR_MAX];
    if (rc != SQLITE_DONE)
        return chunk_fail(err, ctx_id, index, "touch: %s",
                          store_db_message(store_sqlite(s), msg, sizeof msg));
    if (sqlite3_changes(store_sqlite(s)) == 0)
        return chunk_fail(err, ctx_id, index, "touch: no such chunk");
    return 0;
}

int store_chunk_list(store *s, const char *ctx_id,
                     int (*fn)(void *arg, const store_chunk *c), void *arg, char err[ERR_MAX])
{
    if (!valid_id(ctx_id))
        return err_set(err, "store: list chunks: empty context id");
    if (require_context(s, ctx_id, err) != 0)
        return -1;
    sqlite3_stmt *st = chunk_stmt(s, CS_LIST, err);
    if (!st)
        return -1;
    if (sqlite3_bind_text(st, 1, ctx_id, -1, SQLITE_STATIC) != SQLITE_OK)
        return db_fail(s, err, ctx_id, "binding");
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        store_chunk c;
        int64_t gen;
        read_row(st, &c, &gen);
        int stop = fn ? fn(arg, &c) : 0;
        if (stop) {
            sqlite3_reset(st);
            return stop;
        }
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE)
        return db_fail(s, err, ctx_id, "listing chunks");
    return 0;
}

/* The (index, generation) of the chunks of ctx_id with index >= first, in a malloc'ed
 * array (NULL when there are none). */
static int chunk_files(store *s, const char *ctx_id, int first, int64_t **pairs, int *n,
                       char *err)
{
    *pairs = NULL;
    *n = 0;
    sqlite3_stmt *st = chunk_stmt(s, CS_FILES, err);
    if (!st)
        return -1;
    if (sqlite3_bind_text(st, 1, ctx_id, -1, SQLITE_STATIC) != SQLITE_OK ||
        sqlite3_bind_int(st, 2, first) != SQLITE_OK)
        return db_fail(s, err, ctx_id, "binding");
    int rc, cap = 0;
    while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            int64_t *p = realloc(*pairs, (size_t)cap * 2 * sizeof *p);
            if (!p) {
                sqlite3_reset(st);
                free(*pairs);
                *pairs = NULL;
                return err_set(err, "store: out of memory listing chunks of '%.40s'", ctx_id);
            }
            *pairs = p;
        }
        (*pairs)[2 * *n] = sqlite3_column_int64(st, 0);
        (*pairs)[2 * *n + 1] = sqlite3_column_int64(st, 1);
        (*n)++;
    }
    sqlite3_reset(st);
    if (rc != SQLITE_DONE) {
        free(*pairs);
        *pairs = NULL;
        return db_fail(s, err, ctx_id, "listing chunk files");
    }
    return 0;
}

int store_chunk_rows_delete_from(store *s, const char *ctx_id, int first, int64_t **files,
                                 int *n_files, char *err)
{
    if (chunk_files(s, ctx_id, first, files, n_files, err) != 0)
        return -1;
    sqlite3_stmt *st = chunk_stmt(s, CS_DELETE_FROM, err);
    if (st && (sqlite3_bind_text(st, 1, ctx_id, -1, SQLITE_STATIC) != SQLITE_OK ||
               sqlite3_bind_int(st, 2, first) != SQLITE_OK)) {
        db_fail(s, err, ctx_id, "binding");
        st = NULL;
    }
    int rc = st ? sqlite3_step(st) : SQLITE_ERROR;
    if (st)
        sqlite3_reset(st);
    if (st && rc != SQLITE_DONE)
        db_fail(s, err, ctx_id, "deleting chunk rows");
    if (rc != SQLITE_DONE) {
        free(*files);
        *files = NULL;
        *n_files = 0;
        return -1;
    }
    return 0;
}

int store_chunk_files_remove(store *s, const char *ctx_id, const int64_t *files, int n,
                             char *err)
{
    int result = 0;
    for (int i = 0; i < n; i++) {
        char path[PATH_MAX], e[ERR_MAX];
        if (chunk_path(s, ctx_id, (int)files[2 * i], files[2 * i + 1], CHUNK_SUFFIX, path,
                       sizeof path, e) != 0) {
            if (result == 0 && err)
                snprintf(err, ERR_MAX, "%s", e);
            result = -1;
            continue;
        }
        if (unlink(path) != 0 && errno != ENOENT && result == 0) {
            result = -1;
            if (err)
                chunk_fail(err, ctx_id, (int)files[2 * i], "removing %s: %s", path,
                           strerror(errno));
        }
    }
    return result;
}

int store_chunk_delete_from(store *s, const char *ctx_id, int first, char err[ERR_MAX])
{
    if (!valid_id(ctx_id))
        return err_set(err, "store: delete chunks: empty context id");
    if (first < 0)
        return err_set(err, "store: delete chunks of '%.40s': first index %d", ctx_id, first);
    if (require_context(s, ctx_id, err) != 0)
        return -1;
    int64_t *files;
    int n;
    if (store_chunk_rows_delete_from(s, ctx_id, first, &files, &n, err) != 0)
        return -1;
    /* The rows are gone: from here on a failure leaves only orphans for the gc. */
    int result = store_chunk_files_remove(s, ctx_id, files, n, err);
    free(files);
    return result;
}

int store_chunk_drop_cache(store *s, const char *ctx_id, char err[ERR_MAX])
{
    if (!valid_id(ctx_id))
        return err_set(err, "store: drop cache: empty context id");
    if (require_context(s, ctx_id, err) != 0)
        return -1;
    int64_t *files;
    int n;
    if (chunk_files(s, ctx_id, 0, &files, &n, err) != 0)
        return -1;
    int result = 0;
    for (int i = 0; i < n && result == 0; i++) {
        int index = (int)files[2 * i];
        char path[PATH_MAX];
        if (chunk_path(s, ctx_id, index, files[2 * i + 1], CHUNK_SUFFIX, path, sizeof path,
                       err) != 0) {
            result = -1;
            break;
        }
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            result = chunk_fail(err, ctx_id, index, "opening %s: %s", path, strerror(errno));
            break;
        }
        int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
        if (rc != 0)
            result = chunk_fail(err, ctx_id, index, "dropping the cache of %s: %s", path,
                                strerror(rc));
    }
    free(files);
    return result;
}

/* ---- removing files ---- */

void store_chunks_remove_context(store *s, const char *ctx_id)
{
    char dir[PATH_MAX], ignored[ERR_MAX];
    if (ctx_dir_path(s, ctx_id, dir, sizeof dir, ignored) != 0)
        return;
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        int index;
        int64_t gen;
        if (!parse_chunk_name(e->d_name, CHUNK_SUFFIX, &index, &gen) &&
            !parse_chunk_name(e->d_name, CHUNK_TMP_SUFFIX, &index, &gen))
            continue;
        unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
    rmdir(dir);
}

/* Removes the orphans and stale temporary files of one context directory, then the
 * directory itself if that left it empty. */
static int gc_context_dir(store *s, const char *top, const char *name, int *n_removed,
                          char *err)
{
    char ctx_id[NAME_MAX + 1];
    if (ctx_id_of_dir(name, ctx_id, sizeof ctx_id) != 0)
        return 0; /* not a directory the store made */
    char dir[PATH_MAX];
    if ((size_t)snprintf(dir, sizeof dir, "%s/%s", top, name) >= sizeof dir)
        return err_set(err, "store: chunk gc: path of %s too long", name);
    DIR *d = opendir(dir);
    if (!d) {
        if (errno == ENOTDIR)
            return 0;
        return err_set(err, "store: chunk gc: opening %s: %s", dir, strerror(errno));
    }
    int result = 0;
    struct dirent *e;
    while (result == 0 && (e = readdir(d))) {
        int index;
        int64_t gen;
        bool stale;
        if (parse_chunk_name(e->d_name, CHUNK_TMP_SUFFIX, &index, &gen)) {
            stale = true; /* gc runs before any write begins: a temp file is a crash's */
        } else if (parse_chunk_name(e->d_name, CHUNK_SUFFIX, &index, &gen)) {
            store_chunk c;
            int64_t row_gen;
            bool found;
            if (get_row(s, ctx_id, index, &c, &row_gen, &found, err) != 0) {
                result = -1;
                break;
            }
            stale = !found || row_gen != gen;
        } else {
            continue;
        }
        if (!stale)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) != 0 && errno != ENOENT)
            result = err_set(err, "store: chunk gc: removing %s/%s: %s", dir, e->d_name,
                             strerror(errno));
        else if (n_removed)
            (*n_removed)++;
    }
    closedir(d);
    if (result == 0 && rmdir(dir) != 0 && errno != ENOTEMPTY && errno != EEXIST)
        return err_set(err, "store: chunk gc: removing %s: %s", dir, strerror(errno));
    return result;
}

int store_chunks_gc(store *s, int *n_removed, char err[ERR_MAX])
{
    if (n_removed)
        *n_removed = 0;
    if (!chunks_state(s, err))
        return -1;
    char top[PATH_MAX];
    if ((size_t)snprintf(top, sizeof top, "%s/" CHUNK_DIR, store_dir(s)) >= sizeof top)
        return err_set(err, "store: state directory path too long");
    DIR *d = opendir(top);
    if (!d) {
        if (errno == ENOENT)
            return 0;
        return err_set(err, "store: chunk gc: opening %s: %s", top, strerror(errno));
    }
    int result = 0;
    struct dirent *e;
    while (result == 0 && (e = readdir(d)))
        if (e->d_name[0] != '.')
            result = gc_context_dir(s, top, e->d_name, n_removed, err);
    closedir(d);
    return result;
}

/* ---- reading ---- */

void store_chunk_close(store_chunk_reader *r)
{
    if (!r)
        return;
    if (r->fd >= 0)
        close(r->fd);
    free(r->raw);
    free(r->comp);
    free(r->codec);
    free(r->offset);
    free(r->crc);
    free(r->scratch);
    free(r->path);
    ZSTD_freeDCtx(r->dctx);
    free(r);
}

/* Reads and checks the header of r's file against its catalog row. */
static int read_header(store_chunk_reader *r, const char *path, char *err)
{
    const char *id = r->ctx_id;
    int index = r->meta.index;
    struct stat st;
    if (fstat(r->fd, &st) != 0)
        return chunk_fail(err, id, index, "%s: %s", path, strerror(errno));
    if ((int64_t)st.st_size != r->meta.file_bytes)
        return chunk_fail(err, id, index, "%s is %lld bytes, the catalog says %lld", path,
                          (long long)st.st_size, (long long)r->meta.file_bytes);
    int n = r->meta.n_sections;
    if (n < 0 || n > STORE_CHUNK_MAX_SECTIONS)
        return chunk_fail(err, id, index, "catalog row has %d sections", n);
    size_t head = header_bytes(n);
    if ((int64_t)head > r->meta.file_bytes)
        return chunk_fail(err, id, index, "%s is %lld bytes, shorter than its %zu-byte header",
                          path, (long long)r->meta.file_bytes, head);
    uint8_t *h = malloc(head);
    r->raw = calloc((size_t)n + 1, sizeof *r->raw);
    r->comp = calloc((size_t)n + 1, sizeof *r->comp);
    r->codec = calloc((size_t)n + 1, sizeof *r->codec);
    r->offset = calloc((size_t)n + 1, sizeof *r->offset);
    r->crc = calloc((size_t)n + 1, sizeof *r->crc);
    if (!h || !r->raw || !r->comp || !r->codec || !r->offset || !r->crc) {
        free(h);
        return chunk_fail(err, id, index, "out of memory");
    }
    ssize_t got = pread_all(r->fd, h, head, 0);
    int result = 0;
    if (got < 0)
        result = chunk_fail(err, id, index, "reading %s: %s", path, strerror(errno));
    else if ((size_t)got < head)
        result = chunk_fail(err, id, index, "%s: header cut short", path);
    else if (memcmp(h, CHUNK_MAGIC, 8) != 0)
        result = chunk_fail(err, id, index, "%s is not a chunk file (bad magic)", path);
    else if (crc32c(0, h, head - 4) != get_u32(h + head - 4))
        result = chunk_fail(err, id, index, "%s: header checksum mismatch", path);
    else if (get_u32(h + 8) != CHUNK_VERSION)
        result = chunk_fail(err, id, index, "%s: format version %u, expected %u", path,
                            get_u32(h + 8), CHUNK_VERSION);
    else if (get_u32(h + 12) != (uint32_t)n)
        result = chunk_fail(err, id, index, "%s has %u sections, the catalog says %d", path,
                            get_u32(h + 12), n);
    if (got > 0)
        r->bytes_read += got;
    uint64_t at = head, raw_total = 0, largest = 0;
    for (int i = 0; i < n && result == 0; i++) {
        const uint8_t *e = h + CHUNK_HEAD_FIXED + (size_t)i * CHUNK_HEAD_ENTRY;
        r->raw[i] = get_u64(e);
        r->comp[i] = get_u64(e + 8);
        r->crc[i] = get_u32(e + 16);
        r->codec[i] = get_u32(e + 20);
        r->offset[i] = at;
        if (r->codec[i] != CODEC_RAW && r->codec[i] != CODEC_ZSTD) {
            result = chunk_fail(err, id, index, "%s: section %d has unknown codec %u", path,
                                i, r->codec[i]);
            break;
        }
        if (r->comp[i] > (uint64_t)r->meta.file_bytes - at ||
            (r->raw[i] == 0) != (r->comp[i] == 0) || r->raw[i] > (uint64_t)INT64_MAX ||
            (r->codec[i] == CODEC_RAW && r->comp[i] != r->raw[i])) {
            result = chunk_fail(err, id, index, "%s: section %d sizes (%" PRIu64 " raw, %"
                                PRIu64 " stored) do not fit the file", path, i, r->raw[i],
                                r->comp[i]);
            break;
        }
        at += r->comp[i];
        raw_total += r->raw[i];
        if (r->codec[i] == CODEC_ZSTD && r->comp[i] > largest)
            largest = r->comp[i];
    }
    free(h);
    if (result != 0)
        return -1;
    if (at != (uint64_t)r->meta.file_bytes)
        return chunk_fail(err, id, index, "%s: sections end at %" PRIu64 " of %lld bytes",
                          path, at, (long long)r->meta.file_bytes);
    if (raw_total != (uint64_t)r->meta.raw_bytes)
        return chunk_fail(err, id, index, "%s holds %" PRIu64 " bytes, the catalog says %lld",
                          path, raw_total, (long long)r->meta.raw_bytes);
    r->scratch = malloc(largest ? largest : 1);
    if (!r->scratch)
        return chunk_fail(err, id, index, "out of memory for %" PRIu64 " bytes", largest);
    return 0;
}

/* cachestat(2) (Linux 6.5) counts a file's cached pages in one call: 0.3-0.7 us here,
 * against 6-21 us for mmap + mincore + munmap of a 32-368 KB chunk file, which matters
 * with a few hundred chunks per switch-in. Debian 12's headers predate it; its number is
 * 451 on both architectures below. */
#if !defined(__NR_cachestat) && (defined(__x86_64__) || defined(__aarch64__))
#define __NR_cachestat 451
#endif

#ifdef __NR_cachestat
struct cachestat_range {
    uint64_t off, len;
};
struct cachestat {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

static atomic_bool no_cachestat; /* the kernel (or a seccomp filter) refused it */
#endif

/* The share of fd's pages (size bytes) in the page cache by mincore on a mapping that
 * is never touched (no I/O, no page faulted in); -1 when it cannot be told. */
static double mincore_share(int fd, size_t size)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    void *map = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED)
        return -1;
    size_t n_pages = (size + page - 1) / page, resident = 0;
    unsigned char vec[256];
    for (size_t at = 0; at < n_pages; at += sizeof vec) {
        size_t n = n_pages - at < sizeof vec ? n_pages - at : sizeof vec;
        size_t len = at + n == n_pages ? size - at * page : n * page;
        if (mincore((char *)map + at * page, len, vec) != 0) {
            munmap(map, size);
            return -1;
        }
        for (size_t i = 0; i < n; i++)
            resident += vec[i] & 1;
    }
    munmap(map, size);
    return (double)resident / (double)n_pages;
}

/* The share of fd's pages in the page cache, -1 when it cannot be told. */
static double cached_share(int fd)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return -1;
    if (sb.st_size <= 0)
        return 1;
#ifdef __NR_cachestat
    if (!atomic_load_explicit(&no_cachestat, memory_order_relaxed)) {
        struct cachestat_range all = {0, 0};
        struct cachestat cs;
        if (syscall(__NR_cachestat, fd, &all, &cs, 0) == 0) {
            size_t page = (size_t)sysconf(_SC_PAGESIZE);
            double n_pages = (double)(((size_t)sb.st_size + page - 1) / page);
            return (double)cs.nr_cache < n_pages ? (double)cs.nr_cache / n_pages : 1;
        }
        if (errno == ENOSYS || errno == EPERM)
            atomic_store_explicit(&no_cachestat, true, memory_order_relaxed);
    }
#endif
    return mincore_share(fd, (size_t)sb.st_size);
}

store_chunk_reader *store_chunk_open_deferred(store *s, const char *ctx_id, int index,
                                              bool *found, char err[ERR_MAX])
{
    *found = false;
    if (!valid_id(ctx_id)) {
        err_set(err, "store: open chunk: empty context id");
        return NULL;
    }
    store_chunk meta;
    int64_t gen;
    bool have;
    if (get_row(s, ctx_id, index, &meta, &gen, &have, err) != 0 || !have)
        return NULL;
    *found = true;
    char path[PATH_MAX];
    if (chunk_path(s, ctx_id, index, gen, CHUNK_SUFFIX, path, sizeof path, err) != 0)
        return NULL;
    store_chunk_reader *r = calloc(1, sizeof *r);
    if (!r) {
        chunk_fail(err, ctx_id, index, "out of memory");
        return NULL;
    }
    r->fd = -1;
    r->meta = meta;
    snprintf(r->ctx_id, sizeof r->ctx_id, "%s", ctx_id);
    r->n_sections = meta.n_sections;
    if (!(r->dctx = ZSTD_createDCtx())) {
        chunk_fail(err, ctx_id, index, "out of memory");
        store_chunk_close(r);
        return NULL;
    }
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        chunk_fail(err, ctx_id, index, "opening %s: %s", path, strerror(errno));
        store_chunk_close(r);
        return NULL;
    }
    r->cached = cached_share(r->fd);
    if (!(r->path = strdup(path))) {
        chunk_fail(err, ctx_id, index, "out of memory");
        store_chunk_close(r);
        return NULL;
    }
    return r;
}

int store_chunk_read_header(store_chunk_reader *r, char err[ERR_MAX])
{
    if (r->raw)
        return 0;
    if (read_header(r, r->path, err) == 0)
        return 0;
    /* what read_header allocated: a reader is either without a header or with all of it */
    free(r->raw);
    free(r->comp);
    free(r->codec);
    free(r->offset);
    free(r->crc);
    r->raw = r->comp = r->offset = NULL;
    r->codec = r->crc = NULL;
    return -1;
}

store_chunk_reader *store_chunk_open(store *s, const char *ctx_id, int index, bool *found,
                                     char err[ERR_MAX])
{
    store_chunk_reader *r = store_chunk_open_deferred(s, ctx_id, index, found, err);
    if (r && store_chunk_read_header(r, err) != 0) {
        store_chunk_close(r);
        return NULL;
    }
    return r;
}

const store_chunk *store_chunk_reader_meta(const store_chunk_reader *r)
{
    return &r->meta;
}

size_t store_chunk_section_bytes(const store_chunk_reader *r, int i)
{
    return r->raw && i >= 0 && i < r->n_sections ? (size_t)r->raw[i] : 0;
}

int store_chunk_read_section(store_chunk_reader *r, int i, void *dst, size_t dst_bytes,
                             char err[ERR_MAX])
{
    const char *id = r->ctx_id;
    int index = r->meta.index;
    if (!r->raw)
        return chunk_fail(err, id, index, "section %d read before the header", i);
    if (i < 0 || i >= r->n_sections)
        return chunk_fail(err, id, index, "no section %d (of %d)", i, r->n_sections);
    if (dst_bytes != r->raw[i])
        return chunk_fail(err, id, index, "section %d holds %" PRIu64 " bytes, not %zu", i,
                          r->raw[i], dst_bytes);
    if (r->comp[i] == 0)
        return 0;
    if (!dst)
        return chunk_fail(err, id, index, "section %d: no destination", i);
    uint8_t *stored = r->codec[i] == CODEC_RAW ? dst : r->scratch;
    ssize_t got = pread_all(r->fd, stored, r->comp[i], (off_t)r->offset[i]);
    if (got < 0)
        return chunk_fail(err, id, index, "reading section %d: %s", i, strerror(errno));
    r->bytes_read += got;
    if ((uint64_t)got != r->comp[i])
        return chunk_fail(err, id, index, "section %d cut short (%zd of %" PRIu64 " bytes)",
                          i, got, r->comp[i]);
    if (crc32c(0, stored, r->comp[i]) != r->crc[i])
        return chunk_fail(err, id, index, "section %d checksum mismatch", i);
    if (r->codec[i] == CODEC_RAW)
        return 0;
    size_t n = ZSTD_decompressDCtx(r->dctx, dst, dst_bytes, r->scratch, r->comp[i]);
    if (ZSTD_isError(n))
        return chunk_fail(err, id, index, "section %d: zstd: %s", i, ZSTD_getErrorName(n));
    if (n != dst_bytes)
        return chunk_fail(err, id, index, "section %d decompressed to %zu bytes, not %zu", i,
                          n, dst_bytes);
    return 0;
}

int64_t store_chunk_reader_bytes_read(const store_chunk_reader *r)
{
    return r->bytes_read;
}

double store_chunk_reader_cached(const store_chunk_reader *r)
{
    return r->cached;
}
