// The Jinja engine: real chat templates against Jinja2's renderings (tests/data/templates,
// made by scripts/gen_template_renderings.py), then each construct, whitespace rule, filter,
// error and limit.
#include "runtime/jinja/jinja.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

using namespace tandem::jinja;
using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

// 2026-07-26T12:00:00Z, the generator's FIXED_NOW.
constexpr std::time_t fixed_now = 1785067200;

std::string render(std::string_view src, const json& ctx = json::object()) {
    render_options opt;
    opt.now = fixed_now;
    return template_program::parse(src).render(ctx, opt);
}

std::string fails(std::string_view src, const json& ctx = json::object(), const render_options& opt = {}) {
    try {
        template_program::parse(src).render(ctx, opt);
    } catch (const error& e) {
        return e.what();
    }
    return "(no error)";
}

} // namespace

TEST_CASE("real chat templates render as Jinja2 renders them") {
    const fs::path templates = fs::path(TANDEM_SHARED_DIR) / "data" / "templates";
    const fs::path expected = fs::path(TANDEM_SOURCE_DIR) / "tests" / "data" / "templates";
    REQUIRE(fs::is_directory(templates));
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(templates))
        if (e.path().extension() == ".jinja") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    int n_identical = 0, n_templates = 0;
    std::vector<std::string> skipped, differing;
    for (const auto& file : files) {
        const fs::path want = expected / (file.stem().string() + ".json");
        if (!fs::exists(want)) {
            skipped.push_back(file.filename().string());
            continue;
        }
        ++n_templates;
        const json doc = json::parse(read_file(want));
        const std::string src = read_file(file);
        bool all_same = true;
        std::optional<template_program> prog;
        std::string load_error;
        try {
            prog = template_program::parse(src);
        } catch (const error& e) {
            load_error = e.what();
        }
        for (const auto& c : doc["cases"]) {
            CAPTURE(file.filename().string());
            CAPTURE(c["name"].get<std::string>());
            std::string got, err = load_error;
            if (prog) {
                try {
                    render_options opt;
                    opt.now = fixed_now;
                    got = prog->render(c["context"], opt);
                } catch (const error& e) {
                    err = e.what();
                }
            }
            if (c.contains("error")) {
                CAPTURE(c["error"].get<std::string>());
                CHECK_MESSAGE(!err.empty(), "Jinja2 refuses this case; Tandem rendered it");
                all_same &= !err.empty();
            } else {
                CAPTURE(err);
                const std::string exp = c["expected"].get<std::string>();
                size_t at = 0;
                while (at < got.size() && at < exp.size() && got[at] == exp[at]) ++at;
                const size_t from = at < 40 ? 0 : at - 40;
                CAPTURE(at);
                CAPTURE(got.substr(from, 100));
                CAPTURE(exp.substr(from, 100));
                CHECK_MESSAGE(got == exp, "rendering differs from Jinja2's");
                all_same &= err.empty() && got == exp;
            }
        }
        if (all_same) ++n_identical;
        else differing.push_back(file.filename().string());
    }
    MESSAGE(n_identical << " of " << n_templates << " templates identical to Jinja2 in every case");
    for (const auto& d : differing) MESSAGE("differs: " << d);
    for (const auto& s : skipped) MESSAGE("skipped (no rendering in tests/data/templates; run scripts/gen_template_renderings.py): " << s);
    CHECK(n_templates >= 34);
}

TEST_CASE("each construct renders as Jinja2 renders it (tests/data/jinja_language.json)") {
    const json cases = json::parse(read_file(fs::path(TANDEM_SOURCE_DIR) / "tests" / "data" / "jinja_language.json"));
    REQUIRE(cases.size() >= 70);
    for (const auto& c : cases) {
        const std::string src = c["template"].get<std::string>();
        CAPTURE(src);
        std::string got, err;
        try {
            got = render(src, c["context"]);
        } catch (const error& e) {
            err = e.what();
        }
        if (c.contains("error")) {
            CAPTURE(c["error"].get<std::string>());
            CHECK_MESSAGE(!err.empty(), "Jinja2 refuses this; Tandem rendered: " << got);
        } else {
            CAPTURE(err);
            CHECK(got == c["expected"].get<std::string>());
        }
    }
}

TEST_CASE("syntax errors and unsupported constructs name the problem and its line") {
    CHECK(fails("a\n{% if x %}b") == "unexpected end of template, expected 'endif' (line 2)");
    CHECK(fails("{% frobnicate %}") == "Encountered unknown tag 'frobnicate' (line 1)");
    CHECK(fails("line1\n{% include 'x.jinja' %}") == "unsupported tag 'include' (line 2)");
    CHECK(fails("{% extends 'base' %}").starts_with("unsupported tag 'extends'"));
    CHECK(fails("{% do x.append(1) %}").starts_with("unsupported tag 'do'"));
    CHECK(fails("{{ x ") == "unexpected end of template, expected '}}' (line 1)");
    CHECK(fails("{# open") == "Missing end of comment tag (line 1)");
    CHECK(fails("{{ 'abc }}").starts_with("unexpected end of string"));
    CHECK(fails("{{ (1 }}").find("unexpected '}'") != std::string::npos);
    // unknown filters and tests: refused when loading, as Jinja2 compiles them, except inside
    // an if (or a conditional expression), where they fail only when reached
    CHECK_THROWS_WITH_AS(template_program::parse("\n\n{% for m in x %}{{ x | nosuchfilter }}{% endfor %}"),
                         "No filter named 'nosuchfilter'. (line 3)", error);
    CHECK_THROWS_WITH_AS(template_program::parse("{{ 1 is nosuchtest }}"), "No test named 'nosuchtest'. (line 1)", error);
    CHECK(render("{% if false %}{{ x | from_json }}{% endif %}{{ 'a' if true else y | nope }}") == "a");
    CHECK(fails("{% if true %}{{ '{}' | from_json }}{% endif %}") == "No filter named 'from_json'. (line 1)");
    CHECK(fails("{% for x in y recursive %}{% endfor %}").starts_with("recursive loops are not supported"));
    CHECK(fails("{{ f(*a) }}").starts_with("*args and **kwargs"));
    CHECK(fails("{{ raise_exception('no system role') }}") == "no system role (line 1)");
}

