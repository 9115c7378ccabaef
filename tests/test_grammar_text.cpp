// Text front ends suite: regular expressions against a backtracking matcher of their own,
// JSON-string bodies, search semantics and refused constructs; GBNF grammars and their errors.
#include "runtime/grammar/gbnf.hpp"
#include "runtime/grammar/reference.hpp"
#include "runtime/grammar/regex.hpp"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <random>
#include <string>
#include <vector>

using namespace tandem::grammar;

namespace {

std::string utf8(const std::u32string& s) {
    std::string out;
    for (const char32_t c : s) {
        if (c < 0x80) {
            out += char(c);
        } else if (c < 0x800) {
            out += {char(0xC0 | c >> 6), char(0x80 | (c & 0x3F))};
        } else if (c < 0x10000) {
            out += {char(0xE0 | c >> 12), char(0x80 | (c >> 6 & 0x3F)), char(0x80 | (c & 0x3F))};
        } else {
            out += {char(0xF0 | c >> 18), char(0x80 | (c >> 12 & 0x3F)), char(0x80 | (c >> 6 & 0x3F)),
                    char(0x80 | (c & 0x3F))};
        }
    }
    return out;
}

std::u32string from_utf8(const std::string& s) {
    std::u32string out;
    for (size_t i = 0; i < s.size();) {
        const auto b = uint8_t(s[i]);
        const int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
        char32_t c = n == 1 ? b : b & (0x3F >> (n - 1));
        for (int k = 1; k < n; ++k) c = c << 6 | (uint8_t(s[i + k]) & 0x3F);
        out += c;
        i += n;
    }
    return out;
}

// The text between the quotes of the JSON string holding s.
std::string json_body(const std::string& s) {
    const std::string quoted = nlohmann::json(s).dump();
    return quoted.substr(1, quoted.size() - 2);
}

compiled regex_grammar(std::string_view pattern, regex_options opt = {}) {
    builder b;
    const rule_id root = b.add("root", regex_expr(b, pattern, opt));
    return b.build(root);
}

bool regex_accepts(std::string_view pattern, std::string_view text, regex_options opt = {}) {
    return matches(regex_grammar(pattern, opt), text);
}

// --- The test's own regular expressions: an AST with a backtracking matcher -----------------

struct node {
    enum kind { set, seq, alt, rep, bol, eol };
    kind k = seq;
    std::vector<cp_range> ranges; // set
    bool negated = false;         // set
    std::vector<node> kids;
    int min = 0, max = -1; // rep
};

bool in_set(const node& n, char32_t c) {
    bool in = false;
    for (const auto& [lo, hi] : n.ranges) in = in || (lo <= c && c <= hi);
    return in != n.negated;
}

using cont = std::function<bool(size_t)>;

bool match(const node& n, const std::u32string& s, size_t i, const cont& k);

// Iterations past the minimum must consume something, or a nullable body would loop.
bool match_rep(const node& n, int count, const std::u32string& s, size_t i, const cont& k) {
    if (count >= n.min && k(i)) return true;
    if (n.max >= 0 && count >= n.max) return false;
    return match(n.kids[0], s, i,
                 [&](size_t j) { return (j > i || count < n.min) && match_rep(n, count + 1, s, j, k); });
}

bool match_seq(const std::vector<node>& kids, size_t at, const std::u32string& s, size_t i, const cont& k) {
    if (at == kids.size()) return k(i);
    return match(kids[at], s, i, [&](size_t j) { return match_seq(kids, at + 1, s, j, k); });
}

bool match(const node& n, const std::u32string& s, size_t i, const cont& k) {
    switch (n.k) {
    case node::set: return i < s.size() && in_set(n, s[i]) && k(i + 1);
    case node::seq: return match_seq(n.kids, 0, s, i, k);
    case node::alt:
        for (const node& kid : n.kids)
            if (match(kid, s, i, k)) return true;
        return false;
    case node::rep: return match_rep(n, 0, s, i, k);
    case node::bol: return i == 0 && k(i);
    case node::eol: return i == s.size() && k(i);
    }
    return false;
}

bool oracle(const node& n, const std::u32string& s, bool search) {
    if (!search) return match(n, s, 0, [&](size_t j) { return j == s.size(); });
    for (size_t i = 0; i <= s.size(); ++i)
        if (match(n, s, i, [](size_t) { return true; })) return true;
    return false;
}

// ECMAScript's \s: WhiteSpace (the Zs category, tab, VT, FF, BOM) and LineTerminator.
const std::vector<cp_range> es_space = {{0x09, 0x0D}, {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                                        {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                                        {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const std::vector<cp_range> es_digit = {{'0', '9'}};
const std::vector<cp_range> es_word = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};

node set_node(std::vector<cp_range> r, bool negated = false) {
    node n;
    n.k = node::set;
    n.ranges = std::move(r);
    n.negated = negated;
    return n;
}

node one(char32_t c) { return set_node({{c, c}}); }

std::vector<cp_range> plus_ranges(std::vector<cp_range> a, const std::vector<cp_range>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

struct atom_form {
    const char* text;
    node n;
};

// Single-code-point atoms as a pattern writes them, with their sets.
const std::vector<atom_form>& atoms() {
    static const std::vector<atom_form> v = {
        {"a", one('a')},
        {"b", one('b')},
        {"c", one('c')},
        {" ", one(' ')},
        {"\\.", one('.')},
        {".", set_node({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}, true)},
        {"[ab]", set_node({{'a', 'b'}})},
        {"[^ab]", set_node({{'a', 'b'}}, true)},
        {"[a-c]", set_node({{'a', 'c'}})},
        {"[^\\n]", set_node({{'\n', '\n'}}, true)},
        {"[\\d\\s]", set_node(plus_ranges(es_digit, es_space))},
        {"[é-ê]", set_node({{0xE9, 0xEA}})},
        {"[\\x00-\\x1f]", set_node({{0, 0x1F}})},
        {"[\"\\\\]", set_node({{'"', '"'}, {'\\', '\\'}})},
        {"[^\\w\"]", set_node(plus_ranges(es_word, {{'"', '"'}}), true)},
        {"\\d", set_node(es_digit)},
        {"\\D", set_node(es_digit, true)},
        {"\\w", set_node(es_word)},
        {"\\W", set_node(es_word, true)},
        {"\\s", set_node(es_space)},
        {"\\S", set_node(es_space, true)},
        {"\\n", one('\n')},
        {"\\t", one('\t')},
        {"\\u00e9", one(0xE9)},
        {"\\x01", one(0x01)},
        {"\\\\", one('\\')},
        {"\"", one('"')},
        {"é", one(0xE9)},
        {"\\u{1F600}", one(0x1F600)},
        {"\\uD83D\\uDE00", one(0x1F600)},
    };
    return v;
}

// The code points random texts are made of: each atom's set meets them.
const std::u32string alphabet = U"abc. 1_\n\t\r\b\"\\\u00e9\u00ea\x01\x1f\u00a0\u2028\U0001F600" + std::u32string(1, 0);

struct random_regex {
    node n;
    std::string text;
    int prec; // 0 alternation, 1 sequence, 2 quantified, 3 atom or group
};

class regex_gen {
public:
    explicit regex_gen(uint32_t seed) : rng_(seed) {}

    // A top level: one or two alternatives, each maybe anchored at either end.
    random_regex top() {
        random_regex out{node{node::alt}, "", 0};
        const int n_branches = pick(2) + 1;
        for (int i = 0; i < n_branches; ++i) {
            random_regex br = at_least(any(1), 1);
            node s{node::seq};
            const bool bol = pick(3) == 0, eol = pick(3) == 0;
            if (bol) s.kids.push_back(node{node::bol});
            s.kids.push_back(std::move(br.n));
            if (eol) s.kids.push_back(node{node::eol});
            const std::string text = (bol ? "^" : "") + br.text + (eol ? "$" : "");
            out.text += (i ? "|" : "") + text;
            out.n.kids.push_back(std::move(s));
        }
        return out;
    }

    std::u32string sample(const node& n) {
        std::u32string s;
        switch (n.k) {
        case node::set: {
            std::u32string in;
            for (const char32_t c : alphabet)
                if (in_set(n, c)) in += c;
            if (!in.empty()) s += in[pick(int(in.size()))];
            break;
        }
        case node::seq:
            for (const node& k : n.kids) s += sample(k);
            break;
        case node::alt: s = sample(n.kids[pick(int(n.kids.size()))]); break;
        case node::rep: {
            const int n_times = n.min + pick((n.max < 0 ? 2 : n.max - n.min) + 1);
            for (int i = 0; i < n_times; ++i) s += sample(n.kids[0]);
            break;
        }
        default: break;
        }
        return s;
    }

    std::u32string noise(int max_len) {
        std::u32string s;
        for (int n = pick(max_len + 1); n > 0; --n) s += alphabet[pick(int(alphabet.size()))];
        return s;
    }

    int pick(int n) { return int(rng_() % uint32_t(n)); }

private:
    random_regex any(int depth) {
        switch (depth >= 4 ? 0 : pick(5)) {
        case 1: return sequence(depth);
        case 2: return alternation(depth);
        case 3: return quantified(depth);
        case 4: return at_least(any(depth + 1), 4); // always a group
        default: {
            const atom_form& a = atoms()[pick(int(atoms().size()))];
            return {a.n, a.text, 3};
        }
        }
    }

    random_regex sequence(int depth) {
        random_regex out{node{node::seq}, "", 1};
        for (int i = pick(2) + 2; i > 0; --i) {
            random_regex k = at_least(any(depth + 1), 1);
            out.text += k.text;
            out.n.kids.push_back(std::move(k.n));
        }
        return out;
    }

    random_regex alternation(int depth) {
        random_regex out{node{node::alt}, "", 0};
        for (int i = pick(2) + 2; i > 0; --i) {
            random_regex k = any(depth + 1);
            out.text += (out.n.kids.empty() ? "" : "|") + k.text;
            out.n.kids.push_back(std::move(k.n));
        }
        return out;
    }

    random_regex quantified(int depth) {
        random_regex k = at_least(any(depth + 1), 3);
        struct form {
            std::string text;
            int min, max;
        };
        const int lo = pick(3), hi = lo + pick(3);
        const form forms[] = {{"?", 0, 1},
                              {"*", 0, -1},
                              {"+", 1, -1},
                              {fmt::format("{{{}}}", lo), lo, lo},
                              {fmt::format("{{{},}}", lo), lo, -1},
                              {fmt::format("{{{},{}}}", lo, hi), lo, hi}};
        const form& f = forms[pick(6)];
        node n{node::rep};
        n.min = f.min;
        n.max = f.max;
        n.kids.push_back(std::move(k.n));
        const char* lazy = pick(4) == 0 ? "?" : ""; // the same language
        return {std::move(n), k.text + f.text + lazy, 2};
    }

    // r, in a group when it binds looser than prec.
    random_regex at_least(random_regex r, int prec) {
        if (r.prec >= prec) return r;
        static const char* const opens[] = {"(", "(?:", "(?<g>"};
        return {std::move(r.n), opens[pick(3)] + r.text + ")", 3};
    }

    std::mt19937 rng_;
};

} // namespace

TEST_CASE("regex: random patterns agree with a backtracking matcher, in every mode") {
    regex_gen gen(20240611);
    int n_accepted = 0, n_checked = 0;
    for (int round = 0; round < 500; ++round) {
        const random_regex r = gen.top();
        std::vector<std::u32string> texts;
        for (int i = 0; i < 8; ++i) texts.push_back(gen.noise(5));
        for (int i = 0; i < 8; ++i) texts.push_back(gen.sample(r.n));
        for (int i = 0; i < 4; ++i) texts.push_back(gen.noise(2) + gen.sample(r.n) + gen.noise(2));
        for (const bool search : {false, true}) {
            for (const bool json : {false, true}) {
                INFO("pattern: ", r.text, " search: ", search, " json_string: ", json);
                const compiled g = regex_grammar(r.text, {.search = search, .json_string = json});
                for (const auto& t : texts) {
                    const std::string text = json ? json_body(utf8(t)) : utf8(t);
                    INFO("text: ", nlohmann::json(text).dump());
                    const bool expected = oracle(r.n, t, search);
                    CHECK(matches(g, text) == expected);
                    n_accepted += expected;
                    ++n_checked;
                }
            }
        }
    }
    MESSAGE(n_accepted, " of ", n_checked, " texts matched");
    CHECK(n_accepted > n_checked / 5); // the sampled texts give the comparison positives
}

TEST_CASE("regex: under json_string every accepted text is a JSON string body whose value matches") {
    regex_gen gen(77);
    for (int round = 0; round < 300; ++round) {
        const random_regex r = gen.top();
        for (const bool search : {false, true}) {
            INFO("pattern: ", r.text, " search: ", search);
            const compiled g = regex_grammar(r.text, {.search = search, .json_string = true});
            for (int i = 0; i < 10; ++i) {
                const std::u32string t = i % 2 ? gen.noise(4) : gen.sample(r.n);
                // Raw (unescaped) text and another escape form must not slip through.
                for (std::string text : {utf8(t), json_body(utf8(t))}) {
                    if (const size_t nl = text.find("\\n"); nl != std::string::npos) text.replace(nl, 2, "\\u000a");
                    if (!matches(g, text)) continue;
                    INFO("text: ", nlohmann::json(text).dump());
                    const auto value = nlohmann::json::parse("\"" + text + "\"", nullptr, false);
                    REQUIRE_FALSE(value.is_discarded());
                    const auto decoded = value.get<std::string>();
                    CHECK(text == json_body(decoded)); // the one canonical form
                    CHECK(oracle(r.n, from_utf8(decoded), search));
                }
            }
        }
    }
}

TEST_CASE("regex: escapes, classes and quantifiers") {
    struct row {
        const char* pattern;
        std::vector<std::string> yes, no;
    };
    const std::vector<row> rows = {
        {"\\s",
         {" ", "\t", "\n", "\v", "\f", "\r", "\u00a0", "\u1680", "\u2000", "\u200a", "\u2028", "\u2029", "\u202f",
          "\u205f", "\u3000", "\ufeff"},
         {"a", "\u200b", "\u0085", ""}},
        {"\\S", {"a", "\u200b"}, {" ", "\u3000"}},
        {".", {"a", "\u0085", "\U0001F600", "\x7f"}, {"\n", "\r", "\u2028", "\u2029", "", "ab"}},
        {"[^]", {"\n", "x"}, {""}},
        {"a|[]", {"a"}, {"", "b"}},
        {"\\w+", {"azAZ09_"}, {"é", "-"}},
        {"\\d{2,3}", {"12", "123"}, {"1", "1234", "١٢"}},
        {"x{2}", {"xx"}, {"x", "xxx"}},
        {"x{2,}", {"xx", "xxxxx"}, {"x"}},
        {"a{,2}", {"a{,2}"}, {"a", "aa"}}, // not a quantifier: literal braces (Annex B)
        {"{}a}", {"{}a}"}, {}},
        {"\\cJ\\0\\v\\f", {std::string("\n\0\v\f", 4)}, {}},
        {"[\\b]", {"\b"}, {"b"}},
        {"\\/\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\^\\$\\-", {"/.*+?()[]{}|^$-"}, {}},
        {"\\u00e9\\x41\\u{1F600}\\uD83D\\uDE00", {"éA\U0001F600\U0001F600"}, {}},
        {"[-a]|[a-]", {"-", "a"}, {"b"}},
        {"[\\--/]", {"-", ".", "/"}, {","}},
        {"[^\\d\\s]", {"a", "é"}, {"1", " "}},
        {"(?<year>\\d{4})-(?:\\d{2})", {"2024-01"}, {"2024-1"}},
        {"a*?b+?c??", {"b", "aabbc"}, {"c", "a"}},
        {"(a*)*b", {"b", "aab"}, {"a"}},
        {"(a|b?)+c", {"c", "abbac"}, {"ab"}},
        {"()|x", {"", "x"}, {"xx"}},
        {"^abc$", {"abc"}, {"xabc"}},
        {"^$", {""}, {"a"}},
        {"日本+", {"日本本"}, {"日"}},
    };
    for (const auto& r : rows) {
        INFO("pattern: ", r.pattern);
        const compiled g = regex_grammar(r.pattern);
        for (const auto& t : r.yes) CHECK_MESSAGE(matches(g, t), nlohmann::json(t).dump());
        for (const auto& t : r.no) CHECK_MESSAGE(!matches(g, t), nlohmann::json(t).dump());
    }
}

TEST_CASE("regex: search finds the pattern anywhere unless anchored") {
    const regex_options search{.search = true};
    CHECK(regex_accepts("abc", "xxabcyy", search));
    CHECK(regex_accepts("abc", "abc", search));
    CHECK_FALSE(regex_accepts("abc", "abxc", search));
    CHECK(regex_accepts("^abc", "abcx", search));
    CHECK_FALSE(regex_accepts("^abc", "xabc", search));
    CHECK(regex_accepts("abc$", "xabc", search));
    CHECK_FALSE(regex_accepts("abc$", "abcx", search));
    CHECK(regex_accepts("^a$|b", "xbx", search));
    CHECK(regex_accepts("^a$|b", "a", search));
    CHECK_FALSE(regex_accepts("^a$|b", "ax", search));
    CHECK(regex_accepts("", "anything \n at all", search));
    CHECK(regex_accepts("^$", "", search));
    CHECK_FALSE(regex_accepts("^$", " ", search));
    // Without search, anchors at the ends change nothing.
    CHECK(regex_accepts("^abc$", "abc"));
    CHECK_FALSE(regex_accepts("abc", "xabc"));
}

TEST_CASE("regex: json_string writes each code point as JSON does") {
    const regex_options json{.json_string = true};
    CHECK(regex_accepts("\"", "\\\"", json));
    CHECK_FALSE(regex_accepts("\"", "\"", json));
    CHECK(regex_accepts("\\\\", "\\\\", json));
    CHECK_FALSE(regex_accepts("\\\\", "\\", json));
    CHECK(regex_accepts("\\n\\t\\r\\f[\\b]", "\\n\\t\\r\\f\\b", json));
    CHECK_FALSE(regex_accepts("\\n", "\n", json));
    CHECK_FALSE(regex_accepts("\\n", "\\u000a", json)); // one form per code point
    CHECK(regex_accepts("\\x01\\x1f", "\\u0001\\u001f", json));
    CHECK(regex_accepts("[^a]", "\\\"", json));
    CHECK(regex_accepts("[^a]", "\\u001f", json));
    CHECK(regex_accepts("[^a]", "é", json));
    CHECK_FALSE(regex_accepts("[^a]", "\"", json));
    CHECK(regex_accepts("/\\x7f", "/\x7f", json)); // `/` and DEL stay raw
    CHECK(regex_accepts(".", "\\t", json));
    CHECK(regex_accepts("a|[]", "a", json));
    CHECK_FALSE(regex_accepts(".", "\\n", json));
    // search's any text is string text too
    const regex_options both{.search = true, .json_string = true};
    CHECK(regex_accepts("^[A-Z]{2}-\\d{3}", "AB-123 \\\"and\\\" \\n more", both));
    CHECK_FALSE(regex_accepts("^[A-Z]{2}-\\d{3}", "AB-123 \"", both));
    CHECK_FALSE(regex_accepts("^[A-Z]{2}-\\d{3}$", "AB-1234", both));
}

TEST_CASE("regex: what a generator cannot honour is refused, naming it and its offset") {
    const std::vector<std::pair<std::string, std::string>> rows = {
        {"(a)\\1", "backreference \\1"},
        {"(?<x>a)\\k<x>", "backreference \\k<name>"},
        {"a(?=b)", "lookahead"},
        {"a(?!b)", "lookahead"},
        {"(?<=a)b", "lookbehind"},
        {"(?<!a)b", "lookbehind"},
        {"\\bfoo", "word boundary \\b"},
        {"a\\B", "word boundary \\B"},
        {"a^b", "^ not at the start"},
        {"(^a)", "^ not at the start"},
        {"a$b", "$ not at the end"},
        {"(a$)", "$ not at the end"},
        {"(?i)abc", "inline modifier, flag or unknown group"},
        {"(?m:a)", "inline modifier, flag or unknown group"},
        {"(?P<n>a)", "inline modifier, flag or unknown group"},
        {"a(?", "inline modifier, flag or unknown group"},
        {"[a", "unterminated class"},
        {"[a-", "unterminated class"},
        {"\\u{12", "malformed \\u{...}"},
        {"\\c", "malformed \\cX"},
        {"a{3,2}", "{3,2} with min over max"},
        {"(ab", "'(' without ')'"},
        {"ab)", "')' without '('"},
        {"ab\\", "trailing backslash"},
        {"a{10001}", "repetition count over 10000"},
        {"a{2,20000}", "repetition count over 10000"},
        {"a{99999999999}", "repetition count over 10000"},
        {"*a", "nothing to repeat"},
        {"a**", "nothing to repeat"},
        {"a{2}{3}", "nothing to repeat"},
        {"^*", "nothing to repeat"},
        {"[abc", "unterminated class"},
        {"[z-a]", "range out of order"},
        {"[\\d-z]", "set escape"},
        {"\\p{L}", "Unicode property escape"},
        {"\\q", "unknown escape \\q"},
        {"\\x4", "malformed \\xHH"},
        {"\\u12", "malformed \\uHHHH"},
        {"\\uD800", "lone surrogate"},
        {"\\uDC00", "lone surrogate"},
        {"\\u{110000}", "malformed \\u{...}"},
        {"\\01", "octal escape"},
        {"(?<1a>x)", "malformed group name"},
        {"\\c1", "malformed \\cX"},
        {"a\xff", "malformed UTF-8"},
        {std::string(300, '(') + std::string(300, ')'), "nested deeper than 256"},
    };
    for (const auto& entry : rows) { // no structured binding: clang 14 cannot capture one in INFO
        const std::string& pattern = entry.first;
        const std::string& what = entry.second;
        INFO("pattern: ", pattern);
        builder b;
        CHECK_THROWS_WITH_AS(regex_expr(b, pattern), doctest::Contains(what.c_str()), grammar_error);
    }
    builder b;
    CHECK_THROWS_WITH_AS(regex_expr(b, "ab(?=c)"), doctest::Contains("(at offset 2)"), grammar_error);
    CHECK_THROWS_WITH_AS(regex_expr(b, "é\\1"), doctest::Contains("(at offset 2)"), grammar_error); // bytes
    CHECK_THROWS_AS(regex_grammar("[]"), grammar_error); // nothing matches
}

// Untrusted input: whatever the text, a front end builds a grammar or throws grammar_error
// (an assertion or a stray read here would take the daemon down).
template <class Front>
void soup(std::string_view pieces_text, Front front) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < pieces_text.size();) {
        const size_t sp = std::min(pieces_text.find(' ', i), pieces_text.size());
        pieces.emplace_back(pieces_text.substr(i, sp - i));
        i = sp + 1;
    }
    pieces.push_back(" ");
    std::mt19937 rng(5);
    for (int round = 0; round < 3000; ++round) {
        std::string text;
        for (int n = int(rng() % 12); n > 0; --n) text += pieces[rng() % pieces.size()];
        INFO("text: ", nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
        try {
            builder b;
            (void)b.build(front(b, text));
        } catch (const grammar_error&) {
        }
    }
}

TEST_CASE("regex and gbnf: random syntax is built or refused, never anything else") {
    soup(R"(a b ( ) (? (?: (?<g> (?< > ) | ^ $ * + ? *? {2} {1,3} { } , 0 3 [ ] [^ - \ \d \s \w \b \u \u{ \x \k \c é )"
         "\xff \" \n",
         [](builder& b, std::string_view t) {
             return b.add("root", regex_expr(b, t, {.search = t.size() % 2 == 1, .json_string = t.size() % 3 == 0}));
         });
    soup(R"(root ::= a b ::= " "x" [ ] [^ - ( ) | * + ? {2} {1,3} { } , # \ \n \x41 \u12 . < é )"
         "\xff \n \r\n",
         [](builder& b, std::string_view t) { return add_gbnf(b, t); });
}

// --- GBNF ---------------------------------------------------------------------------------------

namespace {

compiled gbnf_grammar(std::string_view text) {
    builder b;
    const rule_id root = add_gbnf(b, text);
    return b.build(root);
}

void check_texts(const compiled& g, const std::vector<std::string>& yes, const std::vector<std::string>& no) {
    for (const auto& t : yes) CHECK_MESSAGE(matches(g, t), nlohmann::json(t).dump());
    for (const auto& t : no) CHECK_MESSAGE(!matches(g, t), nlohmann::json(t).dump());
}

} // namespace

TEST_CASE("gbnf: arithmetic") {
    const compiled g = gbnf_grammar(R"g(root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= [0-9]+
)g");
    check_texts(g, {"1", "1+2*(3-4)", "((7))/8", "12*34-5"}, {"", "1+", "(1", "1+-2", "a"});
}

TEST_CASE("gbnf: JSON") {
    const compiled g = gbnf_grammar(R"g(# JSON, with whitespace after every token
root    ::= ws value
value   ::= (object | array | string | number | "true" | "false" | "null") ws
object  ::= "{" ws (member ("," ws member)*)? "}"
member  ::= string ws ":" ws value
array   ::= "[" ws (value ("," ws value)*)? "]"
string  ::= "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})   # escapes
  )* "\""
number  ::= "-"? ("0" | [1-9] [0-9]*) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws      ::= [ \t\n]*
)g");
    check_texts(g,
                {R"({"a": [1, 2.5e3, "x\"y"], "b": null})", " [ ] ", R"({"u":"\u00e9 é"})", "-0.5E-7", "true\n",
                 R"([[], {}, [{"k": false}]])"},
                {R"({"a" 1})", "[1,]", "01", R"("\x")", R"({"a":1}})", "\"tab\there\"", "nul"});
}

