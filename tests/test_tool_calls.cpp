// Tool calling's text side: the call each family writes is a text of the tools grammar and
// the parser reads it back; the parser's streaming hold-back; the trigger that keeps a reply
// free until it opens a call, checked token by token against the grammar alone.
#include "runtime/chat_template.hpp"
#include "runtime/grammar/guide.hpp"
#include "runtime/grammar/reference.hpp"
#include "runtime/grammar/tool_call.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <ostream>
#include <set>

using namespace tandem;
using namespace tandem::grammar;
using json = nlohmann::json;

namespace {

const std::vector<tool_function>& weather_tools() {
    static const std::vector<tool_function> fns{
        {"get_weather", R"({"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
                            "required": ["city"]})"},
        {"get_time", ""}};
    return fns;
}

std::shared_ptr<const compiled> tools_grammar(tool_syntax s, bool parallel) {
    return compile({constraint::kind::tools, tools_constraint_text(s, weather_tools(), parallel)});
}

struct read_back {
    std::string content;
    std::vector<std::pair<std::string, std::string>> calls; // name, arguments
    bool complete = false;
    bool operator==(const read_back&) const = default;
};

std::ostream& operator<<(std::ostream& os, const read_back& r) {
    os << "content " << json(r.content).dump() << ", calls [";
    for (const auto& [name, args] : r.calls) os << name << " " << json(args).dump() << "; ";
    return os << "], complete " << r.complete;
}

// The parser's events merged, the text fed `chunk` bytes at a time (0: all at once).
read_back parse(tool_syntax s, std::string_view text, size_t chunk = 0) {
    tool_call_parser p(s);
    std::vector<tool_call_parser::event> evs;
    for (size_t at = 0; at < text.size(); at += chunk ? chunk : text.size()) p.feed(text.substr(at, chunk ? chunk : text.size()), evs);
    p.finish(evs);
    read_back r;
    for (const auto& e : evs) {
        using kind = tool_call_parser::event::kind;
        if (e.k == kind::content) r.content += e.text;
        if (e.k == kind::call) {
            REQUIRE(e.index == int32_t(r.calls.size()));
            r.calls.push_back({e.text, ""});
        }
        if (e.k == kind::arguments) {
            REQUIRE(size_t(e.index) < r.calls.size());
            r.calls[size_t(e.index)].second += e.text;
        }
    }
    r.complete = p.calls_complete();
    CHECK(p.n_calls() == int32_t(r.calls.size()));
    return r;
}

void check_any_chunking(tool_syntax s, std::string_view text, const read_back& want) {
    for (const size_t chunk : {0, 1, 2, 3, 5, 11}) {
        CAPTURE(chunk);
        CHECK(parse(s, text, chunk) == want);
    }
}

} // namespace

TEST_CASE("each family's calls, as its template writes them, are texts of the grammar and read back") {
    const std::string args = R"({"city": "Paris", "n": 3})";
    const std::vector<chat_tool_call> calls{{"call_a", "get_weather", R"({"city":"Paris","n":3})"},
                                            {"call_b", "get_time", "{}"}};
    struct family_case {
        chat_family family;
        tool_syntax syntax;
        std::string written; // the calls as the family's reference template renders them
    };
    const family_case cases[] = {
        {chat_family::chatml, tool_syntax::hermes,
         "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args +
             "}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"},
        {chat_family::llama3, tool_syntax::llama3, "{\"name\": \"get_weather\", \"parameters\": " + args + "}"},
    };
    for (const auto& fc : cases) {
        CAPTURE(name_of(fc.syntax));
        const chat_template t = chat_template::of(fc.family);
        REQUIRE(t.tool_syntax() == fc.syntax);
        const bool parallel = layout_of(fc.syntax).parallel;
        const std::vector<chat_message> history{
            {"user", "weather?", {}, {}},
            {"assistant", "", parallel ? calls : std::vector<chat_tool_call>{calls[0]}, {}}};
        CHECK(t.render(history, false).find(fc.written) != std::string::npos);
        CHECK(matches(*tools_grammar(fc.syntax, parallel), fc.written));
        read_back want{"", {{"get_weather", args}}, true};
        if (parallel) want.calls.push_back({"get_time", "{}"});
        check_any_chunking(fc.syntax, fc.written, want);
    }
    // Mistral's history carries the ids; what a model writes does not.
    const std::string mistral = R"([TOOL_CALLS] [{"name": "get_weather", "arguments": )" + args +
                                R"(}, {"name": "get_time", "arguments": {}}])";
    CHECK(matches(*tools_grammar(tool_syntax::mistral, true), mistral));
    check_any_chunking(tool_syntax::mistral, mistral, {"", {{"get_weather", args}, {"get_time", "{}"}}, true});
    // Not parallel: one call, then the end.
    CHECK_FALSE(matches(*tools_grammar(tool_syntax::mistral, false), mistral));
    CHECK_FALSE(matches(*tools_grammar(tool_syntax::hermes, true),
                        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"n\": 3}}\n</tool_call>")); // city is required
    CHECK_FALSE(matches(*tools_grammar(tool_syntax::hermes, true),
                        "<tool_call>\n{\"name\": \"get_wind\", \"arguments\": {}}\n</tool_call>"));
}

