/*
 * client_internal.h — what the files of libllmsclient share: the connection and the
 * request/response machinery of client.c, and the one converter (kb.c's RAG result) that
 * client.c's stream reader needs. Declared hidden: libllmsclient.so exports none of them.
 * Not for any other file.
 */
#ifndef LLMS_CLIENT_INTERNAL_H
#define LLMS_CLIENT_INTERNAL_H

#include <stdint.h>

#include "client/llms.h"
#include "proto/frame.h"

struct llms_conn {
    int fd;
    uint64_t next_id; /* ids increase per connection; 0 is the daemon's "no request" */
    int broken;       /* an I/O or protocol failure: the stream is out of step */
    uint32_t timeout_ms; /* sent with every request; 0: none */
    /* A callback of the call in progress is running: a call it made would read that
     * call's frames as another request's and drop them. */
    int in_callback;
    char err[LLMS_ERROR_MAX];
};

#pragma GCC visibility push(hidden)

/* ---- client.c: the request/response machinery ---- */

/* Writes the message into c->err and returns s; an I/O or protocol failure also marks c
 * broken (the stream is out of step, every later call fails). */
__attribute__((format(printf, 3, 4))) enum llms_status
client_fail(llms_conn *c, enum llms_status s, const char *fmt, ...);

/* Sends req with c's next id (returned in *id when id is not NULL) and c's timeout. */
enum llms_status client_send_request(llms_conn *c, Llms__Request *req, uint64_t *id);

/* Reads frames until the next one for request id (*out, to frame_free_response). */
enum llms_status client_next_for(llms_conn *c, uint64_t id, Llms__Response **out);

/* The code of error Response r, its message in c->err. */
enum llms_status client_error_of(llms_conn *c, const Llms__Response *r);

/* The next frame of a streamed request id that is not an error: error frames are
 * consumed here, a non-final one skipped, a final one ending the stream with its status
 * (CANCELLED when the caller had cancelled). LLMS_OK with *out set, else the status that
 * ends the stream. */
enum llms_status client_next_answer(llms_conn *c, uint64_t id, int cancelled,
                                    Llms__Response **out);

/* Sends req and reads its one final reply, which must carry body want (*out, to
 * frame_free_response), or an error. */
enum llms_status client_unary(llms_conn *c, Llms__Request *req, Llms__Response__BodyCase want,
                              Llms__Response **out);

/* client_unary for a request answered Ok. */
enum llms_status client_unary_ok(llms_conn *c, Llms__Request *req);

/* INVALID_ARGUMENT naming what when s is NULL. */
enum llms_status client_check_str(llms_conn *c, const char *s, const char *what);

/* strdup, NULL for NULL. */
char *client_dup_or_null(const char *s);

/* An llms_params packed for the wire: g points into the app's llms_params (the stop
 * strings) and into bias, which the pack owns. */
typedef struct client_params_pb {
    Llms__GenerationParams g;
    Llms__TokenBias *bias;       /* (n_logit_bias) */
    Llms__TokenBias **bias_ptrs; /* (n_logit_bias) into bias */
    Llms__SamplerStep order[LLMS__SAMPLER_STEP__SAMPLER_TEMPERATURE + 1]; /* g.samplers */
    int any_set;                 /* whether g sets anything */
} client_params_pb;

/* Packs p (NULL: nothing set) into pb, which client_params_pb_free releases: INVALID_ARGUMENT
 * for a logit_bias or breakers count without its array, or samplers that are no string of
 * llama.cpp's letters each once; INTERNAL out of memory (pb then holds nothing). */
enum llms_status client_params_pack(llms_conn *c, const llms_params *p, client_params_pb *pb);

/* &pb->g when the pack sets anything, else NULL (the request's field stays unset). */
Llms__GenerationParams *client_params_packed(client_params_pb *pb);

void client_params_pb_free(client_params_pb *pb);

/* Cancels request id (its own answer is skipped by client_next_for). */
enum llms_status client_send_cancel(llms_conn *c, uint64_t id);

/* Reads the streamed reply of request id to its final frame, text chunks to on_text
 * (nonzero: cancel and drain); the result into out, or with rag_out a RAG result there. */
enum llms_status client_stream(llms_conn *c, uint64_t id, llms_token_cb on_text, void *user,
                               llms_result *out, llms_rag_result *rag_out);

/* ---- kb.c ---- */

/* Copies RAG result p into *out; INTERNAL, *out emptied, when memory runs out. */
enum llms_status client_rag_result_from(llms_conn *c, const Llms__RagResult *p,
                                        llms_rag_result *out);

#pragma GCC visibility pop

#endif
