/*
 * jsonschema.h — a JSON Schema compiled into the table that JSON mode's recogniser
 * (jsonmask.h) follows, so that a reply is not only JSON but an instance of the schema
 * (OpenAI's structured outputs, ollama's and llama.cpp's "format"/"json_schema").
 *
 * What is taken (every other keyword is refused with a message naming it, so that no
 * constraint is silently dropped):
 *   - type: "object", "array", "string", "number", "integer", "boolean", "null", or a
 *     list of them; without "type", the kinds that the keywords present imply;
 *   - object: properties, required, additionalProperties (false, or absent, with
 *     properties: no other key; absent or true without properties: any keys, values of
 *     any kind; a schema without properties: any keys, values of that schema). Keys come
 *     in the order of "properties"; a required one may not be skipped, others may (as
 *     llama.cpp's grammar from a schema orders them);
 *   - array: items, minItems, maxItems; tuples: prefixItems, then items (a schema or
 *     false), or as draft 7 wrote them, items as a list, then additionalItems;
 *   - string: minLength, maxLength (in characters; an escape is one); pattern (an
 *     ECMA-262 regular expression as regex.h takes it, unanchored unless ^ or $ says);
 *     format "date", "time", "date-time" (RFC 3339; seconds 00-59, dates that exist,
 *     29 February in leap years), "uuid" and "ipv4", each as the pattern of what is
 *     valid (other formats are annotations: read past). A patterned string is written
 *     without \u escapes: a character as itself (control characters b f n r t as their
 *     short escapes);
 *   - integer and number: minimum, maximum, exclusiveMinimum, exclusiveMaximum (a bounded
 *     number is written without an exponent, in at most JSONSCHEMA_NUMBER_CHARS
 *     characters, so that every prefix is checked against the bounds);
 *   - enum and const of strings, numbers, booleans and null, written as json-c writes
 *     them (a string with its quotes and minimal escapes); a "type" beside them keeps
 *     only the values of that type (Pydantic writes a Literal as a const beside its type);
 *   - anyOf / oneOf whose alternatives start with different bytes: their kinds differ
 *     (integer and number count as one); an enum's kinds are its values'. Optional[X]
 *     (X or null) is the usual case. Objects among them may be several when they are a
 *     tagged union: each a closed object with one property, required in all, that is a
 *     const or enum of strings no other alternative has (Pydantic's discriminated unions,
 *     a tool call's name). That tag is the property an OpenAPI "discriminator" beside the
 *     union names, else the first property of the first object that all can be tagged on;
 *     it is written first, whatever its place in "properties", and chooses;
 *   - allOf of one schema; $ref to "#", "#/$defs/NAME" or "#/definitions/NAME"
 *     (recursion included); true and {} (any value);
 *   - annotations are read past: title, description, default, examples, $schema, $id,
 *     $comment, deprecated, readOnly, writeOnly, format (but for the five above), and
 *     discriminator (read beside a tagged union).
 * The top-level value must be an object or an array, so that the reply's end is its
 * closing bracket.
 *
 * The compiled schema is immutable: one may serve any number of cursors at once.
 */
#ifndef LLMS_JSONSCHEMA_H
#define LLMS_JSONSCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "engine/err.h"
#include "engine/model/regex.h"

/* The kinds of JSON value a node may be; a value's first byte tells its kind. */
enum {
    JSONSCHEMA_OBJECT = 1,
    JSONSCHEMA_ARRAY = 2,
    JSONSCHEMA_STRING = 4,
    JSONSCHEMA_NUMBER = 8,  /* any number */
    JSONSCHEMA_INTEGER = 16, /* a number without fraction or exponent */
    JSONSCHEMA_BOOLEAN = 32,
    JSONSCHEMA_NULL = 64,
    JSONSCHEMA_ANY_KIND = 127,
};

/* Node 0 of every schema: any JSON value. */
#define JSONSCHEMA_ANY 0

/* Bounds of what one schema may hold: properties of one object and alternatives of one
 * anyOf (a key is matched against a 64-bit set of candidates), values of one enum, nodes. */
#define JSONSCHEMA_PROPS_MAX 64
#define JSONSCHEMA_ENUM_MAX 4096
#define JSONSCHEMA_NODES_MAX 4096
/* Patterned strings of one schema, and their automata's memory together: a client's
 * schema is compiled on the daemon's threads, so what it may cost is bounded. */
