// The JSON Schema compiler's parts (internal to runtime/grammar): reading subschemas into value
// sets (schema_translate.cpp) and writing value sets as grammar rules (schema_emit.cpp).
#pragma once

#include "runtime/grammar/json_schema.hpp"
#include "runtime/grammar/schema_value.hpp"

#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

namespace tandem::grammar {

class schema_compiler {
public:
    schema_compiler(builder& b, const nlohmann::ordered_json& root, const json_options& opt);

    // The rule for a value valid under the whole schema.
    rule_id root_rule();
    // The rule for any JSON object.
    rule_id any_object() { return shared(object_, "object", &schema_compiler::make_object); }

    // ---- reading (schema_translate.cpp)

    // The values valid under f, computed once (a grammar_error for a $ref cycle with nothing
    // between, which no value can satisfy or which never ends).
    const value_set& eval(formula_id f);
    // Whether f certainly has no value (false when unsure, or when f is being evaluated).
    bool provably_empty(formula_id f, int depth);
    bool provably_empty(const value_set& v, int depth);

private:
    value_set translate(const schema_loc& s);
    value_set types_of(const nlohmann::ordered_json& t, const schema_loc& s);
    value_set const_value(const nlohmann::ordered_json& v, const schema_loc& s, const std::string& path);
    value_set enum_values(const nlohmann::ordered_json& values, const schema_loc& s);
    string_set string_part(const schema_loc& s);
    number_set number_part(const schema_loc& s);
    object_shape object_part(const schema_loc& s);
    value_set dependencies(const schema_loc& s);
    array_shape array_part(const schema_loc& s);
    value_set one_of(const schema_loc& s);
    void unevaluated(const schema_loc& s, value_set& v);
    const dfa& pattern(const std::string& re, const schema_loc& s, std::string_view keyword);
    // The schema in `keyword` of s, as a formula (true when absent).
    formula_id sub(const schema_loc& s, std::string_view keyword);
    // Follows a subschema that is only a reference (draft-07 and before: any $ref) to what it
    // names; a cycle of such references is an error.
    const schema_loc& through_refs(const schema_loc& s);
    std::optional<const schema_loc*> ref_target(const schema_loc& s);

    // ---- writing (schema_emit.cpp)

    rule_id emit(formula_id f);
    expr formula_expr(formula_id f);
    expr value_expr(const value_set& v, const std::string& name);
    expr object_expr(const object_shape& o, const std::string& name);
    expr array_expr(const array_shape& a, const std::string& name);
    rule_id string_rule(const string_set& s);
    rule_id number_rule(const dfa& d);
    rule_id dfa_rules(const dfa& d, bool json_chars, const std::string& name);
    rule_id char_rule(const std::vector<cp_range>& set);
    expr key_literal(const std::string& name);

    using maker = expr (schema_compiler::*)();
    rule_id shared(std::optional<rule_id>& slot, const char* name, maker make);
    expr ws() { return ref(shared(ws_, "ws", &schema_compiler::make_ws)); }
    expr sep() { return seq({ws(), lit(","), ws()}); }
    expr colon() { return seq({ws(), lit(":"), ws()}); }
    rule_id any_char() { return shared(char_, "char", &schema_compiler::make_char); }
    rule_id any_string() { return shared(string_, "string", &schema_compiler::make_string); }
    rule_id any_number() { return shared(number_, "number", &schema_compiler::make_number); }
    rule_id any_value() { return shared(value_, "value", &schema_compiler::make_value); }
    rule_id any_array() { return shared(array_, "array", &schema_compiler::make_array); }
    expr make_ws();
    expr make_char();
    expr make_string();
    expr make_number();
    expr make_value();
    expr make_object();
    expr make_array();

    builder& b_;
    schema_doc doc_;
    formula_table f_;
    value_algebra alg_;
    json_options opt_;
    std::unordered_map<formula_id, value_set> evals_;
    std::set<formula_id> evaluating_;
    std::unordered_map<formula_id, rule_id> rules_;
    std::map<std::string, rule_id> dfa_rules_, char_rules_;
    std::map<std::string, dfa> patterns_;
    std::set<const schema_loc*> disjoint_one_of_; // oneOf whose branches exclude each other
    size_t n_translated_ = 0;
    std::optional<rule_id> ws_, char_, string_, number_, value_, object_, array_;
};

} // namespace tandem::grammar
