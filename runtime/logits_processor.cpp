// Logits processors: the chain, logit bias and the repetition penalties.
#include "runtime/logits_processor.hpp"

#include "runtime/sampler.hpp"

#include <algorithm>
#include <cmath>

namespace tandem {

void processor_chain::apply(std::span<float> logits, std::span<const token_id> history) {
    for (auto& p : procs_) p->apply(logits, history);
}

void processor_chain::accept(token_id t) {
    for (auto& p : procs_) p->accept(t);
}

void processor_chain::rewind(int32_t n) {
    for (auto& p : procs_) p->rewind(n);
}

processor_chain processor_chain::clone() const {
    processor_chain c;
    for (const auto& p : procs_) c.add(p->clone());
    return c;
}

namespace {

bool in_range(token_id id, size_t n_vocab) { return id >= 0 && size_t(id) < n_vocab; }

class bias_processor final : public logits_processor {
public:
    explicit bias_processor(std::vector<std::pair<token_id, float>> b) : bias_(std::move(b)) {}
    std::string_view name() const override { return "logit_bias"; }
    void apply(std::span<float> logits, std::span<const token_id>) override {
        for (const auto& [id, b] : bias_)
            if (in_range(id, logits.size()) && !std::isnan(b)) logits[size_t(id)] += b;
    }
    std::unique_ptr<logits_processor> clone() const override { return std::make_unique<bias_processor>(*this); }

private:
    std::vector<std::pair<token_id, float>> bias_;
};

class penalty_processor final : public logits_processor {
public:
    penalty_processor(float r, float f, float p, int32_t last_n) : r_(r), f_(f), p_(p), last_n_(last_n) {}
    std::string_view name() const override { return "penalties"; }
    void apply(std::span<float> logits, std::span<const token_id> history) override {
        if (last_n_ == 0 || history.empty()) return;
        const size_t n_window = last_n_ < 0 ? history.size() : std::min(size_t(last_n_), history.size());
        // Sorting the window gives each distinct token and its count without a vocab-sized table.
        window_.assign(history.end() - std::ptrdiff_t(n_window), history.end());
        std::sort(window_.begin(), window_.end());
        for (size_t i = 0; i < window_.size();) {
            const token_id id = window_[i];
            size_t j = i;
            while (j < window_.size() && window_[j] == id) ++j;
            const size_t n_count = j - i;
            i = j;
            if (!in_range(id, logits.size())) continue;
            float& x = logits[size_t(id)];
            if (r_ != 1.0f) x = x > 0.0f ? x / r_ : x * r_;
            if (f_ != 0.0f) x -= float(n_count) * f_;
            if (p_ != 0.0f) x -= p_;
        }
    }
    std::unique_ptr<logits_processor> clone() const override {
        return std::make_unique<penalty_processor>(r_, f_, p_, last_n_);
    }

private:
    float r_, f_, p_;           // 1, 0, 0 where off
    int32_t last_n_;
    std::vector<token_id> window_; // scratch
};

} // namespace

std::unique_ptr<logits_processor> make_bias_processor(std::vector<std::pair<token_id, float>> bias) {
    return std::make_unique<bias_processor>(std::move(bias));
}

std::unique_ptr<logits_processor> make_penalty_processor(float repetition, float frequency, float presence,
                                                         int32_t last_n) {
    const bool use_rep = std::isfinite(repetition) && repetition > 0.0f && repetition != 1.0f;
    const bool use_freq = std::isfinite(frequency) && frequency != 0.0f;
    const bool use_pres = std::isfinite(presence) && presence != 0.0f;
    if (!use_rep && !use_freq && !use_pres) return nullptr;
    return std::make_unique<penalty_processor>(use_rep ? repetition : 1.0f, use_freq ? frequency : 0.0f,
                                               use_pres ? presence : 0.0f, last_n);
}

processor_chain make_processors(const sampling_params& p) {
    processor_chain c;
    if (!p.logit_bias.empty()) c.add(make_bias_processor(p.logit_bias));
    if (auto pen = make_penalty_processor(p.repetition_penalty, p.frequency_penalty, p.presence_penalty,
                                          p.penalty_last_n))
        c.add(std::move(pen));
    return c;
}

} // namespace tandem
