// Jinja filters: Jinja2's builtins that chat templates use, with Hugging Face's tojson
// (json.dumps with ensure_ascii=False, indent, separators and sort_keys).
#include "runtime/jinja/evaluator.hpp"
#include "runtime/jinja/strings.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace tandem::jinja {

namespace {

std::string soft_str(const value& v) { return to_str(v); }

// Jinja2's make_attrgetter: "a.b.0" looked up item first, then attribute.
value attr_path(evaluator& ev, const value& item, const std::string& path) {
    value cur = item;
    size_t start = 0;
    for (;;) {
        const size_t dot = path.find('.', start);
        const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        const bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
        cur = get_item(ev, cur, digits ? value(int64_t(std::atoll(part.c_str()))) : value(part));
        if (dot == std::string::npos) return cur;
        start = dot + 1;
    }
}

const value* opt_arg(const call_args& a, size_t i, const char* name) { return a.get(i, name); }

bool bool_arg(const call_args& a, size_t i, const char* name, bool def) {
    const value* v = a.get(i, name);
    return v ? truthy(*v) : def;
}

size_t length_of(const value& v) {
    if (v.is_string()) return n_code_points(v.str());
    if (v.is_list()) return v.list()->items.size();
    if (v.is_dict()) return v.dict()->items.size();
    if (v.is_undefined()) return 0;
    throw error("object of type '" + type_name(v) + "' has no len()");
}

// The key a sort compares by: case-folded strings unless case_sensitive.
value sort_key(const value& v, bool case_sensitive) {
    if (!case_sensitive && v.is_string()) return value(ascii_lower(v.str()));
    return v;
}

std::vector<std::string> split_lines(const std::string& s) {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t i = 0; i < s.size(); ++i) {
        const char c = s[i];
        if (c == '\n' || c == '\r' || c == '\v' || c == '\f') {
            out.push_back(s.substr(start, i - start));
            if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
            start = i + 1;
        }
    }
    if (start < s.size()) out.push_back(s.substr(start));
    return out;
}

// select/reject/selectattr/rejectattr
value select_items(evaluator& ev, const value& input, call_args& a, bool with_attr, bool keep, int line) {
    size_t k = 0;
    std::string attr;
    if (with_attr) {
        if (a.pos.empty()) throw error("selectattr/rejectattr need an attribute", line);
        attr = to_str(a.pos[0]);
        k = 1;
    }
    std::string test;
    call_args targs;
    if (a.pos.size() > k) {
        test = to_str(a.pos[k]);
        targs.pos.assign(a.pos.begin() + std::ptrdiff_t(k + 1), a.pos.end());
        targs.kw = a.kw;
    }
    std::vector<value> out;
    for (const auto& item : iterate(input, line)) {
        ev.tick();
        const value x = with_attr ? attr_path(ev, item, attr) : item;
        const bool r = test.empty() ? truthy(x) : apply_test(ev, test, x, targs, line);
        if (r == keep) out.push_back(item);
    }
    return make_list(std::move(out));
}

double py_round(double x, int64_t precision, const std::string& method) {
    const double m = std::pow(10.0, double(precision));
    if (method == "ceil") return std::ceil(x * m) / m;
    if (method == "floor") return std::floor(x * m) / m;
    if (method != "common") throw error("method must be 'common', 'ceil' or 'floor'");
    // Python's round(): half to even on the decimal value
    const double y = x * m;
    double r = std::nearbyint(y); // FE_TONEAREST: ties to even
    if (std::fabs(y - std::trunc(y)) != 0.5) r = std::round(y);
    return r / m;
}

std::string html_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        switch (c) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out.push_back(c);
        }
    }
    return out;
}

} // namespace

bool is_filter(const std::string& name) {
    static const char* const names[] = {
        "tojson", "trim", "length", "count", "string", "safe", "lower", "upper", "title", "capitalize", "e", "escape",
        "replace", "join", "first", "last", "default", "d", "items", "list", "reverse", "map", "select", "reject",
        "selectattr", "rejectattr", "unique", "sort", "dictsort", "min", "max", "int", "float", "abs", "round",
        "indent", "wordcount", "batch", "sum", "format", "center", "attr"};
    for (const char* n : names)
        if (name == n) return true;
    return name == body_placeholder;
}

