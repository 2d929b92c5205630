/* gguf.c — GGUF reader (validating, mmap-based) and writer (see gguf.h). */
#include "engine/gguf/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/quant/quant.h"

#define GGUF_DEFAULT_ALIGNMENT 32
/* Nested arrays are walked recursively; a depth limit keeps a hostile file from
 * exhausting the stack. */
#define GGUF_MAX_ARRAY_DEPTH 8
/* Names in error messages are cut to this many bytes. */
#define NAME_SHOWN 64

/* Smallest encodings, used to reject counts that cannot fit in the bytes left before
 * anything is allocated for them. */
#define MIN_KV_BYTES 13     /* key length, type, one byte of value */
#define MIN_TENSOR_BYTES 33 /* name length, one name byte, n_dims, one ne, type, offset */
#define MIN_ARRAY_BYTES 12  /* element type and count */

static size_t value_type_size(uint32_t t)
{
    switch (t) {
    case GGUF_UINT8:
    case GGUF_INT8:
    case GGUF_BOOL:
        return 1;
    case GGUF_UINT16:
    case GGUF_INT16:
        return 2;
    case GGUF_UINT32:
    case GGUF_INT32:
    case GGUF_FLOAT32:
        return 4;
    case GGUF_UINT64:
    case GGUF_INT64:
    case GGUF_FLOAT64:
        return 8;
    default:
        return 0;
    }
}

static bool value_type_known(uint32_t t)
{
    return t <= GGUF_FLOAT64;
}

static bool is_pow2(uint64_t x)
{
    return x != 0 && (x & (x - 1)) == 0;
}

/* Little-endian decoding that works on any host and any alignment. */
static uint16_t le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32);
}

static int name_len_shown(gguf_str s)
{
    return (int)(s.len < NAME_SHOWN ? s.len : NAME_SHOWN);
}

/* ======================================================================== */
/* reader                                                                   */
/* ======================================================================== */

typedef struct gguf_kv {
    gguf_str key;
    uint32_t type;
    const uint8_t *raw; /* encoded value (after the type field), in the mapping */
    uint64_t raw_len;
    /* arrays only */
    uint32_t elem_type;
    uint64_t count;
    const uint8_t *elems; /* first element */
    gguf_str *strs;       /* (count) for string arrays, else NULL */
} gguf_kv;

/* Open-addressing hash from names to indices; slots hold index + 1, 0 is empty. */
typedef struct name_index {
    uint32_t *slots;
    size_t mask;
} name_index;

struct gguf_file {
    const uint8_t *base;
    size_t size;
    bool mapped;
    void *map_base; // the whole reservation to munmap when mapped (may exceed size)
    size_t map_len;
    uint32_t version;
    size_t alignment;
    size_t data_offset; /* start of the data section in the file */
    int64_t n_kv;
    gguf_kv *kvs;       /* (n_kv) */
    int64_t n_tensors;
    gguf_tensor *tensors; /* (n_tensors) */
    name_index kv_index;
    name_index tensor_index;
};

