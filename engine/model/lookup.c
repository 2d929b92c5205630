/* lookup.c — prompt-lookup drafts (see lookup.h). */
#include "engine/model/lookup.h"

#include <string.h>

/* The start of the latest occurrence of hist[n - g, n) that begins before n - g, or -1. */
static int latest_match(const int32_t *hist, int n, int g)
{
    const int32_t *tail = hist + n - g;
    for (int i = n - g - 1; i >= 0; i--)
        if (hist[i] == tail[0] && memcmp(hist + i, tail, sizeof *tail * (size_t)g) == 0)
            return i;
    return -1;
}

int lookup_propose(const int32_t *hist, int n, int k, int32_t *out)
{
    for (int g = LOOKUP_NGRAM_MAX; g >= LOOKUP_NGRAM_MIN && k > 0; g--) {
        if (n <= g)
            continue;
        int at = latest_match(hist, n, g);
        if (at < 0)
            continue;
        /* what followed the match, up to the end of hist (a repeating pattern continues
         * into the tokens it proposes, as the text would) */
        int from = at + g, m = 0;
        for (; m < k && from + m < n; m++)
            out[m] = hist[from + m];
        return m;
    }
    return 0;
}
