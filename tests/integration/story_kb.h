/*
 * story_kb.h — the four-story knowledge base the graph tests retrieve from.
 *
 * Header-only (static inline), as llmsd_proc.h: the Makefile links tests only with
 * tests/support, and this is for the integration tests alone.
 */
#ifndef LLMS_TESTS_STORY_KB_H
#define LLMS_TESTS_STORY_KB_H

#include <stdio.h>

#include "client/llms.h"

/* "boat" is in the second story only */
static const char *const story_kb_texts[] = {
    "Lily went to the park with her dog. They played with a red ball all day.",
    "Tom had a big boat. He sailed on the river and saw a fish jump.",
    "The little bird sang a song in the tree. The sun was warm and happy.",
    "Sam baked a cake with his mom. The cake was sweet and they shared it.",
};

/* Creates knowledge base "stories" on c with the four stories as documents d0..d3 (a
 * base that already exists is kept as it is). 0 or -1. */
static inline int story_kb_make(llms_conn *c)
{
    llms_kb_doc d[4];
    char ids[4][16];
    for (int i = 0; i < 4; i++) {
        snprintf(ids[i], sizeof ids[i], "d%d", i);
        d[i] = (llms_kb_doc){ids[i], story_kb_texts[i], NULL};
    }
    enum llms_status s = llms_kb_create(c, "stories", 0, 0);
    if (s != LLMS_OK && s != LLMS_ERR_FAILED_PRECONDITION)
        return -1;
    return s == LLMS_OK ? (llms_kb_add(c, "stories", d, 4, NULL) == LLMS_OK ? 0 : -1) : 0;
}

#endif
