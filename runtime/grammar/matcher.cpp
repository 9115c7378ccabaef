#include "runtime/grammar/matcher.hpp"

#include <bit>

namespace tandem::grammar {

matcher::matcher(std::shared_ptr<const compiled> g) : g_(std::move(g)) {
    nodes_ = {{0, root_bottom}, {0, any_bottom}};
    ++stamp_;
    for (const uint32_t a : g_->alt_starts[g_->root]) expand(a, root_bottom);
}

matcher::matcher(std::shared_ptr<const compiled> g, uint32_t pos, std::span<const uint32_t> below, uint32_t bottom)
    : g_(std::move(g)) {
    TANDEM_ASSERT(g_->elems[pos].k == element::kind::bytes, "a stack's top is a byte class");
    nodes_ = {{0, root_bottom}, {0, any_bottom}};
    uint32_t parent = bottom;
    for (size_t i = below.size(); i-- > 0;) parent = node_of(below[i], parent);
    stacks_.push_back({pos, parent});
}

bool matcher::first_visit(uint32_t pos, uint32_t parent) {
    if (2 * (n_seen_ + 1) > seen_key_.size()) { // keep the table at most half full
        std::vector<uint64_t> keys;
        for (size_t i = 0; i < seen_key_.size(); ++i)
            if (seen_stamp_[i] == stamp_) keys.push_back(seen_key_[i]);
        const size_t cap = std::bit_ceil(std::max<size_t>(64, 4 * (n_seen_ + 1)));
        seen_key_.assign(cap, 0);
        seen_stamp_.assign(cap, 0);
        n_seen_ = 0;
        for (const uint64_t k : keys) first_visit(uint32_t(k >> 32), uint32_t(k));
    }
    const uint64_t key = uint64_t(pos) << 32 | parent;
    const size_t mask = seen_key_.size() - 1; // a power of two
    for (size_t i = (key * 0x9E3779B97F4A7C15ull) >> 40 & mask;; i = (i + 1) & mask) {
        if (seen_stamp_[i] != stamp_) {
            seen_stamp_[i] = stamp_;
            seen_key_[i] = key;
            ++n_seen_;
            return true;
        }
        if (seen_key_[i] == key) return false;
    }
}

// Every stack (pos, parent) leads to without consuming a byte: references expand to their
// rule's alternatives, ends return to the node below. Each pair is visited once per step,
// which also ends cycles of tail calls through nullable rules.
void matcher::expand(uint32_t pos, uint32_t parent) {
    work_.assign(1, {pos, parent});
    while (!work_.empty()) {
        const stack s = work_.back();
        work_.pop_back();
        if (!first_visit(s.pos, s.parent)) continue;
        const element& el = g_->elems[s.pos];
        switch (el.k) {
        case element::kind::bytes: stacks_.push_back(s); break;
        case element::kind::end:
            if (s.parent == root_bottom) at_root_ = true;
            else if (s.parent == any_bottom) at_any_ = true;
            else work_.push_back({nodes_[s.parent].pos, nodes_[s.parent].parent});
            break;
        case element::kind::ref: {
            uint32_t ret = s.parent; // a tail call returns where its caller would
            if (g_->elems[s.pos + 1].k != element::kind::end) ret = node_of(s.pos + 1, s.parent);
            for (const uint32_t a : g_->alt_starts[el.arg]) work_.push_back({a, ret});
            break;
        }
        }
    }
}

bool matcher::advance(uint8_t byte) {
    const size_t n_nodes = nodes_.size();
    old_.swap(stacks_);
    stacks_.clear();
    const bool was_root = at_root_, was_any = at_any_;
    at_root_ = at_any_ = false;
    ++stamp_;
    n_seen_ = 0;
    for (const stack& s : old_)
        if (has_byte(g_->classes[g_->elems[s.pos].arg], byte)) expand(s.pos + 1, s.parent);
    if (stacks_.empty() && !at_root_ && !at_any_) {
        stacks_.swap(old_);
        at_root_ = was_root, at_any_ = was_any;
        truncate(n_nodes);
        return false;
    }
    return true;
}

bool matcher::advance(std::string_view bytes) {
    const mark m = checkpoint();
    for (const char c : bytes) {
        if (!advance(uint8_t(c))) {
            rollback(m);
            drop(m);
            return false;
        }
    }
    drop(m);
    return true;
}

matcher::mark matcher::checkpoint() {
    if (n_saved_ == saved_.size()) saved_.emplace_back();
    state& st = saved_[n_saved_];
    st.stacks.assign(stacks_.begin(), stacks_.end());
    st.at_root = at_root_;
    st.at_any = at_any_;
    return {nodes_.size(), n_saved_++};
}

void matcher::rollback(const mark& m) {
    TANDEM_ASSERT(m.n_saved < n_saved_ && m.n_nodes <= nodes_.size(), "rollback past a newer mark");
    const state& st = saved_[m.n_saved];
    stacks_.assign(st.stacks.begin(), st.stacks.end());
    at_root_ = st.at_root;
    at_any_ = st.at_any;
    truncate(m.n_nodes);
    n_saved_ = m.n_saved + 1;
}

void matcher::drop(const mark& m) {
    TANDEM_ASSERT(m.n_saved + 1 == n_saved_, "drop of mark {} under {} newer", m.n_saved, n_saved_ - 1 - m.n_saved);
    n_saved_ = m.n_saved;
}

bool matcher::accepts_from(const stack& s, std::string_view bytes) {
    const size_t n_nodes = nodes_.size();
    std::vector<stack> keep(1, s);
    keep.swap(stacks_);
    const bool was_root = at_root_, was_any = at_any_;
    at_root_ = at_any_ = false;
    bool ok = true;
    for (size_t i = 0; ok && i < bytes.size(); ++i) ok = advance(uint8_t(bytes[i]));
    stacks_.swap(keep);
    at_root_ = was_root, at_any_ = was_any;
    truncate(n_nodes);
    return ok;
}

uint32_t matcher::node_of(uint32_t pos, uint32_t parent) {
    const auto [it, fresh] = node_index_.try_emplace(uint64_t(pos) << 32 | parent, uint32_t(nodes_.size()));
    if (fresh) nodes_.push_back({pos, parent});
    return it->second;
}

void matcher::truncate(size_t n_nodes) {
    for (size_t i = n_nodes; i < nodes_.size(); ++i) node_index_.erase(uint64_t(nodes_[i].pos) << 32 | nodes_[i].parent);
    nodes_.resize(n_nodes);
}

} // namespace tandem::grammar
