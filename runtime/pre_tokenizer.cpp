// Byte-level BPE pre-tokenizers (tokenizer.ggml.pre): llama.cpp's regex families as hand-written matchers.
#include "runtime/pre_tokenizer.hpp"

#include "runtime/unicode.hpp"

#include <algorithm>
#include <cstdint>
#include <span>

namespace tandem {
namespace {

namespace uni = tandem::unicode;

// Pre-tokenization: llama.cpp applies a list of regexes in turn; each one splits every piece
// so far into its matches and the gaps between them (both kept). Each regex here is a
// hand-written matcher with the regex's own semantics: at a position, the first alternative
// that matches wins, quantifiers are greedy and backtrack. A piece's bounds are the text's
// bounds for lookarounds and `$`, as they are for llama.cpp.

// The text as code points; invalid UTF-8 becomes U+FFFD here but keeps its own bytes.
struct cpt_text {
    std::vector<char32_t> cpts;
    std::vector<uint8_t> flags;
    std::vector<uint32_t> offs; // byte offset of each code point, plus the end
};

cpt_text decode_text(std::string_view s) {
    cpt_text t;
    t.cpts.reserve(s.size());
    t.flags.reserve(s.size());
    t.offs.reserve(s.size() + 1);
    for (size_t pos = 0; pos < s.size();) {
        const uni::decoded d = uni::decode_utf8(s, pos);
        t.cpts.push_back(d.cpt);
        t.flags.push_back(uni::flags_of(d.cpt));
        t.offs.push_back(uint32_t(pos));
        pos += d.len;
    }
    t.offs.push_back(uint32_t(s.size()));
    return t;
}

struct span {
    uint32_t begin, end; // code point indices
};

// One piece under a matcher: positions at or past `end` hold nothing.
struct cursor {
    const cpt_text& t;
    size_t end;

    bool in(size_t i) const { return i < end; }
    char32_t at(size_t i) const { return i < end ? t.cpts[i] : 0xFFFFFFFF; }
    bool has(size_t i, uint8_t f) const { return i < end && (t.flags[i] & f); }
    bool ws(size_t i) const { return has(i, uni::whitespace); }
    bool letter(size_t i) const { return has(i, uni::letter); }
    bool number(size_t i) const { return has(i, uni::number); }
    bool punct(size_t i) const { return has(i, uni::punctuation); }
    // [^\s\p{L}\p{N}]
    bool other(size_t i) const {
        return in(i) && !(t.flags[i] & (uni::whitespace | uni::letter | uni::number));
    }
    bool crlf(size_t i) const { return at(i) == '\r' || at(i) == '\n'; }

