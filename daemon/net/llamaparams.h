/*
 * llamaparams.h — llama.cpp's server's sampling fields beyond OpenAI's, read from a
 * request body: min_keep, typical_p, top_n_sigma, xtc_probability and xtc_threshold,
 * dynatemp_range and dynatemp_exponent, the dry_ fields with dry_sequence_breakers,
 * mirostat, mirostat_tau and mirostat_eta, and the `samplers` order (names or a string
 * of letters). llama.cpp's /completion takes them, and so do its /v1/chat/completions
 * and /v1/completions (the same reader of a body): llamacpp.c and openai.c read them
 * here, and llamacpp.c names the steps with them in its generation_settings.
 */
#ifndef LLMS_LLAMAPARAMS_H
#define LLMS_LLAMAPARAMS_H

#include <json-c/json.h>
#include <stddef.h>

#include "engine/model/drybreak.h"
#include "proto/llms.pb-c.h"

/* The steps of the chain: LLMS__SAMPLER_STEP__SAMPLER_TEMPERATURE is the last. */
#define LLAMAPARAMS_STEPS (LLMS__SAMPLER_STEP__SAMPLER_TEMPERATURE + 1)

/* Where the lists read into a GenerationParams point: it must live as long as it. */
typedef struct llamaparams_lists {
    char *breakers[DRYBREAK_MAX];            /* into the body */
    Llms__SamplerStep order[LLAMAPARAMS_STEPS];
} llamaparams_lists;

/* The fields of body into p (their lists into *lists). llama.cpp's values that turn a
 * sampler off become the native off values where the native range has no room for them
 * (typical_p above 1; a negative xtc_probability, xtc_threshold or dynatemp_range), as
 * its server's replacement does for dry_base below 1 (1.75); the rest of each range is
 * the session's to check. An empty dry_sequence_breakers, more than DRYBREAK_MAX of
 * them, a samplers name or letter llama.cpp does not have, and infill are refused. 0, or
 * -1 with msg naming the field. */
int llamaparams_read(json_object *body, Llms__GenerationParams *p, llamaparams_lists *lists,
                     char *msg, size_t cap);

/* llama.cpp's name of a step of the chain ("penalties", "dry", "top_n_sigma", "top_k",
 * "typ_p", "top_p", "min_p", "xtc", "temperature"). */
const char *llamaparams_step_name(Llms__SamplerStep step);

#endif
