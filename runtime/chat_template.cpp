// Chat templates: family detection from the Jinja source, and native renderers that follow
// each family's reference template character for character.
#include "runtime/chat_template.hpp"

#include "runtime/gguf.hpp"
#include "runtime/grammar/tool_call.hpp"
#include "runtime/tokenizer.hpp"

#include <nlohmann/json.hpp>

#include <ctime>
#include <optional>

namespace tandem {

namespace {

bool has(std::string_view s, std::string_view needle) { return s.find(needle) != std::string_view::npos; }

// Python's str.strip() / Jinja's trim, on ASCII whitespace.
std::string_view trim(std::string_view s) {
    constexpr std::string_view ws = " \t\n\r\f\v";
    const size_t b = s.find_first_not_of(ws);
    if (b == std::string_view::npos) return {};
    return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Either quoting style of a Jinja string literal: has_literal(src, " [INST] ") looks for
// ' [INST] ' and " [INST] ".
bool has_literal(std::string_view src, std::string_view text) {
    for (char q : {'\'', '"'}) {
        std::string lit(1, q);
        lit.append(text);
        lit.push_back(q);
        if (has(src, lit)) return true;
    }
    return false;
}

// The text of a Jinja string literal's body (escapes resolved), or nullopt when `body` is
// not plain literal text (it holds a quote, an expression or a statement).
std::optional<std::string> unescape_literal(std::string_view body) {
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
        const char c = body[i];
        if (c == '\'' || c == '"' || c == '{' || c == '}') return std::nullopt;
        if (c != '\\') {
            out.push_back(c);
            continue;
        }
        if (++i == body.size()) return std::nullopt;
        switch (body[i]) {
        case 'n': out.push_back('\n'); break;
        case 't': out.push_back('\t'); break;
        case '\\': out.push_back('\\'); break;
        default: return std::nullopt;
        }
    }
    return out;
}

// Qwen-style chatml templates add a system turn when the conversation has none; its text is
// the literal between "<|im_start|>system\n" and "<|im_end|>" (the branch that is not
// messages[0]['content']).
std::string chatml_default_system(std::string_view src) {
    constexpr std::string_view head = "<|im_start|>system";
    for (size_t at = src.find(head); at != std::string_view::npos; at = src.find(head, at + 1)) {
        std::string_view rest = src.substr(at + head.size());
        if (rest.starts_with("\\n"))
            rest.remove_prefix(2);
        else if (rest.starts_with("\n"))
            rest.remove_prefix(1);
        else
            continue;
        const size_t end = rest.find("<|im_end|>");
        if (end == std::string_view::npos || end == 0) continue;
        if (auto text = unescape_literal(rest.substr(0, end))) return *text;
    }
    return {};
}

// Llama 3.1-style templates open with a dated system header; the default date is the
// literal of `set date_string = "..."`.
std::string llama3_date(std::string_view src) {
    constexpr std::string_view key = "set date_string = ";
    const size_t at = src.find(key);
    if (at == std::string_view::npos || at + key.size() >= src.size()) return "26 Jul 2024";
    const char q = src[at + key.size()];
    const size_t b = at + key.size() + 1, e = src.find(q, b);
    if ((q != '"' && q != '\'') || e == std::string_view::npos) return "26 Jul 2024";
    return std::string(src.substr(b, e - b));
}

// out += a + b + ...: appended piece by piece (no temporaries, and none of GCC 12's
// -Wrestrict false positives on chained std::string +).
template <class... Parts>
void append(std::string& out, const Parts&... parts) {
    (out.append(std::string_view(parts)), ...);
}

// strftime_now("%d %b %Y") in the local time zone, as transformers renders it.
std::string today_date() {
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[32];
    return std::strftime(buf, sizeof buf, "%d %b %Y", &tm) ? buf : "26 Jul 2024";
}

std::string capitalized(std::string_view role) {
    std::string s(role);
    if (!s.empty() && s[0] >= 'a' && s[0] <= 'z') s[0] = char(s[0] - 'a' + 'A');
    return s;
}

// Python's json.dumps as transformers' tojson calls it (ensure_ascii off): ", " and ": "
// between items; with an indent, each item on its own line and "," after it.
void py_json(std::string& out, const nlohmann::ordered_json& j, int indent = 0, int depth = 0) {
    if (!j.is_structured() || j.empty()) {
        out += j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
        return;
    }
    const bool object = j.is_object();
    out += object ? '{' : '[';
    for (auto it = j.begin(); it != j.end(); ++it) {
        if (it != j.begin()) out += indent > 0 ? "," : ", ";
        if (indent > 0) {
            out += '\n';
            out.append(size_t(indent * (depth + 1)), ' ');
        }
        if (object) {
            py_json(out, it.key());
            out += ": ";
        }
        py_json(out, *it, indent, depth + 1);
    }
    if (indent > 0) {
        out += '\n';
        out.append(size_t(indent * depth), ' ');
    }
    out += object ? '}' : ']';
}

std::string py_json_text(std::string_view json_text, int indent = 0) {
    const auto j = nlohmann::ordered_json::parse(json_text, nullptr, false);
    if (j.is_discarded()) return std::string(json_text); // not JSON: as the client wrote it
    std::string out;
    py_json(out, j, indent);
    return out;
}

// Past calls as a family's layout writes them (what the grammar makes a model write).
std::string written_calls(grammar::tool_syntax syntax, std::span<const chat_tool_call> calls) {
    const grammar::call_layout& lay = grammar::layout_of(syntax);
    std::string out = lay.trigger + lay.open;
    for (size_t i = 0; i < calls.size(); ++i) {
        if (i > 0) out += lay.sep;
        append(out, calls[i].name, lay.mid, py_json_text(calls[i].arguments), lay.close);
    }
    return out + lay.end;
}

// The hermes form (Qwen 2.5's template, and Tandem's generic one): the tools described in the
// system turn, past calls in the assistant's text, tool results as a user turn of
// <tool_response> blocks (consecutive results share one).
std::vector<chat_message> fold_hermes(std::span<const chat_message> messages, std::span<const std::string> tools,
                                      std::string_view default_system) {
    std::vector<chat_message> out;
    if (!tools.empty()) {
        const bool has_system = !messages.empty() && messages[0].role == "system";
        std::string sys = has_system ? messages[0].content : std::string(default_system);
        if (!sys.empty()) sys += "\n\n";
        sys += "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
               "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
        for (const auto& t : tools) append(sys, "\n", py_json_text(t));
        sys += "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
               "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
               "<args-json-object>}\n</tool_call>";
        out.push_back({"system", std::move(sys), {}, {}});
        if (has_system) messages = messages.subspan(1);
    }
    bool after_result = false; // the last message was a tool result
    for (const auto& m : messages) {
        if (m.role == "tool") {
            const std::string block = "<tool_response>\n" + m.content + "\n</tool_response>";
            if (after_result)
                append(out.back().content, "\n", block);
            else
                out.push_back({"user", block, {}, {}});
        } else if (!m.tool_calls.empty()) {
            std::string text = m.content.empty() ? "" : m.content + "\n";
            text += written_calls(grammar::tool_syntax::hermes, m.tool_calls);
            out.push_back({m.role, std::move(text), {}, {}});
        } else {
            out.push_back({m.role, m.content, {}, {}});
        }
        after_result = m.role == "tool";
    }
    return out;
}

// Mistral v3's [AVAILABLE_TOOLS] block: each function's fields in order ("return" left
// out), strings written raw (the reference template does not escape them), the rest through
// tojson.
std::string mistral_tools(std::span<const std::string> tools) {
    std::string out = "[AVAILABLE_TOOLS] [";
    for (size_t i = 0; i < tools.size(); ++i) {
        const auto t = nlohmann::ordered_json::parse(tools[i], nullptr, false);
        const auto fn = t.is_object() ? t.value("function", nlohmann::ordered_json::object()) : nlohmann::ordered_json::object();
        append(out, i ? ", " : "", "{\"type\": \"function\", \"function\": {");
        bool first = true;
        for (auto it = fn.begin(); it != fn.end(); ++it) {
            if (it.key() == "return") continue;
            append(out, first ? "" : ", ", "\"", it.key(), "\": ");
            first = false;
            if (it->is_string())
                append(out, "\"", it->get<std::string>(), "\"");
            else
                py_json(out, *it);
        }
        out += "}}";
    }
    return out + "][/AVAILABLE_TOOLS]";
}

bool has_tool_turns(std::span<const chat_message> messages) {
    for (const auto& m : messages)
        if (m.role == "tool" || !m.tool_calls.empty()) return true;
    return false;
}

} // namespace

std::string_view name_of(chat_family f) {
    switch (f) {
    case chat_family::llama2: return "llama-2";
    case chat_family::llama3: return "llama-3";
    case chat_family::chatml: return "chatml";
    case chat_family::mistral: return "mistral";
    case chat_family::zephyr: return "zephyr";
    case chat_family::gemma: return "gemma";
    case chat_family::phi3: return "phi-3";
    case chat_family::plain: return "plain";
    }
    return "plain";
}

chat_family detect_chat_family(std::string_view src) {
    // Most specific markers first: zephyr and phi-3 share <|user|>, llama-2 and mistral [INST].
    if (has(src, "<|start_header_id|>")) return chat_family::llama3;
    if (has(src, "<|im_start|>")) return chat_family::chatml;
    if (has(src, "<start_of_turn>")) return chat_family::gemma;
    if (has(src, "<|user|>")) return has(src, "<|end|>") ? chat_family::phi3 : chat_family::zephyr;
    if (has(src, "[INST]")) return has(src, "<<SYS>>") ? chat_family::llama2 : chat_family::mistral;
    return chat_family::plain;
}

chat_template chat_template::of(chat_family family, std::string bos_text, std::string eos_text) {
    chat_template t;
    t.family_ = family;
    t.bos_text_ = std::move(bos_text);
    t.eos_text_ = std::move(eos_text);
    return t;
}

chat_template chat_template::parse(std::string_view src, std::string bos_text, std::string eos_text) {
    chat_template t = of(detect_chat_family(src), std::move(bos_text), std::move(eos_text));
    switch (t.family_) {
    case chat_family::chatml:
        t.default_system_ = chatml_default_system(src);
        break;
    case chat_family::llama3:
        if (has(src, "Cutting Knowledge Date")) t.date_string_ = llama3_date(src);
        // Llama 3.2 asks for today's date where the renderer has strftime_now (transformers does).
        t.date_now_ = has(src, "strftime_now");
        break;
    case chat_family::mistral:
        // Mistral's tokenizer versions differ in spaces around [INST]/[/INST] (v1: "<s> [INST] a
        // [/INST] b</s>", v3: "<s>[INST] a[/INST] b</s>"); each template's literals say which.
        t.mistral_ = {};
        t.mistral_.space_before_inst = has_literal(src, " [INST] ");
        t.mistral_.space_before_close = has(src, " [/INST]");
        t.mistral_.space_before_answer = has(src, "' ' + message") || has(src, "\" \" + message");
        t.mistral_.trim_answer = has(src, "]|trim + eos_token") || has(src, "] | trim + eos_token");
        t.mistral_.system_in_last = has(src, "loop.last and system_message");
        break;
    case chat_family::phi3:
        t.phi3_bos_ = has(src, "bos_token");
        t.phi3_eos_ = has(src, "eos_token");
        break;
    default: break;
    }
    return t;
}

chat_template chat_template::from_gguf(const gguf::file& f, const tokenizer& tok, const std::string& override_source) {
    const token_id bos = tok.bos(), eos = tok.eos();
    std::string bos_text = bos >= 0 && bos < tok.n_vocab() ? tok.token_text(bos) : "";
    std::string eos_text = eos >= 0 && eos < tok.n_vocab() ? tok.token_text(eos) : "";
    const std::string src =
        override_source.empty() ? f.get_string("tokenizer.chat_template").value_or("") : override_source;
    chat_template t = from_jinja(src, std::move(bos_text), std::move(eos_text));
    // The plain template starts as encode(add_special) would: BOS only where the model asks.
    if (t.family_ == chat_family::plain && !tok.add_bos()) t.bos_text_.clear();
    return t;
}

grammar::tool_syntax chat_template::tool_syntax() const {
    switch (family_) {
    case chat_family::llama3: return grammar::tool_syntax::llama3;
    case chat_family::mistral: return grammar::tool_syntax::mistral;
    default: return grammar::tool_syntax::hermes;
    }
}

std::string chat_template::render_family(std::span<const chat_message> messages, bool add_generation_prompt,
                                         std::span<const std::string> tools) const {
    std::vector<chat_message> folded;
    if (tool_syntax() == grammar::tool_syntax::hermes && (!tools.empty() || has_tool_turns(messages))) {
        folded = fold_hermes(messages, tools, family_ == chat_family::chatml ? default_system_ : "");
        messages = folded;
        tools = {};
    }
    std::string out;
    // Families without a system role fold a leading system message into the first user turn.
    std::string_view system;
    bool has_system = false;
    if (!messages.empty() && messages[0].role == "system") {
        system = messages[0].content;
        has_system = true;
    }
    const auto rest = has_system ? messages.subspan(1) : messages;

    switch (family_) {
    case chat_family::llama2:
        // <s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {answer} </s>; each turn's
        // content is strip()ped whole, the system block included.
        for (size_t i = 0; i < rest.size(); ++i) {
            const chat_message& m = rest[i];
            std::string content;
            if (i == 0 && has_system) append(content, "<<SYS>>\n", system, "\n<</SYS>>\n\n");
            content += m.content;
            if (m.role == "assistant")
                append(out, " ", trim(content), " ", eos_text_);
            else
                append(out, bos_text_, "[INST] ", trim(content), " [/INST]");
        }
        if (rest.empty() && has_system) // the reference renders nothing; keep the system text
            append(out, bos_text_, "[INST] <<SYS>>\n", system, "\n<</SYS>> [/INST]");
        break;

    case chat_family::llama3: {
        out += bos_text_;
        auto turn = [&](std::string_view role, std::string_view content) {
            append(out, "<|start_header_id|>", role, "<|end_header_id|>\n\n", content, "<|eot_id|>");
        };
        size_t first = 0;
        if (!date_string_.empty() || !tools.empty()) { // Llama 3.1: the system header is always there
            out += "<|start_header_id|>system<|end_header_id|>\n\n";
            if (!tools.empty()) out += "Environment: ipython\n";
            if (!date_string_.empty())
                append(out, "Cutting Knowledge Date: December 2023\nToday Date: ",
                       date_now_ ? today_date() : date_string_, "\n\n");
            out += has_system ? trim(system) : std::string_view{};
            out += "<|eot_id|>";
            first = has_system ? 1 : 0;
        }
        if (!tools.empty()) { // Llama 3.1's tools_in_user_message: described in the first user turn
            std::string text = "Given the following functions, please respond with a JSON for a function call with its "
                               "proper arguments that best answers the given prompt.\n\nRespond in the format "
                               "{\"name\": function name, \"parameters\": dictionary of argument name and its "
                               "value}.Do not use variables.\n\n";
            for (const auto& t : tools) append(text, py_json_text(t, 4), "\n\n");
            if (first < messages.size()) text += trim(messages[first++].content);
            turn("user", text);
        }
        for (size_t i = first; i < messages.size(); ++i) {
            const chat_message& m = messages[i];
            if (m.role == "tool") { // the reference writes a result through tojson: a JSON string
                std::string result;
                py_json(result, nlohmann::ordered_json(m.content));
                turn("ipython", result);
            } else if (!m.tool_calls.empty()) { // one call a turn: the format has no other
                for (const auto& c : m.tool_calls)
                    turn("assistant", written_calls(grammar::tool_syntax::llama3, std::span(&c, 1)));
            } else {
                turn(m.role, trim(m.content));
            }
        }
        if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
        break;
    }

    case chat_family::chatml:
        if (!has_system && !default_system_.empty())
            append(out, "<|im_start|>system\n", default_system_, "<|im_end|>\n");
        for (const auto& m : messages) append(out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
        if (add_generation_prompt) out += "<|im_start|>assistant\n";
        break;

    case chat_family::mistral: {
        const mistral_variant& v = mistral_;
        out += bos_text_;
        // Which user turn carries the system text: the first (v1), or the last message when
        // it is a user turn (v3's `loop.last and system_message`: otherwise it is dropped).
        auto is_user = [](const chat_message& m) { return m.role != "assistant" && m.role != "tool"; };
        size_t sys_at = rest.size(), last_user = rest.size();
        if (v.system_in_last) {
            if (!rest.empty() && is_user(rest.back())) sys_at = rest.size() - 1;
        } else {
            for (size_t i = 0; i < rest.size() && sys_at == rest.size(); ++i)
                if (is_user(rest[i])) sys_at = i;
        }
        for (size_t i = 0; i < rest.size(); ++i)
            if (is_user(rest[i])) last_user = i;
        for (size_t i = 0; i < rest.size(); ++i) {
            const chat_message& m = rest[i];
            if (m.role == "tool") {
                append(out, "[TOOL_RESULTS] {\"content\": ", m.content, ", \"call_id\": \"", m.tool_call_id,
                       "\"}[/TOOL_RESULTS]");
                continue;
            }
            if (!m.tool_calls.empty()) { // each call with its id, which the results name
                out += "[TOOL_CALLS] [";
                for (size_t k = 0; k < m.tool_calls.size(); ++k)
                    append(out, k ? ", " : "", "{\"name\": \"", m.tool_calls[k].name, "\", \"arguments\": ",
                           py_json_text(m.tool_calls[k].arguments), ", \"id\": \"", m.tool_calls[k].id, "\"}");
                append(out, "]", eos_text_);
                continue;
            }
            if (i == last_user && !tools.empty()) out += mistral_tools(tools);
            if (m.role == "assistant") {

                out += v.space_before_answer ? " " : "";
                out += v.trim_answer ? std::string(trim(m.content)) : m.content;
                out += eos_text_;
                continue;
            }
            out += v.space_before_inst ? " [INST] " : "[INST] ";
            if (i == sys_at && has_system) append(out, system, "\n\n");
            out += m.content;
            out += v.space_before_close ? " [/INST]" : "[/INST]";
        }
        if (rest.empty() && has_system)
            append(out, v.space_before_inst ? " [INST] " : "[INST] ", system,
                   v.space_before_close ? " [/INST]" : "[/INST]");
        break;
    }

    case chat_family::zephyr:
        // The reference uses trim_blocks: each turn is "<|role|>\n{content}</s>\n".
        for (const auto& m : messages) append(out, "<|", m.role, "|>\n", m.content, eos_text_, "\n");
        if (add_generation_prompt) out += "<|assistant|>\n";
        break;

    case chat_family::gemma:
        // No system role: Gemma 3's template puts "{system}\n\n" before the first user text.
        out += bos_text_;
        for (size_t i = 0; i < rest.size(); ++i) {
            const chat_message& m = rest[i];
            out += "<start_of_turn>";
            out += m.role == "assistant" ? "model" : m.role;
            out += "\n";
            if (i == 0 && has_system) append(out, system, "\n\n");
            out += trim(m.content);
            out += "<end_of_turn>\n";
        }
        if (rest.empty() && has_system) append(out, "<start_of_turn>user\n", system, "\n\n<end_of_turn>\n");
        if (add_generation_prompt) out += "<start_of_turn>model\n";
        break;

    case chat_family::phi3:
        if (phi3_bos_) out += bos_text_;
        for (const auto& m : messages) append(out, "<|", m.role, "|>\n", m.content, "<|end|>\n");
        if (add_generation_prompt)
            out += "<|assistant|>\n";
        else if (phi3_eos_)
            out += eos_text_;
        break;

    case chat_family::plain:
        // Tandem's plain template, for models without a recognised one:
        //   BOS {system}\n\nUser: {user}\nAssistant: {answer}\n ... Assistant:
        out += bos_text_;
        if (has_system) append(out, system, "\n\n");
        for (const auto& m : rest) append(out, capitalized(m.role), ": ", m.content, "\n");
        if (add_generation_prompt) out += "Assistant:";
        break;
    }
    return out;
}

std::vector<std::string> chat_template::stop_strings() const {
    switch (family_) {
    case chat_family::llama2: return {"[INST]"};
    case chat_family::llama3: return {"<|eot_id|>", "<|start_header_id|>"};
    case chat_family::chatml: return {"<|im_end|>", "<|im_start|>"};
    case chat_family::mistral: return {"[INST]"};
    case chat_family::zephyr: return {"</s>", "<|user|>"};
    case chat_family::gemma: return {"<end_of_turn>", "<start_of_turn>"};
    case chat_family::phi3: return {"<|end|>", "<|user|>"};
    case chat_family::plain: return {"\nUser:"};
    }
    return {};
}

} // namespace tandem
