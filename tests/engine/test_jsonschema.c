/*
 * jsonschema: compiling a JSON Schema (what is taken, what is refused and why) and the
 * recogniser following it: documents accepted whole, refused at the first wrong byte;
 * and a property test: random walks over the bytes the recogniser allows never reach a
 * state that allows nothing (a dead end would leave a model without a token), and every
 * document they complete is valid by a separate validator over json-c's parse.
 */
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/model/jsonmask.h"
#include "engine/model/jsonschema.h"
#include "tests/support/test.h"

static jsonschema *compile_or_fail(const char *text)
{
    char err[ERR_MAX];
    jsonschema *s = NULL;
    if (jsonschema_compile(text, strlen(text), &s, err))
        test_fail(__FILE__, __LINE__, "%s: %s", text, err);
    return s;
}

/* ---- compiling ---- */

static void refusals_name_the_keyword(void)
{
    static const struct {
        const char *schema, *says;
    } cases[] = {
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"(?=x)\"}}}",
         "'pattern' at #/properties/a: "},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^x$\","
         "\"minLength\":2}}}", "'pattern' at #/properties/a: "},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"pattern\":7}}}",
         "'pattern' at #/properties/a is not a string"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"pattern\":\"x\",\"format\":\"date\"}}}",
         "'format' date beside 'pattern'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"uniqueItems\":true}}}",
         "'uniqueItems' at #/properties/a is not supported"},
        {"{\"type\":\"string\"}", "top-level value must be an object or an array"},
        {"{\"enum\":[1,2]}", "top-level value"},
        {"{\"type\":\"object\",\"properties\":{\"n\":{\"type\":\"number\",\"minimum\":1,"
         "\"exclusiveMaximum\":1}}}", "no number at #/properties/n is within its bounds"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"integer\"},"
         "{\"type\":\"number\"}]}}}", "not told apart"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/$defs/missing\"}}}",
         "names nothing"},
        {"{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"a\"}},"
         "\"required\":[\"t\"]},{\"type\":\"object\",\"properties\":{\"u\":{\"const\":\"b\"}},"
         "\"required\":[\"u\"]}]}", "are no tagged union"},
        {"{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"t\":{\"enum\":[\"a\",\"b\"]}},"
         "\"required\":[\"t\"]},{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"b\"}},"
         "\"required\":[\"t\"]}]}", "have one tag value"},
        {"{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"a\"}}},"
         "{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"b\"}},\"required\":[\"t\"]}]}",
         "are no tagged union"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"http://x/y\"}}}",
         "only references inside"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}",
         "required 'b' at # is not among its properties"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[]}}}", "has 0 values"},
        /* (json-c asserts on the length of what is not a list: the fuzzer found it) */
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":\"x\"}}}", "is not a list"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[{\"x\":1}]}}}",
         "object or list in 'enum'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":true},\"additionalProperties\":true}",
         "'additionalProperties' beside 'properties'"},
        {"{\"type\":\"array\",\"prefixItems\":[{}],\"items\":[{}]}",
         "'items' as a list beside 'prefixItems' at #"},
        {"{\"type\":\"array\",\"prefixItems\":{}}", "'prefixItems' at # is not a list"},
        {"{\"type\":\"array\",\"prefixItems\":[]}", "'prefixItems' at # is not a list"},
        {"{\"type\":\"array\",\"prefixItems\":[{\"type\":\"strin\"}]}",
         "'type' at #/prefixItems/0 is not a type name"},
        {"{\"type\":\"array\",\"prefixItems\":[{}],\"items\":false,\"minItems\":2}",
         "above the 1 items that may be"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "minItems above maxItems"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":5,"
         "\"maximum\":4}}}", "no integer"},
        {"{\"type\":\"object\",\"properties\":{\"a\":false}}", "no value is valid"},
        {"{\"type\":\"objet\"}", "'type' at # is not a type name"},
        {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"t\":{\"const\":\"a\"},"
         "\"u\":{\"const\":\"x\"}},\"required\":[\"t\",\"u\"]},{\"type\":\"object\","
         "\"properties\":{\"t\":{\"const\":\"b\"}},\"required\":[\"t\"]}],"
         "\"discriminator\":{\"propertyName\":\"u\"}}", "with one property 'u' required"},
        {"{\"oneOf\":[{\"type\":\"object\"}],\"discriminator\":{}}", "has no propertyName"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"const\":1,\"type\":\"string\"}}}",
         "no value of 'const' at #/properties/a is of its 'type'"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1],\"type\":\"strng\"}}}",
         "'type' at #/properties/a is not a type name"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#/properties/a\"}}}",
         "leads back to itself"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"allOf\":[{},{}]}}}",
         "only a list of one schema"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"$ref\":\"#\",\"type\":\"string\"}}}",
         "'type' beside '$ref'"},
        {"{\"type\":\"object\"", "not one JSON document"},
        {"{\"type\":\"object\"} {}", "not one JSON document"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[ERR_MAX] = "";
        jsonschema *s = NULL;
        int rc = jsonschema_compile(cases[i].schema, strlen(cases[i].schema), &s, err);
        CHECK_MSG(rc == -1 && !s, "%s was compiled", cases[i].schema);
        CHECK_MSG(strstr(err, cases[i].says), "%s: '%s' does not say '%s'", cases[i].schema,
                  err, cases[i].says);
    }
}

/* Annotations are read past; format is an annotation (not asserted). */
static void annotations_are_taken(void)
{
    jsonschema *s = compile_or_fail(
        "{\"$schema\":\"https://json-schema.org/draft/2020-12/schema\",\"title\":\"T\","
        "\"description\":\"d\",\"type\":\"object\",\"properties\":{\"when\":{\"type\":"
        "\"string\",\"format\":\"date-time\",\"examples\":[\"x\"],\"default\":\"y\"}},"
        "\"$comment\":\"c\"}");
    jsonschema_free(s);
}

