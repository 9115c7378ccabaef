#include "runtime/grammar/token_mask.hpp"

#include <algorithm>
#include <bit>

namespace tandem::grammar {

int32_t token_set::count() const {
    int32_t n = 0;
    for (const uint64_t w : w_) n += std::popcount(w);
    return n;
}

vocab_trie::vocab_trie(std::vector<std::string> pieces, std::vector<token_id> end_tokens, std::span<const token_id> skip)
    : pieces_(std::move(pieces)), ends_(std::move(end_tokens)) {
    std::vector<bool> skipped(pieces_.size(), false);
    for (const token_id t : skip) skipped[size_t(t)] = true;
    for (const token_id t : ends_) skipped[size_t(t)] = true;
    std::vector<token_id> order;
    for (token_id t = 0; t < n_vocab(); ++t)
        if (!skipped[size_t(t)] && !pieces_[size_t(t)].empty()) order.push_back(t);
    std::sort(order.begin(), order.end(), [&](token_id a, token_id b) {
        return pieces_[size_t(a)] != pieces_[size_t(b)] ? pieces_[size_t(a)] < pieces_[size_t(b)] : a < b;
    });
    // Sorted strings give the trie in preorder: each one keeps the path it shares with the
    // one before and adds nodes for the rest.
    nodes_.push_back({0, 0, 0, 0, 0});
    std::vector<uint32_t> path{0};
    std::string_view prev;
    for (const token_id t : order) {
        const std::string_view p = pieces_[size_t(t)];
        size_t common = 0;
        while (common < prev.size() && common < p.size() && prev[common] == p[common]) ++common;
        path.resize(common + 1);
        for (size_t i = common; i < p.size(); ++i) {
            const auto here = uint32_t(toks_.size());
            path.push_back(uint32_t(nodes_.size()));
            nodes_.push_back({uint8_t(p[i]), uint16_t(std::min<size_t>(i + 1, 65535)), 0, here, here});
        }
        toks_.push_back(t);
        ++nodes_[path.back()].tok_end;
        prev = p;
    }
    std::vector<uint32_t> open; // nodes whose subtree has not ended yet
    for (uint32_t i = 0; i < nodes_.size(); ++i) {
        while (!open.empty() && nodes_[open.back()].depth >= nodes_[i].depth && i > 0) {
            nodes_[open.back()].skip = i;
            open.pop_back();
        }
        open.push_back(i);
    }
    for (const uint32_t i : open) nodes_[i].skip = uint32_t(nodes_.size());
}

std::shared_ptr<const vocab_trie> vocab_trie::of(const tokenizer& tok) {
    std::vector<std::string> pieces(size_t(tok.n_vocab()));
    std::vector<token_id> ends;
    for (token_id t = 0; t < tok.n_vocab(); ++t) {
        if (tok.is_eog(t)) ends.push_back(t);
        const token_type ty = tok.type_of(t);
        if (ty == token_type::normal || ty == token_type::byte || ty == token_type::user_defined)
            pieces[size_t(t)] = tok.piece(t);
    }
    return std::make_shared<vocab_trie>(std::move(pieces), std::move(ends));
}

uint32_t vocab_trie::subtree_end(uint32_t i) const {
    const uint32_t s = nodes_[i].skip;
    return s < nodes_.size() ? nodes_[s].tok_begin : uint32_t(toks_.size());
}

mask_cache::mask_cache(std::shared_ptr<const compiled> g, std::shared_ptr<const vocab_trie> vocab)
    : g_(std::move(g)), vocab_(std::move(vocab)) {}

size_t mask_cache::n_cached() const {
    std::lock_guard lock(mu_);
    return cache_.size();
}

mask_cache::context mask_cache::context_of(const matcher& m, const matcher::stack& s) const {
    context c{s.pos};
    uint32_t n = s.parent;
    for (; n > matcher::any_bottom && c.size() <= context_depth; n = m.frame(n).parent) c.push_back(m.frame(n).pos);
    if (n == matcher::root_bottom) c.push_back(matcher::root_bottom);
    return c;
}

const position_mask& mask_cache::at(const context& c) {
    std::lock_guard lock(mu_);
    auto& slot = cache_[c];
    if (!slot) slot = std::make_unique<position_mask>(classify(c));
    return *slot;
}

// The walk over the trie from context c alone. At each node the matcher holds the state after
// the node's bytes; `escaped[d]` says some path at depth d went past the context, into frames
// the walk does not know. A node no stack survives ends its subtree: uncertain when a path
// escaped on the way, rejected otherwise.
position_mask mask_cache::classify(const context& c) const {
    position_mask pm{token_set(vocab_->n_vocab()), {}};
    const bool whole = c.back() == matcher::root_bottom && c.size() > 1;
    const auto below = std::span(c).subspan(1, c.size() - 1 - (whole ? 1 : 0));
    matcher m(g_, c[0], below, whole ? matcher::root_bottom : matcher::any_bottom);
    const auto& nodes = vocab_->nodes();
    std::vector<matcher::mark> marks; // marks[k]: the state at depth k
    std::vector<uint8_t> escaped{0};
    for (uint32_t i = 1; i < nodes.size();) {
        const uint32_t d = nodes[i].depth;
        if (marks.size() >= d) {
            m.rollback(marks[d - 1]);
            marks.resize(d);
        } else {
            marks.push_back(m.checkpoint());
        }
        const bool esc = escaped[d - 1] || m.at_any();
        if (!m.advance(nodes[i].byte)) {
            if (esc) {
                const auto sub = vocab_->tokens(nodes[i].tok_begin, vocab_->subtree_end(i));
                pm.uncertain.insert(pm.uncertain.end(), sub.begin(), sub.end());
            }
            i = nodes[i].skip;
            continue;
        }
        escaped.resize(d + 1);
        escaped[d] = esc;
        for (const token_id t : vocab_->tokens(nodes[i].tok_begin, nodes[i].tok_end)) pm.accepted.add(t);
        ++i;
    }
    return pm;
}

void mask_cache::fill(matcher& m, token_set& out) {
    out.clear();
    if (m.can_end())
        for (const token_id t : vocab_->end_tokens()) out.add(t);
    const std::vector<matcher::stack> stacks = m.stacks();
    std::vector<const position_mask*> pms;
    for (const auto& s : stacks) {
        pms.push_back(&at(context_of(m, s)));
        out.add_all(pms.back()->accepted);
    }
    // The uncertain tokens of each stack's context, tried from that stack with all below it.
    for (size_t i = 0; i < stacks.size(); ++i)
        for (const token_id t : pms[i]->uncertain)
            if (!out.has(t) && m.accepts_from(stacks[i], vocab_->piece(t))) out.add(t);
}

} // namespace tandem::grammar