static uint64_t hash_bytes(const char *p, uint64_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static bool str_eq_bytes(gguf_str s, const char *p, uint64_t n)
{
    return s.len == n && (n == 0 || memcmp(s.ptr, p, n) == 0);
}

static int index_init(name_index *ix, int64_t n)
{
    size_t cap = 16;
    while (cap < (size_t)n * 2)
        cap *= 2;
    ix->slots = calloc(cap, sizeof *ix->slots);
    ix->mask = cap - 1;
    return ix->slots ? 0 : -1;
}

/* Finds name among names[0..]; names are reached through a stride so the same index
 * serves keys and tensors. Returns the index or -1. */
static int64_t index_find(const name_index *ix, const void *names, size_t stride,
                          const char *p, uint64_t n)
{
    if (!ix->slots)
        return -1;
    for (size_t s = hash_bytes(p, n) & ix->mask;; s = (s + 1) & ix->mask) {
        uint32_t v = ix->slots[s];
        if (v == 0)
            return -1;
        const gguf_str *name = (const gguf_str *)((const char *)names + (v - 1) * stride);
        if (str_eq_bytes(*name, p, n))
            return (int64_t)v - 1;
    }
}

/* Inserts entry i (whose name is not yet present). */
static void index_insert(name_index *ix, gguf_str name, int64_t i)
{
    size_t s = hash_bytes(name.ptr, name.len) & ix->mask;
    while (ix->slots[s] != 0)
        s = (s + 1) & ix->mask;
    ix->slots[s] = (uint32_t)(i + 1);
}

/* Bounds-checked cursor over the file. */
typedef struct reader {
    const uint8_t *p;
    size_t size;
    size_t pos;
    char *err;
} reader;

static size_t rd_left(const reader *r)
{
    return r->size - r->pos;
}

static int rd_need(reader *r, uint64_t n, const char *what)
{
    if (n > rd_left(r))
        return err_set(r->err,
                       "truncated file: %s needs %llu bytes at offset %zu, file has %zu bytes",
                       what, (unsigned long long)n, r->pos, r->size);
    return 0;
}

static int rd_u32(reader *r, uint32_t *v, const char *what)
{
    if (rd_need(r, 4, what))
        return -1;
    *v = le32(r->p + r->pos);
    r->pos += 4;
    return 0;
}

static int rd_u64(reader *r, uint64_t *v, const char *what)
{
    if (rd_need(r, 8, what))
        return -1;
    *v = le64(r->p + r->pos);
    r->pos += 8;
    return 0;
}

static int rd_str(reader *r, gguf_str *s, const char *what)
{
    uint64_t len;
    if (rd_u64(r, &len, what))
        return -1;
    if (len > rd_left(r))
        return err_set(r->err,
                       "%s: string length %llu at offset %zu exceeds the %zu bytes left in the file",
                       what, (unsigned long long)len, r->pos - 8, rd_left(r));
    s->ptr = (const char *)(r->p + r->pos);
    s->len = len;
    r->pos += (size_t)len;
    return 0;
}

/* Skips an array body (element type and count already read) nested inside key's value,
 * validating every element. */
static int skip_array_body(reader *r, gguf_str key, uint32_t elem_type, uint64_t count,
                           int depth);

static int skip_nested_array(reader *r, gguf_str key, int depth)
{
    uint32_t elem_type;
    uint64_t count;
    if (depth > GGUF_MAX_ARRAY_DEPTH)
        return err_set(r->err, "key '%.*s': arrays nested deeper than %d levels",
                       name_len_shown(key), key.ptr, GGUF_MAX_ARRAY_DEPTH);
    if (rd_u32(r, &elem_type, "nested array element type") ||
        rd_u64(r, &count, "nested array count"))
        return -1;
    return skip_array_body(r, key, elem_type, count, depth);
}

static int check_array_count(reader *r, gguf_str key, uint64_t count, uint64_t min_elem)
{
    if (count > rd_left(r) / min_elem)
        return err_set(r->err,
                       "key '%.*s': array count %llu cannot fit in the %zu bytes left in the file",
                       name_len_shown(key), key.ptr, (unsigned long long)count, rd_left(r));
    return 0;
}

static int skip_array_body(reader *r, gguf_str key, uint32_t elem_type, uint64_t count,
                           int depth)
{
    if (!value_type_known(elem_type))
        return err_set(r->err, "key '%.*s': unknown array element value type %u",
                       name_len_shown(key), key.ptr, elem_type);
    size_t esize = value_type_size(elem_type);
    if (esize) {
        if (check_array_count(r, key, count, esize))
            return -1;
        r->pos += (size_t)(count * esize);
        return 0;
    }
    if (check_array_count(r, key, count, elem_type == GGUF_STRING ? 8 : MIN_ARRAY_BYTES))
        return -1;
    for (uint64_t i = 0; i < count; i++) {
        if (elem_type == GGUF_STRING) {
            gguf_str s;
            if (rd_str(r, &s, "array string"))
                return -1;
        } else if (skip_nested_array(r, key, depth + 1)) {
            return -1;
        }
    }
    return 0;
}

/* Reads the value of kv (its type already set) and records where it lies. */
static int parse_value(reader *r, gguf_kv *kv)
{
    size_t start = r->pos;
    size_t esize = value_type_size(kv->type);
    if (esize) {
        if (rd_need(r, esize, "metadata value"))
            return -1;
        r->pos += esize;
    } else if (kv->type == GGUF_STRING) {
        gguf_str s;
        if (rd_str(r, &s, "metadata string value"))
            return -1;
    } else {
        if (rd_u32(r, &kv->elem_type, "array element type") ||
            rd_u64(r, &kv->count, "array count"))
            return -1;
        kv->elems = r->p + r->pos;
        if (kv->elem_type == GGUF_STRING) {
            if (check_array_count(r, kv->key, kv->count, 8))
                return -1;
            kv->strs = malloc((kv->count ? kv->count : 1) * sizeof *kv->strs);
            if (!kv->strs)
                return err_set(r->err, "out of memory for array '%.*s'",
                               name_len_shown(kv->key), kv->key.ptr);
            for (uint64_t i = 0; i < kv->count; i++)
                if (rd_str(r, &kv->strs[i], "array string"))
                    return -1;
        } else if (skip_array_body(r, kv->key, kv->elem_type, kv->count, 1)) {
            return -1;
        }
    }
    kv->raw = r->p + start;
    kv->raw_len = r->pos - start;
    return 0;
}

static int parse_kvs(reader *r, gguf_file *g)
{
    g->kvs = calloc(g->n_kv ? (size_t)g->n_kv : 1, sizeof *g->kvs);
    if (!g->kvs || index_init(&g->kv_index, g->n_kv))
        return err_set(r->err, "out of memory for %lld metadata entries", (long long)g->n_kv);
    for (int64_t i = 0; i < g->n_kv; i++) {
        gguf_kv *kv = &g->kvs[i];
        if (rd_str(r, &kv->key, "metadata key") || rd_u32(r, &kv->type, "metadata value type"))
            return -1;
        if (!value_type_known(kv->type))
            return err_set(r->err, "key '%.*s': unknown value type %u",
                           name_len_shown(kv->key), kv->key.ptr, kv->type);
        if (index_find(&g->kv_index, g->kvs, sizeof *g->kvs, kv->key.ptr, kv->key.len) >= 0)
            return err_set(r->err, "duplicate key '%.*s'", name_len_shown(kv->key),
                           kv->key.ptr);
        index_insert(&g->kv_index, kv->key, i);
        if (parse_value(r, kv))
            return -1;
    }
    return 0;
}

static int parse_alignment(reader *r, gguf_file *g)
{
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    int64_t i = gguf_find_key(g, "general.alignment");
    if (i < 0)
        return 0;
    const gguf_kv *kv = &g->kvs[i];
    if (kv->type != GGUF_UINT32)
        return err_set(r->err, "general.alignment has value type %u, expected uint32 (4)",
                       kv->type);
    uint32_t a = le32(kv->raw);
    if (!is_pow2(a))
        return err_set(r->err, "general.alignment %u is not a power of two", a);
    g->alignment = a;
    return 0;
}

/* Reads one tensor info; sizes and offsets are checked later, once the data section's
 * start is known. */
static int parse_tensor_info(reader *r, gguf_file *g, int64_t i)
{
    gguf_tensor *t = &g->tensors[i];
    if (rd_str(r, &t->name, "tensor name"))
        return -1;
    int nl = name_len_shown(t->name);
    if (t->name.len == 0)
        return err_set(r->err, "tensor %lld has an empty name", (long long)i);
    if (index_find(&g->tensor_index, g->tensors, sizeof *g->tensors, t->name.ptr,
                   t->name.len) >= 0)
        return err_set(r->err, "duplicate tensor name '%.*s'", nl, t->name.ptr);
    index_insert(&g->tensor_index, t->name, i);

    if (rd_u32(r, &t->n_dims, "tensor n_dims"))
        return -1;
    if (t->n_dims < 1 || t->n_dims > GGUF_MAX_DIMS)
        return err_set(r->err, "tensor '%.*s': n_dims %u not in 1..%d", nl, t->name.ptr,
                       t->n_dims, GGUF_MAX_DIMS);
    for (int d = 0; d < GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        if ((uint32_t)d < t->n_dims && rd_u64(r, &ne, "tensor dimension"))
            return -1;
        if (ne > INT64_MAX)
            return err_set(r->err, "tensor '%.*s': dimension %d is negative (%lld)", nl,
                           t->name.ptr, d, (long long)ne);
        t->ne[d] = (int64_t)ne;
    }
    if (rd_u32(r, &t->type, "tensor type") || rd_u64(r, &t->offset, "tensor offset"))
        return -1;

    const quant_traits *tr = quant_traits_of(t->type);
    if (!tr)
        return err_set(r->err, "tensor '%.*s': unknown tensor type %u", nl, t->name.ptr,
                       t->type);
    if (t->ne[0] % tr->block_size != 0)
        return err_set(r->err, "tensor '%.*s': ne[0] = %lld is not a multiple of the %s block size %d",
                       nl, t->name.ptr, (long long)t->ne[0], tr->name, tr->block_size);
    int64_t n_el = 1;
    for (int d = 0; d < GGUF_MAX_DIMS; d++)
        if (__builtin_mul_overflow(n_el, t->ne[d] ? t->ne[d] : 1, &n_el))
            return err_set(r->err, "tensor '%.*s': element count overflows", nl, t->name.ptr);
    uint64_t row_bytes, bytes;
    uint64_t rows = (uint64_t)t->ne[1] * (uint64_t)t->ne[2] * (uint64_t)t->ne[3];
    if (__builtin_mul_overflow((uint64_t)(t->ne[0] / tr->block_size), (uint64_t)tr->block_bytes,
                               &row_bytes) ||
        __builtin_mul_overflow(row_bytes, rows, &bytes) || bytes > SIZE_MAX)
        return err_set(r->err, "tensor '%.*s': data size overflows", nl, t->name.ptr);
    t->bytes = (size_t)bytes;
    return 0;
}

typedef struct tensor_span {
    uint64_t begin, end;
    int64_t index;
} tensor_span;

static int span_cmp(const void *a, const void *b)
{
    const tensor_span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

/* Two tensors sharing bytes means an offset was altered (or the writer is broken): the
 * model would load and compute with the wrong weights, so the file is refused, as
 * llama.cpp refuses it. Empty tensors occupy nothing. */
static int check_overlaps(reader *r, gguf_file *g)
{
    tensor_span *spans = malloc((g->n_tensors ? (size_t)g->n_tensors : 1) * sizeof *spans);
    if (!spans)
        return err_set(r->err, "out of memory for %lld tensor spans", (long long)g->n_tensors);
    size_t n = 0;
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (g->tensors[i].bytes > 0)
            spans[n++] = (tensor_span){g->tensors[i].offset,
                                       g->tensors[i].offset + g->tensors[i].bytes, i};
    qsort(spans, n, sizeof *spans, span_cmp);
    int rc = 0;
    for (size_t k = 1; k < n && rc == 0; k++) {
        if (spans[k].begin >= spans[k - 1].end)
            continue;
        const gguf_tensor *a = &g->tensors[spans[k - 1].index], *b = &g->tensors[spans[k].index];
        rc = err_set(r->err,
                     "tensors '%.*s' [%llu, %llu) and '%.*s' [%llu, %llu) overlap in the data "
                     "section",
                     name_len_shown(a->name), a->name.ptr, (unsigned long long)spans[k - 1].begin,
                     (unsigned long long)spans[k - 1].end, name_len_shown(b->name), b->name.ptr,
                     (unsigned long long)spans[k].begin, (unsigned long long)spans[k].end);
    }
    free(spans);
    return rc;
}

static int place_tensors(reader *r, gguf_file *g)
{
    for (int64_t i = 0; i < g->n_tensors; i++) {
        gguf_tensor *t = &g->tensors[i];
        int nl = name_len_shown(t->name);
        if (t->offset % g->alignment != 0)
            return err_set(r->err, "tensor '%.*s': data offset %llu is not aligned to %zu",
                           nl, t->name.ptr, (unsigned long long)t->offset, g->alignment);
        uint64_t begin, end;
        if (__builtin_add_overflow((uint64_t)g->data_offset, t->offset, &begin) ||
            __builtin_add_overflow(begin, (uint64_t)t->bytes, &end))
            return err_set(r->err, "tensor '%.*s': data offset %llu + %zu bytes overflows", nl,
                           t->name.ptr, (unsigned long long)t->offset, t->bytes);
        if (end > g->size)
            return err_set(r->err, "tensor '%.*s': data [%llu, %llu) past end of file (%zu bytes)",
                           nl, t->name.ptr, (unsigned long long)begin, (unsigned long long)end,
                           g->size);
        t->data = g->base + begin;
    }
    return check_overlaps(r, g);
}

static int parse(gguf_file *g, char *err)
{
    reader r = {g->base, g->size, 0, err};
    uint64_t n_tensors, n_kv;

    if (g->size < 4)
        return err_set(err, "file too small for the GGUF magic (%zu bytes)", g->size);
    if (memcmp(g->base, "GGUF", 4) != 0)
        return err_set(err, "bad magic: not a GGUF file");
    r.pos = 4;
    if (rd_u32(&r, &g->version, "version"))
        return -1;
    if (g->version != 2 && g->version != 3) {
        uint32_t swapped = __builtin_bswap32(g->version);
        if (swapped == 2 || swapped == 3)
            return err_set(err, "big-endian GGUF (version %u) is not supported", swapped);
        return err_set(err, "unsupported GGUF version %u (only 2 and 3 are read)", g->version);
    }
    if (rd_u64(&r, &n_tensors, "tensor count") || rd_u64(&r, &n_kv, "metadata count"))
        return -1;
    if (n_kv > rd_left(&r) / MIN_KV_BYTES || n_kv > INT32_MAX)
        return err_set(err, "metadata count n_kv %llu cannot fit in the %zu bytes left in the file",
                       (unsigned long long)n_kv, rd_left(&r));
    g->n_kv = (int64_t)n_kv;
    if (parse_kvs(&r, g) || parse_alignment(&r, g))
        return -1;

    if (n_tensors > rd_left(&r) / MIN_TENSOR_BYTES || n_tensors > INT32_MAX)
        return err_set(err, "tensor count n_tensors %llu cannot fit in the %zu bytes left in the file",
                       (unsigned long long)n_tensors, rd_left(&r));
    g->n_tensors = (int64_t)n_tensors;
    g->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    if (!g->tensors || index_init(&g->tensor_index, g->n_tensors))
        return err_set(err, "out of memory for %llu tensors", (unsigned long long)n_tensors);
    for (int64_t i = 0; i < g->n_tensors; i++)
        if (parse_tensor_info(&r, g, i))
            return -1;

    /* The data section may begin past the end of a file without tensors. */
    g->data_offset = (r.pos + g->alignment - 1) / g->alignment * g->alignment;
    return place_tensors(&r, g);
}

gguf_file *gguf_open_memory(const void *data, size_t size, char err[ERR_MAX])
{
    gguf_file *g = calloc(1, sizeof *g);
    if (!g) {
        err_set(err, "out of memory");
        return NULL;
    }
    g->base = data;
    g->size = size;
    if (parse(g, err)) {
        gguf_close(g);
        return NULL;
    }
    return g;
}

/* Alignment of huge pages (PMD mappings) on x86-64 and most 64-bit Linux targets. */
#define GGUF_HUGE_ALIGN ((size_t)2 << 20)

/*
 * Maps a file read-only at a GGUF_HUGE_ALIGN-aligned address and asks for huge pages. With
 * offset 0 on an aligned address (recent kernels align large file mappings themselves; older
 * ones do not), large page-cache folios of the file can be mapped by PMD
 * entries, which removes most TLB misses when decode streams the weights; the mapping stays
 * file-backed and shared with the page cache. Returns the data address and stores the
 * reservation to unmap in *base and *len, or returns MAP_FAILED with errno set. Falls back
 * to a plain mapping whenever the aligned one cannot be made.
 */
static void *gguf_map(int fd, size_t size, void **base, size_t *len)
{
    size_t span = size + GGUF_HUGE_ALIGN;
    void *res = span > size ? mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                            : MAP_FAILED;
    if (res != MAP_FAILED) {
        uintptr_t start = (uintptr_t)res;
        uintptr_t aligned = (start + GGUF_HUGE_ALIGN - 1) & ~(uintptr_t)(GGUF_HUGE_ALIGN - 1);
        void *map = mmap((void *)aligned, size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
        if (map != MAP_FAILED) {
            /* Advisory: without THP support the mapping simply keeps small pages. */
            madvise(map, size, MADV_HUGEPAGE);
            *base = res;
            *len = span;
            return map;
        }
        munmap(res, span);
    }
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map != MAP_FAILED) {
        *base = map;
        *len = size;
    }
    return map;
}

/*
 * Reads a file of `size` bytes into private anonymous memory at a GGUF_HUGE_ALIGN-aligned
 * address advised to use huge pages (anonymous memory gets them whenever THP is "always" or
 * "madvise", unlike page-cache pages), then makes it read-only like the mapping it stands
 * in for. Same results as gguf_map; MAP_FAILED with errno set on failure.
 */
static void *gguf_copy(int fd, size_t size, void **base, size_t *len)
{
    size_t span = size + GGUF_HUGE_ALIGN;
    if (span < size) {
        errno = EOVERFLOW;
        return MAP_FAILED;
    }
    void *res = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED)
        return MAP_FAILED;
    uintptr_t aligned = ((uintptr_t)res + GGUF_HUGE_ALIGN - 1) & ~(uintptr_t)(GGUF_HUGE_ALIGN - 1);
    char *data = (char *)aligned;
    madvise(data, size, MADV_HUGEPAGE);
    for (size_t done = 0; done < size;) {
        /* pread moves at most about 2 GiB per call on Linux */
        size_t want = size - done < ((size_t)1 << 30) ? size - done : (size_t)1 << 30;
        ssize_t got = pread(fd, data + done, want, (off_t)done);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            int e = got < 0 ? errno : EIO; /* 0: the file shrank while being read */
            munmap(res, span);
            errno = e;
            return MAP_FAILED;
        }
        done += (size_t)got;
    }
    if (mprotect(data, size, PROT_READ) != 0) {
        int e = errno;
        munmap(res, span);
        errno = e;
        return MAP_FAILED;
    }
    *base = res;
    *len = span;
    return data;
}

