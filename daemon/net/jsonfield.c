/*
 * jsonfield.c — a request body's fields, for both of the gateway's API shapes.
 */
#include "daemon/net/jsonfield.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int jsonfield_get(json_object *o, const char *key, const char *where, json_type t,
                  json_object **out, char *msg, size_t cap)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
        return 0;
    json_type have = json_object_get_type(v);
    if (have == t || (t == json_type_double && have == json_type_int)) {
        *out = v;
        return 1;
    }
    snprintf(msg, cap, "'%s%s' must be %s", where, key,
             t == json_type_string ? "a string" : t == json_type_int ? "an integer"
             : t == json_type_double ? "a number" : t == json_type_boolean ? "a boolean"
             : t == json_type_array ? "an array" : "an object");
    return -1;
}

/* jsonfield_get of a number into *out, setting *has: 1 read, 0 absent, -1 (msg). */
static int read_float(json_object *o, const char *key, const char *where, protobuf_c_boolean *has,
                      float *out, char *msg, size_t cap)
{
    json_object *v;
    int rc = jsonfield_get(o, key, where, json_type_double, &v, msg, cap);
    if (rc == 1) {
        *has = 1;
        *out = (float)json_object_get_double(v);
    }
    return rc;
}

int jsonfield_sampling_floats(json_object *o, const char *where, Llms__GenerationParams *p,
                              char *msg, size_t cap)
{
    if (read_float(o, "temperature", where, &p->has_temperature, &p->temperature, msg, cap) < 0 ||
        read_float(o, "top_p", where, &p->has_top_p, &p->top_p, msg, cap) < 0 ||
        read_float(o, "min_p", where, &p->has_min_p, &p->min_p, msg, cap) < 0 ||
        read_float(o, "repeat_penalty", where, &p->has_repeat_penalty, &p->repeat_penalty, msg,
                   cap) < 0 ||
        read_float(o, "frequency_penalty", where, &p->has_frequency_penalty,
                   &p->frequency_penalty, msg, cap) < 0 ||
        read_float(o, "presence_penalty", where, &p->has_presence_penalty, &p->presence_penalty,
                   msg, cap) < 0)
        return -1;
    return 0;
}

int jsonfield_stops(json_object *o, const char *key, const char *where,
                    Llms__GenerationParams *p, size_t max, char *msg, size_t cap)
{
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null))
        return 0;
    bool one = json_object_is_type(v, json_type_string);
    bool list = json_object_is_type(v, json_type_array);
    size_t n = one ? 1 : list ? json_object_array_length(v) : 0;
    for (size_t i = 0; list && i < n; i++)
        list = json_object_is_type(json_object_array_get_idx(v, i), json_type_string);
    if (!one && !list) {
        snprintf(msg, cap, "'%s%s' must be a string or an array of strings", where, key);
        return -1;
    }
    if (n > max - p->n_stop) {
        snprintf(msg, cap, "'%s%s' has %zu strings, at most %zu", where, key, n,
                 max - p->n_stop);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        p->stop[p->n_stop++] =
            (char *)json_object_get_string(one ? v : json_object_array_get_idx(v, i));
    return 0;
}

bool jsonfield_asks_nothing(json_object *v)
{
    return json_object_is_type(v, json_type_null) ||
           (json_object_is_type(v, json_type_boolean) && !json_object_get_boolean(v)) ||
           (json_object_is_type(v, json_type_array) && json_object_array_length(v) == 0) ||
           (json_object_is_type(v, json_type_object) && json_object_object_length(v) == 0) ||
           (json_object_is_type(v, json_type_string) && json_object_get_string_len(v) == 0);
}

int jsonfield_strings(json_object *in, const char ***texts, size_t *n)
{
    bool one = json_object_is_type(in, json_type_string);
    *texts = NULL;
    *n = 0;
    if (!one && !json_object_is_type(in, json_type_array))
        return -1;
    size_t count = one ? 1 : json_object_array_length(in);
    const char **t = malloc((count ? count : 1) * sizeof *t);
    if (!t)
        return -2;
    for (size_t i = 0; i < count; i++) {
        json_object *s = one ? in : json_object_array_get_idx(in, i);
        if (!json_object_is_type(s, json_type_string)) {
            free(t);
            return -1;
        }
        t[i] = json_object_get_string(s);
    }
    *texts = t;
    *n = count;
    return 0;
}

/* A message's content: a string, or text parts joined (into *owned, to free) with a
 * newline between them once there is text, as llama.cpp's server joins them. */
const char *jsonfield_message_content(json_object *m, char **owned, char *msg, size_t cap)
{
    json_object *c;
    *owned = NULL;
    if (!json_object_object_get_ex(m, "content", &c) || json_object_is_type(c, json_type_null))
        return "";
    if (json_object_is_type(c, json_type_string))
        return json_object_get_string(c);
    if (!json_object_is_type(c, json_type_array)) {
        snprintf(msg, cap, "a message's 'content' must be a string or an array of parts");
        return NULL;
    }
    size_t n = json_object_array_length(c), len = 0;
    for (size_t pass = 0; pass < 2; pass++) {
        size_t at = 0;
        for (size_t i = 0; i < n; i++) {
            json_object *part = json_object_array_get_idx(c, i), *type, *text;
            /* a JSON null is a NULL json_object: every value is type-checked first */
            if (!json_object_is_type(part, json_type_object) ||
                !json_object_object_get_ex(part, "type", &type) ||
                !json_object_is_type(type, json_type_string) ||
                strcmp(json_object_get_string(type), "text") != 0 ||
                !json_object_object_get_ex(part, "text", &text) ||
                !json_object_is_type(text, json_type_string)) {
                free(*owned);
                *owned = NULL;
                snprintf(msg, cap, "only text content parts are supported");
                return NULL;
            }
            size_t k = (size_t)json_object_get_string_len(text);
            if (at > 0) {
                if (pass)
                    (*owned)[at] = '\n';
                at++;
            }
            if (pass)
                memcpy(*owned + at, json_object_get_string(text), k);
            at += k;
        }
        if (!pass) {
            len = at;
            if (!(*owned = malloc(len + 1))) {
                snprintf(msg, cap, "out of memory");
                return NULL;
            }
        }
    }
    (*owned)[len] = '\0';
    return *owned;
}
