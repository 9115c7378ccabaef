// The grammar engine's core: lowering to bytes, the fast matcher against the reference
// (Earley) matcher, and token masks from the cache against every token tried on the reference.
#include "runtime/gguf.hpp"
#include "runtime/grammar/grammar.hpp"
#include "runtime/grammar/matcher.hpp"
#include "runtime/grammar/reference.hpp"
#include "runtime/grammar/token_mask.hpp"
#include "runtime/sampler.hpp"
#include "runtime/tokenizer.hpp"
#include "test_util.hpp"

#include <doctest/doctest.h>

#include <memory>
#include <random>

using namespace tandem;
using namespace tandem::grammar;

namespace {

std::string utf8(char32_t c) {
    std::string s;
    if (c < 0x80) {
        s += char(c);
    } else if (c < 0x800) {
        s += char(0xC0 | c >> 6), s += char(0x80 | (c & 0x3F));
    } else if (c < 0x10000) {
        s += char(0xE0 | c >> 12), s += char(0x80 | (c >> 6 & 0x3F)), s += char(0x80 | (c & 0x3F));
    } else {
        s += char(0xF0 | c >> 18), s += char(0x80 | (c >> 12 & 0x3F)), s += char(0x80 | (c >> 6 & 0x3F));
        s += char(0x80 | (c & 0x3F));
    }
    return s;
}

std::shared_ptr<const compiled> build_one(expr e, builder b = {}) {
    const rule_id r = b.add("root", std::move(e));
    return std::make_shared<const compiled>(b.build(r));
}

// A random grammar over {a, b, c}: rules referring to each other (recursion included).
// Left-recursive draws are refused by build(), and the caller draws again.
struct random_grammar {
    std::mt19937 rng;
    builder b;
    std::vector<rule_id> rules;

    explicit random_grammar(uint32_t seed) : rng(seed) {}

    int pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); }

    expr draw(int depth) {
        const int k = depth <= 0 ? pick(3) : pick(8);
        switch (k) {
        case 0: return lit(std::string(1, char('a' + pick(3))));
        case 1: return lit(std::string(size_t(pick(3)), char('a' + pick(3)))); // maybe empty
        case 2: return pick(4) == 0 ? ref(rules[size_t(pick(int(rules.size())))]) : cls({{'a', char32_t('a' + pick(3))}});
        case 3: return seq({draw(depth - 1), draw(depth - 1)});
        case 4: return alt({draw(depth - 1), draw(depth - 1), draw(depth - 1)});
        case 5: return rep(draw(depth - 1), pick(2), pick(3) == 0 ? -1 : 1 + pick(3));
        case 6: return ref(rules[size_t(pick(int(rules.size())))]);
        default: return seq({lit(std::string(1, char('a' + pick(3)))), draw(depth - 1)});
        }
    }

    std::shared_ptr<const compiled> make() {
        const int n = 1 + pick(4);
        for (int i = 0; i < n; ++i) rules.push_back(b.declare(fmt::format("r{}", i)));
        for (const rule_id r : rules) b.define(r, draw(3));
        return std::make_shared<const compiled>(b.build(rules[0]));
    }
};

std::shared_ptr<const compiled> some_random_grammar(uint32_t& seed) {
    for (;; ++seed) {
        try {
            return random_grammar(seed).make();
        } catch (const grammar_error&) {
        }
    }
}

std::string random_text(std::mt19937& rng, int max_len) {
    std::string s(size_t(std::uniform_int_distribution<int>(0, max_len)(rng)), 'a');
    for (char& c : s) c = char('a' + std::uniform_int_distribution<int>(0, 3)(rng)); // 'd' never matches
    return s;
}

// The mask for the state after `text` token by token on the reference: a token is allowed
// when its bytes extend the text to a prefix; an end token when the text is whole.
token_set reference_mask(const compiled& g, const vocab_trie& v, std::string_view text) {
    token_set out(v.n_vocab());
    reference_matcher ref(g);
    REQUIRE(ref.feed(text));
    for (token_id t = 0; t < v.n_vocab(); ++t)
        if (!v.piece(t).empty() && ref.can_feed(v.piece(t))) out.add(t);
    if (ref.can_end())
        for (const token_id t : v.end_tokens()) out.add(t);
    return out;
}

void check_same(const token_set& got, const token_set& want, const vocab_trie& v) {
    for (token_id t = 0; t < v.n_vocab(); ++t) {
        if (got.has(t) == want.has(t)) continue;
        FAIL_CHECK("token " << t << " '" << v.piece(t) << "': mask " << got.has(t) << ", reference " << want.has(t));
        return;
    }
}

