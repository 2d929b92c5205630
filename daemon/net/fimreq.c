/* fimreq.c — a prompt and a suffix as a bare fill-in-the-middle prompt (see fimreq.h). */
#include "daemon/net/fimreq.h"

#include <stdio.h>
#include <string.h>

#include "daemon/infill.h"

int fimreq_prompt_part(const hreq *hr, const char *prompt, const char *suffix,
                       Llms__PromptPart *part, char *msg, size_t cap)
{
    const models_view_entry *dflt = http_view_default(hr->h, MODELS_GENERATE);
    const tokenizer *tok = hr->h->senv.tok;
    const char *named = hr->model_named ? hr->model_named : hr->model;
    char err[ERR_MAX], why[128];
    if (!dflt || strcmp(dflt->name, hr->model) != 0) {
        snprintf(msg, cap, "'suffix' runs on the default generate model '%s', not '%s'",
                 dflt ? dflt->name : "", named);
        return -1;
    }
    if (!tok || !infill_supported(tok, why, sizeof why)) {
        snprintf(msg, cap, "'suffix': %s does not support insert", named);
        return -1;
    }
    int32_t *ids;
    int n;
    if (infill_bare_tokens(tok, prompt, suffix, &ids, &n, err)) {
        snprintf(msg, cap, "%s", err);
        return -1;
    }
    part->tokens = ids;
    part->n_tokens = (size_t)n;
    return 0;
}
