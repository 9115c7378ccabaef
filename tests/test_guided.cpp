// Guided generation end to end: a model with random weights and the real 32,000-token
// vocabulary (the hardest case for a mask: it wants any token) samples at temperature 1 under
// generated JSON schemas, regular expressions, GBNF grammars and choices. Every output must
// validate (by checkers written apart from the grammar engine), or have stopped at max_tokens
// as a prefix the grammar can still complete.
#include "cpu/thread_pool.hpp"
#include "json_schema_check.hpp"
#include "runtime/generate.hpp"
#include "runtime/gguf.hpp"
#include "runtime/grammar/gbnf.hpp"
#include "runtime/grammar/guide.hpp"
#include "runtime/grammar/reference.hpp"
#include "runtime/grammar/tool_call.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <regex>

using namespace tandem;
using json = nlohmann::json;

namespace {

model_bundle& tiny_random() {
    static model_bundle b = load_model(test::model_path("llama-2-tiny-random.gguf"));
    return b;
}

const std::shared_ptr<const grammar::vocab_trie>& vocab() {
    static const auto v = grammar::vocab_trie::of(*tiny_random().tok);
    return v;
}

struct sampled {
    std::string text;
    std::string finish_reason;
    std::vector<token_id> tokens;
};

// A trigger (tool_choice auto): free text until it appears; the `favoured` tokens get
// `bias` so that a random model meets it.
struct auto_calls {
    std::string trigger;
    bool anchored = false;
    float bias = 0;
    std::vector<token_id> favoured;
};

// One completion under constraint c at temperature 1, with drafts when `draft` > 0.
sampled sample(const grammar::constraint& c, uint64_t seed, int32_t max_tokens, int32_t draft = 0,
               float temperature = 1.0f, const auto_calls* calls = nullptr) {
    static cpu::thread_pool pool(1);
    model_bundle& b = tiny_random();
    // A little classification ahead: masks come from both paths (ahead, and when first met).
    auto cache = std::make_shared<grammar::mask_cache>(grammar::compile(c), vocab(), std::chrono::milliseconds(20));
    generate_params p;
    p.request.max_tokens = max_tokens;
    p.request.sampling.temperature = temperature;
    p.request.sampling.seed = seed;
    p.request.draft_tokens = draft;
    std::shared_ptr<const grammar::trigger_table> trigger;
    if (calls) {
        trigger = std::make_shared<const grammar::trigger_table>(*vocab(), calls->trigger, calls->anchored);
        for (const token_id t : calls->favoured) p.request.sampling.logit_bias.emplace_back(t, calls->bias);
    }
    p.request.make_processor = [cache, trigger] { return grammar::make_grammar_processor(cache, nullptr, trigger); };
    const auto r = generate(exec_ctx{backend::cpu, &pool}, *b.mdl, *b.tok, b.tok->encode("Data:", true), p);
    return {r.text, r.finish_reason, r.tokens};
}

// A text cut at max_tokens must still begin some text of the grammar.
void check_cut(const grammar::constraint& c, const sampled& s) {
    REQUIRE(s.finish_reason == "length");
    CHECK(grammar::is_prefix(*grammar::compile(c), s.text));
}

} // namespace

TEST_CASE("generated JSON schemas: every sampled output validates (or is a cut prefix)") {
    int n_whole = 0, n_cut = 0;
    for (uint64_t seed = 1; seed <= 120; ++seed) {
        const json schema = schema_check::schema_generator(seed).root();
        const grammar::constraint c{grammar::constraint::kind::json_schema, schema.dump()};
        const sampled s = sample(c, seed, 96);
        CAPTURE(schema.dump());
        CAPTURE(s.text);
        if (s.finish_reason == "stop") {
            const json v = json::parse(s.text, nullptr, false);
            REQUIRE_FALSE(v.is_discarded());
            CHECK(schema_check::validator(schema).valid(v));
            ++n_whole;
        } else {
            check_cut(c, s);
            ++n_cut;
        }
    }
    MESSAGE(n_whole << " whole, " << n_cut << " cut at max_tokens");
    CHECK(n_whole > 20); // the test must see whole outputs, not only prefixes
}

TEST_CASE("json_object: any object, parsed") {
    for (uint64_t seed = 1; seed <= 20; ++seed) {
        const grammar::constraint c{grammar::constraint::kind::json_object, ""};
        const sampled s = sample(c, seed, 64);
        CAPTURE(s.text);
        if (s.finish_reason == "length") {
            check_cut(c, s);
            continue;
        }
        const json v = json::parse(s.text, nullptr, false);
        CHECK(v.is_object());
    }
}