value apply_filter(evaluator& ev, const std::string& name, const value& v, call_args& a, int line) {
    if (name == "tojson") {
        const value* ea = opt_arg(a, 0, "ensure_ascii");
        const value* ind = opt_arg(a, 1, "indent");
        int indent = -1;
        if (ind && !ind->is_none()) {
            if (!ind->is_int()) throw error("tojson: indent must be an integer", line);
            indent = int(std::clamp<int64_t>(ind->as_int(), 0, 64));
        }
        const value* seps = opt_arg(a, 2, "separators");
        std::string is, ks;
        if (seps && !seps->is_none()) {
            if (!seps->is_list() || seps->list()->items.size() != 2) throw error("tojson: separators must be a pair", line);
            is = to_str(seps->list()->items[0]);
            ks = to_str(seps->list()->items[1]);
        }
        const bool sort_keys = bool_arg(a, 3, "sort_keys", false);
        std::string r = to_json(v, indent, sort_keys, seps && !seps->is_none() ? &is : nullptr,
                                seps && !seps->is_none() ? &ks : nullptr, ea && truthy(*ea));
        ev.check_size(r.size());
        return value(std::move(r));
    }
    if (name == "trim") {
        const value* c = opt_arg(a, 0, "chars");
        const std::string chars = c && !c->is_none() ? to_str(*c) : std::string();
        return value(py_strip(soft_str(v), c && !c->is_none() ? &chars : nullptr, true, true));
    }
    if (name == "length" || name == "count") return value(int64_t(length_of(v)));
    if (name == "string") return value(soft_str(v));
    if (name == "safe") return value(soft_str(v));
    if (name == "lower") return value(ascii_lower(soft_str(v)));
    if (name == "upper") return value(ascii_upper(soft_str(v)));
    if (name == "title") return value(jinja_title(soft_str(v)));
    if (name == "capitalize") return value(py_capitalize(soft_str(v)));
    if (name == "e" || name == "escape") return value(html_escape(soft_str(v)));
    if (name == "replace") {
        if (a.pos.size() < 2) throw error("replace expects old and new", line);
        const value* c = opt_arg(a, 2, "count");
        return value(py_replace(soft_str(v), to_str(a.pos[0]), to_str(a.pos[1]), c && !c->is_none() ? c->as_int() : -1,
                                ev.options().limits.max_output));
    }
    if (name == "join") {
        const value* d = opt_arg(a, 0, "d");
        const value* attr = opt_arg(a, 1, "attribute");
        const std::string sep = d ? to_str(*d) : std::string();
        std::string out;
        bool first = true;
        for (const auto& item : iterate(v, line)) {
            if (!first) out += sep;
            first = false;
            out += soft_str(attr && !attr->is_none() ? attr_path(ev, item, to_str(*attr)) : item);
            ev.check_size(out.size());
        }
        return value(std::move(out));
    }
    if (name == "first" || name == "last") {
        if (v.is_string()) {
            auto cps = code_points(v.str());
            if (cps.empty()) return value::undefined("No " + name + " item, sequence was empty.");
            return value(name == "first" ? cps.front() : cps.back());
        }
        auto items = iterate(v, line);
        if (items.empty()) return value::undefined("No " + name + " item, sequence was empty.");
        return name == "first" ? items.front() : items.back();
    }
    if (name == "default" || name == "d") {
        const value* def = opt_arg(a, 0, "default_value");
        const bool boolean = bool_arg(a, 1, "boolean", false);
        if (v.is_undefined() || (boolean && !truthy(v))) return def ? *def : value(std::string());
        return v;
    }
    if (name == "items") {
        if (v.is_undefined()) return make_list();
        if (!v.is_dict()) throw error("items filter: can only get item pairs from a mapping.", line);
        std::vector<value> items;
        for (const auto& [k, x] : v.dict()->items) items.push_back(make_list({value(k), x}, true));
        return make_list(std::move(items));
    }
    if (name == "list") return make_list(iterate(v, line));
    if (name == "reverse") {
        if (v.is_string()) {
            auto cps = code_points(v.str());
            std::string r;
            for (auto it = cps.rbegin(); it != cps.rend(); ++it) r += *it;
            return value(std::move(r));
        }
        auto items = iterate(v, line);
        std::reverse(items.begin(), items.end());
        return make_list(std::move(items));
    }
    if (name == "map") {
        std::vector<value> out;
        const value* attr = nullptr;
        for (const auto& k : a.kw)
            if (k.name == "attribute") attr = &k.v;
        if (attr) {
            const value* def = nullptr;
            for (const auto& k : a.kw)
                if (k.name == "default") def = &k.v;
            for (const auto& item : iterate(v, line)) {
                ev.tick();
                value x = attr_path(ev, item, to_str(*attr));
                if (x.is_undefined() && def) x = *def;
                out.push_back(std::move(x));
            }
            return make_list(std::move(out));
        }
        if (a.pos.empty()) throw error("map requires a filter argument", line);
        const std::string f = to_str(a.pos[0]);
        call_args rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        rest.kw = a.kw;
        for (const auto& item : iterate(v, line)) {
            ev.tick();
            call_args copy = rest;
            out.push_back(apply_filter(ev, f, item, copy, line));
        }
        return make_list(std::move(out));
    }
    if (name == "select") return select_items(ev, v, a, false, true, line);
    if (name == "reject") return select_items(ev, v, a, false, false, line);
    if (name == "selectattr") return select_items(ev, v, a, true, true, line);
    if (name == "rejectattr") return select_items(ev, v, a, true, false, line);
    if (name == "unique") {
        const bool cs = bool_arg(a, 0, "case_sensitive", false);
        const value* attr = opt_arg(a, 1, "attribute");
        std::vector<value> out, seen;
        for (const auto& item : iterate(v, line)) {
            ev.tick();
            const value key = sort_key(attr && !attr->is_none() ? attr_path(ev, item, to_str(*attr)) : item, cs);
            bool dup = false;
            for (const auto& s : seen)
                if (equals(s, key)) { dup = true; break; }
            if (!dup) {
                seen.push_back(key);
                out.push_back(item);
            }
        }
        return make_list(std::move(out));
    }
    if (name == "sort" || name == "dictsort" || name == "min" || name == "max") {
        const bool dictsort = name == "dictsort";
        bool reverse = false, cs = false;
        const value* attr = nullptr;
        bool by_value = false;
        if (dictsort) {
            cs = bool_arg(a, 0, "case_sensitive", false);
            const value* by = opt_arg(a, 1, "by");
            by_value = by && to_str(*by) == "value";
            reverse = bool_arg(a, 2, "reverse", false);
        } else if (name == "sort") {
            reverse = bool_arg(a, 0, "reverse", false);
            cs = bool_arg(a, 1, "case_sensitive", false);
            attr = opt_arg(a, 2, "attribute");
        } else {
            cs = bool_arg(a, 0, "case_sensitive", false);
            attr = opt_arg(a, 1, "attribute");
        }
        std::vector<value> items;
        if (dictsort) {
            if (!v.is_dict()) throw error("dictsort: input must be a mapping", line);
            for (const auto& [k, x] : v.dict()->items) items.push_back(make_list({value(k), x}, true));
        } else {
            items = iterate(v, line);
        }
        auto key = [&](const value& item) {
            if (dictsort) return sort_key(item.list()->items[by_value ? 1 : 0], cs);
            return sort_key(attr && !attr->is_none() ? attr_path(ev, item, to_str(*attr)) : item, cs);
        };
        if (name == "min" || name == "max") {
            if (items.empty()) return value::undefined("No aggregated item, sequence was empty.");
            size_t best = 0;
            for (size_t i = 1; i < items.size(); ++i) {
                const bool better = name == "min" ? less(key(items[i]), key(items[best])) : less(key(items[best]), key(items[i]));
                if (better) best = i;
            }
            return items[best];
        }
        std::stable_sort(items.begin(), items.end(), [&](const value& x, const value& y) {
            return reverse ? less(key(y), key(x)) : less(key(x), key(y));
        });
        return make_list(std::move(items));
    }
    if (name == "int") {
        const value* def = opt_arg(a, 0, "default");
        const value fallback = def ? *def : value(int64_t(0));
        if (v.is_int()) return v;
        if (v.is_bool()) return value(v.as_int());
        if (v.is_float()) return value(int64_t(v.as_double()));
        if (v.is_string()) {
            const std::string s = py_strip(v.str(), nullptr, true, true);
            char* end = nullptr;
            const long long i = std::strtoll(s.c_str(), &end, 10);
            if (!s.empty() && end && *end == 0) return value(int64_t(i));
            const double d = std::strtod(s.c_str(), &end);
            if (!s.empty() && end && *end == 0 && std::isfinite(d)) return value(int64_t(d));
        }
        return fallback;
    }
    if (name == "float") {
        const value* def = opt_arg(a, 0, "default");
        const value fallback = def ? *def : value(0.0);
        if (v.is_number()) return value(v.as_double());
        if (v.is_string()) {
            const std::string s = py_strip(v.str(), nullptr, true, true);
            char* end = nullptr;
            const double d = std::strtod(s.c_str(), &end);
            if (!s.empty() && end && *end == 0) return value(d);
        }
        return fallback;
    }
    if (name == "abs") {
        if (v.is_int() || v.is_bool()) {
            const int64_t i = v.as_int();
            if (i == INT64_MIN) throw error("integer overflow", line);
            return value(i < 0 ? -i : i);
        }
        if (v.is_float()) return value(std::fabs(v.as_double()));
        throw error("bad operand type for abs(): '" + type_name(v) + "'", line);
    }
    if (name == "round") {
        const value* p = opt_arg(a, 0, "precision");
        const value* m = opt_arg(a, 1, "method");
        return value(py_round(v.as_double(), p ? p->as_int() : 0, m ? to_str(*m) : "common"));
    }
    if (name == "indent") {
        const value* w = opt_arg(a, 0, "width");
        std::string ind = "    ";
        if (w) ind = w->is_string() ? w->str() : std::string(size_t(std::clamp<int64_t>(w->as_int(), 0, 256)), ' ');
        const bool first = bool_arg(a, 1, "first", false);
        const bool blank = bool_arg(a, 2, "blank", false);
        const std::string s = soft_str(v) + "\n";
        const auto lines = split_lines(s);
        std::string rv;
        if (blank) {
            for (size_t i = 0; i < lines.size(); ++i) {
                if (i) rv += "\n" + ind;
                rv += lines[i];
            }
        } else {
            rv = lines.empty() ? std::string() : lines[0];
            for (size_t i = 1; i < lines.size(); ++i) {
                rv += "\n";
                if (!lines[i].empty()) rv += ind;
                rv += lines[i];
            }
        }
        if (first) rv = ind + rv;
        ev.check_size(rv.size());
        return value(std::move(rv));
    }
    if (name == "wordcount") {
        int64_t n = 0;
        bool in_word = false;
        for (char c : soft_str(v)) {
            const bool w = std::isalnum(static_cast<unsigned char>(c)) || c == '_' || static_cast<unsigned char>(c) >= 0x80;
            if (w && !in_word) ++n;
            in_word = w;
        }
        return value(n);
    }
    if (name == "batch") {
        if (a.pos.empty()) throw error("batch expects a count", line);
        const int64_t n = a.pos[0].as_int();
        if (n <= 0) throw error("batch count must be positive", line);
        const value* fill = opt_arg(a, 1, "fill_with");
        std::vector<value> out, cur;
        for (const auto& item : iterate(v, line)) {
            ev.tick();
            cur.push_back(item);
            if (int64_t(cur.size()) == n) {
                out.push_back(make_list(std::move(cur)));
                cur.clear();
            }
        }
        if (!cur.empty()) {
            if (fill && !fill->is_none())
                while (int64_t(cur.size()) < n) cur.push_back(*fill);
            out.push_back(make_list(std::move(cur)));
        }
        return make_list(std::move(out));
    }
    if (name == "sum") {
        const value* attr = opt_arg(a, 0, "attribute");
        const value* start = opt_arg(a, 1, "start");
        value total = start ? *start : value(int64_t(0));
        for (const auto& item : iterate(v, line)) {
            const value x = attr && !attr->is_none() ? attr_path(ev, item, to_str(*attr)) : item;
            if (!x.is_number() || !total.is_number()) throw error("sum: unsupported operand types", line);
            if ((total.is_int() || total.is_bool()) && (x.is_int() || x.is_bool())) {
                int64_t r;
                if (__builtin_add_overflow(total.as_int(), x.as_int(), &r)) throw error("integer overflow", line);
                total = value(r);
            } else {
                total = value(total.as_double() + x.as_double());
            }
        }
        return total;
    }
    if (name == "format") {
        if (!a.kw.empty()) throw error("format filter: keyword arguments are not supported", line);
        return python_format(ev, soft_str(v), make_list(a.pos, true));
    }
    if (name == "center") {
        const value* w = opt_arg(a, 0, "width");
        const int64_t width = w ? w->as_int() : 80;
        ev.check_size(size_t(std::max<int64_t>(0, width)));
        const std::string s = soft_str(v);
        const int64_t n = int64_t(n_code_points(s));
        if (width <= n) return value(s);
        const size_t pad = size_t(width - n);
        const size_t left = pad / 2 + (pad & size_t(width) & 1);
        return value(std::string(left, ' ') + s + std::string(pad - left, ' '));
    }
    if (name == "attr") {
        if (a.pos.empty()) throw error("attr expects a name", line);
        // Python's getattr: a dict's keys are not its attributes (its methods are)
        value r = get_attr(ev, v, to_str(a.pos[0]));
        if (v.is_dict() && !v.dict()->is_namespace && !v.dict()->is_loop && !r.is_func())
            return value::undefined("'dict object' has no attribute '" + to_str(a.pos[0]) + "'");
        return r;
    }
    if (name == body_placeholder) return v;
    throw error("No filter named '" + name + "'.", line);
}

} // namespace tandem::jinja