/* ---- documents ---- */

/* Feeds doc whole under the schema: 1 complete, 0 a valid prefix, -1 refused. */
static int feed_doc(const jsonschema *s, const char *doc)
{
    jsonmask_state st;
    jsonmask_init_schema(&st, s);
    if (!jsonmask_feed(&st, doc, strlen(doc)))
        return -1;
    return jsonmask_complete(&st) ? 1 : 0;
}

typedef struct doc_case {
    const char *doc;
    int want; /* feed_doc's */
} doc_case;

static void check_docs(const char *schema, const doc_case *cases, size_t n)
{
    jsonschema *s = compile_or_fail(schema);
    if (!s)
        return;
    for (size_t i = 0; i < n; i++) {
        int got = feed_doc(s, cases[i].doc);
        CHECK_MSG(got == cases[i].want, "schema %s, document '%s': %d, expected %d", schema,
                  cases[i].doc, got, cases[i].want);
    }
    jsonschema_free(s);
}

#define CHECK_DOCS(schema, ...)                                                    \
    do {                                                                           \
        static const doc_case cases_[] = {__VA_ARGS__};                            \
        check_docs(schema, cases_, sizeof cases_ / sizeof *cases_);                \
    } while (0)

static void objects_follow_their_properties(void)
{
    CHECK_DOCS("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
               "\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
               "{\"type\":\"string\"}}},\"required\":[\"name\",\"age\"]}",
               {"{\"name\":\"Ada\",\"age\":36}", 1},
               {"{ \"name\" : \"Ada\" , \"age\" : 36 , \"tags\" : [\"x\"] }", 1},
               {"{\"name\":\"Ada\",\"age\":36,\"tags\":[]}", 1},
               {"{\"name\":\"Ada\"}", -1},          /* age is required */
               {"{\"age\":36}", -1},                /* name first: required, in order */
               {"{\"name\":\"Ada\",\"age\":3.5}", -1}, /* integer */
               {"{\"name\":\"Ada\",\"age\":1e3}", -1},
               {"{\"name\":\"Ada\",\"age\":-7,", 0},
               {"{\"name\":\"Ada\",\"age\":-7,\"x\"", -1}, /* no other key */
               {"{\"name\":\"Ada\",\"age\":-7,\"tags\":[1]}", -1},
               {"{\"name\":1", -1},
               {"{\"nam\":", -1},
               {"{\"na", 0},
               {"{}", -1},
               {"[]", -1});
    /* optional properties may be skipped, a required one may not */
    CHECK_DOCS("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"boolean\"},"
               "\"b\":{\"type\":\"null\"},\"c\":{\"type\":\"boolean\"}},\"required\":[\"c\"]}",
               {"{\"c\":true}", 1}, {"{\"a\":false,\"c\":true}", 1},
               {"{\"b\":null,\"c\":false}", 1}, {"{\"a\":true,\"b\":null,\"c\":true}", 1},
               {"{\"c\":true,\"a\":true}", -1}, {"{\"a\":true}", -1}, {"{\"b\":nul}", -1});
    /* no properties: any keys, values of any kind (or of additionalProperties) */
    CHECK_DOCS("{\"type\":\"object\"}", {"{\"x\":[1,{\"y\":null}],\"z\":\"w\"}", 1}, {"{}", 1});
    CHECK_DOCS("{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}",
               {"{\"x\":1,\"y\":-2}", 1}, {"{\"x\":\"1\"}", -1}, {"{\"x\":1.5}", -1});
    CHECK_DOCS("{\"type\":\"object\",\"additionalProperties\":false}", {"{}", 1},
               {"{\"a\"", -1});
    /* a key that needs escaping is written as json-c writes it */
    CHECK_DOCS("{\"type\":\"object\",\"properties\":{\"a\\\"b\":{\"const\":1}},"
               "\"required\":[\"a\\\"b\"]}",
               {"{\"a\\\"b\":1}", 1}, {"{\"a\"b\":1}", -1});
}

static void arrays_count_their_items(void)
{
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":2,"
               "\"maxItems\":3}",
               {"[1,2]", 1}, {"[1,2,3]", 1}, {"[1]", -1}, {"[]", -1}, {"[1,2,3,", -1},
               {"[ 1 , 2 , 3 ]", 1}, {"[1,2,3 ,", -1}, {"[\"a\"]", -1});
    CHECK_DOCS("{\"type\":\"array\",\"maxItems\":0}", {"[]", 1}, {"[1", -1});
    CHECK_DOCS("{\"type\":[\"array\",\"object\"]}", {"[{}]", 1}, {"{\"a\":[]}", 1});
}

