#include "runtime/grammar/reference.hpp"

#include <algorithm>

namespace tandem::grammar {

// Earley's recognizer, written for clarity: set k holds the items (dotted alternatives with
// their origin) that are live after k bytes. Prediction adds a referenced rule's
// alternatives, completion advances the items that were waiting for a finished rule, and a
// nullable rule is stepped over at prediction (Aycock and Horspool), so empty rules need no
// special completion.
reference_matcher::reference_matcher(const compiled& g) : g_(&g), nullable_(g.n_rules(), false) {
    for (bool changed = true; changed;) { // a rule's nullability depends on others': a fixpoint
        changed = false;
        for (rule_id r = 0; r < g.n_rules(); ++r) {
            for (const uint32_t a : g.alt_starts[r]) {
                uint32_t p = a;
                while (g.elems[p].k == element::kind::ref && nullable_[g.elems[p].arg]) ++p;
                if (!nullable_[r] && g.elems[p].k == element::kind::end) nullable_[r] = changed = true;
            }
        }
    }
    sets_.emplace_back();
    for (const uint32_t a : g.alt_starts[g.root]) sets_[0].push_back({a, 0, g.root});
    close(0);
}

void reference_matcher::close(size_t k) const {
    auto& set = sets_[k];
    const auto add = [&](const item& it) {
        if (std::find(set.begin(), set.end(), it) == set.end()) set.push_back(it);
    };
    for (size_t i = 0; i < set.size(); ++i) { // the set grows while it is walked
        const item it = set[i];
        const element& el = g_->elems[it.pos];
        if (el.k == element::kind::ref) {
            for (const uint32_t a : g_->alt_starts[el.arg]) add({a, uint32_t(k), el.arg});
            if (nullable_[el.arg]) add({it.pos + 1, it.origin, it.rule});
        } else if (el.k == element::kind::end) {
            // Completion: items of the origin set waiting for this rule move past it. For an
            // empty completion (origin k) those are in this very set.
            for (size_t j = 0; j < sets_[it.origin].size(); ++j) {
                const item w = sets_[it.origin][j];
                const element& we = g_->elems[w.pos];
                if (we.k == element::kind::ref && we.arg == it.rule) add({w.pos + 1, w.origin, w.rule});
            }
        }
    }
}

bool reference_matcher::scan(uint8_t byte) const {
    std::vector<item> next;
    for (const item& it : sets_.back()) {
        const element& el = g_->elems[it.pos];
        if (el.k == element::kind::bytes && has_byte(g_->classes[el.arg], byte)) {
            const item moved{it.pos + 1, it.origin, it.rule};
            if (std::find(next.begin(), next.end(), moved) == next.end()) next.push_back(moved);
        }
    }
    if (next.empty()) return false;
    sets_.push_back(std::move(next));
    close(sets_.size() - 1);
    return true;
}

bool reference_matcher::feed(std::string_view bytes) {
    const size_t before = sets_.size();
    for (const char c : bytes) {
        if (!scan(uint8_t(c))) {
            sets_.resize(before);
            return false;
        }
    }
    return true;
}

bool reference_matcher::can_end() const {
    for (const item& it : sets_.back())
        if (it.rule == g_->root && it.origin == 0 && g_->elems[it.pos].k == element::kind::end) return true;
    return false;
}

bool reference_matcher::can_feed(std::string_view bytes) const {
    const size_t before = sets_.size();
    for (const char c : bytes) {
        if (!scan(uint8_t(c))) break;
    }
    const bool ok = sets_.size() == before + bytes.size();
    sets_.resize(before);
    return ok;
}

bool matches(const compiled& g, std::string_view text) {
    reference_matcher m(g);
    return m.feed(text) && m.can_end();
}

bool is_prefix(const compiled& g, std::string_view text) {
    reference_matcher m(g);
    return m.feed(text);
}

} // namespace tandem::grammar