gguf_file *gguf_open(const char *path, char err[ERR_MAX])
{
    return gguf_open_as(path, GGUF_LOAD_MAP, err);
}

gguf_file *gguf_open_as(const char *path, gguf_load how, char err[ERR_MAX])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        err_set(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        err_set(err, "%s: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        err_set(err, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    size_t size = (size_t)st.st_size;
    void *map = NULL, *map_base = NULL;
    size_t map_len = 0;
    if (size > 0) {
        map = how == GGUF_LOAD_COPY ? gguf_copy(fd, size, &map_base, &map_len)
                                    : gguf_map(fd, size, &map_base, &map_len);
        if (map == MAP_FAILED) {
            err_set(err, "%s: %s: %s", path, how == GGUF_LOAD_COPY ? "read" : "mmap",
                    strerror(errno));
            close(fd);
            return NULL;
        }
    }
    close(fd);

    char why[ERR_MAX];
    gguf_file *g = gguf_open_memory(map, size, why);
    if (!g) {
        err_set(err, "%s: %s", path, why);
        if (map)
            munmap(map_base, map_len);
        return NULL;
    }
    g->mapped = map != NULL;
    g->map_base = map_base;
    g->map_len = map_len;
    return g;
}

void gguf_close(gguf_file *g)
{
    if (!g)
        return;
    if (g->kvs)
        for (int64_t i = 0; i < g->n_kv; i++)
            free(g->kvs[i].strs);
    free(g->kvs);
    free(g->tensors);
    free(g->kv_index.slots);
    free(g->tensor_index.slots);
    if (g->mapped)
        munmap(g->map_base, g->map_len);
    free(g);
}

uint32_t gguf_version(const gguf_file *g)
{
    return g->version;
}

size_t gguf_alignment(const gguf_file *g)
{
    return g->alignment;
}

size_t gguf_data_offset(const gguf_file *g)
{
    return g->data_offset;
}

int64_t gguf_n_kv(const gguf_file *g)
{
    return g->n_kv;
}

int64_t gguf_find_key(const gguf_file *g, const char *key)
{
    return index_find(&g->kv_index, g->kvs, sizeof *g->kvs, key, strlen(key));
}

gguf_str gguf_key(const gguf_file *g, int64_t i)
{
    if (i < 0 || i >= g->n_kv)
        return (gguf_str){NULL, 0};
    return g->kvs[i].key;
}

enum gguf_value_type gguf_kv_type(const gguf_file *g, int64_t i)
{
    if (i < 0 || i >= g->n_kv)
        return GGUF_UINT8;
    return (enum gguf_value_type)g->kvs[i].type;
}

static const gguf_kv *find_kv(const gguf_file *g, const char *key)
{
    int64_t i = gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kvs[i];
}

/* A scalar integer value as signed / unsigned halves: an integer value is either
 * negative (in *neg) or not (in *pos). */
static bool read_int(uint32_t type, const uint8_t *p, int64_t *neg, uint64_t *pos)
{
    int64_t s = 0;
    switch (type) {
    case GGUF_UINT8:
        *pos = p[0];
        return true;
    case GGUF_UINT16:
        *pos = le16(p);
        return true;
    case GGUF_UINT32:
        *pos = le32(p);
        return true;
    case GGUF_UINT64:
        *pos = le64(p);
        return true;
    case GGUF_INT8:
        s = (int8_t)p[0];
        break;
    case GGUF_INT16:
        s = (int16_t)le16(p);
        break;
    case GGUF_INT32:
        s = (int32_t)le32(p);
        break;
    case GGUF_INT64:
        s = (int64_t)le64(p);
        break;
    default:
        return false;
    }
    *neg = s;
    *pos = s >= 0 ? (uint64_t)s : 0;
    return true;
}

/* Decodes a numeric value (integer or float) as a double. */
static bool read_number(uint32_t type, const uint8_t *p, double *out)
{
    if (type == GGUF_FLOAT32) {
        uint32_t bits = le32(p);
        float f;
        memcpy(&f, &bits, sizeof f);
        *out = f;
        return true;
    }
    if (type == GGUF_FLOAT64) {
        uint64_t bits = le64(p);
        memcpy(out, &bits, sizeof *out);
        return true;
    }
    int64_t neg = 0;
    uint64_t pos = 0;
    if (!read_int(type, p, &neg, &pos))
        return false;
    *out = neg < 0 ? (double)neg : (double)pos;
    return true;
}

bool gguf_get_u32(const gguf_file *g, const char *key, uint32_t *out)
{
    const gguf_kv *kv = find_kv(g, key);
    int64_t neg = 0;
    uint64_t pos = 0;
    if (!kv || !read_int(kv->type, kv->raw, &neg, &pos) || neg < 0 || pos > UINT32_MAX)
        return false;
    *out = (uint32_t)pos;
    return true;
}

bool gguf_get_i64(const gguf_file *g, const char *key, int64_t *out)
{
    const gguf_kv *kv = find_kv(g, key);
    int64_t neg = 0;
    uint64_t pos = 0;
    if (!kv || !read_int(kv->type, kv->raw, &neg, &pos))
        return false;
    if (neg < 0) {
        *out = neg;
        return true;
    }
    if (pos > INT64_MAX)
        return false;
    *out = (int64_t)pos;
    return true;
}

bool gguf_get_f32(const gguf_file *g, const char *key, float *out)
{
    const gguf_kv *kv = find_kv(g, key);
    double v;
    if (!kv || (kv->type != GGUF_FLOAT32 && kv->type != GGUF_FLOAT64) ||
        !read_number(kv->type, kv->raw, &v))
        return false;
    *out = (float)v;
    return true;
}

bool gguf_get_bool(const gguf_file *g, const char *key, bool *out)
{
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != GGUF_BOOL)
        return false;
    *out = kv->raw[0] != 0;
    return true;
}

