// JSON Schema for tests, written apart from runtime/grammar/: a validator for the keywords the
// generator uses, as the specification (2020-12) reads them; seeded random schemas over those
// keywords; valid instances for a schema; mutations that are likely invalid; a writer that
// puts bounded random whitespace where JSON allows it.
//
// The specification's reading: each keyword applies on its own (allOf, anyOf, oneOf, $ref and
// the keywords beside them all hold together), oneOf holds when exactly one branch does,
// additionalProperties absent allows any other key, a keyword about one type says nothing
// about values of another. Formats as Tandem checks them (json_schema.hpp).
#pragma once

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace tandem::schema_check {

using json = nlohmann::ordered_json; // keys in insertion order, as the grammar writes properties

inline const json& resolve(const json& root, const json& s) {
    return root.at(json::json_pointer(s["$ref"].get<std::string>().substr(1)));
}

// The types the generator's schemas are about, for the instance generator: `type`, or what
// the keywords speak of, or every type.
inline std::vector<std::string> types_of(const json& s) {
    if (s.contains("type")) return s["type"].is_array() ? s["type"].get<std::vector<std::string>>()
                                                        : std::vector<std::string>{s["type"].get<std::string>()};
    std::set<std::string> t;
    for (const auto& [k, v] : s.items()) {
        if (k == "minLength" || k == "maxLength" || k == "pattern" || k == "format") t.insert("string");
        if (k == "minimum" || k == "maximum" || k == "exclusiveMinimum" || k == "exclusiveMaximum") t.insert("number");
        if (k == "properties" || k == "required" || k == "additionalProperties") t.insert("object");
        if (k == "items" || k == "prefixItems" || k == "minItems" || k == "maxItems") t.insert("array");
    }
    if (t.empty()) return {"object", "array", "string", "number", "boolean", "null"};
    return {t.begin(), t.end()};
}

// s with its $ref target and allOf branches merged in, for the instance generator (the
// generator's allOf branches list different properties, so merging is their intersection).
inline json merge(json a, const json& b) {
    for (const auto& [k, v] : b.items()) {
        if (k == "properties" && a.contains(k)) a[k].update(v);
        else if (k == "required" && a.contains(k)) {
            for (const json& n : v)
                if (std::find(a[k].begin(), a[k].end(), n) == a[k].end()) a[k].push_back(n);
        } else if (k != "description" && k != "$defs" && k != "definitions") {
            a[k] = v;
        }
    }
    return a;
}

inline json flatten(const json& root, const json& s) {
    if (s.is_boolean()) return json::object();
    json out = s;
    out.erase("$ref");
    out.erase("allOf");
    if (s.contains("$ref")) out = merge(flatten(root, resolve(root, s)), out);
    for (const json& b : s.value("allOf", json::array())) out = merge(out, flatten(root, b));
    return out;
}

inline bool constrains(const json& s, const std::string& except = "") {
    for (const auto& [k, v] : s.items())
        if (k != except && k != "description" && k != "$defs" && k != "definitions") return true;
    return false;
}

inline bool has_type(const json& v, const std::string& t) {
    if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v);
    return t == "number" ? v.is_number() : v.type_name() == t;
}

inline size_t code_points(const std::string& s) {
    return size_t(std::count_if(s.begin(), s.end(), [](char c) { return (uint8_t(c) & 0xC0) != 0x80; }));
}

// ---- formats, as Tandem defines them, checked by hand

inline bool digits(const std::string& s, size_t at, size_t n) {
    if (at + n > s.size()) return false;
    return std::all_of(s.begin() + long(at), s.begin() + long(at + n), [](char c) { return c >= '0' && c <= '9'; });
}
inline int num(const std::string& s, size_t at, size_t n) { return std::stoi(s.substr(at, n)); }

