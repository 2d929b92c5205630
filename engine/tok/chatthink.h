/*
 * chatthink.h — what the template writers (chat.c, chattools.c) share for Qwen3's
 * template, which reads an assistant message's reasoning back ("<think>...</think>"
 * before its answer): which user message is the last query, and an assistant message's
 * opening and text as the template writes them. Header-only, as textwriter.h.
 */
#ifndef LLMS_CHATTHINK_H
#define LLMS_CHATTHINK_H

#include <stdbool.h>
#include <string.h>

#include "engine/tok/chat.h"
#include "engine/tok/textwriter.h"

/* Whether a message is a query in Qwen3's sense: a user message that is not a tool
 * response ("<tool_response>...</tool_response>", as a client may send results). */
static inline bool chatthink_is_query(const char *role, const char *content)
{
    static const char open[] = "<tool_response>", close[] = "</tool_response>";
    size_t n = strlen(content), nc = sizeof close - 1;
    bool response = strncmp(content, open, sizeof open - 1) == 0 && n >= nc &&
                    strcmp(content + n - nc, close) == 0;
    return strcmp(role, "user") == 0 && !response;
}

/*
 * An assistant message as Qwen3's template writes it, up to its calls and end of turn:
 * '<|im_start|>assistant\n' and its content (the text after its last "</think>" with the
 * line breaks before it stripped, or the whole text); after the last query (after_query)
 * and when it is the conversation's last message (last) or has reasoning, its block
 * first, '<think>\n' + the reasoning + '\n</think>\n\n', and the content's leading line
 * breaks stripped. Whether that content is not empty (what the template tests before a
 * call's line break).
 */
static inline bool chatthink_put_reply(textwriter *w, const char *content, bool after_query,
                                       bool last)
{
    const char *reasoning, *answer;
    size_t nr, skip = 0;
    bool split = chat_think_parts(content, &reasoning, &nr, &answer);
    while (split && answer[skip] == '\n')
        skip++;
    textwriter_put(w, "<|im_start|>assistant\n");
    if (after_query && (last || nr > 0)) {
        textwriter_put(w, "<think>\n");
        textwriter_put_n(w, reasoning, nr);
        textwriter_put(w, "\n</think>\n\n");
        while (answer[skip] == '\n')
            skip++;
    }
    textwriter_put(w, answer + skip);
    return split ? answer[skip] != '\0' : content[0] != '\0';
}

#endif
