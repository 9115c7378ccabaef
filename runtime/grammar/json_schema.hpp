// JSON Schema to grammar: the rules whose texts are exactly the JSON texts (as Tandem writes
// them, below) of values valid under a schema, draft-04 to 2020-12, or a grammar_error that
// names what cannot be honoured. docs/guided.md has the user's account.
//
// Semantics are the specification's:
// - The dialect is `$schema`'s (draft-04, -06, -07, 2019-09, 2020-12; 2020-12 without one);
//   keywords the dialect does not define are annotations and change nothing (`id`, `x-...`,
//   `nullable`, `dependencies` after draft-07, ...). In draft-07 and before, the keywords
//   beside `$ref` are ignored.
// - Every keyword the dialects define is enforced exactly, or the schema is refused with a
//   message naming keyword and JSON pointer: `uniqueItems` on arrays of more than one item,
//   `$dynamicRef` to an anchor defined more than once, remote `$ref`, and combinations that
//   pass the size limits. An unsatisfiable schema is refused as such.
// - allOf intersects, anyOf unites, `not` complements, oneOf is a union where the branches
//   exclude each other and otherwise each branch minus the ones it may overlap; if/then/else
//   and the dependencies are the unions they stand for. Strings and number texts are regular
//   languages (automaton.hpp), objects and arrays shapes over subschemas (schema_value.hpp).
// - `format` is enforced for date, time, date-time, duration, email, ipv4, ipv6, uri,
//   uri-reference, uuid, json-pointer and relative-json-pointer (json_text.cpp), an annotation
//   for any other name.
//
// What Tandem writes, where JSON leaves a choice (the valid texts outside it are never
// generated):
// - Whitespace between tokens is bounded (json_options), none before or after the value.
// - Numbers have no exponent where a keyword constrains them, at most 15 integer and 20
//   fraction digits, and no negative zero; unconstrained ones may have an exponent of 2 digits.
// - Printable ASCII in strings is written raw (`\"`, `\\` and `\/` aside); other characters
//   raw or escaped in any JSON way. Lengths count code points.
// - Objects write each name once; with up to 6 names in any order, with more in the schema's
//   order (merged schemas: the first's names first); keys of patternProperties and
//   additionalProperties anywhere between them.
#pragma once

#include "runtime/grammar/grammar.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>

namespace tandem::grammar {

// Whitespace between JSON tokens: at each place JSON allows it, at most one line break (\n or
// \r\n) then at most max_indent spaces or tabs (bounded), or none (compact).
enum class whitespace : uint8_t { bounded, compact };

std::string_view name_of(whitespace w);

struct json_options {
    static constexpr int32_t max_indent = 20;
    whitespace ws = whitespace::bounded;
    // For generation: an object schema that lists properties (or patternProperties, or required
    // names) and says nothing of additionalProperties gets no other keys, as OpenAI's strict
    // mode reads it. Every text is still valid under the schema; off (the specification's
    // reading, and what checking instances needs), such objects may have any other key, which a
    // weak model may fill without end.
    bool closed_objects = false;
};

// The rule for a JSON value valid under `schema`; its rules are added to b.
rule_id add_json_schema(builder& b, const nlohmann::ordered_json& schema, const json_options& opt = {});
// The rule for any JSON object (response_format json_object).
rule_id add_json_object(builder& b, const json_options& opt = {});
// b.build(root, lim), where a grammar that matches nothing is a schema no value satisfies:
// what the schema's parts allow, put together, may turn out to allow nothing.
compiled build_json_schema(const builder& b, rule_id root, const build_limits& lim = {});

} // namespace tandem::grammar
