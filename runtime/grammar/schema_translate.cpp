// Reading a subschema into the set of values it allows: each keyword the dialect defines is a
// constraint on its type, and the keywords of one schema object meet; applicators (allOf,
// anyOf, oneOf, not, if/then/else, $ref, dependencies) are the algebra's operations on their
// subschemas' sets. Keywords the dialect does not define are annotations and are skipped.
#include "runtime/grammar/schema_compiler.hpp"

#include "runtime/grammar/json_text.hpp"
#include "runtime/grammar/regex.hpp"

#include <algorithm>
#include <cmath>
#include <mutex>

namespace tandem::grammar {

using json = nlohmann::ordered_json;

namespace {

constexpr size_t kMaxTranslated = 20000; // subschemas read for one schema
constexpr size_t kMaxPatterns = 6;       // patternProperties of one schema: key regions are their 2^n combinations

const json* find(const json& s, std::string_view key) {
    const auto it = s.find(std::string(key));
    return it == s.end() ? nullptr : &*it;
}

int64_t count_of(const json& v, std::string_view key, const schema_loc& s) {
    if (!v.is_number() || v.get<double>() < 0 || v.get<double>() != std::floor(v.get<double>()))
        reject("\"{}\" {} must be a non-negative integer", key, s.where());
    return int64_t(std::min(v.get<double>(), 1e15));
}

double number_of(const json& v, std::string_view key, const schema_loc& s) {
    if (!v.is_number()) reject("\"{}\" {} must be a number", key, s.where());
    return v.get<double>();
}

std::vector<std::string> names_of(const json& v, std::string_view key, const schema_loc& s) {
    if (!v.is_array()) reject("\"{}\" {} must be an array of strings", key, s.where());
    std::vector<std::string> out;
    for (const json& n : v) {
        if (!n.is_string()) reject("\"{}\" {} must be an array of strings", key, s.where());
        if (std::find(out.begin(), out.end(), n.get<std::string>()) == out.end()) out.push_back(n.get<std::string>());
    }
    return out;
}

bool is_schema(const json& v) { return v.is_object() || v.is_boolean(); }

// Object shapes: any object with these names required (and each a class of its own).
object_shape with_required(const std::vector<std::string>& names, formula_id value) {
    object_shape s;
    std::vector<std::u32string> keys;
    for (const std::string& n : names) {
        member_class c;
        c.named = true;
        c.name = n;
        c.value = value;
        s.classes.push_back(std::move(c));
        keys.push_back(to_u32(n));
        if (value != f_false) s.required.push_back(n);
    }
    member_class rest;
    rest.keys = dfa::all() - dfa::of_strings(keys);
    s.classes.push_back(std::move(rest));
    return s;
}

} // namespace

const value_set& schema_compiler::eval(formula_id f) {
    if (const auto it = evals_.find(f); it != evals_.end()) return it->second;
    const formula_node& n = f_.at(f);
    if (evaluating_.contains(f)) {
        const std::string at = n.o == formula_node::op::loc ? n.loc->where() : "in the schema";
        reject("the schema {} refers to itself (through $ref, allOf, anyOf, oneOf, not or if) before any object or "
               "array: no value can be checked against it",
               at);
    }
    evaluating_.insert(f);
    value_set v;
    switch (n.o) {
    case formula_node::op::constant: v = n.args[0] ? value_set::every() : value_set::none(); break;
    case formula_node::op::loc: v = translate(*n.loc); break;
    case formula_node::op::all:
        v = value_set::every();
        for (const formula_id a : n.args) v = alg_.meet(v, eval(a), "in the schema");
        break;
    case formula_node::op::any:
        for (const formula_id a : n.args) v = alg_.join(std::move(v), eval(a));
        break;
    case formula_node::op::negate: {
        const formula_node& inner = f_.at(n.args[0]);
        const schema_loc& near = inner.o == formula_node::op::loc ? *inner.loc : doc_.root();
        v = alg_.complement(eval(n.args[0]), near.d, near.where());
        break;
    }
    }
    evaluating_.erase(f);
    return evals_.emplace(f, std::move(v)).first->second;
}

bool schema_compiler::provably_empty(formula_id f, int depth) {
    if (f == f_false) return true;
    if (f == f_true || depth <= 0 || evaluating_.contains(f)) return false;
    return provably_empty(eval(f), depth - 1);
}

bool schema_compiler::provably_empty(const value_set& v, int depth) {
    if (v.null_ok || v.bools || !v.numbers.empty() || !v.strings.empty()) return false;
    for (const array_shape& a : v.arrays) {
        bool empty = false;
        for (size_t i = 0; !empty && i < size_t(a.min); ++i)
            empty = provably_empty(i < a.prefix.size() ? a.prefix[i] : a.rest, depth);
        for (const auto& c : a.counts) empty = empty || (c.min > 0 && provably_empty(c.f, depth));
        if (!empty) return false;
    }
    for (const object_shape& o : v.objects) {
        bool empty = false;
        for (const std::string& r : o.required) empty = empty || provably_empty(o.class_of(r).value, depth);
        for (const member_class& c : o.classes) empty = empty || (c.min > 0 && provably_empty(c.value, depth));
        if (!empty) return false;
    }
    return true;
}

formula_id schema_compiler::sub(const schema_loc& s, std::string_view keyword) {
    const json* v = find(*s.node, keyword);
    if (!v) return f_true;
    if (!is_schema(*v)) reject("\"{}\" {} must be a schema (an object or a boolean)", keyword, s.where());
    return f_.of(doc_.child(s, keyword));
}

std::optional<const schema_loc*> schema_compiler::ref_target(const schema_loc& s) {
    const json& j = *s.node;
    for (const char* key : {"$ref", "$dynamicRef", "$recursiveRef"}) {
        const json* r = find(j, key);
        if (!r || !schema_doc::is_keyword(s.d, key)) continue;
        if (!r->is_string()) reject("\"{}\" {} must be a string", key, s.where());
        const std::string& ref = r->get_ref<const std::string&>();
        return std::string_view(key) == "$ref" ? &doc_.resolve(s, ref, key) : &doc_.resolve_dynamic(s, ref, key);
    }
    return std::nullopt;
}

value_set schema_compiler::translate(const schema_loc& s) {
    const json& j = *s.node;
    if (j.is_boolean()) return j.get<bool>() ? value_set::every() : value_set::none();
    if (!j.is_object()) reject("the schema {} must be an object or a boolean", s.where());
    if (++n_translated_ > kMaxTranslated) reject("the schema has over {} subschemas to read: too large", kMaxTranslated);
    const dialect d = s.d;
    const std::string& where = s.path;
    value_set v = value_set::every();
    const auto meet = [&](const value_set& x) { v = alg_.meet(v, x, s.where()); };
    if (const auto target = ref_target(s)) {
        const value_set& r = eval(f_.of(**target));
        if (d <= dialect::draft7) return r; // the keywords beside a $ref are ignored there
        meet(r);
    }
    const auto has = [&](std::string_view k) { return find(j, k) && schema_doc::is_keyword(d, k); };
    if (has("type")) meet(types_of(j["type"], s));
    if (has("enum")) meet(enum_values(j["enum"], s));
    if (has("const")) meet(const_value(j["const"], s, where + "/const"));
    for (const char* k : {"minLength", "maxLength", "pattern", "format"})
        if (has(k)) {
            v.strings = alg_.meet(v.strings, string_part(s));
            break;
        }
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"})
        if (has(k)) {
            number_set n = number_part(s);
            if (!n.any) v.numbers = v.numbers.any ? n : number_set{false, v.numbers.d & n.d};
            break;
        }
    for (const char* k : {"properties", "patternProperties", "additionalProperties", "required", "propertyNames",
                          "minProperties", "maxProperties"})
        if (has(k)) {
            value_set o = value_set::every();
            o.objects = {object_part(s)};
            meet(o);
            break;
        }
    if (has("dependencies") || has("dependentRequired") || has("dependentSchemas")) meet(dependencies(s));
    for (const char* k : {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains"})
        if (has(k)) {
            value_set a = value_set::every();
            a.arrays = {array_part(s)};
            meet(a);
            break;
        }
    const auto each = [&](std::string_view key, auto&& fn) {
        const json& arr = j[std::string(key)];
        if (!arr.is_array() || arr.empty()) reject("\"{}\" {} must be a non-empty array of schemas", key, s.where());
        for (size_t i = 0; i < arr.size(); ++i) {
            if (!is_schema(arr[i])) reject("\"{}\" {} must be a non-empty array of schemas", key, s.where());
            fn(f_.of(doc_.item(s, key, i)));
        }
    };
    if (has("allOf")) each("allOf", [&](formula_id f) { meet(eval(f)); });
    if (has("anyOf")) {
        value_set u;
        each("anyOf", [&](formula_id f) { u = alg_.join(std::move(u), eval(f)); });
        meet(u);
    }
    if (has("oneOf")) meet(one_of(s));
    if (has("not")) meet(eval(f_.negate(sub(s, "not"))));
    if (has("if")) {
        const formula_id c = sub(s, "if");
        const formula_id t = has("then") ? sub(s, "then") : f_true, e = has("else") ? sub(s, "else") : f_true;
        meet(eval(f_.any({f_.all({c, t}), f_.all({f_.negate(c), e})})));
    }
    if (has("unevaluatedProperties") || has("unevaluatedItems")) unevaluated(s, v);
    return v;
}

value_set schema_compiler::types_of(const json& t, const schema_loc& s) {
    value_set v;
    for (const json& name : t.is_array() ? t : json::array({t})) {
        const std::string n = name.is_string() ? name.get<std::string>() : "";
        if (n == "null") v.null_ok = true;
        else if (n == "boolean") v.bools = 3;
        else if (n == "number") v.numbers = number_set::every();
        else if (n == "integer") {
            if (!v.numbers.any) v.numbers = {false, v.numbers.d | integer_texts(s.d)};
        } else if (n == "string") v.strings = string_set::every();
        else if (n == "array") v.arrays.assign(1, array_shape{});
        else if (n == "object") v.objects.assign(1, object_shape::any());
        else reject("\"type\" {} must be a type name (null, boolean, object, array, number, string, integer) or an "
                    "array of them, not {}",
                    s.where(), name.dump());
    }
    return v;
}

value_set schema_compiler::const_value(const json& x, const schema_loc& s, const std::string& path) {
    value_set v;
    switch (x.type()) {
    case json::value_t::null: v.null_ok = true; break;
    case json::value_t::boolean: v.bools = x.get<bool>() ? 2 : 1; break;
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: v.numbers = {false, number_texts(x)}; break;
    case json::value_t::string: v.strings = string_set::of(dfa::of_strings({to_u32(x.get<std::string>())})); break;
    case json::value_t::array: {
        array_shape a;
        for (size_t i = 0; i < x.size(); ++i)
            a.prefix.push_back(f_.of(doc_.synthetic({{"enum", json::array({x[i]})}}, s, path + "/" + std::to_string(i))));
        a.rest = f_false;
        a.min = a.max = int64_t(x.size());
        v.arrays.push_back(std::move(a));
        break;
    }
    case json::value_t::object: {
        std::vector<std::string> keys;
        for (const auto& [k, _] : x.items()) keys.push_back(k);
        object_shape o = with_required(keys, f_true);
        for (member_class& c : o.classes) {
            if (c.named) c.value = f_.of(doc_.synthetic({{"enum", json::array({x[c.name]})}}, s, path + "/" + c.name));
            else c.value = f_false; // no other key
        }
        v.objects.push_back(std::move(o));
        break;
    }
    default: reject("a value {} that JSON Schema cannot compare", s.where());
    }
    return v;
}

value_set schema_compiler::enum_values(const json& values, const schema_loc& s) {
    if (!values.is_array()) reject("\"enum\" {} must be an array", s.where());
    value_set v;
    std::vector<std::u32string> strings;
    for (size_t i = 0; i < values.size(); ++i) {
        if (values[i].is_string()) strings.push_back(to_u32(values[i].get<std::string>()));
        else v = alg_.join(std::move(v), const_value(values[i], s, s.path + "/enum/" + std::to_string(i)));
    }
    if (!strings.empty()) v = alg_.join(std::move(v), value_set{.strings = string_set::of(dfa::of_strings(strings))});
    return v;
}

const dfa& schema_compiler::pattern(const std::string& re, const schema_loc& s, std::string_view keyword) {
    if (const auto it = patterns_.find(re); it != patterns_.end()) return it->second;
    try {
        return patterns_.emplace(re, dfa::of(regex_expr(re, {.search = true, .json_string = false}), "the pattern"))
            .first->second;
    } catch (const grammar_error& e) {
        reject("\"{}\" {}: {}", keyword, s.where(), e.what());
    }
}

string_set schema_compiler::string_part(const schema_loc& s) {
    const json& j = *s.node;
    std::optional<dfa> lang;
    const auto with = [&](const dfa& x) { lang = lang ? *lang & x : x; };
    if (const json* p = find(j, "pattern")) {
        if (!p->is_string()) reject("\"pattern\" {} must be a string", s.where());
        with(pattern(p->get<std::string>(), s, "pattern"));
    }
    int64_t format_max = -1;
    if (const json* f = find(j, "format"); f && f->is_string()) {
        if (format_unchecked(f->get<std::string>()))
            reject("\"format\" \"{}\" {} is not checked by Tandem (the formats checked are date, time, date-time, "
                   "duration, email, hostname, ipv4, ipv6, uri, uri-reference, uuid, json-pointer, "
                   "relative-json-pointer)",
                   f->get<std::string>(), s.where());
        format_max = format_max_length(f->get<std::string>());
        if (const std::string* re = format_regex(f->get<std::string>())) {
            static std::mutex mu; // formats are constants: their automata are shared by every compile
            static std::map<std::string, dfa> cache;
            std::lock_guard lock(mu);
            auto it = cache.find(*re);
            if (it == cache.end()) it = cache.emplace(*re, dfa::of(regex_expr(*re), "the format")).first;
            with(it->second);
        }
    }
    string_set out = lang ? string_set::of(*lang) : string_set::every();
    if (const json* lo = find(j, "minLength")) out.min_len = count_of(*lo, "minLength", s);
    if (const json* hi = find(j, "maxLength")) out.max_len = count_of(*hi, "maxLength", s);
    if (format_max >= 0) out.max_len = out.max_len < 0 ? format_max : std::min(out.max_len, format_max);
    return out;
}

number_set schema_compiler::number_part(const schema_loc& s) {
    const json& j = *s.node;
    std::optional<number_bound> lo, hi;
    const auto tighter = [](std::optional<number_bound>& b, number_bound x, bool lower) {
        if (!b || (lower ? x.v > b->v || (x.v == b->v && x.strict) : x.v < b->v || (x.v == b->v && x.strict))) b = x;
    };
    for (const bool lower : {true, false}) {
        const char* inclusive = lower ? "minimum" : "maximum";
        const char* exclusive = lower ? "exclusiveMinimum" : "exclusiveMaximum";
        std::optional<number_bound>& b = lower ? lo : hi;
        if (const json* v = find(j, inclusive)) tighter(b, {number_of(*v, inclusive, s), false}, lower);
        if (const json* v = find(j, exclusive)) {
            if (s.d == dialect::draft4) {
                if (!v->is_boolean()) reject("\"{}\" {} must be a boolean in draft-04", exclusive, s.where());
                if (v->get<bool>() && b) b->strict = true;
            } else {
                tighter(b, {number_of(*v, exclusive, s), true}, lower);
            }
        }
    }
    std::optional<dfa> lang;
    if (lo || hi) lang = number_range(lo, hi);
    if (const json* m = find(j, "multipleOf")) {
        const double x = number_of(*m, "multipleOf", s);
        if (!(x > 0)) reject("\"multipleOf\" {} must be greater than 0", s.where());
        const dfa mult = multiples_of(x, s.where());
        lang = lang ? *lang & mult : mult;
    }
    return lang ? number_set{false, *lang} : number_set::every();
}

object_shape schema_compiler::object_part(const schema_loc& s) {
    const json& j = *s.node;
    const dialect d = s.d;
    const json* props = find(j, "properties");
    const json* pats = find(j, "patternProperties");
    if (props && !props->is_object()) reject("\"properties\" {} must be an object of schemas", s.where());
    if (pats && !pats->is_object()) reject("\"patternProperties\" {} must be an object of schemas", s.where());
    const bool has_extra = find(j, "additionalProperties") != nullptr;
    const formula_id extra = sub(s, "additionalProperties");
    std::vector<std::string> names;
    if (props)
        for (const auto& [n, sch] : props->items()) {
            if (!is_schema(sch)) reject("\"properties\" {} must be an object of schemas", s.where());
            names.push_back(n);
        }
    std::vector<std::string> required;
    if (const json* r = find(j, "required")) {
        required = names_of(*r, "required", s);
        for (const std::string& n : required)
            if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
    }
    std::vector<std::pair<const dfa*, formula_id>> patterns;
    if (pats) {
        if (pats->size() > kMaxPatterns)
            reject("\"patternProperties\" {} has {} patterns: at most {} are supported", s.where(), pats->size(),
                   kMaxPatterns);
        for (const auto& [re, sch] : pats->items()) {
            if (!is_schema(sch)) reject("\"patternProperties\" {} must be an object of schemas", s.where());
            patterns.push_back({&pattern(re, s, "patternProperties"), f_.of(doc_.child(s, "patternProperties", re))});
        }
    }
    object_shape o;
    std::vector<std::u32string> keys;
    for (const std::string& n : names) {
        member_class c;
        c.named = true;
        c.name = n;
        const std::u32string k = to_u32(n);
        keys.push_back(k);
        std::vector<formula_id> parts;
        const bool listed = props && props->contains(n);
        if (listed) parts.push_back(f_.of(doc_.child(s, "properties", n)));
        for (const auto& [p, f] : patterns)
            if (p->accepts(k)) parts.push_back(f);
        if (parts.empty()) parts.push_back(extra);
        c.evaluated = listed || has_extra || std::any_of(patterns.begin(), patterns.end(), [&](const auto& p) {
                          return p.first->accepts(k);
                      });
        c.value = f_.all(parts);
        o.classes.push_back(std::move(c));
    }
    // Key regions: every combination of patterns matched, less the names.
    struct region {
        dfa keys;
        std::vector<formula_id> parts;
    };
    std::vector<region> regions{{dfa::all() - dfa::of_strings(keys), {}}};
    for (const auto& [p, f] : patterns) {
        std::vector<region> next;
        for (region& r : regions) {
            dfa in = r.keys & *p, out = r.keys - *p;
            if (!in.empty()) {
                std::vector<formula_id> parts = r.parts;
                parts.push_back(f);
                next.push_back({std::move(in), std::move(parts)});
            }
            if (!out.empty()) next.push_back({std::move(out), std::move(r.parts)});
        }
        regions = std::move(next);
    }
    for (region& r : regions) {
        member_class c;
        c.keys = std::move(r.keys);
        c.evaluated = !r.parts.empty() || has_extra;
        c.value = r.parts.empty() ? extra : f_.all(r.parts);
        o.classes.push_back(std::move(c));
    }
    if (find(j, "propertyNames") && schema_doc::is_keyword(d, "propertyNames")) {
        const value_set& pn = eval(sub(s, "propertyNames"));
        if (!pn.strings.is_every()) {
            dfa ok;
            try {
                ok = pn.strings.language();
            } catch (const grammar_error& e) {
                reject("\"propertyNames\" {}: {}", s.where(), e.what());
            }
            for (member_class& c : o.classes) {
                if (c.named) {
                    if (!ok.accepts(to_u32(c.name))) c.value = f_false;
                } else {
                    c.keys = c.keys & ok;
                }
            }
            std::erase_if(o.classes, [](const member_class& c) { return !c.named && c.keys.empty(); });
            member_class bad;
            bad.keys = dfa::all() - ok - dfa::of_strings(keys);
            bad.value = f_false;
            if (!bad.keys.empty()) o.classes.push_back(std::move(bad));
        }
    }
    o.required = required;
    if (const json* m = find(j, "minProperties")) o.min = count_of(*m, "minProperties", s);
    if (const json* m = find(j, "maxProperties")) o.max = count_of(*m, "maxProperties", s);
    return o;
}

value_set schema_compiler::dependencies(const schema_loc& s) {
    const json& j = *s.node;
    value_set v = value_set::every();
    for (const char* key : {"dependencies", "dependentRequired", "dependentSchemas"}) {
        const json* deps = find(j, key);
        if (!deps || !schema_doc::is_keyword(s.d, key)) continue;
        if (!deps->is_object()) reject("\"{}\" {} must be an object", key, s.where());
        for (const auto& [name, dep] : deps->items()) {
            value_set d = value_set::every();
            d.objects = {with_required({name}, f_false)}; // absent
            if (dep.is_array() && std::string_view(key) != "dependentSchemas") {
                std::vector<std::string> all{name};
                for (const std::string& n : names_of(dep, key, s))
                    if (n != name) all.push_back(n);
                d.objects.push_back(with_required(all, f_true));
            } else if (is_schema(dep) && std::string_view(key) != "dependentRequired") {
                value_set present = value_set::every();
                present.objects = {with_required({name}, f_true)};
                present = alg_.meet(present, eval(f_.of(doc_.child(s, key, name))), s.where());
                d.objects.insert(d.objects.end(), present.objects.begin(), present.objects.end());
            } else {
                reject("\"{}\" {} must map names to {}", key, s.where(),
                       std::string_view(key) == "dependentRequired" ? "arrays of names" : "schemas");
            }
            v = alg_.meet(v, d, s.where());
        }
    }
    return v;
}

array_shape schema_compiler::array_part(const schema_loc& s) {
    const json& j = *s.node;
    const dialect d = s.d;
    array_shape a;
    const json* items = find(j, "items");
    const json* prefix = d == dialect::draft2020 ? find(j, "prefixItems") : nullptr;
    const auto tuple = [&](const char* key) {
        const json& arr = j[key];
        for (size_t i = 0; i < arr.size(); ++i) {
            if (!is_schema(arr[i])) reject("\"{}\" {} must be an array of schemas", key, s.where());
            a.prefix.push_back(f_.of(doc_.item(s, key, i)));
        }
    };
    if (prefix) {
        if (!prefix->is_array()) reject("\"prefixItems\" {} must be an array of schemas", s.where());
        tuple("prefixItems");
    }
    a.n_evaluated = a.prefix.size();
    if (items && items->is_array() && !prefix) { // the tuple form before 2020-12 (read in 2020-12 too)
        tuple("items");
        a.n_evaluated = a.prefix.size();
        if (find(j, "additionalItems")) {
            a.rest = sub(s, "additionalItems");
            a.all_evaluated = true;
        }
    } else if (items) {
        if (items->is_array()) reject("\"items\" {} must be a schema beside \"prefixItems\"", s.where());
        a.rest = sub(s, "items");
        a.all_evaluated = true;
    }
    if (const json* m = find(j, "minItems")) a.min = count_of(*m, "minItems", s);
    if (const json* m = find(j, "maxItems")) a.max = count_of(*m, "maxItems", s);
    if (const json* u = find(j, "uniqueItems")) {
        if (!u->is_boolean()) reject("\"uniqueItems\" {} must be a boolean", s.where());
        a.unique = u->get<bool>();
    }
    if (find(j, "contains") && schema_doc::is_keyword(d, "contains")) {
        const bool counts = d >= dialect::draft2019;
        const json* lo = counts ? find(j, "minContains") : nullptr;
        const json* hi = counts ? find(j, "maxContains") : nullptr;
        a.counts.push_back({sub(s, "contains"), 0, lo ? count_of(*lo, "minContains", s) : 1,
                            hi ? count_of(*hi, "maxContains", s) : -1});
    }
    // A false item ends the array before it; past maxItems nothing is checked.
    for (size_t i = 0; i < a.prefix.size(); ++i)
        if (a.prefix[i] == f_false) a.max = a.max < 0 ? int64_t(i) : std::min(a.max, int64_t(i));
    if (a.rest == f_false) a.max = a.max < 0 ? int64_t(a.prefix.size()) : std::min(a.max, int64_t(a.prefix.size()));
    return a;
}

value_set schema_compiler::one_of(const schema_loc& s) {
    const json& arr = (*s.node)["oneOf"];
    if (!arr.is_array() || arr.empty()) reject("\"oneOf\" {} must be a non-empty array of schemas", s.where());
    std::vector<formula_id> branches;
    for (size_t i = 0; i < arr.size(); ++i) {
        if (!is_schema(arr[i])) reject("\"oneOf\" {} must be a non-empty array of schemas", s.where());
        branches.push_back(f_.of(doc_.item(s, "oneOf", i)));
    }
    // Branches that can both hold must exclude each other explicitly: each is then read with
    // the complements of those it may overlap.
    const size_t n = branches.size();
    std::vector<std::vector<size_t>> overlaps(n);
    for (size_t i = 0; i < n; ++i)
        for (size_t k = i + 1; k < n; ++k) {
            if (branches[i] == f_false || branches[k] == f_false) continue;
            const value_set both = alg_.meet(eval(branches[i]), eval(branches[k]), s.where());
            if (provably_empty(both, 3)) continue;
            overlaps[i].push_back(k);
            overlaps[k].push_back(i);
        }
    if (std::all_of(overlaps.begin(), overlaps.end(), [](const auto& o) { return o.empty(); })) {
        disjoint_one_of_.insert(&s);
        value_set u;
        for (const formula_id b : branches) u = alg_.join(std::move(u), eval(b));
        return u;
    }
    value_set u;
    for (size_t i = 0; i < n; ++i) {
        std::vector<formula_id> parts{branches[i]};
        for (const size_t k : overlaps[i]) parts.push_back(f_.negate(branches[k]));
        try {
            u = alg_.join(std::move(u), eval(f_.all(parts)));
        } catch (const grammar_error& e) {
            reject("\"oneOf\" {}: branch {} may hold together with branch {}, and excluding it failed: {}", s.where(), i,
                   overlaps[i][0], e.what());
        }
    }
    return u;
}

void schema_compiler::unevaluated(const schema_loc& s, value_set& v) {
    if (find(*s.node, "unevaluatedProperties")) {
        const formula_id u = sub(s, "unevaluatedProperties");
        for (object_shape& o : v.objects)
            for (member_class& c : o.classes) {
                if (!c.evaluated) c.value = f_.all({c.value, u});
                c.evaluated = true;
            }
        std::erase_if(v.objects, [](const object_shape& o) {
            return std::any_of(o.required.begin(), o.required.end(),
                               [&](const std::string& r) { return o.class_of(r).value == f_false; });
        });
    }
    if (find(*s.node, "unevaluatedItems")) {
        const formula_id u = sub(s, "unevaluatedItems");
        for (array_shape& a : v.arrays) {
            if (a.all_evaluated) continue;
            if (!a.counts.empty())
                reject("\"unevaluatedItems\" {} beside \"contains\": which items contains evaluates depends on their "
                       "values: not supported",
                       s.where());
            for (size_t i = a.n_evaluated; i < a.prefix.size(); ++i) a.prefix[i] = f_.all({a.prefix[i], u});
            a.rest = f_.all({a.rest, u});
            a.all_evaluated = true;
            for (size_t i = 0; i < a.prefix.size(); ++i)
                if (a.prefix[i] == f_false) a.max = a.max < 0 ? int64_t(i) : std::min(a.max, int64_t(i));
            if (a.rest == f_false)
                a.max = a.max < 0 ? int64_t(a.prefix.size()) : std::min(a.max, int64_t(a.prefix.size()));
        }
        std::erase_if(v.arrays, [](const array_shape& a) { return a.max >= 0 && a.min > a.max; });
    }
}

const schema_loc& schema_compiler::through_refs(const schema_loc& s) {
    const schema_loc* at = &s;
    for (int hops = 0;; ++hops) {
        if (hops > 64) reject("the schema {} is a chain of over 64 references, or a cycle of them", s.where());
        const json& j = *at->node;
        if (!j.is_object()) return *at;
        const auto target = ref_target(*at);
        if (!target) return *at;
        if (at->d >= dialect::draft2019)
            for (const auto& [k, _] : j.items())
                if (k != "$ref" && k != "$dynamicRef" && k != "$recursiveRef" && schema_doc::is_keyword(at->d, k))
                    return *at;
        at = *target;
    }
}

} // namespace tandem::grammar