inline bool is_date(const std::string& s) {
    if (!(s.size() == 10 && digits(s, 0, 4) && s[4] == '-' && digits(s, 5, 2) && s[7] == '-' && digits(s, 8, 2)))
        return false;
    const int y = num(s, 0, 4), m = num(s, 5, 2), d = num(s, 8, 2);
    const bool leap = y % 4 == 0 && (y % 100 != 0 || y % 400 == 0);
    static constexpr int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    return m >= 1 && m <= 12 && d >= 1 && d <= days[m - 1] + (m == 2 && leap);
}
inline bool is_offset_hm(const std::string& s, size_t at) { // HH:MM
    return digits(s, at, 2) && s.size() > at + 2 && s[at + 2] == ':' && digits(s, at + 3, 2) && num(s, at, 2) <= 23 &&
           num(s, at + 3, 2) <= 59;
}
// RFC 3339's full-time; a leap second only as 23:59:60 with a zero offset.
inline bool is_time(const std::string& s) {
    if (!is_offset_hm(s, 0) || s.size() < 8 || s[5] != ':' || !digits(s, 6, 2) || num(s, 6, 2) > 60) return false;
    size_t i = 8;
    if (i < s.size() && s[i] == '.') {
        size_t n = 0;
        while (i + 1 + n < s.size() && digits(s, i + 1 + n, 1)) ++n;
        if (n < 1) return false;
        i += 1 + n;
    }
    const std::string zone = s.substr(i);
    const bool zero = zone == "Z" || zone == "z" || zone == "+00:00" || zone == "-00:00";
    if (num(s, 6, 2) == 60 && !(s.starts_with("23:59") && zero)) return false;
    if (zone == "Z" || zone == "z") return true;
    return zone.size() == 6 && (zone[0] == '+' || zone[0] == '-') && is_offset_hm(zone, 1);
}
inline bool is_date_time(const std::string& s) {
    return s.size() > 11 && (s[10] == 'T' || s[10] == 't') && is_date(s.substr(0, 10)) && is_time(s.substr(11));
}
inline bool is_uuid(const std::string& s) {
    if (s.size() != 36) return false;
    for (size_t i = 0; i < 36; ++i)
        if ((i == 8 || i == 13 || i == 18 || i == 23) ? s[i] != '-' : !std::isxdigit(uint8_t(s[i]))) return false;
    return true;
}
inline std::vector<std::string> split(const std::string& s, char c) {
    std::vector<std::string> out(1);
    for (char x : s) {
        if (x == c) out.emplace_back();
        else out.back().push_back(x);
    }
    return out;
}
inline bool is_email(const std::string& s) {
    const auto at = split(s, '@');
    if (at.size() != 2) return false;
    for (const std::string& atom : split(at[0], '.'))
        if (atom.empty() || !std::all_of(atom.begin(), atom.end(), [](char c) {
                return std::isalnum(uint8_t(c)) || std::string_view("!#$%&'*+/=?^_`{|}~-").find(c) != std::string::npos;
            }))
            return false;
    for (const std::string& label : split(at[1], '.'))
        if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-' ||
            !std::all_of(label.begin(), label.end(), [](char c) { return std::isalnum(uint8_t(c)) || c == '-'; }))
            return false;
    return true;
}
inline bool is_ipv4(const std::string& s) {
    const auto parts = split(s, '.');
    return parts.size() == 4 && std::all_of(parts.begin(), parts.end(), [](const std::string& p) {
               return !p.empty() && p.size() <= 3 && digits(p, 0, p.size()) && (p.size() == 1 || p[0] != '0') &&
                      std::stoi(p) <= 255;
           });
}
inline bool has_format(const std::string& f, const std::string& s) {
    if (f == "date") return is_date(s);
    if (f == "time") return is_time(s);
    if (f == "date-time") return is_date_time(s);
    if (f == "uuid") return is_uuid(s);
    if (f == "email") return is_email(s);
    return f == "ipv4" && is_ipv4(s);
}

// ---- the validator

class validator {
public:
    explicit validator(const json& root) : root_(root) {}
    bool valid(const json& v) const { return check(root_, v); }

