// TEMPORARY stand-in for chat templates (daemon branch only): chatml and plain rendering so
// tandemd links and runs; the client branch's full implementation replaces this file at merge.
#include "runtime/chat_template.hpp"

#include "runtime/gguf.hpp"
#include "runtime/tokenizer.hpp"

namespace tandem {

std::string_view name_of(chat_family f) {
    switch (f) {
    case chat_family::llama2: return "llama2";
    case chat_family::llama3: return "llama3";
    case chat_family::chatml: return "chatml";
    case chat_family::mistral: return "mistral";
    case chat_family::zephyr: return "zephyr";
    case chat_family::gemma: return "gemma";
    case chat_family::phi3: return "phi3";
    case chat_family::plain: return "plain";
    }
    return "plain";
}

chat_family detect_chat_family(std::string_view src) {
    if (src.find("<|im_start|>") != std::string_view::npos) return chat_family::chatml;
    return chat_family::plain;
}

chat_template chat_template::from_gguf(const gguf::file& f, const tokenizer& tok) {
    const std::string src = f.get_string("tokenizer.chat_template").value_or("");
    const token_id bos = tok.bos(), eos = tok.eos();
    return of(detect_chat_family(src), bos >= 0 ? tok.token_text(bos) : "", eos >= 0 ? tok.token_text(eos) : "");
}

chat_template chat_template::of(chat_family family, std::string bos_text, std::string eos_text) {
    chat_template t;
    t.family_ = family == chat_family::chatml ? family : chat_family::plain;
    t.bos_text_ = std::move(bos_text);
    t.eos_text_ = std::move(eos_text);
    return t;
}

std::string chat_template::render(std::span<const chat_message> messages, bool add_generation_prompt) const {
    std::string out;
    if (family_ == chat_family::chatml) {
        for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
        if (add_generation_prompt) out += "<|im_start|>assistant\n";
        return out;
    }
    // plain: BOS, then "Role: content" paragraphs, then "Assistant:" to prompt the reply
    out = bos_text_;
    for (const auto& m : messages) {
        std::string role = m.role;
        if (!role.empty()) role[0] = char(role[0] - ('a' <= role[0] && role[0] <= 'z' ? 32 : 0));
        out += role + ": " + m.content + "\n\n";
    }
    if (add_generation_prompt) out += "Assistant:";
    return out;
}

std::vector<std::string> chat_template::stop_strings() const {
    if (family_ == chat_family::chatml) return {"<|im_end|>"};
    return {"\n\nUser:"};
}

} // namespace tandem
