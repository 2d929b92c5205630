/*
 * infill.c — llama.cpp's fill-in-the-middle prompt (infill.h).
 */
#include "daemon/infill.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/arraygrow.h"

/* llama.cpp's separator of extra chunks when the vocabulary has no FIM_SEP */
#define SNIPPET "\n\n--- snippet ---\n\n"

/* Tokens built up. */
typedef struct toks {
    int32_t *ids;
    uint32_t n, cap;
} toks;

/* n of src's tokens from the from-th after t's. */
static int push_part(toks *t, const toks *src, uint32_t from, uint32_t n, char err[ERR_MAX])
{
    if (n == 0)
        return 0;
    if (arraygrow((void **)&t->ids, &t->cap, t->n, sizeof *t->ids, n))
        return err_set(err, "out of memory");
    memcpy(t->ids + t->n, src->ids + from, sizeof *t->ids * n);
    t->n += n;
    return 0;
}

/* One token after t's. */
static int push(toks *t, int32_t id, char err[ERR_MAX])
{
    toks one = {&id, 1, 1};
    return push_part(t, &one, 0, 1, err);
}

/* len bytes of text tokenized (no BOS or EOS: llama.cpp's add_special false) after t's
 * tokens. */
static int push_text(toks *t, const tokenizer *tok, const char *text, size_t len,
                     bool parse_special, char err[ERR_MAX])
{
    int n = tok_encode(tok, text, len, false, parse_special, NULL, 0);
    if (n < 0)
        return err_set(err, "tokenizer failed on the text");
    if (n == 0)
        return 0;
    if (arraygrow((void **)&t->ids, &t->cap, t->n, sizeof *t->ids, (uint32_t)n))
        return err_set(err, "out of memory");
    if (tok_encode(tok, text, len, false, parse_special, t->ids + t->n, n) != n)
        return err_set(err, "tokenizer failed on the text");
    t->n += (uint32_t)n;
    return 0;
}

/* A FIM_SEP line: the token, then name and a newline tokenized as one text (as llama.cpp
 * does: a name's last character and the newline may merge). */
static int push_file_line(toks *t, const tokenizer *tok, int32_t sep, const char *name,
                          char err[ERR_MAX])
{
    size_t len = strlen(name);
    char *line = malloc(len + 2);
    if (!line)
        return err_set(err, "out of memory");
    memcpy(line, name, len);
    line[len] = '\n';
    line[len + 1] = '\0';
    int rc = push(t, sep, err) || push_text(t, tok, line, len + 1, false, err) ? -1 : 0;
    free(line);
    return rc;
}

/* The repo-level context of p into t: the project's line, each chunk, the current file's
 * line (infill.h). */
static int repo_context(toks *t, const tokenizer *tok, const infill_parts *p, char err[ERR_MAX])
{
    int32_t rep = tok_special(tok, TOK_SPECIAL_FIM_REP);
    int32_t sep = tok_special(tok, TOK_SPECIAL_FIM_SEP);
    /* llama.cpp names neither the project nor the current file: its fixed words stand in */
    if (rep >= 0 && (push(t, rep, err) || push_text(t, tok, "myproject\n", 10, false, err)))
        return -1;
    for (size_t i = 0; i < p->n_extra; i++) {
        const infill_chunk *c = &p->extra[i];
        if (sep >= 0 ? push_file_line(t, tok, sep, c->filename ? c->filename : "tmp", err)
                     : push_text(t, tok, SNIPPET, strlen(SNIPPET), false, err))
            return -1;
        if (push_text(t, tok, c->text, strlen(c->text), false, err))
            return -1;
    }
    return sep >= 0 ? push_file_line(t, tok, sep, "filename", err) : 0;
}

static int64_t clamp(int64_t x, int64_t lo, int64_t hi)
{
    return x < lo ? lo : x > hi ? hi : x;
}