    bool check(const json& s, const json& v) const {
        if (s.is_boolean()) return s.get<bool>();
        if (s.contains("$ref") && !check(resolve(root_, s), v)) return false;
        if (s.contains("type") && !typed(s, v)) return false;
        if (s.contains("enum") && std::find(s["enum"].begin(), s["enum"].end(), v) == s["enum"].end()) return false;
        if (s.contains("const") && v != s["const"]) return false;
        for (const json& b : s.value("allOf", json::array()))
            if (!check(b, v)) return false;
        if (s.contains("anyOf") && std::none_of(s["anyOf"].begin(), s["anyOf"].end(), [&](const json& b) { return check(b, v); }))
            return false;
        if (s.contains("oneOf") && std::count_if(s["oneOf"].begin(), s["oneOf"].end(), [&](const json& b) { return check(b, v); }) != 1)
            return false;
        if (v.is_string()) return string_ok(s, v.get<std::string>());
        if (v.is_number()) return number_ok(s, v.get<double>());
        if (v.is_object()) return object_ok(s, v);
        return !v.is_array() || array_ok(s, v);
    }

private:
    const json& root_;

    static bool typed(const json& s, const json& v) {
        const auto ts = types_of(s);
        return std::any_of(ts.begin(), ts.end(), [&](const std::string& t) { return has_type(v, t); });
    }
    static bool string_ok(const json& s, const std::string& x) {
        const size_t n = code_points(x);
        if (n < s.value("minLength", size_t(0)) || n > s.value("maxLength", SIZE_MAX)) return false;
        if (s.contains("pattern") && !std::regex_search(x, std::regex(s["pattern"].get<std::string>()))) return false;
        return !s.contains("format") || has_format(s["format"], x);
    }
    static bool number_ok(const json& s, double x) {
        if (s.contains("minimum") && x < s["minimum"].get<double>()) return false;
        if (s.contains("maximum") && x > s["maximum"].get<double>()) return false;
        if (s.contains("exclusiveMinimum") && x <= s["exclusiveMinimum"].get<double>()) return false;
        return !s.contains("exclusiveMaximum") || x < s["exclusiveMaximum"].get<double>();
    }
    bool object_ok(const json& s, const json& v) const {
        const json props = s.value("properties", json::object());
        const json extra = s.value("additionalProperties", json(true));
        for (const json& r : s.value("required", json::array()))
            if (!v.contains(r.get<std::string>())) return false;
        for (const auto& [k, x] : v.items())
            if (!check(props.contains(k) ? props[k] : extra, x)) return false;
        return true;
    }
    bool array_ok(const json& s, const json& v) const {
        if (v.size() < s.value("minItems", size_t(0)) || v.size() > s.value("maxItems", SIZE_MAX)) return false;
        const json prefix = s.value("prefixItems", json::array());
        for (size_t i = 0; i < v.size(); ++i)
            if (!check(i < prefix.size() ? prefix[i] : s.value("items", json(true)), v[i])) return false;
        return true;
    }
};

// ---- randomness shared by the generators

class dice {
public:
    explicit dice(uint64_t seed) : rng_(seed) {}
    int64_t between(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
    bool chance(double p) { return std::bernoulli_distribution(p)(rng_); }
    template <class T>
    const T& pick(const std::vector<T>& v) { return v[size_t(between(0, int64_t(v.size()) - 1))]; }
    std::mt19937_64& rng() { return rng_; }

    // Strings with what JSON escapes (quotes, backslash, controls) and 2-, 3- and 4-byte UTF-8.
    std::string text(int64_t n_chars) {
        static const std::vector<std::string> chars = {"a", "b", "z", "Q", "0", " ", "\"", "\\", "/", "\n", "\t",
                                                       "\x01", "\x1f", "\x7f", "é", "€", "中", "😀", "-", "."};
        std::string s;
        for (int64_t i = 0; i < n_chars; ++i) s += pick(chars);
        return s;
    }
    json scalar() {
        switch (between(0, 5)) {
        case 0: return nullptr;
        case 1: return chance(0.5);
        case 2: return between(-1000, 1000);
        case 3: return double(between(-100000, 100000)) / 64;
        case 4: return double(between(1, 99)) * std::pow(10.0, double(between(-30, 30)));
        default: return text(between(0, 5));
        }
    }
    json any(int depth) {
        if (depth <= 0 || chance(0.6)) return scalar();
        json v = chance(0.5) ? json::array() : json::object();
        for (int64_t i = between(0, 3); i > 0; --i) {
            if (v.is_array()) v.push_back(any(depth - 1));
            else v[text(between(0, 3))] = any(depth - 1);
        }
        return v;
    }

private:
    std::mt19937_64 rng_;
};

// Patterns the generator uses, with strings matching each: none with `.`, negated classes or
// \W \S \D, where std::regex (over bytes) and a code-point matcher could differ on UTF-8.
struct sample_pattern {
    std::string pattern;
    std::vector<std::string> examples;
};
inline const std::vector<sample_pattern>& sample_patterns() {
    static const std::vector<sample_pattern> p = {
        {"^[a-z]+$", {"abc", "z", "hello"}},
        {"^[0-9]{3}-[0-9]{4}$", {"555-1234", "000-0000"}},
        {"ab", {"ab", "xxaby", "\"ab\\"}},
        {"^(foo|bar)[0-9]*$", {"foo", "bar12"}},
        {"^\\d+(\\.\\d+)?$", {"12", "3.14"}},
        {"x$", {"x", "é x"}},
        {"^[A-Z][a-z]* [A-Z]", {"Hello World", "A Bcd"}},
    };
    return p;
}

// ---- random schemas

// Nested schemas over every keyword Tandem honours. Recursive references ($defs that reach
// themselves, and "#") appear only where an instance may leave them out (optional properties,
// items of arrays that may be empty) and after a bracket, so every schema has finite instances
// and no left recursion.
class schema_generator {
public:
    explicit schema_generator(uint64_t seed) : d_(seed) {}