bool gguf_get_str(const gguf_file *g, const char *key, gguf_str *out)
{
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != GGUF_STRING)
        return false;
    out->len = le64(kv->raw);
    out->ptr = (const char *)kv->raw + 8;
    return true;
}

bool gguf_get_arr(const gguf_file *g, const char *key, enum gguf_value_type *elem_type,
                  uint64_t *count)
{
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != GGUF_ARRAY)
        return false;
    *elem_type = (enum gguf_value_type)kv->elem_type;
    *count = kv->count;
    return true;
}

bool gguf_arr_str(const gguf_file *g, const char *key, uint64_t i, gguf_str *out)
{
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != GGUF_ARRAY || !kv->strs || i >= kv->count)
        return false;
    *out = kv->strs[i];
    return true;
}

bool gguf_arr_bool(const gguf_file *g, const char *key, bool *out, uint64_t n)
{
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != GGUF_ARRAY || kv->elem_type != GGUF_BOOL || kv->count != n)
        return false;
    for (uint64_t i = 0; i < n; i++)
        out[i] = kv->elems[i] != 0;
    return true;
}

/* The elements of a numeric array of exactly n elements, or NULL. */
static const gguf_kv *numeric_array(const gguf_file *g, const char *key, uint64_t n)
{
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != GGUF_ARRAY || kv->count != n || kv->elem_type == GGUF_BOOL ||
        value_type_size(kv->elem_type) == 0)
        return NULL;
    return kv;
}

