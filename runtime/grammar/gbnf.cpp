// GBNF to grammar rules: llama.cpp's grammar syntax, parsed by recursive descent.
//
// Where this reads differently from llama.cpp: outside a group a line break ends a rule only
// when the next line opens one (`name ::=`) or the text ends, so a grammar llama.cpp reads
// means the same here, and continuation lines (`| b` under `a ::= x`) work too. A rule
// defined twice is an error (llama.cpp keeps the last one, which hides a mistake), as is a
// class range out of order (llama.cpp matches nothing for it). \xHH, \uHHHH and \UHHHHHHHH
// are code points, and one UTF-8 cannot carry (a surrogate, past U+10FFFF) is an error.
#include "runtime/grammar/gbnf.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <string>

namespace tandem::grammar {
namespace {

constexpr int max_depth = 256; // nested groups and stacked postfix operators: both recurse

bool is_word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

class parser {
public:
    parser(builder& b, std::string_view text) : b_(b), s_(text) {}

    rule_id grammar() {
        space(true);
        while (!at_end()) rule();
        for (const auto& [name, s] : symbols_)
            if (!s.defined) fail(s.used_at, s.used_in, fmt::format("undefined rule '{}'", name));
        const auto root = symbols_.find("root");
        if (root == symbols_.end()) reject("gbnf: no rule 'root' (the start rule)");
        return root->second.id;
    }

private:
    struct symbol {
        rule_id id;
        bool defined = false;
        size_t defined_at = 0;
        size_t used_at = 0;  // the first reference, for an undefined rule's message
        std::string used_in; // the rule it is in
    };

    // name ::= alternatives, ended by a newline (or the end) outside any group.
    void rule() {
        const size_t at = pos_;
        const std::string name(word());
        if (name.empty()) fail(at, "", "expected a rule name");
        rule_ = name;
        space(false);
        if (!s_.substr(pos_).starts_with("::=")) fail(pos_, "expected ::= after the rule name");
        pos_ += 3;
        gap(false);
        symbol& s = lookup(name, at);
        if (s.defined)
            fail(at, fmt::format("rule '{}' is defined twice (first on line {})", name, line_of(s.defined_at)));
        s.defined = true;
        s.defined_at = at;
        b_.define(s.id, alternatives(0));
        const bool cr = eat('\r');
        if (!eat('\n') && !cr && !at_end()) fail(pos_, fmt::format("expected the end of the line at '{}'", s_[pos_]));
        space(true);
    }

    expr alternatives(int depth) {
        std::vector<expr> alts;
        alts.push_back(sequence(depth));
        while (eat('|')) {
            gap(depth > 0);
            alts.push_back(sequence(depth));
        }
        return alt(std::move(alts));
    }

    // Items and their postfix operators, up to what is not one (`|`, `)`, a rule's end).
    expr sequence(int depth) {
        const bool nested = depth > 0;
        std::vector<expr> items;
        int n_postfix = 0; // on the last item
        while (!at_end()) {
            const size_t at = pos_;
            const char c = peek();
            if (c == '*' || c == '+' || c == '?' || c == '{') {
                if (items.empty()) fail(at, fmt::format("'{}' with nothing before it to repeat", c));
                if (depth + ++n_postfix > max_depth) fail(at, "postfix operators nested too deep");
                items.back() = postfix(std::move(items.back()), nested);
            } else if (auto e = item(depth)) {
                items.push_back(std::move(*e));
                n_postfix = 0;
            } else {
                break;
            }
            gap(nested);
        }
        return seq(std::move(items));
    }

    // A literal, class, `.`, group or rule reference at pos_; none where the sequence ends.
    std::optional<expr> item(int depth) {
        const size_t at = pos_;
        const char c = peek();
        if (is_word_char(c)) return ref(lookup(std::string(word()), at).id);
        if (c == '<') fail(at, "token references <...> are not supported");
        if (c != '"' && c != '[' && c != '.' && c != '(') return std::nullopt;
        ++pos_;
        if (c == '"') return literal(at);
        if (c == '[') return char_class(at);
        if (c == '.') return any_char();
        if (depth + 1 > max_depth) fail(at, fmt::format("groups nested deeper than {}", max_depth));
        space(true);
        expr e = alternatives(depth + 1);
        if (!eat(')')) fail(at, "'(' without ')'");
        return e;
    }

    expr literal(size_t at) {
        std::string text;
        while (!eat('"')) {
            if (at_end()) fail(at, "an unterminated literal");
            utf8_append(text, character());
        }
        return lit(text);
    }

    expr char_class(size_t at) {
        const bool negated = eat('^');
        std::vector<cp_range> set;
        while (!eat(']')) {
            if (at_end()) fail(at, "an unterminated class '['");
            const size_t lo_at = pos_;
            const char32_t lo = character();
            char32_t hi = lo;
            if (peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
                ++pos_;
                hi = character();
                if (hi < lo) fail(lo_at, "a class range out of order");
            }
            set.push_back({lo, hi});
        }
        return cls(std::move(set), negated);
    }