/* Tuples: each first item its own schema, then `items` (or nothing after false). */
static void tuples_type_each_item(void)
{
    /* Pydantic's Tuple[int, str] */
    CHECK_DOCS("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"},{\"type\":"
               "\"string\"}],\"minItems\":2,\"maxItems\":2}",
               {"[1,\"a\"]", 1}, {"[1, \"a\" ]", 1}, {"[\"a\"", -1}, {"[1,2", -1},
               {"[1]", -1}, {"[1,\"a\",", -1}, {"[]", -1});
    /* then items of a schema; fewer than the tuple's are valid without minItems */
    CHECK_DOCS("{\"type\":\"object\",\"properties\":{\"t\":{\"prefixItems\":[{\"const\":"
               "\"x\"},{\"type\":\"null\"}],\"items\":{\"type\":\"boolean\"}}},\"required\":"
               "[\"t\"]}",
               {"{\"t\":[\"x\",null,true,false]}", 1}, {"{\"t\":[]}", 1},
               {"{\"t\":[\"x\"]}", 1}, {"{\"t\":[\"x\",null,null", -1},
               {"{\"t\":[null", -1});
    /* items false closes it; draft 7 writes the tuple as items and the rest as
     * additionalItems */
    CHECK_DOCS("{\"type\":\"array\",\"prefixItems\":[{\"type\":\"integer\"}],\"items\":false}",
               {"[]", 1}, {"[7]", 1}, {"[7,", -1});
    CHECK_DOCS("{\"type\":\"array\",\"items\":[{\"type\":\"string\"},{\"type\":\"integer\"}],"
               "\"additionalItems\":{\"type\":\"null\"}}",
               {"[\"a\",1,null,null]", 1}, {"[\"a\",1,2", -1}, {"[1", -1});
    CHECK_DOCS("{\"type\":\"array\",\"items\":[{\"type\":\"string\"}],\"additionalItems\":false}",
               {"[\"a\"]", 1}, {"[\"a\",", -1});
}

/* A pattern (unanchored unless it says), with the lengths beside it, and the formats
 * asserted: what the text decodes to is matched; \u escapes are not written. */
static void patterns_and_formats(void)
{
    CHECK_DOCS("{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":"
               "\"^[A-Z]{3}-\\\\d{2,4}$\"},\"q\":{\"pattern\":\"a\\\"b|c/d\",\"maxLength\":4}},"
               "\"required\":[\"code\"]}",
               {"{\"code\":\"ABC-12\"}", 1}, {"{\"code\":\"ABC-1234\"}", 1},
               {"{\"code\":\"ABC-1\"", -1}, {"{\"code\":\"ABC-12345", -1},
               {"{\"code\":\"AB1", -1}, {"{\"code\":\"ABC-12\",\"q\":\"a\\\"b\"}", 1},
               {"{\"code\":\"ABC-12\",\"q\":\"xa\\\"b\"}", 1},
               {"{\"code\":\"ABC-12\",\"q\":\"c\\/d\"}", 1},
               {"{\"code\":\"ABC-12\",\"q\":\"xc/dy\"", -1},
               {"{\"code\":\"ABC-12\",\"q\":\"\\u0061", -1},
               {"{\"code\":\"ABC-12\",\"q\":\"ab\"", -1});
    /* a non-ASCII class, and a newline written as its escape */
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":"
               "\"^[\u00e0-\u00ff]+(\\\\n\u20ac)?$\",\"minLength\":2}}",
               {"[\"\u00e9\u00e8\"]", 1}, {"[\"\xc3\xa9\xc3\xa0\\n\xe2\x82\xac\"]", 1},
               {"[\"\xc3\xa9\"]", -1}, {"[\"e", -1});
    CHECK_DOCS("{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":"
               "\"date\"},\"t\":{\"type\":\"string\",\"format\":\"date-time\"},\"u\":{\"type\":"
               "\"string\",\"format\":\"uuid\"},\"ip\":{\"format\":\"ipv4\",\"type\":\"string\"},"
               "\"url\":{\"type\":\"string\",\"format\":\"uri\"}}}",
               {"{\"d\":\"2024-02-29\"}", 1}, {"{\"d\":\"2000-02-29\"}", 1},
               {"{\"d\":\"2023-02-29", -1}, {"{\"d\":\"1900-02-29", -1},
               {"{\"d\":\"2023-04-31", -1}, {"{\"d\":\"2023-12-31\"}", 1},
               {"{\"d\":\"2023-1-", -1},
               {"{\"t\":\"2023-12-31T23:59:59.5+01:00\"}", 1}, {"{\"t\":\"2023-12-31T24", -1},
               {"{\"t\":\"2023-12-31T23:59:59\"", -1},
               {"{\"u\":\"123e4567-e89b-12d3-a456-426614174000\"}", 1},
               {"{\"u\":\"123e4567-e89b-12d3-a456-42661417400\"", -1},
               {"{\"ip\":\"192.168.0.255\"}", 1}, {"{\"ip\":\"256", -1},
               {"{\"url\":\"not checked\"}", 1});
}

/* A schema's patterns share one budget of construction steps (REGEX_WORK_MAX), so that a
 * request bringing many costly ones is refused in the time one takes: a pattern that
 * compiles alone (some 1.5M steps) is refused once sixteen properties repeat it. */
static void patterns_share_one_budget(void)
{
    static const char costly[] = "{\"type\":\"string\",\"pattern\":\"[^x]{15}[^y]{15}\"}";
    char text[2048];
    int n = snprintf(text, sizeof text, "{\"type\":\"object\",\"properties\":{\"p0\":%s}}",
                     costly);
    jsonschema_free(compile_or_fail(text));
    n = snprintf(text, sizeof text, "{\"type\":\"object\",\"properties\":{");
    for (int i = 0; i < 16; i++)
        n += snprintf(text + n, sizeof text - (size_t)n, "%s\"p%d\":%s", i ? "," : "", i, costly);
    snprintf(text + n, sizeof text - (size_t)n, "}}");
    char err[ERR_MAX] = "";
    jsonschema *s = NULL;
    CHECK(jsonschema_compile(text, strlen(text), &s, err) == -1 && !s);
    CHECK_MSG(strstr(err, "and those of the patterns before it take more than"), "%s", err);
}

static void strings_count_characters(void)
{
    CHECK_DOCS("{\"type\":\"object\",\"properties\":{\"s\":{\"type\":\"string\",\"minLength\":2,"
               "\"maxLength\":3}},\"required\":[\"s\"]}",
               {"{\"s\":\"ab\"}", 1}, {"{\"s\":\"abc\"}", 1}, {"{\"s\":\"a\"}", -1},
               {"{\"s\":\"abcd", -1}, {"{\"s\":\"\\u00e9\\n\"}", 1},
               {"{\"s\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}", 1},
               {"{\"s\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80x", -1});
}