bool gguf_arr_f32(const gguf_file *g, const char *key, float *out, uint64_t n)
{
    const gguf_kv *kv = numeric_array(g, key, n);
    if (!kv)
        return false;
    size_t es = value_type_size(kv->elem_type);
    for (uint64_t i = 0; i < n; i++) {
        double v;
        read_number(kv->elem_type, kv->elems + i * es, &v);
        out[i] = (float)v;
    }
    return true;
}

bool gguf_arr_i32(const gguf_file *g, const char *key, int32_t *out, uint64_t n)
{
    const gguf_kv *kv = numeric_array(g, key, n);
    if (!kv)
        return false;
    size_t es = value_type_size(kv->elem_type);
    /* Checked fully before writing, so a failed call leaves out untouched. */
    for (uint64_t i = 0; i < n; i++) {
        double v;
        read_number(kv->elem_type, kv->elems + i * es, &v);
        if (!(v >= INT32_MIN && v <= INT32_MAX) || v != floor(v))
            return false;
    }
    for (uint64_t i = 0; i < n; i++) {
        double v;
        read_number(kv->elem_type, kv->elems + i * es, &v);
        out[i] = (int32_t)v;
    }
    return true;
}

bool gguf_arr_bytes(const gguf_file *g, const char *key, const uint8_t **data, uint64_t *n)
{
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != GGUF_ARRAY ||
        (kv->elem_type != GGUF_UINT8 && kv->elem_type != GGUF_INT8))
        return false;
    *data = kv->elems;
    *n = kv->count;
    return true;
}