TEST_CASE("the parser: content around calls, partial triggers held back, text that breaks the layout") {
    const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"}\\\"{\"}}\n</tool_call>";
    check_any_chunking(tool_syntax::hermes, "Hello there.", {"Hello there.", {}, true});
    check_any_chunking(tool_syntax::hermes, "Let me look.\n" + call, {"Let me look.", {{"f", R"({"s": "}\"{"})"}}, true});
    check_any_chunking(tool_syntax::hermes, "a <tool> b <tool_c", {"a <tool> b <tool_c", {}, true});
    check_any_chunking(tool_syntax::hermes, "ends in space  ", {"ends in space  ", {}, true});
    // Cut inside a call (max_tokens): the call so far, not complete.
    check_any_chunking(tool_syntax::hermes, call.substr(0, 47), {"", {{"f", R"({"s": "})"}}, false}); // a brace in a string
    // Not the layout: everything from the trigger is content after all.
    check_any_chunking(tool_syntax::hermes, "x <tool_call> oops", {"x<tool_call> oops", {}, true});
    // Llama 3: a call only as the whole reply.
    check_any_chunking(tool_syntax::llama3, "Sure: {\"name\": \"f\"}", {"Sure: {\"name\": \"f\"}", {}, true});
    check_any_chunking(tool_syntax::llama3, "{\"name\": \"f\", \"parameters\": {}}", {"", {{"f", "{}"}}, true});
    check_any_chunking(tool_syntax::llama3, "", {"", {}, true});
}

namespace {

// A vocabulary of a few pieces around the hermes trigger; token 0 ends the text.
std::shared_ptr<const vocab_trie> trigger_vocab() {
    static const auto v = std::make_shared<const vocab_trie>(
        std::vector<std::string>{"", "a", " b", "<", "<tool", "_call>", "<tool_call>", "\n", "{\"", "<tool_call>\n",
                                 "<tool_call>x", "_call>\n{\"", "_call>!", "name", "x<tool_call>\n{", "{x"},
                                 std::vector<token_id>{0});
    return v;
}

token_id id_of(std::string_view piece) {
    const auto& v = *trigger_vocab();
    for (token_id t = 0; t < v.n_vocab(); ++t)
        if (v.piece(t) == piece) return t;
    FAIL("no piece ", std::string(piece));
    return -1;
}

// The tokens a processor bans from here.
std::set<std::string> banned_by(logits_processor& p) {
    const auto& v = *trigger_vocab();
    std::vector<float> logits(size_t(v.n_vocab()), 0.0f);
    p.apply(logits, {});
    std::set<std::string> out;
    for (token_id t = 0; t < v.n_vocab(); ++t)
        if (std::isinf(logits[size_t(t)])) out.insert(t == 0 ? "<end>" : v.piece(t));
    return out;
}

// The tokens the reference recognizer bans after `text`: those it cannot go on with, and the
// end unless the text is whole.
std::set<std::string> reference_banned(const compiled& g, const std::string& text) {
    const auto& v = *trigger_vocab();
    std::set<std::string> out;
    if (!matches(g, text)) out.insert("<end>");
    for (token_id t = 1; t < v.n_vocab(); ++t)
        if (!is_prefix(g, text + v.piece(t))) out.insert(v.piece(t));
    return out;
}

} // namespace

TEST_CASE("a trigger keeps the reply free until it opens a call; from there the grammar's mask applies") {
    const auto cache = std::make_shared<mask_cache>(
        compile({constraint::kind::tools, tools_constraint_text(tool_syntax::hermes, {{{"f", ""}}}, false)}),
        trigger_vocab());
    auto table = std::make_shared<const trigger_table>(*trigger_vocab(), "<tool_call>", false);
    auto p = make_grammar_processor(cache, nullptr, table);

    // Free: only a token that completes the trigger with bytes the call cannot start with.
    CHECK(banned_by(*p) == std::set<std::string>{"<tool_call>x"});
    p->accept(id_of("a"));
    p->accept(id_of("<tool")); // a partial trigger: what completes it must continue the call
    const auto partial = banned_by(*p);
    CHECK(partial == std::set<std::string>{"<tool_call>x", "_call>!"});
    auto fork = p->clone();

    // Opened: the mask is the grammar's, as a processor without a trigger has it there.
    p->accept(id_of("_call>"));
    auto plain = make_grammar_processor(cache);
    plain->accept(id_of("<tool_call>"));
    CHECK(banned_by(*p) == banned_by(*plain));
    CHECK(banned_by(*p).contains("a"));
    CHECK(banned_by(*p).contains("<end>"));
    p->accept(id_of("\n"));
    plain->accept(id_of("\n"));
    CHECK(banned_by(*p) == banned_by(*plain));
    CHECK(banned_by(*p) == reference_banned(*cache->grammar(), "<tool_call>\n"));

    // Rewound (rejected drafts) it is free again, and the fork never left.
    p->rewind(2);
    CHECK(banned_by(*p) == partial);
    CHECK(banned_by(*fork) == partial);
    p->rewind(2);
    CHECK(banned_by(*p) == std::set<std::string>{"<tool_call>x"});
    // A token that holds the trigger mid-piece opens the call there; from then on a token is
    // allowed exactly where the reference recognizer says the call can go on with it.
    p->accept(id_of("x<tool_call>\n{"));
    CHECK(banned_by(*p) == reference_banned(*cache->grammar(), "<tool_call>\n{"));
}

TEST_CASE("an anchored trigger counts only at the start of the reply") {
    const auto cache = std::make_shared<mask_cache>(
        compile({constraint::kind::tools, tools_constraint_text(tool_syntax::llama3, {{{"f", ""}}}, false)}),
        trigger_vocab());
    auto table = std::make_shared<const trigger_table>(*trigger_vocab(), "{", true);
    auto p = make_grammar_processor(cache, nullptr, table);
    CHECK(banned_by(*p) == std::set<std::string>{"{x"}); // {" may begin {"name": ...
    auto late = p->clone();
    p->accept(id_of("{\""));
    CHECK(banned_by(*p).contains("a"));
    late->accept(id_of("a"));
    CHECK(banned_by(*late).empty()); // past the start, nothing opens a call
    late->accept(id_of("{x"));
    CHECK(banned_by(*late).empty());
}

TEST_CASE("a tools constraint of another shape is a grammar_error, never another exception") {
    // Found by fuzz_grammar: a function without "parameters" threw nlohmann's out_of_range
    // out of compile(), which promises a grammar_error (the daemon catches that one only).
    const char* const specs[] = {
        R"({"syntax": "hermes", "parallel": true, "tools": [{"name": "f", "parameter3": null}]})",
        R"({"syntax": "hermes", "parallel": true, "tools": [{"parameters": null}]})",
        R"({"syntax": "hermes", "parallel": true, "tools": [{"name": 7, "parameters": null}]})",
        R"({"syntax": "hermes", "parallel": true, "tools": {"name": "f"}})",
        R"({"syntax": "hermes", "tools": [{"name": "f", "parameters": null}]})",
        R"({"syntax": "hermes", "parallel": 1, "tools": [{"name": "f", "parameters": null}]})",
        R"({"parallel": true, "tools": []})",
        R"([1, 2])",
        R"({"syntax": "hermes", "parallel": true, "tools": [3]})",
    };
    for (const char* spec : specs) {
        CAPTURE(spec);
        CHECK_THROWS_AS(compile({constraint::kind::tools, spec}), grammar_error);
    }
    CHECK(compile({constraint::kind::tools, R"({"syntax": "hermes", "parallel": false, "tools": [{"name": "f", "parameters": null}]})"}));
}
