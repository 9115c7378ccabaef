// The fast matcher: a pushdown recognizer over a compiled grammar's bytes.
//
// Its state is a set of stacks. A stack's top is a position at a byte class; below it are
// return positions, kept in an arena as a tree (stacks that share their bottom share its
// nodes, as in XGrammar's persistent stack). A reference whose alternative ends after it is
// a tail call and pushes nothing, so repetition does not grow a stack. Bytes are consumed one
// at a time; checkpoint() and rollback() undo them in LIFO order, which the token-mask walk
// over the vocabulary trie uses to try every token from one state.
#pragma once

#include "runtime/grammar/grammar.hpp"

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace tandem::grammar {

class matcher {
public:
    // Below the root's stacks: completing the root here means the text may end.
    static constexpr uint32_t root_bottom = 0;
    // Below a stack the mask cache starts from one position: completing it here means "what
    // follows depends on the context", which the cache reports as uncertain.
    static constexpr uint32_t any_bottom = 1;

    struct stack {
        uint32_t pos;    // a bytes element of g.elems
        uint32_t parent; // arena node of the return position below it
        bool operator==(const stack&) const = default;
    };

    // The state at the start of the root rule.
    explicit matcher(std::shared_ptr<const compiled> g);
    // The state of one stack alone: its top `pos` (a bytes element), then the return
    // positions `below` (nearest first), then `bottom` (any_bottom or root_bottom).
    matcher(std::shared_ptr<const compiled> g, uint32_t pos, std::span<const uint32_t> below = {},
            uint32_t bottom = any_bottom);

    // Consumes one byte when some stack allows it; otherwise false, the state unchanged.
    bool advance(uint8_t byte);
    // All of `bytes` or nothing.
    bool advance(std::string_view bytes);

    // What was consumed may end here (a stack completed the root).
    bool can_end() const { return at_root_; }
    // A stack completed the rule the state was started at (any_bottom): more bytes would
    // continue in a context the state does not know.
    bool at_any() const { return at_any_; }
    // No byte can follow (only the end, if can_end()).
    bool dead() const { return stacks_.empty(); }
    const std::vector<stack>& stacks() const { return stacks_; }
    // A node below a stack's top: its return position and the node below it.
    stack frame(uint32_t node) const { return {nodes_[node].pos, nodes_[node].parent}; }
    const compiled& grammar() const { return *g_; }

    // Undo points, LIFO: rollback(m) returns to the state checkpoint() saw and keeps m (it
    // may be returned to again); drop(m), m the newest, forgets it and keeps the state.
    struct mark {
        size_t n_nodes, n_saved;
    };
    mark checkpoint();
    void rollback(const mark& m);
    void drop(const mark& m);

    // The mask cache's trie walks keep the states they meet, for every context, in one matcher
    // and return to them at will, where checkpoints would be LIFO. reset() sets the state to
    // one stack, as the constructor above does; restore() to `stacks` (nodes of this matcher's
    // arena, as stacks() gave them) and end flags.
    void reset(uint32_t pos, std::span<const uint32_t> below, uint32_t bottom);
    void restore(std::span<const stack> stacks, bool at_root, bool at_any);

    // Whether `bytes` can be consumed from one of the state's stacks alone, below it intact
    // (the mask's check of a token that depends on more than the top of the stack). The
    // state is left as it was.
    bool accepts_from(const stack& s, std::string_view bytes);

private:
    struct node {
        uint32_t pos, parent;
    };
    struct state {
        std::vector<stack> stacks;
        bool at_root, at_any;
    };
    void expand(uint32_t pos, uint32_t parent);
    bool first_visit(uint64_t key); // (pos << 32 | parent), and a bit for stacks
    bool insert_seen(uint64_t key);
    uint32_t node_of(uint32_t pos, uint32_t parent);
    void rehash_nodes();
    void truncate(size_t n_nodes);

    std::shared_ptr<const compiled> g_;
    std::vector<node> nodes_;       // arena: [0] root_bottom, [1] any_bottom
    // Hash-consed: one node per (pos, parent), so equal stacks are equal pairs and an
    // ambiguous grammar's stacks merge instead of multiplying.
    static constexpr uint32_t tombstone = UINT32_MAX;
    std::vector<uint32_t> slots_;  // see node_of()
    size_t n_slot_used_ = 0;       // slots not empty (tombstones included)
    std::vector<stack> stacks_;     // current, deduplicated
    bool at_root_ = false, at_any_ = false;
    std::vector<state> saved_;      // [0, n_saved_): the states live marks return to
    size_t n_saved_ = 0;            // (entries past it keep their capacity for reuse)
    std::vector<stack> old_, work_; // scratch of advance() and expand()
    // (pos, parent) pairs expand() reached in this step: the first few in small_, more in an
    // open-addressing table whose entries are live when their stamp is the step's.
    std::array<uint64_t, 16> small_{};
    size_t n_small_ = 0;
    bool hashed_ = false;
    std::vector<uint64_t> seen_key_;
    std::vector<uint32_t> seen_stamp_;
    uint32_t stamp_ = 0;
    size_t n_seen_ = 0;
};

} // namespace tandem::grammar