static void integers_keep_their_bounds(void)
{
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":100,"
               "\"maximum\":150}}",
               {"[100,150,123]", 1}, {"[5", -1}, /* 5x is below, 5xx above: a dead end */
               {"[1", 0}, {"[15", 0}, {"[151", -1}, {"[99]", -1}, {"[0", -1}, {"[-", -1},
               {"[1000", -1}, {"[12]", -1});
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"exclusiveMinimum\":-10,"
               "\"exclusiveMaximum\":0}}",
               {"[-9,-1]", 1}, {"[-10", -1}, {"[0", -1}, {"[-0", -1}, {"[1", -1}, {"[-", 0});
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":0}}",
               {"[0,7,12345678901234567890]", -1}, {"[0,7,1234567890123456789]", 1},
               {"[-", -1});
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"type\":\"integer\",\"minimum\":-9223372036854775808,"
               "\"maximum\":-9223372036854775807}}",
               {"[-9223372036854775808,-9223372036854775807]", 1}, {"[-9223372036854775809", -1});
}

static void numbers_keep_their_bounds(void)
{
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1}}",
               {"[0,1,0.5,1.0,0.25,0.000]", 1}, {"[1.5", -1}, {"[1.", 0}, {"[2", -1},
               {"[-", -1}, {"[0.5e3", -1}, {"[1.0001", -1}, {"[10", -1}, {"[0.99999", 0});
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"type\":\"number\",\"exclusiveMinimum\":0,"
               "\"exclusiveMaximum\":1}}",
               {"[0.5,0.999]", 1}, {"[0]", -1}, {"[0.0]", -1}, {"[0.", 0}, {"[1", -1});
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":-2.5,"
               "\"maximum\":-0.5}}",
               {"[-1,-2.5,-0.5,-0.75]", 1}, {"[-3", -1}, {"[-0.4", -1}, {"[-0]", -1},
               {"[-2.51", -1}, {"[1", -1});
    /* a large lower bound: the digits it needs fit the spelling's room */
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"type\":\"number\",\"minimum\":1e15}}",
               {"[1000000000000000]", 1}, {"[2", 0}, {"[99999999999999]", -1});
    /* unbounded numbers keep their exponents */
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"type\":\"number\"}}", {"[1e300,-2.5E-3]", 1});
}

static void enums_and_consts(void)
{
    CHECK_DOCS("{\"type\":\"object\",\"properties\":{\"c\":{\"enum\":[\"red\",\"green\",\"re\","
               "null,1,10,true]}},\"required\":[\"c\"]}",
               {"{\"c\":\"red\"}", 1}, {"{\"c\":\"re\"}", 1}, {"{\"c\":\"r\"}", -1},
               {"{\"c\":\"redd", -1}, {"{\"c\":null}", 1}, {"{\"c\":1}", 1}, {"{\"c\":10}", 1},
               {"{\"c\":100", -1}, {"{\"c\":1 }", 1}, {"{\"c\":true}", 1},
               {"{\"c\":false", -1}, {"{\"c\":2", -1});
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"const\":\"x/y\"}}", {"[\"x/y\",\"x/y\"]", 1},
               {"[\"x\\/y\"]", -1});
    /* a type beside them, as Pydantic writes a Literal, keeps only the values of the type */
    CHECK_DOCS("{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"x\",\"type\":"
               "\"string\"},\"e\":{\"enum\":[\"a\",1,2.5,3.0,null],\"type\":[\"integer\","
               "\"null\"]}},\"required\":[\"k\",\"e\"]}",
               {"{\"k\":\"x\",\"e\":1}", 1}, {"{\"k\":\"x\",\"e\":null}", 1},
               {"{\"k\":\"x\",\"e\":3.0}", 1}, {"{\"k\":\"x\",\"e\":\"", -1},
               {"{\"k\":\"x\",\"e\":2", -1}, {"{\"k\":\"y", -1});
}

static void unions_choose_by_first_byte(void)
{
    /* Optional[X] as Pydantic writes it, and a type list */
    CHECK_DOCS("{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"string\","
               "\"maxLength\":2},{\"type\":\"null\"}],\"default\":null},\"b\":{\"type\":"
               "[\"integer\",\"boolean\"]}},\"required\":[\"a\",\"b\"]}",
               {"{\"a\":null,\"b\":3}", 1}, {"{\"a\":\"xy\",\"b\":false}", 1},
               {"{\"a\":\"xyz", -1}, {"{\"a\":1", -1}, {"{\"a\":null,\"b\":1.5", -1},
               {"{\"a\":null,\"b\":\"", -1});
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"oneOf\":[{\"enum\":[\"a\",\"b\"]},{\"type\":"
               "\"array\",\"items\":{\"type\":\"number\"}},{\"type\":\"object\",\"properties\":"
               "{\"k\":{\"type\":\"integer\"}}}]}}",
               {"[\"a\",[1.5,-2e3],{\"k\":1},{}]", 1}, {"[\"c\"", -1}, {"[{\"j\"", -1});
}