TEST_CASE("the sandbox refuses to mutate and to reach Python internals") {
    CHECK(fails("{% set l = [] %}{{ l.append(1) }}").starts_with("access to attribute 'append' of 'list' object is unsafe."));
    CHECK(fails("{% set d = {} %}{{ d.pop('a') }}").starts_with("access to attribute 'pop' of 'dict' object is unsafe."));
    CHECK(fails("{{ ''.__class__.__mro__ }}").starts_with("access to attribute '__class__'"));
    CHECK(render("{{ messages.__len__ }}", {{"messages", json::array()}}) == "");
}

TEST_CASE("limits: a hostile template fails with an error, never hangs or exhausts memory") {
    render_options opt;
    opt.limits.max_iterations = 10000;
    CHECK(fails("{% for i in range(100000) %}{% endfor %}", json::object(), opt).starts_with("template exceeded 10000 loop iterations"));
    CHECK(fails("{% for i in range(100) %}{% for j in range(100) %}{% for k in range(100) %}{% endfor %}{% endfor %}{% endfor %}",
                json::object(), opt).find("loop iterations") != std::string::npos);
    // range() itself is bounded: no list of 10^12 items is built
    CHECK(fails("{{ range(1000000000000) | length }}", json::object(), opt).find("loop iterations") != std::string::npos);
    // unbounded recursion
    CHECK(fails("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").starts_with("macro calls nested too deeply (limit 64)"));
    // output size: doubling strings, repetition, join
    render_options small;
    small.limits.max_output = 1 << 16;
    CHECK(fails("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}", json::object(), small)
              .find("output exceeded 65536 bytes") != std::string::npos);
    CHECK(fails("{{ 'x' * 1000000000 }}", json::object(), small).find("output exceeded") != std::string::npos);
    CHECK(fails("{% for i in range(100000) %}xxxxxxxxxx{% endfor %}", json::object(), small).find("output exceeded") != std::string::npos);
    CHECK(fails("{{ 'ab' | replace('', 'xxxxxxxxxxxxxxxx') | replace('', 'yyyyyyyyyyyyyyyyy') | replace('', 'zzzzzzzzzzzzzzzz') | replace('', 'wwwwwwwwwwwwwwww') }}",
                json::object(), small).find("output exceeded") != std::string::npos);
    // time: a loop within the iteration budget that takes too long
    render_options quick;
    quick.limits.max_time = std::chrono::milliseconds(50);
    quick.limits.max_iterations = uint64_t(1) << 40;
    CHECK(fails("{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}", json::object(), quick)
              .find("time limit") != std::string::npos);
    // deep nesting in the source is refused at parse time, not by overflowing the stack
    const std::string deep = std::string(5000, '(') + "1" + std::string(5000, ')');
    CHECK(fails("{{ " + deep + " }}").find("nested too deeply") != std::string::npos);
    std::string deep_if;
    for (int i = 0; i < 1000; ++i) deep_if += "{% if true %}";
    CHECK(fails(deep_if).find("nested too deeply") != std::string::npos);
    CHECK(fails("{{ " + std::string(5000, '-') + "1 }}").find("nested too deeply") != std::string::npos);
    CHECK(fails("{{ 9223372036854775807 + 1 }}").starts_with("integer overflow"));
    // a list holding one list twice, doubled 60 times: printing, tojson and == would walk 2^60 items
    std::string dag = "{% set a = [1] %}{% set b = [1] %}";
    for (int i = 0; i < 60; ++i) dag += "{% set a = [a, a] %}{% set b = [b, b] %}";
    CHECK(fails(dag + "{{ a }}").find("exceeded") != std::string::npos);
    CHECK(fails(dag + "{{ a | tojson }}").find("exceeded") != std::string::npos);
    CHECK(fails(dag + "{{ a == b }}").find("exceeded") != std::string::npos);
    CHECK(render(dag + "{{ a == a }}") == "True");
    // a library exception inside (an index past every integer) is the template's error too
    CHECK(fails("{{ '{99999999999999999999999}'.format(1) }}").starts_with("template failed: "));
}

TEST_CASE("values from JSON keep their order and print as Python prints them") {
    const json ctx = json::parse(R"({"d": {"z": 1, "a": [1.5, "q", null, false]}, "f": 3.0, "big": 1e300})");
    CHECK(render("{{ d }} {{ f }} {{ big }} {{ d | tojson }}", ctx) ==
          R"({'z': 1, 'a': [1.5, 'q', None, False]} 3.0 1e+300 {"z": 1, "a": [1.5, "q", null, false]})");
    CHECK(python_float(0.1) == "0.1");
    CHECK(python_float(1e16) == "1e+16");
    CHECK(python_float(123456789012345.0) == "123456789012345.0");
    CHECK(python_float(0.0001) == "0.0001");
    CHECK(python_float(0.00001) == "1e-05");
}