TEST_CASE("gbnf: a list, and chess moves") {
    check_texts(gbnf_grammar("# a grammar for lists\nroot ::= (\"- \" item)+\nitem ::= [^\\n]+ \"\\n\"\n"),
                {"- a\n", "- a\n- bc d\n"}, {"- a", "-a\n", "- \n", ""});
    const compiled chess = gbnf_grammar(R"g(
root ::= (
    # the first move, then one or more numbered ones
    "1. " move " " move "\n"
    ([1-9] [0-9]? ". " move " " move "\n")+
)
move    ::= (pawn | nonpawn | castle) [+#]?
pawn    ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBRQ])?
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]
castle  ::= "O-O" "-O"?
)g");
    check_texts(chess, {"1. e4 e5\n2. Nf3 Nc6\n", "1. d4 d5\n2. c4 dxc4\n10. O-O O-O-O+\n11. exd8=Q# Kxd8\n"},
                {"1. e4 e5\n", "1. e9 e5\n2. a3 a6\n", "1. e4 e5\n2. Nf3\n"});
}

TEST_CASE("gbnf: syntax llama.cpp grammars use") {
    // Escapes, `.`, {n,m}, an empty alternative, CRLF lines, comments, a rule continued after
    // `|` and on a line that begins with `|`, rules used before they are defined.
    const compiled g = gbnf_grammar("root ::= greeting sp name sp?  # trailing comment\r\n"
                                    "greeting ::= \"\\x48i\" | \"\\u00c9h\" |\r\n"
                                    "    \"\\U0001F600\"\n"
                                    "  | \"yo\"{2,3}\n"
                                    "\n"
                                    "# names\n"
                                    "name ::= [A-Z] [a-z\\]-]{0,4} . \n"
                                    "sp ::= | \" \"\n");
    check_texts(g, {"Hi Bob!", "ÉhAnn.", "\U0001F600 Zed0 ", "yoyo Ab-c]x", "yoyoyoX_"},
                {"yo Bob!", "yoyoyoyo Bob!", "Hi bob!", "Hi Bobbbbb!"});
    // A group spans lines; a negated class with escapes.
    check_texts(gbnf_grammar("root ::= (\n  \"a\"\n  |\n  \"b\"\n) [^\"\\\\]\n"), {"ax", "b\n"},
                {"a\"", "b\\", "ab\"", "c1"});
    check_texts(gbnf_grammar("root ::= \"\\[\\\"\\\\\\]\" \"a\"{2,} [\\[\\]]"), {"[\"\\]aa[", "[\"\\]aaaa]"},
                {"[\"\\]a[", "[\"\\]aa"});
    // Postfix operators stack, as in llama.cpp: ("ab"?)+ and ("x"{2})*.
    check_texts(gbnf_grammar("root ::= \"ab\"?+ \"x\"{2}*"), {"", "abab", "xxxx", "abxx"}, {"a", "x", "xxx"});
}

