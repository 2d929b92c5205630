/* libFuzzer target: arbitrary bytes arriving on a socket, read the way llmsd reads them.
 * The first input byte picks how many bytes each read() returns; the rest is the stream.
 * Every complete frame is decoded as a Request, every field of it read (so ASan checks
 * what protobuf-c built), re-encoded and decoded again; an oversized or empty header
 * ends the stream, as it closes the daemon's connection. */
#include <stdlib.h>
#include <string.h>

#include "proto/frame.h"

#define FUZZ_MAX_FRAME 512

/* Reads every byte of a string so ASan checks it is allocated and terminated. */
static unsigned touch_str(const char *s)
{
    unsigned h = 0;
    if (s)
        for (; *s; s++)
            h = h * 31 + (unsigned char)*s;
    return h;
}

static unsigned touch_bytes(const uint8_t *p, size_t n)
{
    unsigned h = 0;
    for (size_t i = 0; i < n; i++)
        h = h * 31 + p[i];
    return h;
}

/* Unknown fields met in the last walk: protobuf-c keeps them, even one with the invalid
 * field number 0 when its tag is encoded in more bytes than needed, and writes that one
 * back in the short form, which it then refuses, so such requests skip the re-decode. */
static size_t n_unknown;

static unsigned walk_message(const ProtobufCMessage *m, int depth);

/* Reads one value of a field's type at p. */
static unsigned walk_value(const ProtobufCFieldDescriptor *f, const void *p, int depth)
{
    switch (f->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_ENUM:
        return *(const uint32_t *)p;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return (unsigned)*(const uint64_t *)p;
    case PROTOBUF_C_TYPE_FLOAT:
        return *(const float *)p > 0;
    case PROTOBUF_C_TYPE_DOUBLE:
        return *(const double *)p > 0;
    case PROTOBUF_C_TYPE_BOOL:
        return *(const protobuf_c_boolean *)p != 0;
    case PROTOBUF_C_TYPE_STRING:
        return touch_str(*(char *const *)p);
    case PROTOBUF_C_TYPE_BYTES: {
        const ProtobufCBinaryData *b = p;
        return touch_bytes(b->data, b->len);
    }
    case PROTOBUF_C_TYPE_MESSAGE: {
        const ProtobufCMessage *sub = *(ProtobufCMessage *const *)p;
        return sub ? walk_message(sub, depth + 1) : 0;
    }
    }
    abort();
}

/* Reads every present field of a message, through its descriptor, so fields added to
 * llms.proto later are covered without touching this file. */
static unsigned walk_message(const ProtobufCMessage *m, int depth)
{
    const ProtobufCMessageDescriptor *d = m->descriptor;
    if (depth > 64 || d->magic != PROTOBUF_C__MESSAGE_DESCRIPTOR_MAGIC)
        abort();
    const char *base = (const char *)m;
    unsigned h = d->n_fields;
    for (unsigned i = 0; i < m->n_unknown_fields; i++) {
        const ProtobufCMessageUnknownField *u = &m->unknown_fields[i];
        h += u->tag + u->wire_type + touch_bytes(u->data, u->len);
    }
    n_unknown += m->n_unknown_fields;
    for (unsigned i = 0; i < d->n_fields; i++) {
        const ProtobufCFieldDescriptor *f = &d->fields[i];
        const void *member = base + f->offset;
        if (f->label == PROTOBUF_C_LABEL_REPEATED) {
            size_t n = *(const size_t *)(base + f->quantifier_offset);
            const char *arr = *(char *const *)member;
            size_t elem = f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE
                              ? sizeof(void *)
                          : f->type == PROTOBUF_C_TYPE_BYTES ? sizeof(ProtobufCBinaryData)
                          : f->type == PROTOBUF_C_TYPE_INT64 || f->type == PROTOBUF_C_TYPE_SINT64 ||
                                  f->type == PROTOBUF_C_TYPE_SFIXED64 ||
                                  f->type == PROTOBUF_C_TYPE_UINT64 ||
                                  f->type == PROTOBUF_C_TYPE_FIXED64 ||
                                  f->type == PROTOBUF_C_TYPE_DOUBLE
                              ? 8
                          : f->type == PROTOBUF_C_TYPE_BOOL ? sizeof(protobuf_c_boolean)
                                                           : 4;
            if (n && !arr)
                abort();
            for (size_t j = 0; j < n; j++)
                h += walk_value(f, arr + j * elem, depth);
            continue;
        }
        if (f->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            if (*(const uint32_t *)(base + f->quantifier_offset) != f->id)
                continue;
        } else if (f->label == PROTOBUF_C_LABEL_OPTIONAL && f->type != PROTOBUF_C_TYPE_STRING &&
                   f->type != PROTOBUF_C_TYPE_MESSAGE &&
                   !*(const protobuf_c_boolean *)(base + f->quantifier_offset)) {
            continue;
        }
        if (f->label == PROTOBUF_C_LABEL_REQUIRED &&
            (f->type == PROTOBUF_C_TYPE_STRING || f->type == PROTOBUF_C_TYPE_MESSAGE) &&
            !*(void *const *)member)
            abort(); /* protobuf-c refuses messages missing a required field */
        h += walk_value(f, member, depth);
    }
    return h;
}

/* Checks that a decoded request encodes again into something that decodes the same. */
static void repack(const Llms__Request *req)
{
    uint8_t *frame;
    size_t len;
    if (frame_pack(&req->base, UINT32_MAX, &frame, &len) != 0)
        abort();
    Llms__Request *again = frame_unpack_request(frame + FRAME_HEADER_BYTES,
                                                len - FRAME_HEADER_BYTES);
    if (!again || again->id != req->id || again->body_case != req->body_case)
        abort();
    uint8_t *frame2;
    size_t len2;
    if (frame_pack(&again->base, UINT32_MAX, &frame2, &len2) != 0 || len2 != len ||
        memcmp(frame, frame2, len) != 0)
        abort();
    free(frame2);
    frame_free_request(again);
    free(frame);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    size_t chunk = 1 + data[0] % 64;
    const uint8_t *stream = data + 1;
    size_t n = size - 1, received = 0, consumed = 0;
    volatile unsigned sink = 0;

    while (received < n) {
        received += received + chunk <= n ? chunk : n - received;
        for (;;) {
            uint32_t body_len = 0;
            size_t avail = received - consumed;
            enum frame_status st = frame_peek(stream + consumed, avail, FUZZ_MAX_FRAME, &body_len);
            if (st == FRAME_NEED_MORE) {
                if (avail >= FRAME_HEADER_BYTES &&
                    (body_len > FUZZ_MAX_FRAME || avail - FRAME_HEADER_BYTES >= body_len))
                    abort();
                break;
            }
            if (st == FRAME_TOO_LARGE || st == FRAME_EMPTY)
                return 0;
            if (st != FRAME_COMPLETE || body_len > FUZZ_MAX_FRAME ||
                avail < FRAME_HEADER_BYTES + (size_t)body_len)
                abort();
            Llms__Request *req =
                frame_unpack_request(stream + consumed + FRAME_HEADER_BYTES, body_len);
            consumed += FRAME_HEADER_BYTES + body_len;
            if (!req)
                return 0; /* malformed: the daemon answers an error and closes */
            n_unknown = 0;
            sink += walk_message(&req->base, 0) + (unsigned)req->id + req->body_case;
            if (n_unknown == 0)
                repack(req);
            frame_free_request(req);
        }
    }
    (void)sink;
    return 0;
}
