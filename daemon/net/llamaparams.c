/* llamaparams.c — llama.cpp's sampling fields of a request body (see llamaparams.h). */
#include "daemon/net/llamaparams.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "daemon/net/jsonfield.h"

/* llama.cpp's names and letters of its samplers, and infill, which llmsd does not have
 * (step -1). */
static const struct {
    const char *name;
    char letter;
    int step;
} names[] = {
    {"penalties", 'e', LLMS__SAMPLER_STEP__SAMPLER_PENALTIES},
    {"dry", 'd', LLMS__SAMPLER_STEP__SAMPLER_DRY},
    {"top_n_sigma", 's', LLMS__SAMPLER_STEP__SAMPLER_TOP_N_SIGMA},
    {"top_k", 'k', LLMS__SAMPLER_STEP__SAMPLER_TOP_K},
    {"typ_p", 'y', LLMS__SAMPLER_STEP__SAMPLER_TYPICAL},
    {"top_p", 'p', LLMS__SAMPLER_STEP__SAMPLER_TOP_P},
    {"min_p", 'm', LLMS__SAMPLER_STEP__SAMPLER_MIN_P},
    {"xtc", 'x', LLMS__SAMPLER_STEP__SAMPLER_XTC},
    {"temperature", 't', LLMS__SAMPLER_STEP__SAMPLER_TEMPERATURE},
    {"infill", 'i', -1},
};

const char *llamaparams_step_name(Llms__SamplerStep step)
{
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (names[i].step == (int)step)
            return names[i].name;
    return "";
}

/* A number field into *out with *has set: 1 read, 0 absent, -1 (msg). */
static int number(json_object *o, const char *key, protobuf_c_boolean *has, float *out,
                  char *msg, size_t cap)
{
    json_object *v;
    int rc = jsonfield_get(o, key, "", json_type_double, &v, msg, cap);
    if (rc == 1)
        *has = 1, *out = (float)json_object_get_double(v);
    return rc;
}

/* An integer field (int32's range) into *out with *has set: 1, 0 absent, -1 (msg). */
static int integer(json_object *o, const char *key, protobuf_c_boolean *has, int32_t *out,
                   char *msg, size_t cap)
{
    json_object *v;
    int rc = jsonfield_get(o, key, "", json_type_int, &v, msg, cap);
    if (rc == 1) {
        int64_t x = json_object_get_int64(v);
        *has = 1, *out = x < INT32_MIN ? INT32_MIN : x > INT32_MAX ? INT32_MAX : (int32_t)x;
    }
    return rc;
}

/* The step of samplers' entry i (a name, or with letters a character): 0.., or -1 with
 * msg. */
static int step_of(json_object *list, size_t i, bool letters, char *msg, size_t cap)
{
    const char *name = NULL;
    char c = 0;
    if (letters) {
        c = json_object_get_string(list)[i];
    } else {
        json_object *e = json_object_array_get_idx(list, i);
        if (!json_object_is_type(e, json_type_string)) {
            snprintf(msg, cap, "'samplers' is an array of sampler names, or a string of their "
                               "letters");
            return -1;
        }
        name = json_object_get_string(e);
    }
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        if (letters ? c != names[k].letter : strcmp(name, names[k].name) != 0)
            continue;
        if (names[k].step < 0)
            snprintf(msg, cap, "'samplers': the %s sampler is not supported", names[k].name);
        return names[k].step;
    }
    if (letters)
        snprintf(msg, cap, "'samplers': '%c' is no sampler's letter", c);
    else
        snprintf(msg, cap, "'samplers': '%.32s' is no sampler's name", name);
    return -1;
}

/* llama.cpp's samplers list: the steps that run, in its order. 0, or -1 with msg. */
static int read_order(json_object *body, Llms__GenerationParams *p, llamaparams_lists *lists,
                      char *msg, size_t cap)
{
    json_object *v;
    if (!json_object_object_get_ex(body, "samplers", &v) || json_object_is_type(v, json_type_null))
        return 0;
    bool letters = json_object_is_type(v, json_type_string);
    if (!letters && !json_object_is_type(v, json_type_array)) {
        snprintf(msg, cap, "'samplers' is an array of sampler names, or a string of their "
                           "letters");
        return -1;
    }
    size_t n = letters ? (size_t)json_object_get_string_len(v) : json_object_array_length(v);
    if (n > LLAMAPARAMS_STEPS) {
        snprintf(msg, cap, "'samplers' names %zu samplers: each runs once, and there are %d",
                 n, LLAMAPARAMS_STEPS);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        int step = step_of(v, i, letters, msg, cap);
        if (step < 0)
            return -1;
        lists->order[i] = (Llms__SamplerStep)step;
    }
    /* None listed: llama.cpp's chain is its draw alone, from the model's distribution.
     * Native orders are never empty (none is the default one): a temperature of 1. */
    if (n == 0) {
        lists->order[n++] = LLMS__SAMPLER_STEP__SAMPLER_TEMPERATURE;
        p->has_temperature = p->has_dynatemp_range = 1;
        p->temperature = 1, p->dynatemp_range = 0;
    }
    p->n_samplers = n;
    p->samplers = lists->order;
    return 0;
}

