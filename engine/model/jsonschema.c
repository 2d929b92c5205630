/* jsonschema.c — compiling a JSON Schema into jsonmask's table (see jsonschema.h). */
#include "engine/model/jsonschema.h"

#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/arraygrow.h"

#define WHERE_MAX 192
/* $ref targets compiled so far, at most. */
#define REFS_MAX 256

/* Any value: every kind, any keys and items, no bounds. */
#define ANY_NODE                                                                           \
    {                                                                                      \
        .shape = JSONSCHEMA_TYPED, .kinds = JSONSCHEMA_ANY_KIND, .free_object = true,       \
        .items = JSONSCHEMA_ANY, .max_items = UINT32_MAX, .max_length = UINT32_MAX          \
    }

static const jsonschema_node any_node = ANY_NODE;

const jsonschema *jsonschema_any_object(void)
{
    static const jsonschema_node nodes[2] = {
        ANY_NODE,
        {.shape = JSONSCHEMA_TYPED,
         .kinds = JSONSCHEMA_OBJECT,
         .free_object = true,
         .items = JSONSCHEMA_ANY,
         .max_items = UINT32_MAX,
         .max_length = UINT32_MAX},
    };
    static const jsonschema any_object = {.nodes = (jsonschema_node *)nodes, .n_nodes = 2, .root = 1};
    return &any_object;
}

typedef struct ref_entry {
    const char *path; /* the $ref string, owned by the document */
    uint16_t node;
} ref_entry;

typedef struct builder {
    jsonschema *s;
    json_object *doc;
    uint32_t cap_nodes, cap_props, cap_spellings, cap_alts, cap_text, cap_patterns;
    size_t pattern_bytes; /* of every automaton so far */
    uint64_t pattern_work; /* the steps taken to build every automaton so far (regex.h) */
    bool *done;       /* (cap_nodes) the node is filled (not a $ref target in progress) */
    ref_entry refs[REFS_MAX];
    int n_refs;
    char *err;
} builder;

static int oom(builder *b)
{
    return err_set(b->err, "json schema: out of memory");
}

static int new_node(builder *b, const char *where, uint16_t *id)
{
    jsonschema *s = b->s;
    if (s->n_nodes >= JSONSCHEMA_NODES_MAX)
        return err_set(b->err, "json schema: more than %d schemas at %s", JSONSCHEMA_NODES_MAX,
                       where);
    uint32_t cap = b->cap_nodes;
    if (arraygrow((void **)&s->nodes, &b->cap_nodes, s->n_nodes, sizeof *s->nodes, 1))
        return oom(b);
    if (b->cap_nodes != cap) {
        bool *d = realloc(b->done, b->cap_nodes * sizeof *d);
        if (!d)
            return oom(b);
        b->done = d;
    }
    *id = (uint16_t)s->n_nodes++;
    s->nodes[*id] = any_node;
    b->done[*id] = false;
    return 0;
}

static int add_text(builder *b, const char *bytes, size_t len, jsonschema_text *t)
{
    jsonschema *s = b->s;
    if (len > UINT32_MAX - s->n_text ||
        arraygrow((void **)&s->text, &b->cap_text, s->n_text, 1, (uint32_t)len))
        return oom(b);
    memcpy(s->text + s->n_text, bytes, len);
    *t = (jsonschema_text){s->n_text, (uint32_t)len};
    s->n_text += (uint32_t)len;
    return 0;
}

/* A value as json-c writes it: no spaces, '/' not escaped. A parsed number keeps its
 * spelling in the schema. */
static const char *spelling_of(json_object *v)
{
    return json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN |
                                                 JSON_C_TO_STRING_NOSLASHESCAPE);
}

/* A key's text as JSON spells it inside its quotes (a property's name, a tag's). */
static int add_key_text(builder *b, const char *key, jsonschema_text *t)
{
    json_object *k = json_object_new_string(key);
    if (!k)
        return oom(b);
    const char *spelled = spelling_of(k);
    int rc = add_text(b, spelled + 1, strlen(spelled) - 2, t);
    json_object_put(k);
    return rc;
}

/* where + "/" + key, cut to WHERE_MAX - 1 bytes: a place for messages only. */
static void where_join(char out[WHERE_MAX], const char *where, const char *key)
{
    size_t n = strnlen(where, WHERE_MAX - 1);
    memmove(out, where, n);
    if (n < WHERE_MAX - 1)
        out[n++] = '/';
    size_t k = strnlen(key, WHERE_MAX - 1 - n);
    memcpy(out + n, key, k);
    out[n + k] = '\0';
}

static const char *const annotations[] = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "format", "$defs", "definitions",
    "discriminator", /* OpenAPI's, beside a tagged union: its propertyName is read there */
    NULL,
};

static const char *const constraints[] = {
    "type", "properties", "required", "additionalProperties", "items", "prefixItems",
    "additionalItems", "minItems", "maxItems",
    "minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
    "exclusiveMaximum",
    "enum", "const", "anyOf", "oneOf", "allOf", "$ref", NULL,
};

static bool listed(const char *const *list, const char *key)
{
    for (int i = 0; list[i]; i++)
        if (!strcmp(list[i], key))
            return true;
    return false;
}

/* Refuses a keyword that is neither a known constraint nor an annotation, and with
 * `alone` (the schema is a $ref, an allOf, an enum or an anyOf), any other constraint
 * beside it. */
static int check_keywords(builder *b, json_object *sch, const char *where, const char *alone)
{
    json_object_object_foreach(sch, key, val)
    {
        (void)val;
        if (listed(annotations, key))
            continue;
        if (!listed(constraints, key))
            return err_set(b->err, "json schema: '%s' at %s is not supported", key, where);
        bool typed_values = alone && (!strcmp(alone, "enum") || !strcmp(alone, "const")) &&
                            !strcmp(key, "type");
        if (alone && strcmp(key, alone) && !typed_values)
            return err_set(b->err, "json schema: '%s' beside '%s' at %s is not supported", key,
                           alone, where);
    }
    return 0;
}

