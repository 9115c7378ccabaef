// Grammars for guided generation: the expression form every front end builds (JSON Schema,
// regular expressions, GBNF, choices), and the compiled byte-level form the matcher runs.
//
// A front end declares rules and defines each by an expression over code points: literals,
// character classes, references to rules, sequences, alternatives and bounded or unbounded
// repetition. build() lowers that to bytes: classes become UTF-8 byte sequences, repetitions
// become helper rules, every rule a list of alternatives of byte classes and rule references.
#pragma once

#include "runtime/error.hpp"

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::grammar {

// A constraint that cannot be honoured or does not parse. The message names what: a schema
// keyword and its JSON pointer, a regex construct and its offset, a GBNF rule and its line.
class grammar_error : public error {
public:
    using error::error;
};

template <class... Args>
[[noreturn]] void reject(fmt::format_string<Args...> f, Args&&... args) {
    throw grammar_error(fmt::format(f, std::forward<Args>(args)...));
}

// UTF-8 for the front ends: the code point at s[pos] and its length in bytes (length 0 for
// malformed UTF-8: truncated, overlong, a surrogate, past U+10FFFF); c's encoding appended.
std::pair<char32_t, size_t> utf8_decode(std::string_view s, size_t pos);
void utf8_append(std::string& out, char32_t c);
// A hex digit's value, or -1.
int hex_value(char c);

using rule_id = uint32_t;
using cp_range = std::pair<char32_t, char32_t>; // inclusive code point range

// An expression over code points. Build with the functions below, not by hand.
struct expr {
    enum class kind : uint8_t { literal, cls, ref, seq, alt, repeat };
    kind k = kind::seq;                // an empty seq matches the empty string
    std::string text;                  // literal: UTF-8
    std::vector<cp_range> ranges;      // cls: the ranges (any order, may overlap)
    bool negated = false;              // cls: every code point but those
    rule_id rule = 0;                  // ref
    std::vector<expr> items;           // seq, alt; repeat: its one item
    int32_t min = 0, max = -1;         // repeat: max -1 is unbounded
};

// Sorted, merged, without surrogates (which UTF-8 cannot carry); the complement when negated.
std::vector<cp_range> normalize(std::vector<cp_range> ranges, bool negated);

expr lit(std::string_view utf8);                               // the exact text ("" matches empty)
expr cls(std::vector<cp_range> ranges, bool negated = false);  // one code point in (or not in) ranges
expr any_char();                                               // any one code point
expr ref(rule_id r);
expr seq(std::vector<expr> items);
expr alt(std::vector<expr> items);                              // at least one item
expr rep(expr e, int32_t min, int32_t max);                     // min..max times (max -1: unbounded)
inline expr opt(expr e) { return rep(std::move(e), 0, 1); }
inline expr star(expr e) { return rep(std::move(e), 0, -1); }
inline expr plus(expr e) { return rep(std::move(e), 1, -1); }

// The compiled grammar: flat element array over bytes.
//
// elems holds every alternative of every rule, each ended by an `end` element; a rule's
// alternatives start at alt_starts[rule]. A position is an index into elems.
struct element {
    enum class kind : uint8_t { bytes, ref, end };
    kind k = kind::end;
    uint32_t arg = 0; // bytes: index into classes; ref: the rule
};

using byte_set = std::array<uint64_t, 4>; // bit b: byte b

inline bool has_byte(const byte_set& s, uint8_t b) { return (s[b >> 6] >> (b & 63)) & 1; }
inline void add_byte(byte_set& s, uint8_t b) { s[b >> 6] |= uint64_t(1) << (b & 63); }

struct compiled {
    std::vector<element> elems;
    std::vector<byte_set> classes;
    std::vector<std::vector<uint32_t>> alt_starts; // per rule
    std::vector<std::string> rule_names;           // per rule, for messages and dumps
    rule_id root = 0;

    // Per position p, where expanding it leads without consuming a byte inside its own frame
    // (build() works it out once, so the matcher's steps need not walk references): the
    // byte positions it reaches, each with the return positions pushed on the way there
    // (the one nearest the frame first), and whether it can finish its rule (and return).
    struct reach {
        uint32_t pos, push_begin, push_end; // pushes: closure_pushes[push_begin, push_end)
    };
    std::vector<uint32_t> closure_begin;  // [elems.size() + 1]: p's reaches are
    std::vector<reach> closure;           //   closure[closure_begin[p], closure_begin[p + 1])
    std::vector<uint32_t> closure_pushes;
    std::vector<uint8_t> completes;       // [elems.size()]

    size_t n_rules() const { return alt_starts.size(); }
    // Readable dump (GBNF-like, byte classes in hex) for tests and `tandem grammar --dump`.
    std::string dump() const;
};

// Limits on what build() accepts: a request's constraint is untrusted input.
struct build_limits {
    size_t max_elems = 1u << 22; // bytes and refs over all rules after lowering
    int32_t max_repeat = 10000;  // a bounded repetition's max (and min)
    // Past it, build() gives up (a request's compile time limit).
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

class builder {
public:
    // A new rule. Names need not be unique (helpers add a suffix); they appear in dumps.
    rule_id declare(std::string name);
    // Its definition; each declared rule is defined once before build().
    void define(rule_id r, expr e);
    rule_id add(std::string name, expr e) {
        const rule_id r = declare(std::move(name));
        define(r, std::move(e));
        return r;
    }
    bool defined(rule_id r) const { return r < defs_.size() && is_defined_[r]; }
    size_t n_rules() const { return defs_.size(); }

    // Lowers to bytes from `root`. Throws grammar_error for a rule declared and not defined,
    // left recursion (a rule that can reach itself without consuming a byte: the matcher
    // would never end expanding it), an empty class, and grammars over the limits.
    compiled build(rule_id root, const build_limits& lim = {}) const;

private:
    std::vector<std::string> names_;
    std::vector<expr> defs_;
    std::vector<bool> is_defined_;
};

} // namespace tandem::grammar