// Every string over {a, b, c} of length 1..3, plus an end token with no text.
std::shared_ptr<const vocab_trie> toy_vocab() {
    std::vector<std::string> pieces{""}; // 0: the end token
    for (int len = 1; len <= 3; ++len) {
        for (int code = 0; code < 81; ++code) {
            std::string s;
            for (int i = 0, c = code; i < len; ++i, c /= 3) s += char('a' + c % 3);
            if (std::find(pieces.begin(), pieces.end(), s) == pieces.end()) pieces.push_back(s);
        }
    }
    pieces.push_back("abcabcab");
    return std::make_shared<vocab_trie>(std::move(pieces), std::vector<token_id>{0});
}

} // namespace

TEST_CASE("a class lowers to the UTF-8 of exactly its code points") {
    std::mt19937 rng(7);
    const std::vector<char32_t> probes{0, 0x41, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF};
    for (int trial = 0; trial < 60; ++trial) {
        std::vector<cp_range> ranges;
        for (int i = 0, n = 1 + int(rng() % 4); i < n; ++i) {
            char32_t lo = rng() % 3 == 0 ? probes[rng() % probes.size()] : char32_t(rng() % 0x11000);
            char32_t hi = std::min<char32_t>(0x10FFFF, lo + char32_t(rng() % (rng() % 2 ? 0x100 : 0x20000)));
            ranges.push_back({lo, hi});
        }
        const bool negated = rng() % 2;
        const auto g = build_one(cls(ranges, negated));
        const auto in_class = [&](char32_t c) {
            bool in = false;
            for (const auto& [lo, hi] : ranges) in = in || (c >= lo && c <= hi);
            return in != negated;
        };
        std::vector<char32_t> cps = probes;
        for (const auto& [lo, hi] : ranges)
            for (const char32_t c : {lo, hi, char32_t(lo - 1), char32_t(hi + 1), char32_t((lo + hi) / 2)}) cps.push_back(c);
        for (int i = 0; i < 200; ++i) cps.push_back(char32_t(rng() % 0x110000));
        for (const char32_t c : cps) {
            if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) continue;
            CAPTURE(trial);
            CAPTURE(uint32_t(c));
            CHECK(matches(*g, utf8(c)) == in_class(c));
        }
        CHECK_FALSE(matches(*g, "\xED\xA0\x80")); // a surrogate is never a character
    }
}

TEST_CASE("build refuses what the matcher cannot run") {
    {
        builder b;
        const rule_id a = b.declare("a");
        b.define(a, alt({seq({ref(a), lit("x")}), lit("y")}));
        CHECK_THROWS_WITH_AS(b.build(a), doctest::Contains("left-recursive"), grammar_error);
    }
    {
        builder b;
        const rule_id a = b.declare("a"), u = b.declare("undefined-one");
        b.define(a, seq({lit("x"), ref(u)}));
        CHECK_THROWS_WITH_AS(b.build(a), doctest::Contains("\"undefined-one\" is used but never defined"), grammar_error);
    }
    {
        builder b;
        const rule_id a = b.declare("a");
        b.define(a, seq({lit("x"), ref(a)})); // never ends
        CHECK_THROWS_WITH_AS(b.build(a), doctest::Contains("matches no text"), grammar_error);
    }
    CHECK_THROWS_AS(build_one(rep(lit("a"), 3, 2)), grammar_error);
    CHECK_THROWS_AS(build_one(rep(lit("a"), 0, 20000)), grammar_error);
    builder big;
    build_limits lim;
    lim.max_elems = 1000;
    CHECK_THROWS_WITH_AS(big.build(big.add("r", rep(lit("abcdefghij"), 200, 200)), lim), doctest::Contains("too large"),
                         grammar_error);
    // A repetition of something that may be empty is fine: a cycle of tail calls.
    const auto g = build_one(star(star(alt({lit("a"), lit("")}))));
    CHECK(matches(*g, ""));
    CHECK(matches(*g, "aaaa"));
    CHECK_FALSE(matches(*g, "ab"));
}

TEST_CASE("bounded and unbounded repetition") {
    const auto g = build_one(seq({rep(lit("ab"), 2, 4), rep(cls({{'0', '9'}}), 1, -1)}));
    for (int n = 0; n <= 6; ++n) {
        std::string s;
        for (int i = 0; i < n; ++i) s += "ab";
        CHECK(matches(*g, s + "7") == (n >= 2 && n <= 4));
        CHECK(matches(*g, s + "123") == (n >= 2 && n <= 4));
        CHECK_FALSE(matches(*g, s));
    }
}

TEST_CASE("the fast matcher accepts exactly the reference's prefixes") {
    std::mt19937 rng(11);
    uint32_t seed = 1;
    for (int trial = 0; trial < 300; ++trial, ++seed) {
        const auto g = some_random_grammar(seed);
        CAPTURE(seed);
        for (int k = 0; k < 20; ++k) {
            const std::string text = random_text(rng, 12);
            matcher m(g);
            reference_matcher ref(*g);
            CHECK(m.can_end() == ref.can_end());
            for (const char c : text) {
                const bool ok = ref.feed(std::string_view(&c, 1));
                REQUIRE(m.advance(uint8_t(c)) == ok);
                CHECK(m.can_end() == ref.can_end());
                if (!ok) break;
            }
        }
    }
}

