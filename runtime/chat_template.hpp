// Chat templates: the model's own tokenizer.chat_template rendered by the sandboxed Jinja
// engine (runtime/jinja), and the common families recognised from its markers, which say how
// the model writes tool calls and which stop texts end a turn, and render the prompt natively
// when a file has no template or its template fails (docs/chat_templates.md).
#pragma once

#include <nlohmann/json_fwd.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

namespace gguf { class file; }
namespace jinja { class template_program; }
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
    std::string reasoning_content;          // assistant turns: their reasoning, where given
};

enum class chat_family { llama2, llama3, chatml, mistral, zephyr, gemma, phi3, plain };

std::string_view name_of(chat_family f);

// Recognises the family from the template's Jinja source by its markers; "" or an
// unrecognised template gives plain.
chat_family detect_chat_family(std::string_view template_src);

class chat_template {
public:
    // From tokenizer.chat_template (when present) and the tokenizer's BOS/EOS texts: the
    // template is compiled by the Jinja engine, and its family found from its markers. A
    // non-empty `override_source` (the config's chat_template file) replaces the file's
    // template. A template the engine refuses is logged with the reason and the family renders.
    static chat_template from_gguf(const gguf::file& f, const tokenizer& tok, const std::string& override_source = {});
    // From a template's source rendered by the Jinja engine (the family from its markers).
    static chat_template from_jinja(std::string_view template_src, std::string bos_text, std::string eos_text);
    // From a template's Jinja source: the family, and the variant details its literals show
    // (Qwen's default system text, Llama 3.1's dated system header, Mistral's spacing).
    static chat_template parse(std::string_view template_src, std::string bos_text, std::string eos_text);
    // A family's canonical form; bos/eos default to SentencePiece's texts.
    static chat_template of(chat_family family, std::string bos_text = "<s>", std::string eos_text = "</s>");

    chat_family family() const { return family_; }

    // Whether prompts come from the model's own template (the Jinja engine), and why not.
    bool uses_jinja() const { return program_ != nullptr; }
    const std::string& jinja_error() const { return jinja_error_; }
    // "jinja" or "family:<name>"
    std::string renderer_name() const;

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
    //
    // With the model's template (uses_jinja()), the text is the template's rendering, as
    // Hugging Face's apply_chat_template gives it: messages (tool calls' arguments as JSON
    // objects, tool results with the called function's name, reasoning_content), tools,
    // add_generation_prompt, bos_token/eos_token from the vocabulary, and `kwargs` (a JSON
    // object: the request's chat_template_kwargs, e.g. enable_thinking). Should the template
    // fail for a conversation, the failure is logged (once) and the family renders it.
    std::string render(std::span<const chat_message> messages, bool add_generation_prompt = true,
                       std::span<const std::string> tools = {}, const nlohmann::ordered_json* kwargs = nullptr) const;
    // The family's native rendering (the fallback), whatever the template.
    std::string render_family(std::span<const chat_message> messages, bool add_generation_prompt = true,
                              std::span<const std::string> tools = {}) const;
    // The template's rendering; throws jinja::error where the template fails (no fallback).
    std::string render_jinja(std::span<const chat_message> messages, bool add_generation_prompt,
                             std::span<const std::string> tools, const nlohmann::ordered_json* kwargs) const;

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

    std::shared_ptr<const jinja::template_program> program_; // null: the family renders
    std::string jinja_error_;                                // why the template is not used
    std::string jinja_bos_, jinja_eos_;                      // bos_token / eos_token
    std::shared_ptr<std::atomic<bool>> warned_ = std::make_shared<std::atomic<bool>>(false);
};

} // namespace tandem