    json root() {
        json defs = json::object();
        plain_ = recursive_ = {};
        for (const std::string name : {"p0", "a/b~c"}) { // a name needing ~1 and ~0
            if (d_.chance(0.5)) continue;
            defs[name] = node(2, false);
            plain_.push_back("#/$defs/" + escape(name));
        }
        const std::vector<std::string> rec = {"r0", "r~1"};
        recursive_ = {"#"};
        for (const std::string& name : rec) recursive_.push_back("#/$defs/" + escape(name));
        for (const std::string& name : rec) defs[name] = object(2);
        json s = node(3, false);
        if (!s.is_object()) s = {{"anyOf", json::array({s, true})}};
        s[d_.chance(0.8) ? "$defs" : "definitions"] = defs;
        return fix_refs(s, s.contains("definitions"));
    }

private:
    dice d_;
    std::vector<std::string> plain_, recursive_; // refs usable anywhere; refs only where optional

    static std::string escape(std::string s) {
        s = std::regex_replace(s, std::regex("~"), "~0");
        return std::regex_replace(s, std::regex("/"), "~1");
    }
    // Refs were written for $defs; a root using definitions points them there.
    static json fix_refs(json s, bool definitions) {
        if (!definitions) return s;
        const std::string text = std::regex_replace(s.dump(), std::regex("#/\\$defs/"), "#/definitions/");
        return json::parse(text);
    }

    json node(int depth, bool optional_spot) {
        if (optional_spot && !recursive_.empty() && d_.chance(0.3)) return {{"$ref", d_.pick(recursive_)}};
        if (!plain_.empty() && d_.chance(0.08)) return {{"$ref", d_.pick(plain_)}, {"description", "shared"}};
        switch (depth <= 0 ? d_.between(0, 5) : d_.between(0, 13)) {
        case 0: return string();
        case 1: return integer();
        case 2: return number();
        case 3: return json{{"type", d_.chance(0.5) ? "boolean" : "null"}};
        case 4: return enumeration();
        case 5: return d_.chance(0.5) ? json(true) : json::object();
        case 6: case 7: return object(depth);
        case 8: return array(depth);
        case 9: return any_of(depth);
        case 10: return one_of();
        case 11: return all_of(depth);
        case 12: return json{{"type", json::array({"string", "null"})}, {"maxLength", d_.between(0, 4)}};
        default: return untyped(depth);
        }
    }