TEST_CASE("regular expressions: every whole output matches (std::regex, ECMAScript)") {
    const std::vector<std::string> patterns{
        R"([0-9]{3}-[0-9]{4})", R"((yes|no|maybe))", R"([A-Z][a-z]{1,8}( [A-Z][a-z]{1,8})?)",
        R"(\d{4}-\d{2}-\d{2})", R"(#[0-9a-fA-F]{6})", R"((\w+@\w+\.(com|org)))", R"([^\n]{0,20}\.)",
        R"(-?\d+(\.\d{1,3})?)", R"((ab|cd)*e)", R"([a-c]{2,4}x?)"};
    // std::regex over bytes would count a multi-byte character as several; over wchar_t
    // (UTF-32 here) it counts characters, as the grammar does.
    const auto wide = [](const std::string& s) {
        std::wstring w;
        for (size_t i = 0; i < s.size();) {
            const auto b = uint8_t(s[i]);
            const int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
            uint32_t c = n == 1 ? b : b & (0x7F >> n);
            for (int k = 1; k < n; ++k) c = c << 6 | (uint8_t(s[i + size_t(k)]) & 0x3F);
            w.push_back(wchar_t(c));
            i += size_t(n);
        }
        return w;
    };
    for (size_t i = 0; i < patterns.size(); ++i) {
        const std::wregex re(wide(patterns[i]), std::regex::ECMAScript);
        for (uint64_t seed = 1; seed <= 6; ++seed) {
            const grammar::constraint c{grammar::constraint::kind::regex, patterns[i]};
            const sampled s = sample(c, seed * 31 + i, 48);
            CAPTURE(patterns[i]);
            CAPTURE(s.text);
            if (s.finish_reason == "stop") CHECK(std::regex_match(wide(s.text), re));
            else check_cut(c, s);
        }
    }
}

TEST_CASE("GBNF grammars: every whole output is a text of the grammar (reference matcher)") {
    const std::vector<std::string> grammars{
        "root ::= \"(\" expr \")\"\nexpr ::= term ([-+*/] term)*\nterm ::= [0-9]+ | \"(\" expr \")\"\n",
        "root ::= item (\", \" item){0,3}\nitem ::= (\"apple\" | \"pear\" | [a-z]{2,5}) [.!]?\n",
        "root ::= \"- \" [^\\n]{1,30} \"\\n\" (\"- \" [^\\n]{1,30} \"\\n\")?\n",
        "root ::= move (\" \" move)*\nmove ::= [KQRBN]? [a-h] [1-8] (\"+\" | \"#\")?\n"};
    for (size_t i = 0; i < grammars.size(); ++i) {
        const grammar::constraint c{grammar::constraint::kind::gbnf, grammars[i]};
        const auto g = grammar::compile(c);
        for (uint64_t seed = 1; seed <= 6; ++seed) {
            const sampled s = sample(c, seed * 17 + i, 48);
            CAPTURE(grammars[i]);
            CAPTURE(s.text);
            if (s.finish_reason == "stop") CHECK(grammar::matches(*g, s.text));
            else check_cut(c, s);
        }
    }
}

TEST_CASE("choices: the output is one of them") {
    const std::vector<std::string> choices{"red", "green", "blue", "reddish brown", "\"quoted\"", "€uro"};
    const grammar::constraint c{grammar::constraint::kind::choice, json(choices).dump()};
    for (uint64_t seed = 1; seed <= 20; ++seed) {
        const sampled s = sample(c, seed, 16);
        CAPTURE(s.text);
        REQUIRE(s.finish_reason == "stop");
        CHECK(std::find(choices.begin(), choices.end(), s.text) != choices.end());
    }
}

TEST_CASE("speculative decoding under a grammar: the same tokens as plain decoding") {
    // Drafts the grammar rejects are rejected by the mask at verification, so drafting changes
    // nothing: greedy and sampled outputs are token for token those of plain decoding.
    const grammar::constraint c{grammar::constraint::kind::regex, R"(((ab|ba)c ){4,12})"};
    for (const float temperature : {0.0f, 1.0f}) {
        for (uint64_t seed = 1; seed <= 4; ++seed) {
            const sampled plain = sample(c, seed, 48, 0, temperature);
            const sampled drafted = sample(c, seed, 48, 4, temperature);
            CAPTURE(temperature);
            CHECK(plain.tokens == drafted.tokens);
        }
    }
}

namespace {

// Tool parameters from a generated schema: {"v": schema} as an object, the $defs lifted to
// the parameters' root so the refs still resolve.
json tool_parameters(uint64_t seed) {
    json g = schema_check::schema_generator(seed).root();
    const char* key = g.contains("definitions") ? "definitions" : "$defs";
    json params = {{"type", "object"}, {"properties", json::object()}, {"required", {"v"}}};
    if (g.contains(key)) {
        params[key] = g[key];
        g.erase(key);
    }
    params["properties"]["v"] = g;
    return params;
}

struct read_calls {
    std::string content;
    std::vector<std::pair<std::string, std::string>> calls;
    bool complete = false;
};

read_calls read_reply(grammar::tool_syntax syntax, const std::string& text) {
    grammar::tool_call_parser parser(syntax);
    std::vector<grammar::tool_call_parser::event> evs;
    parser.feed(text, evs);
    parser.finish(evs);
    read_calls r;
    for (const auto& e : evs) {
        using kind = grammar::tool_call_parser::event::kind;
        if (e.k == kind::content) r.content += e.text;
        if (e.k == kind::call) r.calls.push_back({e.text, ""});
        if (e.k == kind::arguments) r.calls[size_t(e.index)].second += e.text;
    }
    r.complete = parser.calls_complete();
    return r;
}

// Every call names one of `fns` and its arguments are valid under that function's parameters.
void check_calls(const read_calls& r, const std::vector<grammar::tool_function>& fns) {
    for (const auto& call : r.calls) {
        const std::string& name = call.first; // no structured binding: clang 14 cannot CAPTURE one
        const std::string& args = call.second;
        CAPTURE(name);
        CAPTURE(args);
        const auto f = std::find_if(fns.begin(), fns.end(), [&](const auto& fn) { return fn.name == name; });
        REQUIRE(f != fns.end());
        const json v = json::parse(args, nullptr, false);
        REQUIRE_FALSE(v.is_discarded());
        CHECK(schema_check::validator(json::parse(f->parameters)).valid(v));
    }
}

} // namespace