bool infill_supported(const tokenizer *tok, char *msg, size_t cap)
{
    bool pre = tok_special(tok, TOK_SPECIAL_FIM_PRE) >= 0,
         suf = tok_special(tok, TOK_SPECIAL_FIM_SUF) >= 0,
         mid = tok_special(tok, TOK_SPECIAL_FIM_MID) >= 0;
    if (pre && suf && mid)
        return true;
    snprintf(msg, cap, "Infill is not supported by this model:%s%s%s",
             pre ? "" : " prefix token is missing.", suf ? "" : " suffix token is missing.",
             mid ? "" : " middle token is missing.");
    return false;
}

int infill_tokens(const tokenizer *tok, const infill_parts *p, int n_ctx, int64_t n_predict,
                  int32_t **out, int *n, char err[ERR_MAX])
{
    toks extra = {0}, prefix = {0}, suffix = {0}, prompt = {0}, all = {0};
    int32_t pre = tok_special(tok, TOK_SPECIAL_FIM_PRE);
    int32_t suf = tok_special(tok, TOK_SPECIAL_FIM_SUF);
    int32_t mid = tok_special(tok, TOK_SPECIAL_FIM_MID);
    int rc = -1;
    if (repo_context(&extra, tok, p, err) ||
        push_text(&prefix, tok, p->prefix, strlen(p->prefix), false, err) ||
        push_text(&suffix, tok, p->suffix, strlen(p->suffix), false, err) ||
        push_text(&prompt, tok, p->prompt, strlen(p->prompt), true, err))
        goto out;
    /* llama.cpp's budget (infill.h); n_predict beyond the window leaves nothing either way,
     * and is cut there so that twice it cannot overflow */
    int64_t batch = n_ctx / 2;
    uint32_t take_prefix = (uint32_t)clamp(3 * (batch / 4), 0, prefix.n);
    uint32_t take_suffix = (uint32_t)clamp(batch / 4 - (2 + (int64_t)prompt.n), 0, suffix.n);
    uint32_t take_extra =
        (uint32_t)clamp(n_ctx - batch - 2 * clamp(n_predict, -1, n_ctx), 0, extra.n);
    if (push_part(&all, &extra, extra.n - take_extra, take_extra, err) ||
        (tok_add_bos(tok) && push(&all, tok_bos(tok), err)) || push(&all, pre, err) ||
        push_part(&all, &prefix, prefix.n - take_prefix, take_prefix, err) ||
        push_part(&all, &prompt, 0, prompt.n, err) || push(&all, suf, err) ||
        push_part(&all, &suffix, 0, take_suffix, err) || push(&all, mid, err))
        goto out;
    if (all.n > INT32_MAX) {
        err_set(err, "the prompt is %u tokens", all.n);
        goto out;
    }
    *out = all.ids;
    *n = (int)all.n;
    all.ids = NULL;
    rc = 0;
out:
    free(extra.ids);
    free(prefix.ids);
    free(suffix.ids);
    free(prompt.ids);
    free(all.ids);
    return rc;
}

int infill_bare_tokens(const tokenizer *tok, const char *prefix, const char *suffix,
                       int32_t **out, int *n, char err[ERR_MAX])
{
    toks all = {0};
    if ((tok_add_bos(tok) && push(&all, tok_bos(tok), err)) ||
        push(&all, tok_special(tok, TOK_SPECIAL_FIM_PRE), err) ||
        push_text(&all, tok, prefix, strlen(prefix), false, err) ||
        push(&all, tok_special(tok, TOK_SPECIAL_FIM_SUF), err) ||
        push_text(&all, tok, suffix, strlen(suffix), false, err) ||
        push(&all, tok_special(tok, TOK_SPECIAL_FIM_MID), err)) {
        free(all.ids);
        return -1;
    }
    if (all.n > INT32_MAX) {
        free(all.ids);
        return err_set(err, "the prompt is %u tokens", all.n);
    }
    *out = all.ids;
    *n = (int)all.n;
    return 0;
}
