// JSON Schema to grammar: generated schemas against an independent validator (valid instances
// match, invalid ones do not), refusals and their messages, integer and number bounds and
// multipleOf exhaustively on small ranges, formats, strings and keys escape by escape, objects
// in any order, the applicators (not, oneOf, if, dependencies), dialects and annotations.
#include "runtime/grammar/json_schema.hpp"

#include "runtime/grammar/reference.hpp"
#include "tests/json_schema_check.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

using namespace tandem::grammar;
using namespace tandem::schema_check;

namespace {

compiled compile(const json& schema, const json_options& opt = {}) {
    builder b;
    const rule_id root = add_json_schema(b, schema, opt);
    return build_json_schema(b, root);
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
        for (int i = 0; i < 6; ++i) {
            const json good = gen.make();
            const std::string good_text = good.dump(), spaced = write(good, d, 4, d.chance(0.5));
            CAPTURE(good_text);
            CAPTURE(spaced);
            REQUIRE(v.valid(good));
            CHECK(matches(g, good_text));
            CHECK(matches(g, spaced));
            ++n_valid;

            const json bad = mutate(good, d);
            const std::string bad_text = bad.dump(), bad_spaced = write(bad, d, 4, d.chance(0.5));
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

TEST_CASE("refusals name the keyword and its JSON pointer") {
    const std::vector<std::pair<const char*, const char*>> cases = {
        {R"({"type": "array", "uniqueItems": true})",
         R"("uniqueItems" at the root: items that must differ from each other are not supported)"},
        {R"({"properties": {"tags": {"type": "array", "uniqueItems": true}}})",
         R"("uniqueItems" at /properties/tags: items that must differ from each other are not supported)"},
        {R"({"properties": {"a": {"$ref": "https://example.com/s.json"}}})",
         R"("$ref" "https://example.com/s.json" at /properties/a is a remote reference: only references within the schema are supported)"},
        {R"({"$ref": "other.json#/x"})",
         R"("$ref" "other.json#/x" at the root is a remote reference: only references within the schema are supported)"},
        {R"({"properties": {"a": {"$ref": "#/$defs/nope"}}})", R"("$ref" "#/$defs/nope" at /properties/a points at nothing in the schema)"},
        {R"({"$ref": "#nope"})", R"("$ref" "#nope" at the root: no anchor "nope" in the schema)"},
        {R"({"type": "string", "format": "regex"})",
         R"("format" "regex" at the root is not checked by Tandem (the formats checked are date, time, date-time, duration, email, hostname, ipv4, ipv6, uri, uri-reference, uuid, json-pointer, relative-json-pointer))"},
        {R"({"type": "number", "multipleOf": 0.123456789})",
         R"("multipleOf" 0.123456789 at the root: a divisor of 9 significant digits over 9 decimals is too large to check)"},
        {R"({"$schema": "http://json-schema.org/draft-03/schema#"})",
         R"("$schema" "http://json-schema.org/draft-03/schema#": drafts before draft-04 are not supported)"},
        {R"({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})",
         "the schema at /$defs/a refers to itself (through $ref, allOf, anyOf, oneOf, not or if) before any object or "
         "array: no value can be checked against it"},
        {R"({"$defs": {"a": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}}, "$ref": "#/$defs/a", "type": "object"})",
         "the schema at the root refers to itself (through $ref, allOf, anyOf, oneOf, not or if) before any object or "
         "array: no value can be checked against it"},
    };
    for (const auto& c : cases) {
        CAPTURE(c.first);
        CHECK(error_of(json::parse(c.first)) == c.second);
    }
    CHECK(error_of(json::parse(R"x({"type": "string", "pattern": "(?=x)"})x")).starts_with(R"("pattern" at the root: )"));
}

TEST_CASE("malformed keyword values are errors with the pointer; unsatisfiable schemas say so") {
    const std::vector<std::pair<const char*, const char*>> cases = {
        {R"({"type": "string", "minLength": "x"})", R"("minLength" at the root must be a non-negative integer)"},
        {R"({"properties": {"s": {"maxLength": -1}}})", R"("maxLength" at /properties/s must be a non-negative integer)"},
        {R"({"properties": []})", R"("properties" at the root must be an object of schemas)"},
        {R"({"type": "strin"})", R"("type" at the root must be a type name (null, boolean, object, array, number, string, integer) or an array of them, not "strin")"},
        {R"({"type": "object", "required": "a"})", R"("required" at the root must be an array of strings)"},
        {R"({"minimum": "3"})", R"("minimum" at the root must be a number)"},
        {R"({"enum": 3})", R"("enum" at the root must be an array)"},
        {R"({"pattern": 3})", R"("pattern" at the root must be a string)"},
        {R"({"$ref": 5})", R"("$ref" at the root must be a string)"},
        {R"({"anyOf": []})", R"("anyOf" at the root must be a non-empty array of schemas)"},
        {R"({"type": "integer", "exclusiveMinimum": true})", R"("exclusiveMinimum" at the root must be a number)"},
        {R"({"multipleOf": 0})", R"("multipleOf" at the root must be greater than 0)"},
    };
    for (const auto& c : cases) {
        CAPTURE(c.first);
        CHECK(error_of(json::parse(c.first)) == c.second);
    }
    const std::string unsat = "the schema is unsatisfiable: no JSON value is valid under it";
    for (const char* s : {"false", R"({"not": {}})", R"({"type": "integer", "minimum": 5, "maximum": 4})",
                          R"({"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 1})",
                          R"({"type": "string", "minLength": 3, "maxLength": 2})", R"({"enum": [1, 2], "type": "string"})",
                          R"({"allOf": [{"type": "string"}, {"type": "integer"}]})", R"({"oneOf": [true, true]})",
                          R"({"type": "array", "items": false, "minItems": 1})",
                          R"({"type": "object", "properties": {"a": false}, "required": ["a"]})",
                          R"({"allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]}, {"properties": {"a": {"type": "integer"}}}], "type": "object"})"}) {
        CAPTURE(s);
        CHECK(error_of(json::parse(s)) == unsat);
    }
}

TEST_CASE("integer bounds and multipleOf: every integer in [-120, 120] against many schemas") {
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
        json::parse(R"({"type": "integer", "minimum": -0.5, "maximum": 0.5})"),
        json::parse(R"({"type": "integer", "minimum": 3, "exclusiveMinimum": 3})"),
        json::parse(R"({"type": "integer", "minimum": -1e300, "maximum": 1e300})"),
        json::parse(R"({"type": "integer", "multipleOf": 7})"),
        json::parse(R"({"type": "integer", "multipleOf": 12, "minimum": -50})"),
        json::parse(R"({"type": "integer", "not": {"multipleOf": 3}, "maximum": 60})"),
        json::parse(R"({"type": "integer", "multipleOf": 2.5})"),
    };
    dice d(7);
    for (int i = 0; i < 120; ++i) { // random bounds, some fractional, some exclusive
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
            CHECK(error_of(s) == "the schema is unsatisfiable: no JSON value is valid under it");
            continue;
        }
        const compiled g = compile(s);
        for (int64_t x = -120; x <= 120; ++x) {
            CAPTURE(x);
            bool ok = s.contains("not") ? x <= 60 && x % 3 != 0 : v.valid(json(x));
            if (s.contains("multipleOf")) ok = ok && std::fmod(double(x), s["multipleOf"].get<double>()) == 0;
            CHECK(matches(g, std::to_string(x)) == ok);
            CHECK(matches(g, std::to_string(x) + ".0") == ok); // 2.0 is an integer (draft-06 on)
        }
        for (const char* odd : {"-0", "007", "+3", "1e2", "01", "- 1", "", "1.5"}) {
            CAPTURE(odd);
            CHECK_FALSE(matches(g, odd));
        }
        ++n_checked;
    }
    MESSAGE(n_checked, " integer schemas checked on every integer in [-120, 120]");
    check_texts(json::parse(R"({"type": "integer"})"),
                {{"999999999999999", true}, {"-999999999999999", true}, {"1000000000000000", false}, {"0", true}});
    check_texts(json::parse(R"({"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"})"),
                {{"2", true}, {"2.0", false}}); // draft-04 reads 2.0 as a number that is not an integer
}