int64_t gguf_n_tensors(const gguf_file *g)
{
    return g->n_tensors;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *g, int64_t i)
{
    if (i < 0 || i >= g->n_tensors)
        return NULL;
    return &g->tensors[i];
}

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name)
{
    int64_t i = index_find(&g->tensor_index, g->tensors, sizeof *g->tensors, name, strlen(name));
    return i < 0 ? NULL : &g->tensors[i];
}

bool gguf_str_eq(gguf_str s, const char *cstr)
{
    return str_eq_bytes(s, cstr, strlen(cstr));
}

/* ======================================================================== */
/* writer                                                                   */
/* ======================================================================== */

typedef struct wkv {
    char *key;
    uint32_t type;
    uint8_t *val; /* the encoded value, as it goes in the file after the type */
    size_t val_len;
} wkv;

typedef struct wtensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[GGUF_MAX_DIMS];
    size_t bytes;
    const void *data; /* borrowed */
} wtensor;

struct gguf_writer {
    wkv *kvs;
    size_t n_kv, cap_kv;
    wtensor *tensors;
    size_t n_tensors, cap_tensors;
    char err[ERR_MAX]; /* the first failure of a setter, reported by gguf_writer_write */
};

/* Growable byte buffer for encoding values. */
typedef struct wbuf {
    uint8_t *p;
    size_t n, cap;
    bool failed;
} wbuf;

