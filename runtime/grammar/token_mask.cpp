#include "runtime/grammar/token_mask.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <deque>
#include <numeric>
#include <set>

namespace tandem::grammar {

int32_t token_set::count() const {
    int32_t n = 0;
    for (const uint64_t w : w_) n += std::popcount(w);
    return n;
}

uint64_t token_set::hash() const {
    uint64_t h = uint64_t(n_);
    for (const uint64_t w : w_) h = (h ^ w) * 0x9E3779B97F4A7C15ull;
    return h;
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
    nodes_.push_back({0, 0, 0, 0, 0, 0});
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
            nodes_.push_back({uint8_t(p[i]), uint16_t(std::min<size_t>(i + 1, 65535)), 0, here, here, 0});
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
    for (auto& n : nodes_) {
        n.tok_skip = n.skip < nodes_.size() ? nodes_[n.skip].tok_begin : uint32_t(toks_.size());
        max_depth_ = std::max<uint32_t>(max_depth_, n.depth);
    }
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

mask_cache::mask_cache(std::shared_ptr<const compiled> g, std::shared_ptr<const vocab_trie> vocab,
                       std::chrono::microseconds prepare_for)
    : g_(std::move(g)), vocab_(std::move(vocab)), states_(std::make_unique<state_table>(g_)), all_(vocab_->n_tokens()) {
    std::iota(all_.begin(), all_.end(), 0u);
    if (prepare_for.count() > 0) prepare(prepare_for);
}

mask_cache::~mask_cache() = default;

// The stacks the grammar can reach, breadth first from the start, one per context: a stack's
// successors are the same for every byte its top allows, so one byte stands for them all. A
// recursive grammar reaches stacks without end but contexts with one, so this ends there too;
// a deadline ends it for the rest, and what it did not reach is classified when met.
void mask_cache::prepare(std::chrono::microseconds budget) {
    const auto deadline = std::chrono::steady_clock::now() + budget;
    matcher m(g_); // this walk's own: only the cache itself is shared
    std::vector<matcher::stack> todo;
    std::set<context> seen;
    const auto visit = [&](const matcher::stack& s) {
        if (seen.insert(context_of(m, s)).second) todo.push_back(s);
    };
    for (const auto& s : m.stacks()) visit(s);
    for (size_t i = 0; i < todo.size() && std::chrono::steady_clock::now() < deadline; ++i) {
        const matcher::stack s = todo[i];
        {
            std::lock_guard lock(mu_);
            at(context_of(m, s));
        }
        const byte_set& cls = g_->classes[g_->elems[s.pos].arg];
        int b = 0;
        while (b < 256 && !has_byte(cls, uint8_t(b))) ++b;
        m.restore(std::span(&s, 1), false, false);
        if (b == 256 || !m.advance(uint8_t(b))) continue; // an empty class: a dead end
        for (const auto& t : m.stacks()) visit(t);
    }
}

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

// A context's walk needs only the tokens its context less one frame left uncertain: those
// accepted or rejected there are so whatever lies below (and with none left, the context has
// the same mask). So most contexts walk a few tokens, and the whole trie is walked for a top
// position and its nearest frames, which many contexts share.
const position_mask& mask_cache::at(const context& c) {
    if (const auto it = cache_.find(c); it != cache_.end()) return *it->second;
    const position_mask* outer = c.size() == 1 ? nullptr : &at(context(c.begin(), c.end() - 1));
    const position_mask* pm = outer;
    if (!outer || !outer->uncertain.empty()) pm = &masks_.emplace_back(classify(c, outer));
    cache_.emplace(c, pm);
    return *pm;
}

// The matcher states the classification walks meet, each kept once, and their moves by each
// byte, worked out the first time a walk takes them. Most of a vocabulary's trie leads back to
// a handful of states (inside a string nearly every byte returns to the string's state), so
// most trie nodes cost a table lookup instead of a matcher step; and contexts share states
// (the context one character into a bounded repetition is the next one's start), so a new
// context's walk mostly finds its moves made.
class state_table {
public:
    static constexpr int32_t dead = -1, unknown = -2;

    explicit state_table(std::shared_ptr<const compiled> g) : m_(std::move(g)) {}
    size_t n_states() const { return keys_.size(); }

    // The state of context c's one stack.
    int32_t start(const mask_cache::context& c) {
        const bool whole = c.back() == matcher::root_bottom && c.size() > 1;
        m_.reset(c[0], std::span(c).subspan(1, c.size() - 1 - (whole ? 1 : 0)),
                 whole ? matcher::root_bottom : matcher::any_bottom);
        return intern();
    }
    // State s's move by `byte`: a state, or dead.
    int32_t next(int32_t s, uint8_t byte) {
        if (moves_[size_t(s)][byte] == unknown) step(s, byte);
        return moves_[size_t(s)][byte];
    }
    // s's moves by byte, as next() gives them where not unknown (they stay where they are).
    const int32_t* moves(int32_t s) const { return moves_[size_t(s)].data(); }
    // A stack of s completed the context's bottom frame: bytes after s go past the context.
    bool at_any(int32_t s) const { return flags_[size_t(s)] & 2; }
    // s has no stacks: every byte after it is dead.
    bool exhausted(int32_t s) const { return flags_[size_t(s)] & 4; }

private:
    // The move by `byte`, and by every byte that each of s's stacks treats alike (in the same
    // classes): those lead to the same state.
    void step(int32_t s, uint8_t byte) {
        const std::vector<uint32_t>& k = keys_[size_t(s)];
        stacks_.clear();
        byte_set alike{~0ull, ~0ull, ~0ull, ~0ull};
        for (size_t i = 1; i < k.size(); i += 2) {
            stacks_.push_back({k[i], k[i + 1]});
            const byte_set& c = m_.grammar().classes[m_.grammar().elems[k[i]].arg];
            const uint64_t flip = has_byte(c, byte) ? 0 : ~0ull;
            for (size_t w = 0; w < 4; ++w) alike[w] &= c[w] ^ flip;
        }
        m_.restore(stacks_, k[0] & 1, k[0] & 2);
        const int32_t t = m_.advance(byte) ? intern() : dead;
        for (int b = 0; b < 256; ++b)
            if (has_byte(alike, uint8_t(b))) moves_[size_t(s)][size_t(b)] = t;
    }

    // The matcher's state as a key: its end flags, then its stacks in order (a state's stacks
    // are a set; the order advance() leaves them in depends on the path).
    int32_t intern() {
        stacks_.assign(m_.stacks().begin(), m_.stacks().end());
        std::sort(stacks_.begin(), stacks_.end(), [](const matcher::stack& a, const matcher::stack& b) {
            return std::pair(a.pos, a.parent) < std::pair(b.pos, b.parent);
        });
        std::vector<uint32_t> k{uint32_t(m_.can_end()) | uint32_t(m_.at_any()) << 1};
        for (const matcher::stack& st : stacks_) k.insert(k.end(), {st.pos, st.parent});
        const auto [it, fresh] = index_.try_emplace(std::move(k), int32_t(keys_.size()));
        if (fresh) {
            keys_.push_back(it->first);
            flags_.push_back(uint8_t(it->first[0] | (m_.dead() ? 4 : 0)));
            moves_.emplace_back().fill(unknown);
        }
        return it->second;
    }

    matcher m_;
    std::map<std::vector<uint32_t>, int32_t> index_;
    std::vector<std::vector<uint32_t>> keys_; // per state
    std::vector<uint8_t> flags_;              // per state: the key's end flags, 4 when no stacks
    std::deque<std::array<int32_t, 256>> moves_; // per state and byte: next state, dead or unknown
                                                 // (a deque: a new state copies no rows)
    std::vector<matcher::stack> stacks_;      // scratch of step() and intern()
};

// The walk over the trie from context c alone, over the tokens `outer` left uncertain (all
// when null) only: subtrees without one are skipped. At each node the walk holds the state
// after the node's bytes, and whether some path to it went past the context, into frames the
// walk does not know. A node no stack survives ends its subtree: uncertain when a path
// escaped on the way, rejected otherwise.
position_mask mask_cache::classify(const context& c, const position_mask* outer) {
    // The table is a cache of matcher steps (a state and its moves, about 1 KiB): past a bound
    // it starts again, and whatever the walks need comes back.
    if (states_->n_states() >= max_states) states_ = std::make_unique<state_table>(g_);
    token_set accepted = outer ? *outer->accepted : token_set(vocab_->n_vocab());
    position_mask pm;
    const std::span<const uint32_t> among = outer ? outer->uncertain : all_;
    state_table& states = *states_;
    const auto& nodes = vocab_->nodes();
    // path[k]: the state at depth k on the current path, its moves, and whether a path to a
    // node below it escaped.
    struct step {
        int32_t state;
        const int32_t* moves;
        bool esc;
    };
    std::vector<step> path(size_t(vocab_->max_depth()) + 1);
    const auto enter = [&](uint32_t depth, int32_t s, bool esc) {
        path[depth] = {s, states.moves(s), esc || states.at_any(s)};
    };
    enter(0, states.start(c), false);
    size_t next = 0; // among[next]: the first token not yet passed
    // The tokens of among before `end`: uncertain when `esc`, else rejected.
    const auto pass = [&](uint32_t end, bool esc) {
        const size_t past = size_t(std::lower_bound(among.begin() + next, among.end(), end) - among.begin());
        if (esc) pm.uncertain.insert(pm.uncertain.end(), among.begin() + next, among.begin() + past);
        next = past;
    };
    for (uint32_t i = 1; i < nodes.size() && next < among.size();) {
        const vocab_trie::node& n = nodes[i];
        if (among[next] >= n.tok_skip) {
            i = n.skip;
            continue;
        }
        const step& from = path[n.depth - 1];
        int32_t to = from.moves[n.byte];
        if (to == state_table::unknown) to = states.next(from.state, n.byte);
        if (to == state_table::dead) {
            pass(n.tok_skip, from.esc);
            i = n.skip;
            continue;
        }
        for (; next < among.size() && among[next] < n.tok_end; ++next) accepted.add(vocab_->token(among[next]));
        if (states.exhausted(to)) { // no byte can follow: the subtree below is dead
            pass(n.tok_skip, from.esc || states.at_any(to));
            i = n.skip;
            continue;
        }
        enter(n.depth, to, from.esc);
        ++i;
    }
    pm.accepted = intern(std::move(accepted));
    return pm;
}

// Many contexts accept the same tokens (a string's, a number's, one literal's), and a set is
// a few KiB: each distinct one is kept once.
const token_set* mask_cache::intern(token_set s) {
    const uint64_t h = s.hash();
    for (auto [it, end] = sets_index_.equal_range(h); it != end; ++it)
        if (*it->second == s) return it->second;
    const token_set* kept = &sets_.emplace_back(std::move(s));
    sets_index_.emplace(h, kept);
    return kept;
}

void mask_cache::fill(matcher& m, token_set& out) {
    out.clear();
    if (m.can_end())
        for (const token_id t : vocab_->end_tokens()) out.add(t);
    const std::vector<matcher::stack> stacks = m.stacks();
    std::vector<const position_mask*> pms;
    {
        std::lock_guard lock(mu_); // the masks stay where they are once made
        for (const auto& s : stacks) pms.push_back(&at(context_of(m, s)));
    }
    std::vector<const token_set*> added; // stacks of one state often share a set
    for (const position_mask* pm : pms) {
        if (std::find(added.begin(), added.end(), pm->accepted) != added.end()) continue;
        out.add_all(*pm->accepted);
        added.push_back(pm->accepted);
    }
    // The uncertain tokens of each stack's context, tried from that stack with all below it.
    for (size_t i = 0; i < stacks.size(); ++i) {
        for (const uint32_t k : pms[i]->uncertain) {
            const token_id t = vocab_->token(k);
            if (!out.has(t) && m.accepts_from(stacks[i], vocab_->piece(t))) out.add(t);
        }
    }
}

} // namespace tandem::grammar
