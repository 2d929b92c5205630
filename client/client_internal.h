/*
 * client_internal.h — what the files of libllmsclient share: the connection and the
 * request/response machinery of client.c, and the one converter (kb.c's RAG result) that
 * client.c's stream reader needs. Declared hidden, so the shared library exports only
 * llms.h. Not for any other file.
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
    char err[LLMS_ERROR_MAX];
};

#pragma GCC visibility push(hidden)

__attribute__((format(printf, 3, 4))) enum llms_status
fail(llms_conn *c, enum llms_status s, const char *fmt, ...);
enum llms_status send_request(llms_conn *c, Llms__Request *req, uint64_t *id);
enum llms_status next_for(llms_conn *c, uint64_t id, Llms__Response **out);
enum llms_status error_of(llms_conn *c, const Llms__Response *r);
enum llms_status unary(llms_conn *c, Llms__Request *req, Llms__Response__BodyCase want,
                       Llms__Response **out);
enum llms_status unary_ok(llms_conn *c, Llms__Request *req);
enum llms_status check_str(llms_conn *c, const char *s, const char *what);
char *dup_or_null(const char *s);
int params_to_proto(const llms_params *p, Llms__GenerationParams *g);
enum llms_status send_cancel(llms_conn *c, uint64_t id);
enum llms_status stream(llms_conn *c, uint64_t id, llms_token_cb on_text, void *user,
                        llms_result *out, llms_rag_result *rag_out);
enum llms_status rag_result_from(llms_conn *c, const Llms__RagResult *p, llms_rag_result *out);

#pragma GCC visibility pop

#endif
