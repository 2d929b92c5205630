/*
 * Well-framed requests with random contents never crash or hang llmsd.
 *
 * The frame tests (test_service: bad_frames_do_not_disturb_others) send bytes that are
 * not requests; these are requests, every field filled generically from the protobuf-c
 * descriptors (numbers at the edges of their types, NaN and infinities, empty, long,
 * path-like and non-UTF-8 strings, unknown enum values, up to three repeated elements,
 * nested messages), of every body kind except the three that stop the service on purpose
 * (Shutdown, LoadModel, UnloadModel). Strings are often the names of what exists (a
 * context, a knowledge base, the model), so requests reach past the lookups.
 *
 * Each request must get its final response (an answer or an error) or a closed
 * connection, within 20 s; the daemon must stay up, answer a plain request afterwards
 * and exit 0 on SIGTERM, which in the sanitizer build also means no leak.
 */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "client/llms.h"
#include "engine/gguf/modelgen.h"
#include "tests/integration/llmsd_proc.h"
#include "tests/integration/rawframe.h"
#include "tests/support/test.h"

#define N_REQUESTS 3000
#define PER_CONNECTION 25
#define MAX_DEPTH 3
#define TIME_CAP_S 240.0 /* the sanitizer build is slow: stop early rather than time out */

static char llmsd_path[1024];
static char tiny_model[1024];

/* xorshift64: the same requests on every run, unless LLMS_RANDOM_SEED names others */
static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint64_t rng(void)
{
    return test_random(&rng_state);
}

static int pick(int n)
{
    return (int)(rng() % (uint64_t)n);
}

/* Every allocation of one request, freed together once it is sent. */
typedef struct arena {
    void *items[4096];
    int n;
} arena;

static void *arena_alloc(arena *a, size_t bytes)
{
    if (a->n == (int)(sizeof a->items / sizeof a->items[0]))
        return NULL;
    void *p = calloc(1, bytes ? bytes : 1);
    if (p)
        a->items[a->n++] = p;
    return p;
}

static void arena_free(arena *a)
{
    for (int i = 0; i < a->n; i++)
        free(a->items[i]);
    a->n = 0;
}

/* Names of things that exist, set once the fixtures are made. */
static char known_context[LLMS_ID_MAX];
static const char *known_names[] = {known_context, "kb1", "one-shot", "multistep", "question",
                                    "kb", "tiny", "default", "answer"};

static char *random_string(arena *a)
{
    static const char *const fixed[] = {"", "a", "../../../etc/passwd", "{question}",
                                        "x contains 'y' or runs(n) >= 99999999999",
                                        "\xff\xfe\xc0\x80", "%s%n%s", "chatml", "llama3"};
    switch (pick(4)) {
    case 0:
        return (char *)fixed[pick((int)(sizeof fixed / sizeof fixed[0]))];
    case 1:
        return (char *)known_names[pick((int)(sizeof known_names / sizeof known_names[0]))];
    default: {
        int n = pick(3) == 0 ? 2000 + pick(3000) : pick(40);
        char *s = arena_alloc(a, (size_t)n + 1);
        if (!s)
            return "";
        for (int i = 0; i < n; i++)
            s[i] = (char)(1 + pick(255)); /* any byte but NUL */
        return s;
    }
    }
}

static uint64_t random_unsigned(void)
{
    static const uint64_t edges[] = {0, 1, 2, 16, 512, 65535, UINT32_MAX, UINT64_MAX};
    return pick(2) ? edges[pick((int)(sizeof edges / sizeof edges[0]))] : rng() % 1000;
}

static int64_t random_signed(void)
{
    static const int64_t edges[] = {0, 1, -1, INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN};
    return pick(2) ? edges[pick((int)(sizeof edges / sizeof edges[0]))]
                   : (int64_t)(rng() % 2000) - 1000;
}

static double random_real(void)
{
    static const double edges[] = {0.0, 1.0, -1.0, 0.5, 1e30, -1e30, 1e-30};
    switch (pick(4)) {
    case 0:
        return NAN;
    case 1:
        return pick(2) ? INFINITY : -INFINITY;
    default:
        return edges[pick((int)(sizeof edges / sizeof edges[0]))];
    }
}

static void fill_message(arena *a, ProtobufCMessage *m, int depth);

