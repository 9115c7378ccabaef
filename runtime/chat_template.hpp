// Chat templates: the common families recognised from a GGUF's tokenizer.chat_template,
// rendered natively (no Jinja engine), with a documented plain fallback.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

namespace gguf { class file; }
class tokenizer;

struct chat_message {
    std::string role;    // "system", "user", "assistant"
    std::string content;
};

enum class chat_family { llama2, llama3, chatml, mistral, zephyr, gemma, phi3, plain };

std::string_view name_of(chat_family f);

// Recognises the family from the template's Jinja source by its markers; "" or an
// unrecognised template gives plain.
chat_family detect_chat_family(std::string_view template_src);

class chat_template {
public:
    // From tokenizer.chat_template (when present) and the tokenizer's BOS/EOS texts.
    static chat_template from_gguf(const gguf::file& f, const tokenizer& tok);
    static chat_template of(chat_family family, std::string bos_text = "<s>", std::string eos_text = "</s>");

    chat_family family() const { return family_; }

    // The prompt text for `messages`, ending with the assistant turn's opening when
    // add_generation_prompt. The text carries special-token text (e.g. "<|im_start|>") and
    // must be encoded with parse_special = true and add_special = false: BOS is part of the
    // rendered text where the family puts it.
    std::string render(std::span<const chat_message> messages, bool add_generation_prompt = true) const;

    // Texts that end an assistant turn for this family (besides the model's EOG tokens).
    std::vector<std::string> stop_strings() const;

private:
    chat_family family_ = chat_family::plain;
    std::string bos_text_, eos_text_;
};

} // namespace tandem