    template <class Pred>
    size_t run(size_t i, Pred pred) const {
        while (i < end && pred(i)) ++i;
        return i;
    }
};

// A matcher returns the length of the match at `pos` (0: none). It may raise `next`, the
// next position worth trying, when it knows every position before it fails too.
using matcher = size_t (*)(const cursor& c, size_t pos, size_t& next);

std::vector<span> split(const cpt_text& t, const std::vector<span>& pieces, matcher m) {
    std::vector<span> out;
    out.reserve(pieces.size() * 2);
    for (const span& p : pieces) {
        const cursor c{t, p.end};
        size_t gap = p.begin;
        for (size_t pos = p.begin; pos < p.end;) {
            size_t next = pos + 1;
            const size_t n = m(c, pos, next);
            if (n == 0) {
                pos = std::max(next, pos + 1);
                continue;
            }
            if (gap < pos) out.push_back({uint32_t(gap), uint32_t(pos)});
            out.push_back({uint32_t(pos), uint32_t(pos + n)});
            pos += n;
            gap = pos;
        }
        if (gap < p.end) out.push_back({uint32_t(gap), p.end});
    }
    return out;
}

// 's|'t|'re|'ve|'m|'ll|'d, ASCII case-insensitive for llama3's (?:'[sS]|'[tT]|...)
size_t contraction(const cursor& c, size_t pos, bool icase) {
    if (c.at(pos) != '\'') return 0;
    const auto lower = [&](size_t i) {
        const char32_t ch = c.at(i);
        return icase && ch >= 'A' && ch <= 'Z' ? ch + 32 : ch;
    };
    const char32_t a = lower(pos + 1), b = lower(pos + 2);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

// \s+(?!\S) for a whitespace run [pos, run_end): all of it at the piece's end, otherwise all
// but the last (which the next token takes); nothing for a single one before non-space.
size_t ws_not_before_nonspace(const cursor& c, size_t pos, size_t run_end) {
    const size_t k = run_end - pos;
    if (run_end == c.end) return k;
    return k >= 2 ? k - 1 : 0;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)
size_t match_gpt2(const cursor& c, size_t pos, size_t&) {
    if (const size_t n = contraction(c, pos, false)) return n;
    const size_t p = c.at(pos) == ' ' ? pos + 1 : pos;
    if (c.letter(p)) return c.run(p, [&](size_t i) { return c.letter(i); }) - pos;
    if (c.number(p)) return c.run(p, [&](size_t i) { return c.number(i); }) - pos;
    if (c.other(p)) return c.run(p, [&](size_t i) { return c.other(i); }) - pos;
    if (c.ws(pos)) return ws_not_before_nonspace(c, pos, c.run(pos, [&](size_t i) { return c.ws(i); }));
    return 0;
}

// (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|
// \p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
template <size_t max_digits>
size_t match_llama3(const cursor& c, size_t pos, size_t&) {
    if (const size_t n = contraction(c, pos, true)) return n;
    const auto letters = [&](size_t i) { return c.letter(i); };
    if (!c.letter(pos) && !c.number(pos) && !c.crlf(pos) && c.letter(pos + 1)) {
        return c.run(pos + 1, letters) - pos;
    }
    if (c.letter(pos)) return c.run(pos, letters) - pos;
    if (c.number(pos)) {
        return std::min(c.run(pos, [&](size_t i) { return c.number(i); }) - pos, max_digits);
    }
    const size_t p = c.at(pos) == ' ' ? pos + 1 : pos;
    if (c.other(p)) {
        const size_t q = c.run(p, [&](size_t i) { return c.other(i); });
        return c.run(q, [&](size_t i) { return c.crlf(i); }) - pos;
    }
    if (c.ws(pos)) {
        const size_t run_end = c.run(pos, [&](size_t i) { return c.ws(i); });
        // \s*[\r\n]+ : up to the last line break of the run
        for (size_t j = run_end; j > pos; --j) {
            if (c.crlf(j - 1)) return j - pos;
        }
        if (const size_t n = ws_not_before_nonspace(c, pos, run_end)) return n;
        return run_end - pos; // \s+
    }
    return 0;
}

size_t match_crlf(const cursor& c, size_t pos, size_t&) {
    return c.crlf(pos) ? 1 : 0;
}

// \s?X+ for a class X
template <class Pred>
size_t ws_opt_run(const cursor& c, size_t pos, Pred in_class) {
    const auto cls = [&](size_t i) { return c.in(i) && in_class(c.at(i), c.t.flags[i]); };
    if (c.ws(pos) && cls(pos + 1)) return c.run(pos + 1, cls) - pos;
    if (cls(pos)) return c.run(pos, cls) - pos;
    return 0;
}

size_t match_ws_letters(const cursor& c, size_t pos, size_t&) { // \s?\p{L}+
    return ws_opt_run(c, pos, [](char32_t, uint8_t f) { return (f & uni::letter) != 0; });
}

size_t match_ws_punct(const cursor& c, size_t pos, size_t&) { // \s?\p{P}+
    return ws_opt_run(c, pos, [](char32_t, uint8_t f) { return (f & uni::punctuation) != 0; });
}

// [一-龥ࠀ-一가-퟿]+ : U+0800..U+9FA5 and U+AC00..U+D7FF. llama.cpp hands std::wregex the
// text with non-ASCII whitespace replaced by U+000B, so U+2000..U+200A, U+3000 etc. stay out.
bool is_deepseek_cjk(char32_t ch, uint8_t f) {
    return ((ch >= 0x0800 && ch <= 0x9FA5) || (ch >= 0xAC00 && ch <= 0xD7FF)) && !(f & uni::whitespace);
}

size_t match_cjk(const cursor& c, size_t pos, size_t&) {
    return c.run(pos, [&](size_t i) { return is_deepseek_cjk(c.at(i), c.t.flags[i]); }) - pos;
}

size_t match_one_number(const cursor& c, size_t pos, size_t&) { // \p{N}
    return c.number(pos) ? 1 : 0;
}

size_t match_numbers(const cursor& c, size_t pos, size_t&) { // \p{N}+
    return c.run(pos, [&](size_t i) { return c.number(i); }) - pos;
}

// DeepSeek LLM's letter class (its tokenizer.json regex), as inclusive code point ranges.
constexpr char32_t deepseek_llm_letters[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
    {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377},
    {0x37B, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C},
    {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
    {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
    {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
    {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
    {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC},
    {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
    {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE},
    {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787},
    {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};

// \s?[A-Za-zµÀ-ÖØ-öø-ƺ...]+
size_t match_deepseek_llm_letters(const cursor& c, size_t pos, size_t&) {
    return ws_opt_run(c, pos, [](char32_t ch, uint8_t) {
        for (const auto& r : deepseek_llm_letters) {
            if (ch < r[0]) return false;
            if (ch <= r[1]) return true;
        }
        return false;
    });
}

// \s?[!-/:-~！-／：-～‘-‟　-。]+ (U+3000 is whitespace, so out, as for llama.cpp)
size_t match_deepseek_llm_punct(const cursor& c, size_t pos, size_t&) {
    return ws_opt_run(c, pos, [](char32_t ch, uint8_t f) {
        return (ch >= 0x21 && ch <= 0x2F) || (ch >= 0x3A && ch <= 0x7E) || (ch >= 0xFF01 && ch <= 0xFF0F) ||
               (ch >= 0xFF1A && ch <= 0xFF5E) || (ch >= 0x2018 && ch <= 0x201F) ||
               (ch >= 0x3000 && ch <= 0x3002 && !(f & uni::whitespace));
    });
}

// \s+$
size_t match_trailing_ws(const cursor& c, size_t pos, size_t& next) {
    if (!c.ws(pos)) return 0;
    const size_t run_end = c.run(pos, [&](size_t i) { return c.ws(i); });
    if (run_end == c.end) return run_end - pos;
    next = run_end; // no later start inside this run reaches the end either
    return 0;
}

// [\p{P}\$\+<=>\^~\|]+
size_t match_punct_and_ascii_symbols(const cursor& c, size_t pos, size_t&) {
    return c.run(pos, [&](size_t i) {
        const char32_t ch = c.at(i);
        return c.punct(i) || ch == '$' || ch == '+' || ch == '<' || ch == '=' || ch == '>' ||
               ch == '^' || ch == '~' || ch == '|';
    }) - pos;
}

// [0-9][0-9][0-9]
size_t match_three_digits(const cursor& c, size_t pos, size_t&) {
    for (size_t i = pos; i < pos + 3; ++i) {
        if (c.at(i) < '0' || c.at(i) > '9') return 0;
    }
    return 3;
}

std::span<const matcher> matchers_for(pre_kind k) {
    static constexpr matcher gpt2[] = {match_gpt2};
    static constexpr matcher digits_gpt2[] = {match_one_number, match_gpt2}; // each digit apart, then GPT-2's
    static constexpr matcher llama3[] = {match_llama3<3>};
    static constexpr matcher qwen2[] = {match_llama3<1>};
    static constexpr matcher deepseek_coder[] = {match_crlf, match_ws_letters, match_ws_punct, match_cjk,
                                                 match_one_number};
    static constexpr matcher deepseek_llm[] = {match_crlf, match_deepseek_llm_letters, match_deepseek_llm_punct,
                                               match_trailing_ws, match_cjk, match_numbers};
    static constexpr matcher bpe_default[] = {match_punct_and_ascii_symbols, match_gpt2, match_numbers,
                                              match_three_digits};
    switch (k) {
    case pre_kind::gpt2: return gpt2;
    case pre_kind::digits_gpt2: return digits_gpt2;
    case pre_kind::llama3: return llama3;
    case pre_kind::qwen2: return qwen2;
    case pre_kind::deepseek_coder: return deepseek_coder;
    case pre_kind::deepseek_llm: return deepseek_llm;
    case pre_kind::bpe_default: return bpe_default;
    }
    return {};
}

} // namespace

std::optional<pre_kind> pre_from_name(std::string_view name) {
    static const std::pair<std::string_view, pre_kind> names[] = {
        {"gpt-2", pre_kind::gpt2}, {"phi-2", pre_kind::gpt2}, {"roberta-bpe", pre_kind::gpt2},
        {"jina-es", pre_kind::gpt2}, {"jina-de", pre_kind::gpt2}, {"jina-v1-en", pre_kind::gpt2},
        {"jina-v2-es", pre_kind::gpt2}, {"jina-v2-de", pre_kind::gpt2},
        {"jina-v2-code", pre_kind::gpt2}, {"gigachat", pre_kind::gpt2},
        {"llama3", pre_kind::llama3}, {"llama-v3", pre_kind::llama3},
        {"llama-bpe", pre_kind::llama3}, {"falcon3", pre_kind::llama3},
        {"qwen2", pre_kind::qwen2}, {"deepseek-r1-qwen", pre_kind::qwen2},
        {"smollm", pre_kind::digits_gpt2}, {"starcoder", pre_kind::digits_gpt2}, {"refact", pre_kind::digits_gpt2},
        {"command-r", pre_kind::digits_gpt2}, {"codeshell", pre_kind::digits_gpt2}, {"exaone", pre_kind::digits_gpt2},
        {"deepseek-coder", pre_kind::deepseek_coder}, {"deepseek-llm", pre_kind::deepseek_llm},
        {"default", pre_kind::bpe_default},
    };
    for (const auto& [n, k] : names) {
        if (n == name) return k;
    }
    return std::nullopt;
}

std::vector<std::pair<size_t, size_t>> pre_split(pre_kind k, std::string_view text) {
    const cpt_text t = decode_text(text);
    std::vector<span> pieces;
    if (!t.cpts.empty()) pieces.push_back({0, uint32_t(t.cpts.size())});
    for (const matcher m : matchers_for(k)) pieces = split(t, pieces, m);
    std::vector<std::pair<size_t, size_t>> out;
    out.reserve(pieces.size());
    for (const span& p : pieces) out.emplace_back(t.offs[p.begin], t.offs[p.end] - t.offs[p.begin]);
    return out;
}

} // namespace tandem
