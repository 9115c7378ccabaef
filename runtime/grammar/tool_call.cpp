#include "runtime/grammar/tool_call.hpp"

#include "runtime/grammar/json_schema.hpp"

#include <nlohmann/json.hpp>

#include <cctype>
#include <utility>

namespace tandem::grammar {

std::string_view name_of(tool_syntax s) {
    switch (s) {
    case tool_syntax::hermes: return "hermes";
    case tool_syntax::llama3: return "llama3";
    case tool_syntax::mistral: return "mistral";
    }
    return "hermes";
}

const call_layout& layout_of(tool_syntax s) {
    // Each as its family's templates render an assistant turn's tool_calls.
    static const call_layout hermes{"<tool_call>", false, "\n{\"name\": \"", "\", \"arguments\": ", "}\n</tool_call>",
                                    "\n<tool_call>\n{\"name\": \"", "", true};
    static const call_layout llama3{"{", true, "\"name\": \"", "\", \"parameters\": ", "}", "", "", false};
    static const call_layout mistral{"[TOOL_CALLS]", false, " [{\"name\": \"", "\", \"arguments\": ", "}",
                                     ", {\"name\": \"", "]", true};
    switch (s) {
    case tool_syntax::hermes: return hermes;
    case tool_syntax::llama3: return llama3;
    case tool_syntax::mistral: return mistral;
    }
    return hermes;
}

std::string tools_constraint_text(tool_syntax s, std::span<const tool_function> functions, bool parallel) {
    nlohmann::ordered_json tools = nlohmann::ordered_json::array();
    for (const auto& f : functions)
        tools.push_back({{"name", f.name},
                         {"parameters", f.parameters.empty() ? nlohmann::ordered_json(nullptr)
                                                             : nlohmann::ordered_json::parse(f.parameters, nullptr, false)}});
    return nlohmann::ordered_json{{"syntax", name_of(s)}, {"parallel", parallel}, {"tools", tools}}.dump();
}

namespace {

tool_syntax syntax_named(const nlohmann::ordered_json& j) {
    for (const tool_syntax s : {tool_syntax::hermes, tool_syntax::llama3, tool_syntax::mistral})
        if (j.is_string() && j.get<std::string>() == name_of(s)) return s;
    reject("unknown tool call syntax {}", j.dump());
}

// A function's arguments: always a JSON object. No schema, or an empty one, is any object; a
// schema without `type` is read as an object schema.
rule_id arguments_rule(builder& b, const nlohmann::ordered_json& params, const json_options& opt) {
    if (params.is_null() || (params.is_object() && params.empty())) return add_json_object(b, opt);
    if (!params.is_object()) reject("must be a JSON Schema object, not {}", params.dump());
    const auto type = params.find("type");
    if (type == params.end()) {
        nlohmann::ordered_json object_schema = params;
        object_schema["type"] = "object";
        return add_json_schema(b, object_schema, opt);
    }
    if (*type != "object") reject("must describe an object (type \"object\"), not type {}", type->dump());
    return add_json_schema(b, params, opt);
}

} // namespace

rule_id add_tool_calls(builder& b, const nlohmann::ordered_json& spec, const json_options& opt) {
    // A spec that is not tools_constraint_text's shape is refused like any bad constraint.
    const auto field = [](const nlohmann::ordered_json& j, const char* key) -> const nlohmann::ordered_json& {
        if (!j.is_object() || !j.contains(key)) reject("a tools constraint needs '{}'", key);
        return j[key];
    };
    const call_layout& lay = layout_of(syntax_named(field(spec, "syntax")));
    const nlohmann::ordered_json& tools = field(spec, "tools");
    const nlohmann::ordered_json& parallel = field(spec, "parallel");
    if (!tools.is_array() || !parallel.is_boolean()) reject("a tools constraint has 'tools' [...] and 'parallel' true|false");
    std::vector<expr> calls;
    for (const auto& f : tools) {
        if (!field(f, "name").is_string()) reject("a tool's name must be a string");
        const std::string name = f["name"].get<std::string>();
        rule_id args = 0;
        try {
            args = arguments_rule(b, field(f, "parameters"), opt);
        } catch (const grammar_error& e) {
            reject("function '{}': parameters {}", name, e.what());
        }
        calls.push_back(seq({lit(name + lay.mid), ref(args), lit(lay.close)}));
    }
    if (calls.empty()) reject("no functions to call");
    const rule_id call = b.add("call", alt(std::move(calls)));
    std::vector<expr> reply{lit(lay.trigger + lay.open), ref(call)};
    if (lay.parallel && parallel.get<bool>()) reply.push_back(star(seq({lit(lay.sep), ref(call)})));
    reply.push_back(lit(lay.end));
    return b.add("tool_calls", seq(std::move(reply)));
}

// ---- the parser

tool_call_parser::tool_call_parser(tool_syntax s) : syntax_(s), lay_(layout_of(s)) {
    TANDEM_ASSERT(lay_.mid.starts_with('"'), "a layout's mid closes the name's string");
}

void tool_call_parser::emit_content(std::string_view s, std::vector<event>& out) {
    if (s.empty()) return;
    if (!out.empty() && out.back().k == event::kind::content)
        out.back().text.append(s);
    else
        out.push_back({event::kind::content, 0, std::string(s)});
}

void tool_call_parser::expect(std::string_view literal, next then) {
    TANDEM_ASSERT(!literal.empty(), "layouts expect no empty literal");
    lit_ = literal;
    lit_at_ = 0;
    then_ = then;
    state_ = state::literal;
}

void tool_call_parser::feed(std::string_view text, std::vector<event>& out) {
    if (state_ == state::broken) return emit_content(text, out);
    if (state_ != state::content) {
        for (const char c : text) step(c, out);
        return;
    }
    held_.append(text);
    const std::string_view trig = lay_.trigger;
    size_t at = std::string_view::npos;
    if (lay_.anchored) {
        if (seen_text_) return emit_content(std::exchange(held_, {}), out);
        if (held_.size() < trig.size() && trig.starts_with(held_)) return; // may still open a call
        if (!held_.starts_with(trig)) {
            seen_text_ = true;
            return emit_content(std::exchange(held_, {}), out);
        }
        at = 0;
    } else {
        at = held_.find(trig);
    }
    if (at == std::string::npos) {
        // Hold back the longest end that begins the trigger, and the whitespace before it.
        size_t keep = std::min(held_.size(), trig.size() - 1);
        while (keep > 0 && !trig.starts_with(std::string_view(held_).substr(held_.size() - keep))) --keep;
        size_t cut = held_.size() - keep;
        while (cut > 0 && std::isspace(static_cast<unsigned char>(held_[cut - 1]))) --cut;
        emit_content(std::string_view(held_).substr(0, cut), out);
        held_.erase(0, cut);
        return;
    }
    size_t content_end = at;
    while (content_end > 0 && std::isspace(static_cast<unsigned char>(held_[content_end - 1]))) --content_end;
    emit_content(std::string_view(held_).substr(0, content_end), out);
    const std::string rest = held_.substr(at + trig.size());
    held_.clear();
    seen_text_ = true;
    raw_ = trig;
    expect(lay_.open, next::name);
    for (const char c : rest) step(c, out);
}

void tool_call_parser::step(char c, std::vector<event>& out) {
    if (state_ == state::broken) return emit_content(std::string_view(&c, 1), out);
    raw_.push_back(c);
    auto broken = [&] { // not the layout (text the grammar did not shape): content after all
        state_ = state::broken;
        emit_content(std::exchange(raw_, {}), out);
    };
    switch (state_) {
    case state::literal:
        if (c != lit_[lit_at_]) return broken();
        if (++lit_at_ < lit_.size()) return;
        switch (then_) {
        case next::name: state_ = state::name; return;
        case next::args: state_ = state::args; depth_ = 0; in_string_ = escaped_ = false; return;
        case next::after_call: state_ = state::after_call; raw_.clear(); return;
        case next::done: state_ = state::done; return;
        }
        return;
    case state::name:
        if (c != '"') {
            name_.push_back(c);
            return;
        }
        out.push_back({event::kind::call, n_calls_++, std::exchange(name_, {})});
        expect(std::string_view(lay_.mid).substr(1), next::args);
        return;
    case state::args: {
        if (depth_ == 0 && c != '{') return broken();
        if (in_string_) {
            if (escaped_) escaped_ = false;
            else if (c == '\\') escaped_ = true;
            else if (c == '"') in_string_ = false;
        } else if (c == '"') {
            in_string_ = true;
        } else if (c == '{' || c == '[') {
            ++depth_;
        } else if (c == '}' || c == ']') {
            --depth_;
        }
        if (!out.empty() && out.back().k == event::kind::arguments && out.back().index == n_calls_ - 1)
            out.back().text.push_back(c);
        else
            out.push_back({event::kind::arguments, n_calls_ - 1, std::string(1, c)});
        if (depth_ == 0) expect(lay_.close, next::after_call);
        return;
    }
    case state::after_call:
        if (!lay_.end.empty() && c == lay_.end[0]) {
            expect(lay_.end, next::done);
        } else if (lay_.parallel && !lay_.sep.empty() && c == lay_.sep[0]) {
            expect(lay_.sep, next::name);
        } else {
            return broken();
        }
        if (++lit_at_ == lit_.size()) state_ = then_ == next::done ? state::done : state::name;
        return;
    case state::done: return broken();
    case state::content:
    case state::broken: return;
    }
}

void tool_call_parser::finish(std::vector<event>& out) {
    if (state_ == state::content) emit_content(std::exchange(held_, {}), out);
}

} // namespace tandem::grammar