    json string() {
        json s = {{"type", "string"}};
        switch (d_.between(0, 3)) {
        case 0: break;
        case 1:
            if (d_.chance(0.7)) s["minLength"] = d_.between(0, 3);
            if (d_.chance(0.7)) s["maxLength"] = s.value("minLength", 0) + d_.between(0, 4);
            break;
        case 2: s["pattern"] = d_.pick(sample_patterns()).pattern; break;
        default:
            s["format"] = d_.pick(std::vector<std::string>{"date", "time", "date-time", "uuid", "email", "ipv4"});
        }
        return s;
    }
    // Bounds of every form: inclusive, exclusive, draft 4's boolean, fractional, negative.
    void bounds(json& s, bool fractional) {
        const auto value = [&]() -> json {
            if (fractional && d_.chance(0.5)) return double(d_.between(-400, 400)) / 8;
            return d_.between(-50, 50);
        };
        const json lo = value();
        const double h = lo.get<double>() + 2 + double(d_.between(0, 60));
        const json hi = lo.is_number_integer() ? json(int64_t(h)) : json(h);
        if (d_.chance(0.7)) {
            s["minimum"] = lo;
        } else if (d_.chance(0.5)) {
            s["exclusiveMinimum"] = lo;
        }
        if (d_.chance(0.6)) {
            s["maximum"] = hi;
        } else if (d_.chance(0.5)) {
            s["exclusiveMaximum"] = hi;
        }
    }
    json integer() {
        json s = {{"type", "integer"}};
        if (d_.chance(0.75)) bounds(s, d_.chance(0.3));
        return s;
    }
    json number() {
        json s = {{"type", "number"}};
        if (d_.chance(0.75)) bounds(s, true);
        return s;
    }
    json enumeration() {
        std::vector<json> values = {"red", "a \"quoted\" one", 3, 2.5, nullptr, true, json::array({1, "x"}),
                                    json{{"k", 1}, {"j", json::array()}}};
        std::shuffle(values.begin(), values.end(), d_.rng());
        if (d_.chance(0.3)) return {{"const", values[0]}};
        json s = {{"enum", json(std::vector<json>(values.begin(), values.begin() + d_.between(1, 4)))}};
        const json types = json::array({"string", "integer", "null"});
        if (d_.chance(0.3) && std::any_of(s["enum"].begin(), s["enum"].end(), [&](const json& v) {
                return has_type(v, "string") || has_type(v, "integer") || v.is_null();
            }))
            s["type"] = types;
        return s;
    }
    json object(int depth) {
        static const std::vector<std::string> names = {"id", "name", "a", "ab", "abc", "b", "tags", "x y", "q\"t", "n\\m"};
        json props = json::object(), required = json::array();
        for (int64_t i = d_.between(d_.chance(0.2) ? 0 : 1, 4); i > 0; --i) {
            const std::string name = d_.pick(names);
            if (props.contains(name)) continue;
            const bool req = d_.chance(0.5);
            props[name] = node(depth - 1, !req);
            if (req) required.push_back(name);
        }
        json s = {{"type", "object"}, {"properties", props}};
        if (d_.chance(0.2)) required.push_back("z_extra_req"); // listed only in required (sorting after every listed name, where the grammar puts it): additional must allow it
        switch (d_.between(0, 3)) {
        case 0: break;
        case 1: s["additionalProperties"] = false; break;
        case 2: s["additionalProperties"] = true; break;
        default: s["additionalProperties"] = node(0, false);
        }
        if (required.size() > 0) {
            std::sort(required.begin(), required.end());
            required.erase(std::unique(required.begin(), required.end()), required.end());
            s["required"] = required;
        }
        if (std::find(required.begin(), required.end(), "z_extra_req") != required.end() && s.value("additionalProperties", json(false)) == false)
            s["additionalProperties"] = true;
        if (props.empty() && d_.chance(0.5)) s.erase("properties");
        return s;
    }
    json array(int depth) {
        json s = {{"type", "array"}};
        const int64_t min = d_.chance(0.5) ? 0 : d_.between(0, 2);
        if (d_.chance(0.4)) {
            json prefix = json::array();
            for (int64_t i = d_.between(1, 2); i > 0; --i) prefix.push_back(node(depth - 1, false));
            s["prefixItems"] = prefix;
        }
        const int64_t items = d_.between(0, 3);
        if (items == 1) s["items"] = false;
        if (items >= 2) s["items"] = node(depth - 1, min == 0);
        if (min > 0) s["minItems"] = min;
        if (d_.chance(0.5)) s["maxItems"] = std::max<int64_t>(min, s.contains("prefixItems") ? 1 : 0) + d_.between(0, 3);
        if (items == 1 && s.contains("minItems")) s["minItems"] = std::min<int64_t>(min, s.value("prefixItems", json::array()).size());
        return s;
    }
    json any_of(int depth) {
        if (d_.chance(0.4)) { // keywords beside the branches merge into each
            return {{"type", "object"},
                    {"properties", {{"a", {{"type", "integer"}}}, {"b", {{"type", "string"}}}}},
                    {"anyOf", json::array({{{"required", {"a"}}}, {{"required", {"b"}}}})}};
        }
        json branches = json::array();
        for (int64_t i = d_.between(2, 3); i > 0; --i) branches.push_back(node(depth - 1, false));
        return {{"anyOf", branches}};
    }
    // Branches of different types.
    json one_of() {
        std::vector<json> kinds = {string(), integer(), json{{"type", "boolean"}}, json{{"type", "array"}, {"maxItems", 2}},
                                   json{{"type", "object"}, {"properties", {{"v", {{"type", "null"}}}}}}};
        std::shuffle(kinds.begin(), kinds.end(), d_.rng());
        return {{"oneOf", json(std::vector<json>(kinds.begin(), kinds.begin() + d_.between(2, 3)))}};
    }
    json all_of(int depth) {
        json a = object(depth), b = object(depth);
        const json a_props = a.value("properties", json::object());
        for (const auto& [k, v] : a_props.items())
            if (b.contains("properties")) b["properties"].erase(k);
        for (json* x : {&a, &b}) { // required again, only where no recursive $ref sits
            x->erase("additionalProperties");
            x->erase("required");
            const json props = x->value("properties", json::object());
            for (const auto& [k, v] : props.items())
                if (!v.contains("$ref") && d_.chance(0.6)) (*x)["required"] = json::array({k});
        }
        if (b.contains("properties") && b["properties"].empty()) b.erase("properties");
        return {{"allOf", json::array({a, b})}, {"description", "merged"}};
    }
    // No `type`: the keywords say which.
    json untyped(int depth) {
        if (d_.chance(0.5)) return {{"minLength", d_.between(1, 3)}};
        return {{"properties", {{"only", node(depth - 1, false)}}}, {"required", {"only"}}};
    }
};

// ---- instances

// Valid instances, by the same reading of the schema as the validator's. Past max_depth every
// optional part is left out, which ends recursion (the generator puts it only there).
class instance_generator {
public:
    instance_generator(const json& root, uint64_t seed, int max_depth = 4) : root_(root), d_(seed), max_depth_(max_depth) {}
    json make() { return make(root_, 0); }
    dice& randomness() { return d_; }

private:
    const json& root_;
    dice d_;
    int max_depth_;

