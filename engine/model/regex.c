/* regex.c — a JSON Schema pattern compiled into a byte automaton (see regex.h). */
#include "engine/model/regex.h"

struct regex_dfa {
    uint16_t start;
};

int regex_compile(const char *pattern, size_t len, uint32_t min_chars, uint32_t max_chars,
                  regex_dfa **out, char err[ERR_MAX])
{
    (void)pattern, (void)len, (void)min_chars, (void)max_chars;
    *out = NULL;
    return err_set(err, "pattern: not compiled yet");
}

void regex_free(regex_dfa *dfa)
{
    (void)dfa;
}

uint16_t regex_start(const regex_dfa *dfa)
{
    return dfa->start;
}

uint16_t regex_step(const regex_dfa *dfa, uint16_t state, uint8_t byte)
{
    (void)dfa, (void)state, (void)byte;
    return REGEX_DEAD;
}

bool regex_accepts(const regex_dfa *dfa, uint16_t state)
{
    (void)dfa, (void)state;
    return false;
}
