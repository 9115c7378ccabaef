// Regular expressions to grammar expressions: a recursive-descent parser over the pattern's
// code points that builds the expression as it reads.
#include "runtime/grammar/regex.hpp"

#include <algorithm>
#include <optional>

namespace tandem::grammar {
namespace {

using ranges = std::vector<cp_range>;

constexpr char32_t max_cp = 0x10FFFF;
constexpr int max_depth = 256; // group nesting: this parser and the lowering recurse on it

// ECMAScript's sets (ECMA-262, CharacterClassEscape): \d and \w are ASCII; \s is WhiteSpace
// and LineTerminator, the Zs category included; `.` is all but the line terminators.
const ranges digit_set = {{'0', '9'}};
const ranges word_set = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const ranges space_set = {{0x09, 0x0D}, {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                          {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                          {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const ranges line_terminators = {{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}};

// Every code point not in r (surrogates included: the builder drops them).
ranges complement(ranges r) {
    std::sort(r.begin(), r.end());
    ranges out;
    char32_t next = 0;
    for (const auto& [lo, hi] : r) {
        if (lo > next) out.push_back({next, char32_t(lo - 1)});
        next = std::max(next, char32_t(hi + 1));
    }
    if (next <= max_cp) out.push_back({next, max_cp});
    return out;
}

bool contains(const ranges& r, char32_t c) {
    return std::any_of(r.begin(), r.end(), [c](const cp_range& x) { return x.first <= c && c <= x.second; });
}

// r without the code points lo..hi.
ranges without(const ranges& r, char32_t lo, char32_t hi) {
    ranges out;
    for (const auto& x : r) {
        if (x.first < lo) out.push_back({x.first, std::min(x.second, char32_t(lo - 1))});
        if (x.second > hi) out.push_back({std::max(x.first, char32_t(hi + 1)), x.second});
    }
    return out;
}

// How a JSON string writes a code point it cannot hold raw: the short escape where JSON has
// one, else \u00xx in lower case. One form per code point, the one nlohmann::json and most
// encoders write, so each decoded value has exactly one text.
std::optional<std::string> json_escape(char32_t c) {
    switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: break;
    }
    if (c < 0x20) return fmt::format("\\u{:04x}", uint32_t(c));
    return std::nullopt;
}

bool is_digit(char32_t c) { return c >= '0' && c <= '9'; }
bool is_alpha(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// One item of a class: a single code point (which may bound a range) or a set escape.
struct class_atom {
    ranges set;
    bool is_point = true;
};

class_atom point_atom(char32_t c) { return {{{c, c}}, true}; }
class_atom set_atom(ranges r) { return {std::move(r), false}; }

struct bounds {
    int32_t min, max; // max -1: unbounded
};

class parser {
public:
    parser(builder* b, std::string_view pattern, const regex_options& opt) : b_(b), p_(pattern), opt_(opt) {}

    expr pattern() {
        std::vector<expr> branches;
        do branches.push_back(top_branch());
        while (eat('|'));
        if (!at_end()) fail("unbalanced parenthesis: ')' without '('", pos_);
        return alt(std::move(branches));
    }

private:
    // A top-level alternative: the only place `^` (first) and `$` (last) may stand. Under
    // search an end without its anchor takes any text.
    expr top_branch() {
        const bool anchored_start = eat('^');
        std::vector<expr> items = sequence(0);
        const bool anchored_end = eat('$'); // sequence() stops at a `$` only where one may be
        if (opt_.search && !anchored_start) items.insert(items.begin(), any_text());
        if (opt_.search && !anchored_end) items.push_back(any_text());
        return seq(std::move(items));
    }

    // Terms up to `|`, `)`, the end, or (at the top) a `$` that ends the alternative.
    std::vector<expr> sequence(int depth) {
        std::vector<expr> items;
        while (!at_end() && peek() != '|' && peek() != ')') {
            const size_t at = pos_;
            if (peek() == '$' && depth == 0 && (at + 1 == p_.size() || p_[at + 1] == '|')) break;
            if (peek() == '^') fail("^ not at the start of the pattern", at);
            if (peek() == '$') fail("$ not at the end of the pattern", at);
            if (quantifier()) fail("a quantifier with nothing to repeat", at);
            expr e = atom(depth);
            if (const auto q = quantifier()) e = rep(std::move(e), q->min, q->max);
            items.push_back(std::move(e));
        }
        return items;
    }

    expr atom(int depth) {
        const size_t at = pos_;
        const char32_t c = next_cp();
        switch (c) {
        case '.': return points(complement(line_terminators));
        case '(': return group(at, depth + 1);
        case '[': return char_class(at);
        case '\\': return points(escape(at, false).set);
        default: return points({{c, c}});
        }
    }

    // ( ), (?: ), (?<name> ); lookaround and inline modifiers are refused here.
    expr group(size_t at, int depth) {
        if (depth > max_depth) fail(fmt::format("groups nested deeper than {}", max_depth), at);
        if (eat('?')) {
            if (starts_with("<=") || starts_with("<!")) fail("lookbehind (?<= or (?<! is not supported", at);
            if (peek() == '=' || peek() == '!') fail("lookahead (?= or (?! is not supported", at);
            if (eat('<')) group_name(at);
            else if (!eat(':')) fail("an inline modifier, flag or unknown group (?... is not supported", at);
        }
        std::vector<expr> branches;
        do branches.push_back(seq(sequence(depth)));
        while (eat('|'));
        if (!eat(')')) fail("unbalanced parenthesis: '(' without ')'", at);
        return alt(std::move(branches));
    }

    void group_name(size_t at) {
        const size_t start = pos_;
        const auto ident = [](char c, bool first) {
            return is_alpha(c) || c == '_' || c == '$' || (!first && is_digit(c));
        };
        while (ident(peek(), pos_ == start)) ++pos_;
        if (pos_ == start || !eat('>')) fail("a malformed group name (?<name>", at);
    }

    // [...] and [^...]: single code points, ranges of them, and set escapes.
    expr char_class(size_t at) {
        const bool negated = eat('^');
        ranges set;
        while (!eat(']')) {
            if (at_end()) fail("an unterminated class '['", at);
            const size_t lo_at = pos_;
            const class_atom lo = class_item();
            if (peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
                ++pos_;
                const class_atom hi = class_item();
                if (!lo.is_point || !hi.is_point)
                    fail("a class range with a set escape (\\d \\w \\s) as an end", lo_at);
                if (lo.set[0].first > hi.set[0].first) fail("a class range out of order", lo_at);
                set.push_back({lo.set[0].first, hi.set[0].first});
            } else {
                set.insert(set.end(), lo.set.begin(), lo.set.end());
            }
        }
        return points(negated ? complement(std::move(set)) : std::move(set));
    }

    class_atom class_item() {
        const size_t at = pos_;
        const char32_t c = next_cp();
        return c == '\\' ? escape(at, true) : point_atom(c);
    }

    // What follows a backslash; `at` is the backslash's offset.
    class_atom escape(size_t at, bool in_class) {
        if (at_end()) fail("a trailing backslash", at);
        const char32_t c = next_cp();
        switch (c) {
        case 'd': return set_atom(digit_set);
        case 'D': return set_atom(complement(digit_set));
        case 'w': return set_atom(word_set);
        case 'W': return set_atom(complement(word_set));
        case 's': return set_atom(space_set);
        case 'S': return set_atom(complement(space_set));
        case 'n': return point_atom('\n');
        case 'r': return point_atom('\r');
        case 't': return point_atom('\t');
        case 'f': return point_atom('\f');
        case 'v': return point_atom('\v');
        case 'b':
            if (in_class) return point_atom('\b');
            fail("a word boundary \\b is not supported", at);
        case 'B': fail("a word boundary \\B is not supported", at);
        case '0':
            if (is_digit(peek())) fail("an octal escape is not supported", at);
            return point_atom(0);
        case 'x': return point_atom(hex(2, "\\xHH", at));
        case 'u': return point_atom(unicode_escape(at));
        case 'c': return point_atom(control_escape(at));
        case 'k': fail("a backreference \\k<name> is not supported", at);
        case 'p':
        case 'P': fail("a Unicode property escape \\p{...} is not supported", at);
        default: break;
        }
        if (c >= '1' && c <= '9') fail(fmt::format("a backreference \\{} is not supported", char(c)), at);
        if (is_digit(c) || is_alpha(c)) fail(fmt::format("an unknown escape \\{}", char(c)), at);
        return point_atom(c); // an escaped metacharacter or punctuation stands for itself
    }

    // \uHHHH (a surrogate pair of two of them is one code point) or \u{H...}.
    char32_t unicode_escape(size_t at) {
        if (eat('{')) {
            char32_t c = 0;
            size_t n = 0;
            for (; hex_value(peek()) >= 0; ++n) // saturates past the largest code point
                c = std::min<char32_t>(c * 16 + hex_value(p_[pos_++]), max_cp + 1);
            if (n == 0 || !eat('}') || c > max_cp) fail("a malformed \\u{...} escape", at);
            if (c >= 0xD800 && c <= 0xDFFF) fail("a lone surrogate \\u{...}", at);
            return c;
        }
        const char32_t c = hex(4, "\\uHHHH", at);
        if (c >= 0xDC00 && c <= 0xDFFF) fail("a lone surrogate \\uHHHH", at);
        if (c < 0xD800 || c > 0xDBFF) return c;
        if (!eat('\\') || !eat('u')) fail("a lone surrogate \\uHHHH", at);
        const char32_t low = hex(4, "\\uHHHH", at);
        if (low < 0xDC00 || low > 0xDFFF) fail("a lone surrogate \\uHHHH", at);
        return 0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00);
    }

    char32_t control_escape(size_t at) {
        if (!is_alpha(peek())) fail("a malformed \\cX escape", at);
        return char32_t(p_[pos_++]) % 32;
    }

    char32_t hex(int n, const char* form, size_t at) {
        char32_t c = 0;
        for (int i = 0; i < n; ++i) {
            if (hex_value(peek()) < 0) fail(fmt::format("a malformed {} escape", form), at);
            c = c * 16 + hex_value(p_[pos_++]);
        }
        return c;
    }

    // ? * + {n} {n,} {n,m} at pos_, consumed with its lazy `?` (laziness picks which match a
    // backtracker reports, not which texts match). A `{` that does not open one is a literal.
    std::optional<bounds> quantifier() {
        const size_t at = pos_;
        std::optional<bounds> q;
        if (const char c = peek(); c == '?' || c == '*' || c == '+') {
            ++pos_;
            q = bounds{c == '+' ? 1 : 0, c == '?' ? 1 : -1};
        } else if (c == '{') {
            q = braces();
        }
        if (!q) return std::nullopt;
        if (q->max >= 0 && q->min > q->max)
            fail(fmt::format("a quantifier {{{},{}}} with min over max", q->min, q->max), at);
        const int32_t limit = build_limits{}.max_repeat;
        if (q->min > limit || q->max > limit) fail(fmt::format("a repetition count over {}", limit), at);
        eat('?');
        return q;
    }

    std::optional<bounds> braces() {
        const size_t at = pos_++;
        const auto number = [&] {
            int64_t v = 0;
            for (; is_digit(peek()); ++pos_) v = std::min<int64_t>(v * 10 + (p_[pos_] - '0'), INT32_MAX);
            return int32_t(v);
        };
        std::optional<bounds> q;
        if (is_digit(peek())) {
            const int32_t min = number();
            int32_t max = min;
            if (eat(',')) max = is_digit(peek()) ? number() : -1;
            if (eat('}')) q = bounds{min, max};
        }
        if (!q) pos_ = at;
        return q;
    }

    // One code point of `set`, written as JSON writes it under json_string.
    expr points(ranges set) {
        if (!opt_.json_string) return cls(std::move(set));
        std::vector<expr> forms;
        ranges raw = set;
        for (char32_t c = 0; c <= '\\'; ++c) {
            const auto escaped = json_escape(c);
            if (!escaped || !contains(set, c)) continue;
            forms.push_back(lit(*escaped));
            raw = without(raw, c, c);
        }
        if (!raw.empty() || forms.empty()) forms.push_back(cls(std::move(raw)));
        return alt(std::move(forms));
    }

    // Any text, for an end without its anchor under search: one rule shared by every use (or,
    // without a builder, the expression itself).
    expr any_text() {
        if (!b_) return star(points({{0, max_cp}}));
        if (!any_text_) any_text_ = b_->add("regex-any", star(points({{0, max_cp}})));
        return ref(*any_text_);
    }

    bool at_end() const { return pos_ >= p_.size(); }
    char peek() const { return at_end() ? '\0' : p_[pos_]; } // NUL at the end: no syntax char
    bool starts_with(std::string_view s) const { return p_.substr(pos_).starts_with(s); }
    bool eat(char c) {
        if (peek() != c || at_end()) return false;
        ++pos_;
        return true;
    }
    char32_t next_cp() {
        const auto [c, n] = utf8_decode(p_, pos_);
        if (n == 0) fail("malformed UTF-8", pos_);
        pos_ += n;
        return c;
    }

    [[noreturn]] static void fail(std::string_view what, size_t at) { reject("regex: {} (at offset {})", what, at); }

    builder* b_;
    std::string_view p_;
    regex_options opt_;
    size_t pos_ = 0;
    std::optional<rule_id> any_text_;
};

} // namespace

expr regex_expr(builder& b, std::string_view pattern, const regex_options& opt) {
    return parser(&b, pattern, opt).pattern();
}

expr regex_expr(std::string_view pattern, const regex_options& opt) { return parser(nullptr, pattern, opt).pattern(); }

} // namespace tandem::grammar
