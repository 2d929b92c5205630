/*
 * frame.h — the framing of llms.proto messages on a stream socket.
 *
 * A frame is a 4-byte little-endian length followed by that many bytes of one protobuf
 * message (Request from client to daemon, Response back). Both the daemon and
 * libllmsclient use these functions, so the two sides cannot disagree on the format.
 */
#ifndef LLMS_FRAME_H
#define LLMS_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "proto/llms.pb-c.h"

#define FRAME_HEADER_BYTES 4
/* The app every client binds to when its user names none: libllmsclient (llms_bind with
 * NULL, where $LLMS_APP does not name another), llms, Python and the HTTP gateway without
 * X-Llmsd-App. One name, so a knowledge base made with one client is found with another. */
#define FRAME_DEFAULT_APP "default"
#define FRAME_DEFAULT_MAX_BYTES (16u << 20)
/* Fields a frame may decode into. Decoding allocates per field (each string, message and
 * unknown field), so a frame of two-byte fields would take twenty times its size in
 * memory and seconds of decoding; every list of the protocol is capped far below this. */
#define FRAME_MAX_FIELDS 65536u

/* Result of looking at the start of a byte stream. */
enum frame_status {
    FRAME_NEED_MORE = 0, /* fewer bytes than the header or the announced body */
    FRAME_COMPLETE = 1,  /* a whole frame is there: *body_len bytes after the header */
    FRAME_TOO_LARGE = 2, /* the header announces more than max_bytes */
    FRAME_EMPTY = 3,     /* the header announces 0 bytes (no message is empty on the wire
                            because Request.id and Response.id are required) */
};

/*
 * Looks at the first avail bytes of a stream and says whether they hold a complete
 * frame; *body_len gets the announced body length whenever the header is there.
 */
enum frame_status frame_peek(const uint8_t *data, size_t avail, uint32_t max_bytes,
                             uint32_t *body_len);

/* Writes the header for a body of len bytes. */
void frame_put_header(uint8_t header[FRAME_HEADER_BYTES], uint32_t len);

/*
 * Packs a message as a whole frame into a fresh buffer (*out, *out_len; free() it).
 * Returns 0, or -1 when the message is larger than max_bytes or memory runs out.
 */
int frame_pack(const ProtobufCMessage *msg, uint32_t max_bytes, uint8_t **out, size_t *out_len);

/*
 * Counts the fields a frame body of message type d would decode into: each field of the
 * message and of the messages inside it, each element of a repeated field (a packed
 * array counts once). Stops past limit, returning limit + 1. Bytes that are not a valid
 * message end the count early; decoding them then fails by itself.
 */
size_t frame_count_fields(const ProtobufCMessageDescriptor *d, const uint8_t *body, size_t len,
                          size_t limit);

/* Decodes a frame body into a Request / Response (NULL when it is not a valid message
 * of that type). Free with frame_free_request / frame_free_response. */
Llms__Request *frame_unpack_request(const uint8_t *body, size_t len);
Llms__Response *frame_unpack_response(const uint8_t *body, size_t len);
void frame_free_request(Llms__Request *req);
void frame_free_response(Llms__Response *resp);

#endif
