#include "runtime/grammar/matcher.hpp"

#include <bit>

namespace tandem::grammar {

matcher::matcher(std::shared_ptr<const compiled> g) : g_(std::move(g)) {
    nodes_ = {{0, root_bottom}, {0, any_bottom}};
    for (const uint32_t a : g_->alt_starts[g_->root]) expand(a, root_bottom);
}

matcher::matcher(std::shared_ptr<const compiled> g, uint32_t pos, std::span<const uint32_t> below, uint32_t bottom)
    : g_(std::move(g)) {
    nodes_ = {{0, root_bottom}, {0, any_bottom}};
    reset(pos, below, bottom);
}

void matcher::reset(uint32_t pos, std::span<const uint32_t> below, uint32_t bottom) {
    TANDEM_ASSERT(g_->elems[pos].k == element::kind::bytes, "a stack's top is a byte class");
    uint32_t parent = bottom;
    for (size_t i = below.size(); i-- > 0;) parent = node_of(below[i], parent);
    stacks_.assign(1, {pos, parent});
    at_root_ = at_any_ = false;
}

// Most steps reach a handful of pairs: those are looked up in a small array; a step that
// reaches more moves them into the hash table.
bool matcher::first_visit(uint64_t key) {
    if (!hashed_) {
        for (size_t i = 0; i < n_small_; ++i)
            if (small_[i] == key) return false;
        if (n_small_ < small_.size()) {
            small_[n_small_++] = key;
            return true;
        }
        hashed_ = true;
        ++stamp_;
        n_seen_ = 0;
        for (const uint64_t k : small_) insert_seen(k);
    }
    return insert_seen(key);
}

bool matcher::insert_seen(uint64_t key) {
    if (2 * (n_seen_ + 1) > seen_key_.size()) { // keep the table at most half full
        std::vector<uint64_t> keys;
        for (size_t i = 0; i < seen_key_.size(); ++i)
            if (seen_stamp_[i] == stamp_) keys.push_back(seen_key_[i]);
        const size_t cap = std::bit_ceil(std::max<size_t>(64, 4 * (n_seen_ + 1)));
        seen_key_.assign(cap, 0);
        seen_stamp_.assign(cap, 0);
        n_seen_ = 0;
        for (const uint64_t k : keys) insert_seen(k);
    }
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

// Every stack (pos, parent) leads to without consuming a byte: the closure table gives the
// byte positions within the frame and what they push; where the position can finish its rule,
// the step goes on from the frame below. Each (start, parent) pair and each stack is visited
// once per step.
void matcher::expand(uint32_t pos, uint32_t parent) {
    constexpr uint64_t ready = uint64_t(1) << 63; // stacks and starts are told apart in seen
    work_.assign(1, {pos, parent});
    while (!work_.empty()) {
        const stack s = work_.back();
        work_.pop_back();
        if (!first_visit(uint64_t(s.pos) << 32 | s.parent)) continue;
        for (uint32_t i = g_->closure_begin[s.pos]; i < g_->closure_begin[s.pos + 1]; ++i) {
            const compiled::reach& r = g_->closure[i];
            uint32_t node = s.parent;
            for (uint32_t k = r.push_begin; k < r.push_end; ++k) node = node_of(g_->closure_pushes[k], node);
            if (first_visit(ready | uint64_t(r.pos) << 32 | node)) stacks_.push_back({r.pos, node});
        }
        if (!g_->completes[s.pos]) continue;
        if (s.parent == root_bottom) at_root_ = true;
        else if (s.parent == any_bottom) at_any_ = true;
        else work_.push_back({nodes_[s.parent].pos, nodes_[s.parent].parent});
    }
}

bool matcher::advance(uint8_t byte) {
    const size_t n_nodes = nodes_.size();
    old_.swap(stacks_);
    stacks_.clear();
    const bool was_root = at_root_, was_any = at_any_;
    at_root_ = at_any_ = false;
    n_small_ = 0; // a new step: nothing reached yet
    hashed_ = false;
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

void matcher::restore(std::span<const stack> stacks, bool at_root, bool at_any) {
    stacks_.assign(stacks.begin(), stacks.end());
    at_root_ = at_root;
    at_any_ = at_any;
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

namespace {

size_t slot_hash(uint32_t pos, uint32_t parent) {
    return size_t((uint64_t(pos) << 32 | parent) * 0x9E3779B97F4A7C15ull >> 32);
}

} // namespace

// The node index: open addressing over node ids (0 empty, tombstone for a removed node, else
// id + 1). Nodes go in LIFO order (truncate), so removal marks the newest ones' slots.
uint32_t matcher::node_of(uint32_t pos, uint32_t parent) {
    if (2 * (n_slot_used_ + 1) > slots_.size()) rehash_nodes();
    const size_t mask = slots_.size() - 1;
    size_t free = SIZE_MAX;
    for (size_t i = slot_hash(pos, parent) & mask;; i = (i + 1) & mask) {
        const uint32_t v = slots_[i];
        if (v == 0) {
            if (free == SIZE_MAX) free = i;
            break;
        }
        if (v == tombstone) {
            if (free == SIZE_MAX) free = i;
        } else if (nodes_[v - 1].pos == pos && nodes_[v - 1].parent == parent) {
            return v - 1;
        }
    }
    if (slots_[free] == 0) ++n_slot_used_;
    slots_[free] = uint32_t(nodes_.size()) + 1;
    nodes_.push_back({pos, parent});
    return uint32_t(nodes_.size()) - 1;
}

void matcher::rehash_nodes() {
    slots_.assign(std::bit_ceil(std::max<size_t>(64, 4 * nodes_.size())), 0);
    n_slot_used_ = 0;
    const size_t mask = slots_.size() - 1;
    for (uint32_t id = 2; id < nodes_.size(); ++id) { // 0 and 1 are the bottoms, not indexed
        size_t i = slot_hash(nodes_[id].pos, nodes_[id].parent) & mask;
        while (slots_[i] != 0) i = (i + 1) & mask;
        slots_[i] = id + 1;
        ++n_slot_used_;
    }
}

void matcher::truncate(size_t n_nodes) {
    const size_t mask = slots_.size() - 1;
    for (size_t id = n_nodes; id < nodes_.size(); ++id) {
        size_t i = slot_hash(nodes_[id].pos, nodes_[id].parent) & mask;
        while (slots_[i] != id + 1) i = (i + 1) & mask;
        slots_[i] = tombstone;
    }
    nodes_.resize(n_nodes);
}

} // namespace tandem::grammar