/* Objects among alternatives: a tagged union, the tag (the first property) choosing. */
static void tagged_unions_choose_by_their_tag(void)
{
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"oneOf\":[{\"type\":\"object\",\"properties\":"
               "{\"kind\":{\"const\":\"cat\"},\"meows\":{\"type\":\"integer\",\"minimum\":0}},"
               "\"required\":[\"kind\",\"meows\"]},{\"type\":\"object\",\"properties\":{\"kind\":"
               "{\"enum\":[\"dog\",\"wolf\"]},\"barks\":{\"type\":\"boolean\"}},\"required\":"
               "[\"kind\"]},{\"type\":\"null\"}]}}",
               {"[{\"kind\":\"cat\",\"meows\":3},{\"kind\":\"dog\",\"barks\":true},"
                "{\"kind\" : \"wolf\"},null]", 1},
               {"[{\"kind\":\"cat\",\"barks\"", -1}, {"[{\"kind\":\"dog\",\"meows\"", -1},
               {"[{\"meows\"", -1}, {"[{\"kind\":\"cow\"", -1}, {"[{\"kind\":\"cat\"}]", -1},
               {"[{}]", -1}, {"[{\"kind\":\"wolf\"}]", 1});
    /* all alternatives objects: the union is the top-level value itself */
    CHECK_DOCS("{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"op\":{\"const\":\"add\"},"
               "\"n\":{\"type\":\"integer\"}},\"required\":[\"op\",\"n\"]},{\"type\":\"object\","
               "\"properties\":{\"op\":{\"const\":\"clear\"}},\"required\":[\"op\"]}]}",
               {"{\"op\":\"add\",\"n\":2}", 1}, {"{\"op\":\"clear\"}", 1},
               {"{\"op\":\"clear\",\"n\"", -1}, {"{\"op\":\"add\"}", -1});
    /* Pydantic's discriminated union, as model_json_schema() writes it (the tag a const
     * beside its type, an OpenAPI discriminator, the tag not first in Dog): the tag is
     * written first, the other keys in their order; Dog stays as it is where used alone */
    CHECK_DOCS("{\"$defs\":{\"Cat\":{\"properties\":{\"pet_type\":{\"const\":\"cat\","
               "\"title\":\"Pet Type\",\"type\":\"string\"},\"meows\":{\"title\":\"Meows\","
               "\"type\":\"integer\"}},\"required\":[\"pet_type\",\"meows\"],\"title\":\"Cat\","
               "\"type\":\"object\"},\"Dog\":{\"properties\":{\"barks\":{\"title\":\"Barks\","
               "\"type\":\"number\"},\"name\":{\"type\":\"string\"},\"pet_type\":{\"const\":"
               "\"dog\",\"title\":\"Pet Type\",\"type\":\"string\"}},\"required\":[\"barks\","
               "\"pet_type\"],\"title\":\"Dog\",\"type\":\"object\"}},\"properties\":{\"pet\":"
               "{\"discriminator\":{\"mapping\":{\"cat\":\"#/$defs/Cat\",\"dog\":\"#/$defs/Dog\"},"
               "\"propertyName\":\"pet_type\"},\"oneOf\":[{\"$ref\":\"#/$defs/Cat\"},{\"$ref\":"
               "\"#/$defs/Dog\"}],\"title\":\"Pet\"},\"best\":{\"$ref\":\"#/$defs/Dog\"}},"
               "\"required\":[\"pet\",\"best\"],\"title\":\"M\",\"type\":\"object\"}",
               {"{\"pet\":{\"pet_type\":\"dog\",\"barks\":1.5,\"name\":\"x\"},\"best\":"
                "{\"barks\":2,\"pet_type\":\"dog\"}}", 1},
               {"{\"pet\":{\"pet_type\":\"dog\",\"barks\":1,\"pet_type\"", -1},
               {"{\"pet\":{\"pet_type\":\"dog\",\"name\":\"x\"}", -1},
               {"{\"pet\":{\"pet_type\":\"cat\",\"meows\":1},\"best\":{\"pet_type\"", -1},
               {"{\"pet\":{\"barks\"", -1});
    /* no discriminator and no common first property: the first property every object
     * can be tagged on */
    CHECK_DOCS("{\"type\":\"array\",\"items\":{\"anyOf\":[{\"type\":\"object\",\"properties\":"
               "{\"x\":{\"type\":\"integer\"},\"t\":{\"const\":\"a\"}},\"required\":[\"x\","
               "\"t\"]},{\"type\":\"object\",\"properties\":{\"t\":{\"enum\":[\"b\",\"c\"]},"
               "\"y\":{\"type\":\"string\"}},\"required\":[\"t\"]}]}}",
               {"[{\"t\":\"a\",\"x\":1},{\"t\":\"c\"},{\"t\":\"b\",\"y\":\"\"}]", 1},
               {"[{\"t\":\"a\"}", -1}, {"[{\"x\"", -1});
}

static void references_and_recursion(void)
{
    const char *tree =
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"name\":{\"type\":"
        "\"string\"},\"children\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
        "\"required\":[\"name\"]}},\"$ref\":\"#/$defs/node\"}";
    CHECK_DOCS(tree, {"{\"name\":\"r\",\"children\":[{\"name\":\"a\"},{\"name\":\"b\","
                      "\"children\":[{\"name\":\"c\",\"children\":[]}]}]}", 1},
               {"{\"name\":\"r\",\"children\":[{}]}", -1});
    /* a linked list through Optional and the root itself */
    CHECK_DOCS("{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},\"next\":"
               "{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}},\"required\":[\"v\",\"next\"]}",
               {"{\"v\":1,\"next\":{\"v\":2,\"next\":null}}", 1},
               {"{\"v\":1,\"next\":{\"v\":2}}", -1});
    /* definitions (draft 7's), allOf of one, ~1 in a pointer */
    CHECK_DOCS("{\"definitions\":{\"a/b\":{\"type\":\"boolean\"}},\"type\":\"object\","
               "\"properties\":{\"x\":{\"allOf\":[{\"$ref\":\"#/definitions/a~1b\"}]}},"
               "\"required\":[\"x\"]}",
               {"{\"x\":true}", 1}, {"{\"x\":1", -1});
}

