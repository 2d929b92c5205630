/* frame.c — length-prefixed protobuf frames (see frame.h). */
#include "proto/frame.h"

#include <stdbool.h>
#include <stdlib.h>

enum frame_status frame_peek(const uint8_t *data, size_t avail, uint32_t max_bytes,
                             uint32_t *body_len)
{
    if (avail < FRAME_HEADER_BYTES)
        return FRAME_NEED_MORE;
    uint32_t len = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                   (uint32_t)data[3] << 24;
    *body_len = len;
    if (len == 0)
        return FRAME_EMPTY;
    if (len > max_bytes)
        return FRAME_TOO_LARGE;
    return avail - FRAME_HEADER_BYTES >= len ? FRAME_COMPLETE : FRAME_NEED_MORE;
}

void frame_put_header(uint8_t header[FRAME_HEADER_BYTES], uint32_t len)
{
    header[0] = (uint8_t)len;
    header[1] = (uint8_t)(len >> 8);
    header[2] = (uint8_t)(len >> 16);
    header[3] = (uint8_t)(len >> 24);
}

int frame_pack(const ProtobufCMessage *msg, uint32_t max_bytes, uint8_t **out, size_t *out_len)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    if (len > max_bytes || len > UINT32_MAX)
        return -1;
    uint8_t *buf = malloc(FRAME_HEADER_BYTES + len);
    if (!buf)
        return -1;
    frame_put_header(buf, (uint32_t)len);
    protobuf_c_message_pack(msg, buf + FRAME_HEADER_BYTES);
    *out = buf;
    *out_len = FRAME_HEADER_BYTES + len;
    return 0;
}

static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    uint64_t x = 0;
    for (int shift = 0; shift < 64 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *v = x;
            return true;
        }
    }
    return false;
}

/* Messages nest this deep at most in llms.proto; deeper bytes are counted flat. */
#define NEST_MAX 16

static size_t count_fields(const ProtobufCMessageDescriptor *d, const uint8_t *p,
                           const uint8_t *end, size_t n, size_t limit, int depth)
{
    while (p < end && n <= limit) {
        uint64_t key, v;
        if (!read_varint(&p, end, &key))
            return n;
        n++;
        switch (key & 7) {
        case 0:
            if (!read_varint(&p, end, &v))
                return n;
            break;
        case 1:
            if (end - p < 8)
                return n;
            p += 8;
            break;
        case 5:
            if (end - p < 4)
                return n;
            p += 4;
            break;
        case 2: {
            if (!read_varint(&p, end, &v) || v > (uint64_t)(end - p))
                return n;
            const ProtobufCFieldDescriptor *f =
                d && key >> 3 <= UINT32_MAX
                    ? protobuf_c_message_descriptor_get_field(d, (unsigned)(key >> 3))
                    : NULL;
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE && depth < NEST_MAX)
                n = count_fields(f->descriptor, p, p + v, n, limit, depth + 1);
            p += v;
            break;
        }
        default:
            return n;
        }
    }
    return n > limit ? limit + 1 : n;
}

size_t frame_count_fields(const ProtobufCMessageDescriptor *d, const uint8_t *body, size_t len,
                          size_t limit)
{
    return count_fields(d, body, body + len, 0, limit, 0);
}

Llms__Request *frame_unpack_request(const uint8_t *body, size_t len)
{
    return llms__request__unpack(NULL, len, body);
}

Llms__Response *frame_unpack_response(const uint8_t *body, size_t len)
{
    return llms__response__unpack(NULL, len, body);
}

void frame_free_request(Llms__Request *req)
{
    if (req)
        llms__request__free_unpacked(req, NULL);
}

void frame_free_response(Llms__Response *resp)
{
    if (resp)
        llms__response__free_unpacked(resp, NULL);
}