TEST_CASE("number bounds and decimal multipleOf: decimals on a grid, exactly") {
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
        R"({"multipleOf": 0.05})",
        R"({"multipleOf": 0.25, "minimum": -2})",
        R"({"multipleOf": 1.5})",
        R"({"not": {"minimum": 1, "maximum": 2}})",
    };
    for (const char* b : bounds) {
        json s = json::parse(b);
        s["type"] = "number";
        const std::string text = s.dump();
        CAPTURE(text);
        const compiled g = compile(s);
        const json lo = s.value("minimum", json(nullptr)), hi = s.value("maximum", json(nullptr));
        for (int k = -520; k <= 520; ++k) { // k/100 as "1.5", "1.50", "-0.05"; integers also as "2" and "2.0"
            const double x = k / 100.0;
            bool ok = validator(s).valid(json(x));
            if (s.contains("multipleOf")) { // exactly, in hundredths
                const int m = int(std::lround(s["multipleOf"].get<double>() * 100));
                ok = ok && k % m == 0;
            }
            if (s.contains("not")) ok = k < 100 || k > 200;
            std::vector<std::string> forms = {fmt::format("{:.2f}", x), fmt::format("{:.3f}", x)};
            if (k % 100 == 0) forms.push_back(std::to_string(k / 100));
            for (const std::string& t : forms) {
                if (t.starts_with("-0") && k == 0) continue; // -0 is valid JSON but never produced
                CAPTURE(t);
                CHECK(matches(g, t) == ok);
            }
        }
        for (const char* odd : {"-0", "-0.0", "+1", "1.", ".5", "01.5", "1e0", "1.5E-1"}) {
            CAPTURE(odd);
            CHECK_FALSE(matches(g, odd)); // constrained numbers are written without exponent
        }
    }
    check_texts(json::parse(R"({"type": "number"})"),
                {{"0", true}, {"-0.5", true}, {"1e+99", true}, {"1e+300", false}, {"1.25E-7", true}, {"0.30000000000000004", true},
                 {"123456789012345.5", true}, {"1234567890123456", false}, {"1e1000", false}, {"01", false},
                 {"1.", false}, {"-", false}, {"0.12345678901234567890", true}, {"0.123456789012345678901", false}});
    check_texts(json::parse(R"({"type": "number", "exclusiveMinimum": 0, "maximum": 1e-18})"),
                {{"0.000000000000000001", true}, {"0.00000000000000000099", true}, {"0.0000000000000000011", false},
                 {"0.00000000000000000000", false}, {"0", false}});
    check_texts(json::parse(R"({"$schema": "http://json-schema.org/draft-04/schema#", "type": "number", "minimum": 1,
                                "exclusiveMinimum": true})"),
                {{"1", false}, {"1.0", false}, {"1.01", true}});
}