/* ---- a separate validator, for the property test ---- */

static bool valid(json_object *v, json_object *sch, json_object *root);

static json_object *get(json_object *o, const char *key)
{
    json_object *v = NULL;
    return json_object_is_type(o, json_type_object) && json_object_object_get_ex(o, key, &v)
               ? v
               : NULL;
}

static json_object *resolve(json_object *root, const char *ref)
{
    if (!strcmp(ref, "#"))
        return root;
    const char *name = strrchr(ref, '/') + 1;
    json_object *defs = get(root, strstr(ref, "$defs") ? "$defs" : "definitions");
    return get(defs, name);
}

static bool type_ok(json_object *v, const char *t)
{
    enum json_type k = json_object_get_type(v);
    if (!strcmp(t, "integer")) /* json-c reads an integer past 64 bits as a double */
        return k == json_type_int ||
               (k == json_type_double && floor(json_object_get_double(v)) == json_object_get_double(v));
    if (!strcmp(t, "number"))
        return k == json_type_int || k == json_type_double;
    return (!strcmp(t, "object") && k == json_type_object) ||
           (!strcmp(t, "array") && k == json_type_array) ||
           (!strcmp(t, "string") && k == json_type_string) ||
           (!strcmp(t, "boolean") && k == json_type_boolean) ||
           (!strcmp(t, "null") && k == json_type_null);
}

static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xc0) != 0x80;
    return n;
}

/* v against bound k, keyword i of minimum, maximum, exclusiveMinimum, exclusiveMaximum:
 * two integers as integers, else as doubles. */
static bool number_within(json_object *v, json_object *k, int i)
{
    int c;
    if (json_object_is_type(v, json_type_int) && json_object_is_type(k, json_type_int)) {
        int64_t x = json_object_get_int64(v), b = json_object_get_int64(k);
        c = (x > b) - (x < b);
    } else {
        double x = json_object_get_double(v), b = json_object_get_double(k);
        c = (x > b) - (x < b);
    }
    return i == 0 ? c >= 0 : i == 1 ? c <= 0 : i == 2 ? c > 0 : c < 0;
}

/* Whether PCRE2 finds pattern in text (JSON Schema's patterns are not anchored). */
static bool pcre_search(const char *pattern, const char *text, size_t len)
{
    int code;
    PCRE2_SIZE at;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &code, &at, NULL);
    if (!re)
        return false;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    bool found = md && pcre2_match(re, (PCRE2_SPTR)text, len, 0, 0, md, NULL) >= 0;
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return found;
}

/* The formats llmsd asserts, checked apart from its own patterns: a date by the calendar,
 * the rest by PCRE2. Other formats are annotations. */
static bool format_valid(const char *format, const char *text, size_t len)
{
    static const char time[] = "([01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(\\.\\d+)?(Z|[+-]([01]\\d|2[0-3]):"
                               "[0-5]\\d)$";
    bool date = !strcmp(format, "date"), date_time = !strcmp(format, "date-time");
    if (date || date_time) {
        int y, m, d, end = 0;
        if (len < 10 || sscanf(text, "%4d-%2d-%2d%n", &y, &m, &d, &end) != 3 || end != 10 ||
            !pcre_search("^\\d{4}-\\d\\d-\\d\\d", text, 10))
            return false;
        static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
        bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        if (m < 1 || m > 12 || d < 1 || d > days[m - 1] + (m == 2 && leap))
            return false;
        if (date)
            return len == 10;
        char tpat[sizeof time + 2] = "^";
        strcat(tpat, time);
        return len > 11 && text[10] == 'T' && pcre_search(tpat, text + 11, len - 11);
    }
    if (!strcmp(format, "time")) {
        char tpat[sizeof time + 2] = "^";
        strcat(tpat, time);
        return pcre_search(tpat, text, len);
    }
    if (!strcmp(format, "uuid"))
        return pcre_search("^[[:xdigit:]]{8}(-[[:xdigit:]]{4}){3}-[[:xdigit:]]{12}$", text, len);
    if (!strcmp(format, "ipv4")) {
        unsigned a[4];
        int end = 0;
        if (sscanf(text, "%3u.%3u.%3u.%3u%n", &a[0], &a[1], &a[2], &a[3], &end) != 4 ||
            (size_t)end != len || !pcre_search("^(0|[1-9]\\d*)(\\.(0|[1-9]\\d*)){3}$", text, len))
            return false;
        return a[0] < 256 && a[1] < 256 && a[2] < 256 && a[3] < 256;
    }
    return true;
}

