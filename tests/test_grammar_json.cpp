// JSON Schema to grammar: generated schemas against an independent validator (valid instances
// match, invalid ones do not), each unsupported keyword's error, integer and number bounds
// exhaustively on small ranges, formats, strings and keys escape by escape, $ref, any object.
#include "runtime/grammar/json_schema.hpp"

#include "runtime/grammar/reference.hpp"
#include "tests/json_schema_check.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <string>
#include <vector>

using namespace tandem::grammar;
using namespace tandem::schema_check;

namespace {

compiled compile(const json& schema, const json_options& opt = {}) {
    builder b;
    const rule_id root = add_json_schema(b, schema, opt);
    return b.build(root);
}

std::string error_of(const json& schema) {
    try {
        compile(schema);
    } catch (const grammar_error& e) {
        return e.what();
    }
    return "no error";
}

// Texts and whether the schema's grammar must accept each.
void check_texts(const json& schema, const std::vector<std::pair<std::string, bool>>& texts) {
    const compiled g = compile(schema);
    const std::string s = schema.dump();
    CAPTURE(s);
    for (const auto& t : texts) { // no structured binding: clang 14 cannot CAPTURE one
        CAPTURE(t.first);
        CHECK(matches(g, t.first) == t.second);
    }
}

} // namespace

TEST_CASE("generated schemas: valid instances match, invalid ones do not") {
    int n_valid = 0, n_invalid = 0, n_valid_mutants = 0, n_valid_mutants_matched = 0;
    for (uint64_t seed = 1; seed <= 300; ++seed) {
        const json schema = schema_generator(seed).root();
        const std::string schema_text = schema.dump();
        CAPTURE(schema_text);
        compiled g;
        REQUIRE_NOTHROW(g = compile(schema));
        const validator v(schema);
        instance_generator gen(schema, seed * 7919);
        dice& d = gen.randomness();
        // Patterns accept a character only as JSON writes it (regex.hpp), so no \u00e9 for é there.
        const bool escapes_ok = schema_text.find("\"pattern\"") == std::string::npos;
        for (int i = 0; i < 6; ++i) {
            const json good = gen.make();
            const std::string good_text = good.dump(), spaced = write(good, d, 4, escapes_ok && d.chance(0.5));
            CAPTURE(good_text);
            CAPTURE(spaced);
            REQUIRE(v.valid(good));
            CHECK(matches(g, good_text));
            CHECK(matches(g, spaced));
            ++n_valid;

            const json bad = mutate(good, d);
            const std::string bad_text = bad.dump(), bad_spaced = write(bad, d, 4, escapes_ok && d.chance(0.5));
            CAPTURE(bad_text);
            if (v.valid(bad)) { // not every mutation breaks the instance
                ++n_valid_mutants;
                n_valid_mutants_matched += matches(g, bad_text);
                continue;
            }
            CHECK_FALSE(matches(g, bad_text));
            CHECK_FALSE(matches(g, bad_spaced));
            ++n_invalid;
        }
    }
    MESSAGE("300 schemas: ", n_valid, " valid instances matched (compact and spaced), ", n_invalid,
            " invalid ones refused; ", n_valid_mutants, " mutants stayed valid, ", n_valid_mutants_matched,
            " of them matched");
}

