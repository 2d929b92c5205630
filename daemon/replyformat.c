/*
 * replyformat.c — checking a reply format and compiling its schema or grammar once.
 */
#include "daemon/replyformat.h"

#include <string.h>

#include "engine/model/grammar.h"
#include "engine/model/jsonschema.h"

/* One format's text: given exactly when the format is, 1..REPLYFORMAT_TEXT_MAX bytes. */
static int check_text_presence(bool wants, const char *text, const char *field,
                               const char *format, char err[ERR_MAX])
{
    if (!wants)
        return text ? err_set(err, "%s is given without format %s", field, format) : 0;
    size_t n = text ? strlen(text) : 0;
    if (n == 0 || n > REPLYFORMAT_TEXT_MAX)
        return err_set(err, "format %s needs %s, 1..%d bytes (it is %zu)", format, field,
                       REPLYFORMAT_TEXT_MAX, n);
    return 0;
}

int replyformat_check(const Llms__GenerationParams *p, char err[ERR_MAX])
{
    if (!p)
        return 0;
    /* protobuf-c keeps an enum value it does not know as it came */
    if (p->has_format && p->format != LLMS__RESPONSE_FORMAT__FORMAT_TEXT &&
        p->format != LLMS__RESPONSE_FORMAT__FORMAT_JSON_OBJECT &&
        p->format != LLMS__RESPONSE_FORMAT__FORMAT_JSON_SCHEMA &&
        p->format != LLMS__RESPONSE_FORMAT__FORMAT_GRAMMAR)
        return err_set(err, "format %d is none of FORMAT_TEXT (0), FORMAT_JSON_OBJECT (1), "
                            "FORMAT_JSON_SCHEMA (2) and FORMAT_GRAMMAR (3)", (int)p->format);
    bool schema = p->has_format && p->format == LLMS__RESPONSE_FORMAT__FORMAT_JSON_SCHEMA;
    bool gbnf = p->has_format && p->format == LLMS__RESPONSE_FORMAT__FORMAT_GRAMMAR;
    if (check_text_presence(schema, p->json_schema, "json_schema", "FORMAT_JSON_SCHEMA", err) ||
        check_text_presence(gbnf, p->grammar, "grammar", "FORMAT_GRAMMAR", err))
        return -1;
    if (schema) {
        jsonschema *compiled;
        if (jsonschema_compile(p->json_schema, strlen(p->json_schema), &compiled, err))
            return -1;
        jsonschema_free(compiled);
    }
    if (gbnf) {
        grammar *compiled;
        if (grammar_compile(p->grammar, strlen(p->grammar), &compiled, err))
            return -1;
        grammar_free(compiled);
    }
    return 0;
}