static bool valid(json_object *v, json_object *sch, json_object *root)
{
    json_object *k;
    if (json_object_is_type(sch, json_type_boolean))
        return json_object_get_boolean(sch);
    if ((k = get(sch, "$ref")))
        return valid(v, resolve(root, json_object_get_string(k)), root);
    if ((k = get(sch, "allOf")))
        return valid(v, json_object_array_get_idx(k, 0), root);
    if ((k = get(sch, "anyOf")) || (k = get(sch, "oneOf"))) {
        int n = 0;
        for (size_t i = 0; i < json_object_array_length(k); i++)
            n += valid(v, json_object_array_get_idx(k, i), root);
        return get(sch, "oneOf") ? n == 1 : n >= 1;
    }
    if ((k = get(sch, "const")) && !json_object_equal(v, k))
        return false;
    if ((k = get(sch, "enum"))) {
        bool listed = false;
        for (size_t i = 0; i < json_object_array_length(k); i++)
            listed |= json_object_equal(v, json_object_array_get_idx(k, i));
        if (!listed)
            return false;
    }
    if ((k = get(sch, "type"))) {
        bool any = false;
        if (json_object_is_type(k, json_type_string))
            any = type_ok(v, json_object_get_string(k));
        for (size_t i = 0; json_object_is_type(k, json_type_array) &&
                           i < json_object_array_length(k); i++)
            any |= type_ok(v, json_object_get_string(json_object_array_get_idx(k, i)));
        if (!any)
            return false;
    }
    if (json_object_is_type(v, json_type_object)) {
        json_object *props = get(sch, "properties"), *extra = get(sch, "additionalProperties");
        json_object *req = get(sch, "required");
        for (size_t i = 0; req && i < json_object_array_length(req); i++)
            if (!json_object_object_get_ex(
                    v, json_object_get_string(json_object_array_get_idx(req, i)), NULL))
                return false; /* (json-c's null is a NULL object: get() cannot tell) */
        json_object_object_foreach(v, key, val)
        {
            json_object *rule = get(props, key) ? get(props, key) : extra;
            if (rule && !valid(val, rule, root))
                return false;
        }
    }
    if (json_object_is_type(v, json_type_array)) {
        size_t n = json_object_array_length(v);
        json_object *items = get(sch, "items"), *prefix = get(sch, "prefixItems");
        if (json_object_is_type(items, json_type_array)) { /* draft 7's tuple */
            prefix = items;
            items = get(sch, "additionalItems");
        }
        size_t n_prefix = prefix ? json_object_array_length(prefix) : 0;
        if ((k = get(sch, "minItems")) && n < (size_t)json_object_get_int64(k))
            return false;
        if ((k = get(sch, "maxItems")) && n > (size_t)json_object_get_int64(k))
            return false;
        for (size_t i = 0; i < n; i++) {
            json_object *rule = i < n_prefix ? json_object_array_get_idx(prefix, i) : items;
            if (rule && !valid(json_object_array_get_idx(v, i), rule, root))
                return false;
        }
    }
    if (json_object_is_type(v, json_type_string)) {
        size_t n = utf8_chars(json_object_get_string(v));
        if ((k = get(sch, "minLength")) && n < (size_t)json_object_get_int64(k))
            return false;
        if ((k = get(sch, "maxLength")) && n > (size_t)json_object_get_int64(k))
            return false;
        const char *text = json_object_get_string(v);
        size_t len = (size_t)json_object_get_string_len(v);
        if ((k = get(sch, "pattern")) && !pcre_search(json_object_get_string(k), text, len))
            return false;
        if ((k = get(sch, "format")) && !format_valid(json_object_get_string(k), text, len))
            return false;
    }
    if (json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)) {
        static const char *const keys[] = {"minimum", "maximum", "exclusiveMinimum",
                                           "exclusiveMaximum"};
        for (int i = 0; i < 4; i++)
            if ((k = get(sch, keys[i])) && !json_object_is_type(k, json_type_boolean) &&
                !number_within(v, k, i))
                return false;
    }
    return true;
}

/* ---- the property test ---- */

/* The bytes st takes next, into ok (256 flags); how many. */
static int next_bytes(const jsonmask_state *st, bool ok[256])
{
    int n = 0;
    for (int b = 0; b < 256; b++) {
        jsonmask_state t = *st;
        uint8_t c = (uint8_t)b;
        n += ok[b] = jsonmask_feed(&t, &c, 1);
    }
    return n;
}

/* Picks one of the n allowed bytes: now and then a byte of structure (so that strings
 * and containers end), else any. */
static uint8_t pick_byte(const bool ok[256], int n, uint64_t *rng)
{
    static const char structure[] = "\"]},:0123456789tfn[{";
    if (test_random(rng) % 4 == 0) {
        int m = 0;
        uint8_t cand[sizeof structure];
        for (const char *p = structure; *p; p++)
            if (ok[(uint8_t)*p])
                cand[m++] = (uint8_t)*p;
        if (m)
            return cand[test_random(rng) % (uint64_t)m];
    }
    int k = (int)(test_random(rng) % (uint64_t)n);
    for (int b = 0; b < 256; b++)
        if (ok[b] && k-- == 0)
            return (uint8_t)b;
    return 0;
}