TEST_CASE("formats accept what they define and refuse near misses; unknown names are annotations") {
    const std::vector<std::tuple<const char*, std::vector<const char*>, std::vector<const char*>>> cases = {
        {"date", {"2024-02-29", "2000-02-29", "0000-12-31", "1999-01-01", "2023-04-30"},
         {"2024-13-01", "2024-00-10", "2024-01-32", "24-01-01", "2024-1-01", "2024-01-01T", "2023-02-29", "1900-02-29",
          "2023-04-31"}},
        {"time", {"23:59:60Z", "00:00:00z", "12:30:45.123+05:30", "01:02:03-23:59", "10:00:00.1234567890Z"},
         {"24:00:00Z", "12:60:00Z", "12:00:61Z", "12:00:00", "12:00:00+5:30", "12:00:00.Z", "12:00:60Z"}},
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
    check_texts(json::parse(R"({"type": "string", "format": "uri"})"),
                {{R"("https://example.com/a/b?c=d#e")", true}, {R"("urn:isbn:0451450523")", true},
                 {R"("http://[::1]:8080/")", true}, {R"("/relative")", false}, {R"("http://exa mple.com")", false}});
    check_texts(json::parse(R"({"type": "string", "format": "hostname", "maxLength": 8})"),
                {{R"("a.b-c.de")", true}, {R"("a.b-c.def")", false}, {R"("-a.b")", false}});
    check_texts(json::parse(R"({"type": "string", "format": "date", "maxLength": 10, "pattern": "^2024"})"),
                {{R"("2024-01-31")", true}, {R"("2023-01-31")", false}});
    check_texts(json::parse(R"({"type": "string", "format": "int32"})"), {{R"("anything")", true}}); // not a standard name
}

TEST_CASE("strings: escapes, lengths in code points however written, patterns with lengths") {
    check_texts(json::parse(R"({"type": "string"})"),
                {{R"("")", true}, {R"("a\"b\\c\/d\b\f\n\r\t")", true}, {R"("\u00e9\u00E9\uD83D\uDE00")", true},
                 {"\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"", true}, {"\"\x7f\"", true}, {R"("\u007f\u001f")", true},
                 {R"("\u0041")", false}, // printable ASCII is written raw
                 {"\"a\nb\"", false}, {"\"\x01\"", false}, {R"("\x41")", false}, {R"("\u12")", false},
                 {R"("\ud800")", false}, {R"("\udc00\ud800")", false}, {R"("a)", false}, {R"("a"")", false}});
    check_texts(json::parse(R"({"type": "string", "minLength": 1, "maxLength": 1})"),
                {{"\"\xf0\x9f\x98\x80\"", true}, {R"("\ud83d\ude00")", true}, {R"("\n")", true}, {R"("\u00e9")", true},
                 {R"("")", false}, {R"("ab")", false}, {R"("\ud83d")", false}, {"\"\xc3\xa9\xc3\xa9\"", false}});
    check_texts(json::parse(R"({"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 3})"),
                {{R"("ab")", true}, {R"("abc")", true}, {R"("a")", false}, {R"("abcd")", false}, {R"("aBc")", false}});
    check_texts(json::parse(R"x({"type": "string", "pattern": "^a\"b\\\\$"})x"), {{R"("a\"b\\")", true}, {R"("a\"b")", false}});
    check_texts(json::parse(R"({"type": "string", "pattern": "b"})"), {{R"("abc")", true}, {R"("b")", true}, {R"("ac")", false}});
    check_texts(json::parse(R"({"type": "string", "pattern": "^é+$"})"),
                {{"\"\xc3\xa9\xc3\xa9\"", true}, {R"("\u00e9")", true}, {R"("e")", false}});
    check_texts(json::parse(R"({"not": {"pattern": "^a"}, "type": "string"})"), {{R"("ba")", true}, {R"("ab")", false}});
    check_texts(json::parse(R"({"minLength": 2})"), {{R"("ab")", true}, {R"("a")", false}, {"3", true}}); // other types any
}

TEST_CASE("objects: any order, each name once, required, additional keys that are none of the names") {
    const json s = json::parse(R"({"type": "object", "properties": {"a": {"type": "string"}, "ab": {"type": "null"},
        "\u00e9": {"type": "boolean"}, "x\"y": {"const": 1}}, "required": ["ab"],
        "additionalProperties": {"type": "integer"}})");
    check_texts(s, {
        {R"({"ab":null})", true},
        {R"({"a":"s","ab":null,"é":true,"x\"y":1})", true},
        {R"({"a":"s","ab":null,"x\"y":1,"é":true})", true}, // any order
        {R"({"ab":null,"a":"s"})", true},
        {R"({"ab":null,"a":"s","a":"t"})", false}, // each name once
        {R"({"a":"s"})", false},                   // ab is required
        {R"({"b":1,"ab":null,"abc":2})", true},
        {R"({"":0,"ab":null})", true},
        {R"({"ab":null,"a":1})", false},     // a is listed: a string, not an extra integer
        {R"({"ab":null,"\u00e9":1})", false},
        {R"({"ab":null,"\u00E9x":1})", true},
        {R"({"ab":null,"x\"":1,"x\"yz":2})", true},
        {R"({"ab":null,"b":"s"})", false},   // extras are integers
        {R"({ "ab" : null , "z" : 1 })", true},
    });
    check_texts(json::parse(R"({"type": "object", "properties": {"a": {}, "b": {}}})"),
                {{"{}", true}, {R"({"b":1})", true}, {R"({"a":1,"b":2})", true}, {R"({"c":1})", true}}); // absent: any
    check_texts(json::parse(R"({"type": "object", "properties": {"a": false}, "additionalProperties": true})"),
                {{"{}", true}, {R"({"a":1})", false}, {R"({"b":[1]})", true}});
    check_texts(json::parse(R"({"required": ["k"], "additionalProperties": {"type": "string"}})"),
                {{R"({"k":"v"})", true}, {R"({"a":"b","k":"v","z":""})", true}, {R"({"k":1})", false}, {"{}", false}});
    // Past 6 names, the required ones once each and the optional ones in any order.
    json many = {{"type", "object"}, {"properties", json::object()}, {"required", {"n0", "n5"}}, {"additionalProperties", false}};
    for (int i = 0; i < 8; ++i) many["properties"][fmt::format("n{}", i)] = {{"type", "integer"}};
    check_texts(many, {{R"({"n7":1,"n5":2,"n0":3})", true}, {R"({"n5":2})", false}, {R"({"n0":1,"n5":2,"x":3})", false},
                       {R"({"n0":1,"n5":2,"n0":3})", false}});
    check_texts(json::parse(R"({"type": "object", "patternProperties": {"^x-": {"type": "integer"}, "y$": {"type": "string"}},
                                "properties": {"x-y": {"const": 1}}, "additionalProperties": false})"),
                {{R"({"x-a":1})", true}, {R"({"ay":"s"})", true}, {R"({"x-y":1})", false}, {R"({"x-z":"s"})", false},
                 {R"({"b":1})", false}, {R"({"x-ay":1})", false}, {R"({"x-ay":"s"})", false}}); // x-ay: both patterns
    check_texts(json::parse(R"({"type": "object", "propertyNames": {"maxLength": 2, "pattern": "^[a-z]+$"}})"),
                {{R"({"ab":1})", true}, {R"({"abc":1})", false}, {R"({"A":1})", false}, {"{}", true}});
    check_texts(json::parse(R"({"type": "object", "minProperties": 1, "maxProperties": 2, "properties": {"a": {}, "b": {}, "c": {}},
                                "additionalProperties": false})"),
                {{"{}", false}, {R"({"c":1})", true}, {R"({"a":1,"c":1})", true}, {R"({"a":1,"b":1,"c":1})", false}});
}

