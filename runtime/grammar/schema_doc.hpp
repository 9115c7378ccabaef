// A JSON Schema document as the specification reads it: its dialect (draft-04 to 2020-12, by
// `$schema`), which keywords that dialect defines (every other keyword is an annotation and
// changes nothing), its resources (`$id`, draft-04's `id`) and anchors (`$anchor`,
// `$dynamicAnchor`, plain-name ids), and `$ref` resolution against base URIs.
#pragma once

#include "runtime/grammar/grammar.hpp"

#include <nlohmann/json.hpp>

#include <deque>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>

namespace tandem::grammar {

enum class dialect : uint8_t { draft4, draft6, draft7, draft2019, draft2020 };

std::string_view name_of(dialect d);

// A subschema: the JSON node, where it is (a JSON pointer from the document's root, for
// messages) and how its references resolve.
struct schema_loc {
    const nlohmann::ordered_json* node;
    std::string path;
    std::string base; // absolute base URI
    dialect d;

    std::string where() const { return path.empty() ? "at the root" : "at " + path; }
};

class schema_doc {
public:
    // `root` must outlive the document. A `$schema` of a draft before 04 is refused.
    explicit schema_doc(const nlohmann::ordered_json& root);

    const schema_loc& root() const { return *root_; }
    // The subschema at `key` (then `key2`) under `from`; its base follows any `$id` it has.
    const schema_loc& child(const schema_loc& from, std::string_view key);
    const schema_loc& child(const schema_loc& from, std::string_view key, std::string_view key2);
    const schema_loc& item(const schema_loc& from, std::string_view key, size_t i);
    // A schema the compiler made (`{"const": v}` for a part of a const), read as if at `path`.
    const schema_loc& synthetic(nlohmann::ordered_json schema, const schema_loc& near, std::string path);

    // The target of `ref` (the value of `keyword` in `from`): a pointer or an anchor in this
    // document. A reference to anything else is a grammar_error ("remote").
    const schema_loc& resolve(const schema_loc& from, const std::string& ref, std::string_view keyword);
    // `$dynamicRef` and `$recursiveRef`, honoured where they cannot mean anything but one
    // target: the anchor defined once in the document (or `#` for `$recursiveRef`).
    const schema_loc& resolve_dynamic(const schema_loc& from, const std::string& ref, std::string_view keyword);

    // Whether `keyword` is one of d's keywords (assertions, applicators, or the core keywords
    // that matter here); anything else is an annotation.
    static bool is_keyword(dialect d, std::string_view keyword);

private:
    const schema_loc& intern(const nlohmann::ordered_json* node, std::string path, const std::string& parent_base,
                             dialect d);
    void index(const schema_loc& at, int depth);
    std::string id_of(const nlohmann::ordered_json& node, dialect d) const;

    std::deque<schema_loc> locs_;
    std::unordered_map<const nlohmann::ordered_json*, const schema_loc*> by_node_;
    std::map<std::string, const schema_loc*> resources_; // absolute URI (no fragment) -> root
    std::map<std::string, const schema_loc*> anchors_;   // URI#name -> schema
    std::map<std::string, std::vector<const schema_loc*>> dynamic_anchors_; // name -> schemas
    std::deque<nlohmann::ordered_json> synthetic_;
    const schema_loc* root_ = nullptr;
};

// RFC 3986 reference resolution: `ref` against the absolute URI `base`.
std::string resolve_uri(const std::string& base, const std::string& ref);

} // namespace tandem::grammar
