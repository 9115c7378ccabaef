// Tool calling's text side: how each chat family writes a function call, the grammar of the
// calls a request's tools allow, and the parser that splits a reply into content and calls.
//
// A family's calls are written byte for byte as its layout says (the form its templates
// render past calls in, so the model's training form):
//   trigger open NAME mid ARGS close (sep NAME mid ARGS close)* end
// where NAME is one of the request's function names and ARGS that function's arguments, a
// JSON object valid under its parameters schema. The grammar is exactly that; the parser
// reads exactly that, so what the grammar lets a model write the parser reads back.
#pragma once

#include "runtime/grammar/json_schema.hpp"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::grammar {

enum class tool_syntax : uint8_t {
    hermes,  // <tool_call>\n{"name": ..., "arguments": ...}\n</tool_call> (Qwen, Hermes; the generic form)
    llama3,  // {"name": ..., "parameters": ...} as the whole reply (Llama 3.1 and later)
    mistral, // [TOOL_CALLS] [{"name": ..., "arguments": ...}, ...]
};

std::string_view name_of(tool_syntax s);

struct call_layout {
    std::string trigger; // where calls begin (free text before it, with tool_choice auto)
    bool anchored;       // the trigger counts only at the very start of the reply
    std::string open, mid, close, sep, end;
    bool parallel; // the syntax can write several calls in one reply
};

const call_layout& layout_of(tool_syntax s);

// A function a request offers: its name and its parameters' JSON Schema as JSON text (""
// for "any object").
struct tool_function {
    std::string name;
    std::string parameters;
};

// The text of a tools constraint (constraint::kind::tools): the syntax, the functions, and
// whether one reply may hold several calls.
std::string tools_constraint_text(tool_syntax s, std::span<const tool_function> functions, bool parallel);

// The rule for a reply of calls, trigger included, from a tools constraint's text. A
// function's parameters that cannot be honoured are a grammar_error naming the function.
rule_id add_tool_calls(builder& b, const nlohmann::ordered_json& spec, const json_options& opt = {});

// Reads a reply as it streams: content until the trigger, then the calls. Text that may
// still turn out to open a call (a partial trigger, and the whitespace before it) is held
// back until it is known.
class tool_call_parser {
public:
    explicit tool_call_parser(tool_syntax s);

    struct event {
        enum class kind : uint8_t { content, call, arguments };
        kind k = kind::content;
        int32_t index = 0; // call and arguments: which call
        std::string text;  // content text; a call's function name; a piece of its arguments
    };

    void feed(std::string_view text, std::vector<event>& out);
    // The reply ended: held-back text is content after all.
    void finish(std::vector<event>& out);

    tool_syntax syntax() const { return syntax_; }
    int32_t n_calls() const { return n_calls_; }
    // No call was left unfinished (one that broke off the layout became content).
    bool calls_complete() const {
        return state_ == state::content || state_ == state::after_call || state_ == state::done ||
               state_ == state::broken;
    }

private:
    enum class state : uint8_t { content, literal, name, args, after_call, done, broken };
    enum class next : uint8_t { name, args, after_call, done };

    void emit_content(std::string_view s, std::vector<event>& out);
    void expect(std::string_view literal, next then);
    void step(char c, std::vector<event>& out);

    tool_syntax syntax_;
    const call_layout& lay_;
    state state_ = state::content;
    std::string held_;      // content held back
    std::string raw_;       // the reply's text since the trigger (given back as content if it breaks)
    bool seen_text_ = false; // anchored layouts: a byte of the reply has been read
    std::string_view lit_;  // state literal: what must come, and what then
    size_t lit_at_ = 0;
    next then_ = next::name;
    std::string name_;
    int32_t depth_ = 0;
    bool in_string_ = false, escaped_ = false;
    int32_t n_calls_ = 0;
};

} // namespace tandem::grammar