    // * + ? {n} {n,} {n,m} on e.
    expr postfix(expr e, bool nested) {
        const size_t at = pos_;
        const char c = s_[pos_++];
        if (c == '*') return star(std::move(e));
        if (c == '+') return plus(std::move(e));
        if (c == '?') return opt(std::move(e));
        space(nested);
        const int32_t min = count();
        int32_t max = min;
        space(nested);
        if (eat(',')) {
            space(nested);
            max = is_digit(peek()) ? count() : -1;
            space(nested);
        }
        if (!eat('}')) fail(pos_, "expected '}' to close a repetition");
        if (max >= 0 && max < min) fail(at, fmt::format("a repetition {{{},{}}} with min over max", min, max));
        return rep(std::move(e), min, max);
    }

    int32_t count() {
        const size_t at = pos_;
        if (!is_digit(peek())) fail(at, "expected a repetition count");
        int64_t v = 0;
        for (; is_digit(peek()); ++pos_) v = std::min<int64_t>(v * 10 + (peek() - '0'), INT32_MAX);
        const int32_t limit = build_limits{}.max_repeat;
        if (v > limit) fail(at, fmt::format("a repetition count over {}", limit));
        return int32_t(v);
    }

    // One code point of a literal or class: raw UTF-8 or an escape.
    char32_t character() {
        const size_t at = pos_;
        const auto [c, n] = utf8_decode(s_, pos_);
        if (n == 0) fail(at, "malformed UTF-8");
        pos_ += n;
        if (c != '\\') return c;
        if (at_end()) fail(at, "a trailing backslash");
        switch (s_[pos_++]) {
        case 'x': return hex(2, at);
        case 'u': return hex(4, at);
        case 'U': return hex(8, at);
        case 't': return '\t';
        case 'r': return '\r';
        case 'n': return '\n';
        case '\\': return '\\';
        case '"': return '"';
        case '[': return '[';
        case ']': return ']';
        default: fail(at, fmt::format("an unknown escape '\\{}'", s_[pos_ - 1]));
        }
    }

    char32_t hex(int n, size_t at) {
        uint32_t c = 0;
        for (int i = 0; i < n; ++i) {
            if (hex_value(peek()) < 0) fail(at, fmt::format("an escape with fewer than {} hex digits", n));
            c = c * 16 + uint32_t(hex_value(s_[pos_++]));
        }
        if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) fail(at, fmt::format("U+{:X} is not a character", c));
        return c;
    }

    symbol& lookup(const std::string& name, size_t at) {
        auto [it, fresh] = symbols_.try_emplace(name);
        if (fresh) {
            it->second.id = b_.declare(name);
            it->second.used_at = at;
            it->second.used_in = rule_;
        }
        return it->second;
    }

    std::string_view word() {
        const size_t start = pos_;
        while (is_word_char(peek())) ++pos_;
        return s_.substr(start, pos_ - start);
    }

    // Blanks and # comments, and line breaks where newline_ok.
    void space(bool newline_ok) {
        while (!at_end()) {
            const char c = peek();
            if (c == '#') {
                while (!at_end() && peek() != '\n' && peek() != '\r') ++pos_;
            } else if (c == ' ' || c == '\t' || (newline_ok && (c == '\n' || c == '\r'))) {
                ++pos_;
            } else {
                break;
            }
        }
    }

    // Blanks between items: line breaks too inside a group, and outside one unless the next
    // line opens a rule or the text ends there (then pos_ stays before the break).
    void gap(bool nested) {
        space(nested);
        if (nested) return;
        const size_t before = pos_;
        space(true);
        if (at_end() || opens_rule()) pos_ = before;
    }

    bool opens_rule() {
        const size_t before = pos_;
        bool opens = !word().empty();
        space(false);
        opens = opens && s_.substr(pos_).starts_with("::=");
        pos_ = before;
        return opens;
    }

    bool at_end() const { return pos_ >= s_.size(); }
    char peek() const { return at_end() ? '\0' : s_[pos_]; } // NUL at the end: no syntax char
    bool eat(char c) {
        if (peek() != c || at_end()) return false;
        ++pos_;
        return true;
    }
    size_t line_of(size_t at) const { return 1 + size_t(std::count(s_.begin(), s_.begin() + ptrdiff_t(at), '\n')); }

    [[noreturn]] void fail(size_t at, std::string_view what) const { fail(at, rule_, what); }
    [[noreturn]] void fail(size_t at, std::string_view rule, std::string_view what) const {
        if (rule.empty()) reject("gbnf: line {}: {}", line_of(at), what);
        reject("gbnf: line {}, rule '{}': {}", line_of(at), rule, what);
    }

    builder& b_;
    std::string_view s_;
    size_t pos_ = 0;
    std::string rule_; // the rule being parsed, for messages
    std::map<std::string, symbol, std::less<>> symbols_;
};

} // namespace

rule_id add_gbnf(builder& b, std::string_view text) { return parser(b, text).grammar(); }

} // namespace tandem::grammar