TEST_CASE("arrays: prefixItems, items, counts, contains") {
    check_texts(json::parse(R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false})"),
                {{"[]", true}, {"[1]", true}, {R"([1,"a"])", true}, {R"([1,"a",2])", false}, {R"(["a"])", false}});
    check_texts(json::parse(R"({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "null"},
                                "minItems": 2, "maxItems": 3})"),
                {{"[1,null]", true}, {"[1,null,null]", true}, {"[1]", false}, {"[1,null,null,null]", false}, {"[null,null]", false}});
    check_texts(json::parse(R"({"type": "array", "prefixItems": [{}, false, {}]})"), {{"[1]", true}, {"[1,2]", false}});
    check_texts(json::parse(R"({"type": "array", "maxItems": 0})"), {{"[]", true}, {"[ ]", true}, {"[1]", false}});
    check_texts(json::parse(R"({"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "integer"}],
                                "additionalItems": {"type": "string"}})"),
                {{R"([1,"a","b"])", true}, {"[1,2]", false}, {R"(["a"])", false}});
    check_texts(json::parse(R"({"type": "array", "contains": {"type": "integer"}, "minContains": 2, "maxContains": 3})"),
                {{"[1,2]", true}, {R"([1,"a",2,"b",3])", true}, {R"([1,"a"])", false}, {"[1,2,3,4]", false}, {"[]", false}});
    check_texts(json::parse(R"({"type": "array", "items": {"type": "string"}, "not": {"contains": {"const": "x"}}})"),
                {{R"(["a","b"])", true}, {R"(["a","x"])", false}, {"[]", true}});
}

