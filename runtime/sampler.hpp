// Token sampling: logit processing (bias, penalties, top-k, top-p, min-p, temperature) and
// a seeded choice; greedy when the temperature is 0.
#pragma once

#include "runtime/logits_processor.hpp"
#include "runtime/tokenizer.hpp"

#include <cstdint>
#include <optional>
#include <span>
#include <utility>
#include <vector>

namespace tandem {

// Neutral defaults: each knob off. Front ends (CLI, API) apply their own defaults.
struct sampling_params {
    float temperature = 1.0f;        // <= 0: greedy (argmax, lowest id on ties)
    int32_t top_k = 0;               // <= 0: off
    float top_p = 1.0f;              // >= 1: off
    float min_p = 0.0f;              // <= 0: off
    float repetition_penalty = 1.0f; // 1: off; CTRL-style, on the last penalty_last_n tokens
    int32_t penalty_last_n = 64;     // window for all penalties; -1: the whole history
    float presence_penalty = 0.0f;   // OpenAI-style, subtracted once per token present
    float frequency_penalty = 0.0f;  // OpenAI-style, subtracted per occurrence
    std::vector<std::pair<token_id, float>> logit_bias; // added to the logit; -inf bans
    std::optional<uint64_t> seed;    // none: seeded from std::random_device
};

// A small, portable PRNG (xoshiro256**) so a seed gives the same stream everywhere.
class rng {
public:
    explicit rng(uint64_t seed);
    uint64_t next();
    double uniform(); // [0, 1)

private:
    uint64_t s_[4];
};

struct token_logprob {
    token_id id;
    float logprob;
};

class sampler {
public:
    explicit sampler(sampling_params p);

    // Picks the next token. `logits` [n_vocab] is modified in place (it is scratch);
    // `history` is the context so far (prompt + generated), for the penalties.
    // llama.cpp's default order: process(), then top_k, top_p, min_p (both on the
    // temperature-1 probabilities), temperature, draw. +inf logits (a forcing bias) share
    // all the mass equally.
    // Returns `none` when no token is possible (every logit -inf or NaN, or n_vocab 0).
    // Sampling (temperature > 0) takes exactly one rng draw per call, so the stream position
    // is the number of tokens sampled; greedy takes none.
    token_id sample(std::span<float> logits, std::span<const token_id> history);

    // The probabilities sample() draws from, into `probs` [n_vocab] (1 on the choice when
    // greedy): the processed logits, top_k, top_p, min_p, temperature. Takes sample()'s rng
    // draw. False (probs all 0) when no token is possible.
    bool distribution(std::span<float> logits, std::span<const token_id> history, std::span<float> probs);

    // A token drawn from `probs` (distribution()'s form), one rng draw; none when all are 0.
    token_id draw(std::span<const float> probs);

    // Speculative sampling's verification of `draft`, proposed from the distribution `q`
    // [n_vocab] (empty: a point mass on it): with p this sampler's distribution, the draft is
    // kept with probability min(1, p/q); otherwise the token comes from max(0, p - q),
    // normalised (Leviathan et al. 2023, Chen et al. 2023), so it is distributed as p. Greedy,
    // or a point mass: sample(), the draft kept when it is the sample. Two rng draws at most.
    token_id verify(std::span<float> logits, std::span<const token_id> history, token_id draft,
                    std::span<const float> q);

    // The logit-processing prefix of sample(), in place: the sequence's processor chain
    // (logit_bias, then the repetition, frequency and presence penalties over the window,
    // then whatever was added); NaN becomes -inf. Ids out of range (in logit_bias or
    // history) are ignored.
    void process(std::span<float> logits, std::span<const token_id> history);

    // The chain process() runs: processors join it (grammar masks), and are told what the
    // sequence accepted (the engine calls accept() for each token it appends).
    processor_chain& processors() { return chain_; }
    void accept(token_id t) { chain_.accept(t); }

    static constexpr token_id none = -1;

    // An independent copy, its rng stream and processors' state included (a forked beam).
    sampler clone() const;

    const sampling_params& params() const { return p_; }
    uint64_t seed() const { return seed_; }

private:
    enum class weighed { none, greedy, sampled };
    weighed weigh(std::span<float> logits, std::span<const token_id> history);

    sampling_params p_;
    uint64_t seed_;
    rng rng_;
    processor_chain chain_;
    std::vector<token_logprob> cand_; // scratch: {id, logit} of the candidates
    std::vector<token_logprob> edge_; // scratch: top_p's boundary bucket
    std::vector<float> weight_;       // scratch: unnormalized probabilities
    std::vector<uint16_t> bucket_;    // scratch: top_p's bucket of each token
    std::vector<float> p_row_;        // scratch: verify()'s distribution [n_vocab]
    token_id greedy_ = none;          // weigh()'s greedy choice
    double u_ = 0;                    // weigh()'s draw
};

// log-softmax of raw logits: the chosen token's logprob and the top `n` alternatives,
// highest first (for the API's logprobs). NaN counts as -inf; an id out of range gets -inf.
// top_logprobs leaves out tokens of probability 0 (-inf), so it may return fewer than `n`;
// ties are ordered by lowest id.
float logprob_of(std::span<const float> logits, token_id id);
std::vector<token_logprob> top_logprobs(std::span<const float> logits, int n);

} // namespace tandem