static int compile_node(builder *b, json_object *sch, const char *where, uint16_t *out);
static int compile_into(builder *b, json_object *sch, const char *where, uint16_t id);

/* A JSON pointer's next token, "~1" and "~0" decoded, into tok. */
static const char *pointer_token(const char *p, char *tok, size_t cap)
{
    size_t n = 0;
    while (*p && *p != '/' && n + 1 < cap) {
        if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
            tok[n++] = p[1] == '0' ? '~' : '/';
            p += 2;
        } else {
            tok[n++] = *p++;
        }
    }
    tok[n] = '\0';
    return p;
}

static int resolve_ref(builder *b, const char *path, const char *where, uint16_t *out)
{
    for (int i = 0; i < b->n_refs; i++)
        if (!strcmp(b->refs[i].path, path)) {
            *out = b->refs[i].node;
            return 0;
        }
    if (path[0] != '#')
        return err_set(b->err, "json schema: $ref '%.64s' at %s: only references inside the "
                               "schema (#...) are supported", path, where);
    json_object *target = b->doc;
    const char *p = path + 1;
    char tok[128];
    while (*p == '/') {
        p = pointer_token(p + 1, tok, sizeof tok);
        json_object *next;
        if (!json_object_is_type(target, json_type_object) ||
            !json_object_object_get_ex(target, tok, &next))
            return err_set(b->err, "json schema: $ref '%.64s' at %s names nothing", path, where);
        target = next;
    }
    if (*p)
        return err_set(b->err, "json schema: $ref '%.64s' at %s is not a JSON pointer", path,
                       where);
    if (b->n_refs == REFS_MAX)
        return err_set(b->err, "json schema: more than %d $ref targets", REFS_MAX);
    uint16_t id;
    if (new_node(b, where, &id))
        return -1;
    b->refs[b->n_refs++] = (ref_entry){path, id};
    *out = id;
    char at[WHERE_MAX];
    snprintf(at, sizeof at, "%.120s", path);
    return compile_into(b, target, at, id);
}

/* Makes node id a copy of node from (a $ref's or allOf's target), which must be filled. */
static int copy_node(builder *b, uint16_t from, uint16_t id, const char *where)
{
    if (!b->done[from])
        return err_set(b->err, "json schema: a $ref at %s leads back to itself with no value "
                               "between", where);
    b->s->nodes[id] = b->s->nodes[from];
    return 0;
}

static int kinds_of_type_name(const char *name, uint8_t *kinds)
{
    static const struct {
        const char *name;
        uint8_t kinds;
    } types[] = {
        {"object", JSONSCHEMA_OBJECT},
        {"array", JSONSCHEMA_ARRAY},
        {"string", JSONSCHEMA_STRING},
        {"number", JSONSCHEMA_NUMBER | JSONSCHEMA_INTEGER},
        {"integer", JSONSCHEMA_INTEGER},
        {"boolean", JSONSCHEMA_BOOLEAN},
        {"null", JSONSCHEMA_NULL},
    };
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        if (!strcmp(name, types[i].name)) {
            *kinds |= types[i].kinds;
            return 0;
        }
    return -1;
}

static int kinds_of_type(builder *b, json_object *type, const char *where, uint8_t *kinds)
{
    *kinds = 0;
    if (json_object_is_type(type, json_type_string)) {
        if (kinds_of_type_name(json_object_get_string(type), kinds) == 0)
            return 0;
    } else if (json_object_is_type(type, json_type_array) && json_object_array_length(type)) {
        for (size_t i = 0; i < json_object_array_length(type); i++) {
            json_object *t = json_object_array_get_idx(type, i);
            if (!json_object_is_type(t, json_type_string) ||
                kinds_of_type_name(json_object_get_string(t), kinds))
                goto bad;
        }
        return 0;
    }
bad:
    return err_set(b->err, "json schema: 'type' at %s is not a type name or a list of them",
                   where);
}

/* A count keyword (minItems, maxLength...): absent leaves *v. */
static int read_count(builder *b, json_object *sch, const char *key, const char *where,
                      uint32_t *v)
{
    json_object *c;
    if (!json_object_object_get_ex(sch, key, &c))
        return 0;
    int64_t n = json_object_get_int64(c);
    if (!json_object_is_type(c, json_type_int) || n < 0)
        return err_set(b->err, "json schema: '%s' at %s is not a non-negative integer", key,
                       where);
    *v = n > JSONSCHEMA_COUNT_MAX ? UINT32_MAX : (uint32_t)n;
    return 0;
}

/* A bound: an integer as it is, another number rounded inward by `round` (ceil for a
 * lower bound, floor for an upper) and clamped to 64 bits. false if absent or not a
 * number. */
static bool read_bound(json_object *sch, const char *key, double (*round)(double), int64_t *v)
{
    json_object *c;
    if (!json_object_object_get_ex(sch, key, &c))
        return false;
    if (json_object_is_type(c, json_type_int)) {
        *v = json_object_get_int64(c);
        return true;
    }
    if (!json_object_is_type(c, json_type_double))
        return false;
    double x = round(json_object_get_double(c));
    *v = x <= -9223372036854775808.0 ? INT64_MIN : x >= 9223372036854775807.0 ? INT64_MAX
                                                                              : (int64_t)x;
    return true;
}

static bool flag_set(json_object *sch, const char *key)
{
    json_object *f;
    return json_object_object_get_ex(sch, key, &f) && json_object_is_type(f, json_type_boolean) &&
           json_object_get_boolean(f);
}

static bool read_double(json_object *sch, const char *key, double *v)
{
    json_object *c;
    if (!json_object_object_get_ex(sch, key, &c) ||
        !(json_object_is_type(c, json_type_int) || json_object_is_type(c, json_type_double)))
        return false;
    *v = json_object_get_double(c);
    return isfinite(*v);
}