TEST_CASE("each unsupported keyword is an error naming it and its pointer") {
    const std::vector<std::pair<const char*, const char*>> cases = {
        {R"({"type": "array", "uniqueItems": true})", R"(unsupported JSON Schema keyword "uniqueItems" at the root)"},
        {R"({"properties": {"tags": {"type": "array", "uniqueItems": true}}})",
         R"(unsupported JSON Schema keyword "uniqueItems" at /properties/tags)"},
        {R"({"not": {"type": "null"}})", R"(unsupported JSON Schema keyword "not" at the root)"},
        {R"({"if": {}, "then": {}})", R"(unsupported JSON Schema keyword "if" at the root)"},
        {R"({"type": "object", "patternProperties": {"^x": {}}})",
         R"(unsupported JSON Schema keyword "patternProperties" at the root)"},
        {R"({"items": {"multipleOf": 2}})", R"(unsupported JSON Schema keyword "multipleOf" at /items)"},
        {R"({"anyOf": [{}, {"minProperties": 1}]})", R"(unsupported JSON Schema keyword "minProperties" at /anyOf/1)"},
        {R"({"allOf": [{"dependentRequired": {}}]})",
         R"(unsupported JSON Schema keyword "dependentRequired" at /allOf/0)"},
        {R"({"prefixItems": [{"contains": {}}]})", R"(unsupported JSON Schema keyword "contains" at /prefixItems/0)"},
        {R"({"additionalProperties": {"propertyNames": {}}})",
         R"(unsupported JSON Schema keyword "propertyNames" at /additionalProperties)"},
        {R"({"properties": {"a/b~": {"unevaluatedProperties": false}}})",
         R"(unsupported JSON Schema keyword "unevaluatedProperties" at /properties/a~1b~0)"},
        {R"({"$defs": {"x": {"$dynamicRef": "#y"}}, "$ref": "#/$defs/x"})",
         R"(unsupported JSON Schema keyword "$dynamicRef" at /$defs/x)"},
        {R"({"type": "string", "contentEncoding": "base64"})",
         R"(unsupported JSON Schema keyword "contentEncoding" at the root)"},
        {R"({"type": "string", "format": "hostname"})", R"(unsupported "format" "hostname" at the root)"},
        {R"({"properties": {"a": {"$ref": "https://example.com/s.json"}}})",
         R"(unsupported $ref "https://example.com/s.json" at /properties/a: only JSON pointers into this schema ("#/...") are)"},
        {R"({"$ref": "#anchor"})", R"(unsupported $ref "#anchor" at the root: only JSON pointers into this schema ("#/...") are)"},
    };
    for (const auto& c : cases) {
        CAPTURE(c.first);
        CHECK(error_of(json::parse(c.first)) == c.second);
    }
}

TEST_CASE("malformed keyword values and empty schemas are errors with the pointer") {
    const std::vector<std::pair<const char*, const char*>> cases = {
        {R"({"type": "string", "minLength": "x"})", R"("minLength" at the root must be a non-negative integer)"},
        {R"({"properties": {"s": {"maxLength": -1}}})", R"("maxLength" at /properties/s must be a non-negative integer)"},
        {R"({"properties": []})", R"("properties" at the root must be an object)"},
        {R"({"type": "strin"})", R"("type" at the root must be a type name or an array of them)"},
        {R"({"type": "object", "required": "a"})", R"("required" at the root must be an array of strings)"},
        {R"({"items": [{}]})", R"("items" at the root must be a schema (a tuple is "prefixItems"))"},
        {R"({"minimum": "3"})", R"("minimum" at the root must be a number)"},
        {R"({"enum": 3})", R"("enum" at the root must be an array)"},
        {R"({"pattern": 3})", R"("pattern" at the root must be a string)"},
        {R"({"nullable": "yes"})", R"("nullable" at the root must be a boolean)"},
        {R"({"$ref": 5})", R"("$ref" at the root must be a string)"},
        {R"({"properties": {"a": {"$ref": "#/$defs/nope"}}})", R"($ref "#/$defs/nope" at /properties/a points at no schema)"},
        {R"({"$ref": "#/$defs/~2"})", R"($ref "#/$defs/~2" at the root points at no schema)"},
        {"false", "schema at the root is false: no value is valid"},
        {R"({"type": "object", "properties": {"a": false}, "required": ["a"]})",
         R"(required property "a" at the root is false)"},
        {R"({"type": "object", "properties": {}, "required": ["a"]})",
         R"(required property "a" at the root is neither in "properties" nor allowed by additionalProperties)"},
        {R"({"type": "integer", "minimum": 5, "maximum": 4})", "no integer is valid at the root: the bounds exclude all"},
        {R"({"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1})",
         "no number is valid at the root: the bounds exclude all"},
        {R"({"type": "string", "minLength": 3, "maxLength": 2})",
         "no string is valid at the root: maxLength is below minLength"},
        {R"({"type": "string", "pattern": "a", "maxLength": 2})",
         R"("pattern" with "minLength/maxLength" at the root is not supported)"},
        {R"({"type": "string", "format": "date", "pattern": "a"})", R"("pattern" with "format" at the root is not supported)"},
        {R"({"enum": ["a"], "maxLength": 2})", R"("maxLength" beside "enum" or "const" at the root is not supported)"},
        {R"({"enum": [1, 2], "type": "string"})", R"(no value is valid under "enum"/"const" at the root)"},
        {R"({"allOf": [{"type": "string"}, {"type": "integer"}]})",
         R"(conflicting "type" when merging allOf/anyOf at the root)"},
        {R"({"allOf": [{"properties": {"a": {"type": "string"}}}, {"properties": {"a": {}}}]})",
         R"(conflicting schemas for property "a" when merging allOf/anyOf at the root)"},
        {R"({"type": "array", "items": false, "minItems": 1})",
         "no array is valid at the root: minItems is above what the items allow"},
        {R"({"type": "integer", "exclusiveMinimum": true})", R"("exclusiveMinimum" at the root is true without "minimum")"},
    };
    for (const auto& c : cases) {
        CAPTURE(c.first);
        CHECK(error_of(json::parse(c.first)) == c.second);
    }
    CHECK(error_of(json::parse(R"x({"type": "string", "pattern": "(?=x)"})x")).starts_with(R"("pattern" at the root: )"));
}

TEST_CASE("integer bounds: every integer in [-120, 120] against many bounds") {
    std::vector<json> schemas = {
        json::parse(R"({"type": "integer"})"),
        json::parse(R"({"type": "integer", "minimum": 0})"),
        json::parse(R"({"type": "integer", "maximum": 0})"),
        json::parse(R"({"type": "integer", "exclusiveMaximum": 0})"),
        json::parse(R"({"type": "integer", "minimum": -7, "maximum": 42})"),
        json::parse(R"({"type": "integer", "exclusiveMinimum": -1, "exclusiveMaximum": 100})"),
        json::parse(R"({"type": "integer", "minimum": 1.5, "maximum": 99.5})"),
        json::parse(R"({"type": "integer", "minimum": -100, "maximum": -3})"),
        json::parse(R"({"type": "integer", "minimum": 10, "maximum": 10})"),
        json::parse(R"({"type": "integer", "minimum": 5, "exclusiveMinimum": true, "maximum": 9, "exclusiveMaximum": true})"),
        json::parse(R"({"type": "integer", "minimum": -0.5, "maximum": 0.5})"),
        json::parse(R"({"type": "integer", "minimum": 3, "exclusiveMinimum": 3})"),
        json::parse(R"({"type": "integer", "minimum": -1e300, "maximum": 1e300})"),
    };
    dice d(7);
    for (int i = 0; i < 150; ++i) { // random bounds, some fractional, some exclusive
        json s = {{"type", "integer"}};
        const auto value = [&]() -> json { return d.chance(0.3) ? json(double(d.between(-600, 600)) / 4) : json(d.between(-150, 150)); };
        if (d.chance(0.8)) s[d.chance(0.5) ? "minimum" : "exclusiveMinimum"] = value();
        if (d.chance(0.8)) s[d.chance(0.5) ? "maximum" : "exclusiveMaximum"] = value();
        schemas.push_back(s);
    }
    int n_checked = 0;
    for (const json& s : schemas) {
        const std::string text = s.dump();
        CAPTURE(text);
        const validator v(s);
        bool any = false;
        for (int64_t x = -200; x <= 200; ++x) any = any || v.valid(json(x));
        if (!any) { // bounds that exclude every integer there, and so everywhere: all are within 150
            CHECK(error_of(s) == "no integer is valid at the root: the bounds exclude all");
            continue;
        }
        const compiled g = compile(s);
        for (int64_t x = -120; x <= 120; ++x) {
            CAPTURE(x);
            CHECK(matches(g, std::to_string(x)) == v.valid(json(x)));
        }
        for (const char* odd : {"-0", "007", "+3", "1.0", "1e2", "01", "- 1", ""}) {
            CAPTURE(odd);
            CHECK_FALSE(matches(g, odd));
        }
        ++n_checked;
    }
    MESSAGE(n_checked, " integer bound sets checked on every integer in [-120, 120]");
    check_texts(json::parse(R"({"type": "integer"})"),
                {{"999999999999999", true}, {"-999999999999999", true}, {"1000000000000000", false}, {"0", true}});
    check_texts(json::parse(R"({"type": "integer", "minimum": 999999999999990})"),
                {{"999999999999990", true}, {"999999999999999", true}, {"999999999999989", false}, {"1000000000000000", false}});
}

TEST_CASE("number bounds: decimals on a grid, exactly, including fractional bounds") {
    const std::vector<const char*> bounds = {
        R"({"minimum": 0})",
        R"({"exclusiveMinimum": 0})",
        R"({"maximum": -0.01})",
        R"({"minimum": -1.15, "exclusiveMaximum": 2.3})",
        R"({"exclusiveMinimum": 0.1, "maximum": 0.35})",
        R"({"minimum": 1.25, "maximum": 1.25})",
        R"({"minimum": -3, "maximum": 3})",
        R"({"exclusiveMinimum": -2.5, "exclusiveMaximum": -0.75})",
        R"({"minimum": 0.001, "maximum": 4.999})",
        R"({"minimum": -0.0, "maximum": 0.0})",
        R"({"minimum": 1, "exclusiveMinimum": true, "maximum": 2})",
    };
    for (const char* b : bounds) {
        json s = json::parse(b);
        s["type"] = "number";
        const std::string text = s.dump();
        CAPTURE(text);
        const validator v(s);
        const compiled g = compile(s);
        for (int k = -520; k <= 520; ++k) { // k/100 as "1.5", "1.50", "-0.05"; integers also as "2" and "2.0"
            const double x = k / 100.0;
            std::vector<std::string> forms = {fmt::format("{:.2f}", x), fmt::format("{:.3f}", x), json(x).dump()};
            if (k % 100 == 0) forms.push_back(std::to_string(k / 100));
            for (const std::string& t : forms) {
                if (t.starts_with("-0") && k == 0) continue; // -0 is valid JSON but never produced
                CAPTURE(t);
                CHECK(matches(g, t) == v.valid(json::parse(t)));
            }
        }
        for (const char* odd : {"-0", "-0.0", "+1", "1.", ".5", "01.5", "1e0", "1.5E-1"}) {
            CAPTURE(odd);
            CHECK_FALSE(matches(g, odd)); // bounded numbers are written without exponent
        }
    }
    check_texts(json::parse(R"({"type": "number"})"),
                {{"0", true}, {"-0.5", true}, {"1e+99", true}, {"1e+300", false}, {"1.25E-7", true}, {"0.30000000000000004", true},
                 {"123456789012345.5", true}, {"1234567890123456", false}, {"1e1000", false}, {"01", false},
                 {"1.", false}, {"-", false}, {"0.12345678901234567890", true}, {"0.123456789012345678901", false}});
    check_texts(json::parse(R"({"type": "number", "exclusiveMinimum": 0, "maximum": 1e-18})"),
                {{"0.000000000000000001", true}, {"0.00000000000000000099", true}, {"0.0000000000000000011", false},
                 {"0.00000000000000000000", false}, {"0", false}});
    check_texts(json::parse(R"({"type": "number", "minimum": -1e300})"),
                {{"-999999999999999.5", true}, {"5", true}, {"-1e5", false}});
}

TEST_CASE("formats accept what they define and refuse near misses") {
    const std::vector<std::tuple<const char*, std::vector<const char*>, std::vector<const char*>>> cases = {
        {"date", {"2024-02-29", "0000-12-31", "1999-01-01"}, {"2024-13-01", "2024-00-10", "2024-01-32", "24-01-01", "2024-1-01", "2024-01-01T"}},
        {"time", {"23:59:60Z", "00:00:00z", "12:30:45.123+05:30", "01:02:03-23:59", "10:00:00.123456789Z"},
         {"24:00:00Z", "12:60:00Z", "12:00:61Z", "12:00:00", "12:00:00+5:30", "12:00:00.Z", "12:00:00.1234567890Z"}},
        {"date-time", {"2024-05-06T07:08:09Z", "2024-05-06t07:08:09.5+01:00"}, {"2024-05-06 07:08:09Z", "2024-05-06T07:08Z"}},
        {"uuid", {"123e4567-e89b-12d3-a456-426614174000", "ABCDEF01-2345-6789-abcd-ef0123456789"},
         {"123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g", "123e4567-e89b-12d3-a456-4266141740000"}},
        {"email", {"a@b.co", "first.last+tag@mail.example.org", "x@localhost", "o'neil/x=y@a-b.c"},
         {"@b.co", "a@", "a@@b.co", "a..b@c.d", "a@-b.co", "a@b-.co", "a b@c.d", ".a@b.c"}},
        {"ipv4", {"0.0.0.0", "255.255.255.255", "192.168.1.10"}, {"256.1.1.1", "1.1.1", "01.1.1.1", "1.1.1.1.1", "1.1.1.a"}},
    };
    for (const auto& [format, good, bad] : cases) {
        const json s = {{"type", "string"}, {"format", format}};
        std::vector<std::pair<std::string, bool>> texts;
        for (const char* t : good) {
            CHECK(has_format(format, t)); // the test's own checker agrees with the examples
            texts.push_back({json(t).dump(), true});
        }
        for (const char* t : bad) {
            CHECK_FALSE(has_format(format, t));
            texts.push_back({json(t).dump(), false});
        }
        check_texts(s, texts);
    }
}

TEST_CASE("strings: escapes, and lengths in code points however they are written") {
    check_texts(json::parse(R"({"type": "string"})"),
                {{R"("")", true}, {R"("a\"b\\c\/d\b\f\n\r\t")", true}, {R"("\u00e9\u00E9\uD83D\uDE00")", true},
                 {"\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"", true}, {"\"\x7f\"", true},
                 {"\"a\nb\"", false}, {"\"\x01\"", false}, {R"("\x41")", false}, {R"("\u12")", false},
                 {R"("\ud800")", false}, {R"("\udc00\ud800")", false}, {R"("a)", false}, {R"("a"")", false}});
    check_texts(json::parse(R"({"type": "string", "minLength": 1, "maxLength": 1})"),
                {{"\"\xf0\x9f\x98\x80\"", true}, {R"("\ud83d\ude00")", true}, {R"("\n")", true}, {R"("\u0041")", true},
                 {R"("")", false}, {R"("ab")", false}, {R"("\ud83d")", false}, {"\"\xc3\xa9\xc3\xa9\"", false}});
    check_texts(json::parse(R"({"type": "string", "pattern": "^[a-z]+$"})"),
                {{R"("abc")", true}, {R"("aBc")", false}, {R"("")", false}});
    check_texts(json::parse(R"x({"type": "string", "pattern": "^a\"b\\\\$"})x"), {{R"("a\"b\\")", true}, {R"("a\"b")", false}});
    check_texts(json::parse(R"({"type": "string", "pattern": "b"})"), {{R"("abc")", true}, {R"("b")", true}, {R"("ac")", false}});
}

TEST_CASE("objects: the schema's order, required, and additional keys that are none of the names") {
    const json s = json::parse(R"({"type": "object", "properties": {"a": {"type": "string"}, "ab": {"type": "null"},
        "\u00e9": {"type": "boolean"}, "x\"y": {"const": 1}}, "required": ["ab"],
        "additionalProperties": {"type": "integer"}})");
    check_texts(s, {
        {R"({"ab":null})", true},
        {R"({"a":"s","ab":null,"é":true,"x\"y":1})", true}, // as the schema lists them
        {R"({"a":"s","ab":null,"x\"y":1,"é":true})", false},
        {R"({"ab":null,"a":"s"})", false},   // listed names in order
        {R"({"a":"s"})", false},             // ab is required
        {R"({"b":1,"ab":null,"abc":2})", true},
        {R"({"":0,"ab":null})", true},
        {R"({"ab":null,"a":1})", false},     // a is listed: a string, not an extra integer
        {R"({"ab":null,"\u0061":1})", false}, // a written with an escape is still a
        {R"({"ab":null,"\u00e9":1})", false},
        {R"({"ab":null,"\u00E9x":1})", true},
        {R"({"ab":null,"x\u0022y":1})", false},
        {R"({"ab":null,"x\"":1,"x\"yz":2})", true},
        {R"({"ab":null,"b":"s"})", false},   // extras are integers
        {R"({ "ab" : null , "z" : 1 })", true},
    });
    check_texts(json::parse(R"({"properties": {"中": {"type": "null"}, "😀": {"type": "null"}}, "additionalProperties": true})"),
                {{R"({"\u4e2d":1})", false}, {R"({"\ud83d\ude00":1})", false}, {R"({"\ud83d\ude01":1})", true},
                 {R"({"\u4E2Dx":1})", true}, {"{\"\xf0\x9f\x98\x80\":null}", true}, {"{\"\xf0\x9f\x98\x80\":1}", false}});
    check_texts(json::parse(R"({"type": "object", "properties": {"a": {}, "b": {}}})"),
                {{"{}", true}, {R"({"b":1})", true}, {R"({"a":1,"b":2})", true}, {R"({"c":1})", false}}); // absent: none
    check_texts(json::parse(R"({"type": "object", "properties": {"a": false}, "additionalProperties": true})"),
                {{"{}", true}, {R"({"a":1})", false}, {R"({"b":[1]})", true}});
    check_texts(json::parse(R"({"type": "object"})"), {{"{}", true}, {R"({"k":{"n":[1,"x",null]}})", true}});
    check_texts(json::parse(R"({"required": ["k"], "additionalProperties": {"type": "string"}})"),
                {{R"({"k":"v"})", true}, {R"({"a":"b","k":"v","z":""})", true}, {R"({"k":1})", false}, {"{}", false}});
}