/* One value of field f at p. */
static void fill_value(arena *a, const ProtobufCFieldDescriptor *f, void *p, int depth)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        *(int32_t *)p = (int32_t)random_signed();
        break;
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        *(uint32_t *)p = (uint32_t)random_unsigned();
        break;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        *(int64_t *)p = random_signed();
        break;
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        *(uint64_t *)p = random_unsigned();
        break;
    case PROTOBUF_C_TYPE_FLOAT:
        *(float *)p = (float)random_real();
        break;
    case PROTOBUF_C_TYPE_DOUBLE:
        *(double *)p = random_real();
        break;
    case PROTOBUF_C_TYPE_BOOL:
        *(protobuf_c_boolean *)p = pick(2);
        break;
    case PROTOBUF_C_TYPE_ENUM: {
        const ProtobufCEnumDescriptor *e = f->descriptor;
        *(int *)p = pick(5) == 0 || e->n_values == 0 ? 77 : e->values[pick((int)e->n_values)].value;
        break;
    }
    case PROTOBUF_C_TYPE_STRING:
        *(char **)p = random_string(a);
        break;
    case PROTOBUF_C_TYPE_BYTES: {
        ProtobufCBinaryData *b = p;
        b->len = (size_t)pick(64);
        b->data = arena_alloc(a, b->len);
        for (size_t i = 0; b->data && i < b->len; i++)
            b->data[i] = (uint8_t)rng();
        if (!b->data)
            b->len = 0;
        break;
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessageDescriptor *d = f->descriptor;
        ProtobufCMessage *sub = arena_alloc(a, d->sizeof_message);
        if (sub) {
            d->message_init(sub);
            fill_message(a, sub, depth + 1);
        }
        *(ProtobufCMessage **)p = sub;
        break;
    }
    }
}

static size_t value_size(const ProtobufCFieldDescriptor *f)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE:
        return 8;
    case PROTOBUF_C_TYPE_BOOL:
        return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_MESSAGE:
        return sizeof(void *);
    case PROTOBUF_C_TYPE_BYTES:
        return sizeof(ProtobufCBinaryData);
    default:
        return 4;
    }
}

/* Sets m's required fields, and its optional and repeated ones at random (none past
 * MAX_DEPTH, where a required message is still set, empty). Members of a oneof are left
 * unset: the caller picks a Request's body itself. */
static void fill_message(arena *a, ProtobufCMessage *m, int depth)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        char *at = (char *)m + f->offset;
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF)
            continue;
        bool deep = depth >= MAX_DEPTH;
        if (f->label == PROTOBUF_C_LABEL_REQUIRED) {
            fill_value(a, f, at, deep ? MAX_DEPTH + 8 : depth);
        } else if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = deep ? 0 : (size_t)pick(4);
            void *items = n ? arena_alloc(a, n * value_size(f)) : NULL;
            if (!items)
                n = 0;
            for (size_t k = 0; k < n; k++)
                fill_value(a, f, (char *)items + k * value_size(f), depth);
            *(size_t *)((char *)m + f->quantifier_offset) = n;
            *(void **)at = items;
        } else if (!deep && pick(2)) {
            fill_value(a, f, at, depth);
            if (f->type != PROTOBUF_C_TYPE_STRING && f->type != PROTOBUF_C_TYPE_MESSAGE)
                *(protobuf_c_boolean *)((char *)m + f->quantifier_offset) = 1;
        }
    }
}

/* Request bodies that stop or change the service on purpose. */
static bool body_excluded(uint32_t id)
{
    return id == LLMS__REQUEST__BODY_SHUTDOWN || id == LLMS__REQUEST__BODY_LOAD_MODEL ||
           id == LLMS__REQUEST__BODY_UNLOAD_MODEL;
}

/* A random Request of a random allowed body kind; its allocations go to a. */
static void random_request(arena *a, Llms__Request *req, uint64_t id)
{
    const ProtobufCMessageDescriptor *d = &llms__request__descriptor;
    const ProtobufCFieldDescriptor *body;
    do
        body = &d->fields[pick((int)d->n_fields)];
    while (!(body->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) || body_excluded(body->id));
    llms__request__init(req);
    fill_message(a, &req->base, 0);
    req->id = id;
    req->has_timeout_ms = pick(4) == 0;
    req->timeout_ms = (uint32_t)pick(3000);
    fill_value(a, body, (char *)req + body->offset, 1);
    *(uint32_t *)((char *)req + body->quantifier_offset) = body->id;
}

