// Reasoning models: the markers a chat template family writes its thinking between
// (<think>...</think> for Qwen3, DeepSeek-R1 and the templates like them), found from the
// template's source or the vocabulary (never guessed from generated text), a streaming
// splitter of a reply into its thinking and its content, and the logits processor that bounds
// the thinking and keeps an output constraint for what follows it.
#pragma once

#include "runtime/logits_processor.hpp"
#include "runtime/tokenizer.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace tandem {

// How a model marks its thinking.
struct reasoning_format {
    std::string open = "<think>", close = "</think>";
    token_id open_id = -1, close_id = -1; // the markers as single tokens (-1: the vocabulary has none)
    // The template reads `enable_thinking` (Qwen3): off, the generation prompt carries an
    // empty thinking block, which `disabled_suffix` is.
    bool can_disable = false;
    std::string disabled_suffix() const { return open + "\n\n" + close + "\n\n"; }
};

// The markers of a model whose chat template writes them (its source names both), or whose
// vocabulary has both as tokens of their own; nullopt for a model without them.
std::optional<reasoning_format> find_reasoning(std::string_view template_src, const tokenizer& tok);

// Where a reply starts, judged from the rendered prompt: thinking (the prompt ends with the
// open marker: the template opened it), content (it ends with the close marker: thinking was
// turned off), or either (the model opens its thinking, or does not).
enum class reasoning_start : uint8_t { maybe, thinking, content };
reasoning_start start_of(const reasoning_format& f, std::string_view prompt);

// Splits a reply, streamed in pieces of any size (a marker may be split across them), into its
// thinking and its content. Thinking happens once, at the start: an open marker after content
// has begun is content. Whitespace right after a marker is dropped.
class reasoning_splitter {
public:
    reasoning_splitter(const reasoning_format& f, reasoning_start start);
    struct piece {
        std::string reasoning, content;
    };
    // The next piece of the reply (`last`: nothing follows; what was held back comes out).
    piece feed(std::string_view text, bool last = false);
    bool thinking() const { return state_ == state::thinking; }
    bool in_content() const { return state_ == state::content; }

private:
    enum class state : uint8_t { before, thinking, content };
    std::string open_, close_;
    state state_;
    std::string held_;     // text that may be the start of a marker
    bool trim_ = false;    // drop whitespace (just past a marker)
};

// The processor of a reasoning reply: while the reply thinks, the open marker cannot start
// again and after `budget` tokens (>= 0) the close marker is forced; `inner` (an output
// constraint, may be null) applies only to the content after the thinking, and a reply that
// may open its thinking is offered the open marker beside what `inner` allows. Needs the
// markers as single tokens.
std::unique_ptr<logits_processor> make_reasoning_processor(const reasoning_format& f, reasoning_start start,
                                                           int32_t budget, std::unique_ptr<logits_processor> inner);

} // namespace tandem