TEST_CASE("arrays: prefixItems, items, counts") {
    check_texts(json::parse(R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false})"),
                {{"[]", true}, {"[1]", true}, {R"([1,"a"])", true}, {R"([1,"a",2])", false}, {R"(["a"])", false}});
    check_texts(json::parse(R"({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "null"},
                                "minItems": 2, "maxItems": 3})"),
                {{"[1,null]", true}, {"[1,null,null]", true}, {"[1]", false}, {"[1,null,null,null]", false}, {"[null,null]", false}});
    check_texts(json::parse(R"({"type": "array", "prefixItems": [{}, false, {}]})"), {{"[1]", true}, {"[1,2]", false}});
    check_texts(json::parse(R"({"type": "array", "maxItems": 0})"), {{"[]", true}, {"[ ]", true}, {"[1]", false}});
}

TEST_CASE("combinators: allOf merged, anyOf with its siblings, oneOf as anyOf, enum and const with whitespace") {
    check_texts(json::parse(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                          {"properties": {"b": {"type": "string"}}, "required": ["b"]}]})"),
                {{R"({"a":1,"b":"x"})", true}, {R"({"a":1})", false}, {R"({"a":1,"b":"x","c":2})", false}});
    check_texts(json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
                                "anyOf": [{"required": ["a"]}, {"required": ["b"]}]})"),
                {{R"({"a":1})", true}, {R"({"b":"x"})", true}, {R"({"a":1,"b":"x"})", true}, {"{}", false}});
    // Exclusivity is not enforced: 2 is valid under both branches, so JSON Schema refuses it.
    check_texts(json::parse(R"({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]})"),
                {{"2", true}, {"-2", true}, {"0.5", true}, {"-0.5", false}});
    check_texts(json::parse(R"({"type": ["string", "null"], "nullable": true, "maxLength": 1})"),
                {{"null", true}, {R"("a")", true}, {R"("ab")", false}});
    check_texts(json::parse(R"({"type": "integer", "nullable": true})"), {{"null", true}, {"3", true}, {"true", false}});
    check_texts(json::parse(R"({"enum": [{"k": [1, "x"]}, "a\"b", 2.5, null]})"),
                {{R"({ "k" : [ 1 , "x" ] })", true}, {R"({"k":[1,"x"]})", true}, {R"("a\"b")", true}, {"2.5", true},
                 {"null", true}, {R"({"k":[1]})", false}, {"2.50", false}});
    check_texts(json::parse(R"({"const": {"b": [], "a": {}}})"), {{R"({"b":[],"a":{}})", true}, {R"({"a":{},"b":[]})", false}});
    check_texts(json::parse(R"({"minLength": 2})"), {{R"("ab")", true}, {R"("a")", false}, {"3", false}}); // typed by keywords
    check_texts(json::parse("true"), {{"[1,{\"a\":null}]", true}, {"\"s\"", true}, {"nul", false}});
}

