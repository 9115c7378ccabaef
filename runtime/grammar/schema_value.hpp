// The JSON values a schema allows, as sets closed under intersection, union and complement:
// what allOf, anyOf, oneOf, not and if/then/else compute with.
//
// A value_set holds, per JSON type, the allowed values: null and booleans as flags, numbers
// and strings as regular languages over their text (automaton.hpp), arrays and objects as
// unions of shapes. A shape's parts (a property's value, an array's items) are formulas over
// subschemas, evaluated only when the grammar needs their rule, so recursive schemas stay
// finite. Number texts are those of the number universe (json_text.hpp): no exponent, at most
// 15 integer and 20 fraction digits, no negative zero; each language holds every text of each
// value it holds, so the complement is exact within it.
#pragma once

#include "runtime/grammar/automaton.hpp"
#include "runtime/grammar/schema_doc.hpp"

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tandem::grammar {

// ---- formulas over subschemas

using formula_id = uint32_t;
constexpr formula_id f_false = 0, f_true = 1;

struct formula_node {
    enum class op : uint8_t { constant, loc, all, any, negate };
    op o = op::constant;
    const schema_loc* loc = nullptr;
    std::vector<formula_id> args; // all, any: sorted, distinct; negate: one
};

class formula_table {
public:
    formula_table();
    formula_id of(const schema_loc& s); // true and false schemas become the constants
    formula_id all(std::vector<formula_id> fs) { return combine(formula_node::op::all, std::move(fs)); }
    formula_id any(std::vector<formula_id> fs) { return combine(formula_node::op::any, std::move(fs)); }
    formula_id negate(formula_id f);
    const formula_node& at(formula_id f) const { return nodes_[f]; }
    size_t size() const { return nodes_.size(); }

private:
    formula_id combine(formula_node::op o, std::vector<formula_id> fs);
    formula_id intern(formula_node n);
    std::vector<formula_node> nodes_;
    std::map<std::tuple<uint8_t, const schema_loc*, std::vector<formula_id>>, formula_id> index_;
};

// ---- scalars

// Strings as their decoded code points: the language of d (all: every string) of
// min_len..max_len code points. Lengths stay apart from the automaton (a bound of 10,000 would
// be that many states in it) until a union or complement needs them in (language()).
struct string_set {
    bool all = false; // d unused
    dfa d;
    int64_t min_len = 0, max_len = -1;

    static string_set none() { return {}; }
    static string_set every() { return {true, {}, 0, -1}; }
    static string_set of(dfa x);
    bool is_every() const { return all && min_len == 0 && max_len < 0; }
    bool empty() const;
    // The whole language as one automaton (a grammar_error for lengths too large for one).
    dfa language() const;
};

// Numbers as their texts.
struct number_set {
    bool any = false; // every JSON number, exponent forms too (d unused)
    dfa d;            // else these texts of the universe
    static number_set none() { return {}; }
    static number_set every() { return {true, {}}; }
    bool empty() const { return !any && d.empty(); }
};

// ---- arrays and objects

struct array_shape {
    std::vector<formula_id> prefix; // items 0..n-1
    formula_id rest = f_true;       // items n and after
    int64_t min = 0, max = -1;      // item count (max -1: unbounded)
    // The items from index `from` on that are valid under f number min..max (contains).
    struct count {
        formula_id f;
        int64_t from, min, max;
    };
    std::vector<count> counts;
    bool unique = false;
    // unevaluatedItems: items before n_evaluated are evaluated, all of them with all_evaluated.
    size_t n_evaluated = 0;
    bool all_evaluated = false;

    bool is_any() const;
};

// A part of the key space and what a member with such a key must be. The classes of a shape
// partition every string: its names, then key regions (automata) that exclude those names.
struct member_class {
    bool named = false;
    std::string name;    // named: the decoded key
    dfa keys;            // else the keys (decoded)
    formula_id value = f_true; // f_false: no such member
    int64_t min = 0, max = -1; // members of a region (named: 0 or 1, required says which)
    bool evaluated = false;    // by properties, patternProperties or additionalProperties
};

struct object_shape {
    std::vector<member_class> classes;
    std::vector<std::string> required; // names of named classes
    int64_t min = 0, max = -1;         // property count

    static object_shape any();
    bool is_any() const;
    // The class a key falls in.
    const member_class& class_of(const std::string& key) const;
    bool needs(const std::string& name) const;
};

struct value_set {
    bool null_ok = false;
    uint8_t bools = 0; // bit 0: false, bit 1: true
    number_set numbers;
    string_set strings;
    std::vector<array_shape> arrays;
    std::vector<object_shape> objects;

    static value_set none() { return {}; }
    static value_set every();
    bool is_every() const;
    bool trivially_empty() const; // no type has anything left
};

// The operations, with the formula table that shapes' parts are built in, and limits on the
// unions they make (a grammar_error naming `where` past them).
class value_algebra {
public:
    explicit value_algebra(formula_table& f) : f_(f) {}

    value_set meet(const value_set& a, const value_set& b, const std::string& where);
    static string_set meet(const string_set& a, const string_set& b);
    value_set join(value_set a, const value_set& b);
    value_set complement(const value_set& a, dialect d, const std::string& where);

    std::optional<object_shape> meet(const object_shape& a, const object_shape& b, const std::string& where);
    std::optional<array_shape> meet(const array_shape& a, const array_shape& b);
    // The shapes whose union is everything of the type a does not allow.
    std::vector<object_shape> complement(const object_shape& a, const std::string& where);
    std::vector<array_shape> complement(const array_shape& a, const std::string& where);

    static constexpr size_t max_terms = 64; // shapes of one type in a value_set

private:
    formula_table& f_;
};

} // namespace tandem::grammar