static void wb_put(wbuf *b, const void *src, size_t n)
{
    if (b->failed || n == 0)
        return;
    if (n > SIZE_MAX - b->n) {
        b->failed = true;
        return;
    }
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n)
            cap = cap > SIZE_MAX / 2 ? b->n + n : cap * 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void wb_u32(wbuf *b, uint32_t v)
{
    uint8_t e[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    wb_put(b, e, 4);
}

static void wb_u64(wbuf *b, uint64_t v)
{
    wb_u32(b, (uint32_t)v);
    wb_u32(b, (uint32_t)(v >> 32));
}

static void wb_str(wbuf *b, const char *s, size_t len)
{
    wb_u64(b, len);
    wb_put(b, s, len);
}

static int writer_fail(gguf_writer *w, const char *what, const char *name)
{
    if (!w->err[0]) {
        if (name)
            err_set(w->err, "%s '%.*s'", what, NAME_SHOWN, name);
        else
            err_set(w->err, "%s", what);
    }
    return -1;
}

gguf_writer *gguf_writer_new(void)
{
    return calloc(1, sizeof(gguf_writer));
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val);
    }
    for (size_t i = 0; i < w->n_tensors; i++)
        free(w->tensors[i].name);
    free(w->kvs);
    free(w->tensors);
    free(w);
}

/* Stores key = value, taking ownership of the encoded bytes in b. */
static int set_kv(gguf_writer *w, const char *key, uint32_t type, wbuf *b)
{
    if (b->failed) {
        free(b->p);
        return writer_fail(w, "out of memory encoding key", key);
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            free(w->kvs[i].val);
            w->kvs[i].type = type;
            w->kvs[i].val = b->p;
            w->kvs[i].val_len = b->n;
            return 0;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        wkv *kvs = realloc(w->kvs, cap * sizeof *kvs);
        if (!kvs) {
            free(b->p);
            return writer_fail(w, "out of memory adding key", key);
        }
        w->kvs = kvs;
        w->cap_kv = cap;
    }
    char *k = strdup(key);
    if (!k) {
        free(b->p);
        return writer_fail(w, "out of memory adding key", key);
    }
    w->kvs[w->n_kv++] = (wkv){k, type, b->p, b->n};
    return 0;
}

int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    wbuf b = {0};
    wb_u32(&b, v);
    return set_kv(w, key, GGUF_UINT32, &b);
}

int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    wbuf b = {0};
    wb_u32(&b, (uint32_t)v);
    return set_kv(w, key, GGUF_INT32, &b);
}

int gguf_writer_set_f32(gguf_writer *w, const char *key, float v)
{
    wbuf b = {0};
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    wb_u32(&b, bits);
    return set_kv(w, key, GGUF_FLOAT32, &b);
}

int gguf_writer_set_bool(gguf_writer *w, const char *key, bool v)
{
    wbuf b = {0};
    uint8_t byte = v ? 1 : 0;
    wb_put(&b, &byte, 1);
    return set_kv(w, key, GGUF_BOOL, &b);
}

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *v)
{
    wbuf b = {0};
    wb_str(&b, v, strlen(v));
    return set_kv(w, key, GGUF_STRING, &b);
}

int gguf_writer_set_arr(gguf_writer *w, const char *key, enum gguf_value_type elem_type,
                        const void *data, uint64_t count)
{
    size_t es = value_type_size((uint32_t)elem_type);
    if (es == 0)
        return writer_fail(w, "array of non-fixed-size elements for key", key);
    if (count > SIZE_MAX / es)
        return writer_fail(w, "array too large for key", key);
    wbuf b = {0};
    wb_u32(&b, (uint32_t)elem_type);
    wb_u64(&b, count);
    if (elem_type == GGUF_BOOL) {
        /* Normalised so every reader sees 0 or 1. */
        for (uint64_t i = 0; i < count; i++) {
            uint8_t byte = ((const bool *)data)[i] ? 1 : 0;
            wb_put(&b, &byte, 1);
        }
    } else {
        /* The host is little-endian (x86-64, arm64), so elements go out as they are. */
        wb_put(&b, data, (size_t)(count * es));
    }
    return set_kv(w, key, GGUF_ARRAY, &b);
}

int gguf_writer_set_str_arr(gguf_writer *w, const char *key, const char *const *strs,
                            uint64_t count)
{
    wbuf b = {0};
    wb_u32(&b, GGUF_STRING);
    wb_u64(&b, count);
    for (uint64_t i = 0; i < count; i++)
        wb_str(&b, strs[i], strlen(strs[i]));
    return set_kv(w, key, GGUF_ARRAY, &b);
}

