// Scalar texts as languages: digit-by-digit comparison for number ranges (bounds met exactly in
// decimal), a remainder automaton for multipleOf, RFC 3339 / 3986 / 4122 formats as regular
// expressions, and the ways JSON writes a character.
#include "runtime/grammar/json_text.hpp"

#include "runtime/grammar/regex.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <set>

namespace tandem::grammar {

namespace {

constexpr int64_t kIntCap = 999'999'999'999'999; // the largest integer of kIntDigits digits

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

// A bound as the shortest decimal that reads back as its double: bounds compare with the
// number's text exactly, in decimal.
struct decimal {
    bool negative = false;
    int64_t whole = 0; // kIntCap + 1: more integer digits than a number here has
    std::string frac;
    bool strict = false;
};

std::string fixed_text(double v) {
    char buf[512]; // the longest fixed form of a double is about 330 characters
    const char* end = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed).ptr;
    return std::string(buf, size_t(end - buf));
}

decimal to_decimal(const number_bound& b) {
    std::string t = fixed_text(b.v);
    decimal d;
    d.negative = t.front() == '-';
    d.strict = b.strict;
    if (d.negative) t.erase(0, 1);
    const size_t dot = std::min(t.find('.'), t.size());
    const std::string whole = t.substr(0, dot);
    d.frac = dot < t.size() ? t.substr(dot + 1) : "";
    d.frac.erase(d.frac.find_last_not_of('0') + 1);
    d.whole = whole.size() > size_t(kIntDigits) ? kIntCap + 1 : std::stoll(whole);
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

// set ∩ [lo, hi].
std::vector<cp_range> clip(const std::vector<cp_range>& set, char32_t lo, char32_t hi) {
    std::vector<cp_range> out;
    for (const auto& [a, b] : set)
        if (b >= lo && a <= hi) out.push_back({std::max(a, lo), std::min(b, hi)});
    return out;
}

bool contains(const std::vector<cp_range>& set, char32_t c) {
    return std::any_of(set.begin(), set.end(), [&](const cp_range& r) { return r.first <= c && c <= r.second; });
}

dfa language(const std::string& re, const char* what) {
    return dfa::of(regex_expr(re, {.search = false, .json_string = false}), what);
}

dfa negative_zero() { return language("-0(\\.0{1,20})?", "negative zero"); }

} // namespace

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

const dfa& number_universe() {
    static const dfa u = language("-?(0|[1-9][0-9]{0,14})(\\.[0-9]{1,20})?", "numbers") - negative_zero();
    return u;
}

const dfa& integer_texts(dialect d) {
    static const dfa plain = language("-?(0|[1-9][0-9]{0,14})", "integers") - negative_zero();
    static const dfa zeros = language("-?(0|[1-9][0-9]{0,14})(\\.0{1,20})?", "integers") - negative_zero();
    return d == dialect::draft4 ? plain : zeros;
}

dfa number_range(const std::optional<number_bound>& lo, const std::optional<number_bound>& hi) {
    const auto dec = [](const std::optional<number_bound>& b) {
        return b ? std::optional(to_decimal(*b)) : std::nullopt;
    };
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
    if (out.empty()) return dfa();
    return dfa::of(alt(std::move(out)), "a number range") & number_universe();
}

dfa multiples_of(double m, const std::string& where) {
    std::string t = fixed_text(m);
    const size_t dot = std::min(t.find('.'), t.size());
    std::string frac = dot < t.size() ? t.substr(dot + 1) : "";
    frac.erase(frac.find_last_not_of('0') + 1);
    const std::string digits = (t.substr(0, dot) + frac);
    const size_t first = digits.find_first_not_of('0');
    const auto e = int64_t(frac.size());
    if (first == std::string::npos || e > kFracDigits || digits.size() - first > 9)
        reject("\"multipleOf\" {} {}: the divisor has too many digits to check", m, where);
    const int64_t c = std::stoll(digits.substr(first));
    const auto n_states = size_t(c * (e + 3) + 2);
    if (n_states > dfa::default_max_states)
        reject("\"multipleOf\" {} {}: a divisor of {} significant digits over {} decimals is too large to check", m,
               where, digits.size() - first, e);
    // States: 0 start, 1 after '-', then per remainder r: integer part I(r), fraction F(r, j)
    // after j < e digits, G(r) with all e (or more, zeros) digits read.
    const auto I = [&](int64_t r) { return uint32_t(2 + r); };
    const auto F = [&](int64_t r, int64_t j) { return uint32_t(2 + c + r * (e + 1) + j); }; // j in [0, e)
    const auto G = [&](int64_t r) { return uint32_t(2 + c + c * (e + 1) + r); };
    std::vector<std::vector<dfa::edge>> edges(size_t(2 + c + c * (e + 1) + c));
    std::vector<uint8_t> acc(edges.size(), 0);
    const auto pow10_mod = [&](int64_t k) {
        int64_t p = 1 % c;
        for (int64_t i = 0; i < k; ++i) p = p * 10 % c;
        return p;
    };
    for (const uint32_t s : {0u, 1u}) {
        if (s == 0) edges[s].push_back({'-', '-', 1});
        for (int d = 0; d <= 9; ++d) edges[s].push_back({char32_t('0' + d), char32_t('0' + d), I(d % c)});
    }
    for (int64_t r = 0; r < c; ++r) {
        edges[I(r)].push_back({'.', '.', F(r, 0)});
        for (int d = 0; d <= 9; ++d) edges[I(r)].push_back({char32_t('0' + d), char32_t('0' + d), I((r * 10 + d) % c)});
        acc[I(r)] = r * pow10_mod(e) % c == 0;
        for (int64_t j = 0; j < e; ++j) {
            for (int d = 0; d <= 9; ++d) {
                const int64_t nr = (r * 10 + d) % c;
                edges[F(r, j)].push_back({char32_t('0' + d), char32_t('0' + d), j + 1 == e ? G(nr) : F(nr, j + 1)});
            }
            acc[F(r, j)] = j >= 1 && r * pow10_mod(e - j) % c == 0;
        }
        if (e == 0) edges[F(r, 0)].push_back({'0', '0', G(r)});
        edges[G(r)].push_back({'0', '0', G(r)});
        acc[G(r)] = r == 0;
    }
    // ('.' sorts before the digits, so each state's edges are in order.)
    for (auto& es : edges) std::sort(es.begin(), es.end(), [](const dfa::edge& a, const dfa::edge& b) { return a.lo < b.lo; });
    return dfa::from_table(std::move(edges), std::move(acc)) & number_universe();
}

dfa number_texts(const nlohmann::ordered_json& v) {
    std::string whole, frac;
    bool negative = false;
    if (v.is_number_integer()) {
        whole = v.dump();
    } else {
        const double x = v.get<double>();
        if (!std::isfinite(x)) return dfa();
        std::string t = fixed_text(x == 0 ? 0.0 : x);
        const size_t dot = std::min(t.find('.'), t.size());
        whole = t.substr(0, dot);
        frac = dot < t.size() ? t.substr(dot + 1) : "";
        frac.erase(frac.find_last_not_of('0') + 1);
    }
    if (whole.starts_with('-')) {
        negative = true;
        whole.erase(0, 1);
    }
    if (whole.size() > size_t(kIntDigits) || frac.size() > size_t(kFracDigits)) return dfa();
    if (whole == "0" && frac.empty()) negative = false;
    std::string re = std::string(negative ? "-" : "") + whole;
    re += frac.empty() ? "(\\.0{1,20})?" : "\\." + frac + "0{0," + std::to_string(kFracDigits - frac.size()) + "}";
    return language(re, "a number") & number_universe();
}

const std::string* format_regex(std::string_view name) {
    static const std::string d31 = "(0[1-9]|[12][0-9]|3[01])", d30 = "(0[1-9]|[12][0-9]|30)";
    static const std::string leap = "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29";
    static const std::string date = "([0-9]{4}-((0[13578]|1[02])-" + d31 + "|(0[469]|11)-" + d30 +
                                    "|02-(0[1-9]|1[0-9]|2[0-8]))|" + leap + ")";
    static const std::string offset = "([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    // A leap second only at 23:59:60 UTC (with a zero offset: the one case a regular expression
    // can check without arithmetic).
    static const std::string time = "(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?" + offset +
                                    "|23:59:60(\\.[0-9]+)?([Zz]|[+-]00:00))";
    static const std::string atext = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+";
    static const std::string label = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    static const std::string octet = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
    static const std::string h16 = "[0-9a-fA-F]{1,4}";
    static const std::string ipv6 = "((" + h16 + ":){7}" + h16 + "|(" + h16 + ":){1,7}:|(" + h16 + ":){1,6}:" + h16 +
                                    "|(" + h16 + ":){1,5}(:" + h16 + "){1,2}|(" + h16 + ":){1,4}(:" + h16 + "){1,3}|(" +
                                    h16 + ":){1,3}(:" + h16 + "){1,4}|(" + h16 + ":){1,2}(:" + h16 + "){1,5}|" + h16 +
                                    ":(:" + h16 + "){1,6}|:((:" + h16 + "){1,7}|:))";
    // RFC 3986: pchar, the authority (an IPv6 literal or a registered name), paths, query.
    static const std::string pct = "%[0-9A-Fa-f]{2}";
    static const std::string unres_sub = "-A-Za-z0-9._~!$&'()*+,;=";
    static const std::string pchar = "([" + unres_sub + ":@]|" + pct + ")";
    static const std::string authority = "(([" + unres_sub + ":]|" + pct + ")*@)?(\\[" + ipv6 + "\\]|([" + unres_sub +
                                         "]|" + pct + ")*)(:[0-9]*)?";
    static const std::string tail = "(\\?(" + pchar + "|[/?])*)?(#(" + pchar + "|[/?])*)?";
    static const std::string hier = "(//" + authority + "(/" + pchar + "*)*|/(" + pchar + "+(/" + pchar + "*)*)?|" +
                                    pchar + "+(/" + pchar + "*)*)?";
    static const std::string uri = "[A-Za-z][A-Za-z0-9+.-]*:" + hier + tail;
    static const std::string nc = "([" + unres_sub + "@]|" + pct + ")";
    static const std::string relative = "(//" + authority + "(/" + pchar + "*)*|/(" + pchar + "+(/" + pchar + "*)*)?|" +
                                        nc + "+(/" + pchar + "*)*)?" + tail;
    static const std::string dur_time = "T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)";
    static const std::map<std::string, std::string, std::less<>> formats = {
        {"date", date},
        {"time", time},
        {"date-time", date + "[Tt]" + time},
        {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
        {"email", atext + "(\\." + atext + ")*@" + label + "(\\." + label + ")*"},
        {"ipv4", octet + "(\\." + octet + "){3}"},
        {"ipv6", ipv6},
        {"uri", uri},
        {"uri-reference", "(" + uri + "|" + relative + ")"},
        {"duration", "P(([0-9]+D|[0-9]+M([0-9]+D)?|[0-9]+Y([0-9]+M([0-9]+D)?)?)(" + dur_time + ")?|" + dur_time +
                         "|[0-9]+W)"},
        {"json-pointer", "(/([^~/]|~[01])*)*"},
        {"relative-json-pointer", "(0|[1-9][0-9]*)(#|(/([^~/]|~[01])*)*)"},
        {"hostname", label + "(\\." + label + ")*"},
    };
    const auto it = formats.find(name);
    return it == formats.end() ? nullptr : &it->second;
}

int64_t format_max_length(std::string_view name) { return name == "hostname" ? 253 : -1; }

bool format_unchecked(std::string_view name) {
    static const std::set<std::string, std::less<>> names = {"regex", "idn-email", "idn-hostname", "iri",
                                                             "iri-reference", "uri-template"};
    return names.contains(name);
}

expr json_char(const std::vector<cp_range>& set) {
    std::vector<expr> ways;
    const std::vector<cp_range> raw = clip(set, 0x20, 0x10FFFF);
    std::vector<cp_range> plain;
    for (const auto& [lo, hi] : raw) { // without '"' and '\'
        char32_t a = lo;
        for (const char32_t c : {char32_t('"'), char32_t('\\')}) {
            if (c < a || c > hi) continue;
            if (a < c) plain.push_back({a, c - 1});
            a = c + 1;
        }
        if (a <= hi) plain.push_back({a, hi});
    }
    if (!plain.empty()) ways.push_back(cls(plain));
    static constexpr std::pair<char32_t, char32_t> kShortEscapes[] = {
        {'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'\b', 'b'}, {'\f', 'f'}, {'\n', 'n'}, {'\r', 'r'}, {'\t', 't'}};
    std::vector<cp_range> letters;
    for (auto [c, letter] : kShortEscapes)
        if (contains(set, c)) letters.push_back({letter, letter});
    if (!letters.empty()) ways.push_back(seq({lit("\\"), cls(std::move(letters))}));
    for (auto [lo, hi] : clip(set, 0, 0x1F)) ways.push_back(seq({lit("\\u"), hex_range(lo, hi)}));
    for (auto [lo, hi] : clip(set, 0x7F, 0xFFFF)) ways.push_back(seq({lit("\\u"), hex_range(lo, hi)}));
    for (auto [lo, hi] : clip(set, 0x10000, 0x10FFFF)) add_surrogate_pairs(lo, hi, ways);
    if (ways.empty()) return cls({}); // nothing: a dead end
    return alt(std::move(ways));
}

} // namespace tandem::grammar
