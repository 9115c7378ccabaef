// Unicode for the tokenizers and citations: UTF-8 coding, general categories, lowercase,
// GPT-2's byte-to-unicode map.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::unicode {

// General category (UnicodeData.txt field 2); `cn` is unassigned, and every value past U+10FFFF.
enum class category : uint8_t {
    cn, lu, ll, lt, lm, lo, mn, mc, me, nd, nl, no, pc, pd, ps, pe, pi, pf, po,
    sm, sc, sk, so, zs, zl, zp, cc, cf, cs, co,
};

// The classes that pre-tokenizer patterns name (\p{L}, \p{N}, ... and \s), as bits.
enum flag : uint8_t {
    letter = 1, number = 2, punctuation = 4, symbol = 8, mark = 16, separator = 32,
    other = 64,      // Cc, Cf, Cs, Co (not Cn)
    whitespace = 128 // the White_Space property, which regex \s means
};

category category_of(char32_t cpt);
uint8_t flags_of(char32_t cpt);
bool is_whitespace(char32_t cpt);
inline bool is_letter(char32_t cpt) { return flags_of(cpt) & letter; }
inline bool is_number(char32_t cpt) { return flags_of(cpt) & number; }
inline bool is_punctuation(char32_t cpt) { return flags_of(cpt) & punctuation; }
inline bool is_symbol(char32_t cpt) { return flags_of(cpt) & symbol; }
inline bool is_mark(char32_t cpt) { return flags_of(cpt) & mark; }
// The simple lowercase mapping (one code point to one: 'A' -> 'a', U+00C9 -> U+00E9, U+0416 ->
// U+0436); a code point without one maps to itself.
char32_t to_lower(char32_t cpt);

std::string_view unicode_version(); // of the generated tables, e.g. "14.0.0"

constexpr char32_t replacement = 0xFFFD;

// One step of strict UTF-8 decoding (no overlongs, surrogates or values past U+10FFFF).
struct decoded {
    char32_t cpt;  // U+FFFD when !valid
    uint32_t len;  // bytes consumed, >= 1: for an invalid sequence its maximal subpart
    bool valid;
};
decoded decode_utf8(std::string_view s, size_t pos);

void append_utf8(std::string& out, char32_t cpt);
std::string to_utf8(char32_t cpt);
bool is_valid_utf8(std::string_view s);

// Number of bytes at the end of `s` that start a sequence still waiting for its continuation
// bytes (0..3): what a streaming decoder holds back.
size_t incomplete_tail(std::string_view s);

// `s` with every invalid sequence (maximal subpart) replaced by U+FFFD.
std::string sanitize_utf8(std::string_view s);

// GPT-2 byte-level BPE: every byte stands for one printable code point (printable Latin-1
// bytes for themselves, the rest for U+0100 upwards). The UTF-8 of the code point for `b`:
std::string_view byte_to_piece(uint8_t b);
// The byte a code point stands for, or -1 for a code point outside the map.
int piece_to_byte(char32_t cpt);

namespace detail {
// Generated tables (unicode_data.cpp).
extern const char unicode_version[];
extern const uint32_t category_runs[];
extern const size_t n_category_runs;
extern const char32_t whitespace_ranges[][2];
extern const size_t n_whitespace_ranges;
extern const char32_t lowercase_pairs[][2];
extern const size_t n_lowercase_pairs;
} // namespace detail

} // namespace tandem::unicode