int gguf_writer_copy_kv(gguf_writer *w, const gguf_file *src, int64_t i)
{
    if (i < 0 || i >= src->n_kv)
        return writer_fail(w, "copy_kv: metadata index out of range", NULL);
    const gguf_kv *kv = &src->kvs[i];
    char *key = strndup(kv->key.ptr, (size_t)kv->key.len);
    if (!key)
        return writer_fail(w, "out of memory copying a key", NULL);
    wbuf b = {0};
    wb_put(&b, kv->raw, (size_t)kv->raw_len);
    int rc = set_kv(w, key, kv->type, &b);
    free(key);
    return rc;
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                           const int64_t *ne, const void *data)
{
    const quant_traits *tr = quant_traits_of(type);
    if (!tr)
        return writer_fail(w, "unknown tensor type for tensor", name);
    if (name[0] == '\0')
        return writer_fail(w, "empty tensor name", name);
    if (n_dims < 1 || n_dims > GGUF_MAX_DIMS)
        return writer_fail(w, "n_dims not in 1..4 for tensor", name);
    wtensor t = {.type = type, .n_dims = n_dims, .data = data};
    uint64_t rows = 1;
    for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
        t.ne[d] = d < n_dims ? ne[d] : 1;
        if (t.ne[d] < 0)
            return writer_fail(w, "negative dimension for tensor", name);
        if (d > 0 && __builtin_mul_overflow(rows, (uint64_t)t.ne[d], &rows))
            return writer_fail(w, "size overflow for tensor", name);
    }
    if (t.ne[0] % tr->block_size != 0)
        return writer_fail(w, "ne[0] not a multiple of the block size for tensor", name);
    uint64_t bytes;
    if (__builtin_mul_overflow((uint64_t)quant_row_bytes(type, t.ne[0]), rows, &bytes) ||
        bytes > SIZE_MAX)
        return writer_fail(w, "size overflow for tensor", name);
    t.bytes = (size_t)bytes;
    if (!data && t.bytes > 0)
        return writer_fail(w, "no data for tensor", name);
    for (size_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0)
            return writer_fail(w, "duplicate tensor name", name);
    if (w->n_tensors == w->cap_tensors) {
        size_t cap = w->cap_tensors ? w->cap_tensors * 2 : 64;
        wtensor *ts = realloc(w->tensors, cap * sizeof *ts);
        if (!ts)
            return writer_fail(w, "out of memory adding tensor", name);
        w->tensors = ts;
        w->cap_tensors = cap;
    }
    t.name = strdup(name);
    if (!t.name)
        return writer_fail(w, "out of memory adding tensor", name);
    w->tensors[w->n_tensors++] = t;
    return 0;
}

static size_t align_up(size_t x, size_t a)
{
    return (x + a - 1) / a * a;
}

static int writer_alignment(const gguf_writer *w, size_t *alignment, char *err)
{
    *alignment = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, "general.alignment") != 0)
            continue;
        if (w->kvs[i].type != GGUF_UINT32)
            return err_set(err, "general.alignment must be a uint32");
        uint32_t a = le32(w->kvs[i].val);
        if (!is_pow2(a))
            return err_set(err, "general.alignment %u is not a power of two", a);
        *alignment = a;
    }
    return 0;
}

static int write_bytes(FILE *f, const void *p, size_t n)
{
    return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1;
}

static int write_padding(FILE *f, size_t pos, size_t alignment)
{
    static const uint8_t zeros[256];
    size_t pad = align_up(pos, alignment) - pos;
    while (pad > 0) {
        size_t n = pad < sizeof zeros ? pad : sizeof zeros;
        if (write_bytes(f, zeros, n))
            return -1;
        pad -= n;
    }
    return 0;
}

/* Writes header, metadata and tensor infos (they are small) from one buffer, then
 * streams the tensor data. */
static int write_file(const gguf_writer *w, FILE *f, size_t alignment)
{
    wbuf b = {0};
    wb_put(&b, "GGUF", 4);
    wb_u32(&b, 3);
    wb_u64(&b, w->n_tensors);
    wb_u64(&b, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        wb_str(&b, w->kvs[i].key, strlen(w->kvs[i].key));
        wb_u32(&b, w->kvs[i].type);
        wb_put(&b, w->kvs[i].val, w->kvs[i].val_len);
    }
    size_t offset = 0;
    for (size_t i = 0; i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        wb_str(&b, t->name, strlen(t->name));
        wb_u32(&b, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            wb_u64(&b, (uint64_t)t->ne[d]);
        wb_u32(&b, t->type);
        wb_u64(&b, offset);
        if (t->bytes > SIZE_MAX - alignment - offset) {
            free(b.p);
            errno = EOVERFLOW;
            return -1;
        }
        offset += align_up(t->bytes, alignment);
    }
    if (b.failed)
        errno = ENOMEM;
    int rc = b.failed || write_bytes(f, b.p, b.n) || write_padding(f, b.n, alignment) ? -1 : 0;
    free(b.p);
    for (size_t i = 0; rc == 0 && i < w->n_tensors; i++) {
        const wtensor *t = &w->tensors[i];
        rc = write_bytes(f, t->data, t->bytes) || write_padding(f, t->bytes, alignment) ? -1 : 0;
    }
    return rc;
}

int gguf_writer_write(gguf_writer *w, const char *path, char err[ERR_MAX])
{
    if (w->err[0])
        return err_set(err, "%s: an earlier call failed: %s", path, w->err);
    size_t alignment;
    if (writer_alignment(w, &alignment, err))
        return -1;
    FILE *f = fopen(path, "wb");
    if (!f)
        return err_set(err, "%s: %s", path, strerror(errno));
    int rc = write_file(w, f, alignment);
    int saved = errno;
    if (fclose(f) != 0 && rc == 0) {
        rc = -1;
        saved = errno;
    }
    if (rc) {
        unlink(path);
        return err_set(err, "%s: write failed: %s", path, strerror(saved));
    }
    return 0;
}
