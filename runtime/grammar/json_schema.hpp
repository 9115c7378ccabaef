// JSON Schema to grammar: the rules that produce exactly the JSON texts valid under a schema,
// as Tandem reads one, in the forms listed below.
//
// Honoured: `type` (each, and unions), `properties`, `required`, `additionalProperties`,
// `enum`, `const`, `anyOf`/`oneOf`, `allOf` (object schemas merged), `$ref` to `#/$defs/...`
// and `#/definitions/...` (recursion included), `items`, `prefixItems`, `minItems`,
// `maxItems`, string `minLength`/`maxLength`/`pattern`/`format` (date, time, date-time,
// uuid, email, ipv4), integer and number `minimum`/`maximum` (and the exclusive forms),
// `nullable`; annotations (`title`, `description`, `$schema`, `$id`, `examples`, `default`,
// `$comment`, `deprecated`, `readOnly`, `writeOnly`) are accepted and change nothing. Any
// other keyword is a grammar_error naming it and its JSON pointer.
//
// Tandem's reading, where JSON Schema leaves room or a generator needs one:
// - Properties come in the order the schema object lists them (the schema is read as an
//   ordered_json, so as the client wrote it), then required names it does not list, in
//   `required`'s order; merged schemas (allOf, $ref siblings) list the first side's first.
//   Required ones must appear.
// - additionalProperties false: none; true or a schema: keys that are none of the listed names
//   (however escaped), anywhere between them. Absent: none when the schema lists `properties`
//   (OpenAI's strict mode and llama.cpp do the same; JSON Schema would allow any), any when it
//   lists none. A required name not in `properties` takes additionalProperties' schema.
// - Without `type`, the types the keywords are about (object for `properties`, string for
//   `minLength`, ...); every type when there are none.
// - oneOf is anyOf: exclusivity is not enforced. allOf, and keywords beside a $ref, merge into
//   one schema (properties and required joined, any other keyword on two sides must agree);
//   keywords beside anyOf/oneOf merge into each branch.
// - $ref: JSON pointers into this document ("#", "#/$defs/a~1b" with ~0 ~1 escapes).
// - enum and const values are written as nlohmann writes them (object keys in the schema's
//   order), whitespace allowed between tokens; beside them only `type` (which filters them)
//   and annotations.
// - Numbers have at most 15 integer, 20 fraction and 2 exponent digits. Integers are plain
//   digits (not 1.0 or 1e3), never -0. Bounded numbers have no exponent and no -0, and meet
//   their bounds exactly in decimal, a bound read as the shortest decimal of its double.
// - String characters are raw or escaped in any JSON way; lengths count code points (an
//   escape, or a surrogate pair, is one). pattern and format strings write characters as
//   regex.hpp does, and combine with neither lengths nor each other. Formats: date (month
//   01-12, day 01-31), time (RFC 3339: offset required, leap second, 1-9 fraction digits),
//   date-time, uuid, email (dot-atom local part, hostname labels), ipv4.
// - A false schema forbids its property, ends an array before its prefix item or items, drops
//   its anyOf branch; anywhere else it is an error, as are bounds no value meets.
#pragma once

#include "runtime/grammar/grammar.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>

namespace tandem::grammar {

struct json_options {
    // Whitespace between tokens is bounded (a model at temperature 1 must not be able to fill
    // max_tokens with it): at most this many of space, \n, \t at each place JSON allows it,
    // none before or after the value.
    int32_t max_ws = 4;
};

// The rule for a JSON value valid under `schema`; its rules are added to b.
rule_id add_json_schema(builder& b, const nlohmann::ordered_json& schema, const json_options& opt = {});
// The rule for any JSON object (response_format json_object).
rule_id add_json_object(builder& b, const json_options& opt = {});

} // namespace tandem::grammar