/* Reads responses until the final one of id: 1, 0 when the daemon closed the connection,
 * -1 on a timeout (why says more). *ok: the final one carried no error. */
static int await_final(int fd, uint64_t id, bool *ok, char *why, size_t cap)
{
    for (;;) {
        int timed_out;
        Llms__Response *r = raw_read(fd, &timed_out);
        if (!r) {
            if (timed_out)
                snprintf(why, cap, "no final response to request %llu within 20 s",
                         (unsigned long long)id);
            return timed_out ? -1 : 0;
        }
        bool done = r->id == id && r->final;
        *ok = done && !r->error;
        frame_free_response(r);
        if (done)
            return 1;
    }
}

static void random_requests_never_crash(void)
{
    if (!llmsd_path[0] || !tiny_model[0]) {
        SKIP("llmsd or the generated model is missing");
    }
    llmsd_proc d;
    CHECK(proc_start(&d, llmsd_path, "random", tiny_model, NULL) == 0);

    /* fixtures whose names the requests use */
    llms_conn *c = proc_connect(&d, "fuzz");
    CHECK(c);
    CHECK_EQ(llms_context_create(c, "You are terse.", NULL, known_context), LLMS_OK);
    CHECK_EQ(llms_kb_create(c, "kb1", 0, 0), LLMS_OK);
    llms_kb_doc doc = {.id = "d1", .text = "Lily went to the park with a red ball.", .metadata = NULL};
    CHECK_EQ(llms_kb_add(c, "kb1", &doc, 1, NULL), LLMS_OK);
    llms_close(c);

    int sent = 0, answered = 0, succeeded = 0, closed = 0;
    char why[256] = "";
    double t0 = proc_now();
    arena *a = calloc(1, sizeof *a);
    CHECK(a);
    while (sent < N_REQUESTS && proc_now() - t0 < TIME_CAP_S && !why[0]) {
        int fd = raw_connect(&d);
        if (fd < 0) {
            snprintf(why, sizeof why, "cannot connect after %d requests", sent);
            break;
        }
        if (pick(4) != 0 && raw_bind(fd, "fuzz") < 0) {
            snprintf(why, sizeof why, "bind refused after %d requests", sent);
            close(fd);
            break;
        }
        for (int k = 0; k < PER_CONNECTION && sent < N_REQUESTS; k++) {
            Llms__Request req;
            uint64_t id = (uint64_t)sent + 1;
            random_request(a, &req, id);
            uint32_t body = req.body_case;
            int rc = raw_send(fd, &req);
            arena_free(a);
            sent++;
            bool ok = false;
            rc = rc < 0 ? 0 : await_final(fd, id, &ok, why, sizeof why);
            succeeded += ok;
            if (rc < 0)
                snprintf(why + strlen(why), sizeof why - strlen(why), " (body %u)", body);
            int status;
            if (waitpid(d.pid, &status, WNOHANG) == d.pid) {
                d.pid = 0;
                snprintf(why, sizeof why, "llmsd died at request %d (body %u)", sent, body);
            }
            if (rc <= 0 || why[0]) {
                closed += rc == 0;
                break;
            }
            answered++;
        }
        close(fd);
    }
    free(a);
    if (why[0])
        proc_print_log(&d);
    CHECK_MSG(!why[0], "%s", why);
    fprintf(stderr, "    %d requests: %d answered (%d without an error), %d connections closed "
                    "by llmsd, %.1f s\n", sent, answered, succeeded, closed, proc_now() - t0);
    CHECK(answered > sent / 2); /* most are answered, not merely dropped */

    CHECK(proc_still_answers(&d, "after"));
    int code = proc_stop(&d, SIGTERM);
    if (code != 0)
        proc_print_log(&d);
    CHECK_EQ(code, 0);
}

int main(int argc, char **argv)
{
    (void)argc;
    signal(SIGPIPE, SIG_IGN);
    proc_find_llmsd(argv[0], llmsd_path, sizeof llmsd_path);
    test_random_seed(&rng_state);
    modelgen_params mp = {
        .arch = "llama", .dim = 64, .n_layer = 2, .n_head = 4, .n_head_kv = 2, .n_ff = 128,
        .n_ctx = 512, .type = QTYPE_F32, .seed = 3, .n_vocab = 300, .n_threads = 1,
    };
    proc_generate_model(tiny_model, sizeof tiny_model, "tiny.gguf", &mp);
    RUN(random_requests_never_crash);
    return test_finish();
}
