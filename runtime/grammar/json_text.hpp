// The texts of JSON scalars as regular languages: numbers (the universe the compiler writes
// numbers in, integers, ranges, multipleOf, a given value), string formats, and how a string's
// characters are written inside its quotes.
//
// The number universe: an optional minus, an integer part of at most 15 digits without
// leading zeros, an optional fraction of 1 to 20 digits; no exponent, no negative zero. Every
// language here holds all the texts of the universe whose value it holds (5, 5.0 and 5.00
// alike), so that complements are exact within the universe.
#pragma once

#include "runtime/grammar/automaton.hpp"
#include "runtime/grammar/schema_doc.hpp"

#include <optional>
#include <string>
#include <vector>

namespace tandem::grammar {

constexpr int kIntDigits = 15, kFracDigits = 20, kExpDigits = 2;

const dfa& number_universe();
// Integers: no fraction, or one of zeros (a JSON Schema integer since draft-06; draft-04 reads
// 1.0 as a number that is not an integer).
const dfa& integer_texts(dialect d);

struct number_bound {
    double v;
    bool strict;
};
// The numbers in [lo, hi] (either open, either absent).
dfa number_range(const std::optional<number_bound>& lo, const std::optional<number_bound>& hi);
// The multiples of m (m > 0, read as the shortest decimal of its double); a grammar_error
// naming `where` when its automaton would be too large.
dfa multiples_of(double m, const std::string& where);
// The texts of the number v (empty when the universe has none).
dfa number_texts(const nlohmann::ordered_json& v);

// A string format as a regular expression over the decoded value, and its length bound in code
// points (-1: none); nullptr for a name that is not one of these.
const std::string* format_regex(std::string_view name);
int64_t format_max_length(std::string_view name);
// The formats the specification defines that Tandem does not check (a schema that asks for one
// is refused; any other unknown name is an annotation, as validators read it).
bool format_unchecked(std::string_view name);

// One character of a string's body whose value is in `set` (sorted, disjoint, no surrogates),
// as JSON writes it: raw (printable ASCII, DEL and non-ASCII), `\"` and `\\`, `\/` for `/`,
// the short escapes of control characters or \u00XX, \uXXXX (either case) for non-ASCII and
// DEL, and surrogate pairs for astral code points. Printable ASCII is raw only.
expr json_char(const std::vector<cp_range>& set);

// Helpers of the integer range code (digits as strings compared as fractions).
struct digits_bound {
    std::string digits;
    bool strict = false;
};
std::vector<expr> digit_range(std::optional<digits_bound> lo, std::optional<digits_bound> hi, int min_len,
                              int max_len, int base);

} // namespace tandem::grammar