/* A number's bounds as they are (draft 6's exclusive numbers, draft 4's flags); of two
 * lower (or upper) bounds the tighter. */
static int compile_number_bounds(builder *b, json_object *sch, const char *where,
                                 jsonschema_node *n)
{
    double x;
    if (read_double(sch, "minimum", &x)) {
        n->has_nmin = true;
        n->nmin = x;
        n->nmin_excl = flag_set(sch, "exclusiveMinimum");
    }
    if (read_double(sch, "exclusiveMinimum", &x) && (!n->has_nmin || x >= n->nmin)) {
        n->has_nmin = n->nmin_excl = true;
        n->nmin = x;
    }
    if (read_double(sch, "maximum", &x)) {
        n->has_nmax = true;
        n->nmax = x;
        n->nmax_excl = flag_set(sch, "exclusiveMaximum");
    }
    if (read_double(sch, "exclusiveMaximum", &x) && (!n->has_nmax || x <= n->nmax)) {
        n->has_nmax = n->nmax_excl = true;
        n->nmax = x;
    }
    if (n->has_nmin && n->has_nmax &&
        (n->nmin > n->nmax || (n->nmin == n->nmax && (n->nmin_excl || n->nmax_excl))))
        return err_set(b->err, "json schema: no number at %s is within its bounds", where);
    return 0;
}

/* minimum, maximum and their exclusive forms (draft 6's numbers, draft 4's booleans). */
static int compile_bounds(builder *b, json_object *sch, const char *where, jsonschema_node *n)
{
    static const char *const keys[] = {"minimum", "maximum", "exclusiveMinimum",
                                       "exclusiveMaximum"};
    bool any = false;
    for (int i = 0; i < 4; i++) {
        json_object *v;
        if (!json_object_object_get_ex(sch, keys[i], &v))
            continue;
        any = true;
        if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double) &&
            !(i >= 2 && json_object_is_type(v, json_type_boolean)))
            return err_set(b->err, "json schema: '%s' at %s is not a number", keys[i], where);
    }
    if (!any || !(n->kinds & (JSONSCHEMA_NUMBER | JSONSCHEMA_INTEGER)))
        return 0;
    if (n->kinds & JSONSCHEMA_NUMBER)
        return compile_number_bounds(b, sch, where, n);
    int64_t lo = INT64_MIN, hi = INT64_MAX, x;
    if (read_bound(sch, "minimum", ceil, &x))
        lo = flag_set(sch, "exclusiveMinimum") ? (x == INT64_MAX ? x : x + 1) : x;
    if (read_bound(sch, "exclusiveMinimum", floor, &x) && x < INT64_MAX && x + 1 > lo)
        lo = x + 1;
    if (read_bound(sch, "maximum", floor, &x))
        hi = flag_set(sch, "exclusiveMaximum") ? (x == INT64_MIN ? x : x - 1) : x;
    if (read_bound(sch, "exclusiveMaximum", ceil, &x) && x > INT64_MIN && x - 1 < hi)
        hi = x - 1;
    if (lo > hi)
        return err_set(b->err, "json schema: no integer at %s is within its bounds", where);
    n->has_min = lo != INT64_MIN;
    n->has_max = hi != INT64_MAX;
    n->min = lo;
    n->max = hi;
    return 0;
}

static int compile_object(builder *b, json_object *sch, const char *where, uint16_t id)
{
    jsonschema *s = b->s;
    json_object *props, *req, *extra;
    bool has_props = json_object_object_get_ex(sch, "properties", &props);
    bool has_extra = json_object_object_get_ex(sch, "additionalProperties", &extra);
    bool has_req = json_object_object_get_ex(sch, "required", &req);
    char at[WHERE_MAX];
    if (!has_props) {
        if (has_req)
            return err_set(b->err, "json schema: 'required' without 'properties' at %s is not "
                                   "supported", where);
        s->nodes[id].free_object = true;
        s->nodes[id].items = JSONSCHEMA_ANY;
        if (!has_extra || json_object_is_type(extra, json_type_boolean)) {
            /* additionalProperties false without properties: only {} */
            if (has_extra && !json_object_get_boolean(extra))
                s->nodes[id].free_object = false;
            return 0;
        }
        uint16_t value;
        where_join(at, where, "additionalProperties");
        if (compile_node(b, extra, at, &value))
            return -1;
        s->nodes[id].items = value;
        return 0;
    }
    if (!json_object_is_type(props, json_type_object))
        return err_set(b->err, "json schema: 'properties' at %s is not an object", where);
    if (has_extra && !(json_object_is_type(extra, json_type_boolean) &&
                       !json_object_get_boolean(extra)))
        return err_set(b->err, "json schema: 'additionalProperties' beside 'properties' at %s "
                               "is not supported (only false)", where);
    int n = json_object_object_length(props);
    if (n > JSONSCHEMA_PROPS_MAX)
        return err_set(b->err, "json schema: more than %d properties at %s",
                       JSONSCHEMA_PROPS_MAX, where);
    if (arraygrow((void **)&s->props, &b->cap_props, s->n_props, sizeof *s->props, (uint32_t)n))
        return oom(b);
    uint32_t first = s->n_props;
    s->n_props += (uint32_t)n;
    s->nodes[id].free_object = false;
    s->nodes[id].first = first;
    s->nodes[id].n = (uint16_t)n;
    int i = 0;
    json_object_object_foreach(props, name, value_schema)
    {
        jsonschema_text t;
        if (add_key_text(b, name, &t))
            return -1;
        char pat[WHERE_MAX];
        where_join(pat, where, "properties");
        where_join(at, pat, name);
        uint16_t value;
        if (compile_node(b, value_schema, at, &value))
            return -1;
        s->props[first + (uint32_t)i] = (jsonschema_prop){t, value};
        i++;
    }
    if (!has_req)
        return 0;
    if (!json_object_is_type(req, json_type_array))
        return err_set(b->err, "json schema: 'required' at %s is not a list", where);
    for (size_t r = 0; r < json_object_array_length(req); r++) {
        json_object *name = json_object_array_get_idx(req, r);
        const char *nm = json_object_get_string(name);
        int found = -1, k = 0;
        json_object_object_foreach(props, pname, pval)
        {
            (void)pval;
            if (json_object_is_type(name, json_type_string) && !strcmp(pname, nm))
                found = k;
            k++;
        }
        if (found < 0)
            return err_set(b->err, "json schema: required '%.64s' at %s is not among its "
                                   "properties", nm ? nm : "", where);
        s->nodes[id].required |= 1ull << found;
    }
    return 0;
}

