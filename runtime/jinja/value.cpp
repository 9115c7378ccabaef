// Jinja values: construction, Python's str/repr/equality/ordering, JSON in and out.
#include "runtime/jinja/value.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace tandem::jinja {

namespace {

thread_local value_budget budget;

void step() {
    if (budget.steps == 0) throw error("template exceeded its work limit (values too large to print or compare)");
    --budget.steps;
}

void check_bytes(const std::string& out) {
    if (out.size() > budget.max_bytes)
        throw error("template output exceeded " + std::to_string(budget.max_bytes) + " bytes");
}

} // namespace

void set_value_budget(const value_budget& b) { budget = b; }

double value::as_double() const {
    if (is_int()) return double(std::get<int64_t>(v));
    if (is_float()) return std::get<double>(v);
    if (is_bool()) return std::get<bool>(v) ? 1.0 : 0.0;
    throw error("expected a number, got " + type_name(*this));
}

int64_t value::as_int() const {
    if (is_int()) return std::get<int64_t>(v);
    if (is_bool()) return std::get<bool>(v) ? 1 : 0;
    throw error("expected an integer, got " + type_name(*this));
}

const value* dict_obj::find(std::string_view key) const {
    for (const auto& [k, x] : items)
        if (k == key) return &x;
    return nullptr;
}

value* dict_obj::find(std::string_view key) {
    for (auto& [k, x] : items)
        if (k == key) return &x;
    return nullptr;
}

void dict_obj::set(std::string key, value x) {
    if (value* p = find(key))
        *p = std::move(x);
    else
        items.emplace_back(std::move(key), std::move(x));
}

const value* call_args::get(size_t i, std::string_view name) const {
    for (const auto& k : kw)
        if (k.name == name) return &k.v;
    if (i < pos.size()) return &pos[i];
    return nullptr;
}

value make_list(std::vector<value> items, bool tuple) {
    auto l = std::make_shared<list_obj>();
    l->items = std::move(items);
    l->tuple = tuple;
    return value(std::move(l));
}

value make_dict() { return value(std::make_shared<dict_obj>()); }

value make_func(std::string name, std::function<value(evaluator&, call_args&)> fn) {
    auto f = std::make_shared<func_obj>();
    f->name = std::move(name);
    f->fn = std::move(fn);
    return value(std::move(f));
}

value from_json(const nlohmann::ordered_json& j) {
    switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return value(nullptr);
    case nlohmann::ordered_json::value_t::boolean: return value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return value(int64_t(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
        std::vector<value> items;
        items.reserve(j.size());
        for (const auto& x : j) items.push_back(from_json(x));
        return make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
        auto d = std::make_shared<dict_obj>();
        for (const auto& [k, x] : j.items()) d->set(k, from_json(x));
        return value(std::move(d));
    }
    default: return value(nullptr);
    }
}

bool truthy(const value& x) {
    return std::visit(
        [](const auto& v) -> bool {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, undefined_t> || std::is_same_v<T, std::nullptr_t>) return false;
            else if constexpr (std::is_same_v<T, bool>) return v;
            else if constexpr (std::is_same_v<T, int64_t>) return v != 0;
            else if constexpr (std::is_same_v<T, double>) return v != 0.0;
            else if constexpr (std::is_same_v<T, std::string>) return !v.empty();
            else if constexpr (std::is_same_v<T, list_ptr>) return !v->items.empty();
            else if constexpr (std::is_same_v<T, dict_ptr>) return !v->items.empty();
            else return true;
        },
        x.v);
}

std::string python_float(double d) {
    if (std::isnan(d)) return "nan";
    if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
    if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
    std::string s(buf, r.ptr);
    // s = [-]D[.DDD]e(+|-)XX
    bool neg = s[0] == '-';
    if (neg) s.erase(0, 1);
    const size_t e = s.find('e');
    std::string mant = s.substr(0, e);
    const int exp = std::stoi(s.substr(e + 1));
    std::string digits;
    for (char c : mant)
        if (c != '.') digits.push_back(c);
    std::string out;
    if (exp >= -5 + 1 && exp < 16) {
        // fixed: digits with the point after exp+1 digits
        const int point = exp + 1;
        if (point <= 0) {
            out = "0." + std::string(size_t(-point), '0') + digits;
        } else if (size_t(point) >= digits.size()) {
            out = digits + std::string(size_t(point) - digits.size(), '0') + ".0";
        } else {
            out = digits.substr(0, size_t(point)) + "." + digits.substr(size_t(point));
        }
    } else {
        out = digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
        out += eb;
    }
    return neg ? "-" + out : out;
}

