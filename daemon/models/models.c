/*
 * models.c — the model registry: building it from the settings, resolving a request's
 * model, loading and unloading at run time, and what each model holds in memory.
 */
#include "daemon/models/models.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/models/genmodel.h"
#include "engine/quant/quant.h"

struct models {
    models_entry *head;
    int threads;              /* engine threads of the encoders' runners */
    gguf_load load;           /* how the generate model came into memory */
    bool repack;              /* its weights are repacked (they do not stream) */
    /* What models_view_update copies out, rewritten by view_publish after every change;
     * the lock is the only thing other threads touch. */
    pthread_mutex_t view_lock;
    models_view_entry *view;  /* (view_cap) entries, view_n of them in use */
    size_t view_n, view_cap;
    uint64_t view_version;
};

static const char *const role_names[] = {"generate", "embed", "rerank", "draft"};
#define N_ROLES (int)(sizeof role_names / sizeof role_names[0])

const char *models_role_name(enum models_role role)
{
    for (int i = 0; i < N_ROLES; i++)
        if (role == 1u << i)
            return role_names[i];
    return "?";
}

const char *models_type_name(enum models_type t)
{
    return t == MODELS_DECODER ? "decoder" : t == MODELS_ENCODER ? "encoder" : "cross-encoder";
}

bool models_name_ok(const char *name)
{
    size_t n = strnlen(name, MODELS_NAME_MAX + 1);
    if (n == 0 || n > MODELS_NAME_MAX)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)name[i]) && !strchr("._-", name[i]))
            return false;
    return true;
}

int models_parse_roles(const char *s, unsigned *roles, char err[ERR_MAX])
{
    *roles = 0;
    while (*s) {
        size_t len = strcspn(s, ",");
        unsigned bit = 0;
        for (int i = 0; i < N_ROLES; i++)
            if (strlen(role_names[i]) == len && strncmp(s, role_names[i], len) == 0)
                bit = 1u << i;
        if (!bit || (*roles & bit))
            return err_set(err, "roles '%.64s': each of generate, embed, rerank, draft at most "
                                "once", s);
        *roles |= bit;
        s += len + (s[len] == ',');
    }
    return 0;
}

/* Writes "a, b, c" (the registry's names) into buf. */
static void list_names(const models *r, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (const models_entry *e = r->head; e && n < cap; e = e->next) {
        int w = snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", e->name);
        n += w > 0 ? (size_t)w : 0;
    }
}

static void list_roles(unsigned roles, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_ROLES && n < cap; i++)
        if (roles & (1u << i)) {
            int w = snprintf(buf + n, cap - n, "%s%s", n ? "," : "", role_names[i]);
            n += w > 0 ? (size_t)w : 0;
        }
    if (!n)
        snprintf(buf, cap, "none");
}

/* Whether some model other than except has role explicitly. */
static bool role_taken(const models *r, const models_entry *except, unsigned role)
{
    for (const models_entry *e = r->head; e; e = e->next)
        if (e != except && (e->roles & role))
            return true;
    return false;
}

static unsigned effective_roles(const models *r, const models_entry *e)
{
    unsigned roles = e->roles;
    for (unsigned bit = 1; bit <= MODELS_RERANK; bit <<= 1)
        if ((e->fallback & bit) && !role_taken(r, e, bit))
            roles |= bit;
    return roles;
}

models_entry *models_generate(models *r)
{
    for (models_entry *e = r->head; e; e = e->next)
        if (e->roles & MODELS_GENERATE)
            return e;
    return NULL;
}

const models_entry *models_first(const models *r)
{
    return r->head;
}

static models_entry *find_name(const models *r, const char *name)
{
    for (models_entry *e = r->head; e; e = e->next)
        if (strcmp(e->name, name) == 0)
            return e;
    return NULL;
}

models_entry *models_find(models *r, const char *name)
{
    return find_name(r, name);
}

/* The entry whose file is path's file (same device and inode), if any; an adapter
 * model's path is an adapter's, which several may share. */