/* A tuple's item schemas (list, at where/key) as nodes, alts[*first .. + *n). */
static int compile_tuple(builder *b, json_object *list, const char *key, const char *where,
                         uint32_t *first, uint16_t *n)
{
    size_t len = json_object_is_type(list, json_type_array) ? json_object_array_length(list) : 0;
    if (len == 0 || len > JSONSCHEMA_PROPS_MAX)
        return err_set(b->err, "json schema: '%s' at %s is not a list of 1..%d schemas", key,
                       where, JSONSCHEMA_PROPS_MAX);
    uint16_t node[JSONSCHEMA_PROPS_MAX];
    char at[WHERE_MAX], at2[WHERE_MAX], idx[24];
    where_join(at, where, key);
    for (size_t i = 0; i < len; i++) {
        snprintf(idx, sizeof idx, "%zu", i);
        where_join(at2, at, idx);
        if (compile_node(b, json_object_array_get_idx(list, i), at2, &node[i]))
            return -1;
    }
    jsonschema *s = b->s;
    if (arraygrow((void **)&s->alts, &b->cap_alts, s->n_alts, sizeof *s->alts, (uint32_t)len))
        return oom(b);
    memcpy(s->alts + s->n_alts, node, len * sizeof *node);
    *first = s->n_alts;
    *n = (uint16_t)len;
    s->n_alts += (uint32_t)len;
    return 0;
}

static int compile_array(builder *b, json_object *sch, const char *where, uint16_t id)
{
    json_object *items;
    uint32_t lo = 0, hi = UINT32_MAX;
    if (read_count(b, sch, "minItems", where, &lo) || read_count(b, sch, "maxItems", where, &hi))
        return -1;
    if (lo == UINT32_MAX)
        return err_set(b->err, "json schema: minItems at %s is above %u", where,
                       JSONSCHEMA_COUNT_MAX);
    if (lo > hi)
        return err_set(b->err, "json schema: minItems above maxItems at %s", where);
    /* a tuple: prefixItems then items (2020-12), or items as a list then additionalItems
     * (draft 7, where additionalItems without that list means nothing) */
    json_object *prefix = NULL, *rest = NULL;
    const char *prefix_key = "prefixItems", *rest_key = "items";
    bool has_items = json_object_object_get_ex(sch, "items", &items);
    if (json_object_object_get_ex(sch, "prefixItems", &prefix)) {
        if (has_items && json_object_is_type(items, json_type_array))
            return err_set(b->err, "json schema: 'items' as a list beside 'prefixItems' at %s",
                           where);
        rest = has_items ? items : NULL;
    } else if (has_items && json_object_is_type(items, json_type_array)) {
        prefix = items;
        prefix_key = "items";
        rest_key = "additionalItems";
        json_object_object_get_ex(sch, rest_key, &rest);
    } else {
        rest = has_items ? items : NULL;
    }
    uint16_t n_prefix = 0, item = JSONSCHEMA_ANY;
    uint32_t first = 0;
    char at[WHERE_MAX];
    if (prefix && compile_tuple(b, prefix, prefix_key, where, &first, &n_prefix))
        return -1;
    if (rest && json_object_is_type(rest, json_type_boolean) && !json_object_get_boolean(rest)) {
        if (hi > n_prefix)
            hi = n_prefix; /* nothing after the tuple's items */
        if (lo > hi)
            return err_set(b->err, "json schema: minItems at %s is above the %u items that "
                                   "may be", where, n_prefix);
    } else if (rest) {
        where_join(at, where, rest_key);
        if (compile_node(b, rest, at, &item))
            return -1;
    }
    jsonschema_node *n = &b->s->nodes[id];
    n->items = item;
    n->min_items = lo;
    n->max_items = hi;
    n->prefix = first;
    n->n_prefix = n_prefix;
    return 0;
}

/* The formats asserted, as the patterns of what is valid (RFC 3339's date and time: a
 * day the month has, 29 February in leap years only; no leap second). */
#define FORMAT_DATE                                                                        \
    "([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)" \
    "|02-(0[1-9]|1[0-9]|2[0-8]))|([0-9]{2}(0[48]|[2468][048]|[13579][26])|"                  \
    "([02468][048]|[13579][26])00)-02-29)"
#define FORMAT_TIME                                                                        \
    "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"
#define FORMAT_OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
static const struct {
    const char *name, *pattern;
} formats[] = {
    {"date", "^" FORMAT_DATE "$"},
    {"time", "^" FORMAT_TIME "$"},
    {"date-time", "^" FORMAT_DATE "T" FORMAT_TIME "$"},
    {"uuid", "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"},
    {"ipv4", "^(" FORMAT_OCTET "\\.){3}" FORMAT_OCTET "$"},
};

/* A string's pattern, or its format if one asserted: node id's automaton, its lengths
 * folded in (the recogniser then follows the automaton alone). */