TEST_CASE("tool calls (tool_choice required): every sampled call names an offered function, its arguments valid") {
    using grammar::tool_syntax;
    int n_calls = 0, n_cut = 0;
    for (uint64_t seed = 1; seed <= 30; ++seed) {
        std::vector<grammar::tool_function> fns;
        for (int k = 0; k < 2; ++k) fns.push_back({fmt::format("fn_{}", k), tool_parameters(seed * 2 + uint64_t(k)).dump()});
        const tool_syntax syntax = std::array{tool_syntax::hermes, tool_syntax::llama3, tool_syntax::mistral}[seed % 3];
        // (closed objects: a random model would fill the specification's open objects with keys
        // of its own until max_tokens)
        const grammar::constraint c{grammar::constraint::kind::tools,
                                    grammar::tools_constraint_text(syntax, fns, seed % 2 == 0),
                                    grammar::whitespace::bounded, true};
        const sampled s = sample(c, seed, 160);
        CAPTURE(s.text);
        CAPTURE(s.tokens.size());
        CAPTURE(s.finish_reason);
        const read_calls r = read_reply(syntax, s.text);
        if (s.finish_reason == "stop") {
            CHECK(r.complete);
            CHECK(r.content.empty());
            REQUIRE_FALSE(r.calls.empty());
            check_calls(r, fns);
            n_calls += int(r.calls.size());
        } else {
            check_cut(c, s);
            ++n_cut;
        }
    }
    MESSAGE(n_calls << " whole calls, " << n_cut << " replies cut at max_tokens");
    CHECK(n_calls >= 10);
}

TEST_CASE("a trigger (tool_choice auto): free text, then the grammar from the trigger on; drafting changes nothing") {
    // A one-byte trigger that a random model meets often (its tokens favoured), on the whole
    // 32,000-token vocabulary: a token holding "@" is allowed only when the grammar takes the
    // rest of it. (Tool calls' own triggers are checked on a small vocabulary in
    // test_tool_calls; a random model seldom spells "<tool_call>".)
    const grammar::constraint c{grammar::constraint::kind::regex, "@[a-z]{2,6}!"};
    const auto g = grammar::compile(c);
    auto_calls calls{"@", false, 0};
    for (token_id t = 0; t < vocab()->n_vocab(); ++t)
        if (vocab()->piece(t).find('@') != std::string::npos) calls.favoured.push_back(t);
    calls.bias = 4.0f;
    int n_opened = 0, n_whole = 0;
    for (uint64_t seed = 1; seed <= 24; ++seed) {
        const sampled s = sample(c, seed, 64, 0, 1.0f, &calls);
        CAPTURE(s.text);
        const size_t at = s.text.find('@');
        if (at == std::string::npos) continue;
        ++n_opened;
        const std::string tail = s.text.substr(at);
        if (s.finish_reason == "stop") {
            CHECK(grammar::matches(*g, tail));
            ++n_whole;
        } else {
            CHECK(grammar::is_prefix(*g, tail));
        }
        if (seed <= 8) CHECK(sample(c, seed, 64, 4, 1.0f, &calls).tokens == s.tokens);
    }
    MESSAGE(n_opened << " of 24 replies met the trigger, " << n_whole << " finished the grammar");
    CHECK(n_whole >= 4);
}

TEST_CASE("a constraint that cannot be honoured is an error naming it") {
    const auto fails = [](grammar::constraint::kind k, const std::string& text, const std::string& what) {
        CAPTURE(text);
        CHECK_THROWS_WITH_AS(grammar::compile({k, text}), doctest::Contains(what.c_str()), grammar::grammar_error);
    };
    using kind = grammar::constraint::kind;
    fails(kind::json_schema, R"({"type":"array","uniqueItems":true})", "uniqueItems");
    fails(kind::json_schema, R"({"properties":{"a":{"type":"array","uniqueItems":true}}})", "/properties/a");
    fails(kind::json_schema, "{not json", "not valid JSON");
    fails(kind::regex, "(a)\\1", "backreference");
    fails(kind::gbnf, "root ::= undefined-rule", "undefined-rule");
    fails(kind::choice, "[]", "non-empty");
}
