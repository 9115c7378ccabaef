// Chat templates through the Jinja engine: a conversation as apply_chat_template's variables,
// and the fallback to the family's renderer when the template cannot render it.
#include "runtime/chat_template.hpp"

#include "runtime/jinja/jinja.hpp"
#include "runtime/log.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace tandem {

namespace {

using ojson = nlohmann::ordered_json;

// A tool call's arguments as templates expect them (HF passes a dict; templates that want the
// text call tojson): the JSON object when the text is one, else the text.
ojson arguments_of(const std::string& text) {
    ojson j = ojson::parse(text, nullptr, false);
    if (j.is_discarded()) return ojson(text);
    return j;
}

} // namespace

chat_template chat_template::from_jinja(std::string_view src, std::string bos_text, std::string eos_text) {
    chat_template t = parse(src, bos_text, eos_text);
    t.jinja_bos_ = std::move(bos_text);
    t.jinja_eos_ = std::move(eos_text);
    if (src.empty()) {
        t.jinja_error_ = "the model file has no chat template";
        return t;
    }
    try {
        t.program_ = std::make_shared<const jinja::template_program>(jinja::template_program::parse(src));
    } catch (const jinja::error& e) {
        t.jinja_error_ = e.what();
        logger("chat")->warn("the model's chat template cannot be used ({}); prompts use the {} family's format",
                             e.what(), name_of(t.family_));
    }
    return t;
}

std::string chat_template::renderer_name() const {
    return program_ ? std::string("jinja") : "family:" + std::string(name_of(family_));
}

std::string chat_template::render_jinja(std::span<const chat_message> messages, bool add_generation_prompt,
                                        std::span<const std::string> tools, const ojson* kwargs) const {
    if (!program_) throw jinja::error(jinja_error_.empty() ? "no template" : jinja_error_);
    ojson ctx = ojson::object();
    ojson msgs = ojson::array();
    std::vector<std::pair<std::string, std::string>> call_names; // id -> function name
    for (const chat_message& m : messages) {
        ojson j = {{"role", m.role}, {"content", m.content}};
        if (!m.reasoning_content.empty()) j["reasoning_content"] = m.reasoning_content;
        if (!m.tool_calls.empty()) {
            ojson calls = ojson::array();
            for (const chat_tool_call& c : m.tool_calls) {
                calls.push_back({{"id", c.id},
                                 {"type", "function"},
                                 {"function", {{"name", c.name}, {"arguments", arguments_of(c.arguments)}}}});
                call_names.emplace_back(c.id, c.name);
            }
            j["tool_calls"] = std::move(calls);
        }
        if (m.role == "tool") {
            j["tool_call_id"] = m.tool_call_id;
            for (const auto& [id, name] : call_names)
                if (id == m.tool_call_id) j["name"] = name;
        }
        msgs.push_back(std::move(j));
    }
    ctx["messages"] = std::move(msgs);
    if (!tools.empty()) {
        ojson ts = ojson::array();
        for (const std::string& t : tools) {
            ojson j = ojson::parse(t, nullptr, false);
            if (!j.is_discarded()) ts.push_back(std::move(j));
        }
        ctx["tools"] = std::move(ts);
    }
    ctx["add_generation_prompt"] = add_generation_prompt;
    ctx["bos_token"] = jinja_bos_;
    ctx["eos_token"] = jinja_eos_;
    if (kwargs && kwargs->is_object())
        for (const auto& [k, v] : kwargs->items())
            if (!ctx.contains(k)) ctx[k] = v; // the conversation's own variables win
    // The output limit grows with the conversation: a long prompt is not a hostile template.
    jinja::render_options opt;
    size_t n_in = 0;
    for (const chat_message& m : messages) n_in += m.content.size() + m.reasoning_content.size() + 64;
    for (const std::string& t : tools) n_in += t.size();
    opt.limits.max_output = std::max(opt.limits.max_output, 8 * n_in);
    return program_->render(ctx, opt);
}

std::string chat_template::render(std::span<const chat_message> messages, bool add_generation_prompt,
                                  std::span<const std::string> tools, const ojson* kwargs) const {
    if (program_) {
        try {
            return render_jinja(messages, add_generation_prompt, tools, kwargs);
        } catch (const jinja::error& e) {
            if (!warned_->exchange(true))
                logger("chat")->warn("the model's chat template failed ({}); this prompt and later failing ones "
                                     "use the {} family's format (logged once)",
                                     e.what(), name_of(family_));
        }
    }
    return render_family(messages, add_generation_prompt, tools);
}

} // namespace tandem