static int compile_pattern(builder *b, json_object *sch, const char *where, uint16_t id)
{
    json_object *v;
    const char *pattern = NULL, *key = "pattern";
    if (json_object_object_get_ex(sch, "pattern", &v)) {
        if (!json_object_is_type(v, json_type_string))
            return err_set(b->err, "json schema: 'pattern' at %s is not a string", where);
        pattern = json_object_get_string(v);
    }
    if (json_object_object_get_ex(sch, "format", &v) && json_object_is_type(v, json_type_string))
        for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
            if (strcmp(json_object_get_string(v), formats[i].name))
                continue;
            if (pattern)
                return err_set(b->err, "json schema: 'format' %s beside 'pattern' at %s is not "
                                       "supported", formats[i].name, where);
            pattern = formats[i].pattern;
            key = "format";
        }
    if (!pattern)
        return 0;
    jsonschema *s = b->s;
    if (s->n_patterns == JSONSCHEMA_PATTERNS_MAX)
        return err_set(b->err, "json schema: more than %d patterns and formats at %s",
                       JSONSCHEMA_PATTERNS_MAX, where);
    if (arraygrow((void **)&s->patterns, &b->cap_patterns, s->n_patterns, sizeof *s->patterns, 1))
        return oom(b);
    jsonschema_node *n = &s->nodes[id];
    char why[ERR_MAX];
    regex_dfa *dfa;
    if (regex_compile_sharing(pattern, strlen(pattern), n->min_length, n->max_length,
                              &b->pattern_work, &dfa, why))
        return err_set(b->err, "json schema: '%s' at %s: %.160s", key, where, why);
    s->patterns[s->n_patterns++] = dfa;
    b->pattern_bytes += regex_bytes(dfa);
    if (b->pattern_bytes > JSONSCHEMA_PATTERN_BYTES_MAX)
        return err_set(b->err, "json schema: the automata of the patterns up to %s need more "
                               "than %u MiB", where, JSONSCHEMA_PATTERN_BYTES_MAX >> 20);
    n->pattern = (uint16_t)s->n_patterns;
    n->min_length = 0; /* in the automaton */
    n->max_length = UINT32_MAX;
    return 0;
}

static int compile_typed(builder *b, json_object *sch, const char *where, uint16_t id)
{
    json_object *type;
    uint8_t kinds = 0;
    if (json_object_object_get_ex(sch, "type", &type)) {
        if (kinds_of_type(b, type, where, &kinds))
            return -1;
    } else {
        /* no type: the kinds the keywords constrain (llama.cpp's reading too) */
        static const struct {
            const char *key;
            uint8_t kinds;
        } implied[] = {
            {"properties", JSONSCHEMA_OBJECT},      {"required", JSONSCHEMA_OBJECT},
            {"additionalProperties", JSONSCHEMA_OBJECT}, {"items", JSONSCHEMA_ARRAY},
            {"minItems", JSONSCHEMA_ARRAY},         {"maxItems", JSONSCHEMA_ARRAY},
            {"prefixItems", JSONSCHEMA_ARRAY},
            {"minLength", JSONSCHEMA_STRING},       {"maxLength", JSONSCHEMA_STRING},
            {"pattern", JSONSCHEMA_STRING},
            {"minimum", JSONSCHEMA_INTEGER},        {"maximum", JSONSCHEMA_INTEGER},
            {"exclusiveMinimum", JSONSCHEMA_INTEGER}, {"exclusiveMaximum", JSONSCHEMA_INTEGER},
        };
        json_object *v;
        for (size_t i = 0; i < sizeof implied / sizeof implied[0]; i++)
            if (json_object_object_get_ex(sch, implied[i].key, &v))
                kinds |= implied[i].kinds;
        if (!kinds)
            kinds = JSONSCHEMA_ANY_KIND;
    }
    jsonschema_node *n = &b->s->nodes[id];
    *n = any_node;
    n->kinds = kinds;
    uint32_t lo = 0, hi = UINT32_MAX;
    if (read_count(b, sch, "minLength", where, &lo) || read_count(b, sch, "maxLength", where, &hi))
        return -1;
    if (lo == UINT32_MAX || lo > hi)
        return err_set(b->err, "json schema: no string at %s is within its lengths", where);
    n->min_length = lo;
    n->max_length = hi;
    if ((kinds & JSONSCHEMA_STRING) && compile_pattern(b, sch, where, id))
        return -1;
    if (compile_bounds(b, sch, where, n))
        return -1;
    if ((kinds & JSONSCHEMA_ARRAY) && compile_array(b, sch, where, id))
        return -1;
    if ((kinds & JSONSCHEMA_OBJECT) && compile_object(b, sch, where, id))
        return -1;
    return 0;
}

