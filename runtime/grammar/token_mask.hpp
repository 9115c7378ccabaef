// Token masks: which tokens of a vocabulary a matcher state allows next.
//
// The vocabulary's byte strings form a trie, walked depth first, so a shared prefix is
// matched once and a rejected prefix cuts its whole subtree. Most of a mask does not depend
// on the whole stack (XGrammar's adaptive token mask cache): for the top position and the few
// return positions under it (the context, up to context_depth frames), the walk is done once,
// from that context alone, and sorts the tokens into accepted (valid whatever lies below),
// rejected, and uncertain (they go on past the context, into frames it does not know). At run
// time a state's mask is the union of its stacks' accepted sets, plus the uncertain tokens
// that the stack itself lets through. A few frames matter: the top is often a one-character
// rule (a class), whose end alone would leave nearly every token uncertain.
//
// A context is classified from the context less its last frame: only the tokens that one
// left uncertain are walked again, so the whole trie is walked for a top position alone and
// a top with one frame, which many contexts share. The walks step a table of the matcher
// states they meet (token_mask.cpp), so most trie nodes cost a lookup, not a matcher step.
#pragma once

#include "runtime/grammar/matcher.hpp"
#include "runtime/tokenizer.hpp"

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <map>
#include <string>
#include <unordered_map>
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
    uint64_t hash() const;
    bool operator==(const token_set&) const = default;

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

    // Preorder nodes; node 0 is the root (no byte). Tokens are numbered in preorder of their
    // end node (trie order), so a subtree's tokens are a range.
    struct node {
        uint8_t byte;
        uint16_t depth;
        uint32_t skip;               // the first node after this one's subtree
        uint32_t tok_begin, tok_end; // tokens ending here: [tok_begin, tok_end)
        uint32_t tok_skip;           // the subtree's tokens: [tok_begin, tok_skip)
    };
    const std::vector<node>& nodes() const { return nodes_; }
    uint32_t max_depth() const { return max_depth_; }
    // The token numbered k in trie order, and how many there are.
    token_id token(uint32_t k) const { return toks_[k]; }
    uint32_t n_tokens() const { return uint32_t(toks_.size()); }

private:
    std::vector<std::string> pieces_;
    std::vector<token_id> ends_;
    std::vector<node> nodes_;
    std::vector<token_id> toks_;
    uint32_t max_depth_ = 0;
};

// What the cache knows of one context.
struct position_mask {
    const token_set* accepted = nullptr; // one of the cache's distinct sets
    std::vector<uint32_t> uncertain;     // in trie order: vocab_trie::token(k)
};

class state_table; // token_mask.cpp

// Masks for one compiled grammar over one vocabulary; the per-context cache is filled ahead
// for a time at construction, then as contexts are met, and is shared by every request with
// the same constraint.
class mask_cache {
public:
    static constexpr size_t context_depth = 4;
    static constexpr size_t max_states = 1024; // of the classification walks' state table

    // Classifying a context walks the vocabulary's trie: up to about a millisecond (a string's
    // characters inside a length limit), on the request path when it is first met. So the
    // constructor first classifies the contexts the grammar reaches, nearest the start first,
    // for `prepare_for` at most (0: none).
    static constexpr std::chrono::microseconds default_prepare{250'000};
    mask_cache(std::shared_ptr<const compiled> g, std::shared_ptr<const vocab_trie> vocab,
               std::chrono::microseconds prepare_for = default_prepare);
    ~mask_cache();

    // Classifies the contexts the grammar reaches, nearest the start first, for `budget` at
    // most (what the constructor does with prepare_for). It holds the lock one context at a
    // time, so requests may use the cache meanwhile: the daemon runs it beside them.
    void prepare(std::chrono::microseconds budget);

    const std::shared_ptr<const compiled>& grammar() const { return g_; }
    const vocab_trie& vocab() const { return *vocab_; }

    // The tokens state m allows next, into `out` (end tokens when m can end).
    void fill(matcher& m, token_set& out);

    size_t n_cached() const; // contexts

    // The context of a stack: its top, then up to context_depth return positions, then
    // matcher::root_bottom when the stack ends within them (the mask is then exact).
    using context = std::vector<uint32_t>;

private:
    context context_of(const matcher& m, const matcher::stack& s) const;
    const position_mask& at(const context& c); // mu_ held
    position_mask classify(const context& c, const position_mask* outer); // mu_ held
    const token_set* intern(token_set s);                                  // mu_ held

    std::shared_ptr<const compiled> g_;
    std::shared_ptr<const vocab_trie> vocab_;
    mutable std::mutex mu_; // engines on several threads may share a cache
    std::map<context, const position_mask*> cache_; // into masks_
    std::deque<position_mask> masks_;
    std::deque<token_set> sets_; // the distinct accepted sets
    std::unordered_multimap<uint64_t, const token_set*> sets_index_; // by hash
    std::unique_ptr<state_table> states_; // of every context's walk
    std::vector<uint32_t> all_; // every token of the trie, in trie order
};

} // namespace tandem::grammar
