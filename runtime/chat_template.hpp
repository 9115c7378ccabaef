// Chat templates: the common families recognised from a GGUF's tokenizer.chat_template,
// rendered natively (no Jinja engine), with a documented plain fallback.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

namespace gguf { class file; }
namespace grammar { enum class tool_syntax : uint8_t; }
class tokenizer;

// A call an assistant turn made (OpenAI's message.tool_calls[i]).
struct chat_tool_call {
    std::string id;
    std::string name;
    std::string arguments; // JSON text, as the client sent it
};

struct chat_message {
    std::string role;    // "system", "user", "assistant", "tool"
    std::string content;
    std::vector<chat_tool_call> tool_calls; // assistant turns that called functions
    std::string tool_call_id;               // tool turns: the call this is the result of
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
    // From a template's Jinja source: the family, and the variant details its literals show
    // (Qwen's default system text, Llama 3.1's dated system header, Mistral's spacing).
    static chat_template parse(std::string_view template_src, std::string bos_text, std::string eos_text);
    // A family's canonical form; bos/eos default to SentencePiece's texts.
    static chat_template of(chat_family family, std::string bos_text = "<s>", std::string eos_text = "</s>");

    chat_family family() const { return family_; }

    // The prompt text for `messages`, as the family's reference Jinja template renders it
    // (a leading system message is folded into the first user turn where the family has no
    // system role). The plain template, for models without a recognised one, is
    //   BOS {system}\n\nUser: {user}\nAssistant: {assistant}\n ... Assistant:
    // (BOS when the model adds one; roles other than user/assistant capitalized alike).
    // It ends with the assistant turn's opening when add_generation_prompt. The text carries
    // special-token text (e.g. "<|im_start|>") and must be encoded with parse_special = true
    // and add_special = false: BOS is part of the rendered text where the family puts it.
    //
    // `tools` are the functions offered, each the request's tool object as JSON text
    // ({"type": "function", "function": {...}}); they are described to the model where the
    // family's reference template puts them, and past calls and tool results are rendered in
    // the family's form (docs/chat_templates.md).
    std::string render(std::span<const chat_message> messages, bool add_generation_prompt = true,
                       std::span<const std::string> tools = {}) const;

    // How this family writes a call (hermes for families without a form of their own).
    grammar::tool_syntax tool_syntax() const;

    // Texts that end an assistant turn for this family (besides the model's EOG tokens).
    std::vector<std::string> stop_strings() const;

private:
    struct mistral_variant {
        bool space_before_inst = true;   // " [INST] " (v1) or "[INST] " (v3)
        bool space_before_close = true;  // " [/INST]" (v1) or "[/INST]" (v3)
        bool space_before_answer = true; // " {answer}</s>"
        bool trim_answer = false;
        bool system_in_last = false;     // v3 puts the system text in the last user turn
    };

    chat_family family_ = chat_family::plain;
    std::string bos_text_, eos_text_;
    std::string default_system_; // chatml: the system turn added when there is none (Qwen)
    std::string date_string_;    // llama-3.1: the dated system header's date; empty for 3.0
    bool date_now_ = false;      // llama-3.2: today's date instead (strftime_now)
    mistral_variant mistral_;
    bool phi3_bos_ = false, phi3_eos_ = true;
};

} // namespace tandem
