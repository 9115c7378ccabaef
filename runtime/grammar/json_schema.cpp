// JSON Schema to grammar: a compiler that walks the schema building one expression per
// subschema, with shared rules for the JSON primitives and one rule per $ref target.
#include "runtime/grammar/json_schema.hpp"

#include "runtime/grammar/regex.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cmath>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace tandem::grammar {
namespace {

using json = nlohmann::ordered_json;
using pointer = json::json_pointer;

// Digit caps that keep every number finite to generate: 15 integer digits stay exact in a
// double (printers switch to exponents at 1e15); 20 fraction digits hold a double's shortest
// fixed form down to 1e-4, where printers switch again; 2 exponent digits keep every number
// a double holds (1e999 is valid JSON that parsers refuse or turn into infinity).
constexpr int kIntDigits = 15, kFracDigits = 20, kExpDigits = 2;
constexpr int64_t kIntCap = 999'999'999'999'999; // the largest integer of kIntDigits digits
constexpr int kMaxDepth = 200;                    // subschema nesting, $ref chains included
constexpr int kMaxInlined = 10000;                // schemas merged in for allOf, $ref siblings, anyOf

// What a keyword constrains: `type` inference and the enum check ask which types a schema's
// keywords are about; annotations (and $defs, which only hold schemas) change nothing.
enum class family { general, annotation, string, number, object, array };

const std::map<std::string, family, std::less<>>& keywords() {
    static const auto k = [] {
        const std::pair<family, std::vector<const char*>> groups[] = {
            {family::general, {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "nullable"}},
            {family::annotation, {"$defs", "definitions", "title", "description", "$schema", "$id", "examples",
                                  "default", "$comment", "deprecated", "readOnly", "writeOnly"}},
            {family::string, {"minLength", "maxLength", "pattern", "format"}},
            {family::number, {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}},
            {family::object, {"properties", "required", "additionalProperties"}},
            {family::array, {"items", "prefixItems", "minItems", "maxItems"}},
        };
        std::map<std::string, family, std::less<>> m;
        for (const auto& [f, names] : groups)
            for (const char* name : names) m.emplace(name, f);
        return m;
    }();
    return k;
}

// Only asked of schemas check_keywords passed.
family family_of(std::string_view keyword) { return keywords().find(keyword)->second; }

std::string where(const pointer& p) { return p.empty() ? "at the root" : "at " + p.to_string(); }

void check_keywords(const json& s, const pointer& p) {
    if (!s.is_object()) reject("schema {} must be an object or a boolean", where(p));
    for (const auto& [k, v] : s.items())
        if (!keywords().contains(k)) reject("unsupported JSON Schema keyword \"{}\" {}", k, where(p));
}

// Whether s has keywords beyond annotations, `nullable` and `except`.
bool constrains(const json& s, std::string_view except) {
    for (const auto& [k, v] : s.items())
        if (k != except && k != "nullable" && family_of(k) != family::annotation) return true;
    return false;
}

// s[key] when present, after checking its kind.
const json* get(const json& s, const char* key, bool (json::*is)() const noexcept, std::string_view what,
                const pointer& p) {
    const auto it = s.find(key);
    if (it == s.end()) return nullptr;
    if (!((*it).*is)()) reject("\"{}\" {} must be {}", key, where(p), what);
    return &*it;
}

int32_t count(const json& s, const char* key, const pointer& p, int32_t fallback) {
    const json* v = get(s, key, &json::is_number, "a non-negative integer", p);
    if (!v) return fallback;
    const double d = v->get<double>();
    if (d < 0 || d != std::floor(d)) reject("\"{}\" {} must be a non-negative integer", key, where(p));
    return int32_t(std::min(d, double(INT32_MAX)));
}

bool flag(const json& s, const char* key, const pointer& p) {
    const json* v = get(s, key, &json::is_boolean, "a boolean", p);
    return v && v->get<bool>();
}

// allOf's meaning here, and how anyOf branches take their schema's other keywords: one schema
// with both sides' keywords, properties and required joined; any other keyword on both sides
// must agree.
json merge(json a, const json& b, const pointer& p) {
    for (const auto& [k, v] : b.items()) {
        if (family_of(k) == family::annotation) continue;
        const auto it = a.find(k);
        if (it == a.end()) {
            a[k] = v;
        } else if (k == "properties" && v.is_object() && it->is_object()) {
            for (const auto& [name, sub] : v.items()) {
                if (it->contains(name) && (*it)[name] != sub)
                    reject("conflicting schemas for property \"{}\" when merging allOf/anyOf {}", name, where(p));
                (*it)[name] = sub;
            }
        } else if (k == "required" && v.is_array() && it->is_array()) {
            for (const json& name : v)
                if (std::find(it->begin(), it->end(), name) == it->end()) it->push_back(name);
        } else if (*it != v) {
            reject("conflicting \"{}\" when merging allOf/anyOf {}", k, where(p));
        }
    }
    return a;
}

// The decoded code points of a property name, for the keys additional properties must avoid.
std::u32string code_points(std::string_view s, const pointer& p) {
    std::u32string out;
    for (size_t i = 0; i < s.size();) {
        const auto lead = uint8_t(s[i]);
        const int n = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : (lead >> 3) == 30 ? 4 : 0;
        bool ok = n > 0 && i + size_t(n) <= s.size();
        char32_t c = n == 1 ? lead : lead & (0x7F >> n);
        for (int k = 1; ok && k < n; ++k) {
            ok = (uint8_t(s[i + size_t(k)]) >> 6) == 2;
            c = (c << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
        }
        if (!ok || (c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF) reject("property name {} is not UTF-8", where(p));
        out.push_back(c);
        i += size_t(n);
    }
    return out;
}

// ---- digit strings: integer ranges, fraction bounds, \uXXXX ranges

struct digits_bound {
    std::string digits; // read as a fraction: "25" is 0.25, and so are "250" and "2500"
    bool strict = false;
};

int digit_value(char c) { return c <= '9' ? c - '0' : c - 'a' + 10; }
int first_digit(const digits_bound& b) { return b.digits.empty() ? 0 : digit_value(b.digits[0]); }
digits_bound rest(const digits_bound& b) { return {b.digits.empty() ? "" : b.digits.substr(1), b.strict}; }

expr digit_cls(int lo, int hi) {
    std::vector<cp_range> r;
    if (lo <= 9) r.push_back({char32_t('0' + lo), char32_t('0' + std::min(hi, 9))});
    if (hi >= 10) { // hex digits in either case
        const int a = std::max(lo, 10) - 10, b = hi - 10;
        r.push_back({char32_t('a' + a), char32_t('a' + b)});
        r.push_back({char32_t('A' + a), char32_t('A' + b)});
    }
    return cls(std::move(r));
}

// Drops bounds every string of at most max_len digits meets, so free digits stay one class.
void normalize(std::optional<digits_bound>& lo, std::optional<digits_bound>& hi, int max_len, int base) {
    for (std::optional<digits_bound>* b : {&lo, &hi})
        if (*b) (*b)->digits.erase((*b)->digits.find_last_not_of('0') + 1);
    if (lo && lo->digits.empty() && !lo->strict) lo.reset();
    if (!hi) return;
    const auto n = size_t(max_len);
    const std::string& d = hi->digits;
    const char top = base == 10 ? '9' : 'f';
    if (d.size() >= n && std::all_of(d.begin(), d.begin() + long(n), [&](char c) { return c == top; }) &&
        (!hi->strict || d.size() > n))
        hi.reset();
}

// The strings t of min_len..max_len digits (base 10 or 16) with lo <= 0.t <= hi (< where
// strict), as alternatives: none when no string qualifies. Reading digits as a fraction lets a
// number's fraction be of any length; strings of one fixed length compare as integers, which is
// how integer and \uXXXX ranges use it. Each alternative fixes a different leading digit, so
// the result is unambiguous.
std::vector<expr> digit_range(std::optional<digits_bound> lo, std::optional<digits_bound> hi, int min_len,
                              int max_len, int base) {
    normalize(lo, hi, max_len, base);
    const expr any = digit_cls(0, base - 1);
    if (!lo && !hi) return {rep(any, min_len, max_len)};
    std::vector<expr> out;
    const bool zero_ok = !lo && !(hi->digits.empty() && hi->strict); // the empty string reads as 0
    if (min_len == 0 && zero_ok) out.push_back(lit(""));
    if (max_len == 0) return out;
    const int lo_d = lo ? first_digit(*lo) : 0, hi_d = hi ? first_digit(*hi) : base - 1;
    if (lo_d > hi_d) return out;
    const int next_min = std::max(min_len - 1, 0), next_max = max_len - 1;
    const int free_lo = lo ? lo_d + 1 : lo_d, free_hi = hi ? hi_d - 1 : hi_d;
    if (free_lo <= free_hi) out.push_back(seq({digit_cls(free_lo, free_hi), rep(any, next_min, next_max)}));
    const auto follow = [&](int d, std::optional<digits_bound> l, std::optional<digits_bound> h) {
        std::vector<expr> tails = digit_range(std::move(l), std::move(h), next_min, next_max, base);
        if (!tails.empty()) out.push_back(seq({digit_cls(d, d), alt(std::move(tails))}));
    };
    if (lo && hi && lo_d == hi_d) {
        follow(lo_d, rest(*lo), rest(*hi));
    } else {
        if (lo) follow(lo_d, rest(*lo), std::nullopt);
        if (hi) follow(hi_d, std::nullopt, rest(*hi));
    }
    return out;
}

// The decimal integers a..b (0 <= a <= b), without leading zeros, as alternatives.
std::vector<expr> int_range(int64_t a, int64_t b) {
    std::vector<expr> out;
    for (int64_t low = 1, len = 1; a <= b; low *= 10, ++len) { // low: 10^(len-1)
        const int64_t high = low * 10 - 1;
        if (a > high) continue;
        const int64_t y = std::min(b, high);
        for (expr& e : digit_range(digits_bound{std::to_string(a)}, digits_bound{std::to_string(y)}, int(len),
                                   int(len), 10))
            out.push_back(std::move(e));
        a = y + 1;
    }
    return out;
}

// Integers a..b with a sign where negative; never "-0".
std::vector<expr> signed_int_range(int64_t a, int64_t b) {
    a = std::max(a, -kIntCap);
    b = std::min(b, kIntCap);
    std::vector<expr> out;
    if (b >= 0) out = int_range(std::max<int64_t>(a, 0), b);
    if (a < 0)
        for (expr& e : int_range(std::max<int64_t>(-b, 1), -a)) out.push_back(seq({lit("-"), std::move(e)}));
    return out;
}

// ---- number bounds

struct bound {
    double v;
    bool strict;
};

// The tighter of `inclusive` and `exclusive` (a number, or draft 4's boolean on `inclusive`).
std::optional<bound> bound_of(const json& s, const char* inclusive, const char* exclusive, bool lower,
                              const pointer& p) {
    std::optional<bound> out;
    if (const json* v = get(s, inclusive, &json::is_number, "a number", p)) out = bound{v->get<double>(), false};
    const auto it = s.find(exclusive);
    if (it == s.end()) return out;
    if (it->is_boolean()) {
        if (it->get<bool>() && !out) reject("\"{}\" {} is true without \"{}\"", exclusive, where(p), inclusive);
        if (out) out->strict = it->get<bool>();
        return out;
    }
    if (!it->is_number()) reject("\"{}\" {} must be a number", exclusive, where(p));
    const bound e{it->get<double>(), true};
    if (!out || (lower ? e.v >= out->v : e.v <= out->v)) out = e;
    return out;
}

// The nearest integer inside a bound, clamped just past the digit cap.
int64_t int_bound(const bound& b, bool lower) {
    const double v = lower ? (b.strict ? std::floor(b.v) + 1 : std::ceil(b.v))
                           : (b.strict ? std::ceil(b.v) - 1 : std::floor(b.v));
    return int64_t(std::clamp(v, -double(kIntCap + 1), double(kIntCap + 1)));
}

// A bound as the shortest decimal that reads back as its double: bounds compare with the
// number's text exactly, in decimal.
struct decimal {
    bool negative = false;
    int64_t whole = 0; // kIntCap + 1: more integer digits than a number here has
    std::string frac;
    bool strict = false;
};

decimal to_decimal(const bound& b) {
    char buf[512]; // the longest fixed form of a double is about 330 characters
    const char* end = std::to_chars(buf, buf + sizeof buf, b.v, std::chars_format::fixed).ptr;
    std::string_view t(buf, size_t(end - buf));
    decimal d;
    d.negative = t.front() == '-';
    d.strict = b.strict;
    if (d.negative) t.remove_prefix(1);
    const size_t dot = std::min(t.find('.'), t.size());
    const std::string_view whole = t.substr(0, dot);
    d.frac = dot < t.size() ? std::string(t.substr(dot + 1)) : "";
    d.frac.erase(d.frac.find_last_not_of('0') + 1);
    d.whole = whole.size() > size_t(kIntDigits) ? kIntCap + 1 : std::stoll(std::string(whole));
    if (d.whole == 0 && d.frac.empty()) d.negative = false; // -0
    return d;
}

expr digit() { return cls({{'0', '9'}}); }
expr fraction() { return opt(seq({lit("."), rep(digit(), 1, kFracDigits)})); }

// Unsigned numbers without exponent from low to high (absent: the digit cap), by integer part:
// low's and high's integers with a bounded fraction, any fraction between them.
std::vector<expr> magnitudes(const decimal& low, const std::optional<decimal>& high) {
    if (low.whole > kIntCap) return {};
    const bool capped = !high || high->whole > kIntCap;
    const int64_t a = low.whole, b = capped ? kIntCap : high->whole;
    std::vector<expr> out;
    const auto with_fraction = [&](int64_t whole, std::optional<digits_bound> lo, std::optional<digits_bound> hi) {
        std::vector<expr> tails = digit_range(lo, hi, 0, 0, 10); // no fraction: it reads as 0
        std::vector<expr> digits = digit_range(lo, hi, 1, kFracDigits, 10);
        if (!digits.empty()) tails.push_back(seq({lit("."), alt(std::move(digits))}));
        if (!tails.empty()) out.push_back(seq({lit(std::to_string(whole)), alt(std::move(tails))}));
    };
    const digits_bound lo_frac{low.frac, low.strict};
    const std::optional<digits_bound> hi_frac =
        capped ? std::nullopt : std::optional(digits_bound{high->frac, high->strict});
    if (a > b) return out;
    if (a == b) {
        with_fraction(a, lo_frac, hi_frac);
        return out;
    }
    with_fraction(a, lo_frac, std::nullopt);
    const int64_t mid_hi = capped ? b : b - 1;
    if (a + 1 <= mid_hi) out.push_back(seq({alt(int_range(a + 1, mid_hi)), fraction()}));
    if (!capped) with_fraction(b, std::nullopt, hi_frac);
    return out;
}

// Numbers in [lo, hi] (either open), written without exponent; never "-0".
std::vector<expr> number_range(const std::optional<bound>& lo, const std::optional<bound>& hi) {
    const auto dec = [](const std::optional<bound>& b) { return b ? std::optional(to_decimal(*b)) : std::nullopt; };
    const std::optional<decimal> l = dec(lo), h = dec(hi);
    std::vector<expr> out;
    if (!l || l->negative) { // below zero: magnitudes above |hi| (or 0) up to |lo|
        const decimal floor = h && h->negative ? *h : decimal{false, 0, "", true};
        for (expr& e : magnitudes(floor, l)) out.push_back(seq({lit("-"), std::move(e)}));
    }
    if (!h || !h->negative) {
        const decimal floor = l && !l->negative ? *l : decimal{};
        for (expr& e : magnitudes(floor, h)) out.push_back(std::move(e));
    }
    return out;
}

// ---- characters of JSON strings

const std::vector<cp_range> kAllChars = {{0, 0xD7FF}, {0xE000, 0x10FFFF}}; // what a string can hold

// set minus removed; both sorted and disjoint.
std::vector<cp_range> minus(const std::vector<cp_range>& set, const std::vector<cp_range>& removed) {
    std::vector<cp_range> out;
    for (auto [lo, hi] : set) {
        for (const auto& [rlo, rhi] : removed) {
            if (rhi < lo || rlo > hi) continue;
            if (rlo > lo) out.push_back({lo, rlo - 1});
            lo = rhi + 1;
            if (lo > hi) break;
        }
        if (lo <= hi) out.push_back({lo, hi});
    }
    return out;
}

bool contains(const std::vector<cp_range>& set, char32_t c) {
    return std::any_of(set.begin(), set.end(), [&](const cp_range& r) { return r.first <= c && c <= r.second; });
}

expr hex_range(char32_t a, char32_t b) {
    return alt(digit_range(digits_bound{fmt::format("{:04x}", uint32_t(a))},
                           digits_bound{fmt::format("{:04x}", uint32_t(b))}, 4, 4, 16));
}

// Astral code points lo..hi as \uD8xx\uDCxx pairs: the high surrogate carries the top 10 bits.
void add_surrogate_pairs(char32_t lo, char32_t hi, std::vector<expr>& ways) {
    const auto pair = [&](char32_t h0, char32_t h1, char32_t l0, char32_t l1) {
        ways.push_back(seq({lit("\\u"), hex_range(0xD800 + h0, 0xD800 + h1), lit("\\u"),
                            hex_range(0xDC00 + l0, 0xDC00 + l1)}));
    };
    const char32_t a = lo - 0x10000, b = hi - 0x10000;
    const char32_t ha = a >> 10, hb = b >> 10, la = a & 0x3FF, lb = b & 0x3FF;
    if (ha == hb) return pair(ha, ha, la, lb);
    const char32_t first = la == 0 ? ha : ha + 1, last = lb == 0x3FF ? hb : hb - 1;
    if (la != 0) pair(ha, ha, la, 0x3FF);
    if (first <= last) pair(first, last, 0, 0x3FF);
    if (lb != 0x3FF) pair(hb, hb, 0, lb);
}

// One character of a string's body whose value is in `set` (sorted, disjoint, no surrogates),
// every way JSON writes it: raw, a short escape, \uXXXX in either case, a surrogate pair. So a
// character counts once for minLength however it is written, and key exclusion is exact.
expr json_char(const std::vector<cp_range>& set) {
    static constexpr std::pair<char32_t, char32_t> kShortEscapes[] = {
        {'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'\b', 'b'}, {'\f', 'f'}, {'\n', 'n'}, {'\r', 'r'}, {'\t', 't'}};
    std::vector<expr> ways;
    const std::vector<cp_range> raw = minus(set, {{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
    if (!raw.empty()) ways.push_back(cls(raw));
    std::vector<cp_range> letters;
    for (auto [c, letter] : kShortEscapes)
        if (contains(set, c)) letters.push_back({letter, letter});
    if (!letters.empty()) ways.push_back(seq({lit("\\"), cls(std::move(letters))}));
    for (auto [lo, hi] : set) {
        if (lo <= 0xFFFF) ways.push_back(seq({lit("\\u"), hex_range(lo, std::min<char32_t>(hi, 0xFFFF))}));
        if (hi >= 0x10000) add_surrogate_pairs(std::max<char32_t>(lo, 0x10000), hi, ways);
    }
    return alt(std::move(ways));
}

expr quoted(expr body) { return seq({lit("\""), std::move(body), lit("\"")}); }

// String formats as regular expressions over the decoded value: RFC 3339's full-date, full-time
// (offset required) and date-time; RFC 4122's uuid; a dot-atom address with hostname labels;
// dotted-quad ipv4.
const std::string* format_regex(std::string_view name) {
    static const std::string date = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])";
    static const std::string time =
        "([01][0-9]|2[0-3]):[0-5][0-9]:([0-5][0-9]|60)(\\.[0-9]{1,9})?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    static const std::string atext = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+";
    static const std::string label = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    static const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    static const std::map<std::string, std::string, std::less<>> formats = {
        {"date", date},
        {"time", time},
        {"date-time", date + "[Tt]" + time},
        {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
        {"email", atext + "(\\." + atext + ")*@" + label + "(\\." + label + ")*"},
        {"ipv4", octet + "(\\." + octet + "){3}"},
    };
    const auto it = formats.find(name);
    return it == formats.end() ? nullptr : &it->second;
}

bool has_type(const json& v, std::string_view t) {
    if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v);
    return t == "number" ? v.is_number() : v.type_name() == t;
}

// ---- the compiler

struct listed_member {
    rule_id kv; // "name": value
    bool required;
};

class compiler {
public:
    compiler(builder& b, const json& root, const json_options& opt)
        : b_(b), root_(root), max_ws_(std::max(opt.max_ws, 0)) {}

    // The rule for the schema at t in the root document: one per target, so $ref recursion
    // closes on itself.
    rule_id schema_rule(const pointer& t, int depth) {
        const std::string key = t.to_string();
        if (const auto it = refs_.find(key); it != refs_.end()) return it->second;
        const rule_id r = b_.declare(key.empty() ? "root" : key);
        refs_.emplace(key, r);
        b_.define(r, schema(root_.at(t), t, depth));
        return r;
    }
    rule_id any_object() { return shared(object_, "object", &compiler::make_object); }

private:
    builder& b_;
    const json& root_;
    int32_t max_ws_;
    std::map<std::string, rule_id> refs_; // $ref target pointer -> its rule
    int n_inlined_ = 0;                   // a schema can ask for exponentially many merges
    std::optional<rule_id> ws_, char_, string_, integer_, number_, value_, object_, array_;

    // Declared before defined, so primitives can reach each other (value -> object -> value).
    rule_id shared(std::optional<rule_id>& slot, const char* name, expr (compiler::*make)()) {
        if (!slot) {
            slot = b_.declare(name);
            b_.define(*slot, (this->*make)());
        }
        return *slot;
    }
    expr ws() { return ref(shared(ws_, "ws", &compiler::make_ws)); }
    rule_id any_char() { return shared(char_, "char", &compiler::make_char); }
    rule_id any_string() { return shared(string_, "string", &compiler::make_string); }
    rule_id any_integer() { return shared(integer_, "integer", &compiler::make_integer); }
    rule_id any_number() { return shared(number_, "number", &compiler::make_number); }
    rule_id any_value() { return shared(value_, "value", &compiler::make_value); }
    rule_id any_array() { return shared(array_, "array", &compiler::make_array); }

    expr make_ws() { return max_ws_ == 0 ? lit("") : rep(cls({{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}}), 0, max_ws_); }
    expr make_char() { return json_char(kAllChars); }
    expr make_string() { return quoted(star(ref(any_char()))); }
    expr make_integer() {
        return alt({lit("0"), seq({opt(lit("-")), cls({{'1', '9'}}), rep(digit(), 0, kIntDigits - 1)})});
    }
    expr make_number() {
        const expr whole = alt({lit("0"), seq({cls({{'1', '9'}}), rep(digit(), 0, kIntDigits - 1)})});
        const expr exponent =
            seq({cls({{'e', 'e'}, {'E', 'E'}}), opt(cls({{'+', '+'}, {'-', '-'}})), rep(digit(), 1, kExpDigits)});
        return seq({opt(lit("-")), whole, fraction(), opt(exponent)});
    }
    expr make_value() {
        return alt({ref(any_object()), ref(any_array()), ref(any_string()), ref(any_number()), lit("true"),
                    lit("false"), lit("null")});
    }
    expr make_object() { return enclose("{", list(seq({ref(any_string()), colon(), ref(any_value())})), false, "}"); }
    expr make_array() { return enclose("[", list(ref(any_value())), false, "]"); }

    expr sep() { return seq({ws(), lit(","), ws()}); }
    expr colon() { return seq({ws(), lit(":"), ws()}); }
    expr list(const expr& item) { return seq({item, star(seq({sep(), item}))}); }
    expr join(std::vector<expr> items) {
        std::vector<expr> out;
        for (expr& e : items) {
            if (!out.empty()) out.push_back(sep());
            out.push_back(std::move(e));
        }
        return seq(std::move(out));
    }
    // open ws (body ws)? close; whitespace appears once where the body is absent.
    expr enclose(std::string_view open, std::optional<expr> body, bool required, std::string_view close) {
        std::vector<expr> items = {lit(open), ws()};
        if (body) items.push_back(required ? seq({std::move(*body), ws()}) : opt(seq({std::move(*body), ws()})));
        items.push_back(lit(close));
        return seq(std::move(items));
    }

    expr schema(const json& s, const pointer& p, int depth) {
        if (depth > kMaxDepth) reject("schema nested deeper than {} {}", kMaxDepth, where(p));
        if (s.is_boolean()) {
            if (!s.get<bool>()) reject("schema {} is false: no value is valid", where(p));
            return ref(any_value());
        }
        check_keywords(s, p);
        expr e = body(s, p, depth);
        return flag(s, "nullable", p) ? alt({std::move(e), lit("null")}) : e;
    }

    expr body(const json& s, const pointer& p, int depth) {
        if (s.contains("allOf") || (s.contains("$ref") && constrains(s, "$ref")))
            return schema(flatten(s, p, depth), p, depth + 1);
        if (s.contains("$ref")) return ref(schema_rule(target_of(s, p), depth + 1));
        if (s.contains("anyOf") || s.contains("oneOf")) return any_of(s, p, depth);
        if (s.contains("enum") || s.contains("const")) return enumeration(s, p);
        std::vector<expr> alts;
        for (const std::string& t : types(s, p)) alts.push_back(typed(t, s, p, depth));
        return alt(std::move(alts));
    }

    pointer target_of(const json& s, const pointer& p) {
        const auto& ref = get(s, "$ref", &json::is_string, "a string", p)->get_ref<const std::string&>();
        if (!ref.starts_with('#') || (ref.size() > 1 && ref[1] != '/'))
            reject("unsupported $ref \"{}\" {}: only JSON pointers into this schema (\"#/...\") are", ref, where(p));
        try {
            const pointer t(ref.substr(1));
            if (root_.contains(t)) return t;
        } catch (const json::exception&) {
        }
        reject("$ref \"{}\" {} points at no schema", ref, where(p));
    }

    // s as one schema object without $ref or allOf at its top: the target and branches merged in.
    json flatten(const json& s, const pointer& p, int depth) {
        if (depth > kMaxDepth) reject("$ref/allOf nested deeper than {} {}", kMaxDepth, where(p));
        if (++n_inlined_ > kMaxInlined) reject("$ref/allOf/anyOf merge over {} schemas {}", kMaxInlined, where(p));
        if (s.is_boolean()) {
            if (!s.get<bool>()) reject("schema {} is false: no value is valid", where(p));
            return json::object();
        }
        check_keywords(s, p);
        json out = s;
        out.erase("$ref");
        out.erase("allOf");
        if (s.contains("$ref")) {
            const pointer t = target_of(s, p);
            out = merge(flatten(root_.at(t), t, depth + 1), out, p);
        }
        if (const json* all = get(s, "allOf", &json::is_array, "an array of schemas", p))
            for (size_t i = 0; i < all->size(); ++i)
                out = merge(out, flatten((*all)[i], p / "allOf" / i, depth + 1), p);
        return out;
    }

    // oneOf is anyOf here: exclusivity is not enforced. Other keywords beside the branches are
    // merged into each.
    expr any_of(const json& s, const pointer& p, int depth) {
        if (s.contains("anyOf") && s.contains("oneOf"))
            reject("unsupported JSON Schema keyword \"oneOf\" beside \"anyOf\" {}", where(p));
        const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
        const json& branches = *get(s, key, &json::is_array, "an array of schemas", p);
        json base = s;
        base.erase(key);
        base.erase("nullable"); // schema() applies it once, outside the branches
        const bool plain = !constrains(base, "");
        std::vector<expr> alts;
        for (size_t i = 0; i < branches.size(); ++i) {
            if (branches[i] == false) continue; // nothing is valid there
            const pointer bp = p / key / i;
            alts.push_back(plain ? schema(branches[i], bp, depth + 1)
                                 : schema(merge(base, flatten(branches[i], bp, depth + 1), bp), bp, depth + 1));
        }
        if (alts.empty()) reject("no value is valid under \"{}\" {}", key, where(p));
        return alt(std::move(alts));
    }

    expr enumeration(const json& s, const pointer& p) {
        for (const auto& [k, v] : s.items())
            if (const family f = family_of(k); f != family::general && f != family::annotation)
                reject("\"{}\" beside \"enum\" or \"const\" {} is not supported", k, where(p));
        std::vector<json> values;
        if (const json* e = get(s, "enum", &json::is_array, "an array", p)) values.assign(e->begin(), e->end());
        if (const auto c = s.find("const"); c != s.end()) {
            if (!s.contains("enum")) values = {*c};
            std::erase_if(values, [&](const json& v) { return v != *c; });
        }
        if (s.contains("type")) {
            const std::vector<std::string> ts = types(s, p);
            std::erase_if(values, [&](const json& v) {
                return std::none_of(ts.begin(), ts.end(), [&](const std::string& t) { return has_type(v, t); });
            });
        }
        if (values.empty()) reject("no value is valid under \"enum\"/\"const\" {}", where(p));
        std::vector<expr> alts;
        for (const json& v : values) alts.push_back(constant(v));
        return alt(std::move(alts));
    }

    // A value as nlohmann writes it (keys in its order), whitespace allowed where JSON allows it.
    expr constant(const json& v) {
        if (!v.is_object() && !v.is_array()) return lit(v.dump());
        std::vector<expr> items;
        for (const auto& [k, x] : v.items())
            items.push_back(v.is_object() ? seq({lit(json(k).dump()), colon(), constant(x)}) : constant(x));
        const bool object = v.is_object();
        std::optional<expr> body;
        if (!items.empty()) body = join(std::move(items));
        return enclose(object ? "{" : "[", std::move(body), true, object ? "}" : "]");
    }

    // `type`, or without it the types the schema's keywords are about (object for properties,
    // string for minLength, ...), or every type when none are. integer is dropped beside number,
    // which holds it.
    std::vector<std::string> types(const json& s, const pointer& p) {
        static const std::map<family, std::string> of_family = {{family::string, "string"}, {family::number, "number"},
                                                                {family::object, "object"}, {family::array, "array"}};
        static const std::vector<std::string> names = {"string", "number", "integer", "boolean",
                                                       "null",   "object", "array"};
        std::vector<std::string> out;
        if (const auto it = s.find("type"); it != s.end()) {
            for (const json& t : it->is_array() ? *it : json::array({*it})) {
                if (!t.is_string() || std::find(names.begin(), names.end(), t.get<std::string>()) == names.end())
                    reject("\"type\" {} must be a type name or an array of them", where(p));
                out.push_back(t.get<std::string>());
            }
        } else {
            for (const auto& [k, v] : s.items())
                if (const auto f = of_family.find(family_of(k)); f != of_family.end()) out.push_back(f->second);
            if (out.empty()) out = {"object", "array", "string", "number", "boolean", "null"};
        }
        if (std::find(out.begin(), out.end(), "number") != out.end()) std::erase(out, "integer");
        std::sort(out.begin(), out.end());
        out.erase(std::unique(out.begin(), out.end()), out.end());
        if (out.empty()) reject("\"type\" {} is an empty array: no value is valid", where(p));
        return out;
    }

    expr typed(const std::string& t, const json& s, const pointer& p, int depth) {
        if (t == "string") return string_schema(s, p);
        if (t == "number" || t == "integer") return number_schema(s, p, t == "integer");
        if (t == "boolean") return alt({lit("true"), lit("false")});
        if (t == "null") return lit("null");
        if (t == "object") return object_schema(s, p, depth);
        return array_schema(s, p, depth);
    }

    // A pattern or format constrains the string alone: intersecting it with lengths (or with
    // each other) is beyond expressions, so those pairs are errors rather than approximations.
    expr string_schema(const json& s, const pointer& p) {
        const int32_t min = count(s, "minLength", p, 0), max = count(s, "maxLength", p, -1);
        const bool lengths = min > 0 || max >= 0;
        const json* pattern = get(s, "pattern", &json::is_string, "a string", p);
        const json* format = get(s, "format", &json::is_string, "a string", p);
        if ((pattern || format) && (lengths || (pattern && format)))
            reject("\"{}\" with \"{}\" {} is not supported", pattern ? "pattern" : "format",
                   lengths ? "minLength/maxLength" : "format", where(p));
        if (pattern) return quoted(regex(pattern->get<std::string>(), true, "pattern", p));
        if (format) {
            const std::string* re = format_regex(format->get<std::string>());
            if (!re) reject("unsupported \"format\" \"{}\" {}", format->get<std::string>(), where(p));
            return quoted(regex(*re, false, "format", p));
        }
        if (max >= 0 && max < min) reject("no string is valid {}: maxLength is below minLength", where(p));
        return lengths ? quoted(rep(ref(any_char()), min, max)) : ref(any_string());
    }

    expr regex(const std::string& re, bool search, const char* keyword, const pointer& p) {
        try {
            return regex_expr(b_, re, {.search = search, .json_string = true});
        } catch (const grammar_error& e) {
            reject("\"{}\" {}: {}", keyword, where(p), e.what());
        }
    }

    // Bounded numbers are written without exponent, so the bounds hold digit by digit.
    expr number_schema(const json& s, const pointer& p, bool integer) {
        const std::optional<bound> lo = bound_of(s, "minimum", "exclusiveMinimum", true, p);
        const std::optional<bound> hi = bound_of(s, "maximum", "exclusiveMaximum", false, p);
        if (!lo && !hi) return ref(integer ? any_integer() : any_number());
        std::vector<expr> alts = integer ? signed_int_range(lo ? int_bound(*lo, true) : -kIntCap,
                                                            hi ? int_bound(*hi, false) : kIntCap)
                                         : number_range(lo, hi);
        if (alts.empty()) reject("no {} is valid {}: the bounds exclude all", integer ? "integer" : "number", where(p));
        return alt(std::move(alts));
    }

    // Properties come in the order the schema object holds them (as the client wrote it), the
    // required ones mandatory. Additional properties: `false` none, `true` or a schema any key
    // that is none of the listed names, anywhere between them; absent, none when the schema
    // lists properties and any when it does not.
    expr object_schema(const json& s, const pointer& p, int depth) {
        const json* props = get(s, "properties", &json::is_object, "an object", p);
        const json* required = get(s, "required", &json::is_array, "an array of strings", p);
        const auto extra = s.find("additionalProperties");
        if (extra != s.end() && !extra->is_boolean() && !extra->is_object())
            reject("\"additionalProperties\" {} must be a schema", where(p));
        const bool extras = extra != s.end() ? *extra != false : !props;
        const json extra_schema = extra != s.end() ? *extra : json(true);
        if (!props && !required && extra_schema == true) return ref(any_object());

        struct spec {
            const json* schema;
            pointer p;
            bool required = false;
        };
        // In the schema's order: its properties, then required names it does not list.
        std::vector<std::pair<std::string, spec>> specs;
        std::map<std::string, size_t> index;
        if (props)
            for (const auto& [name, sub] : props->items()) {
                index[name] = specs.size();
                specs.push_back({name, {&sub, p / "properties" / name}});
            }
        if (required)
            for (const json& name : *required) {
                if (!name.is_string()) reject("\"required\" {} must be an array of strings", where(p));
                const auto [it, added] = index.try_emplace(name.get<std::string>(), specs.size());
                if (added) {
                    if (!extras)
                        reject("required property {} {} is neither in \"properties\" nor allowed by additionalProperties",
                               name.dump(), where(p));
                    specs.push_back({name.get<std::string>(), {&extra_schema, p / "additionalProperties"}});
                }
                spec& sp = specs[it->second].second;
                if (*sp.schema == false) reject("required property {} {} is false", name.dump(), where(p));
                sp.required = true;
            }
        std::vector<std::u32string> names;
        std::vector<listed_member> members;
        for (const auto& [name, sp] : specs) {
            names.push_back(code_points(name, sp.p));
            if (*sp.schema == false) continue; // must be absent: a name extras avoid, never written
            const expr value = schema(*sp.schema, sp.p, depth + 1);
            members.push_back({b_.add(name, seq({lit(json(name).dump()), colon(), value})), sp.required});
        }
        std::sort(names.begin(), names.end()); // other_key wants them sorted
        std::optional<expr> extra_kv;
        if (extras) {
            const expr value = schema(extra_schema, p / "additionalProperties", depth + 1);
            extra_kv = ref(b_.add("extra", seq({quoted(other_key(names, 0)), colon(), value})));
        }
        return members_expr(members, extra_kv);
    }

    // Rules per index i, built from the end: next(i) the listed members from i on, each after a
    // comma; more(i) extras, then next(i); first(i) the first member, listed at i or after. Every
    // text has one derivation.
    expr members_expr(const std::vector<listed_member>& ms, const std::optional<expr>& extra) {
        const size_t n = ms.size();
        std::vector<rule_id> next(n + 1), more(n + 1);
        std::optional<rule_id> first;
        bool any_required = false;
        for (size_t i = n + 1; i-- > 0;) {
            if (i == n) {
                next[i] = b_.add("members-end", lit(""));
            } else {
                std::vector<expr> alts = {seq({sep(), ref(ms[i].kv), ref(more[i + 1])})};
                if (!ms[i].required) alts.push_back(ref(next[i + 1]));
                next[i] = b_.add("members-next", alt(std::move(alts)));
            }
            more[i] = next[i];
            if (extra) {
                more[i] = b_.declare("members-more");
                b_.define(more[i], alt({seq({sep(), *extra, ref(more[i])}), ref(next[i])}));
            }
            if (i == n) continue;
            std::vector<expr> alts = {seq({ref(ms[i].kv), ref(more[i + 1])})};
            if (!ms[i].required && first) alts.push_back(ref(*first));
            first = b_.add("members-first", alt(std::move(alts)));
            any_required = any_required || ms[i].required;
        }
        std::vector<expr> bodies;
        if (extra) bodies.push_back(seq({*extra, ref(more[0])}));
        if (first) bodies.push_back(ref(*first));
        std::optional<expr> body;
        if (!bodies.empty()) body = alt(std::move(bodies));
        return enclose("{", std::move(body), any_required, "}");
    }

    // The bodies of JSON strings decoding to none of `names` (sorted, sharing their first `depth`
    // code points): ending here unless one of them does; going on with a code point none of them
    // has next, then anything; or with one some have, excluding those further.
    expr other_key(std::span<const std::u32string> names, size_t depth) {
        if (names.empty()) return star(ref(any_char()));
        std::vector<expr> alts;
        const bool one_ends = names.front().size() == depth; // sorted: it comes first
        if (!one_ends) alts.push_back(lit(""));
        std::vector<cp_range> taken;
        for (size_t i = one_ends ? 1 : 0, j = i; i < names.size(); i = j) {
            const char32_t c = names[i][depth];
            while (j < names.size() && names[j][depth] == c) ++j;
            taken.push_back({c, c});
            alts.push_back(seq({json_char({{c, c}}), other_key(names.subspan(i, j - i), depth + 1)}));
        }
        alts.push_back(seq({json_char(minus(kAllChars, taken)), star(ref(any_char()))}));
        return alt(std::move(alts));
    }

    // prefixItems, then items, minItems..maxItems in all; a false schema ends the array before it.
    expr array_schema(const json& s, const pointer& p, int depth) {
        const int32_t min = count(s, "minItems", p, 0);
        int32_t max = count(s, "maxItems", p, -1);
        const auto cap = [&](size_t n) { max = max < 0 ? int32_t(n) : std::min(max, int32_t(n)); };
        const json* pre = get(s, "prefixItems", &json::is_array, "an array of schemas", p);
        const auto items = s.find("items");
        if (items != s.end() && !items->is_boolean() && !items->is_object())
            reject("\"items\" {} must be a schema (a tuple is \"prefixItems\")", where(p));
        if (!pre && (items == s.end() || *items == true) && min == 0 && max < 0) return ref(any_array());

        std::vector<expr> elems;
        for (size_t i = 0; pre && i < pre->size() && !max_reached(max, i); ++i) {
            if ((*pre)[i] == false) {
                cap(i);
                break;
            }
            elems.push_back(ref(b_.add("item", schema((*pre)[i], p / "prefixItems" / i, depth + 1))));
        }
        std::optional<expr> item;
        if (items == s.end() || *items != false)
            item = ref(b_.add("items", schema(items != s.end() ? *items : json(true), p / "items", depth + 1)));
        else
            cap(elems.size());
        if (max >= 0 && min > max) reject("no array is valid {}: minItems is above what the items allow", where(p));
        if (max == 0) return enclose("[", std::nullopt, false, "]");

        // From the back: the elements after position i, each after a comma.
        const size_t start = std::max<size_t>(elems.size(), 1); // where the repeated items begin
        expr tail = lit("");
        if (item && !max_reached(max, start))
            tail = rep(seq({sep(), *item}), std::max(min - int32_t(start), 0), max < 0 ? -1 : max - int32_t(start));
        for (size_t i = start; i-- > 1;) {
            if (max_reached(max, i)) continue;
            expr e = seq({sep(), elems[i], std::move(tail)});
            tail = int32_t(i) < min ? std::move(e) : opt(std::move(e));
        }
        return enclose("[", seq({elems.empty() ? *item : elems[0], std::move(tail)}), min > 0, "]");
    }
    static bool max_reached(int32_t max, size_t i) { return max >= 0 && i >= size_t(max); }
};

} // namespace

rule_id add_json_schema(builder& b, const nlohmann::ordered_json& schema, const json_options& opt) {
    return compiler(b, schema, opt).schema_rule(pointer(), 0);
}

rule_id add_json_object(builder& b, const json_options& opt) {
    const json none = json::object();
    return compiler(b, none, opt).any_object();
}

} // namespace tandem::grammar