    json make(const json& s, int depth) {
        const bool minimal = depth > max_depth_;
        if (s.is_boolean()) return d_.any(minimal ? 0 : 2);
        if (s.contains("allOf") || (s.contains("$ref") && constrains(s, "$ref"))) return make(flatten(root_, s), depth);
        if (s.contains("$ref")) return make(resolve(root_, s), depth + 1);
        if (s.contains("anyOf") || s.contains("oneOf")) {
            const std::string key = s.contains("anyOf") ? "anyOf" : "oneOf";
            json base = s;
            base.erase(key);
            const json& b = s[key][minimal ? 0 : size_t(d_.between(0, int64_t(s[key].size()) - 1))];
            return make(constrains(base) ? merge(base, flatten(root_, b)) : b, depth);
        }
        if (s.contains("const")) return s["const"];
        if (s.contains("enum")) {
            const std::vector<std::string> ts = types_of(s);
            std::vector<json> ok;
            for (const json& v : s["enum"])
                if (!s.contains("type") || std::any_of(ts.begin(), ts.end(), [&](const std::string& t) { return has_type(v, t); }))
                    ok.push_back(v);
            return d_.pick(ok);
        }
        const std::string t = d_.pick(types_of(s));
        if (t == "string") return string(s);
        if (t == "integer" || t == "number") return number(s, t == "integer");
        if (t == "boolean") return d_.chance(0.5);
        if (t == "null") return nullptr;
        return t == "object" ? object(s, depth, minimal) : array(s, depth, minimal);
    }

