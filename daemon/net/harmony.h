/*
 * harmony.h — a gpt-oss reply read as it streams: the messages of OpenAI's harmony format
 * told apart into reasoning, content and tool calls, as llama.cpp's server and ollama
 * read them.
 *
 * The prompt ends with "<|start|>assistant" (engine/tok/chatharmony.h); the reply goes on
 * with a message's header and body, "<|channel|>analysis<|message|>thought<|end|>", and
 * after "<|end|>" more messages, each opened by "<|start|>assistant" again:
 *
 *   <|channel|>analysis<|message|>...           reasoning
 *   <|channel|>final<|message|>...              content
 *   <|channel|>commentary<|message|>...         content (a preamble to the calls)
 *   <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}
 *    to=functions.NAME<|channel|>commentary json<|message|>{...}
 *                                               a call of NAME with those arguments
 *
 * A body ends at "<|end|>", "<|return|>" or "<|call|>" (the last two end generation and
 * are not in the reply's text, as the tokenizer makes them end-of-generation tokens) or
 * with the reply. Where the request reads calls, a call goes out as content in the
 * chatml syntax the gateway's tool scan reads ("<tool_call>\n{\"name\": \"NAME\",
 * \"arguments\": " + the body + "}\n</tool_call>", daemon/net/toolcall.h), so that calls
 * reach every route as other families' do; elsewhere (no tools, tool_choice "none") its
 * body is content as it is. A reply that does not begin as a header (the model writing plain text)
 * is content as it is, and so is everything from a header longer than HARMONY_HEADER_MAX
 * on; the markup itself never goes out.
 *
 * The result does not depend on how the reply is cut into pieces: what may begin a
 * marker is held back (never more than HARMONY_HOLD_MAX bytes, a header no more than
 * HARMONY_HEADER_MAX) and let out as soon as it cannot; nothing is allocated.
 */
#ifndef LLMS_HARMONY_H
#define LLMS_HARMONY_H

#include <stdbool.h>
#include <stddef.h>

/* The longest header read: "<|start|>assistant<|channel|>commentary to=functions.NAME
 * <|constrain|>json<|message|>" with a name of up to 96 bytes or so. */
#define HARMONY_HEADER_MAX 160

/* The most body bytes held back: "<|return|>" less its last byte. */
#define HARMONY_HOLD_MAX 9

/* What a body is. */
enum harmony_body {
    HARMONY_REASONING, /* the analysis channel */
    HARMONY_CONTENT,   /* final, commentary without a recipient, anything else */
    HARMONY_CALL,      /* a message to functions.NAME: a call's arguments */
};

enum harmony_state {
    HARMONY_HEADER, /* reading a message's header, up to "<|message|>" */
    HARMONY_BODY,   /* in a message's body */
    HARMONY_RAW,    /* not the format: the rest is content as it is */
};

typedef struct harmony_split {
    enum harmony_state state;
    enum harmony_body body;
    bool calls;                      /* calls go out in chatml's syntax */
    char header[HARMONY_HEADER_MAX]; /* (n_header) the header read so far */
    size_t n_header;
    char held[HARMONY_HOLD_MAX + 1]; /* (n_held) body bytes that may begin an end marker */
    size_t n_held;
    char call_open[HARMONY_HEADER_MAX + 64]; /* the call's opening in chatml's syntax */
    size_t fed;                              /* bytes of reply fed so far */
} harmony_split;

/* Takes a run of the reply: reasoning or content, n > 0 bytes valid for the call alone.
 * 0, or -1 to stop the feed (out of memory). */
typedef int (*harmony_emit)(void *arg, bool reasoning, const char *text, size_t n);

/* Starts s on a reply; calls: a call's message goes out as a call in chatml's syntax
 * (the request's tools are read for calls), otherwise as content. */
void harmony_init(harmony_split *s, bool calls);

/* Feeds the next n bytes of the reply (end: the reply is over, and what was held back is
 * decided), giving what they decide to emit in order. 0, or -1 when emit stopped it. */
int harmony_feed(harmony_split *s, const char *text, size_t n, bool end, harmony_emit emit,
                 void *arg);

#endif
