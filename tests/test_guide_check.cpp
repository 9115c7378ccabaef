// The constraint engine on data no one here wrote: a fixed slice of MaskBench's development set
// (../shared/data/maskbench-dev.json) walked through real token masks (Llama 3's vocabulary
// when ../shared has it, else GPT-2's), and cases of the JSON-Schema-Test-Suite through the
// reference matcher (tests/data/jsts.json: draft 2020-12's not, if-then-else,
// dependentSchemas and propertyNames files, and draft-04's from the npm package
// json-schema-test-suite 0.0.10); and Python's json.dumps, which MaskBench's instances are
// written as.
#include "runtime/grammar/guide_check.hpp"

#include "runtime/gguf.hpp"
#include "runtime/grammar/reference.hpp"
#include "tests/test_util.hpp"

#include <doctest/doctest.h>
#include <fmt/format.h>

#include <filesystem>

using namespace tandem;
using namespace tandem::grammar;
using json = nlohmann::ordered_json;

namespace {

std::string vocab_path() {
    const auto llama3 = test::shared_dir() / "models" / "vocab" / "ggml-vocab-llama-bpe.gguf";
    if (std::filesystem::exists(llama3)) return llama3.string();
    return (test::shared_dir() / "models" / "vocab" / "ggml-vocab-gpt-2.gguf").string();
}

} // namespace

TEST_CASE("python_json_dumps writes as Python's json.dumps does") {
    // Expected texts from Python 3.11's json.dumps.
    const json v = json::parse(R"({"a": 1.0, "b": [1e-05, 1e16, 123456789.125, -0.0, 0.1],
        "c": "\u00e9\u20ac\ud83d\ude00\u007f\u0001\"\\/\n", "d": null, "e": true, "f": {}, "g": [], "h": 12345678901234567890})");
    CHECK(python_json_dumps(v) == R"({"a": 1.0, "b": [1e-05, 1e+16, 123456789.125, -0.0, 0.1], "c": "\u00e9\u20ac\ud83d\ude00\u007f\u0001\"\\/\n", "d": null, "e": true, "f": {}, "g": [], "h": 12345678901234567890})");
    CHECK(python_json_dumps(json(2.5e-07)) == "2.5e-07");
    CHECK(python_json_dumps(json(1e22)) == "1e+22");
    CHECK(python_json_dumps(json(0.0001)) == "0.0001");
    CHECK(python_json_dumps(json(123.0)) == "123.0");
}

TEST_CASE("MaskBench development set, every 4th schema: no invalid instance accepted, no valid one rejected") {
    const auto path = test::shared_dir() / "data" / "maskbench-dev.json";
    if (!std::filesystem::exists(path)) {
        MESSAGE("skipped: no ", path.string());
        return;
    }
    const tokenizer tok = tokenizer::from_gguf(gguf::file::open(vocab_path()));
    const auto vocab = vocab_trie::of(tok);
    const auto entries = read_maskbench(path.string());
    int n = 0, n_compiled = 0, n_valid = 0, n_invalid = 0;
    for (size_t i = 0; i < entries.size(); i += 4) {
        const auto& id = entries[i].first; // (names, not structured bindings: CAPTURE's lambda takes them)
        const auto& entry = entries[i].second;
        CAPTURE(id);
        const schema_run r = run_schema(entry, id, tok, vocab);
        ++n;
        if (!r.compiled) {
            MESSAGE("not compiled: ", id, ": ", r.error);
            continue;
        }
        ++n_compiled;
        n_valid += r.n_valid;
        n_invalid += r.n_invalid;
        for (const std::string& f : r.failures) {
            CAPTURE(f);
            FAIL_CHECK("a wrong verdict");
        }
    }
    MESSAGE(fmt::format("{} of {} schemas compiled ({}: {} valid and {} invalid instances, each verdict right)",
                        n_compiled, n, vocab_path(), n_valid, n_invalid));
    CHECK(n_compiled >= n * 9 / 10);
}

TEST_CASE("JSON-Schema-Test-Suite cases: each compiled schema decides every instance right") {
    const auto cases = read_maskbench(std::string(TANDEM_SOURCE_DIR) + "/tests/data/jsts.json");
    int n_compiled = 0, n_tests = 0;
    for (const auto& id_case : cases) {
        const auto& id = id_case.first;
        const auto& c = id_case.second;
        CAPTURE(id);
        compiled g;
        try {
            builder b;
            const rule_id root = add_json_schema(b, c["schema"]);
            g = b.build(root);
        } catch (const grammar_error& e) {
            MESSAGE("refused: ", id, ": ", std::string(e.what()));
            continue;
        }
        ++n_compiled;
        for (const json& t : c["tests"]) {
            const std::string text = python_json_dumps(t["data"]);
            CAPTURE(text);
            CHECK(matches(g, text) == t["valid"].get<bool>());
            ++n_tests;
        }
    }
    MESSAGE(n_compiled, " of ", cases.size(), " suite schemas compiled, ", n_tests, " instances decided");
    CHECK(n_compiled * 10 >= int(cases.size()) * 8);
}