static int spelling_cmp(const void *a, const void *b, void *arg)
{
    const jsonschema *s = arg;
    const jsonschema_text *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(jsonschema_bytes(s, *x), jsonschema_bytes(s, *y), n);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

static uint8_t kind_of_value(json_object *v)
{
    switch (json_object_get_type(v)) {
    case json_type_string:
        return JSONSCHEMA_STRING;
    case json_type_int:
        return JSONSCHEMA_INTEGER;
    case json_type_double:
        return JSONSCHEMA_NUMBER;
    case json_type_boolean:
        return JSONSCHEMA_BOOLEAN;
    case json_type_null:
        return JSONSCHEMA_NULL;
    default:
        return 0;
    }
}

/* Whether v is of kinds; an integral double (3.0) is an integer, as JSON Schema reads it. */
static bool value_of_kinds(json_object *v, uint8_t kinds)
{
    uint8_t k = kind_of_value(v);
    if (k == JSONSCHEMA_NUMBER && (kinds & JSONSCHEMA_INTEGER)) {
        double d = json_object_get_double(v);
        return d == (double)(int64_t)d;
    }
    return (k & kinds) != 0;
}

/* Node id from an enum, or a const, of scalars; a 'type' beside it keeps only the values
 * of that type (Pydantic writes a Literal as a const beside its type). */
static int compile_enum(builder *b, json_object *sch, bool is_const, const char *where,
                        uint16_t id)
{
    jsonschema *s = b->s;
    json_object *values = json_object_object_get(sch, is_const ? "const" : "enum");
    json_object *type;
    uint8_t typed = JSONSCHEMA_ANY_KIND;
    if (json_object_object_get_ex(sch, "type", &type) && kinds_of_type(b, type, where, &typed))
        return -1;
    if (!is_const && !json_object_is_type(values, json_type_array))
        return err_set(b->err, "json schema: 'enum' at %s is not a list", where);
    size_t n = is_const ? 1 : json_object_array_length(values);
    if (n == 0 || n > JSONSCHEMA_ENUM_MAX)
        return err_set(b->err, "json schema: 'enum' at %s has %zu values (1..%d)", where, n,
                       JSONSCHEMA_ENUM_MAX);
    if (arraygrow((void **)&s->spellings, &b->cap_spellings, s->n_spellings, sizeof *s->spellings,
             (uint32_t)n))
        return oom(b);
    uint32_t first = s->n_spellings;
    uint8_t kinds = 0;
    size_t n_typed = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *v = is_const ? values : json_object_array_get_idx(values, i);
        uint8_t k = kind_of_value(v);
        if (!k)
            return err_set(b->err, "json schema: an object or list in 'enum' or 'const' at %s "
                                   "is not supported", where);
        if (!value_of_kinds(v, typed))
            continue;
        kinds |= k;
        const char *sp = spelling_of(v);
        if (add_text(b, sp, strlen(sp), &s->spellings[first + n_typed++]))
            return -1;
    }
    if (n_typed == 0)
        return err_set(b->err, "json schema: no value of '%s' at %s is of its 'type'",
                       is_const ? "const" : "enum", where);
    n = n_typed;
    qsort_r(s->spellings + first, n, sizeof *s->spellings, spelling_cmp, s);
    uint32_t kept = 1;
    for (size_t i = 1; i < n; i++)
        if (spelling_cmp(&s->spellings[first + kept - 1], &s->spellings[first + i], s))
            s->spellings[first + kept++] = s->spellings[first + i];
    s->n_spellings = first + kept;
    jsonschema_node *node = &s->nodes[id];
    *node = any_node;
    node->shape = JSONSCHEMA_ENUM;
    node->kinds = kinds;
    node->first = first;
    node->n = (uint16_t)kept;
    return 0;
}

/* The first-byte classes of kinds: integer and number start alike. */
static uint8_t start_class(uint8_t kinds)
{
    return kinds & JSONSCHEMA_NUMBER ? (uint8_t)(kinds | JSONSCHEMA_INTEGER)
           : kinds & JSONSCHEMA_INTEGER ? (uint8_t)(kinds | JSONSCHEMA_NUMBER)
                                        : kinds;
}

/* The index of property `name` in node id if id can be an alternative of a tagged union
 * on it: a closed object, filled, where `name` is required and a const or enum of strings;
 * else -1. */
static int tag_index(builder *b, uint16_t id, jsonschema_text name)
{
    const jsonschema *s = b->s;
    const jsonschema_node *n = &s->nodes[id];
    if (!b->done[id] || n->shape != JSONSCHEMA_TYPED || n->kinds != JSONSCHEMA_OBJECT ||
        n->free_object)
        return -1;
    for (int i = 0; i < n->n; i++) {
        const jsonschema_prop *p = &s->props[n->first + (uint32_t)i];
        if (!jsonschema_texts_equal(s, p->name, name))
            continue;
        const jsonschema_node *tag = &s->nodes[p->value];
        bool ok = (n->required >> i & 1) && tag->shape == JSONSCHEMA_ENUM &&
                  tag->kinds == JSONSCHEMA_STRING;
        return ok ? i : -1;
    }
    return -1;
}

/* The tag's name, in *name: `named` (a discriminator's propertyName) when given, else the
 * first property of objs[0] that every object can be tagged on. 1 found, 0 none, -1 error. */
static int find_tag(builder *b, const uint16_t *objs, size_t n, const char *named,
                    jsonschema_text *name)
{
    jsonschema *s = b->s;
    const jsonschema_node *o = &s->nodes[objs[0]];
    if (named && add_key_text(b, named, name))
        return -1;
    for (uint16_t c = 0; c < (named ? 1 : o->n); c++) {
        if (!named)
            *name = s->props[o->first + c].name;
        size_t i = 0;
        while (i < n && tag_index(b, objs[i], *name) >= 0)
            i++;
        if (i == n)
            return 1;
    }
    return 0;
}

/* Object node *id with property `at` moved first (keys may come in any order, and the
 * recogniser reads a tagged union's tag first): a new node, so that the original keeps
 * its order wherever else it is used. */
static int tag_first(builder *b, uint16_t *id, int at, const char *where)
{
    if (at == 0)
        return 0;
    jsonschema *s = b->s;
    uint16_t copy;
    if (new_node(b, where, &copy))
        return -1;
    jsonschema_node n = s->nodes[*id];
    if (arraygrow((void **)&s->props, &b->cap_props, s->n_props, sizeof *s->props, n.n))
        return oom(b);
    jsonschema_prop *to = &s->props[s->n_props];
    to[0] = s->props[n.first + (uint32_t)at];
    for (int i = 0, k = 1; i < n.n; i++)
        if (i != at)
            to[k++] = s->props[n.first + (uint32_t)i];
    uint64_t below = (UINT64_C(1) << at) - 1;
    n.required = 1 | (n.required & below) << 1 | (n.required & ~below & ~(UINT64_C(1) << at));
    n.first = s->n_props;
    s->n_props += n.n;
    s->nodes[copy] = n;
    b->done[copy] = true;
    *id = copy;
    return 0;
}