TEST_CASE("gbnf: errors name the rule and the line") {
    const std::vector<std::pair<std::string, std::string>> rows = {
        {"root ::= foo", "line 1, rule 'root': undefined rule 'foo'"},
        {"# c\n\nroot ::= \"a\" x\n", "line 3, rule 'root': undefined rule 'x'"},
        {"a ::= \"x\"", "no rule 'root'"},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2, rule 'root': rule 'root' is defined twice (first on line 1)"},
        {"root ::= \"abc", "line 1, rule 'root': an unterminated literal"},
        {"root ::= [abc", "unterminated class"},
        {"root ::= (\"a\"\n\n", "line 1, rule 'root': '(' without ')'"},
        {"root ::= \"a\" )", "line 1, rule 'root': expected the end of the line at ')'"},
        {"root ::= \"a\"\nx = \"b\"", "line 2, rule 'root': expected the end of the line at '='"},
        {"root ::= * \"a\"", "'*' with nothing before it to repeat"},
        {"root ::= \"a\"{3,2}", "{3,2} with min over max"},
        {"root ::= \"a\"{20000}", "repetition count over 10000"},
        {"root ::= \"a\"{x}", "expected a repetition count"},
        {"root ::= \"a\"{2", "expected '}'"},
        {"root ::= \"\\q\"", "unknown escape '\\q'"},
        {"root ::= \"\\x4\"", "fewer than 2 hex digits"},
        {"root ::= \"\\uD800\"", "U+D800 is not a character"},
        {"root ::= [z-a]", "range out of order"},
        {"root ::= \"\xc3\"", "malformed UTF-8"},
        {"::= \"a\"", "line 1: expected a rule name"},
        {"root \"a\"", "expected ::= after the rule name"},
        {"root ::= <think>", "token references <...> are not supported"},
        {"root ::= " + std::string(300, '(') + std::string(300, ')'), "groups nested deeper than 256"},
    };
    for (const auto& entry : rows) { // no structured binding: clang 14 cannot capture one in INFO
        const std::string& text = entry.first;
        const std::string& what = entry.second;
        INFO("grammar: ", text);
        builder b;
        CHECK_THROWS_WITH_AS(add_gbnf(b, text), doctest::Contains(what.c_str()), grammar_error);
    }
}
