// Deterministic finite automata over code points: the regular languages JSON Schema's strings
// (pattern, lengths, formats, enums, `not`) and number texts (ranges, multipleOf) come down to,
// closed under intersection, union and complement, so that allOf, anyOf, oneOf and not over
// them are exact.
//
// A dfa is kept trimmed (every state is reachable and can reach an accepting one) and minimal;
// state 0 is the start. The empty language is one state, not accepting, without edges.
#pragma once

#include "runtime/grammar/grammar.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::grammar {

// What a JSON string can hold: every code point but the surrogates.
inline const std::vector<cp_range>& all_chars() {
    static const std::vector<cp_range> r = {{0, 0xD7FF}, {0xE000, 0x10FFFF}};
    return r;
}

class dfa {
public:
    struct edge {
        char32_t lo, hi; // inclusive
        uint32_t to;
        bool operator==(const edge&) const = default;
    };
    // States past this are a grammar_error naming `what` (a schema keyword and its path).
    static constexpr size_t default_max_states = 20000;

    // The empty language.
    dfa();
    // Every string of code points in all_chars().
    static dfa all();
    // Exactly these strings (UTF-32).
    static dfa of_strings(const std::vector<std::u32string>& strings);
    // The language of an expression without rule references (literals, classes, sequences,
    // alternatives, repetitions); `what` names it in errors.
    static dfa of(const expr& e, std::string_view what, size_t max_states = default_max_states);
    // Strings of all_chars() of min..max code points (max -1: unbounded).
    static dfa lengths(int64_t min, int64_t max);
    // From a table (state 0 the start; each state's edges sorted, disjoint), trimmed and minimized.
    static dfa from_table(std::vector<std::vector<edge>> edges, std::vector<uint8_t> accepting);

    dfa operator&(const dfa& o) const; // intersection
    dfa operator|(const dfa& o) const; // union
    dfa operator-(const dfa& o) const; // this and not o
    dfa complement() const;            // all() less this

    bool empty() const { return !accepting_[0] && edges_[0].empty(); }
    bool universal() const; // == all()
    bool accepts(std::u32string_view s) const;
    size_t n_states() const { return edges_.size(); }
    const std::vector<edge>& edges(uint32_t s) const { return edges_[s]; }
    bool accepting(uint32_t s) const { return accepting_[s]; }
    // The one string of a language of exactly one (a `const` after intersections).
    bool single(std::u32string& out) const;
    bool operator==(const dfa& o) const { return edges_ == o.edges_ && accepting_ == o.accepting_; }
    // Identifies the language (minimal dfas of one language are equal up to state numbering,
    // which the construction makes canonical: states in breadth-first order of edges).
    std::string key() const;

private:
    friend class dfa_builder;
    std::vector<std::vector<edge>> edges_; // per state, sorted by lo, disjoint
    std::vector<uint8_t> accepting_;
};

// The UTF-32 form of UTF-8 text (a grammar_error for malformed text).
std::u32string to_u32(std::string_view utf8);

} // namespace tandem::grammar