TEST_CASE("$ref: $defs and definitions, pointer escapes, the root, recursion") {
    const json list = json::parse(R"({"$defs": {"a/b~c": {"type": "integer"},
        "node": {"type": "object", "properties": {"v": {"$ref": "#/$defs/a~1b~0c"}, "next": {"$ref": "#/$defs/node"}},
                 "required": ["v"]}}, "$ref": "#/$defs/node"})");
    check_texts(list, {{R"({"v":1})", true}, {R"({"v":1,"next":{"v":2,"next":{"v":3}}})", true},
                       {R"({"v":1,"next":{"v":2,"next":{"v":"x"}}})", false}, {R"({"v":1,"next":{}})", false}});
    check_texts(json::parse(R"({"definitions": {"x": {"enum": [1]}}, "type": "array", "items": {"anyOf": [{"$ref": "#"},
                                {"$ref": "#/definitions/x"}]}})"),
                {{"[]", true}, {"[1,[],[[1]]]", true}, {"[2]", false}});
    check_texts(json::parse(R"({"$defs": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/s", "maxLength": 1}}})"),
                {{R"({"a":"x"})", true}, {R"({"a":"xy"})", false}}); // siblings of $ref apply with it
}

TEST_CASE("whitespace is bounded by max_ws") {
    const json s = json::parse(R"({"type": "object", "properties": {"a": {"type": "array"}}})");
    const compiled g4 = compile(s), g0 = compile(s, {.max_ws = 0});
    CHECK(matches(g4, "{ \"a\" :\t[ 1 ,\n2 ] }"));
    CHECK(matches(g4, "{    \"a\":[]}"));
    CHECK_FALSE(matches(g4, "{     \"a\":[]}"));
    CHECK_FALSE(matches(g4, "{\"a\":[1,     2]}"));
    CHECK_FALSE(matches(g4, "{\r\"a\":[]}"));
    CHECK(matches(g0, "{\"a\":[1,2]}"));
    CHECK_FALSE(matches(g0, "{ \"a\":[1,2]}"));
}