/* dry_sequence_breakers: a non-empty array of strings, as llama.cpp's server demands. */
static int read_breakers(json_object *body, Llms__GenerationParams *p, llamaparams_lists *lists,
                         char *msg, size_t cap)
{
    json_object *v;
    int rc = jsonfield_get(body, "dry_sequence_breakers", "", json_type_array, &v, msg, cap);
    if (rc <= 0)
        return rc;
    size_t n = json_object_array_length(v);
    if (n == 0 || n > DRYBREAK_MAX) {
        snprintf(msg, cap, "'dry_sequence_breakers' must be a non-empty array of at most %d "
                           "strings", DRYBREAK_MAX);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_array_get_idx(v, i);
        if (!json_object_is_type(e, json_type_string)) {
            snprintf(msg, cap, "'dry_sequence_breakers[%zu]' must be a string", i);
            return -1;
        }
        lists->breakers[i] = (char *)json_object_get_string(e);
    }
    p->n_dry_sequence_breakers = n;
    p->dry_sequence_breakers = lists->breakers;
    return 0;
}

int llamaparams_read(json_object *body, Llms__GenerationParams *p, llamaparams_lists *lists,
                     char *msg, size_t cap)
{
    if (integer(body, "min_keep", &p->has_min_keep, &p->min_keep, msg, cap) < 0 ||
        number(body, "typical_p", &p->has_typical_p, &p->typical_p, msg, cap) < 0 ||
        number(body, "top_n_sigma", &p->has_top_n_sigma, &p->top_n_sigma, msg, cap) < 0 ||
        number(body, "xtc_probability", &p->has_xtc_probability, &p->xtc_probability, msg,
               cap) < 0 ||
        number(body, "xtc_threshold", &p->has_xtc_threshold, &p->xtc_threshold, msg, cap) < 0 ||
        number(body, "dynatemp_range", &p->has_dynatemp_range, &p->dynatemp_range, msg,
               cap) < 0 ||
        number(body, "dynatemp_exponent", &p->has_dynatemp_exponent, &p->dynatemp_exponent,
               msg, cap) < 0 ||
        number(body, "dry_multiplier", &p->has_dry_multiplier, &p->dry_multiplier, msg,
               cap) < 0 ||
        number(body, "dry_base", &p->has_dry_base, &p->dry_base, msg, cap) < 0 ||
        integer(body, "dry_allowed_length", &p->has_dry_allowed_length,
                &p->dry_allowed_length, msg, cap) < 0 ||
        integer(body, "dry_penalty_last_n", &p->has_dry_penalty_last_n,
                &p->dry_penalty_last_n, msg, cap) < 0 ||
        integer(body, "mirostat", &p->has_mirostat, &p->mirostat, msg, cap) < 0 ||
        number(body, "mirostat_tau", &p->has_mirostat_tau, &p->mirostat_tau, msg, cap) < 0 ||
        number(body, "mirostat_eta", &p->has_mirostat_eta, &p->mirostat_eta, msg, cap) < 0 ||
        read_breakers(body, p, lists, msg, cap) < 0 || read_order(body, p, lists, msg, cap) < 0)
        return -1;
    /* llama.cpp's off values beyond the native ranges */
    if (p->has_typical_p && p->typical_p > 1)
        p->typical_p = 1;
    if (p->has_xtc_probability && p->xtc_probability < 0)
        p->xtc_probability = 0;
    if (p->has_xtc_threshold && p->xtc_threshold < 0)
        p->xtc_threshold = 0;
    if (p->has_dynatemp_range && p->dynatemp_range < 0)
        p->dynatemp_range = 0;
    /* llama.cpp's server puts its default in place of a base below 1 */
    if (p->has_dry_base && p->dry_base < 1)
        p->dry_base = 1.75f;
    return 0;
}
