/* libFuzzer target for structured output's untrusted input: a client's JSON Schema
 * (jsonschema_compile) and, when it compiles, a reply fed to the recogniser following it
 * byte by byte (jsonmask_feed), as a generation's tokens are. The input is the schema,
 * a NUL, then the reply. A refusal must come with a message; the recogniser must never
 * take a byte after it has refused one, nor leave the top level open once complete; and
 * nothing may crash, leak or overflow (recursive $refs, deep nesting, huge bounds). */
#include <stdlib.h>
#include <string.h>

#include "engine/model/jsonmask.h"
#include "engine/model/jsonschema.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t schema_len = nul ? (size_t)(nul - data) : size;
    char err[ERR_MAX] = "";
    jsonschema *s = NULL;
    if (jsonschema_compile((const char *)data, schema_len, &s, err) < 0) {
        if (!err[0] || s)
            abort();
        return 0;
    }
    jsonmask_state st;
    jsonmask_init_schema(&st, s);
    const uint8_t *reply = nul ? nul + 1 : data + size;
    size_t n = (size_t)(data + size - reply);
    for (size_t i = 0; i < n; i++) {
        bool was_complete = jsonmask_complete(&st);
        if (!jsonmask_feed(&st, reply + i, 1))
            break;
        if (was_complete)
            abort(); /* nothing may follow a whole value */
    }
    jsonschema_free(s);
    return 0;
}