#define JSONSCHEMA_PATTERNS_MAX 16
#define JSONSCHEMA_PATTERN_BYTES_MAX (4u << 20)
/* Counts above this are taken as no bound (the recogniser counts items to it). */
#define JSONSCHEMA_COUNT_MAX 65535u
/* The longest spelling of a bounded number (sign, digits, point). */
#define JSONSCHEMA_NUMBER_CHARS 23

enum jsonschema_shape {
    JSONSCHEMA_TYPED, /* kinds, with the constraints of each */
    JSONSCHEMA_ENUM,  /* one of n spellings */
    JSONSCHEMA_UNION, /* one of n alternatives, chosen by the value's first byte */
    JSONSCHEMA_TAGGED, /* one of n objects, chosen by their first property's value: read
                          as `items` (a tag head) until the tag is whole */
};

typedef struct jsonschema_node {
    uint8_t shape;        /* enum jsonschema_shape */
    uint8_t kinds;        /* JSONSCHEMA_* kinds the value may be (an enum's: its values') */
    bool free_object;     /* object: any keys (each value of node `items`), no properties */
    bool tag_head;        /* object: the tag property alone of the tagged union `items`,
                             whose alternative the tag's value then names */
    bool has_min, has_max; /* integer bounds */
    bool has_nmin, has_nmax; /* number bounds */
    bool nmin_excl, nmax_excl; /* number bounds that exclude their value */
    uint16_t items;       /* array: each item's node; free object: each value's node; tag
                             head: its tagged union; tagged union: its tag head */
    uint16_t n;           /* properties (closed object), spellings (enum), alternatives */
    uint32_t first;       /* the first of them in props, spellings or alts */
    uint64_t required;    /* closed object: bit i: property i is required */
    uint32_t min_items, max_items;   /* array */
    uint16_t n_prefix;    /* array: a tuple's first items, each of its own node, ... */
    uint32_t prefix;      /* ... alts[prefix .. prefix + n_prefix); the rest are `items` */
    uint32_t min_length, max_length; /* string, in characters */
    uint16_t pattern;     /* string: 1 + the index in patterns of the automaton its text
                             follows (its pattern or format, its lengths folded in); 0: none */
    int64_t min, max;     /* integer, inclusive */
    double nmin, nmax;    /* number (kinds with JSONSCHEMA_NUMBER) */
} jsonschema_node;

/* A byte string of the schema's text table: a key's spelling inside its quotes, or an
 * enum value's whole JSON spelling. */
typedef struct jsonschema_text {
    uint32_t off;
    uint32_t len;
} jsonschema_text;

typedef struct jsonschema_prop {
    jsonschema_text name; /* the key as JSON spells it, without the quotes */
    uint16_t value;       /* node of its value */
} jsonschema_prop;

typedef struct jsonschema {
    jsonschema_node *nodes;    /* (n_nodes) node 0 is JSONSCHEMA_ANY */
    uint32_t n_nodes;
    uint16_t root;             /* the top-level value's node: an object or an array */
    jsonschema_prop *props;    /* (n_props) each closed object's properties, in order */
    uint32_t n_props;
    jsonschema_text *spellings; /* (n_spellings) each enum's values, sorted bytewise */
    uint32_t n_spellings;
    uint16_t *alts;            /* (n_alts) each union's alternatives, each tuple's items */
    uint32_t n_alts;
    char *text;                /* (n_text) the bytes jsonschema_text points into */
    uint32_t n_text;
    regex_dfa **patterns;      /* (n_patterns) the automata of patterned strings */
    uint32_t n_patterns;
} jsonschema;

/* The schema of JSON mode without one: any object. Static; never freed. */
const jsonschema *jsonschema_any_object(void);

/* Compiles the schema text (a JSON document). 0 with *out; -1 with err naming what is
 * malformed or not supported (the first such keyword, with its JSON pointer). */
int jsonschema_compile(const char *text, size_t len, jsonschema **out, char err[ERR_MAX]);

void jsonschema_free(jsonschema *s);

/* The bytes of t. */
static inline const uint8_t *jsonschema_bytes(const jsonschema *s, jsonschema_text t)
{
    return (const uint8_t *)s->text + t.off;
}

/* Whether a and b are the same bytes. */
static inline bool jsonschema_texts_equal(const jsonschema *s, jsonschema_text a,
                                          jsonschema_text b)
{
    return a.len == b.len && memcmp(jsonschema_bytes(s, a), jsonschema_bytes(s, b), a.len) == 0;
}

#endif