/* The n objects of a union (objs) as one tagged union: its node in *out, its head (the
 * tag property alone, of every alternative's tag values) beside it. */
static int compile_tagged(builder *b, uint16_t *objs, size_t n, const char *named,
                          const char *key, const char *where, uint16_t *out)
{
    jsonschema *s = b->s;
    jsonschema_text tag_name;
    int found = find_tag(b, objs, n, named, &tag_name);
    if (found < 0)
        return -1;
    if (!found)
        return err_set(b->err, "json schema: the objects of '%s' at %s are no tagged union "
                               "(each closed, with one property%s%s%s required in all, a const "
                               "or enum of strings)", key, where, named ? " '" : "",
                       named ? named : "", named ? "'" : "");
    uint32_t n_tags = 0;
    for (size_t i = 0; i < n; i++) {
        if (tag_first(b, &objs[i], tag_index(b, objs[i], tag_name), where))
            return -1;
        n_tags += s->nodes[s->props[s->nodes[objs[i]].first].value].n;
    }
    uint16_t tagged, head, tags;
    if (new_node(b, where, &tagged) || new_node(b, where, &head) || new_node(b, where, &tags))
        return -1;
    if (arraygrow((void **)&s->spellings, &b->cap_spellings, s->n_spellings, sizeof *s->spellings,
             n_tags) ||
        arraygrow((void **)&s->props, &b->cap_props, s->n_props, sizeof *s->props, 1) ||
        arraygrow((void **)&s->alts, &b->cap_alts, s->n_alts, sizeof *s->alts, (uint32_t)n))
        return oom(b);
    /* the head's tag: every alternative's values, sorted; none in two alternatives */
    uint32_t first = s->n_spellings;
    for (size_t i = 0; i < n; i++) {
        const jsonschema_node *tag = &s->nodes[s->props[s->nodes[objs[i]].first].value];
        for (uint16_t k = 0; k < tag->n; k++)
            s->spellings[s->n_spellings++] = s->spellings[tag->first + k];
    }
    qsort_r(s->spellings + first, n_tags, sizeof *s->spellings, spelling_cmp, s);
    for (uint32_t k = first + 1; k < first + n_tags; k++)
        if (jsonschema_texts_equal(s, s->spellings[k - 1], s->spellings[k]))
            return err_set(b->err, "json schema: two objects of '%s' at %s have one tag value",
                           key, where);
    s->nodes[tags] = (jsonschema_node){.shape = JSONSCHEMA_ENUM, .kinds = JSONSCHEMA_STRING,
                                       .first = first, .n = (uint16_t)n_tags};
    s->props[s->n_props] = (jsonschema_prop){s->props[s->nodes[objs[0]].first].name, tags};
    jsonschema_node *h = &s->nodes[head];
    h->kinds = JSONSCHEMA_OBJECT;
    h->free_object = false;
    h->tag_head = true;
    h->items = tagged;
    h->first = s->n_props++;
    h->n = 1;
    h->required = 1;
    memcpy(s->alts + s->n_alts, objs, n * sizeof *objs);
    s->nodes[tagged] = (jsonschema_node){.shape = JSONSCHEMA_TAGGED, .kinds = JSONSCHEMA_OBJECT,
                                         .items = head, .first = s->n_alts, .n = (uint16_t)n};
    s->n_alts += (uint32_t)n;
    b->done[tagged] = b->done[head] = b->done[tags] = true;
    *out = tagged;
    return 0;
}

/* anyOf or oneOf (key) at sch; an OpenAPI discriminator beside it names the tag. */
static int compile_union(builder *b, json_object *sch, const char *key, const char *where,
                         uint16_t id)
{
    jsonschema *s = b->s;
    json_object *alts = json_object_object_get(sch, key), *disc, *named = NULL;
    if (json_object_object_get_ex(sch, "discriminator", &disc) &&
        (!json_object_object_get_ex(disc, "propertyName", &named) ||
         !json_object_is_type(named, json_type_string)))
        return err_set(b->err, "json schema: 'discriminator' at %s has no propertyName", where);
    if (!json_object_is_type(alts, json_type_array) || json_object_array_length(alts) == 0 ||
        json_object_array_length(alts) > JSONSCHEMA_PROPS_MAX)
        return err_set(b->err, "json schema: '%s' at %s is not a list of 1..%d schemas", key,
                       where, JSONSCHEMA_PROPS_MAX);
    size_t n = json_object_array_length(alts), n_node = 0, n_objs = 0;
    uint16_t node[JSONSCHEMA_PROPS_MAX], objs[JSONSCHEMA_PROPS_MAX];
    for (size_t i = 0; i < n; i++) {
        char at[WHERE_MAX], idx[24];
        snprintf(idx, sizeof idx, "%zu", i);
        where_join(at, where, key);
        char at2[WHERE_MAX];
        where_join(at2, at, idx);
        uint16_t alt;
        if (compile_node(b, json_object_array_get_idx(alts, i), at2, &alt))
            return -1;
        uint8_t k = s->nodes[alt].kinds;
        if (!b->done[alt] && k == JSONSCHEMA_ANY_KIND)
            return err_set(b->err, "json schema: '%s' at %s leads back to itself", key, where);
        if (k == JSONSCHEMA_OBJECT && s->nodes[alt].shape == JSONSCHEMA_TYPED)
            objs[n_objs++] = alt;
        else
            node[n_node++] = alt;
    }
    /* several objects: one tagged union among the other alternatives */
    if (n_objs > 1 && compile_tagged(b, objs, n_objs, named ? json_object_get_string(named) : NULL,
                                     key, where, &node[n_node++]))
        return -1;
    if (n_objs == 1)
        node[n_node++] = objs[0];
    uint8_t seen = 0, kinds = 0;
    for (size_t i = 0; i < n_node; i++) {
        uint8_t k = s->nodes[node[i]].kinds;
        if (start_class(k) & seen)
            return err_set(b->err, "json schema: the alternatives of '%s' at %s are not told "
                                   "apart by their first byte (two of one kind)", key, where);
        seen |= start_class(k);
        kinds |= k;
    }
    if (n_node == 1)
        return copy_node(b, node[0], id, where);
    if (arraygrow((void **)&s->alts, &b->cap_alts, s->n_alts, sizeof *s->alts, (uint32_t)n_node))
        return oom(b);
    memcpy(s->alts + s->n_alts, node, n_node * sizeof *node);
    jsonschema_node *u = &s->nodes[id];
    *u = any_node;
    u->shape = JSONSCHEMA_UNION;
    u->kinds = kinds;
    u->first = s->n_alts;
    u->n = (uint16_t)n_node;
    s->n_alts += (uint32_t)n_node;
    return 0;
}

