/*
 * jsonfield.h — reading the fields of a gateway request body (json-c): the type a field
 * must have, the values clients send when they mean "none", a list of texts, the stop
 * strings. Every API shape (openai.c, ollama.c, llamacpp.c) reads its bodies with these,
 * so that a field is refused in the same words whichever route it came to.
 */
#ifndef LLMS_JSONFIELD_H
#define LLMS_JSONFIELD_H

#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>

#include "proto/llms.pb-c.h"

/* The field key of o, of type t (an integer is taken for a number): 1 found (*out), 0
 * absent or null, -1 another type, with msg naming it as where + key ("options." or ""). */
int jsonfield_get(json_object *o, const char *key, const char *where, json_type t,
                  json_object **out, char *msg, size_t cap);

/* The sampling numbers both API shapes name alike (temperature, top_p, min_p,
 * repeat_penalty, frequency_penalty, presence_penalty) from o into p: 0, or -1 with msg
 * for one that is not a number. Their ranges are the session's to check. */
int jsonfield_sampling_floats(json_object *o, const char *where, Llms__GenerationParams *p,
                              char *msg, size_t cap);

/* The stop strings of o's field key (a string or an array of strings; absent or null:
 * none) appended to p->stop, which has room for max of them (pointing into o). 0, or -1
 * with msg naming where + key. Their lengths are the session's to check. */
int jsonfield_stops(json_object *o, const char *key, const char *where,
                    Llms__GenerationParams *p, size_t max, char *msg, size_t cap);

/* Whether a value asks for nothing: null, false, an empty array, object or string. */
bool jsonfield_asks_nothing(json_object *v);

/* The strings of in, a string or an array of strings, as *texts (malloc'd, *n of them,
 * pointing into in): 0; -1 when in or an element is not a string (*texts NULL); -2 out
 * of memory. */
int jsonfield_strings(json_object *in, const char ***texts, size_t *n);

/* A chat message's content: "" when absent or null, a string, or text parts joined (into
 * *owned, to free) with a newline between them once there is text, as llama.cpp's server
 * joins them. NULL with msg for anything else. */
const char *jsonfield_message_content(json_object *m, char **owned, char *msg, size_t cap);

#endif
