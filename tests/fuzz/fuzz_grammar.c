/* libFuzzer target for a client's GBNF grammar (grammar_compile) and the recogniser
 * following it (engine/model/grammar.h). The input is the grammar, a NUL, then bytes: fed
 * one by one until one is refused, then used as the choices of a short random walk among
 * the bytes the state takes. A refusal must come with a message; a state that takes no
 * byte must be complete unless a bound refused its bytes (grammar.h promises no other
 * dead end); finished must be complete with no byte to take; a byte refused must leave
 * the state as it was; the walk's text, fed at once to a fresh cursor, must be taken with
 * the same verdict; nothing may crash, leak or overflow (deep groups, huge repetitions,
 * ambiguity, left recursion). */
#include <stdlib.h>
#include <string.h>

#include "engine/model/grammar.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The bytes c takes next (probe: scratch of the same grammar); how many. */
static int next_bytes(grammar_cursor *c, grammar_cursor *probe, uint8_t ok[256])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        if (grammar_cursor_copy(probe, c))
            abort();
        if (grammar_feed(probe, &byte, 1) == 0)
            ok[n++] = byte;
    }
    return n;
}

static void check_state(grammar_cursor *c, grammar_cursor *probe, uint8_t ok[256], int *n_ok)
{
    *n_ok = next_bytes(c, probe, ok);
    if (*n_ok == 0 && !grammar_complete(c) && !grammar_bounded(c))
        abort(); /* a dead end no bound explains */
    if (grammar_finished(c) != (*n_ok == 0 && grammar_complete(c)))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const uint8_t *nul = memchr(data, 0, size);
    size_t len = nul ? (size_t)(nul - data) : size;
    char err[ERR_MAX] = "";
    grammar *g = NULL;
    if (grammar_compile((const char *)data, len, &g, err) < 0) {
        if (strncmp(err, "grammar: ", 9) != 0 || g)
            abort();
        return 0;
    }
    const uint8_t *in = nul ? nul + 1 : data + size, *end = data + size;
    grammar_cursor *c = NULL, *probe = NULL, *fresh = NULL;
    if (grammar_cursor_new(g, NULL, &c, err) || grammar_cursor_new(g, NULL, &probe, err) ||
        grammar_cursor_new(g, NULL, &fresh, err))
        abort();
    uint8_t text[512], ok[256];
    size_t n = 0;
    int n_ok;
    /* the input's bytes while they are taken; a refused one changes nothing */
    for (; in < end && n < sizeof text; in++) {
        bool complete = grammar_complete(c);
        if (grammar_feed(c, in, 1)) {
            if (grammar_complete(c) != complete)
                abort();
            in++;
            break;
        }
        text[n++] = *in;
    }
    /* then a walk: each input byte left picks among the bytes the state takes */
    for (int steps = 0; steps < 24 && n < sizeof text; steps++) {
        check_state(c, probe, ok, &n_ok);
        if (n_ok == 0 || in >= end)
            break;
        uint8_t byte = ok[*in++ % n_ok];
        if (grammar_feed(c, &byte, 1))
            abort();
        text[n++] = byte;
    }
    check_state(c, probe, ok, &n_ok);
    if (grammar_feed(fresh, text, n) || grammar_complete(fresh) != grammar_complete(c) ||
        grammar_finished(fresh) != grammar_finished(c))
        abort();
    grammar_cursor_free(c);
    grammar_cursor_free(probe);
    grammar_cursor_free(fresh);
    grammar_free(g);
    return 0;
}