    json string(const json& s) {
        if (s.contains("pattern"))
            for (const sample_pattern& p : sample_patterns())
                if (p.pattern == s["pattern"]) return d_.pick(p.examples);
        if (s.contains("format")) return format(s["format"]);
        const int64_t min = s.value("minLength", 0), max = s.value("maxLength", min + 6);
        return d_.text(d_.between(min, max));
    }
    std::string format(const std::string& f) {
        const auto n = [&](int64_t lo, int64_t hi) { return d_.between(lo, hi); };
        const std::string date = fmt::format("{}-{:02}-{:02}", n(1000, 9999), n(1, 12), n(1, 28));
        std::string time = fmt::format("{:02}:{:02}:{:02}", n(0, 23), n(0, 59), n(0, 59));
        if (d_.chance(0.5)) time += fmt::format(".{}", n(0, 999999));
        time += d_.chance(0.5) ? (d_.chance(0.5) ? "Z" : "z")
                               : fmt::format("{}{:02}:{:02}", d_.chance(0.5) ? '+' : '-', n(0, 23), n(0, 59));
        if (f == "date") return date;
        if (f == "time") return time;
        if (f == "date-time") return fmt::format("{}{}{}", date, d_.chance(0.8) ? 'T' : 't', time);
        if (f == "uuid") return fmt::format("123e4567-e89b-12d3-A456-42661417400{}", n(0, 9));
        if (f == "email") return d_.pick(std::vector<std::string>{"a@b.co", "first.last+tag@mail.example.org", "x_y@localhost"});
        return fmt::format("{}.{}.0.{}", n(0, 255), n(0, 255), n(0, 255));
    }

    // Uniform in the bounds (a window of 2000 where one is open), integers or multiples of
    // 1/1000 (whose shortest forms are short), checked by the validator's own reading.
    json number(const json& s, bool integer) {
        std::optional<double> lo, hi;
        for (const char* k : {"minimum", "exclusiveMinimum"})
            if (s.contains(k) && s[k].is_number()) lo = std::max(s[k].get<double>(), lo.value_or(-1e300));
        for (const char* k : {"maximum", "exclusiveMaximum"})
            if (s.contains(k) && s[k].is_number()) hi = std::min(s[k].get<double>(), hi.value_or(1e300));
        const double a = lo ? *lo : (hi ? *hi - 1000 : -1000), b = hi ? *hi : a + 2000;
        const validator v(root_);
        json num_schema = s;
        num_schema["type"] = "number";
        for (int tries = 0; tries < 1000; ++tries) {
            json x;
            if (integer || d_.chance(0.3)) x = d_.between(int64_t(std::floor(a)), int64_t(std::ceil(b)));
            else if (d_.chance(0.1) && !has_bounds(s)) x = double(d_.between(1, 999)) * std::pow(10.0, double(d_.between(-40, 40)));
            else x = double(d_.between(int64_t(std::floor(a * 1000)), int64_t(std::ceil(b * 1000)))) / 1000;
            if (v.check(num_schema, x)) return x;
        }
        return nullptr; // the generator's bounds always leave room; a null fails the test loudly
    }
    static bool has_bounds(const json& s) {
        return s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") || s.contains("exclusiveMaximum");
    }

