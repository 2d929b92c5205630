/* Prompt-lookup drafts (engine/model/lookup.h). */
#include <string.h>

#include "engine/model/lookup.h"
#include "tests/support/test.h"

static void no_match_no_draft(void)
{
    const int32_t h[] = {1, 2, 3, 4, 5, 6};
    int32_t out[8];
    CHECK_EQ(lookup_propose(h, 6, 8, out), 0);
    CHECK_EQ(lookup_propose(h, 1, 8, out), 0);
    CHECK_EQ(lookup_propose(h, 0, 8, out), 0);
}

/* The tokens after the earlier occurrence of the last n-gram, at most k, never past the
 * history's end. */
static void copies_what_followed(void)
{
    const int32_t h[] = {9, 5, 6, 7, 8, 1, 2, 3, 4, 0, 5, 6, 7};
    int32_t out[8];
    int n = lookup_propose(h, 13, 3, out);
    CHECK_EQ(n, 3);
    CHECK(out[0] == 8 && out[1] == 1 && out[2] == 2);
    n = lookup_propose(h, 13, 8, out);
    CHECK_EQ(n, 8);
    CHECK(out[7] == 6);
    CHECK_EQ(lookup_propose(h, 13, 0, out), 0);
}

/* The longest n-gram decides, then the latest of its occurrences. */
static void longest_then_latest(void)
{
    /* "2 3" occurs late followed by 50; "1 2 3" early followed by 40: the 3-gram wins */
    const int32_t h[] = {1, 2, 3, 40, 7, 2, 3, 50, 1, 2, 3};
    int32_t out[4];
    CHECK_EQ(lookup_propose(h, 11, 1, out), 1);
    CHECK_EQ(out[0], 40);
    /* two occurrences of "7 8": the latest */
    const int32_t g[] = {7, 8, 1, 0, 7, 8, 2, 0, 7, 8};
    CHECK_EQ(lookup_propose(g, 10, 1, out), 1);
    CHECK_EQ(out[0], 2);
}

/* A repeating pattern continues into the proposal. */
static void repetition_continues(void)
{
    const int32_t h[] = {4, 5, 4, 5, 4, 5};
    int32_t out[6];
    int n = lookup_propose(h, 6, 6, out);
    CHECK(n >= 2);
    for (int i = 0; i < n; i++)
        CHECK_EQ(out[i], i % 2 ? 5 : 4);
}

int main(void)
{
    RUN(no_match_no_draft);
    RUN(copies_what_followed);
    RUN(longest_then_latest);
    RUN(repetition_continues);
    return test_finish();
}