TEST_CASE("add_json_object: any object, nothing else") {
    builder b;
    const compiled g = b.build(add_json_object(b));
    for (const char* ok : {"{}", "{ }", R"({"a":[1,{"b":null}],"c":"d","e":-1.5e3})", R"({"":{"":{"":[]}}})"})
        CHECK(matches(g, ok));
    for (const char* bad : {"[]", "1", "\"{}\"", R"({"a":})", R"({"a" 1})", R"({a:1})", R"({"a":1,})", "{"})
        CHECK_FALSE(matches(g, bad));
}

TEST_CASE("a 100-property schema compiles") {
    json props = json::object();
    json required = json::array();
    for (int i = 0; i < 100; ++i) {
        const std::string name = fmt::format("field_{:03}", i);
        props[name] = i % 3 == 0 ? json{{"type", "string"}, {"maxLength", 20}}
                    : i % 3 == 1 ? json{{"type", "integer"}, {"minimum", -i}, {"maximum", i * 1000}}
                                 : json{{"type", "array"}, {"items", {{"type", "number"}}}};
        if (i % 2 == 0) required.push_back(name);
    }
    const json s = {{"type", "object"}, {"properties", props}, {"required", required}, {"additionalProperties", true}};
    const auto t0 = std::chrono::steady_clock::now();
    compiled g;
    REQUIRE_NOTHROW(g = compile(s));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE(fmt::format("100 properties: compiled in {:.1f} ms, {} rules, {} elements", ms, g.n_rules(), g.elems.size()));
    json instance = json::object();
    for (int i = 0; i < 100; i += 2)
        instance[fmt::format("field_{:03}", i)] = i % 3 == 0 ? json("s") : i % 3 == 1 ? json(i) : json::array({1.5});
    CHECK(matches(g, instance.dump()));
}