    json object(const json& s, int depth, bool minimal) {
        const json props = s.value("properties", json::object());
        const json extra = s.value("additionalProperties", json(true));
        const json required = s.value("required", json::array());
        json out = json::object();
        for (const auto& [k, sub] : props.items()) {
            const bool req = std::find(required.begin(), required.end(), k) != required.end();
            if (req || (!minimal && sub != false && d_.chance(0.5))) out[k] = make(sub, depth + 1);
        }
        for (const json& r : required)
            if (!out.contains(r.get<std::string>())) out[r.get<std::string>()] = make(extra, depth + 1);
        if (extra == false || minimal) return out;
        for (int64_t i = d_.between(-2, 2); i > 0; --i) {
            std::string key = props.empty() || d_.chance(0.5) ? d_.text(d_.between(0, 4)) : props.items().begin().key() + "x";
            if (d_.chance(0.3) && !props.empty()) key = props.items().begin().key().substr(0, props.items().begin().key().size() - 1);
            if (!props.contains(key) && !out.contains(key)) out[key] = make(extra, depth + 1);
        }
        return out;
    }
    json array(const json& s, int depth, bool minimal) {
        const json prefix = s.value("prefixItems", json::array());
        const json items = s.value("items", json(true));
        const int64_t min = s.value("minItems", 0);
        int64_t max = s.value("maxItems", min + 3);
        if (items == false) max = std::min<int64_t>(max, int64_t(prefix.size()));
        const int64_t n = minimal ? min : d_.between(min, std::min(max, min + 3));
        json out = json::array();
        for (int64_t i = 0; i < n; ++i) out.push_back(make(size_t(i) < prefix.size() ? prefix[size_t(i)] : items, depth + 1));
        return out;
    }
};

inline std::string drop_last(std::string s) { // one code point, not one byte
    while (!s.empty() && (uint8_t(s.back()) & 0xC0) == 0x80) s.pop_back();
    if (!s.empty()) s.pop_back();
    return s;
}

// One random change somewhere in v: another type, a longer or shorter string, a number moved a
// little or a lot, a key added or dropped, an element added or dropped. Often invalid.
inline json mutate(json v, dice& d) {
    std::vector<json::json_pointer> spots;
    const auto walk = [&](auto& self, const json& x, const json::json_pointer& p) -> void {
        spots.push_back(p);
        if (x.is_object()) for (const auto& [k, c] : x.items()) self(self, c, p / k);
        if (x.is_array()) for (size_t i = 0; i < x.size(); ++i) self(self, x[i], p / i);
    };
    walk(walk, v, json::json_pointer());
    json& x = v[d.pick(spots)];
    switch (d.between(0, 3)) {
    case 0: x = d.scalar(); break;
    case 1:
        if (x.is_string()) x = d.chance(0.5) ? x.get<std::string>() + d.text(1) : drop_last(x.get<std::string>());
        else if (x.is_number_integer()) x = x.get<int64_t>() + d.pick(std::vector<int64_t>{-1, 1, -7, 100, -100});
        else if (x.is_number()) x = x.get<double>() + d.pick(std::vector<double>{-0.5, 0.125, 0.001, -1000});
        else x = d.any(1);
        break;
    case 2:
        if (x.is_object() && !x.empty() && d.chance(0.5)) x.erase(x.begin());
        else if (x.is_object()) x[x.empty() || d.chance(0.5) ? d.text(2) : x.begin().key() + "x"] = d.scalar();
        else if (x.is_array() && !x.empty() && d.chance(0.5)) x.erase(x.end() - 1);
        else if (x.is_array()) x.push_back(x.empty() ? d.scalar() : x[0]);
        else x = d.any(2);
        break;
    default: x = x.is_null() ? json(0) : json(nullptr);
    }
    return v;
}

// v as text with whitespace where JSON allows it, of the kind Tandem's bounded whitespace
// takes (an optional line break, then up to max_indent spaces or tabs); strings as nlohmann
// writes them, \u-escaped outside ASCII when `ascii`.
inline std::string write(const json& v, dice& d, int max_indent, bool ascii) {
    const auto ws = [&] {
        std::string s = d.chance(0.2) ? "\n" : "";
        for (int64_t n = d.between(0, max_indent); n > 0; --n) s += d.pick(std::vector<char>{' ', '\t'});
        return s;
    };
    if (v.is_string()) return v.dump(-1, ' ', ascii);
    if (!v.is_object() && !v.is_array()) return v.dump();
    std::string out = v.is_object() ? "{" : "[";
    out += ws();
    bool first = true;
    for (const auto& [k, x] : v.items()) {
        if (!first) out += ',' + ws();
        first = false;
        if (v.is_object()) out += json(k).dump(-1, ' ', ascii) + ws() + ":" + ws();
        out += write(x, d, max_indent, ascii) + ws();
    }
    return out + (v.is_object() ? "}" : "]");
}

} // namespace tandem::schema_check