TEST_CASE("applicators: allOf intersects, oneOf exactly one, not, if/then/else, dependencies, unevaluated") {
    check_texts(json::parse(R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                          {"properties": {"b": {"type": "string"}, "a": {"minimum": 3}}, "required": ["b"]}]})"),
                {{R"({"a":3,"b":"x"})", true}, {R"({"a":2,"b":"x"})", false}, {R"({"a":3})", false}, {R"({"a":3,"b":"x","c":2})", true}});
    check_texts(json::parse(R"({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 0}]})"),
                {{"-2", true}, {"0.5", true}, {"2", false}, {"-0.5", false}}); // 2 is valid under both: not one
    check_texts(json::parse(R"({"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]})"),
                {{R"({"a":1})", true}, {R"({"b":1})", true}, {R"({"a":1,"b":1})", false}, {"{}", false}});
    check_texts(json::parse(R"({"oneOf": [{"properties": {"kind": {"const": "x"}, "v": {"type": "integer"}}, "required": ["kind"]},
                                          {"properties": {"kind": {"const": "y"}}, "required": ["kind"]}], "type": "object"})"),
                {{R"({"kind":"x","v":1})", true}, {R"({"kind":"y","v":"s"})", true}, {R"({"kind":"x","v":"s"})", false}});
    check_texts(json::parse(R"({"not": {"type": ["string", "null"]}})"), {{"1", true}, {"{}", true}, {R"("s")", false}, {"null", false}});
    check_texts(json::parse(R"({"not": {"enum": [1, "a"]}, "type": ["integer", "string"]})"),
                {{"2", true}, {"1", false}, {"1.0", false}, {R"("b")", true}, {R"("a")", false}});
    check_texts(json::parse(R"({"type": "object", "if": {"properties": {"t": {"const": "n"}}, "required": ["t"]},
                                "then": {"properties": {"v": {"type": "number"}}}, "else": {"properties": {"v": {"type": "string"}}}})"),
                {{R"({"t":"n","v":1})", true}, {R"({"t":"s","v":"x"})", true}, {R"({"v":"x"})", true}, {R"({"t":"n","v":"x"})", false},
                 {R"({"v":1})", false}});
    check_texts(json::parse(R"({"type": "object", "dependentRequired": {"a": ["b"]}, "dependentSchemas": {"c": {"required": ["d"]}}})"),
                {{R"({"a":1,"b":2})", true}, {R"({"a":1})", false}, {R"({"b":1})", true}, {R"({"c":1,"d":1})", true}, {R"({"c":1})", false}});
    check_texts(json::parse(R"({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "dependencies": {"a": ["b"]}})"),
                {{R"({"a":1,"b":2})", true}, {R"({"a":1})", false}});
    check_texts(json::parse(R"({"type": "object", "dependencies": {"a": ["b"]}})"), // not a 2020-12 keyword: an annotation
                {{R"({"a":1})", true}});
    check_texts(json::parse(R"({"allOf": [{"properties": {"a": {"type": "integer"}}}], "properties": {"b": {}},
                                "unevaluatedProperties": false, "type": "object"})"),
                {{R"({"a":1,"b":2})", true}, {R"({"a":1,"c":2})", false}});
    check_texts(json::parse(R"({"prefixItems": [{"type": "integer"}], "unevaluatedItems": false, "type": "array"})"),
                {{"[1]", true}, {"[1,2]", false}});
    check_texts(json::parse(R"({"enum": [{"k": [1, "x"]}, "a\"b", 2.5, null]})"),
                {{R"({ "k" : [ 1 , "x" ] })", true}, {R"({"k":[1,"x"]})", true}, {R"("a\"b")", true}, {"2.5", true},
                 {"2.50", true}, {"null", true}, {R"({"k":[1]})", false}});
    check_texts(json::parse(R"({"const": {"b": [], "a": {}}})"), {{R"({"b":[],"a":{}})", true}, {R"({"a":{},"b":[]})", true},
                                                                 {R"({"a":{}})", false}});
    check_texts(json::parse("true"), {{"[1,{\"a\":null}]", true}, {"\"s\"", true}, {"nul", false}});
}