static const char *const walk_schemas[] = {
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":8},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":130},\"email\":{\"type\":"
    "\"string\",\"format\":\"email\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":"
    "[\"a\",\"ab\",\"b\",1,12,null]},\"maxItems\":4}},\"required\":[\"name\",\"age\"]}",
    "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\","
    "\"exclusiveMinimum\":-50,\"maximum\":-3},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":"
    "\"#/$defs/node\"},\"maxItems\":2}},\"required\":[\"v\"]}},\"$ref\":\"#/$defs/node\"}",
    "{\"type\":\"array\",\"minItems\":1,\"items\":{\"anyOf\":[{\"type\":\"string\","
    "\"minLength\":2,\"maxLength\":3},{\"type\":\"null\"},{\"type\":\"number\"},{\"type\":"
    "\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}]}}",
    "{\"type\":\"object\",\"properties\":{\"a\":{\"const\":\"x\\\"y\"},\"b\":{\"type\":"
    "[\"integer\",\"null\"],\"minimum\":1000,\"maximum\":1000000},\"c\":{\"type\":\"object\","
    "\"properties\":{},\"additionalProperties\":false},\"d\":true},\"required\":[\"b\",\"d\"]}",
    "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"p\":{\"type\":"
    "\"number\",\"minimum\":0,\"maximum\":1},\"t\":{\"type\":\"number\",\"exclusiveMinimum\":"
    "-40.5,\"exclusiveMaximum\":-2},\"big\":{\"type\":[\"number\",\"null\"],\"minimum\":1e6}},"
    "\"required\":[\"p\",\"t\",\"big\"]}}",
    "{\"$defs\":{\"shape\":{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"kind\":{\"const\":"
    "\"circle\"},\"r\":{\"type\":\"number\",\"exclusiveMinimum\":0,\"maximum\":10}},\"required\":"
    "[\"kind\",\"r\"]},{\"type\":\"object\",\"properties\":{\"kind\":{\"enum\":[\"group\",\"g\"]},"
    "\"of\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/shape\"},\"maxItems\":2}},"
    "\"required\":[\"kind\",\"of\"]},{\"type\":\"string\",\"maxLength\":2}]}},\"type\":\"array\","
    "\"items\":{\"$ref\":\"#/$defs/shape\"}}",
    "{\"$defs\":{\"A\":{\"properties\":{\"n\":{\"enum\":[1,2.5,\"z\"],\"type\":\"integer\"},"
    "\"t\":{\"const\":\"a\",\"type\":\"string\"}},\"required\":[\"n\",\"t\"],\"type\":"
    "\"object\"},\"B\":{\"properties\":{\"t\":{\"enum\":[\"b\",\"bb\"],\"type\":\"string\"},"
    "\"o\":{\"anyOf\":[{\"$ref\":\"#/$defs/A\"},{\"type\":\"null\"}]}},\"required\":[\"t\"],"
    "\"type\":\"object\"}},\"type\":\"array\",\"items\":{\"oneOf\":[{\"$ref\":\"#/$defs/A\"},"
    "{\"$ref\":\"#/$defs/B\"}],\"discriminator\":{\"propertyName\":\"t\"}}}",
    "{\"type\":\"array\",\"maxItems\":3,\"items\":{\"type\":\"array\",\"prefixItems\":"
    "[{\"type\":\"integer\",\"minimum\":-5,\"maximum\":5},{\"enum\":[\"a\",\"b\"]},"
    "{\"type\":\"array\",\"items\":[{\"type\":\"boolean\"}],\"additionalItems\":false}],"
    "\"items\":{\"type\":\"string\",\"maxLength\":3},\"minItems\":2}}",
    "{\"type\":\"object\",\"properties\":{\"code\":{\"type\":\"string\",\"pattern\":"
    "\"^([A-Z]{2,3}|x\\\\d*)-[a-c\\\"\u00e9\\\\n]{1,3}$\"},\"free\":{\"type\":\"string\",\"pattern\":"
    "\"ab\",\"minLength\":3,\"maxLength\":5},\"when\":{\"type\":\"string\",\"format\":"
    "\"date-time\"},\"d\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"format\":"
    "\"date\"},\"maxItems\":3},\"t\":{\"type\":[\"string\",\"null\"],\"format\":\"time\"},"
    "\"u\":{\"type\":\"string\",\"format\":\"uuid\"},\"ip\":{\"type\":\"string\","
    "\"format\":\"ipv4\"}},\"required\":[\"code\",\"free\",\"when\"]}",
    "{\"type\":\"object\"}",
};

/* Random walks over allowed bytes: never a state that allows nothing before the
 * document is whole, and every whole one valid by json-c and the validator above. */
static void random_walks_end_valid(void)
{
#ifdef TEST_SANITIZED
    const int walks = 40;
#else
    const int walks = 400;
#endif
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    test_random_seed(&rng);
    enum { CAP = 6000 };
    static char doc[CAP + 1];
    int completed = 0, total = 0;
    for (size_t si = 0; si < sizeof walk_schemas / sizeof *walk_schemas; si++) {
        jsonschema *s = compile_or_fail(walk_schemas[si]);
        if (!s)
            return;
        json_object *sch = json_tokener_parse(walk_schemas[si]);
        for (int w = 0; w < walks; w++, total++) {
            jsonmask_state st;
            jsonmask_init_schema(&st, s);
            size_t len = 0;
            bool ok[256];
            while (!jsonmask_complete(&st) && len < CAP) {
                int n = next_bytes(&st, ok);
                if (n == 0) {
                    CHECK_MSG(false, "schema %s: nothing may follow '%.*s'", walk_schemas[si],
                              (int)len, doc);
                    break;
                }
                uint8_t c = pick_byte(ok, n, &rng);
                CHECK(jsonmask_feed(&st, &c, 1));
                doc[len++] = (char)c;
            }
            doc[len] = '\0';
            if (!jsonmask_complete(&st))
                continue;
            completed++;
            json_tokener *tk = json_tokener_new();
            json_tokener_set_flags(tk, JSON_TOKENER_STRICT);
            json_object *v = json_tokener_parse_ex(tk, doc, (int)len);
            bool parsed = v && json_tokener_get_parse_end(tk) == len;
            json_tokener_free(tk);
            CHECK_MSG(parsed, "'%s' is not JSON to json-c", doc);
            CHECK_MSG(!parsed || valid(v, sch, sch), "schema %s: '%s' is not valid",
                      walk_schemas[si], doc);
            json_object_put(v);
        }
        json_object_put(sch);
        jsonschema_free(s);
    }
    printf("       %d of %d walks completed a document\n", completed, total);
    CHECK(completed * 10 >= total * 9);
}

int main(void)
{
    RUN(refusals_name_the_keyword);
    RUN(annotations_are_taken);
    RUN(objects_follow_their_properties);
    RUN(arrays_count_their_items);
    RUN(tuples_type_each_item);
    RUN(patterns_and_formats);
    RUN(patterns_share_one_budget);
    RUN(strings_count_characters);
    RUN(integers_keep_their_bounds);
    RUN(numbers_keep_their_bounds);
    RUN(enums_and_consts);
    RUN(unions_choose_by_first_byte);
    RUN(tagged_unions_choose_by_their_tag);
    RUN(references_and_recursion);
    RUN(random_walks_end_valid);
    return test_finish();
}