/* Fills node id from sch. */
static int compile_into(builder *b, json_object *sch, const char *where, uint16_t id)
{
    int rc;
    if (json_object_is_type(sch, json_type_boolean)) {
        if (!json_object_get_boolean(sch))
            return err_set(b->err, "json schema: 'false' at %s: no value is valid there", where);
        b->s->nodes[id] = any_node;
        b->done[id] = true;
        return 0;
    }
    if (!json_object_is_type(sch, json_type_object))
        return err_set(b->err, "json schema: the schema at %s is not an object", where);
    json_object *v;
    static const char *const alone[] = {"$ref", "allOf", "enum", "const", "anyOf", "oneOf"};
    for (size_t i = 0; i < sizeof alone / sizeof alone[0]; i++) {
        if (!json_object_object_get_ex(sch, alone[i], &v))
            continue;
        if (check_keywords(b, sch, where, alone[i]))
            return -1;
        uint16_t from;
        if (i == 0) {
            if (!json_object_is_type(v, json_type_string))
                return err_set(b->err, "json schema: '$ref' at %s is not a string", where);
            rc = resolve_ref(b, json_object_get_string(v), where, &from) ||
                 copy_node(b, from, id, where);
        } else if (i == 1) {
            if (!json_object_is_type(v, json_type_array) || json_object_array_length(v) != 1)
                return err_set(b->err, "json schema: 'allOf' at %s: only a list of one schema "
                                       "is supported", where);
            char at[WHERE_MAX];
            where_join(at, where, "allOf/0");
            rc = compile_node(b, json_object_array_get_idx(v, 0), at, &from) ||
                 copy_node(b, from, id, where);
        } else if (i <= 3) {
            rc = compile_enum(b, sch, i == 3, where, id);
        } else {
            rc = compile_union(b, sch, alone[i], where, id);
        }
        if (rc)
            return -1;
        b->done[id] = true;
        return 0;
    }
    if (check_keywords(b, sch, where, NULL) || compile_typed(b, sch, where, id))
        return -1;
    b->done[id] = true;
    return 0;
}

/* The node of sch: a $ref's target (compiled once, recursion included) or a new node. */
static int compile_node(builder *b, json_object *sch, const char *where, uint16_t *out)
{
    json_object *ref;
    if (json_object_is_type(sch, json_type_object) && json_object_object_get_ex(sch, "$ref", &ref)) {
        if (check_keywords(b, sch, where, "$ref"))
            return -1;
        if (!json_object_is_type(ref, json_type_string))
            return err_set(b->err, "json schema: '$ref' at %s is not a string", where);
        return resolve_ref(b, json_object_get_string(ref), where, out);
    }
    return new_node(b, where, out) || compile_into(b, sch, where, *out) ? -1 : 0;
}

int jsonschema_compile(const char *text, size_t len, jsonschema **out, char err[ERR_MAX])
{
    *out = NULL;
    json_tokener *tk = json_tokener_new();
    if (!tk)
        return err_set(err, "json schema: out of memory");
    json_tokener_set_flags(tk, JSON_TOKENER_STRICT);
    json_object *doc = len > INT32_MAX ? NULL : json_tokener_parse_ex(tk, text, (int)len);
    bool whole = doc && json_tokener_get_error(tk) == json_tokener_success &&
                 json_tokener_get_parse_end(tk) == len;
    json_tokener_free(tk);
    if (!whole) {
        json_object_put(doc);
        return err_set(err, "json schema: the schema is not one JSON document");
    }
    builder b = {.doc = doc, .err = err};
    jsonschema *s = b.s = calloc(1, sizeof *s);
    uint16_t any;
    if (!s || new_node(&b, "#", &any)) {
        free(s);
        json_object_put(doc);
        free(b.done);
        return s ? -1 : err_set(err, "json schema: out of memory");
    }
    b.done[any] = true;
    b.refs[b.n_refs++] = (ref_entry){"#", 0};
    int rc = new_node(&b, "#", &s->root);
    if (rc == 0) {
        b.refs[0].node = s->root;
        rc = compile_into(&b, doc, "#", s->root);
    }
    if (rc == 0) {
        const jsonschema_node *root = &s->nodes[s->root];
        if (root->shape == JSONSCHEMA_ENUM ||
            (root->kinds & ~(JSONSCHEMA_OBJECT | JSONSCHEMA_ARRAY)) || !root->kinds)
            rc = err_set(err, "json schema: the top-level value must be an object or an array "
                              "(give its 'type')");
    }
    free(b.done);
    json_object_put(doc);
    if (rc) {
        jsonschema_free(s);
        return -1;
    }
    *out = s;
    return 0;
}

void jsonschema_free(jsonschema *s)
{
    if (!s)
        return;
    free(s->nodes);
    free(s->props);
    free(s->spellings);
    free(s->alts);
    free(s->text);
    for (uint32_t i = 0; i < s->n_patterns; i++)
        regex_free(s->patterns[i]);
    free(s->patterns);
    free(s);
}
