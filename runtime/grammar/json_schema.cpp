// JSON Schema to grammar: the entry points over the compiler of schema_compiler.hpp.
#include "runtime/grammar/json_schema.hpp"

#include "runtime/grammar/schema_compiler.hpp"

#include <nlohmann/json.hpp>

namespace tandem::grammar {

std::string_view name_of(whitespace w) { return w == whitespace::compact ? "compact" : "bounded"; }

rule_id add_json_schema(builder& b, const nlohmann::ordered_json& schema, const json_options& opt) {
    return schema_compiler(b, schema, opt).root_rule();
}

compiled build_json_schema(const builder& b, rule_id root, const build_limits& lim) {
    try {
        return b.build(root, lim);
    } catch (const grammar_error& e) {
        if (std::string_view(e.what()).starts_with("the grammar matches no text"))
            reject("the schema is unsatisfiable: no JSON value is valid under it");
        throw;
    }
}

rule_id add_json_object(builder& b, const json_options& opt) {
    const nlohmann::ordered_json none = nlohmann::ordered_json::object();
    return schema_compiler(b, none, opt).any_object();
}

} // namespace tandem::grammar
