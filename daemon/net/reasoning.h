/*
 * reasoning.h — a reasoning model's reply told apart into its reasoning and its content
 * as it streams: Qwen3, QwQ and the DeepSeek-R1 distills write their thinking as
 * "<think>...</think>" before the answer, which llama.cpp's server (reasoning_format
 * deepseek), vLLM (--reasoning-parser) and DeepSeek's API give as reasoning_content and
 * ollama as thinking.
 *
 * What is reasoning, as llama.cpp reads it: a reply that begins with "<think>" (its very
 * first bytes; for GLM-4.5 and 4.6, CHAT_THINK_REPLY_SPACED, its first after white space,
 * as their template writes "\n<think>", the white space dropped whatever follows it), or
 * any reply when the template's generation prompt opened the block itself, is reasoning
 * up to "</think>"; what follows is content. A reply that does not
 * begin so is all content, its bytes as they are ("<think>" further on included), and so
 * is everything after the first "</think>". A block never closed (the reply cut by
 * max_tokens) is reasoning to the end. White space at the start of the reasoning and of
 * the content after "</think>" is dropped, and one line break right before "</think>"
 * (the models write "<think>\nthought\n</think>\n\nanswer", which gives "thought" and
 * "answer"); more white space at the end of the reasoning stays, as holding back a run of
 * it would delay the stream by as much.
 *
 * The result does not depend on how the reply is cut into pieces: a marker split between
 * pieces is found all the same. What may begin a marker is held back, never more than
 * REASONING_HOLD_MAX bytes, and let out as soon as it cannot; nothing is allocated.
 */
#ifndef LLMS_REASONING_H
#define LLMS_REASONING_H

#include <stdbool.h>
#include <stddef.h>

#include "daemon/net/harmony.h"
#include "engine/tok/chat.h"

#define REASONING_OPEN "<think>"
#define REASONING_CLOSE "</think>"

/* The most bytes a split holds back: a line break and "</think>" less its last byte. */
#define REASONING_HOLD_MAX 8

/* The most spans one reasoning_feed gives. */
#define REASONING_SPANS 4

enum reasoning_state {
    REASONING_AT_START,   /* nothing decided: the reply may open a block */
    REASONING_AT_SPACE,   /* before the reply's first byte that is not white space, which
                             may open a block (CHAT_THINK_REPLY_SPACED) */
    REASONING_LEAD,       /* in the block, before its first byte that is not white space */
    REASONING_IN,         /* in the block */
    REASONING_AFTER,      /* the block closed: white space before the content is dropped */
    REASONING_CONTENT,    /* the rest is content as it is */
};

typedef struct reasoning_split {
    enum reasoning_state state;
    char held[REASONING_HOLD_MAX]; /* (n_held) bytes that may begin a marker */
    size_t n_held;
    char out[REASONING_HOLD_MAX];  /* held bytes given out by the last feed, which its
                                      spans may point into */
    size_t fed;                    /* bytes of reply fed so far */
    bool harmony;                  /* a gpt-oss reply, told apart by h instead */
    harmony_split h;
} reasoning_split;

/* A run of the reply's text: reasoning or content. */
typedef struct reasoning_span {
    bool reasoning;
    const char *text; /* into the piece fed, or into the split's own out */
    size_t n;
} reasoning_span;

/* Starts s on a reply; opened: the prompt ended inside a block the template opened. */
void reasoning_init(reasoning_split *s, bool opened);

/* Starts s on a reply of a family whose reasoning chat_thinking says how to tell:
 * reasoning_init's think markers (opened for CHAT_THINK_OPENED, after white space for
 * CHAT_THINK_REPLY_SPACED), or gpt-oss's channels
 * (CHAT_THINK_HARMONY: daemon/net/harmony.h, whose calls come out in the content, in
 * chatml's syntax where calls is set). */
void reasoning_start(reasoning_split *s, enum chat_think kind, bool calls);

/*
 * Feeds the next n bytes of the reply (end: the reply is over, and what was held back is
 * decided) into spans (room for REASONING_SPANS): the reasoning and content they decide,
 * in order, none empty. Returns how many. The spans are valid until the next feed and
 * as long as text is. For a split of think markers only (reasoning_init's).
 */
int reasoning_feed(reasoning_split *s, const char *text, size_t n, bool end,
                   reasoning_span *spans);

/* The same for any split, giving each run to emit (harmony.h's; text valid for the call
 * alone) in order. 0, or -1 when emit stopped it. */
int reasoning_feed_each(reasoning_split *s, const char *text, size_t n, bool end,
                        harmony_emit emit, void *arg);

/* Bytes of reply fed so far. */
size_t reasoning_fed(const reasoning_split *s);

/* A whole reply (n bytes) of a family whose chat_thinking is kind (not
 * CHAT_THINK_HARMONY) told apart: *reasoning and *content each one run of text (their n 0
 * when there is none). */
void reasoning_split_text(enum chat_think kind, const char *text, size_t n,
                          reasoning_span *reasoning, reasoning_span *content);

/* A whole gpt-oss reply (n bytes) told apart: its reasoning and its content (calls as
 * harmony_init's calls says) each one run of *owned, a fresh buffer the caller frees. 0,
 * or -1 out of memory. */
int reasoning_split_harmony(const char *text, size_t n, bool calls, char **owned,
                            reasoning_span *reasoning, reasoning_span *content);

#endif