static models_entry *find_file(const models *r, const char *path)
{
    struct stat a, b;
    if (stat(path, &a) != 0)
        return NULL;
    for (models_entry *e = r->head; e; e = e->next)
        if (!e->base && stat(e->path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino)
            return e;
    return NULL;
}

static models_entry *default_for(const models *r, unsigned role)
{
    for (models_entry *e = r->head; e; e = e->next)
        if (e->roles & role)
            return e;
    for (models_entry *e = r->head; e; e = e->next)
        if (e->fallback & role)
            return e;
    return NULL;
}

bool models_is_default(const models *r, const models_entry *e, enum models_role role)
{
    return default_for(r, role) == e;
}

Llms__ErrorCode models_resolve(models *r, const char *name, enum models_role role,
                               models_entry **out, char err[ERR_MAX])
{
    char names[512];
    *out = NULL;
    if (!name || !name[0]) {
        if (!(*out = default_for(r, role))) {
            list_names(r, names, sizeof names);
            err_set(err, "no model has the %s role (models: %s)", models_role_name(role), names);
            return LLMS__ERROR_CODE__FAILED_PRECONDITION;
        }
        return LLMS__ERROR_CODE__OK;
    }
    models_entry *e = models_name_ok(name) ? find_name(r, name) : NULL;
    if (!e) {
        list_names(r, names, sizeof names);
        if (models_name_ok(name))
            err_set(err, "no model '%s' (models: %s)", name, names);
        else
            err_set(err, "no such model: a name is 1..%d bytes of [A-Za-z0-9._-] (models: %s)",
                    MODELS_NAME_MAX, names);
        return LLMS__ERROR_CODE__NOT_FOUND;
    }
    unsigned roles = effective_roles(r, e);
    if (!(roles & role)) {
        char have[64];
        list_roles(roles, have, sizeof have);
        err_set(err, "model '%s' has no %s role (its roles: %s)", e->name,
                models_role_name(role), have);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    *out = e;
    return LLMS__ERROR_CODE__OK;
}

static size_t count_entries(const models *r)
{
    size_t n = 0;
    for (const models_entry *e = r->head; e; e = e->next)
        n++;
    return n;
}

/* Room in the published view for n models, made before the registry grows so that
 * publishing (after an unload too) never allocates. 0, or -1 when memory runs out. */
static int view_reserve(models *r, size_t n)
{
    int rc = 0;
    pthread_mutex_lock(&r->view_lock);
    if (n > r->view_cap) {
        models_view_entry *v = realloc(r->view, n * sizeof *v);
        if (v) {
            r->view = v;
            r->view_cap = n;
        } else {
            rc = -1;
        }
    }
    pthread_mutex_unlock(&r->view_lock);
    return rc;
}

/* Rewrites the published view from the registry, into the room view_reserve made. */
static void view_publish(models *r)
{
    pthread_mutex_lock(&r->view_lock);
    size_t n = 0;
    for (const models_entry *e = r->head; e && n < r->view_cap; e = e->next, n++) {
        models_view_entry *v = &r->view[n];
        memcpy(v->name, e->name, sizeof v->name);
        v->roles = effective_roles(r, e);
        v->defaults = 0;
        for (unsigned bit = 1; bit <= MODELS_RERANK; bit <<= 1)
            if (default_for(r, bit) == e)
                v->defaults |= bit;
        v->family = e->family;
        memcpy(v->arch, e->arch, sizeof v->arch);
        memcpy(v->path, e->path, sizeof v->path);
        v->file_bytes = e->file_bytes;
        v->file_mtime = e->file_mtime;
        v->n_params = e->n_params;
        memcpy(v->quant, e->quant, sizeof v->quant);
        snprintf(v->base, sizeof v->base, "%s", e->base ? e->base->name : "");
        memcpy(v->lora_spec, e->lora_spec, sizeof v->lora_spec);
    }
    r->view_n = n;
    r->view_version++;
    pthread_mutex_unlock(&r->view_lock);
}

int models_view_update(models *r, models_view *v)
{
    int rc = 0;
    pthread_mutex_lock(&r->view_lock);
    if (v->version != r->view_version) {
        if (r->view_n > v->cap) {
            models_view_entry *e = realloc(v->entries, r->view_n * sizeof *e);
            if (e) {
                v->entries = e;
                v->cap = r->view_n;
            }
        }
        if (r->view_n <= v->cap) {
            memcpy(v->entries, r->view, r->view_n * sizeof *v->entries);
            v->n = r->view_n;
            v->version = r->view_version;
        } else {
            rc = -1;
        }
    }
    pthread_mutex_unlock(&r->view_lock);
    return rc;
}

void models_view_free(models_view *v)
{
    free(v->entries);
    *v = (models_view){0};
}

/* The name of a file: its base name without ".gguf". */
static int name_of_path(const char *path, char name[MODELS_NAME_MAX + 1], char err[ERR_MAX])
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t n = strlen(base);
    if (n > 5 && strcmp(base + n - 5, ".gguf") == 0)
        n -= 5;
    if (n == 0 || n > MODELS_NAME_MAX)
        return err_set(err, "%s: the file name makes no model name (1..%d bytes of "
                            "[A-Za-z0-9._-]): give it one with a model.NAME line",
                       path, MODELS_NAME_MAX);
    memcpy(name, base, n);
    name[n] = '\0';
    if (!models_name_ok(name))
        return err_set(err, "%s: the file name makes no model name (1..%d bytes of "
                            "[A-Za-z0-9._-]): give it one with a model.NAME line",
                       path, MODELS_NAME_MAX);
    return 0;
}

/* Reads the file's kind (architecture, decoder or encoder, a classification head). */
/*
 * Reads the hyperparameters and checks every tensor's shape against them, as a load for
 * any role would, so that a corrupt file is refused when it is loaded and not at the
 * first request of a role that opens it lazily (a reranker's).
 */
static int check_shapes(const gguf_file *g, enum models_type type, char err[ERR_MAX])
{
    if (type == MODELS_DECODER) {
        model *m = model_from_gguf(g, err);
        model_free(m);
        return m ? 0 : -1;
    }
    bert_model *b = bert_from_gguf(g, err);
    bert_free(b);
    return b ? 0 : -1;
}

/* llama.cpp's names of general.file_type (enum llama_ftype), for the types real files
 * have; NULL for another value. */
static const char *ftype_name(uint32_t t)
{
    static const char *const names[] = {
        [0] = "F32",     [1] = "F16",     [2] = "Q4_0",    [3] = "Q4_1",    [7] = "Q8_0",
        [8] = "Q5_0",    [9] = "Q5_1",    [10] = "Q2_K",   [11] = "Q3_K_S", [12] = "Q3_K_M",
        [13] = "Q3_K_L", [14] = "Q4_K_S", [15] = "Q4_K_M", [16] = "Q5_K_S", [17] = "Q5_K_M",
        [18] = "Q6_K",   [32] = "BF16",
    };
    return t < sizeof names / sizeof names[0] ? names[t] : NULL;
}

/* e's parameter count and the name of its weights' type: general.file_type when the
 * file names one, else the tensor type that holds most of its bytes. */
static void describe_weights(models_entry *e, const gguf_file *g)
{
    uint64_t bytes_of[QTYPE_COUNT] = {0};
    e->n_params = 0;
    for (int64_t i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        uint64_t n = 1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            n *= (uint64_t)t->ne[d];
        e->n_params += n;
        if (t->type < QTYPE_COUNT)
            bytes_of[t->type] += t->bytes;
    }
    uint32_t ftype;
    const char *name = gguf_get_u32(g, "general.file_type", &ftype) ? ftype_name(ftype) : NULL;
    if (!name) {
        uint32_t most = 0;
        for (uint32_t t = 1; t < QTYPE_COUNT; t++)
            if (bytes_of[t] > bytes_of[most])
                most = t;
        const quant_traits *q = quant_traits_of(most);
        name = q ? q->name : "";
    }
    snprintf(e->quant, sizeof e->quant, "%s", name);
}

static int probe(models_entry *e, char err[ERR_MAX])
{
    char why[ERR_MAX];
    struct stat st;
    if (stat(e->path, &st) != 0)
        return err_set(err, "%s: %s", e->path, strerror(errno));
    e->file_bytes = (uint64_t)st.st_size;
    e->file_mtime = (int64_t)st.st_mtime;
    gguf_file *g = gguf_open(e->path, why);
    if (!g)
        return err_set(err, "%s: %s", e->path, why);
    gguf_str a;
    int rc = 0;
    if (!gguf_get_str(g, "general.architecture", &a)) {
        rc = err_set(err, "%s: no general.architecture", e->path);
    } else {
        snprintf(e->arch, sizeof e->arch, "%.*s", (int)(a.len < 31 ? a.len : 31), a.ptr);
        /* nomic-bert's head, if a file had one, is not read (bert.h) */
        if (bert_is_encoder(g))
            e->type = gguf_str_eq(a, "bert") && gguf_find_tensor(g, "cls.output.weight")
                          ? MODELS_CROSS_ENCODER
                          : MODELS_ENCODER;
        else if (model_arch_from_name(a.ptr, a.len) >= 0)
            e->type = MODELS_DECODER;
        else
            rc = err_set(err, "%s: architecture '%s' is none this llmsd serves (llama, qwen2, "
                              "qwen3, phi3, granite, qwen2moe, qwen3moe, olmoe, gemma, gemma2, "
                              "gemma3, olmo2, granitemoe, smollm3, exaone, exaone4, stablelm, "
                              "mistral3, glm4, chatglm, command-r, cohere2, starcoder2, phi2, "
                              "seed_oss, hunyuan-dense, internlm2, ernie4_5, xverse, deepseek2, "
                              "ernie4_5-moe, glm4moe, qwen2vl, qwen3vl, qwen3vlmoe, gpt-oss, "
                              "bert, nomic-bert, gemma-embedding)", e->path,
                              e->arch);
    }
    if (rc == 0 && check_shapes(g, e->type, why) < 0)
        rc = err_set(err, "%s: %s", e->path, why);
    if (rc == 0)
        describe_weights(e, g);
    gguf_close(g);
    return rc;
}

/* Whether the file's kind can take the roles; -1 + err naming the first it cannot. */
static int roles_fit(const models_entry *e, unsigned roles, char err[ERR_MAX])
{
    if ((roles & MODELS_GENERATE) && e->type != MODELS_DECODER)
        return err_set(err, "model '%s': an %s cannot generate", e->name,
                       models_type_name(e->type));
    if ((roles & MODELS_DRAFT) && e->type != MODELS_DECODER)
        return err_set(err, "model '%s': an %s cannot draft (a decoder drafts)", e->name,
                       models_type_name(e->type));
    if ((roles & MODELS_RERANK) && e->type == MODELS_ENCODER)
        return err_set(err, "model '%s': a bert encoder without a classification head "
                            "(cls.output) cannot rerank", e->name);
    return 0;
}

bool models_embeds_apart(const models *r, const models_entry *e)
{
    return e->type == MODELS_DECODER && (e->roles & (MODELS_EMBED | MODELS_DRAFT)) &&
           e != models_generate((models *)r);
}

static unsigned kind_roles(enum models_type t, bool decoder_generates)
{
    if (t == MODELS_ENCODER)
        return MODELS_EMBED;
    return t == MODELS_DECODER && decoder_generates ? MODELS_GENERATE : MODELS_RERANK;
}

static void entry_free(models_entry *e)
{
    if (!e)
        return;
    rerank_close(e->rr);
    embed_free(e->dec_emb);
    kv_pool_free(e->dec_pool);
    model_runner_free(e->dec_r);
    bert_runner_free(e->enc_r);
    tok_free(e->embed_tok);
    bert_free(e->enc);
    model_free(e->m); /* an adapter model's view goes before its adapters */
    for (int i = 0; i < e->n_lora; i++)
        lora_free(e->lora[i]);
    free(e);
}

/* A decoder's runner and KV pool apart from the steps (for its embeddings, or its
 * drafts), with its tokenizer; an embedder when it embeds, once its pooling is known to
 * give a vector per text. */
static int open_decoder_apart(models_entry *e, int threads, char err[ERR_MAX])
{
    enum embed_pooling pooling;
    char why[ERR_MAX];
    if ((e->roles & MODELS_EMBED) && embed_pooling_of_model(e->m, &pooling, why) < 0)
        return err_set(err, "it cannot have the embed role: %s", why);
    int n_ctx = model_hparams_of(e->m)->n_ctx;
    int max_kv = n_ctx < MODELS_EMBED_MAX_TOKENS ? n_ctx : MODELS_EMBED_MAX_TOKENS;
    if (tok_load(model_gguf(e->m), &e->embed_tok, err) < 0 ||
        !(e->dec_r = model_runner_new(e->m, threads, 0, max_kv, err)) ||
        !(e->dec_pool = kv_pool_new(model_kv_shape(e->m), 0, err)))
        return -1;
    if ((e->roles & MODELS_EMBED) && !(e->dec_emb = embed_new(e->m, e->dec_r, e->dec_pool, err)))
        return -1;
    return 0;
}

/* An adapter model's adapters, each checked against its base's model, and the view of
 * that model with them. */
static int open_lora(models_entry *e, char err[ERR_MAX])
{
    char path[CONFIG_PATH_MAX], why[ERR_MAX];
    float scales[CONFIG_LORA_ADAPTERS_MAX], scale;
    _Static_assert(CONFIG_LORA_ADAPTERS_MAX <= MODEL_LORA_MAX, "a model takes every adapter");
    const char *p = e->lora_spec;
    int rc;
    while ((rc = config_lora_next(&p, path, &scale, why)) == 1) {
        if (e->n_lora == CONFIG_LORA_ADAPTERS_MAX)
            return err_set(err, "model '%s': at most %d adapters", e->name,
                           CONFIG_LORA_ADAPTERS_MAX);
        if (!(e->lora[e->n_lora] = lora_load(e->base->m, path, why)))
            return err_set(err, "model '%s' (adapters of '%s'): %s", e->name, e->base->name, why);
        scales[e->n_lora++] = scale;
    }
    if (rc < 0)
        return err_set(err, "model '%s': %s", e->name, why);
    if (!(e->m = model_with_loras(e->base->m, e->n_lora, (const lora *const *)e->lora, scales,
                                  why)))
        return err_set(err, "model '%s': %s", e->name, why);
    e->family = e->base->family; /* at load time; models_open sets it again after the
                                    chat_template setting */
    return 0;
}

/* Opens what e's roles need now (the reranker waits for its first call); apart: e
 * embeds on its own runner (models_embeds_apart). */
static int entry_open(models_entry *e, int threads, gguf_load load, bool repack, bool apart,
                      char err[ERR_MAX])
{
    char why[ERR_MAX];
    if (e->base)
        return open_lora(e, err);
    if ((e->roles & MODELS_GENERATE) || apart) {
        if (!(e->m = model_load_as(e->path, load, why)) ||
            ((e->roles & MODELS_GENERATE) && repack && model_repack_weights(e->m, why) < 0))
            return err_set(err, "model '%s' (%s): %s", e->name, e->path, why);
        e->copied = load == GGUF_LOAD_COPY;
        if (e->roles & MODELS_GENERATE)
            e->family = chat_detect_file(model_gguf(e->m));
    }
    if (apart && open_decoder_apart(e, threads, why) < 0)
        return err_set(err, "model '%s' (%s): %s", e->name, e->path, why);
    if ((e->roles & MODELS_EMBED) && e->type != MODELS_DECODER) {
        if (!(e->enc = bert_load(e->path, why)))
            return err_set(err, "model '%s' (%s): %s", e->name, e->path, why);
        if (tok_load(bert_gguf(e->enc), &e->embed_tok, why) < 0)
            return err_set(err, "model '%s' (%s): tokenizer: %s", e->name, e->path, why);
        if (!(e->enc_r = bert_runner_new(e->enc, threads, 0, why)))
            return err_set(err, "model '%s' (%s): %s", e->name, e->path, why);
    }
    return 0;
}

static models_entry *entry_new(const char *name, const char *path, char err[ERR_MAX])
{
    models_entry *e = calloc(1, sizeof *e);
    if (!e) {
        err_set(err, "out of memory");
        return NULL;
    }
    if (strlen(name) > MODELS_NAME_MAX || strlen(path) >= sizeof e->path) {
        free(e);
        err_set(err, "model name or path too long");
        return NULL;
    }
    strcpy(e->name, name);
    strcpy(e->path, path);
    if (probe(e, err) < 0) {
        free(e);
        return NULL;
    }
    return e;
}

/* An adapter model's entry, not yet open: base's weights and the adapters of a lora line
 * (their files must exist). NULL + err. */
static models_entry *lora_entry_new(const char *name, models_entry *base, const char *adapters,
                                    char err[ERR_MAX])
{
    if (base->type != MODELS_DECODER || !(base->roles & MODELS_GENERATE)) {
        err_set(err, "model '%s' does not generate: an adapter model's base is a generate "
                     "model", base->name);
        return NULL;
    }
    if (base->base) {
        err_set(err, "model '%s' is an adapter model itself: give its base and all the "
                     "adapters", base->name);
        return NULL;
    }
    models_entry *e = calloc(1, sizeof *e);
    if (!e) {
        err_set(err, "out of memory");
        return NULL;
    }
    if (strlen(name) > MODELS_NAME_MAX || strlen(adapters) >= sizeof e->lora_spec) {
        free(e);
        err_set(err, "model name or adapters too long");
        return NULL;
    }
    strcpy(e->name, name);
    strcpy(e->lora_spec, adapters);
    e->base = base;
    e->type = MODELS_DECODER;
    e->roles = MODELS_GENERATE;
    memcpy(e->arch, base->arch, sizeof e->arch);
    memcpy(e->quant, base->quant, sizeof e->quant);
    e->n_params = base->n_params;
    char path[CONFIG_PATH_MAX], why[ERR_MAX];
    float scale;
    int n = 0, rc;
    for (const char *p = adapters; (rc = config_lora_next(&p, path, &scale, why)) == 1; n++) {
        struct stat st;
        if (stat(path, &st) != 0) {
            err_set(err, "%s: %s", path, strerror(errno));
            free(e);
            return NULL;
        }
        if (n == 0)
            strcpy(e->path, path);
        e->file_bytes += (uint64_t)st.st_size;
        e->file_mtime = (int64_t)st.st_mtime > e->file_mtime ? (int64_t)st.st_mtime : e->file_mtime;
    }
    if (rc < 0 || n == 0) {
        err_set(err, "%s", rc < 0 ? why : "no adapter given");
        free(e);
        return NULL;
    }
    return e;
}

static void append(models *r, models_entry *e)
{
    models_entry **pp = &r->head;
    while (*pp)
        pp = &(*pp)->next;
    *pp = e;
}

/* A shorthand key (model, embed_model, rerank_model): its file joins the entry that
 * already has it, else becomes a model named after the file. */
static int add_shorthand(models *r, const char *key, const char *path, unsigned role,
                         unsigned fallback, char err[ERR_MAX])
{
    models_entry *e = find_file(r, path);
    if (e) {
        e->roles |= role;
        e->fallback &= ~role;
        return roles_fit(e, e->roles, err);
    }
    char name[MODELS_NAME_MAX + 1], why[ERR_MAX];
    if (name_of_path(path, name, why) < 0)
        return err_set(err, "%s: %s", key, why);
    if (find_name(r, name))
        return err_set(err, "%s: model name '%s' is taken by another file: give one of them "
                            "a name with a model.NAME line", key, name);
    if (!(e = entry_new(name, path, why)))
        return err_set(err, "%s: %s", key, why);
    e->roles = role;
    e->fallback = fallback;
    append(r, e);
    if (roles_fit(e, role, why) < 0)
        return err_set(err, "%s: %s", key, why);
    return 0;
}

/* The settings' model.NAME lines, each with its roles (or its kind's), none sharing a
 * name or a file with another. */
static int add_named_models(models *r, const config *cfg, char err[ERR_MAX])
{
    char why[ERR_MAX];
    for (int i = 0; i < cfg->n_models; i++) {
        const config_model *cm = &cfg->models[i];
        unsigned roles;
        models_entry *e;
        if (models_parse_roles(cm->roles, &roles, why) < 0) {
            err_set(err, "model.%s: %s", cm->name, why);
            return -1;
        }
        if (find_name(r, cm->name)) {
            err_set(err, "model.%s: the name is taken (a shorthand key's file name)", cm->name);
            return -1;
        }
        if ((e = find_file(r, cm->path))) {
            err_set(err, "model.%s: %s is model '%s' already (a file is mapped once: give "
                         "that model every role)", cm->name, cm->path, e->name);
            return -1;
        }
        if (!(e = entry_new(cm->name, cm->path, why))) {
            err_set(err, "model.%s: %s", cm->name, why);
            return -1;
        }
        e->roles = roles ? roles : kind_roles(e->type, true);
        append(r, e);
        if (roles_fit(e, e->roles, why) < 0) {
            err_set(err, "model.%s: %s", cm->name, why);
            return -1;
        }
    }
    return 0;
}

/* The settings' lora.NAME lines: adapter models over models already listed. */
static int add_adapter_models(models *r, const config *cfg, char err[ERR_MAX])
{
    char why[ERR_MAX];
    for (int i = 0; i < cfg->n_loras; i++) {
        const config_lora *cl = &cfg->loras[i];
        models_entry *e, *base = find_name(r, cl->base);
        char names[512];
        if (find_name(r, cl->name)) {
            err_set(err, "lora.%s: the name is taken by another model", cl->name);
            return -1;
        }
        if (!base) {
            list_names(r, names, sizeof names);
            err_set(err, "lora.%s: no model '%s' to be its base (models: %s)", cl->name,
                    cl->base, names);
            return -1;
        }
        if (!(e = lora_entry_new(cl->name, base, cl->adapters, why))) {
            err_set(err, "lora.%s: %s", cl->name, why);
            return -1;
        }
        append(r, e);
    }
    return 0;
}

models *models_open(const config *cfg, gguf_load load, char err[ERR_MAX])
{
    models *r = calloc(1, sizeof *r);
    if (!r) {
        err_set(err, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&r->view_lock, NULL);
    r->threads = cfg->threads;
    r->load = load;
    /* batched decode's kernels read repacked Q8_0 weights fastest; streamed weights, and
     * the GPU's copies, are read from the file as it stores them */
    r->repack = cfg->resident_small_mb < 0 && !strcmp(cfg->device, "cpu");
    /* The shorthands come first: they are the defaults of their roles. */
    if ((cfg->model[0] && add_shorthand(r, "model", cfg->model, MODELS_GENERATE,
                                        MODELS_EMBED | MODELS_RERANK, err) < 0) ||
        (cfg->embed_model[0] &&
         add_shorthand(r, "embed_model", cfg->embed_model, MODELS_EMBED, 0, err) < 0) ||
        (cfg->rerank_model[0] &&
         add_shorthand(r, "rerank_model", cfg->rerank_model, MODELS_RERANK, 0, err) < 0))
        goto fail;
    /* adapter models last: their bases are known, and opened before them */
    if (add_named_models(r, cfg, err) || add_adapter_models(r, cfg, err))
        goto fail;
    if (!models_generate(r)) {
        err_set(err, "no generate model: set model = PATH or give a model.NAME line the "
                     "generate role");
        goto fail;
    }
    for (models_entry *e = r->head; e; e = e->next)
        if (entry_open(e, r->threads, load, r->repack, models_embeds_apart(r, e), err) < 0)
            goto fail;
    /* the setting names the template of the file `model` names, whatever the file says */
    models_entry *named = cfg->model[0] ? find_file(r, cfg->model) : NULL;
    if (named && strcmp(cfg->chat_template, "auto") != 0)
        named->family = chat_detect(cfg->chat_template);
    /* an adapter model chats as its base (a fine-tune keeps its base's template) */
    for (models_entry *e = r->head; e; e = e->next)
        if (e->base)
            e->family = e->base->family;
    if (view_reserve(r, count_entries(r)) < 0) {
        err_set(err, "out of memory");
        goto fail;
    }
    view_publish(r);
    return r;
fail:
    models_free(r);
    return NULL;
}

void models_free(models *r)
{
    if (!r)
        return;
    while (r->head) {
        models_entry *e = r->head;
        r->head = e->next;
        entry_free(e);
    }
    free(r->view);
    pthread_mutex_destroy(&r->view_lock);
    free(r);
}

Llms__ErrorCode models_load(models *r, const char *name, const char *path, unsigned roles,
                            char err[ERR_MAX])
{
    char why[ERR_MAX];
    if (!models_name_ok(name)) {
        err_set(err, "a model name is 1..%d bytes of [A-Za-z0-9._-]", MODELS_NAME_MAX);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (!path[0] || strlen(path) >= CONFIG_PATH_MAX) {
        err_set(err, "the path must be 1..%d bytes", CONFIG_PATH_MAX - 1);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (roles & MODELS_DRAFT) {
        err_set(err, "the draft role is given at start: draft_model names the model.NAME line "
                     "of the model that drafts");
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    models_entry *e = find_name(r, name);
    if (e) {
        err_set(err, "model '%s' is loaded already (%s)", name, e->path);
        return LLMS__ERROR_CODE__FAILED_PRECONDITION;
    }
    if ((e = find_file(r, path))) {
        err_set(err, "%s is model '%s' already (a file is mapped once)", path, e->name);
        return LLMS__ERROR_CODE__FAILED_PRECONDITION;
    }
    if (!(e = entry_new(name, path, why))) {
        err_set(err, "model '%s': %s", name, why);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    e->roles = roles ? roles : kind_roles(e->type, false);
    if (roles_fit(e, e->roles, err) < 0) {
        entry_free(e);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    /* not yet in the registry, so never its default generate model */
    if (entry_open(e, r->threads, r->load, r->repack, models_embeds_apart(r, e), err) < 0) {
        entry_free(e);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (view_reserve(r, count_entries(r) + 1) < 0) {
        entry_free(e);
        err_set(err, "out of memory");
        return LLMS__ERROR_CODE__INTERNAL;
    }
    append(r, e);
    view_publish(r);
    return LLMS__ERROR_CODE__OK;
}

Llms__ErrorCode models_load_lora(models *r, const char *name, const char *base,
                                 const char *adapters, char err[ERR_MAX])
{
    char why[ERR_MAX], names[512];
    if (!models_name_ok(name)) {
        err_set(err, "a model name is 1..%d bytes of [A-Za-z0-9._-]", MODELS_NAME_MAX);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    models_entry *e = find_name(r, name), *b = models_name_ok(base) ? find_name(r, base) : NULL;
    if (e) {
        err_set(err, "model '%s' is loaded already", name);
        return LLMS__ERROR_CODE__FAILED_PRECONDITION;
    }
    if (!b) {
        list_names(r, names, sizeof names);
        err_set(err, "no model '%.64s' to be the base of '%s' (models: %s)", base, name, names);
        return LLMS__ERROR_CODE__NOT_FOUND;
    }
    if (!(e = lora_entry_new(name, b, adapters, why))) {
        err_set(err, "model '%s': %s", name, why);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (open_lora(e, err) < 0) {
        entry_free(e);
        return LLMS__ERROR_CODE__INVALID_ARGUMENT;
    }
    if (view_reserve(r, count_entries(r) + 1) < 0) {
        entry_free(e);
        err_set(err, "out of memory");
        return LLMS__ERROR_CODE__INTERNAL;
    }
    append(r, e);
    view_publish(r);
    return LLMS__ERROR_CODE__OK;
}

Llms__ErrorCode models_unload(models *r, const char *name, char err[ERR_MAX])
{
    models_entry **pp = &r->head;
    while (*pp && strcmp((*pp)->name, name) != 0)
        pp = &(*pp)->next;
    models_entry *e = *pp;
    if (!e || !models_name_ok(name)) {
        char names[512];
        list_names(r, names, sizeof names);
        if (models_name_ok(name))
            err_set(err, "no model '%s' (models: %s)", name, names);
        else
            err_set(err, "no such model (models: %s)", names);
        return LLMS__ERROR_CODE__NOT_FOUND;
    }
    if (e == models_generate(r)) {
        err_set(err, "model '%s' is the default generate model: retrieval, prediction, "
                     "decoder embeddings and contexts of unloaded models depend on it "
                     "(restart llmsd with another)", name);
        return LLMS__ERROR_CODE__FAILED_PRECONDITION;
    }
    if (e->running > 0) {
        err_set(err, "model '%s' has %d request%s running: unload it after they end", name,
                e->running, e->running == 1 ? "" : "s");
        return LLMS__ERROR_CODE__FAILED_PRECONDITION;
    }
    for (const models_entry *a = r->head; a; a = a->next)
        if (a->base == e) {
            err_set(err, "model '%s' is the base of adapter model '%s': unload that first",
                    name, a->name);
            return LLMS__ERROR_CODE__FAILED_PRECONDITION;
        }
    *pp = e->next;
    entry_free(e);
    view_publish(r);
    return LLMS__ERROR_CODE__OK;
}

reranker *models_reranker(models_entry *e, const rerank_options *options, char err[ERR_MAX])
{
    if (!e->rr)
        e->rr = rerank_open(e->path, options, err);
    return e->rr;
}

/* Pages of the file at path in the page cache: what a mapping of it holds in memory. */
static uint64_t file_resident(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    struct stat st = {0};
    uint64_t n = 0;
    long page = sysconf(_SC_PAGESIZE);
    if (fstat(fd, &st) == 0 && st.st_size > 0 && page > 0) {
        size_t size = (size_t)st.st_size, pages = (size + (size_t)page - 1) / (size_t)page;
        void *p = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
        unsigned char *vec = malloc(pages);
        if (p != MAP_FAILED && vec && mincore(p, size, vec) == 0)
            for (size_t i = 0; i < pages; i++)
                n += vec[i] & 1;
        free(vec);
        if (p != MAP_FAILED)
            munmap(p, size);
    }
    close(fd);
    n *= (uint64_t)page;
    return n < (uint64_t)st.st_size ? n : (uint64_t)st.st_size;
}

uint64_t models_resident_bytes(const models_entry *e)
{
    if (e->base) {
        char path[CONFIG_PATH_MAX], why[ERR_MAX];
        float scale;
        uint64_t n = 0;
        for (const char *p = e->lora_spec; config_lora_next(&p, path, &scale, why) == 1;)
            n += file_resident(path);
        return n;
    }
    uint64_t repacked = e->m ? model_repacked_bytes(e->m) : 0;
    if (e->copied) {
        const gguf_file *g = model_gguf(e->m);
        uint64_t n = 0;
        for (int64_t i = 0; i < gguf_n_tensors(g); i++)
            n += gguf_tensor_at(g, i)->bytes;
        return n + repacked;
    }
    return file_resident(e->path) + repacked;
}

uint64_t models_scratch_bytes(const models_entry *e)
{
    return (e->enc_r ? bert_runner_scratch_bytes(e->enc_r) : 0) +
           (e->dec_r ? model_runner_scratch_bytes(e->dec_r) : 0) + e->rr_peak_bytes;
}
