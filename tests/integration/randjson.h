/*
 * randjson.h — random JSON values for the gateway routes' random-body tests: null,
 * booleans, integers and numbers at the edges, strings of a test's words, arrays, and
 * objects of a test's field names, nested up to depth 3. The same values on every run
 * (test_random's xorshift64), unless LLMS_RANDOM_SEED names others.
 */
#ifndef LLMS_TEST_RANDJSON_H
#define LLMS_TEST_RANDJSON_H

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/support/test.h"

typedef struct randjson {
    uint64_t rng;              /* test_random's state: test_random_seed(&r.rng) */
    const char *const *keys;   /* (n_keys) field names of the routes' requests */
    size_t n_keys;
    const char *const *words;  /* (n_words) the strings values are drawn from */
    size_t n_words;
} randjson;

/* 0..n-1. */
static inline int randjson_pick(randjson *r, int n)
{
    return (int)(test_random(&r->rng) % (uint64_t)n);
}

static inline const char *randjson_key(randjson *r)
{
    return r->keys[randjson_pick(r, (int)r->n_keys)];
}

/* A value of a random type at depth (arrays and objects only above depth 3); NULL is
 * JSON's null. */
static inline json_object *randjson_value(randjson *r, int depth)
{
    static const double numbers[] = {0, 1, -1, -2, 0.5, 1e300, -1e300, 2147483648.0, 1e-300};
    switch (randjson_pick(r, depth >= 3 ? 5 : 7)) {
    case 0:
        return NULL;
    case 1:
        return json_object_new_boolean(randjson_pick(r, 2));
    case 2:
        return json_object_new_int64(randjson_pick(r, 2)   ? (int64_t)randjson_pick(r, 40) - 8
                                     : randjson_pick(r, 2) ? INT64_MAX
                                                           : INT64_MIN);
    case 3:
        return json_object_new_double(
            numbers[randjson_pick(r, (int)(sizeof numbers / sizeof *numbers))]);
    case 4:
        return json_object_new_string(r->words[randjson_pick(r, (int)r->n_words)]);
    case 5: {
        json_object *a = json_object_new_array();
        for (int i = randjson_pick(r, 4); i > 0; i--)
            json_object_array_add(a, randjson_value(r, depth + 1));
        return a;
    }
    default: {
        json_object *o = json_object_new_object();
        for (int i = randjson_pick(r, 6); i > 0; i--)
            json_object_object_add(o, randjson_key(r), randjson_value(r, depth + 1));
        return o;
    }
    }
}

#endif
