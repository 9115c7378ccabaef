// Token masks: which tokens of a vocabulary a matcher state allows next.
//
// The vocabulary's byte strings form a trie, walked depth first with the matcher's
// checkpoints, so a shared prefix is matched once and a rejected prefix cuts its whole
// subtree. Most of a mask does not depend on the whole stack (XGrammar's adaptive token
// mask cache): for the top position and the few return positions under it (the context,
// up to context_depth frames), the walk is done once, from that context alone, and sorts the
// tokens into accepted (valid whatever lies below), rejected, and uncertain (they go on
// past the context, into frames it does not know). At run time a state's mask is the union
// of its stacks' accepted sets, plus the uncertain tokens that the stack itself lets
// through. A few frames matter: the top is often a one-character rule (a class), whose end
// alone would leave nearly every token uncertain.
#pragma once

#include "runtime/grammar/matcher.hpp"
#include "runtime/tokenizer.hpp"

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <map>
#include <vector>

namespace tandem::grammar {

// A set of token ids, one bit each.
class token_set {
public:
    explicit token_set(int32_t n = 0) : n_(n), w_((size_t(n) + 63) / 64, 0) {}
    bool has(token_id t) const { return (w_[size_t(t) >> 6] >> (t & 63)) & 1; }
    void add(token_id t) { w_[size_t(t) >> 6] |= uint64_t(1) << (t & 63); }
    void add_all(const token_set& o) {
        for (size_t i = 0; i < w_.size(); ++i) w_[i] |= o.w_[i];
    }
    void clear() { std::fill(w_.begin(), w_.end(), 0); }
    int32_t size() const { return n_; }
    int32_t count() const;

private:
    int32_t n_;
    std::vector<uint64_t> w_;
};

// The token byte strings of a vocabulary in a trie (preorder arrays). Tokens with no text a
// grammar can produce (control and unused tokens, empty pieces) are left out: a mask never
// allows them, except the end tokens where the grammar may end.
class vocab_trie {
public:
    // pieces[id]: the token's bytes; `skip`: ids never allowed as text.
    vocab_trie(std::vector<std::string> pieces, std::vector<token_id> end_tokens, std::span<const token_id> skip = {});
    static std::shared_ptr<const vocab_trie> of(const tokenizer& tok);

    int32_t n_vocab() const { return int32_t(pieces_.size()); }
    const std::string& piece(token_id t) const { return pieces_[size_t(t)]; }
    const std::vector<token_id>& end_tokens() const { return ends_; }

    // Preorder nodes; node 0 is the root (no byte). skip[i]: the first node after i's subtree.
    struct node {
        uint8_t byte;
        uint16_t depth;
        uint32_t skip;
        uint32_t tok_begin, tok_end; // tokens ending here: toks_[tok_begin, tok_end)
    };
    const std::vector<node>& nodes() const { return nodes_; }
    // Tokens in preorder of their end node; a subtree's tokens are the range from its first
    // node's tok_begin to its skip node's tok_begin.
    std::span<const token_id> tokens(uint32_t begin, uint32_t end) const {
        return std::span(toks_).subspan(begin, end - begin);
    }
    uint32_t subtree_end(uint32_t i) const;

private:
    std::vector<std::string> pieces_;
    std::vector<token_id> ends_;
    std::vector<node> nodes_;
    std::vector<token_id> toks_;
};

// What the cache knows of one top position.
struct position_mask {
    token_set accepted;
    std::vector<token_id> uncertain;
};

// Masks for one compiled grammar over one vocabulary; the per-position cache fills as
// positions are met and is shared by every request with the same constraint.
class mask_cache {
public:
    static constexpr size_t context_depth = 4;

    mask_cache(std::shared_ptr<const compiled> g, std::shared_ptr<const vocab_trie> vocab);

    const std::shared_ptr<const compiled>& grammar() const { return g_; }
    const vocab_trie& vocab() const { return *vocab_; }

    // The tokens state m allows next, into `out` (end tokens when m can end).
    void fill(matcher& m, token_set& out);

    size_t n_cached() const;

private:
    // The context of a stack: its top, then up to context_depth return positions, then
    // matcher::root_bottom when the stack ends within them (the mask is then exact).
    using context = std::vector<uint32_t>;
    context context_of(const matcher& m, const matcher::stack& s) const;
    const position_mask& at(const context& c);
    position_mask classify(const context& c) const;

    std::shared_ptr<const compiled> g_;
    std::shared_ptr<const vocab_trie> vocab_;
    mutable std::mutex mu_; // engines on several threads may share a cache
    std::map<context, std::unique_ptr<position_mask>> cache_;
};

} // namespace tandem::grammar
