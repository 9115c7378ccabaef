// Logits processors: the per-sequence steps that edit a token's logits before it is chosen
// (logit bias, repetition penalties; grammar masks join the same chain).
#pragma once

#include "runtime/tokenizer.hpp"

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem {

struct sampling_params;

// One step of a sequence's chain. It may keep state about the tokens the sequence accepted
// (a grammar's position); it is told each accepted token, and about tokens taken back.
class logits_processor {
public:
    virtual ~logits_processor() = default;
    virtual std::string_view name() const = 0;
    // Edits logits [n_vocab] for the sequence's next token; history is its tokens so far.
    virtual void apply(std::span<float> logits, std::span<const token_id> history) = 0;
    // The token the sequence accepted.
    virtual void accept(token_id t) { (void)t; }
    // The sequence lost its last n accepted tokens (rejected drafts).
    virtual void rewind(int32_t n) { (void)n; }
    // An independent copy, state included (a forked sequence: beams).
    virtual std::unique_ptr<logits_processor> clone() const = 0;
};

// The processors of one sequence, applied in order.
class processor_chain {
public:
    processor_chain() = default;
    processor_chain(processor_chain&&) = default;
    processor_chain& operator=(processor_chain&&) = default;

    void add(std::unique_ptr<logits_processor> p) { procs_.push_back(std::move(p)); }
    bool empty() const { return procs_.empty(); }
    size_t size() const { return procs_.size(); }
    void apply(std::span<float> logits, std::span<const token_id> history);
    void accept(token_id t);
    void rewind(int32_t n);
    processor_chain clone() const;

private:
    std::vector<std::unique_ptr<logits_processor>> procs_;
};

// logit_bias added to each listed token (-inf bans it; ids out of range and NaN are ignored).
std::unique_ptr<logits_processor> make_bias_processor(std::vector<std::pair<token_id, float>> bias);
// CTRL-style repetition, OpenAI-style frequency and presence penalties over the last
// `last_n` tokens of the history (-1: all of it). Knobs that are off (or nonsense: NaN, a
// repetition penalty <= 0) are skipped, never applied.
std::unique_ptr<logits_processor> make_penalty_processor(float repetition, float frequency, float presence,
                                                         int32_t last_n);
// The chain sampling_params ask for: the bias, then the penalties (each only when set).
processor_chain make_processors(const sampling_params& p);

} // namespace tandem