TEST_CASE("checkpoint and rollback restore the state") {
    const auto g = build_one(seq({star(alt({lit("ab"), lit("ac")})), lit("!")}));
    matcher m(g);
    REQUIRE(m.advance("ab"));
    const auto before = m.stacks();
    const auto mk = m.checkpoint();
    REQUIRE(m.advance("acab!"));
    CHECK(m.can_end());
    m.rollback(mk);
    CHECK(m.stacks() == before);
    CHECK_FALSE(m.can_end());
    CHECK_FALSE(m.advance("b"));
    CHECK(m.stacks() == before); // a refused byte changes nothing
    m.drop(mk);
    CHECK(m.advance("!"));
}

// Both ways a context gets its mask: classified when a walk first meets it (from what the
// context less one frame left uncertain), and classified before any walk, by the cache's own
// search of the contexts the grammar reaches.
TEST_CASE("masks from the cache equal every token tried on the reference (random grammars)") {
    const auto vocab = toy_vocab();
    for (const bool prepared : {false, true}) {
        CAPTURE(prepared);
        std::mt19937 rng(5);
        uint32_t seed = 1000;
        for (int trial = 0; trial < 300; ++trial, ++seed) {
            const auto g = some_random_grammar(seed);
            CAPTURE(seed);
            mask_cache cache(g, vocab, prepared ? std::chrono::seconds(10) : std::chrono::microseconds(0));
            matcher m(g);
            CHECK((cache.n_cached() > 0) == (prepared && !m.dead())); // (some match only "")
            std::string text;
            token_set got(vocab->n_vocab());
            for (int step = 0; step < 8; ++step) {
                cache.fill(m, got);
                check_same(got, reference_mask(*g, *vocab, text), *vocab);
                // Walk on by a random allowed token that is not the end.
                std::vector<token_id> next;
                for (token_id t = 1; t < vocab->n_vocab(); ++t)
                    if (got.has(t)) next.push_back(t);
                if (next.empty()) break;
                const token_id t = next[rng() % next.size()];
                REQUIRE(m.advance(vocab->piece(t)));
                text += vocab->piece(t);
            }
        }
    }
}

TEST_CASE("masks on the real 32,000-token vocabulary equal the reference's") {
    const tokenizer tok = tokenizer::from_gguf(gguf::file::open(test::model_path("llama-2-tiny-random.gguf")));
    const auto vocab = vocab_trie::of(tok);
    REQUIRE(vocab->n_vocab() == 32000);
    // A small JSON-like grammar: {"key": "text" | 123, ...} with bounded spaces.
    builder b;
    const rule_id value = b.declare("value");
    const expr ws = rep(cls({{' ', ' '}, {'\n', '\n'}}), 0, 2);
    const expr str = seq({lit("\""), star(alt({cls({{'"', '"'}, {'\\', '\\'}, {0, 0x1F}}, true), lit("\\n"), lit("\\\"")})),
                          lit("\"")});
    const expr member = seq({ws, str, ws, lit(":"), ws, ref(value), ws});
    b.define(value, alt({str, plus(cls({{'0', '9'}})), seq({lit("{"), member, star(seq({lit(","), member})), lit("}")}),
                         lit("true")}));
    const auto g = std::make_shared<const compiled>(b.build(b.add("root", seq({lit("{"), member, lit("}")}))));
    for (const auto prepare_for : {std::chrono::microseconds(0), mask_cache::default_prepare}) {
        mask_cache cache(g, vocab, prepare_for);
        matcher m(g);
        std::string text;
        token_set got(vocab->n_vocab());
        for (const std::string piece :
             {"{", "\"", "na", "me", "\"", ":", " ", "{", "\"", "\\n", "x", "\":", "1", "2", "}", "}"}) {
            cache.fill(m, got);
            CAPTURE(text);
            check_same(got, reference_mask(*g, *vocab, text), *vocab);
            REQUIRE(m.advance(piece));
            text += piece;
        }
        cache.fill(m, got);
        check_same(got, reference_mask(*g, *vocab, text), *vocab);
        CHECK(got.has(tok.eos()));
        CHECK(got.count() == int32_t(vocab->end_tokens().size())); // whole: only the end may follow
        MESSAGE("contexts cached: " << cache.n_cached() << " (prepared for " << prepare_for.count() << " us)");
    }
}

TEST_CASE("a grammar whose expansions explode is refused, quickly") {
    // (x?){0,5000}: every optional level can be skipped, so the first position reaches x in
    // all 5000 levels, each under a longer chain of returns: quadratic, refused by the limit.
    builder b;
    build_limits lim;
    lim.max_elems = 100000;
    CHECK_THROWS_WITH_AS(b.build(b.add("root", rep(opt(lit("x")), 0, 5000)), lim), doctest::Contains("too large"),
                         grammar_error);
}
