/*
 * harmonytools.h — a tool as gpt-oss's chat template writes it in the developer turn's
 * "namespace functions": its JSON schema as a TypeScript-like type (the template's
 * macros render_tool_namespace and render_typescript_type, with the white space Jinja's
 * trim_blocks and lstrip_blocks leave, as transformers and llama.cpp apply them):
 *
 *   // Get the weather in a city
 *   type get_weather = (_: {
 *   // The city's name
 *   city: string,
 *   unit?: "c" | "f", // default: c
 *   }) => any;
 *
 * A parameter's type: "string" ("a" | "b" for an enum; "string | null" when nullable),
 * "number" (number and integer), "boolean", "T[]" for an array (any[] without items,
 * and for an item type longer than 50 characters), a union of a type list ("string |
 * number") or of oneOf's variants, a nested object's properties in braces, "any" for
 * anything else (a schema without a type). A parameter not in "required" gets "?"; its
 * description and default come as comments.
 */
#ifndef LLMS_HARMONYTOOLS_H
#define LLMS_HARMONYTOOLS_H

#include <json-c/json.h>

/* tool ({"type": "function", "function": {"name", "description"?, "parameters"?}},
 * checked already) as the template writes it, up to and with the blank line after it.
 * Fresh string, or NULL out of memory. */
char *harmonytools_text(json_object *tool);

#endif
