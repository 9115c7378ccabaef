#include "runtime/grammar/guide.hpp"

#include "runtime/grammar/gbnf.hpp"
#include "runtime/grammar/json_schema.hpp"
#include "runtime/grammar/regex.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>

namespace tandem::grammar {

std::string_view kind_name(constraint::kind k) {
    switch (k) {
    case constraint::kind::json_object: return "json_object";
    case constraint::kind::json_schema: return "json_schema";
    case constraint::kind::regex: return "regex";
    case constraint::kind::gbnf: return "grammar";
    case constraint::kind::choice: return "choice";
    }
    return "?";
}

namespace {

nlohmann::json parse_json(const std::string& text, const char* what) {
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        reject("the {} is not valid JSON: {}", what, e.what());
    }
}

expr choice_expr(const std::string& text) {
    const nlohmann::json j = parse_json(text, "choice list");
    if (!j.is_array() || j.empty()) reject("choice must be a non-empty array of strings");
    std::vector<expr> alts;
    for (const auto& c : j) {
        if (!c.is_string()) reject("choice must be a non-empty array of strings, not {}", c.dump());
        alts.push_back(lit(c.get<std::string>()));
    }
    return alt(std::move(alts));
}

} // namespace

std::shared_ptr<const compiled> compile(const constraint& c, std::chrono::milliseconds budget) {
    const auto t0 = std::chrono::steady_clock::now();
    builder b;
    rule_id root = 0;
    switch (c.k) {
    case constraint::kind::json_object: root = add_json_object(b); break;
    case constraint::kind::json_schema: root = add_json_schema(b, parse_json(c.text, "schema")); break;
    case constraint::kind::regex: root = b.add("root", regex_expr(b, c.text)); break;
    case constraint::kind::gbnf: root = add_gbnf(b, c.text); break;
    case constraint::kind::choice: root = b.add("root", choice_expr(c.text)); break;
    }
    build_limits lim;
    lim.deadline = t0 + budget;
    auto g = std::make_shared<const compiled>(b.build(root, lim));
    if (std::chrono::steady_clock::now() > lim.deadline)
        reject("the {} took over {} ms to compile", kind_name(c.k), budget.count());
    return g;
}

void guide_stats::hist::observe(double us) {
    size_t i = 0;
    while (i < bounds_us.size() && us > bounds_us[i]) ++i;
    counts[i].fetch_add(1, std::memory_order_relaxed);
    n.fetch_add(1, std::memory_order_relaxed);
    sum_us.fetch_add(uint64_t(std::llround(us)), std::memory_order_relaxed);
}

namespace {

// One sequence's grammar state. apply() bans every token the state does not allow (the end
// tokens too, until the grammar may end); accept() moves the state by the token's bytes and
// keeps an undo mark for rewind().
class grammar_processor final : public logits_processor {
public:
    grammar_processor(std::shared_ptr<mask_cache> cache, guide_stats* stats)
        : cache_(std::move(cache)), m_(cache_->grammar()), allowed_(cache_->vocab().n_vocab()), stats_(stats) {}

    std::string_view name() const override { return "grammar"; }

    void apply(std::span<float> logits, std::span<const token_id>) override {
        const auto t0 = std::chrono::steady_clock::now();
        if (broken_) allowed_.clear();
        else cache_->fill(m_, allowed_);
        const auto n = std::min<size_t>(logits.size(), size_t(allowed_.size()));
        for (size_t t = 0; t < n; ++t)
            if (!allowed_.has(token_id(t))) logits[t] = -std::numeric_limits<float>::infinity();
        for (size_t t = n; t < logits.size(); ++t) logits[t] = -std::numeric_limits<float>::infinity();
        if (stats_)
            stats_->mask_us.observe(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }

    void accept(token_id t) override {
        marks_.push_back(m_.checkpoint());
        const auto& ends = cache_->vocab().end_tokens();
        if (std::find(ends.begin(), ends.end(), t) != ends.end()) return; // the text ended
        // A token the mask banned cannot come from the sampler; should one arrive anyway (a
        // caller's bug), nothing may follow it rather than text the grammar does not allow.
        if (t < 0 || t >= cache_->vocab().n_vocab() || !m_.advance(cache_->vocab().piece(t))) broken_ = true;
    }

    void rewind(int32_t n) override {
        if (n <= 0) return;
        TANDEM_ASSERT(size_t(n) <= marks_.size(), "rewind {} of {} tokens", n, marks_.size());
        const matcher::mark m = marks_[marks_.size() - size_t(n)];
        m_.rollback(m);
        m_.drop(m);
        marks_.resize(marks_.size() - size_t(n));
        broken_ = false;
    }

    std::unique_ptr<logits_processor> clone() const override { return std::make_unique<grammar_processor>(*this); }

private:
    std::shared_ptr<mask_cache> cache_;
    matcher m_;
    token_set allowed_;
    std::vector<matcher::mark> marks_; // before each accepted token
    bool broken_ = false;
    guide_stats* stats_;
};

} // namespace

std::unique_ptr<logits_processor> make_grammar_processor(std::shared_ptr<mask_cache> cache, guide_stats* stats) {
    return std::make_unique<grammar_processor>(std::move(cache), stats);
}

guide_registry::guide_registry(std::shared_ptr<const vocab_trie> vocab, size_t capacity)
    : vocab_(std::move(vocab)), capacity_(std::max<size_t>(1, capacity)) {}

std::shared_ptr<mask_cache> guide_registry::get(const constraint& c) {
    {
        std::lock_guard lock(mu_);
        if (const auto it = map_.find(c); it != map_.end()) {
            lru_.splice(lru_.begin(), lru_, it->second.second);
            stats_.n_compile_cache_hits.fetch_add(1, std::memory_order_relaxed);
            return it->second.first;
        }
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto cache = std::make_shared<mask_cache>(compile(c), vocab_);
    stats_.compile_us.observe(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    std::lock_guard lock(mu_);
    if (const auto it = map_.find(c); it != map_.end()) return it->second.first; // compiled twice at once
    lru_.push_front(c);
    map_.emplace(c, std::make_pair(cache, lru_.begin()));
    while (map_.size() > capacity_) {
        map_.erase(lru_.back());
        lru_.pop_back();
    }
    return cache;
}

std::unique_ptr<logits_processor> guide_registry::make_processor(const std::shared_ptr<mask_cache>& cache) {
    return make_grammar_processor(cache, &stats_);
}

} // namespace tandem::grammar
