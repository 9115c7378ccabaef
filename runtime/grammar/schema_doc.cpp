// A JSON Schema document: the dialect from `$schema`, an index of resources and anchors built
// by walking the subschema keywords, and references resolved as RFC 3986 and the specification
// say.
#include "runtime/grammar/schema_doc.hpp"

#include <algorithm>
#include <array>

namespace tandem::grammar {

using json = nlohmann::ordered_json;

std::string_view name_of(dialect d) {
    switch (d) {
    case dialect::draft4: return "draft-04";
    case dialect::draft6: return "draft-06";
    case dialect::draft7: return "draft-07";
    case dialect::draft2019: return "2019-09";
    case dialect::draft2020: return "2020-12";
    }
    return "?";
}

namespace {

constexpr int kMaxDepth = 256;                                  // nesting of subschemas walked
const std::string kDefaultBase = "https://tandem.invalid/schema.json"; // a document without $id

// ---- URIs (RFC 3986)

struct uri {
    std::string scheme, authority, path, query, fragment;
    bool has_authority = false, has_query = false, has_fragment = false;
};

uri parse_uri(std::string_view s) {
    uri u;
    if (const size_t hash = s.find('#'); hash != std::string_view::npos) {
        u.has_fragment = true;
        u.fragment = s.substr(hash + 1);
        s = s.substr(0, hash);
    }
    if (const size_t q = s.find('?'); q != std::string_view::npos) {
        u.has_query = true;
        u.query = s.substr(q + 1);
        s = s.substr(0, q);
    }
    const size_t colon = s.find(':');
    const bool scheme_ok = colon != std::string_view::npos && colon > 0 && std::isalpha(uint8_t(s[0])) &&
                           std::all_of(s.begin(), s.begin() + long(colon), [](char c) {
                               return std::isalnum(uint8_t(c)) || c == '+' || c == '-' || c == '.';
                           });
    if (scheme_ok) {
        u.scheme = s.substr(0, colon);
        s = s.substr(colon + 1);
    }
    if (s.starts_with("//")) {
        u.has_authority = true;
        const size_t slash = s.find('/', 2);
        u.authority = s.substr(2, slash == std::string_view::npos ? s.npos : slash - 2);
        s = slash == std::string_view::npos ? std::string_view() : s.substr(slash);
    }
    u.path = s;
    return u;
}

std::string remove_dots(std::string in) {
    std::string out;
    while (!in.empty()) {
        if (in.starts_with("../")) in.erase(0, 3);
        else if (in.starts_with("./")) in.erase(0, 2);
        else if (in.starts_with("/./")) in.erase(0, 2);
        else if (in == "/.") in = "/";
        else if (in.starts_with("/../") || in == "/..") {
            in = in == "/.." ? "/" : in.substr(3);
            const size_t last = out.rfind('/');
            out.erase(last == std::string::npos ? 0 : last);
        } else if (in == "." || in == "..") in.clear();
        else {
            const size_t next = in.find('/', in[0] == '/' ? 1 : 0);
            out += in.substr(0, next);
            in.erase(0, next == std::string::npos ? in.size() : next);
        }
    }
    return out;
}

std::string to_string(const uri& u) {
    std::string s;
    if (!u.scheme.empty()) s += u.scheme + ":";
    if (u.has_authority) s += "//" + u.authority;
    s += u.path;
    if (u.has_query) s += "?" + u.query;
    if (u.has_fragment) s += "#" + u.fragment;
    return s;
}

std::string without_fragment(const std::string& u) { return u.substr(0, u.find('#')); }

std::string percent_decoded(std::string_view s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 && hex_value(s[i + 2]) >= 0) {
            out += char(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]));
            i += 2;
        } else {
            out += s[i];
        }
    }
    return out;
}

std::string escape_token(std::string_view t) {
    std::string out;
    for (const char c : t) out += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
    return out;
}

dialect dialect_of(const json& root) {
    if (!root.is_object()) return dialect::draft2020;
    const auto it = root.find("$schema");
    if (it == root.end() || !it->is_string()) return dialect::draft2020;
    const std::string& s = it->get_ref<const std::string&>();
    if (s.find("draft-04") != s.npos) return dialect::draft4;
    if (s.find("draft-06") != s.npos) return dialect::draft6;
    if (s.find("draft-07") != s.npos) return dialect::draft7;
    if (s.find("2019-09") != s.npos) return dialect::draft2019;
    if (s.find("draft-03") != s.npos || s.find("draft-02") != s.npos || s.find("draft-01") != s.npos)
        reject("\"$schema\" \"{}\": drafts before draft-04 are not supported", s);
    return dialect::draft2020; // 2020-12, the latest, or a meta-schema of the user's own
}

// The keywords whose values are subschemas: one, an array of them, or a map of them.
constexpr std::array kOneSchema = {"additionalProperties", "additionalItems", "not", "if", "then", "else",
                                   "contains", "propertyNames", "unevaluatedProperties", "unevaluatedItems", "items"};
