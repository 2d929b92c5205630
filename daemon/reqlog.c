/*
 * reqlog.c — the request log (reqlog.h).
 */
#include "daemon/reqlog.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

static atomic_int level = REQLOG_INFO;

void reqlog_set_level(const char *name)
{
    if (strcmp(name, "error") == 0)
        atomic_store(&level, REQLOG_ERROR);
    else if (strcmp(name, "warn") == 0)
        atomic_store(&level, REQLOG_WARN);
    else
        atomic_store(&level, REQLOG_INFO);
}

int reqlog_enabled(enum reqlog_level l)
{
    return (int)l <= atomic_load(&level);
}

const char *reqlog_kind(Llms__Request__BodyCase body)
{
    switch (body) {
    case LLMS__REQUEST__BODY_BIND:
        return "bind";
    case LLMS__REQUEST__BODY_CREATE_CONTEXT:
        return "create_context";
    case LLMS__REQUEST__BODY_CALL:
        return "call";
    case LLMS__REQUEST__BODY_CANCEL:
        return "cancel";
    case LLMS__REQUEST__BODY_DELETE_CONTEXT:
        return "delete_context";
    case LLMS__REQUEST__BODY_LIST_CONTEXTS:
        return "list_contexts";
    case LLMS__REQUEST__BODY_GET_CONTEXT:
        return "get_context";
    case LLMS__REQUEST__BODY_TOKENIZE:
        return "tokenize";
    case LLMS__REQUEST__BODY_DETOKENIZE:
        return "detokenize";
    case LLMS__REQUEST__BODY_COMPLETE:
        return "complete";
    case LLMS__REQUEST__BODY_EMBED:
        return "embed";
    case LLMS__REQUEST__BODY_RERANK:
        return "rerank";
    case LLMS__REQUEST__BODY_RERANK_CALIBRATE:
        return "rerank_calibrate";
    case LLMS__REQUEST__BODY_RAG_QUERY:
        return "rag";
    case LLMS__REQUEST__BODY_KB_CREATE:
    case LLMS__REQUEST__BODY_KB_ADD:
    case LLMS__REQUEST__BODY_KB_REMOVE:
    case LLMS__REQUEST__BODY_KB_LIST:
    case LLMS__REQUEST__BODY_KB_DROP:
    case LLMS__REQUEST__BODY_KB_SEARCH:
        return "kb";
    case LLMS__REQUEST__BODY_GRAPH_RUN:
        return "graph_run";
    case LLMS__REQUEST__BODY_GRAPH_CREATE:
    case LLMS__REQUEST__BODY_GRAPH_LIST:
    case LLMS__REQUEST__BODY_GRAPH_DELETE:
        return "graph";
    case LLMS__REQUEST__BODY__NOT_SET:
        return "unknown";
    default:
        return "admin";
    }
}

void reqlog_request(uint32_t uid, const char *app, Llms__Request__BodyCase body, long tokens,
                    double ms, Llms__ErrorCode code, const char *detail)
{
    enum reqlog_level l = code == LLMS__ERROR_CODE__INTERNAL ? REQLOG_ERROR : REQLOG_INFO;
    if (!reqlog_enabled(l))
        return;
    char count[32] = "";
    if (tokens >= 0)
        snprintf(count, sizeof count, " tokens=%ld", tokens);
    const char *code_name = "";
    if (code != LLMS__ERROR_CODE__OK) {
        const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(
            &llms__error_code__descriptor, (int)code);
        code_name = v ? v->name : "ERROR";
    }
    char who[96] = "-";
    if (app)
        snprintf(who, sizeof who, "%u/%s", (unsigned)uid, *app ? app : "-");
    char took[32] = "";
    if (ms >= 0)
        snprintf(took, sizeof took, " ms=%.1f", ms);
    fprintf(stderr, "llmsd: %s: request app=%s kind=%s%s%s outcome=%s%s%s\n",
            l == REQLOG_ERROR ? "error" : "info", who, reqlog_kind(body), count, took, code_name,
            *code_name ? ": " : "", detail);
}
