/* Tests of the frame format shared by llmsd and libllmsclient. */
#include <stdlib.h>
#include <string.h>

#include "proto/frame.h"
#include "tests/support/test.h"

static void request_round_trips_through_a_frame(void)
{
    Llms__Request req = LLMS__REQUEST__INIT;
    Llms__BindRequest bind = LLMS__BIND_REQUEST__INIT;
    bind.app_name = "notes";
    req.id = 77;
    req.body_case = LLMS__REQUEST__BODY_BIND;
    req.bind = &bind;

    uint8_t *buf;
    size_t len;
    uint32_t body_len;
    CHECK(frame_pack(&req.base, FRAME_DEFAULT_MAX_BYTES, &buf, &len) == 0);
    CHECK_EQ(frame_peek(buf, len, FRAME_DEFAULT_MAX_BYTES, &body_len), FRAME_COMPLETE);
    CHECK_EQ(body_len + FRAME_HEADER_BYTES, len);
    Llms__Request *back = frame_unpack_request(buf + FRAME_HEADER_BYTES, body_len);
    free(buf);
    CHECK(back != NULL);
    bool same = back->id == 77 && back->body_case == LLMS__REQUEST__BODY_BIND &&
                strcmp(back->bind->app_name, "notes") == 0;
    frame_free_request(back);
    CHECK(same);
}

static void partial_empty_and_oversized_frames_are_told_apart(void)
{
    uint8_t hdr[8] = {0};
    uint32_t body_len;
    CHECK_EQ(frame_peek(hdr, 3, 100, &body_len), FRAME_NEED_MORE);
    CHECK_EQ(frame_peek(hdr, 4, 100, &body_len), FRAME_EMPTY);
    frame_put_header(hdr, 101);
    CHECK_EQ(frame_peek(hdr, 8, 100, &body_len), FRAME_TOO_LARGE);
    CHECK_EQ(body_len, 101);
    frame_put_header(hdr, 5);
    CHECK_EQ(frame_peek(hdr, 8, 100, &body_len), FRAME_NEED_MORE);
    CHECK_EQ(frame_peek(hdr, 9, 100, &body_len), FRAME_COMPLETE);
    frame_put_header(hdr, 0x01020304);
    CHECK(hdr[0] == 4 && hdr[1] == 3 && hdr[2] == 2 && hdr[3] == 1);
}

static void garbage_does_not_decode(void)
{
    const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x12};
    CHECK(frame_unpack_request(junk, sizeof junk) == NULL);
    /* A well-formed message missing the required id is refused too. */
    const uint8_t no_id[] = {0x52, 0x00}; /* field 10 (bind), empty */
    CHECK(frame_unpack_request(no_id, sizeof no_id) == NULL);
}

static void oversized_message_is_not_packed(void)
{
    Llms__Response resp = LLMS__RESPONSE__INIT;
    Llms__DetokenizeResponse body = LLMS__DETOKENIZE_RESPONSE__INIT;
    char text[200];
    memset(text, 'x', sizeof text - 1);
    text[sizeof text - 1] = '\0';
    body.text = text;
    resp.id = 1;
    resp.final = true;
    resp.body_case = LLMS__RESPONSE__BODY_DETOKENIZE;
    resp.detokenize = &body;
    uint8_t *buf = NULL;
    size_t len;
    CHECK(frame_pack(&resp.base, 100, &buf, &len) == -1);
    CHECK(buf == NULL);
}

/* The count follows nested messages and repeated elements; a packed array counts once;
 * past the limit it says limit + 1; truncated bytes end the count. */
static void fields_are_counted_before_decoding(void)
{
    char *texts[5] = {"a", "", "b", "", "c"};
    Llms__EmbedRequest e = LLMS__EMBED_REQUEST__INIT;
    e.n_texts = 5;
    e.texts = texts;
    Llms__Request req = LLMS__REQUEST__INIT;
    req.id = 3;
    req.body_case = LLMS__REQUEST__BODY_EMBED;
    req.embed = &e;
    uint8_t *buf;
    size_t len;
    CHECK(frame_pack(&req.base, FRAME_DEFAULT_MAX_BYTES, &buf, &len) == 0);
    const uint8_t *body = buf + FRAME_HEADER_BYTES;
    size_t n = len - FRAME_HEADER_BYTES;
    /* id, embed, five texts */
    size_t got = frame_count_fields(&llms__request__descriptor, body, n, 100);
    size_t over = frame_count_fields(&llms__request__descriptor, body, n, 4);
    size_t cut = frame_count_fields(&llms__request__descriptor, body, n - 3, 100);
    free(buf);
    CHECK_EQ(got, 7);
    CHECK_EQ(over, 5);
    CHECK(cut < 7);

    int32_t ids[1000] = {0};
    Llms__DetokenizeRequest d = LLMS__DETOKENIZE_REQUEST__INIT;
    d.n_tokens = 1000;
    d.tokens = ids;
    req.body_case = LLMS__REQUEST__BODY_DETOKENIZE;
    req.detokenize = &d;
    CHECK(frame_pack(&req.base, FRAME_DEFAULT_MAX_BYTES, &buf, &len) == 0);
    got = frame_count_fields(&llms__request__descriptor, buf + FRAME_HEADER_BYTES,
                             len - FRAME_HEADER_BYTES, 100);
    free(buf);
    CHECK_EQ(got, 3);

    /* Unknown fields cost an allocation each when decoded: they count too. */
    uint8_t unknown[64];
    size_t k = 0;
    unknown[k++] = 0x08; /* id = 1 */
    unknown[k++] = 0x01;
    for (int i = 0; i < 20; i++) {
        unknown[k++] = 0xf8; /* field 1000, varint */
        unknown[k++] = 0x3e;
        unknown[k++] = 0x00;
    }
    CHECK_EQ(frame_count_fields(&llms__request__descriptor, unknown, k, 100), 21);
}

int main(void)
{
    RUN(request_round_trips_through_a_frame);
    RUN(partial_empty_and_oversized_frames_are_told_apart);
    RUN(garbage_does_not_decode);
    RUN(oversized_message_is_not_packed);
    RUN(fields_are_counted_before_decoding);
    return test_finish();
}