TEST_CASE("hostile schemas: exponential merging and deep nesting are refused") {
    json defs = json::object();
    for (int i = 0; i < 40; ++i) { // each def merges the next twice: 2^40 schemas if unchecked
        const json next = {{"$ref", fmt::format("#/$defs/d{}", i + 1)}};
        defs[fmt::format("d{}", i)] = {{"allOf", json::array({next, next})}};
    }
    defs["d40"] = {{"type", "object"}};
    const json wide = {{"$defs", defs}, {"$ref", "#/$defs/d0"}};
    CHECK(error_of(wide).starts_with("$ref/allOf/anyOf merge over 10000 schemas at "));
    json deep = {{"type", "null"}};
    for (int i = 0; i < 300; ++i) deep = {{"type", "array"}, {"items", deep}};
    CHECK(error_of(deep).starts_with("schema nested deeper than 200 at /items/items/"));
}

TEST_CASE("the test validator reads schemas as Tandem does") {
    const auto valid = [](const char* schema, const char* instance) {
        const json s = json::parse(schema);
        return validator(s).valid(json::parse(instance));
    };
    CHECK_FALSE(valid(R"({"properties": {"a": {}}})", R"({"b": 1})"));     // absent additionalProperties
    CHECK(valid(R"({"type": "object"})", R"({"b": 1})"));
    CHECK_FALSE(valid(R"({"minLength": 1})", "3"));                          // typed by its keywords
    CHECK_FALSE(valid(R"({"oneOf": [{"type": "integer"}, {"minimum": 0}]})", "2")); // exclusive
    CHECK(valid(R"({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]})", R"({"a": 1, "b": 2})"));
    CHECK(valid(R"({"type": "string", "maxLength": 1})", "\"\xf0\x9f\x98\x80\""));
    CHECK_FALSE(valid(R"({"type": "integer", "minimum": 1, "exclusiveMinimum": true})", "1"));
    CHECK(valid(R"({"type": "integer"})", "2.0"));
    CHECK_FALSE(valid(R"({"format": "date", "type": "string"})", R"("2024-13-01")"));
    CHECK(valid(R"({"$defs": {"a/b": {"const": 1}}, "$ref": "#/$defs/a~1b"})", "1"));
}