namespace {

std::string repr_string(const std::string& s) {
    const bool has_sq = s.find('\'') != std::string::npos;
    const bool has_dq = s.find('"') != std::string::npos;
    const char q = has_sq && !has_dq ? '"' : '\'';
    std::string out(1, q);
    for (unsigned char c : s) {
        if (c == '\\') out += "\\\\";
        else if (c == q) { out += '\\'; out += char(c); }
        else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c == 0x7f) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", c);
            out += b;
        } else out += char(c);
    }
    out += q;
    return out;
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
    out += '"';
    for (size_t i = 0; i < s.size(); ++i) {
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (ensure_ascii && c >= 0x80) {
            // decode one UTF-8 sequence; \uXXXX (surrogate pairs above the BMP)
            uint32_t cp = c;
            int n = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
            cp = n == 3 ? c & 0x07 : n == 2 ? c & 0x0F : n == 1 ? c & 0x1F : 0xFFFD;
            for (int k = 0; k < n && i + 1 < s.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[++i]) & 0x3F);
            char b[16];
            if (cp >= 0x10000) {
                cp -= 0x10000;
                std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF));
            } else {
                std::snprintf(b, sizeof b, "\\u%04x", cp);
            }
            out += b;
            continue;
        }
        switch (c) {
        case '"': out += "\\\""; break;
        case '\\': out += "\\\\"; break;
        case '\n': out += "\\n"; break;
        case '\r': out += "\\r"; break;
        case '\t': out += "\\t"; break;
        case '\b': out += "\\b"; break;
        case '\f': out += "\\f"; break;
        default:
            if (c < 0x20) {
                char b[8];
                std::snprintf(b, sizeof b, "\\u%04x", c);
                out += b;
            } else out += char(c);
        }
    }
    out += '"';
}

void json_dump(std::string& out, const value& x, int indent, bool sort_keys, const std::string& item_sep,
               const std::string& key_sep, int depth, bool ea) {
    if (depth > 512) throw error("tojson: nesting too deep");
    step();
    check_bytes(out);
    auto newline = [&](int d) {
        if (indent < 0) return;
        out += '\n';
        out.append(size_t(indent) * size_t(d), ' ');
    };
    if (x.is_undefined()) throw error("Object of type Undefined is not JSON serializable");
    if (x.is_none()) { out += "null"; return; }
    if (x.is_bool()) { out += std::get<bool>(x.v) ? "true" : "false"; return; }
    if (x.is_int()) { out += std::to_string(std::get<int64_t>(x.v)); return; }
    if (x.is_float()) {
        const double d = std::get<double>(x.v);
        if (std::isnan(d)) out += "NaN";
        else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
        else out += python_float(d);
        return;
    }
    if (x.is_string()) { json_string(out, x.str(), ea); return; }
    if (x.is_list()) {
        const auto& items = x.list()->items;
        if (items.empty()) { out += "[]"; return; }
        out += '[';
        for (size_t i = 0; i < items.size(); ++i) {
            if (i) out += item_sep;
            newline(depth + 1);
            json_dump(out, items[i], indent, sort_keys, item_sep, key_sep, depth + 1, ea);
        }
        newline(depth);
        out += ']';
        return;
    }
    if (x.is_dict()) {
        std::vector<const std::pair<std::string, value>*> items;
        for (const auto& kv : x.dict()->items) items.push_back(&kv);
        if (items.empty()) { out += "{}"; return; }
        if (sort_keys)
            std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
        out += '{';
        for (size_t i = 0; i < items.size(); ++i) {
            if (i) out += item_sep;
            newline(depth + 1);
            json_string(out, items[i]->first, ea);
            out += key_sep;
            json_dump(out, items[i]->second, indent, sort_keys, item_sep, key_sep, depth + 1, ea);
        }
        newline(depth);
        out += '}';
        return;
    }
    throw error("Object of type " + type_name(x) + " is not JSON serializable");
}

