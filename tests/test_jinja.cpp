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
