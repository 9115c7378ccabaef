#include "runtime/grammar/guide.hpp"

#include "runtime/grammar/gbnf.hpp"
#include "runtime/grammar/json_schema.hpp"
#include "runtime/grammar/regex.hpp"
#include "runtime/grammar/tool_call.hpp"
#include "runtime/json_limits.hpp"

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
    case constraint::kind::tools: return "tools";
    }
    return "?";
}

namespace {

// Keys kept in the text's order: a schema's properties are generated in the order it lists them.
// (Under the inputs' nesting limit: `tandem run --json-schema FILE` reads the user's file.)
nlohmann::ordered_json parse_json(const std::string& text, const char* what) {
    std::string why;
    std::optional<nlohmann::ordered_json> j = parse_json_limited(text, default_max_json_depth, why);
    if (!j) reject("the {} is {}", what, why);
    return std::move(*j);
}

expr choice_expr(const std::string& text) {
    const nlohmann::ordered_json j = parse_json(text, "choice list");
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
    const json_options opt{.ws = c.ws, .closed_objects = c.closed_objects};
    switch (c.k) {
    case constraint::kind::json_object: root = add_json_object(b, opt); break;
    case constraint::kind::json_schema: root = add_json_schema(b, parse_json(c.text, "schema"), opt); break;
    case constraint::kind::regex: root = b.add("root", regex_expr(b, c.text)); break;
    case constraint::kind::gbnf: root = add_gbnf(b, c.text); break;
    case constraint::kind::choice: root = b.add("root", choice_expr(c.text)); break;
    case constraint::kind::tools: root = add_tool_calls(b, parse_json(c.text, "tools"), opt); break;
    }
    build_limits lim;
    lim.deadline = t0 + budget;
    auto g = std::make_shared<const compiled>(c.k == constraint::kind::json_schema ? build_json_schema(b, root, lim)
                                                                                    : b.build(root, lim));
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
// keeps an undo mark for rewind(). With a trigger, it stays free (active_ false) until the
// accepted text completes the trigger; the matcher waits past the trigger meanwhile.
class grammar_processor final : public logits_processor {
public:
    grammar_processor(std::shared_ptr<mask_cache> cache, guide_stats* stats, std::shared_ptr<const trigger_table> trigger)
        : cache_(std::move(cache)), m_(cache_->grammar()), allowed_(cache_->vocab().n_vocab()), stats_(stats),
          trigger_(std::move(trigger)), active_(!trigger_) {
        if (trigger_ && !m_.advance(trigger_->trigger))
            throw grammar_error(fmt::format("the grammar does not start with its trigger '{}'", trigger_->trigger));
    }

    std::string_view name() const override { return "grammar"; }

    void apply(std::span<float> logits, std::span<const token_id>) override {
        const auto t0 = std::chrono::steady_clock::now();
        constexpr float banned = -std::numeric_limits<float>::infinity();
        if (!active_) {
            if (match_ >= 0)
                for (const auto& [t, end] : trigger_->completing[size_t(match_)])
                    if (size_t(t) < logits.size() && logits[size_t(t)] != banned &&
                        !continues(cache_->vocab().piece(t).substr(end)))
                        logits[size_t(t)] = banned;
        } else {
            if (broken_) allowed_.clear();
            else cache_->fill(m_, allowed_);
            const auto n = std::min<size_t>(logits.size(), size_t(allowed_.size()));
            for (size_t t = 0; t < n; ++t)
                if (!allowed_.has(token_id(t))) logits[t] = banned;
            for (size_t t = n; t < logits.size(); ++t) logits[t] = banned;
        }
        if (stats_ && active_) // the mask time of constrained tokens; free ones cost next to nothing
            stats_->mask_us.observe(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }

    void accept(token_id t) override {
        undo_.push_back({m_.checkpoint(), match_, active_});
        const auto& ends = cache_->vocab().end_tokens();
        if (std::find(ends.begin(), ends.end(), t) != ends.end()) return; // the text ended
        if (t < 0 || t >= cache_->vocab().n_vocab()) {
            broken_ = true;
            return;
        }
        std::string_view bytes = cache_->vocab().piece(t);
        if (!active_) {
            const auto n = int32_t(trigger_->trigger.size());
            size_t i = 0;
            while (i < bytes.size() && match_ >= 0 && match_ < n) match_ = trigger_->step(match_, uint8_t(bytes[i++]));
            if (match_ != n) return;
            active_ = true;
            bytes.remove_prefix(i);
        }
        // A token the mask banned cannot come from the sampler; should one arrive anyway (a
        // caller's bug), nothing may follow it rather than text the grammar does not allow.
        if (!m_.advance(bytes)) broken_ = true;
    }

    void rewind(int32_t n) override {
        if (n <= 0) return;
        TANDEM_ASSERT(size_t(n) <= undo_.size(), "rewind {} of {} tokens", n, undo_.size());
        const undo u = undo_[undo_.size() - size_t(n)];
        m_.rollback(u.m);
        m_.drop(u.m);
        match_ = u.match;
        active_ = u.active;
        undo_.resize(undo_.size() - size_t(n));
        broken_ = false;
    }

    std::unique_ptr<logits_processor> clone() const override { return std::make_unique<grammar_processor>(*this); }

private:
    struct undo {
        matcher::mark m;
        int32_t match;
        bool active;
    };

    // Whether the grammar, past the trigger, takes `bytes` (the state left as it was).
    bool continues(std::string_view bytes) {
        const matcher::mark m = m_.checkpoint();
        const bool ok = m_.advance(bytes);
        m_.rollback(m);
        m_.drop(m);
        return ok;
    }

    std::shared_ptr<mask_cache> cache_;
    matcher m_;
    token_set allowed_;
    std::vector<undo> undo_; // before each accepted token
    bool broken_ = false;
    guide_stats* stats_;
    std::shared_ptr<const trigger_table> trigger_;
    bool active_;
    int32_t match_ = 0; // while free: the trigger's partial match (-1: it can no longer come)
};

} // namespace

std::unique_ptr<logits_processor> make_grammar_processor(std::shared_ptr<mask_cache> cache, guide_stats* stats,
                                                         std::shared_ptr<const trigger_table> trigger) {
    return std::make_unique<grammar_processor>(std::move(cache), stats, std::move(trigger));
}

trigger_table::trigger_table(const vocab_trie& vocab, std::string trigger_text, bool anchored_at_start)
    : trigger(std::move(trigger_text)), anchored(anchored_at_start) {
    TANDEM_ASSERT(!trigger.empty(), "an empty trigger");
    const auto n = int32_t(trigger.size());
    fail_.assign(size_t(n), 0); // fail_[i]: the longest proper border of trigger[0, i]
    for (int32_t i = 1, k = 0; i < n; ++i) {
        while (k > 0 && trigger[size_t(i)] != trigger[size_t(k)]) k = fail_[size_t(k - 1)];
        if (trigger[size_t(i)] == trigger[size_t(k)]) ++k;
        fail_[size_t(i)] = k;
    }
    completing.resize(size_t(n));
    for (token_id t = 0; t < vocab.n_vocab(); ++t) {
        const std::string_view p = vocab.piece(t);
        for (int32_t j = 0; j < n; ++j)
            for (size_t i = 0, s = size_t(j); i < p.size();) {
                const int32_t next = step(int32_t(s), uint8_t(p[i++]));
                if (next < 0) break;
                if (next == n) {
                    completing[size_t(j)].push_back({t, uint32_t(i)});
                    break;
                }
                s = size_t(next);
            }
    }
}

int32_t trigger_table::step(int32_t j, uint8_t c) const {
    if (j < 0) return -1;
    if (anchored) return uint8_t(trigger[size_t(j)]) == c ? j + 1 : -1;
    while (j > 0 && uint8_t(trigger[size_t(j)]) != c) j = fail_[size_t(j - 1)];
    return uint8_t(trigger[size_t(j)]) == c ? j + 1 : 0;
}

guide_registry::guide_registry(std::shared_ptr<const vocab_trie> vocab, size_t capacity)
    : vocab_(std::move(vocab)), capacity_(std::max<size_t>(1, capacity)) {}

std::shared_ptr<mask_cache> guide_registry::get(const constraint& c, std::chrono::milliseconds budget) {
    {
        std::lock_guard lock(mu_);
        if (const auto it = map_.find(c); it != map_.end()) {
            lru_.splice(lru_.begin(), lru_, it->second.second);
            stats_.n_compile_cache_hits.fetch_add(1, std::memory_order_relaxed);
            return it->second.first;
        }
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto cache = std::make_shared<mask_cache>(compile(c, budget), vocab_, std::chrono::microseconds(0));
    stats_.compile_us.observe(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    std::lock_guard lock(mu_);
    if (const auto it = map_.find(c); it != map_.end()) return it->second.first; // compiled twice at once
    // Its contexts are classified ahead beside the request, not before it: masks it needs first are classified when met. At most
    // max_preparing at once, so a stream of new constraints cannot take every core.
    std::erase_if(preparing_, [](const std::future<void>& f) {
        return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
    });
    if (preparing_.size() < max_preparing)
        preparing_.push_back(std::async(std::launch::async, [cache] { cache->prepare(mask_cache::default_prepare); }));
    lru_.push_front(c);
    map_.emplace(c, std::make_pair(cache, lru_.begin()));
    while (map_.size() > capacity_) {
        map_.erase(lru_.back());
        lru_.pop_back();
    }
    return cache;
}

std::unique_ptr<logits_processor> guide_registry::make_processor(const std::shared_ptr<mask_cache>& cache,
                                                                 std::string_view trigger, bool anchored) {
    if (trigger.empty()) return make_grammar_processor(cache, &stats_);
    std::shared_ptr<const trigger_table> table;
    {
        std::lock_guard lock(mu_);
        auto& slot = triggers_[{std::string(trigger), anchored}];
        if (!slot) slot = std::make_shared<const trigger_table>(*vocab_, std::string(trigger), anchored);
        table = slot;
    }
    return make_grammar_processor(cache, &stats_, std::move(table));
}

} // namespace tandem::grammar