void repr_into(std::string& out, const value& x, int depth) {
    if (depth > 512) throw error("repr: nesting too deep");
    step();
    check_bytes(out);
    if (x.is_string()) { out += repr_string(x.str()); return; }
    if (x.is_list()) {
        const auto& l = *x.list();
        out += l.tuple ? '(' : '[';
        for (size_t i = 0; i < l.items.size(); ++i) {
            if (i) out += ", ";
            repr_into(out, l.items[i], depth + 1);
        }
        if (l.tuple && l.items.size() == 1) out += ',';
        out += l.tuple ? ')' : ']';
        return;
    }
    if (x.is_dict()) {
        const auto& d = *x.dict();
        if (d.is_namespace) { out += "<Namespace>"; return; }
        out += '{';
        bool first = true;
        for (const auto& [k, v] : d.items) {
            if (!first) out += ", ";
            first = false;
            out += repr_string(k);
            out += ": ";
            repr_into(out, v, depth + 1);
        }
        out += '}';
        return;
    }
    out += to_str(x);
}

} // namespace

std::string to_str(const value& x) {
    if (x.is_undefined()) return {}; // also a sandbox refusal: Jinja2 prints it as ""

    if (x.is_none()) return "None";
    if (x.is_bool()) return std::get<bool>(x.v) ? "True" : "False";
    if (x.is_int()) return std::to_string(std::get<int64_t>(x.v));
    if (x.is_float()) return python_float(std::get<double>(x.v));
    if (x.is_string()) return x.str();
    if (x.is_func()) return "<function " + x.func()->name + ">";
    std::string out;
    repr_into(out, x, 0);
    return out;
}

std::string repr(const value& x) {
    std::string out;
    repr_into(out, x, 0);
    return out;
}

std::string to_json(const value& x, int indent, bool sort_keys, const std::string* item_sep,
                    const std::string* key_sep, bool ensure_ascii) {
    const std::string is = item_sep ? *item_sep : (indent < 0 ? ", " : ",");
    const std::string ks = key_sep ? *key_sep : ": ";
    std::string out;
    json_dump(out, x, indent, sort_keys, is, ks, 0, ensure_ascii);
    return out;
}

bool equals(const value& a, const value& b) {
    step();
    if (a.is_number() && b.is_number()) {
        if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) return a.as_int() == b.as_int();
        return a.as_double() == b.as_double();
    }
    if (a.v.index() != b.v.index()) return false;
    if (a.is_undefined() || a.is_none()) return true;
    if (a.is_string()) return a.str() == b.str();
    if (a.is_list()) {
        if (a.list() == b.list()) return true;
        const auto& x = a.list()->items;
        const auto& y = b.list()->items;
        if (x.size() != y.size() || a.list()->tuple != b.list()->tuple) return false;
        for (size_t i = 0; i < x.size(); ++i)
            if (!equals(x[i], y[i])) return false;
        return true;
    }
    if (a.is_dict()) {
        const auto& x = *a.dict();
        const auto& y = *b.dict();
        if (x.is_namespace || y.is_namespace) return a.dict() == b.dict();
        if (x.items.size() != y.items.size()) return false;
        for (const auto& [k, v] : x.items) {
            const value* w = y.find(k);
            if (!w || !equals(v, *w)) return false;
        }
        return true;
    }
    if (a.is_func()) return a.func() == b.func();
    return false;
}

bool less(const value& a, const value& b) {
    step();
    if (a.is_number() && b.is_number()) {
        if ((a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool())) return a.as_int() < b.as_int();
        return a.as_double() < b.as_double();
    }
    if (a.is_string() && b.is_string()) return a.str() < b.str(); // UTF-8 order is code point order
    if (a.is_list() && b.is_list()) {
        const auto& x = a.list()->items;
        const auto& y = b.list()->items;
        for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
            if (less(x[i], y[i])) return true;
            if (less(y[i], x[i])) return false;
        }
        return x.size() < y.size();
    }
    throw error("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

std::string type_name(const value& x) {
    switch (x.v.index()) {
    case 0: return "Undefined";
    case 1: return "NoneType";
    case 2: return "bool";
    case 3: return "int";
    case 4: return "float";
    case 5: return "str";
    case 6: return x.list()->tuple ? "tuple" : "list";
    case 7: return x.dict()->is_namespace ? "Namespace" : (x.dict()->is_loop ? "LoopContext" : "dict");
    default: return "function";
    }
}

size_t n_code_points(std::string_view s) {
    size_t n = 0;
    for (unsigned char c : s)
        if ((c & 0xC0) != 0x80) ++n;
    return n;
}

std::vector<std::string> code_points(std::string_view s) {
    std::vector<std::string> out;
    for (size_t i = 0; i < s.size();) {
        size_t j = i + 1;
        while (j < s.size() && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) ++j;
        out.emplace_back(s.substr(i, j - i));
        i = j;
    }
    return out;
}

} // namespace tandem::jinja