constexpr std::array kSchemaArrays = {"allOf", "anyOf", "oneOf", "prefixItems", "items"};
constexpr std::array kSchemaMaps = {"properties", "patternProperties", "definitions", "$defs", "dependentSchemas",
                                    "dependencies"};

} // namespace

std::string resolve_uri(const std::string& base, const std::string& ref) {
    const uri r = parse_uri(ref), b = parse_uri(base);
    uri t;
    if (!r.scheme.empty()) {
        t = r;
        t.path = remove_dots(r.path);
    } else {
        if (r.has_authority) {
            t.has_authority = true;
            t.authority = r.authority;
            t.path = remove_dots(r.path);
            t.has_query = r.has_query;
            t.query = r.query;
        } else {
            if (r.path.empty()) {
                t.path = b.path;
                t.has_query = r.has_query || b.has_query;
                t.query = r.has_query ? r.query : b.query;
            } else {
                if (r.path.starts_with('/')) {
                    t.path = remove_dots(r.path);
                } else {
                    const std::string merged = b.has_authority && b.path.empty()
                                                   ? "/" + r.path
                                                   : b.path.substr(0, b.path.rfind('/') + 1) + r.path;
                    t.path = remove_dots(merged);
                }
                t.has_query = r.has_query;
                t.query = r.query;
            }
            t.has_authority = b.has_authority;
            t.authority = b.authority;
        }
        t.scheme = b.scheme;
    }
    t.has_fragment = r.has_fragment;
    t.fragment = r.fragment;
    return to_string(t);
}

bool schema_doc::is_keyword(dialect d, std::string_view k) {
    static const std::array common = {"type",          "enum",          "properties",       "required",
                                      "additionalProperties", "patternProperties", "items", "minItems",
                                      "maxItems",      "uniqueItems",   "minLength",        "maxLength",
                                      "pattern",       "format",        "minimum",          "maximum",
                                      "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minProperties",
                                      "maxProperties", "allOf",         "anyOf",            "oneOf",
                                      "not",           "$ref"};
    if (std::find(common.begin(), common.end(), k) != common.end()) return true;
    const bool v6 = d != dialect::draft4, v7 = v6 && d != dialect::draft6, v2019 = v7 && d != dialect::draft7;
    if (k == "additionalItems") return true; // read beside a tuple `items` in every dialect
    if (k == "dependencies") return !v2019;
    if (k == "const" || k == "contains" || k == "propertyNames") return v6;
    if (k == "if" || k == "then" || k == "else") return v7;
    if (k == "dependentRequired" || k == "dependentSchemas" || k == "unevaluatedProperties" ||
        k == "unevaluatedItems" || k == "minContains" || k == "maxContains")
        return v2019;
    if (k == "$recursiveRef") return d == dialect::draft2019;
    if (k == "$dynamicRef" || k == "prefixItems") return d == dialect::draft2020;
    return false;
}

schema_doc::schema_doc(const json& root) {
    const dialect d = dialect_of(root);
    std::string base = kDefaultBase;
    if (const std::string id = id_of(root, d); !id.empty()) base = without_fragment(resolve_uri(kDefaultBase, id));
    root_ = &intern(&root, "", base, d);
    resources_[without_fragment(kDefaultBase)] = root_;
    index(*root_, 0);
}

std::string schema_doc::id_of(const json& node, dialect d) const {
    if (!node.is_object()) return "";
    const auto it = node.find(d == dialect::draft4 ? "id" : "$id");
    return it != node.end() && it->is_string() ? it->get<std::string>() : "";
}

const schema_loc& schema_doc::intern(const json* node, std::string path, const std::string& parent_base, dialect d) {
    if (const auto it = by_node_.find(node); it != by_node_.end()) return *it->second;
    std::string base = parent_base;
    const std::string id = id_of(*node, d);
    if (!id.empty() && !id.starts_with('#')) base = without_fragment(resolve_uri(parent_base, id));
    const schema_loc& loc = locs_.emplace_back(schema_loc{node, std::move(path), std::move(base), d});
    by_node_.emplace(node, &loc);
    return loc;
}

const schema_loc& schema_doc::child(const schema_loc& from, std::string_view key) {
    return intern(&from.node->at(std::string(key)), from.path + "/" + escape_token(key), from.base, from.d);
}

const schema_loc& schema_doc::child(const schema_loc& from, std::string_view key, std::string_view key2) {
    return child(child(from, key), key2);
}

const schema_loc& schema_doc::item(const schema_loc& from, std::string_view key, size_t i) {
    const schema_loc& arr = child(from, key);
    return intern(&arr.node->at(i), arr.path + "/" + std::to_string(i), arr.base, from.d);
}

const schema_loc& schema_doc::synthetic(json schema, const schema_loc& near, std::string path) {
    const json* node = &synthetic_.emplace_back(std::move(schema));
    return intern(node, std::move(path), near.base, near.d);
}