TEST_CASE("dialects: annotations are ignored, ids and anchors resolve, $ref siblings by draft") {
    check_texts(json::parse(R"({"type": "object", "x-kubernetes-group-version-kind": [{"group": ""}], "self": {"vendor": "x"},
                                "_format": "weird", "nullable": true, "properties": {"a": {"type": "integer", "id": "x"}}})"),
                {{R"({"a":1})", true}, {"null", false}, {R"({"a":"s"})", false}});
    check_texts(json::parse(R"({"$id": "https://example.com/root.json", "$defs": {"n": {"$anchor": "num", "type": "integer"},
                                "s": {"$id": "str.json", "type": "string"}}, "type": "array",
                                "prefixItems": [{"$ref": "#num"}, {"$ref": "str.json"}, {"$ref": "https://example.com/root.json#/$defs/n"}]})"),
                {{R"([1,"a",2])", true}, {R"(["a","a",2])", false}, {R"([1,2,2])", false}});
    check_texts(json::parse(R"({"$schema": "http://json-schema.org/draft-04/schema#", "id": "http://x.org/s.json",
                                "definitions": {"i": {"id": "#int", "type": "integer"}}, "properties": {"a": {"$ref": "#int"}}})"),
                {{R"({"a":1})", true}, {R"({"a":"s"})", false}});
    const char* sibling = R"({"$defs": {"s": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/s", "maxLength": 1}}})";
    check_texts(json::parse(sibling), {{R"({"a":"x"})", true}, {R"({"a":"xy"})", false}}); // 2020-12: beside $ref applies
    json seven = json::parse(sibling);
    seven["$schema"] = "http://json-schema.org/draft-07/schema#";
    check_texts(seven, {{R"({"a":"xy"})", true}}); // draft-07: ignored
    const json list = json::parse(R"({"$defs": {"a/b~c": {"type": "integer"},
        "node": {"type": "object", "properties": {"v": {"$ref": "#/$defs/a~1b~0c"}, "next": {"$ref": "#/$defs/node"}},
                 "required": ["v"]}}, "$ref": "#/$defs/node"})");
    check_texts(list, {{R"({"v":1})", true}, {R"({"v":1,"next":{"v":2,"next":{"v":3}}})", true},
                       {R"({"v":1,"next":{"v":2,"next":{"v":"x"}}})", false}, {R"({"v":1,"next":{}})", false}});
}

