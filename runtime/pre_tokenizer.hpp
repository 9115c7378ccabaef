// Byte-level BPE pre-tokenizers (tokenizer.ggml.pre): the regex families that split text into words.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

// Pre-tokenizer regex families, each a fixed sequence of patterns.
enum class pre_kind { gpt2, digits_gpt2, llama3, qwen2, deepseek_coder, deepseek_llm, bpe_default };

// The family of a tokenizer.ggml.pre name; nullopt for a name it does not know.
std::optional<pre_kind> pre_from_name(std::string_view name);

// Byte ranges (offset, length) of the words of `text`, as llama.cpp's regexes split it.
std::vector<std::pair<size_t, size_t>> pre_split(pre_kind k, std::string_view text);

} // namespace tandem