void schema_doc::index(const schema_loc& at, int depth) {
    if (depth > kMaxDepth) reject("schema nested deeper than {} {}", kMaxDepth, at.where());
    const json& s = *at.node;
    if (!s.is_object()) return;
    const std::string id = id_of(s, at.d);
    if (!id.empty()) {
        if (id.starts_with('#')) {
            if (at.d <= dialect::draft7) anchors_[at.base + id] = &at; // a plain-name fragment
        } else {
            resources_.try_emplace(at.base, &at);
            const std::string full = resolve_uri(at.base, id);
            if (const size_t hash = full.find('#'); hash != full.npos && hash + 1 < full.size())
                anchors_[full] = &at;
        }
    }
    for (const char* key : {"$anchor", "$dynamicAnchor"}) {
        const auto it = s.find(key);
        if (it == s.end() || !it->is_string() || at.d < dialect::draft2019) continue;
        anchors_.try_emplace(at.base + "#" + it->get<std::string>(), &at);
        if (std::string_view(key) == "$dynamicAnchor") dynamic_anchors_[it->get<std::string>()].push_back(&at);
    }
    for (const char* key : kOneSchema) {
        const auto it = s.find(key);
        if (it != s.end() && (it->is_object() || it->is_boolean())) index(child(at, key), depth + 1);
    }
    for (const char* key : kSchemaArrays) {
        const auto it = s.find(key);
        if (it == s.end() || !it->is_array()) continue;
        for (size_t i = 0; i < it->size(); ++i) index(item(at, key, i), depth + 1);
    }
    for (const char* key : kSchemaMaps) {
        const auto it = s.find(key);
        if (it == s.end() || !it->is_object()) continue;
        for (const auto& [name, sub] : it->items())
            if (sub.is_object() || sub.is_boolean()) index(child(at, key, name), depth + 1);
    }
}

const schema_loc& schema_doc::resolve(const schema_loc& from, const std::string& ref, std::string_view keyword) {
    const std::string target = ref.starts_with('#') ? from.base + ref : resolve_uri(from.base, ref);
    const std::string doc = without_fragment(target);
    const size_t hash = target.find('#');
    const std::string frag = hash == std::string::npos ? "" : percent_decoded(target.substr(hash + 1));
    const auto res = resources_.find(doc);
    if (res == resources_.end())
        reject("\"{}\" \"{}\" {} is a remote reference: only references within the schema are supported", keyword, ref,
               from.where());
    if (frag.empty()) return *res->second;
    if (frag[0] != '/') {
        const auto it = anchors_.find(doc + "#" + frag);
        if (it == anchors_.end()) reject("\"{}\" \"{}\" {}: no anchor \"{}\" in the schema", keyword, ref, from.where(), frag);
        return *it->second;
    }
    const schema_loc* at = res->second;
    for (size_t pos = 1; pos <= frag.size();) {
        size_t end = frag.find('/', pos);
        if (end == std::string::npos) end = frag.size();
        std::string tok;
        for (size_t i = pos; i < end; ++i) {
            if (frag[i] == '~' && i + 1 < end && (frag[i + 1] == '0' || frag[i + 1] == '1')) {
                tok += frag[++i] == '0' ? '~' : '/';
            } else {
                tok += frag[i];
            }
        }
        const json& node = *at->node;
        const json* next = nullptr;
        if (node.is_object()) {
            if (const auto it = node.find(tok); it != node.end()) next = &*it;
        } else if (node.is_array() && !tok.empty() && std::all_of(tok.begin(), tok.end(), ::isdigit) &&
                   tok.size() < 10 && std::stoul(tok) < node.size()) {
            next = &node[std::stoul(tok)];
        }
        if (!next) reject("\"{}\" \"{}\" {} points at nothing in the schema", keyword, ref, from.where());
        at = &intern(next, at->path + "/" + escape_token(tok), at->base, at->d);
        pos = end + 1;
    }
    return *at;
}

const schema_loc& schema_doc::resolve_dynamic(const schema_loc& from, const std::string& ref, std::string_view keyword) {
    if (keyword == "$recursiveRef") {
        if (ref != "#") reject("\"$recursiveRef\" {} must be \"#\"", from.where());
        return resolve(from, ref, keyword);
    }
    const size_t hash = ref.find('#');
    const std::string name = hash == std::string::npos ? "" : ref.substr(hash + 1);
    const auto it = dynamic_anchors_.find(name);
    if (it == dynamic_anchors_.end() || name.empty() || name[0] == '/') return resolve(from, ref, keyword);
    if (it->second.size() != 1)
        reject("\"$dynamicRef\" \"{}\" {}: the anchor is defined {} times, and which one applies depends on the "
               "path taken: not supported",
               ref, from.where(), it->second.size());
    return *it->second[0];
}

} // namespace tandem::grammar
