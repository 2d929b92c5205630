/* libFuzzer target for a client's JSON Schema pattern (regex_compile): the input is two
 * bytes of length bounds, the pattern, a NUL, then a string walked through the automaton
 * byte by byte. A refusal must come with a message; a compiled automaton must start live,
 * keep REGEX_DEAD dead, and from wherever the walk stops alive still reach an accepting
 * state (no dead ends: a model writing a patterned string must always be able to finish);
 * nothing may crash, leak or overflow (deep groups, huge repeats, wide classes). */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/regex.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Whether an accepting state is reachable from state (breadth first over every byte). */
static bool reaches_acceptance(const regex_dfa *dfa, uint16_t state)
{
    static bool seen[REGEX_STATES_MAX];
    static uint16_t queue[REGEX_STATES_MAX];
    memset(seen, 0, sizeof seen);
    int head = 0, tail = 0;
    queue[tail++] = state;
    seen[state] = true;
    while (head < tail) {
        uint16_t s = queue[head++];
        if (regex_accepts(dfa, s))
            return true;
        for (int b = 0; b < 256; b++) {
            uint16_t t = regex_step(dfa, s, (uint8_t)b);
            if (t != REGEX_DEAD && !seen[t]) {
                seen[t] = true;
                queue[tail++] = t;
            }
        }
    }
    return false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    uint32_t min_chars = data[0] % 16, max_chars = data[1] < 128 ? min_chars + data[1] % 48
                                                                 : UINT32_MAX;
    data += 2;
    size -= 2;
    const uint8_t *nul = memchr(data, 0, size);
    size_t len = nul ? (size_t)(nul - data) : size;
    char err[ERR_MAX] = "";
    regex_dfa *dfa = NULL;
    if (regex_compile((const char *)data, len, min_chars, max_chars, &dfa, err) < 0) {
        if (!err[0] || dfa)
            abort();
        return 0;
    }
    uint16_t s = regex_start(dfa);
    if (s == REGEX_DEAD || regex_step(dfa, REGEX_DEAD, 'a') != REGEX_DEAD ||
        regex_accepts(dfa, REGEX_DEAD))
        abort();
    const uint8_t *text = nul ? nul + 1 : data + size;
    for (; text < data + size && s != REGEX_DEAD; text++)
        s = regex_step(dfa, s, *text);
    if (s != REGEX_DEAD && !reaches_acceptance(dfa, s))
        abort();
    regex_free(dfa);
    return 0;
}