TEST_CASE("whitespace: bounded (a line break and 20 spaces or tabs) or compact") {
    const json s = json::parse(R"({"type": "object", "properties": {"a": {"type": "array"}}})");
    const compiled g = compile(s), c = compile(s, {.ws = whitespace::compact});
    CHECK(matches(g, "{ \"a\" :\t[ 1 ,\n2 ] }"));
    CHECK(matches(g, "{\n                    \"a\":[]}"));
    CHECK(matches(g, "{\r\n  \"a\":[]\n}"));
    CHECK_FALSE(matches(g, "{\n                     \"a\":[]}")); // 21 spaces
    CHECK_FALSE(matches(g, "{\n\n\"a\":[]}"));
    CHECK_FALSE(matches(g, "{ \n\"a\":[]}"));
    CHECK_FALSE(matches(g, " {\"a\":[]}"));
    CHECK(matches(c, "{\"a\":[1,2]}"));
    CHECK_FALSE(matches(c, "{ \"a\":[1,2]}"));
    CHECK_FALSE(matches(c, "{\"a\": [1,2]}"));
}

TEST_CASE("closed_objects writes no keys the schema does not speak of, and narrows nothing under not") {
    const json_options closed{.closed_objects = true};
    const compiled g = compile(json::parse(R"({"type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {}}})"), closed);
    CHECK(matches(g, R"({"a":1,"x1":2})"));
    CHECK_FALSE(matches(g, R"({"a":1,"b":2})"));
    const compiled n = compile(json::parse(R"({"type": "object", "not": {"properties": {"a": {"type": "string"}}}})"), closed);
    CHECK(matches(n, R"({"a":1})"));
    CHECK_FALSE(matches(n, R"({"a":"x"})"));
    CHECK_FALSE(matches(n, R"({"b":1})")); // valid under the schema, but only a is written
    const compiled any = compile(json::parse(R"({"type": "object"})"), closed);
    CHECK(matches(any, R"({"b":1})")); // a shape that names nothing keeps its keys
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
        if (i % 20 == 0) required.push_back(name);
    }
    const json s = {{"type", "object"}, {"properties", props}, {"required", required}, {"additionalProperties", true}};
    const auto t0 = std::chrono::steady_clock::now();
    compiled g;
    REQUIRE_NOTHROW(g = compile(s));
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE(fmt::format("100 properties: compiled in {:.1f} ms, {} rules, {} elements", ms, g.n_rules(), g.elems.size()));
    json instance = json::object();
    for (int i = 98; i >= 0; i -= 2) // backwards: any order
        instance[fmt::format("field_{:03}", i)] = i % 3 == 0 ? json("s") : i % 3 == 1 ? json(i) : json::array({1.5});
    CHECK(matches(g, instance.dump()));
}

TEST_CASE("hostile schemas: exponential combinations and deep nesting are refused") {
    json all = json::array(); // 40 unions of two objects each, met: 2^40 shapes if unchecked
    for (int i = 0; i < 40; ++i)
        all.push_back({{"anyOf", json::array({{{"required", {fmt::format("a{}", i)}}}, {{"required", {fmt::format("b{}", i)}}}})}});
    const json wide = {{"type", "object"}, {"allOf", all}};
    const std::string why = error_of(wide);
    CAPTURE(why);
    CHECK(why.find("over 64 alternative shapes") != std::string::npos);
    json deep = {{"type", "null"}};
    for (int i = 0; i < 300; ++i) deep = {{"type", "array"}, {"items", deep}};
    CHECK(error_of(deep).starts_with("schema nested deeper than 256 at /items/items/"));
}

TEST_CASE("the test validator reads schemas as the specification does") {
    const auto valid = [](const char* schema, const char* instance) {
        const json s = json::parse(schema);
        return validator(s).valid(json::parse(instance));
    };
    CHECK(valid(R"({"properties": {"a": {}}})", R"({"b": 1})")); // absent additionalProperties
    CHECK(valid(R"({"minLength": 1})", "3"));                    // a string keyword, a number
    CHECK_FALSE(valid(R"({"oneOf": [{"type": "integer"}, {"minimum": 0}]})", "2")); // exclusive
    CHECK(valid(R"({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]})", R"({"a": 1, "b": 2})"));
    CHECK(valid(R"({"type": "string", "maxLength": 1})", "\"\xf0\x9f\x98\x80\""));
    CHECK(valid(R"({"type": "integer"})", "2.0"));
    CHECK_FALSE(valid(R"({"format": "date", "type": "string"})", R"("2023-02-29")"));
    CHECK(valid(R"({"$defs": {"a/b": {"const": 1}}, "$ref": "#/$defs/a~1b"})", "1"));
}
